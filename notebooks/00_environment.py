# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
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

# %% tags=["parameters"]
params_file: str = "../params/default.yaml"  # study params; the runner passes the run's resolved copy
run_dir: str = ""  # run folder; empty means outputs/latest, or a new folder when there is none

# %%
from IPython.display import Markdown, display

from nvfp4study import environment
from nvfp4study.stage import open_stage

stage = open_stage("00_environment", params_file, run_dir)
info = environment.collect(stage.params, stage.run_dir)
environment.write_info(info, stage.paths.data("environment"))
display(Markdown(f"Profile **{stage.params.profile}** — run folder `{stage.run_dir}`"))

# %% [markdown]
# ## GPU

# %%
display(Markdown(info["nvfp4_gpu"]))
environment.gpu_table(info)

# %% [markdown]
# ## Software

# %%
environment.package_table(info)

# %% [markdown]
# ## CPU and disk

# %%
environment.machine_table(info)
