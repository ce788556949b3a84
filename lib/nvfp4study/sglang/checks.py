"""The audit's other checks of an SGLang tree, besides the clamp paths.

- :func:`min_deepgemm_dim`: ``MIN_DEEPGEMM_DIM`` in ``batch_invariant_ops`` and the guard that
  sends an ``N >= MIN_DEEPGEMM_DIM`` matmul to DeepGEMM (and whether a DeepGEMM failure falls back).
- :func:`input_global_scales`: how the W4A4 NVFP4 MoE scheme allocates ``w13/w2_input_global_scale``.
- :func:`gate_up_scale_policy`: what the NVFP4 MoE schemes do when an expert's gate and up
  ``weight_global_scale`` differ (warn, raise, or nothing).
- :func:`moe_scheme_for`: which compressed-tensors MoE scheme a quantization config selects, found
  by *executing* ``CompressedTensorsConfig.get_moe_scheme`` and its ``_is_*`` predicates from the
  tree (compiled from the tree's source, with the real ``compressed_tensors`` argument classes;
  GPU, platform and backend lookups stubbed). A predicate that dereferences a missing
  ``input_activations`` raises here exactly as it does in SGLang.
- :func:`shared_fusion`: whether BailingMoeV3 turns shared-expert fusion off by itself for a
  compressed-tensors checkpoint, evaluated with the tree's own ``should_ignore_layer``.
- :func:`bailing_facts`: how BailingMoeV3 hands the clamp to FusedMoE.

All functions read files only; file paths in results are relative to ``sglang/srt``.
"""

from __future__ import annotations

import ast
import builtins
import copy
import functools
import json
import re
import traceback
import types
import typing
from pathlib import Path
from typing import Any

from .clamp_values import _parse as parse_file
from .code_index import files_stamp, walk
from .source import SGLangTree

SRT = "sglang/srt/"
BIO = "batch_invariant_ops/batch_invariant_ops.py"
NVFP4_W4A4 = "layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4_moe.py"
NVFP4_W4A16 = "layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a16_nvfp4_moe.py"
CT_CONFIG = "layers/quantization/compressed_tensors/compressed_tensors.py"
CT_UTILS = "layers/quantization/compressed_tensors/utils.py"
SCHEMES = "layers/quantization/compressed_tensors/schemes"
BAILING = "models/bailing_moe_v3.py"


def _parse(tree: SGLangTree, rel: str) -> ast.Module | None:
    """The parsed file (shared, read-only: the audit's cache keyed by content), None if absent."""
    p = tree.file(SRT + rel)
    return parse_file(p) if p.is_file() else None


def _schemes(tree: SGLangTree) -> list[Path]:
    return sorted(tree.file(SRT + SCHEMES).glob("*.py"))


