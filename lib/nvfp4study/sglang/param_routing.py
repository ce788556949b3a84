"""The routing parameters of Ling's MoE on every path (``kind: routing`` in ``data/moe_params.yaml``).

Where a path routes is read from SGLang's source with the clamp audit's interpreter
(:class:`~nvfp4study.sglang.clamp_flow.Interp`), following one parameter's spec:

1. **TopK** (``applications.routing``): TopK's runner binding (0.5.23 ``TopK.bind_runner_backend``,
   topk.py 769-807: the output format from the runner backend and the routing method type) and the
   forward of each device class of the path (``forward_cuda`` ...; 0.5.19-0.5.22 decide the format
   there from the global backend, topk.py 606-636 in 0.5.19), run with the path's backend and Ling's
   ``TopKConfig`` (the spec's facts, the followed field tracked). The routing functions it reaches
   are the parameter's sinks (``data/moe_param_sinks.yaml``).
2. **The runner**, where TopK hands it the router logits (a sink of form ``runner``:
   ``BypassedTopKOutput``): the path's own steps (:func:`~nvfp4study.sglang.audit_run.run_path`),
   whose TRT-LLM routing kernels are read against the routing method they get (``by-method``:
   ``applications.routing_methods``, SGLang's ``RoutingMethodType`` comments).

General rules (no parameter is named here): a routing function reached with the tracked value in its
argument applies it (APPLIED), one reached without it or that takes none routes without it (DROPPED),
one of form ``wrong`` uses it in another form (WRONG); a TRT-LLM method that does not use it drops it,
one that uses it but scores otherwise than Ling (``applications.routing.ling_scoring``) is WRONG, as is a
routing function told by an argument to score otherwise (form ``by-scoring``). Paths whose branches
disagree, or that reach no routing function, are UNDECIDED with where.
"""

from __future__ import annotations

import ast
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from . import clamp_values as cv
from . import moe_params, path_keys
from .audit_run import _short, run_path
from .audit_sinks import _arg
from .clamp_flow import Interp
from .platforms import PLATFORMS
from .routing_shape import kernel_shape_fails
from .source import SGLangTree

#: the verdict words a routing sink hit can give (the forms of the sink table)
_FORM_WORD = {"none": "DROPPED", "wrong": "WRONG", "unread": "UNDECIDED"}


def for_release(tree: SGLangTree, param: moe_params.ParamSpec) -> moe_params.ParamSpec:
    """``param`` with the TopKConfig facts the release's model decides (``applications.routing.model_passes``:
    the model's ``TopK(...)`` call): a field the call passes keeps Ling's value, one it does not takes
    the default of TopK's ``__init__`` in that release (0.5.19/0.5.20 BailingMoeV3 passes no
    ``scoring_func``: TopK's default ``"softmax"``, topk.py 540 in 0.5.20; 0.5.21 passes
    ``scoring_func=self.score_function``, bailing_moe_v3.py 604)."""
    rule = param.applications.get("routing", {}).get("model_passes")
    if not rule:
        return param
    got = _model_defaults(tree.root, rule["file"], rule["call"], rule["defaults"], tuple(rule["fields"]))
    if not got:
        return param
    return replace(param, facts={**param.facts, **got})


