"""Issue 36's rules of the audit (blind readers' disagreements, fourth audit sample):

- a name bound only by imports under module-level ``if``s that the path's facts make false (the
  default environment, every variable unset: ``moe_params.yaml shared.env_flags: default``) is
  unbound, and a call through it on a step the path runs raises NameError (UNUSABLE, whatever
  the parameter): QuarkW4A4MXFp4MoE/aiter's weight processing calls ``e8m0_shuffle`` /
  ``moe_shuffle_scale``, imported only under ``if _use_aiter:``;
- a method's ``/native`` path (its CustomOp forward off CUDA) is ABSENT where every platform the
  method is built on runs another forward of the class: NPUMXFP8OnlineMoEMethod is built only on
  NPU, where it runs its inherited ``forward_npu``.
"""

from __future__ import annotations

import ast
import re
import textwrap

from nvfp4study.sglang import audit as sa
from nvfp4study.sglang import platforms as pf
from nvfp4study.sglang.audit_sinks import ClampVerdict
from nvfp4study.sglang.import_gates import conditional_imports
from nvfp4study.sglang.param_audit import ParamVerdict, audit_param
from sglang_fixtures import copy23_fixture, mini_tree, released  # noqa: F401 - copy23 is a fixture

MOD = "sglang/srt/layers/moe/toy.py"
EXACT_CALL = "cutlass_fused_moe(swiglu_limit=runner_config.gemm1_clamp_limit, activation_type=ActivationType.SwigluStep)"
QUARK = "sglang/srt/layers/quantization/quark/schemes/quark_w4a4_mxfp4_moe.py"
GATED = """
    from sglang.srt.utils import get_bool_env_var, is_hip
    _use_aiter = get_bool_env_var("SGLANG_USE_AITER") and is_hip()
    if _use_aiter:
        from aiter import shuffle
    {other}

    def run(runner_config):
        shuffle(runner_config)
        return {call}
"""


def _spec(fn: str) -> dict:
    return {"id": "toy", "label": "toy", "steps": [f"layers/moe/toy.py::{fn}"], "platforms": pf.PLATFORMS}


def test_conditional_imports_are_the_names_no_other_statement_binds():
    tree = ast.parse(textwrap.dedent("""
        import os
        if A:
            from x import a, b, c
            if B:
                import y.z
        else:
            from x import d
        if C:
            from x import e
        else:
            e = None
        try:
            from x import b
        except ImportError:
            pass

        def f(c):
            return a, c
    """))
    got = {k: [(ln, [(ast.unparse(t), w) for t, w in conds]) for ln, conds in v]
           for k, v in conditional_imports(tree).items()}
    # b: a try import binds it too; c: a parameter; e: the else assigns it; os: unconditional
    assert got == {"a": [(4, [("A", True)])], "y": [(6, [("A", True), ("B", True)])],
                   "d": [(8, [("A", False)])]}
    assert conditional_imports(ast.parse("if A:\n    from x import a\nfrom y import *\n")) == {}


def test_a_call_through_a_name_imported_only_under_a_false_env_flag_raises(tmp_path):
    r = sa.audit_path(mini_tree(tmp_path / "a", "0.5.23", {MOD: GATED.format(other="", call=EXACT_CALL)}),
                      _spec("run"))
    assert r.verdict == ClampVerdict.UNUSABLE, r.rule
    assert "NameError: shuffle is bound only by the import at layers/moe/toy.py:5" in r.rule
    assert (r.file, r.line) == ("layers/moe/toy.py", 9)
    # bound on the other branch too: nothing raises, the kernel decides
    other = "else:\n        from other import shuffle"
    r = sa.audit_path(mini_tree(tmp_path / "b", "0.5.23", {MOD: GATED.format(other=other, call=EXACT_CALL)}),
                      _spec("run"))
    assert r.verdict == ClampVerdict.EXACT, r.rule
    # a test the path's facts do not decide (an unknown flag) binds it on some runs: no raise
    src = GATED.format(other="", call=EXACT_CALL).replace('get_bool_env_var("SGLANG_USE_AITER") and is_hip()',
                                                           "some_flag()")
    r = sa.audit_path(mini_tree(tmp_path / "c", "0.5.23", {MOD: src}), _spec("run"))
    assert r.verdict == ClampVerdict.EXACT, r.rule


