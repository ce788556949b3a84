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
# # 00 · Environment
#
# What this run used: Python, the packages that decide the results, the CPU, the GPU (name and
# compute capability when torch sees CUDA) and free disk at the checkpoint paths. The model card's
# NVFP4 W4A4 MoE path in SGLang needs compute capability 10.0+ (Blackwell); without such a GPU the
# serving stages record "not run".
#
# Then the preflight table (every check a long run depends on, with its verdict and fix; the
# same rows `nvfp4study preflight` prints) and the plan: every server launch, its requests, and
# an estimated time from the card's load time and tok/s (labelled as the card's, not measured).

# %% tags=["parameters"]
params_file: str = "../params/default.yaml"  # study params; the runner passes the run's resolved copy
run_dir: str = ""  # run folder; empty means outputs/latest, or a new folder when there is none

# %%
from IPython.display import display

from nvfp4study.stages import s00_environment as s0

stage = s0.open_stage(params_file, run_dir)
info = s0.environment(stage)
display(s0.markdown(f"Profile **{stage.params.profile}** — run folder `{stage.run_dir}`"))

# %% [markdown]
# ## GPU

# %%
display(s0.markdown(info["nvfp4_gpu"]))
s0.gpu_table(info)

# %% [markdown]
# ## Software

# %%
s0.package_table(info)

# %% [markdown]
# ## Serving engine
# What stages 04-07 serve on. On the CPU engine (the default profile) this is SGLang's real engine
# with the CUDA-only `sgl_kernel` ops it calls replaced by torch code, a few in-memory patches and
# CPU flags, serving a BF16 all-MLA stand-in, not the NVFP4 checkpoint of 01-03.

# %%
display(s0.markdown(info["serving_engine"]["summary"]))
s0.engine_table(info)

# %% [markdown]
# ## CPU and disk

# %%
s0.machine_table(info)

# %% [markdown]
# ## Preflight

# %%
s0.preflight_table(stage)

# %% [markdown]
# ## Plan of the serving stages
#
# Estimated from the card's ~300 s load and its single-request tok/s per NEXTN depth, with every
# request generating its full `max_tokens` (an upper bound); not a measurement.

# %%
s0.plan_table(stage)
