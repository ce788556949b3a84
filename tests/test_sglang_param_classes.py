"""Classes of error of the parameter audit (``audit-sglang --param``) found against the 35 blind hand
readings of issue 36 (``sglang/data/param_hand_readings.yaml``), one test per class, each on the
released source and at a line found here by scanning the file's text.

Hand readings (the rules):
- The runner's post-permute: a runner core's output reaches the dispatcher through the function its
  runner registers for ``(runner, format)`` (``@register_post_permute("deep_gemm", "standard")``);
  on deep_gemm it is ``post_reorder_deepgemm(..., runner_config.routed_scaling_factor)``, the weighted
  sum times the factor (kernels/ops/moe/ep_moe_kernels.py: "routed_scaling_factor is folded into the
  store"). Fp8MoEMethod on deep_gemm (0.5.19 ``deep-gemm-contiguous``) does not fold it into top-k
  (layer.py ``_fuses_routed_scaling_factor_in_topk``), the model does not (standard dispatch):
  APPLIED once, there. triton_kernels' post-permute to standard multiplies the output by it
  (triton_kernels.py, ``hidden_states.mul_(runner_config.routed_scaling_factor)``): the triton-kernels
  path was DROPPED, it is APPLIED.
- TopKConfig fields the model does not pass: BailingMoeV3 in 0.5.19/0.5.20 builds TopK without
  ``scoring_func`` (0.5.21 passes ``scoring_func=self.score_function``), so TopKConfig holds TopK's
  default ``"softmax"``; the Ascend gate reads it: ``norm_type=(0 if topk_config.scoring_func ==
  "softmax" else 1)``, "1 for sigmoid, 0 for softmax" (hardware_backend/npu/moe/topk.py). Ling's gate
  scores with sigmoid: 0.5.20 ModelSlimFusedMoEMethod/ascend routes with softmax scores -> WRONG, all three.
- The Ascend gate with Ling's sigmoid scores (0.5.21+): ``torch.ops.npu.npu_moe_gating_top_k`` is
  compiled; SGLang states what it does with the top-k weights' normalisation (models/llada2.py: "fused_topk_npu()
  conducting norm before scale with routed_scaling_factor by default") but not whether the bias is used for
  selection only, nor how ``group_select_mode=1`` scores a group -> norm_topk_prob APPLIED,
  correction_bias and grouped_topk UNDECIDED (they were APPLIED, norm_topk_prob UNDECIDED).
- A registered custom op handed None where its schema takes an int: ``@register_custom_op`` registers
  ``torch.ops.sglang.<name>`` with the schema ``torch.library.infer_schema`` reads from the annotations
  (utils/custom_op.py, utils/common.py); 0.5.19 CompressedTensorsW8A8Fp8MoE on flashinfer_trtllm copies
  ``layer.routing_method_type`` (None: Bailing passes none) into its quant info and the runner hands it to
  ``trtllm_fp8_block_scale_moe_out_wrapper(..., routing_method_type: int = 0)``: the op rejects None,
  the path cannot run Ling -> UNUSABLE for every parameter (it was UNDECIDED).
- An all-to-all dispatcher that materialises TopK: 0.5.19 FlashinferDispatcher.dispatch turns a bypassed
  TopK output into the standard one (``topk_output.to_standard()``, select_experts with the same
  TopKConfig) before the TRT-LLM runner, whose routed kernels then take ids and weights only: routing
  is TopK's (biased_grouped_topk) -> APPLIED for the three routing parameters (it was UNDECIDED).
"""

from __future__ import annotations

import re

import pytest

from nvfp4study.sglang.param_audit import ParamVerdict, audit_param
from sglang_fixtures import released

RUNNERS = "sglang/srt/layers/moe/moe_runner"


def _line(tree, rel: str, pattern: str, after: int = 0) -> int:
    """The first line (1-based) at or after ``after`` of ``rel`` matching ``pattern``."""
    lines = (tree.root / rel).read_text().splitlines()
    return next(i + 1 for i, t in enumerate(lines) if i + 1 >= after and re.search(pattern, t))


