"""A scalar parameter's path is run on the device classes its runner backend can run on.

``applications.runner_devices`` (data/moe_params.yaml) lists FlashInfer's TRT-LLM runners as CUDA-only, so
an XPU-only branch of a method's apply (Fp8MoEMethod.apply's sgl_kernel fused_experts) does not decide a
CUDA-only path. The expected rows are read independently here: the runner's only routed-scaling call on
CUDA is a ``*_routed_moe`` op (weights as given) and top-k folds the factor (the release's own
``_fuses_routed_scaling_factor_in_topk`` names Fp8MoEMethod with the routed TRT-LLM backend).
"""

from __future__ import annotations

import pytest

from nvfp4study.sglang import moe_params
from nvfp4study.sglang.param_audit import audit_param
from nvfp4study.sglang.param_runner import runner_device_spec
from nvfp4study.sglang.platforms import PLATFORMS
from sglang_fixtures import released


@pytest.fixture(scope="module")
def rsf() -> moe_params.ParamSpec:
    return moe_params.param("routed_scaling_factor")


@pytest.mark.parametrize("key", ["Fp8MoEMethod/flashinfer_trtllm_routed", "fused:none/flashinfer_trtllm",
                                 "core:flashinfer_trtllm"])
def test_a_trtllm_runner_runs_on_cuda_only(rsf, key):
    assert runner_device_spec({"id": key}, rsf)["platforms"] == ("CUDA",)


@pytest.mark.parametrize("spec", [{"id": "Fp8MoEMethod/triton"}, {"id": "fp8-trtllm", "via": "Fp8MoEMethod/triton"},
                                  {"id": "X/flashinfer_trtllm", "platforms": ("NPU",)}])
def test_other_runners_and_disjoint_paths_keep_their_device_classes(rsf, spec):
    got = runner_device_spec(spec, rsf)
    assert got is spec and tuple(got.get("platforms", PLATFORMS)) == tuple(spec.get("platforms", PLATFORMS))


def _fold_names(version: str) -> str:
    return released(version).file("sglang/srt/layers/moe/fused_moe_triton/layer.py").read_text()


@pytest.mark.parametrize("version", ["0.5.21", "0.5.22"])
def test_fp8_routed_trtllm_applies_once_on_cuda(rsf, version):
    src = _fold_names(version)
    # top-k folds for Fp8MoEMethod with the routed TRT-LLM backend (read from the release, not the audit)
    assert "Fp8MoEMethod" in src and "flashinfer_trtllm_routed" in src
    fp8 = released(version).file("sglang/srt/layers/quantization/fp8.py").read_text()
    assert "if is_xpu() and not get_moe_runner_backend().is_triton():" in fp8  # the XPU-only branch that used to leave the row UNDECIDED
    rows = {r.path: r for r in audit_param(released(version), "routed_scaling_factor")}
    row = rows["Fp8MoEMethod/flashinfer_trtllm_routed"]
    assert (row.verdict, row.parts, row.platform) == ("APPLIED", {"top-k": 1, "runner": 0, "model": 0}, "CUDA")
