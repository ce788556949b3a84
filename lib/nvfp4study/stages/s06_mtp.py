"""Stage 06: the NEXTN (MTP) depth sweep: tok/s and acceptance per depth, from recorded files.

Per depth (``mtp.depths``, 0 = speculation off) the same prompts are sent one at a time
(``--max-running-requests 1``), greedy, after a warm-up. Everything here reads only
``data/serve-raw-<cfg>.jsonl``, the launch records and the server logs of the run, so a replayed
run gives the same tables. The estimators (per request, token-weighted, Prometheus counters and
SGLang's own decode log) are computed in :mod:`nvfp4study.serving.acceptance`; every table names
them.

The ``mtp.*`` verdicts compare the card's numbers with the estimator the card used: SGLang's
``Decode batch`` log lines (``gen throughput (token/s)``, ``accept len``, ``accept rate``) inside
our request windows. Only when the log gives no line there (no log recorded) do the per-request
estimators decide (decode tok/s median, token-weighted acceptance), and the ledger note says so.
Tolerances: tok/s and speedup within 15 % of the card = that check agrees (30 % = partly, for
``mtp.off``); accept length and rate inside the card's range widened by ``RANGE_TOL``. Each
ledger row is decided by its rule in :mod:`~nvfp4study.stages.claim_rules.r06_mtp` (which holds
the tolerances).

A broken draft (fault F-08) at a depth with draft tokens > 1: a token-weighted accept rate below
``acceptance.BROKEN_RATE`` with accept length below ``acceptance.BROKEN_LEN`` is reported as
"draft broken: check layer 42", not as a property of the workload.
"""

from __future__ import annotations

import json
from typing import Any

from ..core import ledger
from ..core.claim_rules import record_rules
from ..core.errors import StageInputMissing
from ..core.files import atomic_write
from ..core.stage import Stage, open_stage_named
from ..serving import acceptance, decode_log, measure
from ..serving.acceptance import broken_draft
from ..serving.acceptance import median as _med
from ..serving.known_acceptance import KNOWN, estimator_spread, known_acceptance_rows
from ..serving.plans import Served
from ..serving.server import (
    CONTROL_LABELS,
    ServerConfig,
    card_refusal,
    engine_description,
    num_draft_tokens,
)
from ..serving.strategies import serves_standin
from .claim_rules import r06_mtp as rules

NOTEBOOK = "06_mtp_sweep"


def _sweep_model(params) -> dict[str, Any]:
    """The depth sweep's model (:func:`nvfp4study.serving.launch_env.trained_sweep`)."""
    from ..serving.launch_env import trained_sweep

    return trained_sweep(params)


def serving_plan(params) -> list[Served]:
    """What 06 serves (:mod:`nvfp4study.serving.plans`), each asked
    :func:`~nvfp4study.serving.records.mtp_requests`: one configuration per ``mtp.depths`` entry
    (0 = speculation off; on the CPU engine the trained stand-in, :func:`_sweep_model`), again on
    ``mtp.broken_model_path`` when set; on the CPU engine also one
    per ``server.cpu.control_drafts`` at ``server.cpu.control_depth`` (the stand-ins of
    :func:`nvfp4study.checkpoint.served.write_served_checkpoint` whose draft agrees or disagrees
    with the target by construction)."""
    clamp = params.server.clamp_mode
    depth = lambda d: None if d == 0 else d  # noqa: E731
    configs = [ServerConfig(clamp=clamp, spec_depth=depth(d), **_sweep_model(params)) for d in params.mtp.depths]
    if params.mtp.broken_model_path:
        configs += [ServerConfig(clamp=clamp, spec_depth=depth(d), model_path=params.mtp.broken_model_path,
                                 model_label="broken-draft") for d in params.mtp.depths]
    if serves_standin(params):  # stand-ins with acceptance known by construction
        cpu = params.server.cpu
        configs += [ServerConfig(clamp=clamp, spec_depth=cpu.control_depth, model_label=CONTROL_LABELS[d])
                    for d in cpu.control_drafts]
    requests = tuple(measure.mtp_requests(params))
    return [Served(c, requests) for c in configs]