def test_the_runner_post_permute_applies_the_factor():
    """Class: the product in the runner's registered post-permute was not seen (the path's steps stop
    at the core): 0.5.19 deep-gemm-contiguous was UNDECIDED, the readers' APPLIED."""
    tree = released("0.5.19")
    rel = f"{RUNNERS}/deep_gemm.py"
    reg = _line(tree, rel, r'@register_post_permute\("deep_gemm", "standard"\)')
    call = _line(tree, rel, r"^\s+post_reorder_deepgemm\(", reg)
    (row,) = audit_param(tree, "routed_scaling_factor", ["deep-gemm-contiguous"])
    assert row.verdict == ParamVerdict.APPLIED, row.rule
    assert row.parts == {"top-k": 0, "runner": 1, "model": 0}
    assert (row.file, row.line) == ("layers/moe/moe_runner/deep_gemm.py", call)
    # the same class on triton_kernels: TopK's TRITON_KERNEL format never folds the factor, the post-permute
    # to standard multiplies the output by it (hidden_states.mul_(runner_config.routed_scaling_factor))
    tree = released("0.5.23")
    rel = f"{RUNNERS}/triton_kernels.py"
    reg = _line(tree, rel, r'@register_post_permute\("triton_kernel", "standard"\)')
    mul = _line(tree, rel, r"hidden_states\.mul_\(runner_config\.routed_scaling_factor\)", reg)
    (row,) = audit_param(tree, "routed_scaling_factor", ["triton-kernels"])
    assert row.verdict == ParamVerdict.APPLIED and row.parts["runner"] == 1, row.rule
    assert (row.file, row.line) == ("layers/moe/moe_runner/triton_kernels.py", mul)


def test_a_helper_returning_none_on_a_branch_may_return_none():
    """Class: a helper's ``return None`` on one branch was read as "nothing returned yet", so the join of
    its returns was the other branch's value alone. 0.5.20-0.5.23 ``post_permute_deep_gemm_to_standard``
    first asks ``deep_gemm_sm120.maybe_post_permute`` (``return None`` unless ``contig_mode``) and returns
    its result when it is not None; read as never None, ``post_reorder_deepgemm(...,
    runner_config.routed_scaling_factor)`` after it was never reached: deep-gemm was DROPPED, the readers'
    APPLIED (the third parameter sample, P1 and P4 on 0.5.20 / 0.5.21)."""
    for v in ("0.5.20", "0.5.23"):
        tree = released(v)
        rel = f"{RUNNERS}/deep_gemm.py"
        reg = _line(tree, rel, r'@register_post_permute\("deep_gemm", "standard"\)')
        assert "maybe_post_permute" in (tree.root / rel).read_text()
        call = _line(tree, rel, r"^\s+post_reorder_deepgemm\(", reg)
        (row,) = audit_param(tree, "routed_scaling_factor", ["deep-gemm"])
        assert row.verdict == ParamVerdict.APPLIED, (v, row.rule)
        assert row.parts == {"top-k": 0, "runner": 1, "model": 0}
        assert (row.file, row.line) == ("layers/moe/moe_runner/deep_gemm.py", call)


def test_the_join_of_a_helpers_returns_keeps_none(tmp_path):
    from nvfp4study.sglang.clamp_flow import Interp
    from nvfp4study.sglang.clamp_values import UNK, Frame, Multi

    src = "def helper(x):\n    if x:\n        return None\n    return 2\n\ndef none():\n    pass\n"
    (tmp_path / "m.py").write_text(src)
    interp = Interp(tmp_path, set())
    mod = interp.module("m.py")
    fns = {n.name: n for n in mod.tree.body}
    frame = Frame(mod, None, "caller")
    assert interp.invoke(mod, fns["helper"], None, [UNK], {}, frame) == Multi((None, 2))
    assert interp.invoke(mod, fns["helper"], None, [False], {}, frame) == 2
    assert interp.invoke(mod, fns["none"], None, [], {}, frame) is UNK  # no return statement: not known


