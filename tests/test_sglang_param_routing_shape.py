"""FlashInfer's grouped TRT-LLM routing kernel raises for Ling's shape (fault F-05; docs/blind-readings/KP.md).

A TRT-LLM-Gen call that routes from the router logits with routing method DeepSeekV3 and n_group > 1 runs
routingDeepSeek, which checks ``mNumExperts / mNumExpertGroups <= WarpSize`` (32): Ling-3.0-flash's 512
experts in 8 groups (64 per group) fail it, so the path raises for Ling whatever its routing parameters are
(UNUSABLE). A call whose method is not decided stays UNDECIDED, saying its DeepSeekV3 branch would raise;
the ``*_routed_moe`` variants (top-k given) do not route from the logits.
"""

from __future__ import annotations

import ast
from types import SimpleNamespace

import pytest

from nvfp4study.core.params import LingShape
from nvfp4study.sglang import clamp_values as cv
from nvfp4study.sglang import moe_params
from nvfp4study.sglang.param_audit import ParamVerdict, audit_param
from nvfp4study.sglang.param_runner import routing_kernel_rejects
from sglang_fixtures import released

PARAMS = ("routed_scaling_factor", "norm_topk_prob", "correction_bias", "grouped_topk")


def _hit(callee: str, line: int = 7, **kwargs) -> cv.SinkHit:
    nodes = {k: ast.Constant(v) if not isinstance(v, ast.AST) else v for k, v in kwargs.items()}
    vals = {k: cv.UNK if isinstance(v, ast.AST) else v for k, v in kwargs.items()}
    return cv.SinkHit(callee, "sglang/srt/layers/moe/moe_runner/x.py", "f", line, vals, [], nodes)


def _run(*hits: cv.SinkHit) -> SimpleNamespace:
    return SimpleNamespace(interp=SimpleNamespace(hits=list(hits)))


@pytest.fixture(scope="module")
def rsf() -> moe_params.ParamSpec:
    return moe_params.param("routed_scaling_factor")


def test_ling_s_shape_fails_the_warp_size_check():
    # independent arithmetic on the model's sizes: 512 experts / 8 groups = 64 per group, FlashInfer's WarpSize 32
    s = LingShape()
    assert (s.num_experts, s.n_group) == (512, 8)
    assert s.num_experts // s.n_group == 64 > 32


def test_deepseek_grouped_call_raises_for_ling(rsf):
    hit = _hit("trtllm_fp8_block_scale_moe", routing_method_type="DeepSeekV3", n_group=8)
    got = routing_kernel_rejects(_run(hit), rsf, "0.7.2")
    assert got is not None
    file, line, text = got
    assert (file, line) == ("layers/moe/moe_runner/x.py", 7)
    assert "512 experts / 8 groups = 64 experts per group > 32" in text
    assert "flashinfer-python 0.7.2 csrc/fused_moe/trtllm_backend/trtllm_fused_moe_routing_deepseek.cu 526-538" in text


def test_n_group_read_from_ling_s_topk_config(rsf):
    # the scalar parameter's interpreter does not know TopKConfig: the argument's source names the field
    node = ast.parse("topk_config.num_expert_group", mode="eval").body
    hit = _hit("trtllm_fp8_block_scale_moe", routing_method_type="DeepSeekV3", n_group=node)
    assert routing_kernel_rejects(_run(hit), rsf, "0.6.18") is not None


@pytest.mark.parametrize("kwargs, pin", [
    ({"routing_method_type": "Renormalize", "n_group": 8}, "0.7.2"),  # routingCustom: no group check
    ({"routing_method_type": "DeepSeekV3", "n_group": 1}, "0.7.2"),  # n_group <= 1: routingCustom
    ({"routing_method_type": "DeepSeekV3", "n_group": None}, "0.7.2"),
    ({"routing_method_type": None, "n_group": 8}, "0.7.2"),  # method not read
    ({"routing_method_type": "DeepSeekV3", "n_group": 8}, "0.9.9"),  # a FlashInfer version not read
])
def test_no_raise_outside_the_checked_case(rsf, kwargs, pin):
    assert routing_kernel_rejects(_run(_hit("trtllm_fp8_block_scale_moe", **kwargs)), rsf, pin) is None