def open_stage(params_file: str = "", run_dir: str = "") -> Stage:
    """:func:`nvfp4study.core.stage.open_stage_named` for notebook ``06_mtp_sweep``."""
    return open_stage_named(NOTEBOOK, params_file, run_dir)


def resolve_mode(stage: Stage) -> measure.Mode:
    """How this stage runs here: replay, live or "not run" (:func:`nvfp4study.serving.measure.resolve_mode`);
    its ``markdown()`` is the notebook's one box."""
    return measure.resolve_mode(stage)


def collect(stage: Stage) -> Any:
    """The stage's live collection, the replay import or "not run" recorded
    (:func:`nvfp4study.serving.measure.collect`): a DataFrame per configuration, or a note."""
    return measure.collect(stage)

CARD_IDS = rules.CARD_IDS  # depth -> claim id


def _nr(stage: Stage):
    """Nothing shown when the stage did not run (its one box says why), else None."""
    mode = measure.resolve_mode(stage)
    return measure.Quiet(f"not run: {mode.reason}") if mode.kind == "not run" else None


def sweep_configs(params) -> list[tuple[str, int, ServerConfig]]:
    """``(model label, depth, config)`` for 06, in the order of ``mtp.depths``."""
    return [(s.config.model_label, s.config.spec_depth or 0, s.config) for s in serving_plan(params)]


def _records(df) -> list[dict[str, Any]]:
    """DataFrame rows as dicts with NaN turned back into None."""
    return df.astype(object).where(df.notna(), None).to_dict("records")


def _dump(stage: Stage, stem: str, df) -> None:
    atomic_write(stage.paths.data(stem), lambda tmp: tmp.write_text(df.to_json(orient="records", indent=1, double_precision=10)))


# --- tables ----------------------------------------------------------------------------------
def _requests(stage: Stage):
    import pandas as pd

    params = measure.params_of(stage)
    specs = measure.mtp_requests(params)
    rows, raw = [], {}
    for model, depth, c in sweep_configs(params):
        recs = measure.rows_for(stage, c, specs)
        raw[(model, depth)] = recs
        for r in recs:
            rows.append({"model": model, "depth": depth, "config": c.key, "prompt_id": r["prompt_id"],
                         "launch": r.get("launch"), **measure.request_metrics(r)})
    df = pd.DataFrame(rows)
    same, div = [], []
    for r in rows:
        base = raw.get((r["model"], 0))
        if base is None or r["depth"] == 0:
            same.append(None if base is None else True)
            div.append(None)
            continue
        a = next(x for x in raw[(r["model"], r["depth"])] if x["prompt_id"] == r["prompt_id"])
        b = next(x for x in base if x["prompt_id"] == r["prompt_id"])
        cmp = measure.compare_outputs(b, a)
        same.append(cmp["identical"])
        div.append(cmp["first_divergence"])
    df["identical_to_off"] = same
    df["first_divergence_vs_off"] = div
    return df, raw


def request_table(stage: Stage):
    """One row per timed request: status, tokens, TTFT, decode and end-to-end tok/s, the server's
    accept length / rate, scoped counter deltas, identity with the depth-0 text.

    Writes ``data/mtp-requests.json``.
    """
    if (nr := _nr(stage)) is not None:
        return nr
    df, _ = _requests(stage)
    _dump(stage, "mtp-requests", df)
    return df


