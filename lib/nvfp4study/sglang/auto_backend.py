"""What ``--moe-runner-backend auto`` becomes in an SGLang tree, per MoE method and device class
(read with ``ast``; nothing imported or run).

SGLang resolves ``auto`` in up to three places, in this order (0.5.23 lines, relative to
``sglang/srt``):

1. **Model overrides** (``arg_groups/model_overrides/<model>.py``): BailingMoeV3's returns
   ``{"moe_runner_backend": "flashinfer_mxfp4"}`` for a mixed FP8/MXFP4 checkpoint on CUDA
   SM90/SM100/SM120 (``bailing_moe_v3.py`` 20-44, from 0.5.21);
   :func:`~nvfp4study.sglang.auto_server.model_auto`.
2. **Server arguments** (``arg_groups/overrides.py`` ``_moe_runner_backend_quant_constraints``,
   1449-1525): by ``--quantization`` and device, e.g. ``modelopt_fp4`` on SM110/SM120 ->
   ``flashinfer_cutlass`` (1513-1518); :func:`~nvfp4study.sglang.auto_server.server_auto`. A
   compressed-tensors checkpoint leaves ``auto`` as it is there.
3. **The MoE method** (``create_moe_runner`` of the class the quantization config builds): a
   ``if backend.is_auto(): backend = MoeRunnerBackend.X`` chain (``fp8.py`` 2962-2972), or a
   choice made by the backend predicates, which are all False for ``auto`` except ``is_auto``
   (``CompressedTensorsW4A4Nvfp4MoE``: ``self.use_flashinfer_trtllm`` from
   ``is_flashinfer_trtllm()``, else ``MoeRunner(FLASHINFER_CUTLASS)``, 294-309); :func:`method_auto`.

Each reader collects the places that set the backend (a ``MoeRunnerBackend.X`` assignment or
``MoeRunner(...)`` call; a returned dict; a string assignment) and evaluates the tests around each
(:func:`nvfp4study.sglang.platforms.guards`) three-valued under one device's facts
(:class:`Device`): platform predicates (``is_hip()``, ``get_platform().is_sm100``, module flags
such as ``_use_aiter``), the capability checks read from ``utils/common.py``
(:func:`capability_majors`), the backend predicates, the a2a backend ``none`` (the default:
``is_none()`` and ``supports_aiter()`` True, ``utils.py`` 102-109), environment variables at their
defaults (``get_bool_env_var(name)`` is false unless set, ``utils/common.py``), and the format's
own facts (``self.block_quant``). A test it cannot decide makes the answer UNDECIDED, naming the
test and its line; it is never guessed.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from . import kleene
from .code_index import SRT, CodeIndex, walk
from .dispatch import _runner_nodes, predicates
from .platforms import EXACT, guards, predicate_value

COMMON = SRT + "utils/common.py"
ENVIRON = SRT + "environ.py"
RUNTIME = SRT + "runtime_context.py"
#: helper calls whose value under ``auto`` with the a2a backend ``none`` is read by hand:
#: ``Fp8MoEMethod.is_deepgemm_moe_runner_backend_enabled`` returns False for ``auto`` unless the
#: a2a backend is DeepEP, Mooncake or NIXL (``fp8.py`` 1520-1542 in 0.5.23)
HELPERS = {"is_deepgemm_moe_runner_backend_enabled": False}


@dataclass(frozen=True)
class Device:
    """A device class of the matrix. ``platform`` is one of
    :data:`~nvfp4study.sglang.platforms.PLATFORMS`; ``capability`` the compute capability x10
    (CUDA: 100 = SM100; ROCm: what torch reports for the GPU, 94 on MI300X gfx942), None on CPU;
    ``arch`` the ROCm gfx name."""

    key: str
    label: str
    platform: str
    capability: int | None
    arch: str | None = None


#: The device classes, in matrix column order.
DEVICES = (
    Device("SM100", "Blackwell SM100 (B200/GB200)", "CUDA", 100),
    Device("SM120", "Blackwell SM120 (RTX PRO 6000, RTX 50xx)", "CUDA", 120),
    Device("Hopper", "Hopper SM90 (H100/H200)", "CUDA", 90),
    Device("Ampere", "Ampere SM80 (A100)", "CUDA", 80),
    Device("ROCm", "ROCm MI300X (gfx942)", "ROCm", 94, "gfx942"),
    Device("CPU", "CPU (Intel AMX, the CPU engine)", "CPU", None),
)


@dataclass
class AutoChoice:
    """What ``auto`` resolves to. ``backend`` None with ``undecided`` set: not decided (why, with
    ``file:line``); ``where`` the deciding ``file:line`` (relative to ``sglang/srt``); ``stage``
    ``model`` / ``server`` / ``method``; ``passthrough``: no place sets a backend, the configured
    value is handed to ``MoeRunner`` as it is (at ``where``)."""

    backend: str | None
    where: str | None = None
    stage: str | None = None
    undecided: str | None = None
    trail: list[str] = field(default_factory=list)
    passthrough: bool = False


def short(rel: str) -> str:
    """``sglang/srt/x.py`` -> ``x.py`` (places are named relative to ``sglang/srt``)."""
    return rel[len(SRT):] if rel.startswith(SRT) else rel


def capability_majors(code: CodeIndex) -> dict[str, list[int]]:
    """``{"is_sm100_supported": [10], "is_blackwell": [10, 11, 12], ...}``: the capability checks
    of ``utils/common.py`` built as ``partial(_check_cuda_device_version,
    device_capability_majors=[...])`` (0.5.23 lines 297-337), every name they are bound to."""
    mod = code.mod(COMMON)
    out: dict[str, list[int]] = {}
    for st in mod.body if mod else []:
        if not isinstance(st, ast.Assign):
            continue
        kw = [k for k in walk(st.value) if isinstance(k, ast.keyword) and k.arg == "device_capability_majors"]
        if kw and isinstance(kw[0].value, ast.List):
            majors = [e.value for e in kw[0].value.elts if isinstance(e, ast.Constant)]
            for t in st.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = majors
    return out


def platform_probes(code: CodeIndex) -> dict[str, str]:
    """``{"is_sm100": "is_sm100_supported", ...}``: ``get_platform()``'s attributes and the
    ``utils/common.py`` functions they answer from (``_PLATFORM_PROBES``, runtime_context.py
    1824-1840 in 0.5.23); empty where the release has no such table."""
    mod = code.mod(RUNTIME)
    for st in mod.body if mod else []:
        target = st.target if isinstance(st, ast.AnnAssign) else st.targets[0] if isinstance(st, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id == "_PLATFORM_PROBES" and isinstance(st.value, ast.Dict):
            return {k.value: v.value for k, v in zip(st.value.keys, st.value.values, strict=False)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)}
    return {}


class Facts:
    """The three-valued facts of one device (and one backend value, ``auto`` by default) in a tree."""

    def __init__(self, code: CodeIndex, device: Device, backend: str = "auto", extra: dict | None = None,
                 quantization: str | None = None):
        self.code, self.device, self.backend, self.quantization = code, device, backend, quantization
        memo = code.__dict__.setdefault("_auto_facts", {})
        if not memo:
            memo.update(majors=capability_majors(code), probes=platform_probes(code), preds=predicates(code))
        self.majors, self.probes, self.preds = memo["majors"], memo["probes"], memo["preds"]
        self.extra = dict(extra or {})
        #: ``(module, function, file, class)`` whose locals a test may name (set while a place is read)
        self.scope: tuple | None = None

    def predicate(self, name: str) -> bool | None:
        """A platform or capability predicate by name (``is_sm100_supported``, ``is_hip``, ``is_gfx95_supported``)."""
        d = self.device
        name = self.probes.get(name, name)
        if name in self.majors:
            return d.platform == "CUDA" and d.capability is not None and d.capability // 10 in self.majors[name]
        if name in EXACT or name in ("is_musa", "is_mps"):
            return predicate_value(name, d.platform) if name in EXACT else False
        if "gfx" in name:
            if d.platform != "ROCm":
                return False
            m = re.search(r"gfx(\d+)", name)
            return None if not (m and d.arch) else d.arch.startswith("gfx" + m.group(1))
        if "amx" in name:
            return True if d.platform == "CPU" else False
        if name.startswith("is_flashinfer_available") or name == "has_flashinfer":
            return d.platform == "CUDA"
        return predicate_value(name, d.platform)

    def backend_pred(self, name: str) -> bool | None:
        """A ``MoeRunnerBackend`` predicate (``is_flashinfer_trtllm``) for the configured value; None if unknown."""
        if name not in self.preds:
            return None
        return self.backend in self.preds[name]


def truth(node: ast.AST, facts: Facts, rel: str, cls: ast.ClassDef | None = None, depth: int = 0) -> bool | None:
    """Three-valued truth of test ``node`` of module ``rel`` (class ``cls`` for ``self.x``) under
    ``facts`` (see the module docstring); None when not decided."""
    if depth > 6:
        return None
    rec = lambda n, r=rel, c=cls: truth(n, facts, r, c, depth + 1)  # noqa: E731
    return kleene.truth(node, lambda n: _leaf(n, facts, rel, cls, depth, rec), operand=rec)


def _leaf(node: ast.AST, facts: Facts, rel: str, cls: ast.ClassDef | None, depth: int,
          rec: Callable[[ast.AST], bool | None]) -> bool | None:
    """:func:`truth` of a node other than ``not`` / ``and`` / ``or``."""
    if isinstance(node, ast.Constant):
        return bool(node.value) if isinstance(node.value, (bool, int, str, type(None))) else None
    if isinstance(node, ast.Compare):
        return _compare(node, facts)
    text = ast.unparse(node)
    if text in facts.extra:
        return facts.extra[text]
    if isinstance(node, ast.Call):
        return _call(node, facts, rel, cls, rec)
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id == "self" and cls is not None:
            return _self_attr(node.attr, facts, rel, cls, depth)
        if "platform" in ast.unparse(node.value) or node.attr.startswith(("is_sm", "is_blackwell", "is_hip", "is_cuda")):
            return facts.predicate(node.attr)
        return None
    if isinstance(node, ast.Name):
        if node.id in EXACT:
            return facts.predicate(node.id)
        mod = facts.code.mod(rel)
        value = _module_value(mod, node.id) if mod else None
        if value is None:
            value = _local(node.id, facts, depth)
        return rec(value) if value is not None else None
    return None


def _call(node: ast.Call, facts: Facts, rel: str, cls, rec) -> bool | None:
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    if name in HELPERS:
        return HELPERS[name]
    if name == "get" and isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute) \
            and ast.unparse(f.value.value) == "envs":
        return env_default(facts.code, f.value.attr)
    if name == "get_bool_env_var":
        default = node.args[1] if len(node.args) > 1 else None
        return isinstance(default, ast.Constant) and str(default.value).lower() in ("true", "1")
    if isinstance(f, ast.Attribute) and "a2a" in ast.unparse(f.value):
        return name in ("is_none", "supports_aiter")  # the default --moe-a2a-backend none
    if isinstance(f, ast.Attribute) and name in facts.preds:
        return facts.backend_pred(name)
    if name in facts.majors or name in EXACT or "gfx" in name or "amx" in name or name in facts.probes:
        return facts.predicate(name)
    return None


def env_default(code: CodeIndex, name: str) -> bool | None:
    """The default of ``envs.NAME`` (``NAME = EnvBool(False)`` in ``environ.py``, 949 in 0.5.23
    for ``SGLANG_USE_AITER``): the value with the variable unset; None if not a constant bool."""
    mod = code.mod(ENVIRON)
    for node in walk(mod) if mod else ():
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets) \
                and isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "EnvBool" and node.value.args \
                and isinstance(node.value.args[0], ast.Constant) and isinstance(node.value.args[0].value, bool):
            return node.value.args[0].value
    return None


def _capability_compare(node: ast.Compare, facts: Facts) -> bool | None:
    """``(8, 0) <= get_device_capability() < (10, 0)`` with the device's (major, minor)."""
    cap = facts.device.capability
    parts = [node.left, *node.comparators]
    if cap is None or facts.device.platform != "CUDA":
        return None
    def is_cap(p: ast.expr) -> bool:
        if isinstance(p, ast.Name):
            p = _local(p.id, facts, 0) or p
        return isinstance(p, ast.expr) and ast.unparse(p).startswith("get_device_capability(")

    try:
        vals = [(cap // 10, cap % 10) if is_cap(p) else ast.literal_eval(p) for p in parts]
    except ValueError:
        return None
    ops = {ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b,
           ast.GtE: lambda a, b: a >= b}
    if any(type(o) not in ops for o in node.ops):
        return None
    return all(ops[type(o)](a, b) for o, a, b in zip(node.ops, vals, vals[1:], strict=False))


def _compare(node: ast.Compare, facts: Facts) -> bool | None:
    """``x.moe_runner_backend == "auto"``, ``x.quantization == "q"`` / ``in [...]``,
    ``x.device != "cuda"``, ``x.moe_a2a_backend != "none"``: the server-argument view's fields."""
    if "get_device_capability(" in ast.unparse(node) or "capability" in ast.unparse(node):
        return _capability_compare(node, facts)
    if len(node.ops) != 1:
        return None
    left, op, right = ast.unparse(node.left).split(".")[-1], node.ops[0], node.comparators[0]
    values = {"moe_runner_backend": facts.backend, "quantization": facts.quantization,
              "moe_a2a_backend": "none", "device": facts.device.platform.lower().replace("rocm", "cuda")}
    if left not in values:
        return None
    have = values[left]
    if isinstance(right, ast.Constant) and isinstance(op, (ast.Eq, ast.NotEq)):
        return (have == right.value) == isinstance(op, ast.Eq)
    if isinstance(right, (ast.List, ast.Tuple, ast.Set)) and isinstance(op, (ast.In, ast.NotIn)):
        consts = [e.value for e in right.elts if isinstance(e, ast.Constant)]
        if len(consts) != len(right.elts):
            return None
        return (have in consts) == isinstance(op, ast.In)
    return None


def _module_value(mod: ast.Module, name: str) -> ast.expr | None:
    vals = [st.value for st in mod.body if isinstance(st, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in st.targets)]
    return vals[0] if len(vals) == 1 else None


def _self_attr(attr: str, facts: Facts, rel: str, cls: ast.ClassDef, depth: int) -> bool | None:
    """``self.attr`` from its one assignment in ``__init__`` (the class's or its nearest base's),
    else from a class attribute of ``cls`` (``requires_blackwell = True``)."""
    own = [st.value for st in cls.body if isinstance(st, ast.Assign)
           and any(isinstance(t, ast.Name) and t.id == attr for t in st.targets)]
    hit = facts.code.method(rel, cls, "__init__")
    if hit is None:
        return truth(own[0], facts, rel, cls, depth + 1) if len(own) == 1 else None
    owner = facts.code.top(hit[0], hit[1].split(".")[0])
    init = next((f for f in walk(owner) if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    vals = [st.value for st in walk(init) if isinstance(st, ast.Assign)
            and any(ast.unparse(t) == f"self.{attr}" for t in st.targets)] if init else []
    if not vals and len(own) == 1:
        return truth(own[0], facts, rel, cls, depth + 1)
    if len(vals) != 1:
        return None
    return truth(vals[0], facts, hit[0], owner if isinstance(owner, ast.ClassDef) else cls, depth + 1)


def _site_state(mod: ast.Module, node: ast.AST, facts: Facts, rel: str, cls) -> tuple[bool | None, str | None]:
    """Whether ``node`` runs under ``facts``: True, False, or None with the first undecided test.
    A local name in a test is read from its assignments in the enclosing function (:func:`_local`)."""
    undecided = None
    outer = facts.scope
    facts.scope = (mod, _enclosing_function(mod, node), rel, cls)
    try:
        for test, want in guards(mod, node):
            v = truth(test, facts, rel, cls)
            if v is None:
                undecided = undecided or f"{short(rel)}:{test.lineno} `{ast.unparse(test)[:90]}`"
            elif v != want:
                return False, None
    finally:
        facts.scope = outer
    return (None, undecided) if undecided else (True, None)


def runs(mod: ast.Module, node: ast.AST, facts: Facts, rel: str, cls: ast.ClassDef | None = None
         ) -> tuple[bool | None, str | None]:
    """Whether statement ``node`` of module ``rel`` runs under ``facts``: True, False, or None
    with the first test not decided (``file:line `test```)."""
    return _site_state(mod, node, facts, rel, cls)


def _enclosing_function(mod: ast.Module, node: ast.AST) -> ast.FunctionDef | None:
    from .platforms import _parents

    parents = _parents(mod)
    while (node := parents.get(id(node))) is not None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node
    return None


def _local(name: str, facts: Facts, depth: int) -> ast.expr | bool | None:
    """The value of local ``name`` in the function being read (``facts.scope``): the expression
    of its one assignment that runs under ``facts`` (every other one decided not to run), else None."""
    scope = facts.scope
    if not scope or scope[1] is None or depth > 4:
        return None
    mod, fn, rel, cls = scope
    assigns = [st for st in walk(fn) if isinstance(st, ast.Assign)
               and any(isinstance(t, ast.Name) and t.id == name for t in st.targets)]
    running = []
    for st in assigns:
        state = True
        for test, want in guards(mod, st):
            v = truth(test, facts, rel, cls, depth + 1)
            if v is None:
                return None
            if v != want:
                state = False
                break
        if state:
            running.append(st.value)
    return running[0] if len(running) == 1 else None


def method_auto(code: CodeIndex, rel: str, cls: ast.ClassDef, facts: Facts) -> AutoChoice:
    """The backend ``cls``'s ``MoeRunner`` gets when ``--moe-runner-backend`` is ``facts.backend``
    (``auto``): among the places that set it (``_runner_nodes``: ``x = MoeRunnerBackend.X`` and
    ``MoeRunner(MoeRunnerBackend.X, ...)``), the ones that run under ``facts``; a method that
    builds no ``MoeRunner`` is ``direct``. Decided when the running places name one backend;
    a place whose tests are not decided makes it UNDECIDED (the test and line)."""
    sites = _runner_nodes(code, rel, cls)
    if not sites:
        return AutoChoice("direct", f"{short(rel)}:{cls.lineno}", "method",
                          trail=[f"{cls.name} builds no MoeRunner: it calls its kernels itself"])
    taken: dict[str, str] = {}
    undecided: list[str] = []
    passthrough: list[str] = []
    for frel, node, members in sites:
        mod = code.mod(frel)
        state, why = _site_state(mod, node, facts, frel, cls)
        where = f"{short(frel)}:{node.lineno}"
        if state is None:
            undecided.append(f"{where} (test {why})")
        elif state and members:
            for b in sorted(members):
                taken.setdefault(b, where)
        elif state:
            passthrough.append(where)
    if undecided and len(taken) != 1:
        return AutoChoice(None, None, "method", undecided="; ".join(undecided[:3]),
                          trail=[f"{b} at {w}" for b, w in taken.items()])
    if len(taken) == 1:
        (b, where), = taken.items()
        trail = [f"{cls.name}: {b} set at {where}"]
        if undecided:
            trail.append("other places not decided: " + "; ".join(undecided[:2]))
        return AutoChoice(b, where, "method", trail=trail)
    if not taken and passthrough:
        return AutoChoice(None, passthrough[0], "method", passthrough=True,
                          undecided=f"{cls.name} hands the configured value to MoeRunner "
                          f"({', '.join(passthrough[:2])}) and sets none for {facts.backend!r}")
    if not taken:
        return AutoChoice(None, None, "method", undecided=f"no place in {cls.name} sets a backend for "
                          f"{facts.backend!r} on {facts.device.key}")
    return AutoChoice(None, None, "method", undecided="several backends set: "
                      + ", ".join(f"{b} at {w}" for b, w in taken.items()))


def init_raises(code: CodeIndex, rel: str, cls: ast.ClassDef, facts: Facts) -> str | None:
    """``file:line message`` of a ``raise`` in ``cls.__init__`` (own or inherited) that runs on
    ``facts.device`` (every test around it decided True), else None."""
    hit = code.method(rel, cls, "__init__")
    if hit is None:
        return None
    owner = code.top(hit[0], hit[1].split(".")[0])
    init = next((f for f in walk(owner) if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    mod = code.mod(hit[0])
    for node in walk(init) if init else ():
        if isinstance(node, ast.Raise) and guards(mod, node):
            state, _ = _site_state(mod, node, facts, hit[0], owner)
            if state:
                msg = next((ast.literal_eval(a) for a in walk(node) if isinstance(a, ast.Constant)
                            and isinstance(a.value, str)), "")
                return f"{short(hit[0])}:{node.lineno} {msg[:80]}"
    return None


__all__ = ["DEVICES", "HELPERS", "AutoChoice", "Device", "Facts", "capability_majors", "env_default",
           "init_raises", "method_auto", "platform_probes", "runs", "short", "truth"]
