"""What preflight asks the machine: interpreters (in a subprocess, with a timeout), the NVIDIA
driver (``nvidia-smi``), free disk, predicted checkpoint sizes, the Hub, and SGLang's own pins.

Every probe returns plain data and never raises for a machine that lacks the thing probed (a
missing interpreter, no ``nvidia-smi``, no network): preflight turns each answer into a row.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any

from ..checkpoint import layout, recipe
from ..core.params import LingShape

# Run inside the probed interpreter: versions from package metadata (no import of the packages),
# torch imported only when asked (CUDA build, devices, free memory), sglang found without running
# its __init__ (importlib.util.find_spec). Prints one JSON line.
PROBE_CODE = r"""
import importlib.metadata as m, importlib.util as u, json, sys
names, want_torch = json.loads(sys.argv[1]), sys.argv[2] == "1"
out = {"python": sys.version.split()[0], "executable": sys.executable, "packages": {}}
for n in names:
    try:
        out["packages"][n] = m.version(n)
    except m.PackageNotFoundError:
        out["packages"][n] = None
out["requires"] = {}
for n in ("llmcompressor",):
    try:
        out["requires"][n] = [r for r in (m.requires(n) or []) if ";" not in r]
    except m.PackageNotFoundError:
        pass
spec = u.find_spec("sglang")
out["sglang_origin"] = spec.origin if spec else None
if want_torch and out["packages"].get("torch"):
    try:
        import torch
        out["torch_cuda"] = torch.version.cuda
        out["cuda_available"] = bool(torch.cuda.is_available())
        gpus = []
        for i in range(torch.cuda.device_count() if out["cuda_available"] else 0):
            p = torch.cuda.get_device_properties(i)
            free, total = torch.cuda.mem_get_info(i)
            gpus.append({"index": i, "name": p.name, "capability": [p.major, p.minor],
                         "total_bytes": total, "free_bytes": free})
        out["gpus"] = gpus
    except Exception as exc:
        out["torch_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def probe_interpreter(python: str, packages: list[str], *, torch: bool = False,
                      timeout_s: float = 60.0) -> dict[str, Any]:
    """Ask ``python`` for its version, the versions of ``packages`` and (``torch``) its CUDA.

    Returns:
        ``{"python", "executable", "packages": {name: version | None}, "requires":
        {"llmcompressor": [Requires-Dist lines]}, "sglang_origin",
        "torch_cuda", "cuda_available", "gpus": [{"name", "capability", "total_bytes",
        "free_bytes"}]}``, or ``{"error": sentence}`` when the interpreter is missing, not
        executable, exits non-zero, prints no JSON or runs past ``timeout_s`` seconds.
    """
    exe = python if os.path.isabs(python) else (shutil.which(python) or python)
    if not Path(exe).is_file():
        return {"error": f"{python} does not exist"}
    if not os.access(exe, os.X_OK):
        return {"error": f"{exe} is not executable"}
    try:
        r = subprocess.run([exe, "-c", PROBE_CODE, json.dumps(packages), "1" if torch else "0"],
                           capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"{exe} did not answer within {timeout_s:g} s"}
    except OSError as exc:
        return {"error": f"{exe} cannot run: {exc.strerror or exc}"}
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines:
        return {"error": f"{exe} exited {r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}"}
    try:
        return json.loads(lines[-1])
    except ValueError:
        return {"error": f"{exe} printed no probe answer: {lines[-1][:200]}"}


SMI_QUERY_GPU = ("--query-gpu=index,name,compute_cap,memory.total,memory.used,memory.free,driver_version",
                 "--format=csv,noheader,nounits")
SMI_QUERY_APPS = ("--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits")


