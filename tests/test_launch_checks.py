"""Launch-log parsing: clamp lines per layer, load lines, warnings (hand-written logs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvfp4study.stages import s04_launch as lc
from nvfp4study.stages.claim_rules import r04_launch as r04
from serving_fixtures import ling_model_dir

P = "[2026-01-02 03:04:05 TP0] "


def _card_log(limits: dict[int, int], first=2, layers=42, rank="TP0", draft=True) -> str:
    pre = f"[2026-01-02 03:04:05 {rank}] "
    lines = [f"{pre}Load weight begin. avail mem=120.00 GB"]
    for i in range(first, layers):
        lines.append(f"{pre}[swiglu-clamp-patch] cutlass nvfp4 limit={limits.get(i, 'None')}")
    lines.append(f"{pre}Load weight end. elapsed=301.25 s, type=BailingMoeV3ForCausalLM, quant=compressed-tensors, "
                 "avail mem=40.10 GB, mem usage=71.80 GB.")
    if draft:
        lines.append(f"{pre}[swiglu-clamp-patch] cutlass nvfp4 limit=None")
        lines.append(f"{pre}Load weight end. elapsed=4.00 s, type=BailingMoeForCausalLMNextN, avail mem=37.00 GB, "
                     "mem usage=3.10 GB.")
    return "\n".join(lines)


def test_parse_card_form():
    rows = lc.parse_clamp_lines(P + "[swiglu-clamp-patch] cutlass nvfp4 limit=4\n" + P + "other line\n"
                                + P + "[swiglu-clamp-patch] cutlass nvfp4 limit=None")
    assert [(r["rank"], r["order"], r["path"], r["limit"], r["layer"], r["mode"]) for r in rows] == [
        ("TP0", 0, "cutlass nvfp4", 4.0, None, None), ("TP0", 1, "cutlass nvfp4", None, None, None)]


def test_parse_key_value_form():
    (r,) = lc.parse_clamp_lines("[2026-01-02 03:04:05 TP1 EP1] [swiglu-clamp-patch] layer=35 "
                                "path=cutlass-nvfp4 mode=exact form=SwigluStep limit=4.0")
    assert (r["rank"], r["layer"], r["mode"], r["path"], r["limit"]) == ("TP1 EP1", 35, "exact", "cutlass-nvfp4", 4.0)


def test_parse_the_study_patch_forms():
    # the strings logged by patches/0.5.23/exact/02-... and none/01-... (issue 4's patch sets)
    exact, none = lc.parse_clamp_lines(
        P + "[swiglu-clamp-patch] cutlass nvfp4 limit=4 mode=exact form=SwigluStep layer=35\n"
        + P + "[swiglu-clamp-patch] cutlass nvfp4 limit=None mode=none config_limit=4 layer=36")
    assert (exact["path"], exact["limit"], exact["mode"], exact["form"], exact["layer"]) == (
        "cutlass nvfp4", 4.0, "exact", "SwigluStep", 35)
    assert (none["limit"], none["mode"], none["config_limit"], none["layer"]) == (None, "none", 4.0, 36)


def test_layers_assigned_in_construction_order(tmp_path):
    cfg = json.loads((ling_model_dir(tmp_path / "m") / "config.json").read_text())
    exp = lc.expected_limits(cfg)
    assert exp["moe_layers"] == list(range(2, 42)) and exp["limit"][35] == 4.0 and exp["limit"][34] is None
    text = _card_log({i: 4 for i in range(35, 42)}) + "\n" + _card_log({}, rank="TP1")  # two ranks log
    got = lc.assign_layers(lc.parse_clamp_lines(text), exp)
    assert len(got) == 41 and {g["rank"] for g in got} == {"TP0"}
    by = {g["assigned"]: g["limit"] for g in got}
    assert by[2] is None and by[34] is None and all(by[i] == 4.0 for i in range(35, 42)) and by["draft"] is None


def test_load_lines_and_units():
    loads = lc.parse_load_lines(_card_log({}))
    assert [(x["type"], x["elapsed_s"], x["mem_gib"]) for x in loads] == [
        ("BailingMoeV3ForCausalLM", 301.25, 71.8), ("BailingMoeForCausalLMNextN", 4.0, 3.1)]
    # SGLang's "GB" is bytes / 2**30 (utils/common.py 576): 71.8 GiB = 77.09 GB of 1e9 bytes
    assert round(71.8 * lc.GIB / 1e9, 2) == 77.09


def test_warnings():
    text = "\n".join([
        P + "w1_weight_global_scale must match w3_weight_global_scale. Accuracy may be affected.",
        "[2026-01-02 03:04:05] Auto-detected --reasoning-parser as 'ling3' from model architecture 'X'",
        P + "clean line"])
    rows = {r["warning"]: r for r in lc.find_warnings(text, {"reasoning_parser": "ling3"})}
    assert rows["gate/up global scales differ"]["count"] == 1
    assert "ling3" in rows["reasoning parser auto-detected"]["first line"]
    assert "reasoning_content" in rows["reasoning parser active"]["first line"]
    assert lc.find_warnings(P + "all fine", {"reasoning_parser": None}) == []


@pytest.mark.parametrize("layers,expected", [([2, 3, 4, 7, 9, 10], "2-4, 7, 9-10"), ([35], "35"), ([], "")])
def test_ranges(layers, expected):
    assert lc._ranges(layers) == expected


def _fit(rec):
    """The fit.single-gpu rule on a launch record alone (the other measurements do not decide it)."""
    x = r04.LaunchMeasurements(rec, "sglang 0.5.23", Path("log"), Path("launch"), Path("clamp"), None, None, {}, {})
    return r04.fit_single_gpu(x)


def test_fit_single_gpu_tp_from_info_command_or_sglang_default():
    healthy = {"status": "ok", "load_s": 310.0, "gpu": {"name": "B", "memory_gb": 128}}
    # no tp_size in /server_info, no --tp-size in the command: SGLang 0.5.23's default tp_size = 1
    res = _fit({**healthy, "server_info": {}, "command": ["python", "-m", "sglang.launch_server"]})
    assert res.verdict == "reproduced" and res.measured["gpus"] == 1 and res.measured["healthy"] is True
    assert "SGLang's default" in res.note and "did not become healthy" not in res.note
    assert res.evidence == [Path("launch"), Path("log")] and res.checked_on == "sglang 0.5.23"
    assert lc.SGLANG_TP_DEFAULT == 1
    # the command's value, then /server_info's, win over the default
    assert lc.tensor_parallel({"command": ["x", "--tensor-parallel-size", "1"]}) == (1, "command --tensor-parallel-size")
    assert lc.tensor_parallel({"server_info": {"tp_size": 4}, "command": ["--tp-size", "1"]})[0] == 4
    res = _fit({**healthy, "command": ["x", "--tp-size", "4"]})
    assert res.verdict == "not run" and res.measured is None and res.evidence == []
    assert res.note == "not run: served with tensor parallel size 4 (command --tp-size): one GPU was not tested"
    # not healthy on one GPU: contradicted, and the note says so
    res = _fit({"status": "timeout", "load_s": None, "server_info": {"tp_size": 1}})
    assert res.verdict == "contradicted" and "did not become healthy" in res.note
    assert res.measured["healthy"] is False


def _load(target):
    card = {"size.resident": {"resident_gb": 71.8}, "load.time": {"load_s": 300}}
    return r04.LaunchMeasurements({"load_s": 420.0}, "sglang 0.5.23", Path("log"), Path("launch"), Path("clamp"),
                                  target, None, {}, card)


def test_resident_size_and_load_time_from_the_load_line():
    (target, _) = lc.parse_load_lines(_card_log({}))
    x = _load(target)
    # 71.8 SGLang "GB" = 71.8 GiB = 77.09 GB: 7.4 % off the card's 71.8 GB, but the GiB figure is the card's
    res = r04.size_resident(x)
    assert res.verdict == "partly" and res.measured == {"resident_gb": 77.09, "sglang_log_gib": 71.8}
    assert "which is GiB (= 77.09 GB)" in res.note and res.evidence == [Path("log")]
    # 301.25 s vs the card's about 300 s: 0.4 %, within 25 %
    res = r04.load_time(x)
    assert res.verdict == "reproduced" and res.measured == {"load_s": 301.25, "launch_to_healthy_s": 420.0}
    assert r04.load_time(_load({**target, "elapsed_s": 420.0})).verdict == "partly"  # 40 %
    assert r04.load_time(_load({**target, "elapsed_s": 600.0})).verdict == "contradicted"  # 100 %
    for rule in (r04.size_resident, r04.load_time):
        assert rule(_load(None)).note == "not run: no 'Load weight end' line in the server log"


# --- the clamp probe (audit.cpu-moe-clamp) ----------------------------------------------------
def _cmp(identical: bool | None, comparable: bool = True, unit: str = "token") -> dict:
    return {"comparable": comparable, "identical": identical, "unit": unit,
            "first_divergence": None if identical else 3}


def _probe(routed: list, shared: list, verdict: str | None = "DROPPED", null: list | None = None,
           **kw) -> r04.ClampProbeMeasurements:
    audit = None if verdict is None else {"path": "fused-moe-native", "verdict": verdict, "sglang_version": "0.5.23",
                                           "file": "layers/quantization/unquant.py", "line": 1342, "rule": "r"}
    null = null or [_cmp(True)] * len(routed)
    pairs = [{"prompt_id": f"p{i}", "routed": a, "shared": b, "null": c}
             for i, (a, b, c) in enumerate(zip(routed, shared, null, strict=True))]
    args = dict(limit=0.001, pairs=pairs, served_wrong=[], audit=audit, served_version="0.5.23",
                evidence=[Path("data/x.jsonl")], checked_on="engine") | kw
    return r04.ClampProbeMeasurements(**args)


def test_clamp_probe_verdicts():
    same, diff = _cmp(True), _cmp(False)
    row = r04.audit_cpu_moe_clamp(_probe([same] * 6, [diff] * 6))
    assert row.verdict == "reproduced" and row.measured["dynamic_reading"] == "not applied"
    assert (row.measured["routed_limit_outputs_equal_to_no_limit"], row.measured["shared_limit_outputs_changed"]) == (6, 6)
    # one routed output that moves means the limit reached the computation
    row = r04.audit_cpu_moe_clamp(_probe([same] * 5 + [diff], [diff] * 6))
    assert row.verdict == "contradicted" and row.measured["dynamic_reading"] == "applied"
    assert r04.audit_cpu_moe_clamp(_probe([diff] * 6, [diff] * 6, "EXACT")).verdict == "reproduced"
    # 5 of 6 changed by the control: bound 0.032 <= 0.05, the verdict stands
    assert r04.audit_cpu_moe_clamp(_probe([diff] * 6, [same] + [diff] * 5, "APPROX")).verdict == "reproduced"
    assert r04.audit_cpu_moe_clamp(_probe([same] * 6, [diff] * 6, "EXACT")).verdict == "contradicted"


def _arm(factor: list, fvw: list, patch: str | None = "applied", **kw) -> r04.ScalingArm:
    return r04.ScalingArm(patch, [{"prompt_id": f"p{i}", "factor": a, "factor_vs_weights": b}
                                  for i, (a, b) in enumerate(zip(factor, fvw, strict=True))], **kw)


def test_scaling_probe_reads_both_arms():
    """Released -> not applied (the audit's DROPPED), patched -> applied once (the patched factor
    launch's outputs equal the down_proj control's); either side off its prediction contradicts."""
    same, diff = _cmp(True), _cmp(False)
    released = ([same] * 6, [diff] * 6)  # the factor launch changes nothing, down_proj x 4 changes all
    row = r04.audit_cpu_routed_scaling(_scaling(*released, patched=_arm([diff] * 6, [same] * 6)))
    assert row.verdict == "reproduced", row.note
    m = row.measured
    assert (m["dynamic_reading"], m["predicted"], m["audit_verdict"]) == ("not applied", "not applied", "DROPPED")
    assert (m["patched_patch"], m["patched_dynamic_reading"], m["patched_predicted"]) == (
        "applied", "applied once", "applied once")
    assert (m["patched_factor_outputs_equal_to_down_proj_control"], m["patched_factor_outputs_equal_to_unchanged"],
            m["miss_bound"]) == (6, 0, round(r04.miss_bound(6, 6), 4))
    assert "routed_scaling patch 'applied': 0 of 6 factor outputs equal the unchanged model's and 6 of 6" in row.note
    # the patched arm differs from the control on one prompt: applied, not as the control
    row = r04.audit_cpu_routed_scaling(_scaling(*released, patched=_arm([diff] * 6, [same] * 5 + [diff])))
    assert row.verdict == "contradicted" and row.measured["patched_dynamic_reading"] == "applied, not as the control"
    # the patch changed nothing: not applied where applied once was predicted
    row = r04.audit_cpu_routed_scaling(_scaling(*released, patched=_arm([same] * 6, [diff] * 6)))
    assert row.verdict == "contradicted" and row.measured["patched_dynamic_reading"] == "not applied"
    # the released side still decides: a moved released launch contradicts whatever the patched arm reads
    row = r04.audit_cpu_routed_scaling(_scaling([diff] * 6, [diff] * 6, [same] * 6, patched=_arm([diff] * 6, [same] * 6)))
    assert row.verdict == "contradicted" and row.measured["dynamic_reading"] == "applied once"
    # a run recorded before the patched arm: the released launch alone, said so
    row = r04.audit_cpu_routed_scaling(_scaling(*released))
    assert row.verdict == "reproduced" and "patched_dynamic_reading" not in row.measured
    assert "no patched factor launch" in row.note


@pytest.mark.parametrize("arm,words", [
    (dict(factor=[_cmp(None, False)] * 6), "patched factor launch failed"),
    (dict(factor=[_cmp(False, unit="char")] * 6), "no output token ids"),
    (dict(served_wrong=True), "patched factor or down_proj launch did not serve"),
    (dict(patch=None), "patched launches' records do not say"),
])
def test_scaling_probe_patched_arm_that_cannot_decide_is_not_run(arm, words):
    same, diff = _cmp(True), _cmp(False)
    kw = {"factor": [diff] * 6, "fvw": [same] * 6} | arm
    row = r04.audit_cpu_routed_scaling(_scaling([same] * 6, [diff] * 6, patched=_arm(**kw)))
    assert row.verdict == "not run" and row.measured is None and words in row.note, row.note


@pytest.mark.parametrize("case,words", [
    (dict(shared="blind"), "too weak"),
    (dict(shared="weak"), "too weak"),  # 4 of 6 changed: bound 0.12 > 0.05
    (dict(verdict="UNDECIDED"), "predicts nothing"),
    (dict(verdict=None), "no fused-moe-native row"),
    (dict(failed=True), "request failed"),
    (dict(unit="char"), "no output token ids"),
    (dict(null=True), "two launches of the no-limit model"),
    (dict(served_wrong=["clamp-probe-routed"]), "did not serve the probe's clamp lists"),
    (dict(served_version="0.5.22"), "the audit read SGLang 0.5.23, the probe served 0.5.22"),
    (dict(missing="no probe recorded"), "no probe recorded"),
])
def test_clamp_probe_that_cannot_decide_is_not_run(case, words):
    same, diff = _cmp(True), _cmp(False)
    shared = {"blind": [same] * 6, "weak": [same] * 2 + [diff] * 4}.get(case.get("shared"), [diff] * 6)
    routed = [same] * 5 + [_cmp(None, False) if case.get("failed") else _cmp(True, unit=case.get("unit", "token"))]
    null = [same] * 5 + [diff] if case.get("null") else None
    kw = {k: case[k] for k in ("served_wrong", "served_version", "missing") if k in case}
    row = r04.audit_cpu_moe_clamp(_probe(routed, shared, case.get("verdict", "DROPPED"), null, **kw))
    assert row.verdict == "not run" and row.measured is None and words in row.note, row.note
    assert row.evidence == [Path("data/x.jsonl")]


def test_clamp_probe_with_nothing_compared_writes_no_row():
    assert r04.audit_cpu_moe_clamp(_probe([], [])) is None


def test_clamp_probe_miss_bound_is_the_wilson_upper_end_to_the_power_n():
    z = 1.959963984540054
    for n in (1, 4, 6, 20):
        # 0 misses of n: Wilson's upper end is z^2 / (n + z^2)
        assert r04.miss_bound(n, n) == pytest.approx((z * z / (n + z * z)) ** n, rel=1e-12)
    p, n = 0.5, 6  # 3 misses of 6: (p + z²/2n + z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)
    hi = (p + z * z / (2 * n) + z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n)
    assert r04.miss_bound(6, 3) == pytest.approx(hi ** 6, rel=1e-12)
    assert r04.miss_bound(6, 0) == 1.0 and r04.miss_bound(0, 0) is None


def test_clamp_probe_of_a_run_without_it_is_not_run(tmp_path):
    """A run (a replay of one recorded before the probe) with no probe records: the finding says
    so; a broken or foreign 03 audit file is no audit row, not a traceback."""
    from nvfp4study.core.params import load_params
    from serving_fixtures import stage_for

    stage = stage_for(load_params(None), tmp_path, "04_launch_server")
    stage.paths.data_dir.mkdir(parents=True, exist_ok=True)
    m = lc._probe_measurements(stage, "engine")
    assert m.pairs == [] and "no record of 6 request(s)" in m.missing
    row = r04.audit_cpu_moe_clamp(m)
    assert row.verdict == "not run" and "no record" in row.note
    audit = stage.paths.data("sglang_audit")
    for text in ("{not json", '{"path": "fused-moe-native"}', '[1, "x", null]',
                 '[{"path": "fused-moe-native", "verdict": "DROPPED"}]'):
        audit.write_text(text)
        row_, _ = lc._audit_row(stage)
        assert row_ == (None if "verdict" not in text else {"path": "fused-moe-native", "verdict": "DROPPED"})


# --- the routed-scaling probe (audit.cpu-routed-scaling) ---------------------------------------
def _scaling(factor: list, weights: list, fvw: list | None = None, patch: str | None = "released",
             null: list | None = None, **kw) -> r04.ScalingProbeMeasurements:
    null = null or [_cmp(True)] * len(factor)
    fvw = fvw or [_cmp(False)] * len(factor)
    pairs = [{"prompt_id": f"p{i}", "factor": a, "weights": b, "null": c, "factor_vs_weights": d}
             for i, (a, b, c, d) in enumerate(zip(factor, weights, null, fvw, strict=True))]
    args = dict(ratio=4.0, factors={"off": 2.5, "scaling-factor": 10.0}, pairs=pairs, served_wrong=[],
                patch=patch, evidence=[Path("data/x.jsonl")], checked_on="engine",
                audit={"verdict": "DROPPED", "file": "layers/moe/fused_moe_native.py", "line": 158, "rule": "r"}) | kw
    return r04.ScalingProbeMeasurements(**args)


def test_scaling_probe_follows_the_audits_reading():
    same, diff = _cmp(True), _cmp(False)
    # the released prediction is the audit's: APPLIED predicts the factor moves the outputs as the control
    applied = {"verdict": "APPLIED", "file": "f.py", "line": 1, "rule": "r"}
    row = r04.audit_cpu_routed_scaling(_scaling([same] * 6, [diff] * 6, audit=applied))
    assert row.verdict == "contradicted" and row.measured["predicted"] == "applied once"
    row = r04.audit_cpu_routed_scaling(_scaling([diff] * 6, [diff] * 6, [same] * 6, audit=applied))
    assert row.verdict == "reproduced" and row.measured["audit_verdict"] == "APPLIED"
    assert "audit-sglang --param routed_scaling_factor, fused-moe-native: APPLIED at f.py:1" in row.note
    # an audit reading that predicts nothing (or none) is not run
    row = r04.audit_cpu_routed_scaling(_scaling([same] * 6, [diff] * 6, audit={"verdict": "UNDECIDED", "rule": "x"}))
    assert row.verdict == "not run" and "predicts nothing" in row.note
    assert r04.audit_cpu_routed_scaling(_scaling([same] * 6, [diff] * 6, audit=None)).verdict == "not run"


def test_scaling_audit_is_read_from_stage_03s_file(tmp_path):
    """04 reads the row of the path its CPU engine runs from 03's data/sglang_param_audit.json (the
    real audit of 0.5.23 there): the served release's row, None for another release, no version, a
    missing, broken or differently shaped file."""
    from nvfp4study.core.params import DEFAULT_PARAMS
    from nvfp4study.core.stage import open_stage
    from nvfp4study.sglang.param_audit import audit_param
    from nvfp4study.stages import s04_launch
    from sglang_fixtures import released

    st = open_stage("04_launch_server", str(DEFAULT_PARAMS), str(tmp_path / "run"))
    f = st.paths.data("sglang_param_audit")
    assert s04_launch._scaling_audit(st, "0.5.23") is None  # no file yet
    rows = [r.as_json() for r in audit_param(released("0.5.23"), "routed_scaling_factor", [r04.PROBE_PATH])]
    other = {**rows[0], "path": "triton", "verdict": "APPLIED"}
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps({"params": {"routed_scaling_factor": [other, *rows]}}))
    row = s04_launch._scaling_audit(st, "0.5.23")
    assert (row["verdict"], row["file"], row["line"]) == ("DROPPED", "layers/moe/fused_moe_native.py", 158)
    assert s04_launch._scaling_audit(st, "0.5.22") is None and s04_launch._scaling_audit(st, None) is None
    for bad in ("{", json.dumps({"params": {}}), json.dumps([1]), json.dumps({"params": {"routed_scaling_factor": 3}})):
        f.write_text(bad)
        assert s04_launch._scaling_audit(st, "0.5.23") is None


def test_scaling_probe_verdicts():
    same, diff = _cmp(True), _cmp(False)
    # released: the factor changes nothing while down_proj x 4 changes every output
    row = r04.audit_cpu_routed_scaling(_scaling([same] * 6, [diff] * 6))
    assert row.verdict == "reproduced" and row.measured["dynamic_reading"] == "not applied"
    assert (row.measured["factor_outputs_equal_to_unchanged"], row.measured["down_proj_control_changed"]) == (6, 6)
    # patched: the factor launch gives the down_proj control's outputs token for token
    row = r04.audit_cpu_routed_scaling(_scaling([diff] * 6, [diff] * 6, [same] * 6, "applied"))
    assert row.verdict == "reproduced" and row.measured["dynamic_reading"] == "applied once"
    # a factor applied twice (or elsewhere) moves the outputs, but not as the control does
    row = r04.audit_cpu_routed_scaling(_scaling([diff] * 6, [diff] * 6, [same] * 5 + [diff], "applied"))
    assert row.verdict == "contradicted" and row.measured["dynamic_reading"] == "applied, not as the control"
    # the patch on but nothing moved; released but something moved
    assert r04.audit_cpu_routed_scaling(_scaling([same] * 6, [diff] * 6, patch="applied")).verdict == "contradicted"
    row = r04.audit_cpu_routed_scaling(_scaling([same] * 5 + [diff], [diff] * 6))
    assert row.verdict == "contradicted" and row.measured["dynamic_reading"] == "applied, not as the control"


@pytest.mark.parametrize("case,words", [
    (dict(weights="weak"), "too weak"),  # 4 of 6 changed: bound 0.12 > 0.05
    (dict(failed=True), "request failed"),
    (dict(unit="char"), "no output token ids"),
    (dict(null=True), "two launches of the no-limit model"),
    (dict(served_wrong=["scaling-probe-factor"]), "did not serve the probe's config"),
    (dict(patch=None), "does not say which routed_scaling patch"),
    (dict(missing="no record of 6 request(s)"), "no record"),
])
def test_scaling_probe_that_cannot_decide_is_not_run(case, words):
    same, diff = _cmp(True), _cmp(False)
    weights = [same] * 2 + [diff] * 4 if case.get("weights") == "weak" else [diff] * 6
    factor = [same] * 5 + [_cmp(None, False) if case.get("failed") else _cmp(True, unit=case.get("unit", "token"))]
    null = [same] * 5 + [diff] if case.get("null") else None
    kw = {k: case[k] for k in ("served_wrong", "missing") if k in case}
    row = r04.audit_cpu_routed_scaling(_scaling(factor, weights, None, case.get("patch", "released"), null, **kw))
    assert row.verdict == "not run" and row.measured is None and words in row.note, row.note
    assert r04.audit_cpu_routed_scaling(_scaling([], [])) is None


def test_scaling_probe_of_a_run_without_it_is_not_run(tmp_path):
    from nvfp4study.core.params import load_params
    from serving_fixtures import stage_for

    stage = stage_for(load_params(None), tmp_path, "04_launch_server")
    stage.paths.data_dir.mkdir(parents=True, exist_ok=True)
    m = lc._scaling_measurements(stage, "engine")
    assert m.pairs == [] and "no record of 6 request(s)" in m.missing
    assert r04.audit_cpu_routed_scaling(m).verdict == "not run"


def test_scaling_probe_measurements_read_the_patched_arm(tmp_path):
    """04 builds both sides from its records: the factor launch served released, and the patched
    arm (scaling_patched_configs: the factor model and its down_proj control again, with the native
    routed_scaling 'applied' patch), the patched factor launch compared per prompt with the
    unchanged model's and the patched control's outputs."""
    from nvfp4study.core.jsonl import append_jsonl
    from nvfp4study.core.params import load_params
    from nvfp4study.serving import records
    from nvfp4study.serving.server import PROBE_LABELS
    from serving_fixtures import stage_for

    params = load_params(None)
    stage = stage_for(params, tmp_path, "04_launch_server")
    stage.paths.data_dir.mkdir(parents=True, exist_ok=True)
    specs = records.probe_requests(params)
    configs = dict(zip(PROBE_LABELS, lc.probe_configs(params), strict=True))
    patched = lc.scaling_patched_configs(params)
    assert list(patched) == ["scaling-factor", "scaling-weights"]
    for k, c in patched.items():
        assert c.native == lc.PATCHED_SCALING == (("routed_scaling", "applied"),)
        assert c.model_label == configs[k].model_label and c.key != configs[k].key
    # output ids: released, the factor changes nothing and down_proj x 4 moves every prompt; patched,
    # factor x 4 and down_proj x 4 both give routed x 10
    unchanged, x4, x10 = [1, 2, 3], [1, 7, 8], [1, 9, 9]
    launches = {configs["off"]: (unchanged, 2.5, "released"), configs["off-again"]: (unchanged, 2.5, "released"),
                configs["scaling-factor"]: (unchanged, 10.0, "released"),
                configs["scaling-weights"]: (x4, 2.5, "released"),
                patched["scaling-factor"]: (x10, 10.0, "applied"), patched["scaling-weights"]: (x10, 2.5, "applied")}
    for config, (ids, factor, patch) in launches.items():
        for s in specs:
            append_jsonl(records.raw_path(stage.paths, config), {
                "request_key": s.key, "prompt_id": s.prompt_id, "status": "ok", "output_ids": ids})
        append_jsonl(records.launch_path(stage.paths, config), {
            "status": "ok", "sglang_version": "0.5.23", "model_config": {"routed_scaling_factor": factor},
            "native_modes": {"moe_clamp": "released", "routed_scaling": patch}})
    # 03's reading of the native path, as stage 03 writes it (data/sglang_param_audit.json)
    stage.paths.data("sglang_param_audit").write_text(json.dumps({"params": {"routed_scaling_factor": [
        {"path": r04.PROBE_PATH, "sglang_version": "0.5.23", "verdict": "DROPPED", "rule": "r",
         "file": "layers/moe/fused_moe_native.py", "line": 158}]}}))
    m = lc._scaling_measurements(stage, "engine")
    assert m.missing is None and m.patch == "released" and m.patched.patch == "applied"
    assert not m.patched.served_wrong and len(m.patched.pairs) == len(specs)
    assert all(p["factor_vs_weights"]["identical"] and not p["factor"]["identical"] for p in m.patched.pairs)
    assert {records.raw_path(stage.paths, c) for c in patched.values()} <= set(m.evidence)
    row = r04.audit_cpu_routed_scaling(m)
    assert row.verdict == "reproduced", row.note
    assert (row.measured["dynamic_reading"], row.measured["patched_dynamic_reading"]) == ("not applied", "applied once")
    assert row.measured["audit_verdict"] == "DROPPED"
    # the patched control served another factor than the probe's: not run
    append_jsonl(records.launch_path(stage.paths, patched["scaling-weights"]), {
        "status": "ok", "model_config": {"routed_scaling_factor": 10.0}, "native_modes": {"routed_scaling": "applied"}})
    m = lc._scaling_measurements(stage, "engine")
    assert m.patched.served_wrong and r04.audit_cpu_routed_scaling(m).verdict == "not run"
