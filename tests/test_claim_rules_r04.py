"""Stage 04's claim rules (``stages/claim_rules/r04_launch.py``) row by row, every field (issue 37's
mutation benchmark; tests/test_launch_checks.py has the parsing and the verdicts): the card's four
rows with each verdict's edges, the CPU engine's launch finding, both probes' rows in full and each
refusal's words. Expected notes are written out here."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from nvfp4study.core.claim_rules import Row
from nvfp4study.serving.server import STANDIN_NOTE
from nvfp4study.stages.claim_rules import r04_launch as r04
from test_launch_checks import _cmp, _probe, _scaling

Z = 1.959963984540054  # the normal 97.5 % quantile (Wilson 95 % interval)
CARD = {"size.resident": {"resident_gb": 70.0}, "load.time": {"load_s": 300.0}}


def launch(rec: dict | None = None, target: dict | None = None, clamp=None, groups=None) -> r04.LaunchMeasurements:
    return r04.LaunchMeasurements(rec or {}, "sglang 0.5.23", Path("log"), Path("launch"), Path("clamp"), target,
                                  clamp, groups or {}, CARD)


def test_tensor_parallel_sources():
    assert r04.tensor_parallel({"server_info": {"tp_size": 2}}) == (2, "/server_info tp_size")
    assert r04.tensor_parallel({"server_info": {"tp_size": None}, "command": ["x", "--tp-size", "3"]}) == (
        3, "command --tp-size")
    assert r04.tensor_parallel({"command": ["x", "--tensor-parallel-size", "2"]}) == (2, "command --tensor-parallel-size")
    assert r04.tensor_parallel({"command": None}) == (
        1, "SGLang's default (no --tp-size in the command, none in /server_info)")
    assert r04.tensor_parallel({"command": ["--tp-size"][:0]})[0] == 1


@pytest.mark.parametrize("rec,healthy", [
    ({"status": "ok"}, True), ({"status": "failed", "load_s": 12.5}, True), ({"status": "failed"}, False),
    ({"status": "OK", "load_s": None}, False), ({}, False),
])
def test_fit_single_gpu_rows(rec, healthy):
    rec = {**rec, "gpu": {"name": "B200", "memory_gb": 180}}
    row = r04.fit_single_gpu(launch(rec))
    src = "SGLang's default (no --tp-size in the command, none in /server_info)"
    note = (f"server reached /health_generate 200 on one GPU (tp 1 from {src})" if healthy else
            f"the server did not become healthy on one GPU (tp 1 from {src}); status {rec.get('status')!r}")
    assert row == Row({"gpus": 1, "gpu": "B200", "gpu_memory_gb": 180, "healthy": healthy},
                      "reproduced" if healthy else "contradicted", [Path("launch"), Path("log")], note, "sglang 0.5.23")
    assert r04.fit_single_gpu(launch({"status": "ok"})).measured == {"gpus": 1, "gpu": None, "gpu_memory_gb": None,
                                                                   "healthy": True}


@pytest.mark.parametrize("gib,verdict", [
    (70.0 * 1e9 / (1 << 30), "reproduced"),          # exactly the card's GB
    (70.0 * 1.05 * 1e9 / (1 << 30), "reproduced"),   # +5 % in GB: on the edge
    (66.5 * 1e9 / (1 << 30), "reproduced"),          # -5 % in GB
    (66.4 * 1e9 / (1 << 30), "contradicted"),        # past it (the GiB figure, 61.8, far too)
    (80.0 * 1e9 / (1 << 30), "contradicted"),        # 74.5 GiB: 6.4 % off either way
    (70.0, "partly"),                                 # the GiB figure is the card's number (75.16 GB)
    (73.5, "partly"),                                 # GiB figure +5 %: on the edge
    (73.6, "contradicted"),                           # just past it
    (68.5, "partly"),                                 # 73.55 GB is 5.07 % off, 68.5 GiB 2.1 %
])
def test_size_resident_edges(gib, verdict):
    row = r04.size_resident(launch(target={"mem_gib": gib, "elapsed_s": 300.0}))
    gb = round(gib * (1 << 30) / 1e9, 2)
    note = (f"SGLang logs {gib} 'GB' which is GiB (= {gb} GB); the card's number matches the GiB figure, not GB"
            if verdict == "partly" else "weights' memory from SGLang's Load weight end line")
    assert row == Row({"resident_gb": gb, "sglang_log_gib": gib}, verdict, [Path("log")], note, "sglang 0.5.23")


@pytest.mark.parametrize("elapsed,verdict", [(300.0, "reproduced"), (375.0, "reproduced"), (225.0, "reproduced"),
                                             (375.5, "partly"), (450.0, "partly"), (150.0, "partly"),
                                             (450.5, "contradicted"), (149.0, "contradicted")])
def test_load_time_edges(elapsed, verdict):
    row = r04.load_time(launch({"load_s": 500.0}, {"mem_gib": 1.0, "elapsed_s": elapsed}))
    assert row == Row({"load_s": elapsed, "launch_to_healthy_s": 500.0}, verdict, [Path("log"), Path("launch")],
                      "weight load from SGLang's log (card: about 300 s; within 25 % = reproduced, 50 % = partly); "
                      "launch to healthy includes CUDA graphs and warm-up", "sglang 0.5.23")


def clamp_table(logged: list[str], match: list[bool]) -> pd.DataFrame:
    rows = [{"layer": str(i + 2), "logged limit": lg, "match": m} for i, (lg, m) in enumerate(zip(logged, match,
                                                                                                    strict=True))]
    return pd.DataFrame(rows + [{"layer": "mtp", "logged limit": "no line", "match": False}])


def test_clamp_log_lines_rows():
    groups = {"limit=7.0": "2-4"}
    row = r04.clamp_log_lines(launch(clamp=clamp_table(["7.0"] * 3, [True] * 3), groups=groups))
    assert row == Row(groups, "reproduced", [Path("log"), Path("clamp")],
                      "one line per MoE layer, limits as in the checkpoint's list; dense layers 0-1 have no MoE and "
                      "log nothing", "sglang 0.5.23")
    row = r04.clamp_log_lines(launch(clamp=clamp_table(["7.0", "no line", "7.0"], [True, False, True]), groups=groups))
    assert (row.verdict, row.note) == ("partly", "lines present but some layers are missing or disagree with the "
                                                 "config's list")
    row = r04.clamp_log_lines(launch(clamp=clamp_table(["no line"] * 3, [False] * 3)))
    assert (row.verdict, row.note, row.measured) == (
        "contradicted", "no [swiglu-clamp-patch] line in the log (is the patch applied?)", {})
    # only digit layers count: the MTP row's missing line does not make it partly
    assert r04.clamp_log_lines(launch(clamp=clamp_table(["7.0"], [True]))).verdict == "reproduced"


def proc(name: str, pid: int, rss: float) -> dict:
    return {"name": name, "pid": pid, "rss_mb": rss}


def test_cpu_engine_launch_rows():
    tree = [proc("python", 10, 100.0), proc("sglang::scheduler", 11, 900.5), proc("sglang::detokenizer", 12, 50.0)]
    x = r04.CpuLaunchMeasurements({"load_s": 42.0, "process_tree": tree, "left_after_stop": [], "returncode": -15},
                                  [Path("rec"), Path("log")], "engine")
    tail = ("left after the stop (SIGINT to SGLang's first process, then SIGKILL to the process group after "
            "server.shutdown_grace_s, marked and adopted processes included)")
    assert r04.serve_cpu_engine_launch(x) == Row(
        {"launch_to_healthy_s": 42.0, "processes": ["python", "sglang::scheduler", "sglang::detokenizer"],
         "resident_mb": {"python (pid 10)": 100.0, "sglang::scheduler (pid 11)": 900.5,
                         "sglang::detokenizer (pid 12)": 50.0},
         "left_after_stop": 0, "returncode": -15},
        "reproduced", [Path("rec"), Path("log")],
        f"3 processes while healthy (python, sglang::scheduler, sglang::detokenizer); 0 {tail}; {STANDIN_NOTE}",
        "engine")

    def verdict(**rec):
        base = {"load_s": 42.0, "process_tree": tree, "left_after_stop": [], "returncode": 0}
        return r04.serve_cpu_engine_launch(r04.CpuLaunchMeasurements({**base, **rec}, [], "engine"))

    assert verdict(load_s=None).verdict == "contradicted"
    assert verdict(left_after_stop=[{"pid": 11}]).verdict == "contradicted"
    assert verdict(left_after_stop=[{"pid": 11}]).note.startswith("3 processes while healthy (python, "
                                                                   "sglang::scheduler, sglang::detokenizer); 1 left")
    row = verdict(process_tree=tree[:2])
    assert row.verdict == "contradicted" and row.note.endswith(f"included); missing: sglang::detokenizer; {STANDIN_NOTE}")
    row = verdict(process_tree=tree[1:])  # both children but no launcher: too few processes
    assert row.verdict == "contradicted" and "missing" not in row.note
    row = verdict(process_tree=None, left_after_stop=None)
    assert row.measured["processes"] == [] and row.measured["left_after_stop"] == 0
    assert row.note.startswith("0 processes while healthy (none); 0 left") and row.verdict == "contradicted"
    assert row.note.endswith("missing: sglang::scheduler, sglang::detokenizer; " + STANDIN_NOTE)


def bound(n: int, changed: int) -> float:
    miss = (n - changed) / n
    centre = (miss + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z * ((miss * (1 - miss) / n + Z * Z / (4 * n * n)) ** 0.5) / (1 + Z * Z / n)
    return (centre + half) ** n


def test_miss_bound_by_its_formula():
    for n, changed in ((6, 6), (6, 5), (10, 9), (3, 0)):
        assert r04.miss_bound(n, changed) == pytest.approx(bound(n, changed), rel=1e-9), (n, changed)
    assert r04.miss_bound(0, 0) is None and r04.miss_bound(-1, 0) is None


def test_clamp_probe_row_in_full():
    same, diff = _cmp(True), _cmp(False)
    row = r04.audit_cpu_moe_clamp(_probe([same] * 5 + [diff], [diff] * 6, "EXACT"))
    b = bound(6, 6)
    where = "audit fused-moe-native: EXACT at layers/quantization/unquant.py:1342 (r)"
    assert row == Row(
        {"limit": 0.001, "prompts": 6, "routed_limit_outputs_equal_to_no_limit": 5, "shared_limit_outputs_changed": 6,
         "no_limit_relaunch_identical": 6, "dynamic_reading": "applied", "audit_verdict": "EXACT",
         "miss_bound": round(b, 4)},
        "reproduced", [Path("data/x.jsonl")],
        "limit 0.001 on every MoE layer's routed experts: 5 of 6 greedy outputs equal the no-limit launch's, token for "
        "token; controls: a second no-limit launch matched on all 6, and the same limit on the shared expert changed "
        f"6 of 6, so a routed clamp that is applied would leave all 6 unchanged with chance <= {b:.3g} (upper end of "
        "the Wilson 95 % interval, prompts taken as independent and the routed experts as sensitive as the shared "
        f"one); {where}. The routed experts ran UnquantizedFusedMoEMethod.forward_cpu -> moe_forward_native (the "
        f"stand-in has no fused_experts_cpu: calling it raises); {STANDIN_NOTE}", "engine")
    assert r04.audit_cpu_moe_clamp(_probe([same] * 6, [diff] * 6, "APPROX")).verdict == "contradicted"
    assert r04.audit_cpu_moe_clamp(_probe([same] * 5 + [diff], [diff] * 6, "DROPPED")).verdict == "contradicted"


def test_clamp_probe_refusals_word_for_word():
    same, diff = _cmp(True), _cmp(False)
    ev = [Path("data/x.jsonl")]

    def note(**kw):
        args = {"routed": [same] * 6, "shared": [diff] * 6} | kw
        return r04.audit_cpu_moe_clamp(_probe(**args))

    assert note(routed=[same] * 5 + [_cmp(None, False)]) == Row.not_run(
        "a clamp-probe request failed (see the probe launches' raw files)", evidence=ev)
    assert note(shared=[diff] * 5 + [_cmp(False, unit="char")]) == Row.not_run(
        "a probe response had no output token ids, so outputs were not compared token for token", evidence=ev)
    assert note(served_wrong=["clamp-probe-routed", "clamp-probe-shared"]) == Row.not_run(
        "the launches of clamp-probe-routed, clamp-probe-shared did not serve the probe's clamp lists", evidence=ev)
    assert note(verdict="UNDECIDED").note == (
        "not run: the audit's verdict predicts nothing the probe can see (audit fused-moe-native: UNDECIDED at "
        "layers/quantization/unquant.py:1342 (r))")
    assert note(verdict=None).note == ("not run: the audit's verdict predicts nothing the probe can see "
                                       "(no fused-moe-native row in 03's audit)")
    assert note(served_version="0.5.22").note == "not run: the audit read SGLang 0.5.23, the probe served 0.5.22"
    assert note(null=[same] * 5 + [diff]).note == (
        "not run: two launches of the no-limit model gave different outputs, so a difference would say nothing "
        "about the clamp")
    weak = note(shared=[same] * 2 + [diff] * 4)
    assert weak.note == (
        "not run: the probe is too weak: the same limit on the shared expert changed 4 of 6 outputs, so an applied "
        f"routed clamp would go unseen with chance up to {bound(6, 4):.3g} (more than 0.05; more prompts: "
        "server.cpu.clamp_probe_prompts)")
    assert r04.audit_cpu_moe_clamp(_probe([same] * 6, [diff] * 6, missing="no probe")) == Row.not_run(
        "no probe", evidence=ev)


def test_scaling_probe_row_in_full():
    same, diff = _cmp(True), _cmp(False)
    row = r04.audit_cpu_routed_scaling(_scaling([same] * 6, [diff] * 5 + [same], [diff] * 6))
    b = bound(6, 5)
    assert row == Row(
        {"ratio": 4.0, "factors": {"off": 2.5, "scaling-factor": 10.0}, "prompts": 6, "patch": "released",
         "audit_verdict": "DROPPED", "factor_outputs_equal_to_unchanged": 6, "factor_outputs_equal_to_down_proj_control": 0,
         "down_proj_control_changed": 5, "null_relaunch_identical": 6, "dynamic_reading": "not applied",
         "predicted": "not applied", "miss_bound": round(b, 4)},
        "reproduced", [Path("data/x.jsonl")],
        "routed_scaling_factor 2.5 -> 10.0 (config only): served with routed_scaling patch 'released', 6 of 6 greedy "
        "outputs equal the unchanged model's and 0 of 6 those of the routed experts' down_proj x 4 (factor "
        "unchanged), read as not applied (predicted not applied); no patched factor launch (a run recorded before "
        "it). Controls: the no-limit model launched twice matched on all 6, and down_proj x 4 changed 5 of 6, so a "
        f"factor that is applied would leave all 6 unchanged with chance <= {b:.3g} (Wilson 95 %, prompts taken as "
        "independent). Released, the prediction is the audit's (audit-sglang --param routed_scaling_factor, "
        "fused-moe-native: DROPPED at layers/moe/fused_moe_native.py:158 (r)); patched, the patch's reading (the "
        "audit does not read the overlay); " + STANDIN_NOTE, "engine")


def test_scaling_probe_row_with_the_patched_arm_in_full():
    from test_launch_checks import _arm

    same, diff = _cmp(True), _cmp(False)
    arm = _arm([diff] * 6, [same] * 6)
    row = r04.audit_cpu_routed_scaling(_scaling([same] * 6, [diff] * 5 + [same], [diff] * 6, patched=arm))
    b = bound(6, 5)
    assert row == Row(
        {"ratio": 4.0, "factors": {"off": 2.5, "scaling-factor": 10.0}, "prompts": 6, "patch": "released",
         "audit_verdict": "DROPPED", "factor_outputs_equal_to_unchanged": 6, "factor_outputs_equal_to_down_proj_control": 0,
         "down_proj_control_changed": 5, "null_relaunch_identical": 6, "dynamic_reading": "not applied",
         "predicted": "not applied", "miss_bound": round(b, 4), "patched_patch": "applied",
         "patched_factor_outputs_equal_to_unchanged": 0, "patched_factor_outputs_equal_to_down_proj_control": 6,
         "patched_dynamic_reading": "applied once", "patched_predicted": "applied once"},
        "reproduced", [Path("data/x.jsonl")],
        "routed_scaling_factor 2.5 -> 10.0 (config only): served with routed_scaling patch 'released', 6 of 6 greedy "
        "outputs equal the unchanged model's and 0 of 6 those of the routed experts' down_proj x 4 (factor "
        "unchanged), read as not applied (predicted not applied); the factor and down_proj launches served again "
        "with routed_scaling patch 'applied': 0 of 6 factor outputs equal the unchanged model's and 6 of 6 the "
        "patched down_proj control's, read as applied once (predicted applied once). Controls: the no-limit model "
        "launched twice matched on all 6, and down_proj x 4 changed 5 of 6, so a factor that is applied would leave "
        f"all 6 unchanged with chance <= {b:.3g} (Wilson 95 %, prompts taken as independent). Released, the "
        "prediction is the audit's (audit-sglang --param routed_scaling_factor, fused-moe-native: DROPPED at "
        "layers/moe/fused_moe_native.py:158 (r)); patched, the patch's reading (the audit does not read the "
        "overlay); " + STANDIN_NOTE, "engine")


def test_scaling_probe_refusals_word_for_word():
    same, diff = _cmp(True), _cmp(False)
    ev = [Path("data/x.jsonl")]

    def row(factor=None, weights=None, fvw=None, patch="released", null=None, **kw):
        return r04.audit_cpu_routed_scaling(_scaling(factor or [same] * 6, weights or [diff] * 6, fvw, patch, null,
                                                     **kw))

    assert row(fvw=[diff] * 5 + [_cmp(None, False)]) == Row.not_run(
        "a routed-scaling probe request failed (see the probe launches' raw files)", evidence=ev)
    assert row(null=[same] * 5 + [_cmp(True, unit="text")]) == Row.not_run(
        "a probe response had no output token ids, so outputs were not compared token for token", evidence=ev)
    assert row(served_wrong=["a", "b"]) == Row.not_run("the launches of a, b did not serve the probe's config",
                                                       evidence=ev)
    assert row(patch="twice") == Row.not_run(
        "the factor launch's record does not say which routed_scaling patch it ran ('twice')", evidence=ev)
    assert row(null=[same] * 5 + [diff]) == Row.not_run("two launches of the no-limit model gave different outputs",
                                                        evidence=ev)
    assert row(weights=[same] * 2 + [diff] * 4) == Row.not_run(
        "the probe is too weak: routed down_proj x 4 changed 4 of 6 outputs, so an applied factor would go unseen "
        f"with chance up to {bound(6, 4):.3g} (more than 0.05; more prompts: server.cpu.clamp_probe_prompts)",
        evidence=ev)
    assert r04.audit_cpu_routed_scaling(_scaling([same] * 6, [diff] * 6, missing="none")) == Row.not_run(
        "none", evidence=ev)


def test_resident_gb_is_bytes_over_1e9_exactly():
    """GB = 1e9 bytes, not a value near it: a load line 6e-9 GB past a rounding edge of the
    ledger's two decimals rounds up (12.345000006 GB -> 12.35)."""
    gib = (12.345 + 6e-9) * 1e9 / (1 << 30)
    assert r04.size_resident(launch(target={"mem_gib": gib, "elapsed_s": 1.0})).measured["resident_gb"] == 12.35
