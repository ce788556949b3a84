"""Simulated first runs: ``nvfp4study run --params params/ling3-flash.yaml`` end to end, 00 to 99,
on each machine class the card's reader may own, against stand-ins (``machines.py``).

Not part of ``make test`` (the file name is not ``test_*.py``); ``make simulate`` runs it, and CI
after ``make test``. What is checked is what a user meets the first time: the run finishes or
stops with a named reason, every stage ran its GPU path (engine gpu, launcher local or docker),
and the run says everywhere that it was simulated.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from machines import (
    CARD_REPO,
    CARD_SHA,
    CLASSES,
    IMAGE,
    SIMULATED_ENV,
    card_repo,
    description,
    installed_sglang,
    interpreter,
    write_bin,
)

from hub_server import HubServer, Repo
from nvfp4study.core.params import REPO_ROOT
from serving_fixtures import free_port

LING = "params/ling3-flash.yaml"
STAGES = ["00_environment", "01_quantize", "02_inspect_checkpoint", "03_sglang_audit", "04_launch_server",
          "05_corruption", "06_mtp_sweep", "07_determinism", "99_report"]
#: the sizes a simulation shrinks (the card's protocol, fewer requests and tokens); nothing else
SHRINK = ["corruption.claim_tasks=[card/binary_search, card/is_balanced]", "corruption.executed_n=1",
          "corruption.reasoning_probe_tasks=1", "mtp.prompts=2", "mtp.max_tokens=64",
          "determinism.prompts=2", "server.startup_timeout_s=60", "server.health_poll_s=0.05",
          "server.shutdown_grace_s=3", "server.request_timeout_s=60"]


def simulate(name: str, base: Path) -> dict:
    """One class's run; returns ``{"run", "rc", "out", "requests"}``."""
    cls = CLASSES[name]
    base.mkdir(parents=True, exist_ok=True)
    origin = None
    if cls.launcher == "local":
        origin = installed_sglang(base / "site")
    log = base / "requests.jsonl"
    python = interpreter(base / "sglang-env", cls, origin, log)
    path = write_bin(base, cls, python)
    repo = card_repo(base.parent / "card-repo")
    run = base / "run"
    over = [f"server.python={python}", f"server.port={free_port()}", *SHRINK, *cls.overrides]
    if cls.launcher == "docker":  # the README's Docker route as written
        over += ["server.launcher=docker", f"server.docker.image={IMAGE}"]
    cmd = [sys.executable, "-m", "nvfp4study.cli", "run", "--params", LING, "--run-dir", str(run)]
    cmd += ["--skip-preflight"] if cls.skip_preflight else []
    for o in over:
        cmd += ["-p", o]
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "FLASHINFER_NVCC", "HF_HUB_OFFLINE")}
    env.update({"PATH": f"{path}{os.pathsep}{env['PATH']}", SIMULATED_ENV: description(cls),
                "HF_HUB_CACHE": str(base / "hf"), "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"})
    with HubServer([Repo(CARD_REPO, repo, CARD_SHA)]) as srv:
        env["HF_ENDPOINT"] = srv.url
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=900)
    requests = [json.loads(x) for x in log.read_text().splitlines()] if log.is_file() else []
    return {"run": run, "rc": r.returncode, "out": r.stdout[-6000:] + r.stderr[-6000:], "requests": requests}


@pytest.fixture(scope="module", params=list(CLASSES))
def first_run(request, tmp_path_factory):
    return request.param, simulate(request.param, tmp_path_factory.mktemp("sim") / request.param)


def test_simulated_first_run(first_run):
    name, r = first_run
    assert r["rc"] == 0, r["out"]
    manifest = json.loads((r["run"] / "manifest.json").read_text())
    print(json.dumps(manifest.get("stages"), indent=1)[:3000])
