"""Stage 06's claim rules: the six ``06_mtp_sweep`` claims of ``core/claims.yaml`` (each depth,
the best depth, the broken draft) and the CPU engine's three findings, one function per ledger row.

The card's rows read :class:`MtpMeasurements` (the summary table's rows, one per model and depth).
A depth's verdict compares the card's numbers with the estimator the card used, SGLang's
``Decode batch`` log lines inside our request windows (:func:`deciding`); only when the log gives
no line there do the per-request estimators decide, and the note says so. Tolerances: tok/s and
speedup within :data:`TOKS_TOL` ``[0]`` of the card agree (``[1]`` = partly, for ``mtp.off``);
accept length and rate inside the card's range widened by :data:`RANGE_TOL`.

The findings read :class:`CpuMtpMeasurements` (the control stand-ins' known-acceptance checks, the
disagreeing draft's summary row and the estimators of the random-weight sweep).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ...core.claim_rules import Row, claim_rule, finding_rule
from ...core.ledger import Verdict
from ...serving import acceptance
from ...serving.server import STANDIN_NOTE

#: The GPU class the card's tok/s belong to: its 22.6 tok/s speculation-off baseline fits a DGX
#: Spark (GB10, 273 GB/s) and lies far below any other Blackwell card's decode ceiling
#: (workstation/bound.py, ``ceiling_table`` of stage 06). On another GPU an absolute tok/s says
#: nothing about the card's claim: only speedup and acceptance are compared there.
CARD_SPEED_GPU = "NVIDIA DGX Spark (GB10)"
TOKS_TOL = (0.15, 0.30)  # tok/s and speedup vs the card: reproduced within 15 %, partly within 30 %
RANGE_TOL = 0.05     # accept length / rate: within the card's range widened by this
CARD_IDS = {0: "mtp.off", 1: "mtp.k1", 2: "mtp.k2", 3: "mtp.k3"}


@dataclass(frozen=True)
class MtpMeasurements:
    """The sweep's summary, as the card's stage-06 rules read it (the stage builds it once)."""

    STAGE: ClassVar[str] = "06_mtp_sweep"
    records: list[dict[str, Any]]  # every summary_table row (model, depth, tok/s, acceptance, flag, ...)
    evidence: list[Path]  # data/mtp-summary.json, mtp-requests.json, mtp-estimators.json, the raw files
    checked: str  # checked_on: "sglang <version>" (and the replayed run)
    card: dict[str, Any]  # claim id -> the card's value (claims.yaml)
    gpu: str | None = None  # the served GPU's name (nvidia-smi); None: not known (tok/s compared as given)

    @property
    def speed_mismatch(self) -> str | None:
        """Why this run's absolute tok/s cannot be compared with the card's (the served GPU is
        known and is not of :data:`CARD_SPEED_GPU`'s class), or None when they can."""
        if self.gpu is None:
            return None
        from ...workstation.bound import UnknownGPU, gpu_bandwidth

        try:
            name, bw = gpu_bandwidth(self.gpu)
        except UnknownGPU:
            name, bw = None, None
        if name == CARD_SPEED_GPU:
            return None
        band = f" ({bw / 1e9:g} GB/s)" if bw else ""
        return (f"tok/s not compared: the card's tok/s are of a {CARD_SPEED_GPU}-class GPU (273 GB/s) and this "
                f"run served on {self.gpu}{band}")

    @property
    def study(self) -> dict[int, dict[str, Any]]:
        """The served checkpoint's (model "study") summary row per depth, in the table's order."""
        return {int(r["depth"]): r for r in self.records if r["model"] == "study"}


def _within(x: float | None, card: float, tol: tuple[float, float]) -> int:
    """2 = within tol[0] (relative), 1 = within tol[1], 0 = outside or missing."""
    if x is None:
        return 0
    r = abs(x - card) / card
    return 2 if r <= tol[0] else 1 if r <= tol[1] else 0


def _in_range(x: float | None, rng: list[float]) -> bool:
    return x is not None and rng[0] - RANGE_TOL <= x <= rng[1] + RANGE_TOL


LOG_NAME = "SGLang decode log (the card's estimator): median gen throughput tok/s, accept len, accept rate of the lines in our request windows"
REQ_NAME = ("per-request estimators (NOT the card's: no decode log line in our request windows): median decode "
            "tok/s, token-weighted accept length and rate")


def deciding(row: dict[str, Any]) -> dict[str, Any]:
    """The values a verdict compares with the card, from one summary table row.

    The card's own estimator decides (SGLang's decode log inside our request windows) whenever it
    has a line with ``gen throughput`` there (and, at a speculative depth, ``accept len``);
    otherwise the per-request estimators decide and the name says so.

    Returns:
        ``{"estimator": name, "tok_s", "speedup", "accept_len", "accept_rate"}`` (tok/s, x, tokens
        per verify pass, fraction; None where not measured).
    """
    log_ok = bool(row.get("log lines")) and row.get("log gen tok/s median") is not None and (
        not row["depth"] or row.get("log accept len median") is not None)
    if log_ok:
        return {"estimator": LOG_NAME, "tok_s": row["log gen tok/s median"],
                "speedup": row.get("speedup vs off (log gen tok/s medians)"),
                "accept_len": row.get("log accept len median"), "accept_rate": row.get("log accept rate median")}
    return {"estimator": REQ_NAME, "tok_s": row["decode tok/s median"],
            "speedup": row.get("speedup vs off (decode medians)"),
            "accept_len": row.get("accept len (token-weighted)"), "accept_rate": row.get("accept rate (token-weighted)")}


TOL_NOTE = (f"tolerances: tok/s and speedup within {TOKS_TOL[0]:.0%} of the card agree ({TOKS_TOL[1]:.0%} = partly "
            f"for mtp.off; tok/s is hardware-dependent), accept length and rate within the card's range "
            f"+- {RANGE_TOL}")


def _measured(depth: int, row: dict[str, Any], d: dict[str, Any]) -> dict[str, Any]:
    """A depth row's ``measured``: the deciding values and both estimator families beside them."""
    r4 = acceptance.round4
    measured = {"estimator": "decode log" if d["estimator"] == LOG_NAME else "per request",
                "tok_s": r4(d["tok_s"]), "n": row["requests ok"],
                "decode_log": {"lines": row.get("log lines"), "gen_tok_s": r4(row.get("log gen tok/s median")),
                               "gen_tok_s_range": [r4(row.get("log gen tok/s min")), r4(row.get("log gen tok/s max"))]},
                "per_request": {"decode_tok_s": r4(row["decode tok/s median"]),
                                "decode_tok_s_range": [r4(row["decode tok/s min"]), r4(row["decode tok/s max"])],
                                "e2e_tok_s": r4(row["e2e tok/s median"])}}
    if depth == 0:
        return measured
    measured.update(speedup=r4(d["speedup"]), accept_len=r4(d["accept_len"]), accept_rate=r4(d["accept_rate"]),
                    texts_identical_to_off=row["texts identical to off"])
    measured["decode_log"].update(accept_len=r4(row.get("log accept len median")),
                                  accept_rate=r4(row.get("log accept rate median")),
                                  speedup=r4(row.get("speedup vs off (log gen tok/s medians)")))
    measured["per_request"].update(
        speedup=r4(row["speedup vs off (decode medians)"]),
        accept_len_token_weighted=r4(row["accept len (token-weighted)"]),
        accept_len_range=[r4(row["accept len min"]), r4(row["accept len max"])],
        accept_rate_token_weighted=r4(row["accept rate (token-weighted)"]),
        accept_rate_range=[r4(row["accept rate min"]), r4(row["accept rate max"])])
    return measured


def _depth(x: MtpMeasurements, depth: int) -> Row:
    """The ``mtp.off`` / ``mtp.k<depth>`` row: the card's tok/s, speedup, accept length and accept
    rate against :func:`deciding`'s values; reproduced when all four agree (depth 0: tok/s within
    15 %, partly within 30 %), partly when some do, contradicted when none; not run when the depth
    was not swept or had no successful request."""
    row = x.study.get(depth)
    if row is None or row["decode tok/s median"] is None:
        return Row.not_run(f"depth {depth} not in mtp.depths or no successful request")
    card, d = x.card[CARD_IDS[depth]], deciding(row)
    measured = _measured(depth, row, d)
    tok = _within(d["tok_s"], card["tok_s"], TOKS_TOL)
    mismatch = x.speed_mismatch
    if depth == 0:
        if mismatch:  # the row is only a tok/s: measured and shown, not judged
            return Row(measured, Verdict.NOT_RUN, x.evidence, f"not run: {mismatch}; measured shown", x.checked)
        return Row(measured, [Verdict.CONTRADICTED, Verdict.PARTLY, Verdict.REPRODUCED][tok], x.evidence,
                   f"decided by {d['estimator']}; {TOL_NOTE}", x.checked)
    checks = {"tok/s": tok == 2, "speedup": _within(d["speedup"], card["speedup"], TOKS_TOL) == 2,
              "accept length": _in_range(d["accept_len"], card["accept_len"]),
              "accept rate": _in_range(d["accept_rate"], card["accept_rate"])}
    if mismatch:
        del checks["tok/s"]
    ok = list(checks.values())
    verdict = Verdict.REPRODUCED if all(ok) else Verdict.PARTLY if any(ok) else Verdict.CONTRADICTED
    note = (f"{sum(ok)}/{len(ok)} of {', '.join(checks)} agree; decided by {d['estimator']}; {TOL_NOTE}"
            + (f"; {mismatch}" if mismatch else ""))
    if row.get("note"):
        note += "; " + row["note"]
    return Row(measured, verdict, x.evidence, note, x.checked)


@claim_rule("mtp.broken-draft", MtpMeasurements)
def mtp_broken_draft(x: MtpMeasurements) -> Row:
    """:func:`nvfp4study.serving.acceptance.broken_draft_result` on the summary rows (its rules are
    in its docstring); ``sources`` names the summary row of each measured value."""
    res = acceptance.broken_draft_result(x.records, x.card["mtp.broken-draft"])
    if "not_run" in res:
        return Row.not_run(res["not_run"])
    return Row(res["measured"], res["verdict"], x.evidence, res["note"], x.checked, res.get("sources"))


@claim_rule("mtp.off", MtpMeasurements)
def mtp_off(x: MtpMeasurements) -> Row:
    """Depth 0 (speculation off): tok/s only."""
    return _depth(x, 0)


@claim_rule("mtp.k1", MtpMeasurements)
def mtp_k1(x: MtpMeasurements) -> Row:
    """NEXTN k=1: tok/s, speedup, accept length and rate (:func:`_depth`)."""
    return _depth(x, 1)


@claim_rule("mtp.k2", MtpMeasurements)
def mtp_k2(x: MtpMeasurements) -> Row:
    """NEXTN k=2: tok/s, speedup, accept length and rate (:func:`_depth`)."""
    return _depth(x, 2)


@claim_rule("mtp.k3", MtpMeasurements)
def mtp_k3(x: MtpMeasurements) -> Row:
    """NEXTN k=3: tok/s, speedup, accept length and rate (:func:`_depth`)."""
    return _depth(x, 3)


@claim_rule("mtp.k2-best", MtpMeasurements)
def mtp_k2_best(x: MtpMeasurements) -> Row:
    """Reproduced when depth 2 has the highest :func:`deciding` tok/s of the swept depths (at least
    two measured), else contradicted."""
    dec = {d: deciding(r) for d, r in x.study.items()}
    meds = {d: v["tok_s"] for d, v in dec.items() if v["tok_s"] is not None}
    if len(meds) < 2:
        return Row.not_run("fewer than two depths measured")
    best = max(meds, key=meds.get)
    names = sorted({dec[d]["estimator"] for d in meds})
    return Row({"best_depth": best, "tok_s": {str(k): acceptance.round4(v) for k, v in meds.items()}},
               Verdict.REPRODUCED if best == 2 else Verdict.CONTRADICTED, x.evidence,
               "best depth by tok/s over the swept depths; decided by " + " and ".join(names), x.checked)


# --- the CPU engine: estimators against acceptance known by construction ---------------------
@dataclass(frozen=True)
class CpuMtpMeasurements:
    """The CPU engine's sweep, as the stage-06 findings read it (the stage builds it once)."""

    STAGE: ClassVar[str] = "06_mtp_sweep"
    known: list[dict[str, Any]]  # known_acceptance_table rows: model, depth, estimator, quantity, measured, expected, match
    disagree: dict[str, Any] | None  # the disagreeing control draft's first summary row (None: not swept)
    spread: dict[str, Any]  # serving.known_acceptance.estimator_spread of the estimator table
    evidence: list[Path]  # the sweep's evidence (as MtpMeasurements.evidence)
    known_evidence: list[Path]  # data/mtp-known-acceptance.json, then ``evidence``
    checked: str  # the engine's summary
    sweep_model: str = "study"  # the depth sweep's model label: the random stand-in or "trained-bf16"


@finding_rule("mtp.cpu-known-acceptance", CpuMtpMeasurements,
              claim="On SGLang's real engine, every acceptance estimator (decode-log line, response "
                    "spec_tokens_details, /metrics deltas) gives the value a draft of known acceptance fixes: "
                    "accept length k+1 and rate 1 when target and draft always agree, 1 and 0 when they never do.")
def mtp_cpu_known_acceptance(x: CpuMtpMeasurements) -> Row | None:
    """Reproduced when every check of every control stand-in matches; recorded only when a control
    stand-in was swept."""
    known = x.known
    if not known:
        return None
    bad = [r for r in known if not r["match"]]
    return Row({m: {"depth": next(r["depth"] for r in known if r["model"] == m),
                    "checks": sum(1 for r in known if r["model"] == m),
                    "matching": sum(1 for r in known if r["model"] == m and r["match"])}
                for m in dict.fromkeys(r["model"] for r in known)},
               Verdict.CONTRADICTED if bad else Verdict.REPRODUCED, x.known_evidence,
               ("all match" if not bad else "mismatches: " + "; ".join(
                   f"{r['model']} {r['estimator']} {r['quantity']}: {r['measured']} (expected {r['expected']})"
                   for r in bad[:4])) + f"; {STANDIN_NOTE} with the draft constructions of checkpoint/served.py",
               x.checked)


@finding_rule("mtp.cpu-broken-draft-signature", CpuMtpMeasurements,
              claim="A draft head that never agrees with the target gives, on SGLang's real engine, the card's "
                    "broken-draft signature in the decode log (accept len: 1.00, accept rate: 0.00), and the study's "
                    "F-08 check flags it.")
def mtp_cpu_broken_draft_signature(x: CpuMtpMeasurements) -> Row | None:
    """Reproduced when the disagreeing draft's decode-log medians print as 1.00 and 0.00 and 06's
    F-08 flag is set; recorded only when that draft was swept."""
    r = x.disagree
    if r is None:
        return None
    log_len, log_rate = r.get("log accept len median"), r.get("log accept rate median")
    sig = log_len is not None and log_rate is not None and f"{log_len:.2f}" == "1.00" and f"{log_rate:.2f}" == "0.00"
    return Row({"depth": r["depth"], "log_accept_len": acceptance.round4(log_len),
                "log_accept_rate": acceptance.round4(log_rate), "log_lines": r.get("log lines"),
                "token_weighted_rate": acceptance.round4(r["accept rate (token-weighted)"]), "flag": r["flag"]},
               Verdict.REPRODUCED if sig and r["flag"] else Verdict.CONTRADICTED, x.known_evidence,
               f"the stand-in's draft always proposes token 1, its target always picks token 0 (checkpoint/served.py "
               f"'disagree'); {STANDIN_NOTE}", x.checked)


@finding_rule("mtp.cpu-estimators", CpuMtpMeasurements,
              claim="The NEXTN sweep runs on SGLang's real engine at every depth of mtp.depths, and the three "
                    "acceptance estimators (decode log, response meta_info, /metrics) are measured side by side "
                    "on one data set.")
def mtp_cpu_estimators(x: CpuMtpMeasurements) -> Row | None:
    """Reproduced when the estimators were measured at a depth of the sweep (a description of the
    pipeline, never compared with the card); recorded only then."""
    if not x.spread:
        return None
    trained = x.sweep_model.startswith("trained")
    served = ("served stand-in: the trained BF16 all-MLA model in Ling's layout (its NEXTN head trained), not the "
              "NVFP4 hybrid checkpoint of 01-03" if trained else STANDIN_NOTE)
    return Row(x.spread, Verdict.REPRODUCED, x.evidence,
               f"toy scale ({'the trained stand-in' if trained else 'random weights'}, a few short prompts): these "
               "numbers describe the pipeline and its estimators, never the card's table; per-request lengths count "
               f"the prefill token, the log's do not; {served}", x.checked)


#: the estimator the trained-head finding reads (every request's accepted / proposed draft tokens).
TRAINED_ESTIMATOR = "token-weighted"


@finding_rule("mtp.trained-acceptance", CpuMtpMeasurements,
              claim="On the trained stand-in's NEXTN head, served by SGLang's real engine, deeper drafting "
                    "accepts a smaller share of draft tokens: the accept rate falls from k=1 to k=3, the shape of "
                    "the card's table (0.85-0.95, 0.81-0.85, 0.53-0.63).")
def mtp_trained_acceptance(x: CpuMtpMeasurements) -> Row | None:
    """Reproduced when the token-weighted accept rate falls strictly with depth over the swept
    depths, contradicted otherwise (the accept length is reported: the card's itself stops growing
    after k=2); recorded only when the sweep served the trained stand-in."""
    if not x.sweep_model.startswith("trained"):
        return None
    depths = sorted((int(k.split("=")[1]), v) for k, v in x.spread.items() if k != "k=0")
    pts = [(d, v["accept_rate"].get(TRAINED_ESTIMATOR), v["accept_len"].get(TRAINED_ESTIMATOR)) for d, v in depths]
    if len(pts) < 2 or any(r is None or n is None for _, r, n in pts):
        return Row.not_run("the trained sweep has fewer than two depths with a token-weighted estimate",
                           evidence=x.evidence)
    falls = all(a[1] > b[1] for a, b in zip(pts, pts[1:], strict=False))
    measured = {f"k={d}": {"accept_rate": r, "accept_len": n} for d, r, n in pts}
    words = ", ".join(f"k={d}: rate {r:.3f}, length {n:.2f}" for d, r, n in pts)
    note = (f"{TRAINED_ESTIMATOR} estimator ({words}); all estimators in mtp.cpu-estimators. Toy scale: the "
            "trained stand-in (docs/trained-standin.md), exact clamp, chat prompts of mtp.prompts; its shape is "
            "compared with the card's, never its numbers")
    return Row(measured, Verdict.REPRODUCED if falls else Verdict.CONTRADICTED, x.evidence, note, x.checked)


# --- the card's tok/s against the memory-bandwidth ceiling (no GPU needed) ---------------------
@dataclass(frozen=True)
class CeilingMeasurements:
    """The card's tok/s per depth over the batch-1 decode ceiling of each card-class GPU
    (:func:`nvfp4study.workstation.bound.card_table` on the real layout), as the finding reads it."""

    STAGE: ClassVar[str] = "06_mtp_sweep"
    rows: list[dict[str, Any]]  # bound.card_table rows: gpu, depth, "card / ceiling", ...
    gpus: tuple[str, ...]  # bound.CARD_CLASS, in its order
    bytes_per_token_gb: float  # bytes read per token of the NVFP4 layout, GB (1e9), 3 decimals
    evidence: list[Path]  # data/mtp-ceiling.json


@finding_rule("mtp.bandwidth-ceiling", CeilingMeasurements,
              claim="The card's tok/s (22.60 off, 40.19 / 45.1 / 40.48 at k=1/2/3) lie below the batch-1 decode "
                    "ceiling (memory bandwidth / bytes read per token of the NVFP4 layout) of each Blackwell GPU a "
                    "128 GB-class card can mean; the fraction of the ceiling says which GPU class the numbers fit.")
def bandwidth_ceiling(x: CeilingMeasurements) -> Row:
    """Reproduced when every card tok/s is below its GPU's ceiling; the note gives each GPU's range."""
    frac = {g: {str(r["depth"]): acceptance.round4(r["card / ceiling"]) for r in x.rows if r["gpu"] == g}
            for g in x.gpus}
    rng = {g: (min(v.values()), max(v.values())) for g, v in frac.items()}
    return Row({"card_over_ceiling": frac, "bytes_per_token_gb": x.bytes_per_token_gb},
               Verdict.REPRODUCED if all(r["card / ceiling"] < 1 for r in x.rows) else Verdict.CONTRADICTED,
               x.evidence,
               "card tok/s / ceiling: " + "; ".join(f"{g} {lo:.0%}-{hi:.0%}" for g, (lo, hi) in rng.items())
               + ". Ceiling: weights read once per pass (verify of k+1 tokens reads the dense weights once, the same "
                 "top_k experts; draft steps counted), accept length = middle of the card's range; KV cache and state "
                 "reads not counted, so the true limit is lower. Bandwidths: vendor figures (see data/mtp-ceiling.json "
                 "'source'), not verified from the vendor pages here.")
