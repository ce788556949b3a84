"""Byte-compile, once at set-up, the part of the SGLang venv that a CPU-engine launch imports.

``make sglang-env`` installs with ``pip install --no-compile`` (why: :mod:`nvfp4study.core.bytecode`):
SGLang 0.5.23's closure is about 20,700 files, of which a launch of the served stand-in imports about
5,800. Without this step the first launch compiles them, and five launches loading side by side
(stage 06) compile them five times over. Run with the SGLang venv's interpreter::

    PYTHONPATH=lib .venv-sglang/bin/python -m nvfp4study.serving.cpu_engine.warm
"""

from __future__ import annotations

import os
import sys

from ...core.bytecode import compile_by_import
from .engine import engine_env

#: What ``sglang serve`` imports on the CPU engine for the served stand-in (NEXTN included), by its
#: entry modules: the CLI and HTTP server, the scheduler and detokenizer, the model runner, the two
#: model files, the speculative worker (0.5.23 has ``eagle_worker_v2``, no ``eagle_worker``), the
#: attention registry and the backends of :func:`~.engine.engine_flags`, and uvicorn's protocols.
#: After these, a launch compiled 166 more small modules (counted: ``.pyc`` files newer than the step).
SERVED_MODULES = (
    "sglang.cli.main",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.models.bailing_moe_v3",
    "sglang.srt.models.bailing_moe_nextn",
    "sglang.srt.speculative.eagle_worker_v2",
    "sglang.srt.layers.attention.attention_registry",
    "sglang.srt.layers.attention.torch_native_backend",
    "sglang.srt.layers.attention.intel_amx_backend",
    "uvicorn.protocols.http.h11_impl",
    "uvicorn.lifespan.on",
    "uvicorn.loops.uvloop",
)


def main() -> int:
    """:data:`SERVED_MODULES` under the engine's environment (the stand-in ``sgl_kernel`` first on
    the path); see :func:`~nvfp4study.core.bytecode.compile_by_import` for the result."""
    return compile_by_import(SERVED_MODULES, "cpu engine",
                             engine_env({"PYTHONPATH": os.environ.get("PYTHONPATH", "")}))


if __name__ == "__main__":
    sys.exit(main())
