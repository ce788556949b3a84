"""Stage 04's claim rules: the four ``04_launch_server`` claims of ``core/claims.yaml`` (one GPU,
resident size, load time, clamp log lines) and the CPU engine's three findings (its launch, the
clamp probe that checks one audit verdict on the running engine, and the routed-scaling probe),
one function per ledger row.

The card's rows read :class:`LaunchMeasurements` (the last launch of the card's configuration, the
target model's ``Load weight end`` line of its server log and the clamp table per MoE layer); the
launch finding reads :class:`CpuLaunchMeasurements` (the launch record's process tree and what was
left after the stop); the probe reads :class:`ClampProbeMeasurements`. SGLang's "GB" in ``Load weight end`` is GiB (``utils/common.py`` 576 divides bytes
by ``1 << 30``); the ledger uses GB = 1e9 bytes.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ...codeeval.served_analysis import wilson_interval
from ...core.claim_rules import Row, claim_rule, finding_rule
from ...core.ledger import Verdict
from ...serving.server import SGLANG_STOP_SIGNAL, STANDIN_NOTE

GIB = 1 << 30  # SGLang's "GB" (bytes / 2**30)
# Tolerances for verdicts (documented in the ledger notes).
LOAD_TIME_TOL = (0.25, 0.50)  # card "about 300 s": reproduced within 25 %, partly within 50 %
RESIDENT_TOL = 0.05           # 71.8 GB within 5 %

SGLANG_TP_DEFAULT = 1  # SGLang 0.5.23 ``tp_size`` default: sglang/srt/arg_groups/fields/parallel.py:45-51
                       # (``--tp-size``, alias ``--tensor-parallel-size``, ``] = 1``)


def _cmd_value(cmd: list[str] | None, flag: str) -> str | None:
    if not cmd or flag not in cmd:
        return None
    return cmd[cmd.index(flag) + 1]


def tensor_parallel(rec: dict[str, Any]) -> tuple[int, str]:
    """The launch's tensor-parallel size and where it came from: ``/server_info`` ``tp_size``, else
    the command's ``--tp-size``/``--tensor-parallel-size``, else SGLang's default
    (:data:`SGLANG_TP_DEFAULT`). Returns ``(tp, source)``."""
    info = rec.get("server_info") or {}
    if info.get("tp_size") is not None:
        return int(info["tp_size"]), "/server_info tp_size"
    for flag in ("--tp-size", "--tensor-parallel-size"):
        v = _cmd_value(rec.get("command"), flag)
        if v is not None:
            return int(v), f"command {flag}"
    return SGLANG_TP_DEFAULT, "SGLang's default (no --tp-size in the command, none in /server_info)"


@dataclass(frozen=True)
class LaunchMeasurements:
    """The card configuration's last launch, as the stage-04 claim rules read it (the stage builds
    it once from the launch record, its server log and the clamp table)."""

    STAGE: ClassVar[str] = "04_launch_server"
    rec: dict[str, Any]  # the launch record (data/serve-launch-<cfg>.jsonl, last row with a log)
    checked: str  # checked_on: "sglang <version>" (and the replayed run)
    log_ev: Path  # the server log
    launch_ev: Path  # the launch record file
    clamp_ev: Path  # data/launch-clamp.json
    target: dict[str, Any] | None  # the target model's first "Load weight end" line (parse_load_lines), or None
    clamp: Any  # the clamp table per MoE layer (pandas DataFrame: layer, logged limit, match, ...)
    groups: dict[str, str]  # "limit=<v>" -> the MoE layers logging it, as ranges
    card: dict[str, Any]  # claim id -> the card's value (claims.yaml)


def _rel(measured: float, card: float) -> float:
    return abs(measured - card) / card


NO_LOAD_LINE = "no 'Load weight end' line in the server log"


@claim_rule("fit.single-gpu", LaunchMeasurements)
def fit_single_gpu(x: LaunchMeasurements) -> Row:
    """Healthy = the launch record's status is "ok" or it has a launch-to-healthy time. One GPU and
    healthy: reproduced; one GPU and not healthy: contradicted; more than one GPU: not run (not
    tested)."""
    rec = x.rec
    healthy = rec.get("status") == "ok" or rec.get("load_s") is not None
    tp, source = tensor_parallel(rec)
    if tp != 1:
        return Row.not_run(f"served with tensor parallel size {tp} ({source}): one GPU was not tested")
    gpu = rec.get("gpu") or {}
    return Row({"gpus": tp, "gpu": gpu.get("name"), "gpu_memory_gb": gpu.get("memory_gb"), "healthy": healthy},
               Verdict.REPRODUCED if healthy else Verdict.CONTRADICTED, [x.launch_ev, x.log_ev],
               (f"server reached /health_generate 200 on one GPU (tp 1 from {source})" if healthy else
                f"the server did not become healthy on one GPU (tp 1 from {source}); status {rec.get('status')!r}"),
               x.checked)


@claim_rule("size.resident", LaunchMeasurements)
def size_resident(x: LaunchMeasurements) -> Row:
    """The target's weights' memory from ``Load weight end`` in GB (1e9 B) within
    :data:`RESIDENT_TOL` of the card: reproduced; only the GiB figure within it: partly (the card
    read SGLang's "GB" as GB); else contradicted."""
    t = x.target
    if t is None:
        return Row.not_run(NO_LOAD_LINE)
    gb = round(t["mem_gib"] * GIB / 1e9, 2)
    card_gb = x.card["size.resident"]["resident_gb"]
    if _rel(gb, card_gb) <= RESIDENT_TOL:
        v, note = Verdict.REPRODUCED, "weights' memory from SGLang's Load weight end line"
    elif _rel(t["mem_gib"], card_gb) <= RESIDENT_TOL:
        v, note = Verdict.PARTLY, (f"SGLang logs {t['mem_gib']} 'GB' which is GiB (= {gb} GB); the card's "
                                   "number matches the GiB figure, not GB")
    else:
        v, note = Verdict.CONTRADICTED, "weights' memory from SGLang's Load weight end line"
    return Row({"resident_gb": gb, "sglang_log_gib": t["mem_gib"]}, v, [x.log_ev], note, x.checked)


@claim_rule("load.time", LaunchMeasurements)
def load_time(x: LaunchMeasurements) -> Row:
    """The target's weight load (``elapsed`` of ``Load weight end``, s) against the card's: within
    :data:`LOAD_TIME_TOL` ``[0]`` reproduced, ``[1]`` partly, else contradicted."""
    t = x.target
    if t is None:
        return Row.not_run(NO_LOAD_LINE)
    r = _rel(t["elapsed_s"], x.card["load.time"]["load_s"])
    v = Verdict.REPRODUCED if r <= LOAD_TIME_TOL[0] else Verdict.PARTLY if r <= LOAD_TIME_TOL[1] else Verdict.CONTRADICTED
    return Row({"load_s": t["elapsed_s"], "launch_to_healthy_s": x.rec.get("load_s")}, v, [x.log_ev, x.launch_ev],
               "weight load from SGLang's log (card: about 300 s; within 25 % = reproduced, "
               "50 % = partly); launch to healthy includes CUDA graphs and warm-up", x.checked)


@claim_rule("clamp.log-lines", LaunchMeasurements)
def clamp_log_lines(x: LaunchMeasurements) -> Row:
    """One clamp line per MoE layer with the checkpoint's limits: reproduced; some missing or
    disagreeing: partly; no line at all (patch not applied): contradicted."""
    layers = x.clamp[x.clamp.layer.str.isdigit()]
    n_lines = int((layers["logged limit"] != "no line").sum())
    if n_lines == 0:
        v, note = Verdict.CONTRADICTED, "no [swiglu-clamp-patch] line in the log (is the patch applied?)"
    elif bool(layers["match"].all()):
        v, note = Verdict.REPRODUCED, ("one line per MoE layer, limits as in the checkpoint's list; dense layers "
                                       f"0-{int(layers.layer.iloc[0]) - 1} have no MoE and log nothing")
    else:
        v, note = Verdict.PARTLY, "lines present but some layers are missing or disagree with the config's list"
    return Row(x.groups, v, [x.log_ev, x.clamp_ev], note, x.checked)


# --- the CPU engine --------------------------------------------------------------------------
#: SGLang 0.5.23's server processes (``setproctitle`` names, ``srt/entrypoints/engine.py``):
#: the launcher runs the HTTP server and tokenizer manager; scheduler and detokenizer are children.
ENGINE_CHILDREN = ("sglang::scheduler", "sglang::detokenizer")


@dataclass(frozen=True)
class CpuLaunchMeasurements:
    """The card configuration's last launch on the CPU engine (the stage builds it once)."""

    STAGE: ClassVar[str] = "04_launch_server"
    rec: dict[str, Any]  # the launch record: load_s, process_tree, left_after_stop, returncode
    evidence: list[Path]  # the launch record file and the server log
    checked_on: str  # the engine's summary


@finding_rule("serve.cpu-engine-launch", CpuLaunchMeasurements,
              claim="SGLang 0.5.23's real engine (tokenizer manager, scheduler, detokenizer) launches from the "
                    "study's own command builder and lifecycle, answers /health_generate, and is torn down as a "
                    "whole process tree: 0 processes left after the stop.")
def serve_cpu_engine_launch(x: CpuLaunchMeasurements) -> Row:
    """Reproduced when the launch became healthy, its process tree held the launcher and every
    process of :data:`ENGINE_CHILDREN`, and no process of the launch was alive after the stop."""
    rec = x.rec
    tree = rec.get("process_tree") or []
    names = [p["name"] for p in tree]
    left = rec.get("left_after_stop") or []
    children = all(c in names for c in ENGINE_CHILDREN)
    ok = rec.get("load_s") is not None and children and not left and len(tree) >= 1 + len(ENGINE_CHILDREN)
    measured = {"launch_to_healthy_s": rec.get("load_s"), "processes": names,
                "resident_mb": {f"{p['name']} (pid {p['pid']})": p["rss_mb"] for p in tree},
                "left_after_stop": len(left), "returncode": rec.get("returncode")}
    missing = [c for c in ENGINE_CHILDREN if c not in names]
    note = (f"{len(tree)} processes while healthy ({', '.join(names) or 'none'}); "
            f"{len(left)} left after the stop ({signal.Signals(SGLANG_STOP_SIGNAL).name} to SGLang's first "
            "process, then SIGKILL to the process group after server.shutdown_grace_s, marked and "
            "adopted processes included)"
            + (f"; missing: {', '.join(missing)}" if missing else ""))
    return Row(measured, Verdict.REPRODUCED if ok else Verdict.CONTRADICTED, x.evidence,
               note + f"; {STANDIN_NOTE}", x.checked_on)


# --- the clamp probe (CPU engine) ------------------------------------------------------------
#: audit verdicts that predict what the probe sees: DROPPED = the routed limit changes nothing;
#: EXACT / APPROX = it changes the outputs. Others (UNDECIDED, REFUSED, ...) predict nothing.
PREDICTS_APPLIED = {"DROPPED": False, "EXACT": True, "APPROX": True}
PROBE_PATH = "fused-moe-native"  # the audit path the CPU engine's routed experts run (see the rule)
#: the largest chance, at the Wilson bound, that a clamp which is applied goes unseen for the
#: verdict to stand (6 prompts need 5 changed by the control)
MAX_MISS = 0.05


@dataclass(frozen=True)
class ClampProbeMeasurements:
    """04's clamp probe on the CPU engine: per prompt, the greedy outputs of the launches with the
    limit on every routed expert, on every shared expert and of a second no-limit launch, each
    compared with the no-limit launch (:func:`~nvfp4study.serving.request_numbers.compare_outputs`);
    the clamp lists each launch served against those :func:`~nvfp4study.checkpoint.served.probe_shape`
    gives; 03's audit row; or why there is nothing to compare."""

    STAGE: ClassVar[str] = "04_launch_server"
    limit: float  # the probe's clamp limit (server.cpu.clamp_probe_limit)
    pairs: list[dict[str, Any]]  # {"prompt_id", "routed", "shared", "null": compare_outputs(.., off)}
    served_wrong: list[str]  # probe labels whose launch served other clamp lists than the probe's
    audit: dict[str, Any] | None  # 03's data/sglang_audit.json row of PROBE_PATH, or None
    served_version: str | None  # the SGLang the probe launches ran
    evidence: list[Path]  # the probe launches' raw files and the audit file
    checked_on: str  # the engine's summary
    missing: str | None = None  # why nothing could be compared (no probe recorded, ...)


def miss_bound(prompts: int, changed: int) -> float | None:
    """Upper bound on the chance that a clamp which is applied changes none of ``prompts``
    outputs, from the control's ``changed`` of ``prompts``: the per-prompt miss share
    ``1 - changed/prompts`` at the upper end of its Wilson 95 % interval (a one-sided 97.5 %
    bound; :func:`~nvfp4study.codeeval.served_analysis.wilson_interval`), to the power
    ``prompts``. Holds as far as prompts miss independently (they share one model, so it can be
    optimistic). None when nothing was compared."""
    if prompts <= 0:
        return None
    return wilson_interval(prompts - changed, prompts)[1] ** prompts



def _control_refusal(pairs: list[dict[str, Any]], control: str, null_why: str, weak: str) -> str | None:
    """Why a probe's controls cannot decide (None: they can): ``null_why`` when the two no-limit
    launches differ; ``weak`` (formatted with changed, n, bound, max_miss) when the positive
    control ``control`` changed too few outputs for :func:`miss_bound` to stay within :data:`MAX_MISS`."""
    if not all(p["null"]["identical"] for p in pairs):
        return null_why
    changed = sum(not p[control]["identical"] for p in pairs)
    bound = miss_bound(len(pairs), changed)
    if bound is None or bound > MAX_MISS:
        return weak.format(changed=changed, n=len(pairs), bound=bound, max_miss=MAX_MISS)
    return None


def _probe_refusal(x: ClampProbeMeasurements, where: str) -> str | None:
    """Why the probe cannot decide (the not-run reason), or None."""
    sides = ("routed", "shared", "null")
    if not all(p[k]["comparable"] for p in x.pairs for k in sides):
        return "a clamp-probe request failed (see the probe launches' raw files)"
    if not all(p[k]["unit"] == "token" for p in x.pairs for k in sides):
        return "a probe response had no output token ids, so outputs were not compared token for token"
    if x.served_wrong:
        return f"the launches of {', '.join(x.served_wrong)} did not serve the probe's clamp lists"
    if x.audit is None or x.audit.get("verdict") not in PREDICTS_APPLIED:
        return f"the audit's verdict predicts nothing the probe can see ({where})"
    if x.audit.get("sglang_version") != x.served_version:
        return (f"the audit read SGLang {x.audit.get('sglang_version')}, the probe served "
                f"{x.served_version}")
    return _control_refusal(
        x.pairs, "shared", "two launches of the no-limit model gave different outputs, so a difference would "
                           "say nothing about the clamp",
        "the probe is too weak: the same limit on the shared expert changed {changed} of {n} outputs, so an "
        "applied routed clamp would go unseen with chance up to {bound:.3g} (more than {max_miss:g}; more "
        "prompts: server.cpu.clamp_probe_prompts)")


@finding_rule("audit.cpu-moe-clamp", ClampProbeMeasurements,
              claim="The audit's static verdict for SGLang's native PyTorch MoE path (fused-moe-native, where the "
                    "CPU engine runs Ling's routed experts) matches what the running engine does with the routed "
                    "clamp limit: with the limit on every routed expert the greedy outputs equal those with no "
                    "limit exactly when the audit says DROPPED.")
def audit_cpu_moe_clamp(x: ClampProbeMeasurements) -> Row | None:
    """Dynamic reading: "not applied" when every routed-limit output equals its no-limit output
    token for token, "applied" when any differs. Not run when it cannot decide
    (:func:`_probe_refusal`: a failed request, other clamp lists served, an audit verdict that
    predicts nothing or of another release, two no-limit launches that disagree, or a shared-expert
    control too weak for :data:`MAX_MISS`). Reproduced when the reading is what the audit's verdict
    predicts (:data:`PREDICTS_APPLIED`), else contradicted."""
    if x.missing:
        return Row.not_run(x.missing, evidence=x.evidence)
    if not x.pairs:
        return None
    n = len(x.pairs)
    verdict = (x.audit or {}).get("verdict")
    where = (f"audit {PROBE_PATH}: {verdict} at {x.audit.get('file')}:{x.audit.get('line')} "
             f"({x.audit.get('rule')})" if x.audit else f"no {PROBE_PATH} row in 03's audit")
    if (refusal := _probe_refusal(x, where)) is not None:
        return Row.not_run(refusal, evidence=x.evidence)
    same = sum(bool(p["routed"]["identical"]) for p in x.pairs)
    changed = sum(not p["shared"]["identical"] for p in x.pairs)
    reading = "not applied" if same == n else "applied"
    bound = miss_bound(n, changed)
    measured = {"limit": x.limit, "prompts": n, "routed_limit_outputs_equal_to_no_limit": same,
                "shared_limit_outputs_changed": changed, "no_limit_relaunch_identical": n,
                "dynamic_reading": reading, "audit_verdict": verdict, "miss_bound": round(bound, 4)}
    note = (f"limit {x.limit:g} on every MoE layer's routed experts: {same} of {n} greedy outputs equal the "
            f"no-limit launch's, token for token; controls: a second no-limit launch matched on all {n}, and "
            f"the same limit on the shared expert changed {changed} of {n}, so a routed clamp that is applied "
            f"would leave all {n} unchanged with chance <= {bound:.3g} (upper end of the Wilson 95 % interval, "
            f"prompts taken as independent and the routed experts as sensitive as the shared one); {where}. "
            "The routed experts ran UnquantizedFusedMoEMethod.forward_cpu -> moe_forward_native (the "
            f"stand-in has no fused_experts_cpu: calling it raises); {STANDIN_NOTE}")
    ok = (reading == "applied") == PREDICTS_APPLIED[verdict]
    return Row(measured, Verdict.REPRODUCED if ok else Verdict.CONTRADICTED, x.evidence, note, x.checked_on)


# --- the routed-scaling probe (CPU engine) -----------------------------------------------------
#: what the native path does with ``routed_scaling_factor`` per ``server.cpu.routed_scaling`` (the
#: overlay's patch, :mod:`nvfp4study.sglang.patch_native`'s docstring gives the file:line reading):
#: released = applied nowhere, so the factor changes nothing; applied = once, so a factor x r gives
#: the outputs of the routed experts' down_proj x r.
SCALING_PREDICTS = {"released": "not applied", "applied": "applied once"}
#: what the audit's routed_scaling_factor verdict of the native path (``audit-sglang --param
#: routed_scaling_factor``, :mod:`nvfp4study.sglang.param_audit`) predicts the released engine does;
#: the released prediction is the audit's (issue 36), the patched one the patch's reading
AUDIT_PREDICTS = {"DROPPED": "not applied", "APPLIED": "applied once", "DOUBLE": "applied, not as the control"}


@dataclass(frozen=True)
class ScalingArm:
    """The routed-scaling probe's patched arm: the factor model and its down_proj control served
    once more with another ``routed_scaling`` patch (04 serves them with the native ``applied``
    one, :data:`nvfp4study.stages.s04_launch.PATCHED_SCALING`); per prompt the patched factor
    launch's greedy outputs against the unchanged model's ("factor", its released no-limit
    launch) and against the patched down_proj control's ("factor_vs_weights": applied once,
    factor x ratio and down_proj x ratio both give the routed output x factor x ratio)."""

    patch: str | None  # server.cpu.routed_scaling both launches ran (their records' native_modes), None: unknown
    pairs: list[dict[str, Any]]  # {"prompt_id", "factor", "factor_vs_weights"}, in the probe's prompt order
    served_wrong: bool = False  # a launch served another factor than the probe's model of its key


@dataclass(frozen=True)
class ScalingProbeMeasurements:
    """04's routed-scaling probe on the CPU engine: per prompt, the greedy outputs of the clamp
    probe's no-limit model served with ``routed_scaling_factor`` x ratio (config only, "factor")
    and with its routed experts' ``down_proj`` x ratio ("weights", the positive control), each
    against the no-limit launch, the factor launch against the weights launch, and the clamp
    probe's second no-limit launch (the null control); ``patched``: the factor model served with
    the native routed-scaling patch (:class:`ScalingArm`; None: a run recorded before that arm)."""

    STAGE: ClassVar[str] = "04_launch_server"
    ratio: float  # server.cpu.scaling_probe_ratio
    factors: dict[str, Any]  # the routed_scaling_factor each launch served (launch record), by probe key
    pairs: list[dict[str, Any]]  # {"prompt_id", "factor", "weights", "null", "factor_vs_weights"}
    served_wrong: list[str]  # model labels that served another factor or clamp lists than the probe's
    patch: str | None  # server.cpu.routed_scaling of the factor launch (its launch record), None: unknown
    evidence: list[Path]
    checked_on: str
    missing: str | None = None
    audit: dict[str, Any] | None = None  # the audit's routed_scaling_factor row of PROBE_PATH (served release)
    patched: ScalingArm | None = None  # the factor launch with the native routed_scaling patch


def _scaling_refusal(x: ScalingProbeMeasurements) -> str | None:
    """Why the routed-scaling probe cannot decide (the not-run reason), or None."""
    sides = ("factor", "weights", "null", "factor_vs_weights")
    if not all(p[k]["comparable"] for p in x.pairs for k in sides):
        return "a routed-scaling probe request failed (see the probe launches' raw files)"
    if not all(p[k]["unit"] == "token" for p in x.pairs for k in sides):
        return "a probe response had no output token ids, so outputs were not compared token for token"
    if x.served_wrong:
        return f"the launches of {', '.join(x.served_wrong)} did not serve the probe's config"
    if x.patch not in SCALING_PREDICTS:
        return f"the factor launch's record does not say which routed_scaling patch it ran ({x.patch!r})"
    if (arm := x.patched) is not None:
        if not all(p[k]["comparable"] for p in arm.pairs for k in ("factor", "factor_vs_weights")) or \
                [p["prompt_id"] for p in arm.pairs] != [p["prompt_id"] for p in x.pairs]:
            return "a request of the patched factor launch failed (see its raw file)"
        if not all(p[k]["unit"] == "token" for p in arm.pairs for k in ("factor", "factor_vs_weights")):
            return "a probe response had no output token ids, so outputs were not compared token for token"
        if arm.served_wrong:
            return "the patched factor or down_proj launch did not serve the probe's config"
        if arm.patch not in SCALING_PREDICTS:
            return ("the patched launches' records do not say which routed_scaling patch they ran (or differ): "
                    f"{arm.patch!r}")
    if x.patch == "released" and (x.audit or {}).get("verdict") not in AUDIT_PREDICTS:
        return (f"the audit's routed_scaling_factor reading of {PROBE_PATH} predicts nothing the probe can see "
                f"({(x.audit or {}).get('verdict')}: {(x.audit or {}).get('rule', 'no audit row')})")
    return _control_refusal(
        x.pairs, "weights", "two launches of the no-limit model gave different outputs",
        f"the probe is too weak: routed down_proj x {x.ratio:g} changed {{changed}} of {{n}} outputs, so an "
        "applied factor would go unseen with chance up to {bound:.3g} (more than {max_miss:g}; more prompts: "
        "server.cpu.clamp_probe_prompts)")


def _scaling_reading(pairs: list[dict[str, Any]], factor: str = "factor",
                     vs_control: str = "factor_vs_weights") -> tuple[str, int, int]:
    """``(reading, equal to the unchanged model's, equal to the down_proj control's)`` of a factor
    launch: "not applied" when every output equals the unchanged model's token for token, "applied
    once" when every one equals the control's, else "applied, not as the control"."""
    n = len(pairs)
    same = sum(bool(p[factor]["identical"]) for p in pairs)
    as_control = sum(bool(p[vs_control]["identical"]) for p in pairs)
    return ("not applied" if same == n else "applied once" if as_control == n
            else "applied, not as the control"), same, as_control


@finding_rule("audit.cpu-routed-scaling", ScalingProbeMeasurements,
              claim="SGLang 0.5.23's native PyTorch MoE path (where the CPU engine runs Ling's routed experts) "
                    "applies Ling's routed_scaling_factor nowhere as released, and the study's native-routed-scaling "
                    "patch applies it exactly once: served with only the factor changed, the greedy outputs equal "
                    "the unchanged model's when released, and those of the routed down_proj scaled by the same "
                    "ratio when patched.")
def audit_cpu_routed_scaling(x: ScalingProbeMeasurements) -> Row | None:
    """Dynamic reading of each factor launch (:func:`_scaling_reading`): the one served with
    ``server.cpu.routed_scaling`` and the patched arm (``x.patched``, the native ``applied`` patch).
    Not run when it cannot decide (:func:`_scaling_refusal`). Reproduced when each reading is what
    its served patch predicts (released: the audit's verdict, :data:`AUDIT_PREDICTS`; patched:
    :data:`SCALING_PREDICTS`), else contradicted; a run recorded before the patched arm is judged
    on the first launch alone."""
    if x.missing:
        return Row.not_run(x.missing, evidence=x.evidence)
    if not x.pairs:
        return None
    if (refusal := _scaling_refusal(x)) is not None:
        return Row.not_run(refusal, evidence=x.evidence)
    n = len(x.pairs)
    reading, same, as_control = _scaling_reading(x.pairs)
    changed = sum(not p["weights"]["identical"] for p in x.pairs)
    bound = miss_bound(n, changed)

    def predicts(patch: str) -> str:
        return AUDIT_PREDICTS[x.audit["verdict"]] if patch == "released" else SCALING_PREDICTS[patch]

    predicted = predicts(x.patch)
    audit_s = (f"audit-sglang --param routed_scaling_factor, {PROBE_PATH}: {x.audit['verdict']} at "
               f"{x.audit.get('file')}:{x.audit.get('line')} ({x.audit.get('rule')})" if x.audit else
               f"no audit reading of {PROBE_PATH}")
    measured = {"ratio": x.ratio, "factors": x.factors, "prompts": n, "patch": x.patch,
                "audit_verdict": (x.audit or {}).get("verdict"),
                "factor_outputs_equal_to_unchanged": same, "factor_outputs_equal_to_down_proj_control": as_control,
                "down_proj_control_changed": changed, "null_relaunch_identical": n,
                "dynamic_reading": reading, "predicted": predicted, "miss_bound": round(bound, 4)}
    ok = reading == predicted
    arm_s = "no patched factor launch (a run recorded before it)"
    if (arm := x.patched) is not None:
        p_reading, p_same, p_control = _scaling_reading(arm.pairs)
        p_predicted = predicts(arm.patch)
        measured.update({"patched_patch": arm.patch, "patched_factor_outputs_equal_to_unchanged": p_same,
                         "patched_factor_outputs_equal_to_down_proj_control": p_control,
                         "patched_dynamic_reading": p_reading, "patched_predicted": p_predicted})
        ok = ok and p_reading == p_predicted
        arm_s = (f"the factor and down_proj launches served again with routed_scaling patch {arm.patch!r}: "
                 f"{p_same} of {n} factor outputs equal the unchanged model's and {p_control} of {n} the patched "
                 f"down_proj control's, read as {p_reading} (predicted {p_predicted})")
    note = (f"routed_scaling_factor {x.factors.get('off')} -> {x.factors.get('scaling-factor')} (config only): "
            f"served with routed_scaling patch {x.patch!r}, {same} of {n} greedy outputs equal the unchanged "
            f"model's and {as_control} of {n} those of the routed experts' down_proj x {x.ratio:g} (factor "
            f"unchanged), read as {reading} (predicted {predicted}); {arm_s}. Controls: the no-limit model "
            f"launched twice matched on all {n}, and down_proj x {x.ratio:g} changed {changed} of {n}, so a factor "
            f"that is applied would leave all {n} unchanged with chance <= {bound:.3g} (Wilson 95 %, prompts taken "
            f"as independent). Released, the prediction is the audit's ({audit_s}); patched, the patch's reading "
            f"(the audit does not read the overlay); {STANDIN_NOTE}")
    return Row(measured, Verdict.REPRODUCED if ok else Verdict.CONTRADICTED, x.evidence, note, x.checked_on)
