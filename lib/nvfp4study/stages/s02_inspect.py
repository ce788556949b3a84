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
from collections import Counter
from pathlib import Path
from typing import Any

from ..checkpoint import audit as ca
from ..checkpoint import compare as cmp
from ..checkpoint import quant_rules as qr
from ..core import display
from ..core.errors import StageInputMissing
from ..core.files import write_json
from ..core.ledger import Verdict, card_claims
from ..core.stage import Stage, open_stage_named

NOTEBOOK = "02_inspect_checkpoint"


def open_stage(params_file: str = "", run_dir: str = "") -> Stage:
    """:func:`nvfp4study.core.stage.open_stage_named` for notebook ``02_inspect_checkpoint``."""
    return open_stage_named(NOTEBOOK, params_file, run_dir)


def markdown(text: str) -> Any:
    """The notebook's Markdown output (:func:`nvfp4study.core.display.markdown`)."""
    return display.markdown(text)

SAFETENSORS_DTYPE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float64": "F64"}  # card word -> header dtype
#: the real-size config both audits share (checkpoint/compare.py), read by _record_claims
real_config = cmp.real_config


def resolve_checkpoint(stage: Stage) -> dict[str, Any]:
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
def _rows_by_prec(rep: ca.AuditReport) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in rep.precision_table:
        out.setdefault(r["component"], set()).add(r["precision"])
    return out


def _scope(stage: Stage, rep: ca.AuditReport, ck: dict[str, Any]) -> tuple[bool, bool, str, str]:
    """``(real, random, scope, checked_on)`` of one audit. The card's checkpoint counts as "real":
    its numbers are compared with the card's directly, whatever its sizes."""
    real = bool(rep.extra["real_size_config"]) or bool(ck.get("card"))
    rnd = bool(rep.config_summary.get("random_weights") or ck.get("random_weights"))
    where = Path(ck["path"])
    checked = ck.get("checked_on") or \
        f"audit of {where.relative_to(stage.run_dir) if where.is_relative_to(stage.run_dir) else where}"
    scope = ("the card's own checkpoint, " + checked if ck.get("card") else
             ("the audited checkpoint at the real sizes" + (" (random weights)" if rnd else "")) if real else
             "the study's SCALED checkpoint with RANDOM weights, quantized with the card's recipe; reproduced in "
             "structure only")
    return real, rnd, scope, checked


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
    cmp.record_card_findings(stage, card)
    ids = stage.claims() + ["audit.fault-verdicts", "audit.gate-up-shared", "audit.up-scale-error-card-pipeline",
                            "audit.card-checkpoint", "audit.card-gate-up-scales"]
    return pd.DataFrame([{k: r.get(k) for k in ("id", "verdict", "checked_on", "measured", "note")}
                         for r in read_ledger(stage.run_dir) if r["id"] in ids])


