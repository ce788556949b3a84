"""Stage 05's claim rules: the detector validation's two claims (and its finding), and the six
claims of the served study; one function per ledger row.

Part 1 reads :class:`DetectorMeasurements` (the validation's summary and samples), part 2
:class:`ServedMeasurements` (the classified served rows, their summary and the reasoning-parser
probe). The rules are those of :mod:`nvfp4study.stages.s05_corruption`'s docstring.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from ...codeeval.detector_samples import CLEAN, METHODS
from ...codeeval.detector_validation import ValidationResult
from ...codeeval.isolation import UNSAFE_NOTE, Isolation
from ...codeeval.served_data import claim_task_ids, sampling_claims
from ...core.claim_rules import Row, claim_rule, finding_rule
from ...core.ledger import Verdict
from ...core.params import Params

#: the share of a junk kind the card's AST check must flag for "detects the junk tokens"
AST_RECALL = 0.95
#: the card's common junk tokens (claims.yaml, detect.ascii-junk)
CARD_TOKENS = ("ulp", "oly", "culp", "Advisory")


def unsafe_suffix(isolations: Any) -> str:
    """`` "; UNSAFE: ..."`` when any of ``isolations`` (strings, or one comma-joined string) is
    ``subprocess-unsafe``, else ""; appended to every ledger note of stage 05."""
    # not ``isolations or ()``: an empty numpy array (no answer ran in the sandbox) has no truth value
    vals = [isolations] if isinstance(isolations, str) else list(() if isolations is None else isolations)
    hit = any(Isolation.SUBPROCESS_UNSAFE.value in str(v) for v in vals if v is not None)
    return f" {UNSAFE_NOTE}." if hit else ""


def recalls(summary: pd.DataFrame, method: str) -> dict[str, float]:
    """Recall per junk kind (and ``all``) of one detection method, rounded to 4 places."""
    s = summary[summary["method"] == method]
    return {r["kind"]: round(float(r["recall"]), 4) for _, r in s.iterrows()}


# === part 1: detector validation ================================================================
@dataclass(frozen=True)
class DetectorMeasurements:
    """The detector validation (not skipped), the evidence files and the sandbox warning."""

    STAGE: ClassVar[str] = "05_corruption"
    result: ValidationResult
    evidence: list[Path]
    unsafe: str = ""  # :func:`unsafe_suffix` of the validation's isolation

    @classmethod
    def gather(cls, result: ValidationResult) -> DetectorMeasurements:
        return cls(result, [result.paths["summary"], result.paths["samples"], result.paths["figure"]],
                   unsafe_suffix(result.isolation))

    @property
    def summary(self) -> pd.DataFrame:
        return self.result.summary


def _first(df: pd.DataFrame, col: str, cast: type) -> Any:
    return cast(df[col].iloc[0]) if len(df) else None


@claim_rule("detect.ast-undefined", DetectorMeasurements)
def detect_ast_undefined(x: DetectorMeasurements) -> Row:
    """*Reproduced* when the AST check flags >= 95 % of every junk kind with no false positive on
    the clean programs; *partly* when it has no false positive and flags some junk but misses
    >= 5 % of at least one kind; *contradicted* when it flags a clean program or no junk at all."""
    s = x.summary
    ast_rows = s[(s["method"] == "ast_undefined") & (s["kind"] != "all")]
    fp = int(ast_rows["fp"].iloc[0]) if len(ast_rows) else 0
    if fp or not len(ast_rows) or ast_rows["tp"].sum() == 0:
        verdict = Verdict.CONTRADICTED
    elif (ast_rows["recall"] >= AST_RECALL).all():
        verdict = Verdict.REPRODUCED
    else:
        verdict = Verdict.PARTLY
    weak = [r["kind"] for _, r in ast_rows.iterrows() if r["recall"] < AST_RECALL]
    det_all = s[(s["method"] == "detector") & (s["kind"] == "all")]
    ast_all = s[(s["method"] == "ast_undefined") & (s["kind"] == "all")]
    measured = {
        "method": "pyflakes undefined names on code that parses",
        "recall": recalls(s, "ast_undefined"),
        "false_positives_clean": fp,
        "n_clean": int(ast_rows["n_clean"].iloc[0]) if len(ast_rows) else 0,
        "n_junk": int(ast_all["n_junk"].iloc[0]) if len(ast_rows) else 0,
        "our_detector_recall_all": round(float(det_all["recall"].iloc[0]), 4) if len(det_all) else None,
        "our_detector_false_positives_clean": _first(det_all, "fp", int),
    }
    note = ("pyflakes UndefinedName on the extracted code; "
            + (f"misses >= 5% of: {', '.join(weak)} (code that no longer parses, junk on "
               "attributes/definitions, junk on a closing fence)" if weak else "flags every kind")
            + "; our detector adds syntax-error recovery, glued-name tokens and fence checks.")
    return Row(measured, verdict, x.evidence, note + x.unsafe)


@claim_rule("detect.ascii-junk", DetectorMeasurements)
def detect_ascii_junk(x: DetectorMeasurements) -> Row:
    """The injected fragments are the card's ASCII tokens, so the scan cannot see them here by
    construction: this reproduces the consequence ("a non-ASCII scan misses them"), and whether
    real junk in served completions is ASCII needs the served study: at most *partly*, when every
    card token is ASCII and the scan flags no junk variant whose clean twin it does not already
    flag; *contradicted* otherwise."""
    s, f = x.summary, x.result.samples
    clean = f[f["kind"] == CLEAN].set_index("task_id")["non_ascii"]
    junky = f[f["kind"] != CLEAN]
    own_hits = int(sum(bool(r["non_ascii"]) and not bool(clean.get(r["task_id"], False))
                       for _, r in junky.iterrows()))
    tokens_ascii = {t: t.isascii() for t in CARD_TOKENS}
    verdict = Verdict.PARTLY if all(tokens_ascii.values()) and own_hits == 0 else Verdict.CONTRADICTED
    na = s[(s["method"] == "non_ascii") & (s["kind"] == "all")]
    measured = {
        "tokens_ascii": tokens_ascii,
        "non_ascii_scan_detects": own_hits > 0,
        "scan_hits_caused_by_junk": own_hits,
        "scan_recall_all": round(float(na["recall"].iloc[0]), 4) if len(na) else None,
        "scan_false_positives_clean": _first(na, "fp", int),
        "n_clean": _first(na, "n_clean", int),
    }
    note = ("partly: the card's four tokens are ASCII, and a non-ASCII scan of the whole "
            "completion flags none of the junk injected with them (its only hits come from "
            "non-ASCII characters already in the clean prompt, e.g. '➞' in HumanEval docstrings, "
            "which also make it flag clean programs). Whether the junk a served model really "
            "emits is ASCII is measured only by the served study (05, GPU).")
    return Row(measured, verdict, x.evidence, note + x.unsafe)


@finding_rule("detect.method-comparison", DetectorMeasurements,
              claim="On junk-injected canonical solutions our detector flags at least as much junk as "
                    "the card's AST check, a non-ASCII scan or execution alone, with no false positive "
                    "on the clean programs.")
def detect_method_comparison(x: DetectorMeasurements) -> Row:
    """Reproduced: no false positive and a pooled recall >= every other method's; partly: no false
    positive but another method flags more."""
    s = x.summary
    comp = {m: recalls(s, m).get("all") for m in METHODS if m in set(s["method"])}
    fps = {m: int(s[s["method"] == m]["fp"].iloc[0]) for m in comp}
    det = comp.get("detector")
    others = [r for m, r in comp.items() if m != "detector" and r is not None]
    if det is not None and fps.get("detector") == 0 and all(det >= r for r in others):
        verdict = Verdict.REPRODUCED
    elif det is not None and fps.get("detector") == 0:
        verdict = Verdict.PARTLY
    else:
        verdict = Verdict.CONTRADICTED
    return Row({"recall_all": comp, "false_positives_clean": fps, "isolation": x.result.isolation}, verdict,
               x.evidence, "recall pooled over all junk kinds (per kind in the summary file); 'partly': no false "
               "positive but another method flags more; execution is left out when not run." + x.unsafe)


# === part 2: the served study ===================================================================
@dataclass(frozen=True)
class ServedMeasurements:
    """The served study's classified rows (``df``), their summary, the probe summary, evidence."""

    STAGE: ClassVar[str] = "05_corruption"
    params: Params
    df: pd.DataFrame
    summary: pd.DataFrame
    probe: pd.DataFrame | None
    evidence: list[Path]
    probe_file: Path | None
    checked_on: str | None = None


