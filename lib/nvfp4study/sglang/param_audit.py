"""Every parameter of Ling's MoE on every path: the audit of a parameter other than the clamp.

The clamp's audit is :mod:`nvfp4study.sglang.audit`; this module follows a *scalar* parameter (the routed
scaling factor, 2.5 for Ling) through the same paths with the same interpreter (:func:`~nvfp4study.sglang.
audit.run_path` with the parameter's spec from ``data/moe_params.yaml``) and counts where it is applied:

- **top-k**: the FusedMoE helper that makes TopK fold the factor into the routed weights, run with
  the path's method object and backend (its file and function are data: ``applications.topk``);
- **runner**: a kernel call or product the runner reaches with the tracked value (the sink table
  ``data/moe_param_sinks.yaml``: ``applies`` / ``none`` / ``unread``, or ``by-method``: the TRT-LLM
  routing method's column ``needs`` of ``applications.routing_methods``; a fused tail: the sums of its epilogue,
  :mod:`~nvfp4study.sglang.param_epilogue`), its registered post-permute run too (:mod:`nvfp4study.sglang.
  param_runner`, which also finds a registered custom op the path hands None where its schema takes an int: UNUSABLE);
- **model**: BailingMoeV3's own product (``applications.model``: on the all-to-all paths only).

Verdicts: ``APPLIED`` (once), ``DROPPED`` (nowhere), ``DOUBLE`` (twice or more), ``UNDECIDED`` (a part the
audit cannot decide, with where), and, as for the clamp, ``REFUSED`` (the path raises about this parameter),
``UNUSABLE`` (it cannot run Ling: the clamp audit's UNUSABLE, or its REFUSED: Ling's clamp is set), ``ABSENT``.
Routing parameters (``kind: routing``: Ling's renormalisation, correction bias and grouped top-k) are judged
where routing is decided, TopK or the runner it hands the logits to (:mod:`nvfp4study.sglang.param_routing`,
:func:`judge_routing`): ``APPLIED`` / ``DROPPED`` / ``WRONG``.
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from functools import lru_cache
from typing import Any

from . import clamp_values as cv
from . import moe_params, path_keys
from .audit import PathResult, audit_tree, path_specs
from .audit_run import _short, run_path
from .audit_sinks import ClampVerdict, _arg, flashinfer_pin
from .clamp_flow import Interp
from .param_epilogue import epilogue_sink
from .param_reroute import with_reroutes
from .param_routing import backend_instance as _backend_instance
from .param_routing import for_release, method_column, routing_verdict, topk_format_facts
from .param_routing import topk_folding as _topk_folding
from .param_runner import custom_op_rejects, e8m0_scales, routing_kernel_rejects, run_post_permute
from .param_runner import runnable_callers as _runnable_callers
from .param_runner import runner_device_spec as _runner_device_spec
from .platforms import PLATFORMS, describe
from .source import SGLangTree
from .tree_files import listing_once


class ParamVerdict(StrEnum):
    """A path's verdict for one parameter (the module docstring says what each means)."""

    APPLIED = "APPLIED"
    DROPPED = "DROPPED"
    DOUBLE = "DOUBLE"
    WRONG = "WRONG"
    REFUSED = "REFUSED"
    UNUSABLE = "UNUSABLE"
    ABSENT = "ABSENT"
    UNDECIDED = "UNDECIDED"


@dataclass
class ParamResult:
    """One path's verdict for one parameter; ``evidence``: ``"file:line what"`` (file relative to
    ``sglang/srt``); ``parts``: where it is applied (``top-k``/``runner``/``model``: 1, 0, None)."""

    path: str
    label: str
    param: str
    verdict: ParamVerdict
    rule: str
    file: str | None
    line: int | None
    sglang_version: str
    catalogued: bool = True
    platform: str = describe(PLATFORMS)
    evidence: list[str] = field(default_factory=list)
    parts: dict[str, int | None] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["verdict"] = self.verdict.value
        return d


def _result(spec: dict, tree: SGLangTree, param: moe_params.ParamSpec, verdict: ParamVerdict, rule: str,
            file: str | None = None, line: int | None = None, **kw: Any) -> ParamResult:
    return ParamResult(path=spec["id"], label=spec["label"], param=param.name, verdict=verdict, rule=rule,
                       file=file, line=line, sglang_version=tree.version, catalogued=spec.get("catalogued", True),
                       platform=describe(spec.get("platforms", PLATFORMS)), **kw)


