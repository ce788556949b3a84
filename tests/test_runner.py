"""The runner executes real notebooks through papermill (tiny notebooks made here)."""

import fnmatch
import json
from pathlib import Path

import nbformat
import pytest

from nvfp4study.core import runner
from nvfp4study.core.errors import ParamsError, ResultParamsChanged

PARAMS_CELL = ('params_file: str = "../params/default.yaml"  # params\n'
               'run_dir: str = ""  # run folder')


def _nb(path: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cell = nbformat.v4.new_code_cell(PARAMS_CELL)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell] + [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, str(path))
    return path


WRITE = ('from pathlib import Path\n'
         'Path(run_dir, "data").mkdir(exist_ok=True)\n'
         'Path(run_dir, "data", "{name}.json").write_text(\'{{"ok": 1}}\')')


@pytest.fixture
def nbdir(tmp_path):
    d = tmp_path / "nbs"
    d.mkdir()
    _nb(d / "00_first.ipynb", WRITE.format(name="first"))
    _nb(d / "01_second.ipynb", WRITE.format(name="second"))
    _nb(d / "99_report.ipynb", "print('report')")
    return d


def test_runs_in_order_and_writes_everything(nbdir, tmp_path):
    lines = []
    root, manifest = runner.run_study(outputs=tmp_path / "out", notebook_dir=nbdir, echo=lines.append)
    assert manifest["status"] == "ok"
    assert [n["notebook"] for n in manifest["notebooks"]] == ["00_first", "01_second", "99_report"]
    for name in ["00_first.ipynb", "01_second.ipynb", "99_report.ipynb", "report.html",
                 "manifest.json", "ledger.json", "params.yaml", "data/first.json",
                 "html/00_first.html"]:
        assert (root / name).exists(), name
    m = json.loads((root / "manifest.json").read_text())
    for key in ["params_hash", "params", "git", "packages", "python", "cpu", "started", "ended"]:
        assert m[key] is not None, key
    assert (tmp_path / "out" / "latest").resolve() == root.resolve()
    assert any("00_first" in line and " ok" in line for line in lines)
    # report.html carries no code cells
    html = (root / "report.html").read_text()
    assert "print('report')" not in html and "report" in html


