"""Stage 04: what the server log says at launch: clamp lines per layer, warnings, memory, load time.

Reads only files of the run: the launch record ``data/serve-launch-<cfg>.jsonl`` and the server
log it names (``logs/sglang-<cfg>.log``). Facts parsed, with their 0.5.23 sources:

- Clamp lines: the card's form ``[swiglu-clamp-patch] cutlass nvfp4 limit=4`` (no layer index:
  lines are assigned to the MoE layers in construction order, layers ``first_k_dense_replace``
  .. ``num_hidden_layers-1``, then the NEXTN draft, built with ``layer_id=0``) and the study's
  patch form (``patches/0.5.23/exact``: ``... cutlass nvfp4 limit=4 mode=exact form=SwigluStep
  layer=35``; ``none``: ``limit=None mode=none config_limit=4 layer=35``).
- ``Load weight end. elapsed=X s, type=T, ..., mem usage=Y GB.`` (``model_executor/
  model_runner.py`` 1371-1379); SGLang's "GB" is GiB: ``get_available_gpu_memory`` divides
  bytes by ``1 << 30`` (``utils/common.py`` 576). The ledger uses GB = 1e9 bytes.
- ``w1_weight_global_scale must match w3_weight_global_scale`` (``compressed_tensors_w4a4_
  nvfp4_moe.py`` 188-194): gate/up global scales differ and the up projection is dequantized
  with the gate's scale.
- A reasoning parser: ``Auto-detected --reasoning-parser as '...'`` (``parser/
  template_detection.py`` 886-890) or ``reasoning_parser`` in ``/model_info``.

The ledger rows are decided by the rules of :mod:`~nvfp4study.stages.claim_rules.r04_launch`
(tolerances, units and the tensor-parallel size are there), from the ``LaunchMeasurements`` this
module builds once.
"""

from __future__ import annotations

from typing import Any

from ..core import ledger
from ..core.claim_rules import record_rules
from ..core.errors import StageInputMissing
from ..core.files import atomic_write, write_json
from ..core.params import Params
from ..core.stage import Stage, open_stage_named
from ..serving import measure, plans, server
from ..serving.measure import model_config_for
from ..serving.records import probe_requests
from ..serving.server import ServerConfig, card_config, card_refusal
from ..serving.sglang_log import (  # noqa: F401  (the log's readers; tests name them here)
    CLAMP_TAG,
    WARNINGS,
    find_warnings,
    parse_clamp_lines,
    parse_load_lines,
    read_log,
)
from ..serving.strategies import serves_standin
from .claim_rules import r04_launch as rules

NOTEBOOK = "04_launch_server"


def open_stage(params_file: str = "", run_dir: str = "") -> Stage:
    """:func:`nvfp4study.core.stage.open_stage_named` for notebook ``04_launch_server``."""
    return open_stage_named(NOTEBOOK, params_file, run_dir)


def resolve_mode(stage: Stage) -> measure.Mode:
    """How this stage runs here: replay, live or "not run" (:func:`nvfp4study.serving.measure.resolve_mode`);
    its ``markdown()`` is the notebook's one box."""
    return measure.resolve_mode(stage)


def collect(stage: Stage) -> Any:
    """The stage's live collection, the replay import or "not run" recorded
    (:func:`nvfp4study.serving.measure.collect`): a DataFrame per configuration, or a note."""
    return measure.collect(stage)


def command_table(params: Params) -> Any:
    """The card's launch command flag by flag, with where SGLang defines each
    (:func:`nvfp4study.serving.server.command_table`)."""
    return server.command_table(params)


def plan_table(params: Params) -> Any:
    """One row per planned server configuration, the stages that use it and its flags
    (:func:`nvfp4study.serving.plans.plan_table`)."""
    return plans.plan_table(params)


