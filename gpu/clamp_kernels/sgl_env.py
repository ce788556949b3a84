"""Run SGLang 0.5.23's Triton MoE (and read its CUTLASS helpers) outside an SGLang server.

SGLang's ``sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe`` is imported from the released
wheel's Python files. What a server would provide is answered here, and each answer is recorded:

- modules the GPU machine lacks and the MoE code never calls (``orjson``, ``pybase64``,
  ``starlette``, ``zmq``, ``IPython``, and any other top-level module an import finds missing) are
  import-only stand-ins: their attributes are placeholders;
- ``sgl_kernel`` (SGLang's compiled kernels, not built here) is a stand-in whose
  ``moe_align_block_size`` is :func:`moe_align_block_size_torch` and whose ``moe_sum_reduce`` is a
  torch sum; any other ``sgl_kernel`` function raises when called;
- the runtime-context lookups of the Triton path (``get_exec``, ``get_parallel``,
  ``use_symmetric_memory``, ``is_allocation_symmetric``; ``triton_utils/fused_moe.py`` 629-636,
  ``fused_moe_triton_config.py`` 72 and 190) are answered for one GPU with no all-reduce fusion and
  no deterministic mode.
SGLang's own Triton GEMM kernels and its clamp (``_swiglu_silu_clamp_mul``, fused_moe.py 411-416)
run unchanged.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from types import SimpleNamespace

IMPORT_ONLY = ["orjson", "pybase64", "starlette", "zmq", "IPython"]
RECORD: dict = {"import_only_standins": [], "sgl_kernel_calls": [], "patched": []}


class _Meta(type):
    def __new__(mcls, name, bases, ns, **kw):
        return super().__new__(mcls, name, bases, ns)

    def __init__(cls, name, bases, ns, **kw):
        super().__init__(name, bases, ns)

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return cls

    def __call__(cls, *a, **k):
        if len(a) == 1 and callable(a[0]) and not k:
            return a[0]
        return super().__call__()

    def __or__(cls, o):
        return cls

    def __ror__(cls, o):
        return cls

    def __getitem__(cls, k):
        return cls

    def __iter__(cls):
        return iter(())


class Placeholder(metaclass=_Meta):
    """An attribute of an import-only stand-in: a base class, decorator or value that does nothing."""

    def __init_subclass__(cls, **kw):
        pass

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder

    def __call__(self, *a, **k):
        return Placeholder


class _StandInModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _StandInModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


_FINDER = _Finder()


def moe_align_block_size_torch(topk_ids, num_buckets, block_size, sorted_ids, expert_ids,
                               num_tokens_post_pad, cumsum_buffer, pad_sorted_token_ids=False,
                               ignore_invalid_expert=False):
    """Torch version of ``sgl_kernel.moe_align_block_size`` with SGLang 0.5.23's "+1" convention.

    SGLang passes ``num_experts + 1`` buckets (``triton_utils/moe_align_block_size.py`` 189-199):
    expert id e goes to bucket e + 1, id -1 (a filtered expert) to bucket 0. Each bucket's token
    slots (flattened topk index, stable order) are padded to a multiple of ``block_size``;
    ``sorted_ids`` is filled with ``topk_ids.numel()`` elsewhere, ``expert_ids[b]`` is the block's
    bucket - 1 and ``num_tokens_post_pad[0]`` the padded total. All outputs are written in place.
    """
    import torch

    RECORD["sgl_kernel_calls"].append("moe_align_block_size (torch stand-in)")
    flat = topk_ids.flatten().to(torch.int64)
    numel = flat.numel()
    bucket = flat + 1
    counts = torch.bincount(bucket, minlength=num_buckets)[:num_buckets]
    padded = (counts + block_size - 1) // block_size * block_size
    offsets = torch.zeros(num_buckets + 1, dtype=torch.int64, device=flat.device)
    offsets[1:] = torch.cumsum(padded, 0)
    sorted_ids.fill_(numel)
    expert_ids.fill_(-1)
    order = torch.argsort(bucket, stable=True)
    sb = bucket[order]
    first = torch.zeros(num_buckets + 1, dtype=torch.int64, device=flat.device)
    first[1:] = torch.cumsum(counts, 0)
    rank = torch.arange(numel, device=flat.device) - first[sb]
    sorted_ids[(offsets[sb] + rank)] = order.to(sorted_ids.dtype)
    for b in range(num_buckets):
        lo, hi = int(offsets[b]) // block_size, int(offsets[b + 1]) // block_size
        if hi > lo:
            expert_ids[lo:hi] = b - 1
    num_tokens_post_pad[0] = int(offsets[-1])
    cumsum_buffer[: num_buckets + 1] = offsets.to(cumsum_buffer.dtype)


def _moe_sum_reduce_torch(x, out, routed_scaling_factor):
    RECORD["sgl_kernel_calls"].append("moe_sum_reduce (torch stand-in)")
    out.copy_(x.float().sum(dim=1).mul(routed_scaling_factor).to(out.dtype))


def _sgl_kernel_module() -> types.ModuleType:
    m = types.ModuleType("sgl_kernel")
    m.__path__ = []
    m.moe_align_block_size = moe_align_block_size_torch
    m.moe_sum_reduce = _moe_sum_reduce_torch

    def _missing(name):
        def fn(*a, **k):
            raise NotImplementedError(f"sgl_kernel.{name} is not available in the clamp check")
        return fn

    m.__getattr__ = lambda name: (_missing(name) if not name.startswith("__")
                                  else (_ for _ in ()).throw(AttributeError(name)))
    return m


def install(sglang_root: str) -> None:
    """Put the wheel's Python tree first on sys.path and install the stand-ins (idempotent)."""
    if sglang_root not in sys.path:
        sys.path.insert(0, sglang_root)
    for name in IMPORT_ONLY:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found and name not in _FINDER.names:
            _FINDER.names.add(name)
            RECORD["import_only_standins"].append(name)
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
    if "sgl_kernel" not in sys.modules:
        sys.modules["sgl_kernel"] = _sgl_kernel_module()


def import_module(name: str, *, max_standins: int = 12):
    """Import ``name``; a top-level module found missing becomes an import-only stand-in (recorded)."""
    for _ in range(max_standins + 1):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as e:
            top = (e.name or "").split(".")[0]
            if not top or top == "sglang" or top in _FINDER.names:
                raise
            _FINDER.names.add(top)
            RECORD["import_only_standins"].append(top)
            for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
                del sys.modules[k]
    raise ImportError(f"{name}: more than {max_standins} missing modules")


def one_gpu_context(*modules) -> None:
    """Answer the runtime-context lookups in ``modules`` for one GPU (recorded)."""
    ctx = SimpleNamespace(
        moe=SimpleNamespace(enable_fused_moe_sum_all_reduce=False),
        deterministic=SimpleNamespace(enable_deterministic_inference=False),
    )
    par = SimpleNamespace(tp_group=None)
    for m in modules:
        for attr, val in (("get_exec", lambda: ctx), ("get_parallel", lambda: par),
                          ("use_symmetric_memory", lambda *a, **k: contextlib.nullcontext()),
                          ("is_allocation_symmetric", lambda: False)):
            if hasattr(m, attr):
                setattr(m, attr, val)
                RECORD["patched"].append(f"{m.__name__}.{attr}")
