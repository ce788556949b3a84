"""The routed scaling factor (and the other parameters) on every path (issue 36): verdicts of the
catalogued paths read by hand, the CLI, and the parts of the count.

Hand readings (SGLang 0.5.23; the other releases' lines in the tables):
- nvfp4-w4a4-cutlass (the card's path): DROPPED. compressed_tensors_w4a4_nvfp4_moe.py:375 builds
  FlashInferCutlassMoeQuantInfo(apply_routed_scaling_factor=False); flashinfer_cutlass.py 208-218
  multiplies only when that is set, and 394-395 calls it for bf16/fp8 only (Ling's is fp4);
  cutlass_fused_moe takes no factor (371-393); layer.py 109-131 _fuses_routed_scaling_factor_in_topk
  is False for the compressed-tensors method with flashinfer_cutlass (no class attribute, not
  ModelOpt NVFP4, not a TRT-LLM backend, not Fp8+cutlass); bailing_moe_v3.py 609-614 scales only when
  the A2A backend is on (default none). 0.5.19-0.5.22: the same, apply_routed_scaling_factor=False at
  361 / 360 / 375 / 371, _fuses_... at layer.py 103 / 102 / 104 / 104 (no backend argument).
- triton: UNDECIDED. triton.py 239-261 fused_experts(moe_runner_config=runner_config) ->
  fused_moe.py 357 / 392 hand moe_runner_config.routed_scaling_factor to in/outplace_fused_experts ->
  moe_combine_topk 973-1068: on CUDA at most 32 tokens SGLang's own moe_sum_reduce_triton /
  moe_sum_reduce_torch_compile (times the factor), above that the compiled sgl_kernel moe_sum_reduce
  (1020, imported at 59), whose form for the pinned sglang-kernel is not known (docs/blind-readings/KP.md):
  the worst branch is not decided; top-k folds it for none of the methods that run Triton.
- marlin (the runner-level row: its worst caller decides): DROPPED. marlin.py:204
  routed_scaling_factor=runner_config.routed_scaling_factor (199 in 0.5.19-0.5.22) -> fused_marlin_moe.py
  436-443 moe_sum_reduce(..., routed_scaling_factor) for an NVFP4 / INT layer (UNDECIDED alone: the compiled
  sgl_kernel sum, as Triton's); but the
  kernel's MXFP4 branch (E8M0 scales, fused_marlin_moe.py 204-210) sums plainly (401-417 in 0.5.20), and
  Mxfp4MoEMethod/marlin hands an E8M0 layer without top-k folding the factor (issue 36; APPLIED before).
- nvfp4-w4a16-marlin: UNDECIDED where the class exists (0.5.22, 0.5.23): the same Marlin call, whose sum is
  the compiled sgl_kernel moe_sum_reduce (fused_marlin_moe.py 438 / 440, imported on CUDA only at 16 / 17).
- nvfp4-w4a4-cutlass with the study's ``exact`` patch set: APPLIED, once, by the runner. The patched
  scheme sets apply_routed_scaling_factor=(not layer.should_fuse_routed_scaling_factor_in_topk and
  get_moe_a2a_backend().is_none()) (unknown to the audit, so the product is reached) and the patched
  runner's post-call product covers fp4; mul_ in _maybe_apply_routed_scaling_factor (flashinfer_cutlass.py
  217 + the patch's 4 lines in 0.5.23). The scheme's flag alone (runner as released) stays DROPPED: the
  runner's bf16/fp8 test is decided for "fp4". Top-k and the model still say no, and ModelOpt NVFP4's
  path (top-k folds it, its flag is False) stays APPLIED once.
- fused-moe-native (the CPU engine's path): DROPPED. fused_moe_native.py 150-158 weights the expert
  outputs by topk_weights only; top-k does not fold it for UnquantizedFusedMoEMethod; the model
  does not (standard dispatch). Measured so on the CPU engine (issue 36: byte-identical outputs with
  the factor at 1.0, 2.5 and 10).
"""

from __future__ import annotations

import json

import pytest

from nvfp4study.cli import main as cli_main
from nvfp4study.core.errors import AuditError
from nvfp4study.sglang import patch as sp
from nvfp4study.sglang.param_audit import ParamVerdict, audit_param
from nvfp4study.sglang.source import copy_tree
from sglang_fixtures import VERSIONS, copy23_fixture, edit_once, release_gaps, released  # noqa: F401 (the copy23 fixture)