@lru_cache(maxsize=64)
def _model_defaults(root: Any, model: str, call: str, defaults: str, fields: tuple[str, ...]) -> dict[str, Any]:
    """The fields of ``fields`` that the model's ``call(...)`` does not pass, with the constant default
    of ``defaults`` (``file::Class.method``); {} when the call or the defaults are not found."""
    src = Path(root) / "sglang/srt" / model
    rel, qual = defaults.split("::")
    dfile = Path(root) / "sglang/srt" / rel
    if not src.is_file() or not dfile.is_file():
        return {}
    calls = [n for n in ast.walk(ast.parse(src.read_text(encoding="utf-8"))) if isinstance(n, ast.Call)
             and (getattr(n.func, "id", None) or getattr(n.func, "attr", None)) == call]
    cls, meth = qual.split(".")
    node = next((m for c in ast.parse(dfile.read_text(encoding="utf-8")).body if isinstance(c, ast.ClassDef)
                 and c.name == cls for m in c.body if isinstance(m, ast.FunctionDef) and m.name == meth), None)
    if not calls or node is None:
        return {}
    args = node.args.args + node.args.kwonlyargs
    dflt = dict(zip([a.arg for a in node.args.args][len(node.args.args) - len(node.args.defaults):],
                    node.args.defaults, strict=False))
    dflt.update({a.arg: d for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=False) if d is not None})
    out = {}
    for f in fields:
        if f in {a.arg for a in args} and isinstance(dflt.get(f), ast.Constant) \
                and not any(k.arg == f for c in calls for k in c.keywords):
            out[f] = dflt[f].value
    return out


def topk_interp(tree: SGLangTree, spec: dict, param: moe_params.ParamSpec, platform: str) -> tuple[Interp, list[str]]:
    """Run TopK's runner binding and ``platform``'s forward (``applications.routing``) under Ling's
    TopKConfig with the path's backend; the interpreter (its sink hits) and what was run."""
    interp, ran, _ = _topk_run(tree, spec, param, platform)
    return interp, ran


def _topk_run(tree: SGLangTree, spec: dict, param: moe_params.ParamSpec, platform: str) -> tuple[Interp, list[str], list]:
    """:func:`topk_interp`, with the values the forward returns."""
    rule = param.applications["routing"]
    rel = "sglang/srt/" + rule["file"]
    interp = Interp(tree.root, param.sinks, spec.get("assume"), (platform,), param=param)
    backend = routing_backend(backend_instance(tree, spec), interp.module(rel))
    for call in rule.get("backend_calls", []):  # 0.5.19-0.5.22: the global backend is the path's
        interp.assume[f"{call}()"] = backend
    roles = {"backend": backend, "none": None}
    ran = []
    bound = interp.run_function(rel, rule["bind"], [], {p: roles[r] for p, r in rule.get("args", {}).items()},
                                method_call=True) if rule.get("bind") else None
    if bound is not None:
        ran.append(f"{rule['file']}:{bound[0].lineno} {rule['bind']}")
    qual = rule["forwards"].get(platform)
    # one argument given (the hidden states): the other parameters' defaults hold
    fwd = interp.run_function(rel, qual, [cv.UNK], method_call=True) if qual else None
    if fwd is not None:
        ran.append(f"{rule['file']}:{fwd[0].lineno} {qual}")
    return interp, ran, list(fwd[1].returns) if fwd is not None else []


def backend_instance(tree: SGLangTree, spec: dict) -> cv.Instance:
    """The path's runner backend as an object whose ``is_<value>()`` predicates are decided: the
    derived path's facts, else true for the path's backend only (a native or direct path: none)."""
    from .code_index import CodeIndex
    from .dispatch import backend_values

    backend = path_keys.runner(spec.get("via", spec["id"]))
    values = set(backend_values(CodeIndex(tree.root)).values())
    facts = {f"is_{v}()": v == backend for v in sorted(values)}
    # the derived path's own predicate facts win (is_marlin() is true for experimental_sgl_marlin too,
    # layers/moe/utils.py 161-168 in 0.5.23)
    facts.update({f"{k}()": v for k, v in (spec.get("assume") or {}).items()
                  if k.startswith("is_") and isinstance(v, bool)})
    return cv.Instance("MoeRunnerBackend", (), tuple(facts.items()))


def routing_backend(backend: cv.Instance, mod: Any) -> cv.Instance:
    """The path's runner backend for TopK: one value, so every ``is_<x>()`` predicate TopK's module
    calls that the path's facts leave open is false (the enum's values and predicate names differ:
    ``triton_kernel`` / ``is_triton_kernels()``, layers/moe/utils.py in 0.5.23); a path with no
    backend of its own runs with the default, ``auto`` (server_args ``moe_runner_backend``)."""
    facts = dict(backend.attrs)
    if not any(v is True for v in facts.values()):
        facts["is_auto()"] = True
    for name in _called_predicates(mod.tree) if mod is not None else ():
        facts.setdefault(f"{name}()", False)
    return cv.Instance(backend.cls, backend.kinds, tuple(facts.items()))