def test_injected_parameters_reach_the_kernel(nbdir, tmp_path):
    root, _ = runner.run_study(outputs=tmp_path / "out", notebook_dir=nbdir, echo=lambda s: None,
                               only="00", run_dir=tmp_path / "run")
    executed = nbformat.read(str(root / "00_first.ipynb"), as_version=4)
    injected = [c for c in executed.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and str(root) in injected[0].source


def test_stops_at_first_failure_and_keeps_what_it_wrote(nbdir, tmp_path):
    _nb(nbdir / "01_second.ipynb", "x = 1", "raise ValueError('boom')")
    lines = []
    root, manifest = runner.run_study(outputs=tmp_path / "out", notebook_dir=nbdir, echo=lines.append)
    assert manifest["status"] == "failed"
    failed = manifest["notebooks"][-1]
    assert failed["notebook"] == "01_second" and failed["status"] == "failed"
    # index in the executed notebook: parameters, injected-parameters, x = 1, raise
    assert failed["cell"] == 3 and "ValueError: boom" in failed["error"]
    assert len(manifest["notebooks"]) == 2  # 99 did not run
    assert (root / "data" / "first.json").exists() and (root / "01_second.ipynb").exists()
    assert any(line.startswith("FAILED") and "boom" in line for line in lines)
    assert not (tmp_path / "out" / "latest").exists()  # a failed run never becomes latest


def test_partial_runs_continue_latest_and_keep_the_manifest(nbdir, tmp_path):
    out = tmp_path / "out"
    from nvfp4study.core.errors import RunDirError

    with pytest.raises(RunDirError, match="run the whole study first"):
        runner.run_study(outputs=out, notebook_dir=nbdir, only="01")
    first, m1 = runner.run_study(outputs=out, notebook_dir=nbdir, echo=lambda s: None)
    again, m2 = runner.run_study(outputs=out, notebook_dir=nbdir, echo=lambda s: None, start="01")
    assert again == first and m2["started"] == m1["started"]
    assert [n["notebook"] for n in m2["notebooks"]] == ["00_first", "01_second", "99_report"]
    assert m2["notebooks"][0] == m1["notebooks"][0]  # 00 kept, not re-run
    with pytest.raises(ResultParamsChanged, match=r"other params: mtp\.prompts: 2 -> 3\."):
        runner.run_study(overrides=["mtp.prompts=3"], outputs=out, notebook_dir=nbdir, only="01")
    # an operational key (the cell time-out) may change: the run continues, the new value recorded
    cont, m3 = runner.run_study(overrides=["execution_timeout_s=999"], outputs=out, notebook_dir=nbdir,
                                echo=lambda s: None, start="01")
    assert cont == first and m3["status"] == "ok" and m3["params"]["execution_timeout_s"] == 999
    assert m3["params_hash"] == m1["params_hash"] and m3["notebooks"][0] == m1["notebooks"][0]


def test_cell_timeout_is_a_failure(nbdir, tmp_path):
    _nb(nbdir / "01_second.ipynb", "import time; time.sleep(30)")
    root, manifest = runner.run_study(None,
                                      overrides=["execution_timeout_s=2"],
                                      outputs=tmp_path / "out", notebook_dir=nbdir,
                                      echo=lambda s: None)
    assert manifest["status"] == "failed"
    assert "CellTimeoutError" in manifest["notebooks"][-1]["error"]


def test_only_and_from(nbdir):
    nbs = runner.notebooks(nbdir)
    assert [p.stem for p in runner.select(nbs, only="0,99")] == ["00_first", "99_report"]
    assert [p.stem for p in runner.select(nbs, start="01")] == ["01_second", "99_report"]
    with pytest.raises(ParamsError, match="no notebook numbered '42'"):
        runner.select(nbs, only="42")
    with pytest.raises(ParamsError, match="no notebook numbered '990'"):
        runner.select(nbs, only="990")
    with pytest.raises(ParamsError, match="selects no notebook"):
        runner.select(nbs, only="00", start="01")
    with pytest.raises(ParamsError, match="selects no notebook"):
        runner.select(nbs, only=",")


def test_bad_params_fail_before_any_folder(nbdir, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("profile: x\nbogus: 1\n")
    with pytest.raises(ParamsError, match="bogus"):
        runner.run_study(bad, outputs=tmp_path / "out", notebook_dir=nbdir)
    assert not (tmp_path / "out").exists()


def test_unwritable_outputs_is_named(nbdir, tmp_path):
    from nvfp4study.core.errors import RunDirError

    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RunDirError):
        runner.run_study(outputs=blocker / "out", notebook_dir=nbdir)


# --- one run per folder (issue 14, item 7) --------------------------------------------
HOLD = ("import sys, time; from nvfp4study.core import runlock\n"
        "with runlock.hold(sys.argv[1]):\n    print('held', flush=True); time.sleep(120)")


def _holder(root: Path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "lib")}
    env.pop("NVFP4STUDY_RUN_LOCK_OWNER", None)
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(root)], stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout.readline().strip() == "held"
    return p


def test_second_run_into_the_same_folder_is_refused(nbdir, tmp_path):
    """A live holder: the run is refused naming its pid, and writes nothing. The holder killed
    (SIGKILL, its lock left behind): the next run takes the folder over."""
    from nvfp4study.core.errors import RunLocked

    root = tmp_path / "run"
    root.mkdir()
    holder = _holder(root)
    try:
        with pytest.raises(RunLocked, match=f"pid {holder.pid}"):
            runner.run_study(run_dir=root, outputs=tmp_path / "out", notebook_dir=nbdir, echo=lambda s: None)
        assert sorted(p.name for p in root.iterdir()) == [".run.lock"]  # no manifest, ledger, params
        # a notebook opened on that folder (not by the holder) is refused too
        from nvfp4study.core import runlock
        with pytest.raises(RunLocked, match=str(holder.pid)):
            runlock.check(root)
    finally:
        holder.kill()
        holder.wait()
    root_, manifest = runner.run_study(run_dir=root, outputs=tmp_path / "out", notebook_dir=nbdir,
                                       echo=lambda s: None)
    assert manifest["status"] == "ok"
    assert (root / ".run.lock").read_text().strip() == str(__import__("os").getpid())


