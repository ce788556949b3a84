"""``checkpoint/check_scales.py`` field by field on tiny checkpoints (issue 37's mutation benchmark:
the fast covering selection for this module; tests/test_checkpoint_audit.py covers the same checks
at Marlin sizes).

Each checkpoint is written by tests/test_checkpoint_audit.py's ``build`` with 1-4 experts, hidden
32 and intermediate 16 (milliseconds), so every value is known from the builder's formula: weight
global scale ``1000 + 10 x layer + expert`` (+0.5 for down_proj; up_proj + ``3 + expert % 3`` when
gate and up are not shared), input global scale 1.0; expert layers 1..NL-1.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

import test_checkpoint_audit as tca
from nvfp4study.checkpoint.audit import AuditCode, Severity, audit_checkpoint

SMALL = {"hidden": 32, "moe_inter": 16}
LAYERS = range(tca.DENSE, tca.NL)  # the expert layers the builder writes (1, 2, 3)


def tiny(tmp_path, experts: int = 4, name: str = "c", **kw):
    root = tmp_path / name
    tca.build(root, experts=experts, routing=(experts, 1, 1, 1), **SMALL, **kw)
    return root


def by_code(rep, code: AuditCode) -> list:
    return [f for f in rep.findings if f.code == code]


def one(rep, code: AuditCode):
    hits = by_code(rep, code)
    assert len(hits) == 1, f"{code.value}: {len(hits)} findings; got {sorted(rep.codes())}"
    return hits[0]


def wgs(layer: int, proj: str, e: int, shared: bool = True) -> float:
    """The builder's weight global scale."""
    return 1000.0 + 10 * layer + e + (0.5 if proj == "down_proj" else 0.0) \
        + (0.0 if shared or proj != "up_proj" else 3.0 + e % 3)


def test_clean_summary_rows_and_shared_finding(tmp_path):
    rep = audit_checkpoint(tiny(tmp_path))
    n = 3 * 4 * len(LAYERS)
    s = rep.input_scales
    assert {k: s[k] for k in ("nvfp4_modules", "expert_modules", "with_input_global_scale", "missing", "values_read",
                              "input_values", "input_nonfinite_or_nonpositive", "input_all_one")} == {
        "nvfp4_modules": n, "expert_modules": n, "with_input_global_scale": n, "missing": 0, "values_read": True,
        "input_values": {1.0: n}, "input_nonfinite_or_nonpositive": 0, "input_all_one": True}
    assert rep.gate_up == [{"layer": la, "expert": e, "gate_global_scale": wgs(la, "gate_proj", e),
                            "up_global_scale": wgs(la, "up_proj", e), "ratio_up_over_gate": 1.0, "up_scale_error": 0.0,
                            "shared": True, "allclose": True} for la in LAYERS for e in range(4)]
    assert rep.gate_up_summary == {"pairs": 12, "mismatched": 0, "not_allclose": 0, "max_abs_up_scale_error": 0.0,
                                   "median_abs_up_scale_error": 0.0, "distinct_expert_weight_scales": 24}
    f = one(rep, AuditCode.GATE_UP_SCALE_SHARED)
    assert (f.severity, f.message) == (Severity.INFO, "all 12 experts share one global scale for gate and up")
    for code in (AuditCode.GATE_UP_SCALE_MISMATCH, AuditCode.SCALES_ALL_IDENTICAL, AuditCode.F01_INPUT_SCALE_MISSING,
                 AuditCode.F01_INPUT_SCALE_NONFINITE, AuditCode.WEIGHT_SCALE_NONFINITE, AuditCode.SCALE_LAYOUT_INVALID,
                 AuditCode.INPUT_SCALE_UNEXPECTED, AuditCode.VALUES_NOT_READ):
        assert not by_code(rep, code), code


def test_header_only_mode_reads_no_value(tmp_path):
    rep = audit_checkpoint(tiny(tmp_path, share_gate_up=False, copied_scales=True), read_values=False)
    assert rep.input_scales["values_read"] is False and "input_values" not in rep.input_scales
    assert rep.gate_up == [] and rep.gate_up_summary == {"pairs": 0, "mismatched": 0}
    f = one(rep, AuditCode.VALUES_NOT_READ)
    assert f.severity == Severity.INFO and f.message == ("scale values not read (header-only mode): finiteness, "
                                                         "gate/up and copied-scale checks skipped")
    assert not by_code(rep, AuditCode.SCALES_ALL_IDENTICAL) and not by_code(rep, AuditCode.GATE_UP_SCALE_MISMATCH)


