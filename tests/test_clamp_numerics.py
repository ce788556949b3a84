"""Clamp forms against values computed by hand (sigmoid(4) = 1 / (1 + e^-4) = 0.98201379...)."""

from __future__ import annotations

import math

import pytest
import torch

from nvfp4study.sglang import clamp_numerics as cn


def t(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def silu(x: float) -> float:
    return x / (1.0 + math.exp(-x))


def test_above_the_limit():
    # g = 5, u = 6, L = 4: none = silu(5) * 6; pre = silu(4) * 4; post = min(silu(5), 4) * 4 = 16.
    assert float(cn.swiglu(t(5), t(6), "none", None)) == pytest.approx(29.79921, abs=1e-5)
    assert float(cn.swiglu(t(5), t(6), "pre", 4.0)) == pytest.approx(15.71222, abs=1e-5)
    assert float(cn.swiglu(t(5), t(6), "post", 4.0)) == pytest.approx(16.0, abs=1e-12)


def test_just_above_the_limit_silu_still_below_it():
    # g = 4.05: silu(4.05) = 3.9786... < 4, so post keeps silu(g); pre caps at silu(4).
    assert float(cn.swiglu(t(4.05), t(1), "post", 4.0)) == pytest.approx(silu(4.05), abs=1e-12)
    assert float(cn.swiglu(t(4.05), t(1), "pre", 4.0)) == pytest.approx(silu(4.0), abs=1e-12)


def test_below_the_limit_pre_and_post_agree():
    # g = 2, u = -5, L = 4: silu(2) = 1.7615942; up clamps to -4.
    for form in ("pre", "post"):
        assert float(cn.swiglu(t(2), t(-5), form, 4.0)) == pytest.approx(-7.0463768, abs=1e-6)
    assert float(cn.swiglu(t(2), t(-5), "none", None)) == pytest.approx(-8.807971, abs=1e-6)
    for form in ("pre", "post"):  # negative gate: silu(-3) = -0.1422776, nothing clamps
        assert float(cn.swiglu(t(-3), t(1), form, 4.0)) == pytest.approx(-0.1422776, abs=1e-6)


@pytest.mark.parametrize("L,gap", [(4.0, 0.0719448), (5.0, 0.0334643), (7.0, 0.0063773)])
def test_max_gate_gap(L, gap):
    # L - silu(L) = L / (1 + e^L): 4 / 55.59815 = 0.0719448
    assert cn.max_gate_gap(L) == pytest.approx(gap, abs=1e-7)
    assert cn.max_gate_gap(L) == pytest.approx(L / (1 + math.exp(L)), rel=1e-12)


def test_compare_table():
    df = cn.compare(n=201)
    row = df[(df["limit"] == 4.0) & (df["pair"] == "pre vs post")].iloc[0]
    # largest output gap = gate gap x the clamped up value L = 0.0719448 * 4
    assert row["max_abs_diff"] == pytest.approx(0.0719448 * 4, abs=1e-6)
    assert row["at_g"] > 4.0 and abs(row["at_u"]) >= 4.0
    assert row["gate_gap_rel"] == pytest.approx(1 - 0.98201379, abs=1e-8)
    assert set(df["pair"]) == {"pre vs post", "none vs post", "none vs pre"}


def test_bad_input():
    with pytest.raises(ValueError):
        cn.swiglu(t(1), t(1), "post", None)
    with pytest.raises(ValueError):
        cn.swiglu(t(1), t(1), "mid", 4.0)


def test_figure(tmp_path):
    assert cn.figure(tmp_path / "f.png").stat().st_size > 10_000


# --- issue 37: compare() and grid() field by field on small grids (the mutation benchmark's) -----
def _forms_by_hand(g: float, u: float, L: float) -> dict[str, float]:
    """The three forms at one point, in plain float arithmetic from the module docstring."""
    uc = max(-L, min(u, L))
    gc = min(g, L)
    return {"none": silu(g) * u, "pre": silu(gc) * uc, "post": min(silu(g), L) * uc}


@pytest.mark.parametrize("L,n", [(4.0, 9), (1.5, 7)])  # L >= 1: gate_factor takes u = 1 unclamped
def test_compare_small_grid_by_hand(L, n):
    """Every column of compare() for one limit on an n x n grid, against a loop over the grid's
    points: the largest |a - b| and the first (g, u) where it occurs (row-major, g slowest), the
    largest relative gap where |b| > 1e-6, the share of points that differ by more than 1e-12,
    and for pre vs post the gate-factor gaps on each side of L."""
    g0, g1, u0, u1 = -2.0, 3.0 * L, -2.5 * L, 2.5 * L
    gs = [g0 + (g1 - g0) * i / (n - 1) for i in range(n)]
    us = [u0 + (u1 - u0) * j / (n - 1) for j in range(n)]
    G, U = cn.grid(L, n=n)
    assert G.shape == U.shape == (n, n) and G.dtype == U.dtype == torch.float64
    assert G[:, 0].tolist() == pytest.approx(gs, abs=1e-12) and U[0, :].tolist() == pytest.approx(us, abs=1e-12)
    assert (G[:, 1:] == G[:, :1]).all() and (U[1:, :] == U[:1, :]).all()
    df = cn.compare((L,), n=n)
    assert list(df["pair"]) == ["pre vs post", "none vs post", "none vs pre"] and (df["limit"] == L).all()
    pts = [(g, u, _forms_by_hand(g, u, L)) for g in gs for u in us]
    for _, row in df.iterrows():
        a, b = row["pair"].split(" vs ")
        d = [abs(f[a] - f[b]) for _, _, f in pts]
        best = max(d)
        first = next(k for k, x in enumerate(d) if x >= best - 1e-12)
        assert row["max_abs_diff"] == pytest.approx(best, rel=1e-9, abs=1e-15)
        assert (row["at_g"], row["at_u"]) == pytest.approx(pts[first][:2], abs=1e-12)
        rel = [x / abs(f[b]) for x, (_, _, f) in zip(d, pts, strict=True) if abs(f[b]) > 1e-6]
        assert row["max_rel_diff"] == pytest.approx(max(rel), rel=1e-9)
        assert row["differs_frac"] == pytest.approx(sum(x > 1e-12 for x in d) / n ** 2, abs=1e-15)
        if (a, b) == ("pre", "post"):
            gap = {g: abs(min(silu(g), L) - silu(min(g, L))) for g in gs}
            assert row["differs_where"] == f"g > {L:g} (identical for g <= L)"
            assert row["gate_gap_le_L"] == pytest.approx(max(v for g, v in gap.items() if g <= L), abs=1e-15)
            assert row["gate_gap_gt_L"] == pytest.approx(max(v for g, v in gap.items() if g > L), rel=1e-9)
            assert row["gate_gap_rel_gt_L"] == pytest.approx(
                max(v / abs(min(silu(g), L)) for g, v in gap.items() if g > L), rel=1e-9)
            assert row["gate_gap"] == pytest.approx(L / (1 + math.exp(L)), rel=1e-12)
            assert row["gate_gap_rel"] == pytest.approx(1 - 1 / (1 + math.exp(-L)), rel=1e-12)
        else:
            assert row["differs_where"] == f"silu(g) > {L:g} or |u| > {L:g}"
            # None in the rows; NaN once pandas puts them in a float column
            assert all(math.isnan(row[k]) for k in ("gate_gap_le_L", "gate_gap_gt_L", "gate_gap_rel_gt_L",
                                                    "gate_gap", "gate_gap_rel"))


def test_grid_spans_and_forms_at_the_edges():
    """grid()'s explicit spans and default size; each form exactly at g = L and u = +-L, a
    limit of 0 or below refused, and gate_factor() as swiglu with u = 1."""
    G, U = cn.grid(4.0, g_span=(0.0, 1.0), u_span=(-1.0, 3.0), n=3)
    assert G[:, 0].tolist() == [0.0, 0.5, 1.0] and U[0, :].tolist() == [-1.0, 1.0, 3.0]
    assert cn.grid(1.0)[0].shape == (401, 401)
    for form in ("pre", "post"):
        assert float(cn.swiglu(t(4.0), t(4.0), form, 4.0)) == pytest.approx(4 * silu(4.0), abs=1e-12)
        assert float(cn.swiglu(t(4.0), t(-9.0), form, 4.0)) == pytest.approx(-4 * silu(4.0), abs=1e-12)
        for bad in (0.0, -1.0):
            with pytest.raises(ValueError, match="needs a positive limit"):
                cn.swiglu(t(1), t(1), form, bad)
    with pytest.raises(ValueError, match="unknown form 'mid'"):
        cn.swiglu(t(1), t(1), "mid", 4.0)
    g = torch.tensor([-3.0, 2.0, 9.0], dtype=torch.float64)
    assert cn.gate_factor(g, "post", 4.0).tolist() == pytest.approx([silu(-3.0), silu(2.0), 4.0], abs=1e-12)
    assert cn.gate_factor(g, "pre", 4.0).tolist() == pytest.approx([silu(-3.0), silu(2.0), silu(4.0)], abs=1e-12)
    assert cn.gate_factor(g, "none", None).tolist() == pytest.approx([silu(-3.0), silu(2.0), silu(9.0)], abs=1e-12)
    assert float(cn.swiglu(t(9.0), t(2.0), "none", 4.0)) == pytest.approx(2 * silu(9.0), abs=1e-12)


def test_formula_sources_in_a_small_tree(tmp_path):
    """formula_sources() names each SGLang function's file:line span, and skips a missing file."""
    fm = tmp_path / "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe.py"
    fm.parent.mkdir(parents=True)
    fm.write_text("import x\n\n\ndef _swiglu_silu_clamp_mul(a):\n    return a\n\n\n"
                  "def swiglu_gpt_oss_sigmoid_alpha(a,\n                                 b):\n    return a\n")
    assert cn.formula_sources(tmp_path) == {
        "_swiglu_silu_clamp_mul": "layers/moe/moe_runner/triton_utils/fused_moe.py:4-5",
        "swiglu_gpt_oss_sigmoid_alpha": "layers/moe/moe_runner/triton_utils/fused_moe.py:8-10"}
    marlin = tmp_path / "sglang/srt/layers/moe/fused_moe_triton/fused_marlin_moe.py"
    marlin.parent.mkdir(parents=True)
    marlin.write_text("def other():\n    pass\n\n\ndef swiglu_limit_func(x):\n    return x\n")
    assert cn.formula_sources(tmp_path)["swiglu_limit_func"] == "layers/moe/fused_moe_triton/fused_marlin_moe.py:5-6"


def test_compare_defaults_are_the_three_limits_on_401_points(monkeypatch):
    """compare()'s defaults: limits 4, 5 and 7 on a 401 x 401 grid (grid() is spied on and asked
    for 5 points instead, so the test stays fast)."""
    asked = []
    real = cn.grid

    def spy(limit, g_span=None, u_span=None, n=401):
        asked.append((limit, n))
        return real(limit, g_span, u_span, n=5)

    monkeypatch.setattr(cn, "grid", spy)
    df = cn.compare()
    assert asked == [(4.0, 401), (5.0, 401), (7.0, 401)] and list(df["limit"]) == [4.0] * 3 + [5.0] * 3 + [7.0] * 3


@pytest.mark.parametrize("L", [0.2, 1.0])
def test_compare_relative_gap_counts_small_outputs(L):
    """With L = 0.2 every output is below 1 in size: max_rel_diff still counts every point whose
    |b| > 1e-6, dividing by |b| itself; L = 1 is a valid limit (only L <= 0 is refused)."""
    n = 5
    g0, g1, u0, u1 = -2.0, 3.0 * L, -2.5 * L, 2.5 * L
    pts = [_forms_by_hand(g0 + (g1 - g0) * i / (n - 1), u0 + (u1 - u0) * j / (n - 1), L)
           for i in range(n) for j in range(n)]
    df = cn.compare((L,), n=n)
    for _, row in df.iterrows():
        a, b = row["pair"].split(" vs ")
        rel = [abs(f[a] - f[b]) / abs(f[b]) for f in pts if abs(f[b]) > 1e-6]
        assert row["max_rel_diff"] == pytest.approx(max(rel), rel=1e-9), row["pair"]
        assert row["differs_frac"] == pytest.approx(sum(abs(f[a] - f[b]) > 1e-12 for f in pts) / n ** 2, abs=1e-15)
    assert float(cn.swiglu(t(3.0), t(2.0), "post", L)) == pytest.approx(min(silu(3.0), L) * L, abs=1e-12)


def test_formula_sources_skips_only_the_missing_file(tmp_path):
    marlin = tmp_path / "sglang/srt/layers/moe/fused_moe_triton/fused_marlin_moe.py"
    marlin.parent.mkdir(parents=True)
    marlin.write_text("# é\ndef swiglu_limit_func(x):\n    return x\n", encoding="utf-8")
    assert cn.formula_sources(tmp_path) == {"swiglu_limit_func": "layers/moe/fused_moe_triton/fused_marlin_moe.py:2-3"}
