"""Where names lead in an SGLang source tree, read with ``ast`` (nothing imported): modules by
path, top-level classes and functions, imports followed (re-exports included), methods found
through in-tree base classes. Used by :mod:`nvfp4study.sglang.dispatch` to follow the MoE
dispatch.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from .clamp_values import _imports, _parse, unparse
from .tree_files import SRT, files_stamp, py_files, source_files, tree_stamp


class CodeIndex:
    """Lazy, cached access to the modules and classes of one tree (``root`` holds ``sglang/``)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._mods: dict[str, ast.Module | None] = {}
        #: ``{file: why}`` for the files the dispatch needed and could not read or parse
        self.unreadable: dict[str, str] = {}

    def mod(self, rel: str) -> ast.Module | None:
        """The parsed module ``rel`` (from the root), or None if absent or unreadable (then
        recorded in :attr:`unreadable`: one bad file does not stop the others being followed)."""
        if rel not in self._mods:
            p = self.root / rel
            try:
                self._mods[rel] = _parse(p) if p.exists() or p.is_symlink() else None
            except SyntaxError as exc:
                self._mods[rel] = None
                where = f":{exc.lineno}" if exc.lineno else ""
                self.unreadable[rel] = f"{rel[len(SRT):] if rel.startswith(SRT) else rel}{where}: {exc.msg}"
        return self._mods[rel]

    def rel_for(self, dotted: str) -> str | None:
        base = dotted.replace(".", "/")
        for rel in (base + ".py", base + "/__init__.py"):
            if (self.root / rel).is_file():
                return rel
        return None

    def top(self, rel: str, name: str) -> ast.AST | None:
        """The module-level class or function ``name`` of ``rel`` (one inside a top-level ``if`` /
        ``try`` / ``with`` counts), the last definition winning."""
        m = self.mod(rel)
        if m is None:
            return None
        defs = getattr(m, "_top_defs", None)  # kept on the module node: a parsed tree never changes
        if defs is None:
            defs = m._top_defs = {n.name: n for n in module_level(m.body)
                                  if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))}
        return defs.get(name)

    def resolve(self, rel: str, name: str, local: dict | None = None, hops: int = 3) -> tuple[str, ast.AST] | None:
        """The top-level class or function ``name`` means in module ``rel`` (following imports,
        re-exports included), with ``local`` the imports made inside the calling function."""
        node = self.top(rel, name)
        if node is not None:
            return rel, node
        m = self.mod(rel)
        if m is None or hops == 0:
            return None
        # the module's last top-level binding of the name wins, as when Python runs it: an import
        # or an alias ``Old = New`` (0.5.19's quantization/__init__.py binds a fallback first)
        last = _bindings(m, rel).get(name)
        if local and name in local:
            last = ("import", local[name])
        if last and last[0] == "alias":
            return self.resolve(rel, last[1], local, hops - 1)
        src = last[1] if last else None
        if src is None:  # from x import *: the name may come from any starred module
            for st in module_level(m.body):
                if isinstance(st, ast.ImportFrom) and any(a.name == "*" for a in st.names):
                    base = _imports([ast.ImportFrom(module=st.module, names=[ast.alias(name="_")], level=st.level)],
                                    module_name(rel))["_"][0]
                    target = self.rel_for(base)
                    hit = self.resolve(target, name, None, hops - 1) if target else None
                    if hit:
                        return hit
        if src is None:
            return None
        target = self.rel_for(src[0])
        return self.resolve(target, src[1], None, hops - 1) if target else None

    def resolve_attr(self, rel: str, node: ast.Attribute) -> tuple[str, ast.AST] | None:
        """What ``mod.Name`` means in ``rel`` when ``mod`` is an imported module (``import a.b as
        mod`` or ``from a import b``)."""
        m = self.mod(rel)
        if m is None or not isinstance(node.value, ast.Name):
            return None
        alias = node.value.id
        for st in module_level(m.body):
            if isinstance(st, ast.Import):
                for a in st.names:
                    if (a.asname or a.name.split(".")[0]) == alias:
                        target = self.rel_for(a.name if a.asname else a.name.split(".")[0])
                        return self.resolve(target, node.attr) if target else None
            elif isinstance(st, ast.ImportFrom):
                src = _imports([st], module_name(rel)).get(alias)
                if src:
                    target = self.rel_for(f"{src[0]}.{src[1]}")
                    return self.resolve(target, node.attr) if target else None
        return None

    def method(self, rel: str, cls: ast.ClassDef, name: str, depth: int = 4) -> tuple[str, str] | None:
        """``(file, "Class.method")`` where ``cls`` or its nearest in-tree base defines ``name``."""
        if name in class_methods(cls):
            return rel, f"{cls.name}.{name}"
        if depth == 0:
            return None
        for b in cls.bases:
            bname = b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else None
            hit = self.resolve(rel, bname) if bname else None
            if hit and isinstance(hit[1], ast.ClassDef):
                found = self.method(hit[0], hit[1], name, depth - 1)
                if found:
                    return found
        return None