def test_f01_missing_w4a4_error_and_message_caps_at_four_layers(tmp_path, monkeypatch):
    monkeypatch.setattr(tca, "NL", 7)  # expert layers 1..6: six layers miss a scale, the message names four
    miss = {(la, "gate_proj"): [1] for la in range(1, 7)}
    miss[(2, "down_proj")] = [0, 1]
    rep = audit_checkpoint(tiny(tmp_path, experts=2, missing_input=miss))
    f = one(rep, AuditCode.F01_INPUT_SCALE_MISSING)
    det = {str(la): {"gate_proj": [1]} for la in range(1, 7)}
    det["2"] = {"down_proj": [0, 1], "gate_proj": [1]}
    assert f.severity == Severity.ERROR and f.layers == [1, 2, 3, 4, 5, 6] and f.details == {"missing": det}
    assert f.message == ("8 expert projections lack input_global_scale (W4A4 config: SGLang fills them from "
                         "torch.empty, NaN logits); layer 1: gate_proj [1]; layer 2: down_proj [0, 1], gate_proj [1]; "
                         "layer 3: gate_proj [1]; layer 4: gate_proj [1]")
    assert sorted(f.tensors) == sorted(f"model.layers.{la}.mlp.experts.{e}.{p}.input_global_scale"
                                       for (la, p), es in miss.items() for e in es)
    s = rep.input_scales
    assert (s["missing"], s["with_input_global_scale"], s["expert_modules"]) == (8, 6 * 6 - 8, 36)


def test_f01_missing_with_w4a16_is_a_warning_only_when_others_have_one(tmp_path):
    rep = audit_checkpoint(tiny(tmp_path, w4a4=False))  # no input scale anywhere: nothing to say
    assert not by_code(rep, AuditCode.F01_INPUT_SCALE_MISSING) and not by_code(rep, AuditCode.INPUT_SCALE_UNEXPECTED)
    assert rep.input_scales["missing"] == 36 and rep.input_scales["input_all_one"] is False
    assert rep.input_scales["input_values"] == {}


def test_w4a16_with_input_scales_warns_and_caps_the_list(tmp_path):
    """A W4A16 config whose experts carry input scales: INPUT_SCALE_UNEXPECTED (200 tensors named
    at most), and a missing one among them is F01 as a warning, 'inconsistent with the others'."""
    root = tiny(tmp_path, experts=23, missing_input={(3, "up_proj"): [22]})
    cfg = root / "config.json"
    cfg.write_text(cfg.read_text().replace('"input_activations": {', '"input_activations": null, "x": {'))
    rep = audit_checkpoint(root)
    f = one(rep, AuditCode.INPUT_SCALE_UNEXPECTED)
    assert f.severity == Severity.WARNING and f.message.startswith("206 input_global_scale tensors with a W4A16 config")
    assert len(f.tensors) == 200 and all(t.endswith(".input_global_scale") for t in f.tensors)
    assert f.message == ("206 input_global_scale tensors with a W4A16 config: SGLang's W4A16 Marlin scheme registers "
                         "them only for W4A4 checkpoints; its docstring says the expert loader raises KeyError for a "
                         "tensor with no destination (compressed_tensors_w4a16_nvfp4_moe.py 35-39)")
    m = one(rep, AuditCode.F01_INPUT_SCALE_MISSING)
    assert m.severity == Severity.WARNING and m.message.startswith(
        "1 expert projections lack input_global_scale (inconsistent with the others); layer 3: up_proj [22]")


