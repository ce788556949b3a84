"""Fused functions SGLang registers only when an environment variable is set.

A ``@register_fused_func`` runs when its module is imported. Some modules are imported only
under an ``if`` on an environment flag that is off by default (0.5.23
``layers/moe/moe_runner/flashinfer_trtllm.py`` 1958-1959: ``if _SGLANG_EXPERIMENTAL_LORA_OPTI: from
sglang.srt.lora.trtllm_lora_temp import sgl_backend``, the flag ``envs.SGLANG_EXPERIMENTAL_LORA_OPTI``,
``EnvBool(False)`` at ``environ.py:1257``). By default such a fused function is not registered,
and ``MoeRunner.__init__`` raises for a backend that has no runner core either (runner.py
177-181 in 0.5.23). :func:`gated_registrations` finds them for :mod:`nvfp4study.sglang.dispatch`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable

from .code_index import CodeIndex, module_level, source_files, walk

SRT = "sglang/srt/"
RUNNER = SRT + "layers/moe/moe_runner/runner.py"  # MoeRunner (as dispatch.RUNNER)
ENVIRON = "sglang/srt/environ.py"


def _env_default(code: CodeIndex, flag: str) -> bool | None:
    """The default of ``envs.<flag>`` (``environ.py``: ``FLAG = EnvBool(False)``); None if not found."""
    mod = code.mod(ENVIRON)
    for n in ast.walk(mod) if mod is not None else ():
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == flag for t in n.targets) \
                and isinstance(n.value, ast.Call) and ast.unparse(n.value.func).endswith("EnvBool") \
                and n.value.args and isinstance(n.value.args[0], ast.Constant):
            return bool(n.value.args[0].value)
    return None


def _flag_of(test: ast.expr, module: ast.Module) -> str | None:
    """The environment flag an ``if`` test reads (``envs.X.get()`` or a module-level name bound to
    it), else None."""
    expr = test
    if isinstance(test, ast.Name):
        expr = next((st.value for st in module_level(module.body) if isinstance(st, ast.Assign)
                     and any(isinstance(t, ast.Name) and t.id == test.id for t in st.targets)), None)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "get" \
            and isinstance(expr.func.value, ast.Attribute) and ast.unparse(expr.func.value.value) == "envs":
        return expr.func.value.attr
    return None


#: the fields of a statement that hold statements (or handlers / match cases, which hold a body)
_STMT_LISTS = ("body", "orelse", "finalbody", "handlers", "cases")


def _imports_of(module: ast.Module, dotted: str) -> list[tuple[int, str | None]]:
    """``(line, flag)`` of each import of ``dotted`` in ``module``: the environment flag of the
    innermost ``if`` around it, None when no such ``if`` guards it. Read once per parsed module
    and name (kept on the node: a parsed tree is shared and never changed, and every audited tree
    asks again, a copy with one file changed included); a new list each call."""
    memo = getattr(module, "_imports_of", None)
    if memo is None:
        memo = module._imports_of = {}
    if dotted not in memo:
        memo[dotted] = tuple(_read_imports_of(module, dotted))
    return list(memo[dotted])


def _read_imports_of(module: ast.Module, dotted: str) -> list[tuple[int, str | None]]:
    """The body of :func:`_imports_of`."""
    out: list[tuple[int, str | None]] = []
    pkg, _, last = dotted.rpartition(".")

    def flag_of(tests: tuple[ast.expr, ...]) -> str | None:  # the innermost flag test wins
        return next((f for t in reversed(tests) if (f := _flag_of(t, module)) is not None), None)

    def visit(body: list[ast.stmt], tests: tuple[ast.expr, ...]) -> None:
        # imports are statements: only statement lists are walked (bodies, else and finally
        # branches, handlers, match cases), never expressions, which hold none; the tests of the
        # ``if``s around a statement are read only where an import is found
        for c in body:
            if isinstance(c, ast.ImportFrom) and ((c.module == pkg and any(a.name == last for a in c.names))
                                                  or c.module == dotted):
                out.append((c.lineno, flag_of(tests)))
            elif isinstance(c, ast.Import) and any(a.name == dotted for a in c.names):
                out.append((c.lineno, flag_of(tests)))
            elif isinstance(c, ast.If):
                visit(c.body, (*tests, c.test))
                visit(c.orelse, tests)
            else:
                for name in _STMT_LISTS:
                    for item in getattr(c, name, ()):
                        visit(item.body if isinstance(item, (ast.ExceptHandler, ast.match_case)) else [item], tests)

    visit(module.body, ())
    return out


def env_read(node: ast.Call, default_of: Callable[[str], bool | None]) -> bool | None:
    """The value of an environment read with every variable unset: ``envs.NAME.get()`` is
    ``default_of(NAME)`` (``NAME = EnvBool(False)`` in ``environ.py``, :func:`env_default_in`);
    ``get_bool_env_var("NAME"[, default])`` is its default, ``"false"`` unless given (``utils/common.py``
    1424-1435 in 0.5.23: true only for "true"/"1"). None for any other call."""
    f = node.func
    if isinstance(f, ast.Attribute) and f.attr == "get" and not node.args and isinstance(f.value, ast.Attribute) \
            and ast.unparse(f.value.value) == "envs":
        return default_of(f.value.attr)
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    if name == "get_bool_env_var" and node.args and isinstance(node.args[0], ast.Constant):
        default = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "default"), None)
        if default is None:
            return False
        return str(default.value).lower() in ("true", "1") if isinstance(default, ast.Constant) else None
    return None


def env_default_in(environ: ast.Module | None, flag: str) -> bool | None:
    """The default of ``envs.<flag>`` in a parsed ``environ.py`` (``FLAG = EnvBool(False)``); None if
    not found or not a constant bool."""
    return None if environ is None else _env_bools(environ).get(flag)


def _env_bools(environ: ast.Module) -> dict[str, bool]:
    # every FLAG = EnvBool(<bool>) of the module, the first in walk order per name, kept on the parsed
    # tree (parse-cached by content): a path's environment reads asked for them one walk each
    got = getattr(environ, "_env_bools", None)
    if got is None:
        got = {}
        for n in ast.walk(environ):
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and n.value.args \
                    and isinstance(n.value.args[0], ast.Constant) and isinstance(n.value.args[0].value, bool) \
                    and ast.unparse(n.value.func).endswith("EnvBool"):
                for t in n.targets:
                    if isinstance(t, ast.Name):
                        got.setdefault(t.id, n.value.args[0].value)
        environ._env_bools = got  # type: ignore[attr-defined]
    return got


def no_fused_func_raise(code: CodeIndex) -> int | None:
    """The line of ``MoeRunner.__init__``'s raise when a backend has neither a runner core nor a
    fused func (``if self.runner_core is None and self.fused_func is None: raise ...``, runner.py
    177-181 in 0.5.23), or None when the runner module has no such raise."""
    cls = code.top(RUNNER, "MoeRunner")
    init = next((n for n in getattr(cls, "body", []) if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    for n in walk(init) if init is not None else ():
        if isinstance(n, ast.If) and "fused_func" in ast.unparse(n.test) and "runner_core" in ast.unparse(n.test):
            r = next((b for b in n.body if isinstance(b, ast.Raise)), None)
            if r is not None:
                return r.lineno
    return None


def _import_sites(code: CodeIndex, dotted: str) -> list[tuple[str, tuple[int, str | None]]]:
    """``(file, (line, flag))`` of each import of module ``dotted`` in the tree. Only files whose
    text spells the package (its dotted parts, any spacing or line continuation between them) and
    the module's last name are parsed: an import of it spells both."""
    pkg, _, last = dotted.rpartition(".")
    spelled = re.compile(r"[\s\\]*\.[\s\\]*".join(map(re.escape, pkg.split("."))))
    out = []
    for r, text in source_files(code.root, code.unreadable):
        if last in text and spelled.search(text):
            rel = r.relative_to(code.root).as_posix()
            out += [(rel, site) for site in _imports_of(code.mod(rel) or ast.Module([], []), dotted)]
    return out