@listing_once  # the tree's files listed once for the whole judgement (it changes none)
def audit_param(tree: SGLangTree, name: str, path_ids: list[str] | None = None,
                clamp_rows: list[PathResult] | None = None) -> list[ParamResult]:
    """Every path of ``tree`` (or only ``path_ids``) judged for parameter ``name``.

    ``clamp_rows``: the clamp audit of the same tree and paths (:func:`~nvfp4study.sglang.audit.audit_tree`;
    computed when None): a path it finds ABSENT, UNUSABLE or REFUSED (Ling's clamp is set, so the
    path raises for Ling) is so for every parameter.

    Raises:
        AuditError: ``name`` is no parameter of ``data/moe_params.yaml``, or is the clamp (its
            rows are :func:`~nvfp4study.sglang.audit.audit_tree`'s); as ``audit_tree`` otherwise.
    """
    from ..core.errors import AuditError

    param = moe_params.param(name)
    if param.kind == "clamp":
        raise AuditError(f"{name} is the clamp: its rows are audit_tree's (nvfp4study audit-sglang --param {name})")
    clamp_rows = clamp_rows if clamp_rows is not None else audit_tree(tree, path_ids)
    specs = path_specs(tree)  # all of them: a runner-level path's callers are other paths
    by_id = {r.path: r for r in clamp_rows}
    wanted = [sp for sp in specs if not path_ids or sp["id"] in path_ids]
    with cv_gc_off():
        out = [_judge(tree, spec, param, specs, by_id) for spec in wanted]
        if param.kind == "scalar":
            callers = {sp["id"]: sp for w in wanted for sp in _callers(w, specs)}
            have = {r.path: r for r in out}
            missing = [i for i in callers if i not in have]
            if missing and path_ids:  # the callers' own rows, as the whole tree's audit gives them
                more = {r.path: r for r in audit_tree(tree, missing)}
                have |= {i: _judge(tree, callers[i], param, specs, more) for i in missing}
            out = [_callers_decide(r, [have[sp["id"]] for sp in _callers(w, specs) if sp["id"] in have])
                   for w, r in zip(wanted, out, strict=True)]
    return out


def _judge(tree: SGLangTree, spec: dict, param: moe_params.ParamSpec, specs: list[dict],
           clamp_by_id: dict[str, PathResult]) -> ParamResult:
    """One path's row (:func:`audit_param`), its clamp row in ``clamp_by_id`` (absent: not inherited)."""
    inherited = _inherited(spec, tree, param, clamp_by_id.get(spec["id"]))
    if inherited is not None:
        return inherited
    if param.kind == "routing":
        return judge_routing(tree, spec, for_release(tree, param))
    if param.kind != "scalar":
        return _result(spec, tree, param, ParamVerdict.UNDECIDED,
                       f"{param.kind} parameters are not followed by the interpreter yet")
    return judge_scalar(tree, spec, param, _runnable_callers(tree, spec, specs, clamp_by_id))  # callers that run Ling


def _callers(spec: dict, specs: list[dict]) -> list[dict]:
    """The method paths that run a runner-level path's backend (``Method/<runner>``, the same
    all-to-all backend; not one whose facts make ``is_<runner>()`` false: it runs the backend as
    another), as :func:`topk_fused` takes them; ``[]`` for a method path."""
    key = spec.get("via", spec["id"])
    if not path_keys.is_runner_level(key):
        return []
    backend, a2a = path_keys.runner(key), path_keys.a2a(key)
    return [sp for sp in specs if "missing" not in sp and path_keys.method(k := sp.get("via", sp["id"]))
            and path_keys.runner(k) == backend and path_keys.a2a(k) == a2a
            and (sp.get("assume") or {}).get(f"is_{backend}") is not False]


#: a runner-level row takes the first of these its callers give (a wrong count before a right one)
_CALLER_ORDER = (ParamVerdict.DROPPED, ParamVerdict.DOUBLE, ParamVerdict.APPLIED)


