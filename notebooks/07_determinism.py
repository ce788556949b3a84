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
# # 07 · Determinism: greedy outputs with and without speculation
#
# The card: under greedy decoding, speculation off is self-reproducible on 5/5 prompts, NEXTN k=2
# matches it byte for byte on only 1/5 (paraphrases, not corruption), and with
# `--enable-deterministic-inference` (which needs `MIN_DEEPGEMM_DIM` raised from 16 to 64) that
# rises to 4/5 at 38.26 tok/s. Claims: `det.spec-off`, `det.spec-on`, `det.deterministic-mode`.
#
# How it is measured: each prompt is sent `determinism.repeats` times, greedy, to speculation off
# and to NEXTN at `determinism.spec_depth`, then to both again in deterministic mode. Outputs are
# compared as token ids (lengths first, then the first differing token: a truncated output never
# passes as equal). A throughput ratio between configurations whose texts differ compares
# different texts (different text, different acceptance): the table labels it and gives the
# identical-pairs-only ratio beside it.
#
# On the CPU engine (the default profile) the comparisons run on SGLang's real engine with a served
# stand-in (random weights): study findings, not the card's rows (those stay not run). SGLang refuses
# deterministic mode with the CPU engine's attention backend; its own message is recorded as not run.
# The last cell also checks every launch of the run: its processes are gone, and each clamp mode served.

# %% tags=["parameters"]
params_file: str = "../params/default.yaml"  # study params; the runner passes the run's resolved copy
run_dir: str = ""  # run folder; empty means outputs/latest, or a new folder when there is none

# %%
from nvfp4study.stages import s07_determinism as determinism

stage = determinism.open_stage(params_file, run_dir)

# %% [markdown]
# ## How this stage runs here

# %%
determinism.resolve_mode(stage).markdown()

# %% [markdown]
# ## Collection (configurations whose requests are not recorded yet)

# %%
determinism.collect(stage)

# %% [markdown]
# ## Identical prompts per comparison

# %%
determinism.identity_table(stage)

# %% [markdown]
# ## Throughput, and speedups labelled by text identity

# %%
determinism.throughput_table(stage)

# %% [markdown]
# ## Every compared pair (first divergence in tokens)

# %%
determinism.pair_table(stage)

# %% [markdown]
# ## Ledger

# %%
determinism.record_claims(stage)
