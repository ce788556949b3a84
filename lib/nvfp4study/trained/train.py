"""Train the stand-in: one command builds the corpus and tokenizer and trains the model.

    python -m nvfp4study.trained.train --out models/trained-standin

runs both steps here: ``prepare`` (CPU: the corpus of :mod:`.corpus`, a byte-level BPE tokenizer
trained on it with ``tokenizers``, the ids packed into ``corpus.npz``, ``config.json``) and ``fit``
(the :class:`~.reference.BailingReference` trained with Ling's clamp; a CUDA GPU when there is one,
else the CPU, slowly). ``--step prepare`` / ``--step fit`` run one of them: the committed model
was prepared on the project's CPU machine and fitted on a lent GPU, which has no network and
none of the corpus's packages (the packed ids travel; their sha256 is checked).

Recipe (``docs/trained-standin.md``; after the clamp-trained reference run): AdamW (0.9, 0.95),
weight decay 0.1 on matrices, lr 2e-3, 200 warm-up steps, cosine decay to 10 %, batch 48 x 512
tokens, bf16 autocast on CUDA, gradient clip 1.0, NEXTN (MTP) loss weight 0.3 (DeepSeek-V3's
first-phase weight, arXiv 2412.19437 section 4.2); aux-loss-free balancing: each MoE layer's
``expert_bias`` moves by ``BIAS_RATE * sign(mean load - load)`` after every step (DeepSeek-V3
section 2.1.2, the selection-only bias Ling's router carries).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

#: vocabulary of the trained stand-in (BPE on the corpus; specials at the top).
VOCAB_SIZE = 1024
SEQ_LEN = 512
BATCH = 48
STEPS = 3000
LR, WARMUP, FINAL_LR_SHARE = 2e-3, 200, 0.1
MTP_WEIGHT = 0.3
#: steps timed before ``budget_s`` fixes the total (well inside the warm-up).
PROBE_STEPS = 30
BIAS_RATE = 1e-3
#: routed_scaling_factor of the trained model: SGLang 0.5.23's CPU engine drops the factor on the
#: native MoE path (stage 04's probe), so the model is trained with 1.0, where dropping changes
#: nothing; Ling's 2.5 is what the layout writes for the random stand-in.
ROUTED_SCALING_FACTOR = 1.0
#: Ling's clamp limits are multiplied by this: at Ling's own limits the toy's gates exceed 4 on
#: 0.02-0.03 % of routed values and dropping the clamp changes held-out loss by 0.01 %
#: (``artifact/train_log_ling_limits.json``); halved, the clamp binds on 1.3-1.7 % (``train_log.json``).
LIMIT_SCALE = 0.5
ARTIFACT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "generation_config.json", "corpus_manifest.json", "train_log.json", "train_log_ling_limits.json")


class TrainError(ValueError):
    """A training input is unusable (what and why are named); nothing is written."""


def standin_config(vocab_size: int = VOCAB_SIZE, limit_scale: float = LIMIT_SCALE) -> dict[str, Any]:
    """``config.json`` of the trained stand-in: the served all-MLA shape of
    ``params/default.yaml`` (:func:`nvfp4study.checkpoint.served.served_shape`: Ling's clamp lists
    on its last layers, limits 4 routed, 5 and 7 shared) with ``vocab_size``,
    :data:`ROUTED_SCALING_FACTOR` and every clamp limit times ``limit_scale``; its ``_nvfp4study``
    key says "trained"."""
    from ..checkpoint.layout import config_dict
    from ..checkpoint.served import served_shape

    base = served_shape()
    shape = base.model_copy(update={
        "vocab_size": vocab_size,
        "expert_swiglu_limits": {k: v * limit_scale for k, v in base.expert_swiglu_limits.items()},
        "share_expert_swiglu_limits": {k: v * limit_scale for k, v in base.share_expert_swiglu_limits.items()}})
    cfg = config_dict(shape)
    cfg["routed_scaling_factor"] = ROUTED_SCALING_FACTOR
    cfg["_nvfp4study"] = {"weights": "trained", "shape": shape.model_dump(mode="json"),
                          "note": "trained by nvfp4study (python -m nvfp4study.trained.train); a toy-scale "
                                  "stand-in for mechanism checks, not Ling-3.0-flash"}
    return cfg


def prepare(out: Path, limit_scale: float = LIMIT_SCALE) -> dict[str, Any]:
    """Corpus, tokenizer, packed ids and config into ``out``, which must not exist or be empty;
    written into ``out.partial`` and renamed. Returns the packed corpus's summary (files, bytes,
    ids, their sha256).

    Raises:
        TrainError: ``out`` is a file or a folder that holds files; ``limit_scale`` is not a
            finite number above 0.
    """
    import shutil

    if not (isinstance(limit_scale, (int, float)) and math.isfinite(limit_scale) and limit_scale > 0):
        raise TrainError(f"--limit-scale must be a finite number above 0 (0 would mean no clamp), not {limit_scale!r}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TrainError(f"{out} exists and is not an empty folder: prepare writes a new artifact folder")
    final, out = out, out.with_name(out.name + ".partial")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    summary = _prepare_into(out, limit_scale)
    if final.exists():
        final.rmdir()
    out.rename(final)
    return summary


def _prepare_into(out: Path, limit_scale: float) -> dict[str, Any]:
    import numpy as np

    from ..checkpoint.tokenizer import EOS, build_tokenizer, tokenizer_config
    from .corpus import collect, ids_sha256, manifest

    train, held = collect()
    tok = build_tokenizer(VOCAB_SIZE, (f.text for f in train))
    eos = tok.token_to_id(EOS)
    packed: dict[str, Any] = {}
    for split, files in (("train", train), ("held_out", held)):
        enc = tok.encode_batch([f.text for f in files])
        packed[split] = np.array([i for e in enc for i in (*e.ids, eos)], dtype=np.uint16)
    packed["held_out_bytes"] = np.array(sum(len(f.text.encode()) for f in held), dtype=np.int64)
    np.savez_compressed(out / "corpus.npz", **packed)
    (out / "tokenizer.json").write_text(tok.to_str(pretty=False) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(VOCAB_SIZE), indent=2) + "\n")
    cfg = standin_config(limit_scale=limit_scale)
    summary = {"files": {"train": len(train), "held_out": len(held)},
               "bytes": {"train": sum(len(f.text.encode()) for f in train), "held_out": int(packed["held_out_bytes"])},
               "ids": {s: int(packed[s].size) for s in ("train", "held_out")},
               "ids_sha256": {s: ids_sha256(packed[s]) for s in ("train", "held_out")}}
    cfg["_nvfp4study"]["corpus"] = summary
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    gen = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    (out / "corpus_manifest.json").write_text(json.dumps(manifest(train, held)) + "\n")
    return summary


def _lr(step: int, steps: int) -> float:
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    t = (step - WARMUP) / max(1, steps - WARMUP)
    return LR * (FINAL_LR_SHARE + (1 - FINAL_LR_SHARE) * 0.5 * (1 + math.cos(math.pi * t)))


def _batch(ids: Any, gen: Any, batch: int, seq: int, device: str) -> Any:
    import torch

    starts = torch.randint(0, ids.numel() - seq - 1, (batch,), generator=gen)
    return torch.stack([ids[s: s + seq + 1] for s in starts.tolist()]).to(device)


def _losses(model: Any, win: Any, forms: Any = None) -> tuple[Any, Any]:
    import torch.nn.functional as F

    from .reference import TRAINED

    x = win[:, :-1]
    logits, mtp = model(x, forms or TRAINED)
    V = logits.shape[-1]
    main = F.cross_entropy(logits.reshape(-1, V), win[:, 1:].reshape(-1))
    return main, F.cross_entropy(mtp.reshape(-1, V), win[:, 2:].reshape(-1))


def _balance(model: Any) -> None:
    import torch

    from .reference import MoE

    for m in model.modules():
        if isinstance(m, MoE) and m.last_load is not None:
            load = m.last_load.float()
            m.expert_bias += BIAS_RATE * torch.sign(load.mean() - load)


def _optimizer(model: Any) -> Any:
    import torch

    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             lr=LR, betas=(0.9, 0.95), fused=False)


def fit(out: Path, *, steps: int = STEPS, device: str | None = None, seed: int = 0,
        batch: int = BATCH, seq: int = SEQ_LEN, log_every: int = 50,
        budget_s: float | None = None) -> dict[str, Any]:
    """Train on ``out/corpus.npz`` with ``out/config.json``; write ``model.safetensors``,
    ``train_log.json`` and ``SHA256SUMS`` into ``out``. Returns the log.

    ``budget_s``: time the first :data:`PROBE_STEPS` steps (inside the warm-up, so the schedule
    does not depend on the total yet) and lower ``steps`` to what fits in ``budget_s`` seconds,
    never below :data:`PROBE_STEPS`; the log records the steps run, and ``--steps N`` repeats them.

    Raises:
        TrainError: ``steps`` or ``batch`` below 1, no ``config.json`` in ``out`` (run ``prepare``
            first), or fewer held-out ids than one evaluation window.
        nvfp4study.trained.corpus.CorpusError: the packed ids do not match the config's hashes.
    """
    import torch

    from .corpus import load_packed
    from .reference import BailingReference

    if steps < 1 or batch < 1 or seq < 2:
        raise TrainError(f"steps, batch and seq must be at least 1, 1 and 2 (got {steps}, {batch}, {seq})")
    if not (out / "config.json").is_file():
        raise TrainError(f"{out / 'config.json'} missing: run `--step prepare` into {out} first")
    cfg = json.loads((out / "config.json").read_text())
    data = load_packed(out / "corpus.npz", cfg["_nvfp4study"]["corpus"]["ids_sha256"])
    if data["held_out"].size < seq + 1 or data["train"].size < seq + 2:
        raise TrainError(f"the packed corpus has {data['train'].size} train / {data['held_out'].size} held-out ids: "
                         f"fewer than one window of {seq + 1}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(seed)
    train_ids = torch.from_numpy(data["train"].astype("int64"))
    model = BailingReference(cfg)
    model.init_weights(seed)
    model.to(device)
    opt = _optimizer(model)
    gen = torch.Generator().manual_seed(seed)
    curve, t0, t_probe = [], time.time(), time.time()
    step = 0
    while step < steps:
        if step == PROBE_STEPS // 3:
            t_probe = time.time()
        if budget_s and step == PROBE_STEPS:
            per_step = (time.time() - t_probe) / (PROBE_STEPS - PROBE_STEPS // 3)
            steps = min(steps, PROBE_STEPS + max(0, int((budget_s - (time.time() - t0)) / per_step)))
        for g in opt.param_groups:
            g["lr"] = _lr(step, steps)
        win = _batch(train_ids, gen, batch, seq, device)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
            main, mtp = _losses(model, win)
            loss = main + MTP_WEIGHT * mtp
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            _balance(model)
        if step % log_every == 0 or step == steps - 1:
            curve.append({"step": step, "loss": round(main.item(), 4), "mtp_loss": round(mtp.item(), 4),
                          "lr": _lr(step, steps), "seconds": round(time.time() - t0, 1)})
            print(json.dumps(curve[-1]), flush=True)
        step += 1
    train_s = time.time() - t0
    model.eval()
    log = {"steps": steps, "batch": batch, "seq_len": seq, "seed": seed, "device": _device_name(device),
           "train_seconds": round(train_s, 1), "curve": curve,
           "held_out": evaluate(model, data, device, seq),
           "versions": {"python": platform.python_version(), "torch": torch.__version__},
           "recipe": {"lr": LR, "warmup": WARMUP, "final_lr_share": FINAL_LR_SHARE, "mtp_weight": MTP_WEIGHT,
                      "bias_rate": BIAS_RATE, "betas": [0.9, 0.95], "weight_decay": 0.1, "clip": 1.0}}
    write_weights(out, model, log)
    return log


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(0)
        return f"{p.name} (SM{p.major}{p.minor})"
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def evaluate(model: Any, data: dict[str, Any], device: str, seq: int = SEQ_LEN,
             max_windows: int = 64) -> dict[str, Any]:
    """Held-out loss (nats per token), bits per byte and MTP loss under each routed clamp form,
    over up to ``max_windows`` consecutive ``seq``-token windows of the held-out ids (float32)."""
    import torch

    from .reference import Forms

    ids = torch.from_numpy(data["held_out"].astype("int64"))
    n = min(max_windows, (ids.numel() - 1) // (seq + 1))
    wins = ids[: n * (seq + 1)].view(n, seq + 1).to(device)
    bytes_per_token = float(data["held_out_bytes"]) / ids.numel()
    from .reference import MoE

    for m in model.modules():  # count where the clamp binds over this evaluation only
        if isinstance(m, MoE):
            m.bind_count, m.bind_total = 0, 0
    out: dict[str, Any] = {"windows": n, "tokens": n * seq, "bytes_per_token": round(bytes_per_token, 4)}
    for form in ("exact", "approx", "dropped"):
        tot, mtot = 0.0, 0.0
        with torch.no_grad():
            for w in wins.split(8):
                main, mtp = _losses(model, w, Forms(routed_clamp=form))
                tot += main.item() * w.shape[0]
                mtot += mtp.item() * w.shape[0]
        nats = tot / max(1, n)
        if form == "exact":
            out["routed_clamp_binds"] = _binding_share(model)
        out[form] = {"loss": round(nats, 5), "bits_per_byte": round(nats / math.log(2) / bytes_per_token, 5),
                     "mtp_loss": round(mtot / max(1, n), 5)}
    return out


def _binding_share(model: Any) -> dict[str, float]:
    """Per clamped MoE layer (``"layer N"``): the share of selected (token, expert) gate values
    whose ``silu`` exceeds the routed limit, over the no-gradient forward passes since
    :func:`evaluate` reset the counts (its exact-form pass)."""
    from .reference import MoE

    return {f"layer {m.layer}": round(m.bind_count / m.bind_total, 6)
            for m in model.modules() if isinstance(m, MoE) and m.limit and m.bind_total}


def write_weights(out: Path, model: Any, log: dict[str, Any]) -> None:
    """``model.safetensors`` (checkpoint names, BF16), ``train_log.json``, and ``SHA256SUMS``
    over :data:`ARTIFACT_FILES`; written to temporary names and renamed."""
    from safetensors.torch import save_file

    from .reference import to_checkpoint

    tmp = out / "model.safetensors.tmp"
    save_file(to_checkpoint(model.cpu()), str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out / "model.safetensors")
    (out / "train_log.json").write_text(json.dumps(log, indent=2) + "\n")
    write_sums(out)


def write_sums(out: Path) -> None:
    """``SHA256SUMS`` (``sha256sum`` format) over the artifact files present in ``out``."""
    lines = [f"{hashlib.sha256((out / f).read_bytes()).hexdigest()}  {f}"
             for f in ARTIFACT_FILES if (out / f).is_file()]
    (out / "SHA256SUMS").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    """CLI (module docstring)."""
    ap = argparse.ArgumentParser(description="train the nvfp4study stand-in (prepare + fit)")
    ap.add_argument("--out", type=Path, required=True, help="artifact folder")
    ap.add_argument("--step", choices=("all", "prepare", "fit"), default="all")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--batch", type=int, default=BATCH)
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit-scale", type=float, default=LIMIT_SCALE,
                    help=f"multiply Ling's clamp limits (prepare; default {LIMIT_SCALE}, the committed model's)")
    ap.add_argument("--budget-s", type=float, default=None, help="lower --steps to fit this many seconds")
    ap.add_argument("--keep-corpus", action="store_true", help="keep corpus.npz after fitting")
    args = ap.parse_args(argv)
    try:
        return _run(args)
    except (TrainError, OSError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from .corpus import CorpusError

    if args.steps < 1:
        raise TrainError(f"--steps must be at least 1, not {args.steps}")
    if args.step in ("all", "prepare"):
        print(json.dumps(prepare(args.out, args.limit_scale)), flush=True)
    if args.step in ("all", "fit"):
        try:
            log = fit(args.out, steps=args.steps, device=args.device, seed=args.seed, batch=args.batch,
                      budget_s=args.budget_s)
        except CorpusError as exc:
            raise TrainError(str(exc)) from None
        print(json.dumps(log["held_out"]), flush=True)
        if not args.keep_corpus and args.step == "all":
            (args.out / "corpus.npz").unlink()
    shutil.rmtree(args.out / "__pycache__", ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
