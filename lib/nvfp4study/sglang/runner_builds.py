"""Which runner a method really builds for a backend, read from SGLang's source (``ast`` only).

The dispatch (:mod:`nvfp4study.sglang.dispatch`) pairs a method with each runner backend it may be
run with. Two facts of the code change what that pair runs, without changing the pair:

- :func:`runner_switch`: the method's ``create_moe_runner`` replaces the requested backend by
  another before it builds its ``MoeRunner`` (``Fp8MoEMethod`` runs ``flashinfer_cutlass`` and
  ``flashinfer_cutedsl`` on Triton: "Fp8MoEMethod has no %s path", fp8.py 2974-2984 in 0.5.23).
- :func:`core_never_built`: ``MoeRunner.__init__`` builds a backend's runner core only under a
  flag of its own (``lora_enabled``), and every ``MoeRunner(..., flag=True)`` in the tree returns
  before it for that backend (``FusedMoEWithLoRA`` returns into its own experimental dispatch for
  ``experimental_sgl_marlin``, lora/layers.py 1050-1063 in 0.5.22): the core does not exist.

And one fact that gives a class a runner it never builds itself:

- :func:`held_runner`: the wrapper that holds the class (a scheme holding its kernel) stores a
  ``MoeRunner`` on it during startup (``self.kernel.runner = MoeRunner(MoeRunnerBackend.MARLIN,
  ...)`` in ``AWQMoEScheme.create_moe_runner``, layers/quantization/awq/schemes/awq_moe.py 129-134
  in 0.5.19-0.5.23), which the class's ``apply`` then runs (``self.runner.run``, awq_kernels.py 252).

And one fact that keeps a method's ``/native`` path from running at all:

- :func:`native_never_runs`: every platform the method is built on runs another forward of the
  class (``NPUMXFP8OnlineMoEMethod``, built only under ``is_npu()``, fp8.py 410-415 in 0.5.22, runs
  its inherited ``forward_npu``, unquant.py 1298, never the ``forward_cpu`` a ``/native`` key runs).
"""

from __future__ import annotations

import ast

from . import kleene, moe_params
from .code_index import SRT, CodeIndex, funcs, local_imports, source_files, walk
from .platforms import PLATFORMS, bound_on, unconditional_calls


def _backend_test(test: ast.expr, name: str | None, facts: dict[str, bool]) -> bool | None:
    """The value of an ``if`` test made of ``name.is_x()`` calls (any name when ``name`` is None)
    joined by ``or``/``and``/``not`` (:func:`~nvfp4study.sglang.kleene.truth`) under one backend's
    predicate ``facts``; any other part is unknown (None)."""
    return kleene.truth(test, lambda n: _backend_call(n, name, facts))


def _backend_call(test: ast.AST, name: str | None, facts: dict[str, bool]) -> bool | None:
    if isinstance(test, ast.Call) and not test.args and isinstance(test.func, ast.Attribute) \
            and isinstance(test.func.value, ast.Name) and name in (None, test.func.value.id) \
            and test.func.attr in facts:
        return facts[test.func.attr]
    return None


def runner_switch(code: CodeIndex, rel: str, cls: ast.ClassDef, backend: str, facts: dict[str, bool],
                  values: dict[str, str]) -> tuple[str, str, int] | None:
    """``(backend run instead, file, line)`` when ``cls``'s ``create_moe_runner`` replaces the
    requested ``backend`` by another before building its runner: a top-level ``if`` of that
    function whose test (``name.is_x()`` calls only) holds for ``backend`` and whose body assigns
    ``name = MoeRunnerBackend.Y`` (``Fp8MoEMethod`` runs ``flashinfer_cutlass`` and
    ``flashinfer_cutedsl`` on Triton, "Fp8MoEMethod has no %s path", fp8.py 2974-2984 in 0.5.23).
    None when it builds what was asked. ``facts``: ``backend``'s predicate facts
    (:func:`~nvfp4study.sglang.dispatch.facts_for`); ``values``: the ``MoeRunnerBackend`` members
    (:func:`~nvfp4study.sglang.dispatch.backend_values`)."""
    where = code.method(rel, cls, "create_moe_runner")
    fn = code.top(where[0], where[1].split(".")[0]) if where else None
    meth = next((m for m in funcs(fn) if m.name == "create_moe_runner"), None) if isinstance(fn, ast.ClassDef) else None
    for st in meth.body if meth is not None else []:
        if not isinstance(st, ast.If):
            continue
        for a in st.body:
            if isinstance(a, ast.Assign) and len(a.targets) == 1 and isinstance(a.targets[0], ast.Name) \
                    and isinstance(a.value, ast.Attribute) and isinstance(a.value.value, ast.Name) \
                    and a.value.value.id == "MoeRunnerBackend" and a.value.attr in values \
                    and values[a.value.attr] != backend and _backend_test(st.test, a.targets[0].id, facts):
                return values[a.value.attr], where[0], a.lineno
    return None


