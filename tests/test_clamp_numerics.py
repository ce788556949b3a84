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
