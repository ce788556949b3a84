"""The served corruption study: ask the served model for code, keep every raw
answer, classify it, execute it, and compare clean fractions before and after the clamp fix.

**Collection** (live, GPU profile). For each clamp mode in ``corruption.clamp_modes`` one SGLang
server is launched (:func:`nvfp4study.serving.server.serving`, configuration from
``server.stage_configs(params)["05_corruption"]``); for each sampling configuration in
``corruption.sampling`` and each task (:func:`nvfp4study.codeeval.tasks.load_tasks`) one chat request is
sent (:func:`nvfp4study.serving.client.chat_completion`; thinking via ``chat_template_kwargs``) and its
record is appended at once to ``data/corruption-raw-clamp=<mode>-sampling=<name>.jsonl``. Rows
whose request succeeded are never sent again, so an interrupted study resumes where it stopped
(a mode whose files are complete does not even start a server).

**Reasoning-parser probe** (``serve.reasoning-parser``). One more server in ``after_mode`` with
``--reasoning-parser <corruption.reasoning_probe_parser>``; the first
``reasoning_probe_tasks`` claim tasks are asked with the first thinking-off sampling
configuration, streamed and not streamed; rows in
``data/corruption-probe-clamp=<mode>-parser=<parser>.jsonl``.

**Raw row schema** (``nvfp4study.codeeval.corruption-raw/1``, one JSON object per request): ``clamp``,
``sampling``, ``task_id``, ``source``, ``thinking``, ``temperature``, ``top_p``, ``top_k``,
``max_tokens``, ``stream``, ``reasoning_parser``, ``server`` (config key), ``status`` ("ok" or the
client's failure status), ``error``, ``content``, ``reasoning_content``, ``finish_reason``,
``completion_tokens``, ``end_s``, ``ttft_s``, ``t_wall``, ``request`` (the body sent),
``params_digest``.

**Analysis** reads only those files (so ``-p replay_from=<run dir>`` re-analyses a recorded run,
with that run's own params, and gives identical tables). Per completion: code extraction and
the detector (:func:`nvfp4study.codeeval.detect.detect_completion`, the prompt in scope), then execution
of the extracted code against the task's checks in the sandbox (:mod:`nvfp4study.codeeval.sandbox`).

* *clean*: the detector's status is ``clean``; *corrupted*: ``corrupted`` (its documented rule);
  ``no_code``: no code in the answer (counted in ``n``, as not clean: shown in its own column);
  failed requests are not completions: excluded from ``n`` and counted as ``failed``.
* clean fraction = clean / n, with a 95 % Wilson score interval (Wilson 1927, JASA 22:209-212;
  z = 1.959963984540054 = Phi^-1(0.975)).
* the card's claim sets: a claim with n tasks (``card.n`` in ``claims.yaml``: 15 for
  ``corruption.t0-off-15``, 10 for the others) uses the first n ids of
  ``corruption.claim_tasks``, by default the study's card-style tasks in order
  (:data:`nvfp4study.codeeval.tasks.CARD_TASK_IDS`: binary_search, is_balanced, dedupe, merge_sorted,
  two_sum, run_length_encode, evaluate_rpn, max_subarray_sum, flatten, word_frequencies,
  first_unique_char, rotate_left, longest_common_prefix, remove_adjacent_duplicates,
  fibonacci); with ``card_tasks: false`` the first n loaded tasks.
* "before" is ``corruption.before_mode`` (``none``: the clamp removed, the card's unpatched
  state), "after" is ``corruption.after_mode`` (``exact``: the post-SiLU clamp); ``stock``
  (SGLang 0.5.23's pre-SiLU clamp, the form the card's own patch gives) is shown when served.

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

import dataclasses
import json
import math
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.errors import RawDataError, ReplayDataMissing, TaskSelectionError
from ..core.files import atomic_write, write_json
from ..core.ledger import Verdict, card_claims
from ..core.params import Params, SamplingConfig
from .isolation import sandbox_status
from .sandbox import check_many
from .tasks import CARD_TASK_IDS, Task, chat_messages, chat_template_kwargs, load_tasks

RAW_STEM, PROBE_STEM = "corruption-raw", "corruption-probe"
ROW_SCHEMA = "nvfp4study.codeeval.corruption-raw/1"
NOT_RUN_REASON = "needs an NVFP4-capable GPU (server.enabled is false)"
SAMPLING_CLAIMS = ("corruption.t0-off-15", "corruption.t0-off-10", "corruption.t06-on",
                   "corruption.t06-off")
SERVED_CLAIMS = (*SAMPLING_CLAIMS, "corruption.executed", "serve.reasoning-parser")
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


# --- claim sets --------------------------------------------------------------------------------
def sampling_claims() -> list[dict[str, Any]]:
    """The card's four sampling claims from ``claims.yaml``: ``{id, sampling, n, card}``."""
    rows = {c["id"]: c for c in card_claims()}
    return [{"id": cid, "sampling": rows[cid]["card"]["sampling"], "n": int(rows[cid]["card"]["n"]),
             "card": rows[cid]["card"]} for cid in SAMPLING_CLAIMS if cid in rows]


