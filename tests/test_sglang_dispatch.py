"""The clamp audit's paths are found by following SGLang's dispatch, not by a list of names:
checked on released trees against lines read by hand, and on copies edited to move the code."""

from __future__ import annotations

import pytest

from nvfp4study.sglang import audit as sa
from nvfp4study.sglang import dispatch as dp
from nvfp4study.sglang import platforms as pf
from nvfp4study.sglang import quant_methods as qm
from nvfp4study.sglang.code_index import CodeIndex, class_defined
from sglang_fixtures import VERSIONS, copy23_fixture, edit_once, released  # noqa: F401  (the copy23 fixture)

SRT = "sglang/srt/"
W4A4 = "layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4_moe.py"


def _keys(tree) -> dict[str, dp.DerivedPath]:
    return {p.key: p for p in dp.derive_paths(tree.root)}


def test_the_cards_path_is_derived_step_by_step():
    p = _keys(released("0.5.23"))["CompressedTensorsW4A4Nvfp4MoE/flashinfer_cutlass"]
    # read by hand in 0.5.23: __init__ 38, create_weights 58 and create_moe_runner 294 (MoeRunner(MoeRunnerBackend.
    # FLASHINFER_CUTLASS) at 307; FusedMoE.__init__ calls them at layer.py 561 and 576), then the loader's
    # process_weights_after_loading 169, apply_weights 311, and the fused func registered for
    # ("none", "flashinfer_cutlass") at moe_runner/flashinfer_cutlass.py:399
    assert p.steps == [f"{W4A4}::CompressedTensorsW4A4Nvfp4MoE.{m}" for m in
                       ("__init__", "create_weights", "create_moe_runner", "process_weights_after_loading",
                        "apply_weights")] + [
        "layers/moe/moe_runner/flashinfer_cutlass.py::fused_experts_none_to_flashinfer_cutlass"]
    assert p.trail[0].startswith("layers/quantization/__init__.py:") and "'compressed-tensors' -> CompressedTensorsConfig" in p.trail[0]
    assert "get_moe_scheme" in p.trail[0]
    assert p.trail[1] == ("layers/moe/moe_runner/flashinfer_cutlass.py:399 @register_fused_func('none', "
                          "'flashinfer_cutlass') -> fused_experts_none_to_flashinfer_cutlass")
    assert p.lost is None
    # the backend's facts: its own predicate true, the TRT-LLM one false
    assert p.assume["is_flashinfer_cutlass"] is True and p.assume["is_flashinfer_trtllm"] is False


def test_backend_predicates_are_read_from_the_enum():
    # layers/moe/utils.py 0.5.23 133-139: is_flashinfer_trtllm is true for two members
    preds = dp.predicates(CodeIndex(released("0.5.23").root))
    assert preds["is_flashinfer_trtllm"] == {"flashinfer_trtllm", "experimental_sgl_trtllm"}
    assert preds["is_triton_kernels"] == {"triton_kernel"}


def test_registry_and_cores():
    code = CodeIndex(released("0.5.23").root)
    reg = dp.fused_registry(code)
    assert reg[("none", "marlin")] == [(SRT + "layers/moe/moe_runner/marlin.py", "fused_experts_none_to_marlin", 115)]
    assert reg[("flashinfer_megamoe", "flashinfer_megamoe")][0][0] == SRT + "layers/moe/flashinfer_megamoe.py"
    assert all(len(v) == 1 for v in reg.values())  # no key registered twice in a release
    cores = dp.runner_cores(code)
    assert cores["triton"][1:] == ("TritonRunnerCore", 101)  # runner.py 100-101
    assert cores["deep_gemm"][1] == "DeepGemmRunnerCore"


