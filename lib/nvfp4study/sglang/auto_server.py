"""What SGLang's server arguments do with ``--moe-runner-backend`` before a MoE method sees it
(read with ``ast``): BailingMoeV3's model override, the quantization-driven pass that resolves
``auto``, and the start-time asserts that refuse a value for a ``--quantization``.

The method's own resolution and the three-valued facts of a device are
:mod:`nvfp4study.sglang.auto_backend`'s; this module evaluates the server-argument code with the
same facts (:class:`~nvfp4study.sglang.auto_backend.Facts`: the view's ``moe_runner_backend``,
``quantization``, ``moe_a2a_backend`` ``none`` and ``device``). 0.5.23 lines, relative to
``sglang/srt``.
"""

from __future__ import annotations

import ast

from .auto_backend import AutoChoice, Facts, runs, short
from .code_index import SRT, CodeIndex, walk

OVERRIDES = SRT + "arg_groups/overrides.py"
MOE_HOOK = SRT + "arg_groups/moe_hook.py"
BAILING_OVERRIDE = SRT + "arg_groups/model_overrides/bailing_moe_v3.py"


def _string_sets(code: CodeIndex, rel: str, func: str, facts: Facts, want: str) -> list[tuple[str, int, bool | None, str | None]]:
    """``(value, line, runs, undecided)`` for each place in function ``func`` of ``rel`` that sets
    ``want`` to a string: ``want = "x"`` or a returned ``{"want": "x"}``."""
    mod = code.mod(rel)
    fn = next((n for n in walk(mod) if isinstance(n, ast.FunctionDef) and n.name == func), None) if mod else None
    out = []
    for node in walk(fn) if fn else ():
        value = None
        if isinstance(node, ast.Assign) and any(ast.unparse(t).split(".")[-1] == want for t in node.targets) \
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            value = node.value.value
        elif isinstance(node, ast.Return) and isinstance(node.value, ast.Dict):
            for k, v in zip(node.value.keys, node.value.values, strict=False):
                if isinstance(k, ast.Constant) and k.value == want and isinstance(v, ast.Constant):
                    value = v.value
        if value is not None:
            state, why = runs(mod, node, facts, rel)
            out.append((value, node.lineno, state, why))
    return out


def _first_run(sets: list, rel: str, stage: str) -> AutoChoice | None:
    for value, line, state, why in sets:
        if state is None:
            return AutoChoice(None, None, stage, undecided=f"{short(rel)}:{line} sets {value!r} under {why}")
        if state:
            return AutoChoice(value, f"{short(rel)}:{line}", stage, trail=[f"{stage}: {value} at {short(rel)}:{line}"])
    return None


def server_auto(code: CodeIndex, quantization: str | None, facts: Facts) -> AutoChoice | None:
    """What the server-argument pass (``_moe_runner_backend_quant_constraints``,
    ``arg_groups/overrides.py``) turns ``auto`` into for ``quantization`` on ``facts.device``;
    None when it leaves it ``auto`` (or the release has no such pass)."""
    facts.quantization = quantization
    return _first_run(_string_sets(code, OVERRIDES, "_moe_runner_backend_quant_constraints", facts,
                                   "moe_runner_backend"), OVERRIDES, "server")


def model_auto(code: CodeIndex, quantization: str | None, facts: Facts) -> AutoChoice | None:
    """What BailingMoeV3's model override (``arg_groups/model_overrides/bailing_moe_v3.py``, from
    0.5.21) turns ``auto`` into; None when it returns nothing for this format and device. The
    format's facts name ``model_config.is_fp4_experts`` (False for a checkpoint of one format)."""
    facts.quantization = quantization
    facts.extra.setdefault("model_config.is_fp4_experts", False)
    return _first_run(_string_sets(code, BAILING_OVERRIDE, "_bailing_moe_v3_overrides", facts,
                                   "moe_runner_backend"), BAILING_OVERRIDE, "model")


def server_refusals(code: CodeIndex) -> dict[str, tuple[list[str | None], str]]:
    """``{backend: (the --quantization values it accepts, "file:line")}``: the asserts of
    ``handle_moe_kernel_config`` (``arg_groups/moe_hook.py`` 80-148 in 0.5.23) of the form
    ``if view.moe_runner_backend == "x": assert view.quantization in [...]`` (or that ``or`` other
    conditions, named in the place); another quantization with that explicit value stops the
    server at start."""
    mod = code.mod(MOE_HOOK)
    fn = next((n for n in walk(mod) if isinstance(n, ast.FunctionDef) and n.name == "handle_moe_kernel_config"),
              None) if mod else None
    out: dict[str, tuple[list[str | None], str]] = {}
    for node in walk(fn) if fn else ():
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and ast.unparse(node.test.left).endswith("moe_runner_backend")):
            continue
        right = node.test.comparators[0]
        backends = [right.value] if isinstance(right, ast.Constant) else \
            [e.value for e in getattr(right, "elts", []) if isinstance(e, ast.Constant)]
        for st in node.body:
            if not isinstance(st, ast.Assert):
                continue
            # ``quantization in [...]``, or that ``or`` another condition (named after the line)
            parts = st.test.values if isinstance(st.test, ast.BoolOp) and isinstance(st.test.op, ast.Or) else [st.test]
            test = next((p for p in parts if isinstance(p, ast.Compare) and isinstance(p.ops[0], ast.In)
                         and ast.unparse(p.left).endswith("quantization")), None)
            if test is None:
                continue
            allowed = [e.value for e in getattr(test.comparators[0], "elts", []) if isinstance(e, ast.Constant)]
            others = [ast.unparse(p) for p in parts if p is not test]
            where = f"{short(MOE_HOOK)}:{st.lineno}" + (f" (unless {' or '.join(others)})" if others else "")
            for b in backends:
                out[b] = (allowed, where)
    return out


__all__ = ["BAILING_OVERRIDE", "MOE_HOOK", "OVERRIDES", "model_auto", "server_auto", "server_refusals"]
