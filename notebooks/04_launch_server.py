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
# # 04 · Launching the server: the card's command, the clamp log lines, memory and load time
#
# The card serves the NVFP4 checkpoint on one 128 GB-class GPU with SGLang and says the patched
# server logs the SwiGLU clamp once per layer: `limit=None` on the unclamped layers and
# `limit=4` on layers 35-41, that the weights take 71.8 GB once loaded and that loading takes
# about 300 s. This stage launches the card's configuration once and reads what its log says.
# Claims: `fit.single-gpu`, `size.resident`, `load.time`, `clamp.log-lines`.
#
# How to read it: the command table shows every flag with the file and line that defines it in
# the SGLang release (re-read from the wheel); the clamp table puts the checkpoint's
# `expert_swiglu_limit_list` beside the limit each MoE layer logs (layers 0-1 are dense and log
# nothing; the NEXTN draft reads entry 0 and runs unclamped). SGLang's log writes "GB" for GiB
# (bytes / 2^30); the ledger's GB are 10^9 bytes. Without an NVFP4-capable GPU (compute
# capability 10.x-12.x) nothing is launched and the claims are recorded as not run; with
# `-p replay_from=<run dir>` a recorded run's log and launch record are analysed instead.
#
# On the CPU engine (the default profile) the same command, lifecycle and log reading run on SGLang's
# real engine with a served stand-in (BF16 all-MLA random weights in Ling's layout): the card's rows
# stay not run, and the launch, its process tree and its teardown are recorded as a study finding.

# %% tags=["parameters"]
params_file: str = "../params/default.yaml"  # study params; the runner passes the run's resolved copy
run_dir: str = ""  # run folder; empty means outputs/latest, or a new folder when there is none

# %%
from nvfp4study.stages import s04_launch as s4

stage = s4.open_stage(params_file, run_dir)

# %% [markdown]
# ## How this stage runs here

# %%
s4.resolve_mode(stage).markdown()

# %% [markdown]
# ## What the CPU engine replaces
#
# On the CPU engine (`server.engine: cpu`) the kernel ops SGLang would take from `sgl_kernel`'s CUDA
# build are torch code, a few SGLang calls are patched in memory (each names the file and line it
# works around) and a few flags are added; nothing else differs from the GPU command. Empty on a GPU.

# %%
s4.engine_table(stage)

# %% [markdown]
# ## The command
#
# `sglang serve` run with the interpreter named in `server.python`; every flag checked against
# the argument definitions of the SGLang release in the params.

# %%
s4.command_table(stage.params)

# %% [markdown]
# ## Every server configuration of the study
#
# Stages 04-07 need these configurations. When a server is up, every request that 04, 06 and 07
# need from it is sent, so each configuration is launched once (05 launches its clamp modes).

# %%
s4.plan_table(stage.params)

# %% [markdown]
# ## Launch (or replay, or not run)

# %%
s4.collect(stage)

# %%
s4.launch_table(stage)

# %% [markdown]
# ## Clamp log lines per layer

# %%
s4.clamp_summary(stage)

# %%
s4.clamp_table(stage)

# %% [markdown]
# ## The clamp probe: what the running engine does with the routed limit (CPU engine)
#
# Stage 03's audit reads SGLang's source and says, per MoE path, what happens to Ling's routed
# clamp limit; for the native PyTorch MoE path, where the CPU engine runs the routed experts, it
# says DROPPED. Here the engine itself answers: the stand-in is served three more times, with only
# `config.json` changed: a tiny limit (`server.cpu.clamp_probe_limit`) on every routed expert, the
# same limit on every shared expert, and no limit. If the routed outputs equal the no-limit outputs
# token for token, the limit was not applied; the shared expert applies its limit, so its row shows
# how often a clamp of that size changes an output (the probe's sensitivity). Study finding
# `audit.cpu-moe-clamp`; a toy-scale model, not a reading of the card.

# %%
s4.clamp_probe_table(stage)

# %% [markdown]
# ## Warnings worth surfacing
#
# The gate/up global-scale warning means the up projection is dequantized with the gate's
# scale; an active reasoning parser can move answers into `reasoning_content`.

# %%
s4.warnings_table(stage)

# %% [markdown]
# ## Weights in memory and load time

# %%
s4.memory_table(stage)

# %% [markdown]
# ## Ledger

# %%
s4.record_claims(stage)
