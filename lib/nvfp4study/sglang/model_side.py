"""The model side of the clamp: does SGLang's BailingMoeV3 hand Ling's per-layer limits over?

Every path verdict of the audit assumes that the MoE layer was built with the layer's routed-expert
limit. This module checks that assumption from the tree's ``models/bailing_moe_v3.py`` (read with
``ast``, nothing imported) before any path is judged:

- **routed**: a MoE-layer construction (``FusedMoE(...)``, ``get_moe_impl_class(...)(...)`` or any
  call with ``num_experts=`` and ``top_k=``) passes ``gemm1_clamp_limit=`` an expression that
  comes from the config's ``expert_swiglu_limit_list`` indexed by the layer number (followed
  through ``self.x = ...`` assignments, local names and helpers of the module/class, e.g.
  ``BailingMoE._get_swiglu_limit`` in SGLang 0.5.19-0.5.23). ``gemm1_alpha=`` may be passed too;
  it is recorded.
- **shared**: the shared-expert MLP is built with ``swiglu_limit=`` from
  ``share_expert_swiglu_limit_list`` the same way, and that MLP's class reads ``swiglu_limit``.

Config key names are Ling-3.0-flash's ``config.json`` keys (``expert_swiglu_limit_list``,
``share_expert_swiglu_limit_list``; one entry per layer, 0 = no clamp), which SGLang reads by
``getattr(config, "...", None)`` (``bailing_moe_v3.py`` 469-477 in 0.5.23).
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass, field
from typing import Any

from .clamp_values import _parse
from .code_index import walk
from .source import SGLangTree

MODEL_FILE = "models/bailing_moe_v3.py"
ROUTED_KEY = "expert_swiglu_limit_list"
SHARED_KEY = "share_expert_swiglu_limit_list"
_LAYER_NAMES = ("layer_id", "layer_num", "layer_idx", "layer_number")


@dataclass
class Handover:
    """One side (routed or shared) of the hand-over. ``line`` is 1-based in :data:`MODEL_FILE`."""

    ok: bool
    reason: str
    line: int | None = None
    function: str | None = None
    keyword: str | None = None
    value: str | None = None
    extra: list[str] = field(default_factory=list)


@dataclass
class ModelSide:
    """What BailingMoeV3 hands to the MoE layers in one tree (see the module docstring)."""

    present: bool
    file: str = MODEL_FILE
    routed: Handover | None = None
    shared: Handover | None = None

    @property
    def ok(self) -> bool:
        return self.present and bool(self.routed and self.routed.ok)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def no_model_line(version: str) -> str:
    """The one line printed for a release without BailingMoeV3."""
    return f"no BailingMoeV3 in SGLang {version}: Ling-3.0-flash does not load"


class _Scope:
    """The module's functions and classes, and the enclosing class of each node."""

    def __init__(self, mod: ast.Module):
        self.mod = mod
        self.classes = {n.name: n for n in mod.body if isinstance(n, ast.ClassDef)}
        self.functions = {n.name: n for n in mod.body if isinstance(n, ast.FunctionDef)}
        self.owner: dict[ast.AST, tuple[ast.ClassDef | None, ast.FunctionDef | None]] = {}
        for n in mod.body:
            cls = n if isinstance(n, ast.ClassDef) else None
            for f in (n.body if cls else [n]):
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for x in walk(f):
                        self.owner[x] = (cls, f)

    def method(self, cls: ast.ClassDef | None, name: str) -> ast.FunctionDef | None:
        if cls is not None:
            for m in cls.body:
                if isinstance(m, ast.FunctionDef) and m.name == name:
                    return m
        return self.functions.get(name)

    def self_assigns(self, cls: ast.ClassDef | None, attr: str) -> list[ast.AST]:
        if cls is None:
            return []
        out = []
        for n in walk(cls):
            if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                if any(isinstance(t, ast.Attribute) and t.attr == attr and ast.unparse(t.value) == "self"
                       for t in targets):
                    out.append(n.value)
        return out


def _local_assigns(fn: ast.FunctionDef | None, name: str) -> list[ast.AST]:
    if fn is None:
        return []
    return [n.value for n in walk(fn) if isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]


def _trace(expr: ast.AST, scope: _Scope, cls, fn, depth: int = 0) -> tuple[set[str], bool]:
    """(config keys read, layer-number indexed) for ``expr``, following names, ``self.x``
    assignments and module/class helpers (their parameters bound to the call's arguments)."""
    keys: set[str] = set()
    layer = False
    if depth > 8:
        return keys, layer
    for n in walk(expr):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.endswith("_list"):
            keys.add(n.value)
        elif isinstance(n, ast.Attribute) and ast.unparse(n.value) == "config" and n.attr.endswith("_list"):
            keys.add(n.attr)
        elif isinstance(n, ast.Name) and n.id in _LAYER_NAMES:
            layer = True
        if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "self":
            for v in scope.self_assigns(cls, n.attr):
                k, ly = _trace(v, scope, cls, fn, depth + 1)
                keys |= k
                layer |= ly
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            for v in _local_assigns(fn, n.id):
                k, ly = _trace(v, scope, cls, fn, depth + 1)
                keys |= k
                layer |= ly
        if isinstance(n, ast.Call):
            helper = None
            if isinstance(n.func, ast.Attribute) and ast.unparse(n.func.value) in ("self", getattr(cls, "name", "")):
                helper = scope.method(cls, n.func.attr)
            elif isinstance(n.func, ast.Name):
                helper = scope.functions.get(n.func.id)
            if helper is not None and not _helper_indexes(helper):
                # a helper that never subscripts its arguments does not pick the layer's entry
                layer = layer and not any(isinstance(a, ast.Name) and a.id in _LAYER_NAMES for a in n.args)
    return keys, layer