def _callers_decide(row: ParamResult, callers: list[ParamResult]) -> ParamResult:
    """A runner-level row of a scalar factor whose count differs from its callers': the worst count among them
    (DROPPED, DOUBLE, then APPLIED when every caller that counts applies it once), naming that caller. The
    runner's product hinges on payload switches the methods set (flashinfer_cutlass's
    ``_maybe_apply_routed_scaling_factor`` reads ``quant_info.apply_routed_scaling_factor``, which
    CompressedTensorsW4A4Nvfp4MoE sets False, compressed_tensors_w4a4_nvfp4_moe.py 355-371 in 0.5.22), and its
    runner input comes from them, as for the clamp (:func:`~nvfp4study.sglang.audit.entries_decided_by_callers`).
    A row that cannot run (UNUSABLE, REFUSED, ABSENT) or without counting callers is kept; so is it while some
    caller is UNDECIDED and none is wrong."""
    counted = [c for c in callers if c.verdict in _CALLER_ORDER]
    if row.verdict not in (*_CALLER_ORDER, ParamVerdict.UNDECIDED) or not counted:
        return row
    worst = min(counted, key=lambda c: _CALLER_ORDER.index(c.verdict))
    undecided = any(c.verdict == ParamVerdict.UNDECIDED for c in callers)
    if worst.verdict == row.verdict or (worst.verdict == ParamVerdict.APPLIED and undecided):
        return row
    rule = (f"its callers decide: {len(counted)} method path(s) run with this backend, the worst {worst.path} "
            f"{worst.verdict.value} ({worst.rule[:120]}) | alone: {row.verdict.value}: {row.rule[:100]}")
    return ParamResult(**{**asdict(row), "verdict": worst.verdict, "rule": rule, "file": worst.file,
                          "line": worst.line, "evidence": [f"{worst.path}: {e}" for e in worst.evidence[:3]]
                          + row.evidence})


def cv_gc_off():
    """The clamp audit's collector switch (:func:`nvfp4study.sglang.audit._no_cyclic_gc`)."""
    from .audit import _no_cyclic_gc

    return _no_cyclic_gc()


def _inherited(spec: dict, tree: SGLangTree, param: moe_params.ParamSpec, row: PathResult | None) -> ParamResult | None:
    """The row a path gets whatever this parameter does: ABSENT, or UNUSABLE where the clamp audit
    finds it cannot run Ling (UNUSABLE) or raises on Ling's clamp (REFUSED); None otherwise."""
    if row is None:
        return None
    if row.verdict == ClampVerdict.ABSENT:
        return _result(spec, tree, param, ParamVerdict.ABSENT, row.rule, row.file, row.line)
    if row.verdict in (ClampVerdict.UNUSABLE, ClampVerdict.REFUSED):
        why = "cannot run Ling" if row.verdict == ClampVerdict.UNUSABLE else "raises on Ling's clamp limit"
        return _result(spec, tree, param, ParamVerdict.UNUSABLE, f"the path {why}: {row.rule}", row.file, row.line,
                       evidence=[f"{row.file}:{row.line} {row.rule[:120]}"])
    return None


def judge_scalar(tree: SGLangTree, spec: dict, param: moe_params.ParamSpec, specs: list[dict]) -> ParamResult:
    """One path's verdict for a scalar factor: where it is applied (top-k, runner, model), counted."""
    # the runner's branches on TopK's output format take the format TopK gives on this path
    facts = topk_format_facts(tree, spec)
    spec = _runner_device_spec(spec, param)
    run = run_path(tree, {**spec, "assume": {**(spec.get("assume") or {}), **facts}} if facts else spec, param)
    stopped = _run_stop(tree, spec, param, run)
    if stopped is not None:
        return stopped
    run_post_permute(tree, spec, run)
    flag, t_ev = topk_fused(tree, spec, param, specs)
    topk, t_ev = _topk_folding(tree, spec, facts, flag, t_ev)  # the flag set, but TopK may never route
    runner, r_ev, r_rule = runner_applications(run, param, topk_folds=topk is True)
    model, m_ev = model_applies(tree, spec, param, flag)  # the model's switch reads the flag
    parts = {"top-k": None if topk is None else int(topk), "runner": runner,
             "model": None if model is None else int(model)}
    known = sum(v for v in parts.values() if v is not None)
    verdict = (ParamVerdict.DOUBLE if known >= 2 else ParamVerdict.UNDECIDED if None in parts.values()
               else ParamVerdict.APPLIED if known == 1 else ParamVerdict.DROPPED)
    evidence = r_ev + t_ev + m_ev
    rule = (f"top-k {_word(parts['top-k'])}; runner {_word(runner)} ({r_rule}); model {_word(parts['model'])}"
            + ("" if verdict != ParamVerdict.DROPPED else f": the routed experts run at 1/{param.ling or '?'}"))
    file, line = _deciding(verdict, evidence)
    return _result(spec, tree, param, verdict, rule, file, line, evidence=evidence, parts=parts)


