"""open_stage: what a notebook does first, run by papermill or opened by hand in Jupyter."""

import os

import pytest

from nvfp4study.core import ledger
from nvfp4study.core import stage as stage_mod
from nvfp4study.core.errors import ParamsError
from nvfp4study.core.params import DEFAULT_PARAMS, dump_params, load_params
from nvfp4study.core.paths import point_latest


@pytest.fixture
def outputs(tmp_path, monkeypatch):
    out = tmp_path / "outputs"
    out.mkdir()
    monkeypatch.setattr(stage_mod, "OUTPUTS", out)
    monkeypatch.setattr("nvfp4study.core.paths.OUTPUTS", out)
    return out


def test_explicit_run_dir_uses_given_params(outputs, tmp_path):
    st = stage_mod.open_stage("02_inspect_checkpoint", str(DEFAULT_PARAMS), str(tmp_path / "r"))
    assert st.run_dir == tmp_path / "r"
    assert (st.run_dir / "params.yaml").exists() and (st.run_dir / "ledger.json").exists()
    assert "layout.routed-experts" in st.claims()


def test_first_interactive_open_starts_an_exploration_run_not_latest(outputs, monkeypatch, capsys):
    monkeypatch.delenv(stage_mod.RUN_ENV, raising=False)
    st = stage_mod.open_stage("02_inspect_checkpoint", str(DEFAULT_PARAMS), "")
    assert st.run_dir.parent == outputs and st.run_dir.name.endswith("-interactive")
    # latest is for complete runs only; the exploration run is outputs/interactive
    assert not (outputs / "latest").exists()
    assert (outputs / "interactive").resolve() == st.run_dir.resolve()
    assert "a new exploration run" in capsys.readouterr().out
    again = stage_mod.open_stage("03_patch_sglang", str(DEFAULT_PARAMS), "")
    assert again.run_dir == st.run_dir.resolve()
    assert "outputs/interactive" in capsys.readouterr().out


def test_a_complete_run_wins_over_the_exploration_run(outputs, monkeypatch):
    monkeypatch.delenv(stage_mod.RUN_ENV, raising=False)
    explore = stage_mod.open_stage("01_quantize", str(DEFAULT_PARAMS), "").run_dir
    done = outputs / "20260101T000000Z-default"
    done.mkdir()
    dump_params(load_params(None), done / "params.yaml")
    point_latest(done, outputs)
    assert stage_mod.open_stage("02_inspect_checkpoint", "", "").run_dir == done.resolve() != explore


def test_env_var_chooses_the_run_for_every_notebook_from_the_repo_root(outputs, monkeypatch, capsys):
    rel = f"outputs-test-{os.getpid()}-{id(outputs)}"  # unique across xdist workers too
    monkeypatch.setenv(stage_mod.RUN_ENV, rel)
    target = stage_mod.REPO_ROOT / rel
    try:
        st = stage_mod.open_stage("01_quantize", str(DEFAULT_PARAMS), "")
        assert st.run_dir == target  # relative to the repository root, not to notebooks/
        assert "$NVFP4STUDY_RUN_DIR" in capsys.readouterr().out
        # the folder now has params: a second notebook keeps them, whatever the default says
        dump_params(load_params(None, ["mtp.prompts=3"]), target / "params.yaml")
        st2 = stage_mod.open_stage("06_mtp_sweep", "", "")
        assert st2.run_dir == target and st2.params.mtp.prompts == 3
        out = capsys.readouterr().out
        assert "the run's own params are used" in out and "differs from this run's params.yaml" in out
    finally:
        import shutil

        shutil.rmtree(target, ignore_errors=True)


def test_relative_run_dir_parameter_is_taken_from_the_repo_root(outputs, monkeypatch):
    rel = f"outputs-test-param-{os.getpid()}-{id(outputs)}"
    try:
        st = stage_mod.open_stage("01_quantize", str(DEFAULT_PARAMS), rel)
        assert st.run_dir == stage_mod.REPO_ROOT / rel
    finally:
        import shutil

        shutil.rmtree(stage_mod.REPO_ROOT / rel, ignore_errors=True)


def test_interactive_open_uses_the_latest_runs_own_params(outputs, tmp_path):
    run = outputs / "20260101T000000Z-other"
    run.mkdir()
    dump_params(load_params(None, ["mtp.prompts=3"]), run / "params.yaml")
    point_latest(run, outputs)
    st = stage_mod.open_stage("06_mtp_sweep", str(DEFAULT_PARAMS), "")
    assert st.run_dir == run.resolve() and st.params.mtp.prompts == 3
    # other, non-default params for that run are refused rather than mixed into it
    other = tmp_path / "other.yaml"
    dump_params(load_params(None, ["mtp.prompts=7"]), other)
    with pytest.raises(ParamsError, match="differs from the params"):
        stage_mod.open_stage("06_mtp_sweep", str(other), "")


def test_not_run_records_reason(tmp_path, outputs):
    st = stage_mod.open_stage("07_determinism", str(DEFAULT_PARAMS), str(tmp_path / "r"))
    ids = st.not_run("needs an NVFP4-capable GPU")
    rows = {r["id"]: r for r in ledger.read_ledger(st.run_dir)}
    assert ids and all(rows[i]["note"] == "not run: needs an NVFP4-capable GPU" for i in ids)


def test_markdown_output_escapes_dollars_outside_code():
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    from nvfp4study.core.display import escape_dollars, markdown

    text = "regex `.*weight$` matches; a note ending in weight$ and $5 stays text; \\$x already escaped"
    out = escape_dollars(text)
    assert out == "regex `.*weight$` matches; a note ending in weight\\$ and \\$5 stays text; \\$x already escaped"
    # nbconvert (the report) shows every dollar sign as itself
    html = markdown2html_mistune(out)
    assert "weight$ and $5" in html and "<code>.*weight$</code>" in html and "\\$" not in html
    assert markdown(text).data == out
