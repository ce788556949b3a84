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
# # 01 · Quantize: BF16 → NVFP4 with llmcompressor, then the serving rewrite
#
# **What it tests.** How the card says its checkpoint was made: llmcompressor's `model_free_ptq`,
# scheme NVFP4A16, with the fused maps emptied and the MLA kept out through the ignore list
# (claims `provenance.model-free-ptq`, `provenance.fused-maps`). Then the card's serving layout:
# `input_global_scale = 1.0` beside every routed-expert `weight_global_scale` and a W4A4
# `input_activations` block (`dynamic: "local"`) in the config.
#
# **How.** By default a small BF16 checkpoint in the exact Ling-3.0-flash tensor layout is
# generated here with **random weights** (sizes from the params), quantized with the real
# llmcompressor on this machine, and probed: does the tool accept the stock fused tables, one
# emptied table, the W4A4 scheme? A sample of experts is dequantized with compressed-tensors'
# own NVFP4 codec and compared with the BF16 source.
#
# **How to read it.** Counts, times and errors are measured on the scaled-down random checkpoint,
# not on the card's 76 GB files (02 audits any checkpoint from its headers). The llmcompressor /
# compressed-tensors versions this run used are read at run time and shown in the counts table
# below (row "llmcompressor / compressed-tensors"); the card names 0.12.0.1 / 0.17.1 (card).

# %% tags=["parameters"]
params_file: str = "../params/default.yaml"  # study params; the runner passes the run's resolved copy
run_dir: str = ""  # run folder; empty means outputs/latest, or a new folder when there is none

# %%
from IPython.display import Image, display

from nvfp4study.stages import s01_quantize as qs

stage = qs.open_stage(params_file, run_dir)
plan = qs.plan(stage.params, stage.paths)
display(qs.markdown(qs.plan_markdown(plan)))

# %% [markdown]
# ## The source checkpoint
# Layer schedule of the params' shape: MLA on every `layer_group_size`-th layer and on the MTP
# layer (numbered `num_hidden_layers`), dense MLP before `first_k_dense_replace`, MoE after.

# %%
source = qs.build_source(stage.params, stage.paths, plan)
source

# %%
qs.layout_table(stage.params)

# %% [markdown]
# ## The ignore list (MTP layer first) and what each pattern keeps in BF16

# %%
qs.ignore_table(stage.params)

# %% [markdown]
# ## Quantize with `model_free_ptq`, then the serving rewrite
# Progress bars ("Validating", "Quantizing") count shards. MB/s is BF16 input megabytes
# (10^6 bytes) over the wall time of the `model_free_ptq` call.

# %%
report = qs.run_quantize(stage.params, stage.paths, plan, source)
qs.counts_table(report)

# %% [markdown]
# ## What the tool accepts on the Ling layout
# Each probe runs `model_free_ptq` up to its validation step (it stops before quantizing) and
# records the tool's own error message.

# %%
probe = qs.probes(stage.params, stage.paths, plan)
qs.probes_table(probe)

# %% [markdown]
# ## Gate/up global scales per routed expert
# SGLang's W4A4 NVFP4 MoE scheme uses the gate's global scale for gate and up together; an
# expert whose two scales differ is served with a mis-scaled up projection. Measured here on the
# output with the pairing rule (default) and, when `quantize.compare_unshared`, without it.

# %%
gate_up_fig = qs.gate_up_figure(stage.paths, probe)
display(Image(str(gate_up_fig)) if gate_up_fig else qs.markdown("No gate/up scales: quantization skipped."))

# %% [markdown]
# ## Round trip: compressed-tensors' NVFP4 codec vs the BF16 source
# Relative Frobenius error per tensor, and the largest per-element error divided by NVFP4's
# bound (half the e2m1 grid gap times block scale / global scale; see `roundtrip.py`).

# %%
rt = qs.run_roundtrip(stage.params, stage.paths, plan)
rt["table"] if rt["run"] else qs.markdown(f"Round trip not run: {rt['reason']}.")

# %%
display(Image(rt["figure"]) if rt["run"] and rt["figure"] else qs.markdown("No round-trip figure."))

# %% [markdown]
# ## Ledger
# The card's provenance claims and the study's own findings, as recorded for this run.

# %%
qs.record_ledger(stage, report, probe, rt)
