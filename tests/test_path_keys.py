"""The derived path keys' parts (``nvfp4study.sglang.path_keys``), written out by hand per form."""

import pytest

from nvfp4study.sglang import path_keys as pk


@pytest.mark.parametrize("key, method, runner, backends, kind", [
    ("Fp8MoEMethod/cutlass", "Fp8MoEMethod", "cutlass", {"cutlass"}, "cutlass"),
    ("fused:none/flashinfer_mxfp4", None, "flashinfer_mxfp4", {"flashinfer_mxfp4"}, "fused:flashinfer_mxfp4"),
    ("fused:deepep/triton", None, "triton", {"deepep", "triton"}, "fused:triton"),
    ("core:triton", None, "triton", {"triton"}, "core:triton"),
    ("quantization:modelopt_fp4", None, None, set(), "quantization:modelopt_fp4"),
    ("cpu-amx", None, None, set(), "cpu-amx"),  # a catalogued id without a via
])
def test_parts_of_each_form(key, method, runner, backends, kind):
    assert (pk.method(key), pk.runner(key), pk.backends(key), pk.kind(key)) == (method, runner, backends, kind)
    assert pk.is_runner_level(key) == key.startswith(("fused:", "core:"))


def test_made_keys_read_back():
    assert pk.fused_key("none", "triton") == "fused:none/triton" and pk.runner(pk.fused_key("a", "b")) == "b"
    assert pk.core_key("cutlass") == "core:cutlass" and pk.kind(pk.core_key("cutlass")) == "core:cutlass"
