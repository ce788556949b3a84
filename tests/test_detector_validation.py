"""Detector validation on a small sample (with sandboxed execution), its statistics and ledger rows."""

import json
import math

import pandas as pd
import pytest

from nvfp4study.codeeval import detector_samples, detector_scores, detector_validation
from nvfp4study.codeeval.served_analysis import wilson_interval
from nvfp4study.codeeval.tasks import load_tasks
from nvfp4study.core.errors import DetectorValidationError
from nvfp4study.core.ledger import read_ledger
from nvfp4study.core.stage import open_stage
from nvfp4study.stages import s05_corruption as s5


def test_wilson_published_values():
    # 95 % Wilson score intervals (e.g. Newcombe 1998, Stat Med 17:857, table I)
    lo, hi = wilson_interval(5, 10)
    assert (round(lo, 4), round(hi, 4)) == (0.2366, 0.7634)
    lo, hi = wilson_interval(0, 10)
    assert lo == 0 and math.isclose(hi, 3.8415 / 13.8415, rel_tol=1e-4)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))


def test_summarize_by_hand():
    f = pd.DataFrame({
        "kind": ["clean", "clean", "clean", "after_bracket", "after_bracket", "spaced_word"],
        "detector": [False, True, False, True, False, True],
        "execution": pd.array([pd.NA] * 6, dtype="boolean"),
    })
    s = detector_scores.summarize(f).set_index(["method", "kind"])
    assert set(s.index.get_level_values(0)) == {"detector"}  # execution not run: left out
    r = s.loc[("detector", "after_bracket")]
    assert (r["tp"], r["fn"], r["fp"], r["n_clean"], r["recall"], r["precision"]) == (1, 1, 1, 3, 0.5, 0.5)
    a = s.loc[("detector", "all")]
    assert (a["tp"], a["n_junk"], round(a["precision"], 4), round(a["fp_rate_clean"], 4)) == (2, 3, 0.6667, 0.3333)


