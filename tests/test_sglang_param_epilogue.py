"""Two classes of the parameter audit where blind readers disagreed with it (issue 36), on the released source.

Hand readings (the rules):
- The Triton (and Marlin) epilogue: on CUDA above 32 tokens SGLang hands routed_scaling_factor to the compiled
  ``sgl_kernel.moe_sum_reduce`` (0.5.20 layers/moe/moe_runner/triton_utils/fused_moe.py 60 import under
  ``if _is_cuda:``, 903 the call; at most 32 tokens SGLang's own moe_sum_reduce_triton / _torch_compile, 891 /
  897, which multiply by it). The pinned sglang-kernel wheels are binary and not tied to the source read
  (docs/blind-readings/KP.md), so that branch is UNDECIDED and, the worst reachable branch deciding, so is the
  path; on ROCm (no aiter) only SGLang's own sums run: APPLIED. Marlin's non-E8M0 sum is the same compiled op
  (fused_marlin_moe.py 14-15 import on CUDA, 422-426 the call in 0.5.20).
- A method that routes again from the router logits: 0.5.20 QuarkW4A8MXFp4MoE.apply_weights on gfx1250 unpacks
  ``topk_weights, topk_ids, router_logits`` from TopK's output and calls ``aiter_w4a8_gfx1250_forward(
  router_logits=router_logits, ..., renormalize=True)`` (quark_w4a8_mxfp4_moe.py 430-460), whose aiter
  ``routing(router_logits, topk, sm_first=not renormalize)`` is a softmax top-k (aiter_mxfp4_w4a8_moe.py
  153-159): no bias, no groups, a softmax renormalisation -> correction_bias DROPPED, grouped_topk DROPPED,
  norm_topk_prob WRONG (the worst of that branch and TopK's APPLIED one); routed_scaling_factor DROPPED.
"""

from __future__ import annotations

import ast
import re

import pytest

from nvfp4study.sglang import moe_params
from nvfp4study.sglang.clamp_flow import Interp
from nvfp4study.sglang.param_audit import ParamVerdict, audit_param
from nvfp4study.sglang.param_epilogue import epilogue_sums
from nvfp4study.sglang.platforms import PLATFORMS, predicate_value
from sglang_fixtures import VERSIONS, released

TAIL = "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe.py"
MARLIN = "sglang/srt/layers/moe/fused_moe_triton/fused_marlin_moe.py"
QUARK = "sglang/srt/layers/quantization/quark/schemes/quark_w4a8_mxfp4_moe.py"
AITER = "sglang/srt/layers/moe/fused_moe_triton/aiter_mxfp4_w4a8_moe.py"


def _lines(tree, rel: str) -> list[str]:
    return (tree.root / rel).read_text().splitlines()


def _line(tree, rel: str, pattern: str, after: int = 0) -> int:
    """The first line (1-based) at or after ``after`` of ``rel`` matching ``pattern``."""
    return next(i + 1 for i, t in enumerate(_lines(tree, rel)) if i + 1 >= after and re.search(pattern, t))


def _cuda_compiled_sum(tree) -> int:
    """The compiled sum's call line in the tail's CUDA branch (``elif _is_cuda or _is_musa:``), read from the text."""
    branch = _line(tree, TAIL, r"^\s+elif _is_cuda or _is_musa:$")
    hip = _line(tree, TAIL, r"^\s+elif _is_hip:$", branch)
    call = _line(tree, TAIL, r"^\s+moe_sum_reduce\($", branch)
    assert call < hip
    return call


def test_musa_is_none_of_the_device_classes():
    """``is_musa()`` (Moore Threads, 0.5.23 utils/common.py 228-234) is false on each class, so the tail's
    ``elif _is_cuda or _is_musa:`` branch is CUDA's alone."""
    assert all(predicate_value("is_musa", p) is False for p in PLATFORMS)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_moe_sum_reduce_binding_is_the_compiled_sgl_kernel_op(version):
    """The sink table's ``moe_sum_reduce: unread`` holds for the name as these releases bind it: every import of it
    in the two epilogue modules is from sgl_kernel, and no module of sglang/srt defines a function of that name."""
    tree = released(version)
    for rel in (TAIL, MARLIN):
        mod = ast.parse((tree.root / rel).read_text())
        sources = {n.module for n in ast.walk(mod) if isinstance(n, ast.ImportFrom)
                   and any(a.name == "moe_sum_reduce" for a in n.names)}
        assert sources == {"sgl_kernel"}, (rel, sources)
    defs = [p for p in (tree.root / "sglang/srt").rglob("*.py") if re.search(r"^def moe_sum_reduce\(", p.read_text(), re.M)]
    assert defs == []