@pytest.mark.parametrize("version,line", [("0.5.19", 163), ("0.5.23", 178)])
def test_a_backend_without_runner_says_where_moe_runner_raises(version, line):
    # runner.py read by hand: "if self.runner_core is None and self.fused_func is None: raise
    # NotImplementedError(...requires a fused func...)" at 162-166 (0.5.19), 177-181 (0.5.23)
    assert dp.no_fused_func_raise(CodeIndex(released(version).root)) == line
    where = f"layers/moe/moe_runner/runner.py:{line}: no fused func and no runner core for 'cutlass'"
    (p,) = [p for p in dp.derive_paths(released(version).root) if p.key == "Fp8MoEMethod/cutlass"]
    assert p.lost is None and p.no_runner.startswith(where) and p.runner_at is None
    # Fp8MoEMethod never builds a MoeRunner for cutlass and calls its kernel itself (fp8.py, the
    # is_cutlass() branch of apply): judged on its own branches, the raise named in its trail
    r = sa.audit_tree(released(version), ["Fp8MoEMethod/cutlass"])[0]
    assert r.verdict.value == "DROPPED" and any(where in f for f in r.found_by), r.rule
    # a method that does run its runner there stays UNDECIDED at the raise: Fp8MoEMethod/triton's
    # apply reaches self.runner.run; without its runner steps and with the same loss it is lost
    (spec,) = [s for s in sa.path_specs(released(version)) if s["id"] == "Fp8MoEMethod/triton"]
    spec = {**spec, "steps": spec["steps"][:spec["runner_at"]], "runner_at": None, "no_runner": p.no_runner}
    r = sa.audit_path(released(version), spec)
    assert (r.verdict.value, r.file, r.line) == ("UNDECIDED", "layers/moe/moe_runner/runner.py", line), r.rule


@pytest.mark.parametrize("version", VERSIONS)
def test_wrappers_are_skipped_and_what_they_wrap_is_found(version):
    methods = qm.moe_methods(CodeIndex(released(version).root))
    # CompressedTensorsFusedMoEMethod.apply forwards to layer.scheme.apply_weights
    assert "CompressedTensorsFusedMoEMethod" not in methods
    assert {"CompressedTensorsW4A4Nvfp4MoE", "UnquantizedFusedMoEMethod", "Fp8MoEMethod",
            "ModelOptNvFp4FusedMoEMethod", "Mxfp4FlashinferCutlassMoEMethod"} <= set(methods)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_derived_path_is_audited_and_none_is_absent(version):
    results = sa.audit_tree(released(version))
    derived = {p.key for p in dp.derive_paths(released(version).root)}
    named = {e["via"] for e in sa.catalog()["paths"] if "via" in e}
    rows = {r.path: r for r in results}
    assert derived - named <= {r.path for r in results if not r.catalogued}
    # a path found in the code exists: it is never ABSENT, but for a runner core the code names
    # and never builds (runner_builds.core_never_built) and a /native path whose method is built only
    # where the CustomOp runs another forward (runner_builds.native_never_runs)
    assert all(r.verdict.value != "ABSENT" or (r.path.startswith("core:") and "core only when" in r.rule)
               or (r.path.endswith("/native") and "where the CustomOp runs another forward" in r.rule)
               for r in results if not r.catalogued)
    assert all(r.found_by for r in results if not r.catalogued)
    # a catalogued id is ABSENT only where its class or registry entry is not in the release
    for e in sa.catalog()["paths"]:
        if rows[e["id"]].verdict.value == "ABSENT" and "via" in e and "/" in e["via"] and ":" not in e["via"]:
            assert class_defined(released(version).root, e["via"].split("/")[0]) is None


def test_registered_function_renamed_is_still_followed(copy23):
    edit_once(copy23, SRT + "layers/moe/moe_runner/flashinfer_cutlass.py", "def fused_experts_none_to_flashinfer_cutlass(",
              "def some_new_name(")
    r = sa.audit_tree(copy23, ["nvfp4-w4a4-cutlass"])[0]
    assert r.verdict.value == "APPROX"
    assert any("-> some_new_name" in t for t in r.found_by)


