"""The clamp audit on the released SGLang versions, and on small trees built for its traps.

Every expected verdict below was confirmed by reading the deciding lines of the released source
(see the comments); the audit must reach it from the code alone. Expectations are keyed by
release: a new release adds one key per row (CONTRIBUTING.md, "Adding an SGLang release"), and
``test_every_release_is_expected`` names the rows that lack it.
"""

from __future__ import annotations

import json

import pytest

from nvfp4study.checkpoint import quant_rules as qr
from nvfp4study.core.errors import NotAnSGLangTree, SGLangNotInstalled
from nvfp4study.sglang import audit as sa
from nvfp4study.sglang import audit_report as report
from nvfp4study.sglang import releases as rel
from nvfp4study.sglang.checks import extra_checks, moe_scheme_for, shared_fusion
from nvfp4study.sglang.source import (
    copy_tree,
    find_root,
    installed_tree,
    open_tree,
    read_version,
    unpack_wheel,
)
from nvfp4study.sglang.startup_checks import startup_refusals
from sglang_fixtures import (  # noqa: F401 (the copy23 fixture)
    VERSIONS,
    copy23_fixture,
    edit_once,
    mini_tree,
    release_gaps,
    released,
    scheme_messages,
)

E, A, D, R, X, U = "EXACT", "APPROX", "DROPPED", "REFUSED", "ABSENT", "UNDECIDED"
N = "UNUSABLE"

