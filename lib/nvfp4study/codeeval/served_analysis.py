"""The served corruption study's analysis: classify, execute and count every recorded completion.

Reads only the raw rows (:mod:`nvfp4study.codeeval.served_data`). Per completion: code
extraction and the detector (:func:`nvfp4study.codeeval.detect.detect_completion`, the prompt in
scope), then execution of the extracted code against the task's checks in the sandbox
(:mod:`nvfp4study.codeeval.sandbox`).

* *clean*: the detector's status is ``clean``; *corrupted*: ``corrupted`` (its documented rule);
  ``no_code``: no code in the answer (counted in ``n``, as not clean: shown in its own column);
  *unjudged*: the detector refused the answer as ``too_large`` / ``too_deep`` (over the bounds of
  :mod:`nvfp4study.codeeval.bounds`): counted in ``n`` as neither clean nor corrupted, in its own
  column, so an answer the detector could not read never counts as clean;
  failed requests are not completions: excluded from ``n`` and counted as ``failed``;
  *cut*: a thinking-on answer the server stopped at ``max_tokens`` (``finish_reason`` ``length``)
  before any code, still reasoning at 2,048 tokens: nothing in it can be judged clean or
  corrupted, so it is excluded from ``n`` and counted as ``cut`` (an answer cut after its code, or
  with junk, is judged as any other; a thinking-off answer without code stays ``no_code``).
* clean fraction = clean / n, with a 95 % Wilson score interval (Wilson 1927, JASA 22:209-212;
  z = 1.959963984540054 = Phi^-1(0.975)).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.errors import RawDataError
from .sandbox import check_many
from .tasks import Task

Z95 = 1.959963984540054  # Phi^-1(0.975)
JUNK_KINDS = ("undefined_name", "glued_name", "junk_fence")  # findings whose text is a fragment


# --- statistics --------------------------------------------------------------------------------
def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion k/n (Wilson 1927).

    ``center = (p + z²/2n) / (1 + z²/n)``, ``half = z·sqrt(p(1-p)/n + z²/4n²) / (1 + z²/n)``.

    At ``k == 0`` the low end is exactly 0 and at ``k == n`` the high end exactly 1 (the formula
    gives them algebraically; in floating point it can land 1e-16 off, e.g. 10/10 -> high
    0.9999999999999999, which made the interval miss ``p`` and the figure's error bars negative).

    Returns:
        ``(low, high)`` in [0, 1], containing ``k / n``; ``(nan, nan)`` when ``n == 0``.
    """
    if n <= 0:
        return (math.nan, math.nan)
    p = k / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if k <= 0 else max(0.0, center - half)
    high = 1.0 if k >= n else min(1.0, center + half)
    return (low, high)


# --- classification ----------------------------------------------------------------------------
def classify_rows(rows: list[dict[str, Any]], tasks: dict[str, Task], sandbox_params=None,
                  workers: int = 2, execute: bool = True) -> pd.DataFrame:
    """One classified row per request row: extraction, detector verdict, sandboxed execution.

    Args:
        rows: raw rows (already reduced with :func:`~nvfp4study.codeeval.served_data.latest`).
        tasks: ``{task_id: Task}``; every row's task must be there.
        sandbox_params: :class:`~nvfp4study.core.params.SandboxParams` for execution.
        workers: parallel sandboxes.
        execute: False skips execution (``exec_outcome`` stays None).

    Returns:
        DataFrame with columns ``clamp, sampling, task_id, source, thinking, stream,
        reasoning_parser, status, finish_reason, completion_tokens, content_empty,
        code_source, code_origin, think, detector, label, clean, corrupted, no_code,
        unjudged, cut, misplaced, findings (list[str]), junk (list[str]), exec_outcome,
        exec_exception, exec_name, passed, isolation``; ``detector`` is clean / corrupted /
        no_code / too_large / too_deep / request_failed.

    Raises:
        RawDataError: a row names a task that is not in ``tasks``.
    """
    from .detect import detect_completion

    out, jobs = [], []
    for row in rows:
        task = tasks.get(row["task_id"])
        if task is None:
            raise RawDataError(f"row for unknown task {row['task_id']!r} ({row['clamp']}/{row['sampling']})")
        rec = {k: row.get(k) for k in ("clamp", "sampling", "task_id", "source", "thinking",
                                        "stream", "reasoning_parser", "status", "finish_reason",
                                        "completion_tokens")}
        rec["content_empty"] = not (row.get("content") or "").strip()
        rec.update(code_source=None, code_origin=None, think=None, label=None, findings=[],
                   junk=[], exec_outcome=None, exec_exception=None, exec_name=None,
                   passed=False, isolation=None)
        if row["status"] != "ok":
            rec.update(detector="request_failed", clean=False, corrupted=False, no_code=False,
                       unjudged=False, misplaced=False, cut=False)
            out.append(rec)
            continue
        det = detect_completion(row.get("content"), row.get("reasoning_content"),
                                prompt=task.prompt, entry_point=task.entry_point)
        ex = det.extraction or {}
        rec.update(
            code_source=ex.get("source"), code_origin=ex.get("origin"), think=ex.get("think"),
            detector=str(det.status), label=det.label, clean=str(det.status) == "clean",
            corrupted=str(det.status) == "corrupted", no_code=str(det.status) == "no_code",
            unjudged=det.unjudged,
            misplaced=ex.get("origin") in ("reasoning_content", "after_stray_think"),
            findings=sorted({str(f.kind) for f in det.findings}),
            junk=[f.text for f in det.findings if str(f.kind) in JUNK_KINDS and f.text],
        )
        rec["cut"] = rec["no_code"] and row.get("finish_reason") == "length" and bool(row.get("thinking"))
        if execute and not rec["no_code"]:
            jobs.append((len(out), task, det.code))
        out.append(rec)
    if jobs:
        results = check_many([(t, code) for _, t, code in jobs], sandbox_params, workers=workers)
        for (i, _, _), r in zip(jobs, results, strict=True):
            out[i].update(exec_outcome=r.outcome, exec_exception=r.exception, exec_name=r.name,
                          passed=r.passed, isolation=r.isolation)
    cols = ["clamp", "sampling", "task_id", "source", "thinking", "stream", "reasoning_parser",
            "status", "finish_reason", "completion_tokens", "content_empty", "code_source",
            "code_origin", "think", "detector", "label", "clean", "corrupted", "no_code",
            "unjudged", "cut", "misplaced", "findings", "junk", "exec_outcome", "exec_exception", "exec_name",
            "passed", "isolation"]
    return pd.DataFrame(out, columns=cols)


