"""The routing parameters of Ling's MoE (norm_topk_prob, correction_bias, grouped_topk) on every path:
each rule of :mod:`nvfp4study.sglang.param_routing` checked on the released source at the line the
value was read from (the line found here independently, by scanning the file's text), and the
machinery on synthetic calls.

Hand readings (the rules):
- TopK's standard format (every runner that takes top-k ids and weights): select_experts takes
  ``use_grouped_topk`` and a set ``correction_bias`` to ``biased_grouped_topk(correction_bias=...,
  renormalize=..., num_expert_group=..., topk_group=...)`` (topk.py, select_experts) -> APPLIED, all three.
- triton_kernels (TopK's TRITON_KERNEL format): ``routing(router_logits, top_k, sm_first=not
  renormalize)`` in TopK.forward_cuda: a softmax top-k of the raw logits, no bias, no groups ->
  correction_bias and grouped_topk DROPPED, norm_topk_prob WRONG (a softmax renormalised, Ling's
  scores are sigmoid).
- flashinfer_trtllm on 0.5.19-0.5.22: TopK.forward_cuda bypasses (``is_flashinfer_trtllm()`` ->
  BYPASSED); the FP4 runner calls trtllm_fp4_block_scale_moe with ``routing_method_type`` from
  the quant info, None for Ling (FusedMoE's default; Bailing passes none) -> ``RoutingMethodType.Default``
  (softmax -> top-k: no bias, no groups, no renormalisation) -> DROPPED, all three. The FP8 runner
  gets ``getattr(layer, "routing_method_type", None) or RoutingMethodType.DeepSeekV3`` (fp8.py) ->
  DeepSeekV3 (sigmoid, bias, groups, renormalised) -> APPLIED.
- flashinfer_trtllm on 0.5.23: TopK.bind_runner_backend bypasses only when
  ``_can_bypass_trtllm_routing`` holds, False for routing_method_type None -> TopK routes itself ->
  APPLIED.
- Mxfp4MoEMethod with flashinfer_mxfp4 on 0.5.19 (mxfp4-sm100-trtllm): ``trtllm_fp4_block_scale_moe(
  ..., None,  # routing_bias ..., 1,  # routing_method_type, renormalize`` -> Renormalize (softmax):
  correction_bias and grouped_topk DROPPED, norm_topk_prob WRONG.
"""

from __future__ import annotations

import ast
import re

import pytest

from nvfp4study.sglang import clamp_values as cv
from nvfp4study.sglang import moe_params
from nvfp4study.sglang.clamp_flow import Interp
from nvfp4study.sglang.param_audit import ParamVerdict, audit_param
from nvfp4study.sglang.param_routing import _combine, judge_hit, routing_backend
from sglang_fixtures import released

ROUTING = ("norm_topk_prob", "correction_bias", "grouped_topk")
TOPK = "layers/moe/topk.py"
TRT = "layers/moe/moe_runner/flashinfer_trtllm.py"


def _lines(version: str, rel: str) -> list[str]:
    return (released(version).root / "sglang" / "srt" / rel).read_text().splitlines()


def _function_span(version: str, rel: str, name: str) -> tuple[int, int]:
    """(first, last) line of function or method ``name`` (``Class.method``) of a released file."""
    tree = ast.parse("\n".join(_lines(version, rel)))
    cls, _, fn = name.rpartition(".")
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and cls and node.name == cls:
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef) and sub.name == fn:
                    return sub.lineno, sub.end_lineno
        if not cls and isinstance(node, ast.FunctionDef) and node.name == fn:
            return node.lineno, node.end_lineno
    raise AssertionError(f"{name} not in {rel} of {version}")


def _line_of(version: str, rel: str, pattern: str, within: str | None = None) -> int:
    """The one line of ``rel`` matching ``pattern`` (inside function ``within``)."""
    lo, hi = _function_span(version, rel, within) if within else (1, 10 ** 9)
    hits = [i for i, t in enumerate(_lines(version, rel), 1) if lo <= i <= hi and re.search(pattern, t)]
    assert len(hits) == 1, (version, rel, pattern, hits)
    return hits[0]


def _rows(version: str, path: str) -> dict[str, object]:
    return {p: audit_param(released(version), p, [path])[0] for p in ROUTING}


