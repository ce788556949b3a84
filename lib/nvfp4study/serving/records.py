"""What the serving stages (04, 06, 07) ask each server and where the answers are recorded:
the prompts, one :class:`RequestSpec` per request, and the JSONL files of requests and launches
under ``data/`` of the run (their fields: :mod:`nvfp4study.serving.measure`). Appends are
flushed and fsynced row by row (:mod:`nvfp4study.core.jsonl`), so a killed run keeps what it had
received (resume)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True)
class RequestSpec:
    """One request of a study: prompt, repeat index, token budget, thinking switch."""

    prompt_id: str
    repeat: int
    max_tokens: int
    thinking: bool = False

    @property
    def key(self) -> str:
        return f"{self.prompt_id}/r{self.repeat}/max{self.max_tokens}/think={'on' if self.thinking else 'off'}"


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
