"""Stage 07's claim rules (``stages/claim_rules/r07_determinism.py``) row by row, every field, on
hand-made identity counts (issue 37's mutation benchmark): each verdict's edges on both sides (all
identical or one short, more identical than without the mode or as many, tok/s on and past 15 % of
the card's), the not-run reasons, and the CPU engine's findings."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvfp4study.core.claim_rules import Row
from nvfp4study.stages.claim_rules import r07_determinism as r07

OFF, ON = "spec-off self-reproducibility", "spec-on vs spec-off"
DET, DET_PLAIN = "det spec-on vs det spec-off", "det spec-on vs plain spec-off"
CARDS = {"det.spec-on": {"identical": 1, "n": 5}, "det.deterministic-mode": {"identical": 4, "n": 5, "tok_s": 40.0}}
EV = [Path("data/det-pairs.json")]


def c(identical: int, compared: int, not_comparable: int = 0, first: str = "-") -> r07.IdentityCount:
    return r07.IdentityCount(identical, compared, not_comparable, first)


def x(counts: dict, tok: float | None = None, det: bool = True) -> r07.DeterminismMeasurements:
    return r07.DeterminismMeasurements(counts, tok, CARDS, spec_depth=3, repeats=4, deterministic_mode=det,
                                       evidence=EV, checked="sglang 0.5.23")


def test_from_row_and_counts_by_comparison():
    row = {"comparison": OFF, "identical prompts": 2, "prompts compared": 3, "not comparable (failed request)": 1,
           "first divergence (min..max)": "5..7"}
    assert r07.counts_by_comparison([row, {**row, "comparison": ON}]) == {OFF: c(2, 3, 1, "5..7"), ON: c(2, 3, 1, "5..7")}
    assert r07.no_pair(None) == "no comparable pair: no request of this comparison was recorded"
    assert r07.no_pair(c(0, 0, 6)) == "no comparable pair: all requests failed (6 prompt(s) with a failed request)"


def test_spec_off_rows():
    assert r07.det_spec_off(x({OFF: c(3, 3)})) == Row({"identical": 3, "n": 3, "repeats": 4}, "reproduced", EV,
                                                      "every greedy repeat equal to the first, token by token",
                                                      "sglang 0.5.23")
    assert r07.det_spec_off(x({OFF: c(2, 3)})).verdict == "contradicted"
    assert r07.det_spec_off(x({OFF: c(0, 0, 2)})) == Row.not_run(r07.no_pair(c(0, 0, 2)))
    assert r07.det_spec_off(x({})) == Row.not_run(r07.no_pair(None))


def test_spec_on_rows():
    note = ("NEXTN k=3 vs speculation off, repeat 0 of each. The card's count (1/5) depends on its prompts; the "
            "claim tested is that speculation is not byte-identical. Whether the differences are paraphrases was "
            "not judged automatically (texts in det-pairs.json).")
    assert r07.det_spec_on(x({ON: c(2, 3, first="4..9")})) == Row(
        {"identical": 2, "n": 3, "first_divergence": "4..9"}, "reproduced", EV, note, "sglang 0.5.23")
    assert r07.det_spec_on(x({ON: c(3, 3)})).verdict == "contradicted"
    assert r07.det_spec_on(x({ON: c(0, 0, 1)})) == Row.not_run(r07.no_pair(c(0, 0, 1)))
    assert r07.det_spec_on(x({})) == Row.not_run(r07.no_pair(None))


NOTE = ("deterministic spec-on vs deterministic spec-off; 'reproduced' needs more identical prompts than without "
        "the mode (or all identical) and decode tok/s within 15 % of the card (hardware-dependent)")


@pytest.mark.parametrize("det_c,on_c,tok,verdict", [
    (c(4, 4), c(1, 4), 40.0, "reproduced"),        # all identical, tok/s the card's
    (c(4, 4), c(4, 4), 46.0, "reproduced"),        # all identical (as many as without: still better), +15 % exactly
    (c(4, 4), c(1, 4), 34.0, "reproduced"),        # -15 % exactly
    (c(4, 4), c(1, 4), 46.1, "partly"),            # tok/s just past +15 %
    (c(4, 4), c(1, 4), 33.9, "partly"),            # just past -15 %
    (c(3, 4), c(2, 4), 40.0, "reproduced"),        # 3/4 > 2/4 without the mode
    (c(2, 4), c(2, 4), 40.0, "partly"),            # as many as without: not better; tok/s fine
    (c(2, 4), c(2, 4), 10.0, "contradicted"),      # neither
    (c(3, 4), c(0, 0, 4), 40.0, "partly"),         # plain spec-on had no pair: not all identical is not better
    (c(4, 4), c(0, 0, 4), None, "partly"),         # all identical; tok/s unknown
    (c(2, 4), c(2, 4), 0.0, "contradicted"),       # 0 tok/s counts as unknown
])
def test_deterministic_mode_verdict_edges(det_c, on_c, tok, verdict):
    row = r07.det_deterministic_mode(x({DET: det_c, ON: on_c}, tok))
    assert row.verdict == verdict
    assert row.note == NOTE + ("" if on_c.compared else "; plain spec-on had no comparable pair")


def test_deterministic_mode_row_in_full_and_not_run():
    row = r07.det_deterministic_mode(x({DET: c(3, 4), ON: c(1, 4), DET_PLAIN: c(2, 4)}, 41.23456789))
    assert row == Row({"identical": 3, "n": 4, "tok_s": 41.2346, "identical_vs_plain_spec_off": 2}, "reproduced", EV,
                      NOTE, "sglang 0.5.23")
    row = r07.det_deterministic_mode(x({DET: c(3, 4)}, None))
    assert row.measured == {"identical": 3, "n": 4, "tok_s": None, "identical_vs_plain_spec_off": None}
    assert row.note.endswith("; plain spec-on had no comparable pair") and row.verdict == "contradicted"
    assert r07.det_deterministic_mode(x({DET: c(4, 4)}, det=False)) == Row.not_run(
        "determinism.deterministic_mode is false")
    assert r07.det_deterministic_mode(x({DET: c(0, 0, 3)}, 40.0)) == Row.not_run(r07.no_pair(c(0, 0, 3)))
    assert r07.det_deterministic_mode(x({ON: c(1, 4)}, 40.0)) == Row.not_run(r07.no_pair(None))


def cpu(counts: dict, refusals: dict | None = None, det: bool = True) -> r07.CpuDeterminismMeasurements:
    return r07.CpuDeterminismMeasurements(
        counts, repeats=3, spec_depth=2, deterministic_mode=det, evidence=EV, refusals=refusals or {},
        refusal_evidence=[Path("raw/refused.json")],
        teardown={"measured": {"launches": 5, "left": 0}, "verdict": "reproduced", "note": "all gone"},
        patched={"measured": {"modes": 2}, "verdict": "partly", "note": "one mode"},
        lifecycle_evidence=[Path("data/serve-lifecycle.jsonl")], checked="cpu engine", standin_note="the stand-in")


def test_cpu_identity_findings():
    claim_off = "Greedy output without speculation is token-for-token identical across 3 repeats on SGLang's real engine."
    claim_on = ("Greedy output with NEXTN k=2 is token-for-token identical to greedy output without speculation on "
                "SGLang's real engine (fp32 on the CPU).")
    note = "output token ids compared, lengths first; the stand-in"
    assert r07.cpu_spec_off_self(cpu({OFF: c(3, 3)})) == Row(
        {"identical": 3, "n": 3, "first_divergence": "-"}, "reproduced", EV, note, "cpu engine", claim=claim_off)
    assert r07.cpu_spec_on_vs_off(cpu({ON: c(2, 3, first="1..1")})) == Row(
        {"identical": 2, "n": 3, "first_divergence": "1..1"}, "contradicted", EV, note, "cpu engine", claim=claim_on)
    assert r07.cpu_spec_off_self(cpu({OFF: c(0, 0, 3)})) == Row(None, "not run", [], r07.no_pair(c(0, 0, 3)),
                                                               claim=claim_off)
    assert r07.cpu_spec_on_vs_off(cpu({})) == Row(None, "not run", [], r07.no_pair(None), claim=claim_on)


def test_cpu_deterministic_mode_teardown_and_patched():
    m = cpu({}, {"det spec-on": "no backend", "det spec-off": "also no"})
    assert r07.cpu_deterministic_mode(m) == Row(
        None, "not run", [Path("raw/refused.json")],
        "needs an NVFP4-capable GPU (on this CPU SGLang refuses it with the CPU engine's attention backend: "
        "det spec-on: no backend; det spec-off: also no)")
    assert r07.cpu_deterministic_mode(cpu({})).note.endswith(
        "attention backend: SGLang did not refuse it (see the det rows))")
    assert r07.cpu_deterministic_mode(cpu({}, det=False)) is None
    life = [Path("data/serve-lifecycle.jsonl")]
    assert r07.cpu_engine_teardown(m) == Row({"launches": 5, "left": 0}, "reproduced", life, "all gone", "cpu engine")
    assert r07.cpu_engine_patched_modes(m) == Row({"modes": 2}, "partly", life, "one mode", "cpu engine")