# --- TopK's standard format: select_experts -> biased_grouped_topk --------------------------------
@pytest.mark.parametrize("version", ["0.5.19", "0.5.23"])
def test_standard_topk_applies_all_three(version):
    line = _line_of(version, TOPK, r"= biased_grouped_topk\($", within="select_experts")
    call = "\n".join(_lines(version, TOPK)[line - 1:line + 12])
    for kw in ("correction_bias=correction_bias", "renormalize=renormalize", "num_expert_group=num_expert_group"):
        assert kw in call
    for name, r in _rows(version, "triton").items():
        assert (r.verdict, r.file, r.line) == (ParamVerdict.APPLIED, TOPK, line), name
        assert "biased_grouped_topk() routes with" in r.rule


# --- triton_kernels: TopK's own softmax routing ---------------------------------------------------
@pytest.mark.parametrize("version", ["0.5.19", "0.5.21", "0.5.23"])
def test_triton_kernels_route_without_bias_and_groups(version):
    line = _line_of(version, TOPK, r"\) = routing\($", within="TopK.forward_cuda")
    assert "sm_first=not self.topk_config.renormalize" in "\n".join(_lines(version, TOPK)[line:line + 5])
    rows = _rows(version, "triton-kernels")
    assert {n: (r.verdict, r.file, r.line) for n, r in rows.items()} == {
        "norm_topk_prob": (ParamVerdict.WRONG, TOPK, line),
        "correction_bias": (ParamVerdict.DROPPED, TOPK, line),
        "grouped_topk": (ParamVerdict.DROPPED, TOPK, line)}


# --- flashinfer_trtllm: the runner routes (0.5.19-0.5.22), TopK routes (0.5.23) -------------------
@pytest.mark.parametrize("version", ["0.5.19", "0.5.20", "0.5.21", "0.5.22"])
def test_trtllm_fp4_runner_routes_with_the_default_method(version):
    fn = "fused_experts_none_to_flashinfer_trtllm_fp4"
    call = _line_of(version, TRT, r"result = trtllm_fp4_block_scale_moe\(\*\*moe_kwargs\)", within=fn)
    lo, hi = _function_span(version, TRT, fn)
    body = "\n".join(_lines(version, TRT)[lo - 1:hi])
    assert "else RoutingMethodType.Default" in body and "routing_bias=correction_bias" in body
    assert "get_moe_runner_backend().is_flashinfer_trtllm()" in "\n".join(
        _lines(version, TOPK)[slice(*_function_span(version, TOPK, "TopK.forward_cuda"))])
    for name, r in _rows(version, "modelopt-nvfp4-trtllm").items():
        assert (r.verdict, r.file, r.line) == (ParamVerdict.DROPPED, TRT, call), name
        assert "routing method Default" in r.rule and "BypassedTopKOutput()" in r.rule


def test_trtllm_fp8_runner_gets_deepseek_routing():
    version = "0.5.19"
    line = _line_of(version, "layers/quantization/fp8.py", r"or RoutingMethodType\.DeepSeekV3")
    assert "routing_method_type=int(" in _lines(version, "layers/quantization/fp8.py")[line - 3]
    for name, r in _rows(version, "fp8-trtllm").items():
        # the runner's DeepSeekV3 routing would route with the parameter (the evidence), but FlashInfer's grouped
        # routing kernel raises for Ling's 64 experts per group (F-05; test_sglang_param_routing_shape.py)
        assert any(f"routing method DeepSeekV3 routes with {name}" in e for e in r.evidence), name
        assert r.verdict == ParamVerdict.UNUSABLE and "routing method DeepSeekV3" in r.rule, name
        assert "64 experts per group > 32" in r.rule, name


def test_trtllm_keeps_topk_routing_on_0_5_23():
    version = "0.5.23"
    lo, hi = _function_span(version, TOPK, "_can_bypass_trtllm_routing")
    assert "method is None" in "\n".join(_lines(version, TOPK)[lo - 1:hi])
    bailing = "\n".join(_lines(version, "models/bailing_moe_v3.py"))
    assert "routing_method_type=self.experts.routing_method_type" in bailing
    assert "routing_method_type=" not in bailing.split("self.experts = get_moe_impl_class")[1].split("self.topk")[0]
    line = _line_of(version, TOPK, r"= biased_grouped_topk\($", within="select_experts")
    for name, r in _rows(version, "modelopt-nvfp4-trtllm").items():
        assert (r.verdict, r.file, r.line) == (ParamVerdict.APPLIED, TOPK, line), name


