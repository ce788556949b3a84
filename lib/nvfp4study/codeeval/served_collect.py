"""The served corruption study's requests: what stage 05 asks the served model for code, as
requests of the one serving pipeline (:class:`nvfp4study.serving.records.ServedRequest`).

**The sweep** (:func:`sweep_requests`). For each clamp mode in ``corruption.clamp_modes`` stage
05's ``serving_plan`` serves the card's configuration in that mode; for each sampling
configuration in ``corruption.sampling`` and each task (:func:`nvfp4study.codeeval.tasks.load_tasks`;
with ``corruption.protocol: card`` only the tasks of that sampling's claim,
:func:`nvfp4study.codeeval.served_data.sweep_task_ids`) one streamed chat request
(:func:`nvfp4study.serving.client.chat_completion`; thinking via ``chat_template_kwargs``)
whose record is appended at once to ``data/corruption-raw-clamp=<mode>-sampling=<name>.jsonl``
(schema in :mod:`nvfp4study.codeeval.served_data`). The one collector
(:func:`nvfp4study.serving.measure.collect`) launches each configuration once, shares the launch
with any other stage serving the same configuration, and never sends again a request whose row
has status "ok" (resume: a mode whose files are complete does not even start a server).

**Reasoning-parser probe** (:func:`probe_requests`, claim ``serve.reasoning-parser``). One more
server in ``after_mode`` with ``--reasoning-parser <corruption.reasoning_probe_parser>``
(``ServerConfig.reasoning_parser``); the first ``reasoning_probe_tasks`` claim tasks are asked
with the first thinking-off sampling configuration, streamed and not streamed; rows in
``data/corruption-probe-clamp=<mode>-parser=<parser>.jsonl``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

from ..core.params import Params, SamplingConfig
from ..core.paths import RunPaths
from ..core.stage import Stage
from .served_data import (
    ROW_SCHEMA,
    append_row,
    probe_path,
    probe_plan,
    raw_path,
    sweep_task_ids,
)
from .tasks import Task, chat_messages, chat_template_kwargs, load_tasks


@cache
def _tasks(humaneval_count: int, card_tasks: bool) -> dict[str, Task]:
    """``{task id: task}`` of :func:`load_tasks` (read once per process: every plan asks it)."""
    return {t.task_id: t for t in load_tasks(humaneval_count, card_tasks)}


@dataclass(frozen=True)
class CorruptionRequest:
    """One request of 05's sweep (``probe`` False) or of its reasoning-parser probe (True): a task,
    the sampling configuration's values, streamed or not. A
    :class:`~nvfp4study.serving.records.ServedRequest`."""

    task_id: str
    sampling: str
    thinking: bool
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    stream: bool = True
    probe: bool = False
    wants_warmup: ClassVar[bool] = False  # not timed: no warm-up needed

    @classmethod
    def of(cls, task_id: str, s: SamplingConfig, *, stream: bool = True, probe: bool = False) -> CorruptionRequest:
        """The request of ``task_id`` with sampling configuration ``s``."""
        return cls(task_id, s.name, s.thinking, s.temperature, s.top_p, s.top_k, s.max_tokens, stream, probe)

    @property
    def key(self) -> str:
        """``corruption/<sampling>/<task>`` or ``probe/<task>/stream=on|off``."""
        if self.probe:
            return f"probe/{self.task_id}/stream={'on' if self.stream else 'off'}"
        return f"corruption/{self.sampling}/{self.task_id}"

    def path(self, paths: RunPaths, config: Any) -> Path:
        """The sweep's raw file of (clamp mode, sampling), or the probe's file of (mode, parser)."""
        if self.probe:
            return probe_path(paths, config.clamp, config.reasoning_parser)
        return raw_path(paths, config.clamp, self.sampling)

    @staticmethod
    def reads(paths: RunPaths, config: Any) -> tuple[Path, ...]:
        """None: the task's own prompt is all it asks."""
        return ()

    def row_key(self, row: dict[str, Any]) -> str | None:
        """The key a recorded row answers (its file holds only this kind's rows)."""
        if "task_id" not in row:
            return None
        if self.probe:
            return f"probe/{row['task_id']}/stream={'on' if row.get('stream') else 'off'}"
        return f"corruption/{row.get('sampling')}/{row['task_id']}"

    def send(self, stage: Stage, url: str, config: Any, launch: int) -> dict[str, Any]:
        """Ask it, append its row (:data:`~nvfp4study.codeeval.served_data.ROW_SCHEMA`) and return
        the row. A lost connection (the server died) raises ``RequestFailed``; other failures are
        rows with their status."""
        from ..serving import client

        params: Params = stage.params
        c = params.corruption
        task = _tasks(c.humaneval_count, c.card_tasks)[self.task_id]
        rec = client.chat_completion(
            url, chat_messages(task, self.thinking), temperature=self.temperature, top_p=self.top_p,
            top_k=self.top_k, max_tokens=self.max_tokens, chat_template_kwargs=chat_template_kwargs(self.thinking),
            stream=self.stream, timeout=params.server.request_timeout_s, raise_on_error=False)
        if rec.get("status") == "connection_error":
            client.raise_for_record(rec, url)
        usage = rec.get("usage") if isinstance(rec.get("usage"), dict) else {}
        row = {
            "schema": ROW_SCHEMA, "clamp": config.clamp, "sampling": self.sampling, "task_id": task.task_id,
            "source": task.source, "thinking": self.thinking, "temperature": self.temperature,
            "top_p": self.top_p, "top_k": self.top_k, "max_tokens": self.max_tokens, "stream": self.stream,
            "reasoning_parser": config.reasoning_parser or params.server.reasoning_parser,
            "server": config.key, "status": rec.get("status"),
            "error": rec.get("error"), "content": rec.get("content"),
            "reasoning_content": rec.get("reasoning_content"),
            "finish_reason": rec.get("finish_reason"), "completion_tokens": usage.get("completion_tokens"),
            "end_s": rec.get("end_s"), "ttft_s": rec.get("ttft_s"), "t_wall": rec.get("t_wall"),
            "request": rec.get("request"), "params_digest": params.digest(),
        }
        append_row(self.path(stage.paths, config), row)
        return row


def sweep_requests(params: Params, only: list[str] | None = None) -> tuple[CorruptionRequest, ...]:
    """The sweep's requests on one clamp mode's server, in sending order: per sampling
    configuration, its tasks (module docstring) in task order; ``only``: these task ids at most
    (the CPU engine's ``server.cpu.corruption_tasks``).

    Raises:
        TaskSelectionError: ``corruption.claim_tasks`` names a task that is not loaded.
    """
    c = params.corruption
    loaded = list(_tasks(c.humaneval_count, c.card_tasks))
    out = []
    for s in c.sampling:
        want = sweep_task_ids(params, s)  # None: every task (corruption.protocol: extended)
        out += [CorruptionRequest.of(t, s) for t in loaded
                if (want is None or t in want) and (only is None or t in only)]
    return tuple(out)


def probe_requests(params: Params) -> tuple[CorruptionRequest, ...]:
    """The reasoning-parser probe's requests (each task streamed, then not), or () when the probe
    is off (:func:`~nvfp4study.codeeval.served_data.probe_plan`)."""
    plan = probe_plan(params)
    if plan is None:
        return ()
    s, ids = plan
    return tuple(CorruptionRequest.of(i, s, stream=stream, probe=True) for i in ids for stream in (True, False))
