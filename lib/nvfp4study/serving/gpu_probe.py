"""Which GPU the SGLang environment sees: compute capability, name and memory of GPU 0, probed in
that environment's interpreter (the study's own may hold a CPU-only torch), and whether SGLang's
NVFP4 W4A4 MoE scheme can run on it. :mod:`nvfp4study.serving.server` re-exports these names.
"""

from __future__ import annotations

import ast
import functools
import os
import subprocess
from typing import Any

from ..core.params import Params
from .launch_env import STANDIN_NOTE
from .strategies import in_image, serves_standin

GPU_PROBE = (
    "import torch; c = torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None; "
    "p = torch.cuda.get_device_properties(0) if c else None; "
    "print(repr((c[0], c[1], p.name, p.total_memory) if c else None))"
)

# NVFP4 W4A4 MoE needs Blackwell: ``is_blackwell`` = compute capability major in {10, 11, 12}
# and CUDA >= 12.8 (sglang/srt/utils/common.py 297-303), checked by
# ``CompressedTensorsW4A4Nvfp4MoE.__init__`` (compressed_tensors_w4a4_nvfp4_moe.py 38-43).
NVFP4_CAPABILITY_MAJORS = (10, 11, 12)


def gpu_capability(python: str | tuple[str, ...] | None = None) -> tuple[int, int] | None:
    """Compute capability of GPU 0, or None when no CUDA GPU is visible.

    With ``python`` (the SGLang environment's interpreter) the probe runs there, because the
    study's own environment may hold a CPU-only torch; otherwise this process's torch is asked.
    """
    info = gpu_info(python)
    return None if info is None else (info["capability"][0], info["capability"][1])


#: device nodes without which no CUDA (or ROCm) GPU is visible to torch here or to a container
#: started here: the NVIDIA driver's nodes, WSL2's GPU node, ROCm's kernel driver node
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg", "/dev/kfd")


def no_gpu_device(nodes: tuple[str, ...] = GPU_DEVICE_NODES) -> bool:
    """True when none of ``nodes`` exists: then torch sees no GPU (a CPU-engine launch records
    no GPU without starting an interpreter that imports torch, about 1.5 s of CPU per notebook)."""
    return not any(os.path.exists(n) for n in nodes)


@functools.lru_cache(maxsize=8)
def gpu_info(python: str | tuple[str, ...] | None = None) -> dict[str, Any] | None:
    """``{"capability": (major, minor), "name": str, "memory_gb": float (1e9 bytes)}`` of GPU 0
    (cached per interpreter: the probe imports torch, which takes seconds). ``python`` may be an
    argv prefix (:func:`probe_python`: ``docker run ... python3`` for the docker launcher)."""
    if python:
        prefix = [python] if isinstance(python, str) else list(python)
        try:
            out = subprocess.run([*prefix, "-c", GPU_PROBE], capture_output=True, text=True, timeout=120)
            val = ast.literal_eval(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else None
        except (OSError, subprocess.TimeoutExpired, ValueError, SyntaxError):
            val = None
    else:
        try:
            import torch
        except ImportError:
            return None
        if not torch.cuda.is_available():
            return None
        c = torch.cuda.get_device_capability(0)
        prop = torch.cuda.get_device_properties(0)
        val = (c[0], c[1], prop.name, prop.total_memory)
    if not val:
        return None
    return {"capability": (int(val[0]), int(val[1])), "name": val[2], "memory_gb": round(val[3] / 1e9, 2)}


def probe_python(params: Params) -> str | tuple[str, ...] | None:
    """What runs the GPU probe: ``server.python``, or for ``server.launcher: docker`` the image
    (``docker run --rm --gpus ... --entrypoint python3 IMAGE``; None when no image is set)."""
    if in_image(params):
        from . import docker as dk

        return tuple(dk.probe_prefix(params)) if params.server.docker.image else None
    return params.server.python


def nvfp4_w4a4_supported(capability: tuple[int, int] | None) -> bool:
    """Whether SGLang's NVFP4 W4A4 MoE scheme can run: compute capability 10.x, 11.x or 12.x."""
    return capability is not None and capability[0] in NVFP4_CAPABILITY_MAJORS


# --- why a run cannot serve the card's model ----------------------------------------------
def gpu_refusal(params: Params) -> str | None:
    """Why stages 04-07 cannot serve here (a "needs an NVFP4-capable GPU (...)" sentence) or None."""
    if not params.server.enabled:
        return "needs an NVFP4-capable GPU (server.enabled is false in the params: no GPU on this machine)"
    if not params.server.require_gpu or serves_standin(params):
        return None
    cap = gpu_capability(probe_python(params))
    if cap is None:
        return "needs an NVFP4-capable GPU (no CUDA GPU visible)"
    if not nvfp4_w4a4_supported(cap):
        return f"needs an NVFP4-capable GPU (compute capability {cap[0]}.{cap[1]} < 10.0)"
    return None


def card_refusal(params: Params) -> str | None:
    """Why the card's rows of 04-07 cannot be settled by this run even when it serves: the CPU
    engine serves a stand-in, never the NVFP4 checkpoint; None when the run serves on a GPU (or
    :func:`gpu_refusal`'s reason when it does not serve at all)."""
    if serves_standin(params) and params.server.enabled:
        return ("needs the real model on an NVFP4-capable GPU (this run served SGLang's engine on CPU with a "
                + STANDIN_NOTE + ")")
    return gpu_refusal(params)