def _is_core_assign(node: ast.AST) -> bool:
    """Whether ``node`` is ``self.runner_core = SomeCore(...)``."""
    return isinstance(node, ast.Assign) and any(ast.unparse(t) == "self.runner_core" for t in node.targets) \
        and isinstance(node.value, ast.Call)


def core_flag(init: ast.FunctionDef, facts: dict[str, bool]) -> tuple[str, int] | None:
    """``(flag, line)`` when the first branch of ``MoeRunner.__init__`` taken for the backend builds
    its core only under ``if <flag>:``, a parameter of ``__init__``; None otherwise."""
    params = {a.arg for a in init.args.args + init.args.kwonlyargs}
    taken = next((n for n in walk(init) if isinstance(n, ast.If) and _backend_test(n.test, None, facts)), None)
    if taken is None:
        return None
    cores = [a for st in taken.body for a in walk(st) if _is_core_assign(a)]
    flagged = [st for st in taken.body if isinstance(st, ast.If) and isinstance(st.test, ast.Name)
               and st.test.id in params and any(_is_core_assign(a) for b in st.body for a in walk(b))]
    if not cores or len(flagged) != 1:
        return None
    guarded = [a for b in flagged[0].body for a in walk(b) if _is_core_assign(a)]
    return (flagged[0].test.id, flagged[0].lineno) if len(guarded) == len(cores) else None


def _site_skips(fn: ast.FunctionDef, call: ast.Call, facts: dict[str, bool]) -> int | None:
    """The line of a top-level ``if`` of ``fn`` before ``call`` that returns (or raises) for the
    backend of ``facts``, so ``call`` is never reached for it; None when none does."""
    for st in fn.body:
        if st.lineno <= call.lineno <= (st.end_lineno or st.lineno):
            return None
        if isinstance(st, ast.If) and st.body and isinstance(st.body[-1], (ast.Return, ast.Raise)) \
                and _backend_test(st.test, None, facts):
            return st.lineno
    return None


def core_never_built(code: CodeIndex, runner_rel: str, init: ast.FunctionDef,
                     facts: dict[str, bool]) -> str | None:
    """Why no runner core is ever built for the backend of ``facts``, or None when one may be.

    ``MoeRunner.__init__`` (``init``, in ``runner_rel``) builds the core under a flag parameter
    (:func:`core_flag`), and every ``MoeRunner(..., flag=True)`` call in the tree sits after a
    top-level ``if`` of its function that returns for this backend (:func:`_site_skips`), or
    there is no such call, or the flag is one the card's launch never sets (``moe_params.yaml``
    ``shared.launch_off_flags``: ``lora_enabled``, whose only ``MoeRunner(lora_enabled=True)`` is built
    for the LoRA manager under ``--enable-lora``; 0.5.23 runner.py 119-125 builds MarlinLoraRunnerCore only
    then, "Marlin only supports fused path")."""
    hit = core_flag(init, facts)
    if hit is None:
        return None
    flag, line = hit
    sites, launched = [], []
    for path, text in source_files(code.root):
        if f"{flag}=True" not in text or "MoeRunner(" not in text:
            continue
        rel = path.relative_to(code.root).as_posix()
        tree = code.mod(rel)
        for fn in (n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))) if tree else ():
            for c in walk(fn):
                if isinstance(c, ast.Call) and ast.unparse(c.func).split(".")[-1] == "MoeRunner" and any(
                        k.arg == flag and isinstance(k.value, ast.Constant) and k.value.value is True
                        for k in c.keywords):
                    skip = _site_skips(fn, c, facts)
                    if skip is None:
                        launched.append(f"{rel[len(SRT):]}:{c.lineno}")
                    else:
                        sites.append(f"{rel[len(SRT):]}:{c.lineno} (returns at {skip})")
    if launched and flag not in (moe_params.shared().get("launch_off_flags") or ()):
        return None
    where = f"every MoeRunner({flag}=True) returns before it for this backend: {', '.join(sites)}" if sites \
        else f"no MoeRunner({flag}=True) is built anywhere in the tree"
    if launched:  # built for this backend only when the launch sets the flag, which the card's does not
        where = (f"MoeRunner({flag}=True) is built for it only with {flag} on ({', '.join(launched)}), which the "
                 f"card's launch never sets (moe_params.yaml shared.launch_off_flags)")
    return f"{runner_rel[len(SRT):]}:{line} MoeRunner.__init__ builds this backend's core only when {flag}; {where}"


