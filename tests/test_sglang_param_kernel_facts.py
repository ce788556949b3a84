"""The parameter audit follows the compiled kernels' facts of docs/blind-readings/KP.md.

- FlashInfer's TRT-LLM-Gen routing applies routed_scaling_factor to the top-k weights for the DeepSeekV3
  routing method only (``by-method`` sinks, ``needs: route_scale``); its ``*_routed_moe`` ops take the
  weights as given (``none``); on a path where top-k folds the factor, a kernel that routes from the
  logits itself is not decided (``if_topk_folds: unread``).
- sgl-kernel's CPU routing ops: their source for the pinned sglang-kernel was not read (``unread``), and
  topk.py binds ``biased_grouped_topk`` / ``grouped_topk`` / ``fused_topk`` to them on an AMX CPU
  (``bound_on``), which the expected bindings below are read from, independently, in each release's source.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from nvfp4study.sglang import clamp_values as cv
from nvfp4study.sglang import moe_params
from nvfp4study.sglang.param_audit import runner_applications
from nvfp4study.sglang.param_routing import judge_hit
from sglang_fixtures import VERSIONS, released

KP = Path(__file__).resolve().parents[1] / "docs" / "blind-readings" / "KP.md"
ROUTING = ("norm_topk_prob", "correction_bias", "grouped_topk")


def _hit(callee: str, **kwargs) -> cv.SinkHit:
    nodes = {k: ast.Name("x") if isinstance(v, cv.Tracked) else ast.Constant(v) for k, v in kwargs.items()}
    return cv.SinkHit(callee, "sglang/srt/layers/moe/moe_runner/x.py", "f", 7, kwargs, [], nodes)


def _run(*hits: cv.SinkHit) -> SimpleNamespace:
    """A path's run as runner_applications reads it: the sink calls reached, nothing dead, nothing opaque."""
    interp = SimpleNamespace(hits=list(hits), opaque=[], attrs={}, live=set(), find=lambda r, q: None)
    return SimpleNamespace(interp=interp, steps=[])


@pytest.fixture(scope="module")
def rsf() -> moe_params.ParamSpec:
    return moe_params.param("routed_scaling_factor")


def _kp_scaled_methods() -> set[str]:
    """The routing methods KP.md's TRT-LLM table marks as applying routed_scaling_factor (last column "yes")."""
    out = set()
    for line in KP.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[-1].startswith("yes"):
            out |= set(re.findall(r"([A-Za-z0-9]+) \(\d+\)", cells[0]))
    return out


def test_the_route_scale_column_is_kp_md_s_table(rsf):
    methods = rsf.applications["routing_methods"]
    scaled = {m for m, row in methods.items() if row["route_scale"]}
    # KP.md also names MiniMax2, which SGLang's RoutingMethodType lacks (not a row of the table)
    assert scaled == _kp_scaled_methods() & set(methods) == {"DeepSeekV3"}
    # every routing parameter reads the same table
    assert all(moe_params.param(p).applications["routing_methods"] == methods for p in ROUTING)


@pytest.mark.parametrize("method, want", [("DeepSeekV3", 1), (2, 1), ("Renormalize", 0), ("TopK", 0),
                                          ("Default", 0), (None, None)])
def test_trtllm_routing_applies_the_factor_for_deepseek_only(rsf, method, want):
    hit = _hit("trtllm_fp8_block_scale_moe", routed_scaling_factor=rsf.tracked(), routing_method_type=method)
    got, evidence, _ = runner_applications(_run(hit), rsf)
    assert got == want, evidence
    if want == 0:
        assert "does not apply it (routing method" in evidence[0]


def test_positional_fp4_call_reads_its_method_argument(rsf):
    args = [None] * 27
    args[24], args[26] = "DeepSeekV3", rsf.tracked()
    hit = cv.SinkHit("trtllm_fp4_block_scale_moe", "sglang/srt/x.py", "f", 3, {}, args, {})
    assert runner_applications(_run(hit), rsf)[0] == 1
    args[24] = "Renormalize"
    assert runner_applications(_run(hit), rsf)[0] == 0


def test_a_logit_routing_kernel_where_top_k_folds_is_not_decided(rsf):
    hit = _hit("trtllm_bf16_moe", routed_scaling_factor=rsf.tracked(), routing_method_type="DeepSeekV3")
    got, evidence, _ = runner_applications(_run(hit), rsf, topk_folds=True)
    assert got is None and "ignoring TopK's folded weights" in evidence[0]


@pytest.mark.parametrize("callee", ["trtllm_bf16_routed_moe", "trtllm_fp4_block_scale_routed_moe",
                                    "trtllm_fp8_block_scale_routed_moe",
                                    "trtllm_fp8_block_scale_routed_moe_out_wrapper",
                                    "trtllm_fp8_per_tensor_scale_routed_moe",
                                    "trtllm_fp8_per_tensor_scale_routed_moe_out_wrapper"])
def test_routed_variants_take_the_weights_as_given(rsf, callee):
    hit = _hit(callee, routed_scaling_factor=rsf.tracked(), routing_method_type="DeepSeekV3")
    for folds in (False, True):
        got, evidence, _ = runner_applications(_run(hit), rsf, topk_folds=folds)
        assert got == 0 and "does not apply it" in evidence[0]


def _amx_bindings(version: str) -> dict[str, str]:
    """``name -> function`` assigned under ``if _is_cpu and _is_cpu_amx_available:`` in the release's topk.py."""
    tree = ast.parse(released(version).file("sglang/srt/layers/moe/topk.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "_is_cpu and _is_cpu_amx_available":
            return {a.targets[0].id: a.value.id for a in node.body
                    if isinstance(a, ast.Assign) and isinstance(a.value, ast.Name)}
    return {}


@pytest.mark.parametrize("version", VERSIONS)
def test_cpu_bindings_are_the_release_s(version):
    bound = _amx_bindings(version)
    assert bound, version
    for name in ROUTING:
        sinks = moe_params.param(name).sinks
        data = {k: v["bound_on"]["CPU"] for k, v in sinks.items() if "bound_on" in v}
        assert data == {k: v for k, v in bound.items() if k in sinks}, (version, name)


@pytest.mark.parametrize("name", ROUTING)
def test_biased_grouped_topk_on_an_amx_cpu_is_not_decided(name):
    param = moe_params.param(name)
    arg = {"correction_bias": "correction_bias", "grouped_topk": "num_expert_group",
           "norm_topk_prob": "renormalize"}[name]
    hit = _hit("biased_grouped_topk", **{arg: param.tracked()})
    assert judge_hit(hit, param, "CUDA")[0] == "APPLIED"
    word, evidence = judge_hit(hit, param, "CPU")
    assert word == "UNDECIDED" and "biased_grouped_topk_cpu on CPU" in evidence
    assert judge_hit(hit, param)[0] == "APPLIED"  # several device classes: the name's own form
