"""The MoE paths of an SGLang tree, found by following its dispatch code (read with ``ast``).

The clamp audit (:mod:`nvfp4study.sglang.audit`) needs, for every way a routed-expert MoE layer
can run, the functions the clamp limit travels through. This module derives them from the code a
server runs, not from a list of names:

1. **Quantization methods** (:mod:`nvfp4study.sglang.quant_methods`): the classes the configs of
   the ``--quantization`` registry construct, plus what ``FusedMoE.__init__`` builds without a
   config (the unquantized method). A wrapper that forwards ``apply`` to a method object it holds
   is not a path itself; what it holds is.
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
and no core for a backend, two functions registered for one key, a registry entry or a file that
cannot be read) the path carries ``lost`` with the file and line, and the audit says UNDECIDED
there, never ABSENT. Every file is read as bytes and parsed, never imported or run.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from . import path_keys
from .clamp_values import _imports, unparse
from .code_index import (
    SRT,
    CodeIndex,
    called_name,
    funcs,
    local_imports,
    module_level,
    module_name,
    source_files,
    step_name,
    tree_stamp,
    walk,
)
from .import_gates import gated_registrations, no_fused_func_raise
from .platforms import PLATFORMS, module_platforms, reachable_on
from .quant_methods import APPLY_NAMES, QUANT_REGISTRY, moe_methods, quant_configs
from .runner_builds import (
    core_flag,
    core_never_built,
    held_runner,
    native_never_runs,
    runner_switch,
    runs_on,
)
from .runner_steps import CORE_STEPS, RUNNER, SETUP_STEPS, add_held_runner, runner_steps

BACKEND_ENUM = SRT + "layers/moe/utils.py"


@dataclass
class DerivedPath:
    """One way an MoE layer runs, as found in the tree.

    Attributes:
        key: ``"Class/backend"`` (a method with a runner backend), ``"Class/direct"`` (a method that
            calls kernels itself, or runs the runner its holder stores on it: :func:`~nvfp4study.sglang.runner_steps.add_held_runner`), ``"Class/native"`` (a CustomOp method off CUDA),
            ``"fused:a2a/runner"`` or ``"core:backend"``.
        steps: ``"file::qualname"`` (file relative to ``sglang/srt``), in the order they run.
        assume: the facts this path implies (backend predicates), for the interpreter.
        trail: how it was reached, each ``"file:line what"``.
        lost: where the derivation stopped, or None.
        runner_at: the index of the first runner step (what ``MoeRunner.run`` calls), for a method
            path; those steps run only if the method's entry reaches a ``runner.run(...)`` call.
        platforms: the device classes the path can run on (:data:`~nvfp4study.sglang.platforms.PLATFORMS`),
            from the guards around where its method and its ``MoeRunner`` are built and from the
            modules of its steps that exist for one platform only (:func:`path_platforms`).
    """

    key: str
    steps: list[str]
    assume: dict = field(default_factory=dict)
    trail: list[str] = field(default_factory=list)
    lost: str | None = None
    runner_at: int | None = None  # steps[runner_at:] run only when the method calls its runner
    platforms: tuple[str, ...] = PLATFORMS
    absent: str | None = None  # why the code exists but never runs (a runner core never built)
    gated: str | None = None  # MoeRunner raises by default: its fused func is registered only under an env flag
    no_runner: str | None = None  # the backend has no fused func and no runner core (MoeRunner would raise)
    #: ``{MoeRunnerBackend member: runner steps}`` for each other backend the method's create_moe_runner
    #: names (``MoeRunner(MoeRunnerBackend.AITER if use_aiter_runner else MoeRunnerBackend.TRITON, ...)``):
    #: the steps run instead where the run decides the method builds that one (audit_run.run_path)
    runner_alts: dict = field(default_factory=dict)


# --- the runner backends ------------------------------------------------------------------------
def _enum(code: CodeIndex) -> tuple[str, ast.ClassDef] | None:
    """``MoeRunnerBackend``'s file and class (``layers/moe/utils.py``, or wherever it re-exports from)."""
    hit = code.resolve(BACKEND_ENUM, "MoeRunnerBackend")
    return hit if hit and isinstance(hit[1], ast.ClassDef) else None


def backend_values(code: CodeIndex) -> dict[str, str]:
    """``{"FLASHINFER_CUTLASS": "flashinfer_cutlass", ...}``: the ``MoeRunnerBackend`` enum (read
    once per :class:`CodeIndex`: a copy)."""
    memo = code.__dict__.setdefault("_backend_values", {})
    if not memo:
        memo["values"] = _backend_values(code)
    return dict(memo["values"])


