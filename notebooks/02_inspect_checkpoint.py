# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3 (nvfp4study)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Inspect the checkpoint: what the files contain, read from the headers
#
# **What it tests.** The card's statements about its checkpoint's contents: the precision table
# (`layout.*`), the MTP layer's state (`mtp.layer42-bf16`, `mtp.ignore-first`), the counts
# (`counts.*`, `scales.input-global-scale`), the config (`config.w4a4`, `config.clamp-lists`,
# `config.context`), the size on disk (`size.disk`) and the routing limit (`clamp.trtllm-routing`).
# It also looks for the known checkpoint faults F-01..F-05 (missing activation scales, a broken
# MTP layer, a draft in another FP4 format, a weight-only config, routing shapes).
#
# **How.** `nvfp4study.checkpoint.audit` reads only the safetensors headers, the index and
# `config.json`, plus the `[1]`-sized float32 global scales (with `safetensors.safe_open`); it
# matches the config's `ignore`/`targets` against every module the way SGLang 0.5.23 does
# (and reports where compressed-tensors' own matching would differ). The same command works on
# any checkpoint: `nvfp4study audit-checkpoint PATH --json`.
#
# **How to read it.** By default the audited checkpoint is the one 01 made: a **scaled-down
# Ling layout with random weights**. Structure (names, formats, which scheme applies where) is
# reproduced; counts are compared with the layout formulas, which give the card's numbers only
# at the real sizes. Columns labelled "card" are the card's values, never ours.
#
# **The card's own checkpoint.** When the params name it (`checkpoint.card_checkpoint`, as
# `params/card-files.yaml` does), the card's published checkpoint is audited too, from the Hub by
# range requests (headers and the `[1]` scales, a few MB), and the card's claim rows are measured
# on its files (`checked_on` names repo@commit). Without it nothing here touches the network and
# the card-artifact rows say "not run" with the command that settles them.

# %% tags=["parameters"]
params_file: str = "../params/default.yaml"  # study params; the runner passes the run's resolved copy
run_dir: str = ""  # run folder; empty means outputs/latest, or a new folder when there is none

# %%
from IPython.display import Image, display

from nvfp4study.stages import s02_inspect as ins

stage = ins.open_stage(params_file, run_dir)
ck = ins.resolve_checkpoint(stage)
ck

# %% [markdown]
# ## Audit
# Writes `data/checkpoint_audit.json` (findings, tables, counts, serving matrix) and
# `data/checkpoint-tensors.parquet` (one row per tensor: dtype, shape, module, component,
# stored format, the scheme SGLang would apply).

# %%
report = ins.run_audit(stage, ck)
display(ins.markdown(ins.summary_markdown(report, ck)))

# %% [markdown]
# ## Findings
# `F0n-*` codes are the verdicts of the faults F-01..F-05; `error` findings make
# `nvfp4study audit-checkpoint` exit with status 1.

# %%
ins.findings_table(report)

# %% [markdown]
# ## Precision by component (the card's table, derived from the files)

# %%
ins.precision_table(report)

# %% [markdown]
# ## Packed vs plain tensors per layer
# Packed = `weight_packed` (two e2m1 values a byte); scale = their block, global and input scales;
# plain = BF16/F32 tensors. `*` marks the MTP layer.

# %%
display(Image(ins.heatmap_path(stage)))

# %%
ins.layer_table(report)

# %% [markdown]
# ## The MTP (NEXTN) layer

# %%
ins.mtp_table(report)

# %% [markdown]
# ## Which scheme the engine applies to which modules
# SGLang decides a whole MoE layer from expert 0's names; every other Linear by its own name
# (ignore: exact, dotted suffix or `re:` regex; targets: name, then class).

# %%
ins.scheme_table(report)

# %% [markdown]
# ## Gate/up global scales of the audited checkpoint
# SGLang's W4A4 scheme dequantizes both gate and up with the gate's global scale; the histogram
# shows the resulting relative error on up_proj per expert (0 when they share one scale).

# %%
display(Image(ins.up_error_path(stage)))

# %% [markdown]
# ## The same error on the card-style pipeline (no gate/up pairing rule)
# From 01's quantization with both fused tables emptied (the card's recipe).

# %%
unshared = ins.unshared_up_error(stage)
display(Image(unshared["figure"]) if unshared["run"] else ins.markdown(f"Not measured: {unshared['reason']}."))

# %% [markdown]
# ## Who can serve this checkpoint
# SGLang release x GPU generation, from the released source (see `quant_rules.SERVING_SOURCES`).

# %%
ins.serving_table(report)

# %% [markdown]
# ## Counts: measured, the layout formula, and the formula at the real sizes

# %%
ins.counts_table(report)

# %% [markdown]
# ## The card's own checkpoint, read from the Hub
# Writes `data/card_checkpoint_audit.json` and `data/card_checkpoint-tensors.parquet` when
# `checkpoint.card_checkpoint` names the card's repo.

# %%
card = ins.card_audit(stage)
display(ins.markdown(ins.card_summary(card)))

# %% [markdown]
# ## The card's checkpoint vs ours vs the card's text
# Both checkpoint columns are measured from the files; "card says" is the card's text
# (`core/claims.yaml`), never a measurement.

# %%
ins.comparison_table(report, card)

# %% [markdown]
# ## Ledger
# The card's claims of this stage and the study's findings, as recorded for this run.

# %%
ins.record_ledger(stage, report, ck, unshared, card)