def probe_configs(params: Params) -> list[ServerConfig]:
    """The clamp probe's launches on the CPU engine, speculation off, in the card's clamp mode (its
    patch edits no CPU path): one per :data:`~nvfp4study.serving.launch_env.PROBE_LABELS` entry;
    none on the GPU engine, with ``server.cpu.clamp_probe_limit`` 0, or with ``server.model_path``
    set (every launch would serve that one model)."""
    p = params.server
    if not serves_standin(params) or p.cpu.clamp_probe_limit <= 0 or p.model_path:
        return []
    return [ServerConfig(clamp=p.clamp_mode, spec_depth=None, model_label=label)
            for label in server.PROBE_LABELS.values()]


#: the routed-scaling probe's patched arm: the native MoE patch axis it sets
#: (:data:`nvfp4study.sglang.patch.NATIVE_AXES`, ``server.cpu.routed_scaling``)
PATCHED_SCALING = (("routed_scaling", "applied"),)
#: the probe keys (:data:`~nvfp4study.serving.launch_env.PROBE_LABELS`) the patched arm serves again
PATCHED_SCALING_KEYS = ("scaling-factor", "scaling-weights")


def scaling_patched_configs(params: Params) -> dict[str, ServerConfig]:
    """The routed-scaling probe's patched arm, by probe key: the factor model and its down_proj
    control served once more with the native ``routed_scaling: applied`` patch (:data:`PATCHED_SCALING`,
    the launch's own ``native`` axis over ``server.cpu.routed_scaling``), so one run reads the
    released path and the patched one. Both, because the patched factor launch (routed output x
    factor x ratio) equals the down_proj control only when that control is patched too (x factor x
    ratio; released it runs at x ratio, the factor applied nowhere). Empty where
    :func:`probe_configs` is."""
    if not probe_configs(params):
        return {}
    return {k: ServerConfig(clamp=params.server.clamp_mode, spec_depth=None, model_label=server.PROBE_LABELS[k],
                            native=PATCHED_SCALING) for k in PATCHED_SCALING_KEYS}


def serving_plan(params: Params) -> list[plans.Served]:
    """What 04 serves (:mod:`nvfp4study.serving.plans`): the card's configuration, whose launch is
    what 04 measures (launched even with nothing to ask; a replay needs its launch record only),
    then on the CPU engine with ``server.cpu.clamp_probe_limit`` > 0 the clamp and routed-scaling
    probes' launches (:func:`probe_configs`) and the routed-scaling probe's patched arm
    (:func:`scaling_patched_configs`), each asked :func:`~nvfp4study.serving.records.probe_requests`
    (a replay of a run recorded before the probe, or before its patched arm, goes on without them)."""
    probe = tuple(probe_requests(params))
    return [plans.Served(card_config(params), launch_measured=True, replay_requests=False),
            *(plans.Served(c, probe, launch_measured=True, replay_requests=False, replay_optional=True)
              for c in probe_configs(params)),
            *(plans.Served(c, probe, launch_measured=True, replay_requests=False, replay_optional=True,
                           what=f"04 routed-scaling probe, {k} launch with the native routed_scaling patch")
              for k, c in scaling_patched_configs(params).items())]

GIB = rules.GIB  # SGLang's "GB" is GiB (the rules convert with the same constant)
def expected_limits(model_config: dict[str, Any]) -> dict[str, Any]:
    """Expected routed clamp per MoE layer from a config: ``{"moe_layers": [...], "limit": {l: v}}``.

    ``expert_swiglu_limit_list`` entries of 0 mean no clamp (``bailing_moe_v3.py`` 435-439).
    """
    n = int(model_config["num_hidden_layers"])
    first = int(model_config.get("first_k_dense_replace") or 0)
    lst = model_config.get("expert_swiglu_limit_list") or [0] * n
    return {"moe_layers": list(range(first, n)),
            "limit": {i: (float(lst[i]) if i < len(lst) and lst[i] else None) for i in range(n)},
            "draft": int(model_config.get("num_nextn_predict_layers") or 0) > 0}