def _backend_values(code: CodeIndex) -> dict[str, str]:
    hit = _enum(code)
    out = {}
    for st in hit[1].body if hit else []:
        if isinstance(st, ast.Assign) and isinstance(st.value, ast.Constant) and isinstance(st.targets[0], ast.Name):
            out[st.targets[0].id] = st.value.value
    return out


def predicates(code: CodeIndex) -> dict[str, set[str]]:
    """``{"is_flashinfer_trtllm": {"flashinfer_trtllm", "experimental_sgl_trtllm"}, ...}``: for each
    predicate of ``MoeRunnerBackend`` (its own or its in-tree bases', ``_MoeRunnerBackendPredicates``
    in 0.5.23), the backend values it is true for (the members it names). Read once per
    :class:`CodeIndex` (a copy)."""
    memo = code.__dict__.setdefault("_predicates", {})
    if not memo:
        memo["preds"] = _predicates(code)
    return {k: set(v) for k, v in memo["preds"].items()}


def _predicates(code: CodeIndex) -> dict[str, set[str]]:
    values, hit = backend_values(code), _enum(code)
    out: dict[str, set[str]] = {}
    classes = [hit] if hit else []
    for b in hit[1].bases if hit else []:
        base = code.resolve(hit[0], b.id) if isinstance(b, ast.Name) else None
        if base and isinstance(base[1], ast.ClassDef):
            classes.append(base)
    for _, node in classes:
        for fn in funcs(node):
            if not fn.name.startswith("is_"):
                continue
            names = {a.attr for a in walk(fn) if isinstance(a, ast.Attribute)
                     and isinstance(a.value, ast.Name) and a.value.id == "MoeRunnerBackend"}
            out.setdefault(fn.name, set()).update(values[n] for n in names if n in values)
    return out


def facts_for(backend: str | None, preds: dict[str, set[str]]) -> dict[str, bool]:
    """The predicate facts one backend implies (``{}`` for a path without a runner)."""
    if backend is None:
        return {}
    return {p: backend in vals for p, vals in preds.items()}


def fused_registry(code: CodeIndex) -> dict[tuple[str, str], list[tuple[str, str, int]]]:
    """``{(a2a, runner): [(file, function, line), ...]}`` for every ``register_fused_func`` in the
    tree: as a decorator or called on a function (``register_fused_func(a, b)(fn)``), with its two
    names given as strings, keywords or module-level string constants. More than one entry for a
    key means the winner depends on import order (``FusedOpPool``, moe_runner/base.py)."""
    out: dict[tuple[str, str], list[tuple[str, str, int]]] = {}
    for path, text in source_files(code.root, code.unreadable):
        if "register_fused_func" not in text:
            continue
        rel = path.relative_to(code.root).as_posix()
        mod = code.mod(rel)
        if mod is None:
            continue
        for key, fname, line in _module_registrations(mod):
            out.setdefault(key, []).append((rel, fname, line))
    return out


def _module_registrations(mod: ast.Module) -> tuple[tuple[tuple[str, str], str, int], ...]:
    """``((key, function, line), ...)`` of one parsed module's registrations, in order. Kept on the
    parsed module (parsed once per content and never changed): a copied tree's files are not read
    again."""
    got = getattr(mod, "_fused_registrations", None)
    if got is not None:
        return got
    body = module_level(mod.body)
    consts = {t.id: st.value.value for st in body if isinstance(st, ast.Assign)
              and isinstance(st.value, ast.Constant) and isinstance(st.value.value, str)
              for t in st.targets if isinstance(t, ast.Name)}
    # other names for the registrar (_reg = register_fused_func) and decorators built ahead
    # (_triton = register_fused_func("none", "triton"))
    names = {"register_fused_func"} | {t.id for st in body if isinstance(st, ast.Assign)
                                       and unparse(st.value).split(".")[-1] == "register_fused_func"
                                       for t in st.targets if isinstance(t, ast.Name)}
    built = {t.id: st.value for st in body if isinstance(st, ast.Assign) and isinstance(st.value, ast.Call)
             and unparse(st.value.func).split(".")[-1] in names for t in st.targets if isinstance(t, ast.Name)}
    found = []
    for n in body:
        regs = []
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            regs = [(built.get(d.id, d) if isinstance(d, ast.Name) else d, n.name) for d in n.decorator_list]
        elif isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and len(n.value.args) == 1 \
                and isinstance(n.value.args[0], ast.Name):
            f = n.value.func
            regs = [(built.get(f.id, f) if isinstance(f, ast.Name) else f, n.value.args[0].id)]
        for d, fname in regs:
            key = _registration_key(d, consts, names)
            if key is not None:
                found.append((key, fname, d.lineno))
    mod._fused_registrations = got = tuple(found)  # type: ignore[attr-defined]
    return got


