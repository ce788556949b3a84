"""Stage 05: generated-code corruption: the detector validated on real code, then the served study.

Notebook ``05_corruption``; the notebook calls only this module's functions: thin ones over
the wings' tables and figures (:mod:`nvfp4study.codeeval.detector_validation`,
:mod:`nvfp4study.codeeval.detector_scores`, :mod:`nvfp4study.codeeval.served_display`), and the
stage logic below (the served study's orchestration and every ledger row this stage writes).

**Part 1, detector validation** (any machine): :func:`record_detector_claims` with the rules of
:func:`detector_claim_verdicts`, plus the study finding ``detect.method-comparison``.

**Part 2, the served study** (:func:`run_served_study`): what it serves is :func:`serving_plan`
(requests of :mod:`nvfp4study.codeeval.served_collect` and :mod:`nvfp4study.trained.served`),
collected by the one serving pipeline (:func:`nvfp4study.serving.measure.collect`), raw files and claim sets
(:mod:`nvfp4study.codeeval.served_data`), analysis (:mod:`nvfp4study.codeeval.served_analysis`).
"Before" is ``corruption.before_mode`` (``none``: the clamp removed, the card's unpatched
state), "after" is ``corruption.after_mode`` (``exact``: the post-SiLU clamp).

**Verdicts** for ``corruption.t0-off-15`` / ``-10`` / ``t06-on`` / ``t06-off``: *reproduced* when
every after-mode completion of the set is clean AND the before-mode interval lies entirely
below the after-mode interval (the difference is resolved at 95 %); *partly* when exactly one
of the two holds; *contradicted* when neither does. ``corruption.executed``: the first
``executed_n`` claim tasks, first sampling configuration, after mode; *reproduced* when all
pass, else *contradicted* (failures listed). ``serve.reasoning-parser``: *reproduced* when every
probe answer, streamed and not, has empty ``content`` with the code found in
``reasoning_content``; *partly* when some do; *contradicted* when none do.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from ..codeeval import detector_scores as scores
from ..codeeval import detector_validation as validation
from ..codeeval import served_display as served
from ..codeeval.detector_validation import ValidationResult
from ..codeeval.isolation import UNSAFE_NOTE, Isolation, sandbox_status
from ..codeeval.served_analysis import (
    classify_rows,
    junk_fragments,
    probe_summary,
    summarize,
    write_parquet,
)
from ..codeeval.served_data import (
    SERVED_CLAIMS,
    claim_sets,
    claim_task_ids,
    expected_files,
    latest,
    probe_key,
    read_rows,
)
from ..codeeval.tasks import load_tasks
from ..core import display
from ..core.claim_rules import record_rules, rules_for
from ..core.errors import ReplayDataMissing
from ..core.files import write_json
from ..core.ledger import Verdict
from ..core.params import Params
from ..core.stage import Stage, open_stage_named
from .claim_rules import r05_corruption as rules

NOTEBOOK = "05_corruption"
NOT_RUN_REASON = "needs an NVFP4-capable GPU (server.enabled is false)"
__all__ = ["markdown", "NOTEBOOK", "analyse_served", "describe_trained", "run_trained_study", "trained_figure",
           "trained_table", "outside_evidence_table", "card_examples", "describe_validation",
           "detector_claim_verdicts", "example_table", "miss_table", "open_stage", "serving_plan",
           "record_detector_claims", "record_served_claims", "run_served_study", "sandbox_banner",
           "score_table", "served_figure", "served_junk_table", "served_ledger_rows",
           "served_summary_table", "unsafe_suffix", "validate_detector", "validation_figure"]


def open_stage(params_file: str = "", run_dir: str = "") -> Stage:
    """:func:`nvfp4study.core.stage.open_stage_named` for notebook ``05_corruption``."""
    return open_stage_named(NOTEBOOK, params_file, run_dir)


def serving_plan(params: Params) -> list:
    """What 05 serves (:mod:`nvfp4study.serving.plans`; one pipeline, launches shared with any stage
    serving the same configuration): the corruption sweep, the card's configuration per
    ``corruption.clamp_modes`` entry (``--max-running-requests corruption.concurrency`` above 1;
    on the stand-in, the strategy's ``standin``, the first ``server.cpu.corruption_tasks`` claim
    tasks); the reasoning-parser probe (``corruption.after_mode`` with ``--reasoning-parser``; not
    on the stand-in); live on the stand-in with ``server.cpu.trained.enabled`` the trained arms
    (:func:`nvfp4study.trained.served.serving_order`; the null control a launch of its own)."""
    from dataclasses import replace

    from ..codeeval.served_collect import probe_requests, sweep_requests
    from ..serving.plans import Served
    from ..serving.server import card_config
    from ..serving.strategies import serves_standin
    from ..trained import served as trained

    c = params.corruption
    standin = serves_standin(params)
    card = card_config(params)
    conc = c.concurrency if c.concurrency > 1 else None
    only = claim_task_ids(params, params.server.cpu.corruption_tasks) if standin else None
    sweep = sweep_requests(params, only)
    per = ", ".join(f"{s.name} {sum(r.sampling == s.name for r in sweep)}" for s in c.sampling)
    out = [Served(replace(card, clamp=m, max_running_requests=conc), sweep, replay_launch=False,
                  what=f"05 corruption sweep, clamp {m}, protocol {c.protocol}: tasks per sampling config {per}")
           for m in c.clamp_modes]
    # no probe on the stand-in; a replay copies a recorded probe whatever its engine (optional item)
    probe = () if standin and not params.replay_from else probe_requests(params)
    if probe:
        out.append(Served(replace(card, clamp=c.after_mode, reasoning_parser=c.reasoning_probe_parser), probe,
                          replay_launch=False, replay_optional=True,
                          what=f"05 reasoning-parser probe (--reasoning-parser {c.reasoning_probe_parser})"))
    if standin and params.server.cpu.trained.enabled and not params.replay_from:
        out += [Served(trained.server_config(params, a), trained.arm_requests(params, a),
                       what=f"05 trained stand-in, arm {a.key}") for a in trained.serving_order(params)]
    return out


def _is_trained(item) -> bool:
    """Whether a plan item is one of the trained stand-in's arms (collected by :func:`run_trained_study`)."""
    from ..trained.served import TrainedRequest

    return any(isinstance(r, TrainedRequest) for r in item.requests)


