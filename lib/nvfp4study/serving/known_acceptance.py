"""The acceptance estimators against drafts whose acceptance is fixed by construction (the CPU
engine's control stand-ins of :mod:`nvfp4study.checkpoint.served`), and the estimators side by side
on one data set. Pure functions over recorded rows; stage 06 records the findings.
"""

from __future__ import annotations

from typing import Any

from . import acceptance
from .launch_env import CONTROL_LABELS

#: what each control stand-in's draft must give (``checkpoint/served.py``): rate, accept length
#: of a decode-log line as a function of the depth k.
KNOWN = {CONTROL_LABELS["agree"]: {"rate": 1.0, "log_len": lambda k: float(k + 1)},
         CONTROL_LABELS["disagree"]: {"rate": 0.0, "log_len": lambda k: 1.0}}
LOG_EST = "SGLang decode log"


def known_acceptance_rows(requests: list[dict[str, Any]], log_lines: list[dict[str, Any]], model: str,
                          depth: int) -> list[dict[str, Any]]:
    """Every estimator of one control stand-in beside the value its construction fixes (pure).

    Args:
        requests: :func:`nvfp4study.serving.measure.request_metrics` of its timed requests.
        log_lines: its parsed ``Decode batch`` lines inside our request windows.
        model: ``agree-draft`` or ``broken-draft`` (:data:`KNOWN`).
        depth: NEXTN depth k (k draft tokens proposed per verify pass, top-k 1).

    Expected values: accept rate 1 ("agree": target and draft both predict token 0) or 0
    ("disagree"); a decode-log line's accept length k+1 or 1 (it counts decode verify passes
    only); per request, ``spec_accept_length`` = completion tokens / verify passes
    (``managers/tokenizer_manager.py`` 3138-3172: the prefill token is counted, so it exceeds the
    log's by up to 1/verify passes) and the Prometheus deltas of ``generation_tokens_total`` /
    ``spec_verify_calls_total`` must give the same ratio.

    Returns:
        Rows ``{"model", "depth", "estimator", "quantity", "expected", "measured", "match"}``.
    """
    want = KNOWN[model]
    ok = [m for m in requests if m["status"] == "ok" and m.get("verify_ct")]
    rows = []

    def add(est: str, qty: str, expected: float, measured: float | None, tol: float = 1e-9) -> None:
        rows.append({"model": model, "depth": depth, "estimator": est, "quantity": qty, "expected": expected,
                     "measured": measured, "match": measured is not None and abs(measured - expected) <= tol})

    for i, m in enumerate(ok):
        add(f"response spec_tokens_details (request {i})", "accept rate", want["rate"], m["accept_rate"])
        add(f"response spec_tokens_details (request {i})", "accept length = completion tokens / verify passes",
            m["completion_tokens"] / m["verify_ct"], m["accept_len"])
        if m.get("d_verify"):
            add(f"/metrics deltas (request {i})", "generation tokens / verify calls",
                m["completion_tokens"] / m["verify_ct"], m["d_gen"] / m["d_verify"])
    lens = [ln["accept_len"] for ln in log_lines if ln.get("accept_len") is not None]
    rates = [ln["accept_rate"] for ln in log_lines if ln.get("accept_rate") is not None]
    # the log prints two decimals: a line matches when it rounds to the expected value
    add(f"{LOG_EST} ({len(lens)} lines)", "accept len, every line", want["log_len"](depth),
        None if not lens else max(lens, key=lambda x: abs(x - want["log_len"](depth))), tol=0.005)
    add(f"{LOG_EST} ({len(rates)} lines)", "accept rate, every line", want["rate"],
        None if not rates else max(rates, key=lambda x: abs(x - want["rate"])), tol=0.005)
    return rows



def estimator_spread(est_rows: list[dict[str, Any]], model: str = "study") -> dict[str, Any]:
    """Per depth of the sweep of ``model`` (the random-weight stand-in "study", or the trained
    stand-in "trained-bf16"): each estimator's accept length and rate, and the largest difference
    between estimators (pure). ``est_rows`` are :func:`estimator_table` rows."""
    out: dict[str, Any] = {}
    for r in est_rows:
        if r["model"] != model:
            continue
        d = out.setdefault(f"k={r['depth']}", {"accept_len": {}, "accept_rate": {}})
        d["accept_len"][r["estimator"]] = acceptance.round4(r["accept_len"])
        d["accept_rate"][r["estimator"]] = acceptance.round4(r["accept_rate"])
    for d in out.values():
        for q in ("accept_len", "accept_rate"):
            vals = [v for v in d[q].values() if v is not None]
            d[f"{q}_spread"] = acceptance.round4(max(vals) - min(vals)) if vals else None
    return out
