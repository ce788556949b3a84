"""The rules a Ling shape must keep: the layout's, NVFP4's and SGLang 0.5.23's BailingMoeV3 model's.

:class:`~nvfp4study.core.params.LingShape` checks them on construction (raising
:class:`~nvfp4study.core.errors.ShapeInvalid`); :func:`nvfp4study.checkpoint.layout.check_shape`
checks a shape built without validation.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MIN_VOCAB", "shape_problems"]

#: smallest vocabulary a generated checkpoint's tokenizer fits in (its special tokens plus a small
#: character alphabet: :mod:`nvfp4study.checkpoint.tokenizer`).
MIN_VOCAB = 64


def shape_problems(s: Any) -> list[str]:
    """Every rule ``s`` (a :class:`~nvfp4study.core.params.LingShape`, validated or not) breaks, one sentence each (empty: a shape the generator, NVFP4 and SGLang
    0.5.23's model all take). Paths are relative to ``sglang/srt/`` of the 0.5.23 wheel:

    - ``num_hidden_layers`` a multiple of ``layer_group_size`` (``models/bailing_moe_v3.py:1224``
      asserts it when the model is built);
    - ``num_nextn_predict_layers`` 0 or 1 (``models/bailing_moe_v3.py:264``: "Only 1 nextn layer"),
      and with an MTP layer at least 2 main layers (``:265`` reads the MTP layer of a one-layer
      model as layer 0, where this layout has a main layer);
    - ``0 < topk_group <= n_group`` (``models/bailing_moe_v3.py:491``), ``num_experts`` a multiple of
      ``n_group`` with at least 2 experts per group (``layers/moe/topk.py:1802`` takes the top 2 of
      each group), ``num_experts_per_tok <= topk_group x experts per group`` (``topk.py:1816``
      masks the other groups with -inf before the final top-k: more would route to masked experts);
    - ``num_shared_experts == 1``: SGLang builds one shared expert whenever
      ``moe_shared_expert_intermediate_size > 0`` (``models/bailing_moe_v3.py:431``) and sizes it
      by that key alone (``:619``), so the layout's ``[moe_shared x num_shared, H]`` matches only at 1;
    - NVFP4 groups 16 input features (compressed-tensors ``tensor_group``, group size 16):
      ``hidden_size`` and ``moe_intermediate_size`` multiples of 16;
    - ``qk_rope_head_dim`` even (RoPE rotates pairs), ``vocab_size >= MIN_VOCAB`` (the tokenizer),
      ``first_k_dense_replace <= num_hidden_layers``, clamp-list layers inside ``0..num_hidden_layers-1``.
    """
    out: list[str] = []
    if s.num_hidden_layers % s.layer_group_size:
        out.append(f"num_hidden_layers ({s.num_hidden_layers}) must be a multiple of layer_group_size "
                   f"({s.layer_group_size}) (SGLang models/bailing_moe_v3.py:1224)")
    if s.num_nextn_predict_layers > 1:
        out.append(f"num_nextn_predict_layers ({s.num_nextn_predict_layers}) must be 0 or 1 "
                   "(SGLang models/bailing_moe_v3.py:264)")
    if s.num_nextn_predict_layers and s.num_hidden_layers < 2:
        out.append("an MTP layer needs num_hidden_layers >= 2 (SGLang models/bailing_moe_v3.py:265 "
                   "reads a one-layer model's MTP layer as layer 0)")
    if s.first_k_dense_replace > s.num_hidden_layers:
        out.append(f"first_k_dense_replace ({s.first_k_dense_replace}) exceeds num_hidden_layers "
                   f"({s.num_hidden_layers})")
    if s.topk_group > s.n_group:
        out.append(f"topk_group ({s.topk_group}) exceeds n_group ({s.n_group}) "
                   "(SGLang models/bailing_moe_v3.py:491)")
    if s.num_experts % s.n_group:
        out.append(f"num_experts ({s.num_experts}) must be a multiple of n_group ({s.n_group})")
    else:
        per = s.num_experts // s.n_group
        if per < 2:
            out.append(f"num_experts / n_group ({per}) must be >= 2 (SGLang layers/moe/topk.py:1802 "
                       "takes the top 2 experts of each group)")
        if s.num_experts_per_tok > s.topk_group * per:
            out.append(f"num_experts_per_tok ({s.num_experts_per_tok}) exceeds topk_group x experts per "
                       f"group ({s.topk_group} x {per}) (SGLang layers/moe/topk.py:1816)")
    if s.num_experts_per_tok > s.num_experts:
        out.append(f"num_experts_per_tok ({s.num_experts_per_tok}) exceeds num_experts ({s.num_experts})")
    if s.num_shared_experts != 1:
        out.append(f"num_shared_experts ({s.num_shared_experts}) must be 1 (SGLang "
                   "models/bailing_moe_v3.py:431 and :619 build one shared expert of "
                   "moe_shared_expert_intermediate_size)")
    for key in ("hidden_size", "moe_intermediate_size"):
        if getattr(s, key) % 16:
            out.append(f"{key} ({getattr(s, key)}) must be a multiple of 16 (NVFP4 group size)")
    if s.qk_rope_head_dim % 2:
        out.append(f"qk_rope_head_dim ({s.qk_rope_head_dim}) must be even (RoPE rotates pairs)")
    if s.vocab_size < MIN_VOCAB:
        out.append(f"vocab_size ({s.vocab_size}) must be >= {MIN_VOCAB} (the tokenizer's special "
                   "tokens and alphabet)")
    for key in ("expert_swiglu_limits", "share_expert_swiglu_limits"):
        bad = sorted(k for k in getattr(s, key) if not 0 <= k < s.num_hidden_layers)
        if bad:
            out.append(f"{key} names layers {bad} outside 0..{s.num_hidden_layers - 1}")
    return out
