"""The verdicts stated from the stored H200 clamp measurement follow from its numbers."""

import copy
import json

import pytest

from nvfp4study.sglang import kernel_evidence as ke


@pytest.fixture(scope="module")
def doc():
    return ke.load()


def test_stored_result_names_machine_and_date(doc):
    assert doc["environment"]["gpu"] == "NVIDIA H200"
    assert doc["environment"]["capability"] == "9.0"
    assert doc["date_utc"].startswith("2026-12-01")
    assert doc["build"]["test_load"] == "loaded"


def test_verdicts_follow_from_the_shares(doc):
    # recomputed here from the raw numbers, independently of ke.decide
    for part, key, want in (("flashinfer_cutlass", "sglang_swiglu", "pre_silu"),
                            ("flashinfer_cutlass", "swiglu_bias", "pre_silu"),
                            ("flashinfer_cutlass", "swiglu_step", "post_silu"),
                            ("sglang_triton", "clamp", "post_silu"),
                            ("sglang_triton", "clamp_alpha", "pre_silu")):
        for lim in ("4", "5", "7"):
            run = doc[part]["runs"][f"{key}/L={lim}"]
            other = "post_silu" if want == "pre_silu" else "pre_silu"
            assert run[f"{want}/once"]["share_exact_separating"] == 1.0
            assert run[f"{want}/once"]["n_separating"] > 5000
            assert run[f"{other}/once"]["share_exact_separating"] == 0.0
            assert run["pad_max_abs"] == 0.0
    s = ke.summary(doc)
    assert s["forms"]["flashinfer_cutlass/sglang_swiglu"] == "pre_silu"
    assert s["forms"]["flashinfer_cutlass/swiglu_step"] == "post_silu"
    assert s["forms"]["sglang_triton/clamp"] == "post_silu"
    assert s["limits"] == [4.0, 5.0, 7.0]
    assert "not made by this run" in s["sentence"] and "NVIDIA H200" in s["sentence"]


def test_tampered_shares_change_the_verdict(doc):
    bad = copy.deepcopy(doc)
    run = bad["flashinfer_cutlass"]["runs"]["sglang_swiglu/L=4"]
    for r in ("once", "bf16ops"):
        run[f"pre_silu/{r}"]["share_exact_separating"] = 0.0
        run[f"post_silu/{r}"]["share_exact_separating"] = 1.0
    s = ke.summary(bad)
    assert s["forms"]["flashinfer_cutlass/sglang_swiglu"] == "mixed"
    run = bad["sglang_triton"]["runs"]["clamp/L=5"]
    run["pre_silu/once"]["share_exact_separating"] = 0.5
    run["post_silu/once"]["share_exact_separating"] = 0.5
    run["post_silu/bf16ops"]["share_exact_separating"] = 0.5
    assert ke.decide(run)[0] == "undecided"


def test_malformed_json_is_refused(tmp_path, doc):
    p = tmp_path / "x.json"
    p.write_text("{not json")
    with pytest.raises(ke.KernelEvidenceError):
        ke.load(p)
    p.write_text(json.dumps({"flashinfer_cutlass": {}}))
    with pytest.raises(ke.KernelEvidenceError):
        ke.load(p)
    bad = copy.deepcopy(doc)
    del bad["sglang_triton"]["runs"]["clamp/L=4"]["post_silu/once"]
    with pytest.raises(ke.KernelEvidenceError):
        ke.verdicts(bad)
