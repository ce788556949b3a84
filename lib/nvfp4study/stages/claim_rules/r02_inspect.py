"""Stage 02's claim rules: one function per ``02_inspect_checkpoint`` claim of ``core/claims.yaml``.

Every rule reads :class:`InspectMeasurements` (the header audit of one checkpoint: ours, or the
card's own when ``checkpoint.card_checkpoint`` was read) and returns the ledger row. On a scaled
checkpoint a count is at best "partly": it is compared with the layout formula, whose value at
the real sizes (:class:`~nvfp4study.core.params.LingShape` defaults) is the card's number.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ...checkpoint import audit as ca
from ...checkpoint import compare as cmp
from ...checkpoint import quant_rules as qr
from ...core.claim_rules import Row, claim_rule, finding_rule
from ...core.ledger import Verdict, card_claims

#: card word -> safetensors header dtype
SAFETENSORS_DTYPE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float64": "F64"}


def audit_scope(run_dir: Path, rep: ca.AuditReport, ck: dict[str, Any]) -> tuple[bool, bool, str, str]:
    """``(real, random, scope, checked_on)`` of one audit. The card's checkpoint counts as "real":
    its numbers are compared with the card's directly, whatever its sizes."""
    real = bool(rep.extra["real_size_config"]) or bool(ck.get("card"))
    rnd = bool(rep.config_summary.get("random_weights") or ck.get("random_weights"))
    where = Path(ck["path"])
    checked = ck.get("checked_on") or \
        f"audit of {where.relative_to(run_dir) if where.is_relative_to(run_dir) else where}"
    scope = ("the card's own checkpoint, " + checked if ck.get("card") else
             ("the audited checkpoint at the real sizes" + (" (random weights)" if rnd else "")) if real else
             "the study's SCALED checkpoint with RANDOM weights, quantized with the card's recipe; reproduced in "
             "structure only")
    return real, rnd, scope, checked


@dataclass(frozen=True)
class InspectMeasurements:
    """One checkpoint audit, as the stage-02 rules read it (built once by :meth:`gather`)."""

    STAGE: ClassVar[str] = "02_inspect_checkpoint"
    rep: ca.AuditReport
    ck: dict[str, Any]
    real: bool  # real sizes, or the card's own files
    rnd: bool  # random weights
    scope: str  # what was audited, in words (ends every note)
    checked: str  # checked_on
    card: dict[str, Any]  # claim id -> the card's value (claims.yaml)

    @classmethod
    def gather(cls, run_dir: Path, rep: ca.AuditReport, ck: dict[str, Any]) -> InspectMeasurements:
        real, rnd, scope, checked = audit_scope(run_dir, rep, ck)
        return cls(rep, ck, real, rnd, scope, checked, {c["id"]: c["card"] for c in card_claims()})

    @property
    def data(self) -> dict[str, Any]:
        return self.rep.extra

    @property
    def ev(self) -> str:
        return self.data["files"]["audit"]

    @property
    def ev_t(self) -> str:
        return self.data["files"]["tensors"]

    @property
    def nl(self) -> int:
        return self.rep.config_summary["num_hidden_layers"]

    @property
    def counts(self) -> tuple[dict, dict, dict]:
        """``(measured, formulas on the audited config, formulas at the real sizes)``."""
        return self.rep.counts["measured"], self.rep.counts["formulas"], self.data["counts"]["formulas_real_sizes"]

    @property
    def groups(self) -> list[dict[str, Any]]:
        return self.rep.config_summary["groups"]


def _rows_by_prec(rep: ca.AuditReport) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in rep.precision_table:
        out.setdefault(r["component"], set()).add(r["precision"])
    return out


