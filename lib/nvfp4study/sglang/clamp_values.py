"""Abstract values and bookkeeping for :mod:`nvfp4study.sglang.clamp_flow` (the clamp interpreter).

Values: :data:`UNK` (cannot tell), ``None``, Python constants, :class:`Limit` (the clamp value or
anything computed from it), :data:`CONFIG` (the ``MoeRunnerConfig``), :class:`Act` (a FlashInfer
``ActivationType`` member), :class:`Payload` (a ``...QuantInfo`` dataclass), :class:`FuncRef`,
tuples, :class:`AbstractDict`, :class:`Multi` (one of several).
"""

from __future__ import annotations

import ast
import copy
import hashlib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any


class _NamedSentinel:
    """A singleton abstract value compared by identity (:data:`UNK`, :data:`CONFIG`); its repr is its name."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


UNK = _NamedSentinel("?")
CONFIG = _NamedSentinel("runner_config")


@dataclass(frozen=True)
class Limit:
    """The clamp value, or a value derived from it (``how`` says how, for the evidence)."""

    how: str = "gemm1_clamp_limit"


@dataclass(frozen=True)
class Act:
    """A FlashInfer ``ActivationType`` member, by name."""

    name: str


@dataclass(frozen=True)
class ConfigWith:
    """The ``MoeRunnerConfig`` with some fields replaced (``dataclasses.replace(config,
    activation="swiglu")``): ``overrides`` are (field, value) pairs; other fields are Ling's."""

    overrides: tuple


@dataclass(frozen=True)
class Multi:
    """One of several values (a branch the interpreter could not decide)."""

    options: tuple


@dataclass(frozen=True)
class Payload:
    """A ``...QuantInfo(...)`` dataclass instance: its class and the fields given (or defaulted).

    ``origin`` maps a field to ``(file, line, text)`` of the keyword that set it.
    """

    cls: str
    fields: tuple  # ((name, value), ...)
    origin: tuple = ()

    def get(self, name: str) -> Any:
        for k, v in self.fields:
            if k == name:
                return v
        return None if name in CLAMP_FIELDS else UNK

    def where(self, name: str) -> tuple | None:
        for k, v in self.origin:
            if k == name:
                return v
        return None


@dataclass(frozen=True, eq=False)
class LocalFunc:
    """A function defined inside the function being run (``def _inner(): ...``)."""

    node: ast.FunctionDef


@dataclass(frozen=True)
class FuncRef:
    """A sink function held in a variable (``moe_call = trtllm_fp4_block_scale_moe``), with the
    arguments a ``functools.partial`` bound to it (``args``, ``kwargs``: tuples of values / pairs)."""

    name: str
    args: tuple = ()
    kwargs: tuple = ()
    nodes: tuple = ()  # (keyword, ast node) of the bound keywords, for the evidence


@dataclass
class AbstractDict:
    """An abstract ``dict`` (a literal or ``dict(**kwargs)``): key -> abstract value, and key -> ast node."""

    items: dict
    nodes: dict = field(default_factory=dict)


#: Ling's MoE runner config, as BailingMoeV3 builds it (bailing_moe_v3.py: FusedMoE gets
#: ``gemm1_clamp_limit`` only). ``routing_method_type`` is never passed by Bailing.
LING_FACTS: dict[str, Any] = {
    "gemm1_clamp_limit": Limit(),
    "gemm1_alpha": None,
    "gemm1_beta": None,
    "swiglu_limit": None,
    "activation": "silu",
    "is_gated": True,
    # Bailing passes no gate_up_interleaved: FusedMoE's default True (layers/moe/fused_moe_triton/
    # layer.py:367 in 0.5.23; MoeRunnerConfig base.py:70)
    "gate_up_interleaved": True,
}
#: FusedMoE attributes Bailing leaves at their defaults (bailing_moe_v3.py never passes them).
LAYER_FACTS: dict[str, Any] = {"routing_method_type": None}
CONFIG_NAMES = {"runner_config", "moe_runner_config", "config", "_moe_runner_config"}
#: Payload fields that default to None in SGLang's quant-info dataclasses (base.py and runners).
CLAMP_FIELDS = ("gemm1_clamp_limit", "gemm1_alpha", "gemm1_beta", "swiglu_limit", "swiglu_alpha",
                "swiglu_beta", "use_swiglu_step")


def truth(v: Any) -> bool | None:
    """Truthiness of an abstract value; None when unknown."""
    if v is UNK:
        return None
    if isinstance(v, Multi):
        ts = {truth(o) for o in v.options}
        return ts.pop() if len(ts) == 1 else None
    if isinstance(v, (Limit, Act, _NamedSentinel)):
        return True
    if isinstance(v, AbstractDict):
        return bool(v.items)
    try:
        return bool(v)
    except Exception:  # noqa: BLE001 - an exotic constant
        return None


