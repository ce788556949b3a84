"""The card's own checkpoint next to ours: open it on the Hub, the real-size extras, the side-by-side.

Stage 02 audits two checkpoints when ``checkpoint.card_checkpoint`` names the card's repo: ours
(the study's stand-in, or the one ``checkpoint.quantized_path`` names) and the card's, read from
the Hub by range requests (:mod:`.hub_audit`: config, index, shard headers and the ``[1]``
scales; no weights). This module holds what both audits share (the arithmetic at the real
Ling-3.0-flash sizes, :class:`~nvfp4study.core.params.LingShape` defaults) and the comparison
"card's checkpoint vs ours vs the card's text"; the card's text comes from ``core/claims.yaml``
and is labelled "card says", never shown as a measurement.

Without a ``card_checkpoint`` nothing here touches the network: :data:`NO_HUB` is the reason the
card-artifact rows record, with the command that settles them (:data:`SETTLE`).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from ..core import hub
from ..core.errors import HubError
from ..core.ledger import Verdict, card_claims
from ..core.params import HubSource, LingShape
from . import quant_rules as qr
from .audit import CARD_ROWS, AuditReport, count_formulas
from .hub_audit import open_target, snapshot_folder
from .reader import Reader

#: The card's repository (its checkpoint, config.json and sglang_patch/ live there).
CARD_REPO = "kingjones777/Ling-3.0-flash-NVFP4-SGLang-MTP"
#: The command that audits the card's own files (params/card-files.yaml names the repo).
SETTLE = "nvfp4study run --params params/card-files.yaml"
NO_HUB = ("no Hub access: the params name no checkpoint.card_checkpoint, so the card's own files were "
          f"not read; `{SETTLE}` audits them (network, no GPU)")
REAL_KEYS = ("num_hidden_layers", "num_experts", "hidden_size", "moe_intermediate_size", "first_k_dense_replace",
             "n_group", "topk_group", "num_experts_per_tok", "layer_group_size")


def real_config() -> dict[str, Any]:
    """Config of the real Ling-3.0-flash sizes (``layout.config_dict(LingShape())``)."""
    from .layout import config_dict

    return config_dict(LingShape())


def is_real_size(config: dict[str, Any]) -> bool:
    """Whether ``config`` has the real model's sizes (all of :data:`REAL_KEYS`)."""
    real = real_config()
    return all(config.get(k) == real.get(k) for k in REAL_KEYS)


def predicted_data_bytes(shape: LingShape) -> int:
    """Tensor bytes of the NVFP4 + serving layout of ``shape`` (``recipe.nvfp4_layout`` over
    ``layout.tensor_specs``): experts' U8 [o, i/2] + F8_E4M3 [o, i/16] + 2 F32 scales, the
    rest BF16/F32."""
    from . import layout, recipe

    specs, _ = recipe.nvfp4_layout(shape, layout.tensor_specs(shape), layout.config_dict(shape))
    return sum(layout.spec_nbytes(s) for s in specs)


def add_extras(data: dict[str, Any], rep: AuditReport, config: dict[str, Any], shape: LingShape) -> dict[str, Any]:
    """Add to an audit's JSON (``rep.to_json()``) the predictions for the params' ``shape`` and the
    real sizes, the count formulas and the routing check at the real sizes, and whether ``config``
    has the real sizes. Returns ``data``."""
    data["size"]["predicted_data_bytes_params_shape"] = predicted_data_bytes(shape)
    data["size"]["predicted_data_bytes_real_sizes"] = predicted_data_bytes(LingShape())
    data["counts"]["formulas_real_sizes"] = count_formulas(real_config(), rep.counts["measured"]["mtp_other_tensors"])
    data["routing_real_sizes"] = vars(qr.check_routing(*(getattr(LingShape(), k) for k in
                                                          ("num_experts", "n_group", "topk_group", "num_experts_per_tok"))))
    data["real_size_config"] = is_real_size(config)
    return data


