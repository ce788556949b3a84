"""Tests of the header audit (checkpoint.audit, checkpoint.header, checkpoint.quant_rules).

Fixtures are tiny quantized-layout checkpoints written by hand with safetensors + torch in the
Ling tensor naming: NVFP4 experts (``weight_packed`` U8 [out, in/2], ``weight_scale``
F8_E4M3 [out, in/16], ``weight_global_scale`` F32 [1], ``input_global_scale`` F32 [1]), BF16
everything else, a compressed-tensors ``quantization_config``. Each reported fault (docs/faults.md)
F-01..F-05 is one variant of the clean fixture; the builder counts what it writes, so counts are
checked against that count, not against the audit's own formula.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from nvfp4study.checkpoint import audit as ca
from nvfp4study.checkpoint import quant_rules as qr
from nvfp4study.checkpoint.audit import AuditCode, Severity, audit_checkpoint
from nvfp4study.checkpoint.header import read_shard_header
from nvfp4study.core.errors import (
    CheckpointConfigError,
    HeaderJSONInvalid,
    HeaderLengthBeyondFile,
    IndexShardMissing,
    IndexTensorMissing,
    QuantizationConfigMissing,
    ShardTruncated,
    UnknownDtype,
)

H, MI, E = 128, 64, 8  # hidden, moe intermediate, experts (Marlin-compatible sizes)
NL, DENSE, LG = 4, 1, 2  # layers 0-3 (MTP = 4), dense layer 0, MLA on layers 1 and 3


def card_ignore(mtp: int) -> list[str]:
    """The card-style ignore list: MTP layer first, then everything that stays BF16."""
    return [rf"re:.*layers\.{mtp}\..*", "lm_head", r"re:.*word_embeddings.*", r"re:.*attention\..*",
            r"re:.*shared_experts.*", r"re:.*mlp\.gate$", r"re:.*mlp\.(gate|up|down)_proj$", r"re:.*eh_proj$"]


W4A4_ACT = {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 16, "strategy": "tensor_group",
            "dynamic": "local", "observer": "static_minmax", "observer_kwargs": {},
            "scale_dtype": "torch.float8_e4m3fn", "zp_dtype": None, "actorder": None, "block_structure": None}
NVFP4_W = {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group", "group_size": 16,
           "dynamic": False, "scale_dtype": "torch.float8_e4m3fn"}


def nvfp4(out: int, inp: int, gs: float, *, input_scale: float | None = 1.0) -> dict[str, torch.Tensor]:
    t = {"weight_packed": torch.randint(0, 256, (out, inp // 2), dtype=torch.uint8),
         "weight_scale": torch.rand(out, inp // 16).to(torch.float8_e4m3fn),
         "weight_global_scale": torch.tensor([gs], dtype=torch.float32)}
    if input_scale is not None:
        t["input_global_scale"] = torch.tensor([input_scale], dtype=torch.float32)
    return t


def mxfp4(out: int, inp: int) -> dict[str, torch.Tensor]:
    return {"weight": torch.randint(0, 256, (out, inp // 2), dtype=torch.uint8),
            "weight_scale": torch.randint(100, 140, (out, inp // 32), dtype=torch.uint8)}


def bf16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).to(torch.bfloat16)


def build(root: Path, *, mtp: str = "bf16", ignore: list[str] | None = None, w4a4: bool = True,
          missing_input: dict[tuple[int, str], list[int]] | None = None,
          input_value: dict[tuple[int, str, int], float] | None = None, share_gate_up: bool = True,
          copied_scales: bool = False, routing: tuple[int, int, int, int] | None = None, shards: int = 2,
          index: bool = True, experts: int = E, hidden: int = H, moe_inter: int = MI,
          weight_value: dict[tuple[int, str, int], float] | None = None) -> dict:
    """Write a tiny quantized Ling-layout checkpoint; return what was written (independent counts).

    mtp: "bf16" (layer NL plain), "missing" (no layer NL), "nvfp4" or "mxfp4" (its experts packed).
    weight_value / input_value: (layer, proj, expert) -> the weight_global_scale / input_global_scale
    written there instead of the default (weight: 1000 + 10 x layer + expert, +0.5 for down_proj).
    """
    torch.manual_seed(0)
    root.mkdir(parents=True)
    H, MI, E = hidden, moe_inter, experts  # noqa: N806 (local sizes)
    t: dict[str, torch.Tensor] = {"model.word_embeddings.weight": bf16(64, H)}
    written = {"quantized_expert_modules": 0, "input_global_scales": 0, "mtp_tensors": 0, "mla_kv": 0}
    last = NL if mtp != "missing" else NL - 1
    for layer in range(last + 1):
        p = f"model.layers.{layer}."
        lt: dict[str, torch.Tensor] = {p + "input_layernorm.weight": bf16(H), p + "post_attention_layernorm.weight": bf16(H)}
        a = p + "attention."
        if layer >= NL or (layer + 1) % LG == 0:
            lt.update({a + "q_proj.weight": bf16(64, H), a + "kv_a_proj_with_mqa.weight": bf16(24, H),
                       a + "kv_a_layernorm.weight": bf16(16), a + "kv_b_proj.weight": bf16(64, 16),
                       a + "g_proj.weight": bf16(2, H), a + "dense.weight": bf16(H, 32)})
            written["mla_kv"] += 2
        else:
            lt.update({a + f"{x}_proj.weight": bf16(32, H) for x in "qkvfg"})
            lt.update({a + "b_proj.weight": bf16(2, H), a + "o_proj.weight": bf16(H, 32),
                       a + "q_conv1d.weight": bf16(32, 1, 4), a + "o_norm.weight": bf16(16),
                       a + "A_log": torch.rand(2), a + "dt_bias": torch.zeros(32)})
        m = p + "mlp."
        if layer < DENSE:
            lt.update({m + "gate_proj.weight": bf16(64, H), m + "up_proj.weight": bf16(64, H), m + "down_proj.weight": bf16(H, 64)})
        else:
            lt.update({m + "gate.weight": bf16(E, H), m + "gate.expert_bias": torch.zeros(E),
                       m + "shared_experts.gate_proj.weight": bf16(MI, H), m + "shared_experts.up_proj.weight": bf16(MI, H),
                       m + "shared_experts.down_proj.weight": bf16(H, MI)})
            for e in range(E):
                for proj, (o, i) in (("gate_proj", (MI, H)), ("up_proj", (MI, H)), ("down_proj", (H, MI))):
                    x = f"{m}experts.{e}.{proj}"
                    quant = layer < NL or mtp in ("nvfp4", "mxfp4")
                    if not quant:
                        lt[x + ".weight"] = bf16(o, i)
                        continue
                    if layer >= NL and mtp == "mxfp4":
                        lt.update({f"{x}.{k}": v for k, v in mxfp4(o, i).items()})
                        continue
                    gs = 1000.0 + 10 * layer + e + (0.0 if share_gate_up or proj != "up_proj" else 3.0 + e % 3)
                    if proj == "down_proj":
                        gs += 0.5
                    if copied_scales:
                        gs = 448.0
                    gs = (weight_value or {}).get((layer, proj, e), gs)
                    miss = e in (missing_input or {}).get((layer, proj), [])
                    val = (input_value or {}).get((layer, proj, e), 1.0)
                    lt.update({f"{x}.{k}": v for k, v in nvfp4(o, i, gs, input_scale=None if miss or not w4a4 else val).items()})
                    if layer < NL:
                        written["quantized_expert_modules"] += 1
                        written["input_global_scales"] += 0 if miss or not w4a4 else 1
        if layer >= NL:
            lt.update({p + "eh_proj.weight": bf16(H, 2 * H), p + "enorm.weight": bf16(H), p + "hnorm.weight": bf16(H),
                       p + "final_layernorm.weight": bf16(H)})
            written["mtp_tensors"] = len(lt)
        t.update(lt)
    t.update({"model.norm.weight": bf16(H), "lm_head.weight": bf16(64, H)})
    names = list(t)
    per = -(-len(names) // shards)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: t[n].contiguous() for n in names[s * per:(s + 1) * per]}
        save_file(part, str(root / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    if index:
        (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    ne, ng, tg, k = routing or (E, 4, 2, 4)
    cfg = {"architectures": ["BailingMoeV3ForCausalLM"], "model_type": "bailing_hybrid", "num_hidden_layers": NL,
           "hidden_size": H, "moe_intermediate_size": MI, "num_shared_experts": 1, "moe_shared_expert_intermediate_size": MI,
           "first_k_dense_replace": DENSE, "layer_group_size": LG, "num_experts": ne, "n_group": ng, "topk_group": tg,
           "num_experts_per_tok": k, "num_nextn_predict_layers": 1, "max_position_embeddings": 262144, "rope_scaling": None,
           "expert_swiglu_limit_list": [0, 0, 4, 4], "share_expert_swiglu_limit_list": [0, 5, 5, 7],
           "quantization_config": {
               "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "quantization_status": "compressed",
               "config_groups": {"NVFP4A16": {"targets": ["Linear"], "weights": NVFP4_W,
                                              "input_activations": W4A4_ACT if w4a4 else None}},
               "ignore": card_ignore(NL) if ignore is None else ignore}}
    (root / "config.json").write_text(json.dumps(cfg))
    written["tensors"] = len(t)
    return written


FAULTS = {c.value for c in ca.FAULT_CODES}


def codes(rep) -> set[str]:
    return rep.codes()


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    root = tmp_path_factory.mktemp("ck") / "clean"
    written = build(root)
    return root, written, audit_checkpoint(root)


# --- the clean checkpoint -----------------------------------------------------------------------
def test_clean_has_no_fault_and_no_error(clean):
    _, _, rep = clean
    assert not rep.fault_findings(), ca.format_findings(rep.fault_findings())
    assert not rep.errors, ca.format_findings(rep.errors)
    assert {AuditCode.CONFIG_W4A4.value, AuditCode.MTP_BF16_IGNORED.value, AuditCode.GATE_UP_SCALE_SHARED.value,
            AuditCode.ROUTING_WITHIN.value, AuditCode.SHARED_FUSION_VETOED.value} <= codes(rep)


def test_counts_match_what_was_written(clean):
    _, written, rep = clean
    m = rep.counts["measured"]
    assert m["quantized_expert_modules"] == written["quantized_expert_modules"] == 3 * E * (NL - DENSE)
    assert m["input_global_scales"] == written["input_global_scales"]
    assert m["mtp_layer_tensors"] == written["mtp_tensors"]
    assert m["mtp_packed_tensors"] == 0
    assert m["mla_kv_unpacked"] == written["mla_kv"]
    assert m["total_tensors"] == written["tensors"]
    f = rep.counts["formulas"]
    assert f["quantized_expert_modules"]["value"] == m["quantized_expert_modules"]
    assert f["mtp_layer_tensors"]["value"] == written["mtp_tensors"]


def test_formulas_give_the_card_numbers_on_the_real_config():
    real = {"num_hidden_layers": 42, "first_k_dense_replace": 2, "num_experts": 512, "layer_group_size": 6,
            "num_nextn_predict_layers": 1}
    f = ca.count_formulas(real, mtp_other_tensors=16)
    assert f["quantized_expert_modules"]["value"] == 61_440
    assert f["input_global_scales"]["value"] == 61_440
    assert f["mla_kv_unpacked"]["value"] == 16
    assert f["mtp_layer_tensors"]["value"] == 1_552


def test_precision_table_and_layer_counts(clean):
    _, _, rep = clean
    rows = {(r["component"], r["precision"]): r for r in rep.precision_table}
    assert rows[(ca.CARD_ROWS["routed_expert"], "NVFP4")]["modules"] == 3 * E * (NL - DENSE)
    assert rows[(ca.CARD_ROWS["routed_expert"], "NVFP4")]["layers"] == "1-3"
    assert (ca.CARD_ROWS["attention_proj"], "BF16") in rows
    assert (ca.CARD_ROWS["kda_misc"], "F32") in rows  # A_log / dt_bias written as F32
    mtp_rows = [r for r in rep.precision_table if r["component"].startswith(f"layer {NL}")]
    assert {r["precision"] for r in mtp_rows} <= {"BF16", "F32"}
    per = {r["layer"]: r for r in rep.layer_counts}
    assert per[1]["packed"] == 3 * E and per[1]["scale"] == 3 * 3 * E  # block, global, input scale
    assert per[NL]["packed"] == 0 and per[NL]["plain"] == per[NL]["tensors"]
    assert per[1]["attention"] == "MLA" and per[2]["attention"] == "KDA"


def test_engine_scheme_per_module(clean):
    _, _, rep = clean
    mods = rep.modules
    assert mods["model.layers.1.mlp.experts.3.up_proj"].engine == "NVFP4A16"
    assert mods["model.layers.1.attention.q_proj"].engine is None
    assert mods[f"model.layers.{NL}.mlp.experts.0.gate_proj"].engine is None
    assert mods["lm_head"].engine is None


def test_json_cli_and_exit_status(clean, capsys):
    root, _, _ = clean
    assert ca.main([str(root), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert all({"code", "severity", "tensors", "layers", "message"} <= set(f) for f in out)
    assert not FAULTS & {f["code"] for f in out}


def find(rep, code: AuditCode):
    hits = [f for f in rep.findings if f.code == code]
    assert hits, f"{code.value} not found; got {sorted(rep.codes())}"
    return hits[0]


def faults(rep) -> set[str]:
    return {f.code.value for f in rep.fault_findings()}


# --- F-01: missing / non-finite activation scales ---------------------------------------------------
def test_f01_missing_input_scales_named_per_layer_and_projection(tmp_path):
    miss = {(2, "gate_proj"): [40, 42, 82, 98], (2, "down_proj"): [82]}
    build(tmp_path / "c", experts=128, hidden=32, moe_inter=32, missing_input=miss, routing=(128, 8, 4, 8))
    rep = audit_checkpoint(tmp_path / "c")
    f = find(rep, AuditCode.F01_INPUT_SCALE_MISSING)
    assert f.severity == Severity.ERROR and f.layers == [2]
    assert f.details["missing"] == {"2": {"down_proj": [82], "gate_proj": [40, 42, 82, 98]}}
    assert "model.layers.2.mlp.experts.98.gate_proj.input_global_scale" in f.tensors and len(f.tensors) == 5
    assert faults(rep) == {AuditCode.F01_INPUT_SCALE_MISSING.value}
    assert ca.main([str(tmp_path / "c"), "--json"]) == 1


@pytest.mark.parametrize("value", [0.0, float("nan"), float("inf"), -1.0])
def test_f01_present_but_not_finite(tmp_path, value):
    build(tmp_path / "c", input_value={(3, "up_proj", 5): value, (1, "down_proj", 0): value})
    rep = audit_checkpoint(tmp_path / "c")
    f = find(rep, AuditCode.F01_INPUT_SCALE_NONFINITE)
    assert f.details["nonfinite"] == {"1": {"down_proj": [0]}, "3": {"up_proj": [5]}}
    assert faults(rep) == {AuditCode.F01_INPUT_SCALE_NONFINITE.value}
    assert rep.input_scales["input_all_one"] is False


# --- F-02: the MTP layer's three broken states, and the two good ones ------------------------------
def test_f02_mtp_layer_missing(tmp_path):
    build(tmp_path / "c", mtp="missing")
    rep = audit_checkpoint(tmp_path / "c")
    assert faults(rep) == {AuditCode.F02_MTP_MISSING.value}
    assert rep.mtp[0]["state"] == "missing" and rep.mtp[0]["tensors"] == 0


def test_f02_mtp_bf16_but_not_ignored(tmp_path):
    written = build(tmp_path / "c", ignore=card_ignore(NL)[1:])  # drop the layer-4 entry
    rep = audit_checkpoint(tmp_path / "c")
    f = find(rep, AuditCode.F02_MTP_BF16_NOT_IGNORED)
    assert f.layers == [NL] and faults(rep) == {AuditCode.F02_MTP_BF16_NOT_IGNORED.value}
    # every routed expert projection of layer 4 is named (3 x E); nothing else in layer 4 is targeted
    assert sorted(f.tensors) == sorted(f"model.layers.{NL}.mlp.experts.{e}.{p}" for e in range(E)
                                       for p in ("gate_proj", "up_proj", "down_proj"))
    assert rep.mtp[0]["state"] == "bf16-not-ignored" and rep.mtp[0]["tensors"] == written["mtp_tensors"]


def test_f02_mtp_packed_but_ignored(tmp_path):
    build(tmp_path / "c", mtp="nvfp4")
    rep = audit_checkpoint(tmp_path / "c")
    assert faults(rep) == {AuditCode.F02_MTP_PACKED_BUT_IGNORED.value}
    assert rep.mtp[0]["state"] == "packed-but-ignored" and rep.mtp[0]["packed_tensors"] == 3 * E * 4


def test_mtp_quantized_and_targeted_is_not_a_fault(tmp_path):
    build(tmp_path / "c", mtp="nvfp4", ignore=card_ignore(NL)[1:])
    rep = audit_checkpoint(tmp_path / "c")
    assert not faults(rep) and AuditCode.MTP_QUANTIZED.value in rep.codes()


# --- F-03: the draft in MXFP4, the trunk in NVFP4 ---------------------------------------------------
def test_f03_mtp_mxfp4_trunk_nvfp4(tmp_path):
    build(tmp_path / "c", mtp="mxfp4", ignore=card_ignore(NL)[1:], hidden=64, moe_inter=64)
    rep = audit_checkpoint(tmp_path / "c")
    f = find(rep, AuditCode.F03_MTP_FORMAT_DIFFERS)
    assert f.details["formats"] == {"MXFP4": 3 * E} and f.layers == [NL]
    assert faults(rep) == {AuditCode.F03_MTP_FORMAT_DIFFERS.value}
    assert rep.config_summary["trunk_expert_format"] == "NVFP4"


def test_f03_with_layer_ignored_also_gives_f02_iii(tmp_path):
    build(tmp_path / "c", mtp="mxfp4", hidden=64, moe_inter=64)
    rep = audit_checkpoint(tmp_path / "c")
    assert faults(rep) == {AuditCode.F03_MTP_FORMAT_DIFFERS.value, AuditCode.F02_MTP_PACKED_BUT_IGNORED.value}


# --- F-04: W4A16 vs W4A4 config, and who serves which -------------------------------------------------
def test_f04_weight_only_config(tmp_path):
    build(tmp_path / "c", w4a4=False)
    rep = audit_checkpoint(tmp_path / "c")
    assert faults(rep) == {AuditCode.F04_CONFIG_W4A16.value}
    assert rep.config_summary["scheme"] == "W4A16"
    m = {(r["version"], r["gpu"][:3]): r["outcome"] for r in rep.serving}
    assert m[("0.5.20", "Bla")] == m[("0.5.21", "Hop")] == "crash"
    assert m[("0.5.22", "Hop")] == m[("0.5.23", "Bla")] == m[("0.5.23", "Amp")] == "serves"


def test_f04_w4a4_config_serving(clean):
    _, _, rep = clean
    assert rep.config_summary["scheme"] == "W4A4"
    m = {(r["version"], r["gpu"][:3]): (r["outcome"], r["path"]) for r in rep.serving}
    assert m[("0.5.20", "Bla")] == ("serves", "CompressedTensorsW4A4Nvfp4MoE")
    assert m[("0.5.21", "Hop")][0] == "refused"
    assert m[("0.5.23", "Hop")] == ("serves", "CompressedTensorsW4A16Nvfp4MoE (fallback)")


def test_f04_w4a16_with_unshared_scales_is_refused_everywhere(tmp_path):
    build(tmp_path / "c", w4a4=False, share_gate_up=False)
    rep = audit_checkpoint(tmp_path / "c")
    assert {r["outcome"] for r in rep.serving} == {"crash", "refused"}
    assert find(rep, AuditCode.GATE_UP_SCALE_MISMATCH).severity == Severity.ERROR


# --- F-05: routing shapes ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape, code", [((512, 8, 4, 8), AuditCode.F05_ROUTING_OVER_LIMIT),
                                         ((256, 8, 4, 8), AuditCode.F05_ROUTING_AT_LIMIT),
                                         ((16, 8, 1, 8), AuditCode.F05_ROUTING_INVALID)])
def test_f05_routing_shapes(tmp_path, shape, code):
    build(tmp_path / "c", experts=shape[0], routing=shape, hidden=32, moe_inter=32, shards=1)
    rep = audit_checkpoint(tmp_path / "c")
    assert faults(rep) == {code.value}
    assert rep.routing["experts_per_group"] == shape[0] / shape[1]


def test_routing_rule_by_hand():
    over = qr.check_routing(512, 8, 4, 8)
    assert over.status == "over" and over.experts_per_group == 64 and over.candidates == 256
    at = qr.check_routing(256, 8, 4, 8)
    assert at.status == "at" and at.experts_per_group == 32 and at.candidates == 128
    bad = qr.check_routing(16, 8, 1, 8)
    assert bad.status == "invalid" and bad.candidates == 2
    assert qr.check_routing(16, 4, 2, 4).status == "within"
    assert qr.check_routing(96, 8, 4, 8).status == "within"  # 12 per group, 48 candidates
    assert qr.check_routing(64, 2, 2, 8).status == "at"  # 32 per group
    assert qr.check_routing(10, 3, 2, 2).status == "invalid"  # 10 experts do not divide into 3 groups


# --- gate/up scales and copied scales -----------------------------------------------------------------
def test_gate_up_mismatch_and_up_scale_error(tmp_path):
    build(tmp_path / "c", share_gate_up=False)
    rep = audit_checkpoint(tmp_path / "c")
    f = find(rep, AuditCode.GATE_UP_SCALE_MISMATCH)
    assert f.severity == Severity.WARNING  # W4A4: SGLang logs and uses the gate's scale
    assert len(rep.gate_up) == (NL - DENSE) * E and rep.gate_up_summary["mismatched"] == (NL - DENSE) * E
    r = next(x for x in rep.gate_up if x["layer"] == 2 and x["expert"] == 4)
    gate, up = 1000.0 + 20 + 4, 1000.0 + 20 + 4 + 3.0 + 4 % 3  # the builder's formula
    assert r["gate_global_scale"] == gate and r["up_global_scale"] == up
    assert r["up_scale_error"] == pytest.approx(up / gate - 1, rel=1e-6)
    assert not faults(rep)


def test_copied_scales(tmp_path):
    build(tmp_path / "c", copied_scales=True)
    rep = audit_checkpoint(tmp_path / "c")
    f = find(rep, AuditCode.SCALES_ALL_IDENTICAL)
    assert "448.0" in f.message and f.severity == Severity.WARNING


def test_figures(clean, tmp_path):
    _, _, rep = clean
    a = ca.plot_layer_heatmap(rep, tmp_path / "heat.png")
    b = ca.plot_up_scale_error(rep, tmp_path / "hist.png")
    assert a.stat().st_size > 1000 and b.stat().st_size > 1000


# --- matching semantics against the installed compressed-tensors --------------------------------------
NAMES = ["model.layers.42.mlp.experts.0.gate_proj", "model.layers.4.attention.q_proj", "lm_head",
         "model.layers.1.mlp.gate", "model.layers.12.mlp.shared_experts.up_proj", "model.layers.2.mlp.gate_proj"]
TARGETS = [r"re:.*layers\.42\..*", r"re:layers\.4", r"re:.*mlp\.gate$", "lm_head", "q_proj",
           r"re:.*shared_experts.*", r"re:.*mlp\.(gate|up|down)_proj$", "Linear", "re:model"]


def test_ct_match_name_equals_compressed_tensors():
    from compressed_tensors.utils.match import match_name

    for n in NAMES:
        for t in TARGETS:
            assert qr.ct_match_name(n, t) == match_name(n, t), (n, t)


def test_ct_is_match_equals_compressed_tensors_on_a_linear():
    from compressed_tensors.utils.match import is_match

    lin = torch.nn.Linear(2, 2)
    for n in NAMES:
        for t in TARGETS:
            assert qr.ct_is_match(n, ("Linear",), t) == is_match(n, lin, t), (n, t)


def test_sglang_ignore_suffix_rule_differs_from_compressed_tensors():
    # SGLang utils.py 79-100: a plain entry matches a dotted suffix; compressed-tensors needs equality
    assert qr.sglang_ignore_match("model.layers.4.attention.q_proj", "attention.q_proj")
    assert not qr.ct_match_name("model.layers.4.attention.q_proj", "attention.q_proj")
    assert not qr.sglang_ignore_match("model.layers.0.mlp.experts.0.gate_proj", "model.layers.0.mlp.experts.0")


def test_suffix_ignore_reported_as_semantics_difference(tmp_path):
    ign = [i for i in card_ignore(NL) if "shared" not in i] + ["shared_experts.gate_proj", "shared_experts.up_proj",
                                                              "shared_experts.down_proj"]
    build(tmp_path / "c", ignore=ign)
    rep = audit_checkpoint(tmp_path / "c")
    f = find(rep, AuditCode.IGNORE_SEMANTICS_DIFFER)
    assert "model.layers.1.mlp.shared_experts.gate_proj" in f.tensors and not rep.errors


# --- bad input: each a named error that names the file --------------------------------------------------
@pytest.fixture
def small(tmp_path):
    root = tmp_path / "c"
    build(root, shards=2)
    return root


def shard(root: Path, i: int = 1) -> Path:
    return root / f"model-{i:05d}-of-00002.safetensors"


def expect(exc_type, root, path):
    with pytest.raises(exc_type) as ei:
        audit_checkpoint(root)
    assert str(path) in str(ei.value)
    return ei.value


def test_truncated_shard(small):
    p = shard(small, 2)
    p.write_bytes(p.read_bytes()[:-100])
    expect(ShardTruncated, small, p)
    p.write_bytes(b"\x01\x02")
    expect(ShardTruncated, small, p)


def test_header_length_beyond_file(small):
    p = shard(small)
    data = bytearray(p.read_bytes())
    data[:8] = struct.pack("<Q", len(data) + 10)
    p.write_bytes(bytes(data))
    expect(HeaderLengthBeyondFile, small, p)


def test_invalid_header_json(small):
    p = shard(small)
    data = bytearray(p.read_bytes())
    data[8:20] = b"{not json!!!"
    p.write_bytes(bytes(data))
    expect(HeaderJSONInvalid, small, p)


def _rewrite_header(p: Path, edit) -> None:
    data = p.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    edit(header)
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    p.write_bytes(struct.pack("<Q", len(blob)) + blob + data[8 + n:])


def test_unknown_dtype(small):
    p = shard(small)
    _rewrite_header(p, lambda h: h["model.word_embeddings.weight"].update(dtype="F7_E3M3"))
    err = expect(UnknownDtype, small, p)
    assert "F7_E3M3" in str(err) and "model.word_embeddings.weight" in str(err)


def test_offsets_not_matching_shape(small):
    p = shard(small)
    _rewrite_header(p, lambda h: h["model.word_embeddings.weight"].update(shape=[3, 3]))
    expect(HeaderJSONInvalid, small, p)


def test_index_names_missing_shard(small):
    shard(small, 2).rename(small / "elsewhere.bin")
    expect(IndexShardMissing, small, small / "model.safetensors.index.json")


def test_index_names_missing_tensor(small):
    idx = small / "model.safetensors.index.json"
    data = json.loads(idx.read_text())
    data["weight_map"]["model.layers.9.ghost.weight"] = shard(small).name
    idx.write_text(json.dumps(data))
    err = expect(IndexTensorMissing, small, idx)
    assert "model.layers.9.ghost.weight" in str(err)


def test_config_without_quantization_config(small):
    cfg = json.loads((small / "config.json").read_text())
    del cfg["quantization_config"]
    (small / "config.json").write_text(json.dumps(cfg))
    expect(QuantizationConfigMissing, small, small / "config.json")
    cfg["quantization_config"] = {"quant_method": "compressed-tensors"}
    del cfg["num_experts"]
    (small / "config.json").write_text(json.dumps(cfg))
    expect(CheckpointConfigError, small, small / "config.json")
    (small / "config.json").write_text("[1, 2]")
    expect(CheckpointConfigError, small, small / "config.json")
    (small / "config.json").unlink()
    expect(CheckpointConfigError, small, small / "config.json")


def test_cli_error_is_one_line_exit_2(small, capsys):
    from nvfp4study.cli import main as cli_main

    (small / "config.json").write_text("{}")
    assert cli_main(["audit-checkpoint", str(small)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "QuantizationConfigMissing" in err[0] and "config.json" in err[0]


def test_header_only_shards(tmp_path):
    # a header-only layout: data sections absent; accepted only with allow_missing_data
    root = tmp_path / "c"
    build(root, shards=1, index=False)
    p = root / "model-00001-of-00001.safetensors"
    (n,) = struct.unpack("<Q", p.read_bytes()[:8])
    p.write_bytes(p.read_bytes()[:8 + n])
    with pytest.raises(ShardTruncated):
        audit_checkpoint(root)
    rep = audit_checkpoint(root, allow_missing_data=True)
    assert AuditCode.VALUES_NOT_READ.value in rep.codes() and not rep.size["data_complete"]
    assert rep.counts["measured"]["quantized_expert_modules"] == 3 * E * (NL - DENSE)
    assert read_shard_header(p, allow_missing_data=True).data_complete is False


def test_compiled_ignore_list_equals_entry_by_entry():
    from compressed_tensors.utils.match import match_name

    lst = qr.IgnoreList(TARGETS)
    for n in NAMES + ["model.layers.4", "layers.4.x", "q_proj"]:
        assert lst.ct(n) == any(match_name(n, t) for t in TARGETS), n
        assert lst.sglang(n) == any(qr.sglang_ignore_match(n, t) for t in TARGETS), n
    assert qr.IgnoreList(["re:(a)\\1", "re:b"]).ct("aa")  # backreference: falls back to one regex each


# --- on checkpoints made by the study's own generator and quantizer --------------------------------------
@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    from nvfp4study.checkpoint import generate, quantize
    from nvfp4study.checkpoint import layout as ling_layout
    from nvfp4study.core.params import load_params

    p = load_params()
    base = tmp_path_factory.mktemp("gen")
    src = generate.write_checkpoint(p.checkpoint.shape, base / "bf16", shards=p.checkpoint.shards, seed=0)
    out = {}
    for share in (True, False):
        dst = base / f"nvfp4-share={share}"
        quantize.quantize_checkpoint(src, dst, p.quantize.model_copy(update={"share_gate_up_global_scale": share}))
        out[share] = dst
    return p.checkpoint.shape, ling_layout, out


def test_generated_and_quantized_checkpoint_is_clean(generated):
    shape, ling_layout, out = generated
    rep = audit_checkpoint(out[True])
    assert not rep.fault_findings() and not rep.errors, ca.format_findings(rep.findings)
    for r in (rep, audit_checkpoint(out[False])):  # the project's own quantizer: plausible scales
        assert AuditCode.SCALE_VALUE_IMPLAUSIBLE.value not in r.codes(), ca.format_findings(r.findings)
        assert r.input_scales["values_read"] and r.input_scales["input_all_one"]
    want = ling_layout.count_formulas(shape)  # the generator's own closed forms
    m = rep.counts["measured"]
    assert m["quantized_expert_modules"] == want["routed_expert_projections"]["value"]
    assert m["mtp_layer_tensors"] == want["mtp_layer_tensors"]["value"]
    # independent count straight from the headers: weight_packed of routed experts below the MTP layer
    packed = [n for _, n, _, _ in ling_layout.iter_header_specs(out[True])
              if ".mlp.experts." in n and n.endswith(".weight_packed") and int(n.split(".")[2]) < shape.num_hidden_layers]
    assert len(packed) == m["quantized_expert_modules"] == m["input_global_scales"]


def test_card_style_quantization_has_gate_up_mismatch(generated):
    _, _, out = generated
    rep = audit_checkpoint(out[False])
    f = find(rep, AuditCode.GATE_UP_SCALE_MISMATCH)
    assert f.severity == Severity.WARNING and rep.gate_up_summary["mismatched"] > 0
    assert not rep.fault_findings()


@pytest.mark.slow
def test_full_size_header_only_layout_counts(tmp_path):
    from nvfp4study.checkpoint import generate
    from nvfp4study.core.params import LingShape

    root = generate.write_checkpoint(LingShape(), tmp_path / "full", shards=16, header_only=True, layout="nvfp4")
    rep = audit_checkpoint(root)
    m = rep.counts["measured"]
    assert m["quantized_expert_modules"] == 61_440 == m["input_global_scales"]
    assert m["mla_kv_unpacked"] == 16
    assert rep.mtp[0]["layer"] == 42 and rep.mtp[0]["packed_tensors"] == 0
    assert rep.routing["status"] == "over" and AuditCode.F05_ROUTING_OVER_LIMIT.value in rep.codes()


def test_shared_fusion_veto_rule():
    from nvfp4study.checkpoint.check_config import check_shared_fusion

    cfg = {"num_shared_experts": 1, "moe_shared_expert_intermediate_size": 768, "moe_intermediate_size": 768}
    out: list = []
    assert check_shared_fusion(cfg, card_ignore(42), out)["vetoed"] and out[-1].code == AuditCode.SHARED_FUSION_VETOED
    no_shared_ignore = [i for i in card_ignore(42) if "shared" not in i]
    assert not check_shared_fusion(cfg, no_shared_ignore, out)["vetoed"] and out[-1].code == AuditCode.SHARED_FUSION_ON
    assert check_shared_fusion(cfg | {"moe_shared_expert_intermediate_size": 512}, no_shared_ignore, out)["vetoed"]
    assert check_shared_fusion({"num_shared_experts": 0}, [], out) == {"applies": False}


# --- the stage helpers behind notebooks/02_inspect_checkpoint ------------------------------------------
def test_stage_records_every_claim(tmp_path, clean):
    import pandas as pd

    from nvfp4study.core.errors import StageInputMissing
    from nvfp4study.core.ledger import claims_for_stage, read_ledger
    from nvfp4study.core.stage import open_stage
    from nvfp4study.stages import s02_inspect as ins

    stage = open_stage("02_inspect_checkpoint", "", str(tmp_path / "run"))
    with pytest.raises(StageInputMissing):
        ins.resolve_checkpoint(stage)
    root, _, _ = clean
    stage.paths.data("quantize", "json").write_text(json.dumps({"quantized": str(root), "random_weights": True}))
    ck = ins.resolve_checkpoint(stage)
    rep = ins.run_audit(stage, ck)
    assert stage.paths.data("checkpoint_audit", "json").is_file()
    tensors = pd.read_parquet(stage.paths.data("checkpoint-tensors", "parquet"))
    assert len(tensors) == rep.counts["measured"]["total_tensors"]
    ins.record_ledger(stage, rep, ck, ins.unshared_up_error(stage))
    rows = {r["id"]: r for r in read_ledger(stage.run_dir)}
    for cid in claims_for_stage("02_inspect_checkpoint"):
        assert rows[cid]["note"] != "stage did not run", cid
    # scaled, random: counts are "partly" (formula), never "reproduced" against the card
    assert rows["counts.quantized-experts"]["verdict"] == "partly"
    assert rows["counts.quantized-experts"]["measured"]["count"] == 3 * E * (NL - DENSE)
    assert rows["config.clamp-lists"]["verdict"] == "not run"
    assert rows["audit.fault-verdicts"]["verdict"] == "reproduced"


def _audited_stage(tmp_path, clean):
    from nvfp4study.core.stage import open_stage
    from nvfp4study.stages import s02_inspect as ins

    stage = open_stage("02_inspect_checkpoint", "", str(tmp_path / "run"))
    root, _, _ = clean
    stage.paths.data("quantize", "json").write_text(json.dumps({"quantized": str(root), "random_weights": True}))
    ck = ins.resolve_checkpoint(stage)
    return ins, stage, ck, ins.run_audit(stage, ck)


def _record(ins, stage, ck, rep):
    from nvfp4study.core.ledger import read_ledger

    ins.record_ledger(stage, rep, ck, {"run": False})
    return {r["id"]: r for r in read_ledger(stage.run_dir)}


def test_stage_size_disk_verdict_follows_the_numbers(tmp_path, clean):
    ins, stage, ck, rep = _audited_stage(tmp_path, clean)
    s = rep.extra["size"]
    # the builder here is not the params' shape: the prediction for the params' shape cannot match
    rows = _record(ins, stage, ck, rep)
    assert not rows["size.disk"]["measured"]["prediction_matches_scaled_tensor_bytes"]
    assert rows["size.disk"]["verdict"] == "contradicted"
    s["predicted_data_bytes_params_shape"] = s["data_bytes"]
    for real_bytes, verdict, word in ((76 * 2**30, "partly", "as GiB"), (76_200_000_000, "partly", "as GB"),
                                      (80 * 2**30, "contradicted", "neither in GB nor in GiB")):
        s["predicted_data_bytes_real_sizes"] = real_bytes
        row = _record(ins, stage, ck, rep)["size.disk"]
        assert row["verdict"] == verdict and word in row["note"], (real_bytes, row)
        assert f"{real_bytes / 1e9:.1f} GB" in row["note"]


def test_stage_input_scale_dtype_read_from_headers(tmp_path, clean):
    ins, stage, ck, rep = _audited_stage(tmp_path, clean)
    rows = _record(ins, stage, ck, rep)
    n = 3 * E * (NL - DENSE)
    assert rows["scales.input-global-scale"]["measured"]["dtypes"] == {"F32": n}
    assert rows["scales.input-global-scale"]["verdict"] == "partly"
    first = next(m for m in rep.modules.values() if "input_global_scale" in m.params)
    t = first.params["input_global_scale"]
    first.params["input_global_scale"] = t._replace(dtype="BF16")  # what a header saying BF16 would give
    row = _record(ins, stage, ck, rep)["scales.input-global-scale"]
    assert row["measured"]["dtypes"] == {"F32": n - 1, "BF16": 1} and row["verdict"] == "contradicted"


def test_stage_generated_checkpoint_config_claims_not_run_even_at_real_sizes(tmp_path, clean):
    ins, stage, ck, rep = _audited_stage(tmp_path, clean)
    rep.extra["real_size_config"] = True  # as if the generator had written the real sizes
    rows = _record(ins, stage, ck, rep)
    for cid in ("config.clamp-lists", "config.context"):
        assert rows[cid]["verdict"] == "not run" and "generated checkpoint" in rows[cid]["note"], rows[cid]
    routing = rows["clamp.trtllm-routing"]
    assert set(routing["measured"]) == {"audited"} and "512 / 8 = 64" in routing["note"]