def summary_table(stage: Stage):
    """Per depth: decode and end-to-end tok/s (median, range over requests), speedup over depth 0
    with how many texts are identical to depth 0, token-weighted acceptance with its range over
    requests, the card's estimator beside them (SGLang decode log: lines in our windows, median
    gen throughput tok/s, accept len, accept rate, speedup of the log medians) and the broken-draft
    flag. Writes ``data/mtp-summary.json``."""
    import pandas as pd

    if (nr := _nr(stage)) is not None:
        return nr
    df, raw = _requests(stage)
    params = measure.params_of(stage)
    rows = []
    recs = _records(df)
    logs = {(m, d): acceptance.log_summary(decode_log.study_lines(stage.run_dir, measure.launches(stage.paths, c),
                                                                    raw[(m, d)]))
            for m, d, c in sweep_configs(params)}
    log_base = {m: v["log gen tok/s median"] for (m, d), v in logs.items() if d == 0}
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in recs:
        groups.setdefault((r["model"], r["depth"]), []).append(r)
    base = {m: _med([x["decode_tok_s"] for x in g if x["status"] == "ok" and x["decode_tok_s"] is not None])
            for (m, d), g in groups.items() if d == 0}
    for (model, depth), g in groups.items():
        ok = [x for x in g if x["status"] == "ok"]
        dec = [x["decode_tok_s"] for x in ok if x["decode_tok_s"] is not None]
        e2e = [x["e2e_tok_s"] for x in ok if x["e2e_tok_s"] is not None]
        c = next(c for m, d, c in sweep_configs(params) if m == model and d == depth)
        dt = num_draft_tokens(params, c)
        est = {e["estimator"]: e for e in acceptance.estimators(ok, dt)}
        tw, rw = est["token-weighted"], est["request-weighted median"]
        row = {"model": model, "depth": depth, "draft tokens": dt, "requests ok": f"{len(ok)}/{len(g)}",
               "decode tok/s median": _med(dec), "decode tok/s min": min(dec, default=None),
               "decode tok/s max": max(dec, default=None), "e2e tok/s median": _med(e2e),
               "TTFT s median": _med([x["ttft_s"] for x in ok if x["ttft_s"] is not None])}
        b = base.get(model)
        row["speedup vs off (decode medians)"] = (row["decode tok/s median"] / b) if b and row["decode tok/s median"] else None
        lg, lb = logs[(model, depth)], log_base.get(model)
        row.update(lg)
        row["speedup vs off (log gen tok/s medians)"] = (lg["log gen tok/s median"] / lb
                                                        if lb and lg["log gen tok/s median"] else None)
        n_same = sum(1 for x in ok if x["identical_to_off"] is True)
        row["texts identical to off"] = "-" if depth == 0 else f"{n_same}/{len(ok)}"
        row.update({"accept len (token-weighted)": tw["accept_len"], "accept len min": rw["len_min"],
                    "accept len max": rw["len_max"], "accept rate (token-weighted)": tw["accept_rate"],
                    "accept rate min": rw["rate_min"], "accept rate max": rw["rate_max"],
                    "flag": ("draft broken: check layer 42" if broken_draft(tw["accept_len"], tw["accept_rate"], dt)
                             else "")})
        checked = [x for x in ok if x["counter_scoped"] is not None]
        row["counters scoped to our request"] = f"{sum(1 for x in checked if x['counter_scoped'])}/{len(checked)}"
        notes = []
        if depth and n_same != len(ok):
            notes.append("speedup compares different texts on some prompts (different text, different acceptance)")
        if any(x["counter_scoped"] is False for x in checked):
            notes.append("Prometheus deltas include other traffic on some requests")
        row["note"] = "; ".join(notes)
        rows.append(row)
    out = pd.DataFrame(rows)
    _dump(stage, "mtp-summary", out)
    return out