def _func(mod: ast.AST, name: str) -> ast.FunctionDef | None:
    parts = name.split(".")
    node: Any = mod
    for part in parts:
        node = next((n for n in walk(node) if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            return None
    return node


def min_deepgemm_dim(tree: SGLangTree) -> dict[str, Any]:
    """``MIN_DEEPGEMM_DIM`` and its guard (``batch_invariant_ops.py``).

    Returns ``{"present", "value", "line", "function", "guard", "guard_lines", "n32_to_deepgemm",
    "reraise_line"}``; ``n32_to_deepgemm`` is True when an N=32 bf16 matmul passes the guard's
    ``N >= MIN_DEEPGEMM_DIM`` test (the card's failing M=1, N=32, K=2560 shape), and
    ``reraise_line`` is where a DeepGEMM failure is re-raised instead of falling back.
    """
    mod = _parse(tree, BIO)
    out: dict[str, Any] = {"present": False, "file": BIO}
    if mod is None:
        return out
    for fn in walk(mod):
        if not isinstance(fn, ast.FunctionDef):
            continue
        for n in walk(fn):
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "MIN_DEEPGEMM_DIM"
                                                 for t in n.targets):
                out.update(present=True, value=ast.literal_eval(n.value), line=n.lineno,
                           function=fn.name)
            if isinstance(n, ast.If) and "MIN_DEEPGEMM_DIM" in ast.unparse(n.test):
                cmp = next((c for c in walk(n.test) if isinstance(c, ast.Compare)
                            and "MIN_DEEPGEMM_DIM" in ast.unparse(c)), None)
                out.update(guard=ast.unparse(cmp) if cmp else ast.unparse(n.test),
                           guard_lines=[n.test.lineno, n.test.end_lineno])
        if fn.name == "_matmul_persistent_deepgemm":
            for h in walk(fn):
                if isinstance(h, ast.ExceptHandler) and any(isinstance(r, ast.Raise) for r in walk(h)):
                    out["reraise_line"] = next(r.lineno for r in walk(h) if isinstance(r, ast.Raise))
    if out.get("present") and "guard" in out:
        m = re.fullmatch(r"(\w+)\s*>=\s*MIN_DEEPGEMM_DIM", out["guard"].strip())
        out["n32_to_deepgemm"] = bool(m) and 32 >= out["value"]
    return out


def input_global_scales(tree: SGLangTree) -> dict[str, Any]:
    """How ``CompressedTensorsW4A4Nvfp4MoE.create_weights`` allocates the input global scales.

    Returns ``{name: {"alloc": "torch.empty" | "torch.zeros" | ..., "line": int}}`` for
    ``w13_input_global_scale`` and ``w2_input_global_scale``.
    """
    mod = _parse(tree, NVFP4_W4A4)
    fn = _func(mod, "CompressedTensorsW4A4Nvfp4MoE.create_weights") if mod else None
    if fn is None:
        return {}
    var_alloc: dict[str, tuple[str, int]] = {}
    out: dict[str, Any] = {}
    for n in walk(fn):
        if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name):
            inner = next((c for c in walk(n.value) if isinstance(c, ast.Call)
                          and ast.unparse(c.func).startswith("torch.")
                          and ast.unparse(c.func) != "torch.nn.Parameter"), None)
            if inner is not None:
                var_alloc[n.targets[0].id] = (ast.unparse(inner.func), inner.lineno)
        if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("register_parameter") \
                and len(n.args) == 2 and isinstance(n.args[0], ast.Constant):
            name = n.args[0].value
            if "input_global_scale" in name and isinstance(n.args[1], ast.Name) \
                    and n.args[1].id in var_alloc:
                alloc, line = var_alloc[n.args[1].id]
                out[name] = {"alloc": alloc, "line": line, "file": NVFP4_W4A4}
    return out


def gate_up_scale_policy(tree: SGLangTree) -> dict[str, Any]:
    """What each NVFP4 MoE scheme does when gate and up ``weight_global_scale`` differ.

    Returns ``{scheme: {"action": "warn" | "raise" | "none", "line", "uses": text}}``.
    """
    out: dict[str, Any] = {}
    for scheme, rel in (("W4A4", NVFP4_W4A4), ("W4A16", NVFP4_W4A16)):
        mod = _parse(tree, rel)
        cls = "CompressedTensorsW4A4Nvfp4MoE" if scheme == "W4A4" else "CompressedTensorsW4A16Nvfp4MoE"
        fn = _func(mod, f"{cls}.process_weights_after_loading") if mod else None
        if fn is None:
            continue
        entry: dict[str, Any] = {"action": "none", "file": rel}
        for n in walk(fn):
            test = ast.unparse(n.test) if isinstance(n, ast.If) else ""
            if ("w13" in test and "allclose" in test) or test.startswith("mismatch"):
                body = ast.unparse(ast.Module(body=n.body, type_ignores=[]))
                entry.update(line=n.lineno, test=ast.unparse(n.test)[:120])
                entry["action"] = "raise" if any(isinstance(x, ast.Raise) for x in walk(n)) else \
                    "warn" if "warning" in body else "other"
            if isinstance(n, ast.Assign) and "w13_weight_scale_2" in ast.unparse(n.targets[0]) and \
                    "[:, 0]" in ast.unparse(n.value):
                entry.setdefault("uses", f"{ast.unparse(n.value)[:80]} (line {n.lineno})")
        out[scheme] = entry
    return out


