"""Where does a parameter of Ling's MoE go? A small abstract interpreter over SGLang's Python AST.

The audit (:mod:`nvfp4study.sglang.audit`) names, for each MoE path, the functions the value
travels through (its *steps*). This module executes those functions symbolically for one model
configuration, Ling's, following one parameter (:class:`~nvfp4study.sglang.moe_params.ParamSpec`,
from ``data/moe_params.yaml``: its value a labelled :class:`Tracked`, the other config fields
Ling's facts; the clamp by default). It follows assignments,
``if``/``else`` and conditional expressions whose tests it can decide (so a use of the limit that
sits in the alpha-set branch is dead), dataclass payloads (``...QuantInfo(field=...)`` and later
``quant_info.field``), layer attributes set in one step and read in another, ``dict(...)`` passed
as ``**kwargs``, and helper functions it can resolve in the tree (same module or imported). It
records every call to a *sink* (a kernel entry named in the sink table), every ``raise`` it
reaches, and which mentions of the parameter were live.

Values: :data:`UNK` (cannot tell), ``None``, Python constants, :class:`Tracked` (the parameter's
value or anything computed from it), :data:`CONFIG` (the ``MoeRunnerConfig``), :class:`Act` (a FlashInfer
``ActivationType`` member), tuples, :class:`AbstractDict`, :class:`Multi` (one of several).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from . import moe_params
from .clamp_exprs import ExprEval
from .clamp_values import (
    CONFIG,
    CONFIG_NAMES,
    UNK,
    AbstractDict,
    Frame,
    LocalFunc,
    Multi,
    ParsedModule,
    Payload,
    Refusal,
    SinkHit,
    _imports,
    _parse,
    derived,
    join,
    truth,
    unparse,
)
from .code_index import (
    always_evaluated,
    attribute_never_set,
    bound_in_module,
    class_methods,
    module_level,
    walk,
)
from .construction_sites import construction_args
from .layer_attrs import closed_create_weights
from .model_attrs import other_model_read
from .platforms import PLATFORMS, true_on
from .shared_fusion import FACT as FUSION_FACT


def _dicts(v: Any) -> list[AbstractDict]:
    """The abstract dicts ``v`` may be (one, or each option of a Multi of dicts); [] otherwise."""
    opts = v.options if isinstance(v, Multi) else (v,)
    return list(opts) if opts and all(isinstance(o, AbstractDict) for o in opts) else []


def _isinstance_tests(fn: ast.AST) -> tuple[tuple[str, str], ...]:
    """``(name, Class)`` of each ``isinstance(name, Class)`` in ``fn``, in walk order (kept on the
    node: a parsed tree is shared and never changed, and the interpreter binds a function often)."""
    tests = getattr(fn, "_isinstance_tests", None)
    if tests is None:
        tests = fn._isinstance_tests = tuple(
            (n.args[0].id, n.args[1].id) for n in walk(fn)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "isinstance"
            and len(n.args) == 2 and isinstance(n.args[0], ast.Name) and isinstance(n.args[1], ast.Name))
    return tests


def _module_parts(tree: ast.Module, rel: str) -> tuple[dict, dict, dict]:
    """``(functions, classes, imports)`` of the parsed module ``tree`` read as file ``rel`` (the
    imports' package comes from it), kept on the node per ``rel``: a parsed tree is shared and never
    changed, and every interpreter (one per path, parameter and device class) reads the same
    modules. The dicts are shared between interpreters, which only read them."""
    parts = getattr(tree, "_flow_parts", None)
    if parts is None:
        parts = tree._flow_parts = {}
    if rel not in parts:
        body = module_level(tree.body)
        funcs = {n.name: n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        classes = {n.name: class_methods(n) for n in body if isinstance(n, ast.ClassDef)}
        parts[rel] = (funcs, classes, _imports(body, rel[:-3].replace("/", ".")))
    return parts[rel]


class Interp(ExprEval):
    """Executes a path's steps under Ling's facts; see the module docstring.

    Args:
        root: the tree root (folder holding ``sglang/``).
        sinks: sink names (callee simple names) to record, or the sink table (name -> entry),
            whose ``from`` says which modules a sink comes from (:meth:`sink_source_ok`).
        assume: attribute-name facts for this path (e.g. ``{"use_flashinfer_trtllm": False}``).
        platforms: the device classes the path runs on; the platform predicates and module flags
            they all agree on are decided (:mod:`nvfp4study.sglang.platforms`).
        param: the followed parameter (:class:`~nvfp4study.sglang.moe_params.ParamSpec`; None: the
            first of ``data/moe_params.yaml``): its labelled tracked value, mentions, facts.
        a2a: the ``--moe-a2a-backend`` the path runs with (``"none"``, the default, unless the
            path's key names another: :func:`~nvfp4study.sglang.path_keys.a2a`).
    """

    MAX_STEPS = 20000

    def __init__(self, root: Path, sinks: set[str] | dict[str, dict], assume: dict | None = None,
                 platforms: tuple[str, ...] = PLATFORMS, param: moe_params.ParamSpec | None = None,
                 a2a: str = "none"):
        self.root = Path(root)
        self.a2a = a2a
        self.param = param or moe_params.param()
        self.sink_from = {k: list(v.get("from", [])) for k, v in sinks.items()
                          if isinstance(v, dict)} if isinstance(sinks, dict) else {}
        self.platforms = tuple(platforms)
        self._flags = {}
        self.sinks = set(sinks)
        # the parameter's own facts of names (moe_params.yaml ``assume``: none for the clamp) under the path's
        self.assume = {**self.param.assume, **(assume or {})}
        self.attrs: dict[str, Any] = {}
        self.origin: dict[str, tuple] = {}  # attr -> (file, line, how it was set)
        self.hits: list[SinkHit] = []
        self.refusals: list[Refusal] = []
        self.runner_overrides: dict[str, Any] = {}
        self.in_runner = False
        #: running a runner's pre-permute (audit_run._run_pre_permute): its quant-info parameter takes
        #: the payload the method handed, whatever class it is annotated with
        self.in_pre_permute = False
        self.live: set[tuple[str, int]] = set()
        self.opaque: list[tuple[str, str, int]] = []
        self.exhausted = False
        self.runner_calls: list[tuple[str, int]] = []
        self.runner_payloads: list[Any] = []
        self.runner_builds: list[Any] = []
        self.named_calls: list[tuple[Any, dict, ast.Name]] = []  # (module, frame imports, callee) of each call run
        self.steps_done = 0
        self.entry_names: set[str] = set()
        #: (file, qualname, raises reached) of each step that raises on every branch
        self.raising_steps: list[tuple[str, str, list[Refusal]]] = []
        self.class_defaults: dict[str, dict[str, Any]] = {}  # class -> {attr: None}, see none_default
        #: the path's create_weights ran and hands its layer to nothing unseen (layer_attrs): a weight
        #: it never registered is one the layer lacks (Lookup.layer_lacks)
        self.layer_closed = False
        self._mods: dict[str, ParsedModule | None] = {}

    # --- modules ------------------------------------------------------------------------------
    def module(self, rel: str) -> ParsedModule | None:
        if rel in self._mods:
            return self._mods[rel]
        path = self.root / rel
        if not path.is_file():
            self._mods[rel] = None  # the tree does not change while one interpreter runs
            return None
        tree = _parse(path)
        mod = ParsedModule(path, rel, tree, *_module_parts(tree, rel))
        self._mods[rel] = mod
        return mod

    def module_for(self, dotted: str) -> ParsedModule | None:
        base = dotted.replace(".", "/")
        return self.module(base + ".py") or self.module(base + "/__init__.py")

    def find(self, rel: str, qualname: str) -> ast.FunctionDef | None:
        mod = self.module(rel)
        if mod is None:
            return None
        parts = qualname.split(".")
        if len(parts) == 1:
            return mod.functions.get(parts[0])
        return mod.classes.get(parts[0], {}).get(parts[1])

    # --- running ------------------------------------------------------------------------------
    def run_step(self, rel: str, qualname: str) -> bool:
        """Execute one step with unbound parameters. Returns False if the function is absent.

        A step that raises on every branch it can take (:meth:`Frame.raises_always`) is recorded in
        :attr:`raising_steps` with the raises it reached (its :attr:`refusals`)."""
        fn = self.find(rel, qualname)
        if fn is None:
            return False
        frame = Frame(self.module(rel), qualname.split(".")[0] if "." in qualname else None, qualname)
        self._bind(fn, frame, [], {}, method_call=False)
        if qualname.count(".") == 1 and qualname.endswith(".__init__"):
            # a method's constructor gets the arguments the FusedMoE layer builds it with
            frame.locals.update(construction_args(self, qualname.split(".")[0], fn))
        before = len(self.refusals)
        self.exec_body(fn.body, frame)
        if qualname.endswith(".create_weights"):
            self.layer_closed = closed_create_weights(fn) and not frame.raised
        if frame.raises_always() and not self.exhausted:
            self.raising_steps.append((rel, qualname, self.refusals[before:]))
        return True

    def run_function(self, rel: str, qualname: str, args: list | None = None, kwargs: dict | None = None, *,
                     method_call: bool = False) -> tuple[ast.FunctionDef, Frame] | None:
        """Execute ``qualname`` of module ``rel`` with ``args`` / ``kwargs`` bound (abstract values;
        the other parameters unbound, their defaults holding); its definition and the frame it ran
        in (``frame.returns``), or None if the function is absent. ``method_call``: ``args`` start
        after ``self``."""
        fn = self.find(rel, qualname)
        if fn is None:
            return None
        frame = Frame(self.module(rel), qualname.split(".")[0] if "." in qualname else None, qualname)
        self._bind(fn, frame, list(args or []), dict(kwargs or {}), method_call=method_call)
        self.exec_body(fn.body, frame)
        return fn, frame

    def _bind(self, fn, frame, args, kwargs, method_call):
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        if params and params[0] in ("self", "cls"):
            frame.locals[params[0]] = UNK
            params = params[1:]
        defaults = fn.args.defaults
        dmap = dict(zip(params[len(params) - len(defaults):], defaults, strict=False))
        for a in fn.args.kwonlyargs:
            params.append(a.arg)
        for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=False):
            if d is not None:
                dmap[a.arg] = d
        ann = {a.arg: unparse(a.annotation) for a in fn.args.posonlyargs + fn.args.args
               + fn.args.kwonlyargs if a.annotation is not None}
        # A parameter annotated with a base class (``quant_info: MoeQuantInfo``) takes the payload
        # its body narrows it to with ``isinstance(quant_info, X)`` (a runner registry entry).
        narrowed = {}
        handed = self.handed_payload() if self.in_runner and frame.depth == 0 else None
        for name, cls in _isinstance_tests(fn):
            if handed is not None:
                narrowed[name] = handed  # the runner step gets what the method's runner.run handed
            elif f"<payload:{cls}>" in self.attrs:
                narrowed.setdefault(name, self.attrs[f"<payload:{cls}>"])
        for i, p in enumerate(params):
            if i < len(args) and p not in [k.arg for k in fn.args.kwonlyargs]:
                # an unknown argument the body narrows with isinstance is the payload it tests for
                frame.locals[p] = narrowed[p] if args[i] is UNK and p in narrowed else args[i]
            elif p in kwargs:
                frame.locals[p] = narrowed[p] if kwargs[p] is UNK and p in narrowed else kwargs[p]
            elif p in CONFIG_NAMES:
                frame.locals[p] = CONFIG
            elif ann.get(p, "").strip("'\"") and f"<payload:{ann[p].strip(chr(39) + chr(34))}>" in self.attrs:
                frame.locals[p] = self.attrs[f"<payload:{ann[p].strip(chr(39) + chr(34))}>"]
            elif p in narrowed:
                frame.locals[p] = narrowed[p]
            elif handed is not None and self.in_pre_permute and ann.get(p, "").strip("'\"").endswith("QuantInfo"):
                # a pre-permute gets what the method's runner.run handed, of whatever class
                frame.locals[p] = handed
            elif p in dmap and (args or kwargs) and isinstance(dmap[p], ast.Constant):
                frame.locals[p] = dmap[p].value
            else:
                frame.locals[p] = UNK

    def handed_payload(self) -> Any:
        """The quant info the method's live ``runner.run(dispatch_output, quant_info)`` calls hand
        (one of them where several), when every one is a payload built on Ling's branches; else
        None. The runner step's ``isinstance(quant_info, X)`` tests then follow that payload: 0.5.19
        ``CompressedTensorsW8A8Fp8MoE.apply_weights`` hands a ``TritonMoeQuantInfo`` to the
        flashinfer_trtllm_routed MoeRunner (compressed_tensors_w8a8_fp8_moe.py 422-432: its
        ``use_flashinfer_trtllm`` is ``is_flashinfer_trtllm()``, false for the routed backend,
        layers/moe/utils.py 128), whose fused func raises TypeError for it (flashinfer_trtllm.py 1413)."""
        vals = [o for v in self.runner_payloads for o in (v.options if isinstance(v, Multi) else (v,))]
        if not vals or not all(isinstance(v, Payload) for v in vals):
            return None
        out = vals[0]
        for v in vals[1:]:
            out = join(out, v)
        return out

    def exec_body(self, body: list[ast.stmt], frame: Frame) -> None:
        for st in body:
            if frame.stopped:
                return
            self.exec_stmt(st, frame)

    def _branch(self, frame: Frame, bodies: list[list[ast.stmt]], narrowed: tuple | None = None) -> None:
        saved_attrs = self.attrs
        results = []
        for i, body in enumerate(bodies):
            f2 = frame.fork()
            f2.locals.update(narrowed[i] if narrowed else {})  # what an isinstance test leaves each side
            self.attrs = dict(saved_attrs)
            self.exec_body(body, f2)
            results.append((f2, self.attrs))
        merged_locals: dict = {}
        merged_attrs: dict = {}
        live = [(f, a) for f, a in results if not f.stopped] or results
        for k in set().union(*(f.locals.keys() for f, _ in live)):  # fall-through branches only
            vals = [f.locals.get(k, frame.locals.get(k, UNK)) for f, _ in live]
            merged = vals[0]
            for v in vals[1:]:
                merged = join(merged, v)
            merged_locals[k] = merged
        keys = set().union(*(a.keys() for _, a in results))
        for k in keys:  # attributes set on a branch that returned still persist
            if k.startswith("<payload:"):  # a payload exists only where it was built
                vals = [a[k] for _, a in results if k in a]
            else:
                vals = [a.get(k, saved_attrs.get(k, UNK)) for _, a in results]
            merged = vals[0]
            for v in vals[1:]:
                merged = join(merged, v)
            merged_attrs[k] = merged
        frame.locals.update(merged_locals)
        self.attrs = merged_attrs
        for f, _ in results:
            frame.returns.extend(f.returns)
            frame.imports.update(f.imports)
        frame.stopped = all(f.stopped for f, _ in results)
        frame.raised = frame.stopped and all(f.raises_always() for f, _ in results)

    def unset_attribute(self, st: ast.stmt, frame: Frame) -> str | None:
        """``self.X`` read by an ``assert`` or ``if`` test (not its nested bodies) where no
        file of the tree ever sets an attribute ``X`` (:func:`~nvfp4study.sglang.code_index.
        attribute_never_set`): the read raises AttributeError. None when there is none."""
        if not isinstance(st, (ast.Assert, ast.If)):  # where code tests its state (kept cheap)
            return None
        reads = getattr(st, "_self_reads", None)  # kept on the node: it lives as long as its tree
        if reads is None:
            reads = st._self_reads = tuple(dict.fromkeys(
                n.attr for n in walk(st.test) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)
                and isinstance(n.value, ast.Name) and n.value.id == "self"))
        for attr in reads:
            if attr not in self.attrs and attr not in self.assume and attribute_never_set(self.root, attr) \
                    and not bound_in_module(frame.module.tree, attr):
                return f"self.{attr}"
        return None

    def payload_lacks(self, st: ast.stmt, frame: Frame) -> str | None:
        """``x.F`` read by an ``assert`` or ``if`` test, a ``return``, an assignment's value or an
        expression statement where ``x`` holds a quant-info payload whose
        class (and bases) declare no ``F`` (:meth:`Payload.lacks`): the read raises AttributeError.
        0.5.21 ``Mxfp4MoEMethod.apply`` hands a ``TritonMoeQuantInfo`` to the aiter runner (mxfp4.py
        1723-1729), whose pre-permute returns ``quant_type=quant_info.quant_type`` (moe_runner/aiter.py 424). None
        when there is none."""
        if isinstance(st, (ast.Assert, ast.If)):
            top = st.test  # not its nested bodies
        elif isinstance(st, (ast.Return, ast.Assign, ast.Expr)) and st.value is not None:
            top = st.value
        else:
            return None
        reads = getattr(st, "_name_reads", None)  # kept on the node: it lives as long as its tree
        if reads is None:
            reads = st._name_reads = tuple(dict.fromkeys(
                (n.value.id, n.attr) for n in always_evaluated(top) if isinstance(n, ast.Attribute)
                and isinstance(n.ctx, ast.Load) and isinstance(n.value, ast.Name) and n.value.id != "self"))
        for name, attr in reads:
            v = frame.locals.get(name)
            opts = v.options if isinstance(v, Multi) else (v,)
            if opts and all(isinstance(o, Payload) and o.lacks(attr) for o in opts):
                return f"{name}.{attr} ({'/'.join(sorted({o.cls for o in opts}))} declares no {attr})"
        return None

    def exec_stmt(self, st: ast.stmt, frame: Frame) -> None:
        self.steps_done += 1
        if self.steps_done > self.MAX_STEPS:
            self.exhausted = True  # the audit says UNDECIDED, not what the cut-off run saw
            frame.stopped = True
            return
        why = self.unset_attribute(st, frame)  # then a payload's missing field, a weight the layer was never
        # given, another model's attribute
        why = f"{why} is never set anywhere in the tree" if why else self.payload_lacks(st, frame) \
            or self.unregistered_read(st, frame) or other_model_read(self, st, frame)
        if why is not None:
            self.refusals.append(Refusal(frame.module.rel, frame.qualname, st.lineno, False, f"AttributeError: {why}",
                                         certain=all(d for _, d in frame.guards)))
            frame.stopped = frame.raised = True
            return
        if isinstance(st, ast.Assign):
            v = self.eval(st.value, frame)
            for t in st.targets:
                self.assign(t, v, frame)
        elif isinstance(st, ast.AnnAssign) and st.value is not None:
            self.assign(st.target, self.eval(st.value, frame), frame)
        elif isinstance(st, ast.AugAssign):
            v = self.eval(st.value, frame)
            old = self.eval(st.target, frame) if isinstance(st.target, ast.Name) else UNK
            self.assign(st.target, derived("derived", v, old), frame)
        elif isinstance(st, ast.Expr):
            self.eval(st.value, frame)
        elif isinstance(st, ast.Return):
            v = self.eval(st.value, frame) if st.value is not None else None
            if not frame.raised:  # ``return f()`` where f() always raises does not return
                frame.returns.append(v)
            frame.stopped = True
        elif isinstance(st, ast.If):
            t = truth(self.eval(st.test, frame))
            text = unparse(st.test)
            if t is True:
                frame.guards.append((text, True))
                self.exec_body(st.body, frame)
                frame.guards.pop()
            elif t is False:
                frame.guards.append((f"not ({text})", True))
                self.exec_body(st.orelse, frame)
                frame.guards.pop()
            else:
                frame.guards.append((text, False))
                self._branch(frame, [st.body, st.orelse], self.narrowed(st.test, frame))
                frame.guards.pop()
        elif isinstance(st, (ast.For, ast.AsyncFor, ast.While)):
            it = self.eval(st.iter, frame) if isinstance(st, (ast.For, ast.AsyncFor)) else UNK
            if isinstance(it, tuple) and len(it) <= 16:  # a literal tuple: unroll it
                for item in it:
                    self.assign(st.target, item, frame)
                    self.exec_body(st.body, frame)
                if st.orelse and not frame.stopped:  # no break is followed: else runs after
                    self.exec_body(st.orelse, frame)
                return
            if isinstance(st, (ast.For, ast.AsyncFor)):
                self.assign(st.target, UNK, frame)
            self._branch(frame, [st.body, []])
            frame.stopped = frame.raised = False
            if st.orelse:  # runs when the loop ends without break
                self._branch(frame, [st.orelse, []])
                frame.stopped = frame.raised = False
        elif isinstance(st, (ast.With, ast.AsyncWith)):
            self.exec_body(st.body, frame)
        elif isinstance(st, (ast.Try, ast.TryStar)):
            if st.handlers:
                # no exception (body, then else) or one of the handlers: not decidable here, so
                # every way is followed and a raise in any of them is not certain
                frame.guards.append(("try/except", False))
                self._branch(frame, [st.body + st.orelse] + [h.body for h in st.handlers])
                frame.guards.pop()
            else:
                self.exec_body(st.body + st.orelse, frame)
            if not frame.stopped:
                self.exec_body(st.finalbody, frame)
        elif isinstance(st, ast.Match):
            self.eval(st.subject, frame)
            frame.guards.append(("match", False))
            bodies = [c.body for c in st.cases]
            if not any(isinstance(c.pattern, ast.MatchAs) and c.pattern.pattern is None and c.guard is None
                       for c in st.cases):
                bodies.append([])  # no catch-all case: nothing may match
            self._branch(frame, bodies)
            frame.guards.pop()
        elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            frame.locals[st.name] = LocalFunc(st)  # a nested function, called later by name
        elif isinstance(st, ast.Raise):
            self.refusals.append(Refusal(frame.module.rel, frame.qualname, st.lineno,
                                         frame.guard_mentions(self.param.refusal_words), unparse(st)[:160],
                                         certain=all(d for _, d in frame.guards)))
            frame.stopped = frame.raised = True
        elif isinstance(st, ast.Assert):
            t = truth(self.eval(st.test, frame))
            if t is None:
                self.assert_platforms(st.test, frame)
            if t is False:
                txt = unparse(st.test)
                about = any(w in txt for w in self.param.refusal_words)
                self.refusals.append(Refusal(frame.module.rel, frame.qualname, st.lineno,
                                             about, "assert " + txt[:150],
                                             certain=all(d for _, d in frame.guards)))
                # An assert about something else (routing_method_type) is a blocker and execution goes on; one a
                # stated path fact makes false (an ``assume`` predicate: TopK's format; the fused shared-expert
                # count, shared_fusion.FACT) raises whatever the parameter, of any kind: no branch Ling reaches
                frame.stopped = about or any((isinstance(n, ast.Call) and (
                    getattr(n.func, "attr", None) or getattr(n.func, "id", "")) + "()" in self.assume) or (
                    isinstance(n, ast.Attribute) and n.attr == FUSION_FACT and n.attr in self.assume)
                    for n in ast.walk(st.test))
                frame.raised |= frame.stopped and not about
        elif isinstance(st, ast.ImportFrom):
            pkg = frame.module.rel[:-3].replace("/", ".")
            frame.imports.update(_imports([st], pkg))
        # other statements (nested defs, classes, pass, del, global) do not move the value

    def assert_platforms(self, test: ast.expr, frame: Frame) -> None:
        """``assert f()`` on every branch Ling takes, ``f`` a function of the tree true on some
        platforms only (:func:`~nvfp4study.sglang.platforms.true_on`): the path runs on those
        only, so later platform predicates are decided there. Fp8MoEMethod.__init__ asserts
        ``cutlass_fp8_supported()`` for the cutlass backend (layers/quantization/fp8.py 1100-1103
        in 0.5.19), false off CUDA (fp8_utils.py 272-274): its XPU branch (fp8.py 2473) never runs."""
        if not isinstance(test, ast.Call) or not all(d for _, d in frame.guards):
            return
        target = self.resolve(test.func, frame)
        if target is None or target[2] is not None:
            return
        mod, fn, _ = target
        on = true_on(mod.tree, fn, self.platforms)
        if on and on != set(self.platforms):
            self.platforms = tuple(p for p in self.platforms if p in on)

    def assign(self, target: ast.expr, v: Any, frame: Frame) -> None:
        if isinstance(target, ast.Name):
            frame.locals[target.id] = v
        elif isinstance(target, ast.Attribute):
            self.attrs[target.attr] = v
            self.origin[target.attr] = (frame.module.rel, target.lineno, unparse(target))
        elif (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
              and isinstance(target.slice, ast.Constant) and isinstance(target.slice.value, str)
              and _dicts(frame.locals.get(target.value.id))):
            # extra["swiglu_limit"] = x on a local dict: a new dict (branches keep their own)
            key = target.slice.value
            new = [AbstractDict({**d.items, key: v}, {**d.nodes, key: target})
                   for d in _dicts(frame.locals[target.value.id])]
            frame.locals[target.value.id] = new[0] if len(new) == 1 else Multi(tuple(new))
        elif isinstance(target, (ast.Tuple, ast.List)):
            n = len(target.elts)
            if isinstance(v, tuple) and len(v) == n:
                parts = list(v)
            elif isinstance(v, Multi):
                parts = [Multi(tuple(o[i] if isinstance(o, tuple) and len(o) == n else UNK
                                     for o in v.options)) for i in range(n)]
            else:
                parts = [UNK] * n
            for t, p in zip(target.elts, parts, strict=False):
                self.assign(t, p, frame)

    # --- expressions --------------------------------------------------------------------------
