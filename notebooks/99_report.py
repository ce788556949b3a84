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
# # Report: the Ling-3.0-flash NVFP4 model card, claim by claim

# %% tags=["parameters"]
params_file: str = "../params/default.yaml"  # study params; the runner passes the run's resolved copy
run_dir: str = ""  # run folder; empty means outputs/latest, or a new folder when there is none

# %%
from IPython.display import HTML

from nvfp4study.stages import s99_report as report

stage = report.open_stage(params_file, run_dir)
HTML(report.summary_html(stage.run_dir, stage.params.model_dump(mode="json"), stage.params.description))

# %% [markdown]
# ## How to read the claims below
#
# Each section follows one part of the card (`kingjones777/Ling-3.0-flash-NVFP4-SGLang-MTP`). In
# each table **card says** is the card's value, quoted; **we measured** is what this run found (a
# long value is clipped; *whole value* opens it, and the evidence files hold it as JSON).
# Each row opens with its verdict in one sentence: *reproduced*, *partly*, *contradicted*, *not run*
# (the summary above says how to run it); **how / why** has the rest (a long note or evidence list
# is folded: *rest of the note* opens it). Rows marked *study finding* are findings the card does
# not state. This page only reads the files the stages wrote; it computes nothing new.

# %%
HTML(report.sections_html(stage.run_dir))

# %% [markdown]
# ## This run: notebooks and manifest

# %%
HTML(report.notebook_links(stage.run_dir))

# %%
HTML(report.manifest_html(stage.run_dir))