def gated_registrations(code: CodeIndex, fused: dict) -> dict[tuple[str, str], str]:
    """``{(a2a, runner): why}`` for each fused function of ``fused`` (:func:`~nvfp4study.sglang.
    dispatch.fused_registry`) whose every registration lives in a module imported only under an
    environment flag that is off by default; ``why`` names the flag and the import's file:line."""
    out: dict[tuple[str, str], str] = {}
    seen: dict[str, list[tuple[str, tuple[int, str | None]]]] = {}  # a module registers several
    for key, regs in fused.items():
        whys = []
        for rel, _fn, _line in regs:
            dotted = rel[:-3].replace("/", ".")
            if dotted not in seen:
                seen[dotted] = _import_sites(code, dotted)
            sites = seen[dotted]
            if not sites or any(flag is None or _env_default(code, flag) is not False for _, (_, flag) in sites):
                break
            r0, (ln, flag) = sites[0]
            whys.append(f"{rel[len(SRT):]} registers it only when imported, and it is imported only when "
                        f"{flag} is set (off by default: environ.py), {r0[len(SRT):]}:{ln}")
        else:
            if whys:
                out[key] = whys[0]
    return out


#: ``(line of the import, ((test, the truth it needs), ...))`` of one conditional import of a name
GatedImport = tuple[int, tuple[tuple[ast.expr, bool], ...]]


