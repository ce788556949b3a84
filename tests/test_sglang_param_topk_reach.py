"""Issue 36, tenth round: where TopK's routing runs and which runner branches Ling reaches, for a scalar factor.

Three rules, each checked on a synthetic module or on the released source at the lines that decide it:

- a runner branch whose ``assert`` a stated fact of the path makes false (TopK's output format on this path) raises
  for Ling whatever the parameter is: for a parameter other than the clamp that branch ends there (0.5.22
  flashinfer_trtllm.py 978-979: the FP8 per-tensor branch asserts a bypassed TopK, which the routed backend does
  not give, topk.py 735-740);
- a method path that cannot run Ling (its clamp row UNUSABLE ...) is no caller whose top-k decides a runner-level
  path's (0.5.22 CompressedTensorsW8A8Fp8MoE: the routed fused function raises a TypeError, flashinfer_trtllm.py
  1738-1766);
- where TopK hands the router logits to the runner and nothing materialises its routing, its fold into the top-k
  weights never runs, whatever FusedMoE's flag says (0.5.20 ModelOptNvFp4FusedMoEMethod on flashinfer_trtllm:
  the runner's trtllm_fp4_block_scale_moe routes with RoutingMethodType.Default, flashinfer_trtllm.py 1480-1484,
  because BailingMoeV3 passes no routing_method_type: FusedMoE keeps None, fused_moe_triton/layer.py 327, 527,
  and the method reads it, modelopt_quant.py 3020-3022).
"""

from __future__ import annotations

import pytest

from nvfp4study.sglang import clamp_values as cv
from nvfp4study.sglang import moe_params
from nvfp4study.sglang.audit import path_specs
from nvfp4study.sglang.clamp_flow import Interp
from nvfp4study.sglang.param_audit import ParamVerdict, audit_param
from nvfp4study.sglang.param_routing import routing_verdict, topk_format_facts, topk_never_routes
from nvfp4study.sglang.param_runner import runnable_callers
from sglang_fixtures import released

RSF = "routed_scaling_factor"

#: a runner whose second branch asserts a bypassed TopK (as 0.5.22 flashinfer_trtllm.py 978-1004)
_RUNNER = (
    "def f(topk_output, quant_info, rsf):\n"
    "    if quant_info.block_quant:\n"
    "        return trtllm_fp8_block_scale_routed_moe(routed_scaling_factor=rsf)\n"
    "    assert TopKOutputChecker.format_is_bypassed(topk_output)\n"
    "    return trtllm_fp8_per_tensor_scale_moe(routed_scaling_factor=rsf)\n"
)


def _run(tmp_path, code: str, param: str, assume: dict) -> tuple[Interp, cv.Frame]:
    src = tmp_path / "sglang" / "srt"
    src.mkdir(parents=True, exist_ok=True)
    (src / "x.py").write_text(code)
    p = moe_params.param(param)
    interp = Interp(tmp_path, p.sinks, assume, ("CUDA",), param=p)
    fn = interp.find("sglang/srt/x.py", "f")
    frame = cv.Frame(interp.module("sglang/srt/x.py"), None, "f")
    interp._bind(fn, frame, [], {"rsf": p.tracked()}, method_call=False)
    interp.exec_body(fn.body, frame)
    return interp, frame


def test_an_assert_a_path_fact_makes_false_ends_the_branch(tmp_path):
    interp, _ = _run(tmp_path, _RUNNER, RSF, {"format_is_bypassed()": False})
    assert [h.callee for h in interp.hits] == ["trtllm_fp8_block_scale_routed_moe"]
    # a TopK that hands the logits on passes the assert: both kernels are reached
    interp, _ = _run(tmp_path, _RUNNER, RSF, {"format_is_bypassed()": True})
    assert sorted(h.callee for h in interp.hits) == ["trtllm_fp8_block_scale_routed_moe",
                                                     "trtllm_fp8_per_tensor_scale_moe"]


def test_a_branch_raising_on_every_path_fact_raises_always(tmp_path):
    code = "def f(topk_output, rsf):\n    assert TopKOutputChecker.format_is_bypassed(topk_output)\n    return g(rsf)\n"
    _, frame = _run(tmp_path, code, RSF, {"format_is_bypassed()": False})
    assert frame.raises_always()


