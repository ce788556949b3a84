"""Probe inputs that make each MoE output element equal ONE SwiGLU value, and the reference forms.

A probe MoE has hidden size H = 2 * I. Token t carries gate values in columns 0..I-1 and up values
in columns I..2I-1. Every expert's fc1 is one-hot: gate row k reads column k, up row k reads column
I + k; fc2 is one-hot too: output column k (< I) reads activation k, columns I..2I-1 read nothing.
With BF16 operands and FP32 accumulation each GEMM product is x * 1.0 plus exact zeros, so the
output element y[t, k] is the kernel's own SwiGLU value act(g[t, k], u[t, k]) rounded to BF16, and
nothing else. Each token goes to two experts with router weights 0.5 and 0.5 (0.5 * y + 0.5 * y is
exact in BF16), so the routing and the top-k sum add no rounding.

Reference forms (g = gate, u = up, L = limit, a = alpha, b = beta):
  pre-SiLU (GPT-OSS, FlashInfer ``SwigluBiasAdaptor``, flashinfer-python 0.7.2
    ``csrc/fused_moe/cutlass_backend/cutlass_fused_moe_kernels.cuh`` 2250-2262):
    min(g, L) * sigmoid(a * min(g, L)) * (clamp(u, -L, L) + b)
  post-SiLU (Ling-3.0-flash; FlashInfer ``SwigluStepAdaptor``, same file 2264-2279; SGLang 0.5.23
    ``layers/moe/moe_runner/triton_utils/fused_moe.py`` 411-416):
    min(silu(g), L) * clamp(u, -L, L)
  unclamped: g * sigmoid(a * g) * (u + b)
Each form is evaluated two ways: in float64 and rounded once to BF16 (``once``: a kernel that
keeps FP32 until it stores), and op by op in BF16 as eager PyTorch would (``bf16ops``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

FORMS = ("pre_silu", "post_silu", "unclamped")
ROUNDINGS = ("once", "bf16ops")


@dataclass(frozen=True)
class Probe:
    """One probe MoE problem.

    Attributes:
        x: [T, 2I] bf16 tokens (gate values then up values).
        gate, up: [T, I] bf16, the values the activation sees.
        topk_ids: [T, 2] int32 expert ids; topk_weights: [T, 2] float32 (0.5, 0.5).
        num_experts, inter: E and I.
        limit_for_gate: the limit the gate values were spread around (float).
        seed: the torch.Generator seed the values came from.
    """

    x: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor
    num_experts: int
    inter: int
    limit_for_gate: float
    seed: int


def _bf16_uniform(gen: torch.Generator, n: int, lo: float, hi: float) -> torch.Tensor:
    return (torch.rand(n, generator=gen, dtype=torch.float64) * (hi - lo) + lo).to(torch.bfloat16)


def make_probe(limit: float, *, tokens: int = 256, inter: int = 256, num_experts: int = 4,
               seed: int = 0) -> Probe:
    """Build the probe inputs for one limit (CPU tensors).

    Gate values: 60 % above the limit (a quarter of those within 1.0 of it, where silu(g) < L can
    still hold), 40 % in [-2L, L]. Up values: uniform in [-1.25L, 1.25L] (so the up clamp acts too).

    Args:
        limit: the clamp limit L the gate values are spread around (> 0).
        tokens, inter, num_experts: T, I, E; I must be a multiple of 128 (TMA alignment).
        seed: seed of the torch.Generator.
    Raises:
        ValueError: a non-positive limit or an I that is not a multiple of 128.
    """
    if not limit > 0:
        raise ValueError(f"limit must be > 0, got {limit}")
    if inter % 128:
        raise ValueError(f"inter must be a multiple of 128, got {inter}")
    gen = torch.Generator().manual_seed(seed)
    n = tokens * inter
    n_hi = int(n * 0.6)
    n_near = n_hi // 4
    g = torch.cat([
        _bf16_uniform(gen, n_near, limit, limit + 1.0),
        _bf16_uniform(gen, n_hi - n_near, limit + 1.0, 3.0 * limit),
        _bf16_uniform(gen, n - n_hi, -2.0 * limit, limit),
    ])
    g = g[torch.randperm(n, generator=gen)].reshape(tokens, inter)
    u = _bf16_uniform(gen, n, -1.25 * limit, 1.25 * limit).reshape(tokens, inter)
    x = torch.cat([g, u], dim=1).contiguous()
    t = torch.arange(tokens)
    topk_ids = torch.stack([t % num_experts, (t + 1) % num_experts], dim=1).to(torch.int32)
    topk_weights = torch.full((tokens, 2), 0.5, dtype=torch.float32)
    return Probe(x, g, u, topk_ids, topk_weights, num_experts, inter, float(limit), seed)


def probe_weights(probe: Probe, *, gate_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One-hot expert weights (bf16, CPU): fc1 [E, 2I, 2I], fc2 [E, 2I, I].

    ``gate_first`` True puts the gate rows first in fc1 (SGLang's Triton layout, ``x.chunk(2)``
    -> gate, up at ``triton_utils/fused_moe.py`` 412); False puts the up rows first (the
    ``[up; gate]`` order FlashInfer's CUTLASS MoE reads).
    """
    i = probe.inter
    eye = torch.eye(i, dtype=torch.bfloat16)
    zero = torch.zeros(i, i, dtype=torch.bfloat16)
    gate_rows = torch.cat([eye, zero], dim=1)  # [I, 2I]: reads columns 0..I-1
    up_rows = torch.cat([zero, eye], dim=1)  # reads columns I..2I-1
    fc1 = torch.cat([gate_rows, up_rows] if gate_first else [up_rows, gate_rows], dim=0)
    fc2 = torch.cat([eye, zero], dim=0)  # [2I, I]: output k < I reads activation k
    e = probe.num_experts
    return (fc1.unsqueeze(0).repeat(e, 1, 1).contiguous(),
            fc2.unsqueeze(0).repeat(e, 1, 1).contiguous())


