"""The served corruption study's live collection: ask the served model for code, keep every raw answer.

**Collection** (live, GPU profile). For each clamp mode in ``corruption.clamp_modes`` one SGLang
server is launched (:func:`nvfp4study.serving.server.serving`, configuration from
the stage's ``serving_plan(params)``, :mod:`nvfp4study.serving.plans`); for each sampling configuration in
``corruption.sampling`` and each task (:func:`nvfp4study.codeeval.tasks.load_tasks`; with
``corruption.protocol: card`` only the tasks of that sampling's claim,
:func:`nvfp4study.codeeval.served_data.sweep_task_ids`) one chat
request is sent (:func:`nvfp4study.serving.client.chat_completion`; thinking via
``chat_template_kwargs``) and its record is appended at once to
``data/corruption-raw-clamp=<mode>-sampling=<name>.jsonl`` (schema in
:mod:`nvfp4study.codeeval.served_data`). Rows whose request succeeded are never sent again, so an
interrupted study resumes where it stopped (a mode whose files are complete does not even start a
server).

**Reasoning-parser probe** (claim ``serve.reasoning-parser``). One more server in ``after_mode``
with ``--reasoning-parser <corruption.reasoning_probe_parser>``; the first
``reasoning_probe_tasks`` claim tasks are asked with the first thinking-off sampling
configuration, streamed and not streamed; rows in
``data/corruption-probe-clamp=<mode>-parser=<parser>.jsonl``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..core.params import Params, SamplingConfig
from ..core.progress import progress
from ..core.stage import Stage
from .served_data import (
    ROW_SCHEMA,
    append_row,
    latest,
    probe_key,
    probe_path,
    probe_plan,
    raw_path,
    read_rows,
    sweep_task_ids,
)
from .tasks import Task, chat_messages, chat_template_kwargs


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


def collect(stage: Stage, tasks: list[Task]) -> list[Path]:
    """Send every request not yet recorded, one server per clamp mode. Returns the raw files.

    Raises:
        the serving errors of :func:`nvfp4study.serving.server.serving` (launch, health), and
        ``RequestFailed`` when the server stops answering (connection refused).
    """
    from ..serving import plans, server

    params: Params = stage.params
    c = params.corruption
    digest = params.digest()
    files = []
    for config in [s.config for s in plans.plan_of(params, stage.name)]:
        mode = config.clamp
        todo: list[tuple[SamplingConfig, Path, list[Task]]] = []
        for s in c.sampling:
            path = raw_path(stage.paths, mode, s.name)
            files.append(path)
            done = {k for k, r in latest(read_rows(path)).items() if r["status"] == "ok"} \
                if path.is_file() else set()
            want = sweep_task_ids(params, s)  # None: every task (corruption.protocol: extended)
            pending = [t for t in tasks if t.task_id not in done and (want is None or t.task_id in want)]
            if pending:
                todo.append((s, path, pending))
        if not todo:
            continue  # resumed: this mode is complete, no server needed
        with server.serving(stage, config) as url:
            for s, path, pending in todo:
                for task in progress(pending, f"{stage.name} clamp={mode} {s.name}"):  # an ETA for the cell
                    rec = _ask(url, task, s, True, params.server.request_timeout_s)
                    append_row(path, _row(rec, clamp=mode, s=s, task=task, stream=True,
                                          parser=params.server.reasoning_parser,
                                          server_key=config.key, digest=digest))
    return files

def collect_probe(stage: Stage, tasks: list[Task]) -> Path | None:
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
    done = {k for k, r in latest(read_rows(path), key=probe_key).items() if r["status"] == "ok"} \
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
