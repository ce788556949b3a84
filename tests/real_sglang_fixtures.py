"""Helpers for the ``real_sglang`` tests: SGLang 0.5.23's real HTTP/OpenAI layer served over a
stub engine (``tests/real_sglang/serve_stub.py``) by the pinned ``.venv-sglang``.

:func:`make_interpreter` writes an executable the study's ``server.python`` can name: SGLang's
own interpreter for the version and GPU probes, and for ``-c <serve code> serve ...`` the stub
server with the same flags (parsed by SGLang's parser). The study launches, health-waits and
stops it with its own code (``serving.server.serving``); ``no_leftover`` checks no process of
it outlives a test.

The environment is built by ``make sglang-env`` (``make test`` depends on it). When it is
missing the tests FAIL with that command; ``NVFP4STUDY_SKIP_REAL_SGLANG=1`` opts out (skip) for
a quick local run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from serving_fixtures import live_params

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent / "real_sglang"
SGL_PYTHON = REPO / ".venv-sglang" / "bin" / "python"
OUTPUTS = HERE / "outputs.json"
SKIP_ENV = "NVFP4STUDY_SKIP_REAL_SGLANG"


def require_env() -> Path:
    """The environment's interpreter; fails (or skips, with ``NVFP4STUDY_SKIP_REAL_SGLANG=1``)
    when it has not been built."""
    if SGL_PYTHON.is_file():
        return SGL_PYTHON
    msg = f"{SGL_PYTHON} missing: build it with `make sglang-env` (about 2.6 GB, pinned)"
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"{msg}; skipped because {SKIP_ENV}=1")
    pytest.fail(f"{msg}, or set {SKIP_ENV}=1 to skip the real_sglang tests", pytrace=False)


def make_interpreter(folder: Path, outputs: Path = OUTPUTS, step_s: float = 0.002) -> Path:
    """Write ``folder/python``: SGLang's interpreter, except that ``-c <code with
    sglang.cli.main> serve ...`` runs the stub server over ``outputs``."""
    py = require_env()
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "python"
    exe.write_text(
        "#!/bin/sh\n"
        'case "$2" in *sglang.cli.main*)\n'
        f'  shift 2; exec {py} {HERE / "serve_stub.py"} --data {outputs} --step-s {step_s} "$@";;\n'
        "esac\n"
        f'exec {py} "$@"\n')
    exe.chmod(0o755)
    return exe


def real_params(tmp_path: Path, *overrides: str, outputs: Path = OUTPUTS):
    """Params for a live run against the real layer; returns ``(params, params_file, run_dir)``.
    Startup allows 180 s: importing SGLang's HTTP layer takes about 20 s on an idle 2-core box."""
    exe = make_interpreter(tmp_path / "sgl-env", outputs)
    return live_params(tmp_path, exe, ["server.health_poll_s=0.2", "server.shutdown_grace_s=10",
                                       "server.startup_timeout_s=180", "server.request_timeout_s=30",
                                       "server.port=0"],  # a free port per launch: collect loads two at once
                       overrides)
