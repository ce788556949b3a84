"""Stage 02's claim rules (``stages/claim_rules/r02_inspect.py``) row by row, every field, on
hand-made audit reports (issue 37's mutation benchmark; the stage's tests build checkpoints, too
slow for it): each verdict's edges on both sides, the real / scaled / card's-own variants of every
note, each refusal. Expected notes are written out here."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from nvfp4study.checkpoint.audit import CARD_ROWS
from nvfp4study.core.claim_rules import Row
from nvfp4study.stages.claim_rules import r02_inspect as r02

CARD = {"size.disk": {"disk_gb": 76}, "mtp.layer42-bf16": {"layer": 42, "packed": 0, "plain": 1552},
        "counts.quantized-experts": {"quantized_expert_tensors": 61440}, "counts.mla-unpacked": {"mla_unpacked": 16},
        "scales.input-global-scale": {"count": 61440, "dtype": "float32", "value": 1.0},
        "config.context": {"max_position_embeddings": 262144, "rope_scaling": None}}
FILES = {"audit": "data/audit.json", "tensors": "data/tensors.parquet", "heatmap": "figures/heat.png",
         "up_error": "data/up.parquet"}
SCOPE = "SCOPE"
ON = "audit of ck"
SCALED = ("the study's SCALED checkpoint with RANDOM weights, quantized with the card's recipe; reproduced in structure "
          "only")


def finding(code: str, sev: str = "warning") -> NS:
    return NS(code=NS(value=code), severity=NS(value=sev))


def report(findings=(), errors=(), **over) -> NS:
    f = {"extra": {"files": FILES, "real_size_config": False}, "config_summary": {"num_hidden_layers": 4, "groups": []},
         "precision_table": [], "modules": {}, "mtp": [], "counts": {"measured": {}, "formulas": {}},
         "input_scales": {}, "routing": {}, "gate_up_summary": {}, "findings": list(findings) + list(errors),
         "errors": list(errors)}
    f.update(over)
    faults = [x for x in f["findings"] if x.code.value.startswith("F0")]
    return NS(fault_findings=lambda: faults, **f)


def meas(rep=None, real=False, rnd=True, ck=None, card=None) -> r02.InspectMeasurements:
    return r02.InspectMeasurements(rep or report(), ck or {"path": "ck"}, real, rnd, SCOPE, ON, card or CARD)


# --- audit_scope and the measurements -------------------------------------------------------------
def test_audit_scope(tmp_path):
    run = tmp_path / "run"
    rep = report()
    assert r02.audit_scope(run, rep, {"path": str(run / "work" / "ck")}) == (False, False, SCALED, "audit of work/ck")
    assert r02.audit_scope(run, rep, {"path": str(tmp_path / "ck")}) == (False, False, SCALED,
                                                                           f"audit of {tmp_path / 'ck'}")
    real = report(extra={"real_size_config": True})
    assert r02.audit_scope(run, real, {"path": "ck"}) == (True, False, "the audited checkpoint at the real sizes",
                                                          "audit of ck")
    assert r02.audit_scope(run, real, {"path": "ck", "random_weights": True}) == (
        True, True, "the audited checkpoint at the real sizes (random weights)", "audit of ck")
    rnd = report(config_summary={"random_weights": True})
    assert r02.audit_scope(run, rnd, {"path": "ck"})[:2] == (False, True)
    assert r02.audit_scope(run, rep, {"path": "ck", "card": True, "checked_on": "hub rev 1"}) == (
        True, False, "the card's own checkpoint, hub rev 1", "hub rev 1")
    assert r02.audit_scope(run, rep, {"path": "ck", "checked_on": ""})[3] == "audit of ck"


def test_gather_and_properties(tmp_path):
    counts = {"measured": {"a": 1}, "formulas": {"b": 2}}
    extra = {"files": FILES, "real_size_config": True, "counts": {"formulas_real_sizes": {"c": 3}}}
    rep = report(extra=extra, counts=counts, config_summary={"num_hidden_layers": 7, "groups": [{"g": 1}]})
    x = r02.InspectMeasurements.gather(tmp_path, rep, {"path": "ck"})
    assert (x.rep, x.ck, x.real, x.rnd, x.scope, x.checked) == (
        rep, {"path": "ck"}, True, False, "the audited checkpoint at the real sizes", "audit of ck")
    assert x.card["size.disk"] == {"disk_gb": 76} and x.card["mtp.layer42-bf16"]["plain"] == 1552
    assert x.data is extra and x.ev == "data/audit.json" and x.ev_t == "data/tensors.parquet" and x.nl == 7
    assert x.counts == ({"a": 1}, {"b": 2}, {"c": 3}) and x.groups == [{"g": 1}]


# --- size.disk ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fb,verdict", [
    (76.49e9, "reproduced"), (75.5e9, "reproduced"), (76.51e9, "contradicted"), (75.49e9, "contradicted"),
    (76 * 2**30, "reproduced"), (75.51 * 2**30, "reproduced"), (76.51 * 2**30, "contradicted"),
])
def test_size_disk_real_files(fb, verdict):
    rep = report(extra={"files": FILES, "size": {"file_bytes": fb}})
    assert r02.size_disk(meas(rep, real=True)) == Row(
        {"disk_gb": round(fb / 1e9, 2), "disk_gib": round(fb / 2**30, 2)}, verdict, ["data/audit.json"],
        "sum of shard file sizes (GB = 1e9 bytes; GiB = 2^30 bytes)", ON)


def size_rep(pred_p, pred_r, data=1_234_567, fb=2_345_678) -> NS:
    s = {"file_bytes": fb, "data_bytes": data}
    if pred_p is not None:
        s["predicted_data_bytes_params_shape"] = pred_p
    s["predicted_data_bytes_real_sizes"] = pred_r
    return report(extra={"files": FILES, "size": s})


def size_note(gb, gib, rounds, eq, pred_p="1,234,567") -> str:
    return ("Not measured on the real files. The NVFP4+serving layout's tensor bytes (experts U8 [o,i/2] + F8_E4M3 "
            f"[o,i/16] + 2 F32 scales, rest BF16/F32) predict {gb} GB = {gib} GiB at the real sizes (arithmetic on "
            f"LingShape defaults; headers add a few MB), which {rounds}The same prediction for this run's shape {eq} "
            f"the audited checkpoint's tensor bytes ({pred_p} vs 1,234,567).")


def test_size_disk_scaled_row_in_full():
    assert r02.size_disk(meas(size_rep(1_234_567, 76.2e9))) == Row(
        {"scaled_checkpoint_mb": 2.35, "scaled_tensor_bytes": 1_234_567, "predicted_scaled_tensor_bytes": 1_234_567,
         "prediction_matches_scaled_tensor_bytes": True}, "partly", ["data/audit.json"],
        size_note("76.2", "71.0", "rounds to the card's 76 when read as GB. ", "equals"), ON)


def test_size_disk_scaled_variants():
    # 76.25000005 GB prints 76.3 (76.2 were it divided by 1e9 + 1); 1e10 bytes are 10000.0 MB (not 9999.99)
    fine = r02.size_disk(meas(size_rep(1_234_567, 76_250_000_050, fb=10**10)))
    assert fine.measured["scaled_checkpoint_mb"] == 10000.0
    assert fine.note == size_note("76.3", "71.0", "rounds to the card's 76 when read as GB. ", "equals")
    gib = r02.size_disk(meas(size_rep(1_234_567, 76 * 2**30)))
    assert gib.verdict == "partly"
    assert gib.note == size_note("81.6", "76.0", "rounds to the card's 76 when read as GiB. ", "equals")
    both = r02.size_disk(meas(size_rep(1_234_567, 1.0e9), card={**CARD, "size.disk": {"disk_gb": 1}}))
    assert both.verdict == "partly"
    assert both.note == size_note("1.0", "0.9", "rounds to the card's 1 when read as GB or GiB. ", "equals")
    neither = r02.size_disk(meas(size_rep(1_234_567, 80e9)))
    assert neither.verdict == "contradicted"
    assert neither.note == size_note("80.0", "74.5", "rounds to the card's 76 neither in GB nor in GiB. ", "equals")
    off = r02.size_disk(meas(size_rep(1_234_568, 76.2e9)))
    assert off.verdict == "contradicted" and off.measured["prediction_matches_scaled_tensor_bytes"] is False
    assert off.measured["predicted_scaled_tensor_bytes"] == 1_234_568
    assert off.note == size_note("76.2", "71.0", "rounds to the card's 76 when read as GB. ", "does NOT equal",
                                 "1,234,568")


# --- the layout claims ------------------------------------------------------------------------------
RE = CARD_ROWS["routed_expert"]


def layout_rep(fmts=("NVFP4",), weights=None, groups=True) -> NS:
    table = [{"component": RE, "precision": f, "layers": f"{i}-3"} for i, f in enumerate(fmts)]
    table.append({"component": CARD_ROWS["attention_proj"], "precision": "MXFP4", "layers": "0-3"})
    w = {"strategy": "tensor_group", "group_size": 16} if weights is None else weights
    cs = {"num_hidden_layers": 4, "groups": [{"weights": w}, {"weights": {}}] if groups else []}
    return report(precision_table=table, config_summary=cs)


def test_routed_experts_row_in_full():
    assert r02.layout_routed_experts(meas(layout_rep())) == Row(
        {"formats_by_layers": {"NVFP4": "0-3"}, "block_scale": "F8_E4M3", "group_size_from_scale_columns": 16,
         "config_strategy": "tensor_group", "config_group_size": 16}, "partly",
        ["data/audit.json", "data/tensors.parquet"],
        "Routed experts are NVFP4 (U8 packed e2m1 [out,in/2], F8_E4M3 block scales [out,in/16], F32 global scale; "
        "config tensor_group / 16) on layers 0-3; SCOPE. The card's row says layers 0-41, but the dense layers "
        "(< first_k_dense_replace) have no routed experts: the range is 2-41 on the real model.", ON)


@pytest.mark.parametrize("fmts,weights,groups", [
    (("NVFP4", "BF16"), None, True), (("MXFP4",), None, True), ((), None, True),
    (("NVFP4",), {"strategy": "group", "group_size": 16}, True),
    (("NVFP4",), {"strategy": "tensor_group", "group_size": 32}, True),
    (("NVFP4",), {}, True), (("NVFP4",), None, False),
])
def test_routed_experts_contradicted(fmts, weights, groups):
    row = r02.layout_routed_experts(meas(layout_rep(fmts, weights, groups)))
    w = ({"strategy": "tensor_group", "group_size": 16} if weights is None else weights) if groups else {}
    exp = {f: f"{i}-3" for i, f in enumerate(fmts)}
    assert row == Row({"formats_by_layers": exp, "block_scale": "F8_E4M3", "group_size_from_scale_columns": None,
                       "config_strategy": w.get("strategy"), "config_group_size": w.get("group_size")},
                      "contradicted", ["data/audit.json", "data/tensors.parquet"],
                      f"routed experts stored as {exp}, config {w}", ON)


def test_routed_experts_weights_none():
    rep = layout_rep()
    rep.config_summary["groups"][0]["weights"] = None
    assert r02.layout_routed_experts(meas(rep)).note == "routed experts stored as {'NVFP4': '0-3'}, config {}"


BF_ROWS = [CARD_ROWS[k] for k in ("attention_proj", "kda_misc", "mla_proj", "shared_expert", "lm_head")]


def bf_rep(**prec) -> NS:
    """precision rows: component key -> precisions; the routed experts' NVFP4 beside (not counted)."""
    table = [{"component": RE, "precision": "NVFP4"}]
    table += [{"component": CARD_ROWS[k], "precision": p} for k, ps in prec.items() for p in ps]
    return report(precision_table=table)