def count(summary: pd.DataFrame, mode: str, sampling: str) -> dict[str, Any] | None:
    """Clean / n / Wilson 95 % interval of one clamp mode and sampling config on the claim set;
    ``cut`` (answers stopped at ``max_tokens`` before any code, excluded from ``n``) when any."""
    r = summary[(summary.clamp == mode) & (summary.sampling == sampling) & (summary.task_set == "claim")]
    if r.empty:
        return None
    r = r.iloc[0]
    ci = [round(float(r.ci_low), 4), round(float(r.ci_high), 4)] if r.n else None
    frac = round(float(r.clean_frac), 4) if r.n else None
    out = {"clean": int(r.clean), "n": int(r.n), "clean_frac": frac, "no_code": int(r.no_code),
           "unjudged": int(r.unjudged), "failed": int(r.failed), "ci95": ci}
    cut = int(r.get("cut", 0) or 0)  # answers stopped at max_tokens before any code: not in n
    return {**out, "cut": cut} if cut else out


def _sampling_row(x: ServedMeasurements, cid: str) -> Row:
    """*Reproduced* when every after-mode completion is clean AND the before-mode interval lies
    entirely below the after-mode one; *partly* when one of the two holds."""
    c = x.params.corruption
    claim = next(s for s in sampling_claims() if s["id"] == cid)
    sampling = claim["sampling"]
    before, after = count(x.summary, c.before_mode, sampling), count(x.summary, c.after_mode, sampling)
    if after is None or not after["n"]:
        return Row.not_run(f"sampling config {sampling!r} with clamp mode {c.after_mode!r} was not "
                           "served in this run")
    measured = {"sampling": sampling, "n": after["n"], "before_mode": c.before_mode, "after_mode": c.after_mode,
                "clean_before": None if before is None else before["clean"],
                "clean_after": after["clean"], "before": before, "after": after}
    all_clean = after["clean"] == after["n"]
    separated = before is not None and before["n"] > 0 and before["ci95"][1] < after["ci95"][0]
    verdict = (Verdict.REPRODUCED if all_clean and separated else
               Verdict.CONTRADICTED if not all_clean and not separated else Verdict.PARTLY)
    b = "not served" if before is None else f"{before['clean']}/{before['n']} clean"
    note = (f"clean completions on the card's {claim['n']}-task set: {c.before_mode} {b}, "
            f"{c.after_mode} {after['clean']}/{after['n']} clean; "
            f"after all clean: {all_clean}; 95 % Wilson intervals separated: {separated}."
            + unsafe_suffix(x.df.isolation.dropna().unique() if "isolation" in x.df else ()))
    return Row(measured, verdict, x.evidence, note, x.checked_on)


