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
# # 05 · Corrupted code: the junk-token detector, and the served study
#
# The card's headline is how much generated code a missing SwiGLU clamp corrupts (4/15 → 15/15
# and so on), detected by "an AST check for identifiers that are loaded but never bound", since
# the junk tokens (ulp, oly, culp, Advisory) are plain ASCII.
#
# **Part 1, on any machine: the detector on real code.** The canonical solutions of HumanEval
# (164) and of the study's card-style tasks must all be clean; the card's kinds of junk are
# injected into them (a fragment glued onto or replacing an identifier, after a bracket, after a
# number, as a separate word, on the closing fence) and each variant must be flagged. Five
# methods are compared: our detector (pyflakes undefined names with the prompt in scope, glued
# names, syntax errors with a recovery pass, junk fences), the card's AST check taken literally,
# the same counting unparsable code, a non-ASCII scan and execution alone (bubblewrap sandbox).
# Claims: `detect.ast-undefined`, `detect.ascii-junk`.
#
# **Part 2, with an NVFP4-capable GPU: the served study** (clamp modes × sampling configs ×
# tasks). Claims: `corruption.*`, `serve.reasoning-parser`.
#
# How to read it: recall = share of junk variants a method flags; precision counts the clean
# programs it flags too. Every number here was computed in this run; the card's values appear
# only in the ledger's "card" column.

# %% tags=["parameters"]
params_file: str = "../params/default.yaml"  # study params; the runner passes the run's resolved copy
run_dir: str = ""  # run folder; empty means outputs/latest, or a new folder when there is none

# %%
from IPython.display import Markdown, display

from nvfp4study import detector_validation
from nvfp4study.stage import open_stage

stage = open_stage("05_corruption", params_file, run_dir)
display(Markdown(f"Profile **{stage.params.profile}** — run folder `{stage.run_dir}`"))

# %% [markdown]
# ## Part 1 · The detector on real code
#
# Clean programs and their junk-injected twins, each wrapped as a chat completion and classified
# by every method.

# %%
result = detector_validation.run(stage)
display(Markdown(detector_validation.describe(result)))

# %% [markdown]
# ### Recall (precision) per junk kind and method

# %%
detector_validation.table(result.summary)

# %%
detector_validation.figure(result)

# %% [markdown]
# ### One example per kind
#
# The line before and after injection, the detector's class for it, and each method's verdict.

# %%
detector_validation.examples(result.samples)

# %% [markdown]
# ### What our detector misses, by the role of the token the junk hit
#
# Junk on an attribute, a keyword argument, an import or a name that is bound again elsewhere
# leaves every identifier bound: no static check can see it; only execution can.

# %%
detector_validation.misses(result.samples, "detector")

# %% [markdown]
# ### The card's own four junk lines
#
# `stack.append(c)ulp`, `high = len(arr) -  Advisory`, `elif arr[mid] < x Advisory:` and
# `seen.add(culp)`, spliced into the card-style tasks they come from. Two of the four do not
# parse, so an AST check alone cannot even run on them.

# %%
detector_validation.card_examples(stage)

# %% [markdown]
# ### Ledger rows: `detect.ast-undefined`, `detect.ascii-junk`

# %%
detector_validation.record_claims(stage, result)

# %% [markdown]
# ## Part 2 · The served study
#
# <!-- BEGIN SERVED-STUDY SECTION: owned by lib/nvfp4study/corruption.py (issue 5 item 7).
# Only that module's author edits the cells between this marker and END SERVED-STUDY SECTION;
# it replaces the cell below with a call to corruption.run_served_study(stage). -->
#
# For each clamp mode served, each sampling configuration and each task: the raw completion
# (appended to JSONL as it arrives), the classified table, the before/after figure, and the
# ledger rows for `corruption.*` and `serve.reasoning-parser`.

# %%
served_ids = [c for c in stage.claims() if not c.startswith("detect.")]
served_reason = ("needs an NVFP4-capable GPU (server.enabled is false)" if not stage.params.server.enabled
                 else "served study not wired into this notebook yet (corruption.run_served_study)")
stage.not_run(served_reason, served_ids)
display(Markdown(f"**Not run:** {served_reason}. Recorded for: {', '.join(served_ids)}."))

# %% [markdown]
# <!-- END SERVED-STUDY SECTION -->