def estimator_table(stage: Stage):
    """Every estimator's accept length and rate per depth (F-10). Writes ``data/mtp-estimators.json``."""
    import pandas as pd

    if (nr := _nr(stage)) is not None:
        return nr
    df, raw = _requests(stage)
    params = measure.params_of(stage)
    rows = []
    for model, depth, c in sweep_configs(params):
        if depth == 0:
            continue
        g = [r for r in _records(df) if r["model"] == model and r["depth"] == depth]
        launches_used = {int(r["launch"]) for r in g if r["launch"] is not None}
        for e in acceptance.estimators(g, num_draft_tokens(params, c),
                                       acceptance.session_delta(measure.launches(stage.paths, c), launches_used)):
            rows.append({"model": model, "depth": depth, **e})
        rows.append({"model": model, "depth": depth, **decode_log.estimator_row(decode_log.study_lines(stage.run_dir, measure.launches(stage.paths, c), raw[(model, depth)]))})
    out = pd.DataFrame(rows)
    _dump(stage, "mtp-estimators", out)
    return out


def broken_draft_report(stage: Stage):
    """Markdown: per depth whether the draft looks broken (F-08), with the numbers."""
    from ..core.display import markdown

    if (nr := _nr(stage)) is not None:
        return nr
    s = summary_table(stage)
    lines = []
    for r in _records(s):
        if not r["depth"]:
            continue
        if r["flag"]:
            lines.append(f"- **{r['model']} k={r['depth']}: draft broken: check layer 42 of the checkpoint** "
                         f"(accept rate {r['accept rate (token-weighted)']:.2f}, accept length "
                         f"{r['accept len (token-weighted)']:.2f} at {r['draft tokens']} draft tokens); "
                         "this is the checkpoint's draft layer, not a property of the workload.")
        else:
            lines.append(f"- {r['model']} k={r['depth']}: draft working (token-weighted accept rate "
                         f"{acceptance.fmt2(r['accept rate (token-weighted)'])}, accept length {acceptance.fmt2(r['accept len (token-weighted)'])}).")
    return markdown("\n".join(lines) or "No speculative depth in `mtp.depths`.")


def card_marks() -> dict[int, dict[str, Any]]:
    """The card's MTP numbers per depth, read from claims.yaml (shown only labelled "card")."""
    cards = {c["id"]: c["card"] for c in ledger.card_claims()}
    return {d: cards[i] for d, i in CARD_IDS.items() if i in cards}


def figure(stage: Stage):
    """tok/s, accept length and accept rate against depth (medians with request ranges), the
    card's values as reference marks labelled "card" (none on the CPU engine: its numbers are a
    stand-in's). Writes ``figures/mtp-sweep.png``."""
    from IPython.display import Image

    if (nr := _nr(stage)) is not None:
        return nr
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = summary_table(stage)
    cpu = measure.resolve_mode(stage).standin
    card = {} if cpu else card_marks()  # never a toy number beside the card's
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    if cpu:
        fig.suptitle("SGLang's engine on CPU, served stand-in (random weights / known-acceptance drafts): "
                     "pipeline check, not comparable with the card", fontsize=9)
    nan = float("nan")
    recs = _records(s)
    for model in dict.fromkeys(r["model"] for r in recs):
        g = [r for r in recs if r["model"] == model]
        d = [r["depth"] for r in g]
        for ax, mid, lo, hi, label in (
            (axes[0], "decode tok/s median", "decode tok/s min", "decode tok/s max", f"{model}: decode tok/s"),
            (axes[1], "accept len (token-weighted)", "accept len min", "accept len max", f"{model}: token-weighted"),
            (axes[2], "accept rate (token-weighted)", "accept rate min", "accept rate max", f"{model}: token-weighted"),
        ):
            y = [nan if r[mid] is None else r[mid] for r in g]
            err = [[0.0 if None in (r[mid], r[lo]) else max(0.0, r[mid] - r[lo]) for r in g],
                   [0.0 if None in (r[mid], r[hi]) else max(0.0, r[hi] - r[mid]) for r in g]]
            ax.errorbar(d, y, yerr=err, marker="o", capsize=3, label=label + " (range over requests)")
        axes[0].plot(d, [nan if r["e2e tok/s median"] is None else r["e2e tok/s median"] for r in g], "s--",
                     alpha=0.6, label=f"{model}: end-to-end tok/s")
    cd = sorted(card)
    axes[0].plot(cd, [card[k]["tok_s"] for k in cd], "kx", markersize=9, label="card: tok/s")
    for ax, key in ((axes[1], "accept_len"), (axes[2], "accept_rate")):
        first = True
        for k in cd:
            if key in card[k]:
                lo_, hi_ = card[k][key]
                ax.vlines(k + 0.08, lo_, hi_, colors="k", linewidth=3, label="card: range" if first else None)
                first = False
    for ax, t in zip(axes, ("tok/s (one request)", "accept length", "accept rate"), strict=True):
        ax.set_xlabel("NEXTN depth k (0 = speculation off)")
        ax.set_title(t)
        ax.set_xticks(sorted({r["depth"] for r in recs} | set(cd)))
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = stage.paths.figure("mtp-sweep")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Image(str(path))


