"""Round trip: dequantize sampled experts with compressed-tensors' NVFP4 codec, compare to BF16.

The codec is ``compressed_tensors.compressors.nvfp4.NVFP4PackedCompressor.decompress`` applied
per module to ``{weight_packed, weight_scale, weight_global_scale}`` (compressed-tensors' NVFP4
convention, global scale = 448 x 6 / amax = 2688 / amax): W = e2m1 value x block scale / global scale.

Error bound used (per element, derived from the format): with s = block scale / global scale
of the element's block of 16, and v = |x| / s, an e2m1 grid {0, 0.5, 1, 1.5, 2, 3, 4, 6} rounds
to nearest, so |x - q| <= s x halfgap(v) with halfgap = 0.25 below 2, 0.5 in [2, 4), 1 in
[4, 6]; beyond 6 (the FP8 block scale rounded down) the value clips to 6 s, error |x| - 6 s.
Plus a rounding allowance of 2^-7 |x| + 2^-8 s for the BF16 arithmetic of the quantizer and of
the decoded output (``unpack_fp4_from_uint8`` returns bfloat16,
compressed_tensors/compressors/nvfp4/helpers.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.errors import SourceCheckpointMissing
from .layout import EXPERT_RE

E2M1_HALFGAP_EDGES = ((2.0, 0.25), (4.0, 0.5), (float("inf"), 1.0))


def _weight_map(ckpt: Path) -> dict[str, str]:
    idx = ckpt / "model.safetensors.index.json"
    if not idx.is_file():
        raise SourceCheckpointMissing(f"{idx}: index missing")
    return json.loads(idx.read_text())["weight_map"]


def sample_experts(quantized: str | Path, n: int) -> list[tuple[int, int]]:
    """``n`` (layer, expert) pairs with quantized projections, spread evenly over all of them
    (deterministic: first and last included)."""
    wm = _weight_map(Path(quantized))
    pairs = sorted({(int(m.group(1)), int(m.group(2))) for name in wm
                    if name.endswith(".weight_packed") and (m := EXPERT_RE.match(name))})
    if n <= 0 or not pairs:
        return []
    if n >= len(pairs):
        return pairs
    step = (len(pairs) - 1) / (n - 1) if n > 1 else 0
    return [pairs[round(i * step)] for i in range(n)]


def load_tensors(ckpt: Path, wm: dict[str, str], names: list[str]) -> dict[str, Any]:
    """Named tensors of a checkpoint, read shard by shard through the index.

    Raises:
        SourceCheckpointMissing: a name not in the index.
    """
    from safetensors import safe_open

    out: dict[str, Any] = {}
    by_shard: dict[str, list[str]] = {}
    for n in names:
        if n not in wm:
            raise SourceCheckpointMissing(f"{ckpt}: tensor {n} not in the index")
        by_shard.setdefault(wm[n], []).append(n)
    for shard, ns in by_shard.items():
        with safe_open(str(ckpt / shard), "pt") as fh:
            for n in ns:
                out[n] = fh.get_tensor(n)
    return out


def codec_dequantize(state: dict[str, Any]) -> Any:
    """compressed-tensors' own NVFP4 decode of one module's state dict (local names
    ``weight_packed``, ``weight_scale``, ``weight_global_scale``); returns the weight (bf16)."""
    from compressed_tensors.compressors.nvfp4 import NVFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme

    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    return NVFP4PackedCompressor.decompress(dict(state), scheme)["weight"]


def element_bound(x: Any, block_scale: Any, global_scale: Any) -> Any:
    """Per-element bound on |dequant - x| (module docstring). x [o, i]; block_scale [o, i/16]
    (float); global_scale [1]. Returns float32 [o, i]."""
    import torch

    x = x.float()
    s = (block_scale.float() / global_scale.float()).repeat_interleave(16, dim=1)
    v = x.abs() / s.clamp_min(torch.finfo(torch.float32).tiny)
    half = torch.full_like(v, 1.0)
    half = torch.where(v < 4.0, torch.full_like(v, 0.5), half)
    half = torch.where(v < 2.0, torch.full_like(v, 0.25), half)
    inner = s * half
    clip = x.abs() - 6.0 * s
    return torch.where(v <= 6.0, inner, torch.maximum(inner, clip)) + 2.0 ** -7 * x.abs() + 2.0 ** -8 * s


def roundtrip(source: str | Path, quantized: str | Path, n_experts: int) -> Any:
    """Dequantize the gate/up/down of ``n_experts`` sampled experts and compare to the source.

    Returns:
        pandas DataFrame, one row per tensor: ``module, layer, expert, proj, rows, cols,
        rel_error`` (||W_q - W||_F / ||W||_F), ``max_abs_error``, ``max_error_over_bound``
        (max over elements of |W_q - W| / bound; <= 1 means every element is within the NVFP4
        bound of :func:`element_bound`), ``within_bound``.

    Raises:
        SourceCheckpointMissing: a folder, index or tensor is missing.
    """
    import pandas as pd
    import torch

    src, q = Path(source), Path(quantized)
    wm_s, wm_q = _weight_map(src), _weight_map(q)
    rows = []
    for layer, expert in sample_experts(q, n_experts):
        for proj in ("gate", "up", "down"):
            mod = f"model.layers.{layer}.mlp.experts.{expert}.{proj}_proj"
            qn = [f"{mod}.weight_packed", f"{mod}.weight_scale", f"{mod}.weight_global_scale"]
            if not all(n in wm_q for n in qn):
                continue
            qt = load_tensors(q, wm_q, qn)
            w = load_tensors(src, wm_s, [f"{mod}.weight"])[f"{mod}.weight"].float()
            state = {n.rsplit(".", 1)[1]: t for n, t in qt.items()}
            deq = codec_dequantize(state).float()
            err = (deq - w).abs()
            bound = element_bound(w, state["weight_scale"], state["weight_global_scale"])
            ratio = float((err / bound).max())
            rows.append({"module": mod, "layer": layer, "expert": expert, "proj": proj,
                         "rows": w.shape[0], "cols": w.shape[1],
                         "rel_error": float(torch.linalg.norm(deq - w) / torch.linalg.norm(w)),
                         "max_abs_error": float(err.max()), "max_error_over_bound": ratio,
                         "within_bound": ratio <= 1.0})
    return pd.DataFrame(rows, columns=["module", "layer", "expert", "proj", "rows", "cols", "rel_error",
                                       "max_abs_error", "max_error_over_bound", "within_bound"])


def summary(df: Any) -> dict[str, Any]:
    """``tensors``, ``rel_error`` median/min/max, ``all_within_bound``, ``max_error_over_bound``."""
    if df.empty:
        return {"tensors": 0}
    return {"tensors": len(df), "rel_error_median": float(df["rel_error"].median()),
            "rel_error_min": float(df["rel_error"].min()), "rel_error_max": float(df["rel_error"].max()),
            "all_within_bound": bool(df["within_bound"].all()),
            "max_error_over_bound": float(df["max_error_over_bound"].max())}


def figure(df: Any, path: str | Path, title: str = "") -> Path:
    """Two panels: relative Frobenius error per tensor by projection; max error / bound."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    path = Path(path)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    sns.stripplot(data=df, x="proj", y="rel_error", hue="layer", ax=axes[0], jitter=0.2, size=6)
    axes[0].set(title="relative error ||W_q - W|| / ||W||", xlabel="projection", ylabel="relative error")
    sns.stripplot(data=df, x="proj", y="max_error_over_bound", ax=axes[1], jitter=0.2, size=6, color="C1")
    axes[1].axhline(1.0, color="k", lw=1, ls="--")
    axes[1].set(title="max |W_q - W| / NVFP4 bound (<= 1: within)", xlabel="projection", ylabel="ratio",
                ylim=(0, max(1.1, float(df["max_error_over_bound"].max()) * 1.1)))
    fig.suptitle(title or "NVFP4 round trip (compressed-tensors codec) vs BF16 source, random weights")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