@claim_rule("corruption.t0-off-15", ServedMeasurements)
def corruption_t0_off_15(x: ServedMeasurements) -> Row:
    return _sampling_row(x, "corruption.t0-off-15")


@claim_rule("corruption.t0-off-10", ServedMeasurements)
def corruption_t0_off_10(x: ServedMeasurements) -> Row:
    return _sampling_row(x, "corruption.t0-off-10")


@claim_rule("corruption.t06-on", ServedMeasurements)
def corruption_t06_on(x: ServedMeasurements) -> Row:
    return _sampling_row(x, "corruption.t06-on")


@claim_rule("corruption.t06-off", ServedMeasurements)
def corruption_t06_off(x: ServedMeasurements) -> Row:
    return _sampling_row(x, "corruption.t06-off")


@claim_rule("corruption.executed", ServedMeasurements)
def corruption_executed(x: ServedMeasurements) -> Row:
    """The first ``executed_n`` claim tasks, first sampling config, after mode: *reproduced* when
    all pass their assertions, else *contradicted* (failures listed)."""
    c, df = x.params.corruption, x.df
    first = c.sampling[0].name if c.sampling else None
    ids = claim_task_ids(x.params, c.executed_n)
    part = df[(df.clamp == c.after_mode) & (df.sampling == first) & df.task_id.isin(ids)
              & (df.detector != "request_failed")]
    if part.empty:
        return Row.not_run(f"no answered requests for clamp {c.after_mode!r}, sampling {first!r}")
    passed = int(part.passed.sum())
    outcomes = {k: int(v) for k, v in Counter(part.exec_outcome.fillna("no_code")).items()}
    failures = [f"{r.task_id}: {'no code' if pd.isna(r.exec_outcome) else r.exec_outcome}"
                + ("" if pd.isna(r.exec_exception) else f" ({r.exec_exception})")
                for r in part.itertuples() if not r.passed]
    isolation = ", ".join(sorted(set(part.isolation.dropna()))) or "nothing executed"
    note = (f"first {c.executed_n} claim tasks, sampling {first}, clamp {c.after_mode}, executed "
            f"against their assertions in the sandbox ({isolation})"
            + (f"; failed: {'; '.join(failures)}" if failures else "") + "."
            + unsafe_suffix(part.isolation.dropna().unique()))
    return Row({"passed": passed, "n": len(part), "outcomes": outcomes, "sampling": first, "clamp": c.after_mode},
               Verdict.REPRODUCED if passed == len(part) else Verdict.CONTRADICTED, x.evidence, note, x.checked_on)


