"""The three SwiGLU clamp forms on CPU, and where and by how much they differ.

Forms (``g`` = gate pre-activation, ``u`` = up projection, ``L`` = clamp limit):

- ``none``: ``silu(g) * u`` — the clamp dropped;
- ``pre`` (GPT-OSS form with alpha = 1, beta = 0; what FlashInfer's ``SwigluBias`` computes and
  what SGLang 0.5.21-0.5.23 send Ling's NVFP4 CUTLASS path to):
  ``g' = min(g, L); g' * sigmoid(g') * clamp(u, -L, L)`` = ``silu(min(g, L)) * clamp(u, -L, L)``;
  source: flashinfer-python 0.7.2 ``csrc/fused_moe/cutlass_backend/cutlass_fused_moe_kernels.cuh``
  lines 2250-2262 (``SwigluBiasAdaptor``) and the Swiglu -> SwigluBias promotion in
  ``flashinfer_cutlass_fused_moe_binding.cu`` lines 443-448; SGLang's own
  ``swiglu_gpt_oss_sigmoid_alpha`` (``triton_utils/fused_moe.py``) is the same with beta = 1;
- ``post`` (Ling's form, FlashInfer ``SwigluStep``): ``min(silu(g), L) * clamp(u, -L, L)``;
  source: ``cutlass_fused_moe_kernels.cuh`` lines 2264-2279 (``SwigluStepAdaptor``) and SGLang's
  ``_swiglu_silu_clamp_mul`` (``layers/moe/moe_runner/triton_utils/fused_moe.py``, 0.5.23 lines
  411-416); :func:`formula_sources` finds the SGLang lines in any tree.

For ``g <= L`` pre and post agree exactly (silu is increasing and ``silu(L) < L``). For ``g > L``
pre caps the gate factor at ``silu(L)`` and post at ``L``, so the largest gap in the gate factor
is ``L - silu(L) = L / (1 + e^L)`` (a relative ``1 - sigmoid(L)``), reached once ``silu(g) >= L``.
Computed in float64 (the kernels' activation epilogues run in fp32 on bf16 GEMM outputs).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Literal

import torch

Form = Literal["none", "pre", "post"]
FORMS: tuple[Form, ...] = ("none", "pre", "post")


def swiglu(g: torch.Tensor, u: torch.Tensor, form: Form, limit: float | None) -> torch.Tensor:
    """One SwiGLU output per element.

    Args:
        g, u: gate and up values (any shape, broadcastable; float).
        form: ``"none"``, ``"pre"`` or ``"post"`` (see the module docstring).
        limit: the clamp ``L`` (> 0); ignored for ``"none"``.

    Returns:
        ``silu(g) * u`` with the form's clamp, same dtype as the inputs.

    Raises:
        ValueError: unknown form, or a clamped form without a positive limit.
    """
    if form == "none":
        return torch.nn.functional.silu(g) * u
    if limit is None or limit <= 0:
        raise ValueError(f"form {form!r} needs a positive limit, got {limit!r}")
    uc = u.clamp(-limit, limit)
    if form == "pre":
        gc = g.clamp(max=limit)
        return gc * torch.sigmoid(gc) * uc
    if form == "post":
        return torch.nn.functional.silu(g).clamp(max=limit) * uc
    raise ValueError(f"unknown form {form!r}; forms: {FORMS}")


def gate_factor(g: torch.Tensor, form: Form, limit: float | None) -> torch.Tensor:
    """The gate side alone (``swiglu`` with ``u = 1``, which no clamp changes for ``L >= 1``)."""
    return swiglu(g, torch.ones_like(g), form, limit)


def max_gate_gap(limit: float) -> float:
    """``L - silu(L)``: the largest post-minus-pre gap of the gate factor (float64)."""
    L = torch.tensor(float(limit), dtype=torch.float64)
    return float(L - torch.nn.functional.silu(L))


def grid(limit: float, g_span: tuple[float, float] | None = None, u_span: tuple[float, float] | None = None,
         n: int = 401) -> tuple[torch.Tensor, torch.Tensor]:
    """A float64 (g, u) mesh, by default ``g`` in [-2, 3L] and ``u`` in [-2.5L, 2.5L]."""
    g0, g1 = g_span or (-2.0, 3.0 * limit)
    u0, u1 = u_span or (-2.5 * limit, 2.5 * limit)
    g = torch.linspace(g0, g1, n, dtype=torch.float64)
    u = torch.linspace(u0, u1, n, dtype=torch.float64)
    return torch.meshgrid(g, u, indexing="ij")


def compare(limits: tuple[float, ...] = (4.0, 5.0, 7.0), n: int = 401):
    """Where and by how much the forms differ on a (g, u) grid around and beyond each limit.

    Returns:
        A pandas DataFrame, one row per (limit, pair) with: ``max_abs_diff`` (largest
        |a - b| on the grid), ``at_g``/``at_u`` (where), ``max_rel_diff`` (largest
        |a - b| / |b| where |b| > 1e-6), ``differs_frac`` (fraction of grid points with
        |a - b| > 1e-12), ``differs_where`` (the region, stated from the forms), and for
        pre-vs-post the gate-factor gap |post - pre| MEASURED on the grid's gate values:
        ``gate_gap_le_L`` (largest for g <= L; 0 up to rounding if the forms agree there),
        ``gate_gap_gt_L`` (largest for g > L) and ``gate_gap_rel_gt_L`` (largest
        |post - pre| / post for g > L), next to the formulas ``gate_gap`` = ``L - silu(L)`` and
        ``gate_gap_rel`` = ``1 - sigmoid(L)`` they are compared with.
    """
    import pandas as pd

    rows = []
    for L in limits:
        G, U = grid(L, n=n)
        out = {f: swiglu(G, U, f, L) for f in FORMS}
        for a, b in (("pre", "post"), ("none", "post"), ("none", "pre")):
            d = (out[a] - out[b]).abs()
            i = int(torch.argmax(d))
            denom = out[b].abs()
            rel = torch.where(denom > 1e-6, d / denom.clamp(min=1e-6), torch.zeros_like(d))
            row = {"limit": L, "pair": f"{a} vs {b}", "max_abs_diff": float(d.flatten()[i]),
                   "at_g": float(G.flatten()[i]), "at_u": float(U.flatten()[i]),
                   "max_rel_diff": float(rel.max()), "differs_frac": float((d > 1e-12).double().mean())}
            if (a, b) == ("pre", "post"):
                g = G[:, 0]  # the grid's gate values
                post = gate_factor(g, "post", L)
                gap = (post - gate_factor(g, "pre", L)).abs()
                le, gt = g <= L, g > L
                row.update(differs_where=f"g > {L:g} (identical for g <= L)",
                           gate_gap_le_L=float(gap[le].max()) if bool(le.any()) else None,
                           gate_gap_gt_L=float(gap[gt].max()) if bool(gt.any()) else None,
                           gate_gap_rel_gt_L=float((gap[gt] / post[gt].abs()).max()) if bool(gt.any()) else None,
                           gate_gap=max_gate_gap(L),
                           gate_gap_rel=float(1 - torch.sigmoid(torch.tensor(L, dtype=torch.float64))))
            else:
                row.update(differs_where=f"silu(g) > {L:g} or |u| > {L:g}", gate_gap_le_L=None,
                           gate_gap_gt_L=None, gate_gap_rel_gt_L=None, gate_gap=None, gate_gap_rel=None)
            rows.append(row)
    return pd.DataFrame(rows)


def figure(out: str | Path, limits: tuple[float, ...] = (4.0, 5.0, 7.0)) -> Path:
    """Three panels: the gate factor of each form for L = limits[0]; |post - pre| over (g, u) for
    L = limits[0]; the relative gate-factor gap (post - pre) / post against g for each limit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    L0 = limits[0]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    g = torch.linspace(-2, 3 * L0, 600, dtype=torch.float64)
    for f, style in zip(FORMS, ("k:", "C1-", "C0--"), strict=True):
        axes[0].plot(g, gate_factor(g, f, L0), style, label={"none": "none: silu(g)", "pre": "pre: silu(min(g, L))",
                                                              "post": "post: min(silu(g), L)"}[f])
    axes[0].axvline(L0, color="grey", lw=0.5)
    axes[0].set(title=f"gate factor, L = {L0:g}", xlabel="gate pre-activation g", ylabel="gate factor",
                ylim=(-1, L0 * 1.6))
    axes[0].legend(fontsize=8)
    G, U = grid(L0, n=301)
    d = (swiglu(G, U, "post", L0) - swiglu(G, U, "pre", L0)).abs()
    im = axes[1].pcolormesh(G.numpy(), U.numpy(), d.numpy(), shading="auto", cmap="viridis")
    fig.colorbar(im, ax=axes[1], label="|post - pre|")
    axes[1].set(title=f"|post - pre| output, L = {L0:g}", xlabel="g", ylabel="up u")
    for L in limits:
        gg = torch.linspace(0, 3 * max(limits), 800, dtype=torch.float64)
        post, pre = gate_factor(gg, "post", L), gate_factor(gg, "pre", L)
        axes[2].plot(gg, 100 * (post - pre) / post.clamp(min=1e-9), label=f"L = {L:g}")
    axes[2].set(title="relative gate gap (post - pre) / post", xlabel="g", ylabel="%")
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def formula_sources(tree_root: str | Path) -> dict[str, str]:
    """``file:line`` of SGLang's own implementations of the forms in a tree (when present):
    ``_swiglu_silu_clamp_mul`` (post), ``swiglu_gpt_oss_sigmoid_alpha`` (pre, beta 1) and
    ``swiglu_limit_func`` (pre, Marlin)."""
    root = Path(tree_root)
    where = {"_swiglu_silu_clamp_mul": "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe.py",
             "swiglu_gpt_oss_sigmoid_alpha": "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe.py",
             "swiglu_limit_func": "sglang/srt/layers/moe/fused_moe_triton/fused_marlin_moe.py"}
    out = {}
    for fn, rel in where.items():
        p = root / rel
        if not p.is_file():
            continue
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(n, ast.FunctionDef) and n.name == fn:
                out[fn] = f"{rel[len('sglang/srt/'):]}:{n.lineno}-{n.end_lineno}"
    return out