def _registration_key(d: ast.AST, consts: dict[str, str], names: set[str]) -> tuple[str, str] | None:
    if not (isinstance(d, ast.Call) and unparse(d.func).split(".")[-1] in names):
        return None
    vals = list(d.args) + [k.value for k in d.keywords if k.arg]
    names = [v.value if isinstance(v, ast.Constant) else consts.get(v.id) if isinstance(v, ast.Name) else None
             for v in vals]
    if len(names) != 2 or not all(isinstance(x, str) for x in names):
        return None
    return names[0], names[1]


def runner_cores(code: CodeIndex) -> dict[str, tuple[str, str, int]]:
    """``{backend value: (file, CoreClass, line)}``: what ``MoeRunner.__init__``
    (``layers/moe/moe_runner/runner.py``, or wherever ``MoeRunner`` re-exports from) assigns to
    ``self.runner_core`` under each ``runner_backend.is_x()`` test."""
    hit = code.resolve(RUNNER, "MoeRunner")
    if not (hit and isinstance(hit[1], ast.ClassDef)):
        return {}
    rel, cls = hit
    init = next((f for f in funcs(cls) if f.name == "__init__"), None)
    if init is None:
        return {}
    preds, local = predicates(code), local_imports(init, rel)
    out: dict[str, tuple[str, str, int]] = {}
    for node in walk(init):
        if not isinstance(node, ast.If):
            continue
        tested = [c.func.attr for c in walk(node.test) if isinstance(c, ast.Call)
                  and isinstance(c.func, ast.Attribute) and c.func.attr in preds]
        for st in node.body:
            for a in walk(st):
                if isinstance(a, ast.Assign) and any(unparse(t) == "self.runner_core" for t in a.targets) \
                        and isinstance(a.value, ast.Call) and (name := called_name(a.value)):
                    core = code.resolve(rel, name, local)
                    if core and isinstance(core[1], ast.ClassDef):
                        for p in tested:
                            for v in preds[p]:
                                out.setdefault(v, (core[0], core[1].name, a.value.lineno))
    return out


