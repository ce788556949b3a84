"""The run plan: launches, requests and tokens counted by hand for a small profile, the time from
the stated assumptions, and the saving of a batched corruption sweep."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nvfp4study.core.params import REPO_ROOT, load_params
from nvfp4study.workstation import bound, plan

SMALL = ["mtp.depths=[0,2]", "mtp.prompts=2", "mtp.max_tokens=100", "mtp.warmup_requests=1",
         "determinism.prompts=1", "determinism.repeats=2", "determinism.max_tokens=50",
         "determinism.deterministic_mode=false", "determinism.spec_depth=2",
         "corruption.humaneval_count=0", "corruption.card_tasks=true", "corruption.clamp_modes=[exact]",
         "corruption.reasoning_probe_tasks=0", "corruption.protocol=extended"]
A = {"load_s": 100.0, "tok_s": {0: 10.0, 2: 20.0}, "tok_s_deterministic": {}, "source": "given"}


def test_small_plan_by_hand():
    p = load_params(REPO_ROOT / "params" / "ling3-flash.yaml", SMALL)
    s = plan.summary(p, A)
    got = [(x["config"], x["requests"], x["tokens"]) for x in s["launches"]]
    # depth 0: 2 mtp prompts x 100 + 2 det requests x 50 + one 64-token warm-up; same at depth 2
    # (04's card config is depth 2), where 05's sweep in mode exact (the card's configuration at
    # concurrency 1) shares the launch: 15 card tasks x 4 sampling configs x 2048 tokens more
    sweep = 15 * 4 * 2048
    assert got == [("clamp=exact-spec=off-det=off", 5, 364), ("clamp=exact-spec=2-det=off", 65, 364 + sweep)]
    card = s["launches"][1]
    assert card["stage"] == "04_launch_server" and "05 corruption sweep, clamp exact" in card["reason"]
    assert card["reason"].startswith("needed by 04_launch_server, 06_mtp_sweep, 07_determinism; ")
    assert s["total_s"] == pytest.approx(2 * 100 + 364 / 10 + (364 + sweep) / 20)
    assert s["concurrency_saving_s"] is None
    p4 = load_params(REPO_ROOT / "params" / "ling3-flash.yaml", [*SMALL, "corruption.concurrency=4"])
    s4 = plan.summary(p4, A)
    assert s4["launches"][2]["config"] == "clamp=exact-spec=2-det=off-mrr=4"  # its own launch
    # batched: c=4 requests at k=2 verify 12 tokens a step; dense bytes once, the union of their
    # routed experts 512 * (1 - (1 - 8/512)^12), by hand from the layout's bytes
    rb = bound.read_bytes(p4.checkpoint.shape)

    def step(tokens, c):
        return rb.dense + 512 * (1 - (1 - 8 / 512) ** tokens) * rb.expert + tokens * rb.embed_row + c * 2 * rb.draft

    speed = 4 * step(3, 1) / step(12, 4)
    assert 1.5 < speed < 2.0  # far from the ideal 4x
    assert s4["launches"][2]["batch_speedup"] == pytest.approx(speed)
    # against concurrency 1, where the sweep shares the card's launch: the batched decode's
    # saving less the load of the sweep's own launch
    assert s4["concurrency_saving_s"] == pytest.approx(sweep / 20 * (1 - 1 / speed) - 100)


def test_card_assumptions_and_missing_rate():
    a = plan.card_assumptions()
    assert a["load_s"] == 300 and a["tok_s"] == {0: 22.60, 1: 40.19, 2: 45.1, 3: 40.48}
    p = load_params(REPO_ROOT / "params" / "ling3-flash.yaml", [*SMALL, "mtp.depths=[0,5]"])
    s = plan.summary(p, A)
    k5 = next(x for x in s["launches"] if x["depth"] == 5)
    assert k5["seconds"] is None and "--tok-s 5=RATE" in k5["notes"][0]


@pytest.mark.parametrize("params", ["default.yaml", "ling3-flash.yaml"])
def test_cli_both_profiles(params):
    r = subprocess.run([sys.executable, "-m", "nvfp4study.cli", "plan", "--params",
                        str(REPO_ROOT / "params" / params)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "server launch(es)" in r.stdout and "estimated serving time" in r.stdout and "card's" in r.stdout


def test_distinct_experts_per_decode_step():
    # 512 experts, top-8: the union a decode step of b tokens reads (uniform, independent routing)
    got = [round(bound.distinct_experts(512, 8, b)) for b in (1, 2, 4, 8, 16, 32)]
    assert got == [8, 16, 31, 61, 114, 203]
    assert bound.distinct_experts(512, 8, 1) == pytest.approx(8.0)
    rb = bound.read_bytes(load_params(REPO_ROOT / "params" / "ling3-flash.yaml").checkpoint.shape)
    assert bound.batch_speedup(rb, 1, 2) == pytest.approx(1.0)
    assert bound.batch_speedup(rb, 8, 0) < 8 * 0.6  # experts dominate: far below ideal scaling
    with pytest.raises(bound.StudyError):
        bound.distinct_experts(512, 0, 4)


def test_ling3_flash_is_the_cards_protocol_within_three_hours():
    """The card's protocol: 45 requests per clamp mode (15 + 10 + 10 + 10), and at the card's
    rates at most 3 h of serving; by hand from the card's load time and tok/s."""
    p = load_params(REPO_ROOT / "params" / "ling3-flash.yaml", overlay=False)
    s = plan.summary(p)
    sweep = [x for x in s["launches"] if "05 corruption sweep" in x["reason"]]
    # mode none alone; mode exact on the card's configuration, shared with 04/06/07
    alone = {x["config"].split("-")[0]: x for x in sweep}
    assert len(sweep) == 2 and (alone["clamp=none"]["requests"], alone["clamp=none"]["tokens"]) == (45, 45 * 2048)
    assert alone["clamp=none"]["stage"] == "05_corruption"
    shared = alone["clamp=exact"]
    assert shared["requests"] > 45 and shared["stage"] == "04_launch_server"
    tok = {0: 22.60, 1: 40.19, 2: 45.1, 3: 40.48}
    det2 = 38.26
    by_hand = 0.0
    for x in s["launches"]:
        rate = det2 if (x["deterministic"] and x["depth"] == 2) else tok[x["depth"] or 0]
        by_hand += 300 + x["tokens"] / rate
    assert s["total_s"] == pytest.approx(by_hand) and s["total_s"] <= 3 * 3600
    assert s["warnings"] == [] and max(s["stages_s"].values()) < p.execution_timeout_s
    ext = plan.summary(load_params(REPO_ROOT / "params" / "ling3-flash.yaml", ["corruption.protocol=extended"],
                                   overlay=False))
    by = {x["config"]: x["requests"] for x in ext["launches"]}
    card = {x["config"]: x["requests"] for x in s["launches"]}
    # every task with every sampling config: 179 x 4 per mode; the exact sweep's launch also
    # carries 04/06/07's requests (as many as in the card protocol's plan, less its 45)
    assert by["clamp=none-spec=2-det=off"] == 179 * 4
    assert by["clamp=exact-spec=2-det=off"] == 179 * 4 + card["clamp=exact-spec=2-det=off"] - 45
    # the exact sweep runs in 04's cell (the first stage serving the card's configuration)
    assert [w.split(":")[0] for w in ext["warnings"]] == ["04_launch_server", "05_corruption"]
    assert all("exceeds" in w for w in ext["warnings"])


