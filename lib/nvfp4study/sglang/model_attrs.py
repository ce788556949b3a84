"""Layer attributes only another model's code sets (text and ``ast`` only, nothing imported).

A MoE method's weight processing or ``apply`` may read an attribute of the FusedMoE layer that no
layer, quantization or MoE code sets, only one model's file: 0.5.23 ``MiniMaxM3Nvfp4MoE._process_trtllm_weights``
tests ``layer._minimax_activation == "swigluoai"`` (layers/quantization/minimax_m3_nvfp4.py 257) and
its MegaMoE branch passes ``activation=layer._minimax_activation`` (289), which only
``models/minimax_m3.py`` 440 sets (``self.experts._minimax_activation = ...``). Ling's
``BailingMoeV3ForCausalLM`` (``models/bailing_moe_v3.py``) builds its FusedMoE without it, so the
read raises AttributeError for Ling whatever the clamp or routing parameters are.

:func:`ling_model_files` is Ling's model file and the ``models/`` modules it imports (followed
transitively: what it inherits or builds from); :func:`other_model_setters` the setters of a name
when every one lies in another model's file; :func:`other_model_read` is the interpreter's check of
one statement (:meth:`nvfp4study.sglang.clamp_flow.Interp.exec_stmt`). A read under
``getattr(x, "name", default)`` or ``hasattr`` is no read of this kind: it spells the name as a
string, which counts as a possible binding in that file.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from .clamp_values import Refusal
from .code_index import SRT, always_evaluated, source_files, tree_stamp
from .model_side import MODEL_FILE

#: the objects whose attributes are the layer's (``process_weights_after_loading(self, layer)``,
#: ``apply(self, layer, ...)``) or the method's own
_OWNERS = ("self", "layer")
#: what every ``torch.nn.Module`` has (the FusedMoE layer is one): its public methods and ``training``
#: (``dir(torch.nn.Module)`` of torch 2.13, torch/nn/modules/module.py class Module; tests/test_sglang_model_attrs.py
#: checks it against the installed torch). A monkeypatch of one in another model's file (0.5.23 models/transformers.py
#: 183-186 assigns ``module.register_parameter``) is no setter of the layer's own method.
TORCH_MODULE_ATTRS = frozenset({
    "T_destination", "add_module", "apply", "bfloat16", "buffers", "call_super_init", "children", "compile",
    "cpu", "cuda", "double", "dump_patches", "eval", "extra_repr", "float", "forward", "get_buffer",
    "get_extra_state", "get_parameter", "get_submodule", "half", "ipu", "load_state_dict", "modules", "mtia",
    "named_buffers", "named_children", "named_modules", "named_parameters", "parameters",
    "register_backward_hook", "register_buffer", "register_forward_hook", "register_forward_pre_hook",
    "register_full_backward_hook", "register_full_backward_pre_hook", "register_load_state_dict_post_hook",
    "register_load_state_dict_pre_hook", "register_module", "register_parameter",
    "register_state_dict_post_hook", "register_state_dict_pre_hook", "requires_grad_", "set_extra_state",
    "set_submodule", "share_memory", "state_dict", "to", "to_empty", "train", "type", "xpu", "zero_grad",
    "training",
})
_IMPORT = re.compile(r"^\s*(?:from\s+(sglang\.srt\.models[\w.]*)\s+import\s+\(?([^)\n]*(?:\n[^)]*)?)\)?"
                     r"|import\s+(sglang\.srt\.models[\w.]*))", re.M)


def _models_imported(text: str, files: dict[str, str]) -> set[str]:
    """The in-tree ``models/`` files (from the root) that ``text`` imports (a module, a package's
    ``__init__.py``, or a submodule named in ``from package import name``), lazy imports included."""
    out = set()
    for m in _IMPORT.finditer(text):
        mod = m.group(1) or m.group(3)
        base = mod.replace(".", "/")
        names = re.findall(r"\w+", m.group(2) or "")
        for cand in [base + ".py", base + "/__init__.py", *(f"{base}/{n}.py" for n in names)]:
            if cand in files:
                out.add(cand)
    return out


@lru_cache(maxsize=8)
def ling_model_files(root: Path, _stamp: int) -> frozenset[str]:
    """Ling's model file (:data:`~nvfp4study.sglang.model_side.MODEL_FILE`) and every ``models/``
    file it imports, directly or through another such file (files from the root: ``sglang/srt/...``).
    ``_stamp``: the tree's state (:func:`~nvfp4study.sglang.code_index.tree_stamp`), for the cache."""
    files = {p.relative_to(root).as_posix(): t for p, t in source_files(root)}
    start = SRT + MODEL_FILE
    seen, todo = {start}, [start]
    while todo:
        for f in _models_imported(files.get(todo.pop(), ""), files) - seen:
            seen.add(f)
            todo.append(f)
    return frozenset(seen)


