"""Stage 03's verdict rules (``s03_sglang.record_claims``) on small hand-made data files, and
the patcher's roll-back on an interrupt. No SGLang tree is read: each test writes the five JSON
files record_claims reads into a temp run folder, changes one thing, and checks the exact verdict."""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from nvfp4study.core import ledger
from nvfp4study.core.errors import PatchTargetReadOnly
from nvfp4study.core.params import DEFAULT_PARAMS
from nvfp4study.core.stage import open_stage
from nvfp4study.sglang import patch_journal
from nvfp4study.stages import s03_sglang as s3

V = "0.5.23"
CARD = s3.CARD_VERSION


def _audit_row(path: str, verdict: str, version: str = V, rule: str = "r") -> dict[str, Any]:
    """One clamp path's row of the audit's data file."""
    return {"path": path, "verdict": verdict, "rule": rule, "file": "f.py", "line": 1, "sglang_version": version}


def _audit(version: str = V) -> list[dict[str, Any]]:
    return [_audit_row("nvfp4-w4a4-cutlass", "APPROX", version, "Swiglu + swiglu_limit -> SwigluBias"),
            _audit_row("nvfp4-w4a4-trtllm", "DROPPED", version, "literal gemm1_clamp_limit=None"),
            _audit_row("triton", "EXACT", version), _audit_row("marlin", "DROPPED", version, "alpha-only branch"),
            _audit_row("ascend", "EXACT", version), _audit_row("deep-gemm", "DROPPED", version),
            _audit_row("deep-gemm-contiguous", "DROPPED", version), _audit_row("mxint4-trtllm", "APPROX", version)]


def _checks(in_ignore: Any = True, untargeted: Any = False, sees: Any = False) -> dict[str, Any]:
    return {"min_deepgemm_dim": {"value": 16, "line": 298, "guard": "N >= MIN_DEEPGEMM_DIM", "guard_lines": [303],
                                 "n32_to_deepgemm": True, "reraise_line": 271},
            "input_global_scales": {"w13_input_global_scale": {"alloc": "torch.empty", "line": 152},
                                    "w2_input_global_scale": {"alloc": "torch.empty", "line": 161}},
            "moe_scheme": {"W4A16@sm100": {"scheme": "CompressedTensorsW4A16Nvfp4MoE"}},
            "shared_fusion": {"file": "models/bailing_moe_v3.py", "line": 1461, "considers_clamp_lists": sees,
                              "evaluations": {
                                  "shared experts in ignore (regex)": {"fusion_disabled": in_ignore},
                                  "shared experts only untargeted": {"fusion_disabled": untargeted}}}}


def _rt(version: str, mode: str, verdict: str) -> dict[str, Any]:
    return {"sglang": version, "mode": mode, "cutlass_verdict": verdict, "cutlass_rule": "r", "verify_ok": True,
            "idempotent": True, "byte_identical_after_revert": True}


def _numerics_row(L: float, le: float = 0.0, gt: float | None = None, rel: float | None = None) -> dict[str, Any]:
    # L - silu(L) = L / (1 + e^L); relative to post = L: 1 / (1 + e^L) = 1 - sigmoid(L)
    gap, gap_rel = L / (1 + math.exp(L)), 1 / (1 + math.exp(L))
    return {"limit": L, "pair": "pre vs post", "gate_gap_le_L": le, "gate_gap_gt_L": gap if gt is None else gt,
            "gate_gap_rel_gt_L": gap_rel if rel is None else rel, "gate_gap": gap, "gate_gap_rel": gap_rel}


def _inputs() -> dict[str, Any]:
    return {"sglang_audit": _audit(),
            "sglang_audit_versions": _audit(CARD) + _audit(V),
            "sglang_checks": {CARD: _checks(), V: _checks()},
            "sglang_patch_roundtrip": [_rt(CARD, "card", "APPROX"), _rt(V, "exact", "EXACT")],
            "clamp_numerics": {"rows": [_numerics_row(4.0, le=4.4e-16), _numerics_row(7.0)]}}


