"""The plan of a run: every distinct server launch with its reason, its requests and generated
tokens, the disk the run writes, and an estimated wall time from stated assumptions.

``nvfp4study plan [--params FILE] [-p k=v] [--load-s S] [--tok-s DEPTH=TOKS ...] [--json]``.

Launches follow the stages' own serving plans (:mod:`nvfp4study.serving.plans`), read as the
one collector runs them: the stages share one launch per distinct configuration
(:func:`nvfp4study.serving.measure.collect` groups them;
:func:`~nvfp4study.serving.plans.plan_servers` orders them), 05's corruption sweep (one
configuration per ``corruption.clamp_modes`` entry), reasoning-parser probe and trained arms
included.

Assumptions of the time estimate (each printed with the plan):

- every launch takes ``load_s`` seconds to become healthy; default the card's ~300 s
  (claims.yaml ``load.time``), labelled "card's";
- every request generates its full ``max_tokens`` (an upper bound: greedy answers may stop
  early), at the single-request decode rate of its depth; default the card's tok/s per NEXTN
  depth (claims.yaml ``mtp.off``, ``mtp.k1``-``k3``; deterministic mode at k=2: ``det.deterministic-mode``),
  labelled "card's"; prefill time is not counted;
- with ``corruption.concurrency`` = c > 1 the corruption sweep's aggregate rate is the
  single-request rate times :func:`.bound.batch_speedup`: a batched decode step reads the dense
  weights once but the routed experts of every token, the expected number of distinct experts
  among c x (k+1) tokens each picking top_k of E, ``E * (1 - (1 - top_k/E)^tokens)``
  (:func:`.bound.distinct_experts`); for Ling (512 experts, top-8) at c = 8, k = 2 that is about
  2.1x, not 8x. Still an upper bound (KV-cache reads and compute not counted).

Each notebook runs its stage's server work in one cell, and papermill stops a cell after
``execution_timeout_s``: the plan sums each stage's launches (a launch shared by 04/06/07 runs in
the first of them) and warns when a stage would reach that limit (:func:`cell_warnings`).

The decode ceiling of the user's GPU (:mod:`.bound`: memory bandwidth / bytes read per token of
the layout, with and without MTP) is printed beside, so an assumed tok/s above it shows.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.params import Params, load_params
from ..serving.strategies import serves_standin

GB = 1e9
WARMUP_TOKENS = 64  # measure._serve's warm-up request: RequestSpec("warmup-i", 0, 64)


@dataclass
class Launch:
    """One server launch: configuration key, why (the stages that need it), requests, tokens."""

    config: str
    reason: str
    depth: int | None
    deterministic: bool
    requests: int
    tokens: int
    concurrency: int = 1
    stage: str = ""  # the notebook whose cell makes this launch
    batch_speedup: float = 1.0  # aggregate rate / single-request rate (bound.batch_speedup)
    seconds: float | None = None
    notes: list[str] = field(default_factory=list)


def card_assumptions() -> dict[str, Any]:
    """The card's load time and tok/s per depth, from claims.yaml (labelled "card's")."""
    from ..core.ledger import card_claims

    c = {r["id"]: r["card"] for r in card_claims()}
    tok = {0: c["mtp.off"]["tok_s"], 1: c["mtp.k1"]["tok_s"], 2: c["mtp.k2"]["tok_s"], 3: c["mtp.k3"]["tok_s"]}
    return {"load_s": float(c["load.time"]["load_s"]), "tok_s": tok,
            "tok_s_deterministic": {2: c["det.deterministic-mode"]["tok_s"]}, "source": "card's"}