def test_method_routed_to_another_backend(copy23):
    # the scheme's CUTLASS branch now builds a Triton runner: the catalogued CUTLASS path is not
    # reached any more (UNDECIDED, with the class's file:line), and the new path is audited
    edit_once(copy23, SRT + W4A4, "MoeRunnerBackend.FLASHINFER_CUTLASS, moe_runner_config", "MoeRunnerBackend.TRITON, moe_runner_config")
    rows = {r.path: r for r in sa.audit_tree(copy23)}
    cut = rows["nvfp4-w4a4-cutlass"]
    assert cut.verdict.value == "UNDECIDED"
    assert cut.rule.startswith(f"trail lost: CompressedTensorsW4A4Nvfp4MoE exists ({W4A4}:")
    assert "backend 'flashinfer_cutlass'" in cut.rule
    new = rows["CompressedTensorsW4A4Nvfp4MoE/triton"]
    assert not new.catalogued and new.verdict.value != "ABSENT"


def test_scheme_no_longer_constructed(copy23):
    # get_moe_scheme stops building the W4A4 scheme: the class is still there, so not ABSENT
    edit_once(copy23, SRT + "layers/quantization/compressed_tensors/compressed_tensors.py",
              "return CompressedTensorsW4A4Nvfp4MoE(", "return CompressedTensorsW4A16Nvfp4MoE(")
    r = sa.audit_tree(copy23, ["nvfp4-w4a4-cutlass"])[0]
    assert r.verdict.value == "UNDECIDED" and "was not seen to run it" in r.rule


def test_class_gone_is_absent(copy23):
    rel = "layers/quantization/mxfp4_flashinfer_cutlass_moe.py"
    edit_once(copy23, SRT + rel, "class Mxfp4FlashinferCutlassMoEMethod", "class Mxfp4Renamed")
    r = sa.audit_tree(copy23, ["mxfp4-cutlass"])[0]
    assert (r.verdict.value, r.rule) == ("ABSENT", "no class Mxfp4FlashinferCutlassMoEMethod in this release")


def test_derivation_follows_an_edit_in_place(copy23):
    before = {p.key for p in dp.derive_paths(copy23.root)}
    edit_once(copy23, SRT + W4A4, "MoeRunnerBackend.FLASHINFER_CUTLASS, moe_runner_config", "MoeRunnerBackend.TRITON, moe_runner_config")
    after = {p.key for p in dp.derive_paths(copy23.root)}
    assert "CompressedTensorsW4A4Nvfp4MoE/flashinfer_cutlass" in before - after
    assert "CompressedTensorsW4A4Nvfp4MoE/triton" in after - before


def test_setup_order_and_branch_facts_follow_the_code():
    rows = {r.path: r for r in sa.audit_tree(released("0.5.19"), ["fp8-trtllm", "triton"])}
    # create_moe_runner runs before process_weights_after_loading (it sets _owns_moe_runner, which
    # guards the TRT-LLM parameter setup at fp8.py 2187-2191), so the block-scale kernels are judged
    assert "trtllm_fp8_block_scale_moe() APPROX" in rows["fp8-trtllm"].rule
    # the Triton call Ling takes, not the ROCm MXFP8 branch (triton.py 188-194)
    assert (rows["triton"].line, rows["triton"].verdict.value) == (234, "EXACT")


@pytest.mark.parametrize("version, skip_line, site_line", [("0.5.21", 1051, 1060), ("0.5.22", 1050, 1059)])
def test_runner_core_never_built_is_absent(version, skip_line, site_line):
    # MoeRunner builds MarlinLoraRunnerCore only when lora_enabled (runner.py 118-124), and the one
    # MoeRunner(lora_enabled=True) (lora/layers.py) comes after FusedMoEWithLoRA returns into the
    # experimental dispatch for experimental_sgl_marlin (issue 23, hand readings part5, part6);
    # plain marlin reaches it, but only under --enable-lora, which the card's launch never sets
    # (moe_params.yaml shared.launch_off_flags; issue 36's ninth sample, J2): ABSENT as well, by that rule
    rows = {r.path: r for r in sa.audit_tree(released(version), ["core:experimental_sgl_marlin", "core:marlin"])}
    absent = rows["core:experimental_sgl_marlin"]
    assert absent.verdict.value == "ABSENT"
    assert f"lora/layers.py:{site_line} (returns at {skip_line})" in absent.rule
    marlin = rows["core:marlin"]
    assert marlin.verdict.value == "ABSENT" and "lora_enabled" in marlin.rule and "launch_off_flags" in marlin.rule


