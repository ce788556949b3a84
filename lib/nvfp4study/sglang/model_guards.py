"""MoE methods a quantization config selects only for another model (``ast`` and text only).

0.5.21 ``Fp8Config.get_quant_method`` returns ``NPUW4A8MXFP4FusedMoEMethod`` only under
``if self.is_fp4_experts and is_npu_arch35() and self.is_dsv4_fp4_experts`` (layers/quantization/fp8.py
420-432), and the model loader sets that flag from the model's identity:
``quant_config.is_dsv4_fp4_experts = is_deepseek_v4(model_config.hf_config)`` (model_loader/loader.py
222), ``is_deepseek_v4`` being ``_hf_arch(config) in ("DeepseekV4ForCausalLM", ...)``
(configs/model_config.py 275-280). Ling (``BailingMoeV3ForCausalLM``) is never given the method:
whatever the flags, its every path is UNUSABLE (not Ling's path), as the blind readers of the eighth
and ninth samples read it.

:func:`other_model_flags` finds each such flag (an attribute the loader sets from a call on the
model's ``hf_config`` to a function whose only string constants are architecture names, none of them
Ling's); :func:`other_model_methods` the classes constructed only in the body of an ``if`` that
requires one (an ``and`` conjunct ``self.<flag>``); :func:`other_model_refused` makes their rows
UNUSABLE.
"""

from __future__ import annotations

import ast
import re
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

from . import path_keys
from .audit_sinks import ClampVerdict
from .code_index import SRT, source_files, tree_stamp, walk
from .startup_checks import LING_ARCH

Row = TypeVar("Row")  # audit.PathResult (not imported: audit imports this module)
LOADER_FILE = SRT + "model_loader/loader.py"


def _parsed(text: str) -> ast.Module | None:
    # a file that does not parse cannot be imported: it selects nothing, and the rule stays off for
    # what it would have decided (the path keeps its own verdict) rather than stopping the audit
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _read(path: Path) -> ast.Module | None:
    try:
        return _parsed(path.read_text(encoding="utf-8", errors="replace")) if path.is_file() else None
    except OSError:
        return None


def _function_def(root: Path, module: str, name: str) -> ast.FunctionDef | None:
    tree = _read(Path(root) / (module.replace(".", "/") + ".py"))
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None) if tree else None


@lru_cache(maxsize=8)
def other_model_flags(root: Path, _stamp: int) -> dict[str, tuple[int, str, tuple[str, ...]]]:
    """``{flag: (loader line, function, architectures)}``: each ``x.<flag> = f(<...>.hf_config)`` of
    model_loader/loader.py where ``f`` (imported from an in-tree module) has only architecture names
    (``...For...``) as string constants, none of them Ling's (:data:`LING_ARCH`)."""
    tree = _read(Path(root) / LOADER_FILE)
    if tree is None:
        return {}
    imports = {a.asname or a.name: n.module for n in walk(tree) if isinstance(n, ast.ImportFrom) and n.module
               and n.module.startswith("sglang.") for a in n.names}
    out = {}
    for n in walk(tree):
        if not (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Attribute)
                and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name)
                and len(n.value.args) == 1 and ast.unparse(n.value.args[0]).endswith(".hf_config")):
            continue
        fname = n.value.func.id
        fn = _function_def(root, imports[fname], fname) if fname in imports else None
        consts = tuple(c.value for c in walk(fn) if isinstance(c, ast.Constant) and isinstance(c.value, str)) \
            if fn else ()
        if consts and all(re.fullmatch(r"\w+For\w+", c) for c in consts) and LING_ARCH not in consts:
            out[n.targets[0].attr] = (n.lineno, fname, consts)
    return out


def _requires(test: ast.expr, flag: str) -> bool:
    """Whether ``test`` holds only where ``self.<flag>`` does (it, or an ``and`` with it as a conjunct)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(_requires(v, flag) for v in test.values)
    return isinstance(test, ast.Attribute) and test.attr == flag and isinstance(test.value, ast.Name) \
        and test.value.id == "self"


@lru_cache(maxsize=8)
def other_model_methods(root: Path, _stamp: int) -> dict[str, tuple[str, int, str]]:
    """``{class: (file, if line, flag)}`` for each class constructed (``Class(...)``) only inside the body
    of an ``if`` that requires a flag of :func:`other_model_flags`: every ``Class(`` of the tree's
    sources is in such a body."""
    flags = other_model_flags(root, _stamp)
    if not flags:
        return {}
    files = source_files(root)
    guarded: dict[str, list[tuple[str, int, str]]] = {}
    for path, text in files:
        if not any(f in text for f in flags):
            continue
        for node in walk(_parsed(text) or ast.Module(body=[], type_ignores=[])):
            if not isinstance(node, ast.If):
                continue
            flag = next((f for f in flags if _requires(node.test, f)), None)
            for st in node.body if flag else ():
                for c in walk(st):
                    if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id[:1].isupper():
                        rel = path.relative_to(root).as_posix()
                        guarded.setdefault(c.func.id, []).append((rel, node.lineno, flag))
    out = {}
    for cls, sites in guarded.items():
        calls = sum(len(re.findall(rf"(?<![\w.]){cls}\(", text)) - len(re.findall(rf"class {cls}\(", text))
                    for _, text in files if cls in text)
        if calls == len(sites):
            out[cls] = sites[0]
    return out


def other_model_refused(root: Path, key: str, row: Row) -> Row:
    """``row`` (an ``audit.PathResult`` of path ``key``) made UNUSABLE where the path's method is
    selected only for another model (:func:`other_model_methods`); ABSENT stays ABSENT, the path's
    own verdict is kept in the rule."""
    cls = path_keys.method(key)
    stamp = hash(tree_stamp(Path(root)))
    hit = other_model_methods(Path(root), stamp).get(cls) if cls else None
    if hit is None or row.verdict == ClampVerdict.ABSENT:
        return row
    rel, line, flag = hit
    lline, fname, archs = other_model_flags(Path(root), stamp)[flag]
    rule = (f"not Ling's path: {cls} is selected only when self.{flag} ({rel[len(SRT):]}:{line}), which "
            f"{LOADER_FILE[len(SRT):]}:{lline} sets from {fname}(hf_config) (architectures {', '.join(archs)}; "
            f"not {LING_ARCH})")
    return replace(row, verdict=ClampVerdict.UNUSABLE, rule=f"{rule} (the path alone: {row.verdict.value}: "
                   f"{row.rule[:120]})", file=rel[len(SRT):], function=None, line=line)


__all__ = ["other_model_flags", "other_model_methods", "other_model_refused"]
