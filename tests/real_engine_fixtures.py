"""Helpers for ``tests/test_real_engine.py``: the study's own serving path (params ->
``serving.server.serving`` -> ``ServerProcess``) on SGLang 0.5.23's real engine on this CPU.

The default profile's params with the test's port and a run folder under ``tmp_path``; the
served model is the run's stand-in (``serving.server.standin_path``), so nothing here builds a
command or an environment of its own.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import psutil

from nvfp4study.core.params import DEFAULT_PARAMS, load_params
from nvfp4study.core.paths import RunPaths
from nvfp4study.core.stage import Stage


def engine_stage(run: Path, port: int, *overrides: str, name: str = "04_launch_server") -> Stage:
    """A stage on the default profile (``server.engine: cpu``) with ``server.port`` = ``port``,
    a generous startup timeout (the 2-core machine is shared) and ``overrides``, no overlay."""
    params = load_params(DEFAULT_PARAMS, [f"server.port={port}", "server.startup_timeout_s=900",
                                          "server.request_timeout_s=600", *overrides], overlay=False)
    return Stage(name=name, params=params, paths=RunPaths(run))


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` that are still running (zombies count as gone)."""
    out = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
    return out


def log_accept_lines(log: Path, after_line: int = 0) -> list[tuple[float, float]]:
    """``(accept len, accept rate)`` of the ``Decode batch`` lines of a server log from line
    ``after_line`` on, parsed by the study's decode-log reader."""
    from nvfp4study.serving import decode_log

    text = "\n".join(log.read_text(errors="replace").splitlines()[after_line:])
    lines, _ = decode_log.parse_log(text)
    return [(r["accept_len"], r["accept_rate"]) for r in lines if r.get("accept_len") is not None]


def log_length(log: Path) -> int:
    """Number of lines in a log now (to read only what a request adds)."""
    return len(log.read_text(errors="replace").splitlines())