class _Stub:
    """Anything the predicate code touches that is not about the config (GPU, backend, logs)."""

    def __init__(self, *a: Any, **k: Any):
        pass

    def __getattr__(self, name: str) -> Any:
        return _Stub()

    def __call__(self, *a: Any, **k: Any) -> Any:
        return False

    def __bool__(self) -> bool:
        return False


def _scheme_class_facts(tree: SGLangTree, name: str) -> dict[str, Any]:
    """``get_min_capability`` (a constant) and the Blackwell guard of a scheme class, from its file
    (read once per state of the schemes folder: the backend matrix asks for each cell)."""
    files = _schemes(tree)
    return dict(_scheme_facts_cached(str(tree.srt), name, files_stamp(files)))


@functools.lru_cache(maxsize=256)
def _scheme_facts_cached(srt: str, name: str, stamp: tuple) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    for f in (Path(x[0]) for x in stamp):
        src = f.read_text(encoding="utf-8")
        if f"class {name}(" not in src:
            continue
        cls = _func(parse_file(f), name)
        cap = _func(cls, "get_min_capability") if cls else None
        ret = next((r for r in walk(cap) if isinstance(r, ast.Return)), None) if cap else None
        if ret is not None and isinstance(ret.value, ast.Constant):
            facts["min_capability"] = ret.value.value
        init = _func(cls, "__init__") if cls else None
        for n in walk(init) if init else ():
            if isinstance(n, ast.If) and "is_blackwell" in ast.unparse(n.test) and \
                    any(isinstance(x, ast.Raise) for x in walk(n)):
                facts["raises_unless_blackwell"] = {"file": str(f.relative_to(srt)), "line": n.lineno}
        break
    return facts


def _scheme_stub(name: str, facts: dict[str, Any]) -> type:
    def init(self, *a: Any, **k: Any) -> None:
        self.args, self.kwargs = a, k

    body: dict[str, Any] = {"__init__": init, "scheme_name": name, "facts": facts}
    if "min_capability" in facts:
        body["get_min_capability"] = classmethod(lambda cls: facts["min_capability"])
    return type(name, (), body)


def moe_scheme_for(tree: SGLangTree, weights: dict, input_activations: dict | None,
                   capability: int | None = 100, quant_format: str = "nvfp4-pack-quantized",
                   flags: dict[str, bool] | None = None) -> dict[str, Any]:
    """Run the tree's ``CompressedTensorsConfig.get_moe_scheme`` on one config group.

    Args:
        weights / input_activations: the ``config_groups`` entries (``input_activations`` None
            for weight-only), as in a checkpoint's ``quantization_config``.
        capability: GPU compute capability x10 (100 = Blackwell, 90 = Hopper); None: no CUDA
            device (the replayed ``_check_scheme_supported`` then raises, as
            ``torch.cuda.get_device_capability()`` does there, compressed_tensors.py 416 in 0.5.23).
        flags: module flags of ``compressed_tensors.py`` to set (``{"_is_hip": True}`` for ROCm);
            every other ``_is_*`` flag is False (a CUDA machine).

    Returns:
        ``{"scheme": name, "kwargs": {...}}`` or ``{"error": "Type: message", "function": the
        predicate that raised, "file", "line"}`` (a new dict each call: replays are remembered
        per state of the config file and the schemes folder, the backend matrix asks for each cell).
    """
    key = json.dumps([weights, input_activations, capability, quant_format, flags], sort_keys=True, default=str)
    stamp = files_stamp([tree.file(SRT + CT_CONFIG), *_schemes(tree)])
    return copy.deepcopy(_moe_scheme_cached(tree, key, stamp))


