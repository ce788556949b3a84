"""The SwiGLU clamp forms as MEASURED on a GPU (stored result of ``gpu/clamp_kernels/check.py``).

``data/clamp_kernels_h200.json`` was written on the lent NVIDIA H200 (SM90, BF16 experts) on
2026-12-01, not by a study run. Each run fed probe inputs (each output element is one SwiGLU value,
``gpu/clamp_kernels/probes.py``) through a real kernel and counted, for every reference form, the
share of elements that match bit for bit among the *separating* ones (gate above the limit, and the
form's BF16 value differs from every other form's). :func:`verdicts` turns those shares into the
forms the kernels compute; nothing here is hard-coded but the thresholds.

Forms: ``pre_silu`` = silu(min(g, L)) * clamp(u, -L, L) (GPT-OSS; FlashInfer ``SwigluBias``,
flashinfer-python 0.7.2 ``cutlass_fused_moe_kernels.cuh`` 2250-2262), ``post_silu`` =
min(silu(g), L) * clamp(u, -L, L) (Ling; ``SwigluStep``, same file 2264-2279), ``unclamped``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..core.errors import KernelEvidenceError

DATA = "clamp_kernels_h200.json"
FORMS = ("pre_silu", "post_silu", "unclamped")
MATCH = 0.99  # a form is the kernel's when >= 99 % of its separating elements match bit for bit
OTHER = 0.05  # ... and every other form matches at most 5 % of its own separating elements
MIN_SEPARATING = 1000
# (part, run prefix) -> what the run is, for the sentences
RUNS = {
    ("flashinfer_cutlass", "sglang_swiglu"): "SGLang 0.5.23's CUTLASS call (activation Swiglu, "
                                             "alpha/beta/limit from materialize_swiglu_params_for_cutlass)",
    ("flashinfer_cutlass", "sglang_swiglu_alpha"): "the same call with gemm1_alpha set",
    ("flashinfer_cutlass", "swiglu_bias"): "FlashInfer SwigluBias",
    ("flashinfer_cutlass", "swiglu_step"): "FlashInfer SwigluStep",
    ("sglang_triton", "clamp"): "SGLang 0.5.23's Triton MoE with gemm1_clamp_limit",
    ("sglang_triton", "clamp_alpha"): "SGLang's Triton MoE with gemm1_clamp_limit and gemm1_alpha",
}


@dataclass(frozen=True)
class RunVerdict:
    """One measured run: ``form`` is a FORMS name or ``"undecided"``; ``share`` maps form -> share."""

    part: str
    run: str
    limit: float
    form: str
    rounding: str
    share: dict
    n_separating: dict


def load(path: Path | None = None) -> dict:
    """The stored JSON (default: the packaged ``data/clamp_kernels_h200.json``).

    Raises:
        KernelEvidenceError: absent, not JSON, or missing ``environment``/``date_utc``.
    """
    try:
        text = (path.read_text() if path is not None
                else resources.files("nvfp4study.sglang").joinpath("data", DATA).read_text())
        doc = json.loads(text)
    except (OSError, ValueError) as e:
        raise KernelEvidenceError(f"cannot read the GPU clamp measurement: {e}") from e
    if not isinstance(doc, dict) or "environment" not in doc or "date_utc" not in doc:
        raise KernelEvidenceError("GPU clamp measurement lacks environment/date_utc")
    return doc


def decide(run: dict) -> tuple[str, str, dict, dict]:
    """(form, rounding, shares, n_separating) for one run with a limit.

    For each rounding (``once``: kept in FP32, rounded once; ``bf16ops``: op by op in BF16), a form
    wins when its separating share is >= MATCH over at least MIN_SEPARATING elements and every other
    form with separating elements is <= OTHER. The first rounding that decides is used; else
    ``undecided``. Raises KernelEvidenceError for a run without the per-form entries.
    """
    for rounding in ("once", "bf16ops"):
        try:
            shares = {f: run[f"{f}/{rounding}"]["share_exact_separating"] for f in FORMS}
            ns = {f: run[f"{f}/{rounding}"]["n_separating"] for f in FORMS}
        except (KeyError, TypeError) as e:
            raise KernelEvidenceError(f"run lacks {e} entries") from e
        winners = [f for f in FORMS if shares[f] is not None and ns[f] >= MIN_SEPARATING
                   and shares[f] >= MATCH]
        if len(winners) == 1 and all(shares[o] is None or shares[o] <= OTHER
                                     for o in FORMS if o != winners[0]):
            return winners[0], rounding, shares, ns
    return "undecided", "-", shares, ns


def verdicts(doc: dict | None = None) -> list[RunVerdict]:
    """Every run with a limit (4, 5, 7) of both parts, decided. Runs that errored are skipped."""
    doc = load() if doc is None else doc
    out = []
    for part in ("flashinfer_cutlass", "sglang_triton"):
        for key, run in sorted((doc.get(part) or {}).get("runs", {}).items()):
            name, _, lim = key.partition("/L=")
            if lim == "none" or "error" in run:
                continue
            form, rounding, shares, ns = decide(run)
            out.append(RunVerdict(part, name, float(lim), form, rounding, shares, ns))
    return out


def _common_form(vs: list[RunVerdict], part: str, run: str) -> str | None:
    forms = {v.form for v in vs if v.part == part and v.run == run}
    if not forms:
        return None
    return forms.pop() if len(forms) == 1 else "mixed"


def summary(doc: dict | None = None) -> dict:
    """Form per run kind (over limits 4, 5, 7), the machine and date, and the headline sentence.

    Returns ``{"machine", "date", "forms": {run: form}, "limits", "sentence"}``; a run kind whose
    limits disagree is ``mixed``, one that did not run is absent.
    """
    doc = load() if doc is None else doc
    vs = verdicts(doc)
    forms = {}
    for (part, run) in RUNS:
        f = _common_form(vs, part, run)
        if f is not None:
            forms[f"{part}/{run}"] = f
    env = doc["environment"]
    machine = f"{env.get('gpu')} (SM{str(env.get('capability', '')).replace('.', '')}, BF16 experts)"
    date = str(doc["date_utc"])[:10]
    name = {"pre_silu": "the pre-SiLU (GPT-OSS) form", "post_silu": "the post-SiLU (Ling) form",
            "unclamped": "no clamp", "mixed": "different forms at different limits",
            "undecided": "no form the probes decide"}
    parts = []
    for key, label in (("flashinfer_cutlass/sglang_swiglu", "SGLang's CUTLASS call computes"),
                       ("flashinfer_cutlass/swiglu_step", "SwigluStep"),
                       ("sglang_triton/clamp", "SGLang's Triton path")):
        if key in forms:
            parts.append(f"{label} {name[forms[key]]}")
    sentence = (f"measured on {machine} on {date}, not made by this run: " + ", ".join(parts)
                + f" (limits {', '.join(f'{v:g}' for v in sorted({v.limit for v in vs}))})")
    return {"machine": machine, "date": date, "forms": forms,
            "limits": sorted({v.limit for v in vs}), "sentence": sentence}