def test_a_core_a_custom_op_looks_up_by_id_runs_its_own_gemm():
    """Class: a runner core whose ``run`` calls a registered custom op that looks the core up again in a
    class-level table (``runner = HummingRunnerCore.runner_cores[moe_runner_id]``, filled by ``__init__``:
    ``HummingRunnerCore.runner_cores[id(self)] = self``) and calls its GEMM there; and the runner input a
    fused func builds (``HummingRunnerInput(...)`` without ``apply_routed_scaling_factor``: the dataclass
    default True). The GEMM's ``moe_fused_mul_sum(..., routed_scaling_factor=...)`` was never reached:
    Mxfp4HummingMoEMethod/humming was DROPPED, the readers' APPLIED (the third parameter sample, P4 and H3)."""
    for v in ("0.5.19", "0.5.22"):
        tree = released(v)
        rel = f"{RUNNERS}/humming.py"
        table = _line(tree, rel, r"HummingRunnerCore\.runner_cores\[id\(self\)\] = self")
        lookup = _line(tree, rel, r"runner = HummingRunnerCore\.runner_cores\[moe_runner_id\]")
        assert table and lookup
        default = _line(tree, rel, r"^\s+apply_routed_scaling_factor: bool = True")
        assert default < table  # HummingRunnerInput's field, before the core's class
        call = _line(tree, rel, r"^\s+moe_fused_mul_sum\(")
        (row,) = audit_param(tree, "routed_scaling_factor", ["Mxfp4HummingMoEMethod/humming"])
        assert row.verdict == ParamVerdict.APPLIED, (v, row.rule)
        assert row.parts == {"top-k": 0, "runner": 1, "model": 0}
        assert (row.file, row.line) == ("layers/moe/moe_runner/humming.py", call)


def test_a_class_table_of_self_gives_an_object_of_the_class(tmp_path):
    import dataclasses

    from nvfp4study.sglang.clamp_flow import Interp
    from nvfp4study.sglang.clamp_values import UNK, Frame, Instance

    src = ("class Core:\n    table = {}\n    def __init__(self):\n        Core.table[id(self)] = self\n"
           "    def gemm(self, x):\n        return 3\n\nclass Other:\n    table = {}\n\n"
           "def op(i):\n    core = Core.table[i]\n    return core.gemm(1)\n"
           "def op2(i):\n    return Other.table[i]\n")
    (tmp_path / "m.py").write_text(src)
    interp = Interp(tmp_path, set())
    interp.entry_names = set()
    interp.param = dataclasses.replace(interp.param, enter_when=("gemm",))  # gemm() is entered
    mod = interp.module("m.py")
    fns = {n.name: n for n in mod.tree.body if hasattr(n, "args")}
    frame = Frame(mod, None, "caller")
    assert interp.invoke(mod, fns["op"], None, [UNK], {}, frame) == 3  # Core.gemm ran
    assert not isinstance(interp.invoke(mod, fns["op2"], None, [UNK], {}, frame), Instance)  # no self stored


def test_mxfp4_marlin_sums_the_topk_scaled_weights_plainly():
    """Two classes on Mxfp4MarlinMoEMethod/marlin (DOUBLE, the reader's APPLIED, third parameter sample):
    (1) a runner core MoeRunner.__init__ builds only under LoRA (MarlinLoraRunnerCore, "Marlin only supports
    fused path" otherwise) was run after the fused func, its moe_sum_reduce_triton(..., routed_scaling_factor)
    counted; a method path runs with LoRA off and MoeRunner.run calls the fused func. (2) fused_marlin_moe's
    MXFP4 branch sums the top-k-scaled weights plainly ("Top-k weights (incl. routed scaling) are already
    applied above"): where top-k folds the factor (Mxfp4MarlinMoEMethod: fuse_routed_scaling_factor_in_topk =
    True) the call does not apply it again (moe_param_sinks.yaml fused_marlin_moe.if_topk_folds)."""
    for v in ("0.5.20", "0.5.23"):
        tree = released(v)
        text = (tree.root / "sglang/srt/layers/moe/fused_moe_triton/fused_marlin_moe.py").read_text()
        assert "Top-k weights (incl. routed scaling) are already" in text and "moe_sum_reduce(intermediate_cache3, output, 1.0)" in text
        assert "fuse_routed_scaling_factor_in_topk = True" in (tree.root / "sglang/srt/layers/quantization/mxfp4_marlin_moe.py").read_text()
        rows = {r.path: r for r in audit_param(tree, "routed_scaling_factor", ["Mxfp4MarlinMoEMethod/marlin", "marlin"])}
        r = rows["Mxfp4MarlinMoEMethod/marlin"]
        assert r.verdict == ParamVerdict.APPLIED and r.parts == {"top-k": 1, "runner": 0, "model": 0}, (v, r.rule)
        assert not any("lora_moe_runner_marlin" in e for e in r.evidence), r.evidence
        assert any("fused_marlin_moe() takes it and does not apply it: top-k folded it" in e for e in r.evidence)
        # the Marlin runner's row takes its worst caller (issue 36): Mxfp4MoEMethod/marlin, whose E8M0 layer the
        # kernel sums plainly while top-k does not fold the factor (test_an_e8m0_layer_on_marlin_drops_the_factor)
        r = rows["marlin"]
        assert r.verdict == ParamVerdict.DROPPED and "the worst Mxfp4MoEMethod/marlin DROPPED" in r.rule, (v, r.rule)


