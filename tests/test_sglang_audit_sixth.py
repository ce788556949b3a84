"""Error classes of the clamp audit found by comparing it with blind hand readings of SGLang
0.5.19-0.5.23 (issue 36, the sixth round), each fixed by a rule, not by a path's name, and tested
here on the released trees with values read from the source by this file (``ast``), not through
the audit.

1. A method's constructor gets the arguments of the site that builds it. ``FusedMoE.__init__``
   builds ``UnquantizedFusedMoEMethod(self.use_triton_kernels, self.use_flashinfer_trtllm_moe,
   self.use_deep_gemm)`` (layers/moe/fused_moe_triton/layer.py 457-461 in 0.5.20), those flags set
   above it from the runner backend's predicates (385-391); the method copies them in its
   ``__init__`` and ``create_moe_runner`` picks its backend by them before ``elif _is_npu:``
   (layers/quantization/unquant.py 948-966 in 0.5.20), which sets ``NPUUnquantMoEMethod`` as the
   layer's kernels. Under ``--moe-runner-backend ascend`` the flags are False, so the Ascend core
   takes ``NPUSwigluStepAndMul`` (post-SiLU: EXACT), not the quantized kernel's ``NPUSwigluQuant``.
"""

from __future__ import annotations

import ast

from nvfp4study.sglang.audit import audit_tree
from sglang_fixtures import VERSIONS, copy23_fixture, edit_once, released

__all__ = ["copy23_fixture"]  # the fixture, imported for the tests that take ``copy23``

SRT = "sglang/srt/"
LAYER = "layers/moe/fused_moe_triton/layer.py"
UNQUANT = "layers/quantization/unquant.py"
FLAGS = ("use_triton_kernels", "use_flashinfer_trtllm_moe", "use_deep_gemm")


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    c = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(f for f in c.body if isinstance(f, ast.FunctionDef) and f.name == name)


def _site_flags(srt) -> list[dict[str, str]]:
    """Per ``UnquantizedFusedMoEMethod(...)`` call in ``FusedMoE.__init__``: ``{flag: source of the
    last ``self.<flag> = ...`` before the call}`` for each flag it passes."""
    init = _method(ast.parse((srt / LAYER).read_text()), "FusedMoE", "__init__")
    calls = [n for n in ast.walk(init) if isinstance(n, ast.Call) and ast.unparse(n.func) == "UnquantizedFusedMoEMethod"]
    out = []
    for call in calls:
        site = {}
        for i, a in enumerate(call.args):
            assert ast.unparse(a) == f"self.{FLAGS[i]}", ast.unparse(a)
            sets = [n for n in ast.walk(init) if isinstance(n, ast.Assign) and n.lineno < call.lineno
                    and ast.unparse(n.targets[0]) == f"self.{FLAGS[i]}"]
            site[FLAGS[i]] = ast.unparse(max(sets, key=lambda n: n.lineno).value)
        out.append(site)
    return out


def test_a_method_built_by_the_layer_gets_the_layers_arguments():
    for v in VERSIONS:
        srt = released(v).srt
        sites = _site_flags(srt)
        assert len(sites) == 2 and {len(s) for s in sites} == {1, 3}, v  # the KT wrapper's GPU method passes one
        for site in sites:
            for flag, src in site.items():
                # each flag is a backend predicate (or two) other than is_ascend: False for ascend
                preds = [p.strip("()") for p in src.replace("get_moe_runner_backend().", " ").split() if p.startswith("is_")]
                assert preds and "is_ascend" not in preds and "get_moe_runner_backend()" in src, (v, flag, src)
        unq = ast.parse((srt / UNQUANT).read_text())
        init = ast.unparse(_method(unq, "UnquantizedFusedMoEMethod", "__init__"))
        assert all(f"self.{f} = {f}" in init for f in FLAGS), v
        runner = ast.unparse(_method(unq, "UnquantizedFusedMoEMethod", "create_moe_runner"))
        assert "elif _is_npu:" in runner and "layer.w13_kernel = NPUUnquantMoEMethod()" in runner, v
        assert all(runner.index(f"self.{f}") < runner.index("elif _is_npu:") for f in FLAGS), v
        (r,) = audit_tree(released(v), ["UnquantizedFusedMoEMethod/ascend"])
        assert r.verdict.value == "EXACT" and "NPUSwigluStepAndMul" in r.rule and "mixed" not in r.rule, (v, r.rule)


def test_a_flag_the_site_decides_true_takes_the_other_branch(copy23):
    # the layer's flag set True: create_moe_runner takes the triton_kernels branch, never sets the
    # NPU kernel, and the Ascend core no longer reaches the unquantized NPU kernel's branch alone
    edit_once(copy23, SRT + LAYER, "self.use_triton_kernels = get_moe_runner_backend().is_triton_kernels()",
              "self.use_triton_kernels = True")
    (r,) = audit_tree(copy23, ["UnquantizedFusedMoEMethod/ascend"])
    assert not (r.verdict.value == "EXACT" and "NPUSwigluStepAndMul" in r.rule and "mixed" not in r.rule), r.rule
