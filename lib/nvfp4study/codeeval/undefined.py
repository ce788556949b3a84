"""Undefined names by pyflakes, split into junk, missing imports and star-import unknowns.

The model card's check is "an AST check for identifiers that are loaded but never bound".
:func:`undefined_names` runs pyflakes' ``Checker`` (``pyflakes/checker.py``) on a parsed tree
and keeps its ``UndefinedName``, ``UndefinedLocal`` and ``UndefinedExport`` messages
(``pyflakes/messages.py``); ``ImportStarUsage`` (a name that may come from ``from M import
*``) is resolved where ``M`` is a side-effect-free stdlib module and is otherwise reported as
unknown.

An undefined name that a known import would bind (:func:`missing_import_for`) is a real bug but
not junk: HumanEval prompts import from ``typing``, and a completion that drops that import
leaves ``List`` undefined. Such names are ``missing_import``, kept apart.
"""

from __future__ import annotations

import ast
import re
import sys
import typing
from importlib import import_module

from pyflakes import checker as pf_checker
from pyflakes import messages as pf_messages

from .findings import DetectorFinding, FindingKind

# name -> the import that binds it. Names commonly used in short algorithmic code without their
# import; stdlib module names and typing.__all__ are added below. Single letters (math.e) and
# math.ulp are left out on purpose: they are far more likely to be junk than a forgotten import.
COMMON_IMPORTS: dict[str, str] = {
    **{n: "collections" for n in ("defaultdict", "Counter", "deque", "OrderedDict", "namedtuple", "ChainMap")},
    **{n: "itertools" for n in ("permutations", "combinations", "combinations_with_replacement",
                                "product", "accumulate", "chain", "groupby", "islice", "cycle",
                                "zip_longest", "starmap", "takewhile", "dropwhile", "pairwise")},
    **{n: "functools" for n in ("reduce", "lru_cache", "cache", "partial", "cmp_to_key", "wraps")},
    **{n: "math" for n in ("sqrt", "floor", "ceil", "gcd", "lcm", "inf", "pi", "log", "log2",
                           "log10", "exp", "factorial", "comb", "perm", "isqrt", "prod",
                           "isclose", "hypot", "fabs")},
    **{n: "heapq" for n in ("heappush", "heappop", "heapify", "heapreplace", "heappushpop",
                            "nlargest", "nsmallest")},
    **{n: "bisect" for n in ("bisect_left", "bisect_right", "insort", "insort_left", "insort_right")},
    **{n: "string" for n in ("ascii_lowercase", "ascii_uppercase", "ascii_letters", "digits",
                             "punctuation", "hexdigits")},
    "deepcopy": "copy", "Fraction": "fractions", "Decimal": "decimal",
    "itemgetter": "operator", "attrgetter": "operator",
    "randint": "random", "shuffle": "random",
    "datetime": "datetime", "timedelta": "datetime", "date": "datetime",
    "dataclass": "dataclasses", "field": "dataclasses",
}
_MODULE_NAMES = frozenset(m for m in sys.stdlib_module_names if not m.startswith("_"))
_TYPING_NAMES = frozenset(typing.__all__)
# Modules whose star import we resolve by listing dir() (all imported by the interpreter or
# pure and side-effect free).
_STAR_RESOLVABLE = frozenset({"math", "typing", "collections", "itertools", "functools", "string",
                              "re", "heapq", "bisect", "operator", "statistics", "fractions",
                              "decimal", "random", "copy", "datetime", "cmath"})
_UNDEFINED_MSGS = (pf_messages.UndefinedName, pf_messages.UndefinedLocal, pf_messages.UndefinedExport)


def prompt_bindings(source: str) -> set[str]:
    """Names a prompt binds at module level (imports, defs, classes, assignments)."""
    tree = None
    for attempt in (source, source.rstrip() + "\n    pass\n"):
        try:
            tree = ast.parse(attempt)
            break
        except (SyntaxError, ValueError):
            continue
    names: set[str] = set()
    if tree is None:
        for m in re.finditer(r"^(?:from\s+\S+\s+)?import\s+(.+)$|^(?:def|class)\s+(\w+)", source, re.M):
            if m.group(2):
                names.add(m.group(2))
            else:
                for part in m.group(1).split(","):
                    names.add(part.strip().split(" as ")[-1].split(".")[0].strip("() "))
        return {n for n in names if n}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                names.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    return names - {"*"}


def _star_modules(tree: ast.Module) -> list[str]:
    return [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
            and any(a.name == "*" for a in n.names)]


def missing_import_for(name: str) -> str | None:
    """The import a name needs if it is a known importable name (``import math``,
    ``from typing import List``), else None."""
    if name in COMMON_IMPORTS:
        return f"from {COMMON_IMPORTS[name]} import {name}"
    if name in _TYPING_NAMES:
        return f"from typing import {name}"
    if name in _MODULE_NAMES:
        return f"import {name}"
    return None


def undefined_names(tree: ast.Module, scope: set[str] = frozenset()) -> list[DetectorFinding]:
    """pyflakes undefined-name findings, split into undefined_name / missing_import /
    star_import_name. ``scope``: extra names treated as bound (the prompt's)."""
    w = pf_checker.Checker(tree, builtins=set(scope))
    star = _star_modules(tree)
    star_names: set[str] | None = None
    if star and all(m in _STAR_RESOLVABLE for m in star):
        star_names = set()
        for m in star:
            star_names.update(n for n in dir(import_module(m)) if not n.startswith("_"))
    out: list[DetectorFinding] = []
    for msg in sorted(w.messages, key=lambda m: (m.lineno, m.col)):
        if isinstance(msg, pf_messages.ImportStarUsage):
            name = msg.message_args[0]
            if star_names is None:
                out.append(DetectorFinding(FindingKind.STAR_IMPORT_NAME, msg.lineno, msg.col, name,
                                   f"may come from: {msg.message_args[1]}"))
                continue
            if name in star_names:
                continue
            msg_kind = "undefined"
        elif isinstance(msg, _UNDEFINED_MSGS):
            name, msg_kind = msg.message_args[0], type(msg).__name__
        else:
            continue
        need = missing_import_for(name)
        if need:
            out.append(DetectorFinding(FindingKind.MISSING_IMPORT, msg.lineno, msg.col, name, need))
        else:
            out.append(DetectorFinding(FindingKind.UNDEFINED_NAME, msg.lineno, msg.col, name, msg_kind))
    return out