@claim_rule("size.disk", InspectMeasurements)
def size_disk(x: InspectMeasurements) -> Row:
    """Real files: the shard sizes in GB or GiB vs the card's 76; scaled: the layout's byte
    prediction, checked on this shape, evaluated at the real sizes (at best partly)."""
    s, card_gb = x.data["size"], x.card["size.disk"]["disk_gb"]
    pred_p, pred_r = s.get("predicted_data_bytes_params_shape"), s.get("predicted_data_bytes_real_sizes")
    if x.real:
        gb = s["file_bytes"] / 1e9
        return Row({"disk_gb": round(gb, 2), "disk_gib": round(s["file_bytes"] / 2**30, 2)},
                   Verdict.REPRODUCED if round(gb) == card_gb or round(s["file_bytes"] / 2**30) == card_gb
                   else Verdict.CONTRADICTED, [x.ev],
                   "sum of shard file sizes (GB = 1e9 bytes; GiB = 2^30 bytes)", x.checked)
    ok = pred_p == s["data_bytes"]
    gb_r, gib_r = pred_r / 1e9, pred_r / 2**30
    fits = [u for u, v in (("GB", gb_r), ("GiB", gib_r)) if round(v) == card_gb]
    return Row({"scaled_checkpoint_mb": round(s["file_bytes"] / 1e6, 2), "scaled_tensor_bytes": s["data_bytes"],
                "predicted_scaled_tensor_bytes": pred_p, "prediction_matches_scaled_tensor_bytes": ok},
               Verdict.PARTLY if ok and fits else Verdict.CONTRADICTED, [x.ev],
               (f"Not measured on the real files. The NVFP4+serving layout's tensor bytes (experts U8 [o,i/2] + "
                f"F8_E4M3 [o,i/16] + 2 F32 scales, rest BF16/F32) predict {gb_r:.1f} GB = {gib_r:.1f} GiB at "
                f"the real sizes (arithmetic on LingShape defaults; headers add a few MB), which "
                + (f"rounds to the card's {card_gb} when read as {' or '.join(fits)}. " if fits else
                   f"rounds to the card's {card_gb} neither in GB nor in GiB. ")
                + f"The same prediction for this run's shape {'equals' if ok else 'does NOT equal'} the "
                f"audited checkpoint's tensor bytes ({pred_p:,} vs {s['data_bytes']:,})."), x.checked)


@claim_rule("layout.routed-experts", InspectMeasurements)
def layout_routed_experts(x: InspectMeasurements) -> Row:
    """NVFP4 storage and the config's tensor_group / 16; partly at best, since the card's layer
    range 0-41 includes the dense layers, which have no routed experts."""
    rexp = [r for r in x.rep.precision_table if r["component"] == ca.CARD_ROWS["routed_expert"]]
    exp_fmt = {r["precision"]: r["layers"] for r in rexp}
    w = (x.groups[0]["weights"] or {}) if x.groups else {}
    ok_fmt = set(exp_fmt) == {"NVFP4"} and w.get("strategy") == "tensor_group" and w.get("group_size") == 16
    return Row({"formats_by_layers": exp_fmt, "block_scale": "F8_E4M3",
                "group_size_from_scale_columns": 16 if ok_fmt else None,
                "config_strategy": w.get("strategy"), "config_group_size": w.get("group_size")},
               Verdict.PARTLY if ok_fmt else Verdict.CONTRADICTED, [x.ev, x.ev_t],
               (f"Routed experts are NVFP4 (U8 packed e2m1 [out,in/2], F8_E4M3 block scales [out,in/16], F32 global "
                f"scale; config tensor_group / 16) on layers {exp_fmt.get('NVFP4')}; {x.scope}. The card's row says "
                "layers 0-41, but the dense layers (< first_k_dense_replace) have no routed experts: the range is "
                "2-41 on the real model." if ok_fmt else f"routed experts stored as {exp_fmt}, config {w}"),
               x.checked)


