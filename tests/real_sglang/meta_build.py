"""Build SGLang 0.5.23's config class and model for a checkpoint on the meta device (run by
.venv-sglang with the CPU engine's environment). Prints one JSON line.

Usage: ``python meta_build.py CHECKPOINT``. The config is ``srt/configs/bailing_hybrid.py``
``BailingHybridConfig`` from the checkpoint's ``config.json``; the model is
``srt/models/bailing_moe_v3.py`` ``BailingMoeV3ForCausalLM(config=...)`` (keyword-only, line
1376), built after a one-process gloo group and a published ServerArgs, as SGLang's own layer
tests do (``sglang/test/layer_ut_utils.py`` ``init_single_process_dist``; that module itself
imports the benchmark datasets, so its steps are repeated here).
"""

from __future__ import annotations

import json
import os
import socket
import sys

import torch


def main(ckpt: str) -> dict:
    from sglang.srt.configs.bailing_hybrid import BailingHybridConfig

    raw = json.loads(open(os.path.join(ckpt, "config.json")).read())
    config = BailingHybridConfig(**{k: v for k, v in raw.items() if not k.startswith("_")})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")
    from sglang.srt.distributed import parallel_state
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    parallel_state.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
    reset_context()
    publish(ServerArgs(model_path=ckpt, device="cpu", mamba_radix_cache_strategy="no_buffer",
                       disable_overlap_schedule=True, attention_backend="torch_native"),
            role="test", ranks=SpawnRanks(world_rank=0))
    get_parallel().override_permanently(world_group=parallel_state._WORLD)
    parallel_state.initialize_model_parallel(backend="gloo")
    from sglang.srt.models.bailing_moe_v3 import BailingMoeV3ForCausalLM

    with torch.device("meta"):
        model = BailingMoeV3ForCausalLM(config=config)
    params = dict(model.named_parameters())
    return {"config_class": type(config).__name__, "model_class": type(model).__name__,
            "num_hidden_layers": config.num_hidden_layers,
            "layer_group_size": config.layer_group_size,
            "eos_token_id": config.eos_token_id, "pad_token_id": config.pad_token_id,
            "vocab_size": config.vocab_size,
            "devices": sorted({str(p.device) for p in params.values()}),
            "num_params": sum(p.numel() for p in params.values()),
            "param_names": sorted(params)}


if __name__ == "__main__":
    print("META " + json.dumps(main(sys.argv[1])))
