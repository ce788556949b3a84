"""Error classes of the clamp audit found by comparing it with blind hand readings of SGLang
0.5.19-0.5.23 (issue 36, the fifth round), each fixed by a rule, not by a path's name, and tested
here on the released trees with values read from the source by this file (``ast``), not through
the audit.

1. State one object stores on another during startup: ``AWQMoEScheme.create_moe_runner`` asserts
   the backend is ``auto`` and sets ``self.kernel.runner = MoeRunner(MoeRunnerBackend.MARLIN, ...)``
   on the ``AWQMoEKernel`` it holds (layers/quantization/awq/schemes/awq_moe.py 129-134 in
   0.5.19-0.5.23); the kernel's ``apply`` raises only while that runner is None
   (hardware_backend/gpu/quantization/awq_kernels.py 238-239 in 0.5.21) and then runs it
   (252), so the Marlin fused function runs (moe_runner/marlin.py), which passes the limit only
   with ``gemm1_alpha`` set: DROPPED, not UNUSABLE ("moe runner is not initialized").
2. The all-to-all backend a path runs with: ``none`` (``get_moe_a2a_backend`` falls back to
   ``MoeA2ABackend.NONE``, layers/moe/utils.py 465-469 in 0.5.20) unless the path's key names
   another (``fused:<a2a>/<runner>``). The Ascend runner core builds ``NPUSwigluDeepEPKernel``
   only under ``get_moe_a2a_backend().is_deepep()`` (layers/moe/moe_runner/ascend.py 100 in
   0.5.20); under ``none`` an unquantized NPU kernel (``NPUUnquantMoEMethod``, set by the method:
   gguf.py 810-811) takes ``NPUSwigluStepAndMul`` (post-SiLU: EXACT), while a quantized kernel's
   branch (``NPUSwigluQuant`` for W8A8) stays: the kernel the method builds decides
   ``isinstance``.
"""

from __future__ import annotations

import ast

from nvfp4study.sglang.audit import audit_tree
from sglang_fixtures import VERSIONS, copy23_fixture, edit_once, released

__all__ = ["copy23_fixture"]  # the fixture, imported for the tests that take ``copy23``

SRT = "sglang/srt/"
AWQ_SCHEME = "layers/quantization/awq/schemes/awq_moe.py"
AWQ_KERNEL = "hardware_backend/gpu/quantization/awq_kernels.py"


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    c = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(f for f in c.body if isinstance(f, ast.FunctionDef) and f.name == name)


def _held_runner_backend(srt) -> str:
    """The ``MoeRunnerBackend`` member ``AWQMoEScheme.create_moe_runner`` stores on its kernel."""
    fn = _method(ast.parse((srt / AWQ_SCHEME).read_text()), "AWQMoEScheme", "create_moe_runner")
    (st,) = [s for s in fn.body if isinstance(s, ast.Assign) and ast.unparse(s.targets[0]) == "self.kernel.runner"]
    assert ast.unparse(st.value.func) == "MoeRunner"
    return ast.unparse(st.value.args[0])


def test_a_runner_the_holder_stores_on_the_kernel_is_the_kernels_runner():
    for v in VERSIONS:
        srt = released(v).srt
        assert _held_runner_backend(srt) == "MoeRunnerBackend.MARLIN", v
        kernel = ast.parse((srt / AWQ_KERNEL).read_text())
        # the kernel never builds a runner: its __init__ leaves it None, apply raises only then
        init = ast.unparse(_method(kernel, "AWQMoEKernel", "__init__"))
        assert "self.runner" in init and "MoeRunner(" not in ast.unparse(kernel), v
        apply = _method(kernel, "AWQMoEKernel", "apply")
        raises = [n for n in ast.walk(apply) if isinstance(n, ast.If) and any(isinstance(b, ast.Raise) for b in n.body)]
        assert [ast.unparse(n.test) for n in raises] == ["self.runner is None"], v
        # the Marlin fused func passes the limit only with gemm1_alpha set (None for Ling)
        marlin = ast.parse((srt / "layers/moe/moe_runner/marlin.py").read_text())
        picks = {(ast.unparse(n.body), ast.unparse(n.test)) for n in ast.walk(marlin) if isinstance(n, ast.IfExp)}
        assert ("runner_config.gemm1_clamp_limit", "runner_config.gemm1_alpha is not None") in picks, v
        (r,) = audit_tree(released(v), ["AWQMoEKernel/direct"])
        assert r.verdict.value == "DROPPED", (v, r.rule)
        assert r.file == "layers/moe/moe_runner/marlin.py" and "fused_marlin_moe" in r.rule, (v, r.rule)
        assert any("AWQMoEScheme.create_moe_runner" in f for f in r.found_by), v