def held_runner(code: CodeIndex, cls_rel: str, cls: ast.ClassDef, holder: tuple[str, ast.ClassDef] | None,
                values: dict[str, str]) -> tuple[str, str, int] | None:
    """Where the wrapper ``holder`` (``(file, ClassDef)``, the method object that holds ``cls``;
    None: none) builds the ``MoeRunner`` that ``cls`` runs: ``(file, "Holder.method", backend)``
    when one of the holder's setup methods (``__init__`` / ``create_moe_runner`` /
    ``process_weights_after_loading``, its own or inherited) assigns ``self.<held>.<attr> =
    MoeRunner(MoeRunnerBackend.X, ...)`` with ``<attr>`` the attribute ``cls`` calls ``.run`` on
    (``self.runner.run(...)``) and ``X`` one member of ``values`` (member -> backend value); else
    None (no holder, no such assignment, or a backend chosen at run time)."""
    if holder is None:
        return None
    called = {c.func.value.attr for f in _all_methods(code, cls_rel, cls) for c in walk(f[1])
              if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "run"
              and isinstance(c.func.value, ast.Attribute) and isinstance(c.func.value.value, ast.Name)
              and c.func.value.value.id == "self" and c.func.value.attr.endswith("runner")}
    hrel, hcls = holder
    for name in ("__init__", "create_moe_runner", "process_weights_after_loading"):
        m = code.method(hrel, hcls, name)
        owner = code.top(m[0], m[1].split(".")[0]) if m else None
        for fn in (f for f in funcs(owner) if f.name == name) if isinstance(owner, ast.ClassDef) else ():
            for st in walk(fn):
                if not (isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.value, ast.Call)):
                    continue
                t = st.targets[0]
                if not (isinstance(t, ast.Attribute) and t.attr in called and isinstance(t.value, ast.Attribute)
                        and isinstance(t.value.value, ast.Name) and t.value.value.id == "self"):
                    continue  # only self.<held>.<attr> = ...: state stored on the held object
                if ast.unparse(st.value.func).split(".")[-1] != "MoeRunner" or not st.value.args:
                    continue
                members = {values[a.attr] for a in walk(st.value.args[0]) if isinstance(a, ast.Attribute)
                           and a.attr in values and ast.unparse(a.value).endswith("MoeRunnerBackend")}
                if len(members) == 1:
                    return m[0], m[1], members.pop()
    return None


def _all_methods(code: CodeIndex, rel: str, cls: ast.ClassDef, depth: int = 4) -> list[tuple[str, ast.FunctionDef]]:
    """``(file, def)`` of each method ``cls`` defines or inherits from an in-tree base (nearest first)."""
    out, seen = [], set()
    for f in funcs(cls):
        out.append((rel, f))
        seen.add(f.name)
    for b in cls.bases if depth > 0 else ():
        bname = b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else None
        hit = code.resolve(rel, bname) if bname else None
        if hit and isinstance(hit[1], ast.ClassDef) and hit[1] is not cls:
            out += [(r, f) for r, f in _all_methods(code, hit[0], hit[1], depth - 1) if f.name not in seen]
    return out


