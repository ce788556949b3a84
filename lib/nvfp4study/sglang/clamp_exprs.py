"""Expression evaluation of the clamp interpreter (:class:`~nvfp4study.sglang.clamp_flow.Interp`).

:class:`ExprEval` is the half of the interpreter that gives an abstract value to an expression:
names, attributes (layer attributes set in an earlier step, :class:`Payload` fields, the
``MoeRunnerConfig`` facts of Ling), boolean and comparison operators (three-valued: a test it
cannot decide is :data:`UNK`), and calls: a *sink* call is recorded as a :class:`SinkHit`,
``...QuantInfo(...)`` builds a :class:`Payload`, ``setattr``-like helpers set layer attributes,
and a helper function it can resolve in the tree is executed (at most ``MAX_DEPTH`` deep).
Statements, branches and module loading are in :mod:`nvfp4study.sglang.clamp_flow`.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from . import platforms as pf
from .a2a_backend import A2A_GETTER, A2A_MODULE, a2a_instance
from .clamp_lookup import Lookup
from .clamp_values import (
    _TENSOR_VIEWS,
    CONFIG,
    CONFIG_NAMES,
    PARAMETER,
    UNK,
    AbstractDict,
    Act,
    Backend,
    ConfigWith,
    Filled,
    Frame,
    FuncRef,
    Instance,
    LocalFunc,
    Multi,
    Payload,
    SinkHit,
    Tracked,
    compare_values,
    derived,
    has_tracked,
    join,
    module_constant,
    relevant,
    truth,
    unparse,
)
from .code_index import constant_defaults, declared_names

#: words in a called name that mark a kernel the interpreter cannot enter (a compiled op)
_KERNEL_NAME_PARTS = ("moe", "expert", "kernel", "gemm")


class ExprEval(Lookup):
    """Expression half of the interpreter; mixed into :class:`~nvfp4study.sglang.clamp_flow.Interp`,
    which sets the state below and provides ``module_for``, ``_bind`` and ``exec_body``; names,
    methods and class attributes are looked up by :class:`~nvfp4study.sglang.clamp_lookup.Lookup`."""

    MAX_DEPTH = 4
    root: Path
    sinks: set[str]
    assume: dict[str, Any]
    attrs: dict[str, Any]
    origin: dict[str, tuple]
    hits: list[SinkHit]
    live: set[tuple[str, int]]
    entry_names: set[str]
    opaque: list[tuple[str, str, int]]  # (callee, file, line): the limit passed where it cannot follow
    runner_calls: list[tuple[str, int]]  # (file, line) of each live ``...runner.run(...)``
    runner_payloads: list[Any]  # the quant info each live ``runner.run(dispatch_output, quant_info)`` hands
    runner_builds: list[Any]  # the backend each live ``MoeRunner(backend, config)`` is built with (Backend, else unknown)
    runner_overrides: dict[str, Any]  # config fields a method replaced in the config its MoeRunner gets
    in_runner: bool  # running the runner's steps (fused func or core): they see runner_overrides
    in_pre_permute: bool  # running a runner's pre-permute (audit_run._run_pre_permute)
    platforms: tuple[str, ...]  # the device classes the path runs on (platforms.PLATFORMS)
    sink_from: dict[str, list[str]]  # sink -> the modules it comes from (the sink table's ``from``)
    param: Any  # the followed parameter (moe_params.ParamSpec): its mentions, facts, entry words
    a2a: str  # the path's --moe-a2a-backend (path_keys.a2a: "none" unless its key names one)
    _flags: dict[tuple[str, str], Any]

    def a2a_backend(self) -> Instance | None:
        """The path's global all-to-all backend (:func:`~nvfp4study.sglang.a2a_backend.a2a_instance`
        for :attr:`a2a`), read once; None where the tree has no ``MoeA2ABackend``."""
        key = (A2A_MODULE, f"<{self.a2a}>")  # beside the module flags, a key no name can take
        if key not in self._flags:
            mod = self.module(A2A_MODULE)
            self._flags[key] = a2a_instance(mod.tree if mod else None, self.a2a)
        return self._flags[key]

    def platform_value(self, name: str) -> bool | None:
        """A platform predicate's value (``is_npu``, ``is_sm100_supported``): the path's assumed
        fact ``name()`` first, else the value every platform of the path agrees on (None: not
        a predicate, or not decided)."""
        if f"{name}()" in self.assume:
            v = self.assume[f"{name}()"]
            return v if isinstance(v, bool) else None
        vals = {pf.predicate_value(name, p) for p in self.platforms}
        return vals.pop() if len(vals) == 1 else None

    def module_flag(self, mod: Any, name: str) -> Any:
        """A module-level platform flag (``_is_hip = is_hip()``) of ``mod``, or of the module it
        is imported from, under the path's platforms (:func:`~nvfp4study.sglang.platforms.flag`);
        UNK when ``name`` is no such flag or it is not decided."""
        key = (mod.rel, name)
        if key not in self._flags:
            self._flags[key] = UNK  # a cycle of imports reads as unknown
            v = pf.flag(mod.tree, name, self.platform_value, env_of=self.env_value)
            if v is None:
                v = module_constant(mod.tree, name)
            src = mod.imports.get(name)
            if v is None and src is not None:
                other = self.module_for(src[0])
                v = None if other is None else self.module_flag(other, src[1])
            self._flags[key] = UNK if v is None else v
        return self._flags[key]

    def attr_value(self, name: str, base: Any = UNK) -> Any:
        if name in self.assume:
            return self.assume[name]
        if isinstance(base, ConfigWith):
            if name in dict(base.overrides):
                return dict(base.overrides)[name]
            base = CONFIG
        if base is CONFIG and self.in_runner and name in self.runner_overrides:
            return self.runner_overrides[name]
        if isinstance(base, Act) and name == "value":
            return base
        if isinstance(base, AbstractDict):
            return UNK
        if name in self.attrs:
            return self.attrs[name]
        if name in CONFIG_NAMES or name in self.param.config_names:
            return CONFIG
        if base is CONFIG and name in self.param.facts:
            return self.param.facts[name]
        if name in self.param.layer_facts:
            return self.param.layer_facts[name]
        return UNK

    def eval(self, node: ast.expr | None, frame: Frame) -> Any:  # noqa: C901 - one dispatch
        if node is None:
            return None
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in frame.locals:
                return frame.locals[node.id]
            if node.id in self.sinks:
                return FuncRef(node.id)
            if node.id in self.assume:
                return self.assume[node.id]
            return self.module_flag(frame.module, node.id)
        if isinstance(node, ast.Attribute):
            if node.attr in self.param.mentions:
                self.live.add((frame.module.rel, node.lineno))
            base_src = unparse(node.value)
            if base_src.endswith("ActivationType"):
                return Act(node.attr)
            if base_src.endswith("MoeRunnerBackend") and node.attr.isupper():
                return Backend(node.attr)
            prop = self.property_value(node, frame)
            if prop is not None:
                return prop
            if self.none_attribute(node.value, frame):
                return UNK
            base = self.eval(node.value, frame)
            if isinstance(base, (Payload, Instance)):
                return base.get(node.attr)
            if isinstance(base, Multi) and all(isinstance(o, Payload) for o in base.options):
                out = base.options[0].get(node.attr)
                for o in base.options[1:]:
                    out = join(out, o.get(node.attr))
                return out
            if has_tracked(base) and node.attr in _TENSOR_VIEWS:
                return base
            return self.attr_value(node.attr, base)
        if isinstance(node, ast.Call):
            return self.call(node, frame)
        if isinstance(node, ast.BoolOp):
            # Three-valued and/or: a decided operand wins even after an unknown one; the
            # operands after a decided one are not evaluated (Python short-circuits: in
            # ``getattr(self, "runner", None) is not None and self.runner.x`` the second never runs)
            stop = False if isinstance(node.op, ast.And) else True
            unknown = False
            v = None
            for e in node.values:
                v = self.eval(e, frame)
                t = truth(v)
                if t is stop:
                    return v if not unknown or isinstance(node.op, ast.Or) else stop
                if t is None:
                    unknown = True
            return UNK if unknown else v
        if isinstance(node, ast.UnaryOp):
            v = self.eval(node.operand, frame)
            if isinstance(node.op, ast.Not):
                t = truth(v)
                return UNK if t is None else (not t)
            return derived("derived", v)
        if isinstance(node, ast.BinOp):
            a, b = self.eval(node.left, frame), self.eval(node.right, frame)
            return derived(unparse(node)[:60], a, b)
        if isinstance(node, ast.Compare):
            return self.compare(node, frame)
        if isinstance(node, ast.IfExp):
            t = truth(self.eval(node.test, frame))
            if t is True:
                return self.eval(node.body, frame)
            if t is False:
                return self.eval(node.orelse, frame)
            return join(self.eval(node.body, frame), self.eval(node.orelse, frame))
        if isinstance(node, (ast.Tuple, ast.List)):
            return tuple(self.eval(e, frame) for e in node.elts)
        if isinstance(node, ast.Dict):
            items = {}
            for k, v in zip(node.keys, node.values, strict=False):
                if isinstance(k, ast.Constant):
                    items[k.value] = self.eval(v, frame)
            return AbstractDict(items)
        if isinstance(node, ast.Subscript):  # an object its class registers itself in (Lookup.registry_item)
            return self.registry_item(node, frame) or derived("indexed", self.eval(node.value, frame))
        if isinstance(node, ast.JoinedStr):
            parts = []
            for v in node.values:
                x = self.eval(v.value if isinstance(v, ast.FormattedValue) else v, frame)
                if not isinstance(x, str):
                    return UNK
                parts.append(x)
            return "".join(parts)
        if isinstance(node, ast.NamedExpr):
            v = self.eval(node.value, frame)
            self.assign(node.target, v, frame)
            return v
        for child in ast.iter_child_nodes(node):  # e.g. f-strings: walk for live mentions only
            if isinstance(child, ast.expr):
                self.eval(child, frame)
        return UNK

    def compare(self, node: ast.Compare, frame: Frame) -> Any:
        if len(node.ops) != 1:
            return UNK
        a = self.eval(node.left, frame)
        b = self.eval(node.comparators[0], frame)
        op = node.ops[0]
        return compare_values(a, op, b, node.comparators[0])

    def call(self, node: ast.Call, frame: Frame) -> Any:
        f = node.func
        if self.unbound_call(node, frame):  # NameError: its name is imported only where false
            return UNK
        if isinstance(f, ast.Name):  # what the path calls by name (param_runner.e8m0_scales reads them)
            self.named_calls.append((frame.module, frame.imports, f))
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        bound = None
        if isinstance(f, ast.Call):  # functools.partial(sink, ...)(...) called at once
            ref = self.eval(f, frame)
            if isinstance(ref, FuncRef):
                name, bound = ref.name, ref
        if isinstance(f, ast.Name) and f.id in frame.locals:
            ref = frame.locals[f.id]
            refs = ref.options if isinstance(ref, Multi) else (ref,)
            if refs and all(isinstance(r, FuncRef) for r in refs):
                name = refs[0].name
                bound = refs[0]
        args = [self.eval(a, frame) for a in node.args if not isinstance(a, ast.Starred)]
        kwargs, kw_nodes = {}, {}
        if bound is not None:  # what a partial bound comes first; the call's own arguments after
            args = list(bound.args) + args
            kwargs, kw_nodes = dict(bound.kwargs), dict(bound.nodes)
        for k in node.keywords:
            v = self.eval(k.value, frame)
            if k.arg is None:
                if isinstance(v, AbstractDict):
                    kwargs.update(v.items)
                    kw_nodes.update(v.nodes)
                elif isinstance(v, Multi) and all(isinstance(o, AbstractDict) for o in v.options):
                    # **extra, a dict that differs by branch: each key one of its branches' values
                    # (None where a branch lacks it: the keyword is then not passed)
                    for key in dict.fromkeys(x for o in v.options for x in o.items):
                        vals = [o.items.get(key) for o in v.options]
                        joined = vals[0]
                        for x in vals[1:]:
                            joined = join(joined, x)
                        kwargs[key] = joined
                        node_of = next((o.nodes[key] for o in v.options if key in o.nodes), None)
                        if node_of is not None:
                            kw_nodes[key] = node_of
            else:
                kwargs[k.arg] = v
                kw_nodes[k.arg] = k.value
        recv = None  # the receiver of a method call, where known without evaluating it twice
        if isinstance(f, ast.Attribute) and not isinstance(f.value, ast.Name | ast.Attribute):
            recv = self.eval(f.value, frame)
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            recv = frame.locals.get(f.value.id)
        n = f.value if isinstance(f, ast.Attribute) else None
        while isinstance(n, ast.Attribute):  # self.runner.runner_backend.is_x() with self.runner None
            if self.none_attribute(n, frame):
                return UNK
            n = n.value
        if isinstance(f, ast.Attribute) and f.attr == "run" and unparse(f.value).endswith("runner"):
            # self.runner.run(...): MoeRunner.run (after the None check: a None runner raises first)
            self.runner_calls.append((frame.module.rel, node.lineno))
            qi = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "quant_info"), None)
            self.runner_payloads.append(self.eval(qi, frame) if qi is not None else UNK)
        if name == A2A_GETTER and not node.args and (a2a := self.a2a_backend()) is not None:
            return a2a  # the path's --moe-a2a-backend (none unless its key names one): its predicates decided
        if recv is CONFIG and name in self.param.config_methods:
            # a method of the config object that returns one of its fields (moe_params.yaml config_methods)
            return self.attr_value(self.param.config_methods[name], CONFIG)
        if name in self.assume and not node.args and not node.keywords:
            return self.assume[name]
        if f"{name}()" in self.assume:  # a call fact, whatever the arguments (use_intel_amx_backend(layer))
            return self.assume[f"{name}()"]
        if isinstance(recv, Instance) and not node.args and not node.keywords and recv.has(f"{name}()"):
            return recv.get(f"{name}()")  # a known object's predicate (a runner backend's is_marlin())
        if (pv := self.platform_value(name) if pf.is_predicate(name) else self.env_value(node)) is not None:
            return pv  # is_npu(), is_sm100_supported(): the path's platforms; an environment read: its default
        if name in self.sinks and self.sink_source_ok(f, name, frame):
            origins = {}
            for k, kn in kw_nodes.items():
                if isinstance(kn, ast.Attribute):
                    base = self.eval(kn.value, frame)
                    for b in base.options if isinstance(base, Multi) else (base,):
                        if isinstance(b, Payload) and b.where(kn.attr):
                            origins[k] = b.where(kn.attr)
            self.hits.append(SinkHit(name, frame.module.rel, frame.qualname, node.lineno,
                                     kwargs, args, kw_nodes, origins))
            return UNK
        if (filled := self.filled(f, node, args)) is not None:
            return filled
        if name == "partial" and args and (isinstance(args[0], FuncRef) or (
                isinstance(node.args[0], ast.Name) and node.args[0].id in self.sinks)):
            # functools.partial(sink, swiglu_limit=x): the bound arguments travel with the function
            fname = args[0].name if isinstance(args[0], FuncRef) else node.args[0].id
            return FuncRef(fname, tuple(args[1:]), tuple(kwargs.items()), tuple(kw_nodes.items()))
        if name == "isinstance" and len(args) == 2:
            return self.isinstance_value(args[0], node.args[1], frame)
        if name == "getattr" and len(args) >= 3 and isinstance(args[1], str) and self.layer_lacks(node.args[0], args[1]):
            return args[2]  # getattr(layer, "x", None) of a weight the layer was never given
        if name == "getattr" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            attr = node.args[1].value
            if attr in self.param.mentions:
                self.live.add((frame.module.rel, node.lineno))
            if args and isinstance(args[0], Instance):  # a known object: its attribute or the default
                return args[0].get(attr) if args[0].has(attr) else args[2] if len(args) >= 3 else UNK
            if isinstance(node.args[0], ast.Name) and node.args[0].id == "self" and frame.cls \
                    and attr not in self.attrs and attr not in self.assume \
                    and self.class_none(frame.module, frame.cls, attr, 4) is not None:
                return None  # getattr(self, "runner", None): the class default, nothing set it
            v = self.attr_value(attr, args[0] if args else UNK)
            return v if v is not UNK or len(args) < 3 else UNK
        if name in _TENSOR_VIEWS and isinstance(f, ast.Attribute) and has_tracked(base := self.eval(f.value, frame)):
            return derived(f"{unparse(f.value)[:40]}.{name}()", base)
        if name in ("register_parameter", "register_buffer") and isinstance(f, ast.Attribute) and len(args) == 2:
            args = [UNK, *args]  # layer.register_parameter("x", v) (create_weights) sets layer.x as setattr does
        if (name == "setattr" or "param" in name or name == "register_buffer") and len(args) >= 3 \
                and isinstance(args[1], str):
            # setattr(layer, "x", v), copy_or_rebind_param(layer, "x", v), replace_parameter(...)
            self.attrs[args[1]] = args[2]
            self.origin[args[1]] = (frame.module.rel, node.lineno, unparse(node)[:60])
            return UNK
        if name in ("float", "int") and len(args) == 1:
            # an enum member the parameter's name facts give (int(RoutingMethodType.DeepSeekV3)) stays itself
            member = isinstance(args[0], str) and self.param.assume.get(args[0]) == args[0]
            return args[0] if isinstance(args[0], Tracked) or args[0] is None or member else UNK
        if name == "bool" and len(args) == 1:
            t = truth(args[0])
            return UNK if t is None else t
        if name == "dict" and not args:
            return AbstractDict(dict(kwargs), dict(kw_nodes))
        if name == "replace" and args and (args[0] is CONFIG or isinstance(args[0], ConfigWith)):
            # dataclasses.replace(moe_runner_config, activation="swiglu")
            old = dict(args[0].overrides) if isinstance(args[0], ConfigWith) else {}
            return ConfigWith(tuple({**old, **kwargs}.items()))
        if name == "MoeRunner":
            self.runner_builds.append(args[0] if args else kwargs.get("runner_backend", UNK))
            # the config the runner is built with: its replaced fields hold in the runner's steps
            for v in [*args, *kwargs.values()]:
                if isinstance(v, ConfigWith):
                    self.runner_overrides.update(dict(v.overrides))
        if name == "getattr" and len(node.args) >= 2 and unparse(node.args[0]).endswith("ActivationType") \
                and isinstance(args[1], str):
            return Act(args[1])
        if name == "ActivationType" and len(args) == 1:
            return args[0] if isinstance(args[0], Act) else UNK
        if name in ("get", "pop") and isinstance(f, ast.Attribute) and args:
            base = self.eval(f.value, frame)
            default = args[1] if len(args) > 1 else None
            if isinstance(base, AbstractDict) and isinstance(args[0], (str, int)):
                return base.items.get(args[0], default)
            if isinstance(base, Multi) and isinstance(args[0], str):
                return Multi(tuple(o.items.get(args[0], default) if isinstance(o, AbstractDict) else UNK
                                   for o in base.options))
        if name.endswith(("QuantInfo", "RunnerInput")):  # the two dataclass families a runner takes (moe_runner/base.py)
            # the dataclass's own constant defaults first (use_mxfp8: bool = False), then the
            # defaulted fields of the data (moe_params.yaml shared.quant_info_defaults), then what
            # the call passes
            defaults = self.param.quant_info_defaults
            src = frame.imports.get(name) or frame.module.imports.get(name)
            mod, cname = (self.module_for(src[0]), src[1]) if src else (frame.module, name)
            fields = {**constant_defaults(mod, cname), **defaults}
            origin = {fld: (frame.module.rel, node.lineno, f"{name}() default") for fld in defaults}
            for k, v in kwargs.items():
                fields[k] = v
                kn = kw_nodes.get(k)
                literal = isinstance(kn, ast.Constant) and kn.value is None
                origin[k] = (frame.module.rel, getattr(kn, "lineno", node.lineno),
                             f"literal {k}=None" if literal else unparse(kn)[:60] if kn else k)
            p = Payload(name, tuple(fields.items()), tuple(origin.items()), declared_names(mod, cname, self.module_for))
            key = f"<payload:{name}>"
            self.attrs[key] = p
            return p
        if isinstance(f, ast.Name) and isinstance(frame.locals.get(f.id), LocalFunc) and frame.depth < self.MAX_DEPTH:
            # a closure: it sees the enclosing frame's names
            return self.invoke(frame.module, frame.locals[f.id].node, frame.cls, args, kwargs, frame, closure=True)
        sup = self.super_method(f, frame)
        if sup is not None and frame.depth < self.MAX_DEPTH:
            # super().__init__(...): the base's code runs on the same object (it sets its flags)
            return self.invoke(*sup, args, kwargs, frame)
        target = self.resolve(f, frame)
        if target is not None and frame.depth < self.MAX_DEPTH:
            mod, fn, cls = target
            carries = any(has_tracked(v) or v is CONFIG for v in args + list(kwargs.values()))
            if fn.name not in self.entry_names and (carries or relevant(fn, self.param.enter_when)):
                return self.invoke(mod, fn, cls, args, kwargs, frame)
        vals = args + list(kwargs.values())
        if any(has_tracked(v) for v in vals):
            text = unparse(f)
            # a call the interpreter cannot enter that looks like a kernel (a compiled op)
            if target is None and (text.startswith("torch.ops.") or any(k in name.lower() for k in _KERNEL_NAME_PARTS)):
                self.opaque.append((name, frame.module.rel, node.lineno))
            return derived(f"{name}(...)", *vals)
        if target is None and isinstance(f, ast.Name) and (cdef := self.class_def(f.id, frame.module, frame.imports)):
            return self.built(*cdef)  # an object of an in-tree class: its class decides isinstance tests
        return UNK

    @staticmethod
    def filled(f: ast.expr, node: ast.Call, args: list) -> Any:
        """``torch.full(shape, <number>)`` / ``torch.ones`` / ``torch.zeros`` (``Filled``),
        ``Parameter(<Filled>)`` (the same constant), ``Parameter(<other untracked>)`` (:data:`PARAMETER`);
        None for any other call."""
        text = unparse(f)
        if text in ("torch.ones", "torch.zeros"):
            return Filled(1.0 if text == "torch.ones" else 0.0)
        if text == "torch.full":
            fill = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords
                                                                  if k.arg == "fill_value"), None)
            if isinstance(fill, ast.Constant) and isinstance(fill.value, int | float) and not isinstance(fill.value, bool):
                return Filled(float(fill.value))
        if text.split(".")[-1] == "Parameter" and args:
            # of anything else an object, never None (Mxfp4MoEMethod's triton-kernels branch sets
            # layer.w13_weight_bias so, and apply reads it with getattr(..., None): mxfp4.py 1027-1034, 1717 in 0.5.21)
            return args[0] if isinstance(args[0], Filled) else None if has_tracked(args[0]) else PARAMETER
        return None

    def invoke(self, mod, fn: ast.FunctionDef, cls: str | None, args: list, kwargs: dict, frame: Frame,
               closure: bool = False) -> Any:
        """Run ``fn`` one level deeper than ``frame``; the join of what it returns (UNK if nothing).
        ``closure``: ``fn`` is defined inside ``frame``'s function and sees its names."""
        if closure:
            sub = Frame(mod, cls, f"{frame.qualname}.{fn.name}", depth=frame.depth + 1)
            sub.locals, sub.imports = dict(frame.locals), dict(frame.imports)
        else:
            sub = Frame(mod, cls, f"{cls + '.' if cls else ''}{fn.name}", depth=frame.depth + 1)
        sub.guards = list(frame.guards)
        self._bind(fn, sub, args, kwargs, method_call=cls is not None and not closure)
        self.exec_body(fn.body, sub)
        if sub.raises_always():  # the helper raises on every branch: the caller never goes on
            frame.stopped = frame.raised = True
        out: Any = sub.returns[0] if sub.returns else UNK  # a returned None is a value (not "nothing yet")
        for r in sub.returns[1:]:
            out = join(out, r)
        return out

    def sink_source_ok(self, f: ast.expr, name: str, frame: Frame) -> bool:
        """Whether a call ``name(...)`` is the sink of that name: a sink whose table entry says
        where it comes from (``from``: module prefixes) is that sink only when the name is
        defined in, or imported from, such a module (``from sgl_kernel import fused_experts`` on
        XPU is not SGLang's Triton ``fused_experts``). A name whose source cannot be told (an
        attribute call, a local) keeps its sink."""
        prefixes = self.sink_from.get(name)
        if not prefixes or not isinstance(f, ast.Name) or f.id in frame.locals:
            return True
        src = frame.imports.get(name) or (None if name in frame.module.functions else frame.module.imports.get(name))
        where = src[0] if src else frame.module.rel[:-3].replace("/", ".") if name in frame.module.functions else None
        return where is None or any(where == p or where.startswith(p + ".") for p in prefixes)
