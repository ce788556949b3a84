"""Preflight's GPU rows: present, compute capability, memory for SGLang's pool, driver / CUDA.

Thresholds and their sources:

- NVFP4 W4A4 MoE in SGLang 0.5.23 needs compute capability major 10, 11 or 12 and CUDA >= 12.8
  (``is_blackwell``, ``sglang/srt/utils/common.py`` 297-303, checked by
  ``CompressedTensorsW4A4Nvfp4MoE.__init__``, ``compressed_tensors_w4a4_nvfp4_moe.py`` 38-43);
  Hopper (9.x) is refused by name.
- SGLang sizes its static pool as ``mem_fraction_static`` x the memory available before the
  weights load (``distributed/bootstrap.py`` 193-213, ``mem_cache/kv_cache_configurator.py``
  3007): the weights (the predicted NVFP4 size) must fit in it. On a discrete GPU the check uses
  ``nvidia-smi``'s total and free memory. On a GPU that shares the host's memory (DGX Spark /
  GB10, whose ``nvidia-smi`` prints ``[N/A]`` for memory) SGLang reads the host's available
  memory, ``psutil.virtual_memory().available`` (``srt/utils/common.py`` 449-456), and so does
  this check (:func:`.probes.host_memory`).
"""

from __future__ import annotations

from typing import Any

from ..core.params import Params
from ..serving.strategies import in_image, serves_standin
from . import probes
from .checks import BLOCKER, GB, NA, OK, WARNING, Check, cuda_version, quantizing, serving

MIN_SERVE_CUDA = (12, 8)
ARCH = {7: "Volta/Turing", 8: "Ampere/Ada", 9: "Hopper", 10: "Blackwell", 11: "Blackwell", 12: "Blackwell"}
NAMES = ["GPU present", "GPU compute capability", "GPU free memory", "driver / CUDA"]


def gpu_list(smi: dict | None, probe: dict | None) -> list[dict[str, Any]]:
    """The GPUs ``nvidia-smi`` lists, else those the probed torch sees (MiB, as ``nvidia-smi``)."""
    return (smi or {}).get("gpus") or [
        {"name": g["name"], "capability": tuple(g["capability"]), "total_mib": g["total_bytes"] / 2**20,
         "free_mib": g["free_bytes"] / 2**20, "unified": False} for g in (probe or {}).get("gpus") or []]


def gpu_checks(p: Params, smi: dict | None, probe: dict | None, resident: int,
               host: dict | None = None) -> list[Check]:
    """GPU present, compute capability, memory for ``resident`` weight bytes, driver / CUDA.

    Args:
        smi: :func:`.probes.nvidia_smi` (or :func:`.probes.parse_nvidia_smi` of a record).
        probe: the SGLang (or quantizer) interpreter's :func:`.probes.probe_interpreter` answer.
        resident: bytes of the served weights.
        host: :func:`.probes.host_memory` for a unified-memory GPU (None: asked when needed).

    Returns four rows named as :data:`NAMES`; never raises for a machine's answer.
    """
    need_serve = serving(p) and not serves_standin(p)  # the CPU engine serves without a GPU
    need_cuda = quantizing(p) and p.quantize.device.startswith("cuda")
    if not (need_serve or need_cuda):
        why = ("server.engine is cpu (SGLang's engine on this CPU)" if serving(p) else "server.enabled is false") \
            + " and quantize.device is not cuda"
        return [Check(n, NA, why) for n in NAMES]
    gpus = gpu_list(smi, probe)
    if not gpus:
        why = ("nvidia-smi not found on PATH" if smi is None else "nvidia-smi lists no GPU")
        why += " and no torch that was probed sees a CUDA device"
        fix = ("run on the GPU workstation (NVIDIA driver installed), or set server.enabled: false "
               "and quantize.device: cpu")
        return [Check(NAMES[0], BLOCKER, why, fix)] + [
            Check(n, BLOCKER, "no GPU to check", "see 'GPU present'") for n in NAMES[1:]]
    g = gpus[0]
    memory = "unified with the host" if g.get("unified") else f"{(g.get('total_mib') or 0) * 2**20 / GB:.1f} GB"
    return [Check(NAMES[0], OK, f"{len(gpus)} GPU(s); GPU 0: {g['name']} ({memory})"),
            capability_check(p, g, need_serve),
            memory_check(p, g, smi, resident, host, need_serve),
            driver_check(smi, probe, need_serve, docker=in_image(p))]


