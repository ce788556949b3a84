"""Per-module checks of the audit: the scheme SGLang gives each module against what is stored.

:func:`apply_schemes` decides each Linear module's scheme by SGLang's rules, :func:`check_mismatches`
compares it with the stored format (including the MTP verdicts F-02 (ii)/(iii) and F-03),
:func:`check_mtp` reports the state of each MTP (NEXTN) layer (F-02 (i): missing), and
:func:`check_counts` sets measured counts beside the closed forms of :func:`count_formulas`.
Each check appends :class:`~nvfp4study.checkpoint.findings.AuditFinding` objects and returns what it measured.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from . import quant_rules as qr
from .findings import AuditCode, AuditFinding, Severity
from .modules import (
    _ENGINE_KIND,
    PACKED_FORMATS,
    CheckpointModule,
    ct_scheme,
    engine_scheme,
    is_weighted_linear,
    ranges,
)


def count_formulas(config: dict[str, Any], mtp_other_tensors: int | None = None) -> dict[str, dict[str, Any]]:
    """Closed-form counts of the NVFP4 Ling layout from a config (what the card's numbers are).

    Args:
        config: a Ling ``config.json`` dict (``num_hidden_layers``, ``first_k_dense_replace``,
            ``num_experts``, ``layer_group_size``, ``num_nextn_predict_layers``).
        mtp_other_tensors: the MTP layer's non-expert tensors (a structural constant measured
            from the files; sizes do not change it). ``None`` leaves ``mtp_layer_tensors`` out.

    Returns:
        ``{key: {"value": int, "formula": str}}`` for ``quantized_expert_modules`` (3 x E x MoE
        trunk layers; 61,440 for 42 layers, 2 dense, 512 experts), ``input_global_scales`` (one
        per quantized expert projection), ``mla_layers`` (floor(layers / layer_group_size) + MTP),
        ``mla_kv_unpacked`` (kv_a_proj_with_mqa + kv_b_proj per MLA layer: 16 on the real model)
        and ``mtp_layer_tensors`` (3 x E + others).
    """
    nl, fk = int(config["num_hidden_layers"]), int(config.get("first_k_dense_replace") or 0)  # null as absent
    e, lg = int(config.get("num_experts") or 0), int(config.get("layer_group_size") or 0)
    nn = int(config.get("num_nextn_predict_layers") or 0)
    mla = (nl // lg if lg else 0) + nn
    out = {
        "quantized_expert_modules": {"value": 3 * e * (nl - fk),
                                     "formula": f"3 x num_experts x (num_hidden_layers - first_k_dense_replace) = 3 x {e} x ({nl} - {fk})"},
        "input_global_scales": {"value": 3 * e * (nl - fk), "formula": f"one per quantized expert projection = 3 x {e} x {nl - fk}"},
        "mla_layers": {"value": mla, "formula": f"floor(num_hidden_layers / layer_group_size) + num_nextn_predict_layers = {nl // lg if lg else 0} + {nn}"},
        "mla_kv_unpacked": {"value": 2 * mla, "formula": f"2 (kv_a_proj_with_mqa, kv_b_proj) x MLA layers = 2 x {mla}"},
    }
    if mtp_other_tensors is not None and nn:
        out["mtp_layer_tensors"] = {"value": 3 * e + mtp_other_tensors,
                                    "formula": f"3 x num_experts + other tensors of the MTP layer = 3 x {e} + {mtp_other_tensors}"}
    return out


def apply_schemes(modules: dict[str, CheckpointModule], ignore: list[str], groups: list[qr.ConfigGroup],
                   findings: list[AuditFinding]) -> None:
    """Set ``engine`` on every addressable module (SGLang's rules; experts per layer from expert 0)
    and report where compressed-tensors' rules would disagree."""
    layer_moe: dict[int, tuple[str | None, str]] = {}
    expert_layers = sorted({m.layer for m in modules.values() if m.component == "routed_expert"})
    for layer in expert_layers:
        base = f"model.layers.{layer}.mlp.experts.0."
        picks = [engine_scheme(base + p, "routed_expert", ignore, groups) for p in ("gate_proj", "up_proj", "down_proj")]
        if len({p[0] for p in picks}) > 1:
            findings.append(AuditFinding(AuditCode.MOE_SCHEME_SPLIT, Severity.ERROR,
                                    f"layer {layer}: expert 0's gate/up/down get different schemes {[p[0] for p in picks]}; "
                                    "SGLang raises 'All MoE projections need to have same quantization scheme' "
                                    "(compressed_tensors.py 887-896)", [base + p for p in ("gate_proj", "up_proj", "down_proj")], [layer]))
        layer_moe[layer] = picks[0]
    differ: list[str] = []
    for m in modules.values():
        if not is_weighted_linear(m):
            continue
        if m.component == "routed_expert":
            m.engine, m.engine_note = layer_moe[m.layer]
            m.engine_note = f"layer rule (expert 0): {m.engine_note}"
        else:
            m.engine, m.engine_note = engine_scheme(m.name, m.component, ignore, groups)
        if _ENGINE_KIND.get(m.component) != "never" and ct_scheme(m.name, m.component, ignore, groups) != m.engine \
                and "unmatched" not in m.engine_note:
            differ.append(m.name)
    if differ:
        findings.append(AuditFinding(AuditCode.IGNORE_SEMANTICS_DIFFER, Severity.INFO,
                                f"{len(differ)} modules get a different scheme under compressed-tensors' matching "
                                "(exact / re: names, exact class; utils/match.py 344-466) than under SGLang's "
                                "(dotted-suffix ignore, class substring, one decision per MoE layer from expert 0)",
                                differ[:200], sorted({modules[n].layer for n in differ}), {"count": len(differ)}))


def check_mismatches(modules: dict[str, CheckpointModule], groups: list[qr.ConfigGroup], mtp: set[int],
                trunk_fmt: str | None, findings: list[AuditFinding]) -> None:
    """Compare each addressable module's stored format with the scheme SGLang applies to it:
    TARGETED_BUT_PLAIN / PACKED_BUT_IGNORED / FORMAT_MISMATCH / UNMATCHED_LINEAR, and in the MTP
    layers the F-02 (ii)/(iii) and F-03 verdicts; PACKED_LAYOUT_INVALID for bad packed modules."""
    fmt_of = {g.name: g.weight_format for g in groups}
    buckets: dict[AuditCode, list[CheckpointModule]] = defaultdict(list)
    for m in modules.values():
        if m.fmt == "INVALID-PACKED":
            buckets[AuditCode.PACKED_LAYOUT_INVALID].append(m)
        if not is_weighted_linear(m):
            continue
        in_mtp = m.layer in mtp
        if "unmatched" in m.engine_note:
            buckets[AuditCode.UNMATCHED_LINEAR].append(m)
        elif m.engine is not None and not m.packed:
            buckets[AuditCode.F02_MTP_BF16_NOT_IGNORED if in_mtp else AuditCode.TARGETED_BUT_PLAIN].append(m)
        elif m.engine is None and m.packed:
            buckets[AuditCode.F02_MTP_PACKED_BUT_IGNORED if in_mtp else AuditCode.PACKED_BUT_IGNORED].append(m)
        elif m.engine is not None and m.packed and m.fmt != fmt_of.get(m.engine) and m.fmt != "INVALID-PACKED":
            buckets[AuditCode.FORMAT_MISMATCH].append(m)
        if in_mtp and m.component == "routed_expert" and m.fmt in PACKED_FORMATS and trunk_fmt and m.fmt != trunk_fmt:
            buckets[AuditCode.F03_MTP_FORMAT_DIFFERS].append(m)
    texts = {
        AuditCode.PACKED_LAYOUT_INVALID: "packed tensors whose scales do not fit NVFP4 or MXFP4",
        AuditCode.UNMATCHED_LINEAR: "Linear modules neither ignored nor targeted: SGLang raises 'Unable to find "
                               "matching target' (compressed_tensors/utils.py 143-147)",
        AuditCode.TARGETED_BUT_PLAIN: "modules stored in plain precision that the config targets: the engine "
                                 "builds an FP4 module over them",
        AuditCode.PACKED_BUT_IGNORED: "packed modules the config ignores: the engine expects plain weights",
        AuditCode.FORMAT_MISMATCH: "packed modules in a format different from the config scheme that targets them",
        AuditCode.F02_MTP_BF16_NOT_IGNORED: "MTP layer stored in plain precision but no ignore pattern matches it: "
                                       "the engine builds an FP4 draft over BF16 tensors (card: accept len 1.00, accept rate 0.00)",
        AuditCode.F02_MTP_PACKED_BUT_IGNORED: "MTP layer experts are packed while ignore claims the layer stays BF16",
        AuditCode.F03_MTP_FORMAT_DIFFERS: f"MTP layer experts are in a different FP4 format from the trunk's {trunk_fmt}",
    }
    for code, ms in buckets.items():
        layers = sorted({m.layer for m in ms})
        fmts = Counter(m.fmt for m in ms)
        findings.append(AuditFinding(code, Severity.ERROR, f"{len(ms)} {texts[code]}; layers {ranges(layers)}; stored {dict(fmts)}",
                                [m.name for m in ms], layers,
                                {"count": len(ms), "formats": dict(fmts),
                                 "problems": sorted({m.problem for m in ms if m.problem})[:20]}))


def check_mtp(modules: dict[str, CheckpointModule], config: dict[str, Any], ignore: list[str],
               trunk_fmt: str | None, findings: list[AuditFinding]) -> list[dict[str, Any]]:
    """The MTP layers' state: present?, packed/plain tensor counts, ignored?, verdict."""
    nl = int(config["num_hidden_layers"])
    nn = int(config.get("num_nextn_predict_layers") or 0)
    by_layer: dict[int, list[CheckpointModule]] = defaultdict(list)
    for m in modules.values():
        if m.layer >= nl:
            by_layer[m.layer].append(m)
    extra = sorted(set(by_layer) - set(range(nl, nl + nn)))
    if extra:
        findings.append(AuditFinding(AuditCode.MTP_UNDECLARED, Severity.INFO,
                                f"layers {ranges(extra)} are stored but num_nextn_predict_layers is {nn}: "
                                "the engine never loads them", layers=extra))
    out = []
    for layer in range(nl, nl + nn):
        ms = by_layer.get(layer, [])
        tensors = [t for m in ms for t in m.params.values()]
        packed = sum(len(m.params) for m in ms if m.packed)
        experts = [m for m in ms if m.component == "routed_expert"]
        efmt = Counter(m.fmt for m in experts)
        probe = f"model.layers.{layer}.mlp.experts.0.gate_proj"
        ignored_by = [ig for ig in ignore if qr.sglang_ignore_match(probe, ig)]
        row = {"layer": layer, "tensors": len(tensors), "packed_tensors": packed, "plain_tensors": len(tensors) - packed,
               "expert_modules": len(experts), "expert_formats": dict(efmt),
               "other_tensors": sum(len(m.params) for m in ms if m.component != "routed_expert"),
               "dtypes": dict(Counter(t.dtype for t in tensors)),
               "ignored_by": ignored_by, "ignore_first_matches": bool(ignore) and qr.sglang_ignore_match(probe, ignore[0]),
               "engine_scheme": experts[0].engine if experts else None, "state": ""}
        codes = {f.code for f in findings if layer in f.layers}
        if not tensors:
            row["state"] = "missing"
            findings.append(AuditFinding(AuditCode.F02_MTP_MISSING, Severity.ERROR,
                                    f"num_nextn_predict_layers = {nn} but no model.layers.{layer}.* tensor exists: "
                                    "the NEXTN draft has no weights", [f"model.layers.{layer}.*"], [layer]))
        elif AuditCode.F02_MTP_BF16_NOT_IGNORED in codes:
            row["state"] = "bf16-not-ignored"
        elif AuditCode.F02_MTP_PACKED_BUT_IGNORED in codes:
            row["state"] = "packed-but-ignored"
        elif AuditCode.F03_MTP_FORMAT_DIFFERS in codes:
            row["state"] = "format-differs"
        elif packed == 0:
            row["state"] = "bf16-ignored"
            findings.append(AuditFinding(AuditCode.MTP_BF16_IGNORED, Severity.INFO,
                                    f"MTP layer {layer}: {len(tensors)} tensors, all plain "
                                    f"({', '.join(sorted({t.dtype for t in tensors}))}), ignored by {ignored_by}", layers=[layer]))
        else:
            row["state"] = "quantized"
            findings.append(AuditFinding(AuditCode.MTP_QUANTIZED, Severity.INFO,
                                    f"MTP layer {layer}: experts stored {dict(efmt)} and targeted by the config "
                                    f"(same format as the trunk's {trunk_fmt})", layers=[layer]))
        out.append(row)
    return out


def check_counts(modules: dict[str, CheckpointModule], config: dict[str, Any], findings: list[AuditFinding], scheme: str) -> dict[str, Any]:
    """Measured counts (quantized expert projections, input scales, unpacked MLA kv projections,
    MTP layer tensors) beside :func:`count_formulas` on the audited config; a difference is a
    COUNT_FORMULA_MISMATCH warning, experts per layer other than ``num_experts`` an
    EXPERT_COUNT_MISMATCH warning."""
    nl = int(config["num_hidden_layers"])
    trunk_q = [m for m in modules.values() if m.component == "routed_expert" and m.fmt == "NVFP4" and m.layer < nl]
    mtp_first = [m for m in modules.values() if m.layer == nl]
    mtp_other = sum(len(m.params) for m in mtp_first if m.component != "routed_expert")
    kv = [m for m in modules.values() if m.component == "mla_proj" and m.proj in ("kv_a_proj_with_mqa", "kv_b_proj") and not m.packed]
    mla_parts = Counter(m.proj for m in modules.values() if m.component == "mla_proj" and not m.packed)
    measured = {
        "quantized_expert_modules": len(trunk_q),
        "input_global_scales": sum(1 for m in trunk_q if "input_global_scale" in m.params),
        "mla_kv_unpacked": len(kv),
        "mtp_layer_tensors": sum(len(m.params) for m in mtp_first),
        "mtp_packed_tensors": sum(len(m.params) for m in mtp_first if m.packed),
        "mtp_other_tensors": mtp_other,
        "mla_unpacked_by_module": dict(mla_parts),
        "total_tensors": sum(len(m.params) for m in modules.values()),
        "packed_modules": sum(1 for m in modules.values() if m.packed),
    }
    formulas = count_formulas(config, mtp_other if mtp_first else None)
    ids: dict[int, set[int]] = defaultdict(set)
    for m in modules.values():
        if m.component == "routed_expert":
            ids[m.layer].add(m.expert)
    want = set(range(int(config.get("num_experts") or 0)))
    off = sorted(la for la, s in ids.items() if s != want)
    if off:
        findings.append(AuditFinding(AuditCode.EXPERT_COUNT_MISMATCH, Severity.WARNING,
                                f"layers {ranges(off)} store experts {sorted({len(ids[la]) for la in off})} "
                                f"where num_experts is {len(want)}", layers=off))
    for key in ("quantized_expert_modules", "mla_kv_unpacked") + (("input_global_scales",) if scheme == "W4A4" else ()):
        if measured[key] != formulas[key]["value"]:
            findings.append(AuditFinding(AuditCode.COUNT_FORMULA_MISMATCH, Severity.WARNING,
                                    f"{key}: measured {measured[key]}, the layout formula gives {formulas[key]['value']} "
                                    f"({formulas[key]['formula']})", details={"key": key}))
    return {"measured": measured, "formulas": formulas}