def join(a: Any, b: Any) -> Any:
    if a is b or (type(a) is type(b) and a == b):
        return a
    opts: list = []
    for v in (a, b):
        for o in v.options if isinstance(v, Multi) else (v,):
            if not any(o is p or (type(o) is type(p) and o == p) for p in opts):
                opts.append(o)
    return opts[0] if len(opts) == 1 else Multi(tuple(opts))


def has_limit(v: Any) -> bool:
    if isinstance(v, Limit):
        return True
    if isinstance(v, Multi):
        return any(has_limit(o) for o in v.options)
    if isinstance(v, tuple):
        return any(has_limit(o) for o in v)
    return False


@dataclass
class SinkHit:
    callee: str
    file: str
    function: str
    line: int
    kwargs: dict
    args: list
    kw_nodes: dict  # keyword -> AST node (to tell a literal None from a computed one)
    origins: dict = field(default_factory=dict)  # keyword -> where its payload field was set


@dataclass
class Refusal:
    file: str
    function: str
    line: int
    mentions_clamp: bool
    text: str
    certain: bool = True


@dataclass
class ParsedModule:
    """One parsed Python file of the SGLang tree: its top-level functions, classes and imports."""

    path: Path
    rel: str
    tree: ast.Module
    functions: dict
    classes: dict
    imports: dict  # local name -> (module, name)


class _Source:
    """A file's bytes, equal to any other with the same digest (the key of :func:`_parse_source`)."""

    __slots__ = ("digest", "data", "name")

    def __init__(self, data: bytes, name: str):
        self.digest, self.data, self.name = hashlib.blake2b(data, digest_size=20).digest(), data, name

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Source) and other.digest == self.digest


@cache
def _parse_source(src: _Source) -> ast.Module:
    # bytes, so a PEP 263 coding line is honoured and bad bytes are a SyntaxError
    tree = ast.parse(src.data, filename=src.name)
    src.data = b""  # the cache keeps the key; the digest alone decides equality
    return tree


@cache
def _parse_cached(path: Path, mtime_ns: int, size: int) -> ast.Module:
    # Keyed by content underneath: a copied tree (the patch round trip, the tests' copies) shares
    # the parsed modules of its original instead of parsing every file again. Nothing in the
    # audit changes a parsed tree or keeps its filename, so sharing one is safe.
    return _parse_source(_Source(path.read_bytes(), str(path)))


def _parse(path: Path) -> ast.Module:
    """Parse a file once per version of its contents (keyed by mtime and size).

    Raises:
        SyntaxError: the file does not parse, is not valid in its encoding, cannot be read (a
            dangling link, no permission, not a regular file) or nests too deep for the parser;
            ``filename`` names it.
    """
    path = Path(path)
    try:
        st = path.stat()
        if not path.is_file():  # a FIFO or device named *.py would block the read
            raise OSError("not a regular file")
        return _parse_cached(path, st.st_mtime_ns, st.st_size)
    except SyntaxError:
        raise
    except (OSError, ValueError, RecursionError, MemoryError) as exc:
        why = "nests too deep to parse" if isinstance(exc, (RecursionError, MemoryError)) else \
            (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)
        err = SyntaxError(f"cannot read: {why}")
        err.filename = str(path)
        raise err from exc


def _imports(body: list[ast.stmt], pkg: str) -> dict:
    out = {}
    for n in body:
        if isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - n.level]
                base = ".".join(parts + ([n.module] if n.module else []))
            for a in n.names:
                out[a.asname or a.name] = (base, a.name)
    return out


@dataclass
class Frame:
    module: ParsedModule
    cls: str | None
    qualname: str
    depth: int = 0
    locals: dict = field(default_factory=dict)
    imports: dict = field(default_factory=dict)
    returns: list = field(default_factory=list)
    guards: list = field(default_factory=list)
    stopped: bool = False
    raised: bool = False  # stopped by a raise (see raises_always)

    def fork(self) -> Frame:
        f = copy.copy(self)
        f.locals = dict(self.locals)
        f.imports = dict(self.imports)
        f.returns = []
        f.guards = list(self.guards)
        f.stopped = False
        f.raised = False
        return f

    def raises_always(self) -> bool:
        """Whether the code run in this frame raises on every branch followed: stopped by a
        raise, and no branch returned (a return recorded before an undecided ``if`` fell
        through to the raise means that raise is not reached on every branch)."""
        return self.raised and not self.returns

    def guard_mentions_clamp(self) -> bool:
        return any("clamp" in g for g, _ in self.guards)