def reference(form: str, gate: torch.Tensor, up: torch.Tensor, limit: float | None, *,
              alpha: float = 1.0, beta: float = 0.0, rounding: str = "once") -> torch.Tensor:
    """One SwiGLU form on bf16 ``gate``/``up`` [T, I]; returns bf16 [T, I].

    ``limit`` None means no clamp (every form is then the unclamped one). Formulas in the module
    docstring. Raises ValueError for an unknown form or rounding.
    """
    if form not in FORMS or rounding not in ROUNDINGS:
        raise ValueError(f"unknown form {form!r} or rounding {rounding!r}")
    lim = math.inf if limit is None else float(limit)
    if rounding == "once":
        g, u = gate.double(), up.double()
        if form == "pre_silu":
            gc = g.clamp(max=lim)
            out = gc * torch.sigmoid(alpha * gc) * (u.clamp(-lim, lim) + beta)
        elif form == "post_silu":
            out = (g * torch.sigmoid(g)).clamp(max=lim) * u.clamp(-lim, lim)
        else:
            out = g * torch.sigmoid(alpha * g) * (u + beta)
        return out.to(torch.bfloat16)
    g, u = gate.to(torch.bfloat16), up.to(torch.bfloat16)
    if form == "pre_silu":
        gc = g.clamp(max=lim)
        return gc * torch.sigmoid(gc * alpha) * (u.clamp(-lim, lim) + beta)
    if form == "post_silu":
        return torch.nn.functional.silu(g).clamp(max=lim) * u.clamp(-lim, lim)
    return g * torch.sigmoid(g * alpha) * (u + beta)


def compare(out: torch.Tensor, probe: Probe, limit: float | None, *, alpha: float = 1.0,
            beta: float = 0.0) -> dict:
    """Compare a kernel's output [T, 2I] with every form and rounding.

    ``limit`` is the limit the forms use (for a run with no limit given, the caller passes the
    one the kernel is expected to use or None). Returns a JSON-ready dict: ``pad_max_abs`` (largest
    |y| in the columns that must be 0), ``n``, ``n_gate_above`` (elements with g > L), and per
    ``form/rounding``: ``max_abs``, ``max_rel`` (|y - ref| / max(|ref|, 1e-3)), ``share_exact_all``,
    ``share_exact_gate_above`` (bit-for-bit matches among g > L), ``n_separating`` (g > L elements
    where this form's BF16 value differs from every other form's, same rounding) and
    ``share_exact_separating``.
    """
    out = out.detach().to("cpu")
    i = probe.inter
    act = out[:, :i]
    pad = out[:, i:].float().abs().max().item() if out.shape[1] > i else 0.0
    lim = math.inf if limit is None else float(limit)
    above = probe.gate.float() > lim
    res: dict = {"pad_max_abs": pad, "n": act.numel(), "n_gate_above": int(above.sum())}
    for rounding in ROUNDINGS:
        refs = {f: reference(f, probe.gate, probe.up, limit, alpha=alpha, beta=beta,
                             rounding=rounding) for f in FORMS}
        for f in FORMS:
            ref = refs[f]
            d = (act.double() - ref.double()).abs()
            rel = d / ref.double().abs().clamp(min=1e-3)
            exact = act.view(torch.int16) == ref.view(torch.int16)
            sep = above.clone()
            for other in FORMS:
                if other != f:
                    sep &= ref.view(torch.int16) != refs[other].view(torch.int16)
            n_sep = int(sep.sum())
            res[f"{f}/{rounding}"] = {
                "max_abs": d.max().item(),
                "max_rel": rel.max().item(),
                "share_exact_all": exact.double().mean().item(),
                "share_exact_gate_above": (exact[above].double().mean().item()
                                           if above.any() else None),
                "n_separating": n_sep,
                "share_exact_separating": (exact[sep].double().mean().item() if n_sep else None),
            }
    return res