# path -> {release: verdict}. Each path is found by following the
# dispatch (tests/test_sglang_dispatch.py); these are the verdicts read by hand. The 0.5.19 column
# was read by hand for every path; its deciding lines (sglang/srt unless noted) are in the comments
# marked "0.5.19:".
EXPECTED = {
    # 0.5.20: FlashInferCutlassMoeQuantInfo has no clamp field, _run_flashinfer_cutlass passes no
    # swiglu_limit. 0.5.21+: materialize_swiglu_params_for_cutlass -> swiglu_limit with
    # activation Swiglu, which FlashInfer promotes to SwigluBias (clamp before SiLU).
    "nvfp4-w4a4-cutlass": {"0.5.19": D, "0.5.20": D, "0.5.21": A, "0.5.22": A, "0.5.23": A},
    # apply_weights asserts layer.routing_method_type is not None (310 / 309 / 320 / 320 / 324), which
    # BailingMoeV3 never passes (FusedMoE default None, base_config.py 126-130 returns it unchanged):
    # it crashes whatever the limit (issue 36); the path alone would pass a literal
    # gemm1_clamp_limit=None (331 / 342 / 342 / 346).
    "nvfp4-w4a4-trtllm": {"0.5.19": N, "0.5.20": N, "0.5.21": N, "0.5.22": N, "0.5.23": N},
    # the W4A16 scheme exists from 0.5.22; Marlin passes swiglu_limit unless alpha is set.
    # 0.5.19: no such MoE scheme (compressed_tensors.py 782-904 raises RuntimeError at 902-904).
    "nvfp4-w4a16-marlin": {"0.5.19": X, "0.5.20": X, "0.5.21": X, "0.5.22": D, "0.5.23": D},
    # _use_swiglu_step = limit set and alpha None -> ActivationType.SwigluStep. 0.5.19 makes the
    # cutlass_fused_moe call inline in the registry entry fused_experts_none_to_flashinfer_mxfp4
    # (flashinfer_cutlass.py 412-436; mxfp4_flashinfer_cutlass_moe.py 104-109); 0.5.20+ delegate it.
    "mxfp4-cutlass": {"0.5.19": E, "0.5.20": E, "0.5.21": E, "0.5.22": E, "0.5.23": E},
    # builds its limit tensor from swiglu_limit only (0.5.19: mxfp4_flashinfer_trtllm_moe.py 71-81, 357).
    "mxfp4-trtllm": {"0.5.19": D, "0.5.20": D, "0.5.21": D, "0.5.22": D, "0.5.23": D},
    # alpha None + gemm1_limit -> _swiglu_silu_clamp_mul (silu, then clamp). 0.5.19: triton.py 234 ->
    # triton_utils/fused_moe.py 357, 691-694, 373-378. The MXFP8 branch (triton.py 188-194, ROCm
    # gfx95) uses the GPT-OSS form (mxfp8_moe_amd_gfx95.py 408-409) and is not Ling's (assume).
    "triton": {"0.5.19": E, "0.5.20": E, "0.5.21": E, "0.5.22": E, "0.5.23": E},
    # 0.5.19: Swiglu and no swiglu_limit (unquant.py 823-826, 930-946; flashinfer_cutlass.py 234-252).
    "bf16-flashinfer-cutlass": {"0.5.19": D, "0.5.20": D, "0.5.21": A, "0.5.22": A, "0.5.23": A},
    # 0.5.19: the limit never reaches cutlass_fused_moe (modelopt_quant.py 3005-3031; flashinfer_cutlass.py 234-252).
    "modelopt-nvfp4-cutlass": {"0.5.19": D, "0.5.20": D, "0.5.21": A, "0.5.22": A, "0.5.23": A},
    # gemm1_clamp_limit / g1_alphas to trtllm-gen, whose Swiglu clamps before the sigmoid
    # (0.5.19: modelopt_quant.py 2599-2611, 2924, 2944; flashinfer_trtllm.py 1156 / 1197).
    "modelopt-nvfp4-trtllm": {"0.5.19": A, "0.5.20": A, "0.5.21": A, "0.5.22": A, "0.5.23": A},
    # block-scale kernels get it (pre-SiLU: APPROX); the per-tensor FP8 kernel takes no clamp, so
    # the path is as bad as DROPPED. 0.5.19: create_moe_runner sets _owns_moe_runner (fp8.py 2393),
    # process_weights_after_loading 2187-2191 -> setattr(layer, f"_flashinfer_trtllm_{name}") 2218,
    # apply 2634; flashinfer_trtllm.py 763 (block_quant) -> 816 / 854; per-tensor 929.
    "fp8-trtllm": {"0.5.19": D, "0.5.20": D, "0.5.21": D, "0.5.22": D, "0.5.23": D},
    # the BF16 body asserts num_fused_shared_experts == 0 (flashinfer_trtllm.py 1292 in 0.5.19, 1723 in 0.5.23),
    # and it holds: the server arguments force --disable-shared-experts-fusion for --moe-runner-backend
    # flashinfer_trtllm (arg_groups/overrides.py 1539 in 0.5.19, 1590 in 0.5.20, 1547 in 0.5.23;
    # fusion_overrides), so the kernel decides: trtllm_bf16_moe takes no clamp argument
    "trtllm-bf16": {"0.5.19": D, "0.5.20": D, "0.5.21": D, "0.5.22": D, "0.5.23": D},
    "flashinfer-cutedsl": {"0.5.19": D, "0.5.20": D, "0.5.21": D, "0.5.22": D, "0.5.23": D},  # 0.5.19: no clamp argument on any entry (flashinfer_cutedsl.py 353-369, 656-668)
    # The server does not start for Ling: handle_a2a_moe (run at startup by arg_groups/pipeline.py
    # 312 / 277 / 283 / 295 in 0.5.20 / 0.5.21 / 0.5.22 / 0.5.23) runs validate_flashinfer_megamoe_model
    # under `if a2a_backend == "flashinfer_megamoe":` (arg_groups/moe_hook.py 264-265 in 0.5.20,
    # 269-270 in 0.5.21, 274-275 in 0.5.22, 315-316 in 0.5.23), whose validated_architectures lack
    # BailingMoeV3ForCausalLM and whose `if not any(...)` raises ValueError (moe_hook.py 209-216,
    # 214-221, 219-226, 255-262). The kernel alone would drop the limit (DROPPED): gate_up_clamp =
    # moe_runner_config.swiglu_limit (None for Ling): flashinfer_megamoe.py 358 (0.5.20/0.5.21),
    # 376 (0.5.22); 0.5.23 via _nvfp4_megamoe_activation_kwargs 350-352. No file in 0.5.19.
    "flashinfer-megamoe": {"0.5.19": X, "0.5.20": N, "0.5.21": N, "0.5.22": N, "0.5.23": N},
    # clamp_limit = gemm1_clamp_limit only if gemm1_alpha is set, else swiglu_limit (0.5.19: marlin.py
    # 200-204; fused_marlin_moe.py 349-350).
    "marlin": {"0.5.19": D, "0.5.20": D, "0.5.21": D, "0.5.22": D, "0.5.23": D},
    "wna16-marlin": {"0.5.19": D, "0.5.20": D, "0.5.21": D, "0.5.22": D, "0.5.23": D},  # 0.5.19: clamp_limit=swiglu_limit (compressed_tensors_wNa16_moe.py 474, 494)
    # passes gemm1_clamp_limit, but it is used only when alpha is set. 0.5.19: _run_masked_gemm 723 ->
    # _varlen_deep_gemm_silu_mul_quant 1406, whose "if gemm1_alpha is not None" (1428) is skipped and
    # the plain fused SiLU + quant runs (1504-1512); the contiguous GEMM's _legacy_silu_and_mul (478)
    # takes no limit.
    "deep-gemm": {"0.5.19": D, "0.5.20": D, "0.5.21": D, "0.5.22": D, "0.5.23": D},
    "deep-gemm-contiguous": {"0.5.19": D, "0.5.20": D, "0.5.21": D, "0.5.22": D, "0.5.23": D},
    "humming": {"0.5.19": D, "0.5.20": D, "0.5.21": D, "0.5.22": D, "0.5.23": D},  # 0.5.19: reads only swiglu_limit (humming.py 155, 381-400)
    "triton-kernels": {"0.5.19": D, "0.5.20": D, "0.5.21": D, "0.5.22": D, "0.5.23": D},  # 0.5.19: Ling has no bias; that call takes no clamp (triton_kernels.py 133-138)
    # the clamp appears only in the alpha-set and SiTU branches (0.5.19: fused_moe_native.py 39-40,
    # 85-86, 131-141; reached from unquant.py forward_cpu 1021-1029).
    "fused-moe-native": {"0.5.19": D, "0.5.20": D, "0.5.21": D, "0.5.22": D, "0.5.23": D},
    # the Intel AMX branch of UnquantizedFusedMoEMethod.forward_cpu passes gemm1_alpha and
    # gemm1_clamp_limit positionally to torch.ops.sgl_kernel.fused_experts_cpu (unquant.py 1000 /
    # 1131 / 1170 / 1205 / 1361), a compiled sgl-kernel op whose form the sink table does not hold.
    "cpu-amx": {"0.5.19": U, "0.5.20": U, "0.5.21": U, "0.5.22": U, "0.5.23": U},
    # NPUSwigluStepAndMul: silu(gate).clamp(max=L) * up.clamp(-L, L) on ascend_tp (0.5.19: ascend.py
    # 128-133; npu/moe/activation.py 197-201). Its DeepEP, int8 and MXFP8 branches build kernels
    # that take no limit (ascend.py 92-99, 114-123), which are not sinks: not judged here.
    "ascend": {"0.5.19": E, "0.5.20": E, "0.5.21": E, "0.5.22": E, "0.5.23": E},
    # an assert on routing_method_type fails first for Ling, whatever the limit (issue 36: UNUSABLE;
    # 0.5.19: compressed_tensors_w4a4_mxint4_moe.py 320-321; 317 / 316 / 315 / 322 later); the path
    # alone passes gemm1_clamp_limit to trtllm_mxint4_block_scale_moe (pre-SiLU trtllm-gen form, 340, 346-348).
    "mxint4-trtllm": {"0.5.19": N, "0.5.20": N, "0.5.21": N, "0.5.22": N, "0.5.23": N},
    # the routed TRT-LLM FP4 kernel gets the limit (stored per expert), pre-SiLU: mq = modelopt_quant.py,
    # mq 2599-2612 / 2673-2686 / 2766-2779 / 2778-2791 / 2848-2877 -> flashinfer_trtllm.py 1156 / 1423 /
    # 1426 / 1493 / 1569 (the call at 1146 / 1413 / 1416 / 1483 / 1593).
    "modelopt-nvfp4-trtllm-routed": {"0.5.19": A, "0.5.20": A, "0.5.21": A, "0.5.22": A, "0.5.23": A},
    # the CuTe-DSL wrapper takes no clamp: flashinfer_cutedsl.py 353-368 (built with Swiglu, 232),
    # wrapper.run 493-508 (0.5.19) / 495-510 (0.5.20+).
    "modelopt-nvfp4-cutedsl": {"0.5.19": D, "0.5.20": D, "0.5.21": D, "0.5.22": D, "0.5.23": D},
    # marlin.py 200-204 (205-209 in 0.5.23): clamp_limit = gemm1_clamp_limit only if alpha is set, else
    # swiglu_limit (None); mq returns before the clamp setup (2527-2528 ... 2764-2765).
    "modelopt-nvfp4-marlin": {"0.5.19": D, "0.5.20": D, "0.5.21": D, "0.5.22": D, "0.5.23": D},
    # SM100: the TRT-LLM-gen kernel gets the limit with GPT-OSS alpha 1.702 / beta 1.0 substituted
    # (mxfp4.py 708-717): 0.5.19 inline in apply (mxfp4.py 1785, clamp 1795); 0.5.20+ the registry
    # entry dispatches on the quant info type to _fused_experts_flashinfer_mxfp4_sm100_trtllm_gen
    # (flashinfer_trtllm.py 1194 / 1195 / 1238 / 1306, the limit at 1204 / 1205 / 1248 / 1316).
    "mxfp4-sm100-trtllm": {"0.5.19": A, "0.5.20": A, "0.5.21": A, "0.5.22": A, "0.5.23": A},
    "hpc-ops": {"0.5.19": R, "0.5.20": R, "0.5.21": R, "0.5.22": R, "0.5.23": R},  # 0.5.19: ValueError when the limit is set (hpc_ops.py 121, called at 155)
    # entered by name (the dispatch does not reach it): 0.5.23 MoeLoraRunner._admit raises on the
    # limit (lora/moe/runner.py 247-256); before, the LoRA wrapper's Triton runner with LoRA hooks,
    # which pass gemm1_limit to the post-SiLU clamp (fused_moe.py 373 in 0.5.19; issue 36)
    "lora-moe": {"0.5.19": E, "0.5.20": E, "0.5.21": E, "0.5.22": E, "0.5.23": R},
}


