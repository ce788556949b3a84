"""Stage 02_inspect_checkpoint: what the notebook calls, one function per cell.

Find the checkpoint (``checkpoint.quantized_path`` or 01's ``data/quantize.json``), audit it from
its headers (:func:`nvfp4study.checkpoint_audit.audit_checkpoint`), write
``data/checkpoint_audit.json`` + ``data/checkpoint-tensors.parquet`` + two figures, show tables,
and record the ledger rows whose stage is ``02_inspect_checkpoint`` plus the study's findings.

The default run audits a SCALED checkpoint with RANDOM weights: counts are compared with the
layout formulas evaluated on the audited config, and the same formulas evaluated on the real
Ling-3.0-flash sizes (:class:`~nvfp4study.params.LingShape` defaults, from ``ling3-flash.md``)
give the numbers the card states; card values are only ever compared, never recorded as ours.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from . import checkpoint_audit as ca
from . import quant_rules as qr
from .errors import StageInputMissing
from .ledger import Verdict, card_claims
from .params import LingShape

REAL_KEYS = ("num_hidden_layers", "num_experts", "hidden_size", "moe_intermediate_size", "first_k_dense_replace",
             "n_group", "topk_group", "num_experts_per_tok", "layer_group_size")


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def resolve_checkpoint(stage: Any) -> dict[str, Any]:
    """The checkpoint to audit: ``checkpoint.quantized_path`` when set, else the ``quantized`` path
    01_quantize wrote in ``data/quantize.json``.

    Raises:
        StageInputMissing: neither is available (01 not run, or it skipped quantization).
    """
    cp = stage.params.checkpoint
    if cp.quantized_path:
        return {"path": cp.quantized_path, "from": "params checkpoint.quantized_path", "random_weights": None}
    f = stage.paths.data("quantize", "json")
    if not f.is_file():
        raise StageInputMissing(f"{f} missing: run 01_quantize first (or set checkpoint.quantized_path)")
    q = json.loads(f.read_text())
    if not q.get("quantized"):
        raise StageInputMissing(f"{f} names no quantized checkpoint ({q.get('reason') or 'quantization skipped'})")
    return {"path": q["quantized"], "from": f"01_quantize ({f.name})", "random_weights": q.get("random_weights")}


def real_config() -> dict[str, Any]:
    """Config of the real Ling-3.0-flash sizes (``ling_layout.config_dict(LingShape())``)."""
    from .ling_layout import config_dict

    return config_dict(LingShape())


def is_real_size(config: dict[str, Any]) -> bool:
    """Whether the audited config has the real model's sizes (all of :data:`REAL_KEYS`)."""
    real = real_config()
    return all(config.get(k) == real.get(k) for k in REAL_KEYS)


def predicted_data_bytes(shape: LingShape) -> int | None:
    """Tensor bytes of the NVFP4 + serving layout of ``shape`` (``quantize.nvfp4_layout`` over
    ``ling_layout.tensor_specs``): experts' U8 [o, i/2] + F8_E4M3 [o, i/16] + 2 F32 scales, the
    rest BF16/F32. None when the generator or quantizer layout is unavailable."""
    try:
        from . import ling_layout, quantize

        specs, _ = quantize.nvfp4_layout(shape, ling_layout.tensor_specs(shape), ling_layout.config_dict(shape))
        return sum(ling_layout.spec_nbytes(s) for s in specs)
    except Exception:  # the other stage's layout helpers changed or are missing: no prediction
        return None


def run_audit(stage: Any, ck: dict[str, Any]) -> ca.AuditReport:
    """Audit the checkpoint; write ``data/checkpoint_audit.json``, ``data/checkpoint-tensors.parquet``,
    ``figures/checkpoint-layer-heatmap.png`` and ``figures/checkpoint-up-scale-error.png``."""
    import pandas as pd

    rep = ca.audit_checkpoint(ck["path"])
    p = stage.paths
    data = rep.to_json() | {"source": ck}
    shape = stage.params.checkpoint.shape
    data["size"]["predicted_data_bytes_params_shape"] = predicted_data_bytes(shape)
    data["size"]["predicted_data_bytes_real_sizes"] = predicted_data_bytes(LingShape())
    data["counts"]["formulas_real_sizes"] = ca.count_formulas(real_config(), rep.counts["measured"]["mtp_other_tensors"])
    data["routing_real_sizes"] = vars(qr.check_routing(*(getattr(LingShape(), k) for k in
                                                          ("num_experts", "n_group", "topk_group", "num_experts_per_tok"))))
    data["real_size_config"] = is_real_size(json.loads((Path(ck["path"]) / "config.json").read_text()))
    _write_json(p.data("checkpoint_audit", "json"), data)
    tmp = p.data(".checkpoint-tensors", "parquet")
    pd.DataFrame(rep.tensor_rows()).to_parquet(tmp)
    os.replace(tmp, p.data("checkpoint-tensors", "parquet"))
    ca.plot_layer_heatmap(rep, p.figure("checkpoint-layer-heatmap"))
    ca.plot_up_scale_error(rep, p.figure("checkpoint-up-scale-error"))
    rep.extra = data  # type: ignore[attr-defined]
    return rep


