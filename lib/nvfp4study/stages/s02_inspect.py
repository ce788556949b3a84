"""Stage 02_inspect_checkpoint: what the notebook calls, one function per cell.

Find the checkpoint (``checkpoint.quantized_path`` or 01's ``data/quantize.json``), audit it from
its headers (:func:`nvfp4study.checkpoint.audit.audit_checkpoint`), write
``data/checkpoint_audit.json`` + ``data/checkpoint-tensors.parquet`` + two figures, show tables,
and record the ledger rows whose stage is ``02_inspect_checkpoint`` plus the study's findings.

The default run audits a SCALED checkpoint with RANDOM weights: counts are compared with the
layout formulas evaluated on the audited config, and the same formulas evaluated on the real
Ling-3.0-flash sizes (:class:`~nvfp4study.core.params.LingShape` defaults, ``docs/ling-layout.md``)
give the numbers the card states; card values are only ever compared, never recorded as ours.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..checkpoint import audit as ca
from ..checkpoint import compare as cmp
from ..core import display
from ..core.claim_rules import record_rules
from ..core.errors import StageInputMissing
from ..core.files import write_json
from ..core.ledger import card_claims
from ..core.stage import Stage, open_stage_named
from .claim_rules import r02_inspect as rules

NOTEBOOK = "02_inspect_checkpoint"


def open_stage(params_file: str = "", run_dir: str = "") -> Stage:
    """:func:`nvfp4study.core.stage.open_stage_named` for notebook ``02_inspect_checkpoint``."""
    return open_stage_named(NOTEBOOK, params_file, run_dir)


def markdown(text: str) -> Any:
    """The notebook's Markdown output (:func:`nvfp4study.core.display.markdown`)."""
    return display.markdown(text)


SAFETENSORS_DTYPE = rules.SAFETENSORS_DTYPE  # card word -> header dtype
#: the real-size config both audits share (checkpoint/compare.py), read by the claim rules
real_config = cmp.real_config


