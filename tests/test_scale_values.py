"""Plausibility of global and input scale values (check_scale_values): each implausible kind
is a finding naming the experts; the clean fixture has none (the project's own quantizer output
is checked in test_checkpoint_audit.test_generated_and_quantized_checkpoint_is_clean)."""

from __future__ import annotations

import math

import pytest

from nvfp4study.checkpoint.audit import AuditCode, Severity, audit_checkpoint
from nvfp4study.checkpoint.check_scale_values import FLT_MIN, value_problem
from test_checkpoint_audit import DENSE, NL, E, build


def implausible(rep, param: str) -> dict[str, dict]:
    """reason -> details of the SCALE_VALUE_IMPLAUSIBLE findings for ``param``."""
    return {f.details["reason"]: f for f in rep.findings
            if f.code == AuditCode.SCALE_VALUE_IMPLAUSIBLE and f.details["param"] == param}


def test_value_problem_by_hand():
    assert [value_problem(v) for v in (math.nan, math.inf, -math.inf, 0.0, -0.0, -3.0, 1e-40, FLT_MIN, 2688.0, None)] == \
        ["nan", "inf", "inf", "zero", "zero", "negative", "subnormal", None, None, "nan"]


def test_clean_fixture_has_no_implausible_scale(tmp_path):
    build(tmp_path / "c")
    rep = audit_checkpoint(tmp_path / "c")
    assert AuditCode.SCALE_VALUE_IMPLAUSIBLE.value not in rep.codes()
    assert rep.input_scales["implausible"] == {"weight_global_scale": {}, "input_global_scale": {}}


BAD = [(math.nan, "nan"), (math.inf, "inf"), (0.0, "zero"), (-7.5, "negative"), (1e-40, "subnormal")]


@pytest.mark.parametrize("value,reason", BAD)
@pytest.mark.parametrize("param", ["weight_global_scale", "input_global_scale"])
def test_each_bad_value_names_its_experts(tmp_path, param, value, reason):
    where = {(2, "up_proj", 3): value, (3, "down_proj", 6): value}
    build(tmp_path / "c", **({"weight_value": where} if param == "weight_global_scale" else {"input_value": where}))
    rep = audit_checkpoint(tmp_path / "c")
    f = implausible(rep, param)[reason]
    assert f.severity == Severity.ERROR and f.layers == [2, 3]
    assert f.details["experts"] == {"2": {"up_proj": [3]}, "3": {"down_proj": [6]}}
    assert f.tensors == [f"model.layers.2.mlp.experts.3.up_proj.{param}", f"model.layers.3.mlp.experts.6.down_proj.{param}"]
    assert set(implausible(rep, param)) == {reason}  # nothing else flagged


def test_weight_scale_copied_to_most_experts_of_a_layer(tmp_path):
    copied = {(2, "gate_proj", e): 777.0 for e in range(E) if e != 1}  # 7 of 8 experts
    build(tmp_path / "c", weight_value=copied, share_gate_up=False)
    f = implausible(audit_checkpoint(tmp_path / "c"), "weight_global_scale")["copied-within-layer"]
    assert f.severity == Severity.WARNING and "777.0" in f.message
    assert f.details["experts"] == {"2": {"gate_proj": [0, 2, 3, 4, 5, 6, 7]}}


def test_a_few_equal_scales_are_not_a_copy(tmp_path):
    # BF16 amax values collide by chance: 3 of 8 experts sharing one value is below the threshold
    build(tmp_path / "c", weight_value={(2, "gate_proj", e): 777.0 for e in (0, 1, 2)})
    assert "copied-within-layer" not in implausible(audit_checkpoint(tmp_path / "c"), "weight_global_scale")


def test_weight_scales_of_one_layer_pasted_into_another(tmp_path):
    # layer 3 gets layer 2's per-expert values (the builder's formula for layer 2)
    pasted = {(3, p, e): 1000.0 + 20 + e + (0.5 if p == "down_proj" else 0.0)
              for p in ("gate_proj", "up_proj", "down_proj") for e in range(E)}
    build(tmp_path / "c", weight_value=pasted)
    f = implausible(audit_checkpoint(tmp_path / "c"), "weight_global_scale")["copied-across-layers"]
    assert f.layers == [2, 3] and f.details["experts"]["3"]["down_proj"] == list(range(E))
    assert set(f.details["experts"]) == {"2", "3"}


def test_input_scales_all_one_are_the_placeholder_but_another_copied_value_is_not(tmp_path):
    build(tmp_path / "one")
    assert not implausible(audit_checkpoint(tmp_path / "one"), "input_global_scale")
    everywhere = {(la, p, e): 0.25 for la in range(DENSE, NL) for p in ("gate_proj", "up_proj", "down_proj")
                  for e in range(E)}
    build(tmp_path / "q", input_value=everywhere)
    f = implausible(audit_checkpoint(tmp_path / "q"), "input_global_scale")["copied-within-layer"]
    assert f.details["count"] == 3 * E * (NL - DENSE) and "0.25" in f.message


