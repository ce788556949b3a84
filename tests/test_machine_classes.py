"""Preflight and notebook 00's checks on each machine class the card's run may meet, from the
recorded ``nvidia-smi`` answers in ``tests/nvidia_smi/`` (sources in its SOURCES.md): a DGX Spark
(GB10, unified memory: ``[N/A]`` for memory), a B200, an RTX PRO 6000 Blackwell, an H200 and an
H100 (captured). Every class gives rows with findings and names its GPU; none raises. Expected
sizes are computed here from the recorded MiB."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nvfp4study.core.params import REPO_ROOT, load_params
from nvfp4study.workstation import preflight as pf
from nvfp4study.workstation import probes

LING = REPO_ROOT / "params" / "ling3-flash.yaml"
SMI = Path(__file__).parent / "nvidia_smi"
CLASSES = ["gb10", "b200", "rtx-pro-6000", "h200", "h100"]
MiB = 2**20
RESIDENT = probes.checkpoint_bytes(load_params(LING).checkpoint.shape)["nvfp4"]
CUDA_TORCH = {"torch_cuda": "13.0"}


def recorded(machine: str) -> dict:
    f = SMI / machine
    return probes.parse_nvidia_smi(*((f / n).read_text() for n in ("query-gpu.csv", "query-apps.csv", "plain.txt")))


def fake_smi_bin(tmp_path: Path, machine: str) -> Path:
    """A folder holding an ``nvidia-smi`` that prints ``machine``'s recorded answers."""
    b = tmp_path / "bin"
    b.mkdir(exist_ok=True)
    exe = b / "nvidia-smi"
    f = SMI / machine
    exe.write_text("#!/bin/sh\ncase \"$1\" in\n"
                   f"  --query-gpu=*) cat '{f / 'query-gpu.csv'}' ;;\n"
                   f"  --query-compute-apps=*) cat '{f / 'query-apps.csv'}' ;;\n"
                   f"  *) cat '{f / 'plain.txt'}' ;;\nesac\n")
    exe.chmod(0o755)
    return b


def by_name(rows):
    return {r.name: r for r in rows}


def test_recorded_answers_parse():
    gb10 = recorded("gb10")
    assert gb10["driver"] == "580.126.09" and gb10["cuda"] == "13.0"
    assert gb10["gpus"] == [{"index": 0, "name": "NVIDIA GB10", "capability": (12, 1), "total_mib": None,
                             "used_mib": None, "free_mib": None, "unified": True}]
    assert gb10["processes"] == [{"pid": 114687, "name": "/usr/local/bin/python", "used_mib": 19135.0}]
    h100 = recorded("h100")  # captured unedited
    assert h100["gpus"][0] == {"index": 0, "name": "NVIDIA H100 80GB HBM3", "capability": (9, 0),
                               "total_mib": 81559.0, "used_mib": 0.0, "free_mib": 81079.0, "unified": False}
    assert h100["cuda"] == "13.0" and h100["processes"] == []
    assert recorded("b200")["gpus"][0]["capability"] == (10, 0)
    assert recorded("rtx-pro-6000")["gpus"][0]["total_mib"] == 97887.0


def test_gb10_sized_from_the_hosts_available_memory():
    """SGLang's pool on a unified-memory GPU is mem_fraction_static x psutil's available memory."""
    p = load_params(LING)
    host = {"total_bytes": 128_000_000_000, "available_bytes": 119_000_000_000, "source": "test"}
    rows = by_name(pf.gpu_checks(p, recorded("gb10"), CUDA_TORCH, RESIDENT, host))
    assert "NVIDIA GB10" in rows["GPU present"].detail and "unified" in rows["GPU present"].detail
    assert rows["GPU compute capability"].verdict == pf.OK and "12.1" in rows["GPU compute capability"].detail
    mem = rows["GPU free memory"]
    pool = 0.75 * 119e9  # 89.25 GB > the predicted weights (about 81.3 GB)
    assert pool > RESIDENT and mem.verdict == pf.OK, mem
    assert f"{pool / 1e9:.1f} GB" in mem.detail and "common.py 449-456" in mem.detail
    host["available_bytes"] = 100_000_000_000  # 75 GB pool: a page cache left by the download
    mem = by_name(pf.gpu_checks(p, recorded("gb10"), CUDA_TORCH, RESIDENT, host))["GPU free memory"]
    assert mem.verdict == pf.BLOCKER and "75.0 GB" in mem.detail and "drop_caches" in mem.fix
    assert "pid 114687" in mem.detail
    unknown = by_name(pf.gpu_checks(p, recorded("gb10"), CUDA_TORCH, RESIDENT, {"error": "no psutil"}))
    assert unknown["GPU free memory"].verdict == pf.WARNING and "no psutil" in unknown["GPU free memory"].detail