def capability_check(p: Params, g: dict[str, Any], need_serve: bool) -> Check:
    """Blackwell (10.x-12.x) for serving; any CUDA GPU for quantization."""
    cap, name = g.get("capability"), NAMES[1]
    if not need_serve or not p.server.require_gpu:
        return Check(name, NA if not need_serve else OK,
                     f"{cap}: quantization runs on any CUDA GPU" if not need_serve
                     else f"{cap}: server.require_gpu is false")
    if cap is None:
        return Check(name, BLOCKER, f"{g['name']}: capability unknown (driver too old for compute_cap)",
                     "update the NVIDIA driver")
    if cap[0] in (10, 11, 12):
        return Check(name, OK, f"{g['name']}: {cap[0]}.{cap[1]} (Blackwell): NVFP4 W4A4 MoE can run")
    return Check(name, BLOCKER,
                 f"{g['name']} is {ARCH.get(cap[0], 'pre-Blackwell')} ({cap[0]}.{cap[1]}): SGLang's NVFP4 "
                 "W4A4 MoE scheme needs compute capability 10.x-12.x (Blackwell) and refuses it",
                 "serve on a Blackwell GPU; on this GPU only quantization (quantize.device: cuda) "
                 "can run: set server.enabled: false")


def _memory_basis(g: dict[str, Any], host: dict | None) -> tuple[float, float, str] | str:
    """``(total bytes, available bytes, where from)`` as SGLang sizes its pool, or a reason."""
    if not g.get("unified") and g.get("total_mib") is not None and g.get("free_mib") is not None:
        return g["total_mib"] * 2**20, g["free_mib"] * 2**20, "nvidia-smi memory.total / memory.free"
    if not g.get("unified"):
        return f"nvidia-smi reports no memory size for {g['name']}"
    host = host if host is not None else probes.host_memory()
    if "error" in host:
        return f"{g['name']} shares the host's memory and the host's size is unknown ({host['error']})"
    return (float(host["total_bytes"]), float(host["available_bytes"]),
            f"unified memory: nvidia-smi prints [N/A]; SGLang sizes from the host's available memory, "
            f"{host['source']} (sglang srt/utils/common.py 449-456)")


def memory_check(p: Params, g: dict[str, Any], smi: dict | None, resident: int, host: dict | None,
                 need_serve: bool) -> Check:
    """SGLang's pool, ``mem_fraction_static`` x the available memory (module docstring), holds
    ``resident`` bytes; on a discrete GPU the free memory must also cover the pool."""
    name = NAMES[2]
    basis = _memory_basis(g, host)
    if isinstance(basis, str):
        return Check(name, WARNING if need_serve else NA, basis + ": the fit of the weights is not checked",
                     "check by hand that the GPU holds the weights" if need_serve else "")
    total, free, where = basis
    if not need_serve:
        return Check(name, NA, f"{free / GB:.1f} GB free: quantization holds one tensor at a time ({where})")
    frac = p.server.mem_fraction_static
    holders = ", ".join(f"pid {x['pid']} {x['name']} {x['used_mib'] or 0:.0f} MiB"
                        for x in (smi or {}).get("processes", []))
    if g.get("unified"):  # SGLang's basis is the available memory itself
        pool = frac * free
        detail = f"{free / GB:.1f} GB available of {total / GB:.1f} GB ({where}); pool {frac} x available = {pool / GB:.1f} GB"
        if resident > pool:
            return Check(name, BLOCKER, f"{detail} < weights {resident / GB:.1f} GB; held by: {holders or 'none listed'}",
                         "free host memory (stop other processes; drop the page cache: sync; echo 3 | sudo tee "
                         "/proc/sys/vm/drop_caches), or raise server.mem_fraction_static")
        return Check(name, OK, f"{detail} holds the weights ({resident / GB:.1f} GB)")
    pool = frac * total
    if resident > pool:
        return Check(name, BLOCKER, f"weights {resident / GB:.1f} GB > mem_fraction_static "
                     f"{frac} x {total / GB:.1f} GB = {pool / GB:.1f} GB",
                     "a GPU with more memory, or raise server.mem_fraction_static")
    if free < pool:
        return Check(name, BLOCKER, f"{free / GB:.1f} GB free of {total / GB:.1f} GB, SGLang's "
                     f"pool needs {pool / GB:.1f} GB; held by: {holders or 'unknown processes'}",
                     "stop the processes holding GPU memory (nvidia-smi lists them)")
    return Check(name, OK, f"{free / GB:.1f} GB free of {total / GB:.1f} GB; pool "
                 f"{pool / GB:.1f} GB holds the weights ({resident / GB:.1f} GB)")