@lru_cache(maxsize=16)
def _called_predicates(tree: ast.Module) -> tuple[str, ...]:
    """The ``is_<x>`` method names a module calls, sorted (one walk per parsed module: every path
    asks it of TopK's module)."""
    return tuple(sorted({n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call)
                         and isinstance(n.func, ast.Attribute) and n.func.attr.startswith("is_")}))


def _value(hit: cv.SinkHit, specs: list[str], facts: dict) -> tuple[bool, Any, ast.AST | None]:
    for s in specs:
        present, v, node = _arg(hit, s, facts)
        if present:
            return True, v, node
    return False, None, None


def _method_options(hit: cv.SinkHit, sink: dict, methods: dict, facts: dict) -> list[str | None] | None:
    """Each value the ``method`` argument of a TRT-LLM kernel call may take, as a name of ``routing_methods``
    (None for one not read: not a name, an int value, or the one member its argument's source names); None
    when the call has no such argument."""
    present, v, node = _value(hit, sink.get("method", []), facts)
    if not present:
        return None
    by_value = {row["value"]: name for name, row in methods.items()}
    out: list[str | None] = []
    for o in v.options if isinstance(v, cv.Multi) else (v,):
        if isinstance(o, str) and o in methods:
            out.append(o)
        elif isinstance(o, int) and not isinstance(o, bool) and o in by_value:
            out.append(by_value[o])
        else:
            named = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)} & set(methods) \
                if node is not None else set()
            out.append(named.pop() if len(named) == 1 else None)
    return list(dict.fromkeys(out))


def _method(hit: cv.SinkHit, sink: dict, methods: dict, facts: dict) -> list[str] | None:
    """The routing method(s) a TRT-LLM kernel call gets (names of ``routing_methods``); None when
    any is not read (:func:`_method_options`)."""
    opts = _method_options(hit, sink, methods, facts)
    return None if opts is None or None in opts else [o for o in opts if o is not None]


def raise_note(hit: cv.SinkHit, sink: dict, param: moe_params.ParamSpec) -> str:
    """``"; its DeepSeekV3 branch would raise: ..."`` where a call's routing method is not decided but one it may
    take fails Ling's shape in FlashInfer's routing kernel (:func:`~nvfp4study.sglang.routing_shape.kernel_shape_fails`);
    "" otherwise."""
    opts = _method_options(hit, sink, param.applications.get("routing_methods", {}), param.facts) or []
    for m in (o for o in opts if o is not None):
        fails = kernel_shape_fails(hit, sink, param, [m])
        if fails is not None:
            return f"; its {m} branch would raise: it {fails}"
    return ""


def routing_methods_of(hit: cv.SinkHit, sink: dict, param: moe_params.ParamSpec) -> list[str] | None:
    """The names of ``applications.routing_methods`` a TRT-LLM kernel call can get (the sink's ``method``
    argument); None when not read."""
    return _method(hit, sink, param.applications.get("routing_methods", {}), param.facts)


def method_column(hit: cv.SinkHit, sink: dict, param: moe_params.ParamSpec) -> tuple[bool | None, str]:
    """What the TRT-LLM routing method(s) a kernel call gets do with a value it takes, as one column of
    ``applications.routing_methods`` (the sink's ``needs``: e.g. whether the routing kernel multiplies
    the top-k weights by its scale, read from FlashInfer's routing runner; docs/blind-readings/KP.md).

    Returns ``(True, names)`` where every method the call can get has the column true, ``(False, names)``
    where none has, ``(None, why)`` where the method is not read or the methods differ. Raises KeyError
    when the sink names no ``needs`` (a data error: the table entry is incomplete)."""
    methods = param.applications.get("routing_methods", {})
    names = _method(hit, sink, methods, param.facts)
    if not names:
        return None, "its routing method is not read" + raise_note(hit, sink, param)
    got = {bool(methods[m].get(sink["needs"])) for m in names}
    if len(got) != 1:
        return None, f"its routing methods {', '.join(names)} differ"
    return got.pop(), f"routing method {', '.join(names)}"


