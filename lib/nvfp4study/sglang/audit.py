"""Clamp-plumbing audit of an SGLang source tree, read with Python's ``ast`` (nothing imported).

For each MoE path of the tree, found by following SGLang's dispatch
(:mod:`nvfp4study.sglang.dispatch`; the hand-read ones are named in
``data/sglang_clamp_paths.yaml``), it decides, for a model that sets ``gemm1_clamp_limit`` and
no ``gemm1_alpha`` (Ling-3.0-flash), whether the routed-expert SwiGLU clamp is

- ``EXACT``: it reaches a kernel in Ling's post-SiLU form ``min(silu(g), L) * clamp(u, -L, L)``;
- ``APPROX``: it reaches a kernel in the GPT-OSS pre-SiLU form (``min(g, L)`` before the SiLU);
- ``DROPPED``: no clamp reaches the kernel, silently;
- ``REFUSED``: the path raises when the limit is set;
- ``UNUSABLE``: the path raises for Ling whatever the limit (a step raises on every branch Ling
  can take there, with the raise's file and line), or the server does not start for Ling with the
  path's backend (a startup validation whose architecture allowlist lacks Ling's,
  :mod:`nvfp4study.sglang.startup_checks`, with the raise's and the guard's lines);

plus ``ABSENT`` (the path does not exist in this version) and ``UNDECIDED`` (the audit cannot
tell, with where it lost the trail). Every row carries file, function, line and the
rule that decided. The values are traced by :mod:`nvfp4study.sglang.clamp_flow`; the kernel form comes
from the hand-kept sink table in the same YAML file, with its sources.

The verdict of one kernel call is :mod:`nvfp4study.sglang.audit_sinks`'; the table, the
version x path figure and ``nvfp4study audit-sglang`` are :mod:`nvfp4study.sglang.audit_report`'s;
the other checks (:func:`extra_checks`) live in :mod:`nvfp4study.sglang.checks`.
"""

from __future__ import annotations

import ast
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..core.errors import AuditError, NoBailingMoeV3
from . import clamp_values as cv
from . import path_keys
from .audit_run import PathRun, _short, entry_steps, run_path
from .audit_sinks import ClampVerdict, flashinfer_check, judge_hit
from .clamp_flow import Interp
from .code_index import CodeIndex, alias_target, class_defined, forget_settable, source_files
from .ctor_checks import constructor_raised
from .dispatch import backend_values, derive_paths
from .loader_checks import loader_refused
from .model_guards import other_model_refused
from .model_side import MODEL_FILE, ModelSide, model_side, no_model_line
from .param_routing import topk_format_facts
from .platforms import PLATFORMS, describe
from .shared_fusion import fusion_noted, with_fusion
from .source import SGLangTree
from .startup_checks import startup_refused
from .tree_files import listing_once, once_per_state

#: Order used when several kernel calls of one path disagree: the path is as bad as its worst.
_SEVERITY = [ClampVerdict.DROPPED, ClampVerdict.APPROX, ClampVerdict.UNDECIDED,
             ClampVerdict.REFUSED, ClampVerdict.UNUSABLE, ClampVerdict.EXACT]


@dataclass
class PathResult:
    """One audited path. ``file`` is relative to ``sglang/srt``; ``line`` is 1-based."""

    path: str
    label: str
    verdict: ClampVerdict
    rule: str
    file: str | None
    function: str | None
    line: int | None
    sglang_version: str
    sink: str | None = None
    catalogued: bool = True
    found_by: list[str] = field(default_factory=list)
    live_mentions: list[str] = field(default_factory=list)
    dead_mentions: list[str] = field(default_factory=list)
    flashinfer_check: str | None = None
    platform: str = describe(PLATFORMS)  # the device classes the path runs on, "CUDA|ROCm"

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["verdict"] = self.verdict.value
        return d


