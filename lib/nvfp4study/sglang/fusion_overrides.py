"""SGLang's server-argument post-processing that forces ``--disable-shared-experts-fusion`` before
the model is built, per MoE path (``ast`` only).

``resolve_shared_experts_config`` (``layers/moe/utils.py`` 601-623 in 0.5.23;
``install_shared_experts_fusion_decision`` 515-545 in 0.5.19) consults a model's fusion gate only
while ``disable_shared_experts_fusion`` is False; a server argument that is True fuses nothing
(``num_fused_shared_experts`` 0). The server arguments set it for some backends whatever the user
asked: 0.5.20 ``arg_groups/overrides.py`` ``_moe_runner_fusion_disable`` 1575-1596
(``--moe-runner-backend`` flashinfer_cutedsl, flashinfer_trtllm, experimental_sgl_trtllm,
flashinfer_trtllm_routed; 0.5.23 adds the LoRA runners), ``_a2a_fusion_adjustments`` 1599-1620
(``--moe-a2a-backend`` flashinfer, flashinfer_megamoe, deepep_v2), and
``arg_groups/expert_pack_hook.py`` ``handle_expert_pack`` 197 (``--load-format expert_pack``).

:func:`forced_off` finds every such write in the release (a ``return {"disable_shared_experts_fusion":
True}``, a call with ``disable_shared_experts_fusion=True``, or an assignment of True to that
attribute, in ``server_args.py`` or under ``arg_groups/``) and evaluates the ``if`` tests that lead
to it, and the early exits before it, with the path's runner and all-to-all backend and the
server's defaults of the other fields (read from the field declarations). A write that turns fusion
ON (Waterfill, ``False``) is not one: the gate is then still consulted, and it vetoes every
all-to-all backend anyway (``models/bailing_moe_v3.py``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from . import kleene
from .clamp_values import _parse as parse_file
from .code_index import SRT, source_files, walk
from .tree_files import tree_stamp

FIELD = "disable_shared_experts_fusion"
#: the server-argument fields a path decides (``path_keys.runner`` / ``path_keys.a2a``)
RUNNER, A2A = "moe_runner_backend", "moe_a2a_backend"
_UNKNOWN = object()


@dataclass(frozen=True)
class Override:
    """One server-argument write of ``disable_shared_experts_fusion = True`` the path's backends
    take: ``where`` ``file:line`` (relative to ``sglang/srt``) of the write, ``function`` its
    function, ``test`` the condition that leads to it (unparsed source)."""

    where: str
    function: str
    test: str


def _writes_true(node: ast.AST) -> bool:
    """``node`` writes ``disable_shared_experts_fusion = True`` (dict entry, keyword or attribute).
    Its line (:func:`_line`) is the keyword's for a call, else the node's."""
    true = lambda v: isinstance(v, ast.Constant) and v.value is True  # noqa: E731
    if isinstance(node, ast.Return) and isinstance(node.value, ast.Dict):
        return any(isinstance(k, ast.Constant) and k.value == FIELD and true(v)
                   for k, v in zip(node.value.keys, node.value.values, strict=True))
    if isinstance(node, ast.Call):
        return any(k.arg == FIELD and true(k.value) for k in node.keywords)
    if isinstance(node, ast.Assign):
        return true(node.value) and any(isinstance(t, ast.Attribute) and t.attr == FIELD for t in node.targets)
    return False


def _line(node: ast.AST) -> int:
    kw = [k for k in getattr(node, "keywords", []) if k.arg == FIELD]
    return kw[0].lineno if kw else node.lineno


def _arg_files(root: Path) -> list[tuple[str, ast.Module]]:
    out = []
    for path, text in source_files(root):
        rel = path.relative_to(Path(root) / SRT).as_posix()
        if (rel == "server_args.py" or rel.startswith("arg_groups/")) and FIELD in text:
            out.append((rel, parse_file(path)))
    return out


@lru_cache(maxsize=16)
def _defaults(root: Path, _stamp: tuple) -> dict[str, object]:
    """``{field: default}`` of the server arguments declared with a constant default
    (``load_format: A[str, ...] = "auto"``): ``server_args.py`` (0.5.19) or ``arg_groups/fields/``."""
    out: dict[str, object] = {}
    for path, _text in source_files(root):
        rel = path.relative_to(Path(root) / SRT).as_posix()
        if rel != "server_args.py" and not rel.startswith("arg_groups/fields/"):
            continue
        for n in walk(parse_file(path)):
            if (isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and isinstance(n.value, ast.Constant)
                    and n.target.id not in out):
                out[n.target.id] = n.value.value
    return out


class _Eval:
    """Three-valued evaluation of an ``if`` test over the server-argument fields (``view.X``,
    ``cfg.X``, ``self.X``, or a local bound to one: ``runner = view.moe_runner_backend``)."""

    def __init__(self, fields: dict[str, object], aliases: dict[str, str]):
        self.fields, self.aliases = fields, aliases

    def value(self, e: ast.expr) -> object:
        if isinstance(e, ast.Constant):
            return e.value
        if isinstance(e, ast.Attribute):
            return self.fields.get(e.attr, _UNKNOWN)
        if isinstance(e, ast.Name) and e.id in self.aliases:
            return self.fields.get(self.aliases[e.id], _UNKNOWN)
        if isinstance(e, ast.Tuple | ast.List | ast.Set):
            vals = [self.value(x) for x in e.elts]
            return _UNKNOWN if _UNKNOWN in vals else vals
        return _UNKNOWN

    def truth(self, e: ast.expr) -> bool | None:
        """``not`` / ``and`` / ``or`` as :func:`~nvfp4study.sglang.kleene.truth`; a comparison or a
        field's value by :meth:`leaf`."""
        return kleene.truth(e, self.leaf)

    def leaf(self, e: ast.AST) -> bool | None:
        """A one-operator comparison of fields and constants, else the truth of a field's value."""
        if isinstance(e, ast.Compare) and len(e.ops) == 1:
            a, b = self.value(e.left), self.value(e.comparators[0])
            if a is _UNKNOWN or b is _UNKNOWN:
                return None
            op = e.ops[0]
            if isinstance(op, ast.Eq | ast.NotEq):
                return (a == b) == isinstance(op, ast.Eq)
            if isinstance(op, ast.In | ast.NotIn) and isinstance(b, list):
                return (a in b) == isinstance(op, ast.In)
            return None
        v = self.value(e)
        return None if v is _UNKNOWN else bool(v)