def launches(params: Params) -> list[Launch]:
    """Every launch the serving stages make for ``params`` (no time yet): one per distinct
    configuration of the stages' serving plans (:func:`~nvfp4study.serving.plans.plan_servers`),
    with every request any stage asks it (:func:`~nvfp4study.serving.plans.needs`, warm-ups when
    a timed request is among them), made in the cell of the first stage that serves it (the one
    collector runs it there). The reason is each item's own ``what`` (05's sweep, probe and
    trained arms), else "needed by" the stages that serve it."""
    from ..serving import plans
    from .bound import batch_speedup, read_bytes

    p = params
    every = plans.stage_plans(p)
    out = []
    for c in plans.plan_servers(p):
        users = {s: [i for i in items if i.config == c] for s, items in every.items()}
        users = {s: its for s, its in users.items() if its}
        reqs = plans.needs(p, c, every)
        warm = p.mtp.warmup_requests if any(r.wants_warmup for r in reqs) else 0
        plain = [s for s, its in users.items() if any(not i.what for i in its)]
        whats = [i.what for its in users.values() for i in its if i.what]
        conc = c.max_running_requests or 1
        speed = batch_speedup(read_bytes(p.checkpoint.shape), conc, c.spec_depth or 0) if conc > 1 else 1.0
        out.append(Launch(c.key, "; ".join((["needed by " + ", ".join(plain)] if plain else []) + whats),
                          c.spec_depth, c.deterministic, len(reqs) + warm,
                          sum(r.max_tokens for r in reqs) + warm * WARMUP_TOKENS,
                          concurrency=conc, stage=next(iter(users)), batch_speedup=speed))
    return out


def estimate(plan: list[Launch], assumptions: dict[str, Any]) -> list[Launch]:
    """Fill ``seconds`` of each launch: ``load_s + tokens / (tok_s(depth) x batch_speedup)``.

    A depth without a rate leaves ``seconds`` None with a note (no number is invented)."""
    for launch in plan:
        d = launch.depth or 0
        rate = (assumptions.get("tok_s_deterministic", {}).get(d) if launch.deterministic else None) \
            or assumptions["tok_s"].get(d)
        if launch.deterministic and d not in assumptions.get("tok_s_deterministic", {}):
            launch.notes.append("deterministic mode: assumed at the non-deterministic rate")
        if rate is None:
            launch.notes.append(f"no tok/s assumption for depth {d}: pass --tok-s {d}=RATE")
            continue
        launch.seconds = assumptions["load_s"] + launch.tokens / (rate * launch.batch_speedup)
    return plan


def ceilings(params: Params, gpu: str | None = None) -> dict[str, Any]:
    """Decode tok/s ceilings per NEXTN depth of ``mtp.depths`` on the user's GPU
    (:mod:`.bound`; the layout of ``checkpoint.shape``, accept length = middle of the card's range,
    labelled so). ``gpu`` None: the first GPU ``nvidia-smi`` names.

    Returns ``{"gpu", "bandwidth_gbs", "source", "depths": {depth: {"ceiling_tok_s",
    "independent_routing_tok_s", "accept_len"}}}`` or ``{"gpu": None|name, "reason"}``."""
    from ..core.ledger import card_claims
    from . import bound, probes

    if gpu is None:
        smi = probes.nvidia_smi()
        if not smi or not smi["gpus"]:
            return {"gpu": None, "reason": "no NVIDIA GPU detected: pass --gpu NAME (known: " + ", ".join(bound.GPUS) + ")"}
        gpu = smi["gpus"][0]["name"]
    try:
        name, bw = bound.gpu_bandwidth(gpu)
    except bound.UnknownGPU as exc:
        return {"gpu": gpu, "reason": str(exc)}
    card = {r["id"]: r["card"] for r in card_claims()}
    rb = bound.read_bytes(params.checkpoint.shape)
    out = {}
    for d in sorted(set(params.mtp.depths)):
        al = None if not d else (sum(card[f"mtp.k{d}"]["accept_len"]) / 2 if f"mtp.k{d}" in card else None)
        if d and al is None:
            continue
        c = bound.ceiling(rb, bw, d, al)
        out[d] = {"ceiling_tok_s": c["ceiling_tok_s"], "independent_routing_tok_s": c["independent_routing_tok_s"],
                  "accept_len": al}
    return {"gpu": gpu, "table_name": name, "bandwidth_gbs": bw / 1e9, "source": bound.GPUS[name]["source"],
            "bytes_per_token_gb": rb.per_token() / GB, "depths": out}