@cache
def catalog() -> dict[str, Any]:
    """The sink table and path catalog (``data/sglang_clamp_paths.yaml``)."""
    return yaml.safe_load(resources.files(__package__).joinpath("data/sglang_clamp_paths.yaml").read_text())


# once per tree state, catalogue and fusion step (the clamp audit and each parameter's ask for them)
@once_per_state(depends=lambda: (catalog(), with_fusion), maxsize=32)
def path_specs(tree: SGLangTree) -> list[dict]:
    """The paths to audit in ``tree``: each catalogued id with the steps and facts of the derived
    path it names (:func:`nvfp4study.sglang.dispatch.derive_paths`), then every derived path the
    catalogue does not name (id = its derived key, ``catalogued`` False).

    A spec whose derived path is not in this tree carries ``missing`` (why) instead of steps.
    """
    derived = {p.key: p for p in derive_paths(tree.root)}
    unreadable = [d.lost for k, d in derived.items() if k.startswith("unreadable:")]
    out, named = [], set()
    for entry in catalog()["paths"]:
        spec = {**entry, "catalogued": True}
        if "via" in entry:
            p = derived.get(entry["via"]) or derived.get(_aliased(tree, entry["via"]))
            if p is None:
                spec["missing"] = missing_reason(tree, entry["via"], unreadable)
            else:
                named.add(p.key)
                if entry.get("assume"):  # pinned to one device: the method on every device, for callers
                    spec["unpinned_assume"] = p.assume
                spec.update(steps=p.steps, assume={**p.assume, **entry.get("assume", {})},
                            found_by=p.trail, lost=p.lost, runner_at=p.runner_at, platforms=p.platforms,
                            gated=p.gated, no_runner=p.no_runner, runner_alts=p.runner_alts)
        else:
            spec.update(steps=entry_steps(tree.root, entry["entry"]), found_by=["entered by name: the MoE dispatch does not reach it"])
        out.append(spec)
    for key, p in derived.items():
        if key not in named:
            out.append({"id": key, "label": key, "catalogued": False, "steps": p.steps, "assume": p.assume,
                        "found_by": p.trail, "lost": p.lost, "runner_at": p.runner_at, "platforms": p.platforms,
                        "gated": p.gated, "no_runner": p.no_runner, "runner_alts": p.runner_alts})
            if p.absent:  # the code is there but never runs: no path
                out[-1]["missing"] = (ClampVerdict.ABSENT, p.absent)
    return with_fusion(tree, out, catalog()["shared_fusion"])  # Ling's shared expert fused on each path?


def _aliased(tree: SGLangTree, key: str) -> str | None:
    """``key`` with its class renamed to what a module-level alias (``Old = New``) points at."""
    cls = path_keys.method(key)
    if cls is None or ":" in key:
        return None
    target = alias_target(tree.root, cls)
    return f"{target}/{path_keys.runner(key)}" if target else None


