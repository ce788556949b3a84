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
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.errors import StudyError

ARTIFACT = Path(__file__).parent / "artifact"
#: files a served copy holds (the corpus manifest and training logs stay in the artifact).
SERVED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                "generation_config.json")
#: sha256 of the committed ``artifact/SHA256SUMS``: the list itself is pinned here, so changing a
#: file and its line together is refused (rebuilding the artifact means updating this constant).
SUMS_SHA256 = "f338387db6e8f72a180df5597b81deeb4a2a34b2393d802ccc2cba7f9ee74e74"


class TrainedArtifactError(StudyError):
    """The trained stand-in's files are missing or differ from ``SHA256SUMS`` (each named)."""


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _listed(sums: Path) -> dict[str, str]:
    """``{name: sha256}`` of a ``sha256sum``-format file; only plain names inside the folder.

    Raises:
        TrainedArtifactError: a line that is not ``<64 hex>  <name>``, or a name with a path in it.
    """
    want: dict[str, str] = {}
    for n, line in enumerate(sums.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        m = re.fullmatch(r"([0-9a-f]{64}) [ *]([^/\\]+)", line.strip())
        if not m or m.group(2) in (".", ".."):
            raise TrainedArtifactError(f"{sums}:{n}: not '<sha256>  <file name in this folder>': {line[:80]!r}")
        want[m.group(2)] = m.group(1)
    return want


def verify(folder: Path = ARTIFACT, sums_sha256: str | None = SUMS_SHA256) -> dict[str, str]:
    """``{file: sha256}`` of every file ``folder/SHA256SUMS`` lists, after checking each.

    ``sums_sha256``: the sha256 ``SHA256SUMS`` itself must have (default: the committed artifact's,
    pinned in this module, so an edited file with an edited ``SHA256SUMS`` is refused too; None for
    a folder of one's own, e.g. a fresh ``train`` output, which is then only checked against its
    own list). Listed files must be regular files in ``folder`` (no path, no symbolic link).

    Raises:
        TrainedArtifactError: ``SHA256SUMS`` missing, empty, malformed or not the pinned one; a
            listed file missing, a link, or with another sha256; a served file not listed (each named).
    """
    sums = folder / "SHA256SUMS"
    if not sums.is_file() or sums.is_symlink():
        raise TrainedArtifactError(f"{sums} is missing: the trained stand-in cannot be checked")
    if sums_sha256 is not None and _sha(sums) != sums_sha256:
        raise TrainedArtifactError(f"{sums} is not the committed one (sha256 {_sha(sums)[:12]}..., pinned "
                                   f"{sums_sha256[:12]}... in nvfp4study.trained.artifact)")
    want = _listed(sums)
    if not want:
        raise TrainedArtifactError(f"{sums} lists no file")
    problems, got = [], {}
    for name, sha in want.items():
        f = folder / name
        if f.is_symlink() or (f.exists() and not f.is_file()):
            problems.append(f"{name} is not a regular file")
            continue
        if not f.is_file():
            problems.append(f"{name} missing")
            continue
        got[name] = _sha(f)
        if got[name] != sha:
            problems.append(f"{name}: sha256 {got[name][:12]}..., SHA256SUMS says {sha[:12]}...")
    missing_served = [f for f in SERVED_FILES if f not in want]
    if missing_served:
        problems.append(f"SHA256SUMS does not list {', '.join(missing_served)}")
    if problems:
        raise TrainedArtifactError(f"trained stand-in {folder.name}: " + "; ".join(problems))
    return got


def served_copy(dst: Path, folder: Path = ARTIFACT, sums_sha256: str | None = SUMS_SHA256) -> Path:
    """``dst`` holding the hash-checked :data:`SERVED_FILES` (made once: an existing ``dst`` whose
    served files all match the list is kept; any other is replaced). Written to ``dst.partial``
    and renamed; nothing is left half-written.

    Raises:
        TrainedArtifactError: as :func:`verify`; ``dst`` is a file.
    """
    sums = verify(folder, sums_sha256)
    if dst.exists() and not dst.is_dir():
        raise TrainedArtifactError(f"{dst} is a file, not a folder for the served copy")
    if all((dst / f).is_file() and not (dst / f).is_symlink() and _sha(dst / f) == sums[f] for f in SERVED_FILES):
        return dst
    tmp = dst.with_name(dst.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        for f in SERVED_FILES:
            shutil.copyfile(folder / f, tmp / f)
        if any(_sha(tmp / f) != sums[f] for f in SERVED_FILES):  # changed while copying
            raise TrainedArtifactError(f"{folder}: a served file changed while it was copied")
        shutil.rmtree(dst, ignore_errors=True)
        tmp.rename(dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
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
    src_sha = _sha(bf16 / "model.safetensors")
    rec = dst / "nvfp4study_quantize.json"
    try:
        made = json.loads(rec.read_text())
        fresh = made["source_sha256"] == src_sha and made["model_sha256"] == _sha(dst / "model.safetensors")
    except (OSError, ValueError, KeyError, TypeError):
        fresh = False
    if not fresh:  # made from these trained weights, and untouched since: else made again
        report = nvfp4_copy(bf16, dst, qparams)
        rec.write_text(json.dumps({"quantized": report["quantized"], "counts": report["report"].get("counts"),
                                   "source_sha256": src_sha,
                                   "model_sha256": _sha(dst / "model.safetensors")}, indent=2) + "\n")
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