def _record_claims(stage: Stage, rep: ca.AuditReport, ck: dict[str, Any]) -> None:
    data = rep.extra
    ev, ev_t, ev_h = data["files"]["audit"], data["files"]["tensors"], data["files"]["heatmap"]
    real, rnd, scope, checked = _scope(stage, rep, ck)
    card = {c["id"]: c["card"] for c in card_claims()}
    nl = rep.config_summary["num_hidden_layers"]
    m, f, fr = rep.counts["measured"], rep.counts["formulas"], data["counts"]["formulas_real_sizes"]

    # size.disk
    s = data["size"]
    pred_p, pred_r = s.get("predicted_data_bytes_params_shape"), s.get("predicted_data_bytes_real_sizes")
    if real:
        gb = s["file_bytes"] / 1e9
        stage.record("size.disk", measured={"disk_gb": round(gb, 2), "disk_gib": round(s["file_bytes"] / 2**30, 2)},
                     verdict=Verdict.REPRODUCED if round(gb) == card["size.disk"]["disk_gb"] or round(s["file_bytes"] / 2**30) == card["size.disk"]["disk_gb"] else Verdict.CONTRADICTED,
                     evidence=[ev], note="sum of shard file sizes (GB = 1e9 bytes; GiB = 2^30 bytes)", checked_on=checked)
    else:
        ok = pred_p == s["data_bytes"]
        card_gb = card["size.disk"]["disk_gb"]
        gb_r, gib_r = pred_r / 1e9, pred_r / 2**30
        fits = [u for u, x in (("GB", gb_r), ("GiB", gib_r)) if round(x) == card_gb]
        stage.record("size.disk", measured={"scaled_checkpoint_mb": round(s["file_bytes"] / 1e6, 2),
                                            "scaled_tensor_bytes": s["data_bytes"], "predicted_scaled_tensor_bytes": pred_p,
                                            "prediction_matches_scaled_tensor_bytes": ok},
                     verdict=Verdict.PARTLY if ok and fits else Verdict.CONTRADICTED, evidence=[ev],
                     note=(f"Not measured on the real files. The NVFP4+serving layout's tensor bytes (experts U8 [o,i/2] + "
                           f"F8_E4M3 [o,i/16] + 2 F32 scales, rest BF16/F32) predict {gb_r:.1f} GB = {gib_r:.1f} GiB at "
                           f"the real sizes (arithmetic on LingShape defaults; headers add a few MB), which "
                           + (f"rounds to the card's {card_gb} when read as {' or '.join(fits)}. " if fits else
                              f"rounds to the card's {card_gb} neither in GB nor in GiB. ")
                           + f"The same prediction for this run's shape {'equals' if ok else 'does NOT equal'} the "
                           f"audited checkpoint's tensor bytes ({pred_p:,} vs {s['data_bytes']:,})."), checked_on=checked)

    # layout.*
    prec = _rows_by_prec(rep)
    rexp = [r for r in rep.precision_table if r["component"] == ca.CARD_ROWS["routed_expert"]]
    exp_fmt = {r["precision"]: r["layers"] for r in rexp}
    groups = rep.config_summary["groups"]
    w = (groups[0]["weights"] or {}) if groups else {}
    ok_fmt = set(exp_fmt) == {"NVFP4"} and w.get("strategy") == "tensor_group" and w.get("group_size") == 16
    stage.record("layout.routed-experts",
                 measured={"formats_by_layers": exp_fmt, "block_scale": "F8_E4M3", "group_size_from_scale_columns": 16 if ok_fmt else None,
                           "config_strategy": w.get("strategy"), "config_group_size": w.get("group_size")},
                 verdict=Verdict.PARTLY if ok_fmt else Verdict.CONTRADICTED, evidence=[ev, ev_t],
                 note=(f"Routed experts are NVFP4 (U8 packed e2m1 [out,in/2], F8_E4M3 block scales [out,in/16], F32 global "
                       f"scale; config tensor_group / 16) on layers {exp_fmt.get('NVFP4')}; {scope}. The card's row says "
                       "layers 0-41, but the dense layers (< first_k_dense_replace) have no routed experts: the range is "
                       "2-41 on the real model." if ok_fmt else f"routed experts stored as {exp_fmt}, config {w}"),
                 checked_on=checked)
    bf_rows = [ca.CARD_ROWS[k] for k in ("attention_proj", "kda_misc", "mla_proj", "shared_expert", "lm_head")]
    got = {r: sorted(prec.get(r, set())) for r in bf_rows}
    packed_any = any(x in ("NVFP4", "MXFP4", "INVALID-PACKED") for v in got.values() for x in v)
    only_bf16 = all(set(v) <= {"BF16"} for v in got.values())
    stage.record("layout.bf16-components", measured=got,
                 verdict=Verdict.CONTRADICTED if packed_any else (Verdict.REPRODUCED if only_bf16 else Verdict.PARTLY),
                 evidence=[ev, ev_t],
                 note=("None of these components is quantized" + ("" if only_bf16 else
                       "; A_log, dt_bias and the router's expert_bias are F32 in the generated Ling layout "
                       "(ling_layout's reconstruction), not BF16 as the card's table says") + f"; {scope}."
                       if not packed_any else "some of these components are packed (see measured)"), checked_on=checked)
    fg = sorted({(mo.proj, mo.fmt) for mo in rep.modules.values()
                 if mo.component == "attention_proj" and mo.proj in ("f_proj", "g_proj") and mo.layer < nl
                 and f"model.layers.{mo.layer}.attention.kv_a_proj_with_mqa" not in rep.modules})
    stage.record("layout.kda-gates-bf16", measured={p_: f_ for p_, f_ in fg},
                 verdict=Verdict.REPRODUCED if fg and all(f_ == "BF16" for _, f_ in fg) else Verdict.CONTRADICTED,
                 evidence=[ev_t], note=f"f_proj and g_proj of the KDA layers, as stored; {scope}.", checked_on=checked)

    # MTP
    mt = rep.mtp[0] if rep.mtp else None
    if mt is None:
        stage.not_run("config declares no MTP layer", ["mtp.layer42-bf16", "mtp.ignore-first"])
    else:
        fm = f.get("mtp_layer_tensors", {})
        frm = fr.get("mtp_layer_tensors", {})
        c42 = card["mtp.layer42-bf16"]
        state_ok = mt["packed_tensors"] == 0 and mt["state"] == "bf16-ignored"
        bf16_other = m["mtp_other_tensors"] - mt["dtypes"].get("F32", 0)
        if real:
            v = Verdict.REPRODUCED if state_ok and mt["tensors"] == c42["plain"] else Verdict.PARTLY if state_ok else Verdict.CONTRADICTED
        else:
            v = Verdict.PARTLY if state_ok else Verdict.CONTRADICTED
        stage.record("mtp.layer42-bf16",
                     measured={"layer": mt["layer"], "packed": mt["packed_tensors"], "plain": mt["plain_tensors"],
                               "dtypes": mt["dtypes"], "state": mt["state"], "formula": fm.get("formula")},
                     verdict=v, evidence=[ev, ev_h],
                     note=(f"MTP layer {mt['layer']}: {mt['packed_tensors']} packed, {mt['plain_tensors']} plain, state "
                           f"'{mt['state']}'; {scope}. Count = 3 x num_experts + {m['mtp_other_tensors']} other tensors of the "
                           f"generated layout = {frm.get('value')} at the real sizes vs the card's {c42['plain']:,} "
                           f"(the reconstructed name list has one non-expert tensor more; its plain tensors here are "
                           f"{mt['dtypes']}: the router's expert_bias is F32, so the BF16 tensors alone number "
                           f"3 x num_experts + {bf16_other} = {3 * real_config()['num_experts'] + bf16_other:,} at the real "
                           "sizes, the card's number if it counted BF16 tensors only)."),
                     checked_on=checked)
        first = rep.config_summary["ignore"][0] if rep.config_summary["ignore"] else None
        want = rf"re:.*layers\.{nl}\..*"
        stage.record("mtp.ignore-first", measured={"ignore_first": first, "matches_mtp_layer": mt["ignore_first_matches"]},
                     verdict=Verdict.REPRODUCED if first == want and mt["ignore_first_matches"] else Verdict.CONTRADICTED,
                     evidence=[ev], note=f"ignore[0] of config.json; the MTP layer here is {nl} (the card's 42 at real sizes); {scope}.",
                     checked_on=checked)

    # counts
    for cid, key, ckey in (("counts.quantized-experts", "quantized_expert_modules", "quantized_expert_tensors"),
                           ("counts.mla-unpacked", "mla_kv_unpacked", "mla_unpacked")):
        v, why = cmp.count_verdict(m[key], f[key]["value"], fr[key]["value"], card[cid][ckey], real)
        extra = ("" if key != "mla_kv_unpacked" else
                 " The card does not say which 16 tensors: kv_a_proj_with_mqa + kv_b_proj of the 8 MLA layers (7 trunk + MTP) "
                 f"is the reading of this layout that gives 16; unpacked MLA-only modules here: {m['mla_unpacked_by_module']}.")
        # the formula's value at the real sizes is arithmetic, not a measurement: it is in the note
        stage.record(cid, measured={"count": m[key], "formula": f[key]["formula"]},
                     verdict=v, evidence=[ev, ev_t], note=why + "." + extra, checked_on=checked)
    ins = rep.input_scales
    c_in = card["scales.input-global-scale"]
    v, why = cmp.count_verdict(m["input_global_scales"], f["input_global_scales"]["value"], fr["input_global_scales"]["value"],
                            c_in["count"], real)
    in_dtypes = dict(Counter(mo.params["input_global_scale"].dtype for mo in rep.modules.values()
                             if "input_global_scale" in mo.params))
    want_dt = SAFETENSORS_DTYPE.get(c_in["dtype"], c_in["dtype"])
    if not (ins.get("input_all_one") and m["input_global_scales"] == m["quantized_expert_modules"]
            and set(in_dtypes) == {want_dt}):
        v = Verdict.CONTRADICTED
    why += (f". Header dtypes of the input_global_scale tensors: {in_dtypes or 'none'} (card {c_in['dtype']} = "
            f"safetensors {want_dt})")
    stage.record("scales.input-global-scale",
                 measured={"count": m["input_global_scales"], "dtypes": in_dtypes, "values": ins.get("input_values"),
                           "one_per_expert_weight_global_scale": m["input_global_scales"] == m["quantized_expert_modules"],
                           "missing": ins.get("missing"), "nonfinite": ins.get("input_nonfinite_or_nonpositive")},
                 verdict=v, evidence=[ev], note=why + ". Values read with safetensors.safe_open.", checked_on=checked)

    # config
    acts = [g["input_activations"] for g in groups]
    a = acts[0] if acts and acts[0] else None
    w4a4 = rep.config_summary["scheme"] == "W4A4" and a and a.get("dynamic") == "local"
    stage.record("config.w4a4",
                 measured={"scheme": rep.config_summary["scheme"],
                           "input_activations": {k: a.get(k) for k in ("num_bits", "type", "dynamic", "strategy", "group_size")} if a else None},
                 verdict=Verdict.REPRODUCED if w4a4 else Verdict.CONTRADICTED, evidence=[ev],
                 note=("The config's group is 4-bit float tensor_group/16 for weights and activations with dynamic 'local', "
                       "which SGLang's _is_fp4a4_nvfp4 predicate (compressed_tensors.py 589-616) accepts -> "
                       f"CompressedTensorsW4A4Nvfp4MoE on Blackwell; {scope}." if w4a4 else "not the card's W4A4 block"),
                 checked_on=checked)
    cl = rep.config_summary["clamp_lists"]
    ctx = rep.config_summary["context"]
    if real and not rnd:
        want_e = {str(i): 4 for i in range(35, 42)}
        want_s = {**{str(i): 5 for i in range(34, 40)}, "40": 7, "41": 7}
        got_e = (cl.get("expert_swiglu_limit_list") or {}).get("nonzero")
        got_s = (cl.get("share_expert_swiglu_limit_list") or {}).get("nonzero")
        stage.record("config.clamp-lists", measured={"expert": got_e, "shared": got_s},
                     verdict=Verdict.REPRODUCED if got_e == want_e and got_s == want_s else Verdict.CONTRADICTED,
                     evidence=[ev], note="nonzero entries by layer, from config.json", checked_on=checked)
        cc = card["config.context"]
        stage.record("config.context", measured=ctx,
                     verdict=Verdict.REPRODUCED if ctx == {"max_position_embeddings": cc["max_position_embeddings"], "rope_scaling": None} else Verdict.CONTRADICTED,
                     evidence=[ev], note="from config.json", checked_on=checked)
    elif rnd:
        why = "not run (generated checkpoint: values come from the generator, circular)"
        stage.record("config.clamp-lists", measured=None, verdict=Verdict.NOT_RUN, evidence=[ev],
                     note=f"{why}: ling_layout wrote the lists (expert {cl.get('expert_swiglu_limit_list')}, shared "
                          f"{cl.get('share_expert_swiglu_limit_list')}) from params / the card's statement. Audit the "
                          "card's checkpoint (checkpoint.quantized_path) to test it.")
        stage.record("config.context", measured=None, verdict=Verdict.NOT_RUN, evidence=[ev],
                     note=f"{why}: the config carries {ctx}, written by ling_layout from the card's own statement; "
                          "the loaders disagree on the real value (131072 + YaRN to 262144 in the vendor's "
                          "serving recipes, 262144 elsewhere).")
    else:
        why = "not run: the audited config does not have the real model's sizes"
        stage.record("config.clamp-lists", measured=None, verdict=Verdict.NOT_RUN, evidence=[ev],
                     note=f"{why} (its lists: expert {cl.get('expert_swiglu_limit_list')}, shared "
                          f"{cl.get('share_expert_swiglu_limit_list')}), so the card's layer numbers do not apply. Audit "
                          "the card's checkpoint (checkpoint.quantized_path) to test it.")
        stage.record("config.context", measured=None, verdict=Verdict.NOT_RUN, evidence=[ev],
                     note=f"{why} (it carries {ctx}); the claim is about the card's config.json.")

    # routing: the card's files are measured; ours is arithmetic at the reference sizes
    if ck.get("card"):
        r = rep.routing
        stage.record("clamp.trtllm-routing", measured={k: r.get(k) for k in ("num_experts", "n_group", "experts_per_group", "status")},
                     verdict=Verdict.REPRODUCED if r.get("status") == "over" and (r.get("experts_per_group") or 0) > qr.WARP_SIZE
                     else Verdict.CONTRADICTED, evidence=[ev],
                     note=(f"{r.get('num_experts')} / {r.get('n_group')} = {r.get('experts_per_group')} experts per group in "
                           f"{scope} vs the kernel's {qr.WARP_SIZE} (FlashInfer routingDeepSeek); rule status "
                           f"'{r.get('status')}'. The kernel's check only; the backend was not run (no GPU)."),
                     checked_on=checked)
        return
    rr = data["routing_real_sizes"]
    stage.record("clamp.trtllm-routing",
                 measured={"audited": {k: rep.routing.get(k) for k in ("num_experts", "n_group", "experts_per_group", "status")}},
                 verdict=Verdict.PARTLY if rr["status"] == "over" and rr["experts_per_group"] > qr.WARP_SIZE else Verdict.CONTRADICTED,
                 evidence=[ev],
                 note=(f"Arithmetic on the reference sizes (LingShape defaults, not measured): {rr['num_experts']} / "
                       f"{rr['n_group']} = {rr['experts_per_group']:g} experts per group "
                       f"{'>' if rr['experts_per_group'] > qr.WARP_SIZE else '<='} {qr.WARP_SIZE} (FlashInfer routingDeepSeek: "
                       f"mNumExperts / mNumExpertGroups <= WarpSize), rule status '{rr['status']}'; the audited config "
                       f"(measured) gives '{rep.routing.get('status')}'. The kernel's check only; the backend was not run "
                       "(no GPU)."),
                 checked_on="FlashInfer TRT-LLM routing kernel checks (fault F-05: routing shapes)")

