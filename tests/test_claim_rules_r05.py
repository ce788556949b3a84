"""Stage 05's claim rules (``stages/claim_rules/r05_corruption.py``) row by row, every field, on
hand-made summaries, served rows, probes and trained arms (issue 37's mutation benchmark; the
stage's tests run the detector validation and the sandbox, too slow for it): each verdict's edges
on both sides, each refusal's words. Expected notes are written out here."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace as NS

import numpy as np
import pandas as pd
import pytest

from nvfp4study.codeeval.isolation import UNSAFE_NOTE
from nvfp4study.core.claim_rules import Row
from nvfp4study.stages.claim_rules import r05_corruption as r05

EV = [Path("data/summary.parquet"), Path("data/samples.parquet")]
UNSAFE = f" {UNSAFE_NOTE}."


def test_unsafe_suffix():
    assert r05.unsafe_suffix("subprocess-unsafe") == UNSAFE
    assert r05.unsafe_suffix("bwrap, subprocess-unsafe") == UNSAFE
    assert r05.unsafe_suffix(["bwrap", None, "subprocess-unsafe"]) == UNSAFE
    assert r05.unsafe_suffix(np.array(["subprocess-unsafe"])) == UNSAFE
    assert r05.unsafe_suffix(v for v in ("bwrap", "subprocess-unsafe")) == UNSAFE  # any iterable, read item by item
    for none in ("bwrap", ["bwrap", None], None, np.array([]), (), "", "subprocess"):
        assert r05.unsafe_suffix(none) == "", none


def summary(rows) -> pd.DataFrame:
    """``(method, kind, recall, tp, fp)`` -> the validation summary (n_clean 5, n_junk 7 + tp)."""
    return pd.DataFrame([{"method": m, "kind": k, "recall": r, "tp": tp, "fp": fp, "n_clean": 5, "n_junk": 7 + tp}
                         for m, k, r, tp, fp in rows])


def test_recalls():
    s = summary([("detector", "a", 0.123456, 1, 0), ("detector", "all", 1, 1, 0), ("ast_undefined", "a", 0.5, 1, 0)])
    assert r05.recalls(s, "detector") == {"a": 0.1235, "all": 1.0}
    assert r05.recalls(s, "non_ascii") == {}


def det(s: pd.DataFrame, samples=None, isolation="bwrap", unsafe="") -> r05.DetectorMeasurements:
    res = NS(summary=s, samples=samples, isolation=isolation, paths={})
    return r05.DetectorMeasurements(res, EV, unsafe)


def test_detector_gather():
    paths = {"summary": Path("s"), "samples": Path("p"), "figure": Path("f"), "examples": Path("e")}
    s = summary([("detector", "all", 1, 1, 0)])
    res = NS(summary=s, samples=None, isolation="subprocess-unsafe", paths=paths)
    x = r05.DetectorMeasurements.gather(res)
    assert (x.result, x.evidence, x.unsafe) == (res, [Path("s"), Path("p"), Path("f")], UNSAFE)
    assert x.summary is s
    assert r05.DetectorMeasurements.gather(NS(**{**vars(res), "isolation": "bwrap"})).unsafe == ""


AST_NOTE = ("pyflakes UndefinedName on the extracted code; {what}; our detector adds syntax-error recovery, glued-name "
            "tokens and fence checks.")
WEAK = ("misses >= 5% of: {k} (code that no longer parses, junk on attributes/definitions, junk on a closing "
        "fence)")


def ast_summary(r1=0.95, r2=1.0, fp=0, tp=(3, 4), det_all=True, r_all=0.97654321) -> pd.DataFrame:
    rows = [("ast_undefined", "glued", r1, tp[0], fp), ("ast_undefined", "fence", r2, tp[1], fp),
            ("ast_undefined", "all", r_all, sum(tp), fp), ("non_ascii", "glued", 0.0, 0, 2)]
    if det_all:
        rows += [("detector", "all", 0.99996, 9, 1), ("detector", "glued", 0.5, 1, 1)]
    return summary(rows)


def test_ast_undefined_row_in_full():
    row = r05.detect_ast_undefined(det(ast_summary(), unsafe=UNSAFE))
    assert row == Row({"method": "pyflakes undefined names on code that parses",
                       "recall": {"glued": 0.95, "fence": 1.0, "all": 0.9765}, "false_positives_clean": 0,
                       "n_clean": 5, "n_junk": 14, "our_detector_recall_all": 1.0,
                       "our_detector_false_positives_clean": 1},
                      "reproduced", EV, AST_NOTE.format(what="flags every kind") + UNSAFE)


@pytest.mark.parametrize("r1,r2,fp,tp,verdict,weak", [
    (0.95, 1.0, 0, (3, 4), "reproduced", ""),
    (0.9499, 1.0, 0, (3, 4), "partly", "glued"),
    (0.5, 0.2, 0, (3, 4), "partly", "glued, fence"),
    (1.0, 1.0, 1, (3, 4), "contradicted", ""),
    (0.0, 0.0, 0, (0, 0), "contradicted", "glued, fence"),
    (0.0, 1.0, 0, (0, 4), "partly", "glued"),
])
def test_ast_undefined_edges(r1, r2, fp, tp, verdict, weak):
    # the pooled row ("all") is below 95 % whenever a kind is: it is not a kind, so never listed
    row = r05.detect_ast_undefined(det(ast_summary(r1, r2, fp, tp, det_all=False, r_all=min(r1, r2, 0.97))))
    assert row.verdict == verdict and row.measured["false_positives_clean"] == fp
    assert row.note == AST_NOTE.format(what=WEAK.format(k=weak) if weak else "flags every kind")
    assert row.measured["our_detector_recall_all"] is None and row.measured["our_detector_false_positives_clean"] is None


def test_ast_undefined_of_one_kind():
    s = summary([("ast_undefined", "glued", 0.5, 1, 0), ("ast_undefined", "all", 0.5, 1, 0)])
    row = r05.detect_ast_undefined(det(s))
    assert row.verdict == "partly" and row.note == AST_NOTE.format(what=WEAK.format(k="glued"))
    assert (row.measured["false_positives_clean"], row.measured["n_clean"], row.measured["n_junk"]) == (0, 5, 8)


def test_ast_undefined_without_ast_rows():
    row = r05.detect_ast_undefined(det(summary([("detector", "all", 0.5, 1, 0)])))
    assert row.verdict == "contradicted" and row.note == AST_NOTE.format(what="flags every kind")
    assert row.measured == {"method": "pyflakes undefined names on code that parses", "recall": {},
                            "false_positives_clean": 0, "n_clean": 0, "n_junk": 0, "our_detector_recall_all": 0.5,
                            "our_detector_false_positives_clean": 0}


ASCII_NOTE = ("partly: the card's four tokens are ASCII, and a non-ASCII scan of the whole completion flags none of "
              "the junk injected with them (its only hits come from non-ASCII characters already in the clean "
              "prompt, e.g. '➞' in HumanEval docstrings, which also make it flag clean programs). Whether the junk a "
              "served model really emits is ASCII is measured only by the served study (05, GPU).")


def samples(*rows) -> pd.DataFrame:
    return pd.DataFrame([{"kind": k, "task_id": t, "non_ascii": n} for k, t, n in rows])


def test_ascii_junk_row_in_full():
    # the junk variant of task 1 is non-ASCII only because its clean twin is
    f = samples(("clean", "t1", True), ("clean", "t2", False), ("glued", "t1", True), ("glued", "t2", False))
    s = summary([("non_ascii", "all", 0.123456, 1, 2), ("non_ascii", "glued", 0.5, 1, 2)])
    assert r05.detect_ascii_junk(det(s, f, unsafe=UNSAFE)) == Row(
        {"tokens_ascii": {"ulp": True, "oly": True, "culp": True, "Advisory": True}, "non_ascii_scan_detects": False,
         "scan_hits_caused_by_junk": 0, "scan_recall_all": 0.1235, "scan_false_positives_clean": 2, "n_clean": 5},
        "partly", EV, ASCII_NOTE + UNSAFE)


def test_ascii_junk_contradicted_by_a_hit_of_the_junk():
    f = samples(("clean", "t1", False), ("clean", "t2", True), ("glued", "t1", True), ("fence", "t2", True),
                ("fence", "t3", True), ("fence", "t4", False))
    row = r05.detect_ascii_junk(det(summary([("detector", "all", 1, 1, 0)]), f))
    assert row.verdict == "contradicted" and row.note == ASCII_NOTE
    assert row.measured == {"tokens_ascii": {"ulp": True, "oly": True, "culp": True, "Advisory": True},
                            "non_ascii_scan_detects": True, "scan_hits_caused_by_junk": 2, "scan_recall_all": None,
                            "scan_false_positives_clean": None, "n_clean": None}
    one = samples(("clean", "t1", False), ("glued", "t1", True))
    row = r05.detect_ascii_junk(det(summary([("detector", "all", 1, 1, 0)]), one))
    assert row.verdict == "contradicted" and row.measured["scan_hits_caused_by_junk"] == 1
    assert row.measured["non_ascii_scan_detects"] is True


def test_ascii_junk_with_a_non_ascii_card_token(monkeypatch):
    monkeypatch.setattr(r05, "CARD_TOKENS", ("ulp", "ül"))
    f = samples(("clean", "t1", False), ("glued", "t1", False))
    row = r05.detect_ascii_junk(det(summary([("detector", "all", 1, 1, 0)]), f))
    assert row.verdict == "contradicted" and row.measured["tokens_ascii"] == {"ulp": True, "ül": False}


COMP_NOTE = ("recall pooled over all junk kinds (per kind in the summary file); 'partly': no false positive but "
             "another method flags more; execution is left out when not run.")


def test_method_comparison_row_in_full():
    s = summary([("execution", "all", 0.5, 1, 3), ("detector", "all", 0.9, 9, 0), ("detector", "a", 0.1, 1, 0),
                 ("non_ascii", "all", 0.9, 2, 4), ("ast_undefined", "a", 0.95, 2, 0)])
    row = r05.detect_method_comparison(det(s, isolation="bwrap", unsafe=UNSAFE))
    assert row == Row({"recall_all": {"detector": 0.9, "ast_undefined": None, "non_ascii": 0.9, "execution": 0.5},
                       "false_positives_clean": {"detector": 0, "ast_undefined": 0, "non_ascii": 4, "execution": 3},
                       "isolation": "bwrap"}, "reproduced", EV, COMP_NOTE + UNSAFE)
    assert list(row.measured["recall_all"]) == ["detector", "ast_undefined", "non_ascii", "execution"]


@pytest.mark.parametrize("d,dfp,other,verdict", [
    (0.9, 0, 0.9, "reproduced"), (0.9, 0, 0.8999, "reproduced"), (0.9, 0, 0.9001, "partly"),
    (0.9, 1, 0.5, "contradicted"), (None, 0, 0.5, "contradicted"),
])
def test_method_comparison_edges(d, dfp, other, verdict):
    rows = [("ast_undefined", "all", other, 1, 0), ("non_ascii", "all", 0.1, 1, 0),
            ("detector", "all" if d is not None else "a", d or 0.3, 1, dfp)]
    row = r05.detect_method_comparison(det(summary(rows), isolation=None))
    assert row.verdict == verdict and row.measured["isolation"] is None and row.note == COMP_NOTE


def test_method_comparison_without_the_detector():
    row = r05.detect_method_comparison(det(summary([("ast_undefined", "all", 0.5, 1, 0)])))
    assert row.verdict == "contradicted"
    assert row.measured["recall_all"] == {"ast_undefined": 0.5} and row.measured["false_positives_clean"] == {
        "ast_undefined": 0}


# --- the served study -----------------------------------------------------------------------------
def srow(clamp, sampling, clean, n, lo, hi, task_set="claim", **kw) -> dict:
    return {"clamp": clamp, "sampling": sampling, "task_set": task_set, "clean": clean, "n": n, "ci_low": lo,
            "ci_high": hi, "clean_frac": clean / n if n else float("nan"), "no_code": 1, "unjudged": 2, "failed": 3,
            **kw}


def test_count():
    s = pd.DataFrame([srow("exact", "a", 10, 15, 0.412345, 0.87654321, task_set="extended"),
                      srow("exact", "a", 2, 3, 0.123456, 0.98765, cut=0), srow("none", "a", 0, 0, 0, 0, cut=2),
                      srow("none", "b", 1, 3, 0.1, 0.2, cut=np.nan)])
    assert r05.count(s, "exact", "a") == {"clean": 2, "n": 3, "clean_frac": 0.6667, "no_code": 1, "unjudged": 2,
                                          "failed": 3, "ci95": [0.1235, 0.9877]}
    assert r05.count(s, "none", "a") == {"clean": 0, "n": 0, "clean_frac": None, "no_code": 1, "unjudged": 2,
                                         "failed": 3, "ci95": None, "cut": 2}
    assert r05.count(s, "exact", "b") is None and r05.count(s, "stock", "a") is None
    assert "cut" not in r05.count(pd.DataFrame([srow("exact", "a", 1, 1, 0.2, 1.0)]), "exact", "a")


def params(sampling=("t0-off-a", "t0-off-b"), executed_n=3, parser="ling3") -> NS:
    return NS(corruption=NS(before_mode="none", after_mode="exact", sampling=[NS(name=s) for s in sampling],
                            executed_n=executed_n, reasoning_probe_parser=parser))


def served(summ=None, df=None, probe=None, probe_file=Path("data/probe.parquet"), p=None) -> r05.ServedMeasurements:
    return r05.ServedMeasurements(p or params(), pd.DataFrame() if df is None else df,
                                  pd.DataFrame([srow("x", "x", 1, 1, 0, 1)]) if summ is None else summ,
                                  probe, EV, probe_file, "sglang 0.5.23")


def sampling_note(n, before, after, all_clean, sep) -> str:
    return (f"clean completions on the card's {n}-task set: none {before}, exact {after}; after all clean: "
            f"{all_clean}; 95 % Wilson intervals separated: {sep}.")


def test_sampling_row_in_full():
    summ = pd.DataFrame([srow("none", "t0-off-a", 4, 15, 0.1, 0.5), srow("exact", "t0-off-a", 15, 15, 0.51, 1.0),
                         srow("exact", "t0-off-b", 1, 10, 0.0, 0.4)])
    df = pd.DataFrame({"isolation": ["bwrap", None, "subprocess-unsafe"]})
    row = r05.corruption_t0_off_15(served(summ, df))
    before = {"clean": 4, "n": 15, "clean_frac": 0.2667, "no_code": 1, "unjudged": 2, "failed": 3, "ci95": [0.1, 0.5]}
    after = {"clean": 15, "n": 15, "clean_frac": 1.0, "no_code": 1, "unjudged": 2, "failed": 3, "ci95": [0.51, 1.0]}
    assert row == Row({"sampling": "t0-off-a", "n": 15, "before_mode": "none", "after_mode": "exact",
                       "clean_before": 4, "clean_after": 15, "before": before, "after": after}, "reproduced", EV,
                      sampling_note(15, "4/15 clean", "15/15 clean", True, True) + UNSAFE, "sglang 0.5.23")
    no_iso = r05.corruption_t0_off_15(served(summ, pd.DataFrame({"other": [1]})))
    assert no_iso.note == sampling_note(15, "4/15 clean", "15/15 clean", True, True)


@pytest.mark.parametrize("b_hi,a_clean,verdict,sep", [
    (0.5, 10, "reproduced", True), (0.51, 10, "partly", False),
    (0.5, 9, "partly", True), (0.6, 9, "contradicted", False),
])
def test_sampling_row_edges(b_hi, a_clean, verdict, sep):
    summ = pd.DataFrame([srow("none", "t06-on", 0, 10, 0.0, b_hi), srow("exact", "t06-on", a_clean, 10, 0.51, 1.0)])
    row = r05.corruption_t06_on(served(summ))
    assert row.verdict == verdict
    assert row.note == sampling_note(10, "0/10 clean", f"{a_clean}/10 clean", a_clean == 10, sep)


def test_sampling_row_one_before_answer_is_enough():
    summ = pd.DataFrame([srow("none", "t06-on", 0, 1, 0.0, 0.79), srow("exact", "t06-on", 10, 10, 0.8, 1.0)])
    row = r05.corruption_t06_on(served(summ))
    assert row.verdict == "reproduced" and row.note == sampling_note(10, "0/1 clean", "10/10 clean", True, True)


def test_sampling_rows_before_not_served_or_empty():
    after = srow("exact", "t06-off", 10, 10, 0.7, 1.0)
    row = r05.corruption_t06_off(served(pd.DataFrame([after])))
    assert row.verdict == "partly" and row.measured["clean_before"] is None and row.measured["before"] is None
    assert row.note == sampling_note(10, "not served", "10/10 clean", True, False)
    row = r05.corruption_t06_off(served(pd.DataFrame([srow("none", "t06-off", 0, 0, 0, 0), after])))
    assert row.verdict == "partly" and row.measured["clean_before"] == 0
    assert row.note == sampling_note(10, "0/0 clean", "10/10 clean", True, False)


def test_sampling_rows_not_run_and_each_claims_sampling():
    for rule, sampling in ((r05.corruption_t0_off_15, "t0-off-a"), (r05.corruption_t0_off_10, "t0-off-b"),
                           (r05.corruption_t06_on, "t06-on"), (r05.corruption_t06_off, "t06-off")):
        why = Row.not_run(f"sampling config {sampling!r} with clamp mode 'exact' was not served in this run")
        assert rule(served(pd.DataFrame([srow("exact", "other", 1, 1, 0.5, 1.0)]))) == why
        assert rule(served(pd.DataFrame([srow("exact", sampling, 0, 0, 0, 0)]))) == why
        assert rule(served(pd.DataFrame([srow("none", sampling, 1, 1, 0.0, 0.1),
                                         srow("exact", sampling, 1, 1, 0.5, 1.0)]))).measured["sampling"] == sampling


def exec_rows(*rows) -> pd.DataFrame:
    cols = ("task_id", "clamp", "sampling", "detector", "passed", "exec_outcome", "exec_exception", "isolation")
    return pd.DataFrame([dict(zip(cols, r, strict=True)) for r in rows])


@pytest.fixture
def ids(monkeypatch):
    seen = []

    def fake(p, n):
        seen.append((p, n))
        return ["T1", "T2", "T3", "T4"][:n]

    monkeypatch.setattr(r05, "claim_task_ids", fake)
    return seen


def test_executed_row_in_full(ids):
    df = exec_rows(("T1", "exact", "t0-off-a", "clean", True, "passed", None, "bwrap"),
                   ("T2", "exact", "t0-off-a", "junk", False, "failed", "AssertionError", "subprocess-unsafe"),
                   ("T3", "exact", "t0-off-a", "clean", False, None, None, None),
                   ("T4", "exact", "t0-off-a", "clean", False, "failed", None, "bwrap"),        # not a claim task
                   ("T1", "none", "t0-off-a", "clean", False, "failed", None, "bwrap"),         # before mode
                   ("T1", "exact", "t0-off-b", "clean", False, "failed", None, "bwrap"),        # other sampling
                   ("T3", "exact", "t0-off-a", "request_failed", False, None, None, None))  # no answer
    p = params()
    row = r05.corruption_executed(served(df=df, p=p))
    assert ids == [(p, 3)]
    assert row == Row({"passed": 1, "n": 3, "outcomes": {"passed": 1, "failed": 1, "no_code": 1},
                       "sampling": "t0-off-a", "clamp": "exact"}, "contradicted", EV,
                      "first 3 claim tasks, sampling t0-off-a, clamp exact, executed against their assertions in the "
                      "sandbox (bwrap, subprocess-unsafe); failed: T2: failed (AssertionError); T3: no code." + UNSAFE,
                      "sglang 0.5.23")


def test_executed_all_pass_and_refusals(ids):
    df = exec_rows(("T1", "exact", "t0-off-a", "clean", True, "passed", None, None),
                   ("T2", "exact", "t0-off-a", "clean", True, "passed", None, None))
    assert r05.corruption_executed(served(df=df)) == Row(
        {"passed": 2, "n": 2, "outcomes": {"passed": 2}, "sampling": "t0-off-a", "clamp": "exact"}, "reproduced", EV,
        "first 3 claim tasks, sampling t0-off-a, clamp exact, executed against their assertions in the sandbox "
        "(nothing executed).", "sglang 0.5.23")
    assert r05.corruption_executed(served(df=df, p=params(sampling=("t0-off-b",)))) == Row.not_run(
        "no answered requests for clamp 'exact', sampling 't0-off-b'")
    assert r05.corruption_executed(served(df=df, p=params(sampling=()))) == Row.not_run(
        "no answered requests for clamp 'exact', sampling None")
    assert r05.corruption_executed(served(df=df, p=params(executed_n=1))).measured["n"] == 1


def probe(*rows) -> pd.DataFrame:
    return pd.DataFrame([{"stream": s, "n": n, "content_empty": e, "answer_in_reasoning": a} for s, n, e, a in rows],
                        columns=["stream", "n", "content_empty", "answer_in_reasoning"])


def probe_note(*parts) -> str:
    return "reasoning parser 'ling3' on, thinking off, clamp exact: " + "; ".join(parts) + "."


def test_reasoning_parser_row_in_full():
    row = r05.serve_reasoning_parser(served(probe=probe((False, 5, 5, 5), (True, 4, 4, 4))))
    assert row == Row({"parser": "ling3", "non_stream": {"n": 5, "content_empty": 5, "answer_in_reasoning_content": 5},
                       "stream": {"n": 4, "content_empty": 4, "answer_in_reasoning_content": 4}}, "reproduced",
                      [Path("data/probe.parquet")],
                      probe_note("non_stream: content empty 5/5, answer in reasoning_content 5/5",
                                 "stream: content empty 4/4, answer in reasoning_content 4/4"), "sglang 0.5.23")
    assert r05.serve_reasoning_parser(served(probe=probe((False, 5, 5, 5)), probe_file=None)).evidence == []


@pytest.mark.parametrize("rows,verdict", [
    (((False, 5, 5, 5), (True, 0, 0, 0)), "reproduced"),    # a stream mode with no answer does not count
    (((False, 5, 5, 4), (True, 4, 4, 4)), "partly"),
    (((False, 5, 4, 5), (True, 4, 4, 4)), "partly"),
    (((False, 5, 1, 1), (True, 4, 0, 0)), "partly"),
    (((False, 5, 5, 0), (True, 4, 0, 4)), "contradicted"),
    (((False, 5, 0, 0),), "contradicted"),
])
def test_reasoning_parser_edges(rows, verdict):
    assert r05.serve_reasoning_parser(served(probe=probe(*rows))).verdict == verdict


def test_reasoning_parser_refusals():
    off = Row.not_run("the probe is switched off (corruption.reasoning_probe_parser is null)")
    none = Row.not_run("no answered probe request")
    assert r05.serve_reasoning_parser(served(p=params(parser=None))) == off
    assert r05.serve_reasoning_parser(served(p=params(parser=""), probe=probe())) == off
    assert r05.serve_reasoning_parser(served(probe=probe())) == none
    assert r05.serve_reasoning_parser(served(probe=probe((False, 0, 0, 0), (True, 0, 0, 0)))) == none


def test_cpu_pipeline():
    x = r05.CpuPipelineMeasurements({"measured": {"a": 1}, "verdict": "partly", "note": "ran"}, ["none", "exact"],
                                    "served stand-in X", EV, "cpu engine")
    assert r05.cpu_pipeline(x) == Row({"a": 1}, "partly", EV, "ran; clamp modes none, exact; served stand-in X",
                                      "cpu engine")


# --- the trained stand-in ------------------------------------------------------------------------------
def arm(name, same=5, n=8, ci=(0.25, 0.875), lp=-1.0) -> dict:
    return {"arm": name, "requests": n, "same_as_reference": same, "same_as_reference_ci": list(ci),
            "reference_logprob_mean": lp}


def arms(**over) -> dict:
    a = {"exact-bf16": arm("exact-bf16", 8, lp=-0.5), "exact-bf16-again": arm("exact-bf16-again", 8, lp=-0.5),
         "released-bf16": arm("released-bf16", 3, ci=(0.125, 0.75), lp=-0.75),
         "exact-nvfp4": arm("exact-nvfp4", 6, ci=(0.5, 1.0), lp=-0.5625),
         "approx-bf16": arm("approx-bf16", 7, ci=(0.5, 1.0), lp=-0.53125)}
    return {k: v for k, v in {**a, **over}.items() if v is not None}


def trained(a=None) -> r05.TrainedMeasurements:
    return r05.TrainedMeasurements(arms() if a is None else a, {"parameters": 1234567}, EV, "cpu engine")


TNOTE = ("toy scale: the project's trained stand-in (1,234,567 parameters, docs/trained-standin.md) on SGLang's real "
         "engine on this CPU, 8 HumanEval prompts, greedy; a mechanism, not the card's numbers")
DROP = ("released-bf16: 3 of 8 continuations as exact-bf16's (95 % 0.12-0.75), their tokens' mean logprob -0.2500 "
        "nats")


def test_trained_before_after_row_in_full():
    assert r05.trained_before_after(trained()) == Row(
        {"prompts": 8, "changed_by_dropping": 5, "changed_ci": [0.25, 0.875], "logprob_delta_nats": -0.25,
         "null_control_identical": 8}, "reproduced", EV,
        f"before (routed clamp dropped) vs after (Ling's form): {DROP}; null control: exact-bf16 relaunched matched on "
        f"all 8; code-level outcomes are in 05's table; {TNOTE}", "cpu engine")
    assert r05.trained_before_after(trained({})) is None


@pytest.mark.parametrize("same,lp,verdict", [
    (7, -0.5001, "reproduced"), (8, -0.75, "contradicted"), (3, -0.5, "contradicted"), (3, -0.25, "contradicted"),
])
def test_trained_before_after_edges(same, lp, verdict):
    row = r05.trained_before_after(trained(arms(**{"released-bf16": arm("released-bf16", same, lp=lp)})))
    assert row.verdict == verdict and row.measured["changed_by_dropping"] == 8 - same
    assert row.measured["logprob_delta_nats"] == round(lp + 0.5, 4)


def test_trained_refusals():
    for rule in (r05.trained_before_after, r05.trained_weights_vs_clamp, r05.trained_approx_gap):
        assert rule(trained({})) is None
        assert rule(trained(arms(**{"exact-bf16-again": None, "released-bf16": None}))) == Row.not_run(
            "arms not served: exact-bf16-again, released-bf16", evidence=EV)
        assert rule(trained({"x": arm("x")})) == Row.not_run(
            "arms not served: exact-bf16, exact-bf16-again, released-bf16" + {
                r05.trained_before_after: "", r05.trained_weights_vs_clamp: ", exact-nvfp4",
                r05.trained_approx_gap: ", approx-bf16"}[rule], evidence=EV)
        null = arms(**{"exact-bf16-again": arm("exact-bf16-again", 7, lp=-0.5)})
        assert rule(trained(null)) == Row.not_run(
            "the null control failed: the reference arm relaunched gave 7 of 8 continuations identical to its first "
            "launch, so a difference between arms cannot be told from the engine's own variation", evidence=EV)
        drift = arms(**{"exact-bf16-again": arm("exact-bf16-again", 8, lp=-0.5 + 2**-13)})
        assert rule(trained(drift)) == Row.not_run(
            "the null control failed: the relaunched reference scored its own tokens +0.00012 nats off the first "
            "launch, above 0.0001: logprob differences between arms are not readable", evidence=EV)
        below = arms(**{"exact-bf16-again": arm("exact-bf16-again", 8, lp=-0.5 - 2**-13)})
        assert rule(trained(below)).note.startswith("not run: the null control failed: the relaunched reference "
                                                     "scored its own tokens -0.00012 nats")
        # a difference of exactly the tolerance (0 and 1e-4: exact in float) is within it
        edge = arms(**{"exact-bf16": arm("exact-bf16", 8, lp=0.0), "exact-bf16-again": arm("exact-bf16-again", 8,
                                                                                            lp=1e-4)})
        assert rule(trained(edge)).verdict != "not run"
        within = arms(**{"exact-bf16-again": arm("exact-bf16-again", 8, lp=-0.5 + 2**-14)})
        assert rule(trained(within)).verdict != "not run"
    assert r05.trained_weights_vs_clamp(trained(arms(**{"exact-nvfp4": None}))) == Row.not_run(
        "arms not served: exact-nvfp4", evidence=EV)


def test_trained_measured_values_rounded():
    """Logprob deltas to 4 decimals, the changed share's interval to 3."""
    a = arms(**{"released-bf16": arm("released-bf16", 3, ci=(0.1234, 0.7654), lp=-0.7512345),
                "exact-nvfp4": arm("exact-nvfp4", 6, lp=-0.5123456), "approx-bf16": arm("approx-bf16", 7, lp=-0.5012345)})
    m = r05.trained_before_after(trained(a)).measured
    assert m["changed_ci"] == [0.235, 0.877] and m["logprob_delta_nats"] == -0.2512
    m = r05.trained_weights_vs_clamp(trained(a)).measured
    assert (m["nvfp4_weights_logprob_delta"], m["dropped_clamp_logprob_delta"]) == (-0.0123, -0.2512)
    m = r05.trained_approx_gap(trained(a)).measured
    assert (m["approx_logprob_delta"], m["dropped_logprob_delta"]) == (-0.0012, -0.2512)