def _aliases(fn: ast.FunctionDef) -> dict[str, str]:
    return {t.id: n.value.attr for n in walk(fn) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Attribute)
            for t in n.targets if isinstance(t, ast.Name)}


def _exits(block: list[ast.stmt]) -> bool:
    return any(isinstance(s, ast.Return | ast.Raise) for s in block)


def _reached(body: list[ast.stmt], target: ast.AST, ev: _Eval, tests: list[str]) -> bool | None:
    """Whether the statements ``body`` run down to ``target`` (True / False / None: unknown),
    collecting the tests that lead to it; an ``if`` before it that exits must be false."""
    for st in body:
        inside = any(n is target for n in walk(st))
        if isinstance(st, ast.If) and inside:
            t = ev.truth(st.test)
            in_body = any(any(n is target for n in walk(s)) for s in st.body)
            want = True if in_body else False
            tests.append(ast.unparse(st.test) if in_body else f"not ({ast.unparse(st.test)})")
            rest = _reached(st.body if in_body else st.orelse, target, ev, tests)
            if t is False if want else t is True:
                return False
            return None if t is None or rest is None else rest
        if inside:
            return True
        if isinstance(st, ast.If) and (_exits(st.body) or _exits(st.orelse)):
            t = ev.truth(st.test)
            if (t is True and _exits(st.body)) or (t is False and _exits(st.orelse)):
                return False
            if t is None:
                return None
    return False


@lru_cache(maxsize=16)  # a few tree states (a run: five releases and a copy patched a handful of times)
def _writes(root: Path, _stamp: tuple) -> tuple[tuple[str, ast.FunctionDef, ast.AST], ...]:
    """Every write of ``disable_shared_experts_fusion = True`` in the server-argument files, with its
    file and function: read once per state of the tree (:func:`forced_off` asks once per path)."""
    out = []
    for rel, mod in _arg_files(root):
        for fn in walk(mod):
            if isinstance(fn, ast.FunctionDef):
                out += [(rel, fn, n) for n in walk(fn) if _writes_true(n)]
    return tuple(out)


def forced_off(root: Path, runner: str | None, a2a: str, unknown: tuple[str, ...] = ()) -> list[Override]:
    """The server-argument writes of ``disable_shared_experts_fusion = True`` that a server run with
    ``--moe-runner-backend runner`` (None: the default) and ``--moe-a2a-backend a2a`` certainly
    reaches, in source order. Every other field is at its declared default except those in
    ``unknown`` (set by the checkpoint, ``quantization``); a test over a field without a value is
    unknown and its write is not counted. Empty: fusion is left to the model's gate.

    Decided once per tree state and (runner, a2a, unknown): the audit asks once per path, and a
    tree's paths share a few dozen backend pairs (about 2.6 ms each time otherwise)."""
    return list(_overrides(Path(root), tree_stamp(root), runner, a2a, tuple(unknown)))


@lru_cache(maxsize=4096)  # per tree state and backend pair: a tree's paths share a few dozen pairs
def _overrides(root: Path, stamp: tuple, runner: str | None, a2a: str,
               unknown: tuple[str, ...]) -> tuple[Override, ...]:
    fields = {k: v for k, v in _defaults(root, stamp).items() if k not in unknown}
    fields[A2A] = a2a
    if runner is not None:
        fields[RUNNER] = runner
    out = []
    for rel, fn, node in _writes(root, stamp):
        tests: list[str] = []
        if _reached(fn.body, node, _Eval(fields, _aliases(fn)), tests) is True:
            out.append(Override(f"{rel}:{_line(node)}", fn.name, " and ".join(tests)))
    return tuple(out)


__all__ = ["FIELD", "Override", "forced_off"]