def driver_check(smi: dict | None, probe: dict | None, need_serve: bool, docker: bool = False) -> Check:
    """A CUDA torch, a driver at least as new as torch's CUDA, CUDA >= 12.8 for serving. With
    ``docker`` (``server.launcher: docker``) and no local torch probed, the torch is the image's:
    only the driver's CUDA is checked against 12.8."""
    name = NAMES[3]
    drv, torch_cuda = (smi or {}).get("cuda"), (probe or {}).get("torch_cuda")
    detail = f"driver {(smi or {}).get('driver') or '?'} (CUDA {drv or '?'}), torch CUDA {torch_cuda or '?'}"
    d, t = cuda_version(drv), cuda_version(torch_cuda)
    if docker and t is None:
        detail = f"driver {(smi or {}).get('driver') or '?'} (CUDA {drv or '?'}); torch is the image's (not probed here)"
        if d is None or d < MIN_SERVE_CUDA:
            return Check(name, BLOCKER, detail + ": SGLang's NVFP4 MoE needs a driver for CUDA >= 12.8",
                         "update the NVIDIA driver (580+ for the CUDA 13 images)")
        return Check(name, OK, detail)
    if torch_cuda is None or t is None:
        return Check(name, BLOCKER, detail + ": the probed torch is not a CUDA build",
                     "install a CUDA build of torch in the environment (make workstation-envs)")
    if d and d < t:
        return Check(name, BLOCKER, detail + ": the driver is older than torch's CUDA",
                     "update the NVIDIA driver, or a torch built for the driver's CUDA")
    if need_serve and t < MIN_SERVE_CUDA:
        return Check(name, BLOCKER, detail + ": SGLang's NVFP4 MoE needs CUDA >= 12.8",
                     "a torch / SGLang build for CUDA 12.8+")
    return Check(name, OK, detail)


def flashinfer_jit_check(p: Params, probe: dict | None, found: dict | None = None) -> Check:
    """FlashInfer's fused-MoE kernel is compiled on the first launch, before the first token:
    FlashInfer 0.7.2's wheel ships none (``flashinfer/fused_moe/core.py`` 649-662) and builds it
    with the ``nvcc`` that :func:`.probes.flashinfer_nvcc` finds in the server's environment
    (this process's, with ``server.env`` over it). That compiler must exist and be of torch's
    CUDA major (``probe["torch_cuda"]``), at least 12.8 (sm_100/sm_120 code). ``found``: the
    probe's answer (None: asked here). Not applicable with the docker launcher (the image's
    toolkit) or without a GPU server."""
    import os

    name = "FlashInfer JIT compiler (nvcc)"
    if not serving(p) or serves_standin(p):
        return Check(name, NA, "no GPU server is launched")
    if in_image(p):
        return Check(name, NA, f"server.launcher is docker: the image {p.server.docker.image} compiles with its own toolkit")
    f = found if found is not None else probes.flashinfer_nvcc({**os.environ, **p.server.env})
    fix = ("install the CUDA 13 toolkit (nvcc) and set CUDA_HOME to it (server.env: {CUDA_HOME: ...}), "
           "the way FlashInfer finds it: CUDA_HOME, CUDA_PATH, nvcc on PATH, /usr/local/cuda")
    where = f"{f['nvcc']} (toolkit from {f['how']})"
    if f["release"] is None:
        return Check(name, BLOCKER, f"{where}: {f['error']}; the first launch would fail compiling FlashInfer's "
                     "fused-MoE kernel", fix)
    nv, torch_cuda = cuda_version(f["release"]), cuda_version((probe or {}).get("torch_cuda"))
    if nv < MIN_SERVE_CUDA or (torch_cuda and nv[0] != torch_cuda[0]):
        want = f"CUDA {torch_cuda[0]}.x like torch" if torch_cuda else "CUDA >= 12.8"
        return Check(name, BLOCKER, f"{where}: release {f['release']}, FlashInfer's build needs {want}", fix)
    return Check(name, OK, f"{where}: release {f['release']}; the first launch compiles the fused-MoE kernel "
                 "(tens of minutes; the plan's load time does not count it)")