def _collect(stage: Stage, trained: bool) -> Any:
    """The one serving pipeline over 05's plan items of one part: the trained arms or the rest."""
    from ..serving import measure

    return measure.collect(stage, select=lambda item: _is_trained(item) == trained)


def markdown(text: str) -> Any:
    """The notebook's Markdown output (:func:`nvfp4study.core.display.markdown`)."""
    return display.markdown(text)


def sandbox_banner(stage: Stage) -> str:
    """Markdown naming the sandbox this run executes generated code in; fails closed.

    Probes the isolation of ``corruption.sandbox`` before anything runs, when this stage will
    execute generated code (the detector validation with ``validation_execute``, or the served
    study, live or replayed). ``subprocess-unsafe`` (asked for by name) gives a warning
    paragraph; every ledger row of the stage then repeats it (:func:`unsafe_suffix`).

    Raises:
        SandboxUnavailable: ``isolation: bwrap`` and bubblewrap cannot be set up here.
    """
    c, p = stage.params.corruption, stage.params
    if not ((c.validate_detector and c.validation_execute) or p.server.enabled or p.replay_from):
        return "Sandbox: not used (this run executes no generated code)."
    status = sandbox_status(c.sandbox)
    if status["isolation"] == Isolation.SUBPROCESS_UNSAFE:
        return f"**Warning, unsafe sandbox.** {UNSAFE_NOTE}. Every execution row and ledger note says so."
    return (f"Sandbox: bubblewrap ({status['bwrap_version'] or 'version unknown'}), interpreter "
            f"`{status['python']}`, no network, read-only root, private /tmp; processes: "
            f"{status['process_cap']}.")


#: `` "; UNSAFE: ..."`` when a sandbox was ``subprocess-unsafe`` (appended to every ledger note here)
unsafe_suffix = rules.unsafe_suffix


# === part 1: detector validation ================================================================
def validate_detector(stage: Stage) -> ValidationResult:
    """The detector validation on the stage's params (:func:`nvfp4study.codeeval.detector_validation.run`)."""
    return validation.run(stage)


def describe_validation(result: ValidationResult) -> str:
    """One Markdown paragraph: what was validated, how, the headline numbers."""
    return validation.describe(result)