def claim_task_ids(params: Params, n: int) -> list[str]:
    """The first ``n`` ids of the claim order (see the module docstring).

    Raises:
        TaskSelectionError: ``corruption.claim_tasks`` names a task that is not loaded.
    """
    c = params.corruption
    loaded = [t.task_id for t in load_tasks(c.humaneval_count, c.card_tasks)]
    if c.claim_tasks:
        unknown = [t for t in c.claim_tasks if t not in set(loaded)]
        if unknown:
            raise TaskSelectionError(f"corruption.claim_tasks names tasks that are not loaded: {unknown}")
        order = list(c.claim_tasks)
    elif c.card_tasks:
        order = list(CARD_TASK_IDS)
    else:
        order = loaded
    return order[:n]


def claim_sets(params: Params) -> dict[str, list[str]]:
    """``{sampling name: task ids}`` of each card claim whose sampling config is in params."""
    names = {s.name for s in params.corruption.sampling}
    return {c["sampling"]: claim_task_ids(params, c["n"]) for c in sampling_claims()
            if c["sampling"] in names}


# --- files -------------------------------------------------------------------------------------
def raw_path(paths, clamp: str, sampling: str) -> Path:
    """``data/corruption-raw-clamp=<clamp>-sampling=<sampling>.jsonl``."""
    return paths.data(RAW_STEM, "jsonl", clamp=clamp, sampling=sampling)


def probe_path(paths, clamp: str, parser: str) -> Path:
    """``data/corruption-probe-clamp=<clamp>-parser=<parser>.jsonl``."""
    return paths.data(PROBE_STEM, "jsonl", clamp=clamp, parser=parser)