@pytest.mark.parametrize("value", [0.0, -2.0, float("nan"), float("inf")])
def test_nonfinite_or_nonpositive_input_scale(tmp_path, value, monkeypatch):
    monkeypatch.setattr(tca, "NL", 7)
    bad = {(la, "up_proj", 1): value for la in range(1, 7)}
    bad[(2, "down_proj", 0)] = value
    rep = audit_checkpoint(tiny(tmp_path, experts=2, input_value=bad))
    f = one(rep, AuditCode.F01_INPUT_SCALE_NONFINITE)
    det = {str(la): {"up_proj": [1]} for la in range(1, 7)}
    det["2"] = {"up_proj": [1], "down_proj": [0]}
    assert f.severity == Severity.ERROR and f.layers == [1, 2, 3, 4, 5, 6] and f.details == {"nonfinite": det}
    assert f.message == ("7 input_global_scale values are 0, negative, NaN or inf (alpha = 1 / input_global_scale x "
                         "... becomes inf/NaN); layer 1: up_proj [1]; layer 2: down_proj [0], up_proj [1]; "
                         "layer 3: up_proj [1]; layer 4: up_proj [1]")
    assert sorted(f.tensors) == sorted(f"model.layers.{la}.mlp.experts.{e}.{p}.input_global_scale"
                                       for (la, p, e) in bad)
    s = rep.input_scales
    assert s["input_nonfinite_or_nonpositive"] == 7 and s["input_all_one"] is False
    finite = 36 - 7 + (7 if math.isfinite(value) else 0)
    assert s["input_values"] == ({1.0: 29, value: 7} if math.isfinite(value) else {1.0: 29})
    assert sum(s["input_values"].values()) == finite


def test_input_values_counts_the_five_most_common_and_all_one(tmp_path):
    vals = {(1, "gate_proj", e): 2.0 + e for e in range(4)}
    vals.update({(1, "up_proj", e): 2.0 for e in range(4)})
    vals.update({(2, "gate_proj", e): 7.0 for e in range(4)})
    rep = audit_checkpoint(tiny(tmp_path, input_value=vals))
    s = rep.input_scales
    assert s["input_values"] == {1.0: 24, 2.0: 5, 7.0: 4, 3.0: 1, 4.0: 1}  # 5.0 is sixth
    assert s["input_all_one"] is False and s["input_nonfinite_or_nonpositive"] == 0
    assert not by_code(rep, AuditCode.F01_INPUT_SCALE_NONFINITE)


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf")])
def test_nonfinite_weight_scale(tmp_path, value):
    bad = {(3, "down_proj", 2): value, (1, "gate_proj", 0): value}
    rep = audit_checkpoint(tiny(tmp_path, weight_value=bad))
    f = one(rep, AuditCode.WEIGHT_SCALE_NONFINITE)
    assert f.severity == Severity.ERROR and f.layers == [1, 3]
    assert f.message == "2 weight_global_scale values are 0, negative, NaN or inf"
    assert f.tensors == ["model.layers.1.mlp.experts.0.gate_proj.weight_global_scale",
                         "model.layers.3.mlp.experts.2.down_proj.weight_global_scale"]
    r = next(x for x in rep.gate_up if (x["layer"], x["expert"]) == (1, 0))
    assert r["gate_global_scale"] == value or math.isnan(value)
    if value == 0.0:
        assert math.isnan(r["ratio_up_over_gate"]) and math.isnan(r["up_scale_error"])
    else:
        assert r["ratio_up_over_gate"] == pytest.approx(1010.0 / value, nan_ok=True)
    # distinct finite expert scales: 24 written; 1032.5 (layer 3 expert 2's down) replaced (1010 stays on up_proj),
    # by a new finite value or by none
    assert rep.gate_up_summary["distinct_expert_weight_scales"] == (24 if math.isfinite(value) else 23)


