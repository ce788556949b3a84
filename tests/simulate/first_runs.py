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
STAGES = ["00_environment", "01_quantize", "02_inspect_checkpoint", "03_patch_sglang", "04_launch_server",
          "05_corruption", "06_mtp_sweep", "07_determinism", "99_report"]
#: the sizes a simulation shrinks (the card's protocol with fewer requests and tokens, fewer audited
#: releases and detector samples); no code path changes
SHRINK = ["corruption.claim_tasks=[card/binary_search, card/is_balanced]", "corruption.executed_n=1",
          "corruption.reasoning_probe_tasks=1", "mtp.prompts=2", "mtp.max_tokens=64",
          "determinism.prompts=2", "server.startup_timeout_s=60", "server.health_poll_s=0.05",
          "server.shutdown_grace_s=3", "server.request_timeout_s=60",
          # 03's audit of the served release only, 05's detector validation on 20 HumanEval problems
          "sglang.audit_versions=[0.5.23]", "sglang.card_patch_versions=[0.5.23]", "corruption.humaneval_count=20"]


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


@pytest.mark.parametrize("name", list(CLASSES))
def test_first_run(name, tmp_path):
    """One class's simulated first run and everything it must show (the checks below). One test
    per class, so that ``make simulate`` (pytest-xdist, two workers) runs each class once."""
    r = simulate(name, tmp_path / name)
    for check in CHECKS:
        check(name, r)


def _ledger(run: Path) -> dict[str, dict]:
    return {r["id"]: r for r in json.loads((run / "ledger.json").read_text())["rows"]}


def check_every_stage_ran_and_says_simulated(name: str, r: dict) -> None:
    """00 to 99 ran (the run finished); the run folder, environment.json, the manifest, every
    ledger row a stage recorded and the report name the stand-ins."""
    assert r["rc"] == 0, r["out"]
    manifest = json.loads((r["run"] / "manifest.json").read_text())
    assert [(n["notebook"], n["status"]) for n in manifest["notebooks"]] == [(s, "ok") for s in STAGES]
    said = description(CLASSES[name])
    assert manifest["simulated"] == said
    assert json.loads((r["run"] / "data" / "environment.json").read_text())["simulated"] == said
    recorded = [row for row in _ledger(r["run"]).values() if row["note"] != "stage did not run"]
    assert recorded and all(row.get("simulated") == said and row["note"].startswith("SIMULATED")
                            and row["checked_on"].startswith("simulated stand-ins") for row in recorded)
    assert "SIMULATED RUN: no value on this page is a measurement." in (r["run"] / "report.html").read_text()
    # preflight (00's table): no blocker, but a Hopper's capability and a GB10 host's memory (this
    # CI host, which SGLang on a GB10 would size its pool from, is no 128 GB machine)
    pre = json.loads((r["run"] / "data" / "preflight.json").read_text())
    blocked = {x["name"] for x in pre["rows"] if x["verdict"] == "blocker"}
    allowed = {"h200": {"GPU compute capability"}, "gb10": {"GPU free memory"}}.get(name, set())
    assert blocked <= allowed and (name != "h200" or blocked), pre["rows"]


def check_the_gpu_paths_ran(name: str, r: dict) -> None:
    """The card's checkpoint came from the (stand-in) Hub at its commit; every launch was the GPU
    engine's, through the class's launcher, on the class's GPU as its nvidia-smi names it."""
    cls, run = CLASSES[name], r["run"]
    params = __import__("yaml").safe_load((run / "params.yaml").read_text())
    assert params["server"]["engine"] == "gpu" and params["server"]["launcher"] == cls.launcher
    assert json.loads((run / "data" / "card_checkpoint.json").read_text())["commit"] == CARD_SHA
    audit = _ledger(run)["audit.gate-up-shared"]  # 02 audited what 01 downloaded, named as the card's
    assert f"the card's own checkpoint, hf:{CARD_REPO}@{CARD_SHA}" in audit["note"] and "RANDOM" not in audit["note"]
    launches = [json.loads(x) for f in sorted((run / "data").glob("serve-launch-*.jsonl"))
                for x in f.read_text().splitlines()]
    if cls.capability[0] < 10:
        assert not launches and not r["requests"]  # check_hopper_is_refused_by_name
        return
    assert launches and {x["launcher"] for x in launches} == {cls.launcher}
    assert r["requests"]  # the stand-in server answered
    assert {x["gpu"]["name"] for x in launches if x.get("gpu")} == {cls.gpu_name}
    assert json.loads((run / "data" / "served-gpu.json").read_text())["name"] == cls.gpu_name


