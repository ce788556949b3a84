# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (nvfp4study)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Where SGLang sends Ling's SwiGLU clamp, and the patches
#
# **What this stage tests.** The card says SGLang's compressed-tensors NVFP4 MoE scheme
# hard-codes `gemm1_clamp_limit=None`, that every other MoE runner forwards the clamp, and that
# three edits fix it. We read SGLang's released source with Python's `ast` (nothing is imported
# or run on a GPU) and decide, for a model that sets `gemm1_clamp_limit` and no `gemm1_alpha`
# (Ling), where the clamp ends up on every MoE path:
# **EXACT** (Ling's post-SiLU form `min(silu(g), L) * clamp(u, -L, L)`), **APPROX** (the GPT-OSS
# pre-SiLU form), **DROPPED** (silently no clamp), **REFUSED** (raises because the limit is set)
# or **UNUSABLE** (raises for Ling whatever the limit).
# Then we apply and revert the study's patch modes (`none`, `exact`, the deterministic edit, and
# the card's own patch on 0.5.20) on a copy, re-audit, and size what APPROX means numerically.
#
# **Claims:** `clamp.nvfp4-dropped`, `clamp.others-forward`, `clamp.cutlass-fix`,
# `scales.input-empty-nan`, `sglang.w4a16-unservable`, `serve.shared-fusion-off`,
# `det.min-deepgemm-dim`, plus the study's own findings.
#
# **How to read it.** Each table row names the file and line that decided. The verdict matrix
# shows how the answer changes across releases. The backend matrix answers which MoE runner a
# Ling user gets per checkpoint format and GPU, and with which verdict. The patch table shows
# each mode's verdict after applying it and that the revert is byte-identical.

# %% tags=["parameters"]
params_file: str = "../params/default.yaml"  # study params; the runner passes the run's resolved copy
run_dir: str = ""  # run folder; empty means outputs/latest, or a new folder when there is none

# %%
from nvfp4study.stages import s03_sglang as s3

stage = s3.open_stage(params_file, run_dir)

# %%
from IPython.display import Image


tree = s3.stage_tree(stage)

# %%
s3.markdown(s3.describe_tree(tree))

# %% [markdown]
# ## The clamp audit of the stage's SGLang
# The paths are found by following SGLang's dispatch: the `--quantization` registry, the MoE
# methods its configs build, the `MoeRunner` backend each method picks, and the fused function or
# runner core that backend runs. One row per catalogued (hand-read) path: verdict, the deciding
# `file:line`, and the rule (the kernel sink and the form it computes, a literal `None`, a use
# that sits only in the alpha-set branch, a `raise`, or where the trail was lost).

# %%
s3.audit_main(stage, tree)

# %% [markdown]
# ## Across releases
# The same audit on every release in `params.sglang.audit_versions`, read from the released wheels.

# %%
results = s3.audit_versions(stage)

# %%
s3.verdict_matrix(results)

# %%
Image(str(s3.matrix_png(stage, results)))

# %% [markdown]
# Every other path the dispatch reaches is audited too, under its derived name (`Class/backend`,
# `fused:a2a/runner`, `core:backend`). These are the audit's machine reading, not hand-catalogued:
# a path is as bad as its worst branch (an MXFP8 or ROCm branch included), and each row's rule,
# with where an UNDECIDED trail was lost, is in `data/sglang_audit_versions.json`. The machine
# reading's counts per release and verdict:

# %%
s3.found_paths(results)

# %% [markdown]
# The other parameters of Ling's MoE on the same paths (`nvfp4study audit-sglang --param NAME`):
# the routed scaling factor (APPLIED once, DROPPED, DOUBLE), and the routing parameters, not
# followed yet (UNDECIDED). Every path's rows go to `data/sglang_param_audit.json` (stage 04 reads
# the CPU engine's path there).

# %%
param_rows = s3.param_audit(stage, results)