@pytest.mark.parametrize("machine,capability,fits", [
    ("b200", pf.OK, True),            # 0.75 x 183359 MiB = 144.2 GB
    ("rtx-pro-6000", pf.OK, False),   # 0.75 x 97887 MiB = 77.0 GB < the predicted weights
    ("h200", pf.BLOCKER, True),       # Hopper: refused by name; 0.75 x 143771 MiB = 113.1 GB
    ("h100", pf.BLOCKER, False),      # Hopper; 0.75 x 81559 MiB = 64.1 GB
])
def test_discrete_classes(machine, capability, fits):
    p = load_params(LING)
    smi = recorded(machine)
    g = smi["gpus"][0]
    rows = by_name(pf.gpu_checks(p, smi, CUDA_TORCH, RESIDENT))
    assert g["name"] in rows["GPU present"].detail
    assert rows["GPU compute capability"].verdict == capability
    pool = 0.75 * g["total_mib"] * MiB
    assert (pool >= RESIDENT) == fits
    mem = rows["GPU free memory"]
    assert mem.verdict == (pf.OK if fits else pf.BLOCKER) and f"{pool / 1e9:.1f} GB" in mem.detail
    assert rows["driver / CUDA"].verdict == pf.OK and "580." in rows["driver / CUDA"].detail


@pytest.mark.parametrize("machine", CLASSES)
def test_simulated_first_preflight(machine, tmp_path):
    """``nvfp4study preflight --params params/ling3-flash.yaml`` with the class's ``nvidia-smi``
    first on PATH: every check listed, the GPU named, no internal error (exit 1: this machine has
    no interpreters at /opt/envs); then ``nvfp4study run`` stops at preflight with the same table."""
    env = {**os.environ, "PATH": f"{fake_smi_bin(tmp_path, machine)}{os.pathsep}{os.environ['PATH']}",
           "NVFP4STUDY_OVERLAY": ""}
    r = subprocess.run([sys.executable, "-m", "nvfp4study.cli", "preflight", "--params", str(LING), "--json"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "internal error" not in r.stderr
    rows = {x["name"]: x for x in json.loads(r.stdout)["rows"]}
    assert recorded(machine)["gpus"][0]["name"] in rows["GPU present"]["detail"]
    assert rows["GPU present"]["verdict"] == pf.OK
    assert {"GPU compute capability", "GPU free memory", "driver / CUDA", "bubblewrap sandbox"} <= set(rows)
    if machine == "gb10":
        assert "psutil.virtual_memory()" in rows["GPU free memory"]["detail"]
    # the first step of `nvfp4study run` on that machine: preflight's table, a named stop, no folder
    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "nvfp4study.cli", "run", "--params", str(LING), "--run-dir", str(run)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1 and "internal error" not in r.stderr and "Traceback" not in r.stderr
    assert recorded(machine)["gpus"][0]["name"] in r.stderr and "stopped before any stage" in r.stderr
    assert not run.exists()


def test_notebook_00_table_on_a_gb10(tmp_path, monkeypatch):
    """Notebook 00's preflight cell (``s00.preflight_table``) on a GB10: a table, no traceback."""
    from nvfp4study.stages import s00_environment as s0

    monkeypatch.setenv("PATH", f"{fake_smi_bin(tmp_path, 'gb10')}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("NVFP4STUDY_OVERLAY", "")
    stage = s0.open_stage(str(LING), str(tmp_path / "run"))
    df = s0.preflight_table(stage)
    row = df.set_index("check").loc["GPU present"]
    assert row["verdict"] == pf.OK and "NVIDIA GB10" in row["detail"]
    saved = json.loads((tmp_path / "run" / "data" / "preflight.json").read_text())
    assert saved["blockers"] == int((df["verdict"] == pf.BLOCKER).sum())


def test_the_served_gpu_is_recorded_and_replayed(tmp_path, monkeypatch):
    """Stage 06 records which GPU served (nvidia-smi's GPU 0) and a replay reads the recorded one,
    whatever machine the replay runs on; without nvidia-smi it is unknown (None)."""
    from nvfp4study.core.paths import RunPaths
    from nvfp4study.core.stage import Stage
    from nvfp4study.stages import s06_mtp

    monkeypatch.setenv("PATH", f"{fake_smi_bin(tmp_path, 'b200')}{os.pathsep}{os.environ['PATH']}")
    p = load_params(LING, overlay=False)
    live = Stage(name="06_mtp_sweep", params=p, paths=RunPaths(tmp_path / "run1"))
    assert s06_mtp.served_gpu(live) == "NVIDIA B200"
    assert json.loads((tmp_path / "run1" / "data" / "served-gpu.json").read_text())["driver"] == "580.82.07"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # the replaying machine has no GPU
    (tmp_path / "run1" / "params.yaml").write_text(__import__("yaml").safe_dump(p.model_dump(mode="json")))
    replay = Stage(name="06_mtp_sweep", params=p.model_copy(update={"replay_from": str(tmp_path / "run1")}),
                   paths=RunPaths(tmp_path / "run2"))
    assert s06_mtp.served_gpu(replay) == "NVIDIA B200"
    assert s06_mtp.served_gpu(Stage(name="06_mtp_sweep", params=p, paths=RunPaths(tmp_path / "run3"))) is None