_TENSOR_VIEWS = {"data", "to", "float", "contiguous", "clone", "detach", "view", "expand",
                 "reshape", "cuda"}
#: a helper that runs the method's MoeRunner (``return self.runner.run(...)`` in
#: ``Mxfp4MoEMethod._apply_marlin``, mxfp4.py 1458-1478 in 0.5.19) is entered too: the runner's
#: steps follow only a ``runner.run`` call the interpreter saw
_RELEVANT = ("clamp", "swiglu", "ActivationType", "gemm1_alpha", "activation_type", "QuantInfo(", "runner.run(")


@cache
def _relevant_src(fn: ast.AST) -> bool:
    src = ast.unparse(fn)
    return any(t in src for t in _RELEVANT)


def _relevant(fn: ast.AST) -> bool:
    """Only helpers that touch the clamp, SwiGLU parameters or activation types are entered."""
    return _relevant_src(fn)


def clamp_mentions(fn: ast.AST) -> list[int]:
    """Lines where a function mentions ``gemm1_clamp_limit`` (attribute, getattr, or keyword)."""
    cached = getattr(fn, "_clamp_mentions", None)  # kept on the node: a parsed tree never changes
    if cached is not None:
        return list(cached)
    lines = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.Attribute) and n.attr == "gemm1_clamp_limit":
            lines.add(n.lineno)
        elif isinstance(n, ast.Constant) and n.value == "gemm1_clamp_limit":
            lines.add(n.lineno)
    fn._clamp_mentions = tuple(sorted(lines))
    return sorted(lines)


_NUM_OPS = {ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
            ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b}


def compare_values(a: Any, op: ast.cmpop, b: Any, right: ast.expr) -> Any:
    """``a <op> b`` on abstract values (``right``: the right operand's node): ``is None`` on
    decided values, a clamp limit against zero (positive: Ling's is), numbers, and ``==`` / ``in``
    on constants (None included: a field Ling leaves unset, ``gemm1_alpha``); UNK otherwise."""
    if isinstance(op, (ast.Is, ast.IsNot)) and isinstance(right, ast.Constant) \
            and right.value is None:
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
    if isinstance(a, Limit) and isinstance(b, (int, float)) and not isinstance(b, bool) and b <= 0 \
            and isinstance(op, (ast.Gt, ast.GtE, ast.Lt, ast.LtE)):
        return isinstance(op, (ast.Gt, ast.GtE))  # a clamp limit is positive (Ling's is)
    num = (int, float)
    if isinstance(a, num) and isinstance(b, num) and not isinstance(a, bool) and not isinstance(b, bool) \
            and type(op) in _NUM_OPS:
        return _NUM_OPS[type(op)](a, b)
    known = (str, int, float, bool, type(None))  # None: a field Ling leaves unset (gemm1_alpha)
    if isinstance(op, (ast.Eq, ast.NotEq)) and isinstance(a, known) and isinstance(b, known):
        return (a == b) if isinstance(op, ast.Eq) else (a != b)
    if isinstance(op, (ast.In, ast.NotIn)) and isinstance(a, known) and isinstance(b, tuple) \
            and all(isinstance(x, known) for x in b):
        return (a in b) if isinstance(op, ast.In) else (a not in b)
    return UNK


def module_constant(tree: ast.Module, name: str) -> Any:
    """The module's constant ``name``, or None: a name bound once in the whole module, at its top
    level, to a literal dict, string or number (``_AITER_ACTIVATIONS = {"silu": "Silu"}``,
    ``_AITER_SWIGLU_OAI_ALPHA = 1.702``; booleans and None are left to the platform flags)."""
    tops = getattr(tree, "_constants", None)  # kept on the tree: it lives as long as the tree
    if tops is None:
        tops = tree._constants = {}
        for st in tree.body:
            targets = st.targets if isinstance(st, ast.Assign) else [st.target] if isinstance(st, ast.AnnAssign) else []
            if len(targets) == 1 and isinstance(targets[0], ast.Name) and isinstance(st.value, (ast.Dict, ast.Constant)):
                tops.setdefault(targets[0].id, []).append(st.value)
    if len(tops.get(name, ())) != 1:
        return None
    stores = getattr(tree, "_stores", None)  # counted only for a module asked for a constant
    if stores is None:
        stores = tree._stores = {}
        for n in ast.walk(tree):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                stores[n.id] = stores.get(n.id, 0) + 1
    if stores.get(name) != 1:
        return None
    try:
        v = ast.literal_eval(tops[name][0])
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None
    if isinstance(v, dict):
        return AbstractDict(v)
    return v if isinstance(v, (str, int, float)) and not isinstance(v, bool) else None
