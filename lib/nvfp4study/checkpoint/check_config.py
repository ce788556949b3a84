"""Config-level checks of the audit: scheme (F-04), routing shape (F-05), clamp lists, shared-expert fusion.

Each reads only ``config.json`` (and its ``quantization_config``), appends
:class:`~nvfp4study.checkpoint.findings.AuditFinding` objects and returns a summary dict.
"""

from __future__ import annotations

from typing import Any

from . import quant_rules as qr
from .findings import AuditCode, AuditFinding, Severity


def check_config(config: dict[str, Any], groups: list[qr.ConfigGroup], findings: list[AuditFinding]) -> dict[str, Any]:
    """W4A4 vs W4A16 (F-04) vs other, from the config groups; returns the config summary.

    Which releases crash, serve or fall back is :data:`~.quant_rules.NVFP4_MOE_SCHEMES`."""
    qc = config["quantization_config"]
    scheme = qr.scheme_label(groups)
    if qc.get("quant_method") != "compressed-tensors":
        findings.append(AuditFinding(AuditCode.CONFIG_NOT_COMPRESSED_TENSORS, Severity.ERROR,
                                f"quant_method is {qc.get('quant_method')!r}, not 'compressed-tensors'"))
    acts = [g.input_activations for g in groups]
    summary = {"quant_method": qc.get("quant_method"), "format": qc.get("format"), "scheme": scheme,
               "groups": [{"name": g.name, "targets": list(g.targets), "weight_format": g.weight_format,
                           "activation": g.activation, "weights": g.weights, "input_activations": g.input_activations}
                          for g in groups],
               "ignore": list(qc.get("ignore") or []), "quantization_status": qc.get("quantization_status")}
    # release ranges from the release-keyed facts, so a new release needs no edit here
    crash, marlin = qr.serving_span("crash"), qr.serving_span("marlin")
    if scheme == "W4A16":
        findings.append(AuditFinding(AuditCode.F04_CONFIG_W4A16, Severity.WARNING,
                                f"weight-only NVFP4 config (input_activations: null): SGLang {crash} crash "
                                f"(AttributeError 'NoneType' ... 'num_bits'); {marlin} serve it through the W4A16 "
                                "Marlin MoE scheme on sm80+ (SwiGLU clamp dropped, gate/up scales must match); the W4A4 "
                                "CUTLASS path is never taken", details={"groups": [g.name for g in groups]}))
    elif scheme == "W4A4":
        dyn = sorted({str((a or {}).get("dynamic")) for a in acts})
        findings.append(AuditFinding(AuditCode.CONFIG_W4A4, Severity.INFO,
                                f"W4A4 NVFP4 config (input_activations 4-bit float tensor_group 16, dynamic {dyn}): "
                                f"SGLang's CompressedTensorsW4A4Nvfp4MoE on Blackwell (sm100+), all of {qr.serving_span()}; "
                                f"below Blackwell {crash} refuse, {marlin} fall back to W4A16 Marlin",
                                details={"dynamic": dyn}))
    else:
        findings.append(AuditFinding(AuditCode.CONFIG_SCHEME_OTHER, Severity.WARNING,
                                f"config groups are {[(g.name, g.weight_format, g.activation) for g in groups]}: "
                                "not a single NVFP4 W4A4 or W4A16 scheme"))
    return summary