def summary(params: Params, assumptions: dict[str, Any] | None = None, gpu: str | None = None) -> dict[str, Any]:
    """The whole plan: launches with times, totals, disk, and the batched-sweep saving.

    Returns ``{"launches": [...], "total_s", "serving": bool, "assumptions", "disk": [...],
    "concurrency_saving_s"}``; ``concurrency_saving_s`` compares ``corruption.concurrency`` with 1
    (None when it is 1)."""
    from ..core.paths import OUTPUTS
    from .preflight import disk_needs

    a = assumptions or card_assumptions()
    plan = estimate(launches(params), a)
    total = sum(x.seconds for x in plan if x.seconds is not None)
    saving = None
    if params.corruption.concurrency > 1:
        serial = params.model_copy(deep=True)
        serial.corruption.concurrency = 1
        saving = sum(x.seconds or 0 for x in estimate(launches(serial), a)) - total
    disk = [{"what": w, "folder": str(f), "gb": round(n / GB, 2)} for w, f, n in disk_needs(params, OUTPUTS)]
    gpu_run = params.server.enabled and not serves_standin(params) and not params.replay_from
    stages: dict[str, float] = {}
    for x in plan:
        stages[x.stage] = stages.get(x.stage, 0.0) + (x.seconds or 0.0)
    return {"launches": [asdict(x) for x in plan], "total_s": total, "serving": params.server.enabled,
            "stages_s": stages, "cell_limit_s": params.execution_timeout_s,
            # the card's GPU rates say nothing of the CPU engine's or a replay's time: warned only for a GPU run
            "warnings": cell_warnings(stages, params.execution_timeout_s) if gpu_run else [],
            "protocol": params.corruption.protocol,
            "assumptions": {**a, "tok_s": {str(k): v for k, v in a["tok_s"].items()},
                            "tok_s_deterministic": {str(k): v for k, v in a.get("tok_s_deterministic", {}).items()}},
            "disk": disk, "concurrency_saving_s": saving, "ceiling": ceilings(params, gpu)}


#: a stage estimated above this share of ``execution_timeout_s`` is warned about: the estimate
#: leaves out prefill and the first launch's kernel compilation (FlashInfer's fused MoE is
#: compiled on first use), so a stage near the limit may reach it.
CELL_MARGIN = 0.8


def cell_warnings(stages_s: dict[str, float], limit_s: float) -> list[str]:
    """One sentence per stage whose estimated seconds reach :data:`CELL_MARGIN` x ``limit_s``
    (``execution_timeout_s``: papermill stops a cell after it, and each stage's server work is
    one cell); ``[]`` when every stage fits."""
    out = []
    for stage, sec in stages_s.items():
        if sec >= CELL_MARGIN * limit_s:
            verb = "exceeds" if sec >= limit_s else "is within 20 % of"
            out.append(f"{stage}: ~{sec / 3600:.2f} h {verb} the per-cell limit execution_timeout_s = "
                       f"{limit_s / 3600:.2f} h; the cell would be stopped. Raise it (-p execution_timeout_s=N, "
                       "an operational key: a stopped run continues with it), or shrink the stage")
    return out


def table(params: Params, assumptions: dict[str, Any] | None = None):
    """The launches as a DataFrame (notebook 00): config, reason, requests, tokens, est. minutes."""
    import pandas as pd

    s = summary(params, assumptions)
    label = s["assumptions"].get("source", "given")
    return pd.DataFrame([{"launch": i + 1, "config": x["config"], "reason": x["reason"], "requests": x["requests"],
                          "generated tokens (at most)": x["tokens"], "concurrency": x["concurrency"],
                          f"est. minutes ({label} load and tok/s)": None if x["seconds"] is None else round(x["seconds"] / 60, 1),
                          "note": "; ".join(x["notes"])} for i, x in enumerate(s["launches"])])


