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
# # Report: Ling-3.0-flash NVFP4 model card, claim by claim
#
# Each row of the claims ledger is one claim of the model card
# (`kingjones777/Ling-3.0-flash-NVFP4-SGLang-MTP`). **card says** is the card's value, quoted;
# **we measured** is what this run found. Verdicts: *reproduced*, *partly*, *contradicted*,
# *not run* (with the reason). Rows whose origin is *study* are findings the card does not state.
# This page only reads files the stages wrote; it computes nothing new.

# %% tags=["parameters"]
params_file: str = "../params/default.yaml"  # study params; the runner passes the run's resolved copy
run_dir: str = ""  # run folder; empty means outputs/latest, or a new folder when there is none

# %%
from IPython.display import HTML, Markdown, display

from nvfp4study.stages import s99_report as report

stage = report.open_stage(params_file, run_dir)
display(Markdown(f"Profile **{stage.params.profile}**: {stage.params.description}"))

# %% [markdown]
# ## Verdicts at a glance

# %%
report.verdict_counts(stage.run_dir)

# %% [markdown]
# ## The claims ledger

# %%
report.styled_ledger(report.ledger_frame(stage.run_dir))

# %% [markdown]
# ## Executed notebooks

# %%
HTML(report.notebook_links(stage.run_dir))

# %% [markdown]
# ## Figures

# %%
HTML(report.figures_html(stage.run_dir))

# %% [markdown]
# ## Manifest

# %%
report.manifest_summary(stage.run_dir)