@pytest.mark.parametrize("version", ["0.5.20", "0.5.23"])
def test_triton_tail_is_undecided_on_cuda_by_its_compiled_sum(version):
    tree = released(version)
    assert _line(tree, TAIL, r"^\s+from sgl_kernel import moe_sum_reduce$") < _line(tree, TAIL, r"^elif _is_cpu and")
    call = _cuda_compiled_sum(tree)
    _line(tree, TAIL, r"^\s+moe_sum_reduce_triton\($", _line(tree, TAIL, r"^\s+elif _is_cuda or _is_musa:$"))
    (row,) = audit_param(tree, "routed_scaling_factor", ["Fp8MoEMethod/triton"])
    assert row.verdict == ParamVerdict.UNDECIDED, row.rule
    assert row.parts == {"top-k": 0, "runner": None, "model": 0}
    assert f"fused_moe.py:{call} moe_sum_reduce() on CUDA" in row.rule, row.rule


@pytest.mark.parametrize("version", ["0.5.20", "0.5.23"])
def test_the_tails_own_sums_apply_where_no_compiled_sum_is_reached(version):
    """SGLang's own sums stay applied: on ROCm (the tail's ``elif _is_hip:`` branch, default environment)
    only moe_sum_reduce_torch_compile / moe_sum_reduce_triton get the factor; on CUDA the compiled one too."""
    tree = released(version)
    param = moe_params.param("routed_scaling_factor")
    sink = param.sinks["_fused_moe_kernel_sequence"]
    rocm = epilogue_sums(Interp(tree.root, {}, {}, ("ROCm",), param=param), sink, param)
    assert rocm and {f for f, _, _ in rocm} == {"applies"}, rocm
    assert {w.rsplit(" ", 1)[1] for _, w, _ in rocm} == {"moe_sum_reduce_torch_compile()", "moe_sum_reduce_triton()"}
    cuda = epilogue_sums(Interp(tree.root, {}, {}, ("CUDA",), param=param), sink, param)
    call = _cuda_compiled_sum(tree)
    assert ("unread", f"layers/moe/moe_runner/triton_utils/fused_moe.py:{call} moe_sum_reduce()", {"CUDA"}) in cuda
    assert {"applies", "unread"} == {f for f, _, _ in cuda}
    (row,) = audit_param(tree, "routed_scaling_factor", ["UnquantizedFusedMoEMethod/aiter"])  # ROCm only
    assert (row.verdict, row.platform) == (ParamVerdict.APPLIED, "ROCm"), row.rule


def test_marlins_scaled_sum_is_the_compiled_op():
    """0.5.20: fused_marlin_moe imports moe_sum_reduce from sgl_kernel under ``if _is_cuda:`` and its non-MXFP4
    branch calls it with the factor: an NVFP4 Marlin layer is UNDECIDED (the E8M0 branch's plain sum, 1.0, stays
    as it was: tests/test_sglang_param_classes.py)."""
    tree = released("0.5.20")
    assert _line(tree, MARLIN, r"^\s+from sgl_kernel import moe_sum_reduce$") > _line(tree, MARLIN, r"^if _is_cuda:$")
    call = _line(tree, MARLIN, r"^\s+moe_sum_reduce\($", _line(tree, MARLIN, r"routed_scaling_factor = 1\.0$"))
    for key in ("modelopt-nvfp4-marlin", "AWQMoEKernel/direct"):
        (row,) = audit_param(tree, "routed_scaling_factor", [key])
        assert row.verdict == ParamVerdict.UNDECIDED, (key, row.rule)
        assert f"fused_marlin_moe.py:{call} moe_sum_reduce() on CUDA" in row.rule, (key, row.rule)


@pytest.mark.parametrize("version", ["0.5.20", "0.5.23"])
def test_a_method_routing_again_from_the_logits_decides_its_branch(version):
    tree = released(version)
    call = _line(tree, QUARK, r"^\s+output = aiter_w4a8_gfx1250_forward\($", _line(tree, QUARK, r"def apply_weights\("))
    _line(tree, QUARK, r"topk_weights, topk_ids, router_logits = dispatch_output\.topk_output")
    assert "router_logits=router_logits," in "\n".join(_lines(tree, QUARK)[call:call + 3])
    assert "renormalize=True," in "\n".join(_lines(tree, QUARK)[call:call + 20])
    routing = _line(tree, AITER, r"[ .]routing\($", _line(tree, AITER, r"^def aiter_w4a8_gfx1250_forward\("))
    assert "router_logits, topk, sm_first=not renormalize" in _lines(tree, AITER)[routing]
    want = {"correction_bias": ParamVerdict.DROPPED, "grouped_topk": ParamVerdict.DROPPED,
            "norm_topk_prob": ParamVerdict.WRONG}
    for name, verdict in want.items():
        (row,) = audit_param(tree, name, ["QuarkW4A8MXFp4MoE/aiter"])
        assert row.verdict == verdict, (name, row.rule)
        assert (row.file, row.line) == (QUARK.removeprefix("sglang/srt/"), call), (name, row.file, row.line)
        assert "the worst of the branches: APPLIED" in row.rule, name  # TopK's own routing on the other branch
    (row,) = audit_param(tree, "routed_scaling_factor", ["QuarkW4A8MXFp4MoE/aiter"])
    assert row.verdict == ParamVerdict.DROPPED, row.rule
    assert f"{QUARK.removeprefix('sglang/srt/')}:{call} aiter_w4a8_gfx1250_forward() gets no" in " ".join(row.evidence)