@claim_rule("layout.bf16-components", InspectMeasurements)
def layout_bf16_components(x: InspectMeasurements) -> Row:
    """None packed: reproduced when all are BF16, partly when some are F32 (A_log, dt_bias, the
    router's expert_bias in the generated layout); any packed component contradicts."""
    prec = _rows_by_prec(x.rep)
    bf_rows = [ca.CARD_ROWS[k] for k in ("attention_proj", "kda_misc", "mla_proj", "shared_expert", "lm_head")]
    got = {r: sorted(prec.get(r, set())) for r in bf_rows}
    packed_any = any(v in ("NVFP4", "MXFP4", "INVALID-PACKED") for vs in got.values() for v in vs)
    only_bf16 = all(set(v) <= {"BF16"} for v in got.values())
    return Row(got, Verdict.CONTRADICTED if packed_any else (Verdict.REPRODUCED if only_bf16 else Verdict.PARTLY),
               [x.ev, x.ev_t],
               ("None of these components is quantized" + ("" if only_bf16 else
                "; A_log, dt_bias and the router's expert_bias are F32 in the generated Ling layout "
                "(ling_layout's reconstruction), not BF16 as the card's table says") + f"; {x.scope}."
                if not packed_any else "some of these components are packed (see measured)"), x.checked)


@claim_rule("layout.kda-gates-bf16", InspectMeasurements)
def layout_kda_gates_bf16(x: InspectMeasurements) -> Row:
    """f_proj / g_proj of the KDA layers (those without an MLA kv_a_proj_with_mqa), as stored."""
    fg = sorted({(mo.proj, mo.fmt) for mo in x.rep.modules.values()
                 if mo.component == "attention_proj" and mo.proj in ("f_proj", "g_proj") and mo.layer < x.nl
                 and f"model.layers.{mo.layer}.attention.kv_a_proj_with_mqa" not in x.rep.modules})
    return Row(dict(fg), Verdict.REPRODUCED if fg and all(f_ == "BF16" for _, f_ in fg) else Verdict.CONTRADICTED,
               [x.ev_t], f"f_proj and g_proj of the KDA layers, as stored; {x.scope}.", x.checked)


_NO_MTP = "config declares no MTP layer"


@claim_rule("mtp.layer42-bf16", InspectMeasurements)
def mtp_layer42_bf16(x: InspectMeasurements) -> Row:
    """No packed tensor and state bf16-ignored; the card's 1,552 plain tensors are compared only
    at the real sizes (the note derives the count: 3 x num_experts + the other tensors)."""
    if not x.rep.mtp:
        return Row.not_run(_NO_MTP)
    mt, (m, f, fr) = x.rep.mtp[0], x.counts
    fm, frm = f.get("mtp_layer_tensors", {}), fr.get("mtp_layer_tensors", {})
    c42 = x.card["mtp.layer42-bf16"]
    state_ok = mt["packed_tensors"] == 0 and mt["state"] == "bf16-ignored"
    bf16_other = m["mtp_other_tensors"] - mt["dtypes"].get("F32", 0)
    if x.real:
        v = Verdict.REPRODUCED if state_ok and mt["tensors"] == c42["plain"] else \
            Verdict.PARTLY if state_ok else Verdict.CONTRADICTED
    else:
        v = Verdict.PARTLY if state_ok else Verdict.CONTRADICTED
    return Row({"layer": mt["layer"], "packed": mt["packed_tensors"], "plain": mt["plain_tensors"],
                "dtypes": mt["dtypes"], "state": mt["state"], "formula": fm.get("formula")},
               v, [x.ev, x.data["files"]["heatmap"]],
               (f"MTP layer {mt['layer']}: {mt['packed_tensors']} packed, {mt['plain_tensors']} plain, state "
                f"'{mt['state']}'; {x.scope}. Count = 3 x num_experts + {m['mtp_other_tensors']} other tensors of the "
                f"generated layout = {frm.get('value')} at the real sizes vs the card's {c42['plain']:,} "
                f"(the reconstructed name list has one non-expert tensor more; its plain tensors here are "
                f"{mt['dtypes']}: the router's expert_bias is F32, so the BF16 tensors alone number "
                f"3 x num_experts + {bf16_other} = {3 * cmp.real_config()['num_experts'] + bf16_other:,} at the real "
                "sizes, the card's number if it counted BF16 tensors only)."), x.checked)


