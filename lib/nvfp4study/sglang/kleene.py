"""Three-valued truth of an ``if`` test's boolean structure: one place for the ``not`` / ``and`` /
``or`` rules the audit's readers of tests share (``ast`` only).

A test decides True, False or None (unknown). ``not`` keeps None; ``and`` is False when any operand
is False, else None when any is None, else True; ``or`` is True when any operand is True, else None
when any is None, else False (Kleene's strong logic, so a decided operand wins after an unknown
one). Every operand is evaluated, whatever its place: the readers decide what SGLang *may* do, not
what one run does. What any other node means (a platform predicate, a server-argument field, a
backend enum member, a device fact) is the caller's ``leaf`` rule.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

Truth = bool | None


def truth(node: ast.AST, leaf: Callable[[ast.AST], Truth],
          operand: Callable[[ast.AST], Truth] | None = None) -> Truth:
    """The truth of ``node``: ``not`` / ``and`` / ``or`` combine their operands' truths (each from
    ``operand``, by default this function with the same ``leaf``: a caller that counts depth passes
    its own); any other node is ``leaf(node)``.

    Args:
        node: an expression (an ``if`` test or a part of one).
        leaf: True / False / None for a node that is not ``not`` / ``and`` / ``or``.
        operand: the truth of an operand of ``not`` / ``and`` / ``or``.
    """
    sub = operand if operand is not None else (lambda n: truth(n, leaf))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        v = sub(node.operand)
        return None if v is None else not v
    if isinstance(node, ast.BoolOp):
        vals = [sub(v) for v in node.values]
        stop = isinstance(node.op, ast.Or)  # or: any True decides; and: any False
        return stop if stop in vals else (None if None in vals else not stop)
    return leaf(node)


__all__ = ["Truth", "truth"]
