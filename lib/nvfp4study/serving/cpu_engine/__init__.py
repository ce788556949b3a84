"""SGLang 0.5.23's real engine on a CPU: the launch environment, flags and what was replaced.

``site/`` goes first on the server process's ``PYTHONPATH``: a stand-in ``sgl_kernel`` (plain
torch ops, ``site/sgl_kernel/cpu_ops.py``) and ``sitecustomize.py`` (a torchvision stand-in and
in-memory patches of SGLang, each naming the file:line it works around). Nothing on disk changes.
"""

from __future__ import annotations

from .engine import (
    FLAGS,
    PATCHES,
    SITE_DIR,
    describe,
    engine_env,
    engine_flags,
    replaced_ops,
    summary,
)

__all__ = ["engine", "warm", "FLAGS", "PATCHES", "SITE_DIR", "describe", "engine_env", "engine_flags",
           "replaced_ops", "summary"]
