"""What the serving stages ask each server and where the answers are recorded: the prompts, the
request protocol every kind of request follows (:class:`ServedRequest`), 04/06/07's timed chat
request (:class:`RequestSpec`), and the JSONL files of requests and launches under ``data/`` of
the run (their fields: :mod:`nvfp4study.serving.measure`). Appends are flushed and fsynced row by
row (:mod:`nvfp4study.core.jsonl`), so a killed run keeps what it had received (resume).

Other kinds of request (05's corruption sweep and reasoning-parser probe,
:mod:`nvfp4study.codeeval.served_collect`; the trained stand-in's arms,
:mod:`nvfp4study.trained.served`) follow the same :class:`ServedRequest` protocol, so the one
collector (:func:`nvfp4study.serving.measure.collect`) sends them, skips those already answered
and shares their launches."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, Protocol

import yaml

from ..core.errors import StudyError
from ..core.jsonl import append_jsonl, read_jsonl  # noqa: F401  (re-exported: measure and tests name them here)
from .server import ServerConfig

RAW_STEM, LAUNCH_STEM = "serve-raw", "serve-launch"


# --- what to ask -----------------------------------------------------------------------------
@cache
def all_prompts() -> tuple[dict[str, str], ...]:
    """The study's serving prompts (``data/serving_prompts.yaml``): ``({"id", "text"}, ...)``."""
    rows = yaml.safe_load(resources.files(__package__).joinpath("data/serving_prompts.yaml").read_text())
    return tuple({"id": r["id"], "text": r["text"]} for r in rows)


def prompts(n: int) -> list[dict[str, str]]:
    """The first ``n`` prompts. Raises StudyError when more are asked than exist."""
    p = all_prompts()
    if n > len(p):
        raise StudyError(f"{n} prompts asked, the study has {len(p)} (data/serving_prompts.yaml)")
    return list(p[:n])


class ServedRequest(Protocol):
    """One request a stage asks a server (a stage's ``serving_plan`` lists them,
    :class:`nvfp4study.serving.plans.Served`).

    - ``key``: unique among the requests any stage asks one configuration (the collector keeps
      one request per key, :func:`nvfp4study.serving.plans.needs`);
    - ``max_tokens``: its token budget (``nvfp4study plan`` counts it);
    - ``wants_warmup``: a timed request: the launch sends its warm-up requests first;
    - :meth:`path`: the JSONL file its row is appended to (one row per answer, fsynced);
    - :meth:`reads`: the recorded files it reads before asking (a launch whose requests append to
      one of them is served before it, :func:`nvfp4study.serving.measure._waves`);
    - :meth:`row_key`: the key a recorded row of that file answers (None: not a request of this
      kind); a row with ``status`` "ok" is never asked again (resume);
    - :meth:`send`: ask it on a healthy server, append its row, return the row.
    """

    key: str
    max_tokens: int
    wants_warmup: bool

    def path(self, paths: Any, config: ServerConfig) -> Path: ...  # noqa: D102

    def reads(self, paths: Any, config: ServerConfig) -> tuple[Path, ...]: ...  # noqa: D102

    def row_key(self, row: dict[str, Any]) -> str | None: ...  # noqa: D102

    def send(self, stage: Any, url: str, config: ServerConfig, launch: int) -> dict[str, Any]: ...  # noqa: D102


