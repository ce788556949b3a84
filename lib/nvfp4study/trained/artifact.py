"""The committed trained stand-in (``trained/artifact/``): its hash check, its served copies
(BF16 as trained; NVFP4-rounded experts from the study's own ``model_free_ptq`` output), and its
description for the report.

The artifact was made by ``python -m nvfp4study.trained.train`` (``prepare`` on the project's CPU
machine, ``fit`` on a lent NVIDIA H100; ``train_log.json`` records device, steps, time, seed,
versions, the loss curve and held-out bits per byte). ``SHA256SUMS`` lists every file; the study
serves nothing whose hash differs.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.errors import StudyError

ARTIFACT = Path(__file__).parent / "artifact"
#: files a served copy holds (the corpus manifest and training logs stay in the artifact).
SERVED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                "generation_config.json")


class TrainedArtifactError(StudyError):
    """The trained stand-in's files are missing or differ from ``SHA256SUMS`` (each named)."""


def verify(folder: Path = ARTIFACT) -> dict[str, str]:
    """``{file: sha256}`` of every file ``folder/SHA256SUMS`` lists, after checking each.

    Raises:
        TrainedArtifactError: ``SHA256SUMS`` is missing or empty, a listed file is missing, or
            its sha256 differs (every problem named).
    """
    sums = folder / "SHA256SUMS"
    if not sums.is_file():
        raise TrainedArtifactError(f"{sums} is missing: the trained stand-in cannot be checked")
    want: dict[str, str] = {}
    for line in sums.read_text().splitlines():
        if line.strip():
            sha, _, name = line.partition("  ")
            want[name.strip()] = sha.strip()
    if not want:
        raise TrainedArtifactError(f"{sums} lists no file")
    problems, got = [], {}
    for name, sha in want.items():
        f = folder / name
        if not f.is_file():
            problems.append(f"{name} missing")
            continue
        got[name] = hashlib.sha256(f.read_bytes()).hexdigest()
        if got[name] != sha:
            problems.append(f"{name}: sha256 {got[name][:12]}..., SHA256SUMS says {sha[:12]}...")
    missing_served = [f for f in SERVED_FILES if f not in want]
    if missing_served:
        problems.append(f"SHA256SUMS does not list {', '.join(missing_served)}")
    if problems:
        raise TrainedArtifactError(f"trained stand-in {folder.name}: " + "; ".join(problems))
    return got


