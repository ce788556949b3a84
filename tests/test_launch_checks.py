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
def _cmp(identical: bool | None, comparable: bool = True) -> dict:
    return {"comparable": comparable, "identical": identical, "first_divergence": None if identical else 3}


def _probe(routed: list, shared: list, verdict: str | None = "DROPPED") -> r04.ClampProbeMeasurements:
    audit = None if verdict is None else {"path": "fused-moe-native", "verdict": verdict,
                                           "file": "layers/quantization/unquant.py", "line": 1342, "rule": "r"}
    pairs = [{"prompt_id": f"p{i}", "routed": a, "shared": b} for i, (a, b) in enumerate(zip(routed, shared, strict=True))]
    return r04.ClampProbeMeasurements(0.001, pairs, audit, [Path("data/x.jsonl")], "engine")


def test_clamp_probe_verdicts():
    same, diff = _cmp(True), _cmp(False)
    row = r04.audit_cpu_moe_clamp(_probe([same] * 6, [diff] * 6))
    assert row.verdict == "reproduced" and row.measured["dynamic_reading"] == "not applied"
    assert (row.measured["routed_limit_outputs_equal_to_no_limit"], row.measured["shared_limit_outputs_changed"]) == (6, 6)
    # one routed output that moves means the limit reached the computation
    row = r04.audit_cpu_moe_clamp(_probe([same] * 5 + [diff], [diff] * 6))
    assert row.verdict == "contradicted" and row.measured["dynamic_reading"] == "applied"
    assert r04.audit_cpu_moe_clamp(_probe([diff] * 6, [diff] * 6, "EXACT")).verdict == "reproduced"
    assert r04.audit_cpu_moe_clamp(_probe([diff] * 6, [same] * 5 + [diff], "APPROX")).verdict == "reproduced"
    assert r04.audit_cpu_moe_clamp(_probe([same] * 6, [diff] * 6, "EXACT")).verdict == "contradicted"
    # undecidable: a blind control, an audit that predicts nothing or is missing, a failed request
    for m, words in ((_probe([same] * 6, [same] * 6), "the probe is blind"),
                     (_probe([same] * 6, [diff] * 6, "UNDECIDED"), "predicts nothing"),
                     (_probe([same] * 6, [diff] * 6, None), "no fused-moe-native row"),
                     (_probe([same] * 5 + [_cmp(None, False)], [diff] * 6), "request failed")):
        row = r04.audit_cpu_moe_clamp(m)
        assert row.verdict == "not run" and row.measured is None and words in row.note, row.note
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