def _run_stop(tree: SGLangTree, spec: dict, param: moe_params.ParamSpec, run: Any) -> ParamResult | None:
    """The row a path's run settles before any part is counted: a step raising on every branch (REFUSED when
    about the parameter, else UNUSABLE), a stop of the run (missing, lost, too long), a registered custom op or a
    TRT-LLM routing kernel that raises for Ling whatever the parameter (UNUSABLE: :func:`~nvfp4study.sglang.
    param_runner.routing_kernel_rejects`, the grouped DeepSeekV3 routing kernel's experts-per-group check), a
    certain raise about the parameter (REFUSED); None when the run goes through."""
    if run.stop == "raising" or (run.interp is not None and run.interp.raising_steps):
        rel, qual, raises = run.interp.raising_steps[0]
        x = next((r for r in raises if r.about_param), raises[0] if raises else None)
        verdict = ParamVerdict.REFUSED if x is not None and x.about_param else ParamVerdict.UNUSABLE
        where = (_short(x.file), x.line) if x is not None else (_short(rel), None)
        return _result(spec, tree, param, verdict, f"{qual} raises on every branch: {x.text if x else ''}", *where)
    if run.stop is not None:
        verdict, rule, file, _fn, line = run.stop
        return _result(spec, tree, param, ParamVerdict(verdict.value), rule, file, line)
    raised = custom_op_rejects(tree, run) if path_keys.method(spec.get("via", spec["id"])) else None
    raised = raised or routing_kernel_rejects(run, param, flashinfer_pin(tree))  # the TRT-LLM routing kernel's shape check
    if raised is not None:
        file, line, text = raised
        return _result(spec, tree, param, ParamVerdict.UNUSABLE, f"the path raises for Ling whatever this parameter is: "
                       f"{text}", file, line, evidence=[f"{file}:{line} {text}"])
    refusals = [x for x in run.interp.refusals if x.about_param and x.certain]
    if refusals:
        x = refusals[0]
        return _result(spec, tree, param, ParamVerdict.REFUSED, f"raises when it is set: {x.text}",
                       _short(x.file), x.line)
    return None


def judge_routing(tree: SGLangTree, spec: dict, param: moe_params.ParamSpec) -> ParamResult:
    """One path's verdict for a routing parameter (:mod:`nvfp4study.sglang.param_routing`): where TopK routes it,
    or, where TopK hands the logits on, the runner (whose run may stop first); the worst of that and a branch
    where the method routes again from the logits (:func:`~nvfp4study.sglang.param_reroute.with_reroutes`)."""
    word, rule, evidence, run = routing_verdict(tree, spec, param)
    word, rule, evidence = with_reroutes(tree, spec, param, word, rule, evidence)
    if run is not None:
        stopped = _run_stop(tree, spec, param, run)
        if stopped is not None:
            stopped.evidence = evidence + stopped.evidence
            return stopped
    file, line = None, None
    for part in [*rule.split("; ")[::-1], *evidence[:1]] if word != "UNDECIDED" else evidence[:1]:
        f, _, ln = part.split(" ", 1)[0].rpartition(":")
        if ln.isdigit():  # the deciding routing call: the runner's where TopK hands it on
            file, line = f, int(ln)
            break
    return _result(spec, tree, param, ParamVerdict(word), rule, file, line, evidence=evidence)


def _word(v: int | None) -> str:
    return "undecided" if v is None else "applies" if v else "no"


