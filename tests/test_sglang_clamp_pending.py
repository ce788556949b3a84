"""Clamp rows the twelfth blind sample decided against the audit, read again from the source (issue 36,
r11a) and left for a later round: each is a strict xfail naming the deciding lines, so the fix that
makes the audit reach the reading turns it into a failure to be removed, not a silent pass.

Both readings need the FusedMoE layer's own attributes, which the audit does not model: it keeps one
attribute table for ``self.X`` and ``layer.X`` and never runs ``create_weights`` (runner_steps.py
SETUP_STEPS), so it cannot tell that a scheme never registers a weight another scheme does.
"""

from __future__ import annotations

import pytest

from nvfp4study.sglang import audit as sa
from sglang_fixtures import released


def verdict(version: str, path: str) -> str:
    """The audit's clamp verdict of one path key on one release."""
    return {r.path: r for r in sa.audit_tree(released(version))}[path].verdict.value


@pytest.mark.xfail(strict=True, reason=(
    "audit gap: NPUCompressedTensorsW8A8Int8DynamicMoE.apply_weights reads layer.w13_weight_offset / "
    "layer.w2_weight_offset unguarded (compressed_tensors_w8a8_int8_moe.py 150-151 in 0.5.19, 149-150 in "
    "0.5.20 and 0.5.21), its create_weights (56-119) registers neither and NPUW8A8Int8MoEMethod."
    "process_weights_after_loading only rebinds an existing one (moe_methods.py, `if offset is not None`): "
    "AttributeError on the first forward; the attribute is set elsewhere in the tree (other schemes), so "
    "clamp_flow's never-set-anywhere rule cannot fire"))
@pytest.mark.parametrize("version", ["0.5.19", "0.5.20", "0.5.21"])
def test_npu_w8a8_int8_scheme_reads_offsets_it_never_creates(version):
    # 0.5.21's scheme file is byte-identical to 0.5.20's: its DROPPED reading (and the audit's) is wrong too
    assert verdict(version, "NPUCompressedTensorsW8A8Int8DynamicMoE/ascend") == "UNUSABLE"


@pytest.mark.xfail(strict=True, reason=(
    "audit gap: 0.5.21 Mxfp4MoEMethod.create_weights creates the w13/w2 biases whenever not _is_hip "
    "(mxfp4.py 571-572), so on CUDA TritonKernelsRunnerCore.run takes its has_bias branch, which hands "
    "gemm1_clamp_limit to triton_kernel_fused_experts_with_bias (moe_runner/triton_kernels.py 114-131); "
    "on ROCm the triton-kernels branch of process_weights_after_loading reads layer.w13_weight_bias "
    "unguarded (mxfp4.py 1027-1031) and raises, so the bias-less DROPPED branch never runs"))
def test_mxfp4_triton_kernel_always_has_its_bias_on_0_5_21():
    assert verdict("0.5.21", "Mxfp4MoEMethod/triton_kernel") == "APPROX"


@pytest.mark.xfail(strict=True, reason=(
    "audit gap: the per-tensor branch is cut since r11a (TopK's standard format makes its assert "
    "format_is_bypassed false, moe_runner/flashinfer_trtllm.py 935-936), but the audit reads the block-quant "
    "routed call, which hands gemm1_clamp_limit to trtllm_fp8_block_scale_routed_moe (flashinfer_trtllm.py "
    "832-851; pre form for flashinfer 0.6.18, docs/blind-readings/K.md), as 'limit reaches it on some "
    "branches only': UNDECIDED on 0.5.20-0.5.22, where the readers say APPROX"))
def test_fp8_trtllm_routed_block_scale_branch_on_0_5_21():
    assert verdict("0.5.21", "Fp8MoEMethod/flashinfer_trtllm_routed") == "APPROX"
