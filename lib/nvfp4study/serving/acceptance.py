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

from ..core.ledger import Verdict
from . import decode_log

BROKEN_RATE = 0.10   # token-weighted accept rate below this ...
BROKEN_LEN = 1.10    # ... with accept length below this = broken draft (card: 0.00 / 1.00)
WORKING_RATE = 0.30  # accept rate at or above this = draft clearly working (3x the broken threshold;
                     # the card's working draft: 0.53-0.95 at k=1..3, claims.yaml mtp.k1-k3)
SPEEDUP_TOL = 0.15   # broken draft's speedup within 15 % of the card's = reproduced (stages/claim_rules/r06_mtp.py TOKS_TOL[0])


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


def fmt2(x: float | None) -> str:
    """``x`` with two decimals, ``n/a`` for None (accept lengths and rates in notes)."""
    return "n/a" if x is None else f"{x:.2f}"


def round4(x: float | None) -> float | None:
    """``x`` rounded to 4 decimals for the ledger, None kept."""
    return None if x is None else round(float(x), 4)


def broken_draft_result(recs: list[dict[str, Any]], card: dict[str, Any]) -> dict[str, Any]:
    """The mtp.broken-draft verdict from rows of 06's summary table (pure; checked in the tests).

    The checkpoint tested is the one served as ``mtp.broken_model_path`` (model "broken-draft"), or
    else the first model flagged broken. Every speculative depth of it needs a token-weighted accept
    rate and length and a speedup over its depth 0; a missing value is named in the note and caps
    the verdict at "partly" (no value at all: not run).

    - reproduced: broken at every depth (:func:`broken_draft`), slower than no speculation at
      every depth, and each speedup within 15 % of the card's.
    - contradicted: the mis-declared checkpoint's draft works: every measured depth has an accept
      rate of at least :data:`WORKING_RATE`, well above the broken signature (< :data:`BROKEN_RATE`).
    - partly: anything between (some depths broken, speedups missing or not slower).

    Returns:
        ``{"measured", "sources" (the summary row of each measured value), "verdict", "note"}``, or
        ``{"not_run": reason}``.
    """
    spec = [r for r in recs if r["depth"]]
    models = [r["model"] for r in spec if r["model"] == "broken-draft"] or [r["model"] for r in spec if r["flag"]]
    if not models:
        tw = [f"k={r['depth']} rate {fmt2(r['accept rate (token-weighted)'])}" for r in spec]
        return {"not_run": "the served checkpoint's draft is not broken (" + ", ".join(tw) + "); set "
                "mtp.broken_model_path to a checkpoint with layer 42 mis-declared to test this claim"}
    model = models[0]
    mine = sorted((r for r in spec if r["model"] == model), key=lambda r: r["depth"])
    LEN, RATE, SP = "accept len (token-weighted)", "accept rate (token-weighted)", "speedup vs off (decode medians)"
    have_acc = [r for r in mine if r[LEN] is not None and r[RATE] is not None]
    if not have_acc:
        return {"not_run": f"model {model!r}: no accept length/rate measured at any speculative depth "
                           "(no successful request)"}
    acc_ids = {id(r) for r in have_acc}
    missing = [f"k={r['depth']} ({'acceptance' if id(r) not in acc_ids else 'speedup'})"
               for r in mine if id(r) not in acc_ids or r[SP] is None]
    hi = {k: max(have_acc, key=lambda r, k=k: r[k]) for k in (LEN, RATE)}  # sources: the rows they come from
    measured = {"accept_len": round4(hi[LEN][LEN]), "accept_rate": round4(hi[RATE][RATE]),
                "speedup": {str(r["depth"]): round4(r[SP]) for r in mine}}
    sources = {n: f"data/mtp-summary.json: model {model!r}, k={d}, {k!r}" for n, k, d in (
        ("accept_len", LEN, hi[LEN]["depth"]), ("accept_rate", RATE, hi[RATE]["depth"]),
        ("speedup", SP, ",".join(str(r["depth"]) for r in mine)))}
    broken = [r for r in have_acc if r["flag"]]
    working = [r for r in have_acc if r[RATE] >= WORKING_RATE]
    gaps = f"; not measured: {', '.join(missing)}" if missing else ""
    if model == "broken-draft" and len(working) == len(have_acc):
        rates = ", ".join(f"k={r['depth']} {fmt2(r[RATE])}" for r in have_acc)
        return {"measured": measured, "sources": sources, "verdict": Verdict.CONTRADICTED,
                "note": f"model {model!r} (layer 42 mis-declared): the draft works, token-weighted accept rate "
                        f"{rates} >= {WORKING_RATE}, far above the broken signature (< {BROKEN_RATE}){gaps}"}
    speeds = [r[SP] for r in mine]
    slower = all(x is not None and x < 1 for x in speeds)
    cs = card["speedup"]
    worse = all(abs(r[SP] - cs[r["depth"]]) / cs[r["depth"]] <= SPEEDUP_TOL if r[SP] is not None else False for r in mine if r["depth"] in cs)
    all_broken = len(broken) == len(mine)
    verdict = Verdict.REPRODUCED if all_broken and slower and worse and not missing else Verdict.PARTLY
    if None in speeds:
        speed_note = "slower than none not checked at every depth (speedup missing)"
    else:
        speed_note = "speculation slower than none at every depth" if slower else "not slower at every depth"
    return {"measured": measured, "sources": sources, "verdict": verdict,
            "note": f"model {model!r}: draft broken (accept rate < {BROKEN_RATE}, length < {BROKEN_LEN}) at "
                    f"{len(broken)} of {len(mine)} depths; {speed_note}{gaps}"}
