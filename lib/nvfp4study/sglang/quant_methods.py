"""The MoE quantization methods an SGLang tree can build, found from its ``--quantization``
registry (read with ``ast``; step 1 of :mod:`nvfp4study.sglang.dispatch`).

``layers/quantization/__init__.py`` maps each ``--quantization`` name to a config class
(``BASE_QUANTIZATION_METHODS``); the MoE methods are the classes those configs construct (in
``get_quant_method`` and the helpers it calls, such as compressed-tensors' ``get_moe_scheme``), plus
what ``FusedMoE.__init__`` builds without a config. A wrapper that forwards ``apply`` to a method
object it holds is not a path itself; what it holds is found by reading its own methods.
"""

from __future__ import annotations

import ast

from .code_index import SRT, CodeIndex, funcs, local_imports, module_level, walk

QUANT_REGISTRY = SRT + "layers/quantization/__init__.py"
FUSED_MOE_LAYER = SRT + "layers/moe/fused_moe_triton/layer.py"
APPLY_NAMES = ("apply", "apply_weights")


def quant_configs(code: CodeIndex) -> list[tuple[str, str | None, str, int]]:
    """``[(quantization name, file, ConfigClass, line)]`` from the ``*QUANTIZATION_METHODS`` tables
    of ``layers/quantization/__init__.py``, however they are filled at module level (also under
    ``if`` / ``try``): a dict literal (``**`` spreads skipped), ``|=``, ``X["name"] = Config``,
    ``.update({...})`` / ``.update(name=Config)`` / ``.update(dict(...))`` and ``.setdefault``.
    An entry whose class is not found in the tree has ``file`` None (reported as a lost trail)."""
    mod = code.mod(QUANT_REGISTRY)
    pairs: list[tuple[ast.expr, ast.expr]] = []

    def table(node: ast.AST) -> bool:
        return "QUANTIZATION_METHODS" in ast.unparse(node)

    def entries(node: ast.AST) -> list[tuple[ast.expr, ast.expr]]:
        if isinstance(node, ast.Dict):
            return [(k, v) for k, v in zip(node.keys, node.values, strict=False) if k is not None]
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "dict":
            out = [(ast.Constant(k.arg), k.value) for k in node.keywords if k.arg]
            if node.args and isinstance(node.args[0], (ast.List, ast.Tuple)):
                out += [tuple(e.elts) for e in node.args[0].elts if isinstance(e, ast.Tuple) and len(e.elts) == 2]
            return out
        return []

    for st in module_level(mod.body) if mod else []:
        if isinstance(st, (ast.Assign, ast.AnnAssign)) and st.value is not None:
            for t in (st.targets if isinstance(st, ast.Assign) else [st.target]):
                if isinstance(t, ast.Name) and table(t):
                    pairs += entries(st.value)
                elif isinstance(t, ast.Subscript) and table(t.value):
                    pairs.append((t.slice, st.value))
        elif isinstance(st, ast.AugAssign) and table(st.target):
            pairs += entries(st.value)
        elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and isinstance(st.value.func, ast.Attribute) \
                and table(st.value.func.value):
            call = st.value
            if call.func.attr == "update":
                for arg in call.args:
                    pairs += entries(arg)
                pairs += [(ast.Constant(k.arg), k.value) for k in call.keywords if k.arg]
            elif call.func.attr == "setdefault" and len(call.args) == 2:
                pairs.append((call.args[0], call.args[1]))
    out: list[tuple[str, str | None, str, int]] = []
    for k, v in pairs:
        if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
            continue
        name = v.id if isinstance(v, ast.Name) else v.attr if isinstance(v, ast.Attribute) else None
        if name is None:
            continue
        hit = code.resolve(QUANT_REGISTRY, name)
        if hit is None and isinstance(v, ast.Attribute):  # mod.Config
            hit = code.resolve_attr(QUANT_REGISTRY, v)
        if hit and isinstance(hit[1], ast.ClassDef):
            out.append((k.value, hit[0], hit[1].name, v.lineno))
        else:
            out.append((k.value, None, name, v.lineno))
    return out


def _is_moe_method(code: CodeIndex, rel: str, cls: ast.ClassDef) -> bool:
    if code.method(rel, cls, "create_moe_runner"):
        return True
    for name in APPLY_NAMES:
        m = code.method(rel, cls, name)
        if m:
            fn = code.top(m[0], m[1].split(".")[0])
            f = next(x for x in funcs(fn) if x.name == name)
            if any(a.arg == "dispatch_output" for a in f.args.args + f.args.kwonlyargs):
                return True
    return False


