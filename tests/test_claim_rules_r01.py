"""Stage 01's claim rules (``stages/claim_rules/r01_quantize.py``) row by row, every field, on
hand-made reports and probes (issue 37's mutation benchmark): each verdict on both sides, each
note's variants, the rows a skipped quantization leaves not run or unrecorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvfp4study.core.claim_rules import Row
from nvfp4study.core.paths import RunPaths
from nvfp4study.stages.claim_rules import r01_quantize as r01

CARD = {"tool": "model_free_ptq", "scheme": "NVFP4A16", "llmcompressor": "0.9.0", "compressed_tensors": "0.13.0"}
REP = {"action": "quantize", "scheme": "NVFP4A16", "llmcompressor": "0.9.0", "compressed_tensors": "0.13.0",
       "counts": {"expert_weight_packed": 96}, "random_weights": True}
VERSIONS = "llmcompressor 0.9.0 / compressed-tensors 0.13.0"


def ok() -> dict:
    return {"ok": True, "error_type": None, "error": None}


def fails(t: str, e: str) -> dict:
    return {"ok": False, "error_type": t, "error": e}


def probes(**over) -> dict:
    p = {"stock_tables": fails("KeyError", "gate_up"), "both_emptied": ok(),
         "dict_only_emptied": fails("KeyError", "d"), "list_only_emptied": ok(),
         "w4a4_scheme_NVFP4": fails("ValueError", "no W4A4")}
    return {"probes": {**p, **over}}


def m(rep=None, probe=None, rt=None) -> r01.QuantizeMeasurements:
    return r01.QuantizeMeasurements(REP if rep is None else rep, probes() if probe is None else probe,
                                    rt or {"run": False}, "data/quantize.json", "data/quantize-probes.json",
                                    ("data/share=on.parquet", "data/share=off.parquet"), CARD)


def test_gather_reads_the_card_and_the_run_folder(tmp_path):
    x = r01.QuantizeMeasurements.gather(RunPaths(tmp_path), REP, {"probes": 1}, {"run": "rt"})
    assert (x.rep, x.probe, x.rt) == (REP, {"probes": 1}, {"run": "rt"})
    assert x.card["scheme"] == "NVFP4A16" and x.card["tool"] == "model_free_ptq"
    assert Path(x.ev_q).name == "quantize.json" and Path(x.ev_p).name == "quantize-probes.json"
    assert [Path(p).name for p in x.ev_share] == ["gate-up-scales-share=on.parquet", "gate-up-scales-share=off.parquet"]
    assert x.quantized and x.versions == VERSIONS
    assert m({"action": "skip", "reason": "no source"}).skipped == "no source"
    assert m({"action": "skip"}).skipped == "quantization skipped" and not m({}).quantized


def test_model_free_ptq_row_in_full():
    row = r01.provenance_model_free_ptq(m())
    assert row == Row(
        {"tool": "model_free_ptq", "scheme": "NVFP4A16", "llmcompressor": "0.9.0", "compressed_tensors": "0.13.0",
         "ran": True, "routed_expert_tensors_packed": 96, "w4a4_scheme_refused": "ValueError: no W4A4"},
        "partly", ["data/quantize.json", "data/quantize-probes.json"],
        "model_free_ptq with scheme NVFP4A16 quantized a Ling-layout checkpoint (random weights, params' shape) into "
        "the card's tensor layout; scheme NVFP4 (W4A4) is refused by model_free_ptq, consistent with the card "
        f"quantizing A16 and editing the config afterwards. Measured with {VERSIONS}, the card's versions; which "
        "tool produced the card's files cannot be checked from the files.", VERSIONS)


def test_model_free_ptq_note_variants():
    rep = {**REP, "scheme": "NVFP4", "random_weights": False, "llmcompressor": "0.8.1"}
    row = r01.provenance_model_free_ptq(m(rep, probes(w4a4_scheme_NVFP4=ok())))
    assert row.measured["w4a4_scheme_refused"] is False and row.verdict == "partly"
    assert row.note == (
        "model_free_ptq with scheme NVFP4 quantized a Ling-layout checkpoint (the given BF16 source) into the card's "
        "tensor layout (the card's scheme is NVFP4A16); scheme NVFP4 (W4A4) was accepted here. Measured with "
        "llmcompressor 0.8.1 / compressed-tensors 0.13.0, NOT the card's llmcompressor 0.9.0 / compressed-tensors "
        "0.13.0; which tool produced the card's files cannot be checked from the files.")
    assert row.checked_on == "llmcompressor 0.8.1 / compressed-tensors 0.13.0"
    other_ct = r01.provenance_model_free_ptq(m({**REP, "compressed_tensors": "0.12.2"})).note
    assert "NOT the card's" in other_ct


def test_skipped_quantization_rows():
    x = m({"action": "given", "reason": "checkpoint given as is"})
    assert r01.provenance_model_free_ptq(x) == Row.not_run("checkpoint given as is")
    assert r01.provenance_fused_maps(x) == Row.not_run("checkpoint given as is")
    full = {**probes(), "unshared": {"share_fraction": 0.5}, "shared": {"share_fraction": 1.0},
            "shared_is_min_of_unshared": True, "global_scales_bf16_exact": {"values": 2, "bf16_exact": 2}}
    rt = {"run": True, "summary": {"tensors": 3}, "data": "d", "figure": "f"}
    x = m({"action": "given", "reason": "r"}, full, rt)
    assert r01.quantize_gate_up_global_scale(x) is None
    assert r01.quantize_global_scale_bf16_values(x) is None
    assert r01.quantize_roundtrip_within_bound(x) is None


def test_fused_maps_rows():
    row = r01.provenance_fused_maps(m())
    assert row == Row(
        {"stock_tables": "fails: KeyError: gate_up", "both_emptied": "accepted", "dict_only_emptied": "fails: KeyError: d",
         "list_only_emptied": "accepted", "oneshot": "not tested"},
        "partly", ["data/quantize-probes.json"],
        "On this run's Ling layout the stock fused tables fail before anything is quantized and emptying both "
        "tables makes model_free_ptq run, with MLA kept out by the ignore list. Emptying only the dict: fails "
        "(KeyError); only the list: accepted (whether the list trips depends on which tensors share a shard). "
        "Sequential oneshot was not tested (needs the model class and the card's hardware), hence partly.",
        VERSIONS)
    bad = "The stock fused tables did not fail, or emptying them did not make model_free_ptq run (see measured)."
    for over in ({"stock_tables": ok()}, {"both_emptied": fails("KeyError", "x")}):
        row = r01.provenance_fused_maps(m(probe=probes(**over)))
        assert (row.verdict, row.note) == ("contradicted", bad), over


def gate_up(sh: float, un: float, is_min: bool) -> dict:
    return {**probes(), "shared": {"share_fraction": sh, "experts": 4}, "unshared": {"share_fraction": un, "experts": 4},
            "shared_is_min_of_unshared": is_min}


@pytest.mark.parametrize("sh,un,is_min,verdict", [
    (1.0, 0.25, True, "reproduced"), (1.0, 0.0, True, "reproduced"),
    (0.75, 0.25, True, "contradicted"),   # not every expert shares with the rule
    (1.0, 1.0, True, "contradicted"),     # all share without it too
    (1.0, 0.25, False, "contradicted"),   # the shared one is not the smaller
])
def test_gate_up_global_scale_edges(sh, un, is_min, verdict):
    row = r01.quantize_gate_up_global_scale(m(probe=gate_up(sh, un, is_min)))
    assert row == Row({"with_rule": {"share_fraction": sh, "experts": 4},
                       "without_rule": {"share_fraction": un, "experts": 4}, "shared_is_min_of_unshared": is_min},
                      verdict, ["data/quantize-probes.json", "data/share=on.parquet", "data/share=off.parquet"],
                      "Random weights; the card's own checkpoint is measured by 02_inspect_checkpoint.", VERSIONS)


def test_gate_up_not_recorded_without_the_unshared_run():
    assert r01.quantize_gate_up_global_scale(m()) is None


def test_global_scale_bf16_values_both_sides():
    note = ("compressed_tensors/quantization/utils/helpers.py generate_gparam computes 448 x 6 / absmax with a "
            "bfloat16 absmax; PyTorch evaluates float / bf16 tensor as 2688 x reciprocal in bf16 "
            "(torch/_tensor.py:1111-1114, two roundings), so a scale can sit one bf16 step off the exactly "
            "rounded 2688 / absmax, and distinct experts can share a global scale by coincidence (a false "
            "'copied scale' smell).")
    bf = {"values": 8, "bf16_exact": 8}
    assert r01.quantize_global_scale_bf16_values(m(probe={**probes(), "global_scales_bf16_exact": bf})) == Row(
        bf, "reproduced", ["data/quantize-probes.json"], note, VERSIONS)
    bf = {"values": 8, "bf16_exact": 7}
    assert r01.quantize_global_scale_bf16_values(
        m(probe={**probes(), "global_scales_bf16_exact": bf})).verdict == "contradicted"


def test_roundtrip_within_bound_rows():
    s = {"tensors": 6, "all_within_bound": True, "rel_error_median": 0.123456}
    rt = {"run": True, "summary": s, "data": "data/roundtrip.parquet", "figure": "figures/roundtrip.png"}
    assert r01.quantize_roundtrip_within_bound(m(rt=rt)) == Row(
        s, "reproduced", ["data/roundtrip.parquet", "figures/roundtrip.png"],
        "6 tensors; relative Frobenius error median 0.1235 on random normal weights.", VERSIONS)
    rt["summary"] = {**s, "all_within_bound": False}
    assert r01.quantize_roundtrip_within_bound(m(rt=rt)).verdict == "contradicted"
    assert r01.quantize_roundtrip_within_bound(m(rt={**rt, "run": False})) is None
    assert r01.quantize_roundtrip_within_bound(m(rt={**rt, "summary": {**s, "tensors": 0}})) is None
    assert r01.quantize_roundtrip_within_bound(m(rt={"run": True, "summary": {}})) is None