def served_copy(dst: Path, folder: Path = ARTIFACT) -> Path:
    """``dst`` holding the hash-checked :data:`SERVED_FILES` (made once: an existing ``dst`` whose
    ``model.safetensors`` matches is kept). Written to ``dst.partial`` and renamed.

    Raises:
        TrainedArtifactError: as :func:`verify`.
    """
    sums = verify(folder)
    if (dst / "model.safetensors").is_file() and \
            hashlib.sha256((dst / "model.safetensors").read_bytes()).hexdigest() == sums["model.safetensors"]:
        return dst
    tmp = dst.with_name(dst.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in SERVED_FILES:
        shutil.copy2(folder / f, tmp / f)
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    return dst


def nvfp4_copy(bf16: Path, dst: Path, qparams: Any) -> dict[str, Any]:
    """A BF16 copy of ``bf16`` whose routed experts are the study's NVFP4 round trip: quantized by
    :func:`nvfp4study.checkpoint.quantize.quantize_checkpoint` (the card's recipe, real
    ``model_free_ptq``) into ``dst.nvfp4``, then decoded by compressed-tensors' own NVFP4 codec
    (:func:`nvfp4study.checkpoint.roundtrip.codec_dequantize`) and written back as BF16: SGLang's
    CPU engine has no FP4 MoE kernel, so the served experts carry NVFP4's weight rounding (e2m1
    values, FP8 block scales of 16, one global scale) while activations stay float32 (no W4A4
    activation rounding). Returns ``{"quantized": n tensors, "report": quantize's report}``.

    Raises:
        the errors of ``quantize_checkpoint``; TrainedArtifactError: no expert was quantized.
    """
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from ..checkpoint.quantize import quantize_checkpoint
    from ..checkpoint.roundtrip import codec_dequantize

    qdir = dst.with_name(dst.name + ".nvfp4")
    report = quantize_checkpoint(bf16, qdir, qparams, overwrite=True)
    packed: dict[str, dict[str, Any]] = {}
    for shard in sorted(qdir.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as fh:
            for name in fh.keys():
                for suffix in ("weight_packed", "weight_scale", "weight_global_scale"):
                    if name.endswith("." + suffix):
                        packed.setdefault(name[: -len(suffix) - 1], {})[suffix] = fh.get_tensor(name)
    if not packed:
        raise TrainedArtifactError(f"{qdir}: model_free_ptq quantized no tensor")
    with safe_open(str(bf16 / "model.safetensors"), "pt") as fh:
        tensors = {n: fh.get_tensor(n) for n in fh.keys()}
    for module, state in packed.items():
        tensors[module + ".weight"] = codec_dequantize(state).to(torch.bfloat16).contiguous()
    tmp = dst.with_name(dst.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(bf16, tmp)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((tmp / "config.json").read_text())
    cfg["_nvfp4study"]["weights"] = "trained, routed experts NVFP4-rounded (model_free_ptq, decoded to BF16)"
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    shutil.rmtree(qdir, ignore_errors=True)
    return {"quantized": len(packed), "report": report}


#: weights -> run work folder name of the served copy.
FOLDERS = {"bf16": "served-trained-bf16", "nvfp4": "served-trained-nvfp4"}


def served_folder(work: Callable[[str], Path], weights: str, qparams: Any) -> Path:
    """The served copy for ``weights`` ("bf16": :func:`served_copy`; "nvfp4": :func:`nvfp4_copy`
    of it, with its quantize report in ``nvfp4study_quantize.json``), made once in the folder
    ``work(name)`` gives.

    Raises:
        TrainedArtifactError: an unknown ``weights`` or a hash that differs.
    """
    if weights not in FOLDERS:
        raise TrainedArtifactError(f"no trained weights {weights!r} (known: {', '.join(FOLDERS)})")
    bf16 = served_copy(work(FOLDERS["bf16"]))
    if weights == "bf16":
        return bf16
    dst = work(FOLDERS["nvfp4"])
    if not (dst / "model.safetensors").is_file():
        report = nvfp4_copy(bf16, dst, qparams)
        (dst / "nvfp4study_quantize.json").write_text(json.dumps(
            {"quantized": report["quantized"], "counts": report["report"].get("counts")}, indent=2) + "\n")
    return dst


def describe(folder: Path = ARTIFACT) -> dict[str, Any]:
    """Size, parameters, training facts and held-out numbers for tables and the report."""
    cfg = json.loads((folder / "config.json").read_text())
    log = json.loads((folder / "train_log.json").read_text())
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as fh:
        n = sum(_prod(fh.get_slice(k).get_shape()) for k in fh.keys())
    return {"parameters": n, "megabytes": round((folder / "model.safetensors").stat().st_size / 1e6, 1),
            "layers": cfg["num_hidden_layers"], "hidden_size": cfg["hidden_size"],
            "experts": cfg["num_experts"], "top_k": cfg["num_experts_per_tok"], "vocab_size": cfg["vocab_size"],
            "routed_limits": cfg["expert_swiglu_limit_list"], "shared_limits": cfg["share_expert_swiglu_limit_list"],
            "routed_scaling_factor": cfg["routed_scaling_factor"], "device": log["device"],
            "steps": log["steps"], "train_seconds": log["train_seconds"], "held_out": log["held_out"],
            "corpus": cfg["_nvfp4study"].get("corpus", {})}


def _prod(shape: Any) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