def _deciding(verdict: ParamVerdict, evidence: list[str]) -> tuple[str | None, int | None]:
    """The row's file:line: the first application (APPLIED/DOUBLE), else the first line that turns it off (a switch
    set False or a dead mention), else the first evidence."""
    pick = [e for e in evidence if (" applies" in e) == (verdict in (ParamVerdict.APPLIED, ParamVerdict.DOUBLE))]
    for e in pick or evidence:
        where = e.split(" ", 1)[0]
        f, _, ln = where.rpartition(":")
        if ln.isdigit():
            return f, int(ln)
    return None, None


def runner_applications(run: Any, param: moe_params.ParamSpec, topk_folds: bool = False) -> tuple[int | None, list[str], str]:
    """``(1 applied / 0 not / None undecided, evidence, rule)`` for the runner: the sink calls the run reached with
    the tracked value (a fused tail's form: the worst sum of its epilogue on the path's device classes,
    :func:`~nvfp4study.sglang.param_epilogue.epilogue_sink`), the payload switches and the dead mentions.
    ``topk_folds``: top-k folds the factor into the routed weights on this path, so a sink whose table entry has
    ``if_topk_folds`` does that form instead (fused_marlin_moe's plain sum for the top-k-scaled MXFP4 weights;
    ``unread``, with ``why_topk_folds``: not decided there); so does one whose entry has ``if_scales_e8m0`` where the
    path ran a cast of the expert scales to E8M0 (:func:`~nvfp4study.sglang.param_runner.e8m0_scales`)."""
    interp: Interp = run.interp
    applying, evidence, undecided = [], [], []
    for h in interp.hits:
        sink = epilogue_sink(interp, param.sinks.get(h.callee), param)
        if sink is None:
            continue
        value = next((v for present, v, _ in (_arg(h, s, param.facts) for s in sink.get("arg", [])) if present), None)
        where = f"{_short(h.file)}:{h.line}"
        if not cv.has_tracked(value):
            why = "it takes none" if not sink.get("arg") else "None" if value is None else "not the factor"
            evidence.append(f"{where} {h.callee}() gets no {param.name} ({why})")
            continue
        opts = value.options if isinstance(value, cv.Multi) else (value,)
        form = sink.get("if_topk_folds", sink["form"]) if topk_folds else sink["form"]
        e8m0 = e8m0_scales(interp) if "if_scales_e8m0" in sink and form == sink["form"] else None
        if not all(cv.has_tracked(o) for o in opts):
            undecided.append(f"{where} {h.callee}() gets it on some branches only")
        elif e8m0 is not None and sink["if_scales_e8m0"] != sink["form"]:
            evidence.append(f"{where} {h.callee}() takes it and does not apply it: the expert scales are E8M0 "
                            f"({e8m0} casts them), its MXFP4 branch sums plainly")
        elif form != sink["form"] and form == "unread":  # folded by top-k, and this kernel's own use not decided
            undecided.append(f"{where} {h.callee}() takes it while top-k folds it: {sink.get('why_topk_folds', '')}")
        elif form != sink["form"]:
            evidence.append(f"{where} {h.callee}() takes it and does not apply it: top-k folded it "
                            f"({sink.get('source', '')[:160]})")
        elif sink["form"] == "applies":
            applying.append(f"{where} {h.callee}() applies it")
        elif sink["form"] == "unread":
            undecided.append(f"{where} {h.callee}() takes it, its use not read ({sink.get('why') or sink.get('source', '')[:80]})")
        elif sink["form"] == "by-method":  # a TRT-LLM routing kernel: its routing method decides
            does, how = method_column(h, sink, param)
            if does is None:
                undecided.append(f"{where} {h.callee}() takes it, {how}")
            elif does:
                applying.append(f"{where} {h.callee}() applies it ({how})")
            else:
                evidence.append(f"{where} {h.callee}() takes it and does not apply it ({how})")
        else:
            evidence.append(f"{where} {h.callee}() takes it and does not apply it")
    evidence = _switches(interp, param) + _dead(run, param) + evidence  # what turns it off first
    applying, evidence = list(dict.fromkeys(applying)), list(dict.fromkeys(evidence))  # a call seen twice
    if applying:
        return 1, applying + evidence, applying[0].split(" ", 1)[1]
    opaque = [(n, f, ln) for n, f, ln in interp.opaque]
    if undecided or opaque:
        first = undecided[0] if undecided else f"{_short(opaque[0][1])}:{opaque[0][2]} passed to {opaque[0][0]}(), not read"
        return None, undecided + evidence, first
    return 0, evidence, "no kernel or product it reaches applies it"