def test_bf16_components_variants():
    ev = ["data/audit.json", "data/tensors.parquet"]
    allbf = {k: ["BF16"] for k in ("attention_proj", "kda_misc", "mla_proj", "shared_expert", "lm_head")}
    assert r02.layout_bf16_components(meas(bf_rep(**allbf))) == Row(
        {r: ["BF16"] for r in BF_ROWS}, "reproduced", ev, "None of these components is quantized; SCOPE.", ON)
    f32 = {**allbf, "kda_misc": ["F32", "BF16", "F32"]}
    assert r02.layout_bf16_components(meas(bf_rep(**f32))) == Row(
        {**{r: ["BF16"] for r in BF_ROWS}, CARD_ROWS["kda_misc"]: ["BF16", "F32"]}, "partly", ev,
        "None of these components is quantized; A_log, dt_bias and the router's expert_bias are F32 in the generated "
        "Ling layout (ling_layout's reconstruction), not BF16 as the card's table says; SCOPE.", ON)
    missing = r02.layout_bf16_components(meas(bf_rep(attention_proj=["BF16"])))
    assert missing.verdict == "reproduced" and missing.measured[CARD_ROWS["lm_head"]] == []
    for packed in ("NVFP4", "MXFP4", "INVALID-PACKED"):
        row = r02.layout_bf16_components(meas(bf_rep(**{**f32, "mla_proj": ["BF16", packed]})))
        assert (row.verdict, row.note) == ("contradicted", "some of these components are packed (see measured)")
        assert row.measured[CARD_ROWS["mla_proj"]] == sorted(["BF16", packed])