def step_name(where: tuple[str, str]) -> str:
    """``"layers/x.py::Class.method"``: a step as the audit names it (relative to ``sglang/srt``)."""
    rel = where[0][len(SRT):] if where[0].startswith(SRT) else where[0]
    return f"{rel}::{where[1]}"


def module_name(rel: str) -> str:
    return rel[:-3].replace("/", ".")


def _bindings(m: ast.Module, rel: str) -> dict[str, tuple[str, Any]]:
    """``{name: ("import", (module, attr)) | ("alias", other)}``: the last module-level import or
    alias (``Old = New``) binding each name in module ``m`` at ``rel``; kept on the module node
    per ``rel`` (one parsed tree may stand for identical files at several places)."""
    per_rel = m.__dict__.setdefault("_bindings", {})
    if rel not in per_rel:
        out: dict[str, tuple[str, Any]] = {}
        for st in module_level(m.body):
            if isinstance(st, ast.ImportFrom):
                for k, v in _imports([st], module_name(rel)).items():
                    out[k] = ("import", v)
            elif isinstance(st, ast.Assign) and isinstance(st.value, ast.Name):
                for t in st.targets:
                    if isinstance(t, ast.Name) and t.id != st.value.id:
                        out[t.id] = ("alias", st.value.id)
        per_rel[rel] = out
    return per_rel[rel]


def walk(node: ast.AST) -> tuple[ast.AST, ...]:
    """``ast.walk(node)`` as a tuple, kept on the node: the parsed trees are shared and never
    changed (clamp_values._parse), and the dispatch and the interpreter walk the same methods
    again for every class and path that has them."""
    nodes = getattr(node, "_walk", None)
    if nodes is None:
        nodes = node._walk = tuple(ast.walk(node))
    return nodes


def local_imports(fn: ast.AST, rel: str) -> dict:
    """The ``from ... import`` names made inside ``fn`` (module ``rel``): ``{name: (module, attr)}``."""
    found = getattr(fn, "_import_froms", None)  # kept on the node: a parsed tree never changes
    if found is None:
        found = fn._import_froms = [n for n in ast.walk(fn) if isinstance(n, ast.ImportFrom)]
    return _imports(found, module_name(rel))


