"""The arguments a MoE method's constructor gets where the FusedMoE layer builds it (``ast`` only).

A path's first setup step is the method's ``__init__`` (:data:`~nvfp4study.sglang.runner_steps.SETUP_STEPS`);
run alone its parameters are unknown, so flags it copies from them stay undecided and every branch
they guard is joined. SGLang builds an unquantized method inside ``FusedMoE.__init__``:
``UnquantizedFusedMoEMethod(self.use_triton_kernels, self.use_flashinfer_trtllm_moe,
self.use_deep_gemm)`` (``layers/moe/fused_moe_triton/layer.py`` 457-461 in 0.5.20, 502-506 in
0.5.23; 449 / 496 hand only the first to the KTransformers wrapper's GPU method), the flags set a
few lines above from the runner backend (``self.use_triton_kernels =
get_moe_runner_backend().is_triton_kernels()``, 385-391 in 0.5.20). :func:`construction_args`
evaluates those arguments under the path's facts: for ``--moe-runner-backend ascend`` all three are
False, so ``create_moe_runner`` takes its ``elif _is_npu:`` branch (unquant.py 962 in 0.5.20).
"""

from __future__ import annotations

import ast
from typing import Any

from .clamp_values import UNK, Frame
from .code_index import SRT, walk

#: the layer that builds the methods it constructs itself, and the method that builds them
LAYER = SRT + "layers/moe/fused_moe_triton/layer.py"
BUILDER = "FusedMoE.__init__"
#: values bound from a site: decided constants only (anything else stays unknown)
_DECIDED = (bool, int, str, type(None))


def _self_attr_value(interp: Any, builder: ast.FunctionDef, attr: str, before: int) -> Any:
    """The value of ``self.<attr>`` at line ``before`` of the builder: its last assignment there
    (``self.<attr> = expr``) evaluated under the path's facts; UNK when none."""
    sets = [n for n in walk(builder) if isinstance(n, ast.Assign) and n.lineno < before and any(
        isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name)
        and t.value.id == "self" for t in n.targets)]
    if not sets:
        return UNK
    last = max(sets, key=lambda n: n.lineno)
    return interp.eval(last.value, Frame(interp.module(LAYER), "FusedMoE", BUILDER))


def _arg_value(interp: Any, builder: ast.FunctionDef, node: ast.expr, line: int) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        v = _self_attr_value(interp, builder, node.attr, line)
        return v if isinstance(v, _DECIDED) else UNK
    return UNK


def _site_binding(interp: Any, builder: ast.FunctionDef, call: ast.Call, init: ast.FunctionDef) -> dict[str, Any]:
    """``{parameter: value}`` of ``init`` (the method's ``__init__``) at one construction ``call``:
    the arguments passed, the other parameters their constant defaults (UNK when not constant)."""
    params = [a.arg for a in init.args.posonlyargs + init.args.args][1:]  # after self
    defaults = dict(zip(params[len(params) - len(init.args.defaults):], init.args.defaults, strict=False))
    out = {p: (d.value if isinstance(d, ast.Constant) else UNK) for p, d in defaults.items()}
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return {p: UNK for p in params}
    for p, a in zip(params, call.args, strict=False):
        out[p] = _arg_value(interp, builder, a, call.lineno)
    for k in call.keywords:
        out[k.arg] = _arg_value(interp, builder, k.value, call.lineno)
    return out


def construction_args(interp: Any, cls: str, init: ast.FunctionDef) -> dict[str, Any]:
    """``{parameter: value}`` for ``cls.__init__`` (``init``) from the calls ``cls(...)`` in
    ``FusedMoE.__init__`` (:data:`LAYER`): a parameter every site gives the same decided value
    (bool / int / str / None) is bound to it; the others are left out (unbound, as before). Empty
    when the layer builds no ``cls``, or the builder is absent in this tree.

    ``interp``: a :class:`~nvfp4study.sglang.clamp_flow.Interp` (its facts decide the flags)."""
    builder = interp.find(LAYER, BUILDER)
    if builder is None:
        return {}
    sites = [n for n in walk(builder) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == cls]
    bindings = [_site_binding(interp, builder, c, init) for c in sites]
    if not bindings:
        return {}
    out = {}
    for p, v in bindings[0].items():
        if v is not UNK and isinstance(v, _DECIDED) and all(
                type(b.get(p)) is type(v) and b.get(p) == v for b in bindings[1:]):
            out[p] = v
    return out


__all__ = ["BUILDER", "LAYER", "construction_args"]
