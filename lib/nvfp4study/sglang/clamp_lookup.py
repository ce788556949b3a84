"""Name and attribute look-up of the clamp interpreter (:class:`~nvfp4study.sglang.clamp_flow.Interp`).

:class:`Lookup` finds what a name or attribute of the code being interpreted stands for: the
function a call resolves to in the tree (same module, imported, or a method of ``self``'s
class), the base-class method ``super().name`` calls, an attribute a class declares ``None`` at
class level (``runner: MoeRunner | None = None``, FusedMoEMethodBase) whose use raises, and a
``@property``'s value, and the class an object is an instance of (``isinstance``, and what an
undecided ``if isinstance(x, C)`` leaves ``x`` on each side). Mixed into :class:`~nvfp4study.sglang.clamp_exprs.ExprEval`.
"""

from __future__ import annotations

import ast
from typing import Any

from . import moe_params
from .clamp_values import UNK, Built, Frame, Instance, Multi, Payload, Refusal, truth, unparse
from .code_index import always_evaluated
from .import_gates import ENVIRON, conditional_imports, env_default_in, env_read
from .layer_attrs import create_weights_only


class Lookup:
    """Look-ups over the parsed tree; the interpreter provides ``module_for``, ``invoke``, the
    state read here (``attrs``, ``assume``, ``refusals``) and ``MAX_DEPTH``."""

    MAX_DEPTH: int
    attrs: dict[str, Any]
    assume: dict[str, Any]
    refusals: list[Refusal]
    root: Any
    in_runner: bool
    layer_closed: bool
    _flags: dict[tuple[str, str], Any]

    def isinstance_value(self, obj: Any, cls_node: ast.expr, frame: Frame) -> Any:
        """``isinstance(obj, cls_node)``: decided where every option of ``obj`` is an object of a
        known class (a payload, a handed :class:`Instance`, a :class:`Built` object; a tuple of
        class names for the last); else UNK."""
        objs = obj.options if isinstance(obj, Multi) else (obj,)
        elts = cls_node.elts if isinstance(cls_node, ast.Tuple) else [cls_node]
        if not objs or not all(isinstance(e, ast.Name) for e in elts):
            return UNK
        names = tuple(e.id for e in elts)
        hits = set()
        for o in objs:
            if isinstance(o, Built):
                in_tree = all(self.class_def(n, frame.module, frame.imports) is not None for n in names)
                hits.add(o.isa(names, in_tree))
            elif isinstance(o, (Payload, Instance)) and len(names) == 1:
                hits.add(o.isa(names[0]) if isinstance(o, Instance) else o.cls == names[0])
            else:
                return UNK
        return hits.pop() if len(hits) == 1 and None not in hits else UNK

    def narrowed(self, test: ast.expr, frame: Frame) -> tuple[dict, dict] | None:
        """``({name: value on the true branch}, {name: value on the false branch})`` of an
        undecided ``if isinstance(name, C):`` whose local ``name`` is one of several objects of
        known classes (a :class:`Multi`): each branch keeps the options that can take it. The
        runner's fused func gets the quant info every ``runner.run`` of the method hands (the
        NPU branch's ``AscendQuantInfo`` beside the ``FlashInferTrtllmFp8MoeQuantInfo``, fp8.py
        2886 and 3095-3138 in 0.5.21), and its ``isinstance(quant_info, FlashInferTrtllmFp8MoeQuantInfo)``
        body reads only the latter's fields (moe_runner/flashinfer_trtllm.py 1664-1670). None otherwise."""
        if not (isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "isinstance"
                and len(test.args) == 2 and isinstance(test.args[0], ast.Name)):
            return None
        name = test.args[0].id
        v = frame.locals.get(name)
        if not isinstance(v, Multi):
            return None
        sides: tuple[list, list] = ([], [])
        for o in v.options:
            t = self.isinstance_value(o, test.args[1], frame)
            if t is not False:
                sides[0].append(o)
            if t is not True:
                sides[1].append(o)
        if not sides[0] or not sides[1] or len(sides[0]) == len(sides[1]) == len(v.options):
            return None
        return tuple({name: opts[0] if len(opts) == 1 else Multi(tuple(opts))} for opts in sides)

    def layer_lacks(self, base: ast.expr, attr: str) -> bool:
        """Whether ``<base>.<attr>`` names a weight the FusedMoE layer was never given: ``base`` is
        the method's ``layer`` (outside the runner's steps), the path's ``create_weights`` ran and
        is closed (:attr:`layer_closed`, :func:`~nvfp4study.sglang.layer_attrs.closed_create_weights`),
        nothing the path ran set ``attr``, and the tree gives it only in a ``create_weights``
        (:func:`~nvfp4study.sglang.layer_attrs.create_weights_only`)."""
        return (self.layer_closed and not self.in_runner and isinstance(base, ast.Name) and base.id == "layer"
                and attr not in self.attrs and attr not in self.assume and create_weights_only(self.root, attr))

    def unregistered_read(self, st: ast.stmt, frame: Frame) -> str | None:
        """``layer.X`` read by an ``assert`` or ``if`` test, a ``return``, an assignment's value or
        an expression statement (not as a called method) where the layer lacks ``X``
        (:meth:`layer_lacks`): the read raises AttributeError. None when there is none."""
        if isinstance(st, (ast.Assert, ast.If)):
            top = st.test
        elif isinstance(st, (ast.Return, ast.Assign, ast.Expr)) and st.value is not None:
            top = st.value
        else:
            return None
        if not self.layer_closed or "layer" not in unparse(top):
            return None
        nodes = always_evaluated(top)
        called = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
        for n in sorted((n for n in nodes if isinstance(n, ast.Attribute)), key=lambda n: (n.lineno, n.col_offset)):
            if isinstance(n.ctx, ast.Load) and id(n) not in called and self.layer_lacks(n.value, n.attr):
                return (f"layer.{n.attr} (line {n.lineno}; the path's create_weights never registers it, "
                        "nor does any step it runs)")
        return None

    def env_value(self, node: ast.Call) -> bool | None:
        """An environment read's value in the default environment (:func:`~nvfp4study.sglang.
        import_gates.env_read`: ``_use_aiter = envs.SGLANG_USE_AITER.get() and _is_hip`` is False),
        when ``moe_params.yaml`` ``shared.env_flags`` is ``default``; None otherwise (left open)."""
        if moe_params.shared().get("env_flags") != "default":
            return None

        def default_of(flag: str) -> bool | None:
            key = (ENVIRON, f"<env:{flag}>")  # beside the module flags, a key no name can take
            if key not in self._flags:
                mod = self.module(ENVIRON)
                self._flags[key] = env_default_in(mod.tree if mod is not None else None, flag)
            return self._flags[key]

        return env_read(node, default_of)

    def unbound_call(self, node: ast.Call, frame: Frame) -> bool:
        """A call through a name (``f(...)``, ``f.g(...)``) that ``frame``'s module binds only by
        imports under module-level ``if``s (:func:`~nvfp4study.sglang.import_gates.conditional_imports`)
        each of which the path's facts make false (the default environment: ``_use_aiter =
        get_bool_env_var("SGLANG_USE_AITER") and _is_hip`` is False, :meth:`env_value`; the path's
        platforms): the name is unbound and the call raises NameError. Records the raise (a
        :class:`Refusal` not about the parameter, naming the import's and the call's lines) and
        stops the frame; False otherwise (a local binding, a test not decided, a true one)."""
        root = node.func
        while isinstance(root, ast.Attribute):
            root = root.value
        if not isinstance(root, ast.Name) or root.id in frame.locals or root.id in frame.imports:
            return False
        gated = conditional_imports(frame.module.tree).get(root.id)
        if not gated:
            return False
        top = Frame(frame.module, None, "<module>")
        for _line, conds in gated:  # each import is skipped: one of its tests has the other truth
            if not any(truth(self.eval(test, top)) is (not want) for test, want in conds):
                return False
        line, conds = gated[0]
        test = next(unparse(t) if want else f"not ({unparse(t)})" for t, want in conds
                    if truth(self.eval(t, top)) is (not want))
        self.refusals.append(Refusal(frame.module.rel, frame.qualname, node.lineno, False,
                                     f"NameError: {root.id} is bound only by the import at "
                                     f"{frame.module.rel[11:]}:{line}, under `if {test[:60]}`, false here (default "
                                     f"environment, the path's platforms); called at {frame.module.rel[11:]}:{node.lineno}",
                                     certain=all(d for _, d in frame.guards)))
        frame.stopped = frame.raised = True
        return True

    def none_attribute(self, node: ast.expr, frame: Frame) -> bool:
        """``self.x.y`` where nothing on this path set ``self.x`` and the class (or an in-tree
        base) declares ``x = None`` at class level (``runner: MoeRunner | None = None``,
        FusedMoEMethodBase, base_config.py): reading ``.y`` raises AttributeError. Records the
        raise (a :class:`Refusal` not about the clamp) and stops the frame; False otherwise."""
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                and frame.cls) or node.attr in self.attrs or node.attr in self.assume:
            return False
        where = self.class_none(frame.module, frame.cls, node.attr, 4)
        if where is None:
            return False
        self.refusals.append(Refusal(frame.module.rel, frame.qualname, node.lineno, False,
                                     f"AttributeError: self.{node.attr} is None here (class default "
                                     f"{where[0][11:]}:{where[1]}): {unparse(node)[:80]}",
                                     certain=all(d for _, d in frame.guards)))
        frame.stopped = frame.raised = True
        return True

    def super_method(self, f: ast.expr, frame: Frame) -> tuple[Any, ast.FunctionDef, str] | None:
        """``(module, function, class)`` that ``super().name`` in a method of ``frame``'s class
        calls: the first in-tree base (depth first, as far as four levels) defining ``name``;
        None for any other callee or a base outside the tree."""
        if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Call) and isinstance(f.value.func, ast.Name)
                and f.value.func.id == "super" and frame.cls):
            return None
        return self._base_method(frame.module, frame.cls, f.attr, 4)

    def _base_method(self, mod: Any, cls: str, name: str, depth: int) -> tuple[Any, ast.FunctionDef, str] | None:
        """The first base of ``cls`` (in ``mod``), depth first, whose own body defines ``name``."""
        if depth == 0:
            return None
        for bmod, bcls in self._bases(mod, cls):
            fn = bmod.classes.get(bcls, {}).get(name)
            if fn is not None:
                return bmod, fn, bcls
            hit = self._base_method(bmod, bcls, name, depth - 1)
            if hit is not None:
                return hit
        return None

    def class_none(self, mod: Any, cls: str, attr: str, depth: int) -> tuple[str, int] | None:
        """(file, line) where class ``cls`` of ``mod`` or an in-tree base declares ``attr = None``
        at class level; None when it is not declared so (or is a method or a property)."""
        node = next((n for n in mod.tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        if node is None or depth == 0:
            return None
        for st in node.body:
            target = st.target if isinstance(st, ast.AnnAssign) else st.targets[0] if isinstance(st, ast.Assign) \
                and len(st.targets) == 1 else None
            if isinstance(target, ast.Name) and target.id == attr:
                v = st.value
                return (mod.rel, st.lineno) if isinstance(v, ast.Constant) and v.value is None else None
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)) and st.name == attr:
                return None
        for bmod, bcls in self._bases(mod, cls):
            hit = self.class_none(bmod, bcls, attr, depth - 1)
            if hit is not None:
                return hit
        return None

    def _bases(self, mod: Any, cls: str) -> list[tuple[Any, str]]:
        """``(module, class name)`` of each base of class ``cls`` of ``mod`` named by a plain name
        and found in the tree (imported or defined in ``mod``), in order."""
        node = next((n for n in mod.tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        out = []
        for b in node.bases if node is not None else ():
            if isinstance(b, ast.Name):
                src = mod.imports.get(b.id)
                bmod = self.module_for(src[0]) if src else mod
                if bmod is not None:
                    out.append((bmod, src[1] if src else b.id))
        return out

    def class_def(self, name: str, mod: Any, imports: dict | None = None, depth: int = 3) -> tuple[Any, ast.ClassDef] | None:
        """``(module, ClassDef)`` of the in-tree class ``name`` as ``mod`` sees it (``imports``: a
        frame's own imports, first), following re-exports up to ``depth`` modules; None when it is
        no in-tree class (a function, an outside class, a name not found)."""
        src = (imports or {}).get(name) or mod.imports.get(name)
        if src is None:
            node = next((n for n in mod.tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
            return (mod, node) if node is not None else None
        other = self.module_for(src[0])
        if other is None or depth == 0:
            return None
        return self.class_def(src[1], other, None, depth - 1)

    def built(self, mod: Any, node: ast.ClassDef, depth: int = 6) -> Built:
        """The :class:`~nvfp4study.sglang.clamp_values.Built` value of an object of class ``node``
        (of ``mod``): its ancestors' names, complete when each base is an in-tree class (followed)
        or is imported from outside ``sglang``."""
        kinds: list[str] = []
        complete = depth > 0
        for b in node.bases if depth > 0 else ():
            name = b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else None
            if name is None:
                complete = False
                continue
            kinds.append(name)
            hit = self.class_def(name, mod) if isinstance(b, ast.Name) else None
            if hit is not None:
                sub = self.built(hit[0], hit[1], depth - 1)
                kinds += list(sub.kinds)
                complete = complete and sub.complete
            else:
                src = mod.imports.get(name) if isinstance(b, ast.Name) else None
                local = src is None and isinstance(b, ast.Name) and name in ("object", "ABC")
                complete = complete and (local or (src is not None and not src[0].startswith("sglang")))
        return Built(node.name, tuple(dict.fromkeys(kinds)), complete)

    def property_value(self, node: ast.Attribute, frame: Frame) -> Any:
        """``self.x`` where the class defines ``x`` as a ``@property``: its body's value, so a
        flag such as ``enable_flashinfer_cutlass_moe`` follows the backend facts. None when ``x``
        is not a property of the frame's class (or was set or assumed)."""
        if not (isinstance(node.value, ast.Name) and node.value.id == "self" and frame.cls) \
                or node.attr in self.attrs or node.attr in self.assume or frame.depth >= self.MAX_DEPTH:
            return None
        fn = frame.module.classes.get(frame.cls, {}).get(node.attr)
        if fn is None or not any(unparse(d).split(".")[-1] in ("property", "cached_property")
                                 for d in fn.decorator_list):
            return None
        return self.invoke(frame.module, fn, frame.cls, [], {}, frame)

    def registry_item(self, node: ast.Subscript, frame: Frame) -> Instance | None:
        """``Cls.table[key]`` where a method of the in-tree class ``Cls`` stores ``self`` in that
        class-level table (``HummingRunnerCore.runner_cores[id(self)] = self`` in ``__init__``, read back
        by the custom op ``humming_moe_runner_core_run``: ``HummingRunnerCore.runner_cores[moe_runner_id]``,
        layers/moe/moe_runner/humming.py 114/158 in 0.5.19): an object of ``Cls``, whose method calls
        :meth:`resolve` follows. None for any other subscript."""
        v = node.value
        if not (isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name)) or v.value.id in frame.locals:
            return None
        cdef = self.class_def(v.value.id, frame.module, frame.imports)
        if cdef is None:
            return None
        stores = any(isinstance(n, ast.Assign) and isinstance(n.value, ast.Name) and n.value.id == "self"
                     and any(isinstance(t, ast.Subscript) and ast.unparse(t.value) == ast.unparse(v)
                             for t in n.targets) for n in ast.walk(cdef[1]))
        return Instance(cdef[1].name, self.built(*cdef).kinds) if stores else None

    def resolve(self, f: ast.expr, frame: Frame):
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and isinstance(
                obj := frame.locals.get(f.value.id), Instance) and obj.cls not in ("", None):
            # a method of a known object (registry_item): its class's, where the class is in the tree
            cdef = self.class_def(obj.cls, frame.module, frame.imports)
            fn = frame.module.classes.get(obj.cls, {}).get(f.attr) if cdef is not None and cdef[0] is frame.module else None
            if fn is not None:
                return frame.module, fn, obj.cls
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
            if frame.cls:
                fn = frame.module.classes.get(frame.cls, {}).get(f.attr)
                if fn is not None:
                    return frame.module, fn, frame.cls
            return None
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id not in frame.locals:
            return self._module_function(f, frame)
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

    def _module_function(self, f: ast.Attribute, frame: Frame):
        """``module.function(...)`` where ``module`` is an imported in-tree module (``from
        sglang.srt.eplb import expert_location_dispatch``; topk.py 2311 in 0.5.19): that function."""
        src = frame.imports.get(f.value.id) or frame.module.imports.get(f.value.id)
        mod = self.module_for(f"{src[0]}.{src[1]}") if src else None
        fn = mod.functions.get(f.attr) if mod is not None else None
        return (mod, fn, None) if fn is not None else None