def runs_on(code: CodeIndex, rel: str, fn: ast.FunctionDef | ast.AsyncFunctionDef, depth: int = 4) -> set[str]:
    """The platforms on which function ``fn`` of module ``rel`` can run: a name it calls on every
    way through it (:func:`~nvfp4study.sglang.platforms.unconditional_calls`) that its module binds
    only under platform tests is there only where they hold
    (:func:`~nvfp4study.sglang.platforms.bound_on`), and a callee found in the tree (its own
    import inside ``fn`` included) is followed the same way, ``depth`` calls deep. The Marlin
    runner: ``fused_experts_none_to_marlin`` (moe_runner/marlin.py:115 in 0.5.19) calls
    ``fused_marlin_moe``, which calls ``moe_wna16_marlin_gemm``, imported only under ``if
    _is_cuda:`` (fused_moe_triton/fused_marlin_moe.py 12-18): CUDA only."""
    memo = code.__dict__.setdefault("_runs_on", {})  # per CodeIndex: a fused func is shared by many paths
    key = (rel, fn.name, fn.lineno, depth)
    if key not in memo:
        memo[key] = _runs_on(code, rel, fn, depth)
    return set(memo[key])


def _runs_on(code: CodeIndex, rel: str, fn: ast.FunctionDef | ast.AsyncFunctionDef, depth: int) -> set[str]:
    """The body of :func:`runs_on`."""
    tree, out = code.mod(rel), set(PLATFORMS)
    if tree is None or depth == 0:
        return out
    local = local_imports(fn, rel)
    params = {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
    assigned = {n.id for n in walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for name in unconditional_calls(fn):
        if name in params or name in assigned:
            continue
        where = None if name in local else bound_on(tree, name)
        if where is not None:
            out &= where
        hit = code.resolve(rel, name, local)
        if hit is not None and isinstance(hit[1], (ast.FunctionDef, ast.AsyncFunctionDef)) and hit[1] is not fn:
            out &= runs_on(code, hit[0], hit[1], depth - 1)
    return out


#: the CustomOp forwards each platform runs, the first the class has (sglang/kernels/fused_op.py
#: ``_PLATFORM_METHODS`` 150-157 in 0.5.22: "hip" tries forward_hip then forward_cuda; the older
#: ``MultiPlatformOp``'s defaults hand forward_npu / forward_xpu / forward_cpu to forward_native)
_PLATFORM_FORWARDS = {"CUDA": ("forward_cuda",), "ROCm": ("forward_hip", "forward_cuda"),
                      "XPU": ("forward_xpu",), "NPU": ("forward_npu",), "CPU": ("forward_cpu",)}


def _method_def(code: CodeIndex, where: tuple[str, str]) -> ast.FunctionDef | None:
    """The definition of the method at ``where`` (``(file, "Class.name")``), None if not found."""
    owner = code.top(where[0], where[1].split(".")[0])
    return next((f for f in funcs(owner) if f.name == where[1].split(".")[-1]), None) \
        if isinstance(owner, ast.ClassDef) else None


def _delegates_to_native(code: CodeIndex, where: tuple[str, str]) -> bool:
    """Whether the method at ``where`` (``(file, "Class.name")``) only hands its call to
    ``self.forward_native`` (a CustomOp base's default platform forward)."""
    fn = _method_def(code, where)
    body = [st for st in fn.body if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))] \
        if fn is not None else []
    return len(body) == 1 and isinstance(body[0], (ast.Return, ast.Expr)) and isinstance(body[0].value, ast.Call) \
        and ast.unparse(body[0].value.func) == "self.forward_native"


def native_never_runs(code: CodeIndex, rel: str, cls: ast.ClassDef, native: tuple[str, str],
                      built_on: tuple[str, ...]) -> str | None:
    """Why ``cls``'s ``/native`` path never runs: on each platform of ``built_on`` (where its method
    is built) the CustomOp dispatch runs another forward the class (or an in-tree base) defines
    (:data:`_PLATFORM_FORWARDS`), neither ``native`` (``(file, "Class.method")``: its forward_cpu,
    else forward_native) nor a default that hands on to forward_native. None when some platform of
    ``built_on`` runs it."""
    other = []
    for p in built_on:
        where = next((w for n in _PLATFORM_FORWARDS.get(p, ()) if (w := code.method(rel, cls, n))), None)
        if where is None or where == native or _delegates_to_native(code, where):
            return None
        fn = _method_def(code, where)
        other.append(f"{p} runs {where[1]} ({where[0][len(SRT):]}:{fn.lineno if fn else '?'})")
    return (f"{cls.name} is built only on {', '.join(built_on)}, where the CustomOp runs another forward: "
            + "; ".join(other)) if other else None