def assign_layers(lines: list[dict[str, Any]], expected: dict[str, Any]) -> list[dict[str, Any]]:
    """Give each clamp line of the first rank a layer: its own ``layer=`` when logged, else by
    order over the MoE layers, then "draft" for the lines after them."""
    if not lines:
        return []
    rank0 = lines[0]["rank"]
    mine = [ln for ln in lines if ln["rank"] == rank0]
    moe = expected["moe_layers"]
    out = []
    for ln in mine:
        if ln["layer"] is not None and ln["order"] < len(moe):
            who = ln["layer"]
        else:
            who = moe[ln["order"]] if ln["order"] < len(moe) else "draft"
        out.append({**ln, "assigned": who})
    return out


# --- the stage -------------------------------------------------------------------------------
def _launch(stage: Stage) -> tuple[dict[str, Any], str]:
    config = card_config(measure.params_of(stage))
    rows = [r for r in measure.launches(stage.paths, config) if r.get("log")]
    if not rows:
        raise StageInputMissing(f"{measure.launch_path(stage.paths, config).name}: no launch recorded")
    rec = rows[-1]
    log = stage.run_dir / rec["log"]
    if not log.is_file():
        raise StageInputMissing(f"server log {log} missing")
    return rec, read_log(log)


def _not_run(stage: Stage):
    """Nothing shown when the stage did not run (its one box says why), else None."""
    mode = measure.resolve_mode(stage)
    return measure.Quiet(f"not run: {mode.reason}") if mode.kind == "not run" else None


def launch_table(stage: Stage):
    """One row per launch of the card's configuration: status, load time, GPU, version."""
    import pandas as pd

    if (nr := _not_run(stage)) is not None:
        return nr
    rows = []
    for r in measure.launches(stage.paths, card_config(measure.params_of(stage))):
        gpu = r.get("gpu") or {}
        rows.append({"launch": r.get("launch"), "status": r.get("status"), "config": r.get("config_key"),
                     "launch→healthy (s)": r.get("load_s"), "sglang": r.get("sglang_version"),
                     "GPU": gpu.get("name"), "GPU memory (GB)": gpu.get("memory_gb"),
                     "tp_size": (r.get("server_info") or {}).get("tp_size"), "log": r.get("log")})
    return pd.DataFrame(rows)


def clamp_table(stage: Stage):
    """Per MoE layer (and the draft): the config's routed limit and what the log reports.

    Writes ``data/launch-clamp.json``. Columns: layer, expected limit, logged limit, mode, match.
    """
    import pandas as pd

    if (nr := _not_run(stage)) is not None:
        return nr
    rec, text = _launch(stage)
    exp = expected_limits(rec.get("model_config") or model_config_for(stage, rec.get("model_path")))
    assigned = assign_layers(parse_clamp_lines(text), exp)
    by_layer = {a["assigned"]: a for a in assigned}
    rows = []
    for layer in exp["moe_layers"] + (["draft"] if exp["draft"] else []):
        e = None if layer == "draft" else exp["limit"][layer]  # the draft reads entry 0: unclamped
        got = by_layer.get(layer)
        logged = got["limit"] if got else "no line"
        rows.append({"layer": str(layer), "expected limit": _fmt(e), "logged limit": _fmt(logged),
                     "mode": (got or {}).get("mode"), "form": (got or {}).get("form"),
                     "path": (got or {}).get("path"), "match": got is not None and _same(e, got["limit"])})
    extra = [a for a in assigned if a["assigned"] == "draft"][1:]
    for a in extra:
        rows.append({"layer": "extra line", "expected limit": "-", "logged limit": _fmt(a["limit"]),
                     "mode": a["mode"], "form": a["form"], "path": a["path"], "match": False})
    df = pd.DataFrame(rows)
    atomic_write(stage.paths.data("launch-clamp"), lambda tmp: tmp.write_text(df.to_json(orient="records", indent=1)))
    return df


def _fmt(v) -> str:
    if v is None or v == 0.0:
        return "None"
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() else str(v)
    return str(v)


def _same(a, b) -> bool:
    a = None if not a else float(a)
    b = None if not b else float(b)
    return a == b


def clamp_summary(stage: Stage):
    """Markdown: which layers report which limit, as ranges (the card's "limit=4 on 35-41")."""
    from ..core.display import markdown

    if (nr := _not_run(stage)) is not None:
        return nr
    df = clamp_table(stage)
    return markdown(_summary_sentence(df))