def mod(layer, proj, fmt, component="attention_proj") -> NS:
    return NS(layer=layer, proj=proj, fmt=fmt, component=component, params={})


def kda_rep(*mods, mla_layers=()) -> NS:
    modules = {f"m{i}": m for i, m in enumerate(mods)}
    modules |= {f"model.layers.{L}.attention.kv_a_proj_with_mqa": mod(L, "kv_a_proj_with_mqa", "BF16", "mla_proj")
                for L in mla_layers}
    return report(modules=modules)


def test_kda_gates():
    ev = ["data/tensors.parquet"]
    note = "f_proj and g_proj of the KDA layers, as stored; SCOPE."
    ok = [mod(0, "f_proj", "BF16"), mod(0, "g_proj", "BF16"), mod(1, "f_proj", "BF16")]
    assert r02.layout_kda_gates_bf16(meas(kda_rep(*ok))) == Row({"f_proj": "BF16", "g_proj": "BF16"}, "reproduced",
                                                                ev, note, ON)
    # the MLA layer's, the MTP layer's (layer 4 = num_hidden_layers), q_proj's and a router's are not read
    others = [mod(2, "f_proj", "NVFP4"), mod(4, "g_proj", "F32"), mod(0, "q_proj", "NVFP4"),
              mod(0, "f_proj", "F32", "router")]
    assert r02.layout_kda_gates_bf16(meas(kda_rep(*ok, *others, mla_layers=(2,)))).verdict == "reproduced"
    assert r02.layout_kda_gates_bf16(meas(kda_rep(*ok, mod(3, "g_proj", "F32")))) == Row(
        {"f_proj": "BF16", "g_proj": "F32"}, "contradicted", ev, note, ON)
    assert r02.layout_kda_gates_bf16(meas(kda_rep(*ok, mod(3, "f_proj", "F32")))).verdict == "contradicted"
    assert r02.layout_kda_gates_bf16(meas(kda_rep(mod(2, "f_proj", "BF16"), mla_layers=(2,)))) == Row(
        {}, "contradicted", ev, note, ON)
    assert r02.layout_kda_gates_bf16(meas(kda_rep(mod(3, "g_proj", "BF16")))).verdict == "reproduced"