def missing_reason(tree: SGLangTree, key: str, unreadable: list[str] | None = None) -> tuple[ClampVerdict, str]:
    """Why the derived path ``key`` is not in ``tree``: ABSENT when its class, fused function or
    backend does not exist in the release; UNDECIDED (with what exists, or the files that could
    not be read, ``unreadable``) when it does or may exist but the dispatch was not seen to reach it."""
    if unreadable:
        return ClampVerdict.UNDECIDED, f"trail lost: not found, and the tree has files that cannot be read: {unreadable[0]}"
    if path_keys.is_runner_level(key):
        backend = path_keys.runner(key)
        values = backend_values(CodeIndex(tree.root))
        if not values:
            return ClampVerdict.UNDECIDED, "trail lost: no MoeRunnerBackend enum found (layers/moe/utils.py)"
        if backend not in values.values():
            return ClampVerdict.ABSENT, f"no MoeRunnerBackend {backend!r} in this release"
        # a registration or core written in a way the dispatch reader does not recognise is not absence
        needle = "register_fused_func" if key.startswith(path_keys.FUSED) else "runner_core"
        names = (f'"{backend}"', f"'{backend}'", f"is_{backend}(", f"is_{backend}s(")
        # a file naming the backend on the registering line itself first, then one naming it anywhere
        candidates = [(path, text) for path, text in source_files(tree.root)
                      if needle in text and any(n in text for n in names)]
        same_line = [(p, t) for p, t in candidates
                     if any(needle in ln and any(n in ln for n in names) for ln in t.splitlines())]
        for path, _ in same_line[:1] or candidates[:1]:
            return ClampVerdict.UNDECIDED, (f"trail lost: {path.relative_to(tree.srt).as_posix()} names "
                                            f"{backend!r} beside {needle}, in a form not followed")
        kind = "@register_fused_func" if key.startswith(path_keys.FUSED) else "runner core"
        return ClampVerdict.ABSENT, f"no {kind} for {key.split(':', 1)[1]} in this release"
    cls, backend = path_keys.method(key), path_keys.runner(key)
    if cls is None:
        return ClampVerdict.UNDECIDED, f"trail lost: {key} names no method class"
    where = class_defined(tree.root, cls)
    if where is None:
        return ClampVerdict.ABSENT, f"no class {cls} in this release"
    return ClampVerdict.UNDECIDED, (f"trail lost: {cls} exists ({where}) but the dispatch was not seen to "
                                    f"run it with backend {backend!r}")


def audit_path(tree: SGLangTree, spec: dict) -> PathResult:
    """Audit one path of :func:`path_specs` in ``tree`` for the clamp (see the module docstring
    for the verdicts): :func:`run_path`, then the clamp's judge."""
    sinks = catalog()["sinks"]
    base = {"path": spec["id"], "label": spec["label"], "sglang_version": tree.version,
            "platform": describe(spec.get("platforms", PLATFORMS)),
            "catalogued": spec.get("catalogued", True), "found_by": list(spec.get("found_by", []))}
    # the runner's branches take TopK's output format on this path (a false assert on it ends the branch)
    run = run_path(tree, {**spec, "assume": {**(spec.get("assume") or {}), **topk_format_facts(tree, spec)}})
    if run.stop == "raising":
        return _raising_verdict(base, run.interp)
    if run.stop is not None:
        verdict, rule, file, function, line = run.stop
        return PathResult(**base, verdict=verdict, rule=rule, file=file, function=function, line=line)
    if spec.get("gated"):  # judged as if the flag were set (moe_params.yaml shared.env_gated_fused_func: note)
        base["found_by"].append(f"not built by default: {spec['gated']}")
    if spec.get("no_runner"):
        base["found_by"].append(f"the method never runs a MoeRunner on Ling's branches ({spec['no_runner']})")
    if run.skipped_runner:
        base["found_by"].append("the method returns before calling its MoeRunner on Ling's branches: "
                                "the runner's steps were not run")
    return _judge_clamp(tree, spec, run, base, sinks)


