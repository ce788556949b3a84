"""Config-only rules of the checkpoint audit: target/ignore matching, scheme kind, who can serve
it, and the grouped-routing limits.

Matching is implemented twice, because the quantizer and the server do not agree:

* compressed-tensors 0.18.0 (what llmcompressor writes the config for),
  ``compressed_tensors/utils/match.py``: ``match_name`` (lines 422-445) is ``re.match`` on the
  name after a ``re:`` prefix (line 443, anchored at the start only) and exact equality
  otherwise; ``_match_class`` (448-466) compares the target with the class names of the module's
  MRO (``LinearBase`` counts as ``Linear``); ``is_match`` (344-383) = any target matches by name
  or class and no ignore entry does. ``match_quantizable_tensors`` (469-523, the model-free path)
  skips modules whose name ends in ``norm`` (502) and treats ``"Linear"`` in targets as
  "every module" (513).
* SGLang 0.5.23, ``srt/layers/quantization/compressed_tensors/utils.py``:
  ``check_equal_or_regex_match`` (79-100) lets a plain ignore entry also match a dotted-path
  *suffix* (``layer_name.endswith("." + target)``), regex entries use ``re.match`` (171-189);
  ``find_matched_target`` (103-149) tries names first, then the module's class name as a
  case-insensitive substring, and raises ``ValueError`` when nothing matches (143-147).
  ``compressed_tensors.py`` ``get_moe_scheme`` (864-900) decides a whole FusedMoE layer from
  expert 0's names only (``layer_name + ".0.gate_proj"`` etc., lines 883-886).

Module classes are not in a checkpoint; the audit infers ``Linear`` for 2-D projection weights
and nothing for norms, convolutions, 1-D parameters, embeddings, the router (SGLang's
``BailingMoEGate`` is a plain ``nn.Module`` with a weight Parameter, ``models/bailing_moe_v3.py``
383-395) and ``lm_head`` (SGLang quantizes the head only when a target names it,
``compressed_tensors.py`` 1095-1143).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..sglang.releases import release_key, version_span

# --- matching -------------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def ct_match_name(name: str, target: str) -> bool:
    """compressed-tensors ``match_name`` (utils/match.py 422-445, no fused map): ``re:`` prefix
    -> ``re.match`` (anchored at the start, not the end); else exact equality."""
    if target.startswith("re:"):
        return _rx(target[3:]).match(name) is not None
    return target == name


def ct_is_match(name: str, classes: tuple[str, ...], target: str) -> bool:
    """compressed-tensors name-or-class match of one target (``is_match`` 344-383 for a single
    target; ``_match_class`` 448-466 compares class names exactly)."""
    return ct_match_name(name, target) or target in classes


def sglang_ignore_match(name: str, target: str) -> bool:
    """SGLang 0.5.23 ``check_equal_or_regex_match`` (compressed_tensors/utils.py 79-100) for one
    ignore entry: regex via ``re.match``, or equal, or a dotted-path suffix of ``name``."""
    if target.startswith("re:"):
        return _rx(target[3:]).match(name) is not None
    return target == name or name.endswith("." + target)


def sglang_target_match(name: str, classes: tuple[str, ...], target: str) -> bool:
    """SGLang ``find_matched_target`` for one target (utils.py 103-189): name equal or ``re:``
    regex, else the class name containing the (non-regex) target, case-insensitively."""
    if target.startswith("re:"):
        return _rx(target[3:]).match(name) is not None
    if target == name:
        return True
    return any(target.lower() in c.lower() for c in classes)


class IgnoreList:
    """An ignore list compiled once: the regex entries joined into one alternation (``re.match``
    of ``(?:p1)|(?:p2)|...`` at position 0 is true exactly when one ``re.match(p_i)`` is), the
    plain entries in a set. Falls back to one regex per entry when they cannot be joined."""

    def __init__(self, entries: list[str] | tuple[str, ...]):
        self.entries = tuple(entries)
        self.plain = frozenset(e for e in entries if not e.startswith("re:"))
        pats = [e[3:] for e in entries if e.startswith("re:")]
        self.rxs: list[re.Pattern[str]] = []
        if pats:
            try:
                self.rxs = [re.compile("|".join(f"(?:{p})" for p in pats))]
            except re.error:
                self.rxs = [_rx(p) for p in pats]

    def _regex(self, name: str) -> bool:
        return any(r.match(name) is not None for r in self.rxs)

    def ct(self, name: str, classes: tuple[str, ...] = ()) -> bool:
        """compressed-tensors: an entry equals the name or a class name, or its regex matches."""
        return name in self.plain or self._regex(name) or any(c in self.plain for c in classes)

    def sglang(self, name: str) -> bool:
        """SGLang: equal, a dotted-path suffix, or the regex matches (utils.py 79-100)."""
        return name in self.plain or self._regex(name) or any(name.endswith("." + p) for p in self.plain)


@lru_cache(maxsize=64)
def ignore_list(entries: tuple[str, ...]) -> IgnoreList:
    """A cached :class:`IgnoreList` for a config's ignore entries."""
    return IgnoreList(entries)