@claim_rule("mtp.ignore-first", InspectMeasurements)
def mtp_ignore_first(x: InspectMeasurements) -> Row:
    """ignore[0] is the regex of the MTP layer (layer num_hidden_layers: 42 at the real sizes)."""
    if not x.rep.mtp:
        return Row.not_run(_NO_MTP)
    mt = x.rep.mtp[0]
    first = x.rep.config_summary["ignore"][0] if x.rep.config_summary["ignore"] else None
    want = rf"re:.*layers\.{x.nl}\..*"
    return Row({"ignore_first": first, "matches_mtp_layer": mt["ignore_first_matches"]},
               Verdict.REPRODUCED if first == want and mt["ignore_first_matches"] else Verdict.CONTRADICTED,
               [x.ev], f"ignore[0] of config.json; the MTP layer here is {x.nl} (the card's 42 at real sizes); "
               f"{x.scope}.", x.checked)


def _count_row(x: InspectMeasurements, cid: str, key: str, ckey: str, extra: str = "") -> Row:
    """A count claim (:func:`nvfp4study.checkpoint.compare.count_verdict`); the formula's value at
    the real sizes is arithmetic, not a measurement: it is in the note, not in ``measured``."""
    m, f, fr = x.counts
    v, why = cmp.count_verdict(m[key], f[key]["value"], fr[key]["value"], x.card[cid][ckey], x.real)
    return Row({"count": m[key], "formula": f[key]["formula"]}, v, [x.ev, x.ev_t], why + "." + extra, x.checked)


@claim_rule("counts.quantized-experts", InspectMeasurements)
def counts_quantized_experts(x: InspectMeasurements) -> Row:
    return _count_row(x, "counts.quantized-experts", "quantized_expert_modules", "quantized_expert_tensors")


@claim_rule("counts.mla-unpacked", InspectMeasurements)
def counts_mla_unpacked(x: InspectMeasurements) -> Row:
    """The card does not say which 16; the note names the reading that gives 16."""
    m = x.counts[0]
    return _count_row(x, "counts.mla-unpacked", "mla_kv_unpacked", "mla_unpacked",
                      " The card does not say which 16 tensors: kv_a_proj_with_mqa + kv_b_proj of the 8 MLA layers "
                      f"(7 trunk + MTP) is the reading of this layout that gives 16; unpacked MLA-only modules here: "
                      f"{m['mla_unpacked_by_module']}.")


@claim_rule("scales.input-global-scale", InspectMeasurements)
def scales_input_global_scale(x: InspectMeasurements) -> Row:
    """The count rule, then contradicted unless all are 1.0, one per expert weight_global_scale,
    and of the card's dtype (float32 = safetensors F32) in the headers."""
    m, f, fr = x.counts
    ins, c_in = x.rep.input_scales, x.card["scales.input-global-scale"]
    v, why = cmp.count_verdict(m["input_global_scales"], f["input_global_scales"]["value"],
                               fr["input_global_scales"]["value"], c_in["count"], x.real)
    in_dtypes = dict(Counter(mo.params["input_global_scale"].dtype for mo in x.rep.modules.values()
                             if "input_global_scale" in mo.params))
    want_dt = SAFETENSORS_DTYPE.get(c_in["dtype"], c_in["dtype"])
    if not (ins.get("input_all_one") and m["input_global_scales"] == m["quantized_expert_modules"]
            and set(in_dtypes) == {want_dt}):
        v = Verdict.CONTRADICTED
    why += (f". Header dtypes of the input_global_scale tensors: {in_dtypes or 'none'} (card {c_in['dtype']} = "
            f"safetensors {want_dt})")
    return Row({"count": m["input_global_scales"], "dtypes": in_dtypes, "values": ins.get("input_values"),
                "one_per_expert_weight_global_scale": m["input_global_scales"] == m["quantized_expert_modules"],
                "missing": ins.get("missing"), "nonfinite": ins.get("input_nonfinite_or_nonpositive")},
               v, [x.ev], why + ". Values read with safetensors.safe_open.", x.checked)