@claim_rule("serve.reasoning-parser", ServedMeasurements)
def serve_reasoning_parser(x: ServedMeasurements) -> Row:
    """*Reproduced* when every probe answer, streamed and not, has empty ``content`` with the code in
    ``reasoning_content``; *partly* when some do; *contradicted* when none do."""
    c, probe = x.params.corruption, x.probe
    if probe is None or probe.empty or not int(probe.n.sum()):
        return Row.not_run("the probe is switched off (corruption.reasoning_probe_parser is null)"
                           if not c.reasoning_probe_parser else "no answered probe request")
    per = {("stream" if r.stream else "non_stream"): {
        "n": int(r.n), "content_empty": int(r.content_empty),
        "answer_in_reasoning_content": int(r.answer_in_reasoning)} for r in probe.itertuples()}
    hits = [(int(r.content_empty), int(r.answer_in_reasoning), int(r.n)) for r in probe.itertuples() if r.n]
    every = all(e == n and a == n for e, a, n in hits)
    some = any(min(e, a) > 0 for e, a, n in hits)
    note = (f"reasoning parser {c.reasoning_probe_parser!r} on, thinking off, clamp "
            f"{c.after_mode}: " + "; ".join(
                f"{k}: content empty {v['content_empty']}/{v['n']}, answer in reasoning_content "
                f"{v['answer_in_reasoning_content']}/{v['n']}" for k, v in per.items()) + ".")
    return Row({"parser": c.reasoning_probe_parser, **per},
               Verdict.REPRODUCED if every else Verdict.PARTLY if some else Verdict.CONTRADICTED,
               [x.probe_file] if x.probe_file else [], note, x.checked_on)


# --- the CPU engine: the served pipeline on the engine's own answers -------------------------------
@dataclass(frozen=True)
class CpuPipelineMeasurements:
    """What the served pipeline did on the CPU engine (``s05_corruption.pipeline_result``: measured,
    verdict, note), as the finding reads it."""

    STAGE: ClassVar[str] = "05_corruption"
    result: dict[str, Any]  # {"measured", "verdict", "note"}
    clamp_modes: list[str]  # corruption.clamp_modes
    served_model: str  # what the engine served, in words (the stand-in note)
    evidence: list[Path]  # the classified and summary files
    checked: str  # the engine's summary


@finding_rule("corruption.cpu-pipeline", CpuPipelineMeasurements,
              claim="The served corruption pipeline runs on SGLang's real engine's own answers: streamed chat "
                    "completions, code extraction and the junk detector, and the sandbox for every answer with code.")
def cpu_pipeline(x: CpuPipelineMeasurements) -> Row:
    """The pipeline's own verdict, with the clamp modes and the served model added to its note."""
    r = x.result
    return Row(r["measured"], r["verdict"], x.evidence,
               r["note"] + f"; clamp modes {', '.join(x.clamp_modes)}; {x.served_model}", x.checked)