# --- the config ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigGroup:
    """One ``config_groups`` entry: its name, targets and what its args describe."""

    name: str
    targets: tuple[str, ...]
    weights: dict[str, Any] | None
    input_activations: dict[str, Any] | None
    weight_format: str  # NVFP4 / MXFP4 / FP8 / INT4 / ... / unknown
    activation: str  # "A16" (none), "A4-NVFP4", "A8-FP8", or "other"


def weight_format_of(w: dict[str, Any] | None) -> str:
    """Name the stored format a weights-args block implies.

    NVFP4 = 4-bit float, ``tensor_group``, group 16 (SGLang ``_is_fp4a16_nvfp4``/``_is_fp4a4_nvfp4``,
    compressed_tensors.py 589-631); MXFP4 = 4-bit float, ``group``, group 32 (``_is_mxfp4_moe``
    676-696).
    """
    if not w:
        return "none"
    bits, typ, strat, gs = w.get("num_bits"), w.get("type"), w.get("strategy"), w.get("group_size")
    if bits == 4 and typ == "float" and strat == "tensor_group" and gs == 16:
        return "NVFP4"
    if bits == 4 and typ == "float" and strat == "group" and gs == 32:
        return "MXFP4"
    if bits == 8 and typ == "float":
        return "FP8"
    if typ == "int":
        return f"INT{bits}"
    return "unknown"


def activation_kind(a: dict[str, Any] | None) -> str:
    """``A16`` when ``input_activations`` is null (weight-only, e.g. NVFP4A16), ``A4-NVFP4`` for
    the NVFP4 activation block (4-bit float, tensor_group, group 16), else ``A8-FP8``/``other``."""
    if not a:
        return "A16"
    if weight_format_of(a) == "NVFP4":
        return "A4-NVFP4"
    if a.get("num_bits") == 8 and a.get("type") == "float":
        return "A8-FP8"
    return "other"


def parse_groups(qc: dict[str, Any]) -> list[ConfigGroup]:
    """The config groups of a ``quantization_config`` (compressed-tensors layout)."""
    groups = []
    for gname, g in (qc.get("config_groups") or {}).items():
        g = g or {}
        w, a = g.get("weights"), g.get("input_activations")
        groups.append(ConfigGroup(gname, tuple(g.get("targets") or ()), w, a,
                                  weight_format_of(w), activation_kind(a)))
    return groups


def scheme_label(groups: list[ConfigGroup]) -> str:
    """``W4A4`` / ``W4A16`` / ``mixed`` / ``other`` for the NVFP4 groups of a config."""
    kinds = {(g.weight_format, g.activation) for g in groups}
    if kinds == {("NVFP4", "A4-NVFP4")}:
        return "W4A4"
    if kinds == {("NVFP4", "A16")}:
        return "W4A16"
    if len(kinds) > 1:
        return "mixed"
    return "other"


# --- who can serve it -------------------------------------------------------------------------

#: What each release's compressed-tensors config does with an NVFP4 MoE checkpoint, read in its
#: wheel (:data:`SERVING_SOURCES`): ``"crash"``: a weight-only (W4A16) config crashes and W4A4 is
#: refused below Blackwell; ``"marlin"``: W4A16 goes to the Marlin MoE scheme (sm80+) and W4A4
#: falls back to it below Blackwell. Keyed by release because it was read in each wheel (0.5.19's
#: was not): a new release adds one key, and the messages render their ranges from these keys.
NVFP4_MOE_SCHEMES: dict[str, str] = {"0.5.20": "crash", "0.5.21": "crash", "0.5.22": "marlin", "0.5.23": "marlin"}
GPU_GENERATIONS = ("Ampere/Ada (sm80-89)", "Hopper (sm90)", "Blackwell (sm100-120)")