def resolve_checkpoint(stage: Stage) -> dict[str, Any]:
    """The checkpoint to audit: ``checkpoint.quantized_path`` when set, else the ``quantized`` path
    01_quantize wrote in ``data/quantize.json``; when that is the card's checkpoint 01 downloaded
    (``checkpoint.serve: card``) it is named as the card's (``card``, ``checked_on``: repo@commit),
    so 02's notes do not call it the study's scaled random-weight checkpoint.

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
    card = q.get("card_checkpoint") or {}
    if card.get("path") == q["quantized"]:  # checkpoint.serve: card: what 01 downloaded is the card's own
        return {"path": q["quantized"], "from": f"01_quantize ({f.name})", "random_weights": None, "card": True,
                "checked_on": f"hf:{card['repo_id']}@{card['commit']} (the card's checkpoint as 01 downloaded it)"}
    return {"path": q["quantized"], "from": f"01_quantize ({f.name})", "random_weights": q.get("random_weights")}


def run_audit(stage: Stage, ck: dict[str, Any], reader: Any = None, stem: str = "checkpoint") -> ca.AuditReport:
    """Audit the checkpoint (through ``reader`` when given: the card's on the Hub); write
    ``data/{stem}_audit.json``, ``data/{stem}-tensors.parquet``, ``figures/{stem}-layer-heatmap.png``
    and ``figures/{stem}-up-scale-error.png``."""
    import pandas as pd

    rep = ca.audit_checkpoint(ck["path"], reader=reader)
    p = stage.paths
    config = json.loads(reader.read_small("config.json") if reader else (Path(ck["path"]) / "config.json").read_text())
    data = cmp.add_extras(rep.to_json() | {"source": ck}, rep, config, stage.params.checkpoint.shape)
    data["files"] = {"audit": str(p.data(f"{stem}_audit", "json")), "tensors": str(p.data(f"{stem}-tensors", "parquet")),
                     "heatmap": str(p.figure(f"{stem}-layer-heatmap")), "up_error": str(p.figure(f"{stem}-up-scale-error"))}
    if reader is not None:
        data["traffic"] = reader.stats.to_dict()
    write_json(p.data(f"{stem}_audit", "json"), data)
    tmp = p.data(f".{stem}-tensors", "parquet")
    pd.DataFrame(rep.tensor_rows()).to_parquet(tmp)
    os.replace(tmp, p.data(f"{stem}-tensors", "parquet"))
    ca.plot_layer_heatmap(rep, p.figure(f"{stem}-layer-heatmap"))
    ca.plot_up_scale_error(rep, p.figure(f"{stem}-up-scale-error"))
    rep.extra = data
    return rep


def card_audit(stage: Stage) -> dict[str, Any]:
    """Audit the card's own checkpoint when ``checkpoint.card_checkpoint`` names it (by range
    requests: headers and ``[1]`` scales, no weights); files as :func:`run_audit` with stem
    ``card_checkpoint``. A re-run of this folder reuses the commit recorded there.

    Returns ``{"run": True, "report", "ck", "traffic"}``, or ``{"run": False, "reason"}`` when no
    card checkpoint is named (nothing touches the network) or the Hub cannot be read (the named
    HubError's message, which says what to do).
    """
    from ..checkpoint.hub_audit import traffic_line
    from ..core.errors import HubError

    src = stage.params.checkpoint.card_checkpoint
    if src is None:
        return {"run": False, "reason": cmp.NO_HUB}
    prev = cmp.recorded_commit(stage.paths.data("card_checkpoint_audit", "json"), src)
    try:
        ck, reader, _ = cmp.open_card(src, prev)
        rep = run_audit(stage, ck, reader=reader, stem="card_checkpoint")
    except HubError as exc:
        return {"run": False, "reason": f"no Hub access ({type(exc).__name__}): {exc}"}
    return {"run": True, "report": rep, "ck": ck, "traffic": traffic_line(reader, rep.size["file_bytes"])}


def comparison_table(report: ca.AuditReport, card: dict[str, Any]) -> Any:
    """Side by side: the card's checkpoint (measured) vs ours (measured) vs the card's text
    ("card says", from claims.yaml); :func:`nvfp4study.checkpoint.compare.side_by_side`."""
    import pandas as pd

    label = card["ck"]["hub"]["commit"][:12] if card["run"] else ""
    return pd.DataFrame(cmp.side_by_side(report, card.get("report"), label, card.get("reason", "")))


def summary_markdown(rep: ca.AuditReport, ck: dict[str, Any]) -> str:
    """One paragraph on our audit: what, how big, how long, findings by severity
    (:func:`nvfp4study.checkpoint.compare.summary_markdown`)."""
    return cmp.summary_markdown(rep, ck)


def card_summary(card: dict[str, Any]) -> str:
    """One Markdown line on :func:`card_audit`'s result: what of the card's checkpoint was read,
    or why not (:func:`nvfp4study.checkpoint.compare.card_summary`)."""
    return cmp.card_summary(card)


def findings_table(rep: ca.AuditReport) -> Any:
    """pandas DataFrame of the findings (tensor lists shortened to 3 names)."""
    import pandas as pd

    return pd.DataFrame([{"severity": f.severity.value, "code": f.code.value, "message": f.message,
                          "layers": ca_ranges(f.layers), "tensors": len(f.tensors),
                          "examples": ", ".join(f.tensors[:3])} for f in rep.findings])


def ca_ranges(xs: list[int]) -> str:
    from ..checkpoint.modules import ranges

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

    from ..checkpoint.modules import is_weighted_linear

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

    data = rep.extra
    card = {c["id"]: c["card"] for c in card_claims()}
    cards = {"quantized_expert_modules": card["counts.quantized-experts"]["quantized_expert_tensors"],
             "input_global_scales": card["scales.input-global-scale"]["count"],
             "mla_kv_unpacked": card["counts.mla-unpacked"]["mla_unpacked"],
             "mtp_layer_tensors": card["mtp.layer42-bf16"]["plain"]}
    m, f, fr = rep.counts["measured"], rep.counts["formulas"], data["counts"]["formulas_real_sizes"]
    return pd.DataFrame([{"count": k, "measured": m.get(k), "formula (audited config)": f.get(k, {}).get("value"),
                          "formula": f.get(k, {}).get("formula"), "formula at real sizes": fr.get(k, {}).get("value"),
                          "card": v} for k, v in cards.items()])


def heatmap_path(stage: Stage) -> str:
    return str(stage.paths.figure("checkpoint-layer-heatmap"))


def up_error_path(stage: Stage) -> str:
    return str(stage.paths.figure("checkpoint-up-scale-error"))


def unshared_up_error(stage: Stage) -> dict[str, Any]:
    """:func:`nvfp4study.checkpoint.compare.up_error_unshared` on 01's
    ``data/gate-up-scales-share=off.parquet``, figure ``figures/up-scale-error-unshared.png``."""
    return cmp.up_error_unshared(stage.paths.data("gate-up-scales", "parquet", share="off"),
                                 stage.paths.figure("up-scale-error-unshared"))


# --- ledger --------------------------------------------------------------------------------------
def _scope(stage: Stage, rep: ca.AuditReport, ck: dict[str, Any]) -> tuple[bool, bool, str, str]:
    """:func:`~nvfp4study.stages.claim_rules.r02_inspect.audit_scope` of this stage's run."""
    return rules.audit_scope(stage.run_dir, rep, ck)


def record_ledger(stage: Stage, rep: ca.AuditReport, ck: dict[str, Any], unshared: dict[str, Any],
                  card: dict[str, Any] | None = None) -> Any:
    """Record every claim of stage 02 and the study's findings; returns the rows as a DataFrame.

    With ``card`` (:func:`card_audit`) run, the claim rows are measured on the card's own files
    (``checked_on`` names repo@commit); ours keep the study's findings. Without it, the claim rows
    come from ours as before and the card-artifact rows say "not run" and why.
    """
    import pandas as pd

    from ..core.ledger import read_ledger

    card = card or {"run": False, "reason": cmp.NO_HUB}
    if card["run"]:
        _record_claims(stage, card["report"], card["ck"])
    else:
        _record_claims(stage, rep, ck)
    _record_findings(stage, rep, ck, unshared)
    record_rules(stage, rules.CardFindings(card))
    ids = stage.claims() + ["audit.fault-verdicts", "audit.gate-up-shared", "audit.up-scale-error-card-pipeline",
                            "audit.card-checkpoint", "audit.card-gate-up-scales"]
    return pd.DataFrame([{k: r.get(k) for k in ("id", "verdict", "checked_on", "measured", "note")}
                         for r in read_ledger(stage.run_dir) if r["id"] in ids])


def _record_claims(stage: Stage, rep: ca.AuditReport, ck: dict[str, Any]) -> None:
    """Every stage-02 card claim, decided by its rule (:mod:`~nvfp4study.stages.claim_rules.r02_inspect`)."""
    record_rules(stage, rules.InspectMeasurements.gather(stage.run_dir, rep, ck))


def _record_findings(stage: Stage, rep: ca.AuditReport, ck: dict[str, Any], unshared: dict[str, Any]) -> None:
    """The study's findings on OUR checkpoint (fault verdicts, gate/up pairing, card-style pipeline),
    each decided by its rule (:class:`~nvfp4study.stages.claim_rules.r02_inspect.InspectFindings`)."""
    real, _, scope, checked = _scope(stage, rep, ck)
    record_rules(stage, rules.InspectFindings(rep, real, scope, checked, unshared))