def test_a_branch_that_does_not_raise_keeps_the_path(rsf):
    raising = _hit("trtllm_fp8_block_scale_moe", routing_method_type="DeepSeekV3", n_group=8)
    other = _hit("trtllm_bf16_moe", line=9, routing_method_type="Renormalize", n_group=8)
    assert routing_kernel_rejects(_run(raising, other), rsf, "0.7.2") is None


def test_a_routed_variant_branch_keeps_the_path(rsf):
    # 0.5.19 Fp8MoEMethod/flashinfer_trtllm_routed reaches the routed FP8 op on one branch, a logits op on another
    raising = _hit("trtllm_fp8_per_tensor_scale_moe_wrapper", routing_method_type="DeepSeekV3", n_group=8)
    routed = _hit("trtllm_fp8_block_scale_routed_moe", line=9, routing_method_type="TopK", n_group=None)
    assert routing_kernel_rejects(_run(raising, routed), rsf, "0.6.18") is None


def test_routed_variants_do_not_route_from_logits(rsf):
    # top-k ids given: no groups argument in the table, so not judged by the shape check
    for name in ("trtllm_fp4_block_scale_routed_moe", "trtllm_fp8_block_scale_routed_moe", "trtllm_bf16_routed_moe"):
        assert "groups" not in rsf.sinks[name]
    hit = _hit("trtllm_fp8_block_scale_routed_moe", routing_method_type="DeepSeekV3", n_group=8)
    assert routing_kernel_rejects(_run(hit), rsf, "0.7.2") is None


@pytest.mark.parametrize("name", PARAMS)
def test_released_fp8_trtllm_is_unusable_for_every_routing_parameter(name):
    # SGLang 0.5.19 (flashinfer-python 0.6.18): Fp8MoEMethod hands the TRT-LLM FP8 kernel routing method
    # DeepSeekV3 (fp8.py 2615-2618: Bailing sets no routing_method_type) and topk_config.num_expert_group
    (row,) = audit_param(released("0.5.19"), name, ["fp8-trtllm"])
    assert row.verdict == ParamVerdict.UNUSABLE, row.rule
    assert (row.file, row.line) == ("layers/moe/moe_runner/flashinfer_trtllm.py", 889)
    assert "64 experts per group > 32" in row.rule and "flashinfer-python 0.6.18" in row.rule


def test_undecided_method_says_the_deepseek_branch_would_raise(rsf):
    """A call whose routing method is one of DeepSeekV3 or a value not read (a branch not decided) names the
    branch that would raise. (SGLang 0.5.22's fp8-trtllm was such a row until round 11 judged the TRT-LLM runner
    on CUDA only: its XPU-only branch had left the method open; now it is UNUSABLE, below.)"""
    from nvfp4study.sglang.param_routing import raise_note

    sink = rsf.sinks["trtllm_fp8_block_scale_moe"]
    hit = _hit("trtllm_fp8_block_scale_moe", n_group=8)
    hit.kwargs["routing_method_type"] = cv.Multi(("DeepSeekV3", cv.UNK))
    assert raise_note(hit, sink, rsf).startswith("; its DeepSeekV3 branch would raise: it routes from the router logits")
    hit.kwargs["n_group"] = 1  # no groups: routingDeepSeek's checks sit under mNumExpertGroups > 1
    assert raise_note(hit, sink, rsf) == ""


def test_fp8_trtllm_on_0_5_22_is_unusable_once_the_xpu_branch_is_gone():
    # round 11 (runner_devices: FlashInfer's TRT-LLM runners run on CUDA only): the method is DeepSeekV3
    (row,) = audit_param(released("0.5.22"), "routed_scaling_factor", ["fp8-trtllm"])
    assert row.verdict == ParamVerdict.UNUSABLE, row.rule
    assert "64 experts per group > 32" in row.rule
