"""Stage 06's card rules (``stages/claim_rules/r06_mtp.py``) rows in full where tests/test_mtp.py
checks only some fields (issue 37's mutation benchmark): the best-depth row with two measured
depths decided by two estimators, and the speed-only off row on another GPU."""

from __future__ import annotations

from pathlib import Path

from nvfp4study.core.claim_rules import Row
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