def score_table(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per junk kind, ``recall (precision)`` per method (:func:`nvfp4study.codeeval.detector_scores.table`)."""
    return scores.table(summary)


def validation_figure(result: ValidationResult) -> Any:
    """The recall figure (an IPython ``Image``), or a Markdown note when skipped."""
    return validation.figure(result)


def example_table(samples: pd.DataFrame) -> pd.DataFrame:
    """One injected variant per junk kind: the line before/after and each method's verdict."""
    return scores.examples(samples)


def miss_table(samples: pd.DataFrame, method: str = "detector") -> pd.DataFrame:
    """Junk variants ``method`` did not flag, counted by kind and site (:func:`nvfp4study.codeeval.detector_scores.misses`)."""
    return scores.misses(samples, method)


def card_examples(stage: Stage) -> pd.DataFrame:
    """Each method's verdict on the card's own four junk lines
    (:func:`nvfp4study.codeeval.detector_validation.card_examples`)."""
    return validation.card_examples(stage)


def detector_claim_verdicts(result: ValidationResult) -> dict[str, dict[str, Any]]:
    """The measured values and verdicts for ``detect.ast-undefined`` and ``detect.ascii-junk``
    (``{id: {"measured", "verdict", "note"}}``), decided by their rules in
    :mod:`~nvfp4study.stages.claim_rules.r05_corruption` (which state them)."""
    x = rules.DetectorMeasurements(result, [])
    return {r.id: {"measured": row.measured, "verdict": row.verdict, "note": row.note}
            for r in rules_for(rules.DetectorMeasurements, "claim") for row in [r.fn(x)]}


def record_detector_claims(stage: Stage, result: ValidationResult) -> pd.DataFrame:
    """Record ``detect.ast-undefined``, ``detect.ascii-junk`` and the study finding
    ``detect.method-comparison`` in the ledger; returns the rows written as a table. A skipped
    validation records the two claims as not run."""
    if result.skipped:
        ids = ["detect.ast-undefined", "detect.ascii-junk"]
        stage.not_run("detector validation switched off (corruption.validate_detector: false)", ids)
        return pd.DataFrame({"id": ids, "verdict": [Verdict.NOT_RUN] * 2})
    rows = record_rules(stage, rules.DetectorMeasurements.gather(result))
    return pd.DataFrame(rows)[["id", "verdict", "measured", "note"]]


# === part 2: the served study ===================================================================
def record_served_claims(stage: Stage, params: Params, df: pd.DataFrame, summary: pd.DataFrame,
                  probe: pd.DataFrame | None, evidence: list[Path], probe_file: Path | None,
                  checked_on: str | None = None) -> list[dict[str, Any]]:
    """Write the six served-study ledger rows, each decided by its rule
    (:mod:`~nvfp4study.stages.claim_rules.r05_corruption`; rules in the module docstring).
    Returns the rows with a verdict (those not run are left out)."""
    ids = set(stage.claims()) if hasattr(stage, "claims") else set(SERVED_CLAIMS)
    x = rules.ServedMeasurements(params, df, summary, probe, evidence, probe_file, checked_on)
    return [r for r in record_rules(stage, x, ids=ids) if r["verdict"] != Verdict.NOT_RUN]


def analyse_served(stage: Stage, params: Params, mode: str, *, record: bool = True) -> dict[str, Any]:
    """Classify the raw files in this run's ``data/``, write the tables and the figure, record
    the ledger rows (the card's, unless ``record`` is false: the CPU engine's stand-in settles
    none of them). Reads nothing but those files (and the task data)."""
    c = params.corruption
    tasks = {t.task_id: t for t in load_tasks(c.humaneval_count, c.card_tasks)}
    raws, probe_file = expected_files(stage.paths, params)
    missing = [str(p) for p in raws if not p.is_file()]
    if missing:
        raise ReplayDataMissing("corruption raw files missing: " + ", ".join(missing))
    rows = []
    for p in raws:
        rows += list(latest(read_rows(p)).values())
    df = classify_rows(rows, tasks, c.sandbox, workers=c.max_workers)
    sets = claim_sets(params)
    summary = summarize(df, sets)
    junk = junk_fragments(df)
    probe_rows = read_rows(probe_file) if probe_file is not None and probe_file.is_file() else []
    probe = probe_summary(list(latest(probe_rows, key=probe_key).values()), tasks) if probe_rows else None
    out = {
        "classified": stage.paths.data("corruption-classified", "parquet"),
        "summary": stage.paths.data("corruption-summary", "parquet"),
        "junk": stage.paths.data("corruption-junk", "parquet"),
        "figure": stage.paths.figure("corruption-clean"),
        "provenance": stage.paths.data("corruption-provenance", "json"),
    }
    write_parquet(df, out["classified"])
    write_parquet(summary, out["summary"])
    write_parquet(junk, out["junk"])
    if probe is not None:
        out["probe"] = stage.paths.data("corruption-probe-summary", "parquet")
        write_parquet(probe, out["probe"])
    served.plot(summary, params, out["figure"])
    status = sandbox_status(c.sandbox)
    write_json(out["provenance"], {
        "mode": mode, "params_digest": params.digest(), "replay_from": params.replay_from,
        "raw_files": [p.name for p in raws], "probe_file": probe_file.name if probe_file else None,
        "claim_sets": sets, "sandbox": status, "rows": len(df),
    })
    evidence = [out["summary"], out["classified"], out["figure"], *raws]
    ledger = record_served_claims(stage, params, df, summary, probe, evidence, probe_file,
                                  checked_on=f"sglang {params.sglang.version}") if record else []
    return {"status": mode, "reason": "", "params": params, "classified": df, "summary": summary,
            "junk": junk, "probe": probe, "files": out, "ledger": ledger, "sets": sets}


def run_served_study(stage: Stage) -> dict[str, Any]:
    """The served study, end to end: replay, live, or "not run".

    * ``replay_from`` set: the recorded run's raw files (and its params) are analysed.
    * ``server.enabled`` false: the six claims are recorded ``not run: needs an NVFP4-capable
      GPU (server.enabled is false)`` and nothing else happens.
    * a GPU refusal (:func:`nvfp4study.serving.server.gpu_refusal`): recorded as not run, with it.
    * else live: the one serving pipeline over this stage's plan (:func:`serving_plan`: the sweep
      and the probe), then :func:`analyse_served`.

    Returns:
        ``{"status": "not run"|"live"|"replay", "reason": str, ...}``; when analysed also
        ``classified``, ``summary``, ``junk``, ``probe`` (DataFrames), ``files``, ``ledger``.
    """
    ids = [i for i in stage.claims() if i in SERVED_CLAIMS]
    params: Params = stage.params
    if params.replay_from:
        _collect(stage, trained=False)  # the replay import of the recorded files
        from ..serving.measure import params_of

        return analyse_served(stage, params_of(stage), "replay")
    if not params.server.enabled:
        _not_run_with_outside(stage, NOT_RUN_REASON, ids)
        return {"status": "not run", "reason": NOT_RUN_REASON, "claims": ids}
    from ..serving.server import gpu_refusal
    from ..serving.strategies import serves_standin

    refusal = gpu_refusal(params)
    if refusal:
        _not_run_with_outside(stage, refusal, ids)
        return {"status": "not run", "reason": refusal, "claims": ids}
    _collect(stage, trained=False)
    if serves_standin(params):
        return run_served_cpu_engine(stage, ids)
    return analyse_served(stage, params, "live")


def pipeline_result(df: pd.DataFrame) -> dict[str, Any]:
    """``corruption.cpu-pipeline`` from the classified rows of a CPU-engine run (pure): how many
    answers came back, how many had code extracted, the detector's verdicts, and how many programs
    ran in the sandbox with their outcomes. Reproduced when every request was answered and every
    answer was classified (the stand-in's random weights rarely give code: 0 executed is no fault).

    Returns:
        ``{"measured", "verdict", "note"}``.
    """
    answered = df[df.detector != "request_failed"] if "detector" in df else df.iloc[0:0]
    outcomes = Counter(answered.exec_outcome.dropna()) if "exec_outcome" in answered else Counter()
    measured = {"requests": len(df), "answered": len(answered),
                "detector": {str(k): int(v) for k, v in Counter(answered.detector.fillna("none")).items()},
                "code_extracted": int((answered.detector != "no_code").sum()) if len(answered) else 0,
                "executed": int(sum(outcomes.values())), "exec_outcomes": {str(k): int(v) for k, v in outcomes.items()}}
    ok = len(df) > 0 and len(answered) == len(df)
    return {"measured": measured, "verdict": Verdict.REPRODUCED if ok else Verdict.CONTRADICTED,
            "note": f"{len(answered)}/{len(df)} requests answered by the engine and classified (chat -> "
                    f"extraction -> detector); {measured['executed']} programs reached the sandbox"
                    + (" (the random-weight stand-in's answers hold no code: the sandbox step is exercised by "
                       "the detector validation above, not by these answers)" if not measured["executed"] else "")}


def run_served_cpu_engine(stage: Stage, ids: list[str]) -> dict[str, Any]:
    """The served pipeline's analysis on SGLang's real engine on this CPU (``server.engine: cpu``):
    the plan asked the first ``server.cpu.corruption_tasks`` claim tasks per sampling configuration
    and clamp mode (streamed chat; extraction, detector and sandbox on the engine's real answers)
    and no reasoning-parser probe. The card's rows stay "not run" (the stand-in settles none of
    them); the finding ``corruption.cpu-pipeline`` (:func:`pipeline_result`) says what ran.

    Returns:
        :func:`analyse_served`'s dict with ``engine`` (the engine's summary and the stand-in note).
    """
    from ..serving.server import card_refusal, engine_description

    params: Params = stage.params
    out = analyse_served(stage, params, "live", record=False)
    _not_run_with_outside(stage, card_refusal(params), ids)
    engine = engine_description(params)
    record_rules(stage, rules.CpuPipelineMeasurements(
        pipeline_result(out["classified"]), list(params.corruption.clamp_modes), engine["served_model"],
        [out["files"]["classified"], out["files"]["summary"]], engine["summary"]))
    out["engine"] = engine
    return out


def describe_served(result: dict[str, Any]):
    """Markdown: what the served study did. On the CPU engine: the engine, the stand-in and the
    pipeline's counts (never beside the card's numbers); else :func:`served_display.describe`."""
    if "engine" not in result:
        return served.describe(result)
    m = pipeline_result(result["classified"])["measured"]
    e = result["engine"]
    return markdown(f"**Served live on the CPU engine** ({e['summary']}; {e['served_model']}): "
                    f"{m['answered']}/{m['requests']} answers classified, code extracted from "
                    f"{m['code_extracted']}, {m['executed']} run in the sandbox; detector verdicts "
                    + ", ".join(f"{k} {v}" for k, v in m["detector"].items())
                    + ". The card's before/after rows are not run: they need the real model on an NVFP4 GPU.")


def served_summary_table(result: dict[str, Any]) -> Any:
    """Clean completions per clamp mode and sampling configuration, with Wilson intervals
    (a DataFrame, or a Markdown "not run"; :func:`nvfp4study.codeeval.served_display.summary_table`)."""
    return served.summary_table(result)


def served_figure(result: dict[str, Any]) -> Any:
    """The before/after bar figure as an Image, or a Markdown "not run"."""
    return served.figure(result)


def served_junk_table(result: dict[str, Any]) -> Any:
    """The most frequent junk fragments per clamp mode, or a Markdown "not run"."""
    return served.junk_table(result)


def served_ledger_rows(stage: Stage) -> pd.DataFrame:
    """This stage's served-study ledger rows as a DataFrame (card value beside ours)."""
    from ..core.ledger import read_ledger

    rows = [r for r in read_ledger(stage.run_dir) if r["id"] in SERVED_CLAIMS]
    return pd.DataFrame([{"claim": r["id"], "card": json.dumps(r["card"]),
                          "measured": json.dumps(r["measured"]), "verdict": r["verdict"],
                          "note": r["note"]} for r in rows])


# --- the trained stand-in: before / after on SGLang's real engine (toy scale) ----------------------
def run_trained_study(stage: Stage) -> dict[str, Any]:
    """Corruption before and after the fix on the trained stand-in (:mod:`nvfp4study.trained.served`):
    one CPU-engine launch per arm (``server.cpu.trained``: clamp released / approx / exact x BF16 /
    NVFP4 weights) plus the reference relaunched (null control); the study findings
    ``corruption.trained-*`` through their rules. On a GPU profile, with the server off or
    ``server.cpu.trained.enabled`` false: ``{"status": "not run", "reason"}`` and no rows.

    Raises:
        nvfp4study.trained.artifact.TrainedArtifactError: the committed weights' hashes differ.
    """
    from ..serving.server import engine_description
    from ..serving.strategies import serves_standin
    from ..trained import served as trained

    p = stage.params
    if not (p.server.enabled and serves_standin(p) and p.server.cpu.trained.enabled and not p.replay_from):
        return {"status": "not run", "reason": "the trained stand-in is served only live on the CPU engine "
                                               "(server.engine: cpu, server.cpu.trained.enabled)"}
    _collect(stage, trained=True)
    out = trained.run(stage, p.corruption.sandbox)
    engine = engine_description(p)
    record_rules(stage, rules.TrainedMeasurements(
        {s["arm"]: s for s in out["summary"]}, out["standin"], list(out["files"].values()), engine["summary"]))
    out["status"] = "live"
    return out


def describe_trained(result: dict[str, Any]) -> Any:
    """Markdown: the stand-in (size, training), the arms, and what was served."""
    if result["status"] != "live":
        return markdown(f"**Trained stand-in: not run.** {result['reason']}")
    s = result["standin"]
    h = s["held_out"]
    binds = ", ".join(f"{k} {v:.1%}" for k, v in h.get("routed_clamp_binds", {}).items())
    return markdown(
        f"**Trained stand-in** (toy scale, never beside the card's numbers): {s['parameters']:,} parameters "
        f"({s['megabytes']} MB BF16), {s['layers']} layers all MLA, {s['experts']} routed experts top-{s['top_k']} "
        f"plus a shared expert, vocabulary {s['vocab_size']}; routed clamp limits {s['routed_limits']}, shared "
        f"{s['shared_limits']} (Ling's halved: at Ling's own limits the toy's gates exceed 4 on under 0.05 % of "
        f"values); trained {s['steps']} steps in {s['train_seconds']:.0f} s on {s['device']}. Held-out bits per "
        f"byte: {h['exact']['bits_per_byte']} with the clamp as trained, {h['dropped']['bits_per_byte']} with the "
        f"routed clamp dropped, {h['approx']['bits_per_byte']} pre-SiLU (the reference's numbers, from the "
        f"training log); the clamp binds on {binds} of routed gate values. Served: "
        f"{len(result['summary'])} launches on SGLang's CPU engine, {result['data']['prompts']} HumanEval "
        f"prompts each, greedy, at most {result['data']['max_new_tokens']} tokens.")


def trained_table(result: dict[str, Any]) -> Any:
    """One row per arm: requests, code, parses, junk (detector), runs / passes (sandbox), continuations
    identical to the reference arm, and the reference tokens' mean logprob, with Wilson intervals."""
    if result["status"] != "live":
        return pd.DataFrame()
    df = pd.DataFrame(result["summary"])
    for col in ("code", "parses", "junk", "runs", "passed", "same_as_reference"):
        if f"{col}_ci" in df:
            df[f"{col}_ci"] = df[f"{col}_ci"].map(lambda c: f"{c[0]:.2f}-{c[1]:.2f}")
    return df


def trained_figure(result: dict[str, Any]) -> Any:
    """:func:`nvfp4study.trained.served.figure` of the arms (None when not run)."""
    if result["status"] != "live":
        return None
    from ..trained.served import figure

    return figure(result["summary"])


def outside_evidence() -> list[dict[str, Any]]:
    """Independent public measurements of Ling without its clamp (``core/outside_evidence.yaml``):
    who, date, stack, what they measured, link. Theirs, shown as theirs."""
    from importlib.resources import files

    import yaml

    return yaml.safe_load(files("nvfp4study.core").joinpath("outside_evidence.yaml").read_text())


def outside_evidence_table() -> Any:
    """:func:`outside_evidence` as a table (their numbers, their stacks; the short form is the
    ledger notes')."""
    return pd.DataFrame(outside_evidence()).drop(columns=["short"])


def _not_run_with_outside(stage: Stage, reason: str, ids: list[str]) -> None:
    """The card's corruption rows "not run" with ``reason``, each note followed by the outside
    evidence, attributed (never as the study's measurement)."""
    cites = "; ".join(f"{e['short']} <{e['url']}>" for e in outside_evidence())
    corr = [i for i in ids if i.startswith("corruption.")]
    if corr:
        stage.not_run(f"{reason}. Outside evidence, theirs, not re-measured here (notebook 05's table): {cites}", corr)
    rest = [i for i in ids if i not in corr]
    if rest:
        stage.not_run(reason, rest)
