"""MoE method constructors that raise for every model: a config object handed where a dict is read.

A quantization config builds its MoE scheme with itself as the argument (``Scheme(self)``), and
the scheme's ``__init__`` reads that argument as a dict: ``quantization_config.get(...)`` on its
first statements, not under any test. When the config's class and its in-tree bases define
neither ``get`` nor ``__getattr__`` (``QuantizationConfig`` is an ``ABC``), the call raises
AttributeError while the layer is built, whatever the limit: every path of that method is
UNUSABLE. Read from the source (``ast``), not listed: in 0.5.20
``compressed_tensors.py`` 890/896 build ``NPUCompressedTensorsW4A8Int8DynamicMoE(self)`` inside
``CompressedTensorsConfig`` (112, base ``QuantizationConfig``, base_config.py 140), and
``compressed_tensors_w4a8_int8_moe.py`` 36-40 call ``quantization_config.get("config_groups", {})``.
"""

from __future__ import annotations

import ast
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

from . import path_keys
from .audit_sinks import ClampVerdict
from .code_index import SRT, CodeIndex, class_methods, tree_stamp, walk
from .quant_methods import moe_methods

Row = TypeVar("Row")  # audit.PathResult (not imported: audit imports this module)

#: what a dict has and a plain object lacks; an object that defines one of _DYNAMIC answers any name
_DICT_ONLY = ("get", "items", "keys", "values")
_DYNAMIC = ("__getattr__", "__getattribute__", "__getitem__")
#: bases outside the tree known to add no such attribute
_PLAIN_BASES = {"ABC", "object", "Generic"}


def _defines(code: CodeIndex, rel: str, cls: ast.ClassDef, attr: str, depth: int = 5) -> bool | None:
    """Whether ``cls`` or a base defines ``attr`` (or a dynamic lookup); None when a base is neither
    in the tree nor a known plain one (undecided)."""
    names = set(class_methods(cls)) | {t.id for st in cls.body if isinstance(st, ast.Assign)
                                      for t in st.targets if isinstance(t, ast.Name)}
    if attr in names or names & set(_DYNAMIC):
        return True
    for b in cls.bases:
        name = ast.unparse(b).split("[")[0].split(".")[-1]
        hit = code.resolve(rel, name) if depth else None
        if hit is None or not isinstance(hit[1], ast.ClassDef):
            if name not in _PLAIN_BASES:
                return None
            continue
        got = _defines(code, hit[0], hit[1], attr, depth - 1)
        if got is not False:
            return got
    return False


def _enclosing_class(code: CodeIndex, rel: str, node: ast.AST) -> ast.ClassDef | None:
    m = code.mod(rel)
    for c in (n for n in walk(m) if isinstance(n, ast.ClassDef)) if m else ():
        if c.lineno <= node.lineno <= (c.end_lineno or c.lineno) and any(x is node for x in walk(c)):
            return c
    return None


def _dict_read(init: ast.FunctionDef, param: str) -> tuple[int, str] | None:
    """``(line, attr)`` of a ``param.<dict method>(...)`` call in a statement of ``init``'s own
    body (not under ``if``/``try``/loops: it runs whenever the constructor does)."""
    for st in init.body:
        if isinstance(st, (ast.If, ast.Try, ast.For, ast.While, ast.With, ast.FunctionDef)):
            continue
        for n in walk(st):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _DICT_ONLY \
                    and isinstance(n.func.value, ast.Name) and n.func.value.id == param:
                return n.lineno, n.func.attr
    return None


@lru_cache(maxsize=8)
def constructor_raises_all(root: Path, _stamp: int) -> dict[str, tuple[str, int, str]]:
    """``{method class: (file, line, rule)}`` for each MoE method whose every construction site
    hands its config object to a dict read in ``__init__`` that the config's class lacks."""
    code, sites = CodeIndex(root), {}
    out = {}
    for name, (rel, cls, _how) in moe_methods(code, sites).items():
        init = class_methods(cls).get("__init__")
        params = [a.arg for a in init.args.args[1:]] if init else []
        why = None
        for srel, call in sites.get(name, []):
            pos = next((i for i, a in enumerate(call.args) if isinstance(a, ast.Name) and a.id == "self"), None)
            owner = _enclosing_class(code, srel, call)
            read = _dict_read(init, params[pos]) if pos is not None and pos < len(params) else None
            if owner is None or read is None or _defines(code, srel, owner, read[1]) is not False:
                why = None
                break
            why = why or (f"{srel[len(SRT):]}:{call.lineno} {owner.name} builds {ast.unparse(call)[:60]}, handing "
                          f"its config object to {name}.__init__, which calls {params[pos]}.{read[1]}() "
                          f"({rel[len(SRT):]}:{read[0]}); {owner.name} and its bases define no "
                          f"{read[1]} nor __getattr__: AttributeError", rel[len(SRT):], read[0])
        if why:
            out[name] = (why[1], why[2], why[0])
    return out


def constructor_raised(root: Path, key: str, row: Row) -> Row:
    """``row`` (an ``audit.PathResult`` of path ``key``) made UNUSABLE at the constructor's dict
    read when :func:`constructor_raises_all` finds one for the path's method class; the verdict the
    path alone gets is kept in the rule. ABSENT stays ABSENT."""
    cls = path_keys.method(key)
    if cls is None or row.verdict == ClampVerdict.ABSENT:
        return row
    hit = constructor_raises_all(Path(root), hash(tree_stamp(Path(root)))).get(cls)
    if hit is None:
        return row
    file, line, rule = hit
    return replace(row, verdict=ClampVerdict.UNUSABLE,
                   rule=f"raises for Ling whatever the limit: {rule} (the path alone: {row.verdict.value}: "
                        f"{row.rule[:120]})", file=file, function=f"{cls}.__init__", line=line)


__all__ = ["constructor_raised", "constructor_raises_all"]