def _ranges(layers: list[int]) -> str:
    out, start, prev = [], None, None
    for x in sorted(layers):
        if start is None:
            start = prev = x
        elif x == prev + 1:
            prev = x
        else:
            out.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = x
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else str(start))
    return ", ".join(out)


def _by_limit(df) -> dict[str, str]:
    groups: dict[str, list[int]] = {}
    for r in df.to_dict("records"):
        if r["layer"].isdigit() and r["logged limit"] != "no line":
            groups.setdefault(f"limit={r['logged limit']}", []).append(int(r["layer"]))
    return {k: _ranges(v) for k, v in groups.items()}


def _summary_sentence(df) -> str:
    groups = _by_limit(df)
    layers = df[df.layer.str.isdigit()]
    missing = int((layers["logged limit"] == "no line").sum())
    bad = int((~layers["match"]).sum()) - missing
    parts = [f"`{k}` on layers {v}" for k, v in groups.items()] or ["no clamp lines in the log"]
    s = "The log reports " + "; ".join(parts) + "."
    s += f" {len(layers) - missing} of {len(layers)} MoE layers have a line"
    s += f"; {bad} disagree with the checkpoint's expert_swiglu_limit_list." if bad else "; all agree with the checkpoint's expert_swiglu_limit_list."
    return s


def warnings_table(stage: Stage):
    """Warnings worth surfacing from the launch log and ``/model_info``."""
    import pandas as pd

    if (nr := _not_run(stage)) is not None:
        return nr
    rec, text = _launch(stage)
    rows = find_warnings(text, rec.get("model_info"))
    return pd.DataFrame(rows or [{"warning": "none of the known warnings", "count": 0, "first line": ""}])


def memory_table(stage: Stage):
    """Weights' memory and load time per loaded model (target, draft) from ``Load weight end``.

    Writes ``data/launch-memory.json``.
    """
    import pandas as pd

    if (nr := _not_run(stage)) is not None:
        return nr
    rec, text = _launch(stage)
    rows = [{"rank": r["rank"], "model type": r["type"], "weight load (s)": r["elapsed_s"],
             "mem usage (SGLang 'GB' = GiB)": r["mem_gib"], "mem usage (GB, 1e9 B)": round(r["mem_gib"] * GIB / 1e9, 2)}
            for r in parse_load_lines(text)]
    df = pd.DataFrame(rows)
    write_json(stage.paths.data("launch-memory"), {"rows": rows, "launch_to_healthy_s": rec.get("load_s")})
    return df


SGLANG_TP_DEFAULT = rules.SGLANG_TP_DEFAULT
#: the launch's tensor-parallel size and its source (:func:`~nvfp4study.stages.claim_rules.r04_launch.tensor_parallel`)
tensor_parallel = rules.tensor_parallel


def _measurements(stage: Stage) -> rules.LaunchMeasurements:
    """The card configuration's last launch, its target model's ``Load weight end`` line and the
    clamp table (:func:`clamp_table`, which writes ``data/launch-clamp.json``), read once."""
    rec, text = _launch(stage)
    params = measure.params_of(stage)
    replay = params.replay_from
    targets = [r for r in parse_load_lines(text) if "NextN" not in r["type"]]
    df = clamp_table(stage)
    return rules.LaunchMeasurements(
        rec=rec, checked=f"sglang {rec.get('sglang_version')}" + (f" (replay of {replay})" if replay else ""),
        log_ev=stage.run_dir / rec["log"], launch_ev=measure.launch_path(stage.paths, card_config(params)),
        clamp_ev=stage.paths.data("launch-clamp"), target=targets[0] if targets else None, clamp=df,
        groups=_by_limit(df), card={c["id"]: c["card"] for c in ledger.card_claims()})