def test_the_clamp_ends_such_a_branch_too(tmp_path):
    """Since round 11 the clamp audit takes TopK's output format too (r11a): the same assert ends the clamp's
    branch, while one the path's facts leave open (no predicate stated) is recorded and the run goes on."""
    code = "def f(topk_output, rsf):\n    assert TopKOutputChecker.format_is_bypassed(topk_output)\n    return g(rsf)\n"
    _, frame = _run(tmp_path, code, "gemm1_clamp_limit", {"format_is_bypassed()": False})
    assert frame.raises_always()
    _, frame = _run(tmp_path, code, "gemm1_clamp_limit", {})
    assert not frame.raises_always() and frame.returns


def test_an_assert_no_path_fact_decides_does_not_end_the_branch(tmp_path):
    """An attribute the interpreter holds None (set where it does not follow, e.g. 0.5.22 layer._cutedsl_wrapper,
    flashinfer_cutedsl.py 353) is no fact of the path: the branch goes on."""
    code = "def f(rsf):\n    w = None\n    assert w is not None\n    return trtllm_fp8_per_tensor_scale_moe(routed_scaling_factor=rsf)\n"
    interp, frame = _run(tmp_path, code, RSF, {})
    assert [h.callee for h in interp.hits] == ["trtllm_fp8_per_tensor_scale_moe"] and not frame.raises_always()


def _spec(tree, pid: str) -> dict:
    return next(s for s in path_specs(tree) if s["id"] == pid)


def test_a_caller_that_cannot_run_ling_is_no_caller():
    tree = released("0.5.22")
    specs = path_specs(tree)
    ids = {s["id"] for s in runnable_callers(tree, _spec(tree, "fused:none/flashinfer_trtllm_routed"), specs, {})}
    assert "CompressedTensorsW8A8Fp8MoE/flashinfer_trtllm_routed" not in ids
    # BF16 asserts no fused shared expert, and it holds: the server arguments force fusion off for the
    # routed TRT-LLM runner (overrides.py _moe_runner_fusion_disable; test_sglang_shared_fusion)
    assert "UnquantizedFusedMoEMethod/flashinfer_trtllm_routed" in ids
    assert "Fp8MoEMethod/flashinfer_trtllm_routed" in ids
    # a method path's specs are left as they are
    own = _spec(tree, "Fp8MoEMethod/flashinfer_trtllm_routed")
    assert runnable_callers(tree, own, specs, {}) is specs


@pytest.mark.parametrize("version", ["0.5.19", "0.5.22"])
def test_the_routed_trtllm_runner_applies_it_once(version):
    """TopK folds 2.5 into the routed weights; the routed kernels take them as given (KP.md); the per-tensor FP8
    branch (asserts a bypassed TopK) and CompressedTensorsW8A8Fp8MoE (TypeError) are no branch Ling reaches."""
    (row,) = audit_param(released(version), RSF, ["fused:none/flashinfer_trtllm_routed"])
    assert row.verdict == ParamVerdict.APPLIED, row.rule
    assert row.parts == {"top-k": 1, "runner": 0, "model": 0}
    assert not any("per_tensor_scale_moe" in e for e in row.evidence)


def test_a_bypassed_topk_folds_nothing_0_5_20():
    tree = released("0.5.20")
    spec = _spec(tree, "modelopt-nvfp4-trtllm")
    assert topk_never_routes(tree, spec, topk_format_facts(tree, spec)) is not None
    (row,) = audit_param(tree, RSF, ["modelopt-nvfp4-trtllm"])
    assert row.verdict == ParamVerdict.DROPPED, row.rule
    assert row.parts == {"top-k": 0, "runner": 0, "model": 0}
    assert any("routing method Default" in e for e in row.evidence)
    # the routing parameters read the same method on the same call
    word, rule, _, _ = routing_verdict(tree, spec, moe_params.param("correction_bias"))
    assert word == "DROPPED" and "routing method Default" in rule


def test_a_topk_that_routes_still_folds_0_5_23():
    """0.5.23's TopK routes itself for a layer with no routing method (topk.py 791-806, STANDARD): it folds."""
    tree = released("0.5.23")
    spec = _spec(tree, "modelopt-nvfp4-trtllm")
    assert topk_never_routes(tree, spec, topk_format_facts(tree, spec)) is None
    (row,) = audit_param(tree, RSF, ["modelopt-nvfp4-trtllm"])
    assert row.verdict == ParamVerdict.APPLIED and row.parts["top-k"] == 1, row.rule
