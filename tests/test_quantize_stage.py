"""stages.s01_quantize: what notebook 01 calls, on a tiny shape in a temporary run folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ledger_fixtures import ledger_row
from ling_fixtures import TINY
from nvfp4study.checkpoint import layout as L
from nvfp4study.checkpoint import ptq as ptq_wing
from nvfp4study.checkpoint import quantize as quantize_wing
from nvfp4study.core.errors import OutputExists, StageInputMissing
from nvfp4study.core.params import load_params
from nvfp4study.core.paths import RunPaths
from nvfp4study.core.stage import Stage
from nvfp4study.stages import s01_quantize as qs


def _stage(run_dir, **over):
    p = load_params()
    p = p.model_copy(update={"checkpoint": p.checkpoint.model_copy(update={"shape": TINY, "shards": 2,
                                                                            **over.get("checkpoint", {})}),
                             "quantize": p.quantize.model_copy(update=over.get("quantize", {}))})
    return Stage(name="01_quantize", params=p, paths=RunPaths(run_dir))


def test_default_flow_records_claims(run_dir):
    st = _stage(run_dir)
    plan = qs.plan(st.params, st.paths)
    assert plan["action"] == "quantize" and plan["source_kind"] == "generate"
    src = qs.build_source(st.params, st.paths, plan)
    assert src["random_weights"] and src["tensors"] == len(L.tensor_specs(TINY)) and not src["reused"]
    rep = qs.run_quantize(st.params, st.paths, plan, src)
    data = json.loads(st.paths.data("quantize", "json").read_text())
    assert data["source"] == plan["source"] and data["quantized"] == plan["quantized"]
    assert data["counts"]["expert_weight_packed"] == 3 * 8 * 2
    probe = qs.probes(st.params, st.paths, plan)
    assert not probe["probes"]["stock_tables"]["ok"] and probe["probes"]["both_emptied"]["ok"]
    assert not probe["probes"]["w4a4_scheme_NVFP4"]["ok"]
    assert probe["shared"]["share_fraction"] == 1.0 and probe["shared_is_min_of_unshared"]
    assert not st.paths.work(qs.UNSHARED_DIR).exists()
    assert qs.gate_up_figure(st.paths, probe).exists()
    rt = qs.run_roundtrip(st.params, st.paths, plan)
    assert rt["summary"]["all_within_bound"] and st.paths.figure("roundtrip").exists()
    table = qs.record_ledger(st, rep, probe, rt)
    assert set(table["id"]) >= {"provenance.model-free-ptq", "provenance.fused-maps"}
    r = ledger_row(run_dir, "provenance.model-free-ptq")
    assert r["verdict"] == "partly" and "0.12.0.1" in r["note"] and r["measured"]["llmcompressor"] == "0.13.0"
    assert "cannot calibrate activations" in r["measured"]["w4a4_scheme_refused"]
    assert f"scheme {rep['scheme']} quantized" in r["note"] and "NOT the card's" in r["note"]
    assert f"llmcompressor {rep['llmcompressor']} / compressed-tensors {rep['compressed_tensors']}" in r["note"]
    assert not [f.name for f in st.paths.data("x", "json").parent.iterdir() if f.name.endswith(".tmp")]
    assert ledger_row(run_dir, "provenance.fused-maps")["measured"]["stock_tables"].startswith("fails:")
    assert ledger_row(run_dir, "quantize.gate-up-global-scale")["verdict"] == "reproduced"
    assert ledger_row(run_dir, "quantize.roundtrip-within-bound")["verdict"] == "reproduced"
    # a second execution in the same run folder reuses the identical source, replaces the output
    again = qs.build_source(st.params, st.paths, plan)
    assert again["reused"]
    qs.run_quantize(st.params, st.paths, plan, again)
    other = _stage(run_dir, checkpoint={"seed": 9})
    with pytest.raises(OutputExists):
        qs.build_source(other.params, other.paths, qs.plan(other.params, other.paths))


def test_a_complete_identical_output_is_reused_unless_redo(run_dir, monkeypatch):
    st = _stage(run_dir, quantize={"compare_unshared": False})
    plan = qs.plan(st.params, st.paths)
    assert plan["action"] == "quantize" and plan["estimate_s"] > 0
    # the estimate is the layout's BF16 bytes over the assumed rate, as printed
    expect = sum(L.spec_nbytes(x) for x in L.tensor_specs(TINY)) / (st.params.quantize.assumed_mb_per_s * 1e6)
    assert plan["estimate_s"] == pytest.approx(expect)
    assert "assumed" in qs.plan_markdown(plan)
    first = qs.run_quantize(st.params, st.paths, plan, qs.build_source(st.params, st.paths, plan))
    qs.probes(st.params, st.paths, plan)

    def boom(*a, **k):
        raise AssertionError("quantized again")

    monkeypatch.setattr(quantize_wing, "quantize_checkpoint", boom)
    monkeypatch.setattr(ptq_wing, "run_ptq", boom)
    again = qs.plan(st.params, st.paths)
    assert again["action"] == "reuse" and "quantize.redo=true" in again["reason"]
    assert "Reusing" in qs.plan_markdown(again)
    rep = qs.run_quantize(st.params, st.paths, again, qs.build_source(st.params, st.paths, again))
    assert rep["counts"] == first["counts"] and rep["action"] == "quantize"
    assert qs.probes(st.params, st.paths, again)["run"]
    # asked to redo, or other quantize params, or a shard gone: quantize again
    redo = _stage(run_dir, quantize={"compare_unshared": False, "redo": True})
    assert qs.plan(redo.params, redo.paths)["action"] == "quantize"
    other = _stage(run_dir, quantize={"compare_unshared": False, "max_workers": 2})
    assert qs.plan(other.params, other.paths)["action"] == "quantize"
    next(Path(first["quantized"]).glob("*.safetensors")).unlink()
    assert qs.plan(st.params, st.paths)["action"] == "quantize"


def test_skip_when_quantized_path_given(run_dir):
    st = _stage(run_dir, checkpoint={"quantized_path": "/models/card"})
    plan = qs.plan(st.params, st.paths)
    assert plan["action"] == "skip" and "quantized_path" in plan["reason"]
    src = qs.build_source(st.params, st.paths, plan)
    rep = qs.run_quantize(st.params, st.paths, plan, src)
    assert json.loads(st.paths.data("quantize", "json").read_text())["quantized"] == "/models/card"
    probe = qs.probes(st.params, st.paths, plan)
    rt = qs.run_roundtrip(st.params, st.paths, plan)
    assert not rt["run"]
    qs.record_ledger(st, rep, probe, rt)
    r = ledger_row(run_dir, "provenance.model-free-ptq")
    assert r["verdict"] == "not run" and "quantized_path" in r["note"]
    assert not st.paths.work(qs.SOURCE_DIR).exists()


def test_skip_when_disabled(run_dir):
    st = _stage(run_dir, quantize={"enabled": False})
    plan = qs.plan(st.params, st.paths)
    rep = qs.run_quantize(st.params, st.paths, plan, qs.build_source(st.params, st.paths, plan))
    assert rep["quantized"] is None and rep["reason"] == "quantize.enabled is false"
    assert "skipped" in qs.counts_table(rep)["value"][0]


def test_read_quantize_json_missing(tmp_path):
    with pytest.raises(StageInputMissing):
        qs.read_quantize_json(RunPaths(tmp_path))


def test_path_source_needs_source_path(run_dir):
    from nvfp4study.core.errors import SourceCheckpointMissing

    st = _stage(run_dir, checkpoint={"source": "path", "source_path": None})
    with pytest.raises(SourceCheckpointMissing, match="source_path"):
        qs.plan(st.params, st.paths)
