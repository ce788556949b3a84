"""The all-to-all backend a path runs with, as the interpreter sees it (``ast`` only).

A path runs on one GPU/NPU with the default server arguments: ``--moe-a2a-backend none`` unless
its key names another (``fused:<a2a>/<runner>``, :func:`~nvfp4study.sglang.path_keys.a2a`). Code
that asks the global backend (``get_moe_a2a_backend().is_deepep()``, layers/moe/utils.py) then
takes one branch: the Ascend runner core builds ``NPUSwigluDeepEPKernel`` only when the backend is
DeepEP (layers/moe/moe_runner/ascend.py 100-135 in 0.5.20) and otherwise the unquantized kernel's
``NPUSwigluStepAndMul``, so a DeepEP branch is not Ling's under ``none``.

:func:`a2a_instance` reads each predicate of ``MoeA2ABackend`` (``is_none`` ... ``supports_aiter``)
from the tree and decides it for one backend value; a predicate it cannot read (one that reads an
environment variable alone) is left out (the interpreter then leaves that test open).
"""

from __future__ import annotations

import ast
from typing import Any

from . import kleene
from .clamp_values import Instance

#: Where SGLang defines the enum and ``get_moe_a2a_backend`` (0.5.19-0.5.23).
A2A_MODULE = "sglang/srt/layers/moe/utils.py"
A2A_ENUM = "MoeA2ABackend"
#: The function whose value is the global backend (layers/moe/utils.py, ``get_moe_a2a_backend``).
A2A_GETTER = "get_moe_a2a_backend"


def a2a_instance(tree: ast.Module | None, value: str) -> Instance | None:
    """The global all-to-all backend with value ``value`` (``"none"``, ``"deepep"``, ...): an
    :class:`~nvfp4study.sglang.clamp_values.Instance` of ``MoeA2ABackend`` whose ``is_x()``-style
    predicates (its zero-argument methods returning a test of ``self``) are facts. None when
    ``tree`` (the parsed ``layers/moe/utils.py``) has no such enum or no member with that value."""
    cls = next((n for n in (tree.body if tree else []) if isinstance(n, ast.ClassDef) and n.name == A2A_ENUM), None)
    if cls is None:
        return None
    members = {st.targets[0].id: st.value.value for st in cls.body if isinstance(st, ast.Assign)
               and isinstance(st.targets[0], ast.Name) and isinstance(st.value, ast.Constant)}
    if value not in members.values():
        return None
    methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)
               and [a.arg for a in f.args.args] == ["self"] and not f.decorator_list}
    facts: dict[str, Any] = {}
    for name in methods:
        v = _predicate(name, methods, members, value, set())
        if v is not None:
            facts[f"{name}()"] = v
    return Instance(A2A_ENUM, (), tuple(facts.items()))


def _predicate(name: str, methods: dict, members: dict[str, str], value: str, seen: set[str]) -> bool | None:
    """The value of the method ``name`` of the enum for a backend ``value``; None when its body is
    not a single ``return`` of ``self ==/in`` members, ``self.is_y()`` calls and ``and/or/not``."""
    body = [st for st in methods[name].body if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))]
    if name in seen or len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        return None
    return _test(body[0].value, methods, members, value, seen | {name})


def _member(node: ast.expr, members: dict[str, str]) -> str | None:
    """``MoeA2ABackend.X`` or ``MoeA2ABackend.X.value`` -> its value; else None."""
    if isinstance(node, ast.Attribute) and node.attr == "value":
        node = node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == A2A_ENUM:
        return members.get(node.attr)
    return None


def _is_self(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "self") or (
        isinstance(node, ast.Attribute) and node.attr == "value" and isinstance(node.value, ast.Name)
        and node.value.id == "self")


def _test(node: ast.expr, methods: dict, members: dict[str, str], value: str, seen: set[str]) -> bool | None:
    return kleene.truth(node, lambda n: _leaf(n, methods, members, value, seen))


def _leaf(node: ast.AST, methods: dict, members: dict[str, str], value: str, seen: set[str]) -> bool | None:
    if isinstance(node, ast.Call) and not node.args and isinstance(node.func, ast.Attribute) \
            and _is_self(node.func.value) and node.func.attr in methods:
        return _predicate(node.func.attr, methods, members, value, seen)
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and _is_self(node.left):
        op, right = node.ops[0], node.comparators[0]
        if isinstance(op, (ast.Eq, ast.NotEq)) and (m := _member(right, members)) is not None:
            return (m == value) == isinstance(op, ast.Eq)
        if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
            vals = [_member(e, members) for e in right.elts]
            if None not in vals:
                return (value in vals) == isinstance(op, ast.In)
    return None


__all__ = ["A2A_GETTER", "A2A_MODULE", "a2a_instance"]