def test_notebooks_of_the_holding_run_pass_the_check(tmp_path):
    """The runner's own kernels are not refused (the lock's owner is passed to them)."""
    d = tmp_path / "nbs"
    d.mkdir()
    _nb(d / "00_check.ipynb", "from nvfp4study.core import runlock\nrunlock.check(run_dir)\nprint('ok')")
    root, manifest = runner.run_study(outputs=tmp_path / "out", notebook_dir=d, echo=lambda s: None)
    assert manifest["status"] == "ok", manifest.get("failure")


def test_kernels_started_together_get_their_own_sockets(tmp_path, monkeypatch):
    # jupyter_client numbers ipc sockets from the files already in the working folder: two managers
    # that write their connection files before either kernel binds drew the same paths there.
    monkeypatch.chdir(tmp_path)
    km = runner._ipc_kernel_manager()
    with monkeypatch.context() as m:  # a temp folder short enough for socket paths (the other case: below)
        m.setattr(runner.tempfile, "gettempdir", lambda: tmp_path.anchor + "t")
        a, b = km(kernel_name="python3"), km(kernel_name="python3")
    try:
        a.write_connection_file()
        b.write_connection_file()
        socks = [{f"{m.ip}-{getattr(m, f'{c}_port')}" for c in ("shell", "iopub", "stdin", "control", "hb")}
                 for m in (a, b)]
        assert len(socks[0]) == len(socks[1]) == 5
        assert not socks[0] & socks[1]
        assert all(Path(s).parent != tmp_path and Path(s).is_absolute() for s in socks[0] | socks[1])
    finally:
        a.cleanup_connection_file()
        b.cleanup_connection_file()
    assert list(tmp_path.iterdir()) == []


def test_a_temp_folder_too_long_for_a_socket_path_falls_back_to_a_short_unique_name(monkeypatch, tmp_path):
    monkeypatch.setattr(runner.tempfile, "gettempdir", lambda: str(tmp_path / ("d" * 90)))
    a, b = runner.kernel_socket_prefix(), runner.kernel_socket_prefix()
    assert a != b and not Path(a).is_absolute()
    assert fnmatch.fnmatch(f"{a}-1", "kernel-*-ipc-*")  # the pattern .gitignore lists
    short = tmp_path.anchor + "t"  # a short temp folder (tmp_path itself can be long under xdist)
    monkeypatch.setattr(runner.tempfile, "gettempdir", lambda: short)
    assert runner.kernel_socket_prefix().startswith(short + "/nvfp4study-kernel-")


def test_previous_manifest_resumes_only_with_the_same_params(tmp_path):
    """Continuing a run folder: none yet gives {}; a manifest with this params' digest (or none,
    an older manifest) is returned; another digest is refused, naming both."""
    from nvfp4study.core.params import load_params

    params = load_params()
    assert runner._previous_manifest(tmp_path, params) == {}
    for h in (params.digest(), None):
        m = {"params_hash": h, "notebooks": [{"name": "00_first", "status": "ok"}]}
        (tmp_path / "manifest.json").write_text(json.dumps(m))
        assert runner._previous_manifest(tmp_path, params) == m
    (tmp_path / "manifest.json").write_text(json.dumps({"params_hash": "0123456789abcdef"}))
    other = load_params(None, ["mtp.prompts=3"]).digest()
    with pytest.raises(ParamsError) as exc:
        runner._previous_manifest(tmp_path, load_params(None, ["mtp.prompts=3"]))
    assert str(exc.value).startswith(f"{tmp_path} was run with other params: params hash: 0123456789abcdef -> {other}. "
                                     "Only operational keys (")
    assert str(exc.value).endswith("continue it with the same result params, or use a new run folder")