def method_backends(code: CodeIndex, rel: str, cls: ast.ClassDef) -> tuple[list[str | None], str | None]:
    """The runner backends ``cls`` can run with, and where the trail was lost (or None).

    ``[None]`` when the class neither builds a ``MoeRunner`` nor calls one (it calls its kernels
    itself). A class that calls ``...runner.run(...)`` while no ``MoeRunner(...)`` construction was
    recognised gives ``[None]`` with the call's place as the lost trail, never a silent "direct".
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
    runtime = built = False
    for frel, fn in bodies:
        enum = _enum_names(code, frel, fn)
        assigned: dict[str, set[str]] = {}
        computed: set[str] = set()  # locals also assigned from something else (the configured backend)
        for st in walk(fn):
            if isinstance(st, ast.Assign) and isinstance(st.targets[0], ast.Name):
                members = _members(st.value, values, enum)
                if members:
                    assigned.setdefault(st.targets[0].id, set()).update(members)
                else:
                    computed.add(st.targets[0].id)
        for c in walk(fn):
            if not (isinstance(c, ast.Call) and unparse(c.func).split(".")[-1] == "MoeRunner"):
                continue
            arg = c.args[0] if c.args else next((k.value for k in c.keywords if k.arg == "runner_backend"), None)
            if arg is None:
                continue
            built = True
            members = _members(arg, values, enum) or (assigned.get(arg.id) if isinstance(arg, ast.Name) else None)
            if members:
                out += sorted(members)
            if not members or (isinstance(arg, ast.Name) and arg.id in computed):
                runtime = True
                lost = f"{frel[len(SRT):]}:{c.lineno} MoeRunner({unparse(arg)}) (backend chosen at run time)"
    if runtime:
        tested = {c.func.attr for _, fn in bodies for c in walk(fn) if isinstance(c, ast.Call)
                  and isinstance(c.func, ast.Attribute) and c.func.attr in preds}
        extra = sorted({v for p in tested for v in preds[p]} - {"auto"})
        out += extra
        if out:  # the backends it can end up with are known: the ones it names or tests
            lost = None
    if not out and not runtime:
        calls = [(frel, c.lineno) for frel, fn in bodies for c in walk(fn) if isinstance(c, ast.Call)
                 and isinstance(c.func, ast.Attribute) and c.func.attr == "run"
                 and unparse(c.func.value).endswith("runner")]
        if calls and not built:
            frel, line = calls[0]
            return [None], (f"{frel[len(SRT):]}:{line} calls its runner, but where that MoeRunner is built "
                            "was not followed")
        return [None], None
    return sorted(set(out), key=out.index), lost


def _enum_names(code: CodeIndex, rel: str, fn: ast.AST) -> set[str]:
    """The names ``MoeRunnerBackend`` goes by in ``fn`` (its module's imports and the function's own,
    an ``as`` alias included)."""
    mod = code.mod(rel)
    imports = {**(_imports(mod.body, module_name(rel)) if mod else {}), **local_imports(fn, rel)}
    return {"MoeRunnerBackend"} | {k for k, (_, attr) in imports.items() if attr == "MoeRunnerBackend"}


def _members(node: ast.AST, values: dict[str, str], enum: set[str] = frozenset({"MoeRunnerBackend"})) -> set[str]:
    return {values[a.attr] for a in walk(node) if isinstance(a, ast.Attribute)
            and isinstance(a.value, ast.Name) and a.value.id in enum and a.attr in values}


# --- the platforms ------------------------------------------------------------------------------
def runner_sites(code: CodeIndex, rel: str, cls: ast.ClassDef, backend: str) -> list[tuple[str, ast.AST]]:
    """``[(file, node)]``: where ``cls`` builds its runner for ``backend``: the ``MoeRunner(...)``
    calls naming that member and the assignments of it to a local, else (the backend passed
    through at run time) the calls naming none."""
    named = [(r, n) for r, n, members in _runner_nodes(code, rel, cls) if backend in members]
    passed = [(r, n) for r, n, members in _runner_nodes(code, rel, cls)
              if not members and isinstance(n, ast.Call)]
    return named or passed


def _runner_nodes(code: CodeIndex, rel: str, cls: ast.ClassDef) -> list[tuple[str, ast.AST, set[str]]]:
    """``(file, node, backends named)`` for each ``MoeRunner(...)`` call of ``cls``'s methods and
    each assignment of a ``MoeRunnerBackend`` member; read once per class (``code.memo``)."""
    memo = code.__dict__.setdefault("_runner_nodes", {})
    if (rel, cls.name) in memo:
        return memo[(rel, cls.name)]
    values = memo.setdefault("<values>", backend_values(code))
    out = []
    for name in {f.name for f in funcs(cls)} | set(SETUP_STEPS):
        m = code.method(rel, cls, name)
        if not m:
            continue
        owner = code.top(m[0], m[1].split(".")[0])
        for fn in (f for f in funcs(owner) if f.name == name):
            enum = _enum_names(code, m[0], fn)
            for c in walk(fn):
                if isinstance(c, ast.Call) and unparse(c.func).split(".")[-1] == "MoeRunner" and c.args:
                    out.append((m[0], c, _members(c.args[0], values, enum)))
                elif isinstance(c, ast.Assign) and (members := _members(c.value, values, enum)):
                    out.append((m[0], c, members))  # backend = MoeRunnerBackend.X, then MoeRunner(backend)
    memo[(rel, cls.name)] = out
    return out


def path_platforms(code: CodeIndex, steps: list[str], built: list | None = None,
                   runner: tuple | None = None, runner_at: int | None = 0) -> tuple[str, ...]:
    """The device classes a path can run on: those on which some place that builds its method
    (``built``: ``[(file, call)]``) and some ``MoeRunner`` for its backend (``runner``:
    ``(file, class, backend)``) are reachable (:func:`~nvfp4study.sglang.platforms.reachable_on`),
    cut to the one platform of any step's module that exists for one platform only
    (:func:`~nvfp4study.sglang.platforms.module_platforms`; ``steps[runner_at:]`` are runner
    steps), and to where the runner's fused function can run (:func:`runs_on`: the Marlin one
    needs the CUDA-only ``moe_wna16_marlin_gemm``, so ``Fp8MoEMethod/marlin`` is judged on CUDA,
    where the hand readings of fp8.py found it). An empty result is kept as every platform (the guards contradict each other: nothing
    is cut rather than everything)."""
    out = set(PLATFORMS)
    if built:
        out &= set().union(*(reachable_on(code.mod(r), c) for r, c in built if code.mod(r) is not None))
    if runner and runner[2] is not None:
        sites = runner_sites(code, *runner)
        if sites:
            out &= set().union(*(reachable_on(code.mod(r), c) for r, c in sites))
    for i, st in enumerate(steps):
        file, qual = st.split("::", 1)
        rel = file if file.startswith("sglang/") else SRT + file
        only = module_platforms(rel, code.mod(rel), runner=runner_at is not None and i >= runner_at)
        if only:
            out &= only
        fn = code.top(rel, qual) if i == runner_at and "." not in qual else None
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out &= runs_on(code, rel, fn)  # the runner's fused func: where its kernels exist
    return tuple(p for p in PLATFORMS if p in out) or PLATFORMS


# --- the paths ----------------------------------------------------------------------------------
def derive_paths(root: Path) -> list[DerivedPath]:
    """Every MoE path of the tree at ``root`` (see the module docstring), in a stable order.

    Cached per state of the tree's files (path, size, mtime), so a tree patched in place between
    two calls is derived again.
    """
    root = Path(root).resolve()
    stamp = tree_stamp(root)
    return [DerivedPath(p.key, list(p.steps), dict(p.assume), list(p.trail), p.lost, p.runner_at, p.platforms,
                        p.absent, p.gated, p.no_runner, dict(p.runner_alts)) for p in _derive(root, hash(stamp))]


def _method_cores(code: CodeIndex, cores: dict, fused: dict, preds: dict[str, set[str]]) -> dict:
    """The runner cores a method path runs (:func:`runner_cores` less some): a method path runs with LoRA
    off (the default), so a core ``MoeRunner.__init__`` builds only under its LoRA flag is left out where a
    fused func is registered for the backend ("Marlin only supports fused path" without it, runner.py
    110-116 in 0.5.20; ``MoeRunner.run`` calls the fused func unless ``lora_enabled``, 187-188)."""
    moe_runner = code.resolve(RUNNER, "MoeRunner")
    init = next((f for f in funcs(moe_runner[1]) if f.name == "__init__"), None) if moe_runner else None
    return {b: c for b, c in cores.items()
            if init is None or ("none", b) not in fused or core_flag(init, facts_for(b, preds)) is None}


def _runner_alts(code: CodeIndex, rel: str, cls: ast.ClassDef, run: str, fused: dict, cores: dict) -> dict:
    """``{member: runner steps}`` for each ``MoeRunnerBackend.<member>`` (value other than ``run``) that
    ``cls``'s ``create_moe_runner`` names, where it builds a ``MoeRunner(...)`` (:attr:`DerivedPath.runner_alts`)."""
    where = code.method(rel, cls, "create_moe_runner")
    owner = code.top(where[0], where[1].split(".")[0]) if where else None
    meth = next((m for m in funcs(owner) if m.name == "create_moe_runner"), None) \
        if isinstance(owner, ast.ClassDef) else None
    values = backend_values(code)
    out = {}
    if meth is None or not any(isinstance(c, ast.Call) and ast.unparse(c.func).split(".")[-1] == "MoeRunner"
                               for c in walk(meth)):
        return out
    for n in walk(meth):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "MoeRunnerBackend" \
                and values.get(n.attr, run) != run and n.attr not in out:
            steps = runner_steps(values[n.attr], fused, cores, code)[0]
            if steps:
                out[n.attr] = steps
    return out