def summary_markdown(rep: ca.AuditReport, ck: dict[str, Any]) -> str:
    """One paragraph: what was audited, how big, how long, and the findings by severity."""
    m, s = rep.counts["measured"], rep.size
    sev = {k: sum(1 for f in rep.findings if f.severity.value == k) for k in ("error", "warning", "info")}
    rnd = rep.config_summary.get("random_weights") or ck.get("random_weights")
    return (f"Audited `{ck['path']}` (from {ck['from']}){' — **random weights, scaled-down Ling layout**' if rnd else ''}: "
            f"{m['total_tensors']:,} tensors in {s['shards']} shards, {s['file_bytes'] / 1e6:,.1f} MB on disk, "
            f"scheme **{rep.config_summary['scheme']}**, audited in {rep.timings['total']:.2f} s. "
            f"Findings: {sev['error']} error, {sev['warning']} warning, {sev['info']} info; "
            f"fault verdicts (F-01..F-05): {sorted(f.code.value for f in rep.fault_findings()) or 'none'}.")


def findings_table(rep: ca.AuditReport) -> Any:
    """pandas DataFrame of the findings (tensor lists shortened to 3 names)."""
    import pandas as pd

    return pd.DataFrame([{"severity": f.severity.value, "code": f.code.value, "message": f.message,
                          "layers": ca_ranges(f.layers), "tensors": len(f.tensors),
                          "examples": ", ".join(f.tensors[:3])} for f in rep.findings])


def ca_ranges(xs: list[int]) -> str:
    from .checkpoint_modules import ranges

    return ranges(xs) if xs else ""


def precision_table(rep: ca.AuditReport) -> Any:
    """The card's precision table, derived from the files: component row x stored precision."""
    import pandas as pd

    return pd.DataFrame([{k: r[k] for k in ("component", "precision", "modules", "tensors", "layers")} |
                         {"MB": round(r["bytes"] / 1e6, 3)} for r in rep.precision_table])


def layer_table(rep: ca.AuditReport) -> Any:
    """Per layer: attention kind, MTP flag, packed FP4 weights, scale tensors, plain tensors."""
    import pandas as pd

    return pd.DataFrame(rep.layer_counts)


def scheme_table(rep: ca.AuditReport) -> Any:
    """Which scheme SGLang would apply to which modules: component x stored format x engine scheme."""
    import pandas as pd

    from .checkpoint_modules import is_weighted_linear

    rows: dict[tuple, dict[str, Any]] = {}
    for m in rep.modules.values():
        if not is_weighted_linear(m):
            continue
        key = (m.component, m.fmt, m.engine or "unquantized", m.engine_note.replace("layer rule (expert 0): ", "expert-0 rule, "))
        r = rows.setdefault(key, {"component": key[0], "stored": key[1], "engine scheme": key[2], "why": key[3],
                                  "modules": 0, "layers": set()})
        r["modules"] += 1
        r["layers"].add(m.layer)
    out = sorted(rows.values(), key=lambda r: (r["component"], r["stored"]))
    for r in out:
        r["layers"] = ca_ranges(sorted(x for x in r["layers"] if x >= 0)) or "-"
    return pd.DataFrame(out)


def mtp_table(rep: ca.AuditReport) -> Any:
    import pandas as pd

    return pd.DataFrame(rep.mtp)


def serving_table(rep: ca.AuditReport) -> Any:
    """SGLang release x GPU generation -> outcome for this checkpoint's scheme."""
    import pandas as pd

    df = pd.DataFrame(rep.serving)
    return df.pivot(index="version", columns="gpu", values="outcome").reset_index() if len(df) else df


def counts_table(rep: ca.AuditReport) -> Any:
    """Measured counts, the layout formula on the audited config, the same formula on the real
    sizes, and the card's value (labelled "card")."""
    import pandas as pd

    data = rep.extra  # type: ignore[attr-defined]
    card = {c["id"]: c["card"] for c in card_claims()}
    cards = {"quantized_expert_modules": card["counts.quantized-experts"]["quantized_expert_tensors"],
             "input_global_scales": card["scales.input-global-scale"]["count"],
             "mla_kv_unpacked": card["counts.mla-unpacked"]["mla_unpacked"],
             "mtp_layer_tensors": card["mtp.layer42-bf16"]["plain"]}
    m, f, fr = rep.counts["measured"], rep.counts["formulas"], data["counts"]["formulas_real_sizes"]
    return pd.DataFrame([{"count": k, "measured": m.get(k), "formula (audited config)": f.get(k, {}).get("value"),
                          "formula": f.get(k, {}).get("formula"), "formula at real sizes": fr.get(k, {}).get("value"),
                          "card": v} for k, v in cards.items()])


def heatmap_path(stage: Any) -> str:
    return str(stage.paths.figure("checkpoint-layer-heatmap"))


def up_error_path(stage: Any) -> str:
    return str(stage.paths.figure("checkpoint-up-scale-error"))


def unshared_up_error(stage: Any) -> dict[str, Any]:
    """The up_proj scale error SGLang's W4A4 scheme would apply on the card-style pipeline (both
    fused tables emptied, no gate/up rule), from 01's ``data/gate-up-scales-share=off.parquet``.
    Writes ``figures/up-scale-error-unshared.png``; ``{"run": False, "reason"}`` when 01 did not
    quantize without the rule."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import pandas as pd

    f = stage.paths.data("gate-up-scales", "parquet", share="off")
    if not f.is_file():
        return {"run": False, "reason": f"{f.name} not written by 01_quantize (quantize.compare_unshared off or skipped)"}
    df = pd.read_parquet(f)
    err = (df["up"] / df["gate"] - 1.0).to_numpy()
    a = np.abs(err)
    out = {"run": True, "data": str(f), "experts": int(len(df)), "differ": int((df["gate"] != df["up"]).sum()),
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
    fig.savefig(stage.paths.figure("up-scale-error-unshared"), dpi=110)
    plt.close(fig)
    out["figure"] = str(stage.paths.figure("up-scale-error-unshared"))
    return out
