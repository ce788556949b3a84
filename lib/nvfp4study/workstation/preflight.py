"""Preflight: every check that can fail a long run, all at once, before any stage starts.

``nvfp4study preflight [--params FILE] [-p k=v] [--json]`` prints one table (check, verdict,
detail, fix) and exits 1 when any row is a blocker, 0 otherwise. Verdicts: ``ok``, ``blocker``
(the run would fail), ``warning`` (it would run, weaker or slower), ``not applicable`` (these
params do not need it). ``nvfp4study run`` calls :func:`preflight` first
(:mod:`nvfp4study.workstation.run`); notebook 00 shows the table.

Thresholds and their sources:

- GPU (present, compute capability, memory for SGLang's pool, driver / CUDA): the sources are
  in :mod:`.preflight_gpu`; a GPU that shares the host's memory (DGX Spark / GB10, whose
  ``nvidia-smi`` prints ``[N/A]`` for memory) is sized from the host's available memory, as SGLang
  sizes it there.
- Disk: the predicted BF16 and NVFP4 sizes (:func:`.probes.checkpoint_bytes`) of what the run
  writes, summed per filesystem.
- Quantizer: llmcompressor / compressed-tensors as the study's pair (0.13.0 / 0.18.0) or the
  card's (0.12.0.1 / 0.17.1), torch inside llmcompressor's own ``Requires-Dist`` range.
- SGLang: ``sglang == sglang.version`` and its own pins of flashinfer-python, sglang-kernel
  and torch (:func:`.probes.sglang_pins`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..core.errors import PortInUse, StudyError
from ..core.params import Params, load_params
from ..core.paths import OUTPUTS
from ..serving.strategies import in_image, serves_standin
from . import probes
from .checks import BLOCKER, GB, NA, OK, WARNING, Check, serving_card
from .checks import quantizing as _quantizing
from .checks import serving as _serving
from .checks import size_text as _size
from .preflight_gpu import ARCH, MIN_SERVE_CUDA, flashinfer_jit_check, gpu_checks

__all__ = ["ARCH", "BLOCKER", "SANDBOX_FIX", "Check", "MIN_SERVE_CUDA", "NA", "OK", "WARNING", "blockers", "card_checkpoint_check", "card_download_bytes", "checkpoint_checks",
           "disk_checks", "disk_needs", "docker_checks", "flashinfer_jit_check", "format_rows", "gpu_checks", "main", "patch_check",
           "port_check", "preflight", "quantizer_checks", "rows_as_dicts", "sandbox_check", "sglang_checks", "table"]

QUANTIZER_PAIRS = {("0.13.0", "0.18.0"): "the study's", ("0.12.0.1", "0.17.1"): "the card's"}


# --- disk --------------------------------------------------------------------------------------
def disk_needs(p: Params, outputs: Path) -> list[tuple[str, Path, int]]:
    """``(what, folder, bytes)`` the run will write: generated BF16 source, NVFP4 output (twice
    with ``quantize.compare_unshared``), a BF16 source to download into ``source_path`` or the Hub
    cache, or, with ``checkpoint.serve: card``, only the card's checkpoint (:func:`card_download_bytes`);
    nothing for what the Hub cache already holds."""
    sizes = probes.checkpoint_bytes(p.checkpoint.shape)
    needs: list[tuple[str, Path, int]] = []
    if serving_card(p):  # 01 neither builds nor reads a BF16 source
        if p.checkpoint.card_checkpoint and _hub_snapshot(p.checkpoint.card_checkpoint) is None:
            from ..core import hub

            n, how = card_download_bytes(p, sizes["nvfp4"])
            needs.append((f"card's checkpoint download (Hub cache; {how})", hub.cache_dir(), n))
        return needs
    if p.checkpoint.source == "generate":
        needs.append(("generated BF16 source", outputs, sizes["bf16"]))
    elif p.checkpoint.source == "path" and p.checkpoint.source_path and not Path(p.checkpoint.source_path).is_dir():
        needs.append(("BF16 source to download", Path(p.checkpoint.source_path), sizes["bf16"]))
    elif p.checkpoint.source == "hub" and _quantizing(p) and p.checkpoint.source_hub \
            and _hub_snapshot(p.checkpoint.source_hub) is None:
        from ..core import hub

        needs.append(("BF16 source download (Hub cache)", hub.cache_dir(), sizes["bf16"]))
    if _quantizing(p):
        n = 2 if p.quantize.compare_unshared else 1
        needs.append((f"NVFP4 output{' x2 (compare_unshared)' if n == 2 else ''}", outputs, n * sizes["nvfp4"]))
    return needs


def card_download_bytes(p: Params, predicted: int, hub_ok=probes.hub_reachable) -> tuple[int, str]:
    """``(bytes, how known)`` of the card's checkpoint download: the sizes the Hub lists for the
    files 01 fetches (:func:`nvfp4study.core.hub.snapshot_bytes`) when the Hub answers, else
    ``predicted`` (the NVFP4 layout's size, :func:`.probes.checkpoint_bytes`), said so."""
    from ..core import hub

    src = p.checkpoint.card_checkpoint
    if not hub.offline() and hub_ok()[0]:
        try:
            return hub.snapshot_bytes(hub.HubRef(src.repo_id, src.revision), hub.CHECKPOINT_PATTERNS), \
                f"the Hub's file sizes at {src.revision}"
        except StudyError as exc:
            return predicted, f"predicted from the layout; the Hub's file list failed: {exc}"
    return predicted, "predicted from the layout (the Hub is not reachable from here)"


def disk_checks(p: Params, outputs: Path, free=probes.free_bytes) -> list[Check]:
    """One row per filesystem: free bytes against the sum of :func:`disk_needs` on it."""
    groups: dict[int, list] = {}
    for what, folder, n in disk_needs(p, outputs):
        avail, at = free(folder)
        key = os.stat(at).st_dev
        groups.setdefault(key, []).append((what, folder, n, avail, at))
    if not groups:
        return [Check("disk", NA, "nothing large is written (quantize disabled, no generated source)")]
    out = []
    for items in groups.values():
        need, avail = sum(i[2] for i in items), items[0][3]
        what = " + ".join(f"{i[0]} {_size(i[2])} at {i[1]}" for i in items)
        detail = f"{avail / GB:.1f} GB free at {items[0][4]}; needs {what}"
        if avail < need:
            out.append(Check(f"disk at {items[0][4]}", BLOCKER, detail,
                             f"free {(need - avail) / GB:.1f} GB there, or point the run elsewhere (--run-dir)"))
        elif avail < 1.1 * need:
            out.append(Check(f"disk at {items[0][4]}", WARNING, detail + " (less than 10 % to spare)"))
        else:
            out.append(Check(f"disk at {items[0][4]}", OK, detail))
    return out


# --- interpreters ------------------------------------------------------------------------------
def quantizer_checks(p: Params, probe: dict | None) -> list[Check]:
    """The quantizer interpreter: runs; llmcompressor + compressed-tensors a known pair; torch in
    llmcompressor's range; a CUDA torch when ``quantize.device`` is cuda."""
    names = ["quantizer interpreter", "quantizer packages"]
    if not _quantizing(p):
        return [Check(n, NA, "quantize.enabled is false or checkpoint.quantized_path is set") for n in names]
    exe = p.quantize.python or sys.executable
    if probe is None or "error" in probe:
        return [Check(names[0], BLOCKER, (probe or {}).get("error", f"{exe} not probed"),
                      "set quantize.python to the quantizer environment's interpreter (make workstation-envs)"),
                Check(names[1], BLOCKER, "interpreter not usable", "see 'quantizer interpreter'")]
    pk = probe["packages"]
    out = [Check(names[0], OK, f"{probe['executable']} (Python {probe['python']})")]
    pair = (pk.get("llmcompressor"), pk.get("compressed-tensors"))
    torch_spec = next((r[len("torch"):].strip() for r in probe.get("requires", {}).get("llmcompressor", [])
                       if r.startswith("torch") and not r.startswith("torchvision")), "")
    found = f"llmcompressor {pair[0]}, compressed-tensors {pair[1]}, torch {pk.get('torch')}"
    fix = ("install the study's pair (llmcompressor==0.13.0 compressed-tensors==0.18.0) or the card's "
           "(0.12.0.1 / 0.17.1): make workstation-envs")
    if pair not in QUANTIZER_PAIRS:
        out.append(Check(names[1], BLOCKER, found + ": not a known pair", fix))
    elif pk.get("torch") is None or (torch_spec and not probes.version_ok(pk["torch"], torch_spec)):
        out.append(Check(names[1], BLOCKER, f"{found}: llmcompressor wants torch{torch_spec}", fix))
    elif p.quantize.device.startswith("cuda") and not probe.get("torch_cuda"):
        out.append(Check(names[1], BLOCKER, f"{found}: torch is a CPU build, quantize.device is "
                         f"{p.quantize.device}", "install a CUDA build of torch there, or quantize.device: cpu"))
    else:
        out.append(Check(names[1], OK, f"{found} ({QUANTIZER_PAIRS[pair]} pair)"))
    return out


def sglang_checks(p: Params, probe: dict | None) -> list[Check]:
    """The SGLang interpreter: runs; ``sglang == sglang.version``; SGLang's own pins."""
    names = ["SGLang interpreter", "SGLang packages"]
    if in_image(p):  # whatever sglang.source says: the image's SGLang is served
        return [Check(n, NA, f"server.launcher is docker: the image {p.server.docker.image} holds SGLang and "
                      f"its version is compared with sglang.version {p.sglang.version} at each launch; no local "
                      f"SGLang is needed (03 audits and 04-07 patch copies of the released {p.sglang.version} "
                      "wheel's files)") for n in names]
    if not (_serving(p) or p.sglang.source == "installed"):
        return [Check(n, NA, "server.enabled is false and sglang.source is not 'installed'") for n in names]
    if not p.server.python:
        return [Check(names[0], BLOCKER, "server.python is not set",
                      "set server.python to the SGLang environment's interpreter (make workstation-envs)"),
                Check(names[1], BLOCKER, "no interpreter", "see 'SGLang interpreter'")]
    if probe is None or "error" in probe:
        return [Check(names[0], BLOCKER, (probe or {}).get("error", "not probed"),
                      "set server.python to the SGLang environment's interpreter (make workstation-envs)"),
                Check(names[1], BLOCKER, "interpreter not usable", "see 'SGLang interpreter'")]
    pk = probe["packages"]
    out = [Check(names[0], OK, f"{probe['executable']} (Python {probe['python']})")]
    # the CPU engine runs without SGLang's CUDA pins: its closure is tests/real_sglang/requirements.txt
    pins, where = ({}, "server.engine cpu: make sglang-env") if serves_standin(p) else probes.sglang_pins(p.sglang.version)
    want = {"sglang": f"=={p.sglang.version}"} if p.server.check_version else {}
    want.update(pins)
    bad = [f"{n} {pk.get(n) or 'missing'} (wants {s})" for n, s in want.items() if not probes.version_ok(pk.get(n), s)]
    shown = ", ".join(f"{n} {pk.get(n)}" for n in want)
    if bad:
        out.append(Check(names[1], BLOCKER, "; ".join(bad) + f" (pins from {where})",
                         f"pip install {' '.join(n + s for n, s in want.items())} in that environment "
                         "(make workstation-envs)"))
    else:
        out.append(Check(names[1], OK, f"{shown} (pins from {where})"))
    return out


def patch_check(p: Params, probe: dict | None) -> Check:
    """Whether the serving install can be patched: known version, writable, stock or a study mode."""
    from ..sglang import patch as sglang_patch
    from ..sglang import source as sglang_source

    name = "SGLang install patchable"
    if not (_serving(p) and p.sglang.apply_to_install):
        return Check(name, NA, "sglang.apply_to_install is false (or no server)")
    if in_image(p):  # patched copies of the released files are mounted, nothing written
        if p.sglang.version in sglang_patch.patch_versions():
            return Check(name, OK, f"docker: patched copies of SGLang {p.sglang.version}'s clamp files are "
                         "mounted read-only over the image's (the image is not modified)")
        return Check(name, BLOCKER, f"no patch set for SGLang {p.sglang.version}",
                     f"an image of a version the patcher knows ({', '.join(sglang_patch.patch_versions())})")
    try:
        if p.sglang.source == "path" and p.sglang.path:
            tree = sglang_source.open_tree(p.sglang.path)
        elif probe and probe.get("sglang_origin"):
            tree = sglang_source.open_tree(Path(probe["sglang_origin"]).parent.parent, origin="installed")
        else:
            return Check(name, BLOCKER, "no SGLang install found for server.python", "see 'SGLang interpreter'")
        st = sglang_patch.status(tree)
    except StudyError as exc:
        return Check(name, BLOCKER, f"{type(exc).__name__}: {exc}", "an SGLang version the patcher knows "
                     f"({', '.join(sglang_patch.patch_versions())})")
    files = [tree.file(f) for f in st["files"]]
    # as the patcher judges it: no write bit = read-only, even for root (sglang/patch.py _writable)
    ro = [str(f) for f in files if f.exists() and not all(
        os.access(x, os.W_OK) and x.stat().st_mode & 0o222 for x in (f, f.parent))]
    if ro:
        return Check(name, BLOCKER, f"read-only: {', '.join(ro[:3])}",
                     "make the install writable, or copy it and use sglang.source: path")
    mode = st["clamp_mode"]
    if mode == "modified":
        return Check(name, BLOCKER, f"{tree.root}: clamp files edited by something else ({st['files']})",
                     f"reinstall sglang=={tree.version} (pip install --force-reinstall --no-deps)")
    if mode != "stock":
        return Check(name, WARNING, f"{tree.root} is in clamp mode {mode!r} (an earlier run?); 03 switches it",
                     f"nvfp4study patch revert --sglang {tree.root}")
    return Check(name, OK, f"{tree.root} (SGLang {tree.version}) stock and writable")


# --- docker ------------------------------------------------------------------------------------
def docker_checks(p: Params) -> list[Check]:
    """With ``server.launcher: docker``: the CLI on PATH, the daemon answering (``docker info``),
    the image present locally (``docker image inspect``), the NVIDIA runtime (``nvidia`` among
    ``docker info``'s runtimes, or the NVIDIA Container Toolkit's ``nvidia-ctk`` /
    ``nvidia-container-cli`` on PATH, which ``--gpus`` needs). Otherwise all "not applicable"."""
    names = ["docker CLI", "docker daemon", "docker image", "NVIDIA container runtime"]
    if not in_image(p) or not _serving(p):
        return [Check(n, NA, "server.launcher is local (or no server)") for n in names]
    d = probes.docker_facts(p.server.docker.image)
    if not d["exe"]:
        fix = "install Docker Engine (docs.docker.com/engine/install), or server.launcher: local"
        return [Check(names[0], BLOCKER, "no 'docker' on PATH", fix)] + [
            Check(n, BLOCKER, "no docker CLI", "see 'docker CLI'") for n in names[1:]]
    out = [Check(names[0], OK, d["exe"])]
    if d["info"][0] != 0:
        return out + [Check(names[1], BLOCKER, d["info"][1] or f"docker info exited {d['info'][0]}",
                            "start the daemon (sudo systemctl start docker) and add your user to the docker group")] + [
            Check(n, BLOCKER, "the daemon does not answer", "see 'docker daemon'") for n in names[2:]]
    out.append(Check(names[1], OK, "docker info answers"))
    image = p.server.docker.image
    if not image:
        out.append(Check(names[2], BLOCKER, "server.docker.image is not set",
                         f"set server.docker.image (e.g. lmsysorg/sglang:v{p.sglang.version})"))
    else:
        rc, text = d["image"]
        out.append(Check(names[2], OK, f"{image} present locally") if rc == 0 else
                   Check(names[2], BLOCKER, f"{image}: {text or 'not present'}", f"docker pull {image}"))
    if "nvidia" in d["runtimes"] or d["toolkit"]:
        out.append(Check(names[3], OK, "runtime 'nvidia' registered" if "nvidia" in d["runtimes"] else d["toolkit"]))
    else:
        out.append(Check(names[3], BLOCKER, f"runtimes {d['runtimes']}: no 'nvidia', no NVIDIA Container Toolkit",
                         "install nvidia-container-toolkit, then sudo nvidia-ctk runtime configure --runtime=docker "
                         "and restart docker"))
    return out


# --- the rest ----------------------------------------------------------------------------------
def port_check(p: Params) -> Check:
    from ..serving.process import check_port_free

    if not _serving(p):
        return Check("server port", NA, "no server is launched")
    try:
        check_port_free(p.server.host, p.server.port)
    except PortInUse as exc:
        return Check("server port", BLOCKER, str(exc), f"stop what listens on {p.server.port} or set server.port")
    except OSError as exc:
        return Check("server port", BLOCKER, f"{p.server.host}:{p.server.port}: {exc}", "set server.host / server.port")
    return Check("server port", OK, f"{p.server.host}:{p.server.port} free")


def _hub_snapshot(src) -> Path | None:
    """The Hub cache's snapshot of ``checkpoint.source_hub`` when it holds safetensors, else None
    (huggingface_hub's layout: ``models--org--name/refs/<revision>`` -> ``snapshots/<commit>``)."""
    from ..core import hub

    repo = hub.cache_dir() / f"models--{src.repo_id.replace('/', '--')}"
    ref = repo / "refs" / src.revision
    commit = ref.read_text().strip() if ref.is_file() else src.revision
    snap = repo / "snapshots" / commit
    return snap if snap.is_dir() and any(snap.glob("*.safetensors")) else None


def checkpoint_checks(p: Params, hub=probes.hub_reachable) -> list[Check]:
    """Every checkpoint path the params name exists; a missing BF16 source needs the Hub."""
    out = []
    cp = p.checkpoint
    if serving_card(p):
        out.append(card_checkpoint_check(p, hub))
    elif cp.source == "hub" and not cp.quantized_path and _quantizing(p):
        from ..core import hub as core_hub

        src = cp.source_hub
        if src is None:
            out.append(Check("BF16 source", BLOCKER, "checkpoint.source is hub but source_hub is not set",
                             "set checkpoint.source_hub: {repo_id: inclusionAI/Ling-3.0-flash, revision: main}"))
        elif (snap := _hub_snapshot(src)) is not None:
            out.append(Check("BF16 source", OK, f"{src.repo_id}@{src.revision} in the Hub cache: {snap}"))
        elif core_hub.offline():
            out.append(Check("BF16 source", BLOCKER, f"{src.repo_id}@{src.revision}: HF_HUB_OFFLINE=1 and not in "
                             f"the cache {core_hub.cache_dir()}", "unset HF_HUB_OFFLINE once, or set HF_HUB_CACHE "
                             "to a populated cache"))
        else:
            ok, why = hub()
            out.append(Check("BF16 source", OK if ok else BLOCKER,
                             f"{src.repo_id}@{src.revision}: 01 downloads it ({why})",
                             "" if ok else "make the Hub reachable (or HF_ENDPOINT a mirror), or download the "
                             "BF16 release elsewhere and set checkpoint.source: path with source_path"))
    elif cp.source == "path" and not cp.quantized_path:
        src = Path(cp.source_path or "")
        if cp.source_path and src.is_dir() and probes.folder_bytes(src):
            out.append(Check("BF16 source", OK, f"local files: {probes.folder_bytes(src) / GB:.1f} GB at {src}"))
        else:
            ok, why = hub()
            out.append(Check("BF16 source", BLOCKER, f"{cp.source_path} has no safetensors; Hub: {why}",
                             (f"hf download inclusionAI/Ling-3.0-flash --local-dir {cp.source_path}" if ok else
                              "copy the BF16 release there (the Hub is not reachable from here)")))
    else:
        out.append(Check("BF16 source", NA if cp.quantized_path or cp.source != "generate" else OK,
                         "checkpoint.quantized_path is served" if cp.quantized_path else
                         "generated by 01" if cp.source == "generate" else "quantize is disabled"))
    for key, val in (("checkpoint.quantized_path", cp.quantized_path), ("server.model_path", p.server.model_path),
                     ("mtp.broken_model_path", p.mtp.broken_model_path if _serving(p) else None)):
        if val and not Path(val).is_dir():
            out.append(Check(key, BLOCKER, f"{val} does not exist", f"fix {key} or set it to null"))
    return out


#: what to do when bubblewrap cannot run: the two values ``corruption.sandbox.isolation`` accepts
#: (core/params.py SandboxParams), and Ubuntu 24.04 / DGX OS's AppArmor rule against
#: unprivileged user namespaces (``kernel.apparmor_restrict_unprivileged_userns``, default 1).
SANDBOX_FIX = ("apt-get install bubblewrap; on Ubuntu 24.04 / DGX OS, where AppArmor stops unprivileged "
               "bubblewrap, run as root, add an AppArmor profile for bwrap, or sudo sysctl "
               "kernel.apparmor_restrict_unprivileged_userns=0; or, knowing that generated code then runs "
               "with your files and network, -p corruption.sandbox.isolation=subprocess-unsafe")


def card_checkpoint_check(p: Params, hub=probes.hub_reachable) -> Check:
    """``checkpoint.serve: card``: the card's checkpoint is in the Hub cache, or the Hub answers."""
    from ..core import hub as core_hub

    name, src = "card checkpoint", p.checkpoint.card_checkpoint
    if src is None:
        return Check(name, BLOCKER, "checkpoint.serve is card but checkpoint.card_checkpoint is not set",
                     "set checkpoint.card_checkpoint: {repo_id: kingjones777/Ling-3.0-flash-NVFP4-SGLang-MTP, "
                     "revision: main}, or checkpoint.serve: ours")
    if (snap := _hub_snapshot(src)) is not None:
        return Check(name, OK, f"{src.repo_id}@{src.revision} in the Hub cache: {snap}")
    if core_hub.offline():
        return Check(name, BLOCKER, f"{src.repo_id}@{src.revision}: HF_HUB_OFFLINE=1 and not in the cache "
                     f"{core_hub.cache_dir()}", "unset HF_HUB_OFFLINE once, or set HF_HUB_CACHE to a populated cache")
    ok, why = hub()
    return Check(name, OK if ok else BLOCKER, f"{src.repo_id}@{src.revision}: 01 downloads it and 04-07 serve it ({why})",
                 "" if ok else "make the Hub reachable (or HF_ENDPOINT a mirror), or download it elsewhere and "
                 "set checkpoint.quantized_path to the folder")


def sandbox_check(p: Params) -> Check:
    """Bubblewrap runs generated code (:func:`nvfp4study.codeeval.isolation.sandbox_status`)."""
    from ..codeeval.isolation import sandbox_status

    try:
        st = sandbox_status(p.corruption.sandbox)
    except StudyError as exc:
        return Check("bubblewrap sandbox", BLOCKER, str(exc), SANDBOX_FIX)
    if st["isolation"] == "bwrap":
        return Check("bubblewrap sandbox", OK, f"bwrap {st['bwrap_version'] or ''} runs generated code")
    return Check("bubblewrap sandbox", WARNING, st["note"], SANDBOX_FIX)


def preflight(params: Params, *, outputs: Path | None = None, timeout_s: float = 60.0) -> list[Check]:
    """Run every check for ``params`` and return the rows (never raises for a machine problem).

    Interpreters are probed in subprocesses (each at most ``timeout_s`` seconds); ``outputs`` is
    where run folders go (default ``outputs/``)."""
    p = params
    outputs = Path(outputs) if outputs else OUTPUTS
    q_probe = (probes.probe_interpreter(p.quantize.python or sys.executable,
                                        ["llmcompressor", "compressed-tensors", "torch"],
                                        torch=p.quantize.device.startswith("cuda"), timeout_s=timeout_s)
               if _quantizing(p) else None)
    s_probe = (probes.probe_interpreter(p.server.python, ["sglang", *probes.PINNED], torch=_serving(p),
                                        timeout_s=timeout_s)
               if p.server.python and not in_image(p) and (_serving(p) or p.sglang.source == "installed")
               else None)
    smi = probes.nvidia_smi() if (_serving(p) or p.quantize.device.startswith("cuda")) else None
    card = _hub_snapshot(p.checkpoint.card_checkpoint) if serving_card(p) and p.checkpoint.card_checkpoint else None
    if p.checkpoint.quantized_path and Path(p.checkpoint.quantized_path).is_dir():
        resident = probes.folder_bytes(p.checkpoint.quantized_path)
    elif card is not None:
        resident = probes.folder_bytes(card)
    else:
        resident = probes.checkpoint_bytes(p.checkpoint.shape)["nvfp4"]
    gpu_probe = s_probe if s_probe and "error" not in s_probe else q_probe
    rows = [Check("params", OK, f"profile {p.profile!r}")]
    rows += gpu_checks(p, smi, gpu_probe if gpu_probe and "error" not in gpu_probe else None, resident)
    rows += disk_checks(p, outputs)
    rows += quantizer_checks(p, q_probe)
    rows += sglang_checks(p, s_probe)
    rows.append(flashinfer_jit_check(p, s_probe if s_probe and "error" not in s_probe else None))
    rows += docker_checks(p)
    rows += [patch_check(p, s_probe), port_check(p)]
    rows += checkpoint_checks(p)
    rows.append(sandbox_check(p))
    return rows


def blockers(rows: list[Check]) -> list[Check]:
    return [r for r in rows if r.verdict == BLOCKER]


def table(rows: list[Check]):
    """The rows as a DataFrame (columns check, verdict, detail, fix) for notebook 00."""
    import pandas as pd

    return pd.DataFrame([{"check": r.name, "verdict": r.verdict, "detail": r.detail, "fix": r.fix} for r in rows])


def format_rows(rows: list[Check]) -> str:
    """A plain-text table: one line per check, the fix indented below it."""
    w = max(len(r.name) for r in rows)
    lines = []
    for r in rows:
        lines.append(f"{r.name:<{w}}  {r.verdict:<14}  {r.detail}")
        if r.fix:
            lines.append(f"{'':<{w}}  {'':<14}  fix: {r.fix}")
    n = len(blockers(rows))
    lines.append(f"\n{n} blocker(s)" + (": the run would fail; nothing was started" if n else ": ready to run"))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``nvfp4study preflight``: print the table (or JSON); exit 1 on any blocker, else 0."""
    ap = argparse.ArgumentParser(prog="nvfp4study preflight", description="Check the machine against the params "
                                 "before a run: GPU, disk, interpreters, packages, SGLang install, port, Hub, sandbox.",
                                 epilog="example: nvfp4study preflight --params params/ling3-flash.yaml")
    ap.add_argument("--params", default=None, help="params YAML (default params/default.yaml)")
    ap.add_argument("-p", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per interpreter probe")
    a = ap.parse_args(argv)
    rows = preflight(load_params(a.params, a.overrides), timeout_s=a.timeout)
    if a.json:
        print(json.dumps({"rows": [asdict(r) for r in rows], "blockers": len(blockers(rows))}, indent=1))
    else:
        print(format_rows(rows))
    return 1 if blockers(rows) else 0


def rows_as_dicts(rows: list[Check]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]