#: release -> line of the literal ``gemm1_clamp_limit=None`` in compressed_tensors_w4a4_nvfp4_moe.py
TRTLLM_ASSERT_LINE = {"0.5.19": 310, "0.5.20": 309, "0.5.21": 320, "0.5.22": 320, "0.5.23": 324}
TRTLLM_NONE_LINE = {"0.5.19": 332, "0.5.20": 331, "0.5.21": 342, "0.5.22": 342, "0.5.23": 346}
#: release -> batch_invariant_ops.py lines: MIN_DEEPGEMM_DIM = 16, and the re-raise
DEEPGEMM_LINES = {"0.5.19": (281, 261), "0.5.20": (298, 271), "0.5.21": (298, 271), "0.5.22": (298, 271),
                  "0.5.23": (298, 271)}
#: release -> line of ``_is_dynamic_token_w8a8`` where a weight-only config crashes (the "crash"
#: releases of quant_rules.NVFP4_MOE_SCHEMES)
W4A16_CRASH_LINE = {"0.5.20": 493, "0.5.21": 498}
#: every release-keyed table of this file (rows -> {release: expected}) and the releases it covers
KEYED = {"EXPECTED": (EXPECTED, VERSIONS),
         "lines": ({"TRTLLM_NONE_LINE": TRTLLM_NONE_LINE, "TRTLLM_ASSERT_LINE": TRTLLM_ASSERT_LINE,
                    "DEEPGEMM_LINES": DEEPGEMM_LINES}, VERSIONS),
         "crash": ({"W4A16_CRASH_LINE": W4A16_CRASH_LINE}, tuple(qr.serving_releases("crash")))}