@cache
def _derive(root: Path, _stamp: int) -> tuple[DerivedPath, ...]:
    code = CodeIndex(root)
    preds, fused, cores = predicates(code), fused_registry(code), runner_cores(code)
    gated = {k[1]: f"{RUNNER[len(SRT):]}:{no_fused_func_raise(code)} MoeRunner raises for {k[1]!r} by default: {w}"
             for k, w in gated_registrations(code, fused).items() if k[0] == "none" and k[1] not in cores}
    run_cores = _method_cores(code, cores, fused, preds)
    out: list[DerivedPath] = []
    sites: dict[str, list] = {}
    holders: dict[str, tuple] = {}
    for name, (rel, cls, how) in sorted(moe_methods(code, sites, holders).items()):
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
                                   trail=[how, f"{native[0][len(SRT):]} {native[1]} (CustomOp off CUDA)"]))
            built_on = path_platforms(code, out[-1].steps, sites.get(name, []), runner_at=None)
            out[-1].absent = native_never_runs(code, rel, cls, native, built_on)
        held = held_runner(code, rel, cls, holders.get(name), backend_values(code)) \
            if backends == [None] and lost and entries else None
        for b in backends:
            p = DerivedPath(key=f"{name}/{b or 'direct'}", steps=setup + entries, assume=facts_for(b, preds),
                            trail=[how], lost=lost)
            if held is not None:  # its holder stores the runner on it: that runner's steps, key kept
                add_held_runner(p, held, len(setup), fused, run_cores, code)
            run = b
            if b is not None and (switch := runner_switch(code, rel, cls, b, facts_for(b, preds),
                                                         backend_values(code))) is not None:
                run = switch[0]  # the method runs another backend's runner: its facts and steps
                p.assume = facts_for(run, preds)
                p.trail.append(f"{switch[1][len(SRT):]}:{switch[2]} create_moe_runner runs {b!r} as {run!r}")
            if b is not None:
                p.runner_alts = _runner_alts(code, rel, cls, run, fused, run_cores)
                steps, trail, why = runner_steps(run, fused, run_cores, code)
                p.runner_at = len(p.steps) if steps else None
                p.steps += steps
                p.trail += trail
                if steps or why is None:
                    p.lost = p.lost or why
                else:  # judged on the method's own branches; lost only if it runs its runner
                    p.no_runner = why
                p.gated = gated.get(run)
            p.platforms = path_platforms(code, p.steps, sites.get(name, []), (rel, cls, b), p.runner_at)
            out.append(p)
    if code.mod(QUANT_REGISTRY) is None and QUANT_REGISTRY not in code.unreadable:
        out.append(DerivedPath(key="quantization:registry", steps=[],
                               lost=f"{QUANT_REGISTRY[len(SRT):]} is missing: no --quantization method followed"))
    for qname, rel, cname, line in quant_configs(code):
        if rel is None:
            out.append(DerivedPath(key=f"quantization:{qname}", steps=[], trail=[f"{QUANT_REGISTRY[len(SRT):]}:{line}"],
                                   lost=f"{QUANT_REGISTRY[len(SRT):]}:{line} {qname!r} names {cname}, not found in the tree"))
    for (a2a, runner), regs in sorted(fused.items()):
        rel, fn, line = regs[0]
        out.append(DerivedPath(key=path_keys.fused_key(a2a, runner), steps=[step_name((rel, fn))], assume=facts_for(runner, preds),
                               platforms=path_platforms(code, [step_name((rel, fn))]),
                               trail=[f"{r[len(SRT):]}:{ln} @register_fused_func({a2a!r}, {runner!r}) -> {f}"
                                      for r, f, ln in regs],
                               lost=None if len(regs) == 1 else f"{len(regs)} functions registered for "
                               f"({a2a!r}, {runner!r}) (which one wins depends on import order)",
                               gated=gated.get(runner) if a2a == "none" else None))
    runner = code.resolve(RUNNER, "MoeRunner")
    init = next((f for f in funcs(runner[1]) if f.name == "__init__"), None) if runner else None
    for backend, (rel, core, line) in sorted(cores.items()):
        cls = code.top(rel, core)
        steps = [step_name(m) for s in CORE_STEPS if (m := code.method(rel, cls, s))]
        out.append(DerivedPath(key=path_keys.core_key(backend), steps=steps, assume=facts_for(backend, preds),
                               platforms=path_platforms(code, steps),
                               trail=[f"{RUNNER[len(SRT):]}:{line} MoeRunner.__init__ -> {core}"],
                               absent=core_never_built(code, runner[0], init, facts_for(backend, preds))
                               if init is not None else None))
    for rel, why in sorted(code.unreadable.items()):  # files the dispatch needed and could not read
        out.append(DerivedPath(key=f"unreadable:{rel[len(SRT):] if rel.startswith(SRT) else rel}", steps=[],
                               lost=f"{why} (the paths through this file were not followed)"))
    return tuple(out)


__all__ = ["DerivedPath", "backend_values", "derive_paths", "facts_for", "fused_registry",
           "method_backends", "predicates", "runner_cores"]
