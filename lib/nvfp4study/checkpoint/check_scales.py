"""Scale checks of the audit: activation scales (F-01), weight global scales, gate/up agreement.

The plausibility of each expert's scale values (copied, zero, negative, subnormal, inf, NaN) is
:mod:`.check_scale_values`.

F-01: a W4A4 NVFP4 checkpoint needs one ``input_global_scale`` (F32 [1], finite, > 0) per routed
expert projection; without it SGLang's W4A4 MoE scheme has no activation scale to quantize with.
SGLang 0.5.23's W4A4 MoE scheme (``layers/quantization/compressed_tensors/schemes/
compressed_tensors_w4a4_nvfp4_moe.py``) uses expert ``gate_proj``'s weight global scale for
both gate and up (lines 187-198, after a ``torch.allclose`` warning), and the W4A16 Marlin scheme
(``compressed_tensors_w4a16_nvfp4_moe.py`` 186-202) refuses gate/up scales that differ.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

from .check_scale_values import check_scale_values
from .findings import AuditCode, AuditFinding, Severity
from .header import CheckpointHeaders, read_scalars
from .modules import CheckpointModule, ranges


def check_scales(modules: dict[str, CheckpointModule], headers: CheckpointHeaders, scheme: str, read_values: bool,
                  findings: list[AuditFinding]) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """F-01 (input_global_scale per expert), weight scale finiteness, gate/up agreement, copies."""

    q = [m for m in modules.values() if m.fmt == "NVFP4"]
    experts = [m for m in q if m.component == "routed_expert"]
    with_in = [m for m in q if "input_global_scale" in m.params]
    bad_layout = [m.params[p].name for m in q for p in ("input_global_scale", "weight_global_scale")
                  if p in m.params and (m.params[p].dtype != "F32" or m.params[p].numel != 1)]
    if bad_layout:
        findings.append(AuditFinding(AuditCode.SCALE_LAYOUT_INVALID, Severity.ERROR,
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
        findings.append(AuditFinding(AuditCode.F01_INPUT_SCALE_MISSING, sev,
                                f"{len(missing_names)} expert projections lack input_global_scale "
                                f"({'W4A4 config: SGLang fills them from torch.empty, NaN logits' if scheme == 'W4A4' else 'inconsistent with the others'}); "
                                + "; ".join(f"layer {k}: " + ", ".join(f"{p} {v}" for p, v in d.items()) for k, d in list(det.items())[:4]),
                                missing_names, sorted(missing), {"missing": det}))
    if scheme == "W4A16" and with_in:
        findings.append(AuditFinding(AuditCode.INPUT_SCALE_UNEXPECTED, Severity.WARNING,
                                f"{len(with_in)} input_global_scale tensors with a W4A16 config: SGLang's W4A16 Marlin "
                                "scheme registers them only for W4A4 checkpoints; its docstring says the expert loader "
                                "raises KeyError for a tensor with no destination (compressed_tensors_w4a16_nvfp4_moe.py 35-39)",
                                [m.name + ".input_global_scale" for m in with_in[:200]]))
    gate_up: list[dict[str, Any]] = []
    gsum: dict[str, Any] = {"pairs": 0, "mismatched": 0}
    if not read_values:
        findings.append(AuditFinding(AuditCode.VALUES_NOT_READ, Severity.INFO,
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
        findings.append(AuditFinding(AuditCode.F01_INPUT_SCALE_NONFINITE, Severity.ERROR,
                                f"{len(bad_in_names)} input_global_scale values are 0, negative, NaN or inf "
                                "(alpha = 1 / input_global_scale x ... becomes inf/NaN); "
                                + "; ".join(f"layer {k}: " + ", ".join(f"{p} {v}" for p, v in d.items()) for k, d in list(det.items())[:4]),
                                bad_in_names, sorted(bad_in), {"nonfinite": det}))
    wgs = {m.name: vals.get(m.params["weight_global_scale"].name) for m in q if "weight_global_scale" in m.params}
    bad_w = [n + ".weight_global_scale" for n, v in wgs.items() if v is None or not math.isfinite(v) or v <= 0]
    if bad_w:
        findings.append(AuditFinding(AuditCode.WEIGHT_SCALE_NONFINITE, Severity.ERROR,
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
        # no finite error when every differing pair has a zero or non-finite scale: said, not formatted
        err = (f"|error| median {gsum['median_abs_up_scale_error']:.3g}, max {gsum['max_abs_up_scale_error']:.3g}"
               if errs else "|error| not finite")
        findings.append(AuditFinding(AuditCode.GATE_UP_SCALE_MISMATCH, sev,
                                f"{len(mism)} of {len(gate_up)} experts have different gate and up weight_global_scale; "
                                "SGLang's W4A4 scheme uses the gate's for both (w4a4_nvfp4_moe.py 187-198), so up_proj is "
                                f"dequantized x up/gate ({err}); the W4A16 Marlin scheme refuses them "
                                "(w4a16_nvfp4_moe.py 186-202)",
                                [f"model.layers.{la}.mlp.experts.{e}.up_proj.weight_global_scale" for la, e in mism],
                                sorted({la for la, _ in mism}), gsum))
    elif gate_up:
        findings.append(AuditFinding(AuditCode.GATE_UP_SCALE_SHARED, Severity.INFO,
                                f"all {len(gate_up)} experts share one global scale for gate and up"))
    ev = [v for m in experts if (v := wgs.get(m.name)) is not None and math.isfinite(v)]
    by_layer: dict[int, set[float]] = defaultdict(set)
    n_by_layer: Counter[int] = Counter()
    for m in experts:
        if (v := wgs.get(m.name)) is not None:
            by_layer[m.layer].add(v)
            n_by_layer[m.layer] += 1
    gsum["distinct_expert_weight_scales"] = len(set(ev))
    summary["implausible"] = check_scale_values(experts, vals, findings)  # copies, 0, <0, subnormal, inf, NaN
    if len(ev) > 1 and len(set(ev)) == 1:
        findings.append(AuditFinding(AuditCode.SCALES_ALL_IDENTICAL, Severity.WARNING,
                                f"all {len(ev)} expert weight_global_scale values are {ev[0]!r}: scales look copied, "
                                "not computed per tensor (2688 / amax)", layers=sorted(by_layer)))
    else:
        same = [la for la, s in by_layer.items() if len(s) == 1 and n_by_layer[la] > 3]
        if same:
            findings.append(AuditFinding(AuditCode.SCALES_ALL_IDENTICAL, Severity.WARNING,
                                    f"layers {ranges(same)}: every expert weight_global_scale in the layer is identical "
                                    "(copied-scale smell)", layers=sorted(same)))
    return summary, gate_up, gsum