def verdicts(audits: dict[str, dict[str, sa.PathResult]], path: str) -> dict[str, str]:
    """``{release: verdict}`` of one path over every audited release (the shape of EXPECTED's rows)."""
    return {v: rows[path].verdict.value for v, rows in audits.items()}


@pytest.fixture(scope="module")
def audits() -> dict[str, dict[str, sa.PathResult]]:
    return {v: {r.path: r for r in sa.audit_tree(released(v))} for v in VERSIONS}


def test_every_catalogued_path_is_expected():
    assert {p["id"] for p in sa.catalog()["paths"]} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(KEYED))
def test_every_release_is_expected(name):
    """Each row names every audited release once: a new release's missing keys are listed here."""
    table, releases = KEYED[name]
    assert release_gaps(table, releases) == {}, "add the new release's key to these rows"


@pytest.mark.parametrize("path", sorted(EXPECTED))
def test_verdicts_per_version(audits, path):
    assert verdicts(audits, path) == EXPECTED[path], {v: audits[v][path].rule for v in VERSIONS}


# --- startup validations: FlashInfer MegaMoE refuses Ling's architecture -----------------------
MOE_HOOK = "sglang/srt/arg_groups/moe_hook.py"
#: the paths run with the flashinfer_megamoe backend, and their verdicts from the kernel alone in
#: 0.5.23 (the hand-read DROPPED of EXPECTED's comment; the FP8 one passes the limit to
#: fused_experts(), fp8.py 3160, whose form the sink table does not hold)
MEGAMOE_KERNEL = {"flashinfer-megamoe": D, "ModelOptNvFp4FusedMoEMethod/flashinfer_megamoe": D,
                  "ModelOptNvFp4OnlineFusedMoEMethod/flashinfer_megamoe": D,
                  "Fp8MoEMethod/flashinfer_megamoe": U}
#: the raise of validate_flashinfer_megamoe_model and its guard in handle_a2a_moe, per release (read
#: by hand: moe_hook.py `raise ValueError(` after `if not any(architecture in validated_architectures`)
MEGAMOE_RAISE = {"0.5.20": (212, 264), "0.5.21": (217, 269), "0.5.22": (222, 274), "0.5.23": (258, 315)}


@pytest.mark.parametrize("version", [v for v in VERSIONS if v in MEGAMOE_RAISE])
def test_megamoe_paths_refused_at_startup(audits, version):
    """Every flashinfer_megamoe path is UNUSABLE in the releases with the validation, at its raise,
    with the guard's line in the rule; every other path's verdict is untouched by the rule."""
    raise_line, guard = MEGAMOE_RAISE[version]
    for path in MEGAMOE_KERNEL:
        r = audits[version][path]
        assert (r.verdict.value, r.file, r.line) == (N, "arg_groups/moe_hook.py", raise_line), r.rule
        assert f"arg_groups/moe_hook.py:{guard}" in r.rule and "validate_flashinfer_megamoe_model" in r.rule
    assert [r.path for r in audits[version].values() if "refuses Ling at startup" in r.rule] \
        == [p for p in audits[version] if p in MEGAMOE_KERNEL]


@pytest.mark.parametrize("edit", [
    ('        "BeamForCausalLM",\n', '        "BeamForCausalLM",\n        "BailingMoeV3ForCausalLM",\n'),
    ("        validate_flashinfer_megamoe_model(server_args)\n", ""),
], ids=["allowlist-has-ling", "no-validation-call"])
def test_megamoe_verdict_back_to_the_kernel(copy23, edit):
    """With Ling in validated_architectures (moe_hook.py 240-254 in 0.5.23), or without the call at
    316, the server starts and the megamoe paths get what the kernel decides."""
    edit_once(copy23, MOE_HOOK, *edit)
    assert [r.validator for r in startup_refusals(copy23.root)] == []
    got = {r.path: r.verdict.value for r in sa.audit_tree(copy23, list(MEGAMOE_KERNEL))}
    assert got == MEGAMOE_KERNEL


