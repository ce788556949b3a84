"""Which weights a FusedMoE layer has after its method's ``create_weights`` (read with ``ast``).

``FusedMoE.__init__`` calls the method's ``create_weights(layer=self, ...)`` (fused_moe_triton/
layer.py 484 in 0.5.19, 561 in 0.5.23), which registers the layer's weights with
``layer.register_parameter("<name>", ...)``; a ``torch.nn.Module`` has no attribute it was not
given, so reading one raises AttributeError and ``getattr(layer, "<name>", None)`` gives None. The
clamp interpreter (:class:`~nvfp4study.sglang.clamp_flow.Interp`) runs ``create_weights`` as a setup
step (:data:`~nvfp4study.sglang.runner_steps.SETUP_STEPS`) and keeps what it registers beside every
other attribute; this module says when that table is the whole story for a name:

- :func:`closed_create_weights`: the method's ``create_weights`` hands its layer to nothing the
  interpreter does not see (only constant-name ``register_parameter`` / ``register_buffer`` /
  ``setattr``);
- :func:`create_weights_only`: the tree gives an object the attribute only inside a
  ``create_weights`` (a weight some scheme registers), never as an object's own ``self.<name>``
  and never as a method.

0.5.19-0.5.23 ``NPUCompressedTensorsW8A8Int8DynamicMoE.apply_weights`` reads ``layer.w13_weight_offset``
(compressed_tensors_w8a8_int8_moe.py 149-150; 150-151 in 0.5.19) that its ``create_weights``
(56-119) never registers; ``CompressedTensorsW4A8Int8MoE`` and the wNa16 scheme register it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from .clamp_values import _parse
from .code_index import _NEVER_SET, source_files, walk

#: the layer's methods that give it an attribute by name (torch.nn.Module)
_REGISTER = ("register_parameter", "register_buffer")


def _const_name(call: ast.Call, at: int) -> bool:
    return len(call.args) > at and isinstance(call.args[at], ast.Constant) and isinstance(call.args[at].value, str)


def closed_create_weights(fn: ast.FunctionDef) -> bool:
    """Whether ``create_weights`` ``fn`` gives its layer (its first parameter after ``self``) only
    what the interpreter records: every call that gets the layer is ``layer.register_parameter("x", ...)``
    / ``register_buffer`` or ``setattr(layer, "x", ...)`` with a constant name (a helper or
    ``super().create_weights(layer, ...)`` may register anything: not closed)."""
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    params = params[1:] if params and params[0] in ("self", "cls") else params
    if not params:
        return False
    layer = params[0]
    for c in walk(fn):
        if not isinstance(c, ast.Call):
            continue
        f = c.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == layer:
            if f.attr not in _REGISTER or not _const_name(c, 0):
                return False  # another method of the layer, or a computed name
            continue
        handed = [a for a in [*c.args, *(k.value for k in c.keywords)] if isinstance(a, ast.Name) and a.id == layer]
        if handed and not (isinstance(f, ast.Name) and f.id == "setattr" and _const_name(c, 1)):
            return False
    return True


def create_weights_only(root: Path, name: str) -> bool:
    """Whether the tree at ``root`` gives an object the attribute ``name`` only inside functions
    named ``create_weights`` (``layer.register_parameter("name", ...)``, ``layer.name = ...``,
    ``setattr(layer, "name", ...)``), at least once, never on ``self`` and never as a method
    (``def name(``). Read once per tree and name, kept beside :func:`~nvfp4study.sglang.code_index.
    attribute_never_set`'s readings so that :func:`~nvfp4study.sglang.code_index.forget_settable` drops
    both (a tree edited in place is read again)."""
    key = (str(root), f"<create_weights_only>{name}")  # a key no attribute name can take
    if key not in _NEVER_SET:
        _NEVER_SET[key] = _only_in_create_weights(root, name)
    return _NEVER_SET[key]


def _only_in_create_weights(root: Path, name: str) -> bool:
    pat = re.compile(rf"\b{re.escape(name)}\b")
    seen = False
    for path, text in source_files(root):
        if name not in text or not pat.search(text):
            continue
        try:
            defined, outside, inside = _file_stores(_parse(path))
        except SyntaxError:
            return False  # a file that cannot be read may set it
        if name in defined or name in outside:
            return False
        seen = seen or name in inside
    return seen


def _file_stores(tree: ast.Module) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """``(defined, outside, inside)`` for a parsed file: the names of its functions, the attribute
    names its functions other than ``create_weights`` give any object (:func:`_stored_names`), and those
    its ``create_weights`` functions give an object other than ``self``. Kept on the tree (the parsed
    trees are shared and never changed): one walk per file, not one per file and attribute name."""
    got = getattr(tree, "_attr_stores", None)
    if got is None:
        defined, outside, inside = set(), set(), set()
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            defined.add(fn.name)
            own = fn.name != "create_weights"
            (outside if own else inside).update(_stored_names(walk(fn), own))
        got = tree._attr_stores = (frozenset(defined), frozenset(outside), frozenset(inside))
    return got


def _stored_names(nodes: tuple[ast.AST, ...], own: bool) -> set[str]:
    """The attribute names ``nodes`` give an object: ``x.name = ...``, ``setattr(x, "name", ...)``,
    ``x.register_parameter("name", ...)`` / ``register_buffer`` (``own``: a store on ``self`` counts
    too; False for the create_weights functions, where ``self.name`` is the method's own)."""
    out = set()
    for node in nodes:
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if own or not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                out.add(node.attr)
        elif isinstance(node, ast.Call):
            f = node.func
            at = 1 if isinstance(f, ast.Name) and f.id == "setattr" else 0 if (
                isinstance(f, ast.Attribute) and f.attr in _REGISTER) else None
            if at is not None and _const_name(node, at):
                out.add(node.args[at].value)
    return out


__all__ = ["closed_create_weights", "create_weights_only"]