A, D, X, U = ParamVerdict.APPLIED, ParamVerdict.DROPPED, ParamVerdict.ABSENT, ParamVerdict.UNDECIDED
CT = "layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4_moe.py"
#: path -> release -> (verdict, file, line) read by hand (the module docstring); line None: not asserted
EXPECTED = {
    "nvfp4-w4a4-cutlass": {"0.5.19": (D, CT, 361), "0.5.20": (D, CT, 360), "0.5.21": (D, CT, 375),
                           "0.5.22": (D, CT, 371), "0.5.23": (D, CT, 375)},
    "triton": {v: (U, "layers/moe/moe_runner/triton.py", None) for v in VERSIONS},
    "marlin": {v: (D, None, None) for v in VERSIONS},
    "nvfp4-w4a16-marlin": {"0.5.19": (X, None, None), "0.5.20": (X, None, None), "0.5.21": (X, None, None),
                           "0.5.22": (U, "layers/moe/moe_runner/marlin.py", None),
                           "0.5.23": (U, "layers/moe/moe_runner/marlin.py", None)},
    "fused-moe-native": {v: (D, "layers/moe/fused_moe_native.py", 158) for v in VERSIONS},
}
#: layer.py's _fuses_routed_scaling_factor_in_topk, read by hand
TOPK_LINE = {"0.5.19": 103, "0.5.20": 102, "0.5.21": 104, "0.5.22": 104, "0.5.23": 109}


def test_every_release_is_expected():
    assert release_gaps(EXPECTED, VERSIONS) == {}
    assert release_gaps({"topk": TOPK_LINE}, VERSIONS) == {}


@pytest.fixture(name="rows", scope="module")
def rows_fixture():
    return {v: {r.path: r for r in audit_param(released(v), "routed_scaling_factor", list(EXPECTED))}
            for v in VERSIONS}


@pytest.mark.parametrize("path", list(EXPECTED))
@pytest.mark.parametrize("version", VERSIONS)
def test_hand_read_verdicts(rows, version, path):
    verdict, file, line = EXPECTED[path][version]
    r = rows[version][path]
    assert r.verdict == verdict, r.rule
    if file is not None:
        assert r.file == file, (r.file, r.line, r.rule)
    if line is not None:
        assert r.line == line, (r.file, r.line, r.rule)


@pytest.mark.parametrize("version", VERSIONS)
def test_card_path_evidence_names_each_part(rows, version):
    r = rows[version]["nvfp4-w4a4-cutlass"]
    assert r.parts == {"top-k": 0, "runner": 0, "model": 0}
    ev = "\n".join(r.evidence)
    assert f"{CT}:{EXPECTED['nvfp4-w4a4-cutlass'][version][2]} FlashInferCutlassMoeQuantInfo.apply_routed_scaling_factor = False" in ev
    assert f"layers/moe/fused_moe_triton/layer.py:{TOPK_LINE[version]} _fuses_routed_scaling_factor_in_topk(" \
           "CompressedTensorsW4A4Nvfp4MoE, flashinfer_cutlass) -> False" in ev
    assert "models/bailing_moe_v3.py:" in ev and "(standard dispatch) -> no" in ev
    assert "1/2.5" in r.rule  # Ling's factor, from the data


def test_triton_epilogue_reaches_the_compiled_sum_on_cuda(rows):
    r = rows["0.5.23"]["triton"]
    assert r.parts == {"top-k": 0, "runner": None, "model": 0}
    assert r.line == 239 and "fused_experts() takes it, its use not read" in r.evidence[0]
    assert "fused_moe.py:1020 moe_sum_reduce() on CUDA" in r.evidence[0]


