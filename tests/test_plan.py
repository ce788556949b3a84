"""The run plan: launches, requests and tokens counted by hand for a small profile, the time from
the stated assumptions, and the saving of a batched corruption sweep."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nvfp4study.core.params import REPO_ROOT, load_params
from nvfp4study.workstation import plan

SMALL = ["mtp.depths=[0,2]", "mtp.prompts=2", "mtp.max_tokens=100", "mtp.warmup_requests=1",
         "determinism.prompts=1", "determinism.repeats=2", "determinism.max_tokens=50",
         "determinism.deterministic_mode=false", "determinism.spec_depth=2",
         "corruption.humaneval_count=0", "corruption.card_tasks=true", "corruption.clamp_modes=[exact]",
         "corruption.reasoning_probe_tasks=0"]
A = {"load_s": 100.0, "tok_s": {0: 10.0, 2: 20.0}, "tok_s_deterministic": {}, "source": "given"}


def test_small_plan_by_hand():
    p = load_params(REPO_ROOT / "params" / "ling3-flash.yaml", SMALL)
    s = plan.summary(p, A)
    got = [(x["config"], x["requests"], x["tokens"]) for x in s["launches"]]
    # depth 0: 2 mtp prompts x 100 + 2 det requests x 50 + one 64-token warm-up; same at depth 2
    # (04's card config is depth 2); 05: 15 card tasks x 4 sampling configs x 2048 tokens
    assert got == [("clamp=exact-spec=off-det=off", 5, 364), ("clamp=exact-spec=2-det=off", 5, 364),
                   ("clamp=exact-spec=2-det=off", 60, 15 * 4 * 2048)]
    assert s["total_s"] == pytest.approx(3 * 100 + 364 / 10 + 364 / 20 + 15 * 4 * 2048 / 20)
    assert s["concurrency_saving_s"] is None
    p4 = load_params(REPO_ROOT / "params" / "ling3-flash.yaml", [*SMALL, "corruption.concurrency=4"])
    s4 = plan.summary(p4, A)
    assert s4["launches"][2]["config"] == "clamp=exact-spec=2-det=off-mrr=4"  # its own launch
    assert s4["concurrency_saving_s"] == pytest.approx(15 * 4 * 2048 / 20 * (1 - 1 / 4))


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