# --- the MTP layer ----------------------------------------------------------------------------------
def mtp_rep(packed=0, state="bf16-ignored", tensors=1552, ignore=None, matches=True) -> NS:
    mt = {"layer": 4, "packed_tensors": packed, "plain_tensors": 20, "dtypes": {"BF16": 19, "F32": 1},
          "state": state, "tensors": tensors, "ignore_first_matches": matches}
    counts = {"measured": {"mtp_other_tensors": 16}, "formulas": {"mtp_layer_tensors": {"formula": "3 x E + 16"}}}
    extra = {"files": FILES, "counts": {"formulas_real_sizes": {"mtp_layer_tensors": {"value": 1552}}}}
    ign = [r"re:.*layers\.4\..*", "lm_head"] if ignore is None else ignore
    return report(mtp=[mt, {"layer": 99}], counts=counts, extra=extra,
                  config_summary={"num_hidden_layers": 4, "groups": [], "ignore": ign})


def mtp_note(packed=0, state="bf16-ignored", fr="1552") -> str:
    return (f"MTP layer 4: {packed} packed, 20 plain, state '{state}'; SCOPE. Count = 3 x num_experts + 16 other "
            f"tensors of the generated layout = {fr} at the real sizes vs the card's 1,552 (the reconstructed name "
            "list has one non-expert tensor more; its plain tensors here are {'BF16': 19, 'F32': 1}: the router's "
            "expert_bias is F32, so the BF16 tensors alone number 3 x num_experts + 15 = 1,551 at the real sizes, "
            "the card's number if it counted BF16 tensors only).")


@pytest.mark.parametrize("real,packed,state,tensors,verdict", [
    (True, 0, "bf16-ignored", 1552, "reproduced"), (True, 0, "bf16-ignored", 1553, "partly"),
    (True, 1, "bf16-ignored", 1552, "contradicted"), (True, 0, "packed", 1552, "contradicted"),
    (False, 0, "bf16-ignored", 1552, "partly"), (False, 0, "bf16-ignored", 7, "partly"),
    (False, 1, "bf16-ignored", 1552, "contradicted"), (False, 0, "bf16-not-ignored", 1552, "contradicted"),
])
def test_mtp_layer42(real, packed, state, tensors, verdict):
    row = r02.mtp_layer42_bf16(meas(mtp_rep(packed, state, tensors), real=real))
    assert row == Row({"layer": 4, "packed": packed, "plain": 20, "dtypes": {"BF16": 19, "F32": 1}, "state": state,
                       "formula": "3 x E + 16"}, verdict, ["data/audit.json", "figures/heat.png"],
                      mtp_note(packed, state), ON)


def test_mtp_layer42_without_f32_tensors():
    rep = mtp_rep()
    rep.mtp[0]["dtypes"] = {"BF16": 20}
    assert r02.mtp_layer42_bf16(meas(rep)).note == mtp_note().replace(
        "{'BF16': 19, 'F32': 1}", "{'BF16': 20}").replace("+ 15 = 1,551", "+ 16 = 1,552")


def test_mtp_rows_without_mtp_or_formulas():
    for rule in (r02.mtp_layer42_bf16, r02.mtp_ignore_first):
        assert rule(meas()) == Row(None, "not run", [], "not run: config declares no MTP layer")
    rep = mtp_rep()
    rep.counts["formulas"] = {}
    rep.extra["counts"]["formulas_real_sizes"] = {}
    row = r02.mtp_layer42_bf16(meas(rep))
    assert row.measured["formula"] is None and row.note == mtp_note(fr="None")


def test_mtp_ignore_first():
    note = "ignore[0] of config.json; the MTP layer here is 4 (the card's 42 at real sizes); SCOPE."
    assert r02.mtp_ignore_first(meas(mtp_rep())) == Row(
        {"ignore_first": r"re:.*layers\.4\..*", "matches_mtp_layer": True}, "reproduced", ["data/audit.json"], note, ON)
    for ign, matches in (([r"re:.*layers\.42\..*"], True), ([r"re:.*layers\.4\..*"], False), (["lm_head"], True)):
        row = r02.mtp_ignore_first(meas(mtp_rep(ignore=ign, matches=matches)))
        assert row == Row({"ignore_first": ign[0], "matches_mtp_layer": matches}, "contradicted", ["data/audit.json"],
                          note, ON)
    assert r02.mtp_ignore_first(meas(mtp_rep(ignore=[]))).measured == {"ignore_first": None, "matches_mtp_layer": True}


# --- the counts -------------------------------------------------------------------------------------
def count_rep(measured: dict, formula: dict, real_sizes: dict, modules=None, ins=None) -> NS:
    return report(counts={"measured": measured, "formulas": formula}, modules=modules or {}, input_scales=ins or {},
                  extra={"files": FILES, "counts": {"formulas_real_sizes": real_sizes}})


