"""Stage 01's claim rules: the two ``01_quantize`` claims of ``core/claims.yaml`` and the study's
three quantization findings, one function per ledger row.

Every rule reads :class:`QuantizeMeasurements`: the quantization report (``data/quantize.json``),
the probes of model_free_ptq on the Ling layout (``data/quantize-probes.json``) and the round
trip. A quantization that did not run (skipped, or the checkpoint given as is) leaves both claims
"not run" with its reason and records no finding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ...core.claim_rules import Row, claim_rule, finding_rule
from ...core.ledger import Verdict, card_claims
from ...core.paths import RunPaths


@dataclass(frozen=True)
class QuantizeMeasurements:
    """What stage 01 measured, as its rules read it (built once by :meth:`gather`)."""

    STAGE: ClassVar[str] = "01_quantize"
    rep: dict[str, Any]  # data/quantize.json (run_quantize's report)
    probe: dict[str, Any]  # data/quantize-probes.json (probes' result)
    rt: dict[str, Any]  # the round trip: {"run", "summary", "data", "figure"} or {"run": False, ...}
    ev_q: str  # data/quantize.json
    ev_p: str  # data/quantize-probes.json
    ev_share: tuple[str, str]  # data/gate-up-scales-share=on / =off .parquet
    card: dict[str, Any]  # provenance.model-free-ptq's card value (claims.yaml)

    @classmethod
    def gather(cls, paths: RunPaths, rep: dict[str, Any], probe: dict[str, Any],
               rt: dict[str, Any]) -> QuantizeMeasurements:
        """The stage's three results and the evidence paths of its run folder."""
        card = next(c["card"] for c in card_claims() if c["id"] == "provenance.model-free-ptq")
        return cls(rep, probe, rt, str(paths.data("quantize", "json")), str(paths.data("quantize-probes", "json")),
                   (str(paths.data("gate-up-scales", "parquet", share="on")),
                    str(paths.data("gate-up-scales", "parquet", share="off"))), card)

    @property
    def quantized(self) -> bool:
        """True when this run quantized (or reused an identical quantization of) the checkpoint."""
        return self.rep.get("action") == "quantize"

    @property
    def skipped(self) -> str:
        """Why the quantization did not run (the claims' "not run" reason)."""
        return self.rep.get("reason", "quantization skipped")

    @property
    def versions(self) -> str:
        """``llmcompressor X / compressed-tensors Y`` of this run (every row's ``checked_on``)."""
        return f"llmcompressor {self.rep['llmcompressor']} / compressed-tensors {self.rep['compressed_tensors']}"


def _verdict_word(probe: dict[str, Any]) -> str:
    return "accepted" if probe["ok"] else f"fails ({probe['error_type']})"


@claim_rule("provenance.model-free-ptq", QuantizeMeasurements)
def provenance_model_free_ptq(x: QuantizeMeasurements) -> Row:
    """Partly at best: model_free_ptq with the card's scheme reproduces the card's tensor layout,
    and scheme NVFP4 (W4A4) is refused, but which tool made the card's files cannot be read from
    them; the note says whether this run's llmcompressor / compressed-tensors are the card's."""
    if not x.quantized:
        return Row.not_run(x.skipped)
    rep, card = x.rep, x.card
    card_versions = f"llmcompressor {card['llmcompressor']} / compressed-tensors {card['compressed_tensors']}"
    same_versions = (str(rep["llmcompressor"]), str(rep["compressed_tensors"])) == (str(card["llmcompressor"]),
                                                                                   str(card["compressed_tensors"]))
    w4a4 = x.probe["probes"]["w4a4_scheme_NVFP4"]
    return Row(
        {"tool": "model_free_ptq", "scheme": rep["scheme"], "llmcompressor": rep["llmcompressor"],
         "compressed_tensors": rep["compressed_tensors"], "ran": True,
         "routed_expert_tensors_packed": rep["counts"]["expert_weight_packed"],
         "w4a4_scheme_refused": (f"{w4a4['error_type']}: {w4a4['error']}" if not w4a4["ok"] else False)},
        Verdict.PARTLY, [x.ev_q, x.ev_p],
        (f"model_free_ptq with scheme {rep['scheme']} quantized a Ling-layout checkpoint ("
         + ("random weights, params' shape" if rep.get("random_weights") else "the given BF16 source")
         + ") into the card's tensor layout"
         + ("" if rep["scheme"] == card["scheme"] else f" (the card's scheme is {card['scheme']})")
         + "; scheme NVFP4 (W4A4) "
         + ("is refused by model_free_ptq, consistent with the card quantizing A16 and editing the "
            "config afterwards. " if not w4a4["ok"] else "was accepted here. ")
         + f"Measured with {x.versions}, "
         + ("the card's versions" if same_versions else f"NOT the card's {card_versions}")
         + "; which tool produced the card's files cannot be checked from the files."),
        x.versions)


