"""Write a checkpoint in the Ling-3.0-flash layout (:mod:`.layout`) with RANDOM weights.

``write_checkpoint(..., header_only=True)`` writes valid safetensors files whose large data
regions are never written (sparse files): the full-size layout (~63k BF16 tensors, or ~245k in
the NVFP4 layout) costs seconds and almost no disk, for the audit's speed benchmark. The NVFP4
layout comes from the card's recipe (:func:`.recipe.nvfp4_layout`).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.errors import LayoutError, OutputExists
from ..core.params import LingShape
from . import recipe
from .layout import (
    EXPERT_RE,
    RANDOM_WEIGHTS_NOTE,
    SMALL_TENSOR_BYTES,
    Spec,
    config_dict,
    iter_header_specs,
    spec_nbytes,
    tensor_specs,
)
from .tokenizer import token_ids, write_tokenizer


# --- writing -------------------------------------------------------------------------------
def split_shards(specs: list[Spec], shards: int) -> list[list[Spec]]:
    """Cut ``specs`` (in order) into ``shards`` contiguous groups of about equal bytes.

    Raises:
        LayoutError: ``shards`` < 1 or more shards than tensors.
    """
    if shards < 1 or shards > len(specs):
        raise LayoutError(f"shards must be in 1..{len(specs)} (tensors), got {shards}")
    cum = list(itertools.accumulate(spec_nbytes(s) for s in specs))
    bounds = [0]
    for g in range(1, shards):
        b = bisect.bisect_left(cum, cum[-1] * g / shards) + 1  # just after the tensor crossing g/shards
        bounds.append(min(max(b, bounds[-1] + 1), len(specs) - (shards - g)))
    bounds.append(len(specs))
    return [specs[bounds[i]:bounds[i + 1]] for i in range(shards)]


def shard_name(i: int, n: int) -> str:
    """Hub-style shard file name, ``model-00001-of-00004.safetensors`` (1-based)."""
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def _random_tensor(spec: Spec, gen: Any) -> Any:
    """Deterministic random values: weights N(0, 0.02) (BF16), norms 1, A_log log U(1,16),
    dt_bias and expert_bias 0 (F32)."""
    import torch

    name, shp, dtype = spec
    tdt = torch.bfloat16 if dtype == "BF16" else torch.float32
    if name.endswith("A_log"):
        return torch.log(torch.rand(shp, generator=gen) * 15 + 1).to(tdt)
    if name.endswith(("dt_bias", "expert_bias")):
        return torch.zeros(shp, dtype=tdt)
    if len(shp) == 1:  # norm weights
        return torch.ones(shp, dtype=tdt)
    return (torch.randn(shp, generator=gen) * 0.02).to(tdt)


def write_safetensors_header_only(path: Path, specs: list[Spec], small: dict[str, bytes] | None = None,
                                  metadata: dict[str, str] | None = None) -> int:
    """Write a valid safetensors file whose data region is left unwritten (a sparse file).

    Format (safetensors README): 8-byte little-endian header length N, N bytes of JSON
    ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`` padded
    with spaces to a multiple of 8, then the data; offsets are relative to the data start,
    contiguous and in file order. ``small`` gives real bytes for some tensors (written in place).

    Returns the file size in bytes.
    """
    header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    places: list[tuple[int, bytes]] = []
    for name, shp, dtype in specs:
        n = spec_nbytes((name, shp, dtype))
        header[name] = {"dtype": dtype, "shape": list(shp), "data_offsets": [offset, offset + n]}
        if small and name in small:
            places.append((offset, small[name]))
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    start = 8 + len(blob)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(blob)))
        fh.write(blob)
        for off, data in places:
            fh.seek(start + off)
            fh.write(data)
        fh.truncate(start + offset)
    return start + offset


def _small_bytes(spec: Spec, gen: Any) -> bytes:
    import torch

    t = _random_tensor(spec, gen) if spec[2] in ("BF16", "F32") else None
    if t is None:
        raise LayoutError(f"no small-value rule for {spec}")
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def write_checkpoint(
    shape: LingShape,
    out_dir: str | Path,
    *,
    shards: int = 4,
    seed: int = 0,
    header_only: bool = False,
    layout: str = "bf16",
    progress: bool = False,
    edit: Callable[[str, Any], Any] | None = None,
    config_extra: dict[str, Any] | None = None,
) -> Path:
    """Write a Ling-layout checkpoint folder like a hub repo (random weights).

    Args:
        shape: sizes (:class:`LingShape`; defaults = the real model).
        out_dir: the folder to create; must not exist. Written in a temp folder beside it and
            renamed at the end, so a failure leaves nothing.
        shards: number of ``model-0000i-of-0000n.safetensors`` files (about equal bytes).
        seed: the values depend only on (shape, seed): same seed, same bytes.
        header_only: write headers only, data regions sparse (unwritten, read back as zeros),
            except tensors of at most :data:`SMALL_TENSOR_BYTES` (scales, biases), which get
            their values.
        layout: ``"bf16"`` (the source checkpoint) or ``"nvfp4"`` (what :mod:`nvfp4study.checkpoint.quantize`
            writes with the card's ignore list and the serving rewrite; header_only only).
        progress: print one line per shard to stderr.
        edit: ``edit(name, tensor) -> tensor`` replaces a tensor after it is drawn (same shape and
            dtype; the random stream is drawn as without it, so the other tensors keep their
            values); real data only. :mod:`.served` uses it for its draft constructions.
        config_extra: keys merged into ``config.json``'s ``_nvfp4study`` block.

    Returns:
        ``out_dir`` as a Path. The folder holds ``config.json``, ``generation_config.json`` (the
        token ids), the tokenizer (:mod:`.tokenizer`: ``tokenizer.json``, ``tokenizer_config.json``),
        the shards, ``model.safetensors.index.json`` and a README saying the weights are random.

    Raises:
        OutputExists: ``out_dir`` exists.
        LayoutError: invalid shape (ShapeInvalid), shard count or layout, an ``edit`` with
            ``header_only`` or one that changes a tensor's shape or dtype.
    """
    out = Path(out_dir)
    if out.exists() or out.is_symlink():
        raise OutputExists(f"output folder exists: {out} (choose a new folder; nothing was written)")
    if layout not in ("bf16", "nvfp4"):
        raise LayoutError(f"layout must be 'bf16' or 'nvfp4', got {layout!r}")
    if layout == "nvfp4" and not header_only:
        raise LayoutError("layout 'nvfp4' is header-only (real NVFP4 files come from `nvfp4study quantize`)")
    if edit is not None and header_only:
        raise LayoutError("edit needs real data (header_only writes no values)")
    specs = tensor_specs(shape)
    config = config_dict(shape, seed=seed)
    if config_extra:
        config["_nvfp4study"].update(config_extra)
    if layout == "nvfp4":
        specs, config = recipe.nvfp4_layout(shape, specs, config)
    groups = split_shards(specs, shards)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        import torch
        from safetensors.torch import save_file

        gen = torch.Generator().manual_seed(seed)
        weight_map: dict[str, str] = {}
        total = 0
        for gi, group in enumerate(groups):
            fname = shard_name(gi, len(groups))
            t0 = time.monotonic()
            if header_only:
                small = {}
                for spec in group:
                    if spec_nbytes(spec) <= SMALL_TENSOR_BYTES:
                        small[spec[0]] = (_nvfp4_small_bytes(spec, seed) if layout == "nvfp4"
                                          else _small_bytes(spec, gen))
                write_safetensors_header_only(tmp / fname, group, small)
            else:
                tensors = {spec[0]: _random_tensor(spec, gen) for spec in group}
                if edit is not None:
                    tensors = {n: _edited(n, t, edit) for n, t in tensors.items()}
                save_file(tensors, str(tmp / fname), metadata={"format": "pt"})
                del tensors
            for spec in group:
                weight_map[spec[0]] = fname
                total += spec_nbytes(spec)
            if progress and ((gi + 1) % max(1, len(groups) // 8) == 0 or gi + 1 == len(groups)):
                print(f"make-checkpoint: {fname}: {len(group)} tensors in {time.monotonic() - t0:.2f} s",
                      file=sys.stderr)
        index = {"metadata": {"total_size": total, "nvfp4study": RANDOM_WEIGHTS_NOTE},
                 "weight_map": dict(sorted(weight_map.items()))}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        (tmp / "generation_config.json").write_text(json.dumps(
            {**token_ids(shape.vocab_size), "_from_model_config": False}, indent=2))
        write_tokenizer(tmp, shape.vocab_size)
        (tmp / "README.md").write_text(
            f"# {RANDOM_WEIGHTS_NOTE}\n\nLayout: {layout}{' (header-only, sparse data)' if header_only else ''}; "
            f"seed {seed}; {len(specs)} tensors in {len(groups)} shards.\n")
        os.chmod(tmp, 0o755)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _edited(name: str, t: Any, edit: Callable[[str, Any], Any]) -> Any:
    new = edit(name, t)
    if tuple(new.shape) != tuple(t.shape) or new.dtype != t.dtype:
        raise LayoutError(f"edit changed {name}: {tuple(t.shape)} {t.dtype} -> {tuple(new.shape)} {new.dtype}")
    return new.contiguous()


def _nvfp4_small_bytes(spec: Spec, seed: int) -> bytes:
    """Values of the small tensors of a header-only NVFP4 layout: input_global_scale 1.0;
    weight_global_scale 2688 / amax with amax drawn per (layer, expert) in [0.05, 0.2]
    (gate and up share it, as the default quantizer writes); other small tensors zeros."""
    import numpy as np

    name, shp, dtype = spec
    if name.endswith("input_global_scale"):
        return np.ones(shp, dtype=np.float32).tobytes()
    if name.endswith("weight_global_scale"):
        m = EXPERT_RE.match(name)
        key = (int(m.group(1)), int(m.group(2)), m.group(3) == "down") if m else (0, 0, False)
        rng = np.random.default_rng([seed, *map(int, key)])
        amax = rng.uniform(0.05, 0.2)
        return np.full(shp, 2688.0 / amax, dtype=np.float32).tobytes()
    return bytes(spec_nbytes(spec))


# --- CLI -----------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    """``nvfp4study make-checkpoint OUT [--params FILE] [--header-only] [--full-size] ...``"""
    ap = argparse.ArgumentParser(
        prog="nvfp4study make-checkpoint",
        description="Write a BF16 checkpoint in the Ling-3.0-flash layout with RANDOM weights.",
        epilog="example: nvfp4study make-checkpoint /tmp/ling-full --full-size --header-only",
    )
    ap.add_argument("out", help="folder to create (must not exist)")
    ap.add_argument("--params", help="params YAML whose checkpoint.shape/shards/seed are used "
                    "(default: params/default.yaml)")
    ap.add_argument("--full-size", action="store_true", help="the real Ling-3.0-flash sizes")
    ap.add_argument("--header-only", action="store_true", help="headers only, sparse data regions")
    ap.add_argument("--layout", choices=["bf16", "nvfp4"], default="bf16",
                    help="nvfp4: the quantized + serving layout (header-only)")
    ap.add_argument("--shards", type=int, help="number of shards (default: from params)")
    ap.add_argument("--seed", type=int, help="random seed (default: from params)")
    args = ap.parse_args(argv)
    from ..core.params import load_params

    cp = load_params(args.params).checkpoint
    shape = LingShape() if args.full_size else cp.shape
    shards = args.shards or (max(cp.shards, 64) if args.full_size else cp.shards)
    seed = cp.seed if args.seed is None else args.seed
    t0 = time.monotonic()
    out = write_checkpoint(shape, args.out, shards=shards, seed=seed, header_only=args.header_only,
                           layout=args.layout, progress=True)
    n = sum(1 for _ in iter_header_specs(out))
    print(f"wrote {out}: {n} tensors, {shards} shards, {time.monotonic() - t0:.1f} s "
          f"({'header-only' if args.header_only else 'random BF16 data'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
