"""checkpoint.roundtrip: compressed-tensors' NVFP4 codec vs the BF16 source, checked by hand on a few blocks."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from ling_fixtures import TINY
from nvfp4study.checkpoint import generate as G
from nvfp4study.checkpoint import quantize as Q
from nvfp4study.checkpoint import roundtrip as R
from nvfp4study.core.errors import SourceCheckpointMissing
from nvfp4study.core.params import QuantizeParams

# e2m1 magnitudes by the low 3 bits of a nibble; bit 3 is the sign (OCP MX spec, FP4 E2M1)
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("rt")
    src = G.write_checkpoint(TINY, root / "src", shards=2, seed=2)
    q = root / "q"
    Q.quantize_checkpoint(src, q, QuantizeParams())
    return src, q


def _get(folder, name):
    wm = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    with safe_open(str(folder / wm[name]), "pt") as fh:
        return fh.get_tensor(name)


def _hand_decode(packed):
    """Two e2m1 values per byte, element 2j in the low nibble, 2j+1 in the high nibble."""
    out = []
    for row in packed.tolist():
        vals = []
        for byte in row:
            for nib in (byte & 0x0F, byte >> 4):
                mag = E2M1[nib & 0x7]
                vals.append(-mag if nib & 0x8 else mag)
        out.append(vals)
    return torch.tensor(out, dtype=torch.float32)


@pytest.mark.parametrize("proj", ["gate", "down"])
def test_hand_decoded_blocks_reproduce_codec_and_source(pair, proj):
    src, q = pair
    mod = f"model.layers.2.mlp.experts.5.{proj}_proj"
    packed, scale, gscale = (_get(q, f"{mod}.{x}") for x in ("weight_packed", "weight_scale", "weight_global_scale"))
    w = _get(src, f"{mod}.weight").float()
    rows = slice(0, 3)  # a few rows x all their blocks of 16
    e2m1 = _hand_decode(packed[rows])
    block = scale[rows].float().repeat_interleave(16, dim=1)  # fp8 e4m3 -> float is exact
    hand = e2m1 * block / float(gscale)
    codec = R.codec_dequantize({"weight_packed": packed, "weight_scale": scale,
                                "weight_global_scale": gscale}).float()[rows]
    # the codec returns bfloat16: equal to the hand value up to one bf16 rounding
    assert torch.allclose(codec, hand, rtol=2 ** -8, atol=0)
    # NVFP4 bound: rounding to the nearest e2m1 point is within half the grid gap x s, where
    # s = block scale / global scale; gaps 0.5 below 2, 1 in [2, 4), 2 in [4, 6]; values of a
    # block whose fp8 scale rounded down clip at 6 s. Small allowance for bf16 arithmetic.
    s = block / float(gscale)
    x = w[rows]
    v = x.abs() / s
    half = torch.where(v < 2, 0.25, torch.where(v < 4, 0.5, 1.0))
    bound = torch.maximum(s * half, x.abs() - 6 * s) + 2 ** -7 * x.abs() + 2 ** -8 * s
    err = (hand - x).abs()
    assert bool((err <= bound).all()), float((err / bound).max())
    # the library's bound is this hand bound, element by element
    assert torch.allclose(R.element_bound(w, scale, gscale)[rows], bound, rtol=1e-6, atol=0)
    # and the codes are the nearest grid points: no other e2m1 value x s is closer
    grid = torch.tensor(E2M1 + [-g for g in E2M1[1:]])
    best = (x.unsqueeze(-1) - grid * s.unsqueeze(-1)).abs().min(dim=-1).values
    assert bool((err <= best + 2 ** -7 * x.abs() + 2 ** -8 * s).all())


def test_roundtrip_table(pair, tmp_path):
    src, q = pair
    df = R.roundtrip(src, q, 4)
    assert len(df) == 12 and set(df["proj"]) == {"gate", "up", "down"}
    assert bool(df["within_bound"].all())
    # random normal weights: about 0.095 relative error (e2m1 with FP8 block scales of 16)
    assert df["rel_error"].between(0.07, 0.12).all()
    s = R.summary(df)
    assert s["tensors"] == 12 and s["all_within_bound"]
    png = R.figure(df, tmp_path / "rt.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bound_catches_a_wrong_decode(pair):
    """The check can fail: decoding with the nibbles swapped breaks the bound."""
    src, q = pair
    mod = "model.layers.1.mlp.experts.0.up_proj"
    packed, scale, gscale = (_get(q, f"{mod}.{x}") for x in ("weight_packed", "weight_scale", "weight_global_scale"))
    swapped = ((packed & 0x0F) << 4) | (packed >> 4)
    wrong = R.codec_dequantize({"weight_packed": swapped, "weight_scale": scale, "weight_global_scale": gscale})
    w = _get(src, f"{mod}.weight")
    assert not bool(((wrong.float() - w.float()).abs() <= R.element_bound(w, scale, gscale)).all())


def test_sample_experts(pair):
    _, q = pair
    all_pairs = R.sample_experts(q, 10_000)
    assert len(all_pairs) == TINY.num_experts * (TINY.num_hidden_layers - TINY.first_k_dense_replace)
    four = R.sample_experts(q, 4)
    assert four[0] == all_pairs[0] and four[-1] == all_pairs[-1] and len(set(four)) == 4
    assert R.sample_experts(q, 0) == []


def test_missing_index(tmp_path):
    with pytest.raises(SourceCheckpointMissing):
        R.roundtrip(tmp_path, tmp_path, 2)


# (v = |x| / s in block-scale units, the bound in units of s by hand from the module docstring:
#  half the e2m1 grid gap, 0.25 below 2, 0.5 in [2, 4), 1 in [4, 6]; beyond 6 the clip |x| - 6 s;
#  then + 2^-7 |x| + 2^-8 s)
HAND_BOUND = [(0.0, 0.25), (1.0, 0.25), (1.99, 0.25), (2.0, 0.5), (3.5, 0.5), (3.99, 0.5), (4.0, 1.0),
              (5.0, 1.0), (6.0, 1.0), (6.5, 1.0), (7.0, 1.0), (7.5, 1.5), (8.0, 2.0), (10.0, 4.0), (16.0, 10.0)]


def test_element_bound_by_hand_element_by_element():
    """Two blocks of 16 with block scales 3 and 6 over a global scale 2 (s = 1.5 and 3): every
    element's bound equals the hand value, both signs, each block with its own s."""
    vs = [v for v, _ in HAND_BOUND] + [0.5]  # 16 values per block
    x, want = [], []
    for s in (1.5, 3.0):
        for sign in (1.0, -1.0):
            row_x = [sign * v * s for v in vs]
            x.append(row_x)
            want.append([h * s + 2 ** -7 * abs(xi) + 2 ** -8 * s
                         for (_, h), xi in zip(HAND_BOUND + [(0.5, 0.25)], row_x, strict=True)])
    # rows: block 0 of the first two rows has s 1.5, block 1 s 3 (each row is both blocks)
    x = torch.tensor([x[0] + x[2], x[1] + x[3]])
    want = torch.tensor([want[0] + want[2], want[1] + want[3]])
    block_scale = torch.tensor([[3.0, 6.0], [3.0, 6.0]])
    got = R.element_bound(x, block_scale, torch.tensor([2.0]))
    assert got.dtype == torch.float32 and got.shape == (2, 32)
    assert torch.allclose(got, want, rtol=1e-6, atol=0), (got - want).abs().max()
    # a bf16 input gives the same float32 bound
    assert torch.equal(R.element_bound(x.bfloat16(), block_scale, torch.tensor([2.0])),
                       R.element_bound(x.bfloat16().float(), block_scale, torch.tensor([2.0])))


def test_element_bound_zero_block_scale_is_finite():
    """An all-zero block (block scale 0): v is |x| / tiny, not a division by zero; the bound of a
    zero element is 0 there and of any other element its clip |x|."""
    got = R.element_bound(torch.tensor([[0.0] * 15 + [1.0]]), torch.tensor([[0.0]]), torch.tensor([1.0]))
    assert torch.isfinite(got).all()
    assert got[0, :15].tolist() == [0.0] * 15 and got[0, 15].item() == pytest.approx(1.0 + 2 ** -7)