def format_plan(params: Params, s: dict[str, Any]) -> str:
    """Plain text of :func:`summary`: launches, totals, disk, assumptions."""
    a = s["assumptions"]
    label = a.get("source", "given")
    lines = [f"profile {params.profile!r}: {len(s['launches'])} server launch(es)"
             + ("" if s["serving"] else " (not made: server.enabled is false; shown for a GPU run)")]
    for i, x in enumerate(s["launches"], 1):
        t = "?" if x["seconds"] is None else f"{x['seconds'] / 60:.1f} min"
        conc = f", concurrency {x['concurrency']}" if x["concurrency"] > 1 else ""
        lines.append(f"  {i:>2}. {x['config']:<34} {x['requests']:>5} requests {x['tokens']:>9} tokens{conc}  ~{t}")
        lines.append(f"      {x['reason']}" + (f" [{'; '.join(x['notes'])}]" if x["notes"] else ""))
    lines.append(f"estimated serving time: {s['total_s'] / 3600:.2f} h ({label} assumptions: load "
                 f"{a['load_s']:g} s per launch, tok/s per depth {a['tok_s']}, deterministic {a.get('tok_s_deterministic')}; "
                 "every request generates max_tokens; prefill not counted)")
    lines.append("per stage (its server work is one notebook cell; limit execution_timeout_s "
                 f"{s['cell_limit_s'] / 3600:.2f} h): " + ", ".join(f"{k} ~{v / 3600:.2f} h" for k, v in sorted(s["stages_s"].items())))
    lines += [f"WARNING: {w}" for w in s["warnings"]]
    lines.append(f"corruption.protocol {s['protocol']}" + (
        " (the card's: each sampling config asks its claim's tasks); -p corruption.protocol=extended plans "
        "every task with every sampling config" if s["protocol"] == "card" else
        " (every task with every sampling config); -p corruption.protocol=card plans the card's 45 requests per mode"))
    if s["concurrency_saving_s"] is not None:
        speed = next((x["batch_speedup"] for x in s["launches"] if x["concurrency"] > 1), 1.0)
        lines.append(f"corruption.concurrency {params.corruption.concurrency}: saves ~{s['concurrency_saving_s'] / 3600:.2f} h "
                     f"against 1 ({speed:.2f}x the single-request rate, not {params.corruption.concurrency}x: each "
                     "request adds its own routed experts to every decode step; an upper bound)")
    else:
        lines.append("corruption.concurrency 1 (the card's --max-running-requests 1); -p corruption.concurrency=8 "
                     "shows the saving of a batched sweep")
    for d in s["disk"]:
        lines.append(f"disk: {d['what']} {d['gb']} GB at {d['folder']}")
    c = s["ceiling"]
    if "reason" in c:
        lines.append(f"decode ceiling: not computed ({c['reason']})")
    else:
        per = ", ".join(f"k={d}: {v['ceiling_tok_s']:.0f}" + ("" if not v["accept_len"] else f" (accept len {v['accept_len']:.2f}, card's)")
                        for d, v in c["depths"].items())
        lines.append(f"decode ceiling on {c['gpu']} ({c['bandwidth_gbs']:g} GB/s, vendor figure; "
                     f"{c['bytes_per_token_gb']:.2f} GB read per token of this layout): {per} tok/s "
                     "(one request; bandwidth / bytes read; KV cache not counted)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``nvfp4study plan``: print the plan (or JSON). Exit 0."""
    ap = argparse.ArgumentParser(prog="nvfp4study plan", description="Every server launch with its reason, "
                                 "requests, generated tokens, disk, and an estimated time.",
                                 epilog="example: nvfp4study plan --params params/ling3-flash.yaml -p corruption.concurrency=8")
    ap.add_argument("--params", default=None)
    ap.add_argument("-p", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--load-s", type=float, default=None, help="seconds per server load (default: card's 300)")
    ap.add_argument("--tok-s", action="append", default=[], metavar="DEPTH=TOKS",
                    help="single-request decode tok/s at a NEXTN depth (default: card's per depth)")
    ap.add_argument("--gpu", default=None, help="GPU name for the decode ceiling (default: the one nvidia-smi names)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    params = load_params(a.params, a.overrides)
    assumptions = card_assumptions()
    if a.load_s is not None or a.tok_s:
        assumptions["source"] = "given"
    if a.load_s is not None:
        assumptions["load_s"] = a.load_s
    for kv in a.tok_s:
        d, _, v = kv.partition("=")
        assumptions["tok_s"][int(d)] = float(v)
    s = summary(params, assumptions, a.gpu)
    print(json.dumps(s, indent=1) if a.json else format_plan(params, s))
    return 0