def _judge_clamp(tree: SGLangTree, spec: dict, run: PathRun, base: dict, sinks: dict) -> PathResult:
    """The clamp's verdict of a path :func:`run_path` ran to its end."""
    interp, steps = run.interp, run.steps
    mentions = []
    for r, q in steps:
        mentions += [(r, ln) for ln in cv.mentions(interp.find(r, q), interp.param.mentions)]
    live = sorted({f"{_short(r)}:{ln}" for r, ln in mentions if (r, ln) in interp.live})
    dead = sorted({f"{_short(r)}:{ln}" for r, ln in mentions if (r, ln) not in interp.live})
    extra = {"live_mentions": live, "dead_mentions": dead}
    refusals = [x for x in interp.refusals if x.about_param and x.certain]
    if refusals:
        x = refusals[0]
        return PathResult(**base, verdict=ClampVerdict.REFUSED, rule=f"raises when the limit is set: {x.text}",
                          file=_short(x.file), function=x.function, line=x.line, **extra)
    if interp.raising_steps:
        return _raising_verdict(base, interp, extra)
    if "returns_clamp" in spec and (got := _returns_clamp(spec, run, base, extra)) is not None:
        return got
    only = set(spec.get("sinks", sinks))
    judged = [(judge_hit(h, sinks[h.callee], tree, interp.origin), h) for h in interp.hits
              if h.callee in only]
    # a kernel call that raises for Ling is a branch it cannot take: the others decide
    runs = [j for j in judged if j[0][0] != ClampVerdict.UNUSABLE]
    raising = sorted({h.callee for j, h in judged if j[0] == ClampVerdict.UNUSABLE})
    if runs and raising:
        judged = runs
    if judged:
        (verdict, rule, where), hit = min(judged, key=lambda j: _SEVERITY.index(j[0][0]))
        kinds = sorted({(j[0].value, h.callee) for j, h in judged})
        if len({k[0] for k in kinds}) > 1:
            rule += " | mixed: " + ", ".join(f"{c}() {v}" for v, c in kinds)
        blockers = [x for x in interp.refusals if not x.about_param and x.certain
                    and x.text.startswith("assert")]
        # an assert on every branch Ling takes fails whatever the limit (BailingMoeV3 passes no
        # routing_method_type; a TRT-LLM path asserts it): the path crashes at its first forward.
        # One on the global backend counts too: a key ``Method/<backend>`` is run with
        # ``--moe-runner-backend <backend>`` (its facts), so GPTQMarlinMoEKernel.create_moe_runner's
        # ``assert get_moe_runner_backend().is_auto()`` (gptq_kernels.py:309 in 0.5.20-0.5.23, 360
        # in 0.5.19) fails at startup for ``/marlin``; a ``/direct`` key is run with auto
        crash = blockers
        if crash:
            x = crash[0]
            return PathResult(**base, verdict=ClampVerdict.UNUSABLE,
                              rule=(f"raises for Ling whatever the limit: {x.text} fails "
                                    f"(the path alone: {verdict.value}: {rule[:140]})"),
                              file=_short(x.file), function=x.function, line=x.line, sink=hit.callee, **extra)
        if runs and raising:
            rule += f" | not taken: {', '.join(raising)}() raise for Ling"
        if dead and verdict == ClampVerdict.DROPPED:
            rule += f" | gemm1_clamp_limit mentioned only where dead for Ling: {', '.join(dead[:3])}"
        file, line, func = _short(hit.file), hit.line, hit.function
        if where is not None:
            file, line, func = _short(where[0]), where[1], _function_at(tree, where[0], where[1])
        # only a verdict that rests on the kernel's form depends on the FlashInfer release
        fcheck = flashinfer_check(tree, hit.callee, sinks[hit.callee]) if verdict in (
            ClampVerdict.EXACT, ClampVerdict.APPROX, ClampVerdict.UNDECIDED) else None
        if fcheck:
            rule += f" | check: {fcheck}"
        if verdict == ClampVerdict.UNDECIDED and path_keys.is_runner_level(spec["id"]):
            rule += " | a runner-level entry alone: the value comes from the quant info a method builds"
        return PathResult(**base, verdict=verdict, rule=rule, file=file, function=func,
                          line=line, sink=hit.callee, flashinfer_check=fcheck, **extra)
    r, q = steps[-1]
    fn = interp.find(r, q)
    if not live:
        why = "mentioned only in branches dead for Ling" if dead else "never reads gemm1_clamp_limit"
        return PathResult(**base, verdict=ClampVerdict.DROPPED, rule=f"no kernel receives it: {why}",
                          file=_short(r), function=q, line=fn.lineno, **extra)
    live_opaque = interp.opaque
    if live_opaque:
        name, orel, oline = live_opaque[0]
        return PathResult(**base, verdict=ClampVerdict.UNDECIDED,
                          rule=f"limit passed to {name}() at {_short(orel)}:{oline}, a kernel whose form the sink "
                               "table does not hold", file=_short(orel), function=_function_at(tree, orel, oline),
                          line=oline, **extra)
    return PathResult(**base, verdict=ClampVerdict.UNDECIDED, rule="limit read but no known sink reached",
                      file=_short(r), function=q, line=fn.lineno, **extra)