def fq(v, real_v) -> tuple[dict, dict]:
    return {"formula": "L x E x 3", "value": v}, {"value": real_v}


def test_quantized_experts_counts():
    ev = ["data/audit.json", "data/tensors.parquet"]
    f, fr = fq(96, 61440)
    x = meas(count_rep({"quantized_expert_modules": 96}, {"quantized_expert_modules": f},
                       {"quantized_expert_modules": fr}))
    assert r02.counts_quantized_experts(x) == Row(
        {"count": 96, "formula": "L x E x 3"}, "partly", ev,
        "measured 96 on the scaled checkpoint = the layout formula on its config; the same formula gives 61,440 at "
        "the real sizes (card 61,440). The card's own files were not audited here.", ON)
    x = meas(count_rep({"quantized_expert_modules": 61440}, {"quantized_expert_modules": f},
                       {"quantized_expert_modules": fr}), real=True)
    assert r02.counts_quantized_experts(x) == Row(
        {"count": 61440, "formula": "L x E x 3"}, "reproduced", ev,
        "measured on the audited files (real sizes or the card's own): 61,440 (card 61,440).", ON)


def test_mla_unpacked_counts():
    f, fr = fq(6, 16)
    m = {"mla_kv_unpacked": 6, "mla_unpacked_by_module": {"kv_a": 3, "kv_b": 3}}
    row = r02.counts_mla_unpacked(meas(count_rep(m, {"mla_kv_unpacked": f}, {"mla_kv_unpacked": fr})))
    assert row == Row({"count": 6, "formula": "L x E x 3"}, "partly", ["data/audit.json", "data/tensors.parquet"],
                      "measured 6 on the scaled checkpoint = the layout formula on its config; the same formula gives "
                      "16 at the real sizes (card 16). The card's own files were not audited here. The card does not "
                      "say which 16 tensors: kv_a_proj_with_mqa + kv_b_proj of the 8 MLA layers (7 trunk + MTP) is the "
                      "reading of this layout that gives 16; unpacked MLA-only modules here: {'kv_a': 3, 'kv_b': 3}.",
                      ON)
    f, fr = fq(7, 16)
    row = r02.counts_mla_unpacked(meas(count_rep(m, {"mla_kv_unpacked": f}, {"mla_kv_unpacked": fr})))
    assert row.verdict == "contradicted"
    assert row.note.startswith("measured 6, formula on the audited config 7, at real sizes 16 (card 16). The card")


def igs(dt) -> NS:
    return NS(params={"input_global_scale": NS(dtype=dt), "weight": NS(dtype="U8")})


def scale_rep(n=4, modules=None, all_one=True, n_mod=4, real_f=61440) -> NS:
    mods = modules if modules is not None else {f"e{i}": igs("F32") for i in range(n)} | {"d": NS(params={"w": 1})}
    ins = {"input_all_one": all_one, "input_values": [1.0], "missing": 0, "input_nonfinite_or_nonpositive": 0}
    return count_rep({"input_global_scales": n, "quantized_expert_modules": n_mod},
                     {"input_global_scales": {"formula": "f", "value": 4}},
                     {"input_global_scales": {"value": real_f}}, mods, ins)


def test_input_global_scale_row_in_full():
    assert r02.scales_input_global_scale(meas(scale_rep())) == Row(
        {"count": 4, "dtypes": {"F32": 4}, "values": [1.0], "one_per_expert_weight_global_scale": True,
         "missing": 0, "nonfinite": 0}, "partly", ["data/audit.json"],
        "measured 4 on the scaled checkpoint = the layout formula on its config; the same formula gives 61,440 at "
        "the real sizes (card 61,440). The card's own files were not audited here. Header dtypes of the "
        "input_global_scale tensors: {'F32': 4} (card float32 = safetensors F32). Values read with "
        "safetensors.safe_open.", ON)


def test_input_global_scale_on_real_sizes():
    rep = scale_rep(n=4, n_mod=4)
    rep.counts["measured"]["input_global_scales"] = 61440
    rep.counts["measured"]["quantized_expert_modules"] = 61440
    row = r02.scales_input_global_scale(meas(rep, real=True))
    assert row.verdict == "reproduced" and row.note.startswith(
        "measured on the audited files (real sizes or the card's own): 61,440 (card 61,440). Header dtypes")


