"""Server-argument validations SGLang runs at startup that refuse Ling's architecture.

A startup hook (``arg_groups/moe_hook.py::handle_a2a_moe`` in 0.5.20-0.5.23, run by
``arg_groups/pipeline.py``) calls, under a guard ``if <...>_backend == "<value>":`` at the top of
its body, a validator whose body raises unless one of the model's architectures is in a tuple of
architecture names: ``validate_flashinfer_megamoe_model`` (``moe_hook.py`` 195-216 in 0.5.20,
199-220 in 0.5.21, 204-225 in 0.5.22, 237-262 in 0.5.23), called at 265 / 270 / 275 / 316 under
``if a2a_backend == "flashinfer_megamoe":`` (264 / 269 / 274 / 315); likewise
``validate_deepep_v2_model_architecture`` under ``a2a_backend == "deepep_v2"``. When the tuple
lacks ``BailingMoeV3ForCausalLM`` (``models/bailing_moe_v3.py``'s class), every path through that
backend cannot start for Ling: :func:`startup_refusals` finds these from the source (the names
are read, not listed here); the audit applies them (:func:`refusal_for`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

from . import path_keys
from .audit_sinks import ClampVerdict
from .clamp_values import _parse
from .code_index import source_files, tree_stamp, walk

Row = TypeVar("Row")  # audit.PathResult (not imported: audit imports this module)

#: a line that may open a backend guard (:func:`_backend_guard`): files without one are not parsed
_GUARD_LINE = re.compile(r"^[ \t]+if [^\n]*(?:a2a|runner)_backend == [\"'][\w.-]+[\"']:", re.M)
#: a line that starts with a call ``name(``; a module-level ``def name(``
_CALL_LINE = re.compile(r"[ \t]+(\w+)\(")
_MODULE_DEF = re.compile(r"^def (\w+)\(", re.M)

#: Ling-3.0-flash's ``architectures`` entry (its config.json; ``models/bailing_moe_v3.py``'s EntryClass)
LING_ARCH = "BailingMoeV3ForCausalLM"


@dataclass(frozen=True)
class StartupRefusal:
    """A startup validation that raises for Ling: the guard ``<kind>_backend == backend`` at
    ``file:guard_line`` in ``caller`` calls ``validator`` (``file:call_line``), which raises at
    ``validator_file:raise_line`` because its allowlist (``allowlist``) lacks :data:`LING_ARCH`.
    Files are relative to ``sglang/srt``; lines 1-based."""

    backend: str
    kind: str
    caller: str
    file: str
    guard_line: int
    call_line: int
    validator: str
    validator_file: str
    raise_line: int
    allowlist: tuple[str, ...]

    def rule(self) -> str:
        """The rule text the audit quotes."""
        return (f"SGLang refuses Ling at startup: {self.caller} ({self.file}:{self.guard_line}) runs "
                f"{self.validator}() when {self.kind} backend == {self.backend!r} ({self.file}:{self.call_line}), "
                f"which raises at {self.validator_file}:{self.raise_line}: its {len(self.allowlist)} "
                f"validated architectures lack {LING_ARCH}")


def _str_tuple(node: ast.AST | None) -> tuple[str, ...] | None:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return tuple(e.value for e in node.elts)
    return None


def _arch_membership(test: ast.AST, consts: dict[str, tuple[str, ...]]) -> tuple[str, ...] | None:
    """The allowlist of an ``if`` test that is true when no architecture is in it:
    ``not any(a in L for a in architectures)`` or ``a not in L``, ``a`` a name spelling
    "architecture"; ``L`` a literal tuple or a local name bound to one (``consts``)."""
    negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
    inner = test.operand if negated else test
    if negated and isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == "any" \
            and inner.args and isinstance(inner.args[0], ast.GeneratorExp):
        inner, want = inner.args[0].elt, ast.In
    elif not negated:
        want = ast.NotIn
    else:
        return None
    if not (isinstance(inner, ast.Compare) and len(inner.ops) == 1 and isinstance(inner.ops[0], want)
            and isinstance(inner.left, ast.Name) and "architecture" in inner.left.id):
        return None
    right = inner.comparators[0]
    return consts.get(right.id) if isinstance(right, ast.Name) else _str_tuple(right)


def arch_validator(fn: ast.FunctionDef) -> tuple[int, tuple[str, ...]] | None:
    """``(raise line, allowlist)`` when a top-level ``if`` of ``fn``'s body raises unless one of
    the model's architectures is in a tuple of names (``moe_hook.py`` 209-216 in 0.5.20);
    None otherwise."""
    consts: dict[str, tuple[str, ...]] = {}
    for st in fn.body:
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
            names = _str_tuple(st.value)
            if names is not None:
                consts[st.targets[0].id] = names
        if isinstance(st, ast.If):
            allow = _arch_membership(st.test, consts)
            raised = next((b for b in st.body if isinstance(b, ast.Raise)), None)
            if allow is not None and raised is not None:
                return raised.lineno, allow
    return None


def _backend_guard(test: ast.AST) -> tuple[str, str] | None:
    """``(kind, value)`` for ``<x>a2a_backend == "v"`` / ``<x>runner_backend == "v"`` (a name or an
    attribute), kind ``"a2a"`` or ``"moe runner"``."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return None
    left, right = test.left, test.comparators[0]
    name = left.id if isinstance(left, ast.Name) else left.attr if isinstance(left, ast.Attribute) else ""
    if not (isinstance(right, ast.Constant) and isinstance(right.value, str)):
        return None
    kind = "a2a" if name.endswith("a2a_backend") else "moe runner" if name.endswith("runner_backend") else None
    return (kind, right.value) if kind else None