def append_row(path: Path, row: dict[str, Any]) -> None:
    """Append one JSON line and fsync it. A last line cut by a crash is first terminated, so
    the new row starts on its own line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as fh:
        if fh.tell() > 0:
            with open(path, "rb") as rd:
                rd.seek(-1, os.SEEK_END)
                if rd.read(1) != b"\n":
                    fh.write(b"\n")
        fh.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
        fh.flush()
        os.fsync(fh.fileno())


REQUIRED = ("clamp", "sampling", "task_id", "status")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a raw JSONL file.

    A line that starts like a JSON object but does not parse is a write cut by a crash (the
    next :func:`append_row` terminated it) and is skipped.

    Raises:
        RawDataError: a line that is not JSON at all, or a row without ``clamp``,
            ``sampling``, ``task_id`` and ``status``.
    """
    rows = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8", errors="replace").splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if line.lstrip().startswith("{"):
                continue  # a record cut mid-write
            raise RawDataError(f"{path}: line {i + 1} is not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or any(k not in row for k in REQUIRED):
            raise RawDataError(f"{path}: line {i + 1} is not a request row (needs {', '.join(REQUIRED)})")
        rows.append(row)
    return rows


def latest(rows: list[dict[str, Any]], key=lambda r: r["task_id"]) -> dict[Any, dict[str, Any]]:
    """``{key: row}``: the last "ok" row of each key, or the last row when none is ok."""
    out: dict[Any, dict[str, Any]] = {}
    for row in rows:
        k = key(row)
        if k not in out or row.get("status") == "ok" or out[k].get("status") != "ok":
            out[k] = row
    return out


# --- collection (live) -------------------------------------------------------------------------
def _row(rec: dict[str, Any], *, clamp: str, s: SamplingConfig, task: Task, stream: bool,
         parser: str | None, server_key: str, digest: str) -> dict[str, Any]:
    usage = rec.get("usage") if isinstance(rec.get("usage"), dict) else {}
    return {
        "schema": ROW_SCHEMA, "clamp": clamp, "sampling": s.name, "task_id": task.task_id,
        "source": task.source, "thinking": s.thinking, "temperature": s.temperature,
        "top_p": s.top_p, "top_k": s.top_k, "max_tokens": s.max_tokens, "stream": stream,
        "reasoning_parser": parser, "server": server_key, "status": rec.get("status"),
        "error": rec.get("error"), "content": rec.get("content"),
        "reasoning_content": rec.get("reasoning_content"),
        "finish_reason": rec.get("finish_reason"), "completion_tokens": usage.get("completion_tokens"),
        "end_s": rec.get("end_s"), "ttft_s": rec.get("ttft_s"), "t_wall": rec.get("t_wall"),
        "request": rec.get("request"), "params_digest": digest,
    }


def _ask(url: str, task: Task, s: SamplingConfig, stream: bool, timeout: float) -> dict[str, Any]:
    """One request; a lost connection (the server died) raises, other failures are rows."""
    from ..serving import client

    rec = client.chat_completion(
        url, chat_messages(task, s.thinking), temperature=s.temperature, top_p=s.top_p,
        top_k=s.top_k, max_tokens=s.max_tokens, chat_template_kwargs=chat_template_kwargs(s.thinking),
        stream=stream, timeout=timeout, raise_on_error=False)
    if rec.get("status") == "connection_error":
        client.raise_for_record(rec, url)
    return rec


def collect(stage, tasks: list[Task]) -> list[Path]:
    """Send every request not yet recorded, one server per clamp mode. Returns the raw files.

    Raises:
        the serving errors of :func:`nvfp4study.serving.server.serving` (launch, health), and
        ``RequestFailed`` when the server stops answering (connection refused).
    """
    from ..serving import server

    params: Params = stage.params
    c = params.corruption
    digest = params.digest()
    files = []
    for config in server.stage_configs(params)["05_corruption"]:
        mode = config.clamp
        todo: list[tuple[SamplingConfig, Path, list[Task]]] = []
        for s in c.sampling:
            path = raw_path(stage.paths, mode, s.name)
            files.append(path)
            done = {k for k, r in latest(read_rows(path)).items() if r["status"] == "ok"} \
                if path.is_file() else set()
            pending = [t for t in tasks if t.task_id not in done]
            if pending:
                todo.append((s, path, pending))
        if not todo:
            continue  # resumed: this mode is complete, no server needed
        with server.serving(stage, config) as url:
            for s, path, pending in todo:
                for task in pending:
                    rec = _ask(url, task, s, True, params.server.request_timeout_s)
                    append_row(path, _row(rec, clamp=mode, s=s, task=task, stream=True,
                                          parser=params.server.reasoning_parser,
                                          server_key=config.key, digest=digest))
    return files


def probe_plan(params: Params) -> tuple[SamplingConfig, list[str]] | None:
    """(the thinking-off sampling config, task ids) of the reasoning-parser probe, or None when
    the probe is switched off or no sampling config has thinking off."""
    c = params.corruption
    if not c.reasoning_probe_parser or c.reasoning_probe_tasks <= 0:
        return None
    off = next((s for s in c.sampling if not s.thinking), None)
    if off is None:
        return None
    return off, claim_task_ids(params, c.reasoning_probe_tasks)


def collect_probe(stage, tasks: list[Task]) -> Path | None:
    """The reasoning-parser probe (module docstring). Returns its file, or None when skipped."""
    from ..serving import server

    params: Params = stage.params
    plan = probe_plan(params)
    if plan is None:
        return None
    s, ids = plan
    c = params.corruption
    parser = c.reasoning_probe_parser
    path = probe_path(stage.paths, c.after_mode, parser)
    by_id = {t.task_id: t for t in tasks}
    done = {k for k, r in latest(read_rows(path), key=_probe_key).items() if r["status"] == "ok"} \
        if path.is_file() else set()
    pending = [(by_id[i], stream) for i in ids for stream in (True, False) if (i, stream) not in done]
    if pending:
        probe_params = params.model_copy(deep=True)
        probe_params.server.reasoning_parser = parser
        probe_stage = dataclasses.replace(stage, params=probe_params)
        config = dataclasses.replace(server.card_config(params), clamp=c.after_mode)
        with server.serving(probe_stage, config) as url:
            for task, stream in pending:
                rec = _ask(url, task, s, stream, params.server.request_timeout_s)
                append_row(path, _row(rec, clamp=c.after_mode, s=s, task=task, stream=stream,
                                      parser=parser, server_key=config.key, digest=params.digest()))
    return path


def _probe_key(row: dict[str, Any]) -> tuple[str, bool]:
    return (row["task_id"], bool(row.get("stream")))


# --- classification ----------------------------------------------------------------------------
def classify_rows(rows: list[dict[str, Any]], tasks: dict[str, Task], sandbox_params=None,
                  workers: int = 2, execute: bool = True) -> pd.DataFrame:
    """One classified row per request row: extraction, detector verdict, sandboxed execution.

    Args:
        rows: raw rows (already reduced with :func:`latest` by the caller).
        tasks: ``{task_id: Task}``; every row's task must be there.
        sandbox_params: :class:`~nvfp4study.core.params.SandboxParams` for execution.
        workers: parallel sandboxes.
        execute: False skips execution (``exec_outcome`` stays None).

    Returns:
        DataFrame with columns ``clamp, sampling, task_id, source, thinking, stream,
        reasoning_parser, status, finish_reason, completion_tokens, content_empty,
        code_source, code_origin, think, detector, label, clean, corrupted, no_code,
        misplaced, findings (list[str]), junk (list[str]), exec_outcome, exec_exception,
        exec_name, passed, isolation``; ``detector`` is clean / corrupted / no_code /
        request_failed.

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
                       misplaced=False)
            out.append(rec)
            continue
        det = detect_completion(row.get("content"), row.get("reasoning_content"),
                                prompt=task.prompt, entry_point=task.entry_point)
        ex = det.extraction or {}
        rec.update(
            code_source=ex.get("source"), code_origin=ex.get("origin"), think=ex.get("think"),
            detector=str(det.status), label=det.label, clean=str(det.status) == "clean",
            corrupted=str(det.status) == "corrupted", no_code=str(det.status) == "no_code",
            misplaced=ex.get("origin") in ("reasoning_content", "after_stray_think"),
            findings=sorted({str(f.kind) for f in det.findings}),
            junk=[f.text for f in det.findings if str(f.kind) in JUNK_KINDS and f.text],
        )
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
            "misplaced", "findings", "junk", "exec_outcome", "exec_exception", "exec_name",
            "passed", "isolation"]
    return pd.DataFrame(out, columns=cols)


# --- summaries ---------------------------------------------------------------------------------
def summarize(df: pd.DataFrame, sets: dict[str, list[str]]) -> pd.DataFrame:
    """Clean fractions per clamp mode x sampling config, on the claim set and on all tasks.

    Returns:
        DataFrame: ``clamp, sampling, task_set ("claim" | "all"), requests, failed, n, clean,
        corrupted, no_code, clean_frac, ci_low, ci_high, executed, passed``; ``n`` = successful
        requests; ``executed`` = completions with code; ``passed`` = executed and passed.
    """
    rows = []
    if df.empty:
        return pd.DataFrame(columns=["clamp", "sampling", "task_set", "requests", "failed", "n",
                                     "clean", "corrupted", "no_code", "clean_frac", "ci_low",
                                     "ci_high", "executed", "passed"])
    for (clamp, sampling), g in df.groupby(["clamp", "sampling"], sort=False):
        subsets = [("claim", g[g.task_id.isin(sets[sampling])])] if sampling in sets else []
        for name, part in [*subsets, ("all", g)]:
            ok = part[part.detector != "request_failed"]
            n, k = len(ok), int(ok.clean.sum())
            lo, hi = wilson_interval(k, n)
            rows.append({"clamp": clamp, "sampling": sampling, "task_set": name,
                         "requests": len(part), "failed": len(part) - n, "n": n, "clean": k,
                         "corrupted": int(ok.corrupted.sum()), "no_code": int(ok.no_code.sum()),
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


# --- the figure --------------------------------------------------------------------------------
def mode_label(mode: str, params: Params) -> str:
    c = params.corruption
    role = {c.before_mode: "before", c.after_mode: "after"}.get(mode)
    return f"{mode} ({role})" if role else mode


def plot(summary: pd.DataFrame, params: Params, path: Path) -> Path:
    """Bars of clean fraction per sampling config and clamp mode (before, stock, after order),
    with 95 % Wilson intervals and k/n on each bar; one panel for the card's claim sets, one for
    all tasks. Writes ``path`` (PNG) and returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = params.corruption
    modes = [m for m in dict.fromkeys([c.before_mode, "none", "stock", c.after_mode, "exact"])
             if m in set(summary.clamp)]
    samplings = list(dict.fromkeys(summary.sampling))
    panels = [(ts, title) for ts, title in (("claim", "card's task sets (n per claim)"),
                                             ("all", "all tasks")) if ts in set(summary.task_set)]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.2), squeeze=False)
    width = 0.8 / max(1, len(modes))
    for ax, (ts, title) in zip(axes[0], panels, strict=True):
        part = summary[summary.task_set == ts]
        for j, mode in enumerate(modes):
            xs, ys, lo, hi, labels, tops = [], [], [], [], [], []
            for i, s in enumerate(samplings):
                r = part[(part.clamp == mode) & (part.sampling == s)]
                if r.empty or not r.iloc[0].n:
                    continue
                r = r.iloc[0]
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(r.clean_frac)
                lo.append(r.clean_frac - r.ci_low)
                hi.append(r.ci_high - r.clean_frac)
                labels.append(f"{int(r.clean)}/{int(r.n)}")
                tops.append(r.ci_high)
            ax.bar(xs, ys, width * 0.92, yerr=[lo, hi], capsize=3, ecolor="0.25",
                   label=mode_label(mode, params))
            for x, top, text in zip(xs, tops, labels, strict=True):
                ax.annotate(text, (x, top + 0.02), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(samplings)), samplings)
        ax.set_ylim(0, 1.3)
        ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
        ax.set_ylabel("clean completions (fraction, 95 % Wilson CI)")
        ax.set_title(title)
        ax.legend(fontsize=8, loc="upper center", ncol=max(1, len(modes)), frameon=False)
    fig.suptitle("Corruption by clamp mode (measured in this run)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --- ledger ------------------------------------------------------------------------------------
def _count(summary: pd.DataFrame, mode: str, sampling: str) -> dict[str, Any] | None:
    r = summary[(summary.clamp == mode) & (summary.sampling == sampling) & (summary.task_set == "claim")]
    if r.empty:
        return None
    r = r.iloc[0]
    ci = [round(float(r.ci_low), 4), round(float(r.ci_high), 4)] if r.n else None
    frac = round(float(r.clean_frac), 4) if r.n else None
    return {"clean": int(r.clean), "n": int(r.n), "clean_frac": frac, "no_code": int(r.no_code),
            "failed": int(r.failed), "ci95": ci}


def record_claims(stage, params: Params, df: pd.DataFrame, summary: pd.DataFrame,
                  probe: pd.DataFrame | None, evidence: list[Path], probe_file: Path | None,
                  checked_on: str | None = None) -> list[dict[str, Any]]:
    """Write the six served-study ledger rows (rules in the module docstring). Returns them."""
    c = params.corruption
    rows = []
    ids = set(stage.claims()) if hasattr(stage, "claims") else set(SERVED_CLAIMS)
    for claim in sampling_claims():
        cid, sampling = claim["id"], claim["sampling"]
        if cid not in ids:
            continue
        before, after = _count(summary, c.before_mode, sampling), _count(summary, c.after_mode, sampling)
        if after is None or not after["n"]:
            stage.not_run(f"sampling config {sampling!r} with clamp mode {c.after_mode!r} was not "
                          "served in this run", [cid])
            continue
        measured = {"sampling": sampling, "n": after["n"], "before_mode": c.before_mode,
                    "after_mode": c.after_mode,
                    "clean_before": None if before is None else before["clean"],
                    "clean_after": after["clean"], "before": before, "after": after}
        all_clean = after["clean"] == after["n"]
        separated = before is not None and before["n"] > 0 and before["ci95"][1] < after["ci95"][0]
        verdict = (Verdict.REPRODUCED if all_clean and separated else
                   Verdict.CONTRADICTED if not all_clean and not separated else Verdict.PARTLY)
        b = "not served" if before is None else f"{before['clean']}/{before['n']} clean"
        note = (f"clean completions on the card's {claim['n']}-task set: {c.before_mode} {b}, "
                f"{c.after_mode} {after['clean']}/{after['n']} clean; "
                f"after all clean: {all_clean}; 95 % Wilson intervals separated: {separated}.")
        rows.append(stage.record(cid, measured=measured, verdict=verdict, evidence=evidence,
                                 note=note, checked_on=checked_on))
    if "corruption.executed" in ids:
        rows.append(_record_executed(stage, params, df, evidence, checked_on))
    if "serve.reasoning-parser" in ids:
        rows.append(_record_probe(stage, params, probe, probe_file, checked_on))
    return [r for r in rows if r is not None]


def _record_executed(stage, params, df, evidence, checked_on):
    c = params.corruption
    first = c.sampling[0].name if c.sampling else None
    ids = claim_task_ids(params, c.executed_n)
    part = df[(df.clamp == c.after_mode) & (df.sampling == first) & df.task_id.isin(ids)
              & (df.detector != "request_failed")]
    if part.empty:
        stage.not_run(f"no answered requests for clamp {c.after_mode!r}, sampling {first!r}",
                      ["corruption.executed"])
        return None
    passed = int(part.passed.sum())
    outcomes = {k: int(v) for k, v in Counter(part.exec_outcome.fillna("no_code")).items()}
    failures = [f"{r.task_id}: {'no code' if pd.isna(r.exec_outcome) else r.exec_outcome}"
                + ("" if pd.isna(r.exec_exception) else f" ({r.exec_exception})")
                for r in part.itertuples() if not r.passed]
    verdict = Verdict.REPRODUCED if passed == len(part) else Verdict.CONTRADICTED
    isolation = ", ".join(sorted(set(part.isolation.dropna()))) or "nothing executed"
    note = (f"first {c.executed_n} claim tasks, sampling {first}, clamp {c.after_mode}, executed "
            f"against their assertions in the sandbox ({isolation})"
            + (f"; failed: {'; '.join(failures)}" if failures else "") + ".")
    return stage.record("corruption.executed", measured={"passed": passed, "n": len(part),
                        "outcomes": outcomes, "sampling": first, "clamp": c.after_mode},
                        verdict=verdict, evidence=evidence, note=note, checked_on=checked_on)


def _record_probe(stage, params, probe, probe_file, checked_on):
    c = params.corruption
    if probe is None or probe.empty or not int(probe.n.sum()):
        why = ("the probe is switched off (corruption.reasoning_probe_parser is null)"
               if not c.reasoning_probe_parser else "no answered probe request")
        stage.not_run(why, ["serve.reasoning-parser"])
        return None
    per = {("stream" if r.stream else "non_stream"): {
        "n": int(r.n), "content_empty": int(r.content_empty),
        "answer_in_reasoning_content": int(r.answer_in_reasoning)} for r in probe.itertuples()}
    hits = [(int(r.content_empty), int(r.answer_in_reasoning), int(r.n)) for r in probe.itertuples() if r.n]
    every = all(e == n and a == n for e, a, n in hits)
    some = any(min(e, a) > 0 for e, a, n in hits)
    verdict = Verdict.REPRODUCED if every else Verdict.PARTLY if some else Verdict.CONTRADICTED
    note = (f"reasoning parser {c.reasoning_probe_parser!r} on, thinking off, clamp "
            f"{c.after_mode}: " + "; ".join(
                f"{k}: content empty {v['content_empty']}/{v['n']}, answer in reasoning_content "
                f"{v['answer_in_reasoning_content']}/{v['n']}" for k, v in per.items()) + ".")
    return stage.record("serve.reasoning-parser",
                        measured={"parser": c.reasoning_probe_parser, **per}, verdict=verdict,
                        evidence=[probe_file] if probe_file else [], note=note,
                        checked_on=checked_on)


# --- the stage ---------------------------------------------------------------------------------
def _replay_source(stage) -> Path:
    src = Path(stage.params.replay_from).expanduser()
    return (src if src.is_absolute() else Path.cwd() / src).resolve()


def _recorded_params(stage) -> Params:
    """The params a replayed run recorded (its ``params.yaml``), else this stage's."""
    from ..core.params import load_params

    if not stage.params.replay_from:
        return stage.params
    src = _replay_source(stage)
    f = src / "params.yaml"
    if not f.is_file():
        raise ReplayDataMissing(f"replay_from {src}: no params.yaml (not a recorded run folder)")
    return load_params(f).model_copy(update={"replay_from": stage.params.replay_from})


def expected_files(paths, params: Params) -> tuple[list[Path], Path | None]:
    """The raw files a complete study with ``params`` has, and its probe file (or None)."""
    c = params.corruption
    raws = [raw_path(paths, m, s.name) for m in c.clamp_modes for s in c.sampling]
    probe = probe_path(paths, c.after_mode, c.reasoning_probe_parser) if probe_plan(params) else None
    return raws, probe


def import_recorded(stage, params: Params) -> list[Path]:
    """Copy a recorded run's raw files into this run (nothing is sent to any server).

    Raises:
        ReplayDataMissing: the folder or any expected raw file is missing.
    """
    from ..core.paths import RunPaths

    src = _replay_source(stage)
    if not src.is_dir():
        raise ReplayDataMissing(f"replay_from {src} is not a folder")
    raws, probe = expected_files(RunPaths(src), params)
    missing = [str(p) for p in raws if not p.is_file()]
    if missing:
        raise ReplayDataMissing("recorded corruption data missing (no live run is started in "
                                "replay mode): " + ", ".join(missing))
    copied = []
    for p in [*raws, *([probe] if probe is not None and probe.is_file() else [])]:
        dst = stage.paths.data_dir / p.name
        if p.resolve() != dst.resolve():
            atomic_write(dst, lambda tmp, src=p: shutil.copyfile(src, tmp))
        copied.append(dst)
    return copied


def analyse(stage, params: Params, mode: str) -> dict[str, Any]:
    """Classify the raw files in this run's ``data/``, write the tables and the figure, record
    the ledger rows. Reads nothing but those files (and the task data)."""
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
    probe = probe_summary(list(latest(probe_rows, key=_probe_key).values()), tasks) if probe_rows else None
    out = {
        "classified": stage.paths.data("corruption-classified", "parquet"),
        "summary": stage.paths.data("corruption-summary", "parquet"),
        "junk": stage.paths.data("corruption-junk", "parquet"),
        "figure": stage.paths.figure("corruption-clean"),
        "provenance": stage.paths.data("corruption-provenance", "json"),
    }
    _write_parquet(df, out["classified"])
    _write_parquet(summary, out["summary"])
    _write_parquet(junk, out["junk"])
    if probe is not None:
        out["probe"] = stage.paths.data("corruption-probe-summary", "parquet")
        _write_parquet(probe, out["probe"])
    plot(summary, params, out["figure"])
    status = sandbox_status(c.sandbox)
    write_json(out["provenance"], {
        "mode": mode, "params_digest": params.digest(), "replay_from": params.replay_from,
        "raw_files": [p.name for p in raws], "probe_file": probe_file.name if probe_file else None,
        "claim_sets": sets, "sandbox": status, "rows": len(df),
    })
    evidence = [out["summary"], out["classified"], out["figure"], *raws]
    ledger = record_claims(stage, params, df, summary, probe, evidence, probe_file,
                           checked_on=f"sglang {params.sglang.version}")
    return {"status": mode, "reason": "", "params": params, "classified": df, "summary": summary,
            "junk": junk, "probe": probe, "files": out, "ledger": ledger, "sets": sets}


def _write_parquet(df: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    df.to_parquet(tmp, index=False)
    os.replace(tmp, path)




def run_served_study(stage) -> dict[str, Any]:
    """The served study, end to end: replay, live, or "not run".

    * ``replay_from`` set: the recorded run's raw files (and its params) are analysed.
    * ``server.enabled`` false: the six claims are recorded ``not run: needs an NVFP4-capable
      GPU (server.enabled is false)`` and nothing else happens.
    * a GPU refusal (:func:`nvfp4study.serving.server.gpu_refusal`): recorded as not run, with it.
    * else live: :func:`collect` and :func:`collect_probe`, then :func:`analyse`.

    Returns:
        ``{"status": "not run"|"live"|"replay", "reason": str, ...}``; when analysed also
        ``classified``, ``summary``, ``junk``, ``probe`` (DataFrames), ``files``, ``ledger``.
    """
    ids = [i for i in stage.claims() if i in SERVED_CLAIMS]
    params: Params = stage.params
    if params.replay_from:
        recorded = _recorded_params(stage)
        import_recorded(stage, recorded)
        return analyse(stage, recorded, "replay")
    if not params.server.enabled:
        stage.not_run(NOT_RUN_REASON, ids)
        return {"status": "not run", "reason": NOT_RUN_REASON, "claims": ids}
    from ..serving.server import gpu_refusal

    refusal = gpu_refusal(params)
    if refusal:
        stage.not_run(refusal, ids)
        return {"status": "not run", "reason": refusal, "claims": ids}
    tasks = load_tasks(params.corruption.humaneval_count, params.corruption.card_tasks)
    collect(stage, tasks)
    collect_probe(stage, tasks)
    return analyse(stage, params, "live")


# --- notebook helpers (each returns something to display) ---------------------------------------
def describe(result: dict[str, Any]):
    """A Markdown paragraph saying what ran and what it found (no card numbers)."""
    from IPython.display import Markdown

    if result["status"] == "not run":
        return Markdown(f"**Not run:** {result['reason']}. Recorded for: "
                        f"{', '.join(result['claims'])}. Re-analyse a recorded run with "
                        "`-p replay_from=<run dir>`.")
    s = result["summary"]
    params = result["params"]
    claim = s[s.task_set == "claim"]
    parts = [f"{r.clamp}/{r.sampling}: {r.clean}/{r.n} clean" for r in claim.itertuples()]
    how = "replayed from the recorded run" if result["status"] == "replay" else "served live"
    return Markdown(f"**{how.capitalize()}** ({len(result['classified'])} completions; "
                    f"before = `{params.corruption.before_mode}`, after = "
                    f"`{params.corruption.after_mode}`). On the card's task sets: "
                    + "; ".join(parts) + ".")


def summary_table(result: dict[str, Any]):
    """The summary DataFrame (or a Markdown "not run")."""
    from IPython.display import Markdown

    if result["status"] == "not run":
        return Markdown("_No served data in this run._")
    return result["summary"]


def figure(result: dict[str, Any]):
    """The bar figure as an Image (or a Markdown "not run")."""
    from IPython.display import Image, Markdown

    if result["status"] == "not run":
        return Markdown("_No figure: the served study did not run._")
    return Image(str(result["files"]["figure"]))


def junk_table(result: dict[str, Any]):
    """The most frequent junk fragments (or a Markdown "not run")."""
    from IPython.display import Markdown

    if result["status"] == "not run":
        return Markdown("_No junk fragments: the served study did not run._")
    if result["junk"].empty:
        return Markdown("_No junk fragment was found in any completion._")
    return result["junk"]


def ledger_rows(stage):
    """This stage's served-study ledger rows as a DataFrame (card value beside ours)."""
    from ..core.ledger import read_ledger

    rows = [r for r in read_ledger(stage.run_dir) if r["id"] in SERVED_CLAIMS]
    return pd.DataFrame([{"claim": r["id"], "card": json.dumps(r["card"]),
                          "measured": json.dumps(r["measured"]), "verdict": r["verdict"],
                          "note": r["note"]} for r in rows])