_ANY_STORE = re.compile(r"\.(\w+)[ \t]*(?::[^=\n]*)?[-+*/|&]?=(?!=)|setattr\([^,)\n]*,\s*[\"'](\w+)[\"']")


@lru_cache(maxsize=8)
def _other_model_stores(root: Path, _stamp: int) -> dict[str, tuple[str, ...]]:
    """``{name: ("models/x.py:LINE", ...)}``: every attribute store or ``setattr`` of another model's
    file (a ``models/`` file outside :func:`ling_model_files`), read once per tree state."""
    ling, out = ling_model_files(root, _stamp), {}
    for path, text in source_files(root):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(SRT + "models/") and rel not in ling:
            for name, where in _file_stores(rel[len(SRT):], text):
                out.setdefault(name, []).append(where)
    return {k: tuple(v) for k, v in out.items()}


@lru_cache(maxsize=1024)  # keyed by whole texts: about three trees' models/ files (300 in 0.5.23), not thirteen
def _file_stores(rel: str, text: str) -> tuple[tuple[str, str], ...]:
    """``((name, "rel:LINE"), ...)`` of one file's attribute stores and ``setattr`` calls, in order:
    kept by the file's text, so a copy of a tree (or a tree edited elsewhere) reads it once."""
    out, line, at = [], 1, 0
    for m in _ANY_STORE.finditer(text):
        line += text.count("\n", at, m.start())  # counted on from the last match, not from the top
        at = m.start()
        out.append((m.group(1) or m.group(2), f"{rel}:{line}"))
    return tuple(out)


@lru_cache(maxsize=4096)
def other_model_setters(root: Path, name: str, _stamp: int) -> tuple[str, ...]:
    """``("models/x.py:LINE", ...)``: where the tree sets an attribute ``name``, when every file
    that may bind it is another model's (a ``models/`` file outside :func:`ling_model_files`);
    ``()`` when a file outside those may bind it (an attribute store or ``setattr``, or the name
    standing alone: a string for ``getattr``/``hasattr``/``register_*``, a keyword, a method, a
    field, a local), or no file sets it at all (that is
    :func:`~nvfp4study.sglang.code_index.attribute_never_set`'s case)."""
    setters = _other_model_stores(root, _stamp).get(name, ())
    if not setters:
        return ()
    word = re.compile(rf"(?<![\w.]){re.escape(name)}\b|\.{re.escape(name)}[ \t]*(?::[^=\n]*)?[-+*/|&]?=(?!=)")
    ling = ling_model_files(root, _stamp)
    for path, text in source_files(root):
        if name in text:
            rel = path.relative_to(root).as_posix()
            if not (rel.startswith(SRT + "models/") and rel not in ling) and word.search(text):
                return ()
    return setters