def _switches(interp: Interp, param: moe_params.ParamSpec) -> list[str]:
    """Where a payload field that switches the runner's product (``applications.switches``) was set."""
    out = []
    for v in interp.attrs.values():
        for p in v.options if isinstance(v, cv.Multi) else (v,):
            if not isinstance(p, cv.Payload):
                continue
            for fld in param.applications.get("switches", []):
                where = p.where(fld)
                if where is not None:
                    line = f"{_short(where[0])}:{where[1]} {p.cls}.{fld} = {p.get(fld)!r} ({where[2]})"
                    if line not in out:
                        out.append(line)
    return out


def _dead(run: Any, param: moe_params.ParamSpec) -> list[str]:
    """The parameter's mentions in the path's steps that were dead for Ling."""
    out = []
    for r, q in run.steps:
        fn = run.interp.find(r, q)
        for ln in cv.mentions(fn, param.mentions) if fn is not None else []:
            if (r, ln) not in run.interp.live:
                out.append(f"{_short(r)}:{ln} {param.name} mentioned where dead for Ling")
    return out


def _method_instance(interp: Interp, spec: dict) -> cv.Instance | None:
    """The path's quantization method as an object: its class, its in-tree bases and class-level
    constants (UNK for one a method assigns); None for a runner-level path."""
    key = spec.get("via", spec["id"])
    cls = path_keys.method(key)
    rel = next((s.split("::")[0] for s in spec.get("steps", []) if s.split("::")[-1].startswith(f"{cls}.")), None)
    mod = interp.module(rel if rel is None or rel.startswith("sglang/") else "sglang/srt/" + rel) if rel else None
    if cls is None or mod is None:
        return None
    kinds, attrs, assigned, todo, seen = [], {}, set(), [(mod, cls)], set()
    while todo:
        m, c = todo.pop(0)
        node = next((n for n in m.tree.body if isinstance(n, ast.ClassDef) and n.name == c), None)
        if node is None or (m.rel, c) in seen:
            continue
        seen.add((m.rel, c))
        for st in node.body:
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name) \
                    and isinstance(st.value, ast.Constant):
                attrs.setdefault(st.targets[0].id, st.value.value)
        assigned |= _stored_attrs(node)
        for bm, bc in interp._bases(m, c):
            kinds.append(bc)
            todo.append((bm, bc))
    attrs.update({a: cv.UNK for a in assigned})
    return cv.Instance(cls, tuple(kinds), tuple(attrs.items()))


@lru_cache(maxsize=256)
def _stored_attrs(node: ast.ClassDef) -> frozenset[str]:
    """The attribute names a class body assigns anywhere (``self.x = ...`` in its methods)."""
    return frozenset(n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store))


@lru_cache(maxsize=16)
def _attribute_sites(tree: ast.Module, attribute: str) -> tuple[ast.Assign | None, tuple[int, ...]]:
    """A module's first assignment to ``<obj>.<attribute>`` and the sorted lines that read it (one
    walk per parsed module: every path asks it of the model's file)."""
    node = next((n for n in ast.walk(tree) if isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Attribute) and t.attr == attribute for t in n.targets)), None)
    uses = sorted({n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                   and n.attr == attribute and isinstance(n.ctx, ast.Load)})
    return node, tuple(uses)


