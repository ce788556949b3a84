"""Tiny Ling shapes and cached checkpoints for the issue-3 tests (test_ling_layout, test_quantize,
test_roundtrip). Sizes are the smallest that keep every rule of the layout: MLA on layer 2 and on
the MTP layer 3, a dense layer 0, MoE on 1-2, NVFP4-compatible widths (multiples of 16)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from nvfp4study.core.params import LingShape

TINY = LingShape(
    vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=3,
    num_attention_heads=2, num_key_value_heads=2, head_dim=16, layer_group_size=3,
    num_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
    moe_intermediate_size=32, moe_shared_expert_intermediate_size=32, first_k_dense_replace=1,
    kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    expert_swiglu_limits={2: 4.0}, share_expert_swiglu_limits={1: 5.0, 2: 7.0},
)


def tree_digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (relative name -> hex), plus mtimes folded in."""
    out = {}
    for p in sorted(Path(folder).rglob("*")):
        if p.is_file():
            h = hashlib.sha256(p.read_bytes()).hexdigest()
            out[str(p.relative_to(folder))] = f"{h}:{p.stat().st_mtime_ns}"
    return out