def _returns_clamp(spec: dict, run: PathRun, base: dict, extra: dict) -> PathResult | None:
    """A path whose last step returns the clamp in a dict (``returns_clamp``: the key): DROPPED
    when every return holds None there, EXACT / APPROX (the spec's ``form``) when every one holds the
    limit; None when neither."""
    interp = run.interp
    r, q = run.steps[-1]
    fn = interp.find(r, q)
    frame = cv.Frame(interp.module(r), None, q)
    interp._bind(fn, frame, [], {}, method_call=False)
    interp.exec_body(fn.body, frame)
    key = spec["returns_clamp"]
    vals = [v.items.get(key) for v in frame.returns if isinstance(v, cv.AbstractDict)]
    if vals and all(v is None for v in vals):
        return PathResult(**base, verdict=ClampVerdict.DROPPED,
                          rule=f"returns {key}=None for Ling (reads swiglu_limit, not gemm1_clamp_limit)",
                          file=_short(r), function=q, line=fn.lineno, **extra)
    if vals and all(cv.has_tracked(v) for v in vals):
        v = ClampVerdict.EXACT if spec.get("form") == "post" else ClampVerdict.APPROX
        return PathResult(**base, verdict=v, rule=f"returns {key}=limit ({spec.get('form')} form)",
                          file=_short(r), function=q, line=fn.lineno, **extra)
    return None


def _raising_verdict(base: dict, interp: Interp, extra: dict | None = None) -> PathResult:
    """The verdict of a path one of whose steps raises on every branch Ling can take: REFUSED when one of those
    raises is about the clamp limit (its test or message names it), else UNUSABLE (the path cannot run for Ling
    whatever the limit), at the first raise reached naming a stated fact (``.num_fused_shared_experts``), else the first."""
    rel, qual, raises = interp.raising_steps[0]
    about = [x for x in raises if x.about_param or any(w in x.text for w in interp.param.refusal_words)]
    stated = [x for x in raises if any(k.isidentifier() and f".{k}" in x.text for k in interp.assume)]
    x = (about or stated or raises or [None])[0]
    if x is None:  # a helper raised where no raise statement was recorded: keep the step's place
        return PathResult(**base, verdict=ClampVerdict.UNUSABLE, rule=f"{_short(rel)}::{qual} raises on every branch",
                          file=_short(rel), function=qual, line=None, **(extra or {}))
    if about:
        return PathResult(**base, verdict=ClampVerdict.REFUSED, rule=f"raises when the limit is set: {x.text}",
                          file=_short(x.file), function=x.function, line=x.line, **(extra or {}))
    return PathResult(**base, verdict=ClampVerdict.UNUSABLE,
                      rule=f"raises for Ling whatever the limit, on every branch of {qual}: {x.text}",
                      file=_short(x.file), function=x.function, line=x.line, **(extra or {}))


def _function_at(tree: SGLangTree, rel: str, line: int) -> str | None:
    """Qualified name of the innermost function holding ``line`` in ``rel``."""
    mod = cv._parse(tree.file(rel))
    best = None

    def visit(node, qual):
        nonlocal best
        for c in ast.iter_child_nodes(node):
            if isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                q = qual + [c.name]
                if c.lineno <= line <= (c.end_lineno or c.lineno) and not isinstance(c, ast.ClassDef):
                    best = ".".join(q)
                visit(c, q)

    visit(mod, [])
    return best


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Python's cycle collector off for the block (on again after, as it was). The parsed trees
    are millions of long-lived objects that the collector's full passes walk again and again
    while finding nothing to free: a third of an audit's time (2.4-3.6 s of CPU instead of
    4.0-4.8 s for 0.5.23, the same peak memory); reference counting still frees everything else."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@listing_once