# --- ledger ----------------------------------------------------------------------------------
def record_claims(stage: Stage):
    """Record this stage's ledger rows, each decided by its rule
    (:mod:`~nvfp4study.stages.claim_rules.r06_mtp`). What the run can settle is asked of its
    strategy (:attr:`~nvfp4study.serving.measure.Mode.settles_card_claims`, ``standin``): the card's
    mtp.off, mtp.k1-k3, mtp.k2-best and mtp.broken-draft from the summary where it serves the
    card's checkpoint, else "not run" (:func:`card_refusal`); on the stand-in the study findings
    ``mtp.cpu-known-acceptance``, ``mtp.cpu-broken-draft-signature`` and ``mtp.cpu-estimators``
    (:func:`_standin_measurements`). Returns this stage's ledger rows."""
    import pandas as pd

    if (nr := _nr(stage)) is not None:
        return nr
    s = summary_table(stage)
    ev = [stage.paths.data("mtp-summary"), stage.paths.data("mtp-requests"), stage.paths.data("mtp-estimators")]
    params = measure.params_of(stage)
    ev += [measure.raw_path(stage.paths, c) for _, _, c in sweep_configs(params)]
    mode = measure.resolve_mode(stage)
    if mode.settles_card_claims:
        replay = params.replay_from
        checked = "sglang " + params.sglang.version + (f" (replay of {replay})" if replay else "")
        gpu = served_gpu(stage)
        if gpu:
            ev.append(stage.paths.data("served-gpu"))
        record_rules(stage, rules.MtpMeasurements(_records(s), ev, checked,
                                                  {c["id"]: c["card"] for c in ledger.card_claims()}, gpu=gpu))
    else:
        stage.not_run(card_refusal(params), [c for c in stage.claims() if c != "mtp.bandwidth-ceiling"])
    if mode.standin:
        record_rules(stage, _standin_measurements(stage, ev))
    rows = [r for r in ledger.read_ledger(stage.run_dir) if r["id"] in stage.claims() or r["stage"] == stage.name]
    return pd.DataFrame([{k: r[k] for k in ("id", "card", "measured", "verdict", "note")} for r in rows])


def served_gpu(stage: Stage) -> str | None:
    """The name of the GPU this run's servers used (``nvidia-smi``'s GPU 0), kept in
    ``data/served-gpu.json``: written once by a live run on its machine, copied from the recorded
    run in a replay (None when that run has none, or no ``nvidia-smi`` answers). The tok/s rows
    compare absolute tok/s with the card's only on the card's GPU class
    (:attr:`~nvfp4study.stages.claim_rules.r06_mtp.MtpMeasurements.speed_mismatch`)."""
    from pathlib import Path

    from ..core.files import write_json
    from ..workstation import probes

    f = stage.paths.data("served-gpu")
    params = measure.params_of(stage)
    if params.replay_from:
        src = Path(params.replay_from).expanduser()
        f_src = (src if src.is_absolute() else Path.cwd() / src) / "data" / f.name
        if not f_src.is_file():
            return None
        write_json(f, json.loads(f_src.read_text()))
    elif not f.is_file():
        smi = probes.nvidia_smi()
        if not smi or not smi["gpus"]:
            return None
        write_json(f, {"name": smi["gpus"][0]["name"], "driver": smi["driver"], "source": "nvidia-smi"})
    return json.loads(f.read_text()).get("name")


