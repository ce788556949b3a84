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
# # 06 · MTP (NEXTN) depth sweep: tok/s and acceptance per draft depth
#
# The card reports one request decoding at 22.60 tok/s without speculation and, with NEXTN,
# 40.19 / 45.1 / 40.48 tok/s at k = 1 / 2 / 3 with accept length 1.85-1.95 / 2.62-2.70 / 2.58-2.90
# and accept rate 0.85-0.95 / 0.81-0.85 / 0.53-0.63, k = 2 being best; a draft layer loaded under
# the wrong scheme shows accept length 1.00, rate 0.00 and speculation slower than none.
# Claims: `mtp.off`, `mtp.k1`, `mtp.k2`, `mtp.k3`, `mtp.k2-best`, `mtp.broken-draft`.
#
# How it is measured: per depth the same prompts, one request at a time (`--max-running-requests
# 1`), greedy, thinking off, after a warm-up, each starting from an empty prefix cache. tok/s comes
# from the streamed chunks' arrival times: **decode tok/s** counts tokens after the first text
# chunk over the time to the last one (time to first token excluded); **end-to-end tok/s** is
# completion tokens over the whole request. Acceptance comes from each request's
# `sglext.spec_tokens_details`, cross-checked against Prometheus counters read around each request.
# Every table names its estimator; medians come with the range over requests. A speedup between
# depths whose texts differ compares different texts, and the table says so. The card's values
# appear only as marks labelled "card".
#
# On the CPU engine (the default profile) the sweep runs on SGLang's real engine with a served
# stand-in (random weights), plus two stand-ins whose acceptance is fixed by construction: a draft
# that always agrees with the target (accept length k+1, rate 1) and one that never does (the
# card's broken-draft line, 1.00 / 0.00). Their tok/s and acceptance test the pipeline and the
# estimators; they are never set beside the card's numbers, whose rows stay not run.

# %% tags=["parameters"]
params_file: str = "../params/default.yaml"  # study params; the runner passes the run's resolved copy
run_dir: str = ""  # run folder; empty means outputs/latest, or a new folder when there is none

# %%
from nvfp4study.stages import s06_mtp as mtp

stage = mtp.open_stage(params_file, run_dir)

# %% [markdown]
# ## How this stage runs here

# %%
mtp.resolve_mode(stage).markdown()

# %% [markdown]
# ## Collection (one server per depth not yet recorded)

# %%
mtp.collect(stage)

# %% [markdown]
# ## Per depth: tok/s, speedup, acceptance

# %%
mtp.summary_table(stage)

# %%
mtp.figure(stage)

# %% [markdown]
# ## Is the draft broken? (accept rate about 0 and accept length about 1)

# %%
mtp.broken_draft_report(stage)

# %% [markdown]
# ## One data set, several acceptance numbers
#
# Request-weighted, token-weighted and counter-delta estimators of the same requests; the
# whole-session counters also count the warm-up and every other request the server answered.

# %%
mtp.estimator_table(stage)

# %% [markdown]
# ## Estimators against acceptance known by construction (CPU engine)
#
# For each control stand-in, every estimator beside the value its draft construction fixes; empty
# on a GPU run.

# %%
mtp.known_acceptance_table(stage)

# %% [markdown]
# ## Every request

# %%
mtp.request_table(stage)

# %% [markdown]
# ## The card's tok/s against the memory-bandwidth ceiling
#
# Needs no GPU: decoding one request reads the weights once per pass, so tok/s cannot exceed
# bandwidth / bytes read per token (the NVFP4 layout's active experts with their scales, the
# shared expert, attention, norms, router and `lm_head` in BF16, one embedding row; a verify pass
# of k+1 tokens reads them once, and yields the accept length). The card's numbers (labelled
# "card") against the ceiling of each Blackwell GPU a 128 GB-class card can mean; bandwidths are
# vendor figures with their sources. Recorded as the study finding `mtp.bandwidth-ceiling`.

# %%
mtp.ceiling_table(stage)

# %% [markdown]
# ## Ledger
#
# The verdicts compare the card's numbers with the estimator the card used: SGLang's `Decode
# batch` log lines inside our request windows (median `gen throughput (token/s)`, `accept len`,
# `accept rate`); the per-request values are recorded beside them, and each note names the
# estimator that decided (the per-request ones only when the log has no line in our windows).

# %%
mtp.record_claims(stage)
