"""The one three-valued logic of the audit's test readers (``sglang/kleene.py``): its ``not`` /
``and`` / ``or`` against Kleene's order False < unknown < True (``and`` the least, ``or`` the
greatest, ``not`` the mirror), over every assignment of three names, computed here independently;
and the readers that use it give what they gave before on the released trees (the audit rows and the
backend matrix are dumped and compared when it changes: tests/test_sglang_*.py pin them)."""

from __future__ import annotations

import ast
import itertools

import pytest

from nvfp4study.sglang import kleene

_RANK = {False: 0, None: 1, True: 2}
_BY_RANK = {v: k for k, v in _RANK.items()}


def _expected(node: ast.AST, env: dict[str, bool | None]) -> bool | None:
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.UnaryOp):
        return _BY_RANK[2 - _RANK[_expected(node.operand, env)]]
    ranks = [_RANK[_expected(v, env)] for v in node.values]
    return _BY_RANK[min(ranks) if isinstance(node.op, ast.And) else max(ranks)]


@pytest.mark.parametrize("src", ["a and b", "a or b", "not a", "a and b and c", "a or b or c",
                                 "not (a and b) or c", "a and (b or not c)", "not not a"])
def test_every_assignment_follows_kleenes_order(src):
    node = ast.parse(src, mode="eval").body
    for vals in itertools.product((True, False, None), repeat=3):
        env = dict(zip("abc", vals, strict=True))
        got = kleene.truth(node, lambda n, env=env: env[n.id] if isinstance(n, ast.Name) else None)
        assert got is _expected(node, env), (src, env)


def test_leaves_are_the_callers_and_operands_may_be_counted():
    node = ast.parse("x == 1 or not f()", mode="eval").body
    seen = []

    def leaf(n):
        seen.append(ast.unparse(n))
        return {"x == 1": None, "f()": False}[ast.unparse(n)]

    assert kleene.truth(node, leaf) is True  # not False decides the or after an unknown operand
    assert seen == ["x == 1", "f()"]  # every operand read, in order
    depth = []
    assert kleene.truth(node, leaf, operand=lambda n: depth.append(n) or None) is None
    assert [ast.unparse(n) for n in depth] == ["x == 1", "not f()"]


@pytest.mark.parametrize("src,want", [("r.is_a() or envs.FLAG", True), ("r.is_b() or envs.FLAG", None),
                                      ("r.is_a() and envs.FLAG", None), ("r.is_b() and envs.FLAG", False),
                                      ("not r.is_a()", False), ("r.is_a() and not r.is_b()", True),
                                      ("q.is_a()", None)])
def test_a_runner_branch_taken_on_a_backend_is_decided_by_kleenes_rules(src, want):
    # runner_builds' backend tests: a predicate of the runner's backend decides an `or` even next to
    # something it cannot read (before: unknown whenever any part was), as SGLang runs it
    from nvfp4study.sglang.runner_builds import _backend_test

    assert _backend_test(ast.parse(src, mode="eval").body, "r", {"is_a": True, "is_b": False}) is want
