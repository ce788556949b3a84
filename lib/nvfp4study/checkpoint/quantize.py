"""BF16 -> NVFP4 with llmcompressor's real ``model_free_ptq``, then the model card's serving rewrite.

Recipe (the model card's "Provenance" section, checked against llmcompressor 0.13.0's
``entrypoints/model_free``):

1. ``model_free_ptq(src, tmp, scheme="NVFP4A16", ignore=CARD_IGNORE)``. ``NVFP4`` (W4A4) is
   refused by model_free_ptq ("cannot calibrate activations"), hence A16 + a config edit.
2. Fused maps: emptied, or one gate/up rule in both tables (:mod:`.ptq` says why).
3. Serving rewrite (the card's layout): ``input_global_scale`` = 1.0 (float32 [1]) beside every
   expert ``weight_global_scale``, and the config group's ``input_activations`` set to the
   compressed-tensors NVFP4 preset's block (``dynamic: "local"``) so SGLang picks its W4A4 MoE
   scheme. The ignore list keeps the MTP layer first.

Everything is written to a temporary folder beside the destination and renamed at the end; the
source is only read (its file sizes and mtimes are checked before and after).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ..core.errors import OutputExists, OutputNotWritable, QuantizeFailed, SourceCheckpointMissing
from ..core.files import write_json
from ..core.params import QuantizeParams
from .layout import EXPERT_RE, iter_header_specs, read_header
from .ptq import run_ptq, stdout_to_stderr, terminate_as_exit
from .recipe import (
    card_ignore,
    set_w4a4_serving_block,
)
from .validate import config_from_bytes, index_weight_map


# --- 3. serving rewrite --------------------------------------------------------------------
def serving_rewrite(ckpt: str | Path) -> dict[str, Any]:
    """Add ``input_global_scale`` = 1.0 (float32 [1]) beside every expert ``weight_global_scale``
    and set the W4A4 ``input_activations`` block in ``config.json``; updates the index.

    Rewrites each affected shard (temp file + rename inside ``ckpt``; call it on a temp copy).

    Returns:
        ``{"input_global_scales_added", "shards_rewritten", "seconds"}``.
    """
    import torch
    from safetensors.torch import load_file, save_file

    ckpt = Path(ckpt)
    t0 = time.monotonic()
    index_path = ckpt / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    added, rewritten = 0, 0
    for shard in sorted(ckpt.glob("*.safetensors")):
        names = [n for n in read_header(shard) if n != "__metadata__"]
        new = [n[: -len("weight_global_scale")] + "input_global_scale" for n in names
               if n.endswith(".weight_global_scale") and EXPERT_RE.match(n)]
        new = [n for n in new if n not in names]
        if not new:
            continue
        tensors = load_file(str(shard))
        for n in new:
            tensors[n] = torch.ones(1, dtype=torch.float32)
            index["weight_map"][n] = shard.name
        tmp = shard.with_name(f".{shard.name}.tmp")
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, shard)
        del tensors
        added += len(new)
        rewritten += 1
    index["metadata"]["total_size"] = int(index["metadata"].get("total_size", 0)) + 4 * added
    index["weight_map"] = dict(sorted(index["weight_map"].items()))
    write_json(index_path, index, indent=2)
    cfg_path = ckpt / "config.json"
    cfg = json.loads(cfg_path.read_text())
    set_w4a4_serving_block(cfg["quantization_config"])
    write_json(cfg_path, cfg, indent=2, sort_keys=True)
    return {"input_global_scales_added": added, "shards_rewritten": rewritten,
            "seconds": time.monotonic() - t0}




# --- measurements on the output --------------------------------------------------------------
def checkpoint_counts(ckpt: str | Path) -> dict[str, Any]:
    """Counts from the safetensors headers: tensors, by dtype, packed weights, scales, input
    scales, expert packed weights, quantized modules per layer and shard file modes."""
    by_dtype, kinds = Counter(), Counter()
    n = 0
    for _, name, _, dtype in iter_header_specs(ckpt):
        n += 1
        by_dtype[dtype] += 1
        for suffix in ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"):
            if name.endswith("." + suffix):
                kinds[suffix] += 1
                if suffix == "weight_packed" and EXPERT_RE.match(name):
                    kinds["expert_weight_packed"] += 1
    modes = sorted({oct(p.stat().st_mode & 0o777) for p in Path(ckpt).glob("*.safetensors")})
    return {"tensors": n, "by_dtype": dict(sorted(by_dtype.items())), **{k: kinds[k] for k in (
        "weight_packed", "expert_weight_packed", "weight_scale", "weight_global_scale", "input_global_scale")},
        "shard_file_modes": modes}


def gate_up_scales(ckpt: str | Path) -> Any:
    """Per expert with a quantized gate and up: both ``weight_global_scale`` values.

    Returns:
        pandas DataFrame: ``layer, expert, gate, up, equal`` (bitwise), ``rel_diff``
        (|gate - up| / max(gate, up)). Reads only the [1]-sized scale tensors.
    """
    import pandas as pd
    from safetensors import safe_open

    ckpt = Path(ckpt)
    wm = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    want: dict[tuple[int, int], dict[str, str]] = {}
    for name in wm:
        m = EXPERT_RE.match(name)
        if m and name.endswith(".weight_global_scale") and m.group(3) in ("gate", "up"):
            want.setdefault((int(m.group(1)), int(m.group(2))), {})[m.group(3)] = name
    by_shard: dict[str, list[str]] = {}
    for pair in want.values():
        for name in pair.values():
            by_shard.setdefault(wm[name], []).append(name)
    values: dict[str, float] = {}
    for shard, names in by_shard.items():
        with safe_open(str(ckpt / shard), "pt") as fh:
            for name in names:
                values[name] = float(fh.get_tensor(name).float().reshape(-1)[0])
    rows = []
    for (layer, expert), pair in sorted(want.items()):
        if set(pair) != {"gate", "up"}:
            continue
        g, u = values[pair["gate"]], values[pair["up"]]
        rows.append({"layer": layer, "expert": expert, "gate": g, "up": u, "equal": g == u,
                     "rel_diff": abs(g - u) / max(abs(g), abs(u)) if max(abs(g), abs(u)) else 0.0})
    return pd.DataFrame(rows, columns=["layer", "expert", "gate", "up", "equal", "rel_diff"])


def gate_up_summary(df: Any) -> dict[str, Any]:
    """``experts``, ``equal`` (count), ``share_fraction``, ``max_rel_diff``, ``median_rel_diff``."""
    n = len(df)
    return {"experts": n, "equal": int(df["equal"].sum()) if n else 0,
            "share_fraction": float(df["equal"].mean()) if n else None,
            "max_rel_diff": float(df["rel_diff"].max()) if n else None,
            "median_rel_diff": float(df["rel_diff"].median()) if n else None}


# --- the whole job -------------------------------------------------------------------------
def check_source(src: str | Path) -> dict[str, Any]:
    """A readable BF16 source: folder, config.json, shards, index naming existing shards.

    Returns ``{"files": {name: (size, mtime_ns)}, "safetensors_bytes", "config"}``.

    Raises:
        SourceCheckpointMissing: what is missing or unreadable, naming the file.
        CheckpointConfigError / ConfigFieldInvalid: config.json is not a JSON object, lacks an
            integer ``num_hidden_layers``, or has a field of the wrong type (:mod:`.validate`).
        IndexInvalid: the index is not JSON or its ``weight_map`` is not names -> shard files.
        QuantizeFailed: the source already has a ``quantization_config``.
    """
    src = Path(src)
    if not src.is_dir():
        raise SourceCheckpointMissing(f"source checkpoint folder not found: {src}")
    cfg_path = src / "config.json"
    if not cfg_path.is_file():
        raise SourceCheckpointMissing(f"{cfg_path}: config.json missing")
    try:
        config = config_from_bytes(cfg_path, cfg_path.read_bytes())  # types and ranges of every field read
    except OSError as exc:
        raise SourceCheckpointMissing(f"{cfg_path}: not readable ({exc.strerror or exc})") from None
    shards = sorted(src.glob("*.safetensors"))
    if not shards:
        raise SourceCheckpointMissing(f"{src}: no *.safetensors shards")
    index = src / "model.safetensors.index.json"
    if index.is_file():
        try:
            _, wm = index_weight_map(index, index.read_bytes())
        except OSError as exc:
            raise SourceCheckpointMissing(f"{index}: not readable ({exc.strerror or exc})") from None
        missing = sorted({f for f in wm.values() if not (src / f).is_file()})
        if missing:
            raise SourceCheckpointMissing(f"{index}: names missing shard(s) {missing}")
    if "quantization_config" in config:
        raise QuantizeFailed(f"{cfg_path}: source already has a quantization_config (not a BF16 source)")
    files = {str(p.relative_to(src)): (p.stat().st_size, p.stat().st_mtime_ns)
             for p in sorted(src.rglob("*")) if p.is_file()}
    return {"files": files, "safetensors_bytes": sum(p.stat().st_size for p in shards), "config": config}


def quantize_checkpoint(src: str | Path, dst: str | Path, qparams: QuantizeParams, *,
                        ignore: list[str] | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Quantize ``src`` (BF16, Ling layout) to NVFP4 in ``dst`` with the card's recipe.

    Args:
        src: source checkpoint folder (read only).
        dst: output folder; must not exist unless ``overwrite`` (then replaced at the end); must
            neither be inside ``src`` nor contain it.
        qparams: scheme, device, max_workers, share_gate_up_global_scale, serving_rewrite, python.
        ignore: ignore patterns; default :func:`card_ignore` for the source's num_hidden_layers.

    Returns:
        A JSON-able report: source, quantized, versions, fused_maps, ignore, seconds
        (``ptq_seconds`` inside model_free_ptq, ``rewrite_seconds``, ``total_seconds``),
        ``source_bytes``, ``mb_per_s`` (source safetensors MB (1e6 bytes) / ptq_seconds),
        ``counts`` (:func:`checkpoint_counts`), ``gate_up`` (:func:`gate_up_summary`),
        ``rewrite``, ``source_unchanged``.

    Raises:
        SourceCheckpointMissing, QuantizeFailed, and the config / index errors of :func:`check_source`.
        OutputNotWritable: the output's parent folder cannot be created or written.
        OutputExists: ``dst`` exists without ``overwrite``, or ``dst`` and ``src`` are nested.
    """
    t0 = time.monotonic()
    src, dst = Path(src).resolve(), Path(dst).absolute()
    before = check_source(src)
    if (dst.exists() or dst.is_symlink()) and not overwrite:
        raise OutputExists(f"output folder exists: {dst} (nothing was written)")
    if dst.resolve() == src or src in dst.resolve().parents:
        raise OutputExists(f"output {dst} is inside the source {src}; refusing to write there")
    if dst.resolve() in src.parents:
        raise OutputExists(f"source {src} is inside the output {dst}; replacing the output would delete it")
    ignore = list(ignore) if ignore is not None else card_ignore(int(before["config"]["num_hidden_layers"]))
    fused = "gate-up" if qparams.share_gate_up_global_scale else "empty"
    with terminate_as_exit():  # from before the temporary folder exists until it is gone
        try:
            dst.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _not_writable(dst, exc) from None
        work = dst.parent / f".{dst.name}.tmp-{secrets.token_hex(6)}"  # created inside the try below
        return _quantize_into(src, dst, work, qparams, before, ignore, fused, t0)