def test_gate_up_mismatch_rows_summary_and_severity(tmp_path):
    rep = audit_checkpoint(tiny(tmp_path, share_gate_up=False))
    rows = {(r["layer"], r["expert"]): r for r in rep.gate_up}
    assert sorted(rows) == [(la, e) for la in LAYERS for e in range(4)]
    errs = []
    for (la, e), r in rows.items():
        g, u = wgs(la, "gate_proj", e), wgs(la, "up_proj", e, shared=False)
        assert (r["gate_global_scale"], r["up_global_scale"], r["shared"], r["allclose"]) == (g, u, False, False)
        assert r["ratio_up_over_gate"] == pytest.approx(u / g, rel=1e-12)
        assert r["up_scale_error"] == pytest.approx(u / g - 1, rel=1e-9)
        errs.append(abs(u / g - 1))
    errs.sort()
    gsum = rep.gate_up_summary
    assert {k: gsum[k] for k in ("pairs", "mismatched", "not_allclose")} == {"pairs": 12, "mismatched": 12,
                                                                             "not_allclose": 12}
    assert gsum["max_abs_up_scale_error"] == pytest.approx(errs[-1], rel=1e-9)
    assert gsum["median_abs_up_scale_error"] == pytest.approx(errs[6], rel=1e-9)  # upper median of 12
    assert gsum["distinct_expert_weight_scales"] == len({wgs(la, p, e, shared=False) for la in LAYERS for e in range(4)
                                                         for p in ("gate_proj", "up_proj", "down_proj")})
    f = one(rep, AuditCode.GATE_UP_SCALE_MISMATCH)
    assert f.severity == Severity.WARNING and f.layers == [1, 2, 3] and f.details == gsum
    assert f.message.startswith("12 of 12 experts have different gate and up weight_global_scale; SGLang's W4A4 "
                                "scheme uses the gate's for both (w4a4_nvfp4_moe.py 187-198), so up_proj is "
                                f"dequantized x up/gate (|error| median {errs[6]:.3g}, max {errs[-1]:.3g}); ")
    assert f.tensors == [f"model.layers.{la}.mlp.experts.{e}.up_proj.weight_global_scale"
                         for la in LAYERS for e in range(4)]
    assert not by_code(rep, AuditCode.GATE_UP_SCALE_SHARED)


def test_gate_up_within_allclose_still_counts_as_mismatched_and_w4a16_is_an_error(tmp_path):
    """up = gate x (1 + 5e-6) passes torch.allclose (atol 1e-8, rtol 1e-5 of up) but is not the
    same scale; x (1 + 2e-5) fails it. Under a W4A16 config a mismatch is an error."""
    near, far = wgs(2, "gate_proj", 1) * (1 + 5e-6), wgs(3, "gate_proj", 0) * (1 + 2e-5)
    root = tiny(tmp_path, weight_value={(2, "up_proj", 1): near, (3, "up_proj", 0): far})
    rep = audit_checkpoint(root)
    rows = {(r["layer"], r["expert"]): r for r in rep.gate_up}
    n32, f32 = float(torch.tensor(near, dtype=torch.float32)), float(torch.tensor(far, dtype=torch.float32))
    assert (rows[2, 1]["up_global_scale"], rows[2, 1]["shared"], rows[2, 1]["allclose"]) == (n32, False, True)
    assert (rows[3, 0]["shared"], rows[3, 0]["allclose"]) == (False, False)
    assert rows[1, 0]["allclose"] and rows[1, 0]["shared"]
    gsum = rep.gate_up_summary
    assert (gsum["mismatched"], gsum["not_allclose"]) == (2, 1)
    assert gsum["max_abs_up_scale_error"] == pytest.approx(f32 / wgs(3, "gate_proj", 0) - 1, rel=1e-6)
    assert gsum["median_abs_up_scale_error"] == 0.0
    f = one(rep, AuditCode.GATE_UP_SCALE_MISMATCH)
    assert f.severity == Severity.WARNING and f.layers == [2, 3] and f.message.startswith("2 of 12 experts")
    cfg = root / "config.json"
    cfg.write_text(cfg.read_text().replace('"input_activations": {', '"input_activations": null, "x": {'))
    assert one(audit_checkpoint(root), AuditCode.GATE_UP_SCALE_MISMATCH).severity == Severity.ERROR