def test_input_global_scale_contradicted():
    assert r02.scales_input_global_scale(meas(scale_rep(real_f=61441))).verdict == "contradicted"
    assert r02.scales_input_global_scale(meas(scale_rep(all_one=False))).verdict == "contradicted"
    assert r02.scales_input_global_scale(meas(scale_rep(n_mod=5))).measured[
        "one_per_expert_weight_global_scale"] is False
    assert r02.scales_input_global_scale(meas(scale_rep(n_mod=5))).verdict == "contradicted"
    mixed = {"a": igs("F32"), "b": igs("BF16"), "c": igs("F32"), "d": igs("F32")}
    row = r02.scales_input_global_scale(meas(scale_rep(modules=mixed)))
    assert row.verdict == "contradicted" and row.measured["dtypes"] == {"F32": 3, "BF16": 1}
    bf = {f"e{i}": igs("BF16") for i in range(4)}
    assert r02.scales_input_global_scale(meas(scale_rep(modules=bf))).verdict == "contradicted"
    card = {**CARD, "scales.input-global-scale": {"count": 61440, "dtype": "BF16", "value": 1.0}}
    row = r02.scales_input_global_scale(meas(scale_rep(modules=bf), card=card))
    assert row.verdict == "partly" and "(card BF16 = safetensors BF16)" in row.note
    none = r02.scales_input_global_scale(meas(scale_rep(modules={})))
    assert none.verdict == "contradicted" and none.measured["dtypes"] == {}
    assert "input_global_scale tensors: none (card float32 = safetensors F32)" in none.note
    rep = scale_rep()
    rep.input_scales = {}
    row = r02.scales_input_global_scale(meas(rep))
    assert row.verdict == "contradicted"
    assert (row.measured["values"], row.measured["missing"], row.measured["nonfinite"]) == (None, None, None)


# --- the config claims ------------------------------------------------------------------------------
ACT = {"num_bits": 4, "type": "float", "dynamic": "local", "strategy": "tensor_group", "group_size": 16,
       "symmetric": True}
W4A4_NOTE = ("The config's group is 4-bit float tensor_group/16 for weights and activations with dynamic 'local', "
             "which SGLang's _is_fp4a4_nvfp4 predicate (compressed_tensors.py 589-616) accepts -> "
             "CompressedTensorsW4A4Nvfp4MoE on Blackwell; SCOPE.")


def w4a4_rep(scheme="W4A4", acts=(ACT,)) -> NS:
    return report(config_summary={"scheme": scheme, "groups": [{"input_activations": a} for a in acts]})


def test_config_w4a4():
    act = {k: ACT[k] for k in ("num_bits", "type", "dynamic", "strategy", "group_size")}
    assert r02.config_w4a4(meas(w4a4_rep())) == Row({"scheme": "W4A4", "input_activations": act}, "reproduced",
                                                    ["data/audit.json"], W4A4_NOTE, ON)
    for scheme, acts in (("W4A16", (ACT,)), ("W4A4", ({**ACT, "dynamic": True},)), ("W4A4", (None, ACT)),
                         ("W4A4", ())):
        row = r02.config_w4a4(meas(w4a4_rep(scheme, acts)))
        a = acts[0] if acts else None
        assert row == Row({"scheme": scheme, "input_activations": {k: a.get(k) for k in act} if a else None},
                          "contradicted", ["data/audit.json"], "not the card's W4A4 block", ON), (scheme, acts)
    assert r02.config_w4a4(meas(w4a4_rep(acts=({"dynamic": "local"},)))).measured["input_activations"] == {
        "num_bits": None, "type": None, "dynamic": "local", "strategy": None, "group_size": None}
    assert r02.config_w4a4(meas(w4a4_rep(acts=({"dynamic": "local"},)))).verdict == "reproduced"


E_OK = {str(i): 4 for i in range(35, 42)}
S_OK = {**{str(i): 5 for i in range(34, 40)}, "40": 7, "41": 7}


def clamp_rep(e=E_OK, s=S_OK) -> NS:
    cl = {"expert_swiglu_limit_list": None if e is None else {"nonzero": e, "len": 42},
          "share_expert_swiglu_limit_list": None if s is None else {"nonzero": s}}
    return report(config_summary={"clamp_lists": cl, "context": {"max_position_embeddings": 262144,
                                                                 "rope_scaling": None}})


def test_config_clamp_lists_real():
    ok = r02.config_clamp_lists(meas(clamp_rep(), real=True, rnd=False))
    assert ok == Row({"expert": E_OK, "shared": S_OK}, "reproduced", ["data/audit.json"],
                     "nonzero entries by layer, from config.json", ON)
    for e, s in (({**E_OK, "34": 4}, S_OK), ({**E_OK, "41": 5}, S_OK), (E_OK, {**S_OK, "40": 5}),
                 (E_OK, {k: v for k, v in S_OK.items() if k != "34"}), (None, S_OK), (E_OK, None)):
        row = r02.config_clamp_lists(meas(clamp_rep(e, s), real=True, rnd=False))
        assert row.verdict == "contradicted" and row.measured == {"expert": e, "shared": s}


def test_config_clamp_lists_not_run():
    lists = f"expert {{'nonzero': {E_OK}, 'len': 42}}, shared {{'nonzero': {S_OK}}}"
    for real in (True, False):
        assert r02.config_clamp_lists(meas(clamp_rep(), real=real, rnd=True)) == Row(
            None, "not run", ["data/audit.json"],
            f"not run (generated checkpoint: values come from the generator, circular): ling_layout wrote the lists "
            f"({lists}) from params / the card's statement. Audit the card's checkpoint (checkpoint.quantized_path) "
            "to test it.")
    assert r02.config_clamp_lists(meas(clamp_rep(), real=False, rnd=False)) == Row(
        None, "not run", ["data/audit.json"],
        f"not run: the audited config does not have the real model's sizes (its lists: {lists}), so the card's layer "
        "numbers do not apply. Audit the card's checkpoint (checkpoint.quantized_path) to test it.")
    assert "shared None)" in r02.config_clamp_lists(meas(clamp_rep(E_OK, None), real=False, rnd=False)).note