@functools.lru_cache(maxsize=512)
def _moe_scheme_cached(tree: SGLangTree, key: str, _stamp: tuple) -> dict[str, Any]:
    weights, input_activations, capability, quant_format, flags = json.loads(key)
    from compressed_tensors.config import CompressionFormat
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationStrategy,
        QuantizationType,
    )
    from pydantic import BaseModel

    mod = _parse(tree, CT_CONFIG)
    cls = next((n for n in mod.body if isinstance(n, ast.ClassDef)
                and any(isinstance(m, ast.FunctionDef) and m.name == "get_moe_scheme" for m in n.body)), None)
    methods = [m for m in cls.body if isinstance(m, ast.FunctionDef)
               and (m.name.startswith("_is_") or m.name == "get_moe_scheme")]
    names = {n.id for m in methods for n in walk(m) if isinstance(n, ast.Name)}
    ns: dict[str, Any] = {"QuantizationArgs": QuantizationArgs, "QuantizationStrategy": QuantizationStrategy,
                          "QuantizationType": QuantizationType, "CompressionFormat": CompressionFormat,
                          "BaseModel": BaseModel, "logger": _Stub()}
    ns.update({k: getattr(typing, k) for k in ("Optional", "Any", "List", "Dict", "Tuple", "Union", "cast")})
    for name in names - set(ns) - set(dir(builtins)) - {"self"}:
        if name.startswith("_is_"):
            ns[name] = (flags or {}).get(name, False)  # _is_npu, _is_hip, _is_xpu: a CUDA machine
        elif name[0].isupper():
            ns[name] = _scheme_stub(name, _scheme_class_facts(tree, name) if name.endswith("MoE") else {})
        else:
            ns[name] = _Stub()
    code = compile(ast.Module(body=methods, type_ignores=[]), str(tree.file(SRT + CT_CONFIG)), "exec")
    exec(code, ns)  # noqa: S102 - the released SGLang source of these predicates, no I/O
    wq = QuantizationArgs(**weights)
    iq = QuantizationArgs(**input_activations) if input_activations else None
    self = types.SimpleNamespace(
        quant_format=quant_format,
        _add_fused_moe_to_target_scheme_map=lambda: None,
        get_scheme_dict=lambda layer, name: {"weights": wq, "input_activations": iq},
        _check_scheme_supported=lambda min_capability, error=True: _capability_at_least(capability, min_capability),
        _is_mxfp4_moe=lambda **k: False,
    )
    for m in methods:
        setattr(self, m.name, types.MethodType(ns[m.name], self))
    try:
        scheme = self.get_moe_scheme(None, "model.layers.2.mlp.experts")
    except Exception as exc:  # noqa: BLE001 - the outcome we report
        tb = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.endswith("compressed_tensors.py")]
        last = tb[-1] if tb else None
        return {"error": f"{type(exc).__name__}: {exc}", "function": last.name if last else None,
                "file": CT_CONFIG, "line": last.lineno if last else None}
    out = {"scheme": getattr(scheme, "scheme_name", type(scheme).__name__),
           "kwargs": getattr(scheme, "kwargs", {})}
    guard = getattr(scheme, "facts", {}).get("raises_unless_blackwell")
    if guard and capability is not None and capability < 100:
        out["error"] = f"{out['scheme']}.__init__ raises below Blackwell"
        out.update(file=guard["file"], line=guard["line"], function="__init__")
    return out


#: The checkpoint formats the card discusses (compressed-tensors ``config_groups`` entries).
NVFP4_WEIGHTS = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                 "symmetric": True, "dynamic": False}
NVFP4_ACTS = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
              "symmetric": True, "dynamic": "local"}


def _capability_at_least(capability: int | None, min_capability: int) -> bool:
    if capability is None:
        raise RuntimeError("compute capability unknown: no CUDA device (torch.cuda.get_device_capability)")
    return capability >= min_capability


def w4a16_loads(tree: SGLangTree) -> dict[str, Any]:
    """Which MoE scheme an NVFP4 W4A16 (``input_activations: null``) and an NVFP4 W4A4 config get,
    on Blackwell (capability 100) and Hopper (90)."""
    out = {}
    for label, acts in (("W4A16", None), ("W4A4", NVFP4_ACTS)):
        for cap in (100, 90):
            out[f"{label}@sm{cap}"] = moe_scheme_for(tree, NVFP4_WEIGHTS, acts, capability=cap)
    return out


def _should_ignore(tree: SGLangTree) -> Any:
    mod = _parse(tree, CT_UTILS)
    keep = [n for n in mod.body if isinstance(n, ast.FunctionDef)]
    ns: dict[str, Any] = {**vars(typing), "re": re, "MappingProxyType": types.MappingProxyType}
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(tree.file(SRT + CT_UTILS)), "exec"), ns)  # noqa: S102
    return ns["should_ignore_layer"]