def record_claims(stage: Stage):
    """Record this stage's ledger rows, each decided by its rule
    (:mod:`~nvfp4study.stages.claim_rules.r04_launch`). What the run can settle is asked of its
    strategy (:attr:`~nvfp4study.serving.measure.Mode.settles_card_claims`, ``standin``): the card's
    fit.single-gpu, size.resident, load.time and clamp.log-lines where it serves the card's
    checkpoint, else "not run" (:func:`card_refusal`); on the stand-in the study finding
    ``serve.cpu-engine-launch`` from the card configuration's launch, and the clamp and
    routed-scaling probes' findings when they ran. Returns this stage's ledger rows."""
    import pandas as pd

    if (nr := _not_run(stage)) is not None:
        return nr
    mode = measure.resolve_mode(stage)
    params = measure.params_of(stage)
    if mode.settles_card_claims:
        record_rules(stage, _measurements(stage))
    else:
        stage.not_run(card_refusal(params))
    if mode.standin:
        rec, _ = _launch(stage)
        summary = (rec.get("engine") or {}).get("summary", f"SGLang {rec.get('sglang_version')}")
        record_rules(stage, rules.CpuLaunchMeasurements(
            rec, [measure.launch_path(stage.paths, card_config(params)), stage.run_dir / rec["log"]], summary))
        if probe_configs(params):
            record_rules(stage, _probe_measurements(stage, summary))
            record_rules(stage, _scaling_measurements(stage, summary))
    rows = [r for r in ledger.read_ledger(stage.run_dir) if r["id"] in stage.claims() or r["stage"] == stage.name]
    return pd.DataFrame([{k: r[k] for k in ("id", "card", "measured", "verdict", "note")} for r in rows])


def engine_table(stage: Stage):
    """What the CPU engine replaces and why (:func:`nvfp4study.serving.cpu_engine.describe`): one
    row per replaced kernel op, runtime patch and CPU flag. Nothing on the GPU engine."""
    import pandas as pd

    if (nr := _not_run(stage)) is not None:
        return nr
    if not measure.resolve_mode(stage).standin:
        return measure.Quiet("GPU engine: nothing replaced")
    from ..serving.server import engine_description

    d = engine_description(measure.params_of(stage))
    rows = [{"kind": "kernel op (torch code)", "name": op, "why": "sgl_kernel's CPU build is not on the package index"}
            for op in d.get("replaced_ops", [])]
    for p in d.get("patches", []):
        rows.append({"kind": "runtime patch", "name": p.get("target", ""),
                     "why": p.get("why", "")})
    for f in d.get("flags", []):
        rows.append({"kind": "CPU flag", "name": f.get("flag", ""), "why": f.get("why", "")})
    return pd.DataFrame(rows)


# --- the clamp probe (CPU engine) --------------------------------------------------------------
def _probe_measurements(stage: Stage, summary: str) -> rules.ClampProbeMeasurements:
    """The probe's launches compared per prompt (routed limit, shared limit and the second no-limit
    launch, each against the first no-limit launch), the clamp lists each launch served against
    :func:`~nvfp4study.checkpoint.served.probe_shape`'s, and 03's audit row of the path they test
    (``data/sglang_audit.json``), or, when the routed launch ran a native clamp patch
    (``server.cpu.moe_clamp``), the audit of that patched overlay from its launch record. A probe never recorded (a replayed run from before it) gives the
    reason in ``missing``."""
    from ..checkpoint.layout import config_dict
    from ..checkpoint.served import probe_shape, served_shape
    from ..serving.request_numbers import compare_outputs

    params = measure.params_of(stage)
    limit = params.server.cpu.clamp_probe_limit
    configs = {p: c for p, c in zip(server.PROBE_LABELS, probe_configs(params), strict=True)
               if p in ("off", "routed", "shared", "off-again")}
    audit, audit_file = _audit_row(stage)
    evidence = [e for e in (measure.raw_path(stage.paths, c) for c in configs.values()) if e.is_file()] + (
        [audit_file] if audit else [])
    try:
        rows = {p: measure.rows_for(stage, c, probe_requests(params)) for p, c in configs.items()}
    except StageInputMissing as exc:
        return rules.ClampProbeMeasurements(limit, [], [], audit, None, evidence, summary, missing=str(exc))
    pairs = [{"prompt_id": rows["off"][i]["prompt_id"],
              **{k: compare_outputs(rows[p][i], rows["off"][i]) for k, p in
                 {"routed": "routed", "shared": "shared", "null": "off-again"}.items()}}
             for i in range(len(rows["off"]))]
    wrong, version = [], None
    lists = ("expert_swiglu_limit_list", "share_expert_swiglu_limit_list")
    for p, c in configs.items():
        want = config_dict(probe_shape(served_shape(params.checkpoint.shape), server.probe_checkpoint(p), limit))
        rec = _last_ok_launch(stage, c)
        got = rec.get("model_config") or {}
        if any(got.get(k) != want[k] for k in lists):
            wrong.append(c.model_label)
        version = version or rec.get("sglang_version")
        if p == "routed" and rec.get("native_moe_audit"):  # served from a patched overlay
            audit = rec["native_moe_audit"]
    return rules.ClampProbeMeasurements(limit, pairs, wrong, audit, version, evidence, summary)


