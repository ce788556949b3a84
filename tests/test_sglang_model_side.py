"""The audit's model side (BailingMoeV3 hands the limits over), synthetic edits of a released tree,
releases without the model, and CLI output into a closed pipe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nvfp4study.core.errors import NoBailingMoeV3
from nvfp4study.sglang import audit as sa
from nvfp4study.sglang import audit_report as report
from nvfp4study.sglang import audit_sinks as sinks
from nvfp4study.sglang.model_side import model_side
from sglang_fixtures import VERSIONS, copy23_fixture, edit_once, released  # noqa: F401  (the copy23 fixture)

SRT = "sglang/srt/"
MODEL = SRT + "models/bailing_moe_v3.py"

# Hand reading of models/bailing_moe_v3.py: the line of `gemm1_clamp_limit=self.expert_swiglu_limit`
# in BailingMoE.__init__'s get_moe_impl_class(quant_config)(...) call, and of
# `swiglu_limit=self.share_expert_swiglu_limit` in its BailingMLP(...) shared-expert call.
HANDOVER_LINES = {"0.5.19": (521, 579), "0.5.20": (523, 581), "0.5.21": (594, 654),
                  "0.5.22": (581, 639), "0.5.23": (578, 639)}


@pytest.mark.parametrize("version", VERSIONS)
def test_model_hands_both_limits_over(version):
    side = model_side(released(version))
    assert side.present and side.ok
    assert (side.routed.line, side.shared.line) == HANDOVER_LINES[version]
    assert side.routed.function == side.shared.function == "BailingMoE.__init__"
    assert side.routed.value == "self.expert_swiglu_limit" and side.shared.ok
    assert side.routed.extra == []  # no gemm1_alpha passed


def test_release_without_the_model_gets_one_line(capsys):
    tree = released("0.5.18")
    assert not model_side(tree).present
    with pytest.raises(NoBailingMoeV3, match="no BailingMoeV3 in SGLang 0.5.18: Ling-3.0-flash does not load"):
        sa.audit_tree(tree)
    assert report.main([str(tree.root)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "no BailingMoeV3 in SGLang 0.5.18: Ling-3.0-flash does not load"]


def test_limit_argument_removed_drops_every_path(copy23):
    edit_once(copy23, MODEL, "            gemm1_clamp_limit=self.expert_swiglu_limit,\n", "")
    side = model_side(copy23)
    assert not side.ok and "without gemm1_clamp_limit=" in side.routed.reason
    results = sa.audit_tree(copy23)
    assert {r.verdict.value for r in results} == {"DROPPED"}
    # the construction call get_moe_impl_class(quant_config)(...) starts at line 568
    assert {(r.file, r.line) for r in results} == {("models/bailing_moe_v3.py", 568)}
    byp = {r.path: r for r in results}
    assert byp["mxfp4-cutlass"].rule.endswith("(the path alone: EXACT)")


def test_limit_from_the_wrong_list_drops_every_path(copy23):
    edit_once(copy23, MODEL, "gemm1_clamp_limit=self.expert_swiglu_limit,",
              "gemm1_clamp_limit=self.share_expert_swiglu_limit,")
    results = sa.audit_tree(copy23, ["triton"])
    assert results[0].verdict.value == "DROPPED" and results[0].line == 578
    assert "does not come from config.expert_swiglu_limit_list" in results[0].rule


def test_registry_target_renamed_or_inlined_is_still_followed(copy23):
    rel = SRT + "layers/moe/moe_runner/flashinfer_cutlass.py"
    p = copy23.file(rel)
    p.write_text(p.read_text().replace("_fused_experts_flashinfer_mxfp4_cutlass", "_renamed_mxfp4_impl"))
    r = sa.audit_tree(copy23, ["mxfp4-cutlass"])[0]
    assert (r.verdict.value, r.function) == ("EXACT", "_renamed_mxfp4_impl")
    # 0.5.19 is the inlined case: the kernel call sits in the registry entry itself
    r19 = sa.audit_tree(released("0.5.19"), ["mxfp4-cutlass"])[0]
    assert (r19.verdict.value, r19.function, r19.line) == ("EXACT", "fused_experts_none_to_flashinfer_mxfp4", 412)


def test_named_step_renamed_is_undecided_not_absent(copy23):
    edit_once(copy23, SRT + "layers/quantization/mxfp4_flashinfer_cutlass_moe.py", "    def apply(\n",
              "    def apply_renamed(\n")
    r = sa.audit_tree(copy23, ["mxfp4-cutlass"])[0]
    assert r.verdict.value == "UNDECIDED"
    assert r.rule.startswith("trail lost at layers/quantization/mxfp4_flashinfer_cutlass_moe.py:")
    assert "Mxfp4FlashinferCutlassMoEMethod has no forward_cuda / apply / apply_weights" in r.rule


def test_activation_changed_to_pre_silu_is_approx(copy23):
    edit_once(copy23, SRT + "layers/moe/moe_runner/triton_utils/fused_moe.py",
              "    gate = F.silu(gate)\n    gate = gate.clamp(min=None, max=gemm1_limit)\n",
              "    gate = gate.clamp(min=None, max=gemm1_limit)\n    gate = F.silu(gate)\n")
    r = sa.audit_tree(copy23, ["triton"])[0]
    assert r.verdict.value == "APPROX" and "before SiLU" in r.rule


def _closed_pipe(args: list[str]) -> subprocess.CompletedProcess:
    """Run the CLI with stdout a pipe whose reading end is closed before it writes."""
    env = {**os.environ, "PYTHONPATH": str(Path(sa.__file__).parents[2])}
    p = subprocess.Popen([sys.executable, "-m", "nvfp4study.cli", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    p.stdout.close()
    err = p.stderr.read().decode()
    p.wait(timeout=300)
    return subprocess.CompletedProcess(args, p.returncode, "", err)


@pytest.mark.parametrize("args", [["audit-sglang", "--version", "0.5.23"], ["patch", "status", "--sglang", "@23"]])
def test_cli_survives_a_closed_pipe(args):
    args = [str(released("0.5.23").root) if a == "@23" else a for a in args]
    done = _closed_pipe(args)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 141


# --- which releases carry the model ------------------------------------------------------------
def test_shipped_discovery_matches_the_wheels():
    from nvfp4study.sglang import releases as rel

    data = rel.shipped()
    assert data["member"] == MODEL
    for v, has in data["checked"].items():  # every recorded check re-read from the cached wheel
        released(v)
        assert rel.wheel_has_model(v) is has, v
    assert data["releases"] == list(VERSIONS)
    assert data["checked"]["0.5.18"] is False  # the walk stopped below the oldest carrier


def test_expand_versions():
    from nvfp4study.core.params import SGLangParams
    from nvfp4study.sglang.releases import ALL_BAILING, expand_versions

    assert SGLangParams().audit_versions == [ALL_BAILING]
    got = expand_versions(["0.5.18", ALL_BAILING, "0.5.23"])
    assert got[0] == "0.5.18" and got[1:] == sorted(set(got[1:]), key=got[1:].index)
    assert set(VERSIONS) <= set(got)


# --- kernel facts vs the FlashInfer release each SGLang release pins -------------------------------
def test_flashinfer_pin_and_mismatch_flag():
    # METADATA Requires-Dist: flashinfer_python[cu13]==0.6.18 (0.5.19-0.5.21), 0.7.1 (0.5.22), 0.7.2 (0.5.23)
    pins = {v: sinks.flashinfer_pin(released(v)) for v in VERSIONS}
    assert pins == {"0.5.19": "0.6.18", "0.5.20": "0.6.18", "0.5.21": "0.6.18", "0.5.22": "0.7.1",
                    "0.5.23": "0.7.2"}
    flagged = {v: {r.path for r in sa.audit_tree(released(v)) if r.flashinfer_check and r.catalogued}
               for v in ("0.5.21", "0.5.22", "0.5.23")}
    # the cutlass and trtllm-gen forms were read from every pinned FlashInfer (0.6.18, 0.7.1, 0.7.2:
    # docs/blind-readings/K.md; before 0.7.1 was read, 0.5.21's trtllm paths and 0.5.22's were flagged)
    assert flagged == {"0.5.21": set(), "0.5.22": set(), "0.5.23": set()}
    # a sink whose facts were read from other releases than the pin is flagged, naming both
    note = sinks.flashinfer_check(released("0.5.22"), "trtllm_bf16_moe", {"flashinfer": ["0.7.2", "0.6.18"]})
    assert note is not None and "0.7.2, 0.6.18" in note and "pins 0.7.1" in note
    assert sinks.flashinfer_check(released("0.5.22"), "trtllm_bf16_moe", {"flashinfer": ["0.7.1"]}) is None