def conditional_imports(module: ast.Module) -> dict[str, tuple[GatedImport, ...]]:
    """``{name: imports}`` for each name ``module`` binds only by imports under module-level
    ``if``s (nested ones included; an import in an ``else`` needs its test false): no other
    statement of the module binds it (an assignment, a ``def``, an unconditional or ``try``
    import, a function's own binding, a parameter, ``global``). Where every such ``if`` is false,
    the name is unbound and a call through it raises NameError: 0.5.19
    ``quark_w4a4_mxfp4_moe.py`` 46-49 ``_use_aiter = get_bool_env_var("SGLANG_USE_AITER") and
    _is_hip`` / ``if _use_aiter: from aiter.utility.fp4_utils import e8m0_shuffle``, called at 853.
    Empty for a module with ``from x import *`` (anything may be bound). Read once per parsed
    module (kept on the node: a parsed tree is shared and never changed)."""
    memo = getattr(module, "_conditional_imports", None)
    if memo is None:
        memo = module._conditional_imports = _read_conditional_imports(module)  # type: ignore[attr-defined]
    return memo


def _read_conditional_imports(module: ast.Module) -> dict[str, tuple[GatedImport, ...]]:
    """The body of :func:`conditional_imports`."""
    gated: dict[str, list[GatedImport]] = {}
    gated_nodes: set[int] = set()

    def visit(body: list[ast.stmt], conds: tuple[tuple[ast.expr, bool], ...]) -> None:
        for st in body:
            if isinstance(st, ast.If):
                visit(st.body, (*conds, (st.test, True)))
                visit(st.orelse, (*conds, (st.test, False)))
            elif isinstance(st, (ast.Import, ast.ImportFrom)) and conds:
                gated_nodes.add(id(st))
                for a in st.names:
                    gated.setdefault((a.asname or a.name).split(".")[0], []).append((st.lineno, conds))

    visit(module.body, ())
    other: set[str] = set()
    for n in ast.walk(module):
        if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in gated_nodes:
            if any(a.name == "*" for a in n.names):
                return {}
            other.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            other.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            other.add(n.name)
        elif isinstance(n, ast.arg):
            other.add(n.arg)
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            other.update(n.names)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            other.add(n.name)
        elif isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name:
            other.add(n.name)
    return {k: tuple(v) for k, v in gated.items() if k not in other}


__all__ = ["conditional_imports", "env_default_in", "env_read", "gated_registrations", "no_fused_func_raise"]