def _is_wrapper(code: CodeIndex, rel: str, cls: ast.ClassDef) -> bool:
    """True when ``apply`` only forwards to a method object it holds (``self.scheme.apply...``)."""
    for name in APPLY_NAMES:
        m = code.method(rel, cls, name)
        if not m:
            continue
        owner = code.top(m[0], m[1].split(".")[0])
        fn = next(x for x in funcs(owner) if x.name == name)
        held = {st.targets[0].id for st in walk(fn) if isinstance(st, ast.Assign)
                and isinstance(st.targets[0], ast.Name) and isinstance(st.value, ast.Attribute)}
        for c in walk(fn):
            if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in APPLY_NAMES \
                    and isinstance(c.func.value, ast.Name) and c.func.value.id in held:
                return True  # scheme = layer.scheme; scheme.apply_weights(...)
            # ``self.scheme.apply_weights(...)`` / ``layer.scheme.apply_weights(...)``: the
            # method object held on the method or on the layer does the work
            if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in APPLY_NAMES \
                    and isinstance(c.func.value, ast.Attribute) and isinstance(c.func.value.value, ast.Name) \
                    and c.func.value.value.id in ("self", "layer"):
                return True
    return False


def moe_methods(code: CodeIndex, sites: dict | None = None,
                holders: dict | None = None) -> dict[str, tuple[str, ast.ClassDef, str]]:
    """``{Class: (file, ClassDef, how it was reached)}``: every MoE method the dispatch constructs.

    Follows the classes constructed in each quantization config's methods and in the functions
    and class methods they call (up to three calls deep), and in ``FusedMoE.__init__``. When
    ``sites`` is given it is filled with ``{Class: [(file, call node), ...]}``: where the class is built
    (the guards around that call say on which platforms the method is chosen). When ``holders`` is
    given it is filled with ``{Class: (file, wrapper ClassDef)}`` for each class found inside a
    wrapper's methods (the scheme that holds its kernel: what the wrapper's setup stores on it,
    :func:`~nvfp4study.sglang.runner_builds.held_runner`).
    """
    seen_fn: set[tuple[str, str]] = set()
    found: dict[str, tuple[str, ast.ClassDef, str]] = {}
    todo: list[tuple[str, ast.AST, str, ast.ClassDef | None, int]] = []
    for qname, rel, cname, line in quant_configs(code):
        if rel is None:
            continue
        cls = code.top(rel, cname)
        for fn in funcs(cls):
            todo.append((rel, fn, f"{QUANT_REGISTRY[len(SRT):]}:{line} {qname!r} -> {cname}.{fn.name}", cls, 0))
    hit = code.resolve(FUSED_MOE_LAYER, "FusedMoE")
    if hit and isinstance(hit[1], ast.ClassDef):
        lrel, layer = hit
        for fn in funcs(layer):
            if fn.name == "__init__":
                todo.append((lrel, fn, f"{lrel[len(SRT):]} FusedMoE.__init__", layer, 0))
    while todo:
        rel, fn, how, owner, depth = todo.pop(0)
        key = (rel, f"{owner.name if owner else ''}.{fn.name}")
        if key in seen_fn:
            continue
        seen_fn.add(key)
        local = local_imports(fn, rel)
        for c in walk(fn):
            if not isinstance(c, ast.Call):
                continue
            f = c.func
            if isinstance(f, ast.Name):
                hit = code.resolve(rel, f.id, local)
                if hit is None:
                    continue
                hrel, node = hit
                if isinstance(node, ast.ClassDef):
                    if node.name in found and sites is not None and node.name in sites:
                        sites[node.name].append((rel, c))
                    if node.name in found or not _is_moe_method(code, hrel, node):
                        continue
                    here = f"{how} -> {hrel[len(SRT):]}:{c.lineno} {node.name}"
                    if not _is_wrapper(code, hrel, node):
                        found[node.name] = (hrel, node, here)
                        if sites is not None:
                            sites[node.name] = [(rel, c)]
                        if holders is not None and owner is not None and _is_moe_method(code, rel, owner) \
                                and _is_wrapper(code, rel, owner):
                            holders[node.name] = (rel, owner)
                    elif depth < 3:  # what a wrapper holds (self.kernel = ...) is built in its methods
                        todo += [(hrel, f, here, node, depth + 1) for f in funcs(node)]
                elif depth < 3:
                    todo.append((hrel, node, f"{how} -> {node.name}", None, depth + 1))
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and depth < 3:
                if f.value.id in ("self", "cls") and owner is not None:
                    target = next((x for x in funcs(owner) if x.name == f.attr), None)
                    if target is not None:
                        todo.append((rel, target, how, owner, depth + 1))
                    continue
                hit = code.resolve(rel, f.value.id, local)
                if hit and isinstance(hit[1], ast.ClassDef):
                    target = next((x for x in funcs(hit[1]) if x.name == f.attr), None)
                    if target is not None:
                        todo.append((hit[0], target, f"{how} -> {hit[1].name}.{f.attr}", hit[1], depth + 1))
    return found


__all__ = ["APPLY_NAMES", "FUSED_MOE_LAYER", "QUANT_REGISTRY", "moe_methods", "quant_configs"]