def test_copied_scales_all_identical_and_per_layer(tmp_path):
    rep = audit_checkpoint(tiny(tmp_path, copied_scales=True))
    f = one(rep, AuditCode.SCALES_ALL_IDENTICAL)
    assert f.severity == Severity.WARNING and f.layers == [1, 2, 3]
    assert f.message == ("all 36 expert weight_global_scale values are 448.0: scales look copied, not computed per "
                         "tensor (2688 / amax)")
    assert rep.gate_up_summary["distinct_expert_weight_scales"] == 1
    # one layer copied (12 modules): named; the others differ
    same = {(2, p, e): 512.0 for p in ("gate_proj", "up_proj", "down_proj") for e in range(4)}
    rep = audit_checkpoint(tiny(tmp_path, weight_value=same, name="d"))
    f = one(rep, AuditCode.SCALES_ALL_IDENTICAL)
    assert f.severity == Severity.WARNING and f.layers == [2]
    assert f.message == "layers 2: every expert weight_global_scale in the layer is identical (copied-scale smell)"
    # one expert per layer: 3 modules a layer, too few to call a copy; a layer of 4 modules is enough
    rep = audit_checkpoint(tiny(tmp_path, experts=1, weight_value={(1, p, 0): 9.0 for p in
                                                                    ("gate_proj", "up_proj", "down_proj")}, name="e"))
    assert not by_code(rep, AuditCode.SCALES_ALL_IDENTICAL)


def test_one_expert_module_alone_is_not_all_identical(tmp_path, monkeypatch):
    """len(ev) > 1: a single expert scale is not 'all identical'; two equal ones are."""
    monkeypatch.setattr(tca, "NL", 2)  # expert layer 1 only
    root = tiny(tmp_path, experts=1, copied_scales=True)
    rep = audit_checkpoint(root)
    assert one(rep, AuditCode.SCALES_ALL_IDENTICAL).message.startswith("all 3 expert weight_global_scale values")
    # drop two of the three modules' scales' values to non-finite: one finite value is left
    rep = audit_checkpoint(tiny(tmp_path, experts=1, copied_scales=True, name="d",
                                weight_value={(1, "up_proj", 0): float("nan"), (1, "down_proj", 0): float("inf")}))
    assert not by_code(rep, AuditCode.SCALES_ALL_IDENTICAL)


def test_global_scale_layout_not_f32_scalar(tmp_path):
    root = tiny(tmp_path)
    shards = sorted(root.glob("*.safetensors"))
    # (a weight_global_scale not F32 [1] makes the module INVALID-PACKED, not NVFP4: the packed-layout check's)
    iname = "model.layers.3.mlp.experts.0.gate_proj.input_global_scale"
    hname = "model.layers.1.mlp.experts.3.down_proj.input_global_scale"
    for p in shards:
        t = load_file(str(p))
        if iname in t:
            t[iname] = torch.ones(2, dtype=torch.float32)
        if hname in t:
            t[hname] = t[hname].to(torch.float16)
        save_file(t, str(p), metadata={"format": "pt"})
    rep = audit_checkpoint(root)
    f = one(rep, AuditCode.SCALE_LAYOUT_INVALID)
    assert f.severity == Severity.ERROR and f.message == "2 global scales are not F32 [1]"
    assert sorted(f.tensors) == sorted([iname, hname]) and f.layers == [1, 3]


def test_mismatch_with_no_finite_error_is_reported_not_raised(tmp_path, monkeypatch):
    """Every differing gate/up pair has a NaN or zero scale, so no error is finite: the mismatch is
    still reported (the message said median/max with None and raised TypeError before issue 37)."""
    monkeypatch.setattr(tca, "NL", 2)  # one expert layer
    rep = audit_checkpoint(tiny(tmp_path, experts=1, weight_value={(1, "up_proj", 0): float("nan")}))
    f = one(rep, AuditCode.GATE_UP_SCALE_MISMATCH)
    assert f.message.startswith("1 of 1 experts have different gate and up weight_global_scale") \
        and "(|error| not finite)" in f.message
    g = rep.gate_up_summary
    assert (g["max_abs_up_scale_error"], g["median_abs_up_scale_error"]) == (None, None)
    assert one(rep, AuditCode.WEIGHT_SCALE_NONFINITE).tensors == ["model.layers.1.mlp.experts.0.up_proj.weight_global_scale"]