def topk_fused(tree: SGLangTree, spec: dict, param: moe_params.ParamSpec,
               specs: list[dict]) -> tuple[bool | None, list[str]]:
    """Whether top-k folds the factor in on this path (``applications.topk``), with evidence; a runner-level
    path takes its callers' value (the method paths run with its backend) when they agree."""
    rule = param.applications.get("topk")
    if not rule:
        return False, []
    if path_keys.method(spec.get("via", spec["id"])) is None:
        backend = path_keys.runner(spec.get("via", spec["id"]))
        # a method that runs this backend as another (its create_moe_runner pins another runner: the
        # derived path's facts make is_<backend>() false, fp8.py 2850-2860 in 0.5.22) never reaches it
        callers = [sp for sp in specs if "missing" not in sp and path_keys.method(sp.get("via", sp["id"]))
                   and path_keys.runner(sp.get("via", sp["id"])) == backend
                   and (sp.get("assume") or {}).get(f"is_{backend}") is not False]
        vals = [(_topk_one(tree, sp, rule, param), sp["id"]) for sp in callers]
        got = {v[0] for (v, _) in vals}
        if not vals or got == {None}:
            return None, [f"{rule['file']} {rule['function']}: no method path runs {backend} to decide it"]
        # the runner's own row: top-k folds it only if every caller's method makes it; a method
        # that does (or is undecided) has its own row, named here
        value = True if got == {True} else False if False in got else None
        ev = next(ev for (v, ev), _ in vals if v == value)
        others = [i for (v, _), i in vals if v != value]
        note = f"; not for {', '.join(others[:4])} (their own rows)" if others else ""
        return value, [f"{ev[0]} (for {len(vals) - len(others)} of {len(vals)} method path(s) run with {backend}{note})"]
    return _topk_one(tree, spec, rule, param)


def _topk_one(tree: SGLangTree, spec: dict, rule: dict, param: moe_params.ParamSpec) -> tuple[bool | None, list[str]]:
    rel = "sglang/srt/" + rule["file"]
    interp = Interp(tree.root, {}, spec.get("assume"), spec.get("platforms", PLATFORMS), param=param)
    fn = interp.find(rel, rule["function"])
    if fn is None:
        return False, [f"{rule['file']} has no {rule['function']}: top-k does not fold it"]
    method = _method_instance(interp, spec)
    roles = {"method": method if method is not None else cv.UNK, "backend": _backend_instance(tree, spec)}
    for call in rule.get("backend_calls", []):  # the global backend getter (0.5.19-0.5.22) gives the path's
        interp.assume[f"{call}()"] = roles["backend"]
    _, frame = interp.run_function(rel, rule["function"], [], {p: roles[r] for p, r in rule["args"].items()})
    out: Any = None
    for r in frame.returns:
        out = r if out is None else cv.join(out, r)
    t = cv.truth(out) if frame.returns else None
    who = method.cls if method is not None else "?"
    return t, [f"{rule['file']}:{fn.lineno} {rule['function']}({who}, {path_keys.runner(spec.get('via', spec['id']))}) "
               f"-> {t if t is not None else 'undecided'}{' (top-k applies it)' if t else ''}"]


def model_applies(tree: SGLangTree, spec: dict, param: moe_params.ParamSpec,
                  topk: bool | None) -> tuple[bool | None, list[str]]:
    """Whether the model applies the factor itself on this path (``applications.model``): its switch evaluated
    with the path's dispatcher (all-to-all or not) and the top-k value."""
    rule = param.applications.get("model")
    if not rule:
        return False, []
    key = spec.get("via", spec["id"])
    a2a = key.startswith(path_keys.FUSED) and key[len(path_keys.FUSED):].split("/")[0] != "none"
    rel = "sglang/srt/" + rule["file"]
    interp = Interp(tree.root, {}, {k: (a2a if role == "a2a" else cv.UNK if topk is None else topk)
                                    for k, role in rule["facts"].items()},
                    spec.get("platforms", PLATFORMS), param=param)
    mod = interp.module(rel)
    node, uses = _attribute_sites(mod.tree, rule["attribute"]) if mod else (None, ())
    if node is None:
        return False, [f"{rule['file']}: no {rule['attribute']} (the model never applies it)"]
    interp.attrs[rule["value"]] = param.tracked()
    t = cv.truth(interp.eval(node.value, cv.Frame(mod, None, rule["attribute"])))
    word = "undecided" if t is None else "applies" if t else "no"
    return t, [f"{rule['file']}:{node.lineno} {rule['attribute']} ({'all-to-all' if a2a else 'standard'} "
               f"dispatch) -> {word}; used at {', '.join(map(str, uses[:3]))}"]


__all__ = ["ParamResult", "ParamVerdict", "audit_param", "judge_scalar", "model_applies", "runner_applications",
           "topk_fused"]
