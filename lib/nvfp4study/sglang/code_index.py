"""Where names lead in an SGLang source tree, read with ``ast`` (nothing imported): modules by
path, top-level classes and functions, imports followed (re-exports included), methods found
through in-tree base classes. Used by :mod:`nvfp4study.sglang.dispatch` to follow the MoE
dispatch.
"""

from __future__ import annotations

import ast
from pathlib import Path

from .clamp_values import _imports, _parse

SRT = "sglang/srt/"


class Code:
    """Lazy, cached access to the modules and classes of one tree (``root`` holds ``sglang/``)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._mods: dict[str, ast.Module | None] = {}

    def mod(self, rel: str) -> ast.Module | None:
        if rel not in self._mods:
            p = self.root / rel
            self._mods[rel] = _parse(p) if p.is_file() else None
        return self._mods[rel]

    def rel_for(self, dotted: str) -> str | None:
        base = dotted.replace(".", "/")
        for rel in (base + ".py", base + "/__init__.py"):
            if (self.root / rel).is_file():
                return rel
        return None

    def top(self, rel: str, name: str) -> ast.AST | None:
        m = self.mod(rel)
        if m is None:
            return None
        for n in m.body:
            if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name:
                return n
        return None

    def resolve(self, rel: str, name: str, local: dict | None = None, hops: int = 3) -> tuple[str, ast.AST] | None:
        """The top-level class or function ``name`` means in module ``rel`` (following imports,
        re-exports included), with ``local`` the imports made inside the calling function."""
        node = self.top(rel, name)
        if node is not None:
            return rel, node
        m = self.mod(rel)
        if m is None or hops == 0:
            return None
        src = (local or {}).get(name) or _imports(m.body, _pkg(rel)).get(name)
        if src is None:
            return None
        target = self.rel_for(src[0])
        return self.resolve(target, src[1], None, hops - 1) if target else None

    def method(self, rel: str, cls: ast.ClassDef, name: str, depth: int = 4) -> tuple[str, str] | None:
        """``(file, "Class.method")`` where ``cls`` or its nearest in-tree base defines ``name``."""
        for n in cls.body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name:
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


def _pkg(rel: str) -> str:
    return rel[:-3].replace("/", ".")


def local_imports(fn: ast.AST, rel: str) -> dict:
    """The ``from ... import`` names made inside ``fn`` (module ``rel``): ``{name: (module, attr)}``."""
    return _imports([n for n in ast.walk(fn) if isinstance(n, ast.ImportFrom)], _pkg(rel))


def funcs(cls: ast.ClassDef) -> list[ast.FunctionDef]:
    """The methods defined in ``cls``'s own body."""
    return [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def called_name(call: ast.Call) -> str | None:
    """``f`` for a call ``f(...)``; None for ``a.f(...)`` and anything else."""
    return call.func.id if isinstance(call.func, ast.Name) else None


def class_defined(root: Path, name: str) -> str | None:
    """``"file:line"`` (relative to ``sglang/srt``) of the first ``class name`` in the tree, or None."""
    needle = f"class {name}"
    for path in sorted((Path(root) / SRT).rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for i, line in enumerate(text.splitlines(), 1):
            if line.startswith(needle) and line[len(needle):len(needle) + 1] in ("(", ":"):
                return f"{path.relative_to(Path(root) / SRT).as_posix()}:{i}"
    return None


__all__ = ["SRT", "Code", "called_name", "class_defined", "funcs", "local_imports", "step_name"]