def _record_findings(stage: Stage, rep: ca.AuditReport, ck: dict[str, Any], unshared: dict[str, Any]) -> None:
    """The study's findings on OUR checkpoint (fault verdicts, gate/up pairing, card-style pipeline)."""
    ev, ev_u = rep.extra["files"]["audit"], rep.extra["files"]["up_error"]
    real, _, scope, checked = _scope(stage, rep, ck)
    rr = rep.extra["routing_real_sizes"]
    faults = sorted(f_.code.value for f_ in rep.fault_findings())
    expected = {"F05-routing-over-limit"} if rr["status"] == "over" and real else set()
    stage.add_finding("audit.fault-verdicts",
                      claim="The checkpoint this run serves carries none of the faults F-01..F-04 (activation scales, MTP "
                            "state, draft format, weight-only config); F-05 depends only on the routing shape.",
                      measured={"fault_codes": faults, "errors": [f_.code.value for f_ in rep.errors],
                                "warnings": sorted({f_.code.value for f_ in rep.findings if f_.severity.value == "warning"})},
                      verdict=Verdict.REPRODUCED if set(faults) <= expected and not rep.errors else Verdict.CONTRADICTED,
                      evidence=[ev], note=f"Header audit of {scope}.", checked_on=checked)
    gs = rep.gate_up_summary
    stage.add_finding("audit.gate-up-shared",
                      claim="Every routed expert of the audited checkpoint has equal gate and up weight_global_scale, so SGLang's "
                            "W4A4 scheme (which uses the gate's for both) dequantizes up_proj exactly.",
                      measured=gs, verdict=Verdict.REPRODUCED if gs.get("pairs") and gs.get("mismatched") == 0 else Verdict.CONTRADICTED,
                      evidence=[ev, ev_u], note=f"{scope}.", checked_on=checked)
    if unshared.get("run"):
        stage.add_finding("audit.up-scale-error-card-pipeline",
                          claim="On the card-style pipeline (fused maps emptied, no gate/up rule) gate and up global scales "
                                "differ per expert, and SGLang's W4A4 scheme serves up_proj scaled by up/gate (error up/gate - 1).",
                          measured={k: unshared[k] for k in ("experts", "differ", "median_abs_up_scale_error",
                                                             "p95_abs_up_scale_error", "max_abs_up_scale_error")},
                          verdict=Verdict.REPRODUCED if unshared["differ"] > 0 else Verdict.CONTRADICTED,
                          evidence=[unshared["data"], unshared["figure"]],
                          note="Scales from 01's quantization without the pairing rule, random weights; the card's own "
                               "checkpoint was not available to measure.", checked_on="SGLang 0.5.23 w4a4_nvfp4_moe.py 187-198")