def test_config_context():
    ctx = {"max_position_embeddings": 262144, "rope_scaling": None}
    assert r02.config_context(meas(clamp_rep(), real=True, rnd=False)) == Row(
        ctx, "reproduced", ["data/audit.json"], "from config.json", ON)
    for bad in ({**ctx, "max_position_embeddings": 131072}, {**ctx, "rope_scaling": {"type": "yarn"}}):
        rep = report(config_summary={"context": bad})
        assert r02.config_context(meas(rep, real=True, rnd=False)) == Row(bad, "contradicted", ["data/audit.json"],
                                                                          "from config.json", ON)
    assert r02.config_context(meas(clamp_rep(), real=True, rnd=True)) == Row(
        None, "not run", ["data/audit.json"],
        f"not run (generated checkpoint: values come from the generator, circular): the config carries {ctx}, written "
        "by ling_layout from the card's own statement; the loaders disagree on the real value (131072 + YaRN to "
        "262144 in the vendor's serving recipes, 262144 elsewhere).")
    assert r02.config_context(meas(clamp_rep(), real=False, rnd=False)) == Row(
        None, "not run", ["data/audit.json"],
        f"not run: the audited config does not have the real model's sizes (it carries {ctx}); the claim is about "
        "the card's config.json.")


# --- clamp.trtllm-routing ----------------------------------------------------------------------------
def routing(epg, status="over", ne=512, ng=8) -> dict:
    return {"num_experts": ne, "n_group": ng, "experts_per_group": epg, "status": status, "other": 1}


@pytest.mark.parametrize("epg,status,verdict", [
    (64, "over", "reproduced"), (33, "over", "reproduced"), (32, "over", "contradicted"),
    (64, "at", "contradicted"), (None, "over", "contradicted"),
])
def test_trtllm_routing_card_files(epg, status, verdict):
    rep = report(routing=routing(epg, status))
    row = r02.clamp_trtllm_routing(meas(rep, ck={"path": "ck", "card": True}))
    assert row == Row({"num_experts": 512, "n_group": 8, "experts_per_group": epg, "status": status}, verdict,
                      ["data/audit.json"],
                      f"512 / 8 = {epg} experts per group in SCOPE vs the kernel's 32 (FlashInfer routingDeepSeek); "
                      f"rule status '{status}'. The kernel's check only; the backend was not run (no GPU).", ON)


@pytest.mark.parametrize("epg,status,verdict,cmp", [
    (64.0, "over", "partly", ">"), (32.5, "over", "partly", ">"), (32.0, "over", "contradicted", "<="),
    (64.0, "at", "contradicted", ">"), (16.0, "ok", "contradicted", "<="),
])
def test_trtllm_routing_ours(epg, status, verdict, cmp):
    rep = report(routing=routing(4, "ok", 16, 4), extra={"files": FILES, "routing_real_sizes": routing(epg, status)})
    row = r02.clamp_trtllm_routing(meas(rep))
    assert row == Row({"audited": {"num_experts": 16, "n_group": 4, "experts_per_group": 4, "status": "ok"}}, verdict,
                      ["data/audit.json"],
                      f"Arithmetic on the reference sizes (LingShape defaults, not measured): 512 / 8 = {epg:g} experts "
                      f"per group {cmp} 32 (FlashInfer routingDeepSeek: mNumExperts / mNumExpertGroups <= WarpSize), "
                      f"rule status '{status}'; the audited config (measured) gives 'ok'. The kernel's check only; the "
                      "backend was not run (no GPU).", "FlashInfer TRT-LLM routing kernel checks (fault F-05: routing "
                      "shapes)")


# --- the findings on our checkpoint ------------------------------------------------------------------
def findings(rep, real=False, unshared=None) -> r02.InspectFindings:
    return r02.InspectFindings(rep, real, SCOPE, ON, unshared or {"run": False})


def fault_rep(status="over", fs=(), errs=()) -> NS:
    return report(findings=[finding(c, s) for c, s in fs], errors=[finding(c, "error") for c in errs],
                  extra={"files": FILES, "routing_real_sizes": {"status": status}})


F05 = "F05-routing-over-limit"


def test_fault_verdicts_row_in_full():
    rep = fault_rep(fs=[(F05, "info"), ("W1-x", "warning"), ("W1-x", "warning"), ("I1-y", "info"),
                        ("A0-z", "warning")])
    assert r02.fault_verdicts(findings(rep, real=True)) == Row(
        {"fault_codes": [F05], "errors": [], "warnings": ["A0-z", "W1-x"]}, "reproduced", ["data/audit.json"],
        "Header audit of SCOPE.", ON)


