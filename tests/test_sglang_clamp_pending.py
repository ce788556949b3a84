"""Clamp rows the twelfth blind sample decided against the audit, read again from the source (issue 36,
r11a) and left pending as strict xfails; settled in r12a by modelling what the source does:

- the FusedMoE layer's own weights: ``create_weights`` runs as a setup step (runner_steps.py
  SETUP_STEPS), ``layer.register_parameter("x", ...)`` sets ``layer.x``, and a weight the path's
  closed ``create_weights`` never registers, that the tree gives only inside a ``create_weights``,
  is one the layer lacks (layer_attrs.py): reading it raises AttributeError;
- ``torch.nn.Parameter(...)`` builds an object, never None (clamp_values.PARAMETER);
- an undecided ``if isinstance(x, C):`` narrows ``x`` on each side (clamp_lookup.Lookup.narrowed).
"""

from __future__ import annotations

import ast

import pytest

from nvfp4study.sglang import audit as sa
from nvfp4study.sglang.clamp_flow import Interp
from nvfp4study.sglang.dispatch import derive_paths
from nvfp4study.sglang.layer_attrs import closed_create_weights, create_weights_only
from sglang_fixtures import released

NPU_KEY = "NPUCompressedTensorsW8A8Int8DynamicMoE/ascend"
NPU_FILE = "sglang/srt/layers/quantization/compressed_tensors/schemes/compressed_tensors_w8a8_int8_moe.py"


def row(version: str, path: str) -> sa.PathResult:
    """The audit's clamp row of one path key on one release."""
    (r,) = sa.audit_tree(released(version), [path])
    return r


@pytest.mark.parametrize("version", ["0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"])
def test_npu_w8a8_int8_scheme_reads_offsets_it_never_creates(version):
    # apply_weights reads layer.w13_weight_offset / w2_weight_offset unguarded (compressed_tensors_w8a8_int8_moe.py
    # 149-150; 150-151 in 0.5.19); its create_weights (56-119) registers neither and NPUW8A8Int8MoEMethod.
    # process_weights_after_loading only rebinds an existing one (moe_methods.py, `if offset is not None`).
    # The scheme file is the same in 0.5.20-0.5.23 (0.5.19: one blank line more)
    r = row(version, NPU_KEY)
    assert r.verdict.value == "UNUSABLE"
    assert "AttributeError: layer.w13_weight_offset" in r.rule
    assert r.function == "NPUCompressedTensorsW8A8Int8DynamicMoE.apply_weights"


@pytest.mark.parametrize("version", ["0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"])
def test_mxfp4_triton_kernel_always_has_its_bias(version):
    # the triton-kernels branch of Mxfp4MoEMethod.process_weights_after_loading sets layer.w13_weight_bias /
    # w2_weight_bias to Parameter(...) (mxfp4.py 1030-1034 in 0.5.21; create_weights made them whenever
    # not _is_hip, 571-572), so apply's getattr(layer, "w13_weight_bias", None) is not None and
    # TritonKernelsRunnerCore.run takes its has_bias branch (moe_runner/triton_kernels.py 114-131)
    r = row(version, "Mxfp4MoEMethod/triton_kernel")
    assert (r.verdict.value, r.sink) == ("APPROX", "triton_kernel_fused_experts_with_bias")


@pytest.mark.parametrize("version", ["0.5.20", "0.5.21", "0.5.22"])
def test_fp8_trtllm_routed_block_scale_branch(version):
    # the routed fused func's isinstance(quant_info, FlashInferTrtllmFp8MoeQuantInfo) body reads the FP8
    # payload only (flashinfer_trtllm.py 1664-1670 in 0.5.21), not the NPU branch's AscendQuantInfo (None
    # clamp); the per-tensor branch asserts the bypassed top-k format (935-936): the block-scale routed
    # call hands gemm1_clamp_limit to trtllm_fp8_block_scale_routed_moe (832-851, pre form)
    r = row(version, "Fp8MoEMethod/flashinfer_trtllm_routed")
    assert (r.verdict.value, r.sink) == ("APPROX", "trtllm_fp8_block_scale_routed_moe")


def test_create_weights_runs_between_the_constructor_and_the_runner():
    # FusedMoE.__init__ calls create_weights, then create_moe_runner (fused_moe_triton/layer.py 561/576 in 0.5.23)
    p = next(p for p in derive_paths(released("0.5.23").root) if p.key == NPU_KEY)
    names = [s.rsplit(".", 1)[-1] for s in p.steps[:4]]
    assert names == ["__init__", "create_weights", "create_moe_runner", "process_weights_after_loading"]


def test_register_parameter_gives_the_layer_its_weight():
    interp = Interp(released("0.5.21").root, set())
    assert interp.run_step(NPU_FILE, "NPUCompressedTensorsW8A8Int8DynamicMoE.create_weights")
    assert {"w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"} <= set(interp.attrs)
    assert "w13_weight_offset" not in interp.attrs
    assert interp.layer_closed


def _fn(src: str) -> ast.FunctionDef:
    return ast.parse(src).body[0]


@pytest.mark.parametrize(("src", "closed"), [
    ("def create_weights(self, layer, n):\n    w = P(n)\n    layer.register_parameter('w13_weight', w)\n"
     "    setattr(layer, 'w2_weight', w)\n    layer.w13_input_scale = None\n    set_weight_attrs(w, {})\n", True),
    ("def create_weights(self, layer, n):\n    self._create_int8(layer, n)\n", False),
    ("def create_weights(self, layer, n):\n    super().create_weights(layer=layer, n=n)\n", False),
    ("def create_weights(self, layer, n):\n    for k in ('a', 'b'):\n        layer.register_parameter(k, P(n))\n", False),
    ("def create_weights(self, layer, n):\n    layer.add_module('x', M())\n", False),
])
def test_closed_create_weights(src, closed):
    assert closed_create_weights(_fn(src)) is closed


def test_create_weights_only_names_weights_no_other_step_sets():
    root = released("0.5.21").root
    assert create_weights_only(root, "w13_weight_offset")  # wNa16 / w4a8 schemes register it (create_weights)
    # set outside a create_weights too: Mxfp4MoEMethod.process_weights_after_loading (mxfp4.py 1033)
    assert not create_weights_only(root, "w13_weight_bias")
    assert not create_weights_only(root, "num_local_experts")  # FusedMoE's own (self.num_local_experts)