def nvidia_smi(timeout_s: float = 10.0) -> dict[str, Any] | None:
    """The NVIDIA driver's view (:func:`parse_nvidia_smi` of three ``nvidia-smi`` calls), or
    ``None`` when ``nvidia-smi`` is not on PATH or its GPU query fails (each call at most
    ``timeout_s`` seconds)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None

    def q(*args: str) -> str | None:
        try:
            r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout if r.returncode == 0 else None

    rows = q(*SMI_QUERY_GPU)
    if rows is None:
        return None
    return parse_nvidia_smi(rows, q(*SMI_QUERY_APPS) or "", q() or "")


def parse_nvidia_smi(query_gpu: str, query_apps: str = "", plain: str = "") -> dict[str, Any]:
    """Parse ``nvidia-smi``'s answers: ``{"driver", "cuda", "gpus": [...], "processes": [...]}``.

    Args:
        query_gpu: the output of :data:`SMI_QUERY_GPU` (one CSV line per GPU: index, name,
            compute_cap, memory.total/used/free in MiB, driver_version).
        query_apps: the output of :data:`SMI_QUERY_APPS` (pid, process name, MiB per process).
        plain: ``nvidia-smi``'s plain table; only its ``CUDA Version:`` is read.

    Returns:
        ``gpus``: ``{"index", "name", "capability" (major, minor) or None, "total_mib",
        "used_mib", "free_mib", "unified"}``; a memory field the driver does not report
        (``[N/A]``, ``[Not Supported]``) is None, and ``unified`` is True when ``memory.total``
        is such a field: a GPU that shares the host's memory (DGX Spark / GB10 prints
        ``[N/A]`` for ``memory.total``, ``memory.used`` and ``memory.free``: llama-swap issue
        782, Osmantic/ODS PR 1133). ``compute_cap`` needs driver 510+. ``processes``:
        ``{"pid", "name", "used_mib"}`` of compute processes holding GPU memory. ``cuda``: the
        highest CUDA the driver supports. Lines with fewer than 7 fields are skipped; nothing
        raises.
    """
    gpus, driver = [], None
    for line in query_gpu.strip().splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) < 7 or not f[0].isdigit():
            continue
        cap = tuple(int(x) for x in f[2].split(".")) if re.fullmatch(r"\d+\.\d+", f[2]) else None
        total = _num(f[3])
        gpus.append({"index": int(f[0]), "name": f[1], "capability": cap, "total_mib": total,
                     "used_mib": _num(f[4]), "free_mib": _num(f[5]), "unified": total is None})
        driver = f[6]
    procs = []
    for line in query_apps.strip().splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) >= 3 and f[0].isdigit():
            procs.append({"pid": int(f[0]), "name": f[1], "used_mib": _num(f[2])})
    m = re.search(r"CUDA Version:\s*([0-9.]+)", plain)
    return {"driver": driver, "cuda": m.group(1) if m else None, "gpus": gpus, "processes": procs}


def _num(x: str) -> float | None:
    try:
        return float(x)
    except ValueError:
        return None


def host_memory() -> dict[str, Any]:
    """The host's memory as SGLang reads it for a GPU that shares it: ``{"total_bytes",
    "available_bytes", "source"}`` from ``psutil.virtual_memory()`` (``total``, ``available``:
    on Linux ``MemTotal`` and ``MemAvailable`` of ``/proc/meminfo``, page cache that can be
    reclaimed included). SGLang 0.5.23 sizes memory on an integrated GPU from
    ``psutil.virtual_memory().available`` instead of ``torch.cuda.mem_get_info``
    (``srt/utils/common.py`` 449-456). ``{"error": ...}`` when psutil cannot say."""
    try:
        import psutil

        vm = psutil.virtual_memory()
    except Exception as exc:  # psutil missing, or no /proc: preflight shows the reason
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"total_bytes": int(vm.total), "available_bytes": int(vm.available),
            "source": "psutil.virtual_memory() (MemTotal / MemAvailable)"}


#: FlashInfer 0.7.2's default toolkit folder when ``CUDA_HOME``/``CUDA_PATH`` are unset and no
#: ``nvcc`` is on PATH (``flashinfer/jit/cpp_ext.py`` 58, from torch's ``cpp_extension``).
FLASHINFER_DEFAULT_CUDA_HOME = "/usr/local/cuda"


def flashinfer_nvcc(env: dict[str, str], timeout_s: float = 30.0,
                    default_home: str = FLASHINFER_DEFAULT_CUDA_HOME) -> dict[str, Any]:
    """The ``nvcc`` FlashInfer 0.7.2's JIT would run in a process with environment ``env``, found
    the way it finds it, and its release.

    FlashInfer 0.7.2 (``flashinfer/jit/cpp_ext.py``): the toolkit is ``CUDA_HOME``, else
    ``CUDA_PATH``, else the folder above the ``bin/`` of ``which nvcc``, else
    ``/usr/local/cuda`` (``get_cuda_path``, 47-63); the compiler is ``FLASHINFER_NVCC``, else
    ``<toolkit>/bin/nvcc`` (289); its version is the ``release X.Y,`` of ``nvcc --version``
    (``get_cuda_version``, 67-85).

    Returns:
        ``{"cuda_home", "how" (which rule found it), "nvcc" (path), "release" ("13.0") or None,
        "error" (why there is no release) or None}``; never raises.
    """
    how = next((k for k in ("CUDA_HOME", "CUDA_PATH") if env.get(k)), None)
    home = env.get(how) if how else None
    if home is None:
        found = shutil.which("nvcc", path=env.get("PATH", ""))
        home, how = ((os.path.dirname(os.path.dirname(found)), f"which nvcc ({found})") if found
                     else (default_home, "the default /usr/local/cuda"))
    nvcc = env.get("FLASHINFER_NVCC") or os.path.join(home, "bin", "nvcc")
    out: dict[str, Any] = {"cuda_home": home, "how": how, "nvcc": nvcc, "release": None, "error": None}
    if not os.path.isfile(nvcc):
        out["error"] = f"{nvcc} does not exist"
        return out
    try:
        r = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=timeout_s, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        out["error"] = f"{nvcc} --version failed: {exc}"
        return out
    m = re.search(r"release (\d+\.\d+),", r.stdout)
    out["release"] = m.group(1) if r.returncode == 0 and m else None
    if out["release"] is None:
        out["error"] = f"{nvcc} --version exited {r.returncode} without 'release X.Y,': {(r.stdout + r.stderr)[-200:]}"
    return out


def free_bytes(path: str | Path) -> tuple[int, Path]:
    """Free bytes (``shutil.disk_usage``) at ``path``'s nearest existing ancestor, and that ancestor."""
    probe = Path(path).expanduser().absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free, probe