def _reads(st: ast.stmt) -> tuple[tuple[str, str], ...]:
    """``(owner, attr)`` of each ``self.attr`` / ``layer.attr`` load Python evaluates whenever it runs
    ``st``'s own expression (an ``if``/``assert`` test, a value assigned, returned or evaluated; not
    nested bodies), kept on the node: a parsed tree is shared and never changed."""
    reads = getattr(st, "_owner_reads", None)
    if reads is None:
        top = st.test if isinstance(st, (ast.If, ast.Assert)) else getattr(st, "value", None) \
            if isinstance(st, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return, ast.Expr)) else None
        reads = st._owner_reads = () if top is None else tuple(dict.fromkeys(
            (n.value.id, n.attr) for n in always_evaluated(top) if isinstance(n, ast.Attribute)
            and isinstance(n.ctx, ast.Load) and isinstance(n.value, ast.Name) and n.value.id in _OWNERS))
    return reads


def _key_branch(interp: Any, frame: Any, guard: str) -> bool:
    """Whether the undecided guard ``guard`` holds only where the path key's runner backend is picked:
    ``self.F`` that the frame's class's ``__init__`` sets to an ``and`` with a conjunct
    ``get_moe_runner_backend().is_<b>()`` where ``is_<b>`` is a fact of the path (its key's backend):
    0.5.23 ``self.use_flashinfer_trtllm = not self.use_marlin and get_moe_runner_backend().
    is_flashinfer_trtllm_routed()`` (minimax_m3_nvfp4.py 123-126). The other branch runs another
    backend's kernel, which is another key's path."""
    m = re.fullmatch(r"self\.(\w+)", guard)
    init = (frame.module.classes.get(frame.cls) or {}).get("__init__") if m and frame.cls else None
    for n in ast.walk(init) if init is not None else ():
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == m.group(1) for t in n.targets) \
                and isinstance(n.value, ast.BoolOp) and isinstance(n.value.op, ast.And):
            return any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and interp.assume.get(c.func.attr)
                       is True and "get_moe_runner_backend()" in ast.unparse(c) for c in n.value.values)
    return False


def other_model_read(interp: Any, st: ast.stmt, frame: Any) -> str | None:
    """The AttributeError text of a ``self.X`` / ``layer.X`` read in statement ``st`` (:func:`_reads`)
    where ``X`` was not set earlier on the path (``interp.attrs``), is no fact of it
    (``interp.assume``) and only other models' files set it (:func:`other_model_setters`); None when
    there is none. Where the read sits under undecided guards that all pick the key's backend
    (:func:`_key_branch`) in a function that has not returned before it, the function is recorded
    as raising on the path (``interp.raising_steps``): the key's branch raises, the others are other
    keys' paths. ``interp``: a :class:`~nvfp4study.sglang.clamp_flow.Interp` (``root``, ``attrs``,
    ``assume``, ``raising_steps``); ``frame``: the running function's
    :class:`~nvfp4study.sglang.clamp_values.Frame`."""
    stamp = getattr(interp, "_model_attrs_stamp", None)
    for owner, attr in _reads(st):
        if attr in interp.attrs or attr in interp.assume or attr.startswith("__") or attr in TORCH_MODULE_ATTRS:
            continue
        if stamp is None:  # the tree's state, read once per interpreter (one path's run): the tree holds still
            stamp = interp._model_attrs_stamp = hash(tree_stamp(interp.root))
        setters = other_model_setters(interp.root, attr, stamp)
        if not setters:
            continue
        why = (f"{owner}.{attr} is set only by another model's code ({', '.join(setters[:3])}), "
               f"never for Ling ({MODEL_FILE} and the models/ files it imports)")
        open_guards = [g for g, decided in frame.guards if not decided]
        if open_guards and not frame.returns and all(_key_branch(interp, frame, g) for g in open_guards):
            interp.raising_steps.append((frame.module.rel, frame.qualname, [Refusal(
                frame.module.rel, frame.qualname, st.lineno, False, f"AttributeError: {why} (on the branch of "
                f"the key's backend: {' and '.join(open_guards)})")]))
        return why
    return None


__all__ = ["TORCH_MODULE_ATTRS", "ling_model_files", "other_model_read", "other_model_setters"]