def test_an_e8m0_layer_on_marlin_drops_the_factor():
    """Class (issue 36, 0.5.20 Mxfp4MoEMethod/marlin: the reader's DROPPED, the audit's APPLIED): fused_marlin_moe
    tests the scales' dtype (is_mxfp4_marlin: E8M0, fused_marlin_moe.py 204-210) and sums that branch plainly
    (401-417), whatever top-k did; the audit read the plain sum only where top-k folds the factor
    (if_topk_folds). Mxfp4MoEMethod's Marlin branch prepares the same E8M0 layer (prepare_moe_mxfp4_layer_for_marlin
    -> mxfp4_marlin_process_scales: .to(torch.float8_e8m0fnu), marlin_utils_fp4.py 224) and its top-k does not
    fold the factor: nothing applies it (moe_param_sinks.yaml fused_marlin_moe.if_scales_e8m0). An NVFP4 Marlin
    layer (E4M3 scales) keeps the kernel's scaled sum, the compiled sgl_kernel moe_sum_reduce (fused_marlin_moe.py
    423): UNDECIDED, its form for the pinned sglang-kernel not known (docs/blind-readings/KP.md)."""
    tree = released("0.5.20")
    lines = (tree.root / "sglang/srt/layers/quantization/marlin_utils_fp4.py").read_text().splitlines()
    assert any(".to(torch.float8_e8m0fnu)" in ln for ln in lines)
    rows = {r.path: r for r in audit_param(tree, "routed_scaling_factor", ["Mxfp4MoEMethod/marlin", "modelopt-nvfp4-marlin"])}
    r = rows["Mxfp4MoEMethod/marlin"]
    assert r.verdict == ParamVerdict.DROPPED and r.parts == {"top-k": 0, "runner": 0, "model": 0}, r.rule
    assert any("the expert scales are E8M0 (layers/quantization/mxfp4.py:" in e
               and "prepare_moe_mxfp4_layer_for_marlin() casts them" in e for e in r.evidence), r.evidence
    r = rows["modelopt-nvfp4-marlin"]
    assert r.verdict == ParamVerdict.UNDECIDED and r.parts == {"top-k": 0, "runner": None, "model": 0}, r.rule
    assert "fused_marlin_moe.py:423 moe_sum_reduce() on CUDA" in r.rule


def test_a_runner_level_row_takes_its_worst_caller():
    """Class: a runner-level row (fused:/core:) counted the factor from the runner alone, where the product
    hinges on what the method hands it: flashinfer_cutlass's _maybe_apply_routed_scaling_factor multiplies
    only when quant_info.apply_routed_scaling_factor, which CompressedTensorsW4A4Nvfp4MoE sets False (and
    top-k does not fold it for that method): fused:none/flashinfer_cutlass was APPLIED, the reader's DROPPED
    (worst reachable branch; 0.5.22, third parameter sample). As the clamp's runner-level entries, the worst
    count among the method paths run with its backend decides, naming that caller."""
    tree = released("0.5.22")
    text = (tree.root / "sglang/srt/layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4_moe.py").read_text()
    assert re.search(r"apply_routed_scaling_factor\s*=\s*False", text)
    (row,) = audit_param(tree, "routed_scaling_factor", ["fused:none/flashinfer_cutlass"])
    assert row.verdict == ParamVerdict.DROPPED, row.rule
    assert row.rule.startswith("its callers decide:") and "the worst nvfp4-w4a4-cutlass DROPPED" in row.rule
    assert "alone: APPLIED" in row.rule
    # the whole tree's audit gives the same row (the callers' rows computed once)
    full = {r.path: r for r in audit_param(tree, "routed_scaling_factor")}
    assert full["fused:none/flashinfer_cutlass"].verdict == ParamVerdict.DROPPED
    assert full["nvfp4-w4a4-cutlass"].verdict == ParamVerdict.DROPPED


NPU_TOPK = "sglang/srt/hardware_backend/npu/moe/topk.py"