def judge_hit(hit: cv.SinkHit, param: moe_params.ParamSpec, platform: str | None = None) -> tuple[str, str]:
    """``(verdict word or "RUNNER", evidence)`` for one routing function reached on ``platform`` (None:
    several). A sink whose name a module binds to another function on a device class (``bound_on``:
    {platform: sink}, e.g. topk.py's ``biased_grouped_topk = biased_grouped_topk_cpu`` on an AMX CPU) is
    judged as that function there."""
    sink = param.sinks[hit.callee]
    where = f"{_short(hit.file)}:{hit.line} {hit.callee}()"
    bound = sink.get("bound_on", {}).get(platform)
    if bound is not None:
        sink, where = param.sinks[bound], f"{where} ({bound} on {platform})"
    form = sink["form"]
    if form == "runner":
        return "RUNNER", f"{where} hands the router logits to the runner, which routes"
    if form == "topk":
        return "TOPK", f"{where} materialises TopK's routing"
    if form in _FORM_WORD:
        why = sink.get("why") or {"none": f"routes without {param.name}", "wrong": f"uses {param.name} in "
                                  "another form", "unread": "routes in code not read"}[form]
        return _FORM_WORD[form], f"{where} {why}"
    present, v, _ = _value(hit, sink.get("arg", []), param.facts)
    carried = (not sink.get("arg")) or (present and cv.has_tracked(v))
    partial = present and isinstance(v, cv.Multi) and not all(cv.has_tracked(o) for o in v.options)
    applied = f"{where} routes with {param.name}"
    if form == "by-scoring" and carried and not partial:  # not carried: DROPPED, as an "applies" sink
        form, applied = _by_scoring(hit, sink, param, where)
        if form in ("wrong", "unread"):
            return _FORM_WORD[form], applied
    form = "applies" if form == "by-scoring" else form
    if form == "applies":
        if partial:
            return "UNDECIDED", f"{where} gets {param.name} on some branches only"
        return ("APPLIED", applied) if carried else \
            ("DROPPED", f"{where} gets no {param.name} ({'None' if present and v is None else 'not passed'})")
    return _by_method(hit, sink, param, where, carried and not partial)


def ling_scoring(param: moe_params.ParamSpec) -> str | None:
    """Ling's scoring function (``applications.routing.ling_scoring``: its gate, sigmoid), not what
    SGLang's TopKConfig holds for it (a release whose model passes none gets TopK's default)."""
    return param.applications["routing"].get("ling_scoring")


def _by_scoring(hit: cv.SinkHit, sink: dict, param: moe_params.ParamSpec, where: str) -> tuple[str, str]:
    """A routing function whose scoring is an argument (``scoring``: the argument and its values, as
    the source's comment names them): ``(form, evidence)``: ``wrong`` where it scores otherwise
    than Ling, ``unread`` where not read, else the sink's form for Ling's scoring (``if_ling``)."""
    rule = sink["scoring"]
    present, v, _ = _value(hit, rule["arg"], param.facts)
    names = {rule["values"].get(o, "?") for o in (v.options if isinstance(v, cv.Multi) else (v,))} if present \
        else {"?"}
    if "?" in names or len(names) != 1:
        return "unread", f"{where} scoring argument {rule['arg'][0]} not decided"
    scoring = names.pop()
    if scoring != ling_scoring(param):
        return "wrong", f"{where} scores with {scoring} ({rule['arg'][0]}), Ling's gate with {ling_scoring(param)}"
    return sink["if_ling"], f"{where} {sink.get('why', '')}".rstrip()


