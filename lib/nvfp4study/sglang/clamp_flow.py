"""Where does ``gemm1_clamp_limit`` go? A small abstract interpreter over SGLang's Python AST.

The audit (:mod:`nvfp4study.sglang.audit`) names, for each MoE path, the functions the value
travels through (its *steps*). This module executes those functions symbolically for one model
configuration, Ling's: ``gemm1_clamp_limit`` set (a :class:`Limit`), ``gemm1_alpha``,
``gemm1_beta`` and ``swiglu_limit`` None, activation ``"silu"``, gated. It follows assignments,
``if``/``else`` and conditional expressions whose tests it can decide (so a use of the limit that
sits in the alpha-set branch is dead), dataclass payloads (``...QuantInfo(field=...)`` and later
``quant_info.field``), layer attributes set in one step and read in another, ``dict(...)`` passed
as ``**kwargs``, and helper functions it can resolve in the tree (same module or imported). It
records every call to a *sink* (a kernel entry named in the sink table), every ``raise`` it
reaches, and which mentions of ``gemm1_clamp_limit`` were live.

Values: :data:`UNK` (cannot tell), ``None``, Python constants, :class:`Limit` (the clamp value or
anything computed from it), :data:`CONFIG` (the ``MoeRunnerConfig``), :class:`Act` (a FlashInfer
``ActivationType`` member), tuples, :class:`DictV`, :class:`Multi` (one of several).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from .clamp_values import (
    _TENSOR_VIEWS,
    CLAMP_FIELDS,
    CONFIG,
    CONFIG_NAMES,
    LAYER_FACTS,
    LING_FACTS,
    UNK,
    Act,
    DictV,
    Frame,
    FuncRef,
    Limit,
    Module,
    Multi,
    Payload,
    Refusal,
    SinkHit,
    _imports,
    _parse,
    _relevant,
    has_limit,
    join,
    truth,
)


class Interp:
    """Executes a path's steps under Ling's facts; see the module docstring.

    Args:
        root: the tree root (folder holding ``sglang/``).
        sinks: sink names (callee simple names) to record.
        assume: attribute-name facts for this path (e.g. ``{"use_flashinfer_trtllm": False}``).
    """

    MAX_DEPTH = 4
    MAX_STEPS = 20000

    def __init__(self, root: Path, sinks: set[str], assume: dict | None = None):
        self.root = Path(root)
        self.sinks = set(sinks)
        self.assume = dict(assume or {})
        self.attrs: dict[str, Any] = {}
        self.origin: dict[str, tuple] = {}  # attr -> (file, line, how it was set)
        self.hits: list[SinkHit] = []
        self.refusals: list[Refusal] = []
        self.live: set[tuple[str, int]] = set()
        self.steps_done = 0
        self.entry_names: set[str] = set()
        self._mods: dict[str, Module] = {}

    # --- modules ------------------------------------------------------------------------------
    def module(self, rel: str) -> Module | None:
        if rel in self._mods:
            return self._mods[rel]
        path = self.root / rel
        if not path.is_file():
            return None
        tree = _parse(path)
        funcs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        classes = {n.name: {m.name: m for m in n.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
                   for n in tree.body if isinstance(n, ast.ClassDef)}
        pkg = rel[:-3].replace("/", ".")
        mod = Module(path, rel, tree, funcs, classes, _imports(tree.body, pkg))
        self._mods[rel] = mod
        return mod

    def module_for(self, dotted: str) -> Module | None:
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
        """Execute one step with unbound parameters. Returns False if the function is absent."""
        fn = self.find(rel, qualname)
        if fn is None:
            return False
        frame = Frame(self.module(rel), qualname.split(".")[0] if "." in qualname else None, qualname)
        self._bind(fn, frame, [], {}, method_call=False)
        self.exec_body(fn.body, frame)
        return True

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
        ann = {a.arg: ast.unparse(a.annotation) for a in fn.args.posonlyargs + fn.args.args
               + fn.args.kwonlyargs if a.annotation is not None}
        for i, p in enumerate(params):
            if i < len(args) and p not in [k.arg for k in fn.args.kwonlyargs]:
                frame.locals[p] = args[i]
            elif p in kwargs:
                frame.locals[p] = kwargs[p]
            elif p in CONFIG_NAMES:
                frame.locals[p] = CONFIG
            elif ann.get(p, "").strip("'\"") and f"<payload:{ann[p].strip(chr(39) + chr(34))}>" in self.attrs:
                frame.locals[p] = self.attrs[f"<payload:{ann[p].strip(chr(39) + chr(34))}>"]
            elif p in dmap and (args or kwargs) and isinstance(dmap[p], ast.Constant):
                frame.locals[p] = dmap[p].value
            else:
                frame.locals[p] = UNK

    def exec_body(self, body: list[ast.stmt], frame: Frame) -> None:
        for st in body:
            if frame.stopped:
                return
            self.exec_stmt(st, frame)

    def _branch(self, frame: Frame, bodies: list[list[ast.stmt]]) -> None:
        saved_attrs = self.attrs
        results = []
        for body in bodies:
            f2 = frame.fork()
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

    def exec_stmt(self, st: ast.stmt, frame: Frame) -> None:
        self.steps_done += 1
        if self.steps_done > self.MAX_STEPS:
            frame.stopped = True
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
            self.assign(st.target, Limit("derived") if has_limit(v) or has_limit(old) else UNK, frame)
        elif isinstance(st, ast.Expr):
            self.eval(st.value, frame)
        elif isinstance(st, ast.Return):
            frame.returns.append(self.eval(st.value, frame) if st.value is not None else None)
            frame.stopped = True
        elif isinstance(st, ast.If):
            t = truth(self.eval(st.test, frame))
            text = ast.unparse(st.test)
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
                self._branch(frame, [st.body, st.orelse])
                frame.guards.pop()
        elif isinstance(st, (ast.For, ast.AsyncFor, ast.While)):
            it = self.eval(st.iter, frame) if isinstance(st, (ast.For, ast.AsyncFor)) else UNK
            if isinstance(it, tuple) and len(it) <= 16:  # a literal tuple: unroll it
                for item in it:
                    self.assign(st.target, item, frame)
                    self.exec_body(st.body, frame)
                return
            if isinstance(st, (ast.For, ast.AsyncFor)):
                self.assign(st.target, UNK, frame)
            self._branch(frame, [st.body, []])
            frame.stopped = False
        elif isinstance(st, (ast.With, ast.AsyncWith)):
            self.exec_body(st.body, frame)
        elif isinstance(st, ast.Try):
            self.exec_body(st.body, frame)
            self.exec_body(st.finalbody, frame)
        elif isinstance(st, ast.Raise):
            self.refusals.append(Refusal(frame.module.rel, frame.qualname, st.lineno,
                                         frame.guard_mentions_clamp(), ast.unparse(st)[:160],
                                         certain=all(d for _, d in frame.guards)))
            frame.stopped = True
        elif isinstance(st, ast.Assert):
            t = truth(self.eval(st.test, frame))
            if t is False:
                txt = ast.unparse(st.test)
                self.refusals.append(Refusal(frame.module.rel, frame.qualname, st.lineno,
                                             "clamp" in txt, "assert " + txt[:150],
                                             certain=all(d for _, d in frame.guards)))
                # An assert about something else (e.g. routing_method_type) is recorded as a
                # blocker; execution goes on so the clamp's own fate is still audited.
                frame.stopped = "clamp" in txt
        elif isinstance(st, ast.ImportFrom):
            pkg = frame.module.rel[:-3].replace("/", ".")
            frame.imports.update(_imports([st], pkg))
        # other statements (nested defs, classes, pass, del, global) do not move the value

    def assign(self, target: ast.expr, v: Any, frame: Frame) -> None:
        if isinstance(target, ast.Name):
            frame.locals[target.id] = v
        elif isinstance(target, ast.Attribute):
            self.attrs[target.attr] = v
            self.origin[target.attr] = (frame.module.rel, target.lineno, ast.unparse(target))
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
    def attr_value(self, name: str, base: Any = UNK) -> Any:
        if name in self.assume:
            return self.assume[name]
        if isinstance(base, Act) and name == "value":
            return base
        if isinstance(base, DictV):
            return UNK
        if name in self.attrs:
            return self.attrs[name]
        if name in CONFIG_NAMES:
            return CONFIG
        if base is CONFIG and name in LING_FACTS:
            return LING_FACTS[name]
        if name in LAYER_FACTS:
            return LAYER_FACTS[name]
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
            return self.assume.get(node.id, UNK)
        if isinstance(node, ast.Attribute):
            if node.attr == "gemm1_clamp_limit":
                self.live.add((frame.module.rel, node.lineno))
            base_src = ast.unparse(node.value)
            if base_src.endswith("ActivationType"):
                return Act(node.attr)
            base = self.eval(node.value, frame)
            if isinstance(base, Payload):
                return base.get(node.attr)
            if isinstance(base, Multi) and all(isinstance(o, Payload) for o in base.options):
                out = base.options[0].get(node.attr)
                for o in base.options[1:]:
                    out = join(out, o.get(node.attr))
                return out
            if has_limit(base) and node.attr in _TENSOR_VIEWS:
                return base
            return self.attr_value(node.attr, base)
        if isinstance(node, ast.Call):
            return self.call(node, frame)
        if isinstance(node, ast.BoolOp):
            # Three-valued and/or: a decided operand wins even after an unknown one.
            vals = [self.eval(e, frame) for e in node.values]
            stop = False if isinstance(node.op, ast.And) else True
            unknown = False
            for v in vals:
                t = truth(v)
                if t is stop:
                    return v if not unknown or isinstance(node.op, ast.Or) else stop
                if t is None:
                    unknown = True
            return UNK if unknown else vals[-1]
        if isinstance(node, ast.UnaryOp):
            v = self.eval(node.operand, frame)
            if isinstance(node.op, ast.Not):
                t = truth(v)
                return UNK if t is None else (not t)
            return Limit("derived") if has_limit(v) else UNK
        if isinstance(node, ast.BinOp):
            a, b = self.eval(node.left, frame), self.eval(node.right, frame)
            if has_limit(a) or has_limit(b):
                return Limit(ast.unparse(node)[:60])
            return UNK
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
            return DictV(items)
        if isinstance(node, ast.Subscript):
            base = self.eval(node.value, frame)
            return Limit("indexed") if has_limit(base) else UNK
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
        if isinstance(op, (ast.Is, ast.IsNot)) and isinstance(node.comparators[0], ast.Constant) \
                and node.comparators[0].value is None:
            if isinstance(a, Multi):
                rs = {(o is None) for o in a.options if o is not UNK}
                if len(rs) != 1 or any(o is UNK for o in a.options):
                    return UNK
                r = rs.pop()
            elif a is UNK:
                return UNK
            else:
                r = a is None
            return r if isinstance(op, ast.Is) else (not r)
        known = (str, int, float, bool)
        if isinstance(op, (ast.Eq, ast.NotEq)) and isinstance(a, known) and isinstance(b, known):
            return (a == b) if isinstance(op, ast.Eq) else (a != b)
        if isinstance(op, (ast.In, ast.NotIn)) and isinstance(a, known) and isinstance(b, tuple) \
                and all(isinstance(x, known) for x in b):
            return (a in b) if isinstance(op, ast.In) else (a not in b)
        return UNK

    def call(self, node: ast.Call, frame: Frame) -> Any:
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        if isinstance(f, ast.Name) and f.id in frame.locals:
            ref = frame.locals[f.id]
            refs = ref.options if isinstance(ref, Multi) else (ref,)
            if refs and all(isinstance(r, FuncRef) for r in refs):
                name = refs[0].name
        args = [self.eval(a, frame) for a in node.args if not isinstance(a, ast.Starred)]
        kwargs, kw_nodes = {}, {}
        for k in node.keywords:
            v = self.eval(k.value, frame)
            if k.arg is None:
                if isinstance(v, DictV):
                    kwargs.update(v.items)
                    kw_nodes.update(v.nodes)
            else:
                kwargs[k.arg] = v
                kw_nodes[k.arg] = k.value
        if isinstance(f, ast.Attribute) and not isinstance(f.value, ast.Name | ast.Attribute):
            self.eval(f.value, frame)
        if name in self.assume and not node.args and not node.keywords:
            return self.assume[name]
        if name in self.sinks:
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
        if name == "getattr" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            attr = node.args[1].value
            if attr == "gemm1_clamp_limit":
                self.live.add((frame.module.rel, node.lineno))
            v = self.attr_value(attr, args[0] if args else UNK)
            return v if v is not UNK or len(args) < 3 else UNK
        if name in _TENSOR_VIEWS and isinstance(f, ast.Attribute) and has_limit(self.eval(f.value, frame)):
            return Limit(f"{ast.unparse(f.value)[:40]}.{name}()")
        if (name == "setattr" or "param" in name) and len(args) >= 3 and isinstance(args[1], str):
            # setattr(layer, "x", v), copy_or_rebind_param(layer, "x", v), replace_parameter(...)
            self.attrs[args[1]] = args[2]
            self.origin[args[1]] = (frame.module.rel, node.lineno, ast.unparse(node)[:60])
            return UNK
        if name in ("float", "int") and len(args) == 1:
            return args[0] if isinstance(args[0], Limit) or args[0] is None else UNK
        if name == "bool" and len(args) == 1:
            t = truth(args[0])
            return UNK if t is None else t
        if name == "dict" and not args:
            return DictV(dict(kwargs), dict(kw_nodes))
        if name == "ActivationType" and len(args) == 1:
            return args[0] if isinstance(args[0], Act) else UNK
        if name == "get" and isinstance(f, ast.Attribute) and args:
            base = self.eval(f.value, frame)
            if isinstance(base, DictV) and isinstance(args[0], (str, int)):
                return base.items.get(args[0], args[1] if len(args) > 1 else None)
            if isinstance(base, Multi) and isinstance(args[0], str):
                return Multi(tuple(o.items.get(args[0]) if isinstance(o, DictV) else UNK
                                   for o in base.options))
        if name.endswith("QuantInfo"):
            fields = {fld: (False if fld == "use_swiglu_step" else None) for fld in CLAMP_FIELDS}
            origin = {fld: (frame.module.rel, node.lineno, f"{name}() default") for fld in CLAMP_FIELDS}
            for k, v in kwargs.items():
                fields[k] = v
                kn = kw_nodes.get(k)
                literal = isinstance(kn, ast.Constant) and kn.value is None
                origin[k] = (frame.module.rel, getattr(kn, "lineno", node.lineno),
                             f"literal {k}=None" if literal else ast.unparse(kn)[:60] if kn else k)
            p = Payload(name, tuple(fields.items()), tuple(origin.items()))
            key = f"<payload:{name}>"
            self.attrs[key] = p
            return p
        target = self.resolve(f, frame)
        if target is not None and frame.depth < self.MAX_DEPTH:
            mod, fn, cls = target
            carries = any(has_limit(v) or v is CONFIG for v in args + list(kwargs.values()))
            if fn.name not in self.entry_names and (carries or _relevant(fn)):
                sub = Frame(mod, cls, f"{cls + '.' if cls else ''}{fn.name}", depth=frame.depth + 1)
                sub.guards = list(frame.guards)
                self._bind(fn, sub, args, kwargs, method_call=cls is not None)
                self.exec_body(fn.body, sub)
                out: Any = None
                for r in sub.returns:
                    out = r if out is None else join(out, r)
                return UNK if not sub.returns else out
        vals = args + list(kwargs.values())
        if any(has_limit(v) for v in vals):
            return Limit(f"{name}(...)")
        return UNK

    def resolve(self, f: ast.expr, frame: Frame):
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
            if frame.cls:
                fn = frame.module.classes.get(frame.cls, {}).get(f.attr)
                if fn is not None:
                    return frame.module, fn, frame.cls
            return None
        if not isinstance(f, ast.Name):
            return None
        name = f.id
        src = frame.imports.get(name) or (None if name in frame.module.functions
                                           else frame.module.imports.get(name))
        if src is None:
            fn = frame.module.functions.get(name)
            return (frame.module, fn, None) if fn is not None else None
        mod = self.module_for(src[0])
        if mod is None:
            return None
        fn = mod.functions.get(src[1])
        return (mod, fn, None) if fn is not None else None