def test_a_topk_field_the_model_does_not_pass_takes_topks_default():
    """Class: Ling's TopKConfig was one set of facts for every release (scoring_func "sigmoid"); a
    field BailingMoeV3 does not pass is TopK's default in that release."""
    tree = released("0.5.20")
    model = (tree.root / "sglang/srt/models/bailing_moe_v3.py").read_text()
    assert "scoring_func" not in model  # the model never passes it
    _line(tree, "sglang/srt/layers/moe/topk.py", r'^\s+scoring_func: str = "softmax",')
    gate = _line(tree, NPU_TOPK, r"torch\.ops\.npu\.npu_moe_gating_top_k\(")
    _line(tree, NPU_TOPK, r'norm_type=\(0 if topk_config\.scoring_func == "softmax" else 1\)', gate)
    for name in ("norm_topk_prob", "correction_bias", "grouped_topk"):
        (row,) = audit_param(tree, name, ["ModelSlimFusedMoEMethod/ascend"])
        assert row.verdict == ParamVerdict.WRONG, (name, row.rule)
        assert (row.file, row.line) == ("hardware_backend/npu/moe/topk.py", gate), name
    # 0.5.21 passes it: the same gate scores with sigmoid there
    tree = released("0.5.21")
    assert "scoring_func=self.score_function" in (tree.root / "sglang/srt/models/bailing_moe_v3.py").read_text()
    (row,) = audit_param(tree, "norm_topk_prob", ["NPUCompressedTensorsW4A8mxfp4MoE/ascend"])
    assert row.verdict != ParamVerdict.WRONG, row.rule


@pytest.mark.parametrize("version", ["0.5.21", "0.5.22"])
def test_the_ascend_gate_decides_what_the_source_states(version):
    """Class: the compiled Ascend gate with Ling's sigmoid scores was APPLIED for the bias and the groups
    (their use not stated) and UNDECIDED for the renormalisation (stated in models/llada2.py)."""
    tree = released(version)
    llada = (tree.root / "sglang/srt/models/llada2.py").read_text()
    assert "fused_topk_npu() conducting norm before scale with routed_scaling_factor by default" in llada
    gate = _line(tree, NPU_TOPK, r"torch\.ops\.npu\.npu_moe_gating_top_k\(")
    path = {"0.5.21": "NPUCompressedTensorsW4A8mxfp4MoE/ascend",
            # not the W8A8 int8 scheme since r12a: it raises at apply_weights (layer.w13_weight_offset never registered)
            "0.5.22": "NPUCompressedTensorsW4A16Int4DynamicMoE/ascend"}[version]
    want = {"norm_topk_prob": ParamVerdict.APPLIED, "correction_bias": ParamVerdict.UNDECIDED,
            "grouped_topk": ParamVerdict.UNDECIDED}
    for name, verdict in want.items():
        (row,) = audit_param(tree, name, [path])
        assert row.verdict == verdict, (name, row.rule)
        assert (row.file, row.line) == ("hardware_backend/npu/moe/topk.py", gate), name


def test_a_custom_op_that_takes_no_none_makes_the_path_unusable():
    """Class: BailingMoeV3 passes no routing_method_type (FusedMoE's None); a TRT-LLM path that hands it to
    SGLang's registered custom op, whose schema is inferred from ``routing_method_type: int = 0``, raises
    for Ling whatever the parameter: UNUSABLE (it was UNDECIDED, the runner's routing method 'not read')."""
    tree = released("0.5.19")
    ops = "sglang/srt/layers/moe/flashinfer_trtllm_moe.py"
    reg = _line(tree, ops, r"^@register_custom_op\(")
    op = _line(tree, ops, r"^def trtllm_fp8_block_scale_moe_out_wrapper\(", reg)
    _line(tree, ops, r"^\s+routing_method_type: int = 0,", op)
    fp8 = f"{RUNNERS}/flashinfer_trtllm.py"
    call = _line(tree, fp8, r"^\s+trtllm_fp8_block_scale_moe_out_wrapper\(")
    for name in ("routed_scaling_factor", "norm_topk_prob", "correction_bias", "grouped_topk"):
        (row,) = audit_param(tree, name, ["CompressedTensorsW8A8Fp8MoE/flashinfer_trtllm"])
        assert row.verdict == ParamVerdict.UNUSABLE, (name, row.rule)
        assert (row.file, row.line) == ("layers/moe/moe_runner/flashinfer_trtllm.py", call), name
        assert "routing_method_type=None" in row.rule
    # Fp8MoEMethod (fp8-trtllm) defaults the None to DeepSeekV3 before the same call (fp8.py): not this class
    # (the custom op takes its int); that path is UNUSABLE for another reason, FlashInfer's grouped routing
    # kernel's 32-experts-per-group check (F-05, test_sglang_param_routing_shape.py)
    (row,) = audit_param(tree, "correction_bias", ["fp8-trtllm"])
    assert row.verdict == ParamVerdict.UNUSABLE, row.rule
    assert "routing_method_type=None" not in row.rule and "64 experts per group > 32" in row.rule