def _guarded_calls(mod: ast.Module) -> list[tuple[str, str, str, int, str, int]]:
    """``(caller, kind, backend, guard line, callee, call line)`` for each plain call statement
    ``callee(...)`` directly in the body of an ``if <backend guard>:`` at the top of a
    module-level function's body."""
    out = []
    for fn in mod.body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        for st in fn.body:
            guard = _backend_guard(st.test) if isinstance(st, ast.If) else None
            if guard is None:
                continue
            for b in st.body:
                if isinstance(b, ast.Expr) and isinstance(b.value, ast.Call) and isinstance(b.value.func, ast.Name):
                    out.append((fn.name, *guard, st.lineno, b.value.func.id, b.lineno))
    return out


def startup_refusals(root: Path) -> tuple[StartupRefusal, ...]:
    """Every startup validation of the tree at ``root`` that raises for :data:`LING_ARCH` (see the
    module docstring), read once per state of the tree's files. A caller counts only when its
    name is used somewhere else in the tree (a hook something runs, ``arg_groups/pipeline.py``
    295 in 0.5.23); the validator is the one its module defines or imports by name
    (:func:`_validator_def`)."""
    return _refusals(Path(root), tree_stamp(root))


def _guarded_names(text: str) -> set[str]:
    """Names a line of a block under a guard line (:data:`_GUARD_LINE`) starts by calling: a text
    filter, so that only files that may hold a guarded validator call are parsed."""
    lines, out = text.splitlines(), set()
    for m in _GUARD_LINE.finditer(text):
        i = text.count("\n", 0, m.start())
        indent = len(lines[i]) - len(lines[i].lstrip())
        for ln in lines[i + 1:]:
            if ln.strip() and len(ln) - len(ln.lstrip()) <= indent:
                break
            c = _CALL_LINE.match(ln)
            if c:
                out.add(c.group(1))
    return out


def _validator_def(root: Path, path: Path, name: str) -> tuple[Path | None, ast.FunctionDef | None]:
    """The module-level ``def name`` that the module at ``path`` calls: its own, else the one of the
    module a ``from a.b import name`` in it names (``root/a/b.py``, relative imports from its
    folder); ``(None, None)`` when neither is found or parses."""
    mod = _parse(path)
    own = next((f for f in mod.body if isinstance(f, ast.FunctionDef) and f.name == name), None)
    if own is not None:
        return path, own
    for node in walk(mod):
        if isinstance(node, ast.ImportFrom) and any(a.name == name and a.asname is None for a in node.names):
            base = path.parents[node.level - 1] if node.level else root
            target = base.joinpath(*(node.module or "").split("."))
            for f in (target.with_suffix(".py"), target / "__init__.py"):
                if f.is_file():
                    fn = next((d for d in _parse(f).body if isinstance(d, ast.FunctionDef) and d.name == name), None)
                    return (f, fn) if fn is not None else (None, None)
    return None, None


@lru_cache(maxsize=8)
def _refusals(root: Path, stamp: tuple) -> tuple[StartupRefusal, ...]:
    files = source_files(root)
    srt = root / "sglang" / "srt"
    # module-level functions of files that spell "architecture": the only possible validators
    arch_defs = {n for _, t in files if "architecture" in t for n in _MODULE_DEF.findall(t)}
    out = []
    for path, text in files:
        if "_backend ==" not in text or not _GUARD_LINE.search(text) or not _guarded_names(text) & arch_defs:
            continue
        for caller, kind, backend, gline, callee, cline in _guarded_calls(_parse(path)):
            if callee not in arch_defs:
                continue
            used = any(caller in t for p, t in files if p != path) or text.count(caller) > 1
            vpath, fn = _validator_def(root, path, callee) if used else (None, None)
            found = arch_validator(fn) if fn is not None else None
            if found is None or LING_ARCH in found[1]:
                continue
            rel = path.relative_to(srt).as_posix()
            out.append(StartupRefusal(backend, kind, caller, rel, gline, cline, callee,
                                      vpath.relative_to(srt).as_posix(), found[0], found[1]))
    return tuple(out)


def refusal_for(root: Path, key: str) -> StartupRefusal | None:
    """The first :func:`startup_refusals` entry whose guarded backend value is one the path
    ``key`` runs with (:func:`~nvfp4study.sglang.path_keys.backends`), or None. An a2a guard counts for a runner of the
    same name: ``a2a_backend == "flashinfer_megamoe"`` forces ``moe_runner_backend ==
    "flashinfer_megamoe"`` (``moe_hook.py`` 270-276 in 0.5.20)."""
    names = path_keys.backends(key)
    return next((r for r in startup_refusals(root) if r.backend in names), None)


def startup_refused(root: Path, key: str, row: Row) -> Row:
    """``row`` (an ``audit.PathResult`` of the path ``key`` in the tree at ``root``) made UNUSABLE
    when :func:`refusal_for` finds a startup validation that refuses Ling for one of the path's
    backends (``arg_groups/moe_hook.py`` 264-265 -> 209-216 in 0.5.20), at the validator's raise;
    the verdict and rule the path alone gets are kept in the rule. A path ABSENT from the release
    stays ABSENT."""
    hit = refusal_for(root, key) if row.verdict != ClampVerdict.ABSENT else None
    if hit is None:
        return row
    return replace(row, verdict=ClampVerdict.UNUSABLE,
                   rule=f"{hit.rule()} (the path alone: {row.verdict.value}: {row.rule[:120]})",
                   file=hit.validator_file, function=hit.validator, line=hit.raise_line)


__all__ = ["LING_ARCH", "StartupRefusal", "arch_validator", "refusal_for", "startup_refused",
           "startup_refusals"]