def test_no_cell_warning_for_the_cpu_engine_or_a_replay():
    """The card's GPU rates do not time the CPU engine or a replay: no warning there, although the
    same estimate on a GPU run would reach the limit."""
    cpu = plan.summary(load_params(None, ["execution_timeout_s=60"]))
    assert cpu["warnings"] == [] and max(cpu["stages_s"].values()) > 60
    gpu = plan.summary(load_params(REPO_ROOT / "params" / "ling3-flash.yaml", ["execution_timeout_s=60"], overlay=False))
    assert len(gpu["warnings"]) == 4
    replay = plan.summary(load_params(REPO_ROOT / "params" / "ling3-flash.yaml",
                                      ["execution_timeout_s=60", "replay_from=outputs/x"], overlay=False))
    assert replay["warnings"] == []


def test_cell_warnings_margin():
    assert plan.cell_warnings({"05_corruption": 0.79 * 3600}, 3600) == []
    near = plan.cell_warnings({"05_corruption": 0.85 * 3600}, 3600)
    assert len(near) == 1 and "within 20 %" in near[0]
    assert "exceeds" in plan.cell_warnings({"06_mtp_sweep": 3600.0}, 3600)[0]


def test_cli_ling3_flash_says_at_most_three_hours():
    r = subprocess.run([sys.executable, "-m", "nvfp4study.cli", "plan", "--params",
                        str(REPO_ROOT / "params" / "ling3-flash.yaml")], capture_output=True, text=True,
                       env={**__import__("os").environ, "NVFP4STUDY_OVERLAY": ""})
    assert r.returncode == 0, r.stderr
    hours = float(r.stdout.split("estimated serving time: ")[1].split(" h")[0])
    assert hours <= 3.0 and "WARNING" not in r.stdout and "protocol card" in r.stdout


def test_run_prints_the_plans_warnings_before_starting(monkeypatch, capsys):
    """``nvfp4study run`` with no preflight blocker prints the per-cell warning, then runs."""
    from nvfp4study.core import runner
    from nvfp4study.workstation import preflight
    from nvfp4study.workstation import run as ws_run

    monkeypatch.setattr(preflight, "preflight", lambda params, **kw: [preflight.Check("params", preflight.OK, "")])
    started = []
    monkeypatch.setattr(runner, "main", lambda argv: started.append(argv) or 0)
    ling = str(REPO_ROOT / "params" / "ling3-flash.yaml")
    assert ws_run.main(["--params", ling, "-p", "corruption.protocol=extended"]) == 0 and started
    assert "plan: WARNING: 05_corruption" in capsys.readouterr().err
    assert ws_run.main(["--params", ling]) == 0
    assert "WARNING" not in capsys.readouterr().err