def test_without_the_holders_store_the_kernel_raises_again(copy23):
    # the same tree with the scheme's store removed: nothing sets the runner, apply raises
    edit_once(copy23, SRT + AWQ_SCHEME,
              "self.kernel.runner = MoeRunner(MoeRunnerBackend.MARLIN, moe_runner_config)", "pass")
    (r,) = audit_tree(copy23, ["AWQMoEKernel/direct"])
    assert r.verdict.value == "UNUSABLE" and "moe runner is not initialized" in r.rule, r.rule


ASCEND = "layers/moe/moe_runner/ascend.py"
QUANT_KERNELS = {"NPUW4A8Int8MoEMethod", "NPUW8A8Int8MoEMethod", "NPUMXFP8MoEMethod"}


def _class_bases(tree: ast.Module) -> dict[str, list[str]]:
    return {n.name: [ast.unparse(b) for b in n.bases] for n in tree.body if isinstance(n, ast.ClassDef)}


def test_under_the_default_all_to_all_backend_a_deepep_branch_is_not_lings():
    for v in VERSIONS:
        srt = released(v).srt
        utils = ast.parse((srt / "layers/moe/utils.py").read_text())
        getter = next(f for f in utils.body if isinstance(f, ast.FunctionDef) and f.name == "get_moe_a2a_backend")
        assert "MoeA2ABackend.NONE" in ast.unparse(getter), v
        assert ast.unparse(_method(utils, "MoeA2ABackend", "is_deepep").body[-1]) == \
            "return self == MoeA2ABackend.DEEPEP", v
        core = _method(ast.parse((srt / ASCEND).read_text()), "AscendRunnerCore", "__init__")
        deepep = [n for n in ast.walk(core) if isinstance(n, ast.If)
                  and ast.unparse(n.test) == "get_moe_a2a_backend().is_deepep()"]
        assert deepep and any("NPUSwigluDeepEPKernel(" in ast.unparse(b) for n in deepep for b in n.body), v
        # GGUF on NPU builds the unquantized NPU kernel, none of the quantized ones the core tests
        gguf = ast.parse((srt / "layers/quantization/gguf.py").read_text())
        built = {ast.unparse(st.value) for st in ast.walk(_method(gguf, "GGUFMoEAscendMethod", "__init__"))
                 if isinstance(st, ast.Assign) and ast.unparse(st.targets[0]) == "self.w2_kernel"}
        assert built == {"NPUUnquantMoEMethod()"}, v
        npu = ast.parse((srt / "hardware_backend/npu/quantization/moe_methods.py").read_text())
        assert not set(_class_bases(npu)["NPUUnquantMoEMethod"]) & QUANT_KERNELS, v
        for key in ("GGUFMoEAscendMethod/ascend", "NPUCompressedTensorsW4A16Int4DynamicMoE/ascend"):
            (r,) = audit_tree(released(v), [key])
            assert r.verdict.value == "EXACT" and "NPUSwigluStepAndMul" in r.rule, (v, key, r.rule)
        # a quantized kernel's own branch stays; the DeepEP one goes (ModelSlimFusedMoEMethod reaches the
        # core; the W8A8 int8 scheme raises before it since r12a: layer.w13_weight_offset is never registered)
        (slim,) = audit_tree(released(v), ["ModelSlimFusedMoEMethod/ascend"])
        assert "NPUSwigluQuant" in slim.rule and "NPUSwigluDeepEPKernel" not in slim.rule, (v, slim.rule)
