"""Quantizer throughput: ``nvfp4study.checkpoint.quantize.quantize_checkpoint`` vs ``model_free_ptq`` called
directly, on the same BF16 Ling-layout input with realistic expert shapes (random weights).

    python benchmarks/bench_quantize.py [--experts 8] [--moe-layers 2] [--repeat 2] [--device cpu]
    python benchmarks/bench_quantize.py --compare-cpu --device cuda --experts 512 --moe-layers 2 [--json-out F]

MB/s = BF16 safetensors input, 10^6 bytes, over the wall time (monotonic clock) of the call.
"Direct" is ``model_free_ptq(src, out, scheme="NVFP4A16", ignore=card ignore list)`` with both
fused tables emptied (with the stock tables it refuses the Ling layout; the error is printed).
"Ours" adds the gate/up pairing rule, the serving rewrite, the header counts and the source
checks; both its model_free_ptq time and its end-to-end time are shown. Imports are warmed up
before timing; runs alternate between the two; median and range over ``--repeat`` runs.

``--compare-cpu`` (with ``--device cuda``): one ``quantize_checkpoint`` on the device and one on
the CPU of the same input (same ``--max-workers``; a small warm-up run on each first), the
sha256 of every output file, whether the outputs are bit-identical, and MB/s of each; with
``--json-out`` the same as JSON. No MTP layer in this mode (``--mtp-layers 0`` default there) so
that the input is only the routed experts' real 768 x 2560 projections plus small attention.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from nvfp4study.checkpoint import generate, quantize
from nvfp4study.checkpoint import ptq as P
from nvfp4study.core.params import LingShape, QuantizeParams


def bench_shape(experts: int, moe_layers: int, mtp_layers: int = 1) -> LingShape:
    """Real hidden/expert sizes (2560, 768); few experts and layers; small attention and vocab."""
    return LingShape(num_nextn_predict_layers=mtp_layers, vocab_size=1024, hidden_size=2560, intermediate_size=768, num_hidden_layers=moe_layers + 1,
                     num_attention_heads=4, num_key_value_heads=4, head_dim=64, layer_group_size=6,
                     num_experts=experts, num_experts_per_tok=min(8, experts), n_group=1, topk_group=1,
                     moe_intermediate_size=768, moe_shared_expert_intermediate_size=768, first_k_dense_replace=1,
                     kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
                     expert_swiglu_limits={}, share_expert_swiglu_limits={})


def _digests(folder: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir()) if f.is_file()}


def compare_cpu(args, work: Path) -> dict:
    """One device and one CPU quantization of the same input: MB/s of each and bit identity."""
    import torch

    shape = bench_shape(args.experts, args.moe_layers, mtp_layers=0)
    t0 = time.monotonic()
    src = generate.write_checkpoint(shape, work / "src", shards=args.shards, seed=0)
    mb = quantize.check_source(src)["safetensors_bytes"] / 1e6
    out = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
           "torch": torch.__version__, "input_mb": round(mb, 1), "experts": args.experts, "moe_layers": args.moe_layers,
           "expert_shape": "768 x 2560 (gate/up), 2560 x 768 (down)", "generate_s": round(time.monotonic() - t0, 1),
           "max_workers": args.max_workers}
    print(f"input: {mb:.0f} MB BF16, {args.moe_layers} MoE layers x {args.experts} experts of 768x2560; "
          f"generated in {out['generate_s']} s; GPU {out['gpu']}", flush=True)
    warm = generate.write_checkpoint(bench_shape(8, 1, 0), work / "warm-src", shards=1, seed=1)
    for i, dev in enumerate((args.device, "cpu")):
        quantize.quantize_checkpoint(warm, work / f"warm-{i}", QuantizeParams(device=dev, max_workers=args.max_workers))
    runs = []
    for i, dev in enumerate((args.device, "cpu")):
        rep = quantize.quantize_checkpoint(src, work / f"out-{i}", QuantizeParams(device=dev, max_workers=args.max_workers))
        runs.append(_digests(work / f"out-{i}"))
        out[dev] = {"mb_per_s_ptq": round(rep["mb_per_s"], 1), "mb_per_s_total": round(mb / rep["total_seconds"], 1),
                    "seconds_total": round(rep["total_seconds"], 1), "sha256": runs[-1]}
        print(f"{dev:>6}: {out[dev]['mb_per_s_ptq']:7.1f} MB/s (model_free_ptq), {out[dev]['mb_per_s_total']:7.1f} MB/s "
              f"end to end, {out[dev]['seconds_total']} s", flush=True)
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(out, indent=1))
    a, b = runs
    out["bit_identical"] = a == b
    out["differing_files"] = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    print(f"outputs {'bit-identical' if a == b else 'DIFFER'} between {args.device} and cpu "
          f"({len(a)} files{'' if a == b else '; differing: ' + ', '.join(out['differing_files'])})")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1))
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--moe-layers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workdir", default=None, help="where to write (default: a temp folder)")
    ap.add_argument("--compare-cpu", action="store_true", help="device vs CPU: MB/s of each and bit identity")
    ap.add_argument("--max-workers", type=int, default=4)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-quantize-", dir=args.workdir))
    if args.compare_cpu:
        try:
            compare_cpu(args, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    try:
        shape = bench_shape(args.experts, args.moe_layers)
        t0 = time.monotonic()
        src = generate.write_checkpoint(shape, work / "src", shards=args.shards, seed=0)
        mb = quantize.check_source(src)["safetensors_bytes"] / 1e6
        print(f"input: {mb:.0f} MB BF16, {args.moe_layers} MoE layers x {args.experts} experts of 768x2560 "
              f"(+ MTP layer), {args.shards} shards; generated in {time.monotonic() - t0:.1f} s")
        ignore = quantize.card_ignore(shape.num_hidden_layers)
        stock = P.ptq(str(src), str(work / "stock"), ignore=ignore, fused_maps="stock", probe=True)
        print(f"model_free_ptq with the stock fused tables: "
              f"{'accepted' if stock['ok'] else stock['error_type'] + ': ' + stock['error']}")
        # warm-up: imports and first-call costs, not timed
        P.ptq(str(src), str(work / "warm"), ignore=ignore, fused_maps="empty", device=args.device, probe=True)
        direct, ours_ptq, ours_total = [], [], []
        for i in range(args.repeat):
            res = P.ptq(str(src), str(work / f"direct{i}"), ignore=ignore, fused_maps="empty",
                               device=args.device)
            assert res["ok"], res
            direct.append(mb / res["seconds"])
            rep = quantize.quantize_checkpoint(src, work / f"ours{i}", QuantizeParams(device=args.device))
            ours_ptq.append(rep["mb_per_s"])
            ours_total.append(mb / rep["total_seconds"])
            shutil.rmtree(work / f"direct{i}")
            shutil.rmtree(work / f"ours{i}")

        def fmt(xs: list[float]) -> str:
            return f"{statistics.median(xs):7.1f} MB/s  (min {min(xs):.1f}, max {max(xs):.1f}, n={len(xs)})"

        print(f"model_free_ptq direct (tables emptied):      {fmt(direct)}")
        print(f"quantize_checkpoint, its model_free_ptq call: {fmt(ours_ptq)}")
        print(f"quantize_checkpoint end to end (+ rewrite):   {fmt(ours_total)}")
        print(f"llmcompressor {stock['llmcompressor']}, compressed-tensors {stock['compressed_tensors']}, "
              f"device {args.device}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
