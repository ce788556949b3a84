"""Helpers for the ``real_engine`` tests: the tiny checkpoint SGLang 0.5.23's real engine serves
on a CPU, the engine's interpreter, and a leftover-process check.

The checkpoint is the project's served checkpoint
(:func:`nvfp4study.checkpoint.served.write_served_checkpoint`: BF16, every layer MLA, one MTP
layer, a generated tokenizer with a chat template, eos/pad ids inside the vocabulary) at a shape
smaller than the default profile's (:data:`TINY_SHAPE`), so a launch and a few requests stay
within seconds on a loaded 2-core machine.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SGL_VENV = REPO / ".venv-sglang"
SGL_PYTHON = SGL_VENV / "bin" / "python"

#: 2 layers (+ the MTP layer), hidden 64, 8 experts in 2 groups: the rules of
#: ``nvfp4study.core.params.shape_problems`` hold (SGLang 0.5.23 builds it).
TINY_SHAPE = dict(
    vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=4, head_dim=16, layer_group_size=1,
    num_experts=8, num_experts_per_tok=2, num_shared_experts=1, n_group=2, topk_group=1,
    moe_intermediate_size=32, moe_shared_expert_intermediate_size=32, first_k_dense_replace=1,
    kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
    num_nextn_predict_layers=1, expert_swiglu_limits={1: 4.0}, share_expert_swiglu_limits={1: 5.0},
)


def require_sglang_env() -> Path:
    """The engine's interpreter; FAILS (never skips) when ``.venv-sglang`` is not built."""
    if SGL_PYTHON.is_file() and list(SGL_VENV.glob(".installed-*")):
        return SGL_PYTHON
    pytest.fail(f"{SGL_PYTHON} missing or not fully installed: build it with `make sglang-env`",
                pytrace=False)


def write_tiny_checkpoint(out: Path, *, seed: int = 0, draft: str = "random") -> Path:
    """The served checkpoint at :data:`TINY_SHAPE` in ``out`` (must not exist). ``draft``:
    ``"random"``, ``"agree"`` (every draft accepted: accept length k + 1) or ``"disagree"``."""
    from nvfp4study.checkpoint.served import write_served_checkpoint
    from nvfp4study.core.params import LingShape

    return write_served_checkpoint(out, LingShape(**TINY_SHAPE), seed=seed, draft=draft)


def no_engine_processes(marker: str) -> list[str]:
    """Processes still carrying ``marker`` in their environment (psutil), as ``pid name``."""
    import psutil

    from nvfp4study.serving.process import SERVER_MARKER_ENV

    left = []
    for p in psutil.process_iter(["pid", "name"]):
        try:
            if p.pid != os.getpid() and p.environ().get(SERVER_MARKER_ENV) == marker:
                left.append(f"{p.pid} {p.info['name']}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return left