def audit_tree(tree: SGLangTree, path_ids: list[str] | None = None) -> list[PathResult]:
    """Audit every path of one tree (or only ``path_ids``), the model side first.

    The paths are :func:`path_specs`': the catalogued ids first (in catalogue order), then every
    other path the dispatch reaches (``catalogued`` False), all found by following the code.

    A path run with a backend for which SGLang's startup refuses Ling's architecture
    (:func:`~nvfp4study.sglang.startup_checks.startup_refused`) is UNUSABLE, with what the path alone gives kept in the rule.

    When BailingMoeV3 does not hand the routed-expert limit to its MoE layer
    (:func:`nvfp4study.sglang.model_side.model_side`), every path is DROPPED with that reason
    and the model file's line, whatever the path alone would give (kept in the rule).

    Run with the cycle collector off (:func:`_no_cyclic_gc`) and the tree's files listed once.

    Raises:
        NoBailingMoeV3: the tree has no ``models/bailing_moe_v3.py``.
        AuditError: a file the catalogue names does not parse.
    """
    with _no_cyclic_gc():
        return _audit_tree(tree, path_ids)


def _audit_tree(tree: SGLangTree, path_ids: list[str] | None = None) -> list[PathResult]:
    """The body of :func:`audit_tree`."""
    try:
        side = model_side(tree)
    except SyntaxError as exc:
        raise AuditError(f"{tree.root}: cannot parse {exc.filename}: {exc.msg}") from exc
    if not side.present:
        raise NoBailingMoeV3(no_model_line(tree.version))
    out = []
    forget_settable(tree.root)  # a tree edited in place since its last audit is read again
    try:
        specs = path_specs(tree)
    except (SyntaxError, RecursionError, MemoryError) as exc:
        raise AuditError(f"{tree.root}: cannot follow the MoE dispatch: {getattr(exc, 'msg', None) or exc!r}") from exc
    for spec in specs:
        if path_ids and spec["id"] not in path_ids:
            continue
        try:
            out.append(audit_path(tree, spec))
        except (SyntaxError, RecursionError, MemoryError) as exc:
            # one file that cannot be read, or code nested too deep to follow, costs this path only
            why = (f"cannot read {_short(str(Path(exc.filename).resolve().relative_to(tree.root.resolve())))}: {exc.msg}"
                   if isinstance(exc, SyntaxError) and exc.filename else "code nested too deep to follow")
            out.append(PathResult(path=spec["id"], label=spec["label"], verdict=ClampVerdict.UNDECIDED,
                                  rule=f"trail lost: {why}", file=None, function=None, line=None,
                                  sglang_version=tree.version, catalogued=spec.get("catalogued", True),
                                  found_by=list(spec.get("found_by", [])),
                                  platform=describe(spec.get("platforms", PLATFORMS))))
    kept = [sp for sp in specs if not path_ids or sp["id"] in path_ids]
    out = entries_decided_by_callers(out, kept, _unpinned_callers(tree, kept))
    for check in (startup_refused, constructor_raised, loader_refused, other_model_refused):
        out = [check(tree.root, sp.get("via", sp["id"]), r) for sp, r in zip(kept, out, strict=True)]
    out = [fusion_noted(tree.root, sp, r) for sp, r in zip(kept, out, strict=True)]
    if not side.ok:
        out = [_model_dropped(r, side) for r in out]
    return out


#: what a runner entry's callers may hand it: the forms, worst first
_CALLER_FORMS = [ClampVerdict.DROPPED, ClampVerdict.APPROX, ClampVerdict.EXACT]


def _backend_of(spec: dict) -> str | None:
    key = spec.get("via", spec["id"])
    return path_keys.runner(key) if path_keys.method(key) else None