def _not_writable(dst: Path, exc: OSError) -> OutputNotWritable:
    return OutputNotWritable(f"cannot create the output beside {dst}: {exc.strerror or exc} "
                             "(nothing was written)")


def _quantize_into(src: Path, dst: Path, work: Path, qparams: QuantizeParams, before: dict[str, Any],
                   ignore: list[str], fused: str, t0: float) -> dict[str, Any]:
    """Create ``work`` (a new name beside ``dst``) and run the steps in it; ``work`` is removed
    however they end, SIGTERM included. The folder is made inside the ``try``: with
    ``tempfile.mkdtemp`` before it, a SIGTERM that came between the folder's creation and the
    ``try`` (between two bytecodes) left it behind (seen once in a test that signals as soon as
    the folder appears)."""
    foreign = False  # a folder of that name made by someone else is never removed
    try:
        try:
            os.mkdir(work, 0o700)
        except OSError as exc:
            foreign = isinstance(exc, FileExistsError)
            raise _not_writable(dst, exc) from None
        out = work / "ckpt"
        spec = {"src": str(src), "out": str(out), "scheme": qparams.scheme, "ignore": ignore,
                "fused_maps": fused, "device": qparams.device, "max_workers": qparams.max_workers}
        res = run_ptq(spec, qparams.python)
        if not res["ok"]:
            raise QuantizeFailed(f"model_free_ptq on {src} failed: {res['error_type']}: {res['error']}")
        rewrite = serving_rewrite(out) if qparams.serving_rewrite else None
        counts = checkpoint_counts(out)
        gu = gate_up_summary(gate_up_scales(out))
        after = check_source(src)
        if after["files"] != before["files"]:
            raise QuantizeFailed(f"source {src} changed during quantization (sizes/mtimes differ)")
        if dst.exists() or dst.is_symlink():
            os.rename(dst, work / "replaced")
        os.rename(out, dst)
    except BaseException:
        if not foreign and (work / "replaced").exists() and not dst.exists():
            os.rename(work / "replaced", dst)
        raise
    finally:
        if not foreign:
            shutil.rmtree(work, ignore_errors=True)
    mb = before["safetensors_bytes"] / 1e6
    return {
        "source": str(src), "quantized": str(dst), "scheme": qparams.scheme, "device": qparams.device,
        "python": qparams.python or sys.executable,
        "llmcompressor": res["llmcompressor"], "compressed_tensors": res["compressed_tensors"],
        "fused_maps": fused, "share_gate_up_global_scale": qparams.share_gate_up_global_scale,
        "serving_rewrite": qparams.serving_rewrite, "ignore": ignore,
        "ptq_seconds": res["seconds"], "rewrite_seconds": rewrite["seconds"] if rewrite else 0.0,
        "total_seconds": time.monotonic() - t0, "source_bytes": before["safetensors_bytes"],
        "mb_per_s": mb / res["seconds"] if res["seconds"] else None,
        "counts": counts, "gate_up": gu, "rewrite": rewrite, "source_unchanged": True,
    }