@pytest.mark.parametrize("status,real,fs,errs,verdict", [
    ("over", True, [], [], "reproduced"), ("ok", False, [], [], "reproduced"),
    ("over", False, [F05], [], "contradicted"),  # scaled: F-05 is not expected
    ("at", True, [F05], [], "contradicted"),
    ("over", True, [F05, "F01-input-scale-missing"], [], "contradicted"),
    ("ok", True, [], ["E1-bad"], "contradicted"),
])
def test_fault_verdicts_edges(status, real, fs, errs, verdict):
    rep = fault_rep(status, [(c, "warning") for c in fs], errs)
    row = r02.fault_verdicts(findings(rep, real=real))
    assert row.verdict == verdict and row.measured["fault_codes"] == sorted(fs) and row.measured["errors"] == errs


def test_gate_up_shared():
    ev = ["data/audit.json", "data/up.parquet"]
    for gs, verdict in (({"pairs": 4, "mismatched": 0}, "reproduced"), ({"pairs": 4, "mismatched": 1}, "contradicted"),
                        ({"pairs": 0, "mismatched": 0}, "contradicted"), ({"pairs": 4}, "contradicted"), ({}, "contradicted")):
        assert r02.gate_up_shared(findings(report(gate_up_summary=gs))) == Row(gs, verdict, ev, "SCOPE.", ON), gs


def test_up_scale_error_card_pipeline():
    assert r02.up_scale_error_card_pipeline(findings(report())) is None
    u = {"run": True, "experts": 8, "differ": 1, "median_abs_up_scale_error": 0.1, "p95_abs_up_scale_error": 0.2,
         "max_abs_up_scale_error": 0.3, "data": "data/u.parquet", "figure": "figures/u.png", "other": 9}
    want = {k: u[k] for k in ("experts", "differ", "median_abs_up_scale_error", "p95_abs_up_scale_error",
                              "max_abs_up_scale_error")}
    note = ("Scales from 01's quantization without the pairing rule, random weights; the card's own checkpoint was not "
            "available to measure.")
    assert r02.up_scale_error_card_pipeline(findings(report(), unshared=u)) == Row(
        want, "reproduced", ["data/u.parquet", "figures/u.png"], note, "SGLang 0.5.23 w4a4_nvfp4_moe.py 187-198")
    row = r02.up_scale_error_card_pipeline(findings(report(), unshared={**u, "differ": 0}))
    assert row.verdict == "contradicted" and row.measured["differ"] == 0


# --- the card's own files ----------------------------------------------------------------------------
def card(rep=None, run=True) -> r02.CardFindings:
    if not run:
        return r02.CardFindings({"run": False, "reason": "no token"})
    return r02.CardFindings({"run": True, "report": rep, "ck": {"checked_on": "hub rev 1"}, "traffic": "3 MB read"})


def test_card_checkpoint():
    assert r02.card_checkpoint(card(run=False)) == Row(None, "not run", [], "not run: no token")
    rep = fault_rep(fs=[(F05, "warning"), ("W1-x", "warning")])
    rep.extra["traffic"] = {"bytes": 3}
    assert r02.card_checkpoint(card(rep)) == Row({"fault_codes": [], "errors": [], "traffic": {"bytes": 3}},
                                                 "reproduced", ["data/audit.json"],
                                                 "Header audit by range requests; 3 MB read.", "hub rev 1")
    rep = fault_rep(fs=[("F02-mtp-missing", "warning"), ("F01-input-scale-missing", "warning")])
    row = r02.card_checkpoint(card(rep))
    assert row.verdict == "contradicted" and row.measured == {
        "fault_codes": ["F01-input-scale-missing", "F02-mtp-missing"], "errors": [], "traffic": None}
    row = r02.card_checkpoint(card(fault_rep(errs=["E2-b", "E1-a", "E2-b"])))
    assert row.verdict == "contradicted" and row.measured["errors"] == ["E1-a", "E2-b"]


def test_card_gate_up_scales():
    ev = ["data/audit.json", "data/up.parquet"]
    assert r02.card_gate_up_scales(card(run=False)) == Row(None, "not run", [], "not run: no token")
    gs = {"pairs": 4, "mismatched": 3, "median_abs_up_scale_error": 0.01, "max_abs_up_scale_error": 0.2}
    rep = report(gate_up_summary=gs, input_scales={"values_read": 1})
    assert r02.card_gate_up_scales(card(rep)) == Row(
        {**gs, "values_read": True}, "reproduced", ev,
        "3 of 4 gate/up pairs differ on the card's files; median |up/gate - 1| 0.01, max 0.2.", "hub rev 1")
    row = r02.card_gate_up_scales(card(report(gate_up_summary={**gs, "mismatched": 0})))
    assert row == Row({**gs, "mismatched": 0, "values_read": False}, "contradicted", ev,
                      "0 of 4 gate/up pairs differ on the card's files; median |up/gate - 1| 0.01, max 0.2.",
                      "hub rev 1")
    row = r02.card_gate_up_scales(card(report(gate_up_summary={"pairs": 0, "mismatched": 0})))
    assert row == Row({"pairs": 0, "mismatched": 0, "values_read": False}, "not run", ev,
                      "not run: the audit read no gate/up scale pairs (values not read)", "hub rev 1")