def _run(tmp_path: Path, data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    st = open_stage("03_patch_sglang", str(DEFAULT_PARAMS), str(tmp_path / "run"))
    for stem, obj in data.items():
        st.paths.data(stem).write_text(json.dumps(obj))
    s3.record_claims(st, V)
    return {r["id"]: r for r in ledger.read_ledger(st.run_dir)}


def test_baseline_verdicts(tmp_path):
    rows = _run(tmp_path, _inputs())
    got = {k: rows[k]["verdict"] for k in ("clamp.nvfp4-dropped", "clamp.others-forward", "clamp.cutlass-fix",
                                           "serve.shared-fusion-off", "finding.approx-size")}
    assert got == {"clamp.nvfp4-dropped": "partly", "clamp.others-forward": "contradicted",
                   "clamp.cutlass-fix": "partly", "serve.shared-fusion-off": "partly",
                   "finding.approx-size": "reproduced"}
    assert rows["clamp.others-forward"]["measured"]["marlin"] == {"marlin": "DROPPED"}
    assert rows["finding.approx-size"]["measured"]["L=4"] == {
        "max_gate_gap_g_le_L": 4.4e-16, "max_gate_gap_g_gt_L": 4 / (1 + math.exp(4)),
        "max_relative_gate_gap_g_gt_L": 1 / (1 + math.exp(4))}


# --- clamp.others-forward -----------------------------------------------------------------------
def _forwarding_audit() -> list[dict[str, Any]]:
    a = _audit()
    for r in a:
        if r["path"] in ("marlin", "deep-gemm", "deep-gemm-contiguous"):
            r["verdict"] = "EXACT"
    return a


def test_others_forward_all_forward(tmp_path):
    d = _inputs()
    d["sglang_audit"] = _forwarding_audit()
    assert _run(tmp_path, d)["clamp.others-forward"]["verdict"] == "reproduced"


def test_others_forward_missing_and_absent_paths_are_skipped(tmp_path):
    d = _inputs()
    a = [r for r in _forwarding_audit() if r["path"] != "marlin"]  # marlin not audited at all
    for r in a:
        if r["path"] == "ascend":
            r["verdict"] = "ABSENT"
        if r["path"] == "deep-gemm-contiguous":
            r["verdict"] = "ABSENT"  # deep_gemm still decided by "deep-gemm"
    d["sglang_audit"] = a
    row = _run(tmp_path, d)["clamp.others-forward"]
    # the rest forward, but two runners could not be checked: not "reproduced", not "contradicted"
    assert row["verdict"] == "partly"
    assert set(row["measured"]) == {"triton", "deep_gemm", "mxint4"}
    assert row["measured"]["deep_gemm"] == {"deep-gemm": "EXACT"}
    assert "marlin (not audited)" in row["note"] and "ascend (ABSENT)" in row["note"]
    assert "deep-gemm-contiguous (ABSENT)" in row["note"]


def test_others_forward_absent_does_not_count_as_dropping(tmp_path):
    d = _inputs()
    a = _forwarding_audit()
    for r in a:
        if r["path"] in ("deep-gemm", "deep-gemm-contiguous"):
            r["verdict"] = "ABSENT"
    d["sglang_audit"] = a
    row = _run(tmp_path, d)["clamp.others-forward"]
    assert row["verdict"] == "partly" and "deep_gemm" not in row["measured"]


def test_others_forward_nothing_decided_is_not_run(tmp_path):
    d = _inputs()
    d["sglang_audit"] = [r for r in _audit() if r["path"].startswith("nvfp4")]
    row = _run(tmp_path, d)["clamp.others-forward"]
    assert row["verdict"] == "not run" and row["measured"] is None


def test_others_forward_a_drop_still_contradicts_with_skips(tmp_path):
    d = _inputs()
    d["sglang_audit"] = [r for r in _audit() if r["path"] != "ascend"]  # marlin still DROPPED
    assert _run(tmp_path, d)["clamp.others-forward"]["verdict"] == "contradicted"


# --- clamp.cutlass-fix --------------------------------------------------------------------------
@pytest.mark.parametrize("card_verdict,expected", [("EXACT", "reproduced"), ("APPROX", "partly"),
                                                   ("DROPPED", "contradicted")])
def test_cutlass_fix_from_card_patch(tmp_path, card_verdict, expected):
    d = _inputs()
    d["sglang_patch_roundtrip"][0]["cutlass_verdict"] = card_verdict
    row = _run(tmp_path, d)["clamp.cutlass-fix"]
    assert row["verdict"] == expected
    assert row["measured"][f"card_patch_on_{CARD}"] == card_verdict


def test_cutlass_fix_not_run_has_no_measured(tmp_path):
    d = _inputs()
    d["sglang_patch_roundtrip"] = [_rt(V, "exact", "EXACT")]
    row = _run(tmp_path, d)["clamp.cutlass-fix"]
    assert row["verdict"] == "not run" and row["measured"] is None
    assert "CUTLASS APPROX" in row["note"] and "'exact' patch on 0.5.23: EXACT" in row["note"]


# --- serve.shared-fusion-off --------------------------------------------------------------------
@pytest.mark.parametrize("in_ignore,untargeted,sees,expected", [
    (False, False, False, "reproduced"),   # SGLang never turns fusion off: the flag is required
    (False, False, True, "reproduced"),
    (True, False, False, "partly"),        # off by itself for one layout only
    (True, True, False, "partly"),         # always off for BF16 shared experts, but blind to the clamp
    (True, True, True, "contradicted"),    # off by itself and aware of the clamp lists: flag not needed
    (None, False, False, "not run"),       # the veto was not evaluated
])
def test_shared_fusion_verdict(tmp_path, in_ignore, untargeted, sees, expected):
    d = _inputs()
    d["sglang_checks"][V] = _checks(in_ignore, untargeted, sees)
    row = _run(tmp_path, d)["serve.shared-fusion-off"]
    assert row["verdict"] == expected
    if expected == "not run":
        assert row["measured"] is None
    else:
        assert row["measured"][V]["auto_off_shared_in_ignore"] is in_ignore
        assert f"names the shared experts: {in_ignore}" in row["note"]


def test_shared_fusion_veto_not_found(tmp_path):
    d = _inputs()
    d["sglang_checks"][V]["shared_fusion"] = {"file": "models/bailing_moe_v3.py", "check": None, "evaluations": {}}
    assert _run(tmp_path, d)["serve.shared-fusion-off"]["verdict"] == "not run"


# --- finding.approx-size ------------------------------------------------------------------------
@pytest.mark.parametrize("row,expected", [
    (_numerics_row(4.0, le=1e-3), "contradicted"),                 # forms differ below the limit
    (_numerics_row(4.0, gt=0.05), "contradicted"),                 # gap above L is not L - silu(L)
    (_numerics_row(4.0, rel=0.02), "contradicted"),                # relative gap is not 1 - sigmoid(L)
    (_numerics_row(4.0, le=8.9e-16), "reproduced"),                # rounding only
])
def test_approx_size_from_grid(tmp_path, row, expected):
    d = _inputs()
    d["clamp_numerics"] = {"rows": [row, _numerics_row(7.0)]}
    assert _run(tmp_path, d)["finding.approx-size"]["verdict"] == expected


def test_approx_size_on_the_real_grid(tmp_path):
    from nvfp4study.sglang import clamp_numerics as cn

    d = _inputs()
    d["clamp_numerics"] = {"rows": cn.compare(n=101).to_dict(orient="records")}
    row = _run(tmp_path, d)["finding.approx-size"]
    assert row["verdict"] == "reproduced"
    assert row["measured"]["L=5"]["max_gate_gap_g_gt_L"] == pytest.approx(5 / (1 + math.exp(5)), rel=1e-12)


def test_missing_input_file(tmp_path):
    from nvfp4study.core.errors import StageInputMissing

    d = _inputs()
    del d["clamp_numerics"]
    with pytest.raises(StageInputMissing):
        _run(tmp_path, copy.deepcopy(d))


# --- patch_journal.write_all: roll back on any exception ----------------------------------------
def _two_files(tmp_path: Path) -> tuple[dict[Path, bytes], dict[Path, bytes]]:
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_bytes(b"A0\n")
    b.write_bytes(b"B0\n")
    return {a: b"A1\n", b: b"B1\n"}, {a: b"A0\n", b: b"B0\n"}


def test_write_all_interrupt_between_renames_rolls_back(tmp_path, monkeypatch):
    new, old = _two_files(tmp_path)
    real, calls = os.replace, []

    def replace(src, dst):
        calls.extend([dst] if Path(dst) in new else [])  # target renames, not the journal's
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(src, dst)

    monkeypatch.setattr(patch_journal.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        patch_journal.write_all(tmp_path, new, old)
    assert {p: p.read_bytes() for p in old} == old
    assert sorted(x.name for x in tmp_path.iterdir()) == ["a.py", "b.py"]  # no temp file, no journal


def test_write_all_interrupt_right_after_a_rename_rolls_back(tmp_path, monkeypatch):
    new, old = _two_files(tmp_path)
    real = os.replace

    def replace(src, dst):
        real(src, dst)
        if Path(dst) in new:
            raise KeyboardInterrupt  # after the rename, before any bookkeeping

    monkeypatch.setattr(patch_journal.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        patch_journal.write_all(tmp_path, new, old)
    assert {p: p.read_bytes() for p in old} == old


def test_write_all_oserror_is_named(tmp_path, monkeypatch):
    new, old = _two_files(tmp_path)
    real, calls = os.replace, []

    def replace(src, dst):
        calls.extend([dst] if Path(dst) in new else [])  # target renames, not the journal's
        if len(calls) == 2:
            raise OSError("disk full")
        real(src, dst)

    monkeypatch.setattr(patch_journal.os, "replace", replace)
    with pytest.raises(PatchTargetReadOnly):
        patch_journal.write_all(tmp_path, new, old)
    assert {p: p.read_bytes() for p in old} == old


# --- finding.clamp-kernels-measured: the stored GPU measurement, as evidence ----------------------
def test_kernel_measurement_is_a_finding_with_its_machine(tmp_path):
    rows = _run(tmp_path, _inputs())
    row = rows["finding.clamp-kernels-measured"]
    assert row["verdict"] == "reproduced" and row["origin"] == "study"
    assert row["measured"] == {"flashinfer_cutlass/sglang_swiglu": "pre_silu",
                               "flashinfer_cutlass/swiglu_step": "post_silu", "sglang_triton/clamp": "post_silu"}
    assert "NVIDIA H200" in row["checked_on"] and "not made by this run" in row["checked_on"]
    copy = tmp_path / "run" / row["evidence"][0]
    assert json.loads(copy.read_text())["environment"]["gpu"] == "NVIDIA H200"
    for cid in ("clamp.nvfp4-dropped", "finding.nvfp4-cutlass-approx"):  # the clamp rows cite it
        assert row["evidence"][0] in rows[cid]["evidence"] and "NVIDIA H200" in rows[cid]["note"], cid


def test_kernel_measurement_that_disagrees_contradicts(tmp_path, monkeypatch):
    from nvfp4study.sglang import kernel_evidence as ke

    doc = ke.load()
    for key, run in doc["sglang_triton"]["runs"].items():  # as if Triton computed the pre-SiLU form
        if key.startswith("clamp/L=") and "error" not in run:
            for rounding in ("once", "bf16ops"):
                pre, post = run[f"pre_silu/{rounding}"], run[f"post_silu/{rounding}"]
                pre["share_exact_separating"], post["share_exact_separating"] = (
                    post["share_exact_separating"], pre["share_exact_separating"])
                pre["n_separating"], post["n_separating"] = post["n_separating"], pre["n_separating"]
    monkeypatch.setattr(ke, "load", lambda path=None: doc)
    row = _run(tmp_path, _inputs())["finding.clamp-kernels-measured"]
    assert row["verdict"] == "contradicted" and row["measured"]["sglang_triton/clamp"] == "pre_silu"


# --- finding.audit-agreement ----------------------------------------------------------------------
def test_agreement_finding_is_recorded_with_its_provenance(tmp_path):
    """record_claims writes data/sglang_audit_agreement.json and the finding; on these hand-made
    rows no hand-read path is listed, so every reading of an audited release disagrees."""
    from nvfp4study.sglang import agreement as ag

    rows = _run(tmp_path, _inputs())
    row = rows["finding.audit-agreement"]
    n = sum(r.release in (CARD, V) and not r.not_compared for r in ag.hand_readings()[1])
    assert row["measured"]["overall"]["n"] == n and row["measured"]["overall"]["agree"] == 0
    assert row["verdict"] == "contradicted" and "hand_readings.yaml" in row["checked_on"]
    assert "data/sglang_audit_agreement.json" in row["evidence"]
    assert (tmp_path / "run" / "data" / "sglang_audit_agreement.json").is_file()