def serving_releases(kind: str | None = None) -> list[str]:
    """Releases of :data:`NVFP4_MOE_SCHEMES` (of ``kind`` only, when given), ascending."""
    return sorted((v for v, k in NVFP4_MOE_SCHEMES.items() if kind in (None, k)), key=release_key)


def serving_span(kind: str | None = None) -> str:
    """:func:`serving_releases` as text ranges over the releases read (``"0.5.22-0.5.23"``)."""
    return version_span(serving_releases(kind), among=serving_releases())


def unkeyed_releases(discovered: list[str]) -> list[str]:
    """Discovered releases from the first one read on that :data:`NVFP4_MOE_SCHEMES` lacks:
    the serving facts a new release still needs (tests require none)."""
    first = release_key(serving_releases()[0])
    return [v for v in discovered if release_key(v) >= first and v not in NVFP4_MOE_SCHEMES]


#: Where each fact comes from (SGLang's released source, the wheels of :data:`NVFP4_MOE_SCHEMES`).
#: Built once at import: the crash releases and the first Marlin one do not move when a release
#: that behaves like the last is added ("+" already covers it).
SERVING_SOURCES = {
    "w4a4-blackwell": "schemes/compressed_tensors_w4a4_nvfp4_moe.py 36-56 (raises unless Blackwell), "
    "get_min_capability 100",
    "w4a4-fallback": f"compressed_tensors.py 962-975 ({serving_releases('marlin')[0]}+: below sm100 -> W4A16 Marlin, "
    "activation quantization ignored)",
    "w4a16-crash": f"{serving_span('crash')} compressed_tensors.py _is_static_tensor_w8a8 reads input_quant.num_bits "
    "with no None guard (AttributeError: 'NoneType' object has no attribute 'num_bits')",
    "w4a16-marlin": f"{serving_releases('marlin')[0]}+ compressed_tensors.py 959-961 CompressedTensorsW4A16Nvfp4MoE; "
    "schemes/compressed_tensors_w4a16_nvfp4_moe.py 186-202 refuses gate/up global scales that differ, "
    "get_min_capability 80",
    "marlin-clamp": "layers/moe/moe_runner/marlin.py 205-209: the Marlin runner passes gemm1_clamp_limit "
                    "only when gemm1_alpha is set, so the SwiGLU clamp is dropped",
}


def serving_matrix(scheme: str, gate_up_shared: bool | None, hidden_size: int | None = None,
                   moe_intermediate_size: int | None = None) -> list[dict[str, str]]:
    """Which SGLang release serves a checkpoint of ``scheme`` on which GPU generation.

    Args:
        scheme: ``"W4A4"`` or ``"W4A16"`` (from :func:`scheme_label`); other values give "unknown".
        gate_up_shared: whether every expert's gate and up ``weight_global_scale`` agree
            (``None``: not measured). The W4A16 Marlin path refuses experts whose scales differ.
        hidden_size, moe_intermediate_size: the Marlin path also needs ``hidden_size % 128 == 0``
            and ``intermediate_size_per_partition % 64 == 0`` (w4a16_nvfp4_moe.py 220-229; TP 1).

    Returns:
        One row per (version, GPU generation): ``version``, ``gpu``, ``path`` (the SGLang MoE
        scheme), ``outcome`` (serves / refused / crash / unknown), ``note``, ``source``.
    """
    rows = []
    why = []
    if gate_up_shared is False:
        why.append("gate/up scales differ -> ValueError")
    if hidden_size is not None and hidden_size % 128:
        why.append(f"hidden_size {hidden_size} % 128 != 0 -> ValueError")
    if moe_intermediate_size is not None and moe_intermediate_size % 64:
        why.append(f"moe_intermediate_size {moe_intermediate_size} % 64 != 0 -> ValueError")
    marlin_refuses = bool(why)
    marlin_note = "weight-only Marlin; clamp dropped" + "".join("; " + w for w in why)
    for v in serving_releases():
        new = NVFP4_MOE_SCHEMES[v] == "marlin"
        for gpu in GPU_GENERATIONS:
            blackwell = gpu.startswith("Blackwell")
            if scheme == "W4A4":
                if blackwell:
                    row = ("CompressedTensorsW4A4Nvfp4MoE", "serves",
                           "W4A4 CUTLASS; uses the gate's global scale for up when they differ",
                           SERVING_SOURCES["w4a4-blackwell"])
                elif new:
                    row = ("CompressedTensorsW4A16Nvfp4MoE (fallback)",
                           "refused" if marlin_refuses else "serves", marlin_note,
                           SERVING_SOURCES["w4a4-fallback"] + "; " + SERVING_SOURCES["w4a16-marlin"])
                else:
                    row = ("CompressedTensorsW4A4Nvfp4MoE", "refused",
                           "ValueError: Current platform does not support NVFP4", SERVING_SOURCES["w4a4-blackwell"])
            elif scheme == "W4A16":
                if new:
                    row = ("CompressedTensorsW4A16Nvfp4MoE", "refused" if marlin_refuses else "serves",
                           marlin_note, SERVING_SOURCES["w4a16-marlin"])
                else:
                    row = ("none", "crash", "AttributeError 'NoneType' ... 'num_bits'", SERVING_SOURCES["w4a16-crash"])
            else:
                row = ("unknown", "unknown", f"scheme {scheme!r} not modelled", "")
            rows.append({"version": v, "gpu": gpu, "path": row[0], "outcome": row[1], "note": row[2], "source": row[3]})
    return rows