def test_cli_param_json_gives_the_card_path_dropped(capsys):
    assert cli_main(["audit-sglang", "--param", "routed_scaling_factor", "--version", "0.5.23", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    card = next(r for r in rows if r["path"] == "nvfp4-w4a4-cutlass")
    assert (card["verdict"], card["file"], card["line"]) == ("DROPPED", CT, 375)
    assert {r["path"]: r["verdict"] for r in rows if r["path"] in ("triton", "marlin")} == \
        {"triton": "UNDECIDED", "marlin": "DROPPED"}  # marlin: its worst caller, Mxfp4MoEMethod/marlin (E8M0)
    assert all(r["param"] == "routed_scaling_factor" for r in rows)


def test_cli_param_names_a_bad_parameter(capsys):
    assert cli_main(["audit-sglang", "--param", "routing_bias", "--version", "0.5.23"]) != 0
    err = capsys.readouterr().err
    assert "AuditError: no MoE parameter 'routing_bias'; followed: gemm1_clamp_limit, routed_scaling_factor" in err


def test_the_clamp_is_not_a_param_audit_row():
    with pytest.raises(AuditError, match="gemm1_clamp_limit is the clamp"):
        audit_param(released("0.5.23"), "gemm1_clamp_limit", ["triton"])


def test_routing_parameters_are_followed_on_the_card_path():
    # TopK routes the card's path (flashinfer_cutlass takes top-k ids and weights): select_experts'
    # biased_grouped_topk call (tests/test_sglang_param_routing.py reads it per release)
    (r,) = audit_param(released("0.5.23"), "grouped_topk", ["nvfp4-w4a4-cutlass"])
    assert r.verdict == ParamVerdict.APPLIED and r.file == "layers/moe/topk.py"
    assert "biased_grouped_topk() routes with grouped_topk" in r.rule


# --- the exact patch set applies the factor on the card's path (issue 36, item 4) -----------------
RUNNER = "layers/moe/moe_runner/flashinfer_cutlass.py"
#: the paths read on each patched copy: the card's, and ModelOpt NVFP4's (same runner, top-k folds it)
PATCHED_PATHS = ["nvfp4-w4a4-cutlass", "modelopt-nvfp4-cutlass"]


@pytest.fixture(name="patched_rows", scope="module")
def patched_rows_fixture(tmp_path_factory):
    """Each release copied, ``exact`` applied, the routed scaling audit of PATCHED_PATHS read, then
    reverted: {version: ({path: row}, reverted byte for byte)}."""
    out = {}
    for v in VERSIONS:
        tree = copy_tree(released(v), tmp_path_factory.mktemp("x") / f"sglang-{v}")
        files = [e["path"] for e in sp._files(v, "exact")]
        before = {f: tree.file(f).read_bytes() for f in files}
        assert sp.apply(tree, "exact") and sp.status(tree)["clamp_mode"] == "exact"
        rows = {r.path: r for r in audit_param(tree, "routed_scaling_factor", PATCHED_PATHS)}
        sp.revert(tree, "exact")
        out[v] = (rows, all(tree.file(f).read_bytes() == before[f] for f in files)
                  and sp.status(tree)["clamp_mode"] == "stock")
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_exact_patch_applies_the_factor_once_on_the_card_path(rows, patched_rows, version):
    assert rows[version]["nvfp4-w4a4-cutlass"].verdict == D  # released
    got, reverted = patched_rows[version]
    r = got["nvfp4-w4a4-cutlass"]
    assert r.verdict == A, r.rule
    assert r.parts == {"top-k": 0, "runner": 1, "model": 0} and r.file == RUNNER
    ev = "\n".join(r.evidence)
    assert f"{RUNNER}:{r.line} mul_() applies it" in ev
    assert "FlashInferCutlassMoeQuantInfo.apply_routed_scaling_factor = ? (not layer.should_fuse_routed_scaling" in ev
    # ModelOpt NVFP4 shares the runner and passes False: still once, by top-k, never DOUBLE
    mo = got["modelopt-nvfp4-cutlass"]
    assert mo.verdict == A and mo.parts == {"top-k": 1, "runner": 0, "model": 0}, mo.rule
    assert reverted  # revert restores the released bytes


def test_the_schemes_flag_alone_leaves_it_dropped(copy23):
    """Half the patch (the scheme's flag True, the runner as released) applies nothing: the runner
    multiplies after the fused call for bf16/fp8 only (flashinfer_cutlass.py:394), and the audit
    decides that test for Ling's fp4."""
    edit_once(copy23, "sglang/srt/" + CT, "apply_routed_scaling_factor=False,\n            )\n            return self",
              "apply_routed_scaling_factor=True,\n            )\n            return self")
    (r,) = audit_param(copy23, "routed_scaling_factor", ["nvfp4-w4a4-cutlass"])
    assert r.verdict == D and r.parts["runner"] == 0, r.rule
    assert f"{CT}:375 FlashInferCutlassMoeQuantInfo.apply_routed_scaling_factor = True" in "\n".join(r.evidence)