def checkpoint_bytes(shape: LingShape) -> dict[str, int]:
    """Predicted tensor bytes of the BF16 source and of the NVFP4 + serving output of ``shape``.

    From :func:`nvfp4study.checkpoint.layout.tensor_specs` (BF16) and
    :func:`nvfp4study.checkpoint.recipe.nvfp4_specs` (NVFP4: U8 [o, i/2] + F8_E4M3 [o, i/16] + F32
    scales per quantized projection, the rest as in the source). Safetensors headers (a few MB)
    are not counted. Returns ``{"bf16": bytes, "nvfp4": bytes}``.
    """
    specs = layout.tensor_specs(shape)
    return {"bf16": sum(map(layout.spec_nbytes, specs)),
            "nvfp4": sum(map(layout.spec_nbytes, recipe.nvfp4_specs(shape, specs)))}


def folder_bytes(path: str | Path) -> int:
    """Bytes of the ``*.safetensors`` files in a checkpoint folder (0 when there are none)."""
    return sum(p.stat().st_size for p in Path(path).glob("*.safetensors"))


def hub_reachable(timeout_s: float = 3.0) -> tuple[bool, str]:
    """Whether a TCP connection to the Hub (``HF_ENDPOINT``, default huggingface.co:443) opens
    within ``timeout_s`` (DNS included: resolution runs in a thread so it cannot hang preflight)."""
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    result: dict[str, Any] = {}

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            result["ok"] = True
        except OSError as exc:
            result["err"] = f"{type(exc).__name__}: {exc}"

    t = threading.Thread(target=connect, daemon=True)
    t.start()
    t.join(timeout_s + 0.5)
    if result.get("ok"):
        return True, f"{host}:{port} reachable"
    return False, f"{host}:{port} not reachable ({result.get('err', f'no answer within {timeout_s:g} s')})"


