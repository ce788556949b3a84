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
    assert R.sample_experts(q, 0) == [] and R.sample_experts(q, -1) == []
    assert R.sample_experts(q, 1) == all_pairs[:1]
    assert R.sample_experts(q, 2) == [all_pairs[0], all_pairs[-1]]
    assert R.sample_experts(q, 3) == [all_pairs[0], all_pairs[round((len(all_pairs) - 1) / 2)], all_pairs[-1]]


def test_missing_index(tmp_path):
    with pytest.raises(SourceCheckpointMissing, match=r"model.safetensors.index.json: index missing"):
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


def test_roundtrip_rows_name_their_tensors_and_summary_by_hand(pair):
    src, q = pair
    df = R.roundtrip(src, q, 4)
    want = [(layer, expert, proj) for layer, expert in R.sample_experts(q, 4) for proj in ("gate", "up", "down")]
    assert list(zip(df["layer"], df["expert"], df["proj"], strict=True)) == want
    assert list(df["module"]) == [f"model.layers.{la}.mlp.experts.{e}.{p}_proj" for la, e, p in want]
    assert not df.isna().any().any()
    assert R.summary(df) == {"tensors": 12, "rel_error_median": float(df["rel_error"].median()),
                             "rel_error_min": float(df["rel_error"].min()),
                             "rel_error_max": float(df["rel_error"].max()), "all_within_bound": True,
                             "max_error_over_bound": float(df["max_error_over_bound"].max())}
    assert R.summary(df.iloc[0:0]) == {"tensors": 0}


def _copy_with(q, dst, edit_map=None, edit_tensors=None):
    """A copy of the quantized checkpoint ``q`` with its index or a shard's tensors edited."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(q, dst)
    idx = dst / "model.safetensors.index.json"
    data = json.loads(idx.read_text())
    if edit_map:
        edit_map(data["weight_map"])
        idx.write_text(json.dumps(data))
    if edit_tensors:
        for shard in sorted(set(data["weight_map"].values())):
            tensors = load_file(str(dst / shard))
            if edit_tensors(tensors):
                save_file(tensors, str(dst / shard), metadata={"format": "pt"})
    return dst


def test_roundtrip_skips_a_module_that_is_not_quantized(pair, tmp_path):
    """A sampled expert whose gate_proj is not quantized: its row is left out, the rest stay."""
    src, q = pair
    layer, expert = R.sample_experts(q, 4)[0]
    mod = f"model.layers.{layer}.mlp.experts.{expert}.gate_proj"
    q2 = _copy_with(q, tmp_path / "q2", edit_map=lambda wm: wm.pop(f"{mod}.weight_scale"))
    df = R.roundtrip(src, q2, 4)
    assert len(df) == 11 and mod not in set(df["module"])
    assert list(df["module"][:2]) == [mod.replace("gate", "up"), mod.replace("gate", "down")]


def test_roundtrip_flags_a_tensor_outside_the_bound(pair, tmp_path):
    """One module's nibbles swapped in the checkpoint: its row is outside the bound (ratio > 1 =
    max |W_q - W| / bound over its elements), every other row within."""
    src, q = pair
    layer, expert = R.sample_experts(q, 4)[1]
    name = f"model.layers.{layer}.mlp.experts.{expert}.down_proj.weight_packed"

    def swap(tensors):
        if name not in tensors:
            return False
        p = tensors[name]
        tensors[name] = ((p & 0x0F) << 4) | (p >> 4)
        return True

    df = R.roundtrip(src, _copy_with(q, tmp_path / "q3", edit_tensors=swap), 4)
    bad = df[~df["within_bound"]]
    assert list(bad["module"]) == [name.rsplit(".", 1)[0]]
    assert float(bad["max_error_over_bound"].iloc[0]) > 1.0
    assert (df[df["within_bound"]]["max_error_over_bound"] <= 1.0).all()
    assert R.summary(df)["all_within_bound"] is False


def test_load_tensors_names_a_missing_tensor(pair):
    _, q = pair
    wm = json.loads((q / "model.safetensors.index.json").read_text())["weight_map"]
    with pytest.raises(SourceCheckpointMissing, match=r": tensor model.nope not in the index"):
        R.load_tensors(q, wm, ["model.nope"])


def test_roundtrip_values_by_hand(pair):
    """Each row's numbers from the source weight and compressed-tensors' decode: shape, relative
    Frobenius error, max |error|, max error / bound, and within_bound = (that ratio <= 1)."""
    src, q = pair
    df = R.roundtrip(src, q, 2)
    for row in df.to_dict("records"):
        m = row["module"]
        w = _get(src, f"{m}.weight").float()
        st = {x: _get(q, f"{m}.{x}") for x in ("weight_packed", "weight_scale", "weight_global_scale")}
        err = (R.codec_dequantize(st).float() - w).abs()
        assert (row["rows"], row["cols"]) == tuple(w.shape) and w.shape[0] != w.shape[1]
        assert row["rel_error"] == pytest.approx(float((err ** 2).sum().sqrt() / (w ** 2).sum().sqrt()), rel=1e-5)
        assert row["max_abs_error"] == float(err.max())
        bound = R.element_bound(w, st["weight_scale"], st["weight_global_scale"])
        assert row["max_error_over_bound"] == pytest.approx(float((err / bound).max()), rel=1e-6)
        assert row["within_bound"] == (row["max_error_over_bound"] <= 1.0)


@pytest.mark.parametrize("scale,within", [(1.0, True), (1.5, False), (3.0, False)])
def test_within_bound_is_ratio_at_most_one(pair, monkeypatch, scale, within):
    """A bound equal to the error (ratio exactly 1) is within; 1.5 and 3 times the error outside."""
    src, q = pair
    real_codec, last = R.codec_dequantize, {}

    def codec(state):  # the real decode, kept for the bound below
        last["deq"] = real_codec(state)
        return last["deq"]

    def element_bound(w, block_scale, global_scale):  # the error / scale (1 where exact)
        err = (last["deq"].float() - w.float()).abs()
        return torch.where(err > 0, err / scale, torch.ones_like(err))

    monkeypatch.setattr(R, "codec_dequantize", codec)
    monkeypatch.setattr(R, "element_bound", element_bound)
    df = R.roundtrip(src, q, 1)
    assert list(df["max_error_over_bound"]) == [pytest.approx(scale)] * 3
    assert list(df["within_bound"]) == [within] * 3


def test_roundtrip_of_no_expert_has_the_columns(pair):
    src, q = pair
    df = R.roundtrip(src, q, 0)
    assert df.empty and list(df.columns) == ["module", "layer", "expert", "proj", "rows", "cols", "rel_error",
                                             "max_abs_error", "max_error_over_bound", "within_bound"]
