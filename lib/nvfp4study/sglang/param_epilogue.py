"""The epilogue of a fused tail, per device class: which sum applies the routed scaling factor.

A runner's fused tail (``_fused_moe_kernel_sequence``, ``fused_experts``, ``fused_marlin_moe`` ...) is one sink
of the factor's table (``data/moe_param_sinks.yaml``), but its last step, the top-k sum that multiplies by the
factor, differs by device class and token count: 0.5.20 layers/moe/moe_runner/triton_utils/fused_moe.py 874-950
calls, on CUDA, ``out_slice.mul_`` (fused all-reduce), SGLang's own ``moe_sum_reduce_triton`` /
``moe_sum_reduce_torch_compile`` at most 32 tokens, and the compiled ``sgl_kernel.moe_sum_reduce`` (imported at
60, under ``if _is_cuda:``) above that; on ROCm without aiter SGLang's own sums only. A sink entry with
``epilogue: {file, function}`` is judged by the sums that function (and the module's functions it calls by name,
``moe_combine_topk`` in 0.5.23) hands the factor to, each taking its own table form, on the device classes where
the path reaches the call (:func:`~nvfp4study.sglang.platforms.reachable_on`) and the callee's name is bound
(:func:`~nvfp4study.sglang.platforms.bound_on`): the worst over them (``unread``, the compiled sum whose form for
the pinned sglang-kernel is not known, docs/blind-readings/KP.md, before ``applies``).
"""

from __future__ import annotations

import ast
from typing import Any

from .platforms import PLATFORMS, bound_on, describe, reachable_on

#: the forms of a sum, worst first (a branch not decided decides before one that applies)
_ORDER = ("unread", "applies")


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _carries(call: ast.Call, specs: list[str], mentions: tuple[str, ...]) -> bool:
    """Whether ``call`` hands the factor (a name of ``mentions``) at one of the sink's ``arg`` places
    (a keyword, or ``"#N"``: the N-th positional argument)."""
    for spec in specs:
        node = (call.args[int(spec[1:])] if spec.startswith("#") and int(spec[1:]) < len(call.args)
                else next((k.value for k in call.keywords if k.arg == spec), None))
        if isinstance(node, ast.Name) and node.id in mentions:
            return True
    return False


def _functions(mod: Any, name: str, sinks: dict) -> list[ast.FunctionDef]:
    """``name`` of parsed module ``mod`` and the module functions it calls by plain name (one level), not those
    that are sinks themselves (``moe_sum_reduce_torch_compile``: judged at its call)."""
    fn = mod.functions.get(name)
    if fn is None:
        return []
    called = {_callee(n) for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return [fn] + [mod.functions[c] for c in sorted(called) if c in mod.functions and c != name and c not in sinks]


def epilogue_sums(interp: Any, sink: dict, param: Any) -> list[tuple[str, str, set[str]]]:
    """``[(form, "file:line callee()", device classes)]``: the sums of ``sink``'s epilogue function that get the
    factor, each with its own table form (``applies`` / ``unread``) and the classes of the path's
    (``interp.platforms``) on which the call is reached and its callee bound; [] where the sink has no
    ``epilogue`` or the file or function is not in this tree."""
    rule = sink.get("epilogue")
    mod = interp.module("sglang/srt/" + rule["file"]) if rule else None
    if mod is None:
        return []
    out = []
    for fn in _functions(mod, rule["function"], param.sinks):
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
            name, entry = _callee(call), param.sinks.get(_callee(call))
            if entry is None or "epilogue" in entry or entry["form"] not in _ORDER \
                    or not _carries(call, entry.get("arg", []), param.mentions):
                continue
            on = reachable_on(mod.tree, call, interp.platforms)
            bound = bound_on(mod.tree, name) if isinstance(call.func, ast.Name) else None
            on = on & bound if bound is not None else on
            if on:
                out.append((entry["form"], f"{rule['file']}:{call.lineno} {name}()", on))
    return out


def epilogue_sink(interp: Any, sink: dict | None, param: Any) -> dict | None:
    """``sink`` with the form its epilogue gives on the path's device classes (:func:`epilogue_sums`): ``unread``
    (with ``why``: the sum and its classes) where a sum whose form is not known is reached, else ``applies``
    where one of SGLang's own is; ``sink`` itself where it has no epilogue or none of its sums is found."""
    sums = epilogue_sums(interp, sink, param) if sink is not None else []
    if not sums:
        return sink
    form = min((s[0] for s in sums), key=_ORDER.index)
    if form == sink["form"] == "applies":
        return sink
    picked = sorted((s for s in sums if s[0] == form), key=lambda s: min(PLATFORMS.index(p) for p in s[2]))
    callee = picked[0][1].rsplit(" ", 1)[1][:-2]
    why = (f"its epilogue reaches {', '.join(f'{w} on {describe(on)}' for _, w, on in picked)} "
           f"({param.sinks[callee].get('why', 'not read')})")
    return {**sink, "form": form, "why": why}


__all__ = ["epilogue_sink", "epilogue_sums"]