def test_trained_weights_vs_clamp():
    w = ("exact-nvfp4: 6 of 8 continuations as exact-bf16's (95 % 0.50-1.00), their tokens' mean logprob -0.0625 "
         "nats")
    assert r05.trained_weights_vs_clamp(trained()) == Row(
        {"nvfp4_weights_logprob_delta": -0.0625, "dropped_clamp_logprob_delta": -0.25, "nvfp4_identical": 6,
         "dropped_identical": 3, "prompts": 8}, "reproduced", EV,
        f"weights: {w}; clamp: {DROP}. Both change greedy continuations; the likelihood cost separates them. NVFP4 "
        f"weight rounding only (decoded to BF16: the CPU engine has no FP4 MoE); {TNOTE}", "cpu engine")
    for lp, verdict in ((-0.25, "contradicted"), (-0.75, "contradicted"), (-0.2500001, "reproduced"),
                        (-0.7499999, "reproduced"), (-0.7500001, "contradicted"), (-1.5, "contradicted"),
                        (0.5, "contradicted"), (-0.4, "reproduced")):
        row = r05.trained_weights_vs_clamp(trained(arms(**{"exact-nvfp4": arm("exact-nvfp4", 6, lp=lp)})))
        assert row.verdict == verdict, lp


def test_trained_approx_gap():
    a = ("approx-bf16: 7 of 8 continuations as exact-bf16's (95 % 0.50-1.00), their tokens' mean logprob -0.0312 "
         "nats")
    assert r05.trained_approx_gap(trained()) == Row(
        {"approx_identical": 7, "dropped_identical": 3, "approx_logprob_delta": -0.0312, "dropped_logprob_delta": -0.25,
         "prompts": 8}, "reproduced", EV, f"approx: {a}; dropped: {DROP}; {TNOTE}", "cpu engine")
    for same, lp, verdict in ((4, -0.5, "reproduced"), (3, -0.5, "contradicted"), (2, -0.5, "contradicted"),
                              (7, -0.75, "contradicted"), (7, -0.7499, "reproduced"), (7, -0.25, "contradicted"), (7, -0.3, "reproduced"),
                              (7, -1.0, "contradicted")):
        row = r05.trained_approx_gap(trained(arms(**{"approx-bf16": arm("approx-bf16", same, lp=lp)})))
        assert row.verdict == verdict, (same, lp)