# sglang 0.5.23's own pins (Requires-Dist of sglang-0.5.23.dist-info/METADATA, lines 232, 273,
# 281); re-read from the cached wheel when it is there (:func:`sglang_pins`).
RECORDED_SGLANG_PINS: dict[str, dict[str, str]] = {
    "0.5.23": {"flashinfer-python": "==0.7.2", "sglang-kernel": "==0.4.10", "torch": "==2.14.1"},
}
PINNED = ("flashinfer-python", "sglang-kernel", "torch")


def sglang_pins(version: str) -> tuple[dict[str, str], str]:
    """``({package: specifier}, where from)`` for the packages SGLang ``version`` pins that its
    environment must hold (flashinfer-python, sglang-kernel, torch).

    Read from ``Requires-Dist`` of the unpacked wheel's METADATA in the study's cache when it is
    there, else :data:`RECORDED_SGLANG_PINS` ("recorded"); ``{}`` for an unknown version.
    """
    from ..sglang.source import cache_dir

    meta = cache_dir() / "src" / f"sglang-{version}" / f"sglang-{version}.dist-info" / "METADATA"
    if meta.is_file():
        pins: dict[str, str] = {}
        for line in meta.read_text(errors="replace").splitlines():
            if not line.startswith("Requires-Dist:") or ";" in line:
                continue
            req = line.split(":", 1)[1].strip()
            name = req.split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip()
            norm = name.lower().replace("_", "-")
            if norm in PINNED:
                pins[norm] = req[len(name):].split("]")[-1].strip()
        if pins:
            return pins, str(meta)
    return dict(RECORDED_SGLANG_PINS.get(version, {})), "recorded"


def version_ok(installed: str | None, spec: str) -> bool:
    """Whether ``installed`` satisfies the PEP 440 specifier ``spec`` (a local label such as
    ``+cu130`` is ignored by ``==X`` as PEP 440 says)."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    if installed is None:
        return False
    try:
        return SpecifierSet(spec).contains(Version(installed), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return installed == spec.lstrip("=")


def _docker(args: list[str], timeout_s: float) -> tuple[int, str]:
    """``docker ARGS`` -> (exit status, stdout, or stderr on failure, last 300 chars)."""
    try:
        r = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout_s,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return 124, f"docker {args[0]} did not answer within {timeout_s:g} s"
    except OSError as exc:
        return 127, str(exc)
    return r.returncode, (r.stdout if r.returncode == 0 else r.stderr or r.stdout).strip()[-300:]


def docker_facts(image: str | None, timeout_s: float = 10.0) -> dict[str, Any]:
    """What ``server.launcher: docker`` needs from this machine.

    Returns:
        ``{"exe": docker path or None, "info": (rc, text) of ``docker info --format
        {{json .Runtimes}}``, "runtimes": sorted runtime names, "image": (rc, text) of ``docker
        image inspect IMAGE`` (None without an image or a daemon), "toolkit": path of
        ``nvidia-ctk`` / ``nvidia-container-cli`` or None}``; each docker call at most
        ``timeout_s`` seconds.
    """
    out: dict[str, Any] = {"exe": shutil.which("docker"), "info": (127, "no docker"), "runtimes": [],
                           "image": None, "toolkit": shutil.which("nvidia-ctk") or shutil.which("nvidia-container-cli")}
    if not out["exe"]:
        return out
    out["info"] = _docker(["info", "--format", "{{json .Runtimes}}"], timeout_s)
    if out["info"][0] != 0:
        return out
    try:
        out["runtimes"] = sorted(json.loads(out["info"][1] or "{}"))
    except (json.JSONDecodeError, TypeError):
        pass
    if image:
        out["image"] = _docker(["image", "inspect", image], timeout_s)
    return out
