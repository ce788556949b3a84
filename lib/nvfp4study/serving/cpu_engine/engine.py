"""The CPU engine's launch environment, flags and description (for the stages and the report).

SGLang 0.5.23 runs its real engine on a CPU (tokenizer manager, scheduler, model runner,
``models/bailing_moe_v3.py``, the NEXTN draft ``models/bailing_moe_nextn.py``, the EAGLE worker,
the detokenizer) when three things hold, all set up here:

- ``SGLANG_USE_CPU_ENGINE=1`` (``srt/utils/common.py`` 221-224 ``is_cpu()``; without it the rope
  code wants vLLM) and ``--device cpu``;
- an importable ``sgl_kernel``: the engine imports it everywhere (e.g.
  ``kernels/ops/kvcache/cache_move.py`` 10) and calls its ``*_cpu`` ops on the CPU paths. Its CPU
  build is not on the package index (``sglang-kernel`` 0.4.10 is CUDA only), so
  :data:`SITE_DIR` holds a stand-in whose ops are plain torch (:func:`replaced_ops`);
- the patches of :data:`PATCHES`, applied in memory by ``site/sitecustomize.py``.

Paths are relative to ``sglang/`` of the 0.5.23 wheel (``srt/...`` and ``kernels/...``).
Only an all-MLA model runs (``layer_group_size: 1``): KDA prefill always uses Triton
(``srt/layers/attention/linear/kda_backend.py``), which has no CPU driver.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Mapping
from pathlib import Path

#: the folder put first on the server's PYTHONPATH (``sgl_kernel/``, ``sitecustomize.py``).
SITE_DIR: Path = Path(__file__).resolve().parent / "site"

#: the engine's CPU flags: (flags, why). ``engine_flags`` adds the attention backend and dtype.
#: Not needed: CUDA-graph flags (on the CPU a graph is captured only with --enable-torch-compile,
#: ``srt/model_executor/model_runner_components/cuda_graph_setup.py`` 735) and
#: ``--max-running-requests`` (the study's params set it).
FLAGS: list[tuple[list[str], str]] = [
    (["--device", "cpu"], "no GPU: SGLang's CPU device (with SGLANG_USE_CPU_ENGINE=1)"),
    (["--mamba-radix-cache-strategy", "no_buffer"],
     "the default extra_buffer asserts platform support for Mamba cache snapshots, which the "
     "CPU lacks (srt/arg_groups/mamba_hook.py 102-121)"),
    (["--disable-overlap-schedule"],
     "no_buffer asserts the overlap schedule is off (srt/arg_groups/mamba_hook.py 157-160)"),
    (["--max-mamba-cache-size", "32"],
     "the hybrid model's Mamba/KDA state pool is otherwise sized from free RAM (about 5 GB was "
     "seen reserved); 32 slots serve a few requests"),
    (["--max-total-tokens", "4096"],
     "bounds the KV pool, which is otherwise sized as mem_fraction_static of the machine's free "
     "RAM"),
    (["--decode-log-interval", "1"],
     "a `Decode batch` log line (accept len / accept rate with speculation) after every decode "
     "step, so a short run has lines to read (default 40)"),
    (["--enable-metrics"], "/metrics with the sglang:spec_accept_* gauges"),
    (["--sleep-on-idle"],
     "an idle scheduler otherwise spins a core at 100 % between requests (90 % of a core "
     "measured; srt/managers/scheduler_components/idle_sleeper.py): on 2 cores that halves "
     "what the study's own work (sandboxed runs, other tests) gets while a server is up; it "
     "waits on its sockets instead and wakes when a request arrives (the same output ids)"),
]

#: the in-memory patches ``site/sitecustomize.py`` applies (same order and targets).
PATCHES: list[dict[str, str]] = [
    {"target": "srt/multimodal/internvl_utils.py:5",
     "why": "server-args resolution imports torchvision at module level (srt/arg_groups/"
            "kv_shard_hook.py:17 -> ... -> srt/multimodal/internvl_utils.py:5: `No module named "
            "'torchvision'`), and PyPI's torchvision is built for CUDA torch (`torchvision::nms "
            "does not exist`): an inert stand-in, switched on after transformers cached that "
            "torchvision is absent"},
    {"target": "srt/models/bailing_moe_nextn.py:289",
     "why": "set_embed_and_head() calls torch.cuda.synchronize() unconditionally (fails on a "
            "CPU-only torch when the EAGLE worker shares embedding and head with the draft): a "
            "no-op during that call"},
    {"target": "srt/models/deepseek_common/attention_backend_handler.py:46",
     "why": "torch_native has no MLA handler and falls back to the Triton one, which sends a "
            "prefill to the MHA branch; torch-native attention then reads the compressed MLA "
            "cache as full K/V (`Expected size ... [4, 32] but got: [4, 48]`, kv_lora_rank 32 + "
            "rope 16): torch_native is registered to the absorbed-MLA branch"},
    {"target": "srt/arg_groups/overrides.py:1305",
     "why": "intel_amx falls back to torch_native unless get_platform().has_amx, and "
            "torch_native cannot run EAGLE/NEXTN (srt/speculative/draft_utils.py 64): AMX is "
            "claimed for this check only (intel_amx's attention calls the stand-in torch ops)"},
    {"target": "srt/entrypoints/engine.py:1995",
     "why": "speed, not a failure: _set_envs_and_config() forces the spawn start method (for "
            "CUDA), so the scheduler and detokenizer import SGLang again; a CPU-only server has no "
            "CUDA context, so fork is set after it (ready in about 13 s instead of 20 s, the same "
            "output ids)"},
]


def replaced_ops() -> list[str]:
    """Names of the ``sgl_kernel`` ops the stand-in provides in plain torch (``__all__`` of
    ``site/sgl_kernel/cpu_ops.py``, read without importing torch), sorted."""
    tree = ast.parse((SITE_DIR / "sgl_kernel" / "cpu_ops.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            return sorted(ast.literal_eval(node.value))
    raise RuntimeError("cpu_ops.py has no __all__")


def engine_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The extra environment of the server subprocess: ``base`` (e.g. ``server.env``; default
    empty) plus

    - ``SGLANG_USE_CPU_ENGINE=1``: SGLang's ``is_cpu()`` (``srt/utils/common.py`` 221-224);
    - ``TORCHDYNAMO_DISABLE=1``: without it dynamo/inductor compiles at start (ready after 84 s
      instead of 58 s for the test checkpoint on the loaded 2-core machine);
    - ``OMP_NUM_THREADS=1``: one intra-op thread per server process. The study loads up to
      ``server.parallel_loads`` servers at once (and the tests run beside them); with torch's
      default of one OpenMP thread per core their threads spin-wait against each other: stage
      06 (five launches loading together) took 77.7 s and 192 s of CPU for stages 04-07 with the
      default, 49.5 s and 120 s with one thread, the same output ids. At this model size a
      matmul has nothing to share between threads (decode tok/s rose from 36 to 49);
    - ``PYTHONPATH``: :data:`SITE_DIR` first, then ``base``'s own PYTHONPATH if any.

    Returns a new dict of strings; pass it as the extra env of the launch (it does not include
    ``os.environ``). ``base``'s other keys are kept as given.
    """
    env = {str(k): str(v) for k, v in (base or {}).items()}
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env.setdefault("TORCHDYNAMO_DISABLE", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(SITE_DIR)]
    env["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR), *rest])
    return env


def engine_flags(spec_depth: int | None, *, dtype: str = "float32") -> list[str]:
    """The CPU flags to append to an ``sglang serve`` command (see :data:`FLAGS` for each one's
    reason), plus the attention backend and the dtype.

    Args:
        spec_depth: NEXTN depth k, or None without speculation. It picks the attention backend
            only: ``torch_native`` without speculation (SGLang's own torch attention, no stand-in
            op called), ``intel_amx`` with it (torch_native refuses EAGLE,
            ``srt/speculative/draft_utils.py`` 64; intel_amx calls ``decode_attention_cpu`` /
            ``extend_attention_cpu``, which the stand-in provides). The speculative flags
            themselves (``--speculative-algorithm NEXTN --speculative-num-steps k ...``) are the
            caller's.
        dtype: ``--dtype``; float32 by default: on a CPU without AMX bf16 matmuls ran about 2x
            slower than fp32.

    Raises:
        ValueError: spec_depth < 1.
    """
    if spec_depth is not None and spec_depth < 1:
        raise ValueError(f"spec_depth must be >= 1 or None, got {spec_depth}")
    flags = [f for group, _ in FLAGS for f in group]
    flags += ["--attention-backend", "torch_native" if spec_depth is None else "intel_amx"]
    flags += ["--dtype", dtype]
    return flags


def describe() -> dict:
    """What the CPU engine is, for the ledger and the report: ``engine``, ``replaced_ops``
    (names), ``patches`` (``target`` file:line, ``why``), ``flags`` (``flag``, ``why``),
    ``called_ops`` (per configuration, the stand-in ops the engine was seen calling), ``env``
    (the variables :func:`engine_env` sets), ``limits`` (what it cannot serve)."""
    return {
        "engine": "SGLang 0.5.23 engine on CPU",
        "replaced_ops": replaced_ops(),
        "patches": [dict(p) for p in PATCHES],
        "flags": [{"flag": " ".join(group), "why": why} for group, why in FLAGS]
        + [{"flag": "--attention-backend torch_native | intel_amx",
            "why": "torch_native without speculation; intel_amx (stand-in torch ops) with NEXTN"}],
        "called_ops": {  # what the engine was seen calling (tests/test_cpu_engine.py)
            "no speculation (torch_native)": [],
            "NEXTN top-k 1 (intel_amx)": [o for o in replaced_ops()
                                          if o != "fill_accept_out_cache_loc_cpu"],
            "NEXTN tree, top-k 2 (intel_amx)": replaced_ops(),
        },
        "env": {"SGLANG_USE_CPU_ENGINE": "1", "TORCHDYNAMO_DISABLE": "1",
                "OMP_NUM_THREADS": "1 (one intra-op thread per server: servers loading side by "
                                   "side otherwise spin their OpenMP threads against each other)",
                "PYTHONPATH": "the stand-in site folder first",
                "SGLANG_DISABLED_MODEL_ARCHS": "every srt/models module but bailing_moe_v3 and "
                                               "bailing_moe_nextn (set by site/sitecustomize.py; "
                                               "speed only: the registry scan imports no others)"},
        "limits": [
            "all-MLA models only (layer_group_size 1): KDA prefill is Triton-only",
            "EAGLE top-k 1 tested; the stand-in ops are unoptimised torch loops",
            "--enable-deterministic-inference: for absorbed-MLA models SGLang allows only the "
            "ascend/fa3/fa4/triton backends (srt/arg_groups/attention_hook.py 639-648); not "
            "answered",
        ],
    }


def summary() -> str:
    """One line: ``"SGLang 0.5.23 engine on CPU; 10 kernel ops replaced by torch code (a, b, ...)"``
    plus the patch count."""
    ops = replaced_ops()
    return (f"SGLang 0.5.23 engine on CPU; {len(ops)} kernel ops replaced by torch code "
            f"({', '.join(ops)}); {len(PATCHES)} in-memory patches")