def _by_method(hit: cv.SinkHit, sink: dict, param: moe_params.ParamSpec, where: str, carried: bool) -> tuple[str, str]:
    """A TRT-LLM routing kernel: its method's use of the parameter (``needs``), Ling's scoring."""
    methods = param.applications.get("routing_methods", {})
    needs = param.applications["routing"]["needs"]
    ling = ling_scoring(param)
    names = _method(hit, sink, methods, param.facts)
    if not names:
        present, v, _ = _value(hit, sink.get("method", []), param.facts)
        what = "None, no routing method (the kernel's handling of it not read)" if present and v is None \
            else "not read"
        return "UNDECIDED", f"{where} routing method {what}{raise_note(hit, sink, param)}"
    words = set()
    for m in names:
        row = methods[m]
        if not row.get(needs):
            words.add(("DROPPED", f"{where} routing method {m} ({row.get('scoring')}) does not use {param.name}"))
        elif row.get("scoring") != ling:
            words.add(("WRONG", f"{where} routing method {m} uses {param.name} with {row.get('scoring')} scores "
                                f"(Ling: {ling})"))
        elif not carried:
            words.add(("DROPPED", f"{where} routing method {m} without Ling's {param.name} (argument not carried)"))
        else:
            words.add(("APPLIED", f"{where} routing method {m} routes with {param.name}"))
    if len({w for w, _ in words}) > 1:
        return "UNDECIDED", f"{where} routing methods {', '.join(names)} differ"
    return words.pop()


def topk_format_facts(tree: SGLangTree, spec: dict) -> dict[str, bool]:
    """The runner's facts about TopK's output format on this path, as TopK's binding and forward give it
    (the first routing parameter's ``applications.routing``): ``runner_facts`` where TopK hands the logits
    on (a sink of form ``runner``) on every judged device class, ``standard_facts`` where it routes itself
    and returns no output object of its own (select_experts: the standard format; 0.5.23 topk.py 791-806,
    a layer with no routing method gets STANDARD, ``_can_bypass_trtllm_routing``); {} otherwise (another
    format, or the device classes differ)."""
    name = next((n for n in moe_params.names() if moe_params.param(n).kind == "routing"), None)
    if name is None:
        return {}
    param = for_release(tree, moe_params.param(name))
    rule = param.applications["routing"]
    own = tuple(spec.get("platforms", PLATFORMS))
    got = set()
    for platform in tuple(p for p in own if p in rule.get("devices", own)) or own:
        interp, _, returns = _topk_run(tree, spec, param, platform)
        forms = {param.sinks[h.callee]["form"] for h in interp.hits if h.callee in param.sinks}
        built = any(isinstance(r, cv.Built) for r in returns)
        got.add("runner" if forms == {"runner"} else "standard" if forms and "runner" not in forms
                and not built else "?")
    if len(got) != 1 or "?" in got:
        return {}
    return dict(rule.get("runner_facts" if got == {"runner"} else "standard_facts", {}))


def topk_never_routes(tree: SGLangTree, spec: dict, facts: dict[str, bool]) -> str | None:
    """Why TopK's own routing (and so any fold of a factor into its top-k weights) never runs on this path, or
    None where it may: ``facts`` (:func:`topk_format_facts`) are the first routing parameter's ``runner_facts``
    (TopK hands the router logits on: its bypassed format) and neither the path's all-to-all dispatcher
    (:func:`dispatcher_materializes`) nor its runner (a sink of form ``topk``, ``to_standard``, reached by the
    path's run under those facts) materialises TopK's routing with ``select_experts``. 0.5.20
    ModelOptNvFp4FusedMoEMethod on flashinfer_trtllm: TopK returns a BypassedTopKOutput (topk.py 670-690) whatever
    its ``apply_routed_scaling_factor_on_output``, and the runner's trtllm_fp4_block_scale_moe routes from the
    logits (flashinfer_trtllm.py 1446-1493)."""
    name = next((n for n in moe_params.names() if moe_params.param(n).kind == "routing"), None)
    if name is None or not facts:
        return None
    rparam = for_release(tree, moe_params.param(name))
    rule = rparam.applications["routing"]
    if facts != rule.get("runner_facts"):
        return None
    own = tuple(spec.get("platforms", PLATFORMS))
    for platform in tuple(p for p in own if p in rule.get("devices", own)) or own:
        if dispatcher_materializes(tree, spec, rparam, platform) is not None:
            return None
    run = run_path(tree, {**spec, "assume": {**(spec.get("assume") or {}), **facts}}, rparam)
    hits = run.interp.hits if run.interp is not None else []
    if run.interp is None or any(rparam.sinks.get(h.callee, {}).get("form") == "topk" for h in hits):
        return None
    return ("TopK hands the router logits to the runner (its bypassed format) and nothing on the path materialises "
            "its routing: its fold into the top-k weights never runs")