def test_quark_mxfp4_aiter_is_unusable_by_default():
    """0.5.19 quark_w4a4_mxfp4_moe.py 46-49: ``_use_aiter = get_bool_env_var("SGLANG_USE_AITER")
    and _is_hip``; ``if _use_aiter:`` imports moe_shuffle_scale / e8m0_shuffle, which
    process_weights_after_loading calls on each branch of ``if _is_gfx1250`` (841, 853): the
    readers' UNUSABLE (the audit said DROPPED for the clamp, APPLIED / DROPPED for the parameters)."""
    tree = released("0.5.19")
    lines = tree.file(QUARK).read_text().splitlines()
    gate = next(i for i, ln in enumerate(lines, 1) if ln.startswith("if _use_aiter:"))
    imp = next(i for i, ln in enumerate(lines, 1) if i > gate and "import moe_shuffle_scale" in ln)
    call = next(i for i, ln in enumerate(lines, 1) if "= moe_shuffle_scale(" in ln)
    (row,) = sa.audit_tree(tree, ["QuarkW4A4MXFp4MoE/aiter"])
    assert row.verdict == ClampVerdict.UNUSABLE, row.rule
    assert f"quark_w4a4_mxfp4_moe.py:{imp}, under `if _use_aiter`" in row.rule and row.line == call
    for param in ("routed_scaling_factor", "norm_topk_prob"):
        (p,) = audit_param(tree, param, ["QuarkW4A4MXFp4MoE/aiter"])
        assert p.verdict == ParamVerdict.UNUSABLE and "NameError" in p.rule, (param, p.rule)


def test_the_gate_is_what_makes_quark_unusable(copy23):
    """The same method with its aiter imports made unconditional runs again (not UNUSABLE)."""
    path = copy23.root / QUARK
    text = path.read_text()
    ungated = re.sub(r"^if _use_aiter:\n((?:    .*\n|\n)+?)(?=\S)",
                     lambda m: textwrap.dedent(m.group(1)), text, count=1, flags=re.M)
    assert ungated != text
    path.write_text(ungated)
    (row,) = sa.audit_tree(copy23, ["QuarkW4A4MXFp4MoE/aiter"])
    assert row.verdict != ClampVerdict.UNUSABLE and "NameError" not in row.rule, row.rule


def test_an_npu_only_method_has_no_native_path():
    """0.5.22 fp8.py 410-415 builds NPUMXFP8OnlineMoEMethod only under ``is_npu()`` (and its module
    lives under hardware_backend/npu/); on NPU the CustomOp runs forward_npu, which it inherits
    from UnquantizedFusedMoEMethod (unquant.py 1298): its forward_cpu (the ``/native`` key) never
    runs. The readers' ABSENT for all four parameters (the audit said APPLIED / DROPPED)."""
    tree = released("0.5.22")
    assert "def forward_npu(" in tree.file("sglang/srt/layers/quantization/unquant.py").read_text()
    rows = {r.path: r for r in sa.audit_tree(tree, ["NPUMXFP8OnlineMoEMethod/native", "fused-moe-native"])}
    r = rows["NPUMXFP8OnlineMoEMethod/native"]
    assert r.verdict == ClampVerdict.ABSENT and "NPU runs UnquantizedFusedMoEMethod.forward_npu" in r.rule, r.rule
    # UnquantizedFusedMoEMethod/native (catalogued as fused-moe-native): built on every platform
    assert rows["fused-moe-native"].verdict != ClampVerdict.ABSENT
    for param in ("routed_scaling_factor", "correction_bias"):
        (p,) = audit_param(tree, param, ["NPUMXFP8OnlineMoEMethod/native"])
        assert p.verdict == ParamVerdict.ABSENT, (param, p.rule)


def test_without_its_own_npu_forward_the_native_path_runs(copy23):
    """The rule hinges on the class's forward_npu: removed, NPU runs the native forward again."""
    path = copy23.root / "sglang/srt/layers/quantization/unquant.py"
    text = path.read_text()
    edited = re.sub(r"\n    def forward_npu\(.*?\n(?=    def )", "\n", text, count=1, flags=re.S)
    assert "def forward_npu(" not in edited
    path.write_text(edited)
    (row,) = sa.audit_tree(copy23, ["NPUMXFP8OnlineMoEMethod/native"])
    assert row.verdict != ClampVerdict.ABSENT, row.rule


def test_the_e8m0_cast_is_what_drops_the_factor_on_marlin(copy23):
    """fused_marlin_moe.if_scales_e8m0 (issue 36 case 2) hinges on the cast the path runs: with the Marlin
    MXFP4 scales no longer cast to E8M0, Mxfp4MoEMethod/marlin's kernel sum takes the factor again, and its
    tail hands it to the compiled sgl_kernel moe_sum_reduce on CUDA (fused_marlin_moe.py 440), whose form in the
    pinned wheel is unread (KP.md): UNDECIDED, no longer DROPPED."""
    (before,) = audit_param(copy23, "routed_scaling_factor", ["Mxfp4MoEMethod/marlin"])
    assert before.verdict == ParamVerdict.DROPPED, before.rule
    path = copy23.root / "sglang/srt/layers/quantization/marlin_utils_fp4.py"
    text = path.read_text()
    assert text.count(".to(torch.float8_e8m0fnu)") == 1
    path.write_text(text.replace(".to(torch.float8_e8m0fnu)", ".to(torch.bfloat16)"))
    (after,) = audit_param(copy23, "routed_scaling_factor", ["Mxfp4MoEMethod/marlin"])
    assert after.verdict == ParamVerdict.UNDECIDED and after.parts["runner"] is None, after.rule
    assert "fused_marlin_moe.py:" in after.rule and "sgl_kernel moe_sum_reduce" in after.rule, after.rule