# --- summaries ---------------------------------------------------------------------------------
def summarize(df: pd.DataFrame, sets: dict[str, list[str]]) -> pd.DataFrame:
    """Clean fractions per clamp mode x sampling config, on the claim set and on all tasks.

    Returns:
        DataFrame: ``clamp, sampling, task_set ("claim" | "all"), requests, failed, cut, n, clean,
        corrupted, no_code, unjudged, clean_frac, ci_low, ci_high, executed, passed``; ``n`` =
        successful requests that are not cut (clean + corrupted + no_code + unjudged);
        ``executed`` = completions with code; ``passed`` = executed and passed.
    """
    rows = []
    if df.empty:
        return pd.DataFrame(columns=["clamp", "sampling", "task_set", "requests", "failed", "cut", "n",
                                     "clean", "corrupted", "no_code", "unjudged", "clean_frac", "ci_low",
                                     "ci_high", "executed", "passed"])
    for (clamp, sampling), g in df.groupby(["clamp", "sampling"], sort=False):
        subsets = [("claim", g[g.task_id.isin(sets[sampling])])] if sampling in sets else []
        for name, part in [*subsets, ("all", g)]:
            answered = part[part.detector != "request_failed"]
            cut = answered["cut"].astype(bool) if "cut" in answered else pd.Series(False, index=answered.index)
            ok = answered[~cut]
            n, k = len(ok), int(ok.clean.sum())
            lo, hi = wilson_interval(k, n)
            rows.append({"clamp": clamp, "sampling": sampling, "task_set": name,
                         "requests": len(part), "failed": len(part) - len(answered), "cut": int(cut.sum()),
                         "n": n, "clean": k,
                         "corrupted": int(ok.corrupted.sum()), "no_code": int(ok.no_code.sum()),
                         "unjudged": int(ok.unjudged.sum()),
                         "clean_frac": k / n if n else math.nan, "ci_low": lo, "ci_high": hi,
                         "executed": int(ok.exec_outcome.notna().sum()),
                         "passed": int(ok.passed.sum())})
    return pd.DataFrame(rows)


def junk_fragments(df: pd.DataFrame, top: int = 20) -> pd.DataFrame:
    """The most frequent junk fragments (undefined names, glued names, fence junk): one row per
    fragment, ``total`` and one count column per clamp mode, most frequent first."""
    counts: dict[str, Counter] = {}
    for clamp, frags in zip(df.get("clamp", []), df.get("junk", []), strict=True):
        for f in frags if frags is not None else []:
            counts.setdefault(f, Counter())[clamp] += 1
    modes = list(dict.fromkeys(df["clamp"])) if not df.empty else []
    rows = [{"fragment": f, "total": sum(c.values()), **{m: c.get(m, 0) for m in modes}}
            for f, c in counts.items()]
    rows.sort(key=lambda r: (-r["total"], r["fragment"]))
    return pd.DataFrame(rows[:top], columns=["fragment", "total", *modes])


def probe_summary(rows: list[dict[str, Any]], tasks: dict[str, Task]) -> pd.DataFrame:
    """Per stream mode of the reasoning-parser probe: ``n`` answered requests,
    ``content_empty`` (content "" or None), ``answer_in_reasoning`` (the code was found in
    ``reasoning_content``), ``code_in_content``."""
    from .extract import extract_code

    out = []
    for stream in (True, False):
        part = [r for r in rows if bool(r.get("stream")) == stream and r["status"] == "ok"]
        empty = in_reasoning = in_content = 0
        for r in part:
            task = tasks[r["task_id"]]
            ex = extract_code(r.get("content"), r.get("reasoning_content"), task.entry_point)
            empty += not (r.get("content") or "").strip()
            in_reasoning += str(ex.origin) == "reasoning_content"
            in_content += str(ex.origin) in ("content", "after_stray_think")
        failed = sum(1 for r in rows if bool(r.get("stream")) == stream and r["status"] != "ok")
        out.append({"stream": stream, "n": len(part), "failed": failed, "content_empty": empty,
                    "answer_in_reasoning": in_reasoning, "code_in_content": in_content})
    return pd.DataFrame(out)


def write_parquet(df: pd.DataFrame, path: Path) -> None:
    """Write ``df`` to ``path`` as Parquet, atomically (a temp file in the folder, then rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    df.to_parquet(tmp, index=False)
    os.replace(tmp, path)