@claim_rule("config.w4a4", InspectMeasurements)
def config_w4a4(x: InspectMeasurements) -> Row:
    """Scheme W4A4 with dynamic 'local' input activations: what SGLang's _is_fp4a4_nvfp4 predicate
    (compressed_tensors.py 589-616) accepts."""
    acts = [g["input_activations"] for g in x.groups]
    a = acts[0] if acts and acts[0] else None
    scheme = x.rep.config_summary["scheme"]
    w4a4 = scheme == "W4A4" and a and a.get("dynamic") == "local"
    return Row({"scheme": scheme, "input_activations":
                {k: a.get(k) for k in ("num_bits", "type", "dynamic", "strategy", "group_size")} if a else None},
               Verdict.REPRODUCED if w4a4 else Verdict.CONTRADICTED, [x.ev],
               ("The config's group is 4-bit float tensor_group/16 for weights and activations with dynamic 'local', "
                "which SGLang's _is_fp4a4_nvfp4 predicate (compressed_tensors.py 589-616) accepts -> "
                f"CompressedTensorsW4A4Nvfp4MoE on Blackwell; {x.scope}." if w4a4 else "not the card's W4A4 block"),
               x.checked)


#: why a config claim is not run: the values come from the generator (circular), or the sizes differ
_GENERATED = "not run (generated checkpoint: values come from the generator, circular)"
_SCALED = "not run: the audited config does not have the real model's sizes"


@claim_rule("config.clamp-lists", InspectMeasurements)
def config_clamp_lists(x: InspectMeasurements) -> Row:
    """Nonzero entries by layer, only on a real config with real weights (the card's layer numbers)."""
    cl = x.rep.config_summary["clamp_lists"]
    if x.real and not x.rnd:
        want_e = {str(i): 4 for i in range(35, 42)}
        want_s = {**{str(i): 5 for i in range(34, 40)}, "40": 7, "41": 7}
        got_e = (cl.get("expert_swiglu_limit_list") or {}).get("nonzero")
        got_s = (cl.get("share_expert_swiglu_limit_list") or {}).get("nonzero")
        return Row({"expert": got_e, "shared": got_s},
                   Verdict.REPRODUCED if got_e == want_e and got_s == want_s else Verdict.CONTRADICTED,
                   [x.ev], "nonzero entries by layer, from config.json", x.checked)
    lists = f"expert {cl.get('expert_swiglu_limit_list')}, shared {cl.get('share_expert_swiglu_limit_list')}"
    if x.rnd:
        return Row(None, Verdict.NOT_RUN, [x.ev],
                   f"{_GENERATED}: ling_layout wrote the lists ({lists}) from params / the card's statement. Audit the "
                   "card's checkpoint (checkpoint.quantized_path) to test it.")
    return Row(None, Verdict.NOT_RUN, [x.ev],
               f"{_SCALED} (its lists: {lists}), so the card's layer numbers do not apply. Audit "
               "the card's checkpoint (checkpoint.quantized_path) to test it.")


@claim_rule("config.context", InspectMeasurements)
def config_context(x: InspectMeasurements) -> Row:
    """max_position_embeddings and rope_scaling, only on a real config with real weights."""
    ctx = x.rep.config_summary["context"]
    if x.real and not x.rnd:
        cc = x.card["config.context"]
        return Row(ctx, Verdict.REPRODUCED if ctx == {"max_position_embeddings": cc["max_position_embeddings"],
                                                      "rope_scaling": None} else Verdict.CONTRADICTED,
                   [x.ev], "from config.json", x.checked)
    if x.rnd:
        return Row(None, Verdict.NOT_RUN, [x.ev],
                   f"{_GENERATED}: the config carries {ctx}, written by ling_layout from the card's own statement; "
                   "the loaders disagree on the real value (131072 + YaRN to 262144 in the vendor's "
                   "serving recipes, 262144 elsewhere).")
    return Row(None, Verdict.NOT_RUN, [x.ev], f"{_SCALED} (it carries {ctx}); the claim is about the card's config.json.")


