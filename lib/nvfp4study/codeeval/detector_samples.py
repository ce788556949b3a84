"""Detector validation, part 1: the samples (clean programs and junk-injected twins) and each method's flag.

**Samples.** For each task (HumanEval's 164 and the study's card-style tasks, from params) the
clean program ``prompt + canonical_solution`` and, per :class:`~nvfp4study.codeeval.junk.JunkKind`,
``junk_variants_per_kind`` junk-injected variants (:func:`nvfp4study.codeeval.junk.make_variants`, seed
``junk_seed``). Each sample is a chat completion: the program in a python fence
(:func:`nvfp4study.codeeval.junk.wrap_completion`); the code every method sees is what
:func:`nvfp4study.codeeval.extract.extract_code` takes out of it. Clean samples are the negatives, junk
variants the positives (junk is present by construction, whether or not it changes behaviour).
:func:`card_example_samples` adds the card's own four junk lines.

**Methods** (:data:`METHODS`), each a yes/no "flagged":

* ``detector``: :func:`nvfp4study.codeeval.detect.detect_completion` says *corrupted* (its rule).
* ``ast_undefined``: the card's check taken literally: the code parses and pyflakes finds a name
  loaded but never bound (``undefined_name`` or ``missing_import``). Code that does not parse
  is not flagged by it.
* ``ast_or_syntax``: the same, also flagging code that does not parse (the generous reading).
* ``non_ascii``: any character above U+007F in the completion (the scan the card warns against).
* ``execution``: the extracted code run against the task's assertions in the sandbox
  (:func:`nvfp4study.codeeval.sandbox.check_many`) does not pass.
"""

from __future__ import annotations

import ast
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from ..core.errors import DetectorValidationError
from . import junk
from .detect import detect_completion
from .extract import extract_code
from .findings import FindingKind
from .junk import JunkKind
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
        ``exec_duration_s``, ``exec_program`` (samples with the same task and extracted program
        share one sandboxed run and its number; absent without execution); and seconds spent
        in detection and execution.
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
    results, program = _execute_once_each(codes, execute)
    seconds["execute"] = time.perf_counter() - t1
    frame["exec_program"] = program
    frame["exec_outcome"] = [str(r.outcome) for r in results]
    frame["execution"] = pd.array([str(r.outcome) != "pass" for r in results], dtype="boolean")
    frame["exec_exception"] = [r.exception for r in results]
    frame["exec_name"] = [r.name for r in results]
    frame["exec_isolation"] = [r.isolation for r in results]
    frame["exec_duration_s"] = [float(r.duration_s) for r in results]
    return frame, seconds


def _execute_once_each(codes: list[tuple[Any, str]],
                       execute: Callable[[list[tuple[Any, str]]], list[Any]]) -> tuple[list[Any], list[int]]:
    """``execute`` over the distinct ``(task, code)`` pairs (by task id and program text), each
    result given to every sample with that pair: a junk kind whose junk extraction removes (a
    closing fence) leaves the clean program, and the same program against the same checks is
    one run. Returns one result per item of ``codes``, in order, and each item's program number
    (the index of its distinct pair: equal numbers shared one run)."""
    first: dict[tuple[str, str], int] = {}
    for task, code in codes:
        first.setdefault((task.task_id, code), len(first))
    unique = [None] * len(first)
    for task, code in codes:
        unique[first[(task.task_id, code)]] = (task, code)
    results = execute(unique)
    program = [first[(task.task_id, code)] for task, code in codes]
    return [results[i] for i in program], program


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