def _unpinned_callers(tree: SGLangTree, specs: list[dict]) -> list[tuple[dict, PathResult]]:
    """``(spec, row)`` of each catalogued path pinned to one device by its catalogue ``assume``
    (``mxfp4-sm100-trtllm``: Mxfp4MoEMethod/flashinfer_mxfp4 on SM100), run again with its derived
    path's facts only: the method on every device it picks a kernel for. They are callers of the
    runner-level entries (:func:`entries_decided_by_callers`), not rows: Mxfp4MoEMethod's SM120
    branch hands cutlass_fused_moe a ``swiglu_limit`` of ``torch.full((E,), 7.0)`` (layers/
    quantization/mxfp4.py 1392-1395, 1506-1529 in 0.5.20), not Ling's limit."""
    out = []
    for sp in specs:
        if "unpinned_assume" in sp and "missing" not in sp:
            spec = {**sp, "id": sp["via"], "assume": sp["unpinned_assume"], "catalogued": False}
            out.append((spec, audit_path(tree, spec)))
    return out


def entries_decided_by_callers(rows: list[PathResult], specs: list[dict],
                               extra: list[tuple[dict, PathResult]] = ()) -> list[PathResult]:
    """A runner-level entry (``fused:``/``core:``) left UNDECIDED because its clamp comes from the
    quant info a method builds takes the worst form (DROPPED, APPROX, EXACT) among this tree's
    method paths run with its backend (``Method/<backend>``) that reach the same kernel, naming
    that caller; without such a caller it stays UNDECIDED. ``extra``: more callers (spec, row),
    not rows of their own (:func:`_unpinned_callers`)."""
    by_backend: dict[str, list[PathResult]] = {}
    for sp, r in [*zip(specs, rows, strict=True), *extra]:
        b = _backend_of(sp)
        if b is not None and r.verdict in _CALLER_FORMS:
            by_backend.setdefault(b, []).append(r)
    out = []
    for sp, r in zip(specs, rows, strict=True):
        backend = path_keys.runner(sp["id"])
        callers = [c for c in by_backend.get(backend, []) if c.sink == r.sink]  # the same kernel call
        if r.verdict != ClampVerdict.UNDECIDED or "a runner-level entry alone" not in r.rule or not callers:
            out.append(r)
            continue
        worst = min(callers, key=lambda c: _CALLER_FORMS.index(c.verdict))
        rule = (f"the quant info comes from its callers: {len(callers)} method path(s) run with this backend, "
                f"the worst {worst.path} {worst.verdict.value} ({worst.rule[:120]}) | alone: {r.rule[:100]}")
        out.append(PathResult(**{**asdict(r), "verdict": worst.verdict, "rule": rule, "file": worst.file,
                                 "function": worst.function, "line": worst.line}))
    return out


def _model_dropped(r: PathResult, side: ModelSide) -> PathResult:
    h = side.routed
    return PathResult(path=r.path, label=r.label, verdict=ClampVerdict.DROPPED,
                      rule=(f"BailingMoeV3 does not hand the limit to the MoE layer: {h.reason} "
                            f"(the path alone: {r.verdict.value})"),
                      file=MODEL_FILE, function=h.function, line=h.line, sglang_version=r.sglang_version,
                      sink=r.sink, catalogued=r.catalogued, found_by=r.found_by, platform=r.platform)


def audit_release(version: str) -> list[PathResult] | str:
    """:func:`audit_tree` of the released wheel of ``version`` (unpacked once into the cache),
    or the one-line reason it has no rows (:class:`~nvfp4study.core.errors.NoBailingMoeV3`).

    Raises:
        SGLangSourceError, NotAnSGLangTree: as :func:`nvfp4study.sglang.source.unpack_wheel`.
    """
    from .source import unpack_wheel

    try:
        return audit_tree(unpack_wheel(version))
    except NoBailingMoeV3 as exc:
        return str(exc)


__all__ = ["ClampVerdict", "PathResult", "audit_path", "audit_release", "audit_tree", "catalog",
           "entries_decided_by_callers", "missing_reason", "path_specs"]
