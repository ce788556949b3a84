"""Abstract values and bookkeeping for :mod:`nvfp4study.sglang.clamp_flow` (the clamp interpreter).

Values: :data:`UNK` (cannot tell), ``None``, Python constants, :class:`Tracked` (the followed
parameter's value or anything computed from it, labelled with the parameter), :data:`CONFIG` (the ``MoeRunnerConfig``), :class:`Act` (a FlashInfer
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
#: a ``torch.nn.Parameter(...)`` the code builds (of anything but a :class:`Filled` constant or the
#: followed parameter): an object, so ``is None`` is decided False, while its truth is not decided
PARAMETER = _NamedSentinel("Parameter(...)")


@dataclass(frozen=True)
class Filled:
    """A tensor filled with a number literal (``torch.full((E,), 7.0)``, ``torch.ones(E)``), or a
    ``Parameter`` of one: a constant of the code, never Ling's limit. Mxfp4MoEMethod's SM120
    branch sets ``layer.swiglu_limit`` so (layers/quantization/mxfp4.py 1392-1395 in 0.5.20)."""

    value: float


@dataclass(frozen=True)
class Tracked:
    """A followed parameter's value, or a value derived from it, labelled with the parameter.

    ``param``: the parameter's name (from ``data/moe_params.yaml``, never from code); ``how``: how
    it was derived (for the evidence); ``positive``: the parameter is positive (a comparison against
    zero is decided); ``value``: Ling's number where it is one (a derived value has none)."""

    param: str
    how: str = ""
    positive: bool = False
    value: float | None = None

    def derive(self, how: str) -> Tracked:
        """The same parameter, derived (``how``); Ling's number is not known after a computation."""
        return Tracked(self.param, how, self.positive, None)


@dataclass(frozen=True)
class Act:
    """A FlashInfer ``ActivationType`` member, by name."""

    name: str


@dataclass(frozen=True)
class Backend:
    """A ``MoeRunnerBackend`` member, by name (``"TRITON"``): what a method builds its MoeRunner with."""

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
    #: every name the class and its bases declare (fields, methods), or None where a base was not
    #: found in the tree: a read of a name outside it raises AttributeError
    declared: frozenset | None = field(default=None, compare=False, repr=False)

    def lacks(self, name: str) -> bool:
        """Whether reading ``name`` on this payload raises AttributeError (its class and every base
        were found and none declares it)."""
        return self.declared is not None and name not in self.declared and not name.startswith("__")

    def get(self, name: str) -> Any:
        for k, v in self.fields:
            if k == name:
                return v
        return UNK  # the builder fills every defaulted field (clamp_exprs: ``...QuantInfo(...)``)

    def where(self, name: str) -> tuple | None:
        for k, v in self.origin:
            if k == name:
                return v
        return None


@dataclass(frozen=True)
class Instance:
    """An object of a known class handed to SGLang code (a quantization method given to a helper):
    its class, the in-tree classes it is an instance of (``kinds``: its bases), and its known
    attributes (``attrs``: (name, value) pairs; UNK for one a method sets)."""

    cls: str
    kinds: tuple = ()
    attrs: tuple = ()

    def has(self, name: str) -> bool:
        return any(k == name for k, _ in self.attrs)

    def get(self, name: str) -> Any:
        return next((v for k, v in self.attrs if k == name), UNK)

    def isa(self, cls: str) -> bool:
        return cls == self.cls or cls in self.kinds


@dataclass(frozen=True)
class Built:
    """An object the path's own code builds from an in-tree class (``layer.w2_kernel =
    NPUUnquantMoEMethod()``, layers/quantization/unquant.py 963-964 in 0.5.20): its class, the
    names of its ancestors (``kinds``) and whether every ancestor was found (``complete``: in the
    tree, or imported from outside ``sglang``). Only ``isinstance`` reads it; its attributes stay
    in the interpreter's heap, as before."""

    cls: str
    kinds: tuple = ()
    complete: bool = False

    def isa(self, names: tuple[str, ...], in_tree: bool) -> bool | None:
        """``isinstance(self, one of names)``: True on a hit; False when none hits, the ancestry is
        complete and every name is an in-tree class (``in_tree``: an outside class may be an
        ancestor of an outside base); None otherwise."""
        if self.cls in names or any(k in names for k in self.kinds):
            return True
        return False if self.complete and in_tree else None


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