def test_a_dispatcher_that_materialises_topk_routes_with_select_experts():
    """Class: TopK bypassed to a TRT-LLM runner behind an all-to-all dispatcher that turns the bypassed
    output into TopK's standard one (``topk_output.to_standard()``) before the runner: the runner's
    routed kernels only take the ids, TopK's select_experts routes (biased_grouped_topk with Ling's
    bias, groups and renormalisation) -> APPLIED (it was UNDECIDED: the routed kernel 'not read')."""
    tree = released("0.5.19")
    disp = "sglang/srt/layers/moe/token_dispatcher/flashinfer.py"
    start = _line(tree, disp, r"^    def dispatch\(")
    mat = _line(tree, disp, r"topk_output = topk_output\.to_standard\(\)", start)
    for name in ("norm_topk_prob", "correction_bias", "grouped_topk"):
        (row,) = audit_param(tree, name, ["fused:flashinfer/flashinfer_trtllm"])
        assert row.verdict == ParamVerdict.APPLIED, (name, row.rule)
        assert (row.file, row.line) == ("layers/moe/token_dispatcher/flashinfer.py", mat), name
        assert "biased_grouped_topk()" in row.rule
    # the standard dispatcher hands the bypassed output on: the runner's kernels still decide there
    (row,) = audit_param(tree, "correction_bias", ["fused:none/flashinfer_trtllm"])
    assert "to_standard" not in row.rule


def test_a_method_that_runs_the_backend_as_another_is_no_caller_of_its_runner():
    """Class: a runner-level path's top-k value was the worst over every method path keyed with its
    backend, among them a method whose create_moe_runner pins another runner (0.5.22 Fp8MoEMethod runs
    flashinfer_cutedsl as triton: "Fp8MoEMethod has no %s path; using triton"), which never reaches the
    fused function. fused:none/flashinfer_cutedsl is reached by the ModelOpt NVFP4 methods only, whose
    top-k folds the factor in: APPLIED (it was DROPPED; reader Q1)."""
    tree = released("0.5.22")
    fp8 = "sglang/srt/layers/quantization/fp8.py"
    pin = _line(tree, fp8, r'"Fp8MoEMethod has no %s path; using triton')
    _line(tree, fp8, r"moe_runner_backend = MoeRunnerBackend\.TRITON", pin)
    fuses = _line(tree, "sglang/srt/layers/moe/fused_moe_triton/layer.py", r"^def _fuses_routed_scaling_factor_in_topk\(")
    (row,) = audit_param(tree, "routed_scaling_factor", ["fused:none/flashinfer_cutedsl"])
    assert row.verdict == ParamVerdict.APPLIED, row.rule
    assert row.parts == {"top-k": 1, "runner": 0, "model": 0}
    assert (row.file, row.line) == ("layers/moe/fused_moe_triton/layer.py", fuses)
    assert "Fp8MoEMethod" not in row.evidence[0]


