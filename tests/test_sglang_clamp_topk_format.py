"""The clamp audit takes TopK's output format on each path (issue 36, r11a, twelfth clamp sample): a runner
branch whose first act is an assert that format makes false raises for Ling whatever the limit, so it is no
branch Ling reaches (0.5.21 ``fused_experts_none_to_flashinfer_trtllm_fp8``'s per-tensor branch asserts
``format_is_bypassed`` (moe_runner/flashinfer_trtllm.py 935-936), which TopK never gives the routed backend:
topk.py 682-687 bypasses for ``is_flashinfer_trtllm()`` only, which excludes it, moe/utils.py 129-135)."""

from __future__ import annotations

import pytest

from nvfp4study.sglang import audit as sa
from sglang_fixtures import mini_tree, released

SINK_MOD = "sglang/srt/layers/moe/toy.py"
RUNNER = """
    def run(runner_config, topk_output, quant_info):
        if quant_info.block_quant:
            out = trtllm_fp8_block_scale_moe(gemm1_clamp_limit=runner_config.gemm1_clamp_limit)
        else:
            assert TopKOutputChecker.format_is_bypassed(topk_output)
            out = trtllm_fp8_per_tensor_scale_moe()
        return out
"""


@pytest.mark.parametrize("bypassed,verdict,line", [(False, "APPROX", 4), (True, "DROPPED", 7), (None, "DROPPED", 7)])
def test_an_assert_the_topk_format_makes_false_ends_the_branch(tmp_path, bypassed, verdict, line):
    # computed by hand: the block branch passes the limit to a pre-form kernel (APPROX), the per-tensor
    # one passes none (DROPPED); the latter runs only where TopK's format is bypassed or unknown
    t = mini_tree(tmp_path, "0.5.23", {SINK_MOD: RUNNER})
    spec = {"id": "toy", "label": "toy", "steps": ["layers/moe/toy.py::run"]}
    if bypassed is not None:
        spec["assume"] = {"format_is_bypassed()": bypassed}
    r = sa.audit_path(t, spec)
    assert (r.verdict.value, r.line) == (verdict, line), r.rule


def test_fp8_trtllm_routed_on_0_5_19_takes_its_block_scale_branch():
    # 0.5.19: TopK gives the routed backend the standard format (topk.py bypasses is_flashinfer_trtllm() only),
    # so the per-tensor branch's assert (moe_runner/flashinfer_trtllm.py, format_is_bypassed) raises; the
    # block-scale routed call hands gemm1_clamp_limit to trtllm_fp8_block_scale_routed_moe: pre form (K.md)
    r = {r.path: r for r in sa.audit_tree(released("0.5.19"))}["Fp8MoEMethod/flashinfer_trtllm_routed"]
    assert (r.verdict.value, r.sink) == ("APPROX", "trtllm_fp8_block_scale_routed_moe"), r.rule


def test_fp8_trtllm_on_0_5_23_keeps_its_per_tensor_routed_branch():
    # 0.5.23 materializes TopK's standard output into routed ids (use_routed_topk |= materialized_topk) and runs
    # the per-tensor FP8 body through trtllm_fp8_per_tensor_scale_routed_moe, whose kwargs name no limit
    # (layers/moe/flashinfer_trtllm_moe.py 358-380): DROPPED, whatever the per-tensor branch's assert does
    rows = {r.path: r for r in sa.audit_tree(released("0.5.23"))}
    for path in ("fp8-trtllm", "Fp8MoEMethod/flashinfer_trtllm_routed"):
        assert (rows[path].verdict.value, rows[path].sink) == ("DROPPED", "trtllm_fp8_per_tensor_scale_routed_moe"), \
            rows[path].rule
