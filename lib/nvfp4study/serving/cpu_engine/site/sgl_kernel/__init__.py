"""A stand-in ``sgl_kernel`` for SGLang 0.5.23's CPU engine (sgl-kernel's CPU build is not on
the package index; the CUDA wheel ``sglang-kernel`` needs libcuda and has no ``*_cpu`` op).

- Every name SGLang imports from ``sgl_kernel`` or a submodule (``sgl_kernel.kvcacheio``,
  ``.flash_attn``, ``.scalar_type``, ...) imports: modules at import time reference dozens of
  GPU kernels (e.g. ``kernels/ops/kvcache/cache_move.py`` 10). Names without a stand-in are
  :class:`Missing` placeholders that raise ``NotImplementedError`` naming the kernel when
  called, so a path this engine does not support fails loudly instead of computing garbage.
- ``torch.ops.sgl_kernel`` is a namespace holding the torch ops of :mod:`.cpu_ops`; other names
  in it are placeholders too, except :data:`ABSENT`: names SGLang probes with ``hasattr`` (or
  ``register_fake_if_exists``) to pick a faster path, which must stay absent so it keeps the
  plain path (e.g. ``convert_weight_packed`` makes ``srt/utils/common.py`` 355-372 claim AMX
  weight packing).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
import types

import torch

from . import cpu_ops

#: names left absent from both ``sgl_kernel`` and ``torch.ops.sgl_kernel``: SGLang 0.5.23 probes
#: them (file:line) and takes another path when they are missing.
ABSENT = frozenset({
    "convert_weight_packed",          # srt/utils/common.py 358: AMX weight packing (cpu_has_amx_support)
    "fused_qk_norm_cpu",              # srt/models/utils.py 456
    "fused_qk_norm_rope_cpu",         # srt/models/qwen3_moe.py 98
    "get_device_accessible_ptr",      # srt/mem_cache/pool_host/common.py 400-404
    "shm_group_initialize",           # multimodal_gen/runtime/distributed/group_coordinator.py 232
    "gdn_attention",                  # srt/hardware_backend/xpu/attention/xpu_gdn_backend.py 31
    # register_fake_if_exists("sgl_kernel::X") registers a fake only when X exists
    "sgl_per_token_group_quant_8bit_v2", "fp8_scaled_mm", "int8_scaled_mm", "scaled_fp4_quant",
    "awq_marlin_repack", "gptq_marlin_repack", "gptq_gemm", "fused_scale_residual_norm_scale_shift",
})

#: names of the ops this package really provides (plain torch; see :mod:`.cpu_ops`).
REPLACED_OPS = tuple(cpu_ops.__all__)


class Missing:
    """A kernel with no CPU stand-in: importable, attribute chains allowed (``op.default``,
    ``scalar_types.uint4b8``), calling it raises ``NotImplementedError``."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{self._name}: no CPU stand-in (nvfp4study cpu_engine provides only "
            f"{', '.join(REPLACED_OPS)})")

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return Missing(f"{self._name}.{name}")

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in: missing {self._name}>"

    def __mro_entries__(self, bases):  # `class X(sgl_kernel.Something)` still defines X
        return (object,)


class _CatchAllModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__") or name in ABSENT:
            raise AttributeError(name)
        value = Missing(f"{self.__name__.partition('.')[2]}.{name}")
        setattr(self, name, value)
        return value


class _OpsNamespace:
    """Stands for ``torch.ops.sgl_kernel``: the torch ops, placeholders, ABSENT names missing."""

    def __init__(self, ops: dict):
        self.__dict__.update(ops)
        self.name = "sgl_kernel"

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ABSENT:
            raise AttributeError(name)
        return Missing(name)


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import sgl_kernel.<anything>`` gives a catch-all module (sgl_kernel.kvcacheio,
    .flash_attn, .scalar_type, .speculative, .mamba, .quantization, .elementwise, ...)."""

    def find_spec(self, name, path=None, target=None):
        if name.startswith(__name__ + ".") and name.count(".") >= 1:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _CatchAllModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


#: ``NVFP4STUDY_CPU_ENGINE_TRACE=<file>``: each process appends ``<op name>`` to the file the
#: first time it calls a stand-in op (tests read it to see which ops the engine really called).
#: A folder instead: the file ``ops-<process group>.txt`` in it, one per server (whose group id is
#: its first process's pid), so servers forked by one fork server share one environment.
TRACE_ENV = "NVFP4STUDY_CPU_ENGINE_TRACE"


def _trace_file(path: str) -> str:
    return os.path.join(path, f"ops-{os.getpgid(0)}.txt") if os.path.isdir(path) else path


def _traced(name: str, fn):
    path = os.environ.get(TRACE_ENV)
    if not path:
        return fn
    seen: set[str] = set()

    @functools.wraps(fn)
    def op(*args, **kwargs):
        if name not in seen:
            seen.add(name)
            with open(_trace_file(path), "a") as f:
                f.write(name + "\n")
        return fn(*args, **kwargs)

    return op


OPS = {name: _traced(name, fn) for name, fn in cpu_ops.OPS.items()}


def _install() -> None:
    if not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
        sys.meta_path.append(_SubmoduleFinder())  # after the path finder: real files win
    torch.ops.sgl_kernel = _OpsNamespace(OPS)


_install()
globals().update(OPS)


def __getattr__(name: str):
    if name.startswith("__") or name in ABSENT:
        raise AttributeError(f"module 'sgl_kernel' has no attribute {name!r}")
    value = Missing(name)
    globals()[name] = value
    return value