def test_the_runner_sees_the_topk_output_format_topk_gives_the_path():
    """Class: a scalar parameter's run left the runner's branches on TopK's output format open (the
    routed-kernel branch and the logits branch both taken), where TopK decides it for the path: 0.5.23
    TopK binds STANDARD when the layer has no routing method (``_can_bypass_trtllm_routing``: method None
    -> False; BailingMoeV3 passes none), so the FP4 TRT-LLM runner falls back to its routed kernel with
    ``routed_scaling_factor=None`` and top-k has folded the factor in: APPLIED once (it was UNDECIDED,
    the logits branch's kernel 'not read'; reader Q2)."""
    tree = released("0.5.23")
    topk = "sglang/srt/layers/moe/topk.py"
    can = _line(tree, topk, r"^def _can_bypass_trtllm_routing\(")
    _line(tree, topk, r"^\s+method is None$", can)
    rel = f"{RUNNERS}/flashinfer_trtllm.py"
    fall = _line(tree, rel, r"if not use_routed_topk and TopKOutputChecker\.format_is_standard\(topk_output\):")
    routed = _line(tree, rel, r"^\s+result = trtllm_fp4_block_scale_routed_moe\(\*\*moe_kwargs\)", fall)
    _line(tree, rel, r"^\s+routed_scaling_factor=None,", fall)
    (row,) = audit_param(tree, "routed_scaling_factor", ["ModelOptNvFp4OnlineFusedMoEMethod/flashinfer_trtllm"])
    assert row.verdict == ParamVerdict.APPLIED, row.rule
    assert row.parts == {"top-k": 1, "runner": 0, "model": 0}
    assert f"layers/moe/moe_runner/flashinfer_trtllm.py:{routed} trtllm_fp4_block_scale_routed_moe() gets no " \
        "routed_scaling_factor (None)" in row.evidence
    assert not any("trtllm_fp4_block_scale_moe()" in e for e in row.evidence)  # the logits branch is not taken


def test_branches_that_route_differently_give_the_worst_branch():
    """Class: a fused function serving several methods routes differently per method (0.5.22
    fused_experts_none_to_flashinfer_mxfp4: the CUTLASS branches materialise TopK, the Mxfp4MoEMethod
    SM100 trtllm-gen call passes None for the bias and the groups with routing method 1, Renormalize);
    the audit gave UNDECIDED where the readers' instruction (and the clamp's) is the worst reachable
    branch, in the order DROPPED, WRONG, DOUBLE, UNDECIDED, REFUSED, APPLIED (readers Q4, Q2)."""
    tree = released("0.5.22")
    rel = f"{RUNNERS}/flashinfer_trtllm.py"
    call = _line(tree, rel, r"^\s+trtllm_gen_output = trtllm_fp4_block_scale_moe\($")
    _line(tree, rel, r"^\s+None,  # routing_bias$", call)
    _line(tree, rel, r"^\s+1,  # routing_method_type, renormalize$", call)
    want = {"norm_topk_prob": ParamVerdict.WRONG, "correction_bias": ParamVerdict.DROPPED,
            "grouped_topk": ParamVerdict.DROPPED}
    for name, verdict in want.items():
        (row,) = audit_param(tree, name, ["fused:none/flashinfer_mxfp4"])
        assert row.verdict == verdict, (name, row.rule)
        assert (row.file, row.line) == ("layers/moe/moe_runner/flashinfer_trtllm.py", call), name
        assert "APPLIED" in row.rule.rsplit("(the worst of the branches: ", 1)[1], name  # the CUTLASS branch


def test_a_combine_kernel_in_the_methods_own_call_applies_the_factor():
    """Class: a factor handed to a combine/reorder kernel inside the function the method calls itself.
    W4AFp8MoEMethod.apply calls cutlass_w4a8_moe(..., routed_scaling_factor=moe_runner_config.routed_scaling_factor
    or 1.0), whose combine is post_reorder_for_cutlass_moe(..., routed_scaling_factor): the kernel's store is the
    top-k weighted sum times the factor (kernels/ops/moe/ep_moe_kernels.py). Neither top-k nor the model apply
    it: APPLIED once (fourth sample, T-readers; it was DROPPED)."""
    for v in ("0.5.19", "0.5.22", "0.5.23"):
        tree = released(v)
        rel = "sglang/srt/layers/moe/cutlass_w4a8_moe.py"
        call = _line(tree, rel, r"^\s+post_reorder_for_cutlass_moe\(", _line(tree, rel, r"^def cutlass_w4a8_moe\("))
        kern = "sglang/kernels/ops/moe/ep_moe_kernels.py"
        _line(tree, kern, r"sum_vec \*= routed_scaling_factor",
              _line(tree, kern, r"^def post_reorder_triton_kernel_for_cutlass_moe\("))
        for key in ("W4AFp8MoEMethod/direct", "CompressedTensorsW4AFP8MoE/direct"):
            (row,) = audit_param(tree, "routed_scaling_factor", [key])
            assert row.verdict == ParamVerdict.APPLIED, (v, key, row.rule)
            assert row.parts == {"top-k": 0, "runner": 1, "model": 0}, (v, key)
            assert (row.file, row.line) == ("layers/moe/cutlass_w4a8_moe.py", call), (v, key)