@dataclass(frozen=True)
class RequestSpec:
    """One timed chat request of 04/06/07 (a :class:`ServedRequest`): prompt, repeat index,
    token budget, thinking switch."""

    prompt_id: str
    repeat: int
    max_tokens: int
    thinking: bool = False
    wants_warmup: ClassVar[bool] = True

    @property
    def key(self) -> str:
        """``<prompt>/r<repeat>/max<tokens>/think=on|off``."""
        return f"{self.prompt_id}/r{self.repeat}/max{self.max_tokens}/think={'on' if self.thinking else 'off'}"

    def path(self, paths: Any, config: ServerConfig) -> Path:
        """The configuration's ``serve-raw-<cfg>.jsonl``."""
        return raw_path(paths, config)

    @staticmethod
    def reads(paths: Any, config: ServerConfig) -> tuple[Path, ...]:
        """None: a timed request reads no other answer."""
        return ()

    @staticmethod
    def row_key(row: dict[str, Any]) -> str | None:
        """``request_key`` of a timed row (warm-up rows answer no request)."""
        return None if row.get("warmup") else row.get("request_key")

    def send(self, stage: Any, url: str, config: ServerConfig, launch: int, *, warmup: bool = False,
             text: str | None = None) -> dict[str, Any]:
        """Send it (flush cache, counters before, stream, counters after) and append its row to
        :meth:`path`; ``text`` replaces the prompt (warm-up requests).

        Returns the row. A failed request is a row with ``status``/``error``; if the server
        process has exited meanwhile, :class:`~nvfp4study.core.errors.ServerDied` is raised after
        the row is kept.
        """
        from . import client
        from .process import process_for

        p = stage.params
        if p.mtp.flush_cache:
            client.flush_cache(url)
        before = counters(url, p.server.enable_metrics)
        prompt = text if text is not None else {q["id"]: q["text"] for q in all_prompts()}[self.prompt_id]
        spec_on = config.spec_depth is not None
        rec = client.chat_completion(
            url, [{"role": "user", "content": prompt}], temperature=0.0, top_p=1.0, top_k=-1,
            max_tokens=self.max_tokens, chat_template_kwargs={"enable_thinking": self.thinking},
            return_spec_tokens_details=spec_on, expect_spec_details=spec_on, return_output_ids=True,
            extra_body={"rid": f"nvfp4study-{uuid.uuid4().hex[:12]}"}, timeout=p.server.request_timeout_s,
            raise_on_error=False)
        after = counters(url, p.server.enable_metrics) if rec["status"] == "ok" else None
        row = {"config": config.to_dict(), "config_key": config.key, "request_key": self.key,
               "prompt_id": self.prompt_id, "repeat": self.repeat, "warmup": warmup, "launch": launch,
               "metrics_before": before, "metrics_after": after, **rec}
        append_jsonl(raw_path(stage.paths, config), row)
        if rec["status"] != "ok":
            sp = process_for(url)
            if sp is not None:
                sp.check_alive(wait_s=2.0)
        return row


def counters(url: str, enabled: bool) -> dict[str, float] | None:
    """The Prometheus counters of :data:`nvfp4study.serving.client.COUNTERS` now (None when
    metrics are off)."""
    if not enabled:
        return None
    from . import client

    m = client.get_metrics(url)
    return {k: m.get(k, 0.0) for k in client.COUNTERS}


def mtp_requests(params) -> list[RequestSpec]:
    """06's requests on each depth: ``mtp.prompts`` prompts once each."""
    m = params.mtp
    return [RequestSpec(p["id"], 0, m.max_tokens, m.thinking) for p in prompts(m.prompts)]


def det_requests(params) -> list[RequestSpec]:
    """07's requests on each of its configurations: ``determinism.prompts`` x ``repeats``."""
    d = params.determinism
    return [RequestSpec(p["id"], r, d.max_tokens, False) for r in range(d.repeats) for p in prompts(d.prompts)]


def probe_requests(params) -> list[RequestSpec]:
    """04's clamp-probe requests on each probe launch: ``server.cpu.clamp_probe_prompts`` prompts
    once each, ``clamp_probe_max_tokens`` greedy tokens, thinking off."""
    c = params.server.cpu
    return [RequestSpec(p["id"], 0, c.clamp_probe_max_tokens, False) for p in prompts(c.clamp_probe_prompts)]


# --- files -----------------------------------------------------------------------------------
def raw_path(paths, config: ServerConfig) -> Path:
    return paths.data(RAW_STEM, "jsonl", **config.tags)


def launch_path(paths, config: ServerConfig) -> Path:
    return paths.data(LAUNCH_STEM, "jsonl", **config.tags)


def recorded(paths, config: ServerConfig) -> dict[str, dict[str, Any]]:
    """``{request_key: row}`` of a configuration's timed rows: the last "ok" row of each key,
    or the last row when none is ok (so failures stay visible). Warm-up rows are left out."""
    p = raw_path(paths, config)
    out: dict[str, dict[str, Any]] = {}
    if not p.is_file():
        return out
    for row in read_jsonl(p):
        if row.get("warmup"):
            continue
        k = row["request_key"]
        if k not in out or row.get("status") == "ok" or out[k].get("status") != "ok":
            out[k] = row
    return out


def launches(paths, config: ServerConfig) -> list[dict[str, Any]]:
    p = launch_path(paths, config)
    return read_jsonl(p) if p.is_file() else []
