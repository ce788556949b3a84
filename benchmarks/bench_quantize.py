"""Quantizer throughput: ``nvfp4study.checkpoint.quantize.quantize_checkpoint`` vs ``model_free_ptq`` called
directly, on the same BF16 Ling-layout input with realistic expert shapes (random weights).

    python benchmarks/bench_quantize.py [--experts 8] [--moe-layers 2] [--repeat 2] [--device cpu]

MB/s = BF16 safetensors input, 10^6 bytes, over the wall time (monotonic clock) of the call.
"Direct" is ``model_free_ptq(src, out, scheme="NVFP4A16", ignore=card ignore list)`` with both
fused tables emptied (with the stock tables it refuses the Ling layout; the error is printed).
"Ours" adds the gate/up pairing rule, the serving rewrite, the header counts and the source
checks; both its model_free_ptq time and its end-to-end time are shown. Imports are warmed up
before timing; runs alternate between the two; median and range over ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from nvfp4study.checkpoint import generate, quantize
from nvfp4study.checkpoint import ptq as P
from nvfp4study.core.params import LingShape, QuantizeParams


def bench_shape(experts: int, moe_layers: int) -> LingShape:
    """Real hidden/expert sizes (2560, 768); few experts and layers; small attention and vocab."""
    return LingShape(vocab_size=1024, hidden_size=2560, intermediate_size=768, num_hidden_layers=moe_layers + 1,
                     num_attention_heads=4, num_key_value_heads=4, head_dim=64, layer_group_size=6,
                     num_experts=experts, num_experts_per_tok=min(8, experts), n_group=1, topk_group=1,
                     moe_intermediate_size=768, moe_shared_expert_intermediate_size=768, first_k_dense_replace=1,
                     kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
                     expert_swiglu_limits={}, share_expert_swiglu_limits={})


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--moe-layers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workdir", default=None, help="where to write (default: a temp folder)")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-quantize-", dir=args.workdir))
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