# --- CLI -----------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    """``nvfp4study quantize SRC DST [--params FILE] [--no-share-gate-up] ...``"""
    ap = argparse.ArgumentParser(
        prog="nvfp4study quantize",
        description="NVFP4-quantize a BF16 Ling-layout checkpoint with llmcompressor's model_free_ptq "
                    "(NVFP4A16, the card's ignore list, fused maps handled), then the serving rewrite.",
        epilog="example: nvfp4study quantize /models/Ling-3.0-flash /models/Ling-3.0-flash-NVFP4 --device cuda",
    )
    ap.add_argument("src", help="BF16 source checkpoint folder (only read)")
    ap.add_argument("dst", help="output folder (must not exist)")
    ap.add_argument("--params", help="params YAML whose quantize section is used (default: params/default.yaml)")
    ap.add_argument("--device", help="cpu, cuda, cuda:0 ... (default: from params)")
    ap.add_argument("--max-workers", type=int, help="worker threads (GPU only)")
    ap.add_argument("--python", help="interpreter of a separate llmcompressor environment")
    ap.add_argument("--no-share-gate-up", action="store_true", help="separate gate/up global scales")
    ap.add_argument("--no-serving-rewrite", action="store_true", help="plain NVFP4A16 output (W4A16 config)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    from ..core.params import load_params

    qp = load_params(args.params).quantize
    upd = {k: v for k, v in {"device": args.device, "max_workers": args.max_workers,
                             "python": args.python}.items() if v is not None}
    if args.no_share_gate_up:
        upd["share_gate_up_global_scale"] = False
    if args.no_serving_rewrite:
        upd["serving_rewrite"] = False
    qp = qp.model_copy(update=upd)
    with stdout_to_stderr() if args.json else contextlib.nullcontext():
        rep = quantize_checkpoint(args.src, args.dst, qp)  # progress and logs: stderr only under --json
    if args.json:
        print(json.dumps(rep, indent=1))
    else:
        c = rep["counts"]
        print(f"wrote {rep['quantized']}: {c['tensors']} tensors, {c['weight_packed']} packed "
              f"({c['expert_weight_packed']} routed-expert), {c['input_global_scale']} input_global_scale; "
              f"model_free_ptq {rep['ptq_seconds']:.1f} s = {rep['mb_per_s']:.1f} MB/s of BF16 input; "
              f"gate/up sharing {rep['gate_up']['equal']}/{rep['gate_up']['experts']} experts")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