def module_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements that run at module (or class) level, in order: those of ``body`` and of the
    blocks of its ``if`` / ``try`` / ``with`` statements, recursively (a class defined under
    ``if TYPE_CHECKING:`` or ``try:`` is still defined at module level)."""
    out: list[ast.stmt] = []
    for st in body:
        out.append(st)
        if isinstance(st, ast.If):
            out += module_level(st.body) + module_level(st.orelse)
        elif isinstance(st, ast.Try):
            out += module_level(st.body) + [x for h in st.handlers for x in module_level(h.body)] \
                + module_level(st.orelse) + module_level(st.finalbody)
        elif isinstance(st, (ast.With, ast.AsyncWith)):
            out += module_level(st.body)
    return out


def class_methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    """``{name: function}`` for the methods of ``cls``'s own body, including names bound to one of
    them (``apply_weights = _impl``, ``x = property(_impl)``); the last binding wins. Read once
    per class node (a copy)."""
    cached = getattr(cls, "_class_methods", None)
    if cached is None:
        cached = cls._class_methods = _class_methods(cls)
    return dict(cached)


def _class_methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    out: dict[str, ast.FunctionDef] = {}
    for st in module_level(cls.body):
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[st.name] = st
        elif isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
            v = st.value
            if isinstance(v, ast.Call) and unparse(v.func).split(".")[-1] in ("property", "cached_property") \
                    and v.args:
                v = v.args[0]
            if isinstance(v, ast.Name) and v.id in out:
                out[st.targets[0].id] = out[v.id]
    return out


def funcs(cls: ast.ClassDef) -> list[ast.FunctionDef]:
    """The methods of ``cls``'s own body, under the names they are bound to (see :func:`class_methods`);
    each carries its bound name in ``bound_name`` when that differs from its ``def`` name."""
    out = []
    for name, fn in class_methods(cls).items():
        if fn.name != name:
            fn = _renamed(fn, name)
        out.append(fn)
    return out


def _renamed(fn: ast.FunctionDef, name: str) -> ast.FunctionDef:
    """A shallow copy of ``fn`` named ``name`` (an alias binding), its body shared."""
    import copy

    new = copy.copy(fn)
    new.name = name
    new.__dict__.pop("_walk", None)  # the kept walk starts with ``fn`` itself (see walk)
    new.__dict__.pop("_src", None)  # its unparsed text names the old name (clamp_values.unparse)
    return new


def called_name(call: ast.Call) -> str | None:
    """``f`` for a call ``f(...)``; None for ``a.f(...)`` and anything else."""
    return call.func.id if isinstance(call.func, ast.Name) else None


def class_defined(root: Path, name: str) -> str | None:
    """``"file:line"`` (relative to ``sglang/srt``) of the first ``class name`` (or a module-level
    alias ``name = Other``) in the tree, or None."""
    cls = re.compile(rf"\s*class {re.escape(name)}\s*[(:]")  # indented too: under a top-level if/try
    alias = re.compile(rf"{re.escape(name)}\s*=\s*[A-Za-z_][\w.]*\s*$")
    for path, text in source_files(root):
        if name not in text:  # both patterns spell the name: most files are passed over here
            continue
        for i, line in enumerate(text.splitlines(), 1):
            if cls.match(line) or alias.match(line):
                return f"{path.relative_to(Path(root) / SRT).as_posix()}:{i}"
    return None


def alias_target(root: Path, name: str) -> str | None:
    """``Other`` when the tree has no ``class name`` but a module-level ``name = Other``."""
    alias = re.compile(rf"{re.escape(name)}\s*=\s*(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*)\s*$")
    hit = class_defined(root, name)
    if hit is None:
        return None
    path, line = hit.rsplit(":", 1)
    m = alias.match((Path(root) / SRT / path).read_text(encoding="utf-8").splitlines()[int(line) - 1])
    return m.group(1) if m else None



def _bound_names(tree: ast.Module) -> frozenset[str]:
    """Names a module may bind as attributes: attribute stores (``x.a = ...``, ``x.a: T = ...``),
    functions, names assigned or annotated anywhere, keyword names and string constants (what
    ``setattr``/``getattr``/dataclass fields spell)."""
    memo = getattr(tree, "_bound_names", None)  # kept on the tree: it lives as long as the tree
    if memo is not None:
        return memo
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and not isinstance(n.ctx, ast.Load):
            out.add(n.attr)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            out.add(n.id)
        elif isinstance(n, ast.keyword) and n.arg:
            out.add(n.arg)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isidentifier():
            out.add(n.value)
    tree._bound_names = frozenset(out)
    return tree._bound_names


def bound_in_module(tree: ast.Module, name: str) -> bool:
    """Whether ``tree`` may bind the attribute ``name`` (:func:`_bound_names`)."""
    return name in _bound_names(tree)


_NEVER_SET: dict[tuple[str, str], bool] = {}


def forget_settable(root: Path) -> None:
    """Drop :func:`attribute_never_set`'s readings of ``root`` (the audit of a tree starts with it,
    so a tree edited in place is read again)."""
    for key in [k for k in _NEVER_SET if k[0] == str(root)]:
        del _NEVER_SET[key]


def attribute_never_set(root: Path, name: str) -> bool:
    """Whether no file of the tree at ``root`` can give an object an attribute ``name``: no
    attribute store (``x.name = ...``, annotated or augmented), no ``setattr`` / ``register_*``
    naming it, no method ``def name(`` (indented) and no class-level binding (``    name = ...`` /
    ``    name: T`` at a class body's indentation). Reading it then raises AttributeError (e.g.
    ``self.fused_experts`` of GGUFMoEMethod, layers/quantization/gguf.py:568 in 0.5.19). Read
    once per tree and name (until :func:`forget_settable`)."""
    key = (str(root), name)
    if key not in _NEVER_SET:
        n = re.escape(name)
        pat = re.compile(rf"\.{n}[ \t]*(?::[^=\n]*)?[-+*/|&]?=(?!=)|(?:setattr|register_\w+)\([^)\n]*[\"']{n}[\"']"
                         rf"|^[ \t]+(?:async[ \t]+)?def[ \t]+{n}[ \t]*\(|^ {{4}}{n}[ \t]*(?::|=(?!=))", re.M)
        # the texts come from source_files' cache, which keeps the last two trees (a module
        # dict of its own here once kept every audited tree's ~50 MB for good)
        _NEVER_SET[key] = not any(pat.search(text) for _, text in source_files(root) if name in text)
    return _NEVER_SET[key]


#: bases that declare no names a payload's reader could want
_NAMELESS_BASES = frozenset({"ABC", "object", "Generic", "Protocol"})


def declared_names(mod: Any, cname: str, module_for: Any, depth: int = 0) -> frozenset | None:
    """Every name class ``cname`` of parsed module ``mod`` (``.tree``, ``.imports``) and its in-tree bases
    declare in their bodies (annotated fields, assignments, methods, nested classes); None where the class
    or a base other than ``ABC``/``object``/``Generic``/``Protocol`` is not found (``module_for``: dotted
    module -> parsed module or None). Kept on the class node: it lives as long as its parsed tree."""
    cls = next((n for n in (mod.tree.body if mod else []) if isinstance(n, ast.ClassDef) and n.name == cname), None)
    if cls is None or depth > 8:
        return None
    memo = getattr(cls, "_declared_names", False)
    if memo is not False:
        return memo
    names: set[str] | None = set()
    for st in cls.body:
        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
            names.add(st.target.id)
        elif isinstance(st, ast.Assign):
            names.update(t.id for t in st.targets if isinstance(t, ast.Name))
        elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(st.name)
    for b in cls.bases:
        b = b.value if isinstance(b, ast.Subscript) else b
        bname = b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else None
        if bname in _NAMELESS_BASES:
            continue
        src = mod.imports.get(bname) if isinstance(b, ast.Name) else None
        other = module_for(src[0]) if src else mod if isinstance(b, ast.Name) else None
        got = None if other is None else declared_names(other, src[1] if src else bname, module_for, depth + 1)
        if got is None:
            names = None
            break
        names |= got
    cls._declared_names = None if names is None else frozenset(names)
    return cls._declared_names


def always_evaluated(node: ast.AST) -> list[ast.AST]:
    """The nodes of expression ``node`` Python evaluates whenever it evaluates ``node``: not the
    operands after the first of ``and``/``or`` (short-circuit), not the branches of ``x if c else
    y``, not the bodies of lambdas and comprehensions."""
    out, todo = [], [node]
    while todo:
        n = todo.pop()
        out.append(n)
        if isinstance(n, ast.BoolOp):
            todo.append(n.values[0])
        elif isinstance(n, ast.IfExp):
            todo.append(n.test)
        elif not isinstance(n, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            todo.extend(ast.iter_child_nodes(n))
    return out


def constant_defaults(mod: Any, cname: str) -> dict[str, Any]:
    """``{field: constant}`` for the fields of class ``cname`` of parsed module ``mod`` declared with a
    constant default (``use_mxfp8: bool = False``); ``{}`` when the class is not found."""
    cls = next((n for n in (mod.tree.body if mod else []) if isinstance(n, ast.ClassDef) and n.name == cname), None)
    if cls is None:
        return {}
    return {st.target.id: st.value.value for st in cls.body if isinstance(st, ast.AnnAssign)
            and isinstance(st.target, ast.Name) and isinstance(st.value, ast.Constant)}


__all__ = ["SRT", "CodeIndex", "alias_target", "always_evaluated", "attribute_never_set", "bound_in_module", "called_name", "constant_defaults", "declared_names", "forget_settable",
           "class_defined", "class_methods", "funcs", "local_imports", "module_level", "module_name",
           "files_stamp", "py_files", "source_files", "step_name", "tree_stamp"]