# %% [markdown]
# ## Which MoE runner a Ling user gets, per checkpoint format and GPU
# For each checkpoint format (compressed-tensors NVFP4 W4A4, the card's, and W4A16; ModelOpt
# NVFP4; FP8 block and per-tensor; W8A8 INT8; MXFP4; GPTQ/AWQ INT4; BF16) and device class
# (Blackwell SM100 and SM120, Hopper, Ampere, ROCm, CPU): the MoE method SGLang builds there, what
# `--moe-runner-backend auto` resolves to (model override, server arguments, then the method; the
# deciding line is in the data) and the clamp verdict of the path it lands on, with the routed
# scaling factor's where the audit decides it (the routing parameters' are in the data). Every backend value
# that reaches a MoE path there, with its verdict, is in `data/sglang_backend_matrix.json` and
# `nvfp4study audit-sglang --matrix --version X`. The latest release:

# %%
s3.backend_matrix(stage, results, param_rows)

# %%
s3.backend_answer(stage)

# %% [markdown]
# ## How far the derived paths' verdicts can be trusted
# Five readers, blind to the audit's code and output, each read 9 of these derived paths by hand
# from the released source (a random sample, 9 per release, seed 20261201; readings, method and
# verdict definitions in `lib/nvfp4study/sglang/data/hand_readings.yaml`). Their verdicts have one
# the audit lacks, UNUSABLE (the path raises for Ling whatever the limit); such a reading counts
# as a disagreement. Written to `data/sglang_audit_agreement.json`.

# %%
agreement = s3.audit_agreement(stage, results)
s3.markdown(agreement["sentence"] + " " + agreement["rule"])

# %% [markdown]
# Agreement per path kind (the key's backend part; `fused:` and `core:` keep their prefix), with
# the Wilson 95 % interval; "verdicts counted" says whether the kind passes the rule above.

# %%
agreement["by_kind"]

# %% [markdown]
# The confusion table: hand verdict (rows) against the audit's verdict (columns), readings.

# %%
agreement["confusion"]

# %% [markdown]
# The derived paths per release and verdict as the study counts them: hand-read paths take the
# hand verdict, a trusted kind the audit's; everything else is the machine reading, kept apart.

# %%
agreement["per_release"]

# %% [markdown]
# The other parameters of Ling's MoE (the routed scaling factor, the routing parameters;
# `nvfp4study audit-sglang --param NAME`) against their own blind hand readings
# (`lib/nvfp4study/sglang/data/param_hand_readings.yaml`, read by others; not run while it is absent).
# The rows are `param_rows` above; the agreement is written to `data/sglang_param_agreement.json`.

# %%
param_agreement = s3.param_agreement(stage, param_rows)
s3.markdown(param_agreement["sentence"])

# %% [markdown]
# ## Other facts the card relies on
# `MIN_DEEPGEMM_DIM` and its guard; how the W4A4 scheme allocates the input global scales; what
# the NVFP4 schemes do when gate and up global scales differ; which MoE scheme an NVFP4 W4A16 or
# W4A4 config gets (replayed from each tree's `get_moe_scheme`); whether BailingMoeV3 turns
# shared-expert fusion off by itself.

# %%
s3.checks(stage)

# %% [markdown]
# ## Patch modes on a copy
# Each mode is applied to a copy of the tree in this run's `work/` folder, applied again
# (idempotence), verified, compiled, re-audited, then reverted and compared byte for byte with
# the released files. OUR reconstruction of the card's patch (`patches/0.5.20/card`) is replayed
# on a copy of SGLang 0.5.20, the release it was written for.

# %%
s3.patch_roundtrip(stage, tree)

# %% [markdown]
# ## The card's own patch files, as published
# When the params name them (`sglang.card_patches`: the card's Hub repo, or `sglang.card_patch_dir`),
# the card's `sglang_patch/*.patch` are applied as its instructions say (`patch -p1` in
# `sglang/srt`, in order, each after a `--dry-run`) to a copy of each release. A file that does
# not apply is reported with its hunk and line, not an error. Without them: "not run".

# %%
s3.card_patch_files(stage)

# %% [markdown]
# ## What APPROX means numerically
# The three forms on a (gate, up) grid around and beyond L = 4, 5, 7 (float64, CPU).

# %%
s3.numerics(stage, tree)

# %%
Image(str(stage.paths.figure("clamp_forms")))

# %% [markdown]
# ## The serving install

# %%
s3.markdown(s3.prepare_install(stage, tree))

# %% [markdown]
# ## Ledger
# Every stage-03 claim of the card, with the version it was checked on, and the study's findings.

# %%
s3.record_claims(stage, tree.version)
