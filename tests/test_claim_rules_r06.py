"""Stage 06's card rules (``stages/claim_rules/r06_mtp.py``) rows in full where tests/test_mtp.py
checks only some fields (issue 37's mutation benchmark): the best-depth row with two measured
depths decided by two estimators, and the speed-only off row on another GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvfp4study.core.claim_rules import Row
from nvfp4study.serving.launch_env import STANDIN_NOTE
from nvfp4study.stages.claim_rules import r06_mtp as r06
from test_mtp import _depth_row

EV = [Path("data/mtp-summary.json")]


def test_best_depth_of_two_measured_depths_in_full():
    """Two depths measured is enough; depth 2 logged (the card's estimator), depth 1 without log
    lines (the per-request estimators): both names, ' and '-joined in sorted order."""
    rows = [{"model": "study", **_depth_row(1, **{"log lines": 0, "decode tok/s median": 50.0})},
            {"model": "study", **_depth_row(2, **{"log gen tok/s median": 45.0})},
            {"model": "study", **_depth_row(3, **{"decode tok/s median": None, "log lines": 0})}]
    row = r06.mtp_k2_best(r06.MtpMeasurements(rows, EV, "sglang 0.5.23", {}))
    assert row == Row({"best_depth": 1, "tok_s": {"1": 50.0, "2": 45.0}}, "contradicted", EV,
                      "best depth by tok/s over the swept depths; decided by " + f"{r06.REQ_NAME} and {r06.LOG_NAME}"
                      if r06.REQ_NAME < r06.LOG_NAME else
                      "best depth by tok/s over the swept depths; decided by " + f"{r06.LOG_NAME} and {r06.REQ_NAME}",
                      "sglang 0.5.23")
    rows[1]["log gen tok/s median"] = 55.0
    assert r06.mtp_k2_best(r06.MtpMeasurements(rows, EV, "", {})).verdict == "reproduced"


def test_speed_only_off_row_on_another_gpu_is_shown_not_judged():
    row = {"model": "study", **_depth_row(0, **{"log gen tok/s median": 22.0, "log accept len median": None})}
    x = r06.MtpMeasurements([row], EV, "sglang 0.5.23", {"mtp.off": {"tok_s": 22.6}}, gpu="NVIDIA H100 80GB HBM3")
    res = r06.mtp_off(x)
    assert res.verdict == "not run" and res.evidence == EV and res.checked_on == "sglang 0.5.23"
    assert res.note == f"not run: {x.speed_mismatch}; measured shown" and res.measured["tok_s"] == 22.0


def test_k3_reads_depth_3():
    rows = [{"model": "study", **_depth_row(d)} for d in (2, 3)]
    card = {f"mtp.k{d}": {"tok_s": 44.0, "speedup": 1.9, "accept_len": [2.6, 2.7], "accept_rate": [0.8, 0.85]}
            for d in (2, 3)}
    rows[1]["log gen tok/s median"] = 10.0  # depth 3 only: its tok/s and nothing else disagrees
    x = r06.MtpMeasurements(rows, EV, "sglang 0.5.23", card)
    assert r06.mtp_k3(x).note.startswith("3/4 of tok/s, speedup, accept length, accept rate agree")
    assert r06.mtp_k2(x).note.startswith("4/4 of")
    assert r06.mtp_k3(r06.MtpMeasurements(rows[:1], EV, "", card)) == Row.not_run(
        "depth 3 not in mtp.depths or no successful request")


# --- mtp.broken-draft: the wrapper of acceptance.broken_draft_result ------------------------------
def test_broken_draft_passes_the_records_and_the_card_value_and_returns_every_field(monkeypatch):
    seen = []

    def fake(recs, card):
        seen.append((recs, card))
        return {"measured": {"a": 1}, "verdict": "partly", "note": "n", "sources": {"a": "row 2"}}

    monkeypatch.setattr(r06.acceptance, "broken_draft_result", fake)
    recs = [{"model": "broken-draft", "depth": 1}]
    x = r06.MtpMeasurements(recs, EV, "sglang 0.5.23", {"mtp.broken-draft": {"accept_len": 1.0}, "mtp.k1": {}})
    assert r06.mtp_broken_draft(x) == Row({"a": 1}, "partly", EV, "n", "sglang 0.5.23", {"a": "row 2"})
    assert seen == [(recs, {"accept_len": 1.0})]
    monkeypatch.setattr(r06.acceptance, "broken_draft_result",
                        lambda recs, card: {"measured": 2, "verdict": "reproduced", "note": "m"})
    assert r06.mtp_broken_draft(x) == Row(2, "reproduced", EV, "m", "sglang 0.5.23", None)
    monkeypatch.setattr(r06.acceptance, "broken_draft_result",
                        lambda recs, card: {"not_run": "no broken model", "measured": 1, "verdict": "partly"})
    assert r06.mtp_broken_draft(x) == Row(None, "not run", [], "not run: no broken model")


# --- the CPU engine's findings --------------------------------------------------------------------
KEV = [Path("data/mtp-known-acceptance.json"), *EV]


def cpu(known=(), disagree=None, spread=None, sweep_model="study") -> r06.CpuMtpMeasurements:
    return r06.CpuMtpMeasurements(list(known), disagree, spread or {}, EV, KEV, "cpu engine", sweep_model)


def known_row(model, depth, match, est="log", q="accept len", measured=1.0, expected=2.0):
    return {"model": model, "depth": depth, "estimator": est, "quantity": q, "measured": measured,
            "expected": expected, "match": match}


def test_known_acceptance_all_match():
    rows = [known_row("agree", 2, True), known_row("disagree", 1, True), known_row("agree", 3, True)]
    assert r06.mtp_cpu_known_acceptance(cpu(rows)) == Row(
        {"agree": {"depth": 2, "checks": 2, "matching": 2}, "disagree": {"depth": 1, "checks": 1, "matching": 1}},
        "reproduced", KEV, f"all match; {STANDIN_NOTE} with the draft constructions of checkpoint/served.py",
        "cpu engine")
    assert list(r06.mtp_cpu_known_acceptance(cpu(rows)).measured) == ["agree", "disagree"]
    assert r06.mtp_cpu_known_acceptance(cpu()) is None


def test_known_acceptance_mismatches_listed_first_four():
    rows = [known_row("disagree", 1, True)] + [
        known_row("agree", 2, False, est=f"e{i}", q=f"q{i}", measured=i, expected=i + 1) for i in range(5)]
    row = r06.mtp_cpu_known_acceptance(cpu(rows))
    assert row.verdict == "contradicted" and row.evidence == KEV and row.checked_on == "cpu engine"
    assert row.measured == {"disagree": {"depth": 1, "checks": 1, "matching": 1},
                            "agree": {"depth": 2, "checks": 5, "matching": 0}}
    assert row.note == ("mismatches: agree e0 q0: 0 (expected 1); agree e1 q1: 1 (expected 2); "
                        "agree e2 q2: 2 (expected 3); agree e3 q3: 3 (expected 4); "
                        f"{STANDIN_NOTE} with the draft constructions of checkpoint/served.py")
    one = r06.mtp_cpu_known_acceptance(cpu([known_row("agree", 2, True), known_row("agree", 2, False)]))
    assert one.verdict == "contradicted" and one.measured == {"agree": {"depth": 2, "checks": 2, "matching": 1}}
    assert one.note.startswith("mismatches: agree log accept len: 1.0 (expected 2.0); ")


SIG_NOTE = ("the stand-in's draft always proposes token 1, its target always picks token 0 (checkpoint/served.py "
            f"'disagree'); {STANDIN_NOTE}")


def disagree_row(ln=1.0, rate=0.0, flag="F-08", lines=7) -> dict:
    r = {"depth": 2, "log accept len median": ln, "log accept rate median": rate,
         "accept rate (token-weighted)": 0.012345, "flag": flag}
    return r if lines is None else {**r, "log lines": lines}


def test_broken_draft_signature_row_in_full():
    assert r06.mtp_cpu_broken_draft_signature(cpu(disagree=disagree_row(1.000049, 0.00004))) == Row(
        {"depth": 2, "log_accept_len": 1.0, "log_accept_rate": 0.0, "log_lines": 7, "token_weighted_rate": 0.0123,
         "flag": "F-08"}, "reproduced", KEV, SIG_NOTE, "cpu engine")
    assert r06.mtp_cpu_broken_draft_signature(cpu()) is None


@pytest.mark.parametrize("ln,rate,flag,verdict", [
    (1.004, 0.004, "F-08", "reproduced"),     # both print as 1.00 and 0.00
    (1.006, 0.0, "F-08", "contradicted"),     # prints 1.01
    (0.994, 0.0, "F-08", "contradicted"),     # prints 0.99
    (1.0, 0.006, "F-08", "contradicted"),     # prints 0.01
    (1.0, 0.0, "", "contradicted"),           # F-08 not flagged
    (None, 0.0, "F-08", "contradicted"), (1.0, None, "F-08", "contradicted"),
])
def test_broken_draft_signature_edges(ln, rate, flag, verdict):
    row = r06.mtp_cpu_broken_draft_signature(cpu(disagree=disagree_row(ln, rate, flag, lines=None)))
    assert row.verdict == verdict
    assert row.measured["log_lines"] is None
    assert row.measured["log_accept_len"] == (None if ln is None else round(ln, 4))
    assert row.measured["log_accept_rate"] == (None if rate is None else round(rate, 4))


SPREAD = {"k=1": {"accept_rate": {"token-weighted": 0.9}, "accept_len": {"token-weighted": 1.9}}}


def test_cpu_estimators_rows():
    assert r06.mtp_cpu_estimators(cpu()) is None
    assert r06.mtp_cpu_estimators(cpu(spread=SPREAD)) == Row(
        SPREAD, "reproduced", EV,
        "toy scale (random weights, a few short prompts): these numbers describe the pipeline and its estimators, "
        "never the card's table; per-request lengths count the prefill token, the log's do not; " + STANDIN_NOTE,
        "cpu engine")
    assert r06.mtp_cpu_estimators(cpu(spread=SPREAD, sweep_model="trained-bf16")) == Row(
        SPREAD, "reproduced", EV,
        "toy scale (the trained stand-in, a few short prompts): these numbers describe the pipeline and its "
        "estimators, never the card's table; per-request lengths count the prefill token, the log's do not; "
        "served stand-in: the trained BF16 all-MLA model in Ling's layout (its NEXTN head trained), not the NVFP4 "
        "hybrid checkpoint of 01-03", "cpu engine")
    assert r06.mtp_cpu_estimators(cpu(spread=SPREAD, sweep_model="xtrained")).note.endswith(STANDIN_NOTE)


def spread(*pts) -> dict:
    """``(depth, rate, length)`` -> an estimator spread keyed ``k=<depth>``, other estimators beside."""
    return {f"k={d}": {"accept_rate": {"token-weighted": r, "log": 0.5}, "accept_len": {"token-weighted": n, "log": 9}}
            for d, r, n in pts}


TRAINED_TAIL = ("all estimators in mtp.cpu-estimators. Toy scale: the trained stand-in (docs/trained-standin.md), "
                "exact clamp, chat prompts of mtp.prompts; its shape is compared with the card's, never its numbers")


def test_trained_acceptance_row_in_full():
    # given out of order, with k=0 (no draft) left out and a two-digit depth sorted as a number
    sp = {**spread((10, 0.5, 5.5), (1, 0.9, 1.9)), "k=0": {"accept_rate": {}, "accept_len": {}},
          **spread((2, 0.8, 2.6))}
    row = r06.mtp_trained_acceptance(cpu(spread=sp, sweep_model="trained-bf16"))
    assert row == Row({"k=1": {"accept_rate": 0.9, "accept_len": 1.9}, "k=2": {"accept_rate": 0.8, "accept_len": 2.6},
                       "k=10": {"accept_rate": 0.5, "accept_len": 5.5}}, "reproduced", EV,
                      "token-weighted estimator (k=1: rate 0.900, length 1.90, k=2: rate 0.800, length 2.60, "
                      "k=10: rate 0.500, length 5.50); " + TRAINED_TAIL, "cpu engine")
    assert list(row.measured) == ["k=1", "k=2", "k=10"]


@pytest.mark.parametrize("pts,verdict", [
    (((1, 0.9, 1.9), (2, 0.8, 2.6)), "reproduced"),
    (((1, 0.9, 1.9), (2, 0.9, 2.6)), "contradicted"),              # equal: does not fall
    (((1, 0.9, 1.9), (2, 0.95, 2.6)), "contradicted"),
    (((1, 0.9, 1.9), (2, 0.8, 2.6), (3, 0.85, 2.7)), "contradicted"),  # falls, then rises
    (((1, 0.9, 1.9), (2, 0.8, 2.6), (3, 0.7, 2.7)), "reproduced"),
])
def test_trained_acceptance_falls_strictly(pts, verdict):
    assert r06.mtp_trained_acceptance(cpu(spread=spread(*pts), sweep_model="trained")).verdict == verdict


def test_trained_acceptance_refusals():
    why = Row.not_run("the trained sweep has fewer than two depths with a token-weighted estimate", evidence=EV)
    assert r06.mtp_trained_acceptance(cpu(spread=spread((1, 0.9, 1.9), (2, 0.8, 2.6)))) is None  # not trained
    assert r06.mtp_trained_acceptance(cpu(spread=spread((1, 0.9, 1.9)), sweep_model="trained")) == why
    assert r06.mtp_trained_acceptance(cpu(spread=spread((1, 0.9, 1.9), (0, 0.8, 2.6)),
                                          sweep_model="trained")) == why  # k=0 does not count
    assert r06.mtp_trained_acceptance(cpu(spread=spread((1, 0.9, 1.9), (2, None, 2.6)),
                                          sweep_model="trained")) == why
    assert r06.mtp_trained_acceptance(cpu(spread=spread((1, 0.9, None), (2, 0.8, 2.6)),
                                          sweep_model="trained")) == why
    sp = spread((1, 0.9, 1.9), (2, 0.8, 2.6))
    del sp["k=2"]["accept_rate"]["token-weighted"]
    assert r06.mtp_trained_acceptance(cpu(spread=sp, sweep_model="trained")) == why


# --- the card's tok/s against the bandwidth ceiling -----------------------------------------------
CEV = [Path("data/mtp-ceiling.json")]
CEIL_TAIL = (". Ceiling: weights read once per pass (verify of k+1 tokens reads the dense weights once, the same "
             "top_k experts; draft steps counted), accept length = middle of the card's range; KV cache and state "
             "reads not counted, so the true limit is lower. Bandwidths: vendor figures (see data/mtp-ceiling.json "
             "'source'), not verified from the vendor pages here.")


def ceiling(*rows) -> r06.CeilingMeasurements:
    return r06.CeilingMeasurements([{"gpu": g, "depth": d, "card / ceiling": f, "other": 1} for g, d, f in rows],
                                   ("GB10", "RTX"), 12.345, CEV)


def test_bandwidth_ceiling_row_in_full():
    x = ceiling(("GB10", 0, 0.512345), ("RTX", 0, 0.1), ("GB10", 1, 0.9), ("RTX", 1, 0.0549))
    assert r06.bandwidth_ceiling(x) == Row(
        {"card_over_ceiling": {"GB10": {"0": 0.5123, "1": 0.9}, "RTX": {"0": 0.1, "1": 0.0549}},
         "bytes_per_token_gb": 12.345}, "reproduced", CEV,
        "card tok/s / ceiling: GB10 51%-90%; RTX 5%-10%" + CEIL_TAIL)


@pytest.mark.parametrize("top,verdict", [(0.9999, "reproduced"), (1.0, "contradicted"), (1.2, "contradicted")])
def test_bandwidth_ceiling_below_one_edge(top, verdict):
    row = r06.bandwidth_ceiling(ceiling(("GB10", 0, 0.5), ("RTX", 0, top), ("GB10", 1, 0.6), ("RTX", 1, 0.2)))
    assert row.verdict == verdict
