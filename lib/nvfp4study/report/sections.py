"""What the report page is made of: its sections (in the card's order), which ledger rows and
figures go where, each figure's caption and alt text, and the page's screen and print styles.

Data only; :mod:`nvfp4study.stages.s99_report` assembles the page from it and the run's files.
"""

from __future__ import annotations

from typing import Any

# (key, heading, one-line intro), in the order of the card
SECTIONS: list[tuple[str, str, str]] = [
    ("clamp", "SwiGLU clamp", "What SGLang does with Ling's routed-expert clamp limit, per release "
     "and MoE path, the card's fix and ours, and how large the approximate form's error is."),
    ("layout", "Checkpoint layout, counts and scales", "What the quantized checkpoint holds, from its "
     "safetensors headers and config.json, and the gate/up global scales the quantizer writes."),
    ("mtp", "MTP (NEXTN) speculative decoding", "The MTP draft layer in the checkpoint, and tok/s "
     "and acceptance per draft depth on the served model."),
    ("corruption", "Code corruption and its detection", "Clean completions before and after the "
     "clamp fix on the served model, and how well each method detects the junk tokens."),
    ("determinism", "Determinism", "Greedy outputs with and without speculation and deterministic "
     "inference, and the MIN_DEEPGEMM_DIM guard that mode needs."),
    ("serving", "Serving: fit, memory, load time, flags", "What one GPU holds, how long loading "
     "takes, and which SGLang flags and schemes the card's serving depends on."),
    ("provenance", "Provenance: how the checkpoint was made", "The quantizer, its scheme and "
     "versions, the fused-map workaround, and the NVFP4 round trip of the weights."),
]
OTHER = ("other", "Other rows", "Rows no section above claims (a new stage's rows land here).")

# ledger id -> section, first match wins (exact id, else prefix ending in ".")
ROW_RULES: list[tuple[str, str]] = [
    ("quantize.gate-up-global-scale", "layout"), ("clamp.trtllm-routing", "serving"),
    ("config.clamp-lists", "clamp"), ("clamp.", "clamp"), ("finding.", "clamp"),
    ("layout.", "layout"), ("counts.", "layout"), ("scales.", "layout"), ("config.", "layout"),
    ("size.disk", "layout"), ("audit.", "layout"),
    ("mtp.", "mtp"),
    ("corruption.", "corruption"), ("detect.", "corruption"), ("serve.reasoning-parser", "corruption"),
    ("det.", "determinism"),
    ("fit.", "serving"), ("size.", "serving"), ("load.", "serving"), ("sglang.", "serving"),
    ("serve.", "serving"),
    ("provenance.", "provenance"), ("quantize.", "provenance"),
]


def section_of(row_id: str) -> str:
    """The section key of a ledger row id (``"other"`` when no rule matches)."""
    for rule, section in ROW_RULES:
        if row_id == rule or (rule.endswith(".") and row_id.startswith(rule)):
            return section
    return OTHER[0]