# --- the trained stand-in (toy scale; never set beside the card's numbers) ------------------------
TRAINED_NOTE = ("toy scale: the project's trained stand-in ({params} parameters, docs/trained-standin.md) on "
                "SGLang's real engine on this CPU, {n} HumanEval prompts, greedy; a mechanism, not the card's numbers")


#: the null control's largest allowed logprob difference (nats): a relaunch that computes the same
#: tokens in float32 reproduces their logprobs to rounding; measured 0 on this machine.
NULL_LOGPROB_TOL = 1e-4


@dataclass(frozen=True)
class TrainedMeasurements:
    """The trained stand-in's arms (``trained.served.summarize`` rows, one per arm, keyed by arm),
    the stand-in's facts (``trained.artifact.describe``), evidence files and the engine."""

    STAGE: ClassVar[str] = "05_corruption"
    arms: dict[str, dict[str, Any]]
    standin: dict[str, Any]
    evidence: list[Path]
    checked: str


def _trained_note(x: TrainedMeasurements) -> str:
    ref = x.arms.get("exact-bf16", {})
    return TRAINED_NOTE.format(params=f"{x.standin['parameters']:,}", n=ref.get("requests", 0))


def _trained_refusal(x: TrainedMeasurements, need: tuple[str, ...]) -> str | None:
    missing = [a for a in ("exact-bf16", "exact-bf16-again", *need) if a not in x.arms]
    if missing:
        return f"arms not served: {', '.join(missing)}"
    null, ref = x.arms["exact-bf16-again"], x.arms["exact-bf16"]
    if null["same_as_reference"] != null["requests"]:
        return (f"the null control failed: the reference arm relaunched gave {null['same_as_reference']} of "
                f"{null['requests']} continuations identical to its first launch, so a difference between arms "
                "cannot be told from the engine's own variation")
    if abs(null["reference_logprob_mean"] - ref["reference_logprob_mean"]) > NULL_LOGPROB_TOL:
        return (f"the null control failed: the relaunched reference scored its own tokens "
                f"{null['reference_logprob_mean'] - ref['reference_logprob_mean']:+.2g} nats off the first launch, "
                f"above {NULL_LOGPROB_TOL:g}: logprob differences between arms are not readable")
    return None


def _arm_words(a: dict[str, Any], ref_lp: float) -> str:
    lo, hi = a["same_as_reference_ci"]
    return (f"{a['arm']}: {a['same_as_reference']} of {a['requests']} continuations as exact-bf16's "
            f"(95 % {lo:.2f}-{hi:.2f}), their tokens' mean logprob {a['reference_logprob_mean'] - ref_lp:+.4f} nats")


@finding_rule("corruption.trained-before-after", TrainedMeasurements,
              claim="On a model trained with Ling's post-SiLU clamp, served by SGLang's real engine, dropping the "
                    "routed clamp (the native MoE path as shipped) changes the greedy output and makes what the "
                    "model writes with its clamp (served through the study's exact patch) less likely.")
def trained_before_after(x: TrainedMeasurements) -> Row | None:
    """Reproduced when the null control holds (the reference relaunched gives the same tokens on
    every prompt and their logprobs within :data:`NULL_LOGPROB_TOL`), the dropped arm changes at
    least one continuation AND gives the reference's tokens a lower per-token mean logprob;
    contradicted otherwise; not run without the arms or the control."""
    if not x.arms:
        return None
    if (why := _trained_refusal(x, ("released-bf16",))) is not None:
        return Row.not_run(why, evidence=x.evidence)
    ref, drop = x.arms["exact-bf16"], x.arms["released-bf16"]
    changed = drop["requests"] - drop["same_as_reference"]
    delta = drop["reference_logprob_mean"] - ref["reference_logprob_mean"]
    measured = {"prompts": drop["requests"], "changed_by_dropping": changed,
                "changed_ci": [round(1 - drop["same_as_reference_ci"][1], 3), round(1 - drop["same_as_reference_ci"][0], 3)],
                "logprob_delta_nats": round(delta, 4), "null_control_identical": x.arms["exact-bf16-again"]["same_as_reference"]}
    ok = changed > 0 and delta < 0
    note = (f"before (routed clamp dropped) vs after (Ling's form): {_arm_words(drop, ref['reference_logprob_mean'])}; "
            f"null control: exact-bf16 relaunched matched on all {ref['requests']}; code-level outcomes are in "
            f"05's table; {_trained_note(x)}")
    return Row(measured, Verdict.REPRODUCED if ok else Verdict.CONTRADICTED, x.evidence, note, x.checked)


