"""The device class an MoE path of an SGLang tree can run on, read from its guards (``ast`` only).

SGLang chooses platform code with predicates of ``sglang/srt/utils/common.py`` (0.5.23 lines):
``is_hip()`` (141: ``torch.version.hip is not None``), ``is_cuda()`` (158), ``is_cuda_alike()``
(163: CUDA or HIP), ``is_xpu()`` (173), ``is_npu()`` (189), ``is_cpu()`` (221: the CPU engine),
and capability checks that are false off their platform (``is_sm90_supported`` ... built on
``_check_cuda_device_version``, ``is_gfx95_supported`` 1239: "False on every non-HIP build",
``cpu_has_amx_support``). Modules cache them in flags (``_is_hip = is_hip()``,
``_use_aiter = get_bool_env_var("SGLANG_USE_AITER") and _is_hip``).

- :func:`flag`: the value of such a module-level flag under a platform's facts (None: not a
  platform flag, or not decided).
- :func:`reachable_on`: the platforms on which a statement of a module is reachable, from the
  ``if`` tests around it and the early ``return``/``raise`` blocks before it.
- :func:`module_platforms`: a module that exists for one platform only (under
  ``hardware_backend/<platform>/``, or importing that package or ``torch_npu`` at module level).
- :func:`bound_on`: the platforms on which a module-level name is bound (a kernel imported only
  under ``if _is_cuda:``); :func:`unconditional_calls`: the names a function calls on every way
  through it (what :func:`nvfp4study.sglang.runner_builds.runs_on` follows).
- :func:`facts`: the interpreter facts (``{"is_npu()": True, ...}``) shared by every platform of a
  set; a predicate whose value differs between them stays unknown.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable
from functools import cache

from . import kleene
from .code_index import walk

#: the device classes, in the order paths name them
PLATFORMS = ("CUDA", "ROCm", "XPU", "NPU", "CPU")
#: predicates whose value is the platform itself (utils/common.py, see the module docstring)
EXACT = {"is_cuda": {"CUDA"}, "is_hip": {"ROCm"}, "is_cuda_alike": {"CUDA", "ROCm"},
         "is_xpu": {"XPU"}, "is_npu": {"NPU"}, "is_cpu": {"CPU"},
         # Moore Threads' MUSA (0.5.23 utils/common.py 228-234: torch.version.musa set and torchada importable)
         # is none of the device classes: false on each
         "is_musa": set()}
#: capability checks: unknown on their platform, False on every other
_ONLY_ON = [(re.compile(r"^_?(is_sm\d+|is_blackwell|is_hopper)"), "CUDA"),
            (re.compile(r"gfx9"), "ROCm"), (re.compile(r"amx"), "CPU")]
#: folders of sglang/srt/hardware_backend and the platform each serves
_BACKEND_DIRS = {"npu": "NPU", "xpu": "XPU", "cpu": "CPU"}
_ONLY_PACKAGES = {"torch_npu": "NPU"}


def predicate_value(name: str, platform: str) -> bool | None:
    """``is_npu`` on ``NPU`` -> True; ``is_sm100_supported`` on CUDA -> None (unknown), on ROCm
    -> False; a name that is no platform predicate -> None."""
    if name in EXACT:
        return platform in EXACT[name]
    for pat, only in _ONLY_ON:
        if pat.search(name):
            return None if platform == only else False
    return None


def is_predicate(name: str) -> bool:
    """Whether ``name`` is one of the platform predicates :func:`predicate_value` knows."""
    return name in EXACT or any(p.search(name) for p, _ in _ONLY_ON)


def facts(platforms: Iterable[str]) -> dict[str, bool]:
    """``{"is_npu()": False, ...}``: each predicate's value where every platform in ``platforms``
    agrees on it (the interpreter's call facts)."""
    ps = list(platforms)
    out = {}
    for name in EXACT:
        vals = {predicate_value(name, p) for p in ps}
        if len(vals) == 1 and None not in vals:
            out[f"{name}()"] = vals.pop()
    return out


def _module_flags(tree: ast.Module) -> dict[str, ast.expr]:
    """``{name: value}`` for names assigned exactly once, directly in the module body."""
    seen: dict[str, list[ast.expr]] = {}
    for st in tree.body:
        if isinstance(st, ast.Assign):
            for t in st.targets:
                if isinstance(t, ast.Name):
                    seen.setdefault(t.id, []).append(st.value)
        elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None:
            seen.setdefault(st.target.id, []).append(st.value)
    return {k: v[0] for k, v in seen.items() if len(v) == 1}


@cache
def _flags_of(tree: ast.Module) -> dict[str, ast.expr]:
    return _module_flags(tree)


def flag(tree: ast.Module, name: str, value_of: Callable[[str], bool | None], depth: int = 0,
         env_of: Callable[[ast.Call], bool | None] | None = None) -> bool | None:
    """The value of module-level flag ``name`` of ``tree`` (``_is_hip = is_hip()``) when it is
    built from platform predicates only; ``value_of(predicate)`` gives a predicate's value
    (None: unknown); ``env_of(call)``, where given, the value of an environment read
    (``_use_aiter = envs.SGLANG_USE_AITER.get() and _is_hip``, fp8.py:130 in 0.5.19). None when the
    flag is not such a flag or is not decided."""
    node = _flags_of(tree).get(name)
    if node is None or depth > 4:
        return None
    return test_value(node, lambda n: flag(tree, n, value_of, depth + 1, env_of), value_of, env_of)


def test_value(node: ast.expr, name_of: Callable[[str], bool | None],
               value_of: Callable[[str], bool | None],
               env_of: Callable[[ast.Call], bool | None] | None = None) -> bool | None:
    """Three-valued truth of a test made of platform predicates: calls (``is_npu()``,
    ``x.is_hip()``; any other call is ``env_of(call)`` where given, else unknown), names
    (``name_of``), ``not``/``and``/``or`` (:func:`~nvfp4study.sglang.kleene.truth`), bool constants."""

    def leaf(n: ast.AST) -> bool | None:
        if isinstance(n, ast.Constant) and isinstance(n.value, bool):
            return n.value
        if isinstance(n, ast.Call):
            f = n.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            return value_of(name) if is_predicate(name) else env_of(n) if env_of is not None else None
        if isinstance(n, ast.Name):
            return value_of(n.id) if n.id in EXACT else name_of(n.id)
        return None

    return kleene.truth(node, leaf)


@cache
def _parents(tree: ast.Module) -> dict[int, ast.AST]:
    out = {}
    todo = [tree]
    while todo:  # each node's children once (ast.walk would list them a second time)
        n = todo.pop()
        for c in ast.iter_child_nodes(n):
            out[id(c)] = n
            todo.append(c)
    return out


def _ends(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], (ast.Return, ast.Raise))


