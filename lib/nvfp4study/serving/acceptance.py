"""Acceptance and throughput estimators of one speculative depth, from recorded request rows.

One data set gives different acceptance figures per estimator (fault F-10 in ``docs/faults.md``),
so each is computed separately and named wherever it is shown:

- **request-weighted**: median (and mean) of the per-request ``spec_accept_length`` /
  ``spec_accept_rate``, with the range over requests.
- **token-weighted**: sum of completion tokens / sum of verify passes; sum of correct drafts /
  sum of proposed drafts (long answers weigh more).
- **counter-delta, scoped**: Prometheus ``sglang:generation_tokens_total`` /
  ``sglang:spec_verify_calls_total`` deltas read just before and after each of our requests.
- **counter-delta, whole session**: the same counters from the server's start of measurement to
  its end: includes the warm-up, the other stages' requests and any other client.
- **SGLang decode log** (the card's): medians of the ``Decode batch`` lines inside our request
  windows (:mod:`nvfp4study.serving.decode_log`); its ``gen throughput (token/s)`` is the card's
  tok/s estimator, its ``accept len`` / ``accept rate`` the card's acceptance estimator.

Counter estimators give no accept rate directly; it is derived as (len - 1) / (draft tokens - 1)
(each verify pass yields the accepted drafts plus one bonus token), so it is labelled "derived".

A broken draft (fault F-08: a draft that is almost always rejected, for example an MTP layer
loaded in the wrong format) is recognised by :func:`broken_draft`.
"""

from __future__ import annotations

import statistics
from typing import Any

from . import decode_log

BROKEN_RATE = 0.10   # token-weighted accept rate below this ...
BROKEN_LEN = 1.10    # ... with accept length below this = broken draft (card: 0.00 / 1.00)
WORKING_RATE = 0.30  # accept rate at or above this = draft clearly working (3x the broken threshold;
                     # the card's working draft: 0.53-0.95 at k=1..3, claims.yaml mtp.k1-k3)


def median(xs: list[float]) -> float | None:
    """Median of ``xs``, None when empty."""
    return statistics.median(xs) if xs else None


def estimators(metrics: list[dict[str, Any]], draft_tokens: int | None,
               session: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """Acceptance of one depth by every per-request and counter estimator.

    Args:
        metrics: :func:`nvfp4study.serving.measure.request_metrics` of the depth's requests.
        draft_tokens: ``--speculative-num-draft-tokens`` (proposed per verify = this - 1).
        session: whole-session counter deltas ``{"d_gen": .., "d_verify": ..}`` or None.

    Returns:
        Rows ``{"estimator", "accept_len", "accept_rate", "rate_derived", "n", "len_min", "len_max",
        "rate_min", "rate_max"}`` (lengths in tokens per verify pass, rates in [0, 1]).
    """
    ok = [m for m in metrics if m["status"] == "ok" and m.get("verify_ct")]
    lens = [m["accept_len"] for m in ok if m["accept_len"] is not None]
    rates = [m["accept_rate"] for m in ok if m["accept_rate"] is not None]
    rng = {"len_min": min(lens, default=None), "len_max": max(lens, default=None),
           "rate_min": min(rates, default=None), "rate_max": max(rates, default=None)}
    none = dict.fromkeys(rng)

    def derived(length: float | None) -> float | None:
        if length is None or not draft_tokens or draft_tokens < 2:
            return None
        return (length - 1) / (draft_tokens - 1)

    rows = [
        {"estimator": "request-weighted median", "accept_len": median(lens), "accept_rate": median(rates),
         "rate_derived": False, "n": len(ok), **rng},
        {"estimator": "request-weighted mean", "accept_len": statistics.fmean(lens) if lens else None,
         "accept_rate": statistics.fmean(rates) if rates else None, "rate_derived": False, "n": len(ok), **rng},
    ]
    toks, ver = sum(m["completion_tokens"] for m in ok), sum(m["verify_ct"] for m in ok)
    corr, prop = sum(m["correct"] or 0 for m in ok), sum(m["proposed"] or 0 for m in ok)
    rows.append({"estimator": "token-weighted", "accept_len": toks / ver if ver else None,
                 "accept_rate": corr / prop if prop else None, "rate_derived": False, "n": len(ok), **none})
    scoped = [m for m in metrics if m["status"] == "ok" and m.get("d_verify")]
    dg, dv = sum(m["d_gen"] for m in scoped), sum(m["d_verify"] for m in scoped)
    length = dg / dv if dv else None
    rows.append({"estimator": "counter-delta, scoped to each request", "accept_len": length,
                 "accept_rate": derived(length), "rate_derived": True, "n": len(scoped), **none})
    if session and session.get("d_verify"):
        length = session["d_gen"] / session["d_verify"]
        rows.append({"estimator": "counter-delta, whole session (incl. warm-up, other requests and clients)",
                     "accept_len": length, "accept_rate": derived(length), "rate_derived": True,
                     "n": None, **none})
    return rows


def broken_draft(accept_len: float | None, accept_rate: float | None, draft_tokens: int | None) -> bool:
    """F-08: accept rate below :data:`BROKEN_RATE` and accept length below :data:`BROKEN_LEN` at
    more than one draft token."""
    return (draft_tokens is not None and draft_tokens > 1 and accept_rate is not None
            and accept_len is not None and accept_rate < BROKEN_RATE and accept_len < BROKEN_LEN)


def session_delta(launch_rows: list[dict[str, Any]], launches_used: set[int]) -> dict[str, float] | None:
    """Whole-session counter deltas ``{"d_gen", "d_verify"}`` summed over the launch records whose
    ``launch`` number is in ``launches_used`` (``metrics_start`` / ``metrics_end`` snapshots);
    None when no such launch has both snapshots."""
    dg = dv = 0.0
    found = False
    for r in launch_rows:
        s, e = r.get("metrics_start"), r.get("metrics_end")
        if r.get("launch") in launches_used and s and e:
            dg += e["sglang:generation_tokens_total"] - s["sglang:generation_tokens_total"]
            dv += e["sglang:spec_verify_calls_total"] - s["sglang:spec_verify_calls_total"]
            found = True
    return {"d_gen": dg, "d_verify": dv} if found else None


def log_summary(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """The card's estimator over parsed decode lines already kept to our windows
    (:func:`nvfp4study.serving.decode_log.study_lines`).

    Returns:
        ``{"log lines": n, "log gen tok/s median", "log gen tok/s min", "log gen tok/s max",
        "log accept len median", "log accept rate median"}`` (None where no line has the field;
        without speculation the accept fields are absent from SGLang's line).
    """
    a = decode_log.aggregates(lines)
    return {"log lines": len(lines), "log gen tok/s median": a["gen_tok_s"]["median"],
            "log gen tok/s min": a["gen_tok_s"]["min"], "log gen tok/s max": a["gen_tok_s"]["max"],
            "log accept len median": a["accept_len"]["median"],
            "log accept rate median": a["accept_rate"]["median"]}