@dataclass(frozen=True)
class _Versus:
    """An arm and the dropped-clamp arm, each with its logprob change from the reference's."""

    ref: float
    arm: dict[str, Any]
    drop: dict[str, Any]
    d_arm: float
    d_drop: float


def _versus_dropped(x: TrainedMeasurements, key: str) -> Row | _Versus | None:
    """Arm ``key`` against released-bf16, or the not-run row (arms missing, null control failed),
    or None when the trained stand-in was not served."""
    if not x.arms:
        return None
    if (why := _trained_refusal(x, ("released-bf16", key))) is not None:
        return Row.not_run(why, evidence=x.evidence)
    ref = x.arms["exact-bf16"]["reference_logprob_mean"]
    arm, drop = x.arms[key], x.arms["released-bf16"]
    return _Versus(ref, arm, drop, arm["reference_logprob_mean"] - ref, drop["reference_logprob_mean"] - ref)


@finding_rule("corruption.trained-weights-vs-clamp", TrainedMeasurements,
              claim="On the trained stand-in, NVFP4-rounded routed experts (the study's model_free_ptq output) with "
                    "the clamp cost less likelihood than BF16 experts without it: the weights are not what breaks it.")
def trained_weights_vs_clamp(x: TrainedMeasurements) -> Row | None:
    """Reproduced when the null control holds and exact-nvfp4 lowers the reference tokens' mean
    logprob less than released-bf16 does; contradicted otherwise."""
    p = _versus_dropped(x, "exact-nvfp4")
    if not isinstance(p, _Versus):
        return p
    ref, w, c, dw, dc = p.ref, p.arm, p.drop, p.d_arm, p.d_drop
    measured = {"nvfp4_weights_logprob_delta": round(dw, 4), "dropped_clamp_logprob_delta": round(dc, 4),
                "nvfp4_identical": w["same_as_reference"], "dropped_identical": c["same_as_reference"],
                "prompts": w["requests"]}
    note = (f"weights: {_arm_words(w, ref)}; clamp: {_arm_words(c, ref)}. Both change greedy continuations; the "
            f"likelihood cost separates them. NVFP4 weight rounding only (decoded to BF16: the CPU engine has no FP4 "
            f"MoE); {_trained_note(x)}")
    return Row(measured, Verdict.REPRODUCED if abs(dw) < abs(dc) else Verdict.CONTRADICTED, x.evidence, note, x.checked)


@finding_rule("corruption.trained-approx-gap", TrainedMeasurements,
              claim="On the trained stand-in, the pre-SiLU clamp (what SGLang 0.5.21+'s NVFP4 CUTLASS call computes, "
                    "the audit's APPROX) is closer to Ling's exact form than dropping the clamp is.")
def trained_approx_gap(x: TrainedMeasurements) -> Row | None:
    """Reproduced when the null control holds and approx-bf16 keeps more continuations identical to
    exact-bf16 than released-bf16 does and loses less mean logprob; contradicted otherwise."""
    p = _versus_dropped(x, "approx-bf16")
    if not isinstance(p, _Versus):
        return p
    ref, a, c, da, dc = p.ref, p.arm, p.drop, p.d_arm, p.d_drop
    measured = {"approx_identical": a["same_as_reference"], "dropped_identical": c["same_as_reference"],
                "approx_logprob_delta": round(da, 4), "dropped_logprob_delta": round(dc, 4), "prompts": a["requests"]}
    ok = a["same_as_reference"] > c["same_as_reference"] and abs(da) < abs(dc)
    note = f"approx: {_arm_words(a, ref)}; dropped: {_arm_words(c, ref)}; {_trained_note(x)}"
    return Row(measured, Verdict.REPRODUCED if ok else Verdict.CONTRADICTED, x.evidence, note, x.checked)