def shared_fusion(tree: SGLangTree, ignore_lists: dict[str, list[str]]) -> dict[str, Any]:
    """Does BailingMoeV3 disable shared-expert fusion by itself for a compressed-tensors checkpoint?

    Finds the compressed-tensors branch of ``shared_experts_fusion_disable_reason`` and replays
    its test with the tree's ``should_ignore_layer`` for each ``ignore`` list given
    (``{label: ignore}``): fusion is disabled only when the layer-0 shared-expert and routed-expert
    names disagree.
    """
    mod = _parse(tree, BAILING)
    fn = _func(mod, "shared_experts_fusion_disable_reason") if mod else None
    out: dict[str, Any] = {"file": BAILING, "check": None, "evaluations": {}}
    if fn is None:
        return out
    names = [c.value for c in walk(fn) if isinstance(c, ast.Constant) and isinstance(c.value, str)
             and c.value.startswith("model.layers.")]
    branch = next((n for n in walk(fn) if isinstance(n, ast.If) and "compressed_tensors" in ast.unparse(n.test)), None)
    if branch is None or len(names) < 2:
        return out
    out.update(check=f"{names[0]} vs {names[1]} in quant_config.ignore", line=branch.lineno,
               function=fn.name,
               # Fusion runs the shared expert inside FusedMoE with the ROUTED clamp limit; does
               # the veto look at Ling's two clamp lists at all?
               considers_clamp_lists="swiglu_limit" in ast.unparse(fn))
    should_ignore = _should_ignore(tree)
    for label, ignore in ignore_lists.items():
        shared = should_ignore(names[0], ignore=ignore, fused_mapping={})
        routed = should_ignore(names[1], ignore=ignore, fused_mapping={})
        out["evaluations"][label] = {"ignore": ignore, "shared_ignored": shared, "routed_ignored": routed,
                                     "fusion_disabled": shared != routed}
    return out


#: Two ways a checkpoint can keep the shared experts BF16 (stage 01 writes one of them).
ILLUSTRATIVE_IGNORES = {
    "shared experts in ignore (regex)": ["re:.*layers\\.42\\..*", "lm_head", "re:.*shared_experts.*",
                                         "re:.*mlp\\.gate$"],
    "shared experts only untargeted": ["re:.*layers\\.42\\..*", "lm_head", "re:.*mlp\\.gate$"],
}


def bailing_facts(tree: SGLangTree) -> dict[str, Any]:
    """How BailingMoeV3 builds its routed FusedMoE: which clamp keyword it passes (line), and
    whether it passes ``gemm1_alpha``, ``swiglu_limit`` or ``routing_method_type`` at all."""
    mod = _parse(tree, BAILING)
    out: dict[str, Any] = {"file": BAILING}
    if mod is None:
        return out
    for call in walk(mod):
        if isinstance(call, ast.Call) and ast.unparse(call.func).endswith("FusedMoE") or (
                isinstance(call, ast.Call) and "get_moe_impl_class" in ast.unparse(call.func)):
            kws = {k.arg for k in call.keywords}
            if "gemm1_clamp_limit" in kws or "top_k" in kws:
                out.update(fused_moe_line=call.lineno, passes=sorted(k for k in kws if k and (
                    "clamp" in k or "alpha" in k or "swiglu" in k or "routing_method" in k)))
                break
    out["passes_routing_method_type"] = "routing_method_type" in out.get("passes", [])
    return out


def extra_checks(tree: SGLangTree, ignore_lists: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """All of the above for one tree (JSON-serialisable)."""
    return {
        "sglang_version": tree.version,
        "min_deepgemm_dim": min_deepgemm_dim(tree),
        "input_global_scales": input_global_scales(tree),
        "gate_up_scale_policy": gate_up_scale_policy(tree),
        "moe_scheme": w4a16_loads(tree),
        "shared_fusion": shared_fusion(tree, ignore_lists or ILLUSTRATIVE_IGNORES),
        "bailing": bailing_facts(tree),
    }