def check_routing_shape(config: dict[str, Any], findings: list[AuditFinding]) -> dict[str, Any]:
    """F-05: ``(num_experts, n_group, topk_group, num_experts_per_tok)`` against FlashInfer's
    grouped-routing limits (:func:`nvfp4study.checkpoint.quant_rules.check_routing`)."""
    keys = ("num_experts", "n_group", "topk_group", "num_experts_per_tok")
    if any(config.get(k) is None for k in ("num_experts", "num_experts_per_tok")):
        findings.append(AuditFinding(AuditCode.ROUTING_UNKNOWN, Severity.INFO, "config has no num_experts / num_experts_per_tok"))
        return {k: config.get(k) for k in keys} | {"status": "unknown"}
    rc = qr.check_routing(int(config["num_experts"]), config.get("n_group"), config.get("topk_group"),
                          int(config["num_experts_per_tok"]))
    shape = f"(num_experts, n_group, topk_group, top_k) = ({rc.num_experts}, {rc.n_group}, {rc.topk_group}, {rc.top_k})"
    why = "; ".join(rc.reasons) + ("; " if rc.reasons else "")
    code, sev, text = {
        "invalid": (AuditCode.F05_ROUTING_INVALID, Severity.ERROR, "cannot route at all"),
        "over": (AuditCode.F05_ROUTING_OVER_LIMIT, Severity.WARNING,
                 "outside FlashInfer's grouped-routing limits: the TRT-LLM MoE backend (--moe-runner-backend "
                 "flashinfer_trtllm) refuses it; use the default CUTLASS backend"),
        "at": (AuditCode.F05_ROUTING_AT_LIMIT, Severity.INFO, "exactly at FlashInfer's grouped-routing limits (accepted)"),
        "within": (AuditCode.ROUTING_WITHIN, Severity.INFO, "within FlashInfer's grouped-routing limits"),
        "ungrouped": (AuditCode.ROUTING_WITHIN, Severity.INFO, "ungrouped routing"),
    }[rc.status]
    findings.append(AuditFinding(code, sev, f"{shape}: {text} ({why}{rc.experts_per_group:g} experts per group)",
                            details={"status": rc.status, "reasons": list(rc.reasons)}))
    return {"num_experts": rc.num_experts, "n_group": rc.n_group, "topk_group": rc.topk_group, "top_k": rc.top_k,
            "experts_per_group": rc.experts_per_group, "candidates": rc.candidates, "status": rc.status,
            "reasons": list(rc.reasons), "limits": {"experts_per_group": qr.WARP_SIZE, "candidates": qr.MAX_CANDIDATES,
                                                    "topk_group": qr.MAX_TOP_GROUPS, "n_group": qr.MAX_GROUPS}}


def check_clamp_lists(config: dict[str, Any], findings: list[AuditFinding]) -> dict[str, Any]:
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
            findings.append(AuditFinding(AuditCode.CLAMP_LIST_LENGTH, Severity.WARNING,
                                    f"{key} has {len(lst)} entries for {nl} layers (SGLang reads entry layer_id)"))
    return out


def check_shared_fusion(config: dict[str, Any], ignore: list[str], findings: list[AuditFinding]) -> dict[str, Any]:
    """Whether SGLang turns shared-expert fusion off by itself for this config.

    SGLang's Bailing V3 veto (``models/bailing_moe_v3.py`` 1461-1481 in 0.5.23, the same code in
    0.5.20-0.5.22; consulted by ``layers/moe/utils.py`` ``resolve_shared_experts_config`` 601-623)
    disables fusion when ``should_ignore_layer`` differs for ``model.layers.0.mlp.shared_experts.gate_proj``
    and ``model.layers.0.mlp.experts.0.gate_proj``, or when the shared intermediate size differs
    from the routed one. Otherwise fusion stays on and the shared expert runs inside FusedMoE with
    the routed experts' clamp limit (one ``gemm1_clamp_limit`` per FusedMoE layer, while
    Ling's shared-expert limits differ from the routed ones on layers 34-41), unless ``--disable-shared-experts-fusion``.
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
        findings.append(AuditFinding(AuditCode.SHARED_FUSION_VETOED, Severity.INFO,
                                "SGLang disables shared-expert fusion by itself for this config (shared experts "
                                f"{'ignored' if shared else 'targeted'}, routed {'ignored' if routed else 'targeted'}"
                                f"{', intermediate sizes differ' if sizes_differ else ''}; bailing_moe_v3.py 1461-1481)",
                                details=out))
    else:
        findings.append(AuditFinding(AuditCode.SHARED_FUSION_ON, Severity.WARNING,
                                "SGLang keeps shared-expert fusion on for this config: the shared expert runs inside "
                                "FusedMoE with the routed experts' clamp limit; pass --disable-shared-experts-fusion",
                                details=out))
    return out