def test_gate_up_allclose_uses_torchs_default_tolerance(tmp_path):
    """SGLang warns with torch.allclose defaults (rtol 1e-5, atol 1e-8) when gate and up differ
    (w4a4 moe 187-192): a pair one float32 ulp apart is allclose but not shared, a pair 1.0 apart
    is neither. Computed here with torch itself, independently of the audit's formula."""
    import torch

    gate = 1000.0 + 20 + 4  # the builder's layer-2 expert-4 gate value
    near = float(torch.nextafter(torch.tensor(gate, dtype=torch.float32), torch.tensor(2e3)))
    far = gate + 1.0
    build(tmp_path / "c", weight_value={(2, "up_proj", 4): near, (3, "up_proj", 5): far})
    rep = audit_checkpoint(tmp_path / "c")
    rows = {(r["layer"], r["expert"]): r for r in rep.gate_up}
    for key, up in (((2, 4), near), ((3, 5), far)):
        want = bool(torch.allclose(torch.tensor([up]), torch.tensor([rows[key]["gate_global_scale"]])))
        assert rows[key]["allclose"] is want and rows[key]["shared"] is False
    assert rows[(2, 4)]["allclose"] and not rows[(3, 5)]["allclose"]
    assert rep.gate_up_summary["mismatched"] == 2 and rep.gate_up_summary["not_allclose"] == 1
    assert all(r["allclose"] and r["shared"] for k, r in rows.items() if k not in ((2, 4), (3, 5)))


# --- check_scale_values on its own, with modules made here (only the fields it reads) ---------
def _check(wgs: dict[tuple[int, str, int], float], extra=()):
    """check_scale_values over experts whose weight_global_scale values are ``wgs``
    ({(layer, proj, expert): value}); ``extra``: modules without the scale or with a [2] one."""
    from types import SimpleNamespace as NS

    from nvfp4study.checkpoint.check_scale_values import check_scale_values

    mods = list(extra)
    for layer, proj, e in wgs:
        t = NS(name=f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight_global_scale", numel=1)
        mods.append(NS(layer=layer, proj=proj, expert=e, params={"weight_global_scale": t}))
    vals = {m.params["weight_global_scale"].name: v for m, v in zip(mods[len(extra):], wgs.values(), strict=True)}
    findings = []
    out = check_scale_values(mods, vals, findings)
    return out["weight_global_scale"], {f.details["reason"]: f for f in findings}


def _layer(layer, values, proj="up_proj"):
    return {(layer, proj, e): v for e, v in enumerate(values)}


def test_copied_within_layer_edges():
    """A value held by >= 4 experts AND >= half of the layer's is a copy: 4 of 8 and 4 of 4 are;
    4 of 10, 2 of 4 and a layer of 3 are not (a small layer first does not stop the others)."""
    distinct = [1.5 + i for i in range(10)]
    wgs = {**_layer(1, [9.0] * 3), **_layer(2, [2.0] * 4 + distinct[:4]), **_layer(3, [3.0] * 4),
           **_layer(4, [4.0] * 4 + distinct[:6]), **_layer(5, [5.0] * 2 + distinct[:2])}
    out, found = _check(wgs)
    assert out == {"copied-within-layer": 8}
    f = found["copied-within-layer"]
    assert f.details["experts"] == {"2": {"up_proj": [0, 1, 2, 3]}, "3": {"up_proj": [0, 1, 2, 3]}}
    assert f.message == ("8 expert weight_global_scale values share one bit-identical value [2.0, 3.0] with at least "
                         "50% of their layer's experts (copied, not calibrated); layers 2-3; "
                         "layer 2: up_proj experts [0, 1, 2, 3]; layer 3: up_proj experts [0, 1, 2, 3]")


def test_copied_within_layer_message_shows_three_values_and_layers():
    wgs = {k: v for la in range(1, 5) for k, v in _layer(la, [float(la)] * 4).items()}
    _, found = _check(wgs)
    f = found["copied-within-layer"]
    assert f.message.startswith("16 expert weight_global_scale values share one bit-identical value [1.0, 2.0, 3.0] "
                                "with at least 50%")
    assert f.message.endswith("; layers 1-4; layer 1: up_proj experts [0, 1, 2, 3]; layer 2: up_proj experts "
                              "[0, 1, 2, 3]; layer 3: up_proj experts [0, 1, 2, 3]")


def test_copied_across_layers_edges():
    """A layer's vector of at least two different values repeated in another layer is a copy; a
    repeated uniform vector (one value) or a single expert is not."""
    out, found = _check({**_layer(1, [1.5, 2.5]), **_layer(2, [1.5, 2.5]), **_layer(1, [7.0, 7.0], "down_proj"),
                         **_layer(2, [7.0, 7.0], "down_proj"), **_layer(3, [8.0], "gate_proj"),
                         **_layer(4, [8.0], "gate_proj")})
    assert out == {"copied-across-layers": 4}
    f = found["copied-across-layers"]
    assert f.message == ("4 expert weight_global_scale values repeat another layer's per-expert values exactly (a layer "
                         "copied); layers 1-2; layer 1: up_proj experts [0, 1]; layer 2: up_proj experts [0, 1]")
    _, found = _check({**_layer(1, [1.5, 2.5]), **_layer(1, [3.5, 4.5], "down_proj"), **_layer(2, [1.5, 2.5]),
                       **_layer(2, [3.5, 4.5], "down_proj")})
    assert found["copied-across-layers"].message.endswith(
        "layer 1: down_proj experts [0, 1], up_proj experts [0, 1]; layer 2: down_proj experts [0, 1], "
        "up_proj experts [0, 1]")


def test_bad_values_skip_modules_without_a_scalar_and_cap_the_tensor_list():
    from types import SimpleNamespace as NS

    no_scale = NS(layer=1, proj="up_proj", expert=99, params={})
    vector = NS(layer=1, proj="up_proj", expert=98,
                params={"weight_global_scale": NS(name="vector.weight_global_scale", numel=2)})
    out, found = _check(_layer(1, [math.nan] * 501), extra=[no_scale, vector])
    assert out == {"nan": 501}
    f = found["nan"]
    assert len(f.tensors) == 500 and f.tensors[0] == "model.layers.1.mlp.experts.0.up_proj.weight_global_scale"
    assert f.severity == Severity.ERROR and "vector.weight_global_scale" not in f.tensors
