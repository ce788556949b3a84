"""Ling's MoE parameters as data (issue 36): the interpreter names no parameter in its code, the
specs load from ``data/moe_params.yaml``, and the tracked value carries its parameter."""

from __future__ import annotations

import ast
from importlib import resources

import pytest

from nvfp4study.core.errors import AuditError
from nvfp4study.sglang import clamp_values as cv
from nvfp4study.sglang import moe_params

#: the interpreter's modules (values, expressions, statements, look-up) and the routing judge
INTERPRETER = ("clamp_values.py", "clamp_exprs.py", "clamp_flow.py", "clamp_lookup.py", "param_routing.py")


def _code_words(tree: ast.AST) -> set[str]:
    """Identifiers and string constants of a module, docstrings left out."""
    docs = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body \
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant):
            docs.add(id(n.body[0].value))
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            out.add(n.value)
        elif isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, ast.keyword) and n.arg:
            out.add(n.arg)
    return out


def _forbidden() -> set[str]:
    words = set(moe_params.names())
    for name in moe_params.names():
        spec = moe_params.param(name)
        words |= set(spec.mentions) | set(spec.refusal_words) | set(spec.facts)
    return words


@pytest.mark.parametrize("module", INTERPRETER)
def test_no_interpreter_module_names_a_parameter(module):
    src = resources.files("nvfp4study.sglang").joinpath(module).read_text()
    words = _code_words(ast.parse(src))
    # a string holding a parameter word (``"clamp" in txt``) counts too
    hits = sorted(w for w in _forbidden() if any(w == x or (len(w) > 3 and w in x) for x in words))
    assert hits == [], f"{module} names parameters in code: {hits}"


def test_the_test_sees_a_parameter_named_in_code():
    # the check above on a module that does name one (the old literal) fails
    words = _code_words(ast.parse('def f(n):\n    """gemm1_clamp_limit in a docstring is fine."""\n'
                                  '    return n.attr == "gemm1_clamp_limit"\n'))
    assert "gemm1_clamp_limit" in words
    assert "gemm1_clamp_limit in a docstring is fine." not in words


def test_specs_load_with_their_tracked_value():
    assert moe_params.names()[0] == "gemm1_clamp_limit"  # the default stays the clamp
    assert set(moe_params.names()) >= {"gemm1_clamp_limit", "routed_scaling_factor", "norm_topk_prob",
                                       "correction_bias", "grouped_topk"}
    clamp = moe_params.param()
    assert clamp.facts["gemm1_clamp_limit"] == cv.Tracked("gemm1_clamp_limit", "gemm1_clamp_limit", True, None)
    assert clamp.facts["gemm1_alpha"] is None and clamp.kind == "clamp"
    assert "flashinfer_cutlass_fused_moe" in clamp.sinks  # the clamp's table (sglang_clamp_paths.yaml)
    rsf = moe_params.param("routed_scaling_factor")
    t = rsf.facts["routed_scaling_factor"]
    assert isinstance(t, cv.Tracked) and t.param == "routed_scaling_factor" and t.value == 2.5
    assert "gemm1_clamp_limit" not in rsf.facts
    assert moe_params.verdicts("routed_scaling_factor")[:3] == ("APPLIED", "DROPPED", "DOUBLE")
    assert moe_params.verdicts("grouped_topk")[:3] == ("APPLIED", "DROPPED", "WRONG")


def test_unknown_parameter_is_a_named_error():
    with pytest.raises(AuditError, match="no MoE parameter 'gemm2_limit'; followed: gemm1_clamp_limit"):
        moe_params.param("gemm2_limit")


def test_tracked_value_keeps_its_label_through_computation():
    t = moe_params.param("routed_scaling_factor").tracked()
    d = cv.derived("x * y", 3, t)
    assert isinstance(d, cv.Tracked) and d.param == "routed_scaling_factor" and d.value is None
    assert cv.derived("x", 3, None) is cv.UNK
    assert cv.tracked_in((1, cv.Multi((None, t)))) is t
    # Ling's number decides a comparison (2.5 != 1.0), a derived one does not
    assert cv.compare_values(t, ast.NotEq(), 1.0, ast.Constant(1.0)) is True
    assert cv.compare_values(d, ast.NotEq(), 1.0, ast.Constant(1.0)) is cv.UNK
    # a positive parameter against zero is decided even without its number
    assert cv.compare_values(d, ast.Gt(), 0, ast.Constant(0)) is True