def _helper_indexes(fn: ast.FunctionDef) -> bool:
    params = {a.arg for a in fn.args.args}
    return any(isinstance(s, ast.Subscript) and isinstance(s.value, ast.Name) and s.value.id in params
               for s in walk(fn))


def _is_moe_construction(call: ast.Call) -> bool:
    f = call.func
    if isinstance(f, ast.Call) and "get_moe_impl_class" in ast.unparse(f.func):
        return True
    if ast.unparse(f).split(".")[-1] in ("FusedMoE", "EPMoE", "DeepEPMoE", "FlashInferFusedMoE"):
        return True
    kws = {k.arg for k in call.keywords}
    return {"num_experts", "top_k"} <= kws


def _kw(call: ast.Call, name: str) -> ast.keyword | None:
    return next((k for k in call.keywords if k.arg == name), None)


def _qual(scope: _Scope, node: ast.AST) -> str | None:
    cls, fn = scope.owner.get(node, (None, None))
    if fn is None:
        return None
    return f"{cls.name}.{fn.name}" if cls else fn.name


def _check_limit(call: ast.Call, kw_name: str, key: str, scope: _Scope, what: str) -> Handover:
    cls, fn = scope.owner.get(call, (None, None))
    where = {"line": call.lineno, "function": _qual(scope, call), "keyword": kw_name}
    kw = _kw(call, kw_name)
    if kw is None:
        return Handover(False, f"{what} built without {kw_name}= (the per-layer limit is not passed)", **where)
    value = ast.unparse(kw.value)
    where["line"] = kw.value.lineno
    if isinstance(kw.value, ast.Constant):
        return Handover(False, f"{what} built with {kw_name}={value} (a literal, not the per-layer limit)",
                        value=value, **where)
    keys, layer = _trace(kw.value, scope, cls, fn)
    if key not in keys:
        return Handover(False, f"{what}: {kw_name}={value} does not come from config.{key}",
                        value=value, **where)
    if not layer:
        return Handover(False, f"{what}: {kw_name}={value} reads {key} but not the layer's entry",
                        value=value, **where)
    return Handover(True, f"{what} receives {kw_name}={value} (config.{key}[layer])", value=value, **where)


def model_side(tree: SGLangTree) -> ModelSide:
    """Find where BailingMoeV3 builds its MoE layers and check both limits are handed over.

    Returns a :class:`ModelSide`; ``present`` is False when the tree has no
    ``models/bailing_moe_v3.py`` (Ling-3.0-flash does not load on that release).

    Raises:
        SyntaxError: the model file does not parse or cannot be read.
    """
    path = tree.file("sglang/srt/" + MODEL_FILE)
    if not (path.exists() or path.is_symlink()):
        return ModelSide(present=False)
    mod = _parse(path)  # SyntaxError names the file, also for one that cannot be read
    scope = _Scope(mod)
    calls = [n for n in walk(mod) if isinstance(n, ast.Call)]
    moe = sorted((c for c in calls if _is_moe_construction(c)), key=lambda c: c.lineno)
    out = ModelSide(present=True)
    if not moe:
        out.routed = Handover(False, "no MoE-layer construction (FusedMoE / get_moe_impl_class) found")
    else:
        checks = [_check_limit(c, "gemm1_clamp_limit", ROUTED_KEY, scope, "routed experts (MoE layer)")
                  for c in moe]
        out.routed = next((h for h in checks if h.ok), checks[0])
        chosen = moe[checks.index(out.routed)]
        alpha = _kw(chosen, "gemm1_alpha")
        if alpha is not None:
            out.routed.extra.append(f"gemm1_alpha={ast.unparse(alpha.value)} also passed")
    shared_calls = [c for c in calls if _kw(c, "swiglu_limit") is not None
                    or "shared_expert" in ast.unparse(c.func) or (
                        isinstance(c.func, ast.Name) and c.func.id.endswith("MLP")
                        and "shared_experts" in ast.unparse(c))]
    shared_calls.sort(key=lambda c: c.lineno)
    if not shared_calls:
        out.shared = Handover(False, "no shared-expert MLP construction found")
    else:
        checks = [_check_limit(c, "swiglu_limit", SHARED_KEY, scope, "shared experts (MLP)")
                  for c in shared_calls]
        out.shared = next((h for h in checks if h.ok), checks[0])
        chosen = shared_calls[checks.index(out.shared)]
        cls = scope.classes.get(ast.unparse(chosen.func))
        if out.shared.ok and cls is not None:
            if not any(isinstance(n, ast.Attribute) and n.attr == "swiglu_limit" and isinstance(n.ctx, ast.Load)
                       for n in walk(cls)):
                out.shared = Handover(False, f"{cls.name} takes swiglu_limit but never reads it",
                                      line=cls.lineno, function=cls.name, keyword="swiglu_limit")
    return out


def dropped_reason(side: ModelSide) -> tuple[str, int | None, str | None]:
    """``(rule, line, function)`` for every path when the routed limit is not handed over."""
    r = side.routed
    return (f"BailingMoeV3 does not hand the limit to the MoE layer: {r.reason}", r.line, r.function)