def test_versions_read_from_the_wheels():
    assert [released(v).version for v in VERSIONS] == list(VERSIONS)


@pytest.mark.parametrize("version", VERSIONS)
def test_trtllm_routing_assert_is_located(audits, version):
    # the assert Bailing fails decides (UNUSABLE at its line); the literal None the path alone
    # would pass is kept in the rule (TRTLLM_NONE_LINE: where it is set)
    r = audits[version]["nvfp4-w4a4-trtllm"]
    assert r.rule.startswith("raises for Ling whatever the limit: assert layer.routing_method_type is not None fails")
    assert r.file.endswith("compressed_tensors_w4a4_nvfp4_moe.py") and r.line == TRTLLM_ASSERT_LINE[version]
    assert "(the path alone: DROPPED: literal gemm1_clamp_limit=None at " in r.rule
    assert f"compressed_tensors_w4a4_nvfp4_moe.py:{TRTLLM_NONE_LINE[version]}," in r.rule


def test_cutlass_evidence_points_at_the_fused_call(audits):
    r = audits["0.5.23"]["nvfp4-w4a4-cutlass"]
    assert (r.file, r.line, r.function) == ("layers/moe/moe_runner/flashinfer_cutlass.py", 371,
                                            "_run_flashinfer_cutlass")
    assert "SwigluBias" in r.rule
    assert audits["0.5.20"]["nvfp4-w4a4-cutlass"].rule.endswith("no clamp argument (swiglu_limit)")


def test_alpha_branch_mention_is_dead_for_ling(audits):
    r = audits["0.5.23"]["marlin"]
    assert "layers/moe/moe_runner/marlin.py:206" in r.dead_mentions
    assert "swiglu_limit" in r.rule


