"""Issue 23's rules of the clamp audit, on small synthetic trees: paths carry their platform
(other platforms' branches are cut), the quant info a path builds picks its branch, kernels are
known by their module, and a path that raises whatever the limit is UNUSABLE."""

from __future__ import annotations

import ast
import textwrap

from nvfp4study.sglang import audit as sa
from nvfp4study.sglang import platforms as pf
from sglang_fixtures import mini_tree

MOD = "sglang/srt/layers/moe/toy.py"
EXACT_CALL = "cutlass_fused_moe(swiglu_limit=runner_config.gemm1_clamp_limit, activation_type=ActivationType.SwigluStep)"
DROP_CALL = "trtllm_fp4_block_scale_moe(gemm1_clamp_limit=None)"


def _spec(fn: str, platforms: tuple[str, ...] = pf.PLATFORMS) -> dict:
    return {"id": "toy", "label": "toy", "steps": [f"layers/moe/toy.py::{fn}"], "platforms": platforms}


def _tree(tmp_path, src: str):
    return mini_tree(tmp_path, "0.5.23", {MOD: src})


PLATFORM_SRC = f"""
    from sglang.srt.utils import is_hip
    _is_hip = is_hip()

    def run(runner_config):
        if _is_hip:
            return {DROP_CALL}
        return {EXACT_CALL}
"""


def test_a_branch_of_another_platform_is_cut_not_joined(tmp_path):
    t = _tree(tmp_path, PLATFORM_SRC)
    # every platform: the ROCm branch is reachable and the worst branch wins
    assert sa.audit_path(t, _spec("run")).verdict.value == "DROPPED"
    # on CUDA the module flag _is_hip = is_hip() is False: its branch is cut
    r = sa.audit_path(t, _spec("run", ("CUDA",)))
    assert (r.verdict.value, r.platform) == ("EXACT", "CUDA")
    assert sa.audit_path(t, _spec("run", ("ROCm",))).verdict.value == "DROPPED"


def test_reachable_on_reads_guards_and_early_returns():
    tree = ast.parse(textwrap.dedent("""
        _is_npu = is_npu()
        _use_aiter = get_bool_env_var("X") and is_hip()

        def f(x):
            if _is_npu:
                return 1
            if _use_aiter:
                a = MoeRunner(1)
            elif x:
                b = MoeRunner(2)
            else:
                c = MoeRunner(3)
    """))
    calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "MoeRunner"),
                   key=lambda n: n.lineno)
    assert pf.reachable_on(tree, calls[0]) == {"ROCm"}  # _use_aiter: only on HIP, and not NPU
    assert pf.reachable_on(tree, calls[1]) == {"CUDA", "ROCm", "XPU", "CPU"}  # after `if _is_npu: return`
    assert pf.module_platforms("sglang/srt/hardware_backend/npu/x.py", None) == {"NPU"}
    assert pf.module_platforms("sglang/srt/layers/x.py", ast.parse("import torch_npu")) == {"NPU"}
    npu_import = ast.parse("from sglang.srt.hardware_backend.npu.moe import a")
    assert pf.module_platforms("sglang/srt/layers/x.py", npu_import) is None  # a method's module
    assert pf.module_platforms("sglang/srt/layers/x.py", npu_import, runner=True) == {"NPU"}


def test_the_quant_info_a_path_builds_selects_the_branch(tmp_path):
    t = _tree(tmp_path, f"""
        from dataclasses import dataclass

        @dataclass
        class ToyQuantInfo:
            use_mxfp8: bool = False

        def make_info():
            return ToyQuantInfo()

        def run(runner_config):
            quant_info = make_info()
            if quant_info.use_mxfp8:
                return {DROP_CALL}
            return {EXACT_CALL}
    """)
    # make_info neither carries nor mentions the limit, but it builds a ...QuantInfo: followed
    assert sa.audit_path(t, _spec("run")).verdict.value == "EXACT"


def test_a_kernel_is_known_by_its_module(tmp_path):
    src = """
        def run(runner_config):
            from {mod} import fused_marlin_moe
            return fused_marlin_moe(clamp_limit=None, gemm1_alpha=None, x=runner_config.gemm1_clamp_limit)
    """
    ours = sa.audit_path(_tree(tmp_path / "a", src.format(mod="sglang.srt.layers.moe.fused_moe_triton")), _spec("run"))
    assert ours.verdict.value == "DROPPED" and ours.sink == "fused_marlin_moe"
    other = sa.audit_path(_tree(tmp_path / "b", src.format(mod="sgl_kernel")), _spec("run"))
    # sgl_kernel's function of the same name is another kernel: the limit goes where the table cannot follow
    assert other.sink is None and other.verdict.value == "UNDECIDED" and "fused_marlin_moe()" in other.rule


def test_a_path_that_raises_on_every_branch_is_unusable(tmp_path):
    t = _tree(tmp_path, f"""
        def refuse(x):
            raise NotImplementedError("backend not supported")

        def run(runner_config, flag):
            if flag:
                refuse(runner_config)  # entered: it is handed the runner config
            else:
                raise ValueError("no such backend")
            return {EXACT_CALL}

        def run_some(runner_config, flag):
            if flag:
                return {EXACT_CALL}
            raise ValueError("no such backend")
    """)
    r = sa.audit_path(t, _spec("run"))
    assert (r.verdict.value, r.line, r.function) == ("UNUSABLE", 3, "refuse")  # the first raise reached
    assert "whatever the limit" in r.rule
    # one branch returns: the raise is not reached on every branch
    assert sa.audit_path(t, _spec("run_some")).verdict.value == "EXACT"


def test_a_class_default_none_read_through_is_unusable(tmp_path):
    t = _tree(tmp_path, """
        class Base:
            runner = None

        class Method(Base):
            def apply(self, runner_config):
                return self.runner.run(runner_config)
    """)
    r = sa.audit_path(t, _spec("Method.apply"))
    assert (r.verdict.value, r.line) == ("UNUSABLE", 7) and "self.runner is None" in r.rule