@pytest.mark.parametrize("version, line", [("0.5.20", 2524), ("0.5.23", 2984)])
def test_method_that_runs_another_backend_is_judged_on_it(version, line):
    # Fp8MoEMethod.create_moe_runner has no CUTLASS / CuTe-DSL path and builds a Triton runner
    # instead (fp8.py, "Fp8MoEMethod has no %s path"); Triton's fused_experts applies Ling's
    # post-SiLU clamp (issue 23, hand readings part2, part6)
    keys = ["Fp8MoEMethod/flashinfer_cutlass", "Fp8MoEMethod/flashinfer_cutedsl"]
    for r in sa.audit_tree(released(version), keys):
        assert (r.verdict.value, r.sink, r.file) == ("EXACT", "fused_experts", "layers/moe/moe_runner/triton.py")
        assert f"layers/quantization/fp8.py:{line} create_moe_runner runs" in " ".join(r.found_by)


def test_super_init_sets_the_flags_a_subclass_reads():
    # ModelOptNvFp4OnlineFusedMoEMethod.__init__ calls super().__init__, which sets
    # enable_flashinfer_trtllm_moe: the limit is stored as L / g1_alphas (modelopt_quant.py 2766-2779
    # in 0.5.21) and reaches the TRT-LLM kernel with Swiglu (hand readings part4, part8)
    rows = {r.path: r for r in sa.audit_tree(released("0.5.21"), [
        "ModelOptNvFp4OnlineFusedMoEMethod/flashinfer_trtllm", "ModelOptNvFp4OnlineFusedMoEMethod/flashinfer_cutlass"])}
    assert {k: r.verdict.value for k, r in rows.items()} == {
        "ModelOptNvFp4OnlineFusedMoEMethod/flashinfer_trtllm": "APPROX",
        "ModelOptNvFp4OnlineFusedMoEMethod/flashinfer_cutlass": "APPROX"}


def test_payload_passed_on_unknown_is_narrowed_by_the_callee(monkeypatch):
    # the experimental_sgl_trtllm fused func hands its quant_info on to
    # fused_experts_none_to_flashinfer_trtllm (lora/trtllm_lora_temp/sgl_backend.py 15-26 in 0.5.20),
    # whose isinstance dispatch takes the FP4 kernel for the NVFP4 payload, not the BF16/FP8 ones
    # (flashinfer_trtllm.py 1628-1636; hand reading part2: APPROX, read with the flag set). The fused
    # func is registered only when SGLANG_EXPERIMENTAL_LORA_OPTI is set (flashinfer_trtllm.py 1753-1755
    # in 0.5.20): the path's trail says so (issue 36; moe_params.yaml shared.env_gated_fused_func, here
    # "note": judged as if the flag were set; the shipped "unusable" stops at MoeRunner's raise)
    from nvfp4study.sglang import moe_params

    shared = {**moe_params.shared(), "env_gated_fused_func": "note"}
    monkeypatch.setattr(moe_params, "shared", lambda: shared)
    r = sa.audit_tree(released("0.5.20"), ["ModelOptNvFp4OnlineFusedMoEMethod/experimental_sgl_trtllm"])[0]
    # TopK hands this backend its bypassed format without --enable-lora (topk.py 644-653 in 0.5.20), so the FP4
    # function keeps use_routed_topk False (flashinfer_trtllm.py 1366-1367) and calls the non-routed kernel (r11a)
    assert (r.verdict.value, r.sink) == ("APPROX", "trtllm_fp4_block_scale_moe")
    assert any(f.startswith("not built by default: layers/moe/moe_runner/runner.py:170") and
               "SGLANG_EXPERIMENTAL_LORA_OPTI" in f for f in r.found_by)


@pytest.mark.parametrize("version, key, raise_line, xpu_line", [
    ("0.5.19", "Fp8MoEMethod/marlin", 2548, 2482),
    ("0.5.20", "Fp8MoEMethod/marlin", 2750, 2683),
    ("0.5.22", "Fp8MoEMethod/experimental_sgl_marlin", 3086, 3019)])
