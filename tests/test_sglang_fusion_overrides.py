"""The server-argument writes that force ``--disable-shared-experts-fusion`` (issue 36, r13a): SGLang's
``arg_groups/overrides.py`` ``_moe_runner_fusion_disable`` (the FlashInfer CuteDSL and TRT-LLM runners;
0.5.23 adds the LoRA runners) and ``_a2a_fusion_adjustments`` (FlashInfer all-to-all; 0.5.20 on also
FlashInfer MegaMoE; 0.5.19 on DeepEP v2), replayed per path by :mod:`nvfp4study.sglang.fusion_overrides`.
The expected lines are read here from the released files as text (the module reads them by ``ast``)."""

from __future__ import annotations

import ast

import pytest

from nvfp4study.sglang import audit as sa
from nvfp4study.sglang import fusion_overrides as fo
from nvfp4study.sglang.tree_files import tree_stamp
from sglang_fixtures import released

RELEASES = ("0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
OVERRIDES = "arg_groups/overrides.py"
RETURN = 'return {"disable_shared_experts_fusion": True}'


def _lines(tree, rel: str, needle: str) -> list[int]:
    text = tree.file("sglang/srt/" + rel).read_text()
    return [i for i, ln in enumerate(text.splitlines(), 1) if needle in ln]


def _write_after(tree, needle: str) -> int | None:
    """The first ``return {...: True}`` after the line holding ``needle`` (None: no such line)."""
    start = _lines(tree, OVERRIDES, needle)
    return next(i for i in _lines(tree, OVERRIDES, RETURN) if i > start[0]) if start else None


def _forced(tree, runner, a2a) -> list[str]:
    return [o.where for o in fo.forced_off(tree.root, runner, a2a, ("quantization",))]


@pytest.mark.parametrize("v", RELEASES)
@pytest.mark.parametrize("runner,needle", [
    ("flashinfer_cutedsl", 'if runner == "flashinfer_cutedsl":'),
    ("flashinfer_trtllm", 'if runner in ("flashinfer_trtllm", "experimental_sgl_trtllm"):'),
    ("experimental_sgl_trtllm", 'if runner in ("flashinfer_trtllm", "experimental_sgl_trtllm"):'),
    ("flashinfer_trtllm_routed", 'if runner == "flashinfer_trtllm_routed":')])
def test_the_flashinfer_runners_force_fusion_off(v, runner, needle):
    t = released(v)
    assert _forced(t, runner, "none") == [f"{OVERRIDES}:{_write_after(t, needle)}"]


@pytest.mark.parametrize("v", RELEASES)
def test_other_runners_and_the_default_leave_fusion_to_the_gate(v):
    # hpc_ops, cutlass, Triton, Marlin and the default (auto) are in no forcing test
    t = released(v)
    for runner in ("hpc_ops", "flashinfer_cutlass", "triton", "marlin", "cutlass", None):
        assert _forced(t, runner, "none") == [], runner


@pytest.mark.parametrize("v", RELEASES)
def test_the_lora_runners_force_it_where_the_release_says_so(v):
    t = released(v)
    write = _write_after(t, 'if runner in ("lora_triton", "lora_cutedsl", "lora_marlin"):')
    assert _forced(t, "lora_triton", "none") == ([f"{OVERRIDES}:{write}"] if write else [])
    assert (write is not None) == (v == "0.5.23")


@pytest.mark.parametrize("v", RELEASES)
def test_the_all_to_all_adjustments(v):
    t = released(v)
    both = _write_after(t, 'if view.moe_a2a_backend in ("flashinfer", "flashinfer_megamoe"):')
    alone = _write_after(t, 'if view.moe_a2a_backend == "flashinfer":')
    flashinfer = both or alone
    assert _forced(t, "triton", "flashinfer") == [f"{OVERRIDES}:{flashinfer}"]
    assert _forced(t, "triton", "flashinfer_megamoe") == ([f"{OVERRIDES}:{both}"] if both else [])
    v2 = _write_after(t, 'if view.moe_a2a_backend == "deepep_v2":')
    assert _forced(t, "triton", "deepep_v2") == ([f"{OVERRIDES}:{v2}"] if v2 else [])
    # Waterfill (off by default) would force fusion ON for DeepEP/MegaMoE: no write that turns it off
    assert _forced(t, "triton", "deepep") == [] and _forced(t, "triton", "megamoe") == []


@pytest.mark.parametrize("v", RELEASES)
def test_expert_pack_is_found_and_not_taken_at_the_default_load_format(v):
    t = released(v)
    hook = "arg_groups/expert_pack_hook.py"
    line = _lines(t, hook, "disable_shared_experts_fusion=True,")
    assert len(line) == 1
    assert (hook, line[0]) in {(rel, fo._line(n)) for rel, _, n in fo._writes(t.root, tree_stamp(t.root))}
    assert fo._defaults(t.root, ())["load_format"] == "auto"  # the guard `load_format != "expert_pack"` returns
    assert not any(w.startswith(hook) for w in _forced(t, "triton", "none"))


def test_the_tests_are_three_valued_over_the_fields():
    # a field without a value (quantization: the checkpoint's, listed in the catalogue) is unknown, not its
    # declared default; a local bound to a field reads it (runner = view.moe_runner_backend)
    assert "quantization" in sa.catalog()["shared_fusion"]["server_unknown"]
    expr = lambda s: ast.parse(s, mode="eval").body  # noqa: E731
    known, unknown = fo._Eval({"quantization": None, "moe_runner_backend": "x"}, {"runner": "moe_runner_backend"}), fo._Eval({}, {})
    assert (known.truth(expr("view.quantization == 'fp8'")), unknown.truth(expr("view.quantization == 'fp8'"))) == (False, None)
    assert known.truth(expr("runner in ('x', 'y') and not view.quantization == 'fp8'")) is True
    assert unknown.truth(expr("view.a == 'b' and view.c")) is None and unknown.truth(expr("1 == 2 and view.c")) is False


@pytest.mark.parametrize("key,runner", [
    ("modelopt-nvfp4-trtllm", "flashinfer_trtllm"), ("modelopt-nvfp4-trtllm-routed", "flashinfer_trtllm_routed"),
    ("Fp8MoEMethod/flashinfer_trtllm_routed", "flashinfer_trtllm_routed"),
    ("ModelOptNvFp4OnlineFusedMoEMethod/flashinfer_trtllm", "flashinfer_trtllm")])
def test_the_trtllm_paths_round_12_called_fused_are_not(key, runner):
    t = released("0.5.23")
    needle = ('if runner == "flashinfer_trtllm_routed":' if runner.endswith("routed")
              else 'if runner in ("flashinfer_trtllm", "experimental_sgl_trtllm"):')
    f = next(s for s in sa.path_specs(t) if s["id"] == key)["fusion"]
    assert (f.fused, f.forced) == (0, f"{OVERRIDES}:{_write_after(t, needle)}"), f.why