def test_mxfp4_trtllm_routes_with_renormalize_softmax():
    version, rel = "0.5.19", "layers/quantization/mxfp4.py"
    line = _line_of(version, rel, r"trtllm_gen_output = trtllm_fp4_block_scale_moe\(")
    text = _lines(version, rel)
    assert text[line + 24].strip() == "1,  # routing_method_type, renormalize"  # the call's #24
    assert text[line + 1].strip() == "None,  # routing_bias"  # #1
    rows = _rows(version, "mxfp4-sm100-trtllm")
    assert {n: (r.verdict, r.file, r.line) for n, r in rows.items()} == {
        "norm_topk_prob": (ParamVerdict.WRONG, rel, line),
        "correction_bias": (ParamVerdict.DROPPED, rel, line),
        "grouped_topk": (ParamVerdict.DROPPED, rel, line)}


def test_a_runner_that_materialises_topk_routes_with_select_experts():
    version = "0.5.23"
    line = _line_of(version, "layers/moe/moe_runner/flashinfer_cutlass.py", r"topk_output\.to_standard\(\)")
    for name, r in _rows(version, "mxfp4-cutlass").items():
        assert r.verdict == ParamVerdict.APPLIED, name
        assert f"flashinfer_cutlass.py:{line} to_standard() materialises TopK's routing" in r.rule


def test_paths_that_cannot_run_ling_keep_the_clamp_audit_verdict():
    for name, r in _rows("0.5.23", "nvfp4-w4a4-trtllm").items():
        assert r.verdict == ParamVerdict.UNUSABLE and "routing_method_type is not None" in r.rule, name


