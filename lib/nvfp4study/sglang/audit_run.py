"""The run step of the SGLang audit: one path's steps run under Ling's facts, no verdict.

:func:`run_path` runs a path of :func:`nvfp4study.sglang.audit.path_specs` with the interpreter
(:class:`~nvfp4study.sglang.clamp_flow.Interp`) following one parameter
(:mod:`nvfp4study.sglang.moe_params`) and returns a :class:`PathRun`; the judges are the clamp's
(:func:`nvfp4study.sglang.audit.audit_path`) and the other parameters'
(:mod:`nvfp4study.sglang.param_audit`).
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from . import moe_params, path_keys
from .audit_sinks import ClampVerdict
from .clamp_flow import Interp
from .clamp_values import Backend, Multi
from .code_index import CodeIndex
from .platforms import PLATFORMS
from .source import SGLangTree


def _split(step: str) -> tuple[str, str]:
    """``"layers/x.py::Q"`` (relative to ``sglang/srt``) or ``"sglang/kernels/x.py::Q"`` (from
    the tree root, for code outside ``srt``) -> ``(file from the root, qualname)``."""
    rel, qual = step.split("::")
    return (rel if rel.startswith("sglang/") else "sglang/srt/" + rel), qual


def _short(rel: str) -> str:
    return rel[11:] if rel.startswith("sglang/srt/") else rel


@dataclass
class PathRun:
    """What running one path's steps gave (:func:`run_path`), before any verdict.

    ``interp``: the interpreter after the steps (hits, refusals, live mentions, raising steps);
    ``steps``: the ``(file, qualname)`` steps run; ``skipped_runner``: the method returned before its
    MoeRunner ran; ``stop``: a verdict the run itself settles (``(verdict, rule, file, function,
    line)``: the path is missing, its trail lost or its code too long) or ``"raising"`` (a step raises
    on every branch before the trail was found), else None."""

    interp: Interp | None
    steps: list[tuple[str, str]]
    skipped_runner: bool = False
    stop: tuple | str | None = None


def entry_steps(root: Path, entry: list) -> list[str]:
    """The steps a catalogue ``entry`` starts from in the tree at ``root``: ``entry`` is a list of
    steps (``"lora/x.py::Class.method"``, as :func:`_split` reads them), or a list of such lists,
    the layouts of different releases (the MoE LoRA runner: ``lora/moe/runner.py::MoeLoraRunner``
    in 0.5.23, ``lora/layers.py::FusedMoEWithLoRA`` before): the first whose first step's file
    defines the class (or function) it names at module level; when none does, the first (its run
    finds it absent: "not in this version")."""
    alts = entry if entry and isinstance(entry[0], list) else [entry]
    code = CodeIndex(root)
    for alt in alts:
        rel, qual = _split(alt[0])
        if code.top(rel, qual.split(".")[0]) is not None:
            return list(alt)
    return list(alts[0])


def run_path(tree: SGLangTree, spec: dict, param: Any = None) -> PathRun:
    """Run one path of :func:`path_specs` under Ling's facts, following ``param``
    (:class:`~nvfp4study.sglang.moe_params.ParamSpec`; None: the clamp). No verdict: see
    :func:`audit_path` (the clamp's judge) and :mod:`nvfp4study.sglang.param_audit`."""
    if "missing" in spec:
        verdict, why = spec["missing"]
        return PathRun(None, [], stop=(verdict, why, None, None, None))
    steps = [_split(s) for s in spec["steps"]]
    param = param or moe_params.param()
    interp = Interp(tree.root, param.sinks, spec.get("assume"), spec.get("platforms", PLATFORMS), param=param,
                    a2a=path_keys.a2a(spec.get("via", spec["id"])))
    if spec.get("lost"):
        return _lost_run(interp, steps, spec)
    interp.entry_names = {q.split(".")[-1] for _, q in steps}
    missing = [(r, q) for r, q in steps if interp.find(r, q) is None]
    if missing:
        r0, q0 = steps[0]
        mod = interp.module(r0)
        entry_exists = mod is not None and ("." not in q0 or q0.split(".")[0] in mod.classes)
        r, q = missing[0]
        if not entry_exists:
            return PathRun(interp, steps, stop=(ClampVerdict.ABSENT, f"not in this version: {_short(r)}::{q}",
                                                None, None, None))
        # The entry code exists: the trail is lost, not the path (a function renamed or inlined).
        have = "the file exists" if interp.module(r) is not None else "the file is missing"
        return PathRun(interp, steps, stop=(
            ClampVerdict.UNDECIDED,
            f"trail lost at {_short(r)}::{q} ({have}; the path's entry {_short(r0)}::{q0} exists)",
            _short(r) if interp.module(r) is not None else _short(r0), q, None))
    gated = spec.get("gated") if moe_params.shared().get("env_gated_fused_func") == "unusable" else None
    if gated and spec.get("runner_at") is None and path_keys.is_runner_level(spec["id"]):
        return PathRun(interp, steps, stop=_gated_stop(spec))  # the runner itself: never built by default
    skipped_runner = False
    for i, (r, q) in enumerate(steps):
        if i == spec.get("runner_at") and (alt := _built_instead(spec, interp)) is not None:
            steps[i:] = [_split(s) for s in alt]  # the runner the method built: its steps run instead
        if i == spec.get("runner_at") and not interp.runner_calls:
            # the method returns before MoeRunner.run on every branch Ling takes: its runner
            # (fused func or core) never runs on this path
            steps, skipped_runner = steps[:i], True
            break
        interp.in_runner = spec.get("runner_at") is not None and i >= spec["runner_at"]
        if interp.in_runner and q.endswith("RunnerCore.run"):
            _run_pre_permute(tree, spec, interp)  # MoeRunner.run hands the core what this returns
            if interp.raising_steps:
                steps = steps[:i]
                break
        interp.run_step(r, q)
        if interp.raising_steps:  # the later steps never run
            steps = steps[:i + 1]
            break
    if gated and interp.runner_calls:  # the method runs a MoeRunner it could not build
        return PathRun(interp, steps, skipped_runner, stop=_gated_stop(spec))
    if spec.get("no_runner") and interp.runner_calls:  # it runs a runner with nothing to call
        return _lost_run(interp, [], {**spec, "lost": spec["no_runner"]})
    if interp.exhausted:
        r0, q0 = steps[-1] if steps else (None, None)
        return PathRun(interp, steps, skipped_runner, stop=(
            ClampVerdict.UNDECIDED, f"trail lost: the code is too long to follow ({Interp.MAX_STEPS} statements run)",
            _short(r0) if r0 else None, q0, None))
    return PathRun(interp, steps, skipped_runner)


def _built_instead(spec: dict, interp: Interp) -> list[str] | None:
    """The runner steps of the backend the method's setup built its MoeRunner with, where every live
    ``MoeRunner(...)`` got one decided ``MoeRunnerBackend`` member other than the key's
    (:attr:`~nvfp4study.sglang.dispatch.DerivedPath.runner_alts`): 0.5.23 QuarkW8A8FP8MoE builds
    ``MoeRunner(MoeRunnerBackend.AITER if use_aiter_runner else MoeRunnerBackend.TRITON, ...)`` with
    ``use_aiter_runner`` false while SGLANG_USE_AITER is off (quark_w8a8_fp8_moe.py 269-278). None otherwise."""
    alts = spec.get("runner_alts") or {}
    built = {o for v in interp.runner_builds for o in (v.options if isinstance(v, Multi) else (v,))}
    if len(built) != 1 or not alts:
        return None
    (b,) = built
    return alts.get(b.name) if isinstance(b, Backend) else None


def _run_pre_permute(tree: SGLangTree, spec: dict, interp: Interp) -> None:
    """Run, as a step, the function the path's runner registers for ``(dispatch format, runner
    backend)`` with ``@register_pre_permute`` (layers/moe/moe_runner/base.py): ``MoeRunner.run`` calls
    it before ``runner_core.run`` (runner.py), handing it the method's quant info. A pre-permute that
    reads a field the handed payload's class lacks raises AttributeError (0.5.21 aiter.py 424
    ``quant_info.quant_type`` on the ``TritonMoeQuantInfo`` ``Mxfp4MoEMethod.apply`` hands, mxfp4.py
    1723-1729)."""
    runner, fmt = runner_and_format(spec)
    found = registered_permutes(tree.root, "register_pre_permute").get((fmt, runner))
    found = found and (*found, runner)
    built = [o for v in interp.runner_builds for o in (v.options if isinstance(v, Multi) else (v,))]
    if found is None or (built and all(isinstance(b, Backend) and b.name.lower().rstrip("s") != found[3].rstrip("s")
                                       for b in built)):
        return  # the method builds its MoeRunner for another backend (unquant.py 1002 in 0.5.21: TRITON)
    # read only for whether it raises: what it returns (and leaves in running_state) the core's
    # steps get as unknown, as before, so a pre-permute that returns leaves the interpreter as it was
    saved = {k: (copy.copy(v) if isinstance(v, (list, dict, set)) else v) for k, v in vars(interp).items()}
    interp.in_pre_permute = True
    interp.run_step(found[0], found[1])
    interp.in_pre_permute = False
    if not interp.raising_steps:
        vars(interp).update(saved)


def runner_and_format(spec: dict) -> tuple[str, str]:
    """``(runner backend, dispatch format)`` of a path: the key's runner, and the all-to-all backend a
    ``fused:<a2a>/<backend>`` key names (``standard`` for ``none`` and every other key), the pair the
    permute registries are keyed by (layers/moe/moe_runner/base.py)."""
    key = spec.get("via", spec["id"])
    a2a = key[len(path_keys.FUSED):].split("/")[0] if key.startswith(path_keys.FUSED) else "none"
    return path_keys.runner(key), "standard" if a2a == "none" else a2a


def registered_permutes(root: Any, decorator: str) -> dict[tuple[str, str], tuple[str, str, int]]:
    """``(first, second) -> (file, function, line)`` of every function a release's runners register
    with ``@<decorator>("<first>", "<second>")`` (``register_pre_permute(format, runner)``,
    ``register_post_permute(runner, format)``: layers/moe/moe_runner/base.py); the first wins."""
    return _permute_registries(root).get(decorator, {})


@lru_cache(maxsize=8)
def _permute_registries(root: Any) -> dict[str, dict[tuple[str, str], tuple[str, str, int]]]:
    # both registries from one read of the runners' folder; a file that does not parse registers nothing
    out: dict[str, dict[tuple[str, str], tuple[str, str, int]]] = {}
    folder = Path(root) / "sglang/srt/layers/moe/moe_runner"
    for f in sorted(folder.glob("*.py")) if folder.is_dir() else ():
        text = f.read_text(encoding="utf-8", errors="replace")
        if "_permute" not in text:
            continue
        try:
            body = ast.parse(text).body
        except (SyntaxError, ValueError, RecursionError):
            continue
        for node in body:
            for d in getattr(node, "decorator_list", []):
                name = getattr(d.func, "id", None) if isinstance(d, ast.Call) else None
                if name in ("register_pre_permute", "register_post_permute") and len(d.args) == 2 \
                        and all(isinstance(a, ast.Constant) for a in d.args):
                    out.setdefault(name, {}).setdefault(
                        (d.args[0].value, d.args[1].value),
                        (f"sglang/srt/layers/moe/moe_runner/{f.name}", node.name, node.lineno))
    return out


def _gated_stop(spec: dict) -> tuple:
    """UNUSABLE at ``MoeRunner.__init__``'s raise: the backend's fused func is registered only when
    an environment flag (off by default) is set (:mod:`nvfp4study.sglang.import_gates`)."""
    where, _, _ = spec["gated"].partition(" ")
    file, _, line = where.rpartition(":")
    return (ClampVerdict.UNUSABLE, f"raises for Ling whatever the limit: {spec['gated']}", file, "MoeRunner.__init__",
            int(line) if line.isdigit() else None)


def _lost_run(interp: Interp, steps: list[tuple[str, str]], spec: dict) -> PathRun:
    """A path whose derivation lost its trail: UNDECIDED at the loss, unless a step that exists
    raises on every branch first (``stop="raising"``: the method refuses before its runner is built)."""
    rule = f"trail lost at {spec['lost']}"
    for r, q in steps:
        if interp.find(r, q) is not None:
            interp.run_step(r, q)
            if interp.raising_steps:
                return PathRun(interp, steps, stop="raising")
    first = next((x for x in interp.refusals if x.certain), None)
    if first is not None:
        rule += f"; before it, {_short(first.file)}:{first.line} {first.function}: {first.text[:100]}"
    lost_file, _, rest = spec["lost"].partition(":")
    lost_line = rest.split(":", 1)[0]
    return PathRun(interp, steps, stop=(ClampVerdict.UNDECIDED, rule, lost_file, None,
                                        int(lost_line) if lost_line.isdigit() else None))



__all__ = ["PathRun", "run_path"]