def topk_folding(tree: SGLangTree, spec: dict, facts: dict[str, bool], flag: bool | None,
                 evidence: list[str]) -> tuple[bool | None, list[str]]:
    """Whether top-k folds a factor on this path, given ``flag`` (the FusedMoE helper's answer, with its
    ``evidence``): False, the evidence saying why, where the flag is not False but TopK never routes
    (:func:`topk_never_routes`); ``(flag, evidence)`` otherwise."""
    idle = topk_never_routes(tree, spec, facts) if flag is not False else None
    if idle is None:
        return flag, evidence
    first = evidence[0].replace(" (top-k applies it)", "") if evidence else "top-k"
    return False, [f"{first}: the flag is set, but {idle}", *evidence[1:]]


def materialized(tree: SGLangTree, spec: dict, param: moe_params.ParamSpec, platform: str) -> list[tuple[str, str]]:
    """TopK's standard routing run from the runner (``applications.routing.materialize``, e.g.
    ``select_experts``) with Ling's TopKConfig: the routing functions it reaches, judged."""
    rule = param.applications["routing"]
    rel = "sglang/srt/" + rule["file"]
    interp = Interp(tree.root, param.sinks, spec.get("assume"), (platform,), param=param)
    done = interp.run_function(rel, rule.get("materialize", ""), [cv.UNK],
                               {param.config_names[0]: cv.CONFIG} if param.config_names else {})
    if done is None:
        return []
    return [j for j in _hits(interp, param) if j[0] not in ("RUNNER", "TOPK")]


def dispatcher_materializes(tree: SGLangTree, spec: dict, param: moe_params.ParamSpec, platform: str) -> str | None:
    """``"file:line Class.dispatch materialises TopK"`` where the path's all-to-all dispatcher turns a
    bypassed TopK output into the standard one before the runner sees it (a sink of form ``topk``,
    ``to_standard``, reached by its ``dispatch`` under the runner's facts: 0.5.19 FlashinferDispatcher,
    token_dispatcher/flashinfer.py 326-327); None for the standard dispatcher or one that hands it on."""
    key = spec.get("via", spec["id"])
    a2a = key[len(path_keys.FUSED):].split("/")[0] if key.startswith(path_keys.FUSED) else "none"
    rel = f"sglang/srt/layers/moe/token_dispatcher/{a2a}.py"
    facts = param.applications["routing"].get("runner_facts", {})
    interp = Interp(tree.root, param.sinks, {**(spec.get("assume") or {}), **facts}, (platform,), param=param)
    mod = interp.module(rel) if a2a != "none" else None
    for cls in sorted(mod.classes) if mod is not None else ():
        if "dispatch" not in mod.classes[cls]:
            continue
        before = len(interp.hits)
        interp.run_function(rel, f"{cls}.dispatch", [cv.UNK, cv.UNK], method_call=True)
        hit = next((h for h in interp.hits[before:] if param.sinks.get(h.callee, {}).get("form") == "topk"), None)
        if hit is not None:
            return f"{_short(hit.file)}:{hit.line} {cls}.dispatch materialises TopK ({hit.callee}) before the runner"
    return None


