"""Checkpoint tensors grouped into modules: component, storage format, the scheme SGLang applies.

Names follow the Ling-3.0-flash layout (``docs/ling-layout.md``, "Tensor names"); the precision-table
rows are the model card's. Used by :mod:`nvfp4study.checkpoint.audit`.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from . import quant_rules as qr
from .header import CheckpointHeaders, TensorHeader

_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_EXPERT_RE = re.compile(r"^mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)$")
_ATTN_PROJ = {"q_proj", "k_proj", "v_proj", "o_proj", "b_proj", "f_proj", "g_proj"}
_KDA_MISC = {"q_conv1d", "k_conv1d", "v_conv1d", "o_norm"}
_MLA_PROJ = {"kv_a_proj_with_mqa", "kv_b_proj", "dense"}

#: The model card's precision-table rows, in its order (the MTP row is added per MTP layer).
CARD_ROWS = {
    "routed_expert": "routed experts (mlp.experts.*)",
    "attention_proj": "attention q/k/v/o_proj, f_proj, g_proj, b_proj",
    "kda_misc": "q_conv1d, k_conv1d, v_conv1d, o_norm, A_log, dt_bias",
    "mla_proj": "MLA kv_a_proj_with_mqa, kv_b_proj, attention.dense",
    "shared_expert": "shared experts, mlp.gate (router), dense MLP",
    "router": "shared experts, mlp.gate (router), dense MLP",
    "dense_mlp": "shared experts, mlp.gate (router), dense MLP",
    "lm_head": "lm_head, word_embeddings, all norms",
    "embedding": "lm_head, word_embeddings, all norms",
    "norm": "lm_head, word_embeddings, all norms",
    "mtp_proj": "other",
    "other": "other",
}
#: How SGLang builds each component: "linear" (LinearBase / FusedMoE, name or class match),
#: "name" (lm_head: name only), "never" (no quant_config: norms, conv, router, embeddings).
_ENGINE_KIND = {"routed_expert": "linear", "attention_proj": "linear", "mla_proj": "linear",
                "shared_expert": "linear", "dense_mlp": "linear", "mtp_proj": "linear", "other": "linear",
                "lm_head": "name", "router": "never", "embedding": "never", "norm": "never", "kda_misc": "never"}
PACKED_FORMATS = ("NVFP4", "MXFP4")


def classify(module: str, param: str) -> tuple[int, str, int, str]:
    """``(layer, component, expert, proj)`` of a module name (layer/expert -1 when none)."""
    m = _LAYER_RE.match(module)
    if not m:
        if module == "lm_head":
            return -1, "lm_head", -1, ""
        if module.endswith("embeddings") or module.endswith("embed_tokens"):
            return -1, "embedding", -1, ""
        return -1, "norm" if module.endswith("norm") else "other", -1, ""
    layer, rest = int(m.group(1)), m.group(2)
    if rest.startswith("mlp.experts."):
        e = _EXPERT_RE.match(rest)
        return (layer, "routed_expert", int(e.group(1)), e.group(2)) if e else (layer, "other", -1, "")
    if rest.startswith("mlp.shared_experts."):
        return layer, "shared_expert", -1, rest.rsplit(".", 1)[-1]
    if rest == "mlp.gate":
        return layer, "router", -1, ""
    if rest in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
        return layer, "dense_mlp", -1, rest[4:]
    if rest == "attention":
        return layer, "kda_misc" if param in ("A_log", "dt_bias") else "other", -1, ""
    if rest.startswith("attention."):
        sub = rest[10:]
        if sub in _KDA_MISC:
            return layer, "kda_misc", -1, sub
        if sub in _MLA_PROJ:
            return layer, "mla_proj", -1, sub
        if sub in _ATTN_PROJ:
            return layer, "attention_proj", -1, sub
        return layer, "norm" if sub.endswith("norm") else "other", -1, sub
    if rest.endswith("norm"):
        return layer, "norm", -1, ""
    if rest == "eh_proj":
        return layer, "mtp_proj", -1, ""
    return layer, "other", -1, ""


@dataclass
class CheckpointModule:
    """The tensors of one module of the checkpoint (a Linear layer, a norm, an embedding) and what they add up to."""

    name: str
    layer: int
    component: str
    expert: int
    proj: str
    params: dict[str, TensorHeader]
    fmt: str = ""  # NVFP4 / MXFP4 / INVALID-PACKED / a dtype (BF16, F32) / mixed "BF16+F32"
    problem: str = ""
    engine: str | None = None  # config group SGLang applies, or None = unquantized
    engine_note: str = ""

    @property
    def packed(self) -> bool:
        return self.fmt in PACKED_FORMATS or self.fmt == "INVALID-PACKED"


def module_format(params: dict[str, TensorHeader]) -> tuple[str, str]:
    """Name the storage format of a module's tensors; returns ``(format, problem)``.

    NVFP4 (compressed-tensors ``nvfp4-pack-quantized``, as llmcompressor's ``model_free_ptq`` writes it):
    ``weight_packed`` U8 [out, in/2], ``weight_scale`` F8_E4M3 [out, in/16], ``weight_global_scale``
    F32 [1]. MXFP4 (fault F-03, a draft layer in another FP4 format): ``weight`` U8 [out, in/2] with a U8/F8_E8M0 ``weight_scale``
    of in/32 columns. Anything else: the dtype(s) of the tensors (plain).
    """
    wp, ws = params.get("weight_packed"), params.get("weight_scale")
    if wp is not None:
        if wp.dtype != "U8" or len(wp.shape) != 2:
            return "INVALID-PACKED", f"weight_packed is {wp.dtype} {list(wp.shape)}, expected U8 [out, in/2]"
        if ws is None or ws.dtype != "F8_E4M3" or len(ws.shape) != 2 or ws.shape[0] != wp.shape[0]:
            got = f"{ws.dtype} {list(ws.shape)}" if ws else "missing"
            return "INVALID-PACKED", f"weight_scale is {got}, expected F8_E4M3 [out, in/16]"
        if ws.shape[1] * 16 != wp.shape[1] * 2:
            return "INVALID-PACKED", f"weight_scale has {ws.shape[1]} columns for {wp.shape[1] * 2} inputs (group {wp.shape[1] * 2 / max(ws.shape[1], 1):g}, expected 16)"
        gs = params.get("weight_global_scale")
        if gs is None or gs.dtype != "F32" or gs.numel != 1:
            return "INVALID-PACKED", "weight_global_scale missing or not F32 [1]"
        return "NVFP4", ""
    w = params.get("weight")
    if w is not None and w.dtype == "U8" and ws is not None and ws.dtype in ("U8", "F8_E8M0") and len(w.shape) == 2:
        if len(ws.shape) == 2 and ws.shape[1] * 32 == w.shape[1] * 2:
            return "MXFP4", ""
        return "INVALID-PACKED", f"U8 weight with a {ws.dtype} scale of {list(ws.shape)} fits neither NVFP4 nor MXFP4"
    dtypes = sorted({t.dtype for t in params.values()})
    return "+".join(dtypes), ""


def _engine_classes(component: str) -> tuple[str, ...]:
    return ("FusedMoE", "Linear") if component == "routed_expert" else ("Linear",)


def engine_scheme(name: str, component: str, ignore: list[str], groups: list[qr.ConfigGroup]) -> tuple[str | None, str]:
    """The config group SGLang 0.5.23 would apply to a module, or None (unquantized).

    Returns ``(group name or None, note)``; note is ``"unmatched"`` when SGLang would raise
    ``Unable to find matching target`` (utils.py 143-147), ``"never"`` for modules built without
    a quant_config, ``"ignored"`` when an ignore entry matches.
    """
    kind = _ENGINE_KIND.get(component, "linear")
    if kind == "never":
        return None, "never"
    if qr.ignore_list(tuple(ignore)).sglang(name):
        return None, "ignored"
    for g in groups:  # pass 1: names (exact or re:), in config order
        if any(not t.startswith("re:") and t == name or t.startswith("re:") and qr.ct_match_name(name, t) for t in g.targets):
            return g.name, "name"
    if kind == "name":
        return None, "untargeted"
    classes = _engine_classes(component)
    for g in groups:  # pass 2: class names, case-insensitive substring
        if any(not t.startswith("re:") and qr.sglang_target_match("", classes, t) for t in g.targets):
            return g.name, "class"
    return None, "unmatched"


def ct_scheme(name: str, component: str, ignore: list[str], groups: list[qr.ConfigGroup]) -> str | None:
    """The group compressed-tensors' ``is_match`` would give (exact / ``re:`` names, exact class)."""
    if _ENGINE_KIND.get(component, "linear") == "never":
        return None
    classes = ("Linear",) if component != "embedding" else ("Embedding",)
    if qr.ignore_list(tuple(ignore)).ct(name, classes):
        return None
    for g in groups:
        if any(qr.ct_is_match(name, classes, t) for t in g.targets):
            return g.name
    return None


def ranges(xs: list[int]) -> str:
    """``[2, 3, 4, 7]`` -> ``"2-4, 7"``."""
    xs = sorted(set(xs))
    parts, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(f"{xs[i]}" if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ", ".join(parts)


def build_modules(headers: CheckpointHeaders) -> dict[str, CheckpointModule]:
    """Group the tensors by module (name minus its last part) and classify each module."""
    groups: dict[str, dict[str, TensorHeader]] = defaultdict(dict)
    for name, t in headers.tensors.items():
        mod, _, param = name.rpartition(".")
        groups[mod][param] = t
    modules = {}
    for mod, params in groups.items():
        first = next(iter(params))
        layer, comp, expert, proj = classify(mod, first)
        m = CheckpointModule(mod, layer, comp, expert, proj, params)
        m.fmt, m.problem = module_format(params)
        modules[mod] = m
    return modules


def is_weighted_linear(m: CheckpointModule) -> bool:
    """A module the config's Linear targets can address: a 2-D weight (or packed weight)."""
    w = m.params.get("weight_packed") or m.params.get("weight")
    return w is not None and len(w.shape) == 2


def build_tables(modules: dict[str, CheckpointModule], nl: int, nn: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The precision table (card row x stored precision: modules, tensors, bytes, layers) and the
    per-layer counts (packed FP4 weights, their scale tensors, plain tensors)."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    mla_layers = {m.layer for m in modules.values() if m.name.endswith("attention.kv_a_proj_with_mqa")}
    per_layer: dict[int, Counter[str]] = defaultdict(Counter)
    for m in modules.values():
        row = f"layer {m.layer} (NEXTN/MTP)" if m.layer >= nl else CARD_ROWS.get(m.component, "other")
        # packed modules count as their format; plain modules per tensor dtype (router: BF16 + F32 bias)
        by_prec = {m.fmt: list(m.params.values())} if m.packed else defaultdict(list)
        if not m.packed:
            for t in m.params.values():
                by_prec[t.dtype].append(t)
        for prec, ts in by_prec.items():
            r = rows.setdefault((row, prec), {"component": row, "precision": prec, "modules": 0, "tensors": 0,
                                              "bytes": 0, "layers": set(), "parts": Counter()})
            r["modules"] += 1
            r["tensors"] += len(ts)
            r["bytes"] += sum(t.nbytes for t in ts)
            if m.layer >= 0:
                r["layers"].add(m.layer)
            r["parts"][m.component] += 1
        c = per_layer[m.layer]
        c["tensors"] += len(m.params)
        if m.packed:
            c["packed"] += sum(1 for p in m.params if p in ("weight_packed", "weight"))
            c["scale"] += sum(1 for p in m.params if p not in ("weight_packed", "weight"))
            c["packed_modules"] += 1
        else:
            c["plain"] += len(m.params)
    order = list(dict.fromkeys(CARD_ROWS.values()))
    table = sorted(rows.values(), key=lambda r: (r["component"].startswith("layer"), order.index(r["component"])
                                                 if r["component"] in order else 99, r["component"], r["precision"]))
    for r in table:
        r["layers"] = ranges(sorted(r["layers"])) if r["layers"] else "-"
        r["parts"] = dict(r["parts"])
    layer_rows = []
    for layer in sorted(per_layer):
        c = per_layer[layer]
        layer_rows.append({"layer": layer if layer >= 0 else "non-layer",
                           "attention": "MLA" if layer in mla_layers else ("KDA" if layer >= 0 else "-"),
                           "mtp": layer >= nl, "tensors": c["tensors"], "packed": c["packed"], "scale": c["scale"],
                           "plain": c["plain"], "packed_modules": c["packed_modules"]})
    return table, layer_rows