def _scaling_measurements(stage: Stage, summary: str) -> rules.ScalingProbeMeasurements:
    """The routed-scaling probe's launches compared per prompt: the factor launch and the routed
    down_proj launch against the no-limit one, the factor launch against the down_proj one, and the
    no-limit model's second launch (the clamp probe's null control); the factor and clamp lists
    each served (launch records) against the probe's; the routed_scaling patch the factor launch
    ran (its record's ``native_modes``); and the patched arm (:func:`scaling_patched_configs`,
    :class:`~nvfp4study.stages.claim_rules.r04_launch.ScalingArm`), None when it was never
    recorded (a run from before it)."""
    from ..serving.records import probe_requests
    from ..serving.request_numbers import compare_outputs

    params = measure.params_of(stage)
    ratio = params.server.cpu.scaling_probe_ratio
    keys = ("off", "off-again", "scaling-factor", "scaling-weights")
    configs = {p: c for p, c in zip(server.PROBE_LABELS, probe_configs(params), strict=True) if p in keys}
    evidence = [e for e in (measure.raw_path(stage.paths, c) for c in configs.values()) if e.is_file()]
    try:
        rows = {p: measure.rows_for(stage, c, probe_requests(params)) for p, c in configs.items()}
    except StageInputMissing as exc:
        return rules.ScalingProbeMeasurements(ratio, {}, [], [], None, evidence, summary, missing=str(exc))
    sides = {"factor": ("scaling-factor", "off"), "weights": ("scaling-weights", "off"),
             "null": ("off-again", "off"), "factor_vs_weights": ("scaling-factor", "scaling-weights")}
    pairs = [{"prompt_id": rows["off"][i]["prompt_id"],
              **{k: compare_outputs(rows[a][i], rows[b][i]) for k, (a, b) in sides.items()}}
             for i in range(len(rows["off"]))]
    recs = {p: _last_ok_launch(stage, c) for p, c in configs.items()}
    factors = {p: (r.get("model_config") or {}).get("routed_scaling_factor") for p, r in recs.items()}
    base = factors.get("off")
    want = {"off": base, "off-again": base, "scaling-factor": None if base is None else base * ratio,
            "scaling-weights": base}
    wrong = [configs[p].model_label for p in keys if base is None or factors.get(p) != want[p]]
    patch = (recs["scaling-factor"].get("native_modes") or {}).get("routed_scaling")
    return rules.ScalingProbeMeasurements(ratio, factors, pairs, wrong, patch, evidence, summary,
                                          audit=_scaling_audit(stage, recs["scaling-factor"].get("sglang_version")),
                                          patched=_scaling_arm(stage, rows, want, evidence))