def test_cli_routing_rows(capsys):
    from nvfp4study.cli import main as cli_main

    assert cli_main(["audit-sglang", "--param", "correction_bias", "--version", "0.5.23"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^nvfp4-w4a4-cutlass\s+APPLIED\s+layers/moe/topk.py:\d+", out, re.M)
    assert re.search(r"^triton-kernels\s+DROPPED\s+layers/moe/topk.py:\d+", out, re.M)


# --- the machinery on synthetic calls --------------------------------------------------------------
def _hit(callee: str, **kwargs) -> cv.SinkHit:
    return cv.SinkHit(callee, "sglang/srt/x.py", "f", 7, kwargs, [], {k: ast.Constant(v) if not isinstance(
        v, cv.Tracked) else ast.Name("x") for k, v in kwargs.items()})


@pytest.fixture
def bias():
    return moe_params.param("correction_bias")


def test_an_applying_function_with_or_without_the_value(bias):
    assert judge_hit(_hit("biased_grouped_topk", correction_bias=bias.tracked()), bias)[0] == "APPLIED"
    word, ev = judge_hit(_hit("biased_grouped_topk", correction_bias=None), bias)
    assert word == "DROPPED" and "gets no correction_bias (None)" in ev
    assert judge_hit(_hit("biased_grouped_topk"), bias)[0] == "DROPPED"
    partial = cv.Multi((bias.tracked(), None))
    assert judge_hit(_hit("biased_grouped_topk", correction_bias=partial), bias)[0] == "UNDECIDED"


def test_the_forms_none_wrong_runner_topk(bias):
    norm = moe_params.param("norm_topk_prob")
    assert judge_hit(_hit("routing"), bias)[0] == "DROPPED"
    assert judge_hit(_hit("routing"), norm)[0] == "WRONG"
    assert judge_hit(_hit("BypassedTopKOutput"), bias)[0] == "RUNNER"
    assert judge_hit(_hit("to_standard"), bias)[0] == "TOPK"
    assert judge_hit(_hit("trtllm_bf16_routed_moe"), bias)[0] == "UNDECIDED"


@pytest.mark.parametrize("method,bias_word,norm_word", [
    ("DeepSeekV3", "APPLIED", "APPLIED"), ("Default", "DROPPED", "DROPPED"),
    ("Renormalize", "DROPPED", "WRONG"), (1, "DROPPED", "WRONG"), ("SigmoidRenorm", "DROPPED", "APPLIED"),
    (None, "UNDECIDED", "UNDECIDED")])
def test_a_trtllm_kernel_follows_its_routing_method(bias, method, bias_word, norm_word):
    norm = moe_params.param("norm_topk_prob")
    h = _hit("trtllm_fp8_block_scale_moe", routing_bias=bias.tracked(), routing_method_type=method)
    assert judge_hit(h, bias)[0] == bias_word
    assert judge_hit(h, norm)[0] == norm_word


def test_a_method_using_the_bias_without_it_drops_it(bias):
    h = _hit("trtllm_fp8_block_scale_moe", routing_bias=None, routing_method_type="DeepSeekV3")
    word, ev = judge_hit(h, bias)
    assert word == "DROPPED" and "argument not carried" in ev


def test_combine_names_disagreement():
    assert _combine([], "TopK on CUDA")[0] == "UNDECIDED"
    assert _combine([("APPLIED", "a"), ("APPLIED", "b")], "w")[:2] == ("APPLIED", "a")
    # reachable branches that differ: the worst (issue 36's class, the readers' order), its branch first
    word, rule, ev = _combine([("APPLIED", "a"), ("DROPPED", "b")], "TopK on ROCm")
    assert word == "DROPPED" and rule == "b (the worst of the branches: APPLIED, DROPPED)" and ev == ["b", "a"]
    assert _combine([("APPLIED", "a"), ("WRONG", "b"), ("UNDECIDED", "c")], "w")[0] == "WRONG"
    assert _combine([("APPLIED", "a"), ("UNDECIDED", "c")], "w")[0] == "UNDECIDED"
    word, rule, _ = _combine([("APPLIED", "a"), ("RUNNER", "b")], "TopK on ROCm")
    assert word == "UNDECIDED" and "route differently (APPLIED, RUNNER)" in rule


def test_routing_backend_is_one_value():
    mod = type("M", (), {"tree": ast.parse("def f(b):\n    return b.is_triton_kernels() or b.is_aiter()\n")})()
    got = routing_backend(cv.Instance("MoeRunnerBackend", (), (("is_triton()", True),)), mod)
    assert dict(got.attrs) == {"is_triton()": True, "is_aiter()": False, "is_triton_kernels()": False}
    default = routing_backend(cv.Instance("MoeRunnerBackend"), mod)
    assert dict(default.attrs)["is_auto()"] is True


def _interp(tmp_path, code: str, extra: dict[str, str] | None = None) -> tuple[Interp, object]:
    src = tmp_path / "sglang" / "srt"
    src.mkdir(parents=True, exist_ok=True)
    (src / "x.py").write_text(code)
    for name, text in (extra or {}).items():
        (src / name).write_text(text)
    interp = Interp(tmp_path, moe_params.param("correction_bias").sinks, None, ("CUDA",),
                    param=moe_params.param("correction_bias"))
    return interp, interp.find("sglang/srt/x.py", "f")


def test_an_enum_member_survives_int_and_the_config_name_reads_facts(tmp_path):
    interp, fn = _interp(tmp_path, "def f(topk_config):\n"
                                   "    m = int(RoutingMethodType.DeepSeekV3)\n"
                                   "    return trtllm_fp8_block_scale_moe(routing_bias=topk_config.correction_bias,"
                                   " routing_method_type=m)\n")
    frame = cv.Frame(interp.module("sglang/srt/x.py"), None, "f")
    interp._bind(fn, frame, [], {"topk_config": cv.CONFIG}, method_call=False)
    interp.exec_body(fn.body, frame)
    (h,) = interp.hits
    assert h.kwargs["routing_method_type"] == "DeepSeekV3" and cv.has_tracked(h.kwargs["routing_bias"])
    assert judge_hit(h, moe_params.param("correction_bias"))[0] == "APPLIED"


def test_a_module_function_is_entered(tmp_path):
    interp, fn = _interp(tmp_path, "from sglang.srt import helper\n"
                                   "def f(topk_config):\n"
                                   "    a, b = helper.passthrough(1, topk_config.correction_bias)\n"
                                   "    return biased_grouped_topk(correction_bias=b)\n",
                         {"helper.py": "def passthrough(x, correction_bias):\n    return x, correction_bias\n"})
    frame = cv.Frame(interp.module("sglang/srt/x.py"), None, "f")
    interp._bind(fn, frame, [], {"topk_config": cv.CONFIG}, method_call=False)
    interp.exec_body(fn.body, frame)
    (h,) = interp.hits
    assert cv.has_tracked(h.kwargs["correction_bias"])