def test_build_samples_rejects_bad_input():
    with pytest.raises(DetectorValidationError):
        detector_samples.build_samples([])
    with pytest.raises(DetectorValidationError):
        detector_samples.build_samples(load_tasks(1, False), per_kind=-1)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Card-style binary search + dedupe, HumanEval/0-2 and HumanEval/72 (non-ASCII docstring),
    one variant per kind, executed in the sandbox."""
    run = tmp_path_factory.mktemp("run")
    stage = open_stage("05_corruption", "", str(run))
    card = {t.task_id: t for t in load_tasks(0, True)}
    he = load_tasks(73, False)
    tasks = [card["card/binary_search"], card["card/dedupe"], *he[:3], he[72]]
    return stage, tasks, detector_validation.run(stage, tasks=tasks, execute=True)


def test_small_sample_clean_and_flagged(small):
    _, tasks, res = small
    f = res.samples
    clean = f[f["kind"] == "clean"]
    assert len(clean) == len(tasks) == 6
    assert not clean["detector"].any() and (clean["detector_status"] == "clean").all()
    assert (clean["exec_outcome"] == "pass").all()
    junk = f[f["kind"] != "clean"]
    always = junk[junk["kind"].isin(["after_bracket", "after_number", "spaced_word", "closing_fence", "replace_number"])]
    assert len(always) > 0 and always["detector"].all()
    # syntax-breaking junk: the literal AST check cannot see it, the recovery pass can
    syn = junk[junk["kind"].isin(["after_bracket", "spaced_word"])]
    assert not syn["ast_undefined"].any() and syn["ast_or_syntax"].all()
    # junk on the fence: extraction cuts it off, so the program still passes
    fence = junk[junk["kind"] == "closing_fence"]
    assert (fence["exec_outcome"] == "pass").all() and (fence["finding_kinds"] == "junk_fence").all()
    # the non-ASCII scan only fires on HumanEval/72, whose prompt has '➞', junk or not
    assert set(f[f["non_ascii"]]["task_id"]) == {"HumanEval/72"}
    assert res.isolation in ("bwrap", "subprocess-unsafe")


def test_an_identical_program_is_run_once_and_shared(small):
    """A fence variant's extracted program is the clean one: the two share one sandboxed run
    (counted here by a runner that records what it is given); the others run alone."""
    _, tasks, _ = small
    samples = detector_samples.build_samples(tasks, per_kind=1)
    given: list[list[tuple]] = []

    class Result:
        def __init__(self, i):
            self.outcome, self.exception, self.name, self.isolation, self.duration_s = f"r{i}", None, None, "x", 0.0

    def runner(items):
        given.append(items)
        return [Result(i) for i in range(len(items))]

    frame, _ = detector_samples.classify(samples, tasks, execute=runner)
    codes = [(t.task_id, c) for t, c in given[0]]
    assert len(given) == 1 and len(codes) == len(set(codes)) < len(samples)
    clean = frame[frame["kind"] == "clean"].set_index("task_id")
    fence = frame[frame["kind"] == "closing_fence"].set_index("task_id")
    assert (fence["exec_program"] == clean.loc[fence.index, "exec_program"]).all()
    assert (fence["exec_outcome"] == clean.loc[fence.index, "exec_outcome"]).all()
    assert frame["exec_program"].nunique() == len(codes)
    # each distinct program's own result: program i got result "r{i}"
    assert (frame["exec_outcome"] == "r" + frame["exec_program"].astype(str)).all()


def test_small_sample_summary_matches_samples(small):
    _, _, res = small
    f, s = res.samples, res.summary.set_index(["method", "kind"])
    for kind in set(f["kind"]) - {"clean"}:
        part = f[f["kind"] == kind]
        assert s.loc[("detector", kind), "tp"] == int(part["detector"].sum())
        assert s.loc[("execution", kind), "tp"] == int(part["execution"].sum())
    assert s.loc[("non_ascii", "all"), "fp"] == 1


def test_small_sample_files(small):
    _, _, res = small
    back = pd.read_parquet(res.paths["samples"])
    assert len(back) == len(res.samples) and list(back["sample_id"]) == list(res.samples["sample_id"])
    summ = json.loads(res.paths["summary"].read_text())
    assert summ["provenance"]["executed"] is True and len(summ["rows"]) == len(res.summary)
    assert res.paths["figure"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = detector_scores.table(res.summary)
    assert "false positives on clean" in table.index and "our detector" in table.columns


def test_claims_recorded(small):
    stage, _, res = small
    out = s5.record_detector_claims(stage, res)
    rows = {r["id"]: r for r in read_ledger(stage.run_dir)}
    ascii_row = rows["detect.ascii-junk"]
    assert ascii_row["verdict"] == "partly"  # injected junk only; served junk needs the GPU
    assert ascii_row["measured"]["scan_hits_caused_by_junk"] == 0
    ast_row = rows["detect.ast-undefined"]
    assert ast_row["measured"]["recall"]["after_bracket"] == 0.0
    assert ast_row["verdict"] == "partly"
    assert rows["detect.method-comparison"]["origin"] == "study"
    assert all(e.startswith("data/") or e.startswith("figures/") for e in ast_row["evidence"])
    assert list(out["id"]) == ["detect.ast-undefined", "detect.ascii-junk", "detect.method-comparison"]


def test_card_lines(small):
    stage, tasks, _ = small
    t = detector_validation.card_examples(stage, tasks, execute=False)
    assert list(t["injected_line"]) == [
        "low, high = 0, len(arr) -  Advisory", "elif arr[mid] < x Advisory:", "seen.add(culp)"]
    assert t["detector"].all()
    assert list(t["ast_undefined"]) == [True, False, True]
    assert list(t["detector_label"]) == ["undefined_name", "syntax_error", "undefined_name"]


def test_switched_off_records_not_run(run_dir):
    stage = open_stage("05_corruption", "", str(run_dir))
    stage.params.corruption.validate_detector = False
    res = detector_validation.run(stage)
    assert res.skipped and res.samples.empty and "Skipped" in detector_validation.describe(res)
    assert detector_validation.card_examples(stage).empty and detector_scores.table(res.summary).empty
    s5.record_detector_claims(stage, res)
    rows = {r["id"]: r for r in read_ledger(run_dir)}
    assert rows["detect.ast-undefined"]["verdict"] == "not run"
    assert "validate_detector" in rows["detect.ascii-junk"]["note"]
    assert not (run_dir / "data").exists() or not any((run_dir / "data").iterdir())


def _stage_with(tmp_path, **sandbox):
    from nvfp4study.core import ledger
    from nvfp4study.core.params import load_params
    from nvfp4study.core.paths import RunPaths
    from nvfp4study.core.stage import Stage

    params = load_params(None, [f"corruption.sandbox.{k}={v}" for k, v in sandbox.items()])
    ledger.init_ledger(tmp_path)
    return Stage(name="05_corruption", params=params, paths=RunPaths(tmp_path))


def test_unsafe_isolation_is_said_everywhere(tmp_path):
    """``subprocess-unsafe`` asked for by name: the banner warns, every execution row and every
    ledger note of the detector validation says UNSAFE."""
    stage = _stage_with(tmp_path, isolation="subprocess-unsafe")
    assert s5.sandbox_banner(stage).startswith("**Warning, unsafe sandbox.**")
    card = {t.task_id: t for t in load_tasks(0, True)}
    res = detector_validation.run(stage, tasks=[card["card/binary_search"]], execute=True)
    assert res.isolation == "subprocess-unsafe"
    assert (res.samples["exec_isolation"] == "subprocess-unsafe").all()
    assert "subprocess-unsafe" in detector_validation.describe(res)
    s5.record_detector_claims(stage, res)
    rows = {r["id"]: r for r in read_ledger(tmp_path)}
    for cid in ("detect.ast-undefined", "detect.ascii-junk", "detect.method-comparison"):
        assert "UNSAFE: sandbox.isolation is 'subprocess-unsafe'" in rows[cid]["note"], cid


def test_banner_fails_closed_without_bwrap(tmp_path, monkeypatch):
    from nvfp4study.codeeval import isolation
    from nvfp4study.core.errors import SandboxUnavailable

    stage = _stage_with(tmp_path)
    monkeypatch.setattr(isolation, "_bwrap_path", lambda: None)
    isolation._bwrap_probe.cache_clear()
    try:
        with pytest.raises(SandboxUnavailable, match="bwrap not found"):
            s5.sandbox_banner(stage)
        with pytest.raises(SandboxUnavailable):
            detector_validation.run(stage, tasks=load_tasks(1, False), execute=True)
    finally:
        monkeypatch.undo()
        isolation._bwrap_probe.cache_clear()
    banner = s5.sandbox_banner(stage)
    assert "unsafe" not in banner.lower()
    assert banner.endswith(f"processes: {isolation.cap_description()}.")  # how forks are bounded