def guards(tree: ast.Module, node: ast.AST) -> list[tuple[ast.expr, bool]]:
    """The tests ``node`` of ``tree`` sits under, each with the value it needs: the enclosing
    ``if`` (True in its body, False in its ``else``) and each earlier ``if`` of the same block
    whose body ends in ``return``/``raise`` without an ``else`` (False), up to the function."""
    parents, out = _parents(tree), []
    child = node
    while (parent := parents.get(id(child))) is not None:
        if isinstance(parent, ast.If) and child is not parent.test:
            out.append((parent.test, child in parent.body))
        for block in ("body", "orelse"):
            stmts = getattr(parent, block, None)
            if isinstance(stmts, list) and child in stmts:
                for st in stmts[:stmts.index(child)]:
                    if isinstance(st, ast.If) and not st.orelse and _ends(st.body):
                        out.append((st.test, False))
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
            break
        child = parent
    return out


def reachable_on(tree: ast.Module, node: ast.AST, platforms: Iterable[str] = PLATFORMS) -> set[str]:
    """The platforms of ``platforms`` on which no test around ``node`` (:func:`guards`) is
    decided against it."""
    out, tests = set(), guards(tree, node)
    for p in platforms:
        def value_of(name: str, p: str = p) -> bool | None:
            return predicate_value(name, p)

        def name_of(name: str, value_of=value_of) -> bool | None:
            return flag(tree, name, value_of)

        if all(test_value(t, name_of, value_of) in (None, want) for t, want in tests):
            out.add(p)
    return out


def true_on(tree: ast.Module, fn: ast.FunctionDef, platforms: Iterable[str] = PLATFORMS) -> set[str]:
    """The platforms of ``platforms`` on which ``fn`` (a function of ``tree``) may return a true
    value: those reaching (:func:`reachable_on`) one of its ``return`` statements that is not
    ``return False``. ``cutlass_fp8_supported()`` (layers/quantization/fp8_utils.py 272-281 in
    0.5.19: ``if not _is_cuda: return False`` first) is true on CUDA only."""
    rets = [r for r in walk(fn) if isinstance(r, ast.Return)
            and not (isinstance(r.value, ast.Constant) and r.value.value is False)]
    return set().union(*(reachable_on(tree, r, platforms) for r in rets)) if rets else set()