def _scaling_arm(stage: Stage, rows: dict[str, list[dict[str, Any]]], want: dict[str, Any],
                 evidence: list[Any]) -> rules.ScalingArm | None:
    """The routed-scaling probe's patched arm (:func:`scaling_patched_configs`): per prompt the
    patched factor launch against the probe's unchanged launch (``rows["off"]``) and against the
    patched down_proj control; ``want``: the factor each probe key should serve. Its raw files join
    ``evidence``. None when it is not planned or was never recorded."""
    from ..serving.records import probe_requests
    from ..serving.request_numbers import compare_outputs

    params = measure.params_of(stage)
    configs = scaling_patched_configs(params)
    if not configs:
        return None
    try:
        got = {k: measure.rows_for(stage, c, probe_requests(params)) for k, c in configs.items()}
    except StageInputMissing:
        return None
    evidence.extend(measure.raw_path(stage.paths, c) for c in configs.values())
    recs = {k: _last_ok_launch(stage, c) for k, c in configs.items()}
    patches = {(r.get("native_modes") or {}).get("routed_scaling") for r in recs.values()}
    wrong = any(want.get(k) is None or (r.get("model_config") or {}).get("routed_scaling_factor") != want[k]
                for k, r in recs.items())
    factor, weights = got["scaling-factor"], got["scaling-weights"]
    pairs = [{"prompt_id": row["prompt_id"], "factor": compare_outputs(row, rows["off"][i]),
              "factor_vs_weights": compare_outputs(row, weights[i])} for i, row in enumerate(factor)]
    return rules.ScalingArm(patches.pop() if len(patches) == 1 else None, pairs, served_wrong=wrong)


def _last_ok_launch(stage: Stage, config: ServerConfig) -> dict[str, Any]:
    """The last launch record of ``config`` with status "ok" (:func:`nvfp4study.serving.measure.launches`), or ``{}``."""
    return next((r for r in reversed(measure.launches(stage.paths, config)) if r.get("status") == "ok"), {})


def _scaling_audit(stage: Stage, version: str | None) -> dict[str, Any] | None:
    """03's routed_scaling_factor row (``data/sglang_param_audit.json``, :func:`nvfp4study.stages.
    s03_sglang.param_audit`; ``audit-sglang --param routed_scaling_factor``) of the path the CPU
    engine runs in the released ``version``; None when the version is unknown, the file is missing
    or unreadable, or it has no such row."""
    import json

    if not version:
        return None
    try:
        rows = json.loads(stage.paths.data("sglang_param_audit").read_text())["params"]["routed_scaling_factor"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(rows, list):
        return None
    return next((r for r in rows if isinstance(r, dict) and r.get("path") == rules.PROBE_PATH
                 and r.get("sglang_version") == version), None)


def _audit_row(stage: Stage) -> tuple[dict[str, Any] | None, Any]:
    """03's audit row of :data:`~nvfp4study.stages.claim_rules.r04_launch.PROBE_PATH` and the
    file's path; None when the file is missing, unreadable or has no such row."""
    import json

    path = stage.paths.data("sglang_audit")
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, path
    if not isinstance(rows, list):
        return None, path
    return next((r for r in rows if isinstance(r, dict) and r.get("path") == rules.PROBE_PATH), None), path


def clamp_probe_table(stage: Stage):
    """The clamp probe, one row per prompt: whether the routed-limit and the shared-limit launches'
    greedy outputs equal the no-limit launch's (and where they first differ). Nothing off the CPU
    engine or with the probe off."""
    import pandas as pd

    if (nr := _not_run(stage)) is not None:
        return nr
    params = measure.params_of(stage)
    if not probe_configs(params):
        return measure.Quiet("no clamp probe (GPU engine, server.cpu.clamp_probe_limit 0, or server.model_path set)")
    m = _probe_measurements(stage, "")
    if m.missing:
        return measure.Quiet(f"clamp probe not recorded: {m.missing}")

    def side(c: dict[str, Any]) -> str:
        if not c["comparable"]:
            return "a request failed"
        return "same tokens" if c["identical"] else f"differs at token {c['first_divergence']}"

    return pd.DataFrame([{"prompt": p["prompt_id"], "routed limit vs none": side(p["routed"]),
                          "shared limit vs none (control)": side(p["shared"]),
                          "none, launched again (control)": side(p["null"])} for p in m.pairs])
