"""Plausibility of the routed experts' global scale values, not only their presence.

A per-tensor NVFP4 global scale is computed from each tensor's own data: llmcompressor's
``weight_global_scale`` is ``FP8_E4M3 max x FP4_E2M1 max / amax = 448 x 6 / amax`` of that expert
projection, amax clamped to float32's smallest normal, NaN/inf replaced by 1.0 (compressed-tensors
0.18.0 ``quantization/utils/helpers.py`` ``generate_gparam``, lines 308-338). So no calibration
produces a zero, negative, subnormal (that needs amax > 2688 x 2^126, beyond float32), NaN or
infinite value; 1.0 is the fallback of an all-zero or NaN tensor, so many experts sharing 1.0 flags
dead experts. Independent experts
and layers do not share one bit-identical value wholesale. A converter bug does: a scale copied
to every expert of a layer, one layer's scale vector pasted into another layer, an uninitialised
or clipped value. Each such value is a :data:`~nvfp4study.checkpoint.findings.AuditCode.SCALE_VALUE_IMPLAUSIBLE`
finding naming the experts (``details["experts"]``: layer -> projection -> expert ids).

Exemption: an ``input_global_scale`` of exactly 1.0 on every expert is the placeholder the
card's serving rewrite writes (:func:`nvfp4study.checkpoint.quantize.serving_rewrite`), reported
as ``input_all_one`` in the scale summary, not as a copy.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

from .findings import AuditCode, AuditFinding, Severity
from .modules import CheckpointModule, ranges

#: the smallest normal float32, 2^-126 (IEEE 754 binary32); a [1] F32 scale below it in magnitude
#: (and not 0) is subnormal: 1 / scale overflows float32 and the value cannot come from 2688 / amax.
FLT_MIN = 2.0**-126
#: a value shared bit-for-bit by at least this fraction of a layer's experts (and by at least
#: MIN_COPIES of them) is a copy. amax of BF16 weights is a BF16 value, so a few experts can share
#: a scale by chance; half of them cannot.
COPY_FRACTION = 0.5
MIN_COPIES = 4
PARAMS = ("weight_global_scale", "input_global_scale")
_BAD = ("nan", "inf", "zero", "negative", "subnormal")


def value_problem(v: float | None) -> str | None:
    """``nan`` / ``inf`` / ``zero`` / ``negative`` / ``subnormal`` for an implausible scale, else None."""
    if v is None or math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf"
    if v == 0:
        return "zero"
    if v < 0:
        return "negative"
    if v < FLT_MIN:
        return "subnormal"
    return None


def check_scale_values(experts: list[CheckpointModule], vals: dict[str, float], findings: list[AuditFinding]) -> dict[str, Any]:
    """Check every routed expert's ``weight_global_scale`` and ``input_global_scale`` value.

    Args:
        experts: the routed-expert NVFP4 modules.
        vals: tensor name -> value of the [1] F32 scales (:func:`.header.read_scalars`).
        findings: appended to: one SCALE_VALUE_IMPLAUSIBLE per (parameter, reason); reasons
            ``nan``/``inf``/``zero``/``negative``/``subnormal`` (severity error) and
            ``copied-within-layer`` / ``copied-across-layers`` (warning).

    Returns:
        ``{param: {reason: count of tensors}}``.
    """
    out: dict[str, dict[str, int]] = {}
    for param in PARAMS:
        by_lp: dict[tuple[int, str], dict[int, float]] = defaultdict(dict)
        names: dict[tuple[int, str, int], str] = {}
        bad: dict[str, list[tuple[int, str, int]]] = defaultdict(list)
        for m in experts:
            t = m.params.get(param)
            if t is None or t.numel != 1:
                continue
            v = vals.get(t.name)
            key = (m.layer, m.proj, m.expert)
            names[key] = t.name
            if (why := value_problem(v)) is not None:
                bad[why].append(key)
            else:
                by_lp[(m.layer, m.proj)][m.expert] = v
        placeholder = param == "input_global_scale" and by_lp and all(
            v == 1.0 for d in by_lp.values() for v in d.values())
        copies: dict[str, list[tuple[int, str, int]]] = defaultdict(list)
        values: dict[str, set[float]] = defaultdict(set)
        if not placeholder:
            for (layer, proj), d in by_lp.items():  # one value held by most experts of a layer
                if len(d) < MIN_COPIES:
                    continue
                v, c = Counter(d.values()).most_common(1)[0]
                if c >= MIN_COPIES and c >= COPY_FRACTION * len(d):
                    copies["copied-within-layer"] += [(layer, proj, e) for e, x in d.items() if x == v]
                    values["copied-within-layer"].add(v)
            sigs: dict[tuple[str, tuple], list[int]] = defaultdict(list)  # one layer's vector in another
            for (layer, proj), d in by_lp.items():
                if len(d) >= 2 and len(set(d.values())) > 1:
                    sigs[(proj, tuple(sorted(d.items())))].append(layer)
            for (proj, sig), layers in sigs.items():
                if len(layers) > 1:
                    copies["copied-across-layers"] += [(la, proj, e) for la in layers for e, _ in sig]
        out[param] = {r: len(k) for r, k in {**bad, **copies}.items()}
        for reason, keys in [(r, bad[r]) for r in _BAD if bad.get(r)] + sorted(copies.items()):
            experts_by: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
            for layer, proj, e in sorted(keys):
                experts_by[str(layer)][proj].append(e)
            layers = sorted({k[0] for k in keys})
            det = {la: dict(d) for la, d in experts_by.items()}
            text = "; ".join(f"layer {la}: " + ", ".join(f"{p} experts {v}" for p, v in d.items())
                             for la, d in list(det.items())[:3])
            if reason in _BAD:
                sev, what = Severity.ERROR, f"are {reason} (no per-expert 448 x 6 / amax gives that)"
            elif reason == "copied-within-layer":
                sev, what = Severity.WARNING, (f"share one bit-identical value {sorted(values[reason])[:3]} with at "
                                               f"least {COPY_FRACTION:.0%} of their layer's experts (copied, not calibrated)")
            else:
                sev, what = Severity.WARNING, "repeat another layer's per-expert values exactly (a layer copied)"
            findings.append(AuditFinding(AuditCode.SCALE_VALUE_IMPLAUSIBLE, sev,
                                    f"{len(keys)} expert {param} values {what}; layers {ranges(layers)}; {text}",
                                    [names[k] for k in sorted(keys)][:500], layers,
                                    {"param": param, "reason": reason, "count": len(keys), "experts": det}))
    return out