def ceiling_table(stage: Stage):
    """The card's tok/s per depth against the memory-bandwidth ceiling
    (:mod:`nvfp4study.workstation.bound`) of each Blackwell GPU a "128 GB-class" card can mean,
    on the real Ling-3.0-flash layout (:class:`~nvfp4study.core.params.LingShape` defaults, the
    card's model, whatever the profile). Needs no GPU: it is arithmetic on the card's numbers and
    the layout. Records the study finding ``mtp.bandwidth-ceiling``; writes ``data/mtp-ceiling.json``."""
    import pandas as pd

    from ..core.params import LingShape
    from ..workstation import bound

    rows = bound.card_table(LingShape())
    df = pd.DataFrame(rows)
    _dump(stage, "mtp-ceiling", df)
    record_rules(stage, rules.CeilingMeasurements(rows, tuple(bound.CARD_CLASS),
                                                  round(bound.read_bytes(LingShape()).per_token() / 1e9, 3),
                                                  [stage.paths.data("mtp-ceiling")]))
    return df


def summary_json(stage: Stage) -> dict[str, Any]:
    """The summary as a dict (for other stages and the report). Raises StageInputMissing."""
    p = stage.paths.data("mtp-summary")
    if not p.is_file():
        raise StageInputMissing(f"{p} missing: run 06_mtp_sweep")
    return {"rows": json.loads(p.read_text())}


# --- the CPU engine: estimators against acceptance known by construction ---------------------
def known_acceptance_table(stage: Stage):
    """For each control stand-in (``server.cpu.control_drafts``), every estimator beside the value
    its construction fixes (:func:`known_acceptance_rows`). Writes ``data/mtp-known-acceptance.json``."""
    import pandas as pd

    if (nr := _nr(stage)) is not None:
        return nr
    if not measure.resolve_mode(stage).standin:
        return measure.Quiet("GPU engine: no control stand-ins")
    _, raw = _requests(stage)
    params = measure.params_of(stage)
    rows = []
    for model, depth, c in sweep_configs(params):
        if model not in KNOWN:
            continue
        lines = decode_log.study_lines(stage.run_dir, measure.launches(stage.paths, c), raw[(model, depth)])
        rows += known_acceptance_rows([measure.request_metrics(r) for r in raw[(model, depth)]], lines, model, depth)
    df = pd.DataFrame(rows)
    _dump(stage, "mtp-known-acceptance", df)
    return df


def _standin_measurements(stage: Stage, ev: list) -> rules.CpuMtpMeasurements:
    """The stand-in's findings' measurements: ``mtp.cpu-known-acceptance`` (every estimator equals
    the acceptance the control stand-ins fix), ``mtp.cpu-broken-draft-signature`` (the
    disagreeing draft gives the card's broken-draft log line, accept len 1.00 and accept rate
    0.00, and 06's F-08 flag) and ``mtp.cpu-estimators`` (the three estimators side by side on the
    sweep; toy scale, never compared with the card's table)."""
    params = measure.params_of(stage)
    known = _records(known_acceptance_table(stage))
    label = CONTROL_LABELS["disagree"]
    disagree = [r for r in _records(summary_table(stage)) if r["model"] == label]
    sweep = _sweep_model(params).get("model_label", "study")
    spread = estimator_spread(_records(estimator_table(stage)), sweep)
    return rules.CpuMtpMeasurements(
        known=known, disagree=disagree[0] if disagree else None, spread=spread, evidence=ev,
        known_evidence=[stage.paths.data("mtp-known-acceptance"), *ev], checked=engine_description(params)["summary"],
        sweep_model=sweep)