def check_tok_s_is_compared_with_the_cards_only_on_its_gpu_class(name: str, r: dict) -> None:
    """The card's tok/s are a GB10's: on the GB10 the speculation-off row compares them; on any
    other class it is not run, naming the served GPU, and the depth rows still judge speedup and
    acceptance (machine-independent)."""
    rows = _ledger(r["run"])
    off, k1 = rows["mtp.off"], rows["mtp.k1"]
    if CLASSES[name].capability[0] < 10:
        return  # nothing served (check_hopper_is_refused_by_name)
    if name == "gb10":
        assert off["verdict"] != "not run" and "not compared" not in off["note"]
    else:
        assert off["verdict"] == "not run" and "tok/s not compared" in off["note"]
        assert CLASSES[name].gpu_name in off["note"]
    assert k1["verdict"] != "not run" and "speedup" in k1["note"]


def check_hopper_is_refused_by_name(name: str, r: dict) -> None:
    """On an H200 preflight names the blocker; run with --skip-preflight, no server is launched
    and every serving claim of 04-07 is "not run" with the GPU's compute capability as reason."""
    if CLASSES[name].capability[0] >= 10:
        return
    rows = _ledger(r["run"])
    serving = [row for row in rows.values() if row["stage"] in ("04_launch_server", "06_mtp_sweep", "07_determinism")
               and row.get("origin") == "card"]
    assert serving and all(row["verdict"] == "not run" and "compute capability 9.0 < 10.0" in row["note"]
                           for row in serving), [(x["id"], x["note"]) for x in serving]
    pre = json.loads((r["run"] / "data" / "preflight.json").read_text())
    cap = next(x for x in pre["rows"] if x["name"] == "GPU compute capability")
    assert cap["verdict"] == "blocker" and "Hopper" in cap["detail"]


def check_local_install_is_left_stock(name: str, r: dict) -> None:
    """03 patched the local SGLang install for 04-07 and put the released files back after."""
    if CLASSES[name].launcher != "local":
        return
    from nvfp4study.sglang import patch as sglang_patch
    from nvfp4study.sglang import source as sglang_source

    tree = sglang_source.open_tree(r["run"].parent / "site", origin="installed")
    assert sglang_patch.status(tree)["clamp_mode"] == "stock"


def check_docker_route_hash_checks_and_mounts(name: str, r: dict) -> None:
    """The README's Docker route: no local SGLang, the image's files hash-checked against the
    released wheel's before patched copies were mounted over them."""
    if CLASSES[name].launcher != "docker":
        return
    calls = [json.loads(x) for x in (r["run"].parent / "bin" / "state" / "calls.jsonl").read_text().splitlines()]
    checks = [i for i, c in enumerate(calls) if any("nvfp4study-image-files" in a for a in c)]
    runs = [i for i, c in enumerate(calls) if c[:1] == ["run"] and "--name" in c]
    assert checks and runs and checks[0] < runs[0]
    assert all(any(a.endswith(":ro") and "sglang-docker-" in a for a in calls[i]) for i in runs)
    launches = [json.loads(x) for f in sorted((r["run"] / "data").glob("serve-launch-*.jsonl"))
                for x in f.read_text().splitlines()]
    assert launches and all("files matched the released wheel's (sha256)" in x["install"] for x in launches)


CHECKS = [check_every_stage_ran_and_says_simulated, check_the_gpu_paths_ran, check_tok_s_is_compared_with_the_cards_only_on_its_gpu_class, check_hopper_is_refused_by_name, check_local_install_is_left_stock, check_docker_route_hash_checks_and_mounts]