def test_a_path_on_one_device_class_cuts_the_other_classes_branches(version, key, raise_line, xpu_line):
    # Hand readings (hand_readings.yaml: part1 0.5.19, part4 0.5.20, part6 0.5.22), all UNUSABLE on
    # CUDA: create_moe_runner builds no MoeRunner for marlin (fp8.py 2384-2396 in 0.5.19, 2524-2538
    # in 0.5.20, 2862-2875 in 0.5.22), so self.runner keeps its class default None; apply
    # dereferences it at fp8.py:2548 / 2750 / 3086. On CUDA alone the NPU-only branch that builds
    # MoeRunner(ASCEND) in create_moe_runner (`if _is_npu and self.is_fp4_expert`, fp8.py:2489 in
    # 0.5.20, 2825 in 0.5.22) and the XPU-only sgl-kernel branch of apply (fp8.py:2473 / 2674 / 3010)
    # are cut, not joined; on XPU alone that branch is the one taken (fused_experts at :2482 / 2683 /
    # 3019, a kernel the sink table does not hold).
    tree = released(version)
    spec = next(s for s in sa.path_specs(tree) if s["id"] == key)
    assert spec["platforms"] == ("CUDA",)  # the Marlin runner's kernel exists on CUDA only (see below)
    (cuda,) = sa.audit_tree(tree, [key])
    assert (cuda.verdict.value, cuda.file, cuda.line, cuda.platform) == (
        "UNUSABLE", "layers/quantization/fp8.py", raise_line, "CUDA")
    assert "self.runner is None" in cuda.rule
    xpu = sa.audit_path(tree, {**spec, "platforms": ("XPU",)})
    assert (xpu.verdict.value, xpu.line) == ("UNDECIDED", xpu_line)
    assert "fused_experts()" in xpu.rule


@pytest.mark.parametrize("version", ["0.5.19", "0.5.22"])
def test_the_marlin_runner_runs_where_its_kernel_is_imported(version):
    # fused_experts_none_to_marlin (moe_runner/marlin.py:115) calls fused_marlin_moe on every way
    # through it; fused_marlin_moe calls moe_wna16_marlin_gemm, which fused_marlin_moe.py imports
    # only under `if _is_cuda:` (lines 12-18 in 0.5.19); experimental_sgl_marlin's fused func only
    # hands over to fused_experts_none_to_marlin (lora/marlin_lora_temp/sgl_backend.py 6-12)
    code = CodeIndex(released(version).root)
    kernel = SRT + "layers/moe/fused_moe_triton/fused_marlin_moe.py"
    assert pf.bound_on(code.mod(kernel), "moe_wna16_marlin_gemm") == {"CUDA"}
    assert pf.bound_on(code.mod(kernel), "fused_marlin_moe") == set(pf.PLATFORMS)  # defined unguarded
    assert pf.bound_on(code.mod(kernel), "no_such_name") is None
    runner = SRT + "layers/moe/moe_runner/marlin.py"
    fn = code.top(runner, "fused_experts_none_to_marlin")
    assert "fused_marlin_moe" in pf.unconditional_calls(fn)
    assert dp.runs_on(code, runner, fn) == {"CUDA"}
    exp = SRT + "lora/marlin_lora_temp/sgl_backend.py"
    assert dp.runs_on(code, exp, code.top(exp, "fused_experts_none_to_experimental_sgl_marlin")) == {"CUDA"}
    # the Triton runner's fused func runs everywhere its guards allow: not cut by this rule
    triton = SRT + "layers/moe/moe_runner/triton.py"
    assert dp.runs_on(code, triton, code.top(triton, "fused_experts_none_to_triton")) == set(pf.PLATFORMS)


def test_unconditional_calls_stop_at_branches_and_returns():
    import ast

    fn = ast.parse(
        "def f(x):\n    a(x)\n    if x:\n        b()\n    y = c() if x else d()\n    return e(x)\n    g()\n"
    ).body[0]
    assert pf.unconditional_calls(fn) == ["a", "e"]