# figure stem -> section, caption (what it shows), how to read it, alt text
FIGURES: dict[str, dict[str, Any]] = {
    "sglang_clamp_matrix": dict(
        section="clamp",
        caption="What each hand-read SGLang MoE path (rows) does with Ling's routed-expert clamp in "
                "each audited release (columns), read from the released source; the paths are found by "
                "following SGLang's dispatch; the other paths it reaches are counted in 03, where "
                "their verdicts' measured agreement with a blind hand reading is shown "
                "(ledger finding.audit-agreement).",
        read="Each cell is the audit's verdict for a limit set with no alpha: EXACT is Ling's "
             "post-SiLU clamp, APPROX the pre-SiLU (GPT-OSS) form, DROPPED means the limit never "
             "reaches the kernel, REFUSED that the path raises because the limit is set, UNUSABLE that "
             "it raises for Ling whatever the limit, ABSENT that it does not exist then.",
        alt="Heatmap of clamp verdicts, MoE paths by SGLang release, coloured EXACT green, APPROX "
            "orange, DROPPED red."),
    "clamp_forms": dict(
        section="clamp",
        caption="Ling's clamp min(silu(g), L) against the pre-SiLU form silu(min(g, L)) that "
                "APPROX paths compute.",
        read="Left: the gate factor over the gate pre-activation g at L = 4, both forms. Middle: "
             "|post - pre| of the expert output over g and the up value u. Right: the relative "
             "gate gap per limit. The forms agree up to g = L and differ by at most L - silu(L) above.",
        alt="Three panels: gate factor curves of both clamp forms, a heatmap of their output gap, "
            "and the relative gap per clamp limit."),
    "checkpoint-layer-heatmap": dict(
        section="layout",
        caption="Tensors per layer of the audited checkpoint: packed FP4 weights, their scales, "
                "and plain (unquantized) tensors.",
        read="Columns are layers (* marks the MTP layer), colour is the tensor count on a log "
             "scale, blank is none. Dense layers and the MTP layer should have no packed tensors.",
        alt="Heatmap of packed, scale and plain tensor counts for each layer."),
    "checkpoint-up-scale-error": dict(
        section="layout",
        caption="Gate/up global scales in the audited checkpoint: the error SGLang makes when it "
                "dequantizes up_proj with the gate's scale.",
        read="Histogram over experts of up_global_scale / gate_global_scale - 1; one bar at 0 "
             "means gate and up share one scale (the study's pairing rule).",
        alt="Histogram of the up_proj scale error over experts."),
    "up-scale-error-unshared": dict(
        section="layout",
        caption="The same scale error for a quantization with the card's recipe (no gate/up "
                "pairing), random weights.",
        read="Histogram over experts of up_global_scale / gate_global_scale - 1; the spread is "
             "the relative error of up_proj in SGLang's W4A4 NVFP4 scheme.",
        alt="Histogram of the up_proj scale error without the gate/up pairing rule."),
    "gate-up-global-scale": dict(
        section="layout",
        caption="How far each expert's gate and up weight global scales lie apart, with and "
                "without the pairing rule (stage 01, random weights).",
        read="Histogram of |gate - up| / max(gate, up) in percent; the legend counts the experts "
             "whose two scales are equal.",
        alt="Two overlaid histograms of the gate/up global-scale difference, with and without the rule."),
    "roundtrip": dict(
        section="provenance",
        caption="NVFP4 round trip of expert weights (compressed-tensors codec) against the BF16 "
                "source, random weights.",
        read="Left: relative Frobenius error per projection. Right: the largest elementwise "
             "error over the NVFP4 bound; at or below 1 every element is within the bound.",
        alt="Two bar panels: relative round-trip error and error over bound per projection."),
    "detector-validation": dict(
        section="corruption",
        caption="Recall of each junk-detection method per junk kind, on canonical solutions "
                "with the card's kinds of junk injected.",
        read="Bars are the fraction of junk variants flagged, with 95 % Wilson intervals; "
             "higher is better. The legend gives each method's false positives on clean programs.",
        alt="Grouped bar chart of recall per junk kind for each detection method."),
    "mtp-sweep": dict(
        section="mtp",
        caption="tok/s, accept length and accept rate per NEXTN draft depth on the served model.",
        read="Depth 0 is speculation off; points are medians with the range over requests; the "
             "card's values are separate marks labelled card.",
        alt="Line charts of throughput and acceptance against NEXTN depth."),
    "corruption-clean": dict(
        section="corruption",
        caption="Clean completions per sampling setting and clamp mode, measured on the served model.",
        read="Bars are the fraction of clean completions with 95 % Wilson intervals; compare the "
             "modes within one sampling setting.",
        alt="Grouped bar chart of clean-completion fractions per sampling setting and clamp mode."),
}