#: names under which SGLang code holds the ``MoeRunnerConfig`` (the runner's config object)
CONFIG_NAMES = {"runner_config", "moe_runner_config", "config", "_moe_runner_config"}


def truth(v: Any) -> bool | None:
    """Truthiness of an abstract value; None when unknown."""
    if v is UNK or v is PARAMETER:  # a tensor's truth is its values' (or raises)
        return None
    if isinstance(v, Multi):
        ts = {truth(o) for o in v.options}
        return ts.pop() if len(ts) == 1 else None
    if isinstance(v, (Tracked, Act, _NamedSentinel)):
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


def tracked_in(v: Any) -> Tracked | None:
    """The first tracked value ``v`` holds (itself, an option of a Multi, an item of a tuple), or None."""
    if isinstance(v, Tracked):
        return v
    if isinstance(v, (Multi, tuple)):
        for o in v.options if isinstance(v, Multi) else v:
            t = tracked_in(o)
            if t is not None:
                return t
    return None


def has_tracked(v: Any) -> bool:
    """Whether ``v`` holds the followed parameter's value (or one derived from it)."""
    return tracked_in(v) is not None


def derived(how: str, *vals: Any) -> Any:
    """A value computed from ``vals``: the followed parameter derived (``how``) when one of them
    holds it, else UNK."""
    for v in vals:
        t = tracked_in(v)
        if t is not None:
            return t.derive(how)
    return UNK


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
    about_param: bool  # its guard or text names the followed parameter (refusal_words)
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

    def guard_mentions(self, words: tuple[str, ...]) -> bool:
        """Whether a guard of this frame names one of ``words`` (the parameter's refusal words)."""
        return any(w in g for g, _ in self.guards for w in words)


_TENSOR_VIEWS = {"data", "to", "float", "contiguous", "clone", "detach", "view", "expand",
                 "reshape", "cuda"}


def unparse(node: ast.AST) -> str:
    """``ast.unparse(node)`` (str), kept on the node in ``_src``: the parsed trees are shared and
    never changed (:func:`_parse`), and the interpreter unparses the same tests, calls and
    attribute bases on every path and parameter. A node copied and changed must drop ``_src``
    (``code_index._renamed``)."""
    src = getattr(node, "_src", None)
    if src is None:
        src = node._src = ast.unparse(node)
    return src


@cache
def _relevant_src(fn: ast.AST, words: tuple[str, ...]) -> bool:
    src = unparse(fn)
    return any(t in src for t in words)


def relevant(fn: ast.AST, words: tuple[str, ...]) -> bool:
    """Whether helper ``fn`` is entered without a tracked argument: its source holds one of the
    parameter's ``enter_when`` words (``data/moe_params.yaml``)."""
    return _relevant_src(fn, words)


def mentions(fn: ast.AST, names: tuple[str, ...]) -> list[int]:
    """Lines where a function mentions one of ``names`` (an attribute, a getattr string or a
    keyword string): the parameter's mentions, from its spec."""
    cache_ = getattr(fn, "_param_mentions", None)  # kept on the node: a parsed tree never changes
    if cache_ is None:
        cache_ = fn._param_mentions = {}
    if names not in cache_:
        lines = set()
        for n in ast.walk(fn):
            if isinstance(n, ast.Attribute) and n.attr in names:
                lines.add(n.lineno)
            elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names:
                lines.add(n.lineno)
        cache_[names] = tuple(sorted(lines))
    return list(cache_[names])


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
    if isinstance(a, Tracked) and a.positive and isinstance(b, (int, float)) and not isinstance(b, bool) \
            and b <= 0 and isinstance(op, (ast.Gt, ast.GtE, ast.Lt, ast.LtE)):
        return isinstance(op, (ast.Gt, ast.GtE))  # a positive parameter (Ling's clamp limit is)
    if isinstance(a, Tracked) and a.value is not None:
        a = a.value  # Ling's number (the routed scaling factor's 2.5 against 1.0)
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
