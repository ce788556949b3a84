"""Time the header audit on the full-size Ling-3.0-flash NVFP4 layout (about 245k tensors).

The layout is written header-only into a temp folder (sparse data regions; the [1] scales carry
values): by ``ling_layout.write_checkpoint(LingShape(), dir, header_only=True, layout="nvfp4")``
when the generator provides it, else by this script from ``ling_layout.tensor_specs`` (or its own
tensor list) with the routed experts of layers 2-41 turned into NVFP4 tensors. Then it runs
``audit_checkpoint`` (headers + scale values) and prints the times.

    python benchmarks/bench_audit.py [--shards 64] [--repeat 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from nvfp4study.checkpoint.audit import audit_checkpoint
from nvfp4study.core.params import LingShape

BYTES = {"BF16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1}


def _own_specs(s: LingShape) -> list[tuple[str, tuple[int, ...], str]]:
    """The BF16 tensor list, from the generator when present (else a minimal Ling list)."""
    try:
        from nvfp4study.checkpoint.layout import tensor_specs

        return tensor_specs(s)
    except Exception as exc:  # generator absent or broken: fall back to the experts + a few tensors
        print(f"(ling_layout.tensor_specs unavailable: {exc}; using a minimal tensor list)", file=sys.stderr)
    H = s.hidden_size
    out = [("model.word_embeddings.weight", (s.vocab_size, H), "BF16")]
    for layer in range(s.num_hidden_layers + s.num_nextn_predict_layers):
        p = f"model.layers.{layer}."
        out += [(p + "input_layernorm.weight", (H,), "BF16"), (p + "post_attention_layernorm.weight", (H,), "BF16")]
        if layer >= s.first_k_dense_replace:
            for e in range(s.num_experts):
                for proj, shp in (("gate_proj", (s.moe_intermediate_size, H)), ("up_proj", (s.moe_intermediate_size, H)),
                                  ("down_proj", (H, s.moe_intermediate_size))):
                    out.append((f"{p}mlp.experts.{e}.{proj}.weight", shp, "BF16"))
    return out + [("model.norm.weight", (H,), "BF16"), ("lm_head.weight", (s.vocab_size, H), "BF16")]


def _write_own(s: LingShape, out: Path, shards: int) -> None:
    """Header-only NVFP4 layout written here: experts of layers first_k..L-1 quantized, W4A4 config."""
    nl = s.num_hidden_layers
    specs = []
    for name, shp, dt in _own_specs(s):
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else -1
        if ".mlp.experts." in name and s.first_k_dense_replace <= layer < nl:
            mod = name[: -len(".weight")]
            o, i = shp
            specs += [(mod + ".weight_packed", (o, i // 2), "U8"), (mod + ".weight_scale", (o, i // 16), "F8_E4M3"),
                      (mod + ".weight_global_scale", (1,), "F32"), (mod + ".input_global_scale", (1,), "F32")]
        else:
            specs.append((name, shp, dt))
    out.mkdir(parents=True)
    per = -(-len(specs) // shards)
    rng = np.random.default_rng(0)
    weight_map = {}
    for k in range(shards):
        part = specs[k * per:(k + 1) * per]
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        header, off, small = {}, 0, []
        for name, shp, dt in part:
            n = BYTES[dt] * int(np.prod(shp))
            header[name] = {"dtype": dt, "shape": list(shp), "data_offsets": [off, off + n]}
            if name.endswith("global_scale"):
                v = 1.0 if name.endswith("input_global_scale") else 2688.0 / rng.uniform(0.05, 0.2)
                small.append((off, np.float32(v).tobytes()))
            off += n
            weight_map[name] = fname
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        with open(out / fname, "wb") as fh:
            fh.write(struct.pack("<Q", len(blob)) + blob)
            start = 8 + len(blob)
            for o, b in small:
                fh.seek(start + o)
                fh.write(b)
            fh.truncate(start + off)
    act = {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 16, "strategy": "tensor_group",
           "dynamic": "local"}
    w = {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 16, "strategy": "tensor_group", "dynamic": False}
    cfg = {"num_hidden_layers": nl, "first_k_dense_replace": s.first_k_dense_replace, "num_experts": s.num_experts,
           "num_experts_per_tok": s.num_experts_per_tok, "n_group": s.n_group, "topk_group": s.topk_group,
           "layer_group_size": s.layer_group_size, "num_nextn_predict_layers": s.num_nextn_predict_layers,
           "hidden_size": s.hidden_size, "moe_intermediate_size": s.moe_intermediate_size,
           "quantization_config": {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                                   "config_groups": {"NVFP4": {"targets": ["Linear"], "weights": w, "input_activations": act}},
                                   "ignore": [rf"re:.*layers\.{nl}\..*", "lm_head", r"re:.*word_embeddings.*",
                                              r"re:.*attention\..*", r"re:.*shared_experts.*", r"re:.*mlp\.gate$",
                                              r"re:.*mlp\.(gate|up|down)_proj$", r"re:.*eh_proj$"]}}
    (out / "config.json").write_text(json.dumps(cfg))
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def build(out: Path, shards: int) -> str:
    """Write the full-size header-only NVFP4 layout; returns who wrote it."""
    try:
        from nvfp4study.checkpoint.generate import write_checkpoint

        write_checkpoint(LingShape(), out, shards=shards, header_only=True, layout="nvfp4")
        return "ling_layout.write_checkpoint(layout='nvfp4', header_only=True)"
    except Exception as exc:
        print(f"(generator's nvfp4 header-only layout unavailable: {type(exc).__name__}: {exc}; writing it here)",
              file=sys.stderr)
        shutil.rmtree(out, ignore_errors=True)
        _write_own(LingShape(), out, shards)
        return "bench_audit._write_own"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", help="write the layout here and keep it")
    args = ap.parse_args()
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-audit-"))
    out = tmp / "ling-full-nvfp4" if not args.keep else tmp
    try:
        t0 = time.perf_counter()
        who = build(out, args.shards)
        t_build = time.perf_counter() - t0
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            rep = audit_checkpoint(out)
            times.append(time.perf_counter() - t0)
        m = rep.counts["measured"]
        print(f"layout: {who}; {m['total_tensors']} tensors in {rep.size['shards']} shards, apparent size "
              f"{rep.size['gb']:.1f} GB (sparse); written in {t_build:.1f} s")
        print(f"audit (headers + {rep.input_scales.get('with_input_global_scale', 0)} input and "
              f"{rep.input_scales.get('nvfp4_modules', 0)} weight global scales read): "
              f"best {min(times):.2f} s, median {sorted(times)[len(times) // 2]:.2f} s over {len(times)} runs")
        print("phases of the last run (s): " + ", ".join(f"{k} {v:.2f}" for k, v in rep.timings.items()))
        print(f"quantized expert projections: {m['quantized_expert_modules']}; MTP layer tensors: {m['mtp_layer_tensors']}; "
              f"findings: {sorted(rep.codes())}")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