@claim_rule("provenance.fused-maps", QuantizeMeasurements)
def provenance_fused_maps(x: QuantizeMeasurements) -> Row:
    """Partly when the stock fused tables fail and emptying both makes model_free_ptq run
    (sequential oneshot was not tested); contradicted otherwise."""
    if not x.quantized:
        return Row.not_run(x.skipped)
    pr = x.probe["probes"]
    stock, both = pr["stock_tables"], pr["both_emptied"]
    ok = (not stock["ok"]) and both["ok"]
    return Row(
        {k: ("accepted" if v["ok"] else f"fails: {v['error_type']}: {v['error']}")
         for k, v in pr.items() if k != "w4a4_scheme_NVFP4"} | {"oneshot": "not tested"},
        Verdict.PARTLY if ok else Verdict.CONTRADICTED, [x.ev_p],
        (("On this run's Ling layout the stock fused tables fail before anything is quantized and emptying "
          "both tables makes model_free_ptq run, with MLA kept out by the ignore list. Emptying only the "
          f"dict: {_verdict_word(pr['dict_only_emptied'])}; only the list: {_verdict_word(pr['list_only_emptied'])} "
          "(whether the list trips depends on which tensors share a shard). Sequential oneshot was not "
          "tested (needs the model class and the card's hardware), hence partly.") if ok else
         "The stock fused tables did not fail, or emptying them did not make model_free_ptq run (see measured)."),
        x.versions)


@finding_rule("quantize.gate-up-global-scale", QuantizeMeasurements,
              claim=("With both fused tables emptied, model_free_ptq gives each routed expert separate gate and up "
                     "global scales; one gate/up pairing rule in both tables makes them share one (the smaller)."))
def quantize_gate_up_global_scale(x: QuantizeMeasurements) -> Row | None:
    """Reproduced when every expert shares one scale with the rule, not all do without it, and the
    shared one is the smaller of the two; recorded only when the unshared quantization ran
    (``quantize.compare_unshared``)."""
    if not x.quantized or "unshared" not in x.probe:
        return None
    p = x.probe
    sh, un = p["shared"], p["unshared"]
    good = sh["share_fraction"] == 1.0 and un["share_fraction"] < 1.0 and p["shared_is_min_of_unshared"]
    return Row({"with_rule": sh, "without_rule": un, "shared_is_min_of_unshared": p["shared_is_min_of_unshared"]},
               Verdict.REPRODUCED if good else Verdict.CONTRADICTED, [x.ev_p, *x.ev_share],
               "Random weights; the card's own checkpoint is measured by 02_inspect_checkpoint.", x.versions)


@finding_rule("quantize.global-scale-bf16-values", QuantizeMeasurements,
              claim="weight_global_scale tensors are float32 but hold bfloat16-rounded values (2688/amax computed "
                    "in the weights' dtype).")
def quantize_global_scale_bf16_values(x: QuantizeMeasurements) -> Row | None:
    """Reproduced when every global scale (gate and up) is exactly representable in bfloat16."""
    if not x.quantized:
        return None
    bf = x.probe["global_scales_bf16_exact"]
    return Row(bf, Verdict.REPRODUCED if bf["bf16_exact"] == bf["values"] else Verdict.CONTRADICTED, [x.ev_p],
               "compressed_tensors/quantization/utils/helpers.py generate_gparam computes 448 x 6 / absmax with a "
               "bfloat16 absmax; PyTorch evaluates float / bf16 tensor as 2688 x reciprocal in bf16 "
               "(torch/_tensor.py:1111-1114, two roundings), so a scale can sit one bf16 step off the exactly "
               "rounded 2688 / absmax, and distinct experts can share a global scale by coincidence (a false "
               "'copied scale' smell).", x.versions)


@finding_rule("quantize.roundtrip-within-bound", QuantizeMeasurements,
              claim="compressed-tensors' NVFP4 codec dequantizes the quantized experts back to the BF16 source "
                    "within NVFP4's per-element bound.")
def quantize_roundtrip_within_bound(x: QuantizeMeasurements) -> Row | None:
    """Reproduced when every round-tripped tensor is within the bound; recorded only when the
    round trip ran on at least one tensor."""
    if not x.quantized or not (x.rt.get("run") and x.rt["summary"].get("tensors")):
        return None
    s = x.rt["summary"]
    return Row(s, Verdict.REPRODUCED if s["all_within_bound"] else Verdict.CONTRADICTED,
               [x.rt["data"], x.rt["figure"]],
               f"{s['tensors']} tensors; relative Frobenius error median {s['rel_error_median']:.4f} on random "
               "normal weights.", x.versions)
