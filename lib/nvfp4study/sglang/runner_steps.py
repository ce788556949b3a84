"""The steps a method path runs in its runner, and the order of its setup (``ast`` only).

:mod:`nvfp4study.sglang.dispatch` pairs each MoE method with the runner backends it runs with;
:func:`runner_steps` gives what ``MoeRunner.run`` calls for one backend (the fused function
registered for the standard dispatch, the runner core ``MoeRunner.__init__`` builds), and
:func:`add_held_runner` gives a class the runner its holder stores on it during startup
(:func:`~nvfp4study.sglang.runner_builds.held_runner`).
"""

from __future__ import annotations

import ast
from typing import Any

from .code_index import SRT, CodeIndex, step_name
from .import_gates import no_fused_func_raise

RUNNER = SRT + "layers/moe/moe_runner/runner.py"
#: The method's setup, in the order SGLang runs it: the method is built, ``FusedMoE.__init__``
#: calls ``create_weights`` then ``create_moe_runner`` (fused_moe_triton/layer.py 484/499 in
#: 0.5.19, 561/576 in 0.5.23), and the model loader calls ``process_weights_after_loading``
#: once the weights are in (model_loader/loader.py); forward then runs ``apply`` / ``apply_weights``.
#: ``create_weights`` runs so the layer's weights are known: what it registers
#: (``layer.register_parameter``) is all a closed one gives the layer (:mod:`~nvfp4study.sglang.layer_attrs`).
SETUP_STEPS = ("__init__", "create_weights", "create_moe_runner", "process_weights_after_loading")
#: What ``MoeRunner.run`` calls on a runner core: ``run`` after the pre-permute, or
#: ``run_from_dispatch`` for a ``DispatchMoeRunnerCore`` (runner.py, ``MoeRunner.run``).
CORE_STEPS = ("__init__", "run", "run_from_dispatch")


def runner_steps(backend: str, fused: dict, cores: dict, code: CodeIndex) -> tuple[list[str], list[str], str | None]:
    """``(steps, trail, lost)`` of the runner for ``backend``: the fused function registered for
    ``("none", backend)`` (or for the backend's own a2a, MegaMoE) and the runner core's
    :data:`CORE_STEPS`; ``lost`` says why none or several were found (None when one was)."""
    steps, trail = [], []
    # the standard dispatch ("none"); a backend registered only with its own a2a (MegaMoE) uses that
    a2a = "none" if ("none", backend) in fused else next(
        (a for a, r in sorted(fused) if r == backend and a == backend), None)
    if a2a is not None:
        regs = fused[(a2a, backend)]
        rel, fn, line = regs[0]
        steps.append(step_name((rel, fn)))
        trail.append(f"{rel[len(SRT):]}:{line} @register_fused_func({a2a!r}, {backend!r}) -> {fn}")
        if len(regs) > 1:
            return steps, trail, (f"{len(regs)} functions registered for ({a2a!r}, {backend!r}): "
                                  + ", ".join(f"{r[len(SRT):]}:{ln} {f}" for r, f, ln in regs)
                                  + " (which one wins depends on import order)")
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
        # is on; whether the method builds a MoeRunner for it at all is decided by running the
        # method (DerivedPath.no_runner): Fp8MoEMethod.create_moe_runner builds none for cutlass
        # and its apply calls cutlass_fused_experts_fp8 itself (fp8.py 2383-2396, 2512 in 0.5.19)
        line = no_fused_func_raise(code)
        return [], trail, (f"{RUNNER[len(SRT):]}{f':{line}' if line else ''}: no fused func and no runner "
                           f"core for {backend!r} (MoeRunner raises NotImplementedError for it unless LoRA is on)")
    return steps, trail, None


def add_held_runner(p: Any, held: tuple[str, str, str], n_setup: int, fused: dict, cores: dict,
                     code: CodeIndex) -> None:
    """Give ``p`` (a :class:`~nvfp4study.sglang.dispatch.DerivedPath` of a class that runs a runner
    it never builds) the runner its holder stores on it (:func:`~nvfp4study.sglang.runner_builds.held_runner`: ``(file, "Holder.method", backend)``):
    the holder's setup method runs after the class's own setup steps of the same or an earlier
    stage (SGLang builds the held object inside the holder's ``__init__``), then the class's
    entry, then that backend's runner steps. The key keeps ``/direct``: the class names no backend."""
    hrel, hqual, backend = held
    stage = SETUP_STEPS.index(hqual.split(".")[-1])
    at = sum(1 for st in p.steps[:n_setup] if SETUP_STEPS.index(st.rsplit(".", 1)[-1]) <= stage)
    p.steps.insert(at, step_name((hrel, hqual)))
    steps, trail, why = runner_steps(backend, fused, cores, code)
    p.trail.append(f"{hrel[len(SRT):]} {hqual} stores a MoeRunner({backend!r}) on it")
    if steps:
        p.runner_at = len(p.steps)
        p.steps += steps
        p.trail += trail
        p.lost = why
    else:
        p.lost = why or p.lost


__all__ = ["CORE_STEPS", "RUNNER", "SETUP_STEPS", "add_held_runner", "runner_steps"]