def figure_info(stem: str, sections_by_evidence: dict[str, str]) -> dict[str, Any]:
    """Caption, reading guide, alt text and section of one figure (``figures/<stem>.png``).

    Figures without an entry in :data:`FIGURES` (a stage added one) get a caption naming the
    ledger rows it backs, in the section of the first of them.
    """
    info = FIGURES.get(stem.split("-k=")[0].split("=")[0])
    if info:
        return {**info, "generic": False}
    section = sections_by_evidence.get(stem, OTHER[0])
    return dict(section=section, caption=f"Figure {stem}, written by a stage of this run.",
                read="No reading guide is registered for it (nvfp4study.report.sections.FIGURES).",
                alt=f"Figure {stem}", generic=True)


PAGE_MARGIN_MM = 10  # the printed page's margins (the print test lays the page out inside them)

# paper: A4; the report is read there as a summary, every detail stays one click away on screen
CSS = f"@page {{ size: A4; margin: {PAGE_MARGIN_MM}mm; }}" + """
.nv { max-width: 78rem; font-size: 15px; line-height: 1.45; }
.nv h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 1.6em; }
.nv .summary { border: 1px solid #9ab; background: #f6f9fb; padding: .6em 1.1em; border-radius: 6px; }
.nv .facts { display: grid; grid-template-columns: 7.5em 1fr; gap: .15em .8em; margin: .3em 0 .5em; }
.nv .summary h2 { margin-top: .3em; }
.nv .summary h3 { margin: .7em 0 .3em; }
.nv ul.headlines { margin: 0; padding-left: 1.2em; }
.nv ul.headlines > li { margin-bottom: .35em; }
.nv .badge { display: inline-block; padding: 0 .45em; border-radius: 4px; font-size: .85em;
  white-space: nowrap; border: 1px solid rgba(0,0,0,.15); }
.nv .v-reproduced { background: #c8e6c9; } .nv .v-partly { background: #fff3c4; }
.nv .v-contradicted { background: #ffcdd2; } .nv .v-not-run { background: #e0e0e0; }
.nv .counts td, .nv .counts th { padding: .15em .7em; }
.nv td.num, .nv th.num { text-align: right; font-variant-numeric: tabular-nums; }
.nv table { border-collapse: collapse; }
.nv table.ledger { table-layout: fixed; width: 100%; font-size: .86em; }
.nv table.ledger > thead > tr > th { text-align: left; background: #eef1f4; padding: .3em .4em; }
.nv table.ledger > tbody > tr > td { vertical-align: top; padding: .35em .4em; text-align: left;
  border-top: 1px solid #ddd; overflow-wrap: anywhere; white-space: normal; }
.nv table.ledger col.c-claim { width: 29%; } .nv table.ledger col.c-card { width: 19%; }
.nv table.ledger col.c-ours { width: 29%; } .nv table.ledger col.c-why { width: 23%; }
.nv table.ledger .lead { font-weight: 600; margin-bottom: .25em; }
.nv table.ledger .lead .badge { font-weight: normal; }
.nv table.kv { font-size: .95em; margin: 0; }
.nv table.kv td, .nv table.kv th { border: 1px solid #e3e3e3; padding: .05em .3em; text-align: left;
  vertical-align: top; font-variant-numeric: tabular-nums; overflow-wrap: anywhere; }
.nv table.kv { width: 100%; table-layout: auto; }  /* JupyterLab fixes every table: equal columns */
.nv table.kv th, .nv table.kv td > b { white-space: nowrap; }
.nv table.kv td:first-child { overflow-wrap: normal; }  /* a key breaks between words only */
.nv table.plain td, .nv table.plain th, .nv table.counts td { border: 1px solid #ddd; padding: .2em .5em; text-align: left;
  vertical-align: top; overflow-wrap: anywhere; }
.nv .muted, .nv .meta { color: #666; font-size: .85em; }
.nv details.whole summary, .nv details.more summary { color: #36c; cursor: pointer; font-size: .85em; }
.nv details.more > div, .nv details.fold { font-size: .92em; }
.nv figure { margin: 1em 0 1.6em; }
.nv figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
.nv figcaption { font-size: .9em; max-width: 60rem; }
.nv .notrun { border: 2px solid #999; background: #f3f3f3; padding: .5em 1em; border-radius: 6px;
  margin: .6em 0; }
.nv code { background: #f2f2f2; padding: 0 .2em; border-radius: 3px; overflow-wrap: anywhere; }
@media print {
  /* nbconvert's lab template pads the notebook, each cell and each output: on paper the tables
     take the page's whole width instead */
  body.jp-Notebook, .jp-Cell, .jp-Cell-outputWrapper, .jp-OutputArea, .jp-OutputArea-child,
  .jp-OutputArea-output, .jp-RenderedHTMLCommon { padding: 0 !important; margin-left: 0 !important;
    margin-right: 0 !important; max-width: none !important; }
  .jp-RenderedHTMLCommon > h1, .jp-RenderedHTMLCommon > h2 { break-after: avoid; }
  /* ... and keeps each output on one page: the manifest would leave most of a page blank */
  .jp-OutputArea-child { break-inside: auto !important; }
  .nv { max-width: none; font-size: 9pt; line-height: 1.25; }
  .nv details.whole, .nv details.fold { display: none; }
  /* a folded evidence list prints as its one-line summary, without the disclosure marker */
  .nv details.more > :not(summary) { display: none; }
  .nv details.more > summary { list-style: none; color: #666; }
  .nv details.more > summary::-webkit-details-marker { display: none; }
  .nv a { color: inherit; text-decoration: none; }
  /* each claim is a grid: its verdict sentence across the page, then claim, card, ours, why
     (a study finding has no card value: ours takes that column too) */
  .nv table.ledger { font-size: .9em; }
  .nv table.ledger, .nv table.ledger > thead, .nv table.ledger > tbody { display: block; width: 100%; }
  .nv table.ledger > thead > tr, .nv table.ledger > tbody > tr { display: grid;
    grid-template-columns: 25% 18% 32% 25%; }
  .nv table.ledger > tbody > tr > td { padding: .1em .3em .3em; border-top: none;
    overflow-wrap: break-word; }
  .nv table.ledger > tbody > tr > td.c-claim { display: contents; }
  .nv table.ledger .lead { grid-column: 1 / -1; border-top: 1px solid #bbb; padding: .3em .3em .1em;
    margin: 0; }
  .nv table.ledger .what { padding: .1em .3em .3em; }
  .nv table.ledger > tbody > tr > td.c-card.none, .nv table.ledger > tbody > tr > td.c-ours.none {
    display: none; }
  .nv table.ledger > tbody > tr > td.c-card.none + td.c-ours { grid-column: 2 / 4; }
  .nv table.ledger > tbody > tr > td.c-ours.none + td.c-why { grid-column: 3 / 5; }
  /* a key column that never wraps squeezes its values to a letter per line in a narrow cell */
  .nv table.kv th, .nv table.kv td > b { white-space: normal; }
  .nv table.ledger > tbody > tr, .nv figure, .nv .notrun { break-inside: avoid; }
  /* a figure's caption beside it, not under it */
  .nv figure { display: grid; grid-template-columns: 60% 1fr; gap: 1em; align-items: start;
    margin: .6em 0 1em; }
  .nv figure img { max-height: 10cm; max-width: 100%; width: auto; }
  .nv figcaption { max-width: none; }
  /* the manifest is a list of short facts: two columns of them */
  .nv table.manifest, .nv table.manifest > tbody { display: block; }
  .nv table.manifest > tbody { columns: 2; column-gap: 1.2em; }
  .nv table.manifest tr { display: grid; grid-template-columns: 8.5em 1fr; break-inside: avoid; }
  .nv h2 { break-after: avoid; margin-top: 1em; }
  .nv .summary { border-color: #999; background: none; }
  .nv .badge { border-color: #999; }
}
"""
