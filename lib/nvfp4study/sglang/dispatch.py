"""The MoE paths of an SGLang tree, found by following its dispatch code (read with ``ast``).

The clamp audit (:mod:`nvfp4study.sglang.audit`) needs, for every way a routed-expert MoE layer
can run, the functions the clamp limit travels through. This module derives them from the code a
server runs, not from a list of names:

1. **Quantization methods.** ``layers/quantization/__init__.py`` maps each ``--quantization``
   name to a config class (``BASE_QUANTIZATION_METHODS``); the MoE methods are the classes those
   configs construct (in ``get_quant_method`` and the helpers it calls, such as compressed-tensors'
   ``get_moe_scheme``), plus what ``FusedMoE.__init__`` builds without a config (the unquantized
   method). A class is an MoE method when it has ``create_moe_runner`` or an ``apply`` /
   ``apply_weights`` taking ``dispatch_output``; a wrapper that only forwards to another method
   (``self.scheme.apply_weights(...)``) is skipped, since what it wraps is found itself.
2. **Runner backends.** The backends a method builds ``MoeRunner(MoeRunnerBackend.X, ...)`` with
   (directly or through a local), or, when it passes the configured backend through, those whose
   predicates (``is_flashinfer_trtllm()`` ...) it tests. The predicates' meaning is read from
   ``_MoeRunnerBackendPredicates`` in ``layers/moe/utils.py``; for one backend they become the
   path's facts (``is_x() -> True/False``), so a method's branches follow the backend.
3. **Runner.** ``MoeRunner.run`` calls the fused function registered for ``(a2a backend, runner
   backend)`` (``@register_fused_func``, ``layers/moe/moe_runner/base.py``), or else the runner core
   ``MoeRunner.__init__`` builds for that backend. The standard (``"none"``) dispatch is assumed.
4. **Runner-level paths.** Every registered fused function and runner core is also a path of its
   own, so kernels reached only from another dispatch (DeepEP, MegaMoE) are audited too.

Where the trail is lost (a backend computed at run time with no predicate tested, no fused function
and no core for a backend) the path carries ``lost`` with the file and line, and the audit says
UNDECIDED there, never ABSENT.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from .code_index import SRT, Code, called_name, funcs, local_imports, step_name

QUANT_REGISTRY = SRT + "layers/quantization/__init__.py"
BACKEND_ENUM = SRT + "layers/moe/utils.py"
RUNNER = SRT + "layers/moe/moe_runner/runner.py"
FUSED_MOE_LAYER = SRT + "layers/moe/fused_moe_triton/layer.py"
#: The method's setup, in the order SGLang runs it: the method is built, ``FusedMoE.__init__``
#: calls ``create_weights`` then ``create_moe_runner`` (fused_moe_triton/layer.py 484/499 in
#: 0.5.19, 561/576 in 0.5.23), and the model loader calls ``process_weights_after_loading``
#: once the weights are in (model_loader/loader.py); forward then runs ``apply`` / ``apply_weights``.
SETUP_STEPS = ("__init__", "create_moe_runner", "process_weights_after_loading")
APPLY_NAMES = ("apply", "apply_weights")
#: What ``MoeRunner.run`` calls on a runner core: ``run`` after the pre-permute, or
#: ``run_from_dispatch`` for a ``DispatchMoeRunnerCore`` (runner.py, ``MoeRunner.run``).
CORE_STEPS = ("__init__", "run", "run_from_dispatch")


@dataclass
class DerivedPath:
    """One way an MoE layer runs, as found in the tree.

    Attributes:
        key: ``"Class/backend"`` (a method with a runner backend), ``"Class/direct"`` (a method that
            calls kernels itself), ``"Class/native"`` (a CustomOp method off CUDA),
            ``"fused:a2a/runner"`` or ``"core:backend"``.
        steps: ``"file::qualname"`` (file relative to ``sglang/srt``), in the order they run.
        assume: the facts this path implies (backend predicates), for the interpreter.
        trail: how it was reached, each ``"file:line what"``.
        lost: where the derivation stopped, or None.
        runner_at: the index of the first runner step (what ``MoeRunner.run`` calls), for a method
            path; those steps run only if the method's entry reaches a ``runner.run(...)`` call.
    """

    key: str
    steps: list[str]
    assume: dict = field(default_factory=dict)
    trail: list[str] = field(default_factory=list)
    lost: str | None = None
    cls_file: str | None = None
    runner_at: int | None = None  # steps[runner_at:] run only when the method calls its runner


# --- the runner backends ------------------------------------------------------------------------
def backend_values(code: Code) -> dict[str, str]:
    """``{"FLASHINFER_CUTLASS": "flashinfer_cutlass", ...}``: the ``MoeRunnerBackend`` enum."""
    node = code.top(BACKEND_ENUM, "MoeRunnerBackend")
    out = {}
    if isinstance(node, ast.ClassDef):
        for st in node.body:
            if isinstance(st, ast.Assign) and isinstance(st.value, ast.Constant) \
                    and isinstance(st.targets[0], ast.Name):
                out[st.targets[0].id] = st.value.value
    return out


def predicates(code: Code) -> dict[str, set[str]]:
    """``{"is_flashinfer_trtllm": {"flashinfer_trtllm", "experimental_sgl_trtllm"}, ...}``: for each
    predicate of ``MoeRunnerBackend``, the backend values it is true for (the members it names)."""
    values = backend_values(code)
    out: dict[str, set[str]] = {}
    for cname in ("_MoeRunnerBackendPredicates", "MoeRunnerBackend"):
        node = code.top(BACKEND_ENUM, cname)
        if not isinstance(node, ast.ClassDef):
            continue
        for fn in funcs(node):
            if not fn.name.startswith("is_"):
                continue
            names = {a.attr for a in ast.walk(fn) if isinstance(a, ast.Attribute)
                     and isinstance(a.value, ast.Name) and a.value.id == "MoeRunnerBackend"}
            out.setdefault(fn.name, set()).update(values[n] for n in names if n in values)
    return out


def facts_for(backend: str | None, preds: dict[str, set[str]]) -> dict[str, bool]:
    """The predicate facts one backend implies (``{}`` for a path without a runner)."""
    if backend is None:
        return {}
    return {p: backend in vals for p, vals in preds.items()}


def fused_registry(code: Code) -> dict[tuple[str, str], tuple[str, str, int]]:
    """``{(a2a, runner): (file, function, line)}`` for every ``@register_fused_func`` in the tree."""
    out = {}
    for path in sorted((code.root / SRT).rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if "register_fused_func(" not in text:
            continue
        rel = path.relative_to(code.root).as_posix()
        mod = code.mod(rel)
        for n in mod.body if mod else []:
            if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for d in n.decorator_list:
                if isinstance(d, ast.Call) and ast.unparse(d.func).endswith("register_fused_func") \
                        and len(d.args) == 2 and all(isinstance(a, ast.Constant) for a in d.args):
                    out.setdefault((d.args[0].value, d.args[1].value), (rel, n.name, d.lineno))
    return out


def runner_cores(code: Code) -> dict[str, tuple[str, str, int]]:
    """``{backend value: (file, CoreClass, line)}`` from the ``runner_backend.is_x()`` chain of
    ``MoeRunner.__init__`` (``layers/moe/moe_runner/runner.py``)."""
    cls = code.top(RUNNER, "MoeRunner")
    if not isinstance(cls, ast.ClassDef):
        return {}
    init = next((f for f in funcs(cls) if f.name == "__init__"), None)
    if init is None:
        return {}
    preds, local = predicates(code), local_imports(init, RUNNER)
    out: dict[str, tuple[str, str, int]] = {}
    for node in ast.walk(init):
        if not isinstance(node, ast.If):
            continue
        tested = [c.func.attr for c in ast.walk(node.test) if isinstance(c, ast.Call)
                  and isinstance(c.func, ast.Attribute) and c.func.attr in preds]
        for st in node.body:
            for call in ast.walk(st):
                if isinstance(call, ast.Call) and (name := called_name(call)) and name.endswith("RunnerCore"):
                    hit = code.resolve(RUNNER, name, local)
                    if hit:
                        for p in tested:
                            for v in preds[p]:
                                out.setdefault(v, (hit[0], name, call.lineno))
    return out


# --- the quantization methods -------------------------------------------------------------------
def quant_configs(code: Code) -> list[tuple[str, str, str, int]]:
    """``[(quantization name, file, ConfigClass, line)]`` from ``BASE_QUANTIZATION_METHODS``."""
    mod = code.mod(QUANT_REGISTRY)
    out = []
    for st in mod.body if mod else []:
        target = st.target if isinstance(st, ast.AnnAssign) else st.targets[0] if isinstance(st, ast.Assign) else None
        if not (isinstance(target, ast.Name) and "QUANTIZATION_METHODS" in target.id
                and isinstance(st.value, ast.Dict)):
            continue
        for k, v in zip(st.value.keys, st.value.values, strict=False):
            if isinstance(k, ast.Constant) and isinstance(v, ast.Name):
                hit = code.resolve(QUANT_REGISTRY, v.id)
                if hit and isinstance(hit[1], ast.ClassDef):
                    out.append((k.value, hit[0], v.id, v.lineno))
    return out


def _is_moe_method(code: Code, rel: str, cls: ast.ClassDef) -> bool:
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


def _is_wrapper(code: Code, rel: str, cls: ast.ClassDef) -> bool:
    """True when ``apply`` only forwards to a method object it holds (``self.scheme.apply...``)."""
    for name in APPLY_NAMES:
        m = code.method(rel, cls, name)
        if not m:
            continue
        owner = code.top(m[0], m[1].split(".")[0])
        fn = next(x for x in funcs(owner) if x.name == name)
        held = {st.targets[0].id for st in ast.walk(fn) if isinstance(st, ast.Assign)
                and isinstance(st.targets[0], ast.Name) and isinstance(st.value, ast.Attribute)}
        for c in ast.walk(fn):
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


def moe_methods(code: Code) -> dict[str, tuple[str, ast.ClassDef, str]]:
    """``{Class: (file, ClassDef, how it was reached)}``: every MoE method the dispatch constructs.

    Follows the classes constructed in each quantization config's methods and in the functions
    and class methods they call (up to three calls deep), and in ``FusedMoE.__init__``.
    """
    seen_fn: set[tuple[str, str]] = set()
    found: dict[str, tuple[str, ast.ClassDef, str]] = {}
    todo: list[tuple[str, ast.AST, str, ast.ClassDef | None, int]] = []
    for qname, rel, cname, line in quant_configs(code):
        cls = code.top(rel, cname)
        for fn in funcs(cls):
            todo.append((rel, fn, f"{QUANT_REGISTRY[len(SRT):]}:{line} {qname!r} -> {cname}.{fn.name}", cls, 0))
    layer = code.top(FUSED_MOE_LAYER, "FusedMoE")
    if isinstance(layer, ast.ClassDef):
        for fn in funcs(layer):
            if fn.name == "__init__":
                todo.append((FUSED_MOE_LAYER, fn, f"{FUSED_MOE_LAYER[len(SRT):]} FusedMoE.__init__", layer, 0))
    while todo:
        rel, fn, how, owner, depth = todo.pop(0)
        key = (rel, f"{owner.name if owner else ''}.{fn.name}")
        if key in seen_fn:
            continue
        seen_fn.add(key)
        local = local_imports(fn, rel)
        for c in ast.walk(fn):
            if not isinstance(c, ast.Call):
                continue
            f = c.func
            if isinstance(f, ast.Name):
                hit = code.resolve(rel, f.id, local)
                if hit is None:
                    continue
                hrel, node = hit
                if isinstance(node, ast.ClassDef):
                    if node.name not in found and _is_moe_method(code, hrel, node) \
                            and not _is_wrapper(code, hrel, node):
                        found[node.name] = (hrel, node, f"{how} -> {hrel[len(SRT):]}:{c.lineno} {node.name}")
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


def method_backends(code: Code, rel: str, cls: ast.ClassDef) -> tuple[list[str | None], str | None]:
    """The runner backends ``cls`` can run with, and where the trail was lost (or None).

    ``[None]`` when the class builds no ``MoeRunner`` (it calls its kernels itself).
    """
    values, preds = backend_values(code), predicates(code)
    bodies = []
    for name in {f.name for f in funcs(cls)} | set(SETUP_STEPS) | set(APPLY_NAMES):
        m = code.method(rel, cls, name)
        if m:
            owner = code.top(m[0], m[1].split(".")[0])
            bodies += [(m[0], f) for f in funcs(owner) if f.name == name]
    out: list[str] = []
    lost = None
    runtime = False
    for frel, fn in bodies:
        assigned: dict[str, set[str]] = {}
        computed: set[str] = set()  # locals also assigned from something else (the configured backend)
        for st in ast.walk(fn):
            if isinstance(st, ast.Assign) and isinstance(st.targets[0], ast.Name):
                members = _members(st.value, values)
                if members:
                    assigned.setdefault(st.targets[0].id, set()).update(members)
                else:
                    computed.add(st.targets[0].id)
        for c in ast.walk(fn):
            if not (isinstance(c, ast.Call) and called_name(c) == "MoeRunner" and c.args):
                continue
            arg = c.args[0]
            members = _members(arg, values) or (assigned.get(arg.id) if isinstance(arg, ast.Name) else None)
            if members:
                out += sorted(members)
            if not members or (isinstance(arg, ast.Name) and arg.id in computed):
                runtime = True
                lost = f"{frel[len(SRT):]}:{c.lineno} MoeRunner({ast.unparse(arg)}) (backend chosen at run time)"
    if runtime:
        tested = {c.func.attr for _, fn in bodies for c in ast.walk(fn) if isinstance(c, ast.Call)
                  and isinstance(c.func, ast.Attribute) and c.func.attr in preds}
        extra = sorted({v for p in tested for v in preds[p]} - {"auto"})
        out += extra
        if out:  # the backends it can end up with are known: the ones it names or tests
            lost = None
    if not out and not runtime:
        return [None], None
    return sorted(set(out), key=out.index), lost


def _members(node: ast.AST, values: dict[str, str]) -> set[str]:
    return {values[a.attr] for a in ast.walk(node) if isinstance(a, ast.Attribute)
            and isinstance(a.value, ast.Name) and a.value.id == "MoeRunnerBackend" and a.attr in values}


# --- the paths ----------------------------------------------------------------------------------
def _runner_steps(backend: str, fused: dict, cores: dict, code: Code) -> tuple[list[str], list[str], str | None]:
    steps, trail = [], []
    # the standard dispatch ("none"); a backend registered only with its own a2a (MegaMoE) uses that
    a2a = "none" if ("none", backend) in fused else next(
        (a for a, r in sorted(fused) if r == backend and a == backend), None)
    if a2a is not None:
        rel, fn, line = fused[(a2a, backend)]
        steps.append(step_name((rel, fn)))
        trail.append(f"{rel[len(SRT):]}:{line} @register_fused_func({a2a!r}, {backend!r}) -> {fn}")
    if backend in cores:
        rel, core, line = cores[backend]
        cls = code.top(rel, core)
        for name in CORE_STEPS:
            m = code.method(rel, cls, name) if isinstance(cls, ast.ClassDef) else None
            if m:
                steps.append(step_name(m))
        trail.append(f"{RUNNER[len(SRT):]}:{line} MoeRunner.__init__ -> {core}")
    if not steps:
        # MoeRunner.__init__ raises NotImplementedError then ("requires a fused func"), unless LoRA
        # is on; whether the method builds a MoeRunner for it at all is not decided here
        return [], trail, (f"{RUNNER[len(SRT):]}: no fused func and no runner core for {backend!r} "
                           "(MoeRunner raises NotImplementedError for it unless LoRA is on)")
    return steps, trail, None


def derive_paths(root: Path) -> list[DerivedPath]:
    """Every MoE path of the tree at ``root`` (see the module docstring), in a stable order.

    Cached per state of the tree's files (path, size, mtime), so a tree patched in place between
    two calls is derived again.
    """
    root = Path(root).resolve()
    stamp = tuple((p.as_posix(), st.st_size, st.st_mtime_ns) for p in sorted((root / SRT).rglob("*.py"))
                  if (st := p.stat()))
    return [DerivedPath(p.key, list(p.steps), dict(p.assume), list(p.trail), p.lost, p.cls_file, p.runner_at)
            for p in _derive(root, hash(stamp))]


@cache
def _derive(root: Path, _stamp: int) -> tuple[DerivedPath, ...]:
    code = Code(root)
    preds, fused, cores = predicates(code), fused_registry(code), runner_cores(code)
    out: list[DerivedPath] = []
    for name, (rel, cls, how) in sorted(moe_methods(code).items()):
        setup = [step_name(m) for s in SETUP_STEPS if (m := code.method(rel, cls, s))]
        # a CustomOp method's apply calls self.forward, which runs forward_cuda on CUDA
        # (MultiPlatformOp.forward, layers/utils/multi_platform.py)
        entries = [step_name(m) for s in ("forward_cuda", *APPLY_NAMES) if (m := code.method(rel, cls, s))][:1]
        backends, lost = method_backends(code, rel, cls)
        if not entries:
            lost = f"{rel[len(SRT):]}:{cls.lineno} {name} has no forward_cuda / apply / apply_weights"
        # forward_cpu first: a method aliases forward_native to it (unquant.py, end of the class)
        native = code.method(rel, cls, "forward_cpu") or code.method(rel, cls, "forward_native")
        if native and entries and entries[0].endswith(".forward_cuda"):
            out.append(DerivedPath(key=f"{name}/native", steps=setup + [step_name(native)],
                                   trail=[how, f"{native[0][len(SRT):]} {native[1]} (CustomOp off CUDA)"],
                                   cls_file=rel))
        for b in backends:
            p = DerivedPath(key=f"{name}/{b or 'direct'}", steps=setup + entries, assume=facts_for(b, preds),
                            trail=[how], lost=lost, cls_file=rel)
            if b is not None:
                steps, trail, why = _runner_steps(b, fused, cores, code)
                p.runner_at = len(p.steps) if steps else None
                p.steps += steps
                p.trail += trail
                p.lost = p.lost or why
            out.append(p)
    for (a2a, runner), (rel, fn, line) in sorted(fused.items()):
        out.append(DerivedPath(key=f"fused:{a2a}/{runner}", steps=[step_name((rel, fn))], assume=facts_for(runner, preds),
                               trail=[f"{rel[len(SRT):]}:{line} @register_fused_func({a2a!r}, {runner!r})"]))
    for backend, (rel, core, line) in sorted(cores.items()):
        cls = code.top(rel, core)
        steps = [step_name(m) for s in CORE_STEPS if (m := code.method(rel, cls, s))]
        out.append(DerivedPath(key=f"core:{backend}", steps=steps, assume=facts_for(backend, preds),
                               trail=[f"{RUNNER[len(SRT):]}:{line} MoeRunner.__init__ -> {core}"]))
    return tuple(out)


__all__ = ["DerivedPath", "backend_values", "derive_paths", "facts_for", "fused_registry",
           "method_backends", "moe_methods", "predicates", "quant_configs", "runner_cores"]
