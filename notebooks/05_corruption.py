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
from IPython.display import display

from nvfp4study.stages import s05_corruption as s5

stage = s5.open_stage(params_file, run_dir)
display(s5.markdown(f"Profile **{stage.params.profile}** — run folder `{stage.run_dir}`"))
display(s5.markdown(s5.sandbox_banner(stage)))  # fails closed: stops here if bwrap cannot run

# %% [markdown]
# ## Part 1 · The detector on real code
#
# Clean programs and their junk-injected twins, each wrapped as a chat completion and classified
# by every method.

# %%
result = s5.validate_detector(stage)
display(s5.markdown(s5.describe_validation(result)))

# %% [markdown]
# ### Recall (precision) per junk kind and method

# %%
s5.score_table(result.summary)

# %%
s5.validation_figure(result)

# %% [markdown]
# ### One example per kind
#
# The line before and after injection, the detector's class for it, and each method's verdict.

# %%
s5.example_table(result.samples)

# %% [markdown]
# ### What our detector misses, by the role of the token the junk hit
#
# Junk on an attribute, a keyword argument, an import or a name that is bound again elsewhere
# leaves every identifier bound: no static check can see it; only execution can.

# %%
s5.miss_table(result.samples, "detector")

# %% [markdown]
# ### The card's own four junk lines
#
# `stack.append(c)ulp`, `high = len(arr) -  Advisory`, `elif arr[mid] < x Advisory:` and
# `seen.add(culp)`, spliced into the card-style tasks they come from. Two of the four do not
# parse, so an AST check alone cannot even run on them.

# %%
s5.card_examples(stage)

# %% [markdown]
# ### Ledger rows: `detect.ast-undefined`, `detect.ascii-junk`

# %%
s5.record_detector_claims(stage, result)

# %% [markdown]
# ## Part 2 · The served study
#
# For each clamp mode served (`corruption.clamp_modes`), each sampling configuration
# (`corruption.sampling`; thinking switched through `chat_template_kwargs`) and each task: the raw
# completion is appended to `data/corruption-raw-clamp=<mode>-sampling=<name>.jsonl` as it
# arrives (an interrupted study resumes), then extracted, classified by the detector of Part 1
# and executed against the task's assertions in the sandbox. A completion is *clean* when the
# detector finds nothing corrupting; requests that failed are not completions and are left out
# of n. The card's claim sets are the first 15 / 10 of the study's card-style tasks
# (`corruption.claim_tasks`). "Before" is the clamp removed (`none`), "after" the exact clamp.
# Without a GPU this section records "not run"; `-p replay_from=<run dir>` re-analyses a
# recorded run's raw files instead. On the CPU engine (the default profile) a few tasks are served
# by SGLang's real engine with a stand-in model (random weights: it seldom writes code), so the
# pipeline runs end to end on real answers; the card's before/after rows stay not run.

# %%
served = s5.run_served_study(stage)
s5.describe_served(served)

# %% [markdown]
# ### Clean completions per clamp mode and sampling configuration
#
# `claim` rows are the card's task sets, `all` every task asked; `ci_low`/`ci_high` is the 95 %
# Wilson interval of `clean / n`; `executed`/`passed` come from the sandbox.

# %%
s5.served_summary_table(served)

# %% [markdown]
# ### Before / after, with 95 % Wilson intervals

# %%
s5.served_figure(served)

# %% [markdown]
# ### The most frequent junk fragments
#
# Undefined names, names glued onto a bracket / string / number, and junk on closing fences, as
# the detector reported them, counted per clamp mode.

# %%
s5.served_junk_table(served)

# %% [markdown]
# ### Ledger rows: `corruption.*`, `serve.reasoning-parser` (card value beside ours)

# %%
s5.served_ledger_rows(stage)

# %% [markdown]
# ### What others measured on the real model (theirs, not ours)
#
# The card's corruption rows above stay *not run* here; their notes cite these independent public
# measurements, attributed. None of them was re-measured by this study.

# %%
s5.outside_evidence_table()

# %% [markdown]
# ## Part 3 · Before and after on a trained stand-in (toy scale)
#
# The mechanism, measured: a small model in Ling's layout that the project trained with Ling's
# post-SiLU clamp (`lib/nvfp4study/trained`, its weights committed with their sha256 and checked
# before serving) is served by SGLang's real engine on this CPU, once per arm: the routed clamp as
# the engine's native MoE path ships it (*released*: dropped), in the pre-SiLU form SGLang's NVFP4
# CUTLASS call computes (*approx*) and in Ling's form (*exact*), each with the trained BF16 experts
# and with NVFP4-rounded ones (the study's `model_free_ptq` output, decoded to BF16 for serving: the
# CPU engine has no FP4 MoE). The reference arm is *exact-bf16* (the form the model was trained with);
# it is launched twice (null control). Every arm answers the same HumanEval prompts greedily and
# scores the reference arm's tokens teacher-forced. Toy scale: these numbers are never set beside
# the card's.

# %%
trained = s5.run_trained_study(stage)
s5.describe_trained(trained)

# %%
s5.trained_table(trained)

# %%
s5.trained_figure(trained)