def test_json_cli(capsys):
    assert report.main([str(released("0.5.23").root), "--json"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert {tuple(sorted(r)) for r in rows} == {("catalogued", "file", "found_by", "function", "line", "path", "rule",
                                                 "sglang_version", "verdict")}
    assert {r["path"]: r["verdict"] for r in rows}["nvfp4-w4a4-cutlass"] == "APPROX"


def test_matrix_figure(tmp_path, audits):
    out = report.matrix_figure([r for v in VERSIONS for r in audits[v].values()], tmp_path / "m.png")
    assert out.stat().st_size > 10_000


# --- a new release, end to end -------------------------------------------------------------------
def test_a_new_release_needs_only_its_keys(audits, tmp_path, monkeypatch):
    """The steps of CONTRIBUTING.md's "Adding an SGLang release", on a copy of the last release
    registered as 0.5.99 in a fresh cache (its unpacked tree and the discovery file): once found,
    it is in the default audit; EXPECTED's rows and the serving facts then lack exactly its key,
    and one key each (the last release's values: the copy behaves like it) is all it takes: the
    expected verdicts match its audit and the messages' ranges include it, with no other edit."""
    new, last = "0.5.99", VERSIONS[-1]
    src = released(last)  # from the real cache, before the cache moves
    cache = tmp_path / "cache"
    tree = copy_tree(src, cache / "src" / f"sglang-{new}")
    (tree.package / "_version.py").write_text(f"__version__ = version = '{new}'\n")
    (tree.root / ".nvfp4study-unpacked").write_text("a copy of the last release\n")  # source._MARKER
    (cache / "bailing_releases.json").write_text(json.dumps({**rel.shipped(), "releases": [*VERSIONS, new]}))
    monkeypatch.setenv("NVFP4STUDY_CACHE", str(cache))
    # step 1, discovery: the study's default audit_versions now include it, and its source opens
    found = rel.expand_versions([rel.ALL_BAILING])
    assert found == [*VERSIONS, new] and unpack_wheel(new, download=False).version == new
    # step 2, expected verdicts: every row lacks exactly the new key; with it, they match the audit
    assert release_gaps(EXPECTED, found) == {p: {"missing": [new], "extra": []} for p in EXPECTED}
    expected = {p: {**row, new: row[last]} for p, row in EXPECTED.items()}
    assert release_gaps(expected, found) == {}
    runs = {**audits, new: {r.path: r for r in sa.audit_tree(unpack_wheel(new, download=False))}}
    assert {p: verdicts(runs, p) for p in expected} == expected
    # step 3, release-keyed facts: one key; the rendered ranges and the serving matrix follow
    assert qr.unkeyed_releases(found) == [new]
    monkeypatch.setitem(qr.NVFP4_MOE_SCHEMES, new, qr.NVFP4_MOE_SCHEMES[last])
    assert qr.unkeyed_releases(found) == []
    msg = scheme_messages()
    assert "0.5.22-0.5.99 serve it through the W4A16" in msg["W4A16"]
    assert "all of 0.5.20-0.5.99; below Blackwell 0.5.20-0.5.21 refuse, 0.5.22-0.5.99 fall back" in msg["W4A4"]
    assert rel.version_span(["0.5.23", new]) == f"0.5.23-{new}"  # over the discovered releases
    assert {r["version"] for r in qr.serving_matrix("W4A16", True)} == {"0.5.20", "0.5.21", "0.5.22", "0.5.23", new}


# --- traps, on small synthetic trees -------------------------------------------------------------
SINK_MOD = "sglang/srt/layers/moe/toy.py"


def _spec(fn: str) -> dict:
    return {"id": "toy", "label": "toy", "steps": [f"layers/moe/toy.py::{fn}"]}


def test_literal_none_with_a_sibling_carrying_the_value(tmp_path):
    t = mini_tree(tmp_path, "0.5.23", {SINK_MOD: """
        def run(runner_config):
            return trtllm_fp4_block_scale_moe(gemm1_beta=runner_config.gemm1_clamp_limit,
                                              gemm1_clamp_limit=None)
    """})
    r = sa.audit_path(t, _spec("run"))
    assert r.verdict.value == "DROPPED"
    assert "passed as gemm1_beta" in r.rule and "literal None" in r.rule


def test_value_used_only_when_alpha_is_set(tmp_path):
    t = mini_tree(tmp_path, "0.5.23", {SINK_MOD: """
        def run(runner_config):
            lim = runner_config.gemm1_clamp_limit if runner_config.gemm1_alpha is not None else None
            return fused_marlin_moe(clamp_limit=lim, gemm1_alpha=runner_config.gemm1_alpha)
    """})
    r = sa.audit_path(t, _spec("run"))
    assert r.verdict.value == "DROPPED" and r.dead_mentions == ["layers/moe/toy.py:3"]


@pytest.mark.parametrize("act,verdict", [("ActivationType.SwigluStep", "EXACT"), ("ActivationType.Swiglu", "APPROX")])
def test_the_sink_decides_the_form(tmp_path, act, verdict):
    t = mini_tree(tmp_path, "0.5.23", {SINK_MOD: f"""
        def run(runner_config):
            return cutlass_fused_moe(swiglu_limit=runner_config.gemm1_clamp_limit, activation_type={act})
    """})
    assert sa.audit_path(t, _spec("run")).verdict.value == verdict


def test_refusal(tmp_path):
    t = mini_tree(tmp_path, "0.5.23", {SINK_MOD: """
        def run(runner_config):
            if runner_config.gemm1_alpha is not None or runner_config.gemm1_clamp_limit is not None:
                raise ValueError("no clamp here")
            return cutlass_fused_moe()
    """})
    r = sa.audit_path(t, _spec("run"))
    assert (r.verdict.value, r.line) == ("REFUSED", 4)


def test_an_activation_without_the_limit_is_a_dropped_branch(tmp_path):
    # issue 23 (first-sample hand readings of the Ascend paths): a reachable branch runs an
    # activation the sink table knows takes no limit, beside one that clamps
    t = mini_tree(tmp_path, "0.5.23", {SINK_MOD: """
        from sglang.srt.hardware_backend.npu.moe.activation import NPUSwigluQuant, NPUSwigluStepAndMul

        def run(config, kernel):
            if kernel.int8:
                act = NPUSwigluQuant()
            else:
                act = NPUSwigluStepAndMul(clamp_limit=config.gemm1_clamp_limit)
            return act
    """})
    r = sa.audit_path(t, _spec("run"))
    assert (r.verdict.value, r.sink, r.line) == ("DROPPED", "NPUSwigluQuant", 6)
    # the same name from another module is another function
    t2 = mini_tree(tmp_path / "b", "0.5.23", {SINK_MOD: """
        from mylib import NPUSwigluQuant

        def run(config):
            NPUSwigluQuant()
            return cutlass_fused_moe(swiglu_limit=config.gemm1_clamp_limit, activation_type=ActivationType.SwigluStep)
    """})
    assert sa.audit_path(t2, _spec("run")).verdict.value == "EXACT"


@pytest.mark.parametrize("other,verdict", [
    ("cutlass_fused_moe(swiglu_limit=config.gemm1_clamp_limit, activation_type=ActivationType.SwigluStep)", "EXACT"),
    ("fused_experts_mxfp8(gemm1_limit=config.gemm1_clamp_limit, gate_up_interleaved=True)", "UNUSABLE"),
])
def test_a_kernel_that_raises_for_ling_is_a_branch_not_taken(tmp_path, other, verdict):
    # issue 23 (first-sample hand readings of Fp8MoEMethod/triton): the MXFP8 kernel raises on
    # Ling's gate_up_interleaved=True, so its pre-SiLU form is not the path's
    t = mini_tree(tmp_path, "0.5.23", {SINK_MOD: f"""
        def run(config, quant_info):
            if quant_info.use_mxfp8:
                return fused_experts_mxfp8(gemm1_limit=config.gemm1_clamp_limit,
                                           gate_up_interleaved=config.gate_up_interleaved)
            return {other}
    """})
    r = sa.audit_path(t, _spec("run"))
    assert r.verdict.value == verdict
    assert "fused_experts_mxfp8() raise" in r.rule or verdict == "UNUSABLE"


AITER_RUNNER = """
    from aiter import ActivationType

    # aiter's ActivationType.Swiglu is SwiGLU-OAI with alpha and the (up + beta) bias baked in
    _ACTS = {"silu": "Silu", "swiglu": "Swiglu"}

    class Core:
        def run(self, quant_info: AiterMoeQuantInfo):
            from aiter.fused_moe import fused_moe
            extra = {}
            if quant_info.swiglu_limit > 0:
                extra["swiglu_limit"] = quant_info.swiglu_limit
            act = getattr(ActivationType, _ACTS.get(self.config.activation, "Gelu"))
            return fused_moe(activation=act, **extra)
"""
AITER_METHOD = """
    from dataclasses import replace

    class Method:
        def create_moe_runner(self, layer, moe_runner_config):
            self.runner = MoeRunner(MoeRunnerBackend.AITER, {cfg})

        def apply(self, layer, x):
            quant_info = AiterMoeQuantInfo(swiglu_limit={limit})
            return self.runner.run(x, quant_info)
"""


@pytest.mark.parametrize("cfg,limit,stated,verdict", [
    ('replace(moe_runner_config, activation="swiglu")', "self.moe_runner_config.gemm1_clamp_limit or 0.0", True, "APPROX"),
    ('replace(moe_runner_config, activation="swiglu")', "self.moe_runner_config.gemm1_clamp_limit or 0.0", False, "UNDECIDED"),
    ('replace(moe_runner_config, activation="swiglu")', "self.moe_runner_config.swiglu_limit or 0.0", True, "DROPPED"),
    ("moe_runner_config", "self.moe_runner_config.gemm1_clamp_limit or 0.0", True, "UNDECIDED"),
])
def test_the_activation_a_method_gives_its_runner_decides_the_form(tmp_path, cfg, limit, stated, verdict):
    # issue 23 (first-sample hand readings of Mxfp4MoEMethod/aiter and QuarkW4A8MXFp4MoE/aiter
    # 0.5.22): the method replaces the runner config's activation with "swiglu", the runner maps it
    # to aiter's Swiglu, whose GPT-OSS form SGLang's aiter.py states in a comment; a limit of 0.0
    # never reaches the kernel (Fp8MoEMethod/aiter 0.5.20); Ling's own "silu" (Silu) has no stated form
    runner = AITER_RUNNER if stated else AITER_RUNNER.replace("is SwiGLU-OAI", "is something")
    t = mini_tree(tmp_path, "0.5.23", {"sglang/srt/layers/moe/moe_runner/aiter.py": runner,
                                       SINK_MOD: AITER_METHOD.format(cfg=cfg, limit=limit)})
    spec = {"id": "toy", "label": "toy", "runner_at": 2,
            "steps": ["layers/moe/toy.py::Method.create_moe_runner", "layers/moe/toy.py::Method.apply",
                      "layers/moe/moe_runner/aiter.py::Core.run"]}
    r = sa.audit_path(t, spec)
    assert r.verdict.value == verdict, r.rule
    if verdict == "APPROX":
        assert "activation Swiglu -> pre-SiLU form (layers/moe/moe_runner/aiter.py:4)" in r.rule


@pytest.mark.parametrize("elsewhere,verdict", [("", "UNUSABLE"), ("        self.fused_experts = None\n", "EXACT"),
                                               ("    fused_experts = None\n", "EXACT")])
def test_an_attribute_never_set_anywhere_raises(tmp_path, elsewhere, verdict):
    # issue 23 (first-sample hand reading of GGUFMoEMethod/direct 0.5.19): apply() asserts on
    # self.fused_experts, which no file of the tree ever sets: AttributeError whatever the limit
    t = mini_tree(tmp_path, "0.5.23", {SINK_MOD: """
        class Method:
            def apply(self, config):
                assert self.fused_experts is None
                return cutlass_fused_moe(swiglu_limit=config.gemm1_clamp_limit, activation_type=ActivationType.SwigluStep)
    """, "sglang/srt/layers/other.py": "class Base:\n    def __init__(self):\n        pass\n" + (
        "class Other:\n" + elsewhere if elsewhere.startswith("    f") else "class Other:\n    def f(self):\n" + elsewhere
        if elsewhere else "")})
    r = sa.audit_path(t, {"id": "toy", "label": "toy", "steps": ["layers/moe/toy.py::Method.apply"]})
    assert r.verdict.value == verdict
    if verdict == "UNUSABLE":
        assert (r.line, r.rule.endswith("self.fused_experts is never set anywhere in the tree")) == (4, True)


def test_a_runner_entry_takes_the_worst_form_its_callers_hand_it():
    # issue 23 (first-sample hand readings of fused:flashinfer/flashinfer_cutlass 0.5.23, APPROX,
    # and core:aiter 0.5.21, DROPPED): the entry alone cannot know the quant info's limit; the
    # method paths run with its backend that reach the same kernel decide, the worst first
    def row(path, verdict, sink, rule="r"):
        return sa.PathResult(path=path, label=path, verdict=sa.ClampVerdict(verdict), rule=rule, file="f.py",
                             function="g", line=3, sglang_version="0.5.23", sink=sink)
    alone = "k(): clamp argument undecided (?) | a runner-level entry alone: the value comes from the quant info"
    specs = [{"id": "fused:none/be"}, {"id": "card", "via": "A/be"}, {"id": "B/be"}, {"id": "C/be"}, {"id": "D/other"},
             {"id": "core:none2"}]
    rows = [row("fused:none/be", "UNDECIDED", "k", alone), row("card", "EXACT", "k"), row("B/be", "APPROX", "k"),
            row("C/be", "DROPPED", "other_kernel"), row("D/other", "DROPPED", "k"),
            row("core:none2", "UNDECIDED", "k", alone)]
    out = sa.entries_decided_by_callers(rows, specs)
    assert out[0].verdict.value == "APPROX" and "2 method path(s)" in out[0].rule and "the worst B/be" in out[0].rule
    assert [r.verdict.value for r in out[1:]] == ["EXACT", "APPROX", "DROPPED", "DROPPED", "UNDECIDED"]


def test_absent_path(tmp_path):
    t = mini_tree(tmp_path, "0.5.23")
    assert sa.audit_path(t, _spec("run")).verdict.value == "ABSENT"


# --- the other checks ---------------------------------------------------------------------------
def test_min_deepgemm_dim_and_scales():
    for v in VERSIONS:
        c = extra_checks(released(v))
        md = c["min_deepgemm_dim"]
        # batch_invariant_ops.py: MIN_DEEPGEMM_DIM = 16 at 281 (0.5.19) / 298; re-raise 261 / 271
        line, reraise = DEEPGEMM_LINES[v]
        assert (md["value"], md["line"], md["guard"], md["n32_to_deepgemm"]) == (16, line, "N >= MIN_DEEPGEMM_DIM", True)
        assert md["reraise_line"] == reraise
        assert {k: x["alloc"] for k, x in c["input_global_scales"].items()} == {
            "w13_input_global_scale": "torch.empty", "w2_input_global_scale": "torch.empty"}
        assert c["gate_up_scale_policy"]["W4A4"]["action"] == "warn"
        assert c["bailing"]["passes"] == ["gemm1_clamp_limit"]
    c23 = extra_checks(released("0.5.23"))
    assert c23["input_global_scales"]["w13_input_global_scale"]["line"] == 152
    assert c23["gate_up_scale_policy"]["W4A16"]["action"] == "raise"


def test_w4a16_scheme_per_version():
    from nvfp4study.sglang.checks import NVFP4_ACTS, NVFP4_WEIGHTS

    # the serving facts the checkpoint audit states (quant_rules.NVFP4_MOE_SCHEMES), read again
    # from each release's code, and every discovered release from the first one read has them
    assert qr.unkeyed_releases(list(VERSIONS)) == []
    for v in qr.serving_releases("crash"):
        r = moe_scheme_for(released(v), NVFP4_WEIGHTS, None)
        assert r["error"] == "AttributeError: 'NoneType' object has no attribute 'num_bits'"
        assert (r["function"], r["line"]) == ("_is_dynamic_token_w8a8", W4A16_CRASH_LINE[v])
        assert moe_scheme_for(released(v), NVFP4_WEIGHTS, NVFP4_ACTS)["scheme"] == "CompressedTensorsW4A4Nvfp4MoE"
    for v in qr.serving_releases("marlin"):
        assert moe_scheme_for(released(v), NVFP4_WEIGHTS, None)["scheme"] == "CompressedTensorsW4A16Nvfp4MoE"
        fallback = moe_scheme_for(released(v), NVFP4_WEIGHTS, NVFP4_ACTS, capability=90)
        assert fallback == {"scheme": "CompressedTensorsW4A16Nvfp4MoE", "kwargs": {"has_input_global_scale": True}}


def test_shared_fusion_veto():
    r = shared_fusion(released("0.5.23"), {"a": ["re:.*shared_experts.*"], "b": ["lm_head"]})
    assert r["evaluations"]["a"]["fusion_disabled"] is True
    assert r["evaluations"]["b"]["fusion_disabled"] is False
    assert r["considers_clamp_lists"] is False


# --- source trees -------------------------------------------------------------------------------
def test_source_tree_validation(tmp_path):
    with pytest.raises(NotAnSGLangTree):
        open_tree(tmp_path)
    t = released("0.5.23")
    assert find_root(t.package) == t.root and find_root(t.srt) == t.root
    assert read_version(t.root) == "0.5.23"
    mini = mini_tree(tmp_path / "x", "9.9.9")
    assert mini.version == "9.9.9"


def test_installed_tree_needs_sglang():
    with pytest.raises(SGLangNotInstalled):
        installed_tree()  # the study's own environment has no sglang