def _hits(interp: Interp, param: moe_params.ParamSpec) -> list[tuple[str, str]]:
    """The routing functions reached, judged (each call once) on the interpreter's device class."""
    seen, out = set(), []
    platform = interp.platforms[0] if len(interp.platforms) == 1 else None
    for h in interp.hits:
        if h.callee in param.sinks and (h.file, h.line, h.callee) not in seen:
            seen.add((h.file, h.line, h.callee))
            out.append(judge_hit(h, param, platform))
    return out


#: where reachable branches differ, the worst in this order (the hand readings' instruction, data/
#: param_hand_readings.yaml header, as the clamp's worst reachable branch): a branch not decided decides
#: only where no branch is known to lose the parameter
_WORST = ("DROPPED", "WRONG", "DOUBLE", "UNDECIDED", "REFUSED", "APPLIED")


def _combine(judged: list[tuple[str, str]], where: str) -> tuple[str, str, list[str]]:
    """One verdict from the routing functions reached: the word they share, else the worst branch
    (:data:`_WORST`), with the branch that gives it first."""
    if not judged:
        return "UNDECIDED", f"{where}: no routing function reached", []
    words = {w for w, _ in judged}
    ev = [e for _, e in judged]
    if len(words) == 1:
        return words.pop(), ev[0], ev
    worst = next((w for w in _WORST if w in words), None)
    if worst is None or not words <= set(_WORST):  # a word outside the order (RUNNER, TOPK): not decided here
        return "UNDECIDED", f"{where}: the branches route differently ({', '.join(sorted(words))})", ev
    first = next(e for w, e in judged if w == worst)
    ev = [first] + [e for e in ev if e != first]
    return worst, f"{first} (the worst of the branches: {', '.join(sorted(words))})", ev


def routing_verdict(tree: SGLangTree, spec: dict, param: moe_params.ParamSpec) -> tuple[str, str, list[str], Any]:
    """``(verdict word, rule, evidence, run)`` for one path: TopK on each of its device classes,
    then, where TopK hands the logits on, the runner (``run``: its :class:`PathRun`, else None)."""
    per, run = {}, None
    own = tuple(spec.get("platforms", PLATFORMS))
    gpus = tuple(p for p in own if p in param.applications["routing"].get("devices", own))
    for platform in gpus or own:
        interp, ran = topk_interp(tree, spec, param, platform)
        word, rule, ev = _combine(_hits(interp, param), f"TopK on {platform}")
        if word == "RUNNER":
            if run is None:
                facts = param.applications["routing"].get("runner_facts", {})
                run = run_path(tree, {**spec, "assume": {**(spec.get("assume") or {}), **facts}}, param)
            if run.stop is not None or run.interp is None:
                per[platform] = ("STOP", rule, ev)
                continue
            judged, disp = [], dispatcher_materializes(tree, spec, param, platform)
            if disp is not None:  # the runner gets TopK's standard output: select_experts routes
                judged += [(w, f"{disp}: {e}") for w, e in materialized(tree, spec, param, platform)]
            for j in _hits(run.interp, param) if disp is None else ():
                if j[0] == "TOPK":  # the runner routes with TopK's own select_experts
                    judged += [(w, f"{j[1]}: {e}") for w, e in materialized(tree, spec, param, platform)]
                elif j[0] != "RUNNER":
                    judged.append(j)
            w2, r2, ev2 = _combine(judged, "the runner")
            word, rule, ev = w2, f"{rule}; {r2}", ev + ev2
        per[platform] = (word, rule, ev + ran)
    words = {w for w, _, _ in per.values()}
    if len(words) == 1:
        word, rule, ev = next(iter(per.values()))
        return word, rule, ev, run
    ev = [e for _, _, es in per.values() for e in es]
    rule = "; ".join(f"{p}: {w}" for p, (w, _, _) in per.items())
    return "UNDECIDED", f"the device classes differ ({rule})", ev, run


__all__ = ["backend_instance", "for_release", "judge_hit", "raise_note", "routing_methods_of", "routing_backend", "routing_verdict", "topk_format_facts",
           "topk_folding", "topk_interp", "topk_never_routes"]