# --- grouped routing --------------------------------------------------------------------------

#: FlashInfer's TRT-LLM grouped routing kernel (routingDeepSeek): ``mNumExperts / mNumExpertGroups
#: <= WarpSize`` ("Routing kernel expects #experts per group <= warp size"), ``mNumLimitedGroups <=
#: MaxNumTopGroups`` (4), ``mNumExpertGroups <= MaxNumGroups`` (8), ``mNumExperts % 4 == 0``; the
#: selected groups are read one warp lane per expert into MaxNumTopGroups slots, hence
#: experts-per-group x topk_group <= 4 x 32 = 128 (fault F-05: routing shapes beyond FlashInfer's grouped-routing kernel).
WARP_SIZE = 32
MAX_TOP_GROUPS = 4
MAX_GROUPS = 8
MAX_CANDIDATES = 128


@dataclass(frozen=True)
class RoutingCheck:
    """The routing shape against the grouped-routing limits."""

    num_experts: int
    n_group: int
    topk_group: int
    top_k: int
    experts_per_group: float
    candidates: float  # experts in the selected groups = experts_per_group * topk_group
    status: str  # "invalid" / "over" / "at" / "within" / "ungrouped"
    reasons: tuple[str, ...]


def check_routing(num_experts: int, n_group: int | None, topk_group: int | None, top_k: int) -> RoutingCheck:
    """Classify ``(num_experts, n_group, topk_group, top_k)`` for FlashInfer's grouped routing.

    ``invalid``: the shape cannot route at all (experts not divisible into groups, more selected
    groups than groups, or fewer candidate experts in the selected groups than ``top_k``);
    ``over``: valid but outside the kernel's limits (the TRT-LLM MoE backend refuses it);
    ``at``: some limit met with equality; ``within``: strictly inside; ``ungrouped``: n_group <= 1.

    Examples (fault F-05, routing shapes): (512, 8, 4, 8) over (64 per group > 32, 256 > 128);
    (256, 8, 4, 8) at (32, 128); (16, 8, 1, 8) invalid (2 candidates < top_k 8).
    """
    if not n_group or n_group <= 1:
        return RoutingCheck(num_experts, n_group or 1, topk_group or 1, top_k, float(num_experts),
                            float(num_experts), "ungrouped", ("no expert groups",))
    tg = topk_group or n_group
    epg = num_experts / n_group
    cand = epg * tg
    invalid, over, at = [], [], []
    if num_experts % n_group:
        invalid.append(f"{num_experts} experts do not divide into {n_group} groups")
    if tg > n_group:
        invalid.append(f"topk_group {tg} > n_group {n_group}")
    if cand < top_k:
        invalid.append(f"{cand:g} experts in the {tg} selected group(s) < top_k {top_k}")
    for value, limit, what, edge in ((epg, WARP_SIZE, "experts per group", True),
                                     (cand, MAX_CANDIDATES, "experts per group x topk_group", True),
                                     (tg, MAX_TOP_GROUPS, "topk_group", False), (n_group, MAX_GROUPS, "n_group", False)):
        if value > limit:
            over.append(f"{what} {value:g} > {limit}")
        elif value == limit and edge:  # "at the limits" = the two F-05 names (per-group, candidates)
            at.append(f"{what} {value:g} = {limit}")
    if num_experts % 4:
        over.append(f"{num_experts} experts not a multiple of 4")
    status = "invalid" if invalid else "over" if over else "at" if at else "within"
    return RoutingCheck(num_experts, n_group, tg, top_k, epg, cand, status, tuple(invalid + over + at))
