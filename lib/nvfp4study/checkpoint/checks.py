"""The audit's checks: each appends :class:`Finding` objects and returns what it measured.

Codes ``F0n-*`` are the verdicts of bug-reports.md's faults F-01..F-05; the others are the
audit's own. Severity ``error`` makes ``nvfp4study audit-checkpoint`` exit 1.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from . import quant_rules as qr
from .header import CheckpointHeaders, read_scalars
from .modules import (
    _ENGINE_KIND,
    PACKED_FORMATS,
    Module,
    ct_scheme,
    engine_scheme,
    is_weighted_linear,
    ranges,
)


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class Code(StrEnum):
    """Finding codes. ``F0n-*`` are the verdicts of the bug-reports faults F-01..F-05."""

    F01_INPUT_SCALE_MISSING = "F01-input-scale-missing"
    F01_INPUT_SCALE_NONFINITE = "F01-input-scale-nonfinite"
    F02_MTP_MISSING = "F02-mtp-missing"
    F02_MTP_BF16_NOT_IGNORED = "F02-mtp-bf16-not-ignored"
    F02_MTP_PACKED_BUT_IGNORED = "F02-mtp-packed-but-ignored"
    F03_MTP_FORMAT_DIFFERS = "F03-mtp-format-differs"
    F04_CONFIG_W4A16 = "F04-config-w4a16"
    F05_ROUTING_OVER_LIMIT = "F05-routing-over-limit"
    F05_ROUTING_AT_LIMIT = "F05-routing-at-limit"
    F05_ROUTING_INVALID = "F05-routing-invalid"
    CONFIG_W4A4 = "config-w4a4"
    CONFIG_SCHEME_OTHER = "config-scheme-other"
    CONFIG_NOT_COMPRESSED_TENSORS = "config-not-compressed-tensors"
    ROUTING_WITHIN = "routing-within-limits"
    ROUTING_UNKNOWN = "routing-unknown"
    MTP_BF16_IGNORED = "mtp-bf16-ignored"
    MTP_QUANTIZED = "mtp-quantized"
    MTP_UNDECLARED = "mtp-undeclared"
    TARGETED_BUT_PLAIN = "targeted-but-plain"
    PACKED_BUT_IGNORED = "packed-but-ignored"
    FORMAT_MISMATCH = "format-mismatch"
    UNMATCHED_LINEAR = "unmatched-linear"
    MOE_SCHEME_SPLIT = "moe-scheme-split"
    IGNORE_SEMANTICS_DIFFER = "ignore-semantics-differ"
    PACKED_LAYOUT_INVALID = "packed-layout-invalid"
    SCALE_LAYOUT_INVALID = "scale-layout-invalid"
    WEIGHT_SCALE_NONFINITE = "weight-scale-nonfinite"
    INPUT_SCALE_UNEXPECTED = "input-scale-unexpected"
    GATE_UP_SCALE_MISMATCH = "gate-up-scale-mismatch"
    GATE_UP_SCALE_SHARED = "gate-up-scale-shared"
    SCALES_ALL_IDENTICAL = "scales-all-identical"
    DUPLICATE_TENSOR = "duplicate-tensor"
    INDEX_UNLISTED_TENSOR = "index-unlisted-tensor"
    CLAMP_LIST_LENGTH = "clamp-list-length"
    COUNT_FORMULA_MISMATCH = "count-formula-mismatch"
    EXPERT_COUNT_MISMATCH = "expert-count-mismatch"
    VALUES_NOT_READ = "values-not-read"
    SHARED_FUSION_VETOED = "shared-fusion-vetoed"
    SHARED_FUSION_ON = "shared-fusion-on"


FAULT_CODES = frozenset(c for c in Code if c.value.startswith("F0"))


@dataclass
class Finding:
    """One audit result: a code, a severity, what it concerns and a sentence."""

    code: Code
    severity: Severity
    message: str
    tensors: list[str] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code.value, "severity": self.severity.value, "tensors": self.tensors,
                "layers": self.layers, "message": self.message, "details": self.details}


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
    nl, fk = int(config["num_hidden_layers"]), int(config.get("first_k_dense_replace", 0))
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


def apply_schemes(modules: dict[str, Module], ignore: list[str], groups: list[qr.ConfigGroup],
                   findings: list[Finding]) -> None:
    """Set ``engine`` on every addressable module (SGLang's rules; experts per layer from expert 0)
    and report where compressed-tensors' rules would disagree."""
    layer_moe: dict[int, tuple[str | None, str]] = {}
    expert_layers = sorted({m.layer for m in modules.values() if m.component == "routed_expert"})
    for layer in expert_layers:
        base = f"model.layers.{layer}.mlp.experts.0."
        picks = [engine_scheme(base + p, "routed_expert", ignore, groups) for p in ("gate_proj", "up_proj", "down_proj")]
        if len({p[0] for p in picks}) > 1:
            findings.append(Finding(Code.MOE_SCHEME_SPLIT, Severity.ERROR,
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
        findings.append(Finding(Code.IGNORE_SEMANTICS_DIFFER, Severity.INFO,
                                f"{len(differ)} modules get a different scheme under compressed-tensors' matching "
                                "(exact / re: names, exact class; utils/match.py 344-466) than under SGLang's "
                                "(dotted-suffix ignore, class substring, one decision per MoE layer from expert 0)",
                                differ[:200], sorted({modules[n].layer for n in differ}), {"count": len(differ)}))


def check_mismatches(modules: dict[str, Module], groups: list[qr.ConfigGroup], mtp: set[int],
                trunk_fmt: str | None, findings: list[Finding]) -> None:
    """Compare each addressable module's stored format with the scheme SGLang applies to it:
    TARGETED_BUT_PLAIN / PACKED_BUT_IGNORED / FORMAT_MISMATCH / UNMATCHED_LINEAR, and in the MTP
    layers the F-02 (ii)/(iii) and F-03 verdicts; PACKED_LAYOUT_INVALID for bad packed modules."""
    fmt_of = {g.name: g.weight_format for g in groups}
    buckets: dict[Code, list[Module]] = defaultdict(list)
    for m in modules.values():
        if m.fmt == "INVALID-PACKED":
            buckets[Code.PACKED_LAYOUT_INVALID].append(m)
        if not is_weighted_linear(m):
            continue
        in_mtp = m.layer in mtp
        if "unmatched" in m.engine_note:
            buckets[Code.UNMATCHED_LINEAR].append(m)
        elif m.engine is not None and not m.packed:
            buckets[Code.F02_MTP_BF16_NOT_IGNORED if in_mtp else Code.TARGETED_BUT_PLAIN].append(m)
        elif m.engine is None and m.packed:
            buckets[Code.F02_MTP_PACKED_BUT_IGNORED if in_mtp else Code.PACKED_BUT_IGNORED].append(m)
        elif m.engine is not None and m.packed and m.fmt != fmt_of.get(m.engine) and m.fmt != "INVALID-PACKED":
            buckets[Code.FORMAT_MISMATCH].append(m)
        if in_mtp and m.component == "routed_expert" and m.fmt in PACKED_FORMATS and trunk_fmt and m.fmt != trunk_fmt:
            buckets[Code.F03_MTP_FORMAT_DIFFERS].append(m)
    texts = {
        Code.PACKED_LAYOUT_INVALID: "packed tensors whose scales do not fit NVFP4 or MXFP4",
        Code.UNMATCHED_LINEAR: "Linear modules neither ignored nor targeted: SGLang raises 'Unable to find "
                               "matching target' (compressed_tensors/utils.py 143-147)",
        Code.TARGETED_BUT_PLAIN: "modules stored in plain precision that the config targets: the engine "
                                 "builds an FP4 module over them",
        Code.PACKED_BUT_IGNORED: "packed modules the config ignores: the engine expects plain weights",
        Code.FORMAT_MISMATCH: "packed modules in a format different from the config scheme that targets them",
        Code.F02_MTP_BF16_NOT_IGNORED: "MTP layer stored in plain precision but no ignore pattern matches it: "
                                       "the engine builds an FP4 draft over BF16 tensors (card: accept len 1.00, accept rate 0.00)",
        Code.F02_MTP_PACKED_BUT_IGNORED: "MTP layer experts are packed while ignore claims the layer stays BF16",
        Code.F03_MTP_FORMAT_DIFFERS: f"MTP layer experts are in a different FP4 format from the trunk's {trunk_fmt}",
    }
    for code, ms in buckets.items():
        layers = sorted({m.layer for m in ms})
        fmts = Counter(m.fmt for m in ms)
        findings.append(Finding(code, Severity.ERROR, f"{len(ms)} {texts[code]}; layers {ranges(layers)}; stored {dict(fmts)}",
                                [m.name for m in ms], layers,
                                {"count": len(ms), "formats": dict(fmts),
                                 "problems": sorted({m.problem for m in ms if m.problem})[:20]}))


def check_mtp(modules: dict[str, Module], config: dict[str, Any], ignore: list[str],
               trunk_fmt: str | None, findings: list[Finding]) -> list[dict[str, Any]]:
    """The MTP layers' state: present?, packed/plain tensor counts, ignored?, verdict."""
    nl = int(config["num_hidden_layers"])
    nn = int(config.get("num_nextn_predict_layers") or 0)
    by_layer: dict[int, list[Module]] = defaultdict(list)
    for m in modules.values():
        if m.layer >= nl:
            by_layer[m.layer].append(m)
    extra = sorted(set(by_layer) - set(range(nl, nl + nn)))
    if extra:
        findings.append(Finding(Code.MTP_UNDECLARED, Severity.INFO,
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
            findings.append(Finding(Code.F02_MTP_MISSING, Severity.ERROR,
                                    f"num_nextn_predict_layers = {nn} but no model.layers.{layer}.* tensor exists: "
                                    "the NEXTN draft has no weights", [f"model.layers.{layer}.*"], [layer]))
        elif Code.F02_MTP_BF16_NOT_IGNORED in codes:
            row["state"] = "bf16-not-ignored"
        elif Code.F02_MTP_PACKED_BUT_IGNORED in codes:
            row["state"] = "packed-but-ignored"
        elif Code.F03_MTP_FORMAT_DIFFERS in codes:
            row["state"] = "format-differs"
        elif packed == 0:
            row["state"] = "bf16-ignored"
            findings.append(Finding(Code.MTP_BF16_IGNORED, Severity.INFO,
                                    f"MTP layer {layer}: {len(tensors)} tensors, all plain "
                                    f"({', '.join(sorted({t.dtype for t in tensors}))}), ignored by {ignored_by}", layers=[layer]))
        else:
            row["state"] = "quantized"
            findings.append(Finding(Code.MTP_QUANTIZED, Severity.INFO,
                                    f"MTP layer {layer}: experts stored {dict(efmt)} and targeted by the config "
                                    f"(same format as the trunk's {trunk_fmt})", layers=[layer]))
        out.append(row)
    return out


def check_scales(modules: dict[str, Module], headers: CheckpointHeaders, scheme: str, read_values: bool,
                  findings: list[Finding]) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """F-01 (input_global_scale per expert), weight scale finiteness, gate/up agreement, copies."""

    q = [m for m in modules.values() if m.fmt == "NVFP4"]
    experts = [m for m in q if m.component == "routed_expert"]
    with_in = [m for m in q if "input_global_scale" in m.params]
    bad_layout = [m.params[p].name for m in q for p in ("input_global_scale", "weight_global_scale")
                  if p in m.params and (m.params[p].dtype != "F32" or m.params[p].numel != 1)]
    if bad_layout:
        findings.append(Finding(Code.SCALE_LAYOUT_INVALID, Severity.ERROR,
                                f"{len(bad_layout)} global scales are not F32 [1]", bad_layout,
                                sorted({modules[n.rpartition('.')[0]].layer for n in bad_layout})))
    missing: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    missing_names = []
    for m in experts:
        if "input_global_scale" not in m.params:
            missing[m.layer][m.proj].append(m.expert)
            missing_names.append(m.name + ".input_global_scale")
    summary: dict[str, Any] = {"nvfp4_modules": len(q), "expert_modules": len(experts),
                               "with_input_global_scale": len(with_in), "missing": len(missing_names),
                               "values_read": False}
    if missing_names and (scheme == "W4A4" or with_in):
        sev = Severity.ERROR if scheme == "W4A4" else Severity.WARNING
        det = {str(layer): {p: sorted(v) for p, v in sorted(d.items())} for layer, d in sorted(missing.items())}
        findings.append(Finding(Code.F01_INPUT_SCALE_MISSING, sev,
                                f"{len(missing_names)} expert projections lack input_global_scale "
                                f"({'W4A4 config: SGLang fills them from torch.empty, NaN logits' if scheme == 'W4A4' else 'inconsistent with the others'}); "
                                + "; ".join(f"layer {k}: " + ", ".join(f"{p} {v}" for p, v in d.items()) for k, d in list(det.items())[:4]),
                                missing_names, sorted(missing), {"missing": det}))
    if scheme == "W4A16" and with_in:
        findings.append(Finding(Code.INPUT_SCALE_UNEXPECTED, Severity.WARNING,
                                f"{len(with_in)} input_global_scale tensors with a W4A16 config: SGLang's W4A16 Marlin "
                                "scheme registers them only for W4A4 checkpoints; its docstring says the expert loader "
                                "raises KeyError for a tensor with no destination (compressed_tensors_w4a16_nvfp4_moe.py 35-39)",
                                [m.name + ".input_global_scale" for m in with_in[:200]]))
    gate_up: list[dict[str, Any]] = []
    gsum: dict[str, Any] = {"pairs": 0, "mismatched": 0}
    if not read_values:
        findings.append(Finding(Code.VALUES_NOT_READ, Severity.INFO,
                                "scale values not read (header-only mode): finiteness, gate/up and copied-scale checks skipped"))
        return summary, gate_up, gsum
    names = [m.params[p].name for m in q for p in ("weight_global_scale", "input_global_scale")
             if p in m.params and m.params[p].numel == 1]
    vals = read_scalars(headers, names)
    summary["values_read"] = True
    ins = {m.name: vals.get(m.params["input_global_scale"].name) for m in with_in}
    bad_in: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    bad_in_names = []
    for m in with_in:
        v = ins[m.name]
        if v is None or not math.isfinite(v) or v <= 0:
            bad_in[m.layer][m.proj or m.component].append(m.expert)
            bad_in_names.append(m.params["input_global_scale"].name)
    finite_in = [v for v in ins.values() if v is not None and math.isfinite(v)]
    summary.update({"input_values": dict(Counter(finite_in).most_common(5)),
                    "input_nonfinite_or_nonpositive": len(bad_in_names),
                    "input_all_one": bool(finite_in) and all(v == 1.0 for v in finite_in) and not bad_in_names})
    if bad_in_names:
        det = {str(layer): {p: sorted(v) for p, v in d.items()} for layer, d in sorted(bad_in.items())}
        findings.append(Finding(Code.F01_INPUT_SCALE_NONFINITE, Severity.ERROR,
                                f"{len(bad_in_names)} input_global_scale values are 0, negative, NaN or inf "
                                "(alpha = 1 / input_global_scale x ... becomes inf/NaN); "
                                + "; ".join(f"layer {k}: " + ", ".join(f"{p} {v}" for p, v in d.items()) for k, d in list(det.items())[:4]),
                                bad_in_names, sorted(bad_in), {"nonfinite": det}))
    wgs = {m.name: vals.get(m.params["weight_global_scale"].name) for m in q if "weight_global_scale" in m.params}
    bad_w = [n + ".weight_global_scale" for n, v in wgs.items() if v is None or not math.isfinite(v) or v <= 0]
    if bad_w:
        findings.append(Finding(Code.WEIGHT_SCALE_NONFINITE, Severity.ERROR,
                                f"{len(bad_w)} weight_global_scale values are 0, negative, NaN or inf", bad_w,
                                sorted({modules[n.rpartition('.')[0]].layer for n in bad_w})))
    pairs: dict[tuple[int, int], dict[str, float]] = defaultdict(dict)
    for m in experts:
        if m.name in wgs and m.proj in ("gate_proj", "up_proj"):
            pairs[(m.layer, m.expert)][m.proj] = wgs[m.name]
    mism = []
    for (layer, e), d in sorted(pairs.items()):
        if "gate_proj" in d and "up_proj" in d:
            g, u = d["gate_proj"], d["up_proj"]
            ratio = u / g if g else float("nan")
            close = abs(g - u) <= 1e-8 + 1e-5 * abs(u)  # torch.allclose defaults, as SGLang (w4a4 moe 187-192)
            gate_up.append({"layer": layer, "expert": e, "gate_global_scale": g, "up_global_scale": u,
                            "ratio_up_over_gate": ratio, "up_scale_error": ratio - 1.0, "shared": g == u, "allclose": close})
            if g != u:
                mism.append((layer, e))
    errs = [abs(r["up_scale_error"]) for r in gate_up if math.isfinite(r["up_scale_error"])]
    gsum = {"pairs": len(gate_up), "mismatched": len(mism), "not_allclose": sum(1 for r in gate_up if not r["allclose"]),
            "max_abs_up_scale_error": max(errs) if errs else None,
            "median_abs_up_scale_error": sorted(errs)[len(errs) // 2] if errs else None}
    if mism:
        sev = Severity.ERROR if scheme == "W4A16" else Severity.WARNING
        findings.append(Finding(Code.GATE_UP_SCALE_MISMATCH, sev,
                                f"{len(mism)} of {len(gate_up)} experts have different gate and up weight_global_scale; "
                                "SGLang's W4A4 scheme uses the gate's for both (w4a4_nvfp4_moe.py 187-198), so up_proj is "
                                f"dequantized x up/gate (|error| median {gsum['median_abs_up_scale_error']:.3g}, max "
                                f"{gsum['max_abs_up_scale_error']:.3g}); the W4A16 Marlin scheme refuses them "
                                "(w4a16_nvfp4_moe.py 186-202)",
                                [f"model.layers.{la}.mlp.experts.{e}.up_proj.weight_global_scale" for la, e in mism],
                                sorted({la for la, _ in mism}), gsum))
    elif gate_up:
        findings.append(Finding(Code.GATE_UP_SCALE_SHARED, Severity.INFO,
                                f"all {len(gate_up)} experts share one global scale for gate and up"))
    ev = [v for m in experts if (v := wgs.get(m.name)) is not None and math.isfinite(v)]
    by_layer: dict[int, set[float]] = defaultdict(set)
    n_by_layer: Counter[int] = Counter()
    for m in experts:
        if (v := wgs.get(m.name)) is not None:
            by_layer[m.layer].add(v)
            n_by_layer[m.layer] += 1
    gsum["distinct_expert_weight_scales"] = len(set(ev))
    if len(ev) > 1 and len(set(ev)) == 1:
        findings.append(Finding(Code.SCALES_ALL_IDENTICAL, Severity.WARNING,
                                f"all {len(ev)} expert weight_global_scale values are {ev[0]!r}: scales look copied, "
                                "not computed per tensor (2688 / amax)", layers=sorted(by_layer)))
    else:
        same = [la for la, s in by_layer.items() if len(s) == 1 and n_by_layer[la] > 3]
        if same:
            findings.append(Finding(Code.SCALES_ALL_IDENTICAL, Severity.WARNING,
                                    f"layers {ranges(same)}: every expert weight_global_scale in the layer is identical "
                                    "(copied-scale smell)", layers=sorted(same)))
    return summary, gate_up, gsum


def check_config(config: dict[str, Any], groups: list[qr.ConfigGroup], findings: list[Finding]) -> dict[str, Any]:
    """W4A4 vs W4A16 (F-04) vs other, from the config groups; returns the config summary."""
    qc = config["quantization_config"]
    scheme = qr.scheme_label(groups)
    if qc.get("quant_method") != "compressed-tensors":
        findings.append(Finding(Code.CONFIG_NOT_COMPRESSED_TENSORS, Severity.ERROR,
                                f"quant_method is {qc.get('quant_method')!r}, not 'compressed-tensors'"))
    acts = [g.input_activations for g in groups]
    summary = {"quant_method": qc.get("quant_method"), "format": qc.get("format"), "scheme": scheme,
               "groups": [{"name": g.name, "targets": list(g.targets), "weight_format": g.weight_format,
                           "activation": g.activation, "weights": g.weights, "input_activations": g.input_activations}
                          for g in groups],
               "ignore": list(qc.get("ignore") or []), "quantization_status": qc.get("quantization_status")}
    if scheme == "W4A16":
        findings.append(Finding(Code.F04_CONFIG_W4A16, Severity.WARNING,
                                "weight-only NVFP4 config (input_activations: null): SGLang 0.5.20-0.5.21 crash "
                                "(AttributeError 'NoneType' ... 'num_bits'); 0.5.22-0.5.23 serve it through the W4A16 "
                                "Marlin MoE scheme on sm80+ (SwiGLU clamp dropped, gate/up scales must match); the W4A4 "
                                "CUTLASS path is never taken", details={"groups": [g.name for g in groups]}))
    elif scheme == "W4A4":
        dyn = sorted({str((a or {}).get("dynamic")) for a in acts})
        findings.append(Finding(Code.CONFIG_W4A4, Severity.INFO,
                                f"W4A4 NVFP4 config (input_activations 4-bit float tensor_group 16, dynamic {dyn}): "
                                "SGLang's CompressedTensorsW4A4Nvfp4MoE on Blackwell (sm100+), all of 0.5.20-0.5.23; "
                                "below Blackwell 0.5.20-0.5.21 refuse, 0.5.22-0.5.23 fall back to W4A16 Marlin",
                                details={"dynamic": dyn}))
    else:
        findings.append(Finding(Code.CONFIG_SCHEME_OTHER, Severity.WARNING,
                                f"config groups are {[(g.name, g.weight_format, g.activation) for g in groups]}: "
                                "not a single NVFP4 W4A4 or W4A16 scheme"))
    return summary


def check_routing_shape(config: dict[str, Any], findings: list[Finding]) -> dict[str, Any]:
    """F-05: ``(num_experts, n_group, topk_group, num_experts_per_tok)`` against FlashInfer's
    grouped-routing limits (:func:`nvfp4study.checkpoint.quant_rules.check_routing`)."""
    keys = ("num_experts", "n_group", "topk_group", "num_experts_per_tok")
    if any(config.get(k) is None for k in ("num_experts", "num_experts_per_tok")):
        findings.append(Finding(Code.ROUTING_UNKNOWN, Severity.INFO, "config has no num_experts / num_experts_per_tok"))
        return {k: config.get(k) for k in keys} | {"status": "unknown"}
    rc = qr.check_routing(int(config["num_experts"]), config.get("n_group"), config.get("topk_group"),
                          int(config["num_experts_per_tok"]))
    shape = f"(num_experts, n_group, topk_group, top_k) = ({rc.num_experts}, {rc.n_group}, {rc.topk_group}, {rc.top_k})"
    why = "; ".join(rc.reasons) + ("; " if rc.reasons else "")
    code, sev, text = {
        "invalid": (Code.F05_ROUTING_INVALID, Severity.ERROR, "cannot route at all"),
        "over": (Code.F05_ROUTING_OVER_LIMIT, Severity.WARNING,
                 "outside FlashInfer's grouped-routing limits: the TRT-LLM MoE backend (--moe-runner-backend "
                 "flashinfer_trtllm) refuses it; use the default CUTLASS backend"),
        "at": (Code.F05_ROUTING_AT_LIMIT, Severity.INFO, "exactly at FlashInfer's grouped-routing limits (accepted)"),
        "within": (Code.ROUTING_WITHIN, Severity.INFO, "within FlashInfer's grouped-routing limits"),
        "ungrouped": (Code.ROUTING_WITHIN, Severity.INFO, "ungrouped routing"),
    }[rc.status]
    findings.append(Finding(code, sev, f"{shape}: {text} ({why}{rc.experts_per_group:g} experts per group)",
                            details={"status": rc.status, "reasons": list(rc.reasons)}))
    return {"num_experts": rc.num_experts, "n_group": rc.n_group, "topk_group": rc.topk_group, "top_k": rc.top_k,
            "experts_per_group": rc.experts_per_group, "candidates": rc.candidates, "status": rc.status,
            "reasons": list(rc.reasons), "limits": {"experts_per_group": qr.WARP_SIZE, "candidates": qr.MAX_CANDIDATES,
                                                    "topk_group": qr.MAX_TOP_GROUPS, "n_group": qr.MAX_GROUPS}}


def check_clamp_lists(config: dict[str, Any], findings: list[Finding]) -> dict[str, Any]:
    """The two SwiGLU clamp lists: nonzero entries by layer; a length other than
    ``num_hidden_layers`` is a warning (SGLang indexes them by layer_id)."""
    nl = int(config["num_hidden_layers"])
    out: dict[str, Any] = {}
    for key in ("expert_swiglu_limit_list", "share_expert_swiglu_limit_list"):
        lst = config.get(key)
        if lst is None:
            out[key] = None
            continue
        out[key] = {"length": len(lst), "nonzero": {str(i): v for i, v in enumerate(lst) if v}}
        if len(lst) != nl:
            findings.append(Finding(Code.CLAMP_LIST_LENGTH, Severity.WARNING,
                                    f"{key} has {len(lst)} entries for {nl} layers (SGLang reads entry layer_id)"))
    return out


def check_counts(modules: dict[str, Module], config: dict[str, Any], findings: list[Finding], scheme: str) -> dict[str, Any]:
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
        findings.append(Finding(Code.EXPERT_COUNT_MISMATCH, Severity.WARNING,
                                f"layers {ranges(off)} store experts {sorted({len(ids[la]) for la in off})} "
                                f"where num_experts is {len(want)}", layers=off))
    for key in ("quantized_expert_modules", "mla_kv_unpacked") + (("input_global_scales",) if scheme == "W4A4" else ()):
        if measured[key] != formulas[key]["value"]:
            findings.append(Finding(Code.COUNT_FORMULA_MISMATCH, Severity.WARNING,
                                    f"{key}: measured {measured[key]}, the layout formula gives {formulas[key]['value']} "
                                    f"({formulas[key]['formula']})", details={"key": key}))
    return {"measured": measured, "formulas": formulas}


def check_shared_fusion(config: dict[str, Any], ignore: list[str], findings: list[Finding]) -> dict[str, Any]:
    """Whether SGLang turns shared-expert fusion off by itself for this config.

    SGLang's Bailing V3 veto (``models/bailing_moe_v3.py`` 1461-1481 in 0.5.23, the same code in
    0.5.20-0.5.22; consulted by ``layers/moe/utils.py`` ``resolve_shared_experts_config`` 601-623)
    disables fusion when ``should_ignore_layer`` differs for ``model.layers.0.mlp.shared_experts.gate_proj``
    and ``model.layers.0.mlp.experts.0.gate_proj``, or when the shared intermediate size differs
    from the routed one. Otherwise fusion stays on and the shared expert runs inside FusedMoE with
    the routed clamp limit (sglang-0.5.23.md), unless ``--disable-shared-experts-fusion``.
    """
    if not int(config.get("num_shared_experts") or 0):
        return {"applies": False}
    ig = qr.ignore_list(tuple(ignore))
    shared = ig.sglang("model.layers.0.mlp.shared_experts.gate_proj")
    routed = ig.sglang("model.layers.0.mlp.experts.0.gate_proj")
    si, ri = config.get("moe_shared_expert_intermediate_size"), config.get("moe_intermediate_size")
    sizes_differ = si is not None and ri is not None and si * int(config["num_shared_experts"]) != ri
    out = {"applies": True, "shared_ignored": shared, "routed_ignored": routed, "sizes_differ": sizes_differ,
           "vetoed": shared != routed or sizes_differ}
    if out["vetoed"]:
        findings.append(Finding(Code.SHARED_FUSION_VETOED, Severity.INFO,
                                "SGLang disables shared-expert fusion by itself for this config (shared experts "
                                f"{'ignored' if shared else 'targeted'}, routed {'ignored' if routed else 'targeted'}"
                                f"{', intermediate sizes differ' if sizes_differ else ''}; bailing_moe_v3.py 1461-1481)",
                                details=out))
    else:
        findings.append(Finding(Code.SHARED_FUSION_ON, Severity.WARNING,
                                "SGLang keeps shared-expert fusion on for this config: the shared expert runs inside "
                                "FusedMoE with the routed experts' clamp limit; pass --disable-shared-experts-fusion",
                                details=out))
    return out