def module_platforms(rel: str, tree: ast.Module | None, runner: bool = False) -> set[str] | None:
    """The one platform a module exists for, or None (any): a file under
    ``sglang/srt/hardware_backend/<npu|xpu|cpu>/``, or one importing ``torch_npu`` in its module
    body (not under ``if``/``try``). A ``runner`` module (a runner core or fused function: it
    implements one backend) is also one platform's when its body imports that platform's
    ``hardware_backend`` package (``moe_runner/ascend.py``); a quantization method's module may
    import one for its branch of that platform only, so that does not count for it."""
    m = re.match(r"sglang/srt/hardware_backend/(\w+)/", rel)
    if m and m.group(1) in _BACKEND_DIRS:
        return {_BACKEND_DIRS[m.group(1)]}
    for st in tree.body if tree is not None else []:
        names = ([st.module or ""] if isinstance(st, ast.ImportFrom) and not st.level
                 else [a.name for a in st.names] if isinstance(st, ast.Import) else [])
        for mod in names:
            top = mod.split(".")[0]
            if top in _ONLY_PACKAGES:
                return {_ONLY_PACKAGES[top]}
            hb = re.match(r"sglang\.srt\.hardware_backend\.(\w+)", mod)
            if runner and hb and hb.group(1) in _BACKEND_DIRS:
                return {_BACKEND_DIRS[hb.group(1)]}
    return None


def _module_stmts(body: list[ast.stmt]) -> Iterable[ast.stmt]:
    """The statements of a module body, those nested in module-level ``if``/``try``/``with``
    blocks included (not the bodies of functions or classes)."""
    for st in body:
        yield st
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for block in ("body", "orelse", "finalbody"):
            yield from _module_stmts(getattr(st, block, None) or [])
        for h in getattr(st, "handlers", None) or []:
            yield from _module_stmts(h.body)


def _binds(st: ast.stmt) -> set[str]:
    """The names a module-level statement binds (imports, assignments to names, defs)."""
    if isinstance(st, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in st.names}
    if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {st.name}
    targets = st.targets if isinstance(st, ast.Assign) else [st.target] if isinstance(st, ast.AnnAssign) else []
    return {n.id for t in targets for n in walk(t) if isinstance(n, ast.Name)}


def bound_on(tree: ast.Module, name: str) -> set[str] | None:
    """The platforms on which module-level ``name`` of ``tree`` is bound: the union of
    :func:`reachable_on` over the statements binding it (``if _is_cuda: from ... import
    moe_wna16_marlin_gemm``, layers/moe/fused_moe_triton/fused_marlin_moe.py 12-18 in 0.5.19:
    CUDA only). None when the module never binds it (a builtin, a local)."""
    sites = [st for st in _module_stmts(tree.body) if name in _binds(st)]
    return set().union(*(reachable_on(tree, st) for st in sites)) if sites else None


#: nodes under which a call may not run although its statement does
_CONDITIONAL = (ast.IfExp, ast.BoolOp, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                ast.GeneratorExp, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def unconditional_calls(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """The plain names ``fn`` calls on every way through its body up to its first ``return``:
    calls in its top-level simple statements (assignments, expressions, ``return``), not under
    an ``if``, loop, ``try`` or conditional expression, none after a statement holding a
    ``return``; ``fused_experts_none_to_marlin`` calls ``fused_marlin_moe`` so
    (moe_runner/marlin.py 115-205 in 0.5.19)."""
    out: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            out.append(node.func.id)
        for c in ast.iter_child_nodes(node):
            if not isinstance(c, _CONDITIONAL):
                visit(c)

    for st in fn.body:
        if isinstance(st, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr, ast.Return)):
            visit(st)
        if isinstance(st, ast.Return) or any(isinstance(n, ast.Return) for n in walk(st)):
            break
    return list(dict.fromkeys(out))


def describe(platforms: Iterable[str]) -> str:
    """``{"CUDA", "ROCm"}`` -> ``"CUDA|ROCm"`` (in :data:`PLATFORMS` order); ``"none"`` if empty."""
    ps = [p for p in PLATFORMS if p in set(platforms)]
    return "|".join(ps) if ps else "none"


__all__ = ["EXACT", "PLATFORMS", "bound_on", "describe", "facts", "flag", "guards", "is_predicate", "module_platforms",
           "predicate_value", "reachable_on", "test_value", "true_on", "unconditional_calls"]
