"""Helpers for the ``real_engine`` tests: a tiny BailingMoeV3 checkpoint SGLang 0.5.23's real
engine serves on a CPU, and the engine's launch (``nvfp4study.serving.cpu_engine``) in the pinned
``.venv-sglang``.

The checkpoint: :func:`write_tiny_checkpoint` uses the project's generator when
``nvfp4study.checkpoint.served`` exists (``write_served_checkpoint``), else writes its own with
``nvfp4study.checkpoint.generate.write_checkpoint`` (the Ling tensor layout, random BF16
weights) and adds what a served model needs: eos/pad ids inside the vocabulary (the config
class defaults both to 156892, ``srt/configs/bailing_hybrid.py`` 74-75) and a byte-level BPE
tokenizer made with ``tokenizers`` carrying a chat template. Every layer is MLA
(``layer_group_size: 1``): KDA prefill has no CPU path (``srt/layers/attention/linear/
kda_backend.py``: Triton only).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SGL_VENV = REPO / ".venv-sglang"
SGL_PYTHON = SGL_VENV / "bin" / "python"

#: the chat template: a plain role-tagged transcript, the generation prompt opens the
#: assistant turn (enable_thinking is accepted and ignored).
CHAT_TEMPLATE = (
    "{% for m in messages %}<role>{{ m['role'] }}</role>{{ m['content'] }}<|eot|>{% endfor %}"
    "{% if add_generation_prompt %}<role>assistant</role>{% endif %}")
SPECIALS = ["<|endoftext|>", "<|eot|>", "<role>", "</role>"]

TINY_SHAPE = dict(
    vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=4, head_dim=16, layer_group_size=1,
    num_experts=8, num_experts_per_tok=2, num_shared_experts=1, n_group=2, topk_group=1,
    moe_intermediate_size=32, moe_shared_expert_intermediate_size=32, first_k_dense_replace=1,
    kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
    num_nextn_predict_layers=1, expert_swiglu_limits={}, share_expert_swiglu_limits={},
)


def require_sglang_env() -> Path:
    """The engine's interpreter; FAILS (never skips) when ``.venv-sglang`` is not built."""
    stamps = list(SGL_VENV.glob(".installed-*"))
    if SGL_PYTHON.is_file() and stamps:
        return SGL_PYTHON
    pytest.fail(f"{SGL_PYTHON} missing or not fully installed: build it with `make sglang-env`",
                pytrace=False)


def _served_generator():
    try:
        from nvfp4study.checkpoint.served import write_served_checkpoint
    except ImportError:
        return None
    return write_served_checkpoint


def write_tokenizer(out: Path, vocab_size: int) -> dict[str, int]:
    """A byte-level BPE tokenizer (no merges: one token per byte) padded with added tokens to
    exactly ``vocab_size`` ids, so every id the model can produce decodes. Returns the special
    tokens' ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIALS + sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    extra = vocab_size - len(vocab)
    if extra < 0:
        raise ValueError(f"vocab_size {vocab_size} < tokenizer size {len(vocab)}")
    tok.add_tokens([f"<|x{i}|>" for i in range(extra)])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|eot|>",
        "pad_token": "<|endoftext|>", "bos_token": None, "chat_template": CHAT_TEMPLATE,
        "model_max_length": 4096, "clean_up_tokenization_spaces": False}, indent=2))
    return {s: vocab[s] for s in SPECIALS}


def write_tiny_checkpoint(out: Path, *, seed: int = 0) -> tuple[Path, str]:
    """Write the test checkpoint to ``out`` (must not exist). Returns ``(path, source)`` where
    source says which generator made it ("served" or "own")."""
    served = _served_generator()
    if served is not None:
        return served(out, seed=seed), "served"
    from nvfp4study.checkpoint.generate import write_checkpoint
    from nvfp4study.core.params import LingShape

    path = write_checkpoint(LingShape(**TINY_SHAPE), out, shards=1, seed=seed)
    ids = write_tokenizer(path, TINY_SHAPE["vocab_size"])
    cfg = json.loads((path / "config.json").read_text())
    cfg.pop("auto_map", None)  # no remote code ships with the test checkpoint
    cfg.update(eos_token_id=ids["<|eot|>"], pad_token_id=ids["<|endoftext|>"],
               bos_token_id=None, max_position_embeddings=4096)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return path, "own"


def no_engine_processes(marker: str) -> list[str]:
    """Processes still carrying ``marker`` in their environment (psutil), as ``pid name``."""
    import psutil

    from nvfp4study.serving.process import SERVER_MARKER_ENV

    left = []
    for p in psutil.process_iter(["pid", "name"]):
        try:
            if p.pid != os.getpid() and p.environ().get(SERVER_MARKER_ENV) == marker:
                left.append(f"{p.pid} {p.info['name']}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return left