@claim_rule("clamp.trtllm-routing", InspectMeasurements)
def clamp_trtllm_routing(x: InspectMeasurements) -> Row:
    """The card's files are measured; ours is arithmetic at the reference sizes (at best partly).
    The limit is FlashInfer routingDeepSeek's mNumExperts / mNumExpertGroups <= WarpSize."""
    keys = ("num_experts", "n_group", "experts_per_group", "status")
    if x.ck.get("card"):
        r = x.rep.routing
        return Row({k: r.get(k) for k in keys},
                   Verdict.REPRODUCED if r.get("status") == "over" and (r.get("experts_per_group") or 0) > qr.WARP_SIZE
                   else Verdict.CONTRADICTED, [x.ev],
                   (f"{r.get('num_experts')} / {r.get('n_group')} = {r.get('experts_per_group')} experts per group in "
                    f"{x.scope} vs the kernel's {qr.WARP_SIZE} (FlashInfer routingDeepSeek); rule status "
                    f"'{r.get('status')}'. The kernel's check only; the backend was not run (no GPU)."), x.checked)
    rr = x.data["routing_real_sizes"]
    return Row({"audited": {k: x.rep.routing.get(k) for k in keys}},
               Verdict.PARTLY if rr["status"] == "over" and rr["experts_per_group"] > qr.WARP_SIZE
               else Verdict.CONTRADICTED, [x.ev],
               (f"Arithmetic on the reference sizes (LingShape defaults, not measured): {rr['num_experts']} / "
                f"{rr['n_group']} = {rr['experts_per_group']:g} experts per group "
                f"{'>' if rr['experts_per_group'] > qr.WARP_SIZE else '<='} {qr.WARP_SIZE} (FlashInfer routingDeepSeek: "
                f"mNumExperts / mNumExpertGroups <= WarpSize), rule status '{rr['status']}'; the audited config "
                f"(measured) gives '{x.rep.routing.get('status')}'. The kernel's check only; the backend was not run "
                "(no GPU)."), "FlashInfer TRT-LLM routing kernel checks (fault F-05: routing shapes)")


# --- the study's findings on OUR checkpoint -------------------------------------------------------
@dataclass(frozen=True)
class InspectFindings:
    """The audit of the checkpoint this run serves (ours, even when the card's was read for the
    claims) and 01's card-style pipeline without the gate/up rule (``unshared``), as the stage-02
    finding rules read them."""

    STAGE: ClassVar[str] = "02_inspect_checkpoint"
    rep: ca.AuditReport
    real: bool  # real sizes
    scope: str  # what was audited, in words
    checked: str  # checked_on
    unshared: dict[str, Any]  # s02's unshared-scale measurement ("run": False when absent)


@finding_rule("audit.fault-verdicts", InspectFindings,
              claim="The checkpoint this run serves carries none of the faults F-01..F-04 (activation scales, MTP "
                    "state, draft format, weight-only config); F-05 depends only on the routing shape.")
def fault_verdicts(x: InspectFindings) -> Row:
    rep = x.rep
    faults = sorted(f_.code.value for f_ in rep.fault_findings())
    over = rep.extra["routing_real_sizes"]["status"] == "over"
    expected = {"F05-routing-over-limit"} if over and x.real else set()
    return Row({"fault_codes": faults, "errors": [f_.code.value for f_ in rep.errors],
                "warnings": sorted({f_.code.value for f_ in rep.findings if f_.severity.value == "warning"})},
               Verdict.REPRODUCED if set(faults) <= expected and not rep.errors else Verdict.CONTRADICTED,
               [rep.extra["files"]["audit"]], f"Header audit of {x.scope}.", x.checked)


@finding_rule("audit.gate-up-shared", InspectFindings,
              claim="Every routed expert of the audited checkpoint has equal gate and up weight_global_scale, so "
                    "SGLang's W4A4 scheme (which uses the gate's for both) dequantizes up_proj exactly.")