def recorded_commit(previous: Path, source: HubSource) -> str | None:
    """The commit an earlier run of this folder recorded for the same ``repo_id`` + ``revision``
    (``source.hub`` of ``previous``, a ``card_checkpoint_audit.json``), so a re-run audits the same
    files even when the branch moved; None when there is none."""
    try:
        hub_src = json.loads(previous.read_text())["source"]["hub"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if hub_src.get("repo_id") == source.repo_id and hub_src.get("revision") == source.revision:
        return hub_src.get("commit")
    return None


def open_card(source: HubSource, commit: str | None = None) -> tuple[dict[str, Any], Reader, dict[str, Any]]:
    """Open the card's checkpoint on the Hub (or, with ``HF_HUB_OFFLINE=1``, from the cache).

    Returns ``(ck, reader, config)``: ``ck`` is the stage's checkpoint record (``path``, ``from``,
    ``card: True``, ``hub``: repo/revision/commit, ``checked_on``: ``hf:REPO@COMMIT``).

    Raises:
        HubError subclasses (unknown repo/revision, 401/403, no network, offline and not cached).
    """
    target = f"hf:{source.repo_id}@{commit or source.revision}"
    path, reader, src = open_target(target)
    src = src | {"revision": source.revision}
    if reader is None:  # open_target gives a reader for every hf: target; keep the type honest
        raise HubError(f"{target}: no reader")
    config = json.loads(reader.read_small("config.json"))
    ck = {"path": str(path), "from": f"the Hub ({src['kind']}) {source.repo_id}@{source.revision}",
          "random_weights": False, "card": True, "hub": src,
          "checked_on": f"hf:{source.repo_id}@{src['commit']} (the card's checkpoint: headers and [1] scales)"}
    if src["kind"] == "cache":
        ck["path"] = str(snapshot_folder(hub.HubRef(source.repo_id, source.revision), src["commit"]))
    return ck, reader, config


def facts(rep: AuditReport) -> dict[str, Any]:
    """The quantities the side-by-side compares, from one audit (measured; nothing assumed)."""
    m, cs = rep.counts["measured"], rep.config_summary
    mt = rep.mtp[0] if rep.mtp else {}
    exp = {r["precision"]: r["layers"] for r in rep.precision_table if r["component"] == CARD_ROWS["routed_expert"]}
    in_dt = dict(Counter(mo.params["input_global_scale"].dtype for mo in rep.modules.values()
                         if "input_global_scale" in mo.params))
    gu = rep.gate_up_summary
    cl = cs.get("clamp_lists") or {}
    return {
        "scheme": cs.get("scheme"),
        "routed-expert formats (layers)": exp or None,
        "quantized routed-expert tensors": m.get("quantized_expert_modules"),
        "input_global_scale tensors": m.get("input_global_scales"),
        "input_global_scale dtypes": in_dt or None,
        "input_global_scale values": rep.input_scales.get("input_values"),
        "MLA tensors left unpacked": m.get("mla_kv_unpacked"),
        "MTP layer": mt.get("layer"),
        "MTP layer packed / plain tensors": f"{mt.get('packed_tensors')} / {mt.get('plain_tensors')}" if mt else None,
        "ignore[0]": (cs.get("ignore") or [None])[0],
        "experts with gate != up global scale": (f"{gu.get('mismatched')} of {gu.get('pairs')}" if gu.get("pairs")
                                                 else "not read"),
        "routing: experts per group (kernel limit 32)": f"{rep.routing.get('num_experts')} / {rep.routing.get('n_group')}"
                                                        f" = {rep.routing.get('experts_per_group')}",
        "expert clamp list (nonzero)": (cl.get("expert_swiglu_limit_list") or {}).get("nonzero"),
        "shared clamp list (nonzero)": (cl.get("share_expert_swiglu_limit_list") or {}).get("nonzero"),
        "context": cs.get("context"),
        "size on disk (GB)": round(rep.size["file_bytes"] / 1e9, 2),
    }


def card_text() -> dict[str, Any]:
    """What the card's text says for each :func:`facts` key (from ``core/claims.yaml``)."""
    c = {x["id"]: x["card"] for x in card_claims()}
    a = c["config.w4a4"]["input_activations"]
    mtp = c["mtp.layer42-bf16"]
    rt = c["clamp.trtllm-routing"]
    return {
        "scheme": f"W4A4 ({a['num_bits']}-bit activations, dynamic {a['dynamic']}, {a['strategy']})",
        "routed-expert formats (layers)": {"NVFP4": "0-41"},
        "quantized routed-expert tensors": c["counts.quantized-experts"]["quantized_expert_tensors"],
        "input_global_scale tensors": c["scales.input-global-scale"]["count"],
        "input_global_scale dtypes": c["scales.input-global-scale"]["dtype"],
        "input_global_scale values": c["scales.input-global-scale"]["value"],
        "MLA tensors left unpacked": c["counts.mla-unpacked"]["mla_unpacked"],
        "MTP layer": mtp["layer"],
        "MTP layer packed / plain tensors": f"{mtp['packed']} / {mtp['plain']}",
        "ignore[0]": c["mtp.ignore-first"]["ignore_first"],
        "experts with gate != up global scale": "(not stated)",
        "routing: experts per group (kernel limit 32)": f"{rt['num_experts']} / {rt['n_group']} = {rt['experts_per_group']}",
        "expert clamp list (nonzero)": c["config.clamp-lists"]["expert"],
        "shared clamp list (nonzero)": c["config.clamp-lists"]["shared"],
        "context": c["config.context"],
        "size on disk (GB)": c["size.disk"]["disk_gb"],
    }


def side_by_side(ours: AuditReport, card: AuditReport | None, card_label: str, not_run: str = NO_HUB) -> list[dict[str, Any]]:
    """Rows ``{"quantity", "card's checkpoint (<label>)", "ours", "card says"}``; the card's
    checkpoint column says ``not run: <why>`` when it was not audited. Values are stringified for
    display (dicts as JSON)."""
    def show(v: Any) -> str:
        return json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else str(v)

    fo, fc, text = facts(ours), (facts(card) if card is not None else None), card_text()
    col = f"card's checkpoint ({card_label})" if card is not None else "card's checkpoint"
    return [{"quantity": k, col: show(fc[k]) if fc is not None else f"not run: {not_run}", "ours": show(v),
             "card says": show(text[k])} for k, v in fo.items()]


def gate_up_test(card: AuditReport) -> dict[str, Any]:
    """The study's gate/up question on the card's files: how many routed experts carry different
    gate_proj and up_proj ``weight_global_scale`` (SGLang's W4A4 scheme serves up_proj with the
    gate's; ``w4a4_nvfp4_moe.py``), and the up/gate - 1 error that gives. Returns the audit's
    ``gate_up_summary`` plus ``values_read``."""
    gs = dict(card.gate_up_summary)
    gs["values_read"] = bool(card.input_scales.get("values_read"))
    return gs


def count_verdict(measured: int, formula_audited: int | None, formula_real: int | None, card: int,
                   real: bool) -> tuple[Verdict, str]:
    """Verdict of a count claim: on the real sizes (or the card's files) measured vs the card; on a
    scaled checkpoint "partly" when it equals the layout formula and the formula gives the card's
    number at the real sizes."""
    if real:
        return (Verdict.REPRODUCED if measured == card else Verdict.CONTRADICTED,
                f"measured on the audited files (real sizes or the card's own): {measured:,} (card {card:,})")
    if measured == formula_audited and formula_real == card:
        return (Verdict.PARTLY, f"measured {measured:,} on the scaled checkpoint = the layout formula on its config; "
                                f"the same formula gives {formula_real:,} at the real sizes (card {card:,}). The card's "
                                "own files were not audited here")
    return (Verdict.CONTRADICTED, f"measured {measured:,}, formula on the audited config {formula_audited}, "
                                  f"at real sizes {formula_real} (card {card:,})")


def summary_markdown(rep: AuditReport, ck: dict[str, Any]) -> str:
    """One paragraph: what was audited, how big, how long, and the findings by severity."""
    m, s = rep.counts["measured"], rep.size
    sev = {k: sum(1 for f in rep.findings if f.severity.value == k) for k in ("error", "warning", "info")}
    rnd = rep.config_summary.get("random_weights") or ck.get("random_weights")
    return (f"Audited `{ck['path']}` (from {ck['from']}){' — **random weights, scaled-down Ling layout**' if rnd else ''}: "
            f"{m['total_tensors']:,} tensors in {s['shards']} shards, {s['file_bytes'] / 1e6:,.1f} MB on disk, "
            f"scheme **{rep.config_summary['scheme']}**, audited in {rep.timings['total']:.2f} s. "
            f"Findings: {sev['error']} error, {sev['warning']} warning, {sev['info']} info; "
            f"fault verdicts (F-01..F-05): {sorted(f.code.value for f in rep.fault_findings()) or 'none'}.")


def card_summary(card: dict[str, Any]) -> str:
    """One Markdown line for stage 02's ``card_audit`` result: what of the card's checkpoint was
    read (and how many bytes and requests), or why it was not."""
    if not card["run"]:
        return f"The card's checkpoint: **not run**: {card['reason']}."
    return f"The card's checkpoint, {card['ck']['checked_on']}: {summary_markdown(card['report'], card['ck'])} {card['traffic']}."


def up_error_unshared(parquet: Path, figure: Path) -> dict[str, Any]:
    """The up_proj scale error SGLang's W4A4 scheme would apply on the card-style pipeline (both
    fused tables emptied, no gate/up rule), from 01's ``gate-up-scales-share=off.parquet``
    (columns ``gate``, ``up``: F32 global scales per expert). Writes ``figure``; ``{"run": False,
    "reason"}`` when 01 did not quantize without the rule."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import pandas as pd

    if not parquet.is_file():
        return {"run": False, "reason": f"{parquet.name} not written by 01_quantize (quantize.compare_unshared off or skipped)"}
    df = pd.read_parquet(parquet)
    err = (df["up"] / df["gate"] - 1.0).to_numpy()
    a = np.abs(err)
    out = {"run": True, "data": str(parquet), "experts": int(len(df)), "differ": int((df["gate"] != df["up"]).sum()),
           "median_abs_up_scale_error": float(np.median(a)) if len(a) else None,
           "p95_abs_up_scale_error": float(np.percentile(a, 95)) if len(a) else None,
           "max_abs_up_scale_error": float(a.max()) if len(a) else None}
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    ax.hist(err, bins=min(60, max(10, len(err) // 4)), color="#c44e52")
    ax.axvline(0, color="k", lw=0.8)
    ax.set_xlabel("up_proj scale error = up_global_scale / gate_global_scale - 1")
    ax.set_ylabel("experts")
    ax.set_title(f"Card-style pipeline (no gate/up rule): {out['differ']} of {out['experts']} experts differ")
    fig.tight_layout()
    fig.savefig(figure, dpi=110)
    plt.close(fig)
    out["figure"] = str(figure)
    return out


CARD_FINDINGS = {
    "audit.card-checkpoint": "The card's published checkpoint, read from the Hub, carries none of the faults "
                             "F-01..F-04 (activation scales, MTP state, draft format, weight-only config).",
    "audit.card-gate-up-scales": "The card's routed experts carry different gate_proj and up_proj weight_global_scale "
                                 "(its recipe empties the fused maps), so SGLang's W4A4 scheme, which uses the gate's "
                                 "for both, serves up_proj scaled by up/gate.",
}
