"""Shared-experts fusion as a path fact (issue 36, r12b): BailingMoeV3 fuses Ling's one shared expert
into the routed FusedMoE (num_fused_shared_experts 1) unless its gate ``shared_experts_fusion_disable_reason``
vetoes it, and a runner that raises on a fused shared expert ends the branch whatever the limit: 0.5.20
``_check_runner_config_supported`` (moe_runner/hpc_ops.py 95-124) raises on num_fused_shared_experts
(102-105) before its clamp check (116-124), so ``Fp8MoEMethod/hpc_ops`` (FP8 on CUDA SM90, the sizes
equal, no all-to-all) is UNUSABLE, not REFUSED. The expected lines are read here from the released files."""

from __future__ import annotations

import ast

import pytest

from nvfp4study.sglang import audit as sa
from nvfp4study.sglang import param_audit as pa
from nvfp4study.sglang import shared_fusion as sf
from sglang_fixtures import released

RELEASES = ("0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
HPC = "layers/moe/moe_runner/hpc_ops.py"
TRTLLM = "layers/moe/moe_runner/flashinfer_trtllm.py"
OVERRIDES = "arg_groups/overrides.py"


def _lines(tree, rel: str, needle: str) -> list[int]:
    text = tree.file("sglang/srt/" + rel).read_text()
    return [i for i, ln in enumerate(text.splitlines(), 1) if needle in ln]


def _asserts_on_fusion(tree, rel: str) -> list[int]:
    mod = ast.parse(tree.file("sglang/srt/" + rel).read_text())
    return [n.lineno for n in ast.walk(mod) if isinstance(n, ast.Assert) and "num_fused_shared_experts" in ast.unparse(n.test)]


def _write_after(tree, test: str) -> int:
    """The line of the first ``return {"disable_shared_experts_fusion": True}`` after the line ``test``
    of arg_groups/overrides.py (read as text)."""
    start = _lines(tree, OVERRIDES, test)[0]
    return next(i for i in _lines(tree, OVERRIDES, 'return {"disable_shared_experts_fusion": True}') if i > start)


def _spec(tree, key: str) -> dict:
    return next(s for s in sa.path_specs(tree) if s["id"] == key)


@pytest.mark.parametrize("v", RELEASES)
def test_hpc_ops_raises_on_the_fused_shared_expert_before_the_limit(v):
    t = released(v)
    check = _lines(t, HPC, "if runner_config.num_fused_shared_experts != 0:")
    clamp = _lines(t, HPC, "or runner_config.gemm1_clamp_limit is not None")
    assert len(check) == 1 and clamp and check[0] < clamp[0]  # the fusion check comes first in the source
    row = sa.audit_tree(t, ["Fp8MoEMethod/hpc_ops"])[0]
    assert (row.verdict.value, row.file, row.line) == ("UNUSABLE", HPC, check[0] + 1), row.rule
    assert "fused shared experts" in row.rule and "shared expert is fused here" in row.rule


@pytest.mark.parametrize("v", ["0.5.20", "0.5.23"])
def test_hpc_ops_without_fusion_is_refused_on_the_limit(v, monkeypatch):
    # the same path where the gate's device test fails everywhere (no fusion): the clamp check raises
    t = released(v)
    cat = sa.catalog()
    monkeypatch.setattr(sa, "catalog", lambda: {**cat, "shared_fusion": {**cat["shared_fusion"], "fuses_on": []}})
    row = sa.audit_tree(t, ["Fp8MoEMethod/hpc_ops"])[0]
    assert row.verdict.value == "REFUSED", row.rule


@pytest.mark.parametrize("v", RELEASES)
def test_bf16_trtllm_is_not_fused_so_its_assert_passes(v):
    # BF16 on FlashInfer TRT-LLM asserts num_fused_shared_experts == 0, but the server arguments force
    # --disable-shared-experts-fusion for the TRT-LLM runners (arg_groups/overrides.py
    # _moe_runner_fusion_disable): the assert holds, and the path is judged on its kernel call
    t = released(v)
    at = _asserts_on_fusion(t, TRTLLM)
    assert len(at) == 1
    for key, test in (("trtllm-bf16", 'if runner in ("flashinfer_trtllm", "experimental_sgl_trtllm"):'),
                      ("UnquantizedFusedMoEMethod/flashinfer_trtllm_routed", 'if runner == "flashinfer_trtllm_routed":')):
        write = _write_after(t, test)
        f = _spec(t, key)["fusion"]
        assert (f.fused, f.forced) == (0, f"{OVERRIDES}:{write}"), f.why
        row = sa.audit_tree(t, [key])[0]
        assert row.verdict.value != "UNUSABLE" and (row.file, row.line) != (TRTLLM, at[0]), (key, row.rule)
        assert "not fused here: --disable-shared-experts-fusion forced" in row.rule and f"{OVERRIDES}:{write}" in row.rule


def test_hpc_ops_routing_parameters_are_unusable_for_the_fusion():
    t = released("0.5.20")
    clamp = sa.audit_tree(t, ["Fp8MoEMethod/hpc_ops"])
    for name in ("routed_scaling_factor", "grouped_topk"):
        row = pa.audit_param(t, name, path_ids=["Fp8MoEMethod/hpc_ops"], clamp_rows=clamp)[0]
        assert row.verdict.value == "UNUSABLE" and "fused shared experts" in row.rule, row.rule


@pytest.mark.parametrize("v", RELEASES)
def test_the_cards_compressed_tensors_checkpoint_is_not_fused(v):
    # the card's ignore list keeps the shared experts BF16 and quantizes the routed ones: the gate's
    # compressed-tensors test vetoes fusion, whatever the device
    t = released(v)
    ct = _lines(t, sf.MODEL, 'quant_config.get_name() == "compressed_tensors"')
    f = _spec(t, "nvfp4-w4a4-cutlass")["fusion"]
    assert (f.fused, f"{sf.MODEL}:{ct[0]}" in f.why) == (0, True), f.why
    row = sa.audit_tree(t, ["nvfp4-w4a4-cutlass"])[0]
    assert row.verdict.value in ("DROPPED", "APPROX") and "fused here" not in row.rule, row.rule


def test_an_ignore_list_treating_both_alike_leaves_the_device_to_decide():
    t = released("0.5.23")
    spec, data = _spec(t, "nvfp4-w4a4-cutlass"), sa.catalog()["shared_fusion"]
    assert sf.path_fusion(t.root, spec, data, (False, False)).fused is None  # CUDA/ROCm fuse, XPU/NPU/CPU do not
    cuda = {**spec, "platforms": ["CUDA"]}
    assert sf.path_fusion(t.root, cuda, data, (False, False)).fused == 1
    assert sf.path_fusion(t.root, cuda, data, (True, False)).fused == 0


@pytest.mark.parametrize("key,why", [("fused:flashinfer/flashinfer_cutlass", "_a2a_fusion_adjustments"),
                                     ("ascend", "off on NPU"), ("AWQIntelAMXMoEKernel/direct", "off on CPU")])
def test_all_to_all_and_devices_off_the_gate_are_not_fused(key, why):
    f = _spec(released("0.5.23"), key)["fusion"]
    assert f.fused == 0 and why in f.why, f.why


def test_the_gates_all_to_all_veto_where_the_server_arguments_leave_it():
    # DeepEP with the Triton runner: no server-argument write (Waterfill, off by default, would force fusion
    # ON), so the gate decides, and it vetoes every all-to-all backend
    t = released("0.5.23")
    spec = {"id": "fused:deepep/triton", "via": "fused:deepep/triton", "platforms": ["CUDA"]}
    f = sf.path_fusion(t.root, spec, sa.catalog()["shared_fusion"], None)
    assert (f.fused, f.forced) == (0, None) and "all-to-all backend 'deepep'" in f.why, f.why


def test_fp8_blocks_that_do_not_divide_the_partition_leave_it_undecided():
    t = released("0.5.23")
    data = {**sa.catalog()["shared_fusion"], "tp_size": 8}  # 768 / 8 = 96, not a multiple of 128
    assert sf.path_fusion(t.root, _spec(t, "Fp8MoEMethod/hpc_ops"), data, None).fused is None


def test_the_fusion_refusals_of_each_release_are_found():
    for v in RELEASES:
        t = released(v)
        found = sf.fusion_refusals(t.root)
        assert (HPC, _lines(t, HPC, "if runner_config.num_fused_shared_experts != 0:")[0] + 1) in found
        assert (TRTLLM, _asserts_on_fusion(t, TRTLLM)[0]) in found


def test_a_class_beats_a_fallback_alias_for_the_config_name():
    # 0.5.19 binds CompressedTensorsConfig = DummyConfig in quantization/__init__.py when its import fails
    assert sf.config_names(released("0.5.19").root, "CompressedTensorsConfig") == {"compressed_tensors"}