def test_f01_w4a4_with_no_input_scale_at_all_is_an_error(tmp_path):
    """A W4A4 config whose experts carry no input scale at all: every projection is named (the
    W4A16 case without any is silent: test_f01_missing_with_w4a16_...)."""
    every = {(la, p): list(range(2)) for la in LAYERS for p in ("gate_proj", "up_proj", "down_proj")}
    rep = audit_checkpoint(tiny(tmp_path, experts=2, missing_input=every))
    f = one(rep, AuditCode.F01_INPUT_SCALE_MISSING)
    assert f.severity == Severity.ERROR and len(f.tensors) == 18 and f.layers == [1, 2, 3]
    assert f.message.startswith("18 expert projections lack input_global_scale (W4A4 config: SGLang fills them "
                                "from torch.empty, NaN logits); layer 1: down_proj [0, 1], gate_proj [0, 1], "
                                "up_proj [0, 1]; ")
    assert rep.input_scales["with_input_global_scale"] == 0 and rep.input_scales["input_all_one"] is False


def unquantize(root, modules: dict[str, tuple[int, int]]) -> None:
    """Store the named expert projections as plain BF16 ``weight`` [out, in] (not NVFP4), in the
    shard that held them, and the index with them."""
    index = root / "model.safetensors.index.json"
    wmap = json.loads(index.read_text())
    for p in sorted(root.glob("*.safetensors")):
        t = load_file(str(p))
        mine = [m for m in modules if f"{m}.weight_packed" in t]
        for mod in mine:
            for k in ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"):
                t.pop(f"{mod}.{k}", None)
                wmap["weight_map"].pop(f"{mod}.{k}", None)
            t[f"{mod}.weight"] = torch.zeros(*modules[mod], dtype=torch.bfloat16)
            wmap["weight_map"][f"{mod}.weight"] = p.name
        if mine:
            save_file(t, str(p), metadata={"format": "pt"})
    index.write_text(json.dumps(wmap))


def test_pairs_need_both_gate_and_up_and_small_positive_scales_are_fine(tmp_path):
    """An expert whose up_proj is not NVFP4 has no gate/up pair (and nothing crashes); a weight
    scale of 0.5 is positive and finite, not a bad value; summary['implausible'] is
    check_scale_values' result; the mismatch message ends with the Marlin scheme's lines."""
    root = tiny(tmp_path, weight_value={(1, "down_proj", 3): 0.5}, share_gate_up=False)
    unquantize(root, {"model.layers.2.mlp.experts.1.up_proj": (16, 32)})
    rep = audit_checkpoint(root)
    assert sorted((r["layer"], r["expert"]) for r in rep.gate_up) == sorted(
        (la, e) for la in LAYERS for e in range(4) if (la, e) != (2, 1))
    assert not by_code(rep, AuditCode.WEIGHT_SCALE_NONFINITE)
    assert rep.input_scales["implausible"] == {"weight_global_scale": {}, "input_global_scale": {}}
    assert one(rep, AuditCode.GATE_UP_SCALE_MISMATCH).message.endswith(
        "; the W4A16 Marlin scheme refuses them (w4a16_nvfp4_moe.py 186-202)")


def test_two_equal_expert_scales_are_all_identical(tmp_path, monkeypatch):
    monkeypatch.setattr(tca, "NL", 2)  # expert layer 1 only, one expert: 3 modules
    rep = audit_checkpoint(tiny(tmp_path, experts=1, copied_scales=True, weight_value={(1, "up_proj", 0): float("nan")}))
    f = one(rep, AuditCode.SCALES_ALL_IDENTICAL)
    assert f.message.startswith("all 2 expert weight_global_scale values are 448.0: scales look copied")


def test_a_layer_of_four_equal_expert_scales_is_a_copy(tmp_path):
    """Four NVFP4 expert modules in a layer, all one scale: named (more than 3); the other layers
    differ."""
    same = {(2, p, e): 512.0 for p in ("gate_proj", "up_proj", "down_proj") for e in range(2)}
    root = tiny(tmp_path, experts=2, weight_value=same)
    unquantize(root, {"model.layers.2.mlp.experts.1.down_proj": (32, 16),
                      "model.layers.2.mlp.experts.0.down_proj": (32, 16)})
    f = one(audit_checkpoint(root), AuditCode.SCALES_ALL_IDENTICAL)
    assert f.layers == [2] and f.message.startswith("layers 2: every expert weight_global_scale in the layer")