def gate_up_shared(x: InspectFindings) -> Row:
    gs = x.rep.gate_up_summary
    files = x.rep.extra["files"]
    return Row(gs, Verdict.REPRODUCED if gs.get("pairs") and gs.get("mismatched") == 0 else Verdict.CONTRADICTED,
               [files["audit"], files["up_error"]], f"{x.scope}.", x.checked)


@finding_rule("audit.up-scale-error-card-pipeline", InspectFindings,
              claim="On the card-style pipeline (fused maps emptied, no gate/up rule) gate and up global scales "
                    "differ per expert, and SGLang's W4A4 scheme serves up_proj scaled by up/gate (error up/gate - 1).")
def up_scale_error_card_pipeline(x: InspectFindings) -> Row | None:
    u = x.unshared
    if not u.get("run"):
        return None
    return Row({k: u[k] for k in ("experts", "differ", "median_abs_up_scale_error", "p95_abs_up_scale_error",
                                  "max_abs_up_scale_error")},
               Verdict.REPRODUCED if u["differ"] > 0 else Verdict.CONTRADICTED, [u["data"], u["figure"]],
               "Scales from 01's quantization without the pairing rule, random weights; the card's own "
               "checkpoint was not available to measure.", "SGLang 0.5.23 w4a4_nvfp4_moe.py 187-198")


# --- the card's own files (the card-artifact findings) -------------------------------------------
@dataclass(frozen=True)
class CardFindings:
    """The audit of the card's published checkpoint (``s02_inspect.card_audit``: ``run``, and
    ``report``, ``ck``, ``traffic`` when it ran, else ``reason``), as the card-artifact findings
    (:data:`~nvfp4study.checkpoint.compare.CARD_FINDINGS`) read it."""

    STAGE: ClassVar[str] = "02_inspect_checkpoint"
    card: dict[str, Any]


@finding_rule("audit.card-checkpoint", CardFindings, claim=cmp.CARD_FINDINGS["audit.card-checkpoint"])
def card_checkpoint(x: CardFindings) -> Row:
    """Reproduced when the card's header audit finds none of F-01..F-04 and no error."""
    card = x.card
    if not card["run"]:
        return Row(None, Verdict.NOT_RUN, [], f"not run: {card['reason']}")
    rep = card["report"]
    faults = sorted(f.code.value for f in rep.fault_findings() if f.code.value != "F05-routing-over-limit")
    return Row({"fault_codes": faults, "errors": sorted({f.code.value for f in rep.errors}),
                "traffic": rep.extra.get("traffic")},
               Verdict.REPRODUCED if not faults and not rep.errors else Verdict.CONTRADICTED,
               [rep.extra["files"]["audit"]], f"Header audit by range requests; {card['traffic']}.",
               card["ck"]["checked_on"])


@finding_rule("audit.card-gate-up-scales", CardFindings, claim=cmp.CARD_FINDINGS["audit.card-gate-up-scales"])
def card_gate_up_scales(x: CardFindings) -> Row:
    """Reproduced when the card's gate and up global scales differ (:func:`~nvfp4study.checkpoint.compare.gate_up_test`)."""
    card = x.card
    if not card["run"]:
        return Row(None, Verdict.NOT_RUN, [], f"not run: {card['reason']}")
    rep = card["report"]
    gs = cmp.gate_up_test(rep)
    v = Verdict.NOT_RUN if not gs.get("pairs") else Verdict.REPRODUCED if gs.get("mismatched") else Verdict.CONTRADICTED
    note = (f"{gs.get('mismatched')} of {gs.get('pairs')} gate/up pairs differ on the card's files; "
            f"median |up/gate - 1| {gs.get('median_abs_up_scale_error')}, max "
            f"{gs.get('max_abs_up_scale_error')}." if gs.get("pairs") else
            "not run: the audit read no gate/up scale pairs (values not read)")
    return Row(gs, v, [rep.extra["files"]["audit"], rep.extra["files"]["up_error"]], note, card["ck"]["checked_on"])
