"""Type and range checks at the boundary: safetensors header bytes, the hub index, ``config.json``.

Every reader of checkpoint files (the local reader in :mod:`.header` and :mod:`.audit`, or one
that fetches the same bytes from elsewhere) hands the raw bytes or the parsed JSON to these
functions, so a wrong type or an out-of-range value becomes a named
:class:`~nvfp4study.core.errors.CheckpointFileError` subclass, never a Python traceback.

Bounds checked before ``json.loads``: the size (a safetensors header may not exceed
:data:`MAX_HEADER_BYTES`, the limit safetensors itself enforces) and the bracket nesting depth
(:func:`json_depth`, a linear scan), so a header nested 200,000 deep is refused in milliseconds
instead of raising ``RecursionError`` inside the JSON parser.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..core.errors import (
    CheckpointConfigError,
    CheckpointFileError,
    ConfigFieldInvalid,
    HeaderJSONInvalid,
    HeaderTooDeep,
    HeaderTooLarge,
    IndexInvalid,
    UnknownDtype,
)

#: bits per element of every dtype safetensors 0.8 defines (F4/F6 are sub-byte, packed).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8,
    "F8_E5M2": 8, "F8_E4M3": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
}
#: safetensors refuses a header longer than this (``MAX_HEADER_SIZE = 100_000_000`` in
#: ``safetensors/src/tensor.rs``, error ``HeaderTooLarge``); the real Ling shards' are < 1 MB.
MAX_HEADER_BYTES = 100_000_000
#: the index of a 245k-tensor checkpoint is about 20 MB; a config.json a few kB.
MAX_INDEX_BYTES = 200_000_000
MAX_CONFIG_BYTES = 16_000_000
#: deepest bracket nesting accepted in any of the three files. A valid header nests 3 deep
#: (object / entry / shape list), an index 3, a compressed-tensors config about 6.
MAX_JSON_DEPTH = 64
#: offsets and dimensions above this cannot address a file (and do not fit numpy's int64).
MAX_OFFSET = 2**63 - 1

# a JSON string (escapes included), matched possessively so a long string is one linear pass
_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"', re.S)

E = TypeVar("E", bound=CheckpointFileError)


def json_depth(raw: bytes) -> int:
    """Deepest ``{``/``[`` nesting of JSON text ``raw`` (brackets inside strings do not count).

    Linear in ``len(raw)``: strings are cut out with one regex, then the brackets are summed with
    numpy. Malformed text gives an over-estimate at worst (an unterminated string's brackets
    count), never a crash.
    """
    import numpy as np

    a = np.frombuffer(_STRING.sub(b"", raw), dtype=np.uint8)
    opens, closes = (a == 0x7B) | (a == 0x5B), (a == 0x7D) | (a == 0x5D)
    idx = np.flatnonzero(opens | closes)
    if not idx.size:
        return 0
    step = np.where(opens[idx], 1, -1).astype(np.int32)
    return int(np.cumsum(step).max())


def load_json_bounded(path: str | Path, raw: bytes, *, what: str, max_bytes: int,
                      error: type[E], too_large: type[CheckpointFileError] | None = None,
                      too_deep: type[CheckpointFileError] | None = None) -> Any:
    """``json.loads(raw)`` after bounding its size and depth.

    Args:
        path: the file the bytes came from (named in every error).
        raw: the JSON bytes (UTF-8).
        what: a word for the messages ("header", "index", "config.json").
        max_bytes: size limit in bytes.
        error: the error class for invalid UTF-8 / JSON; ``too_large`` / ``too_deep`` (default
            ``error``) for the two bounds.

    Raises:
        error / too_large / too_deep: the named error, naming ``path``.
    """
    if len(raw) > max_bytes:
        raise (too_large or error)(path, f"{what} is {len(raw)} bytes, over the {max_bytes}-byte limit")
    depth = json_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise (too_deep or error)(path, f"{what} JSON nests {depth} deep, over the limit of {MAX_JSON_DEPTH}")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise error(path, f"{what} is not valid JSON: {exc}") from None


def parse_header_bytes(path: str | Path, raw: bytes) -> dict[str, Any]:
    """The header JSON object of a safetensors file from its ``N`` header bytes.

    Raises:
        HeaderTooLarge: over :data:`MAX_HEADER_BYTES`.
        HeaderTooDeep: nested over :data:`MAX_JSON_DEPTH`.
        HeaderJSONInvalid: not UTF-8 JSON, or not an object.
    """
    header = load_json_bounded(path, raw, what="header", max_bytes=MAX_HEADER_BYTES, error=HeaderJSONInvalid,
                               too_large=HeaderTooLarge, too_deep=HeaderTooDeep)
    if not isinstance(header, dict):
        raise HeaderJSONInvalid(path, f"header is a JSON {type(header).__name__}, not an object")
    return header


T = TypeVar("T")


def header_entries(path: str | Path, header: dict[str, Any],
                   make: Callable[[str, str, tuple[int, ...], int, int], T]) -> tuple[dict[str, str], dict[str, T]]:
    """Check every entry of a parsed safetensors header; returns ``(metadata, {name: make(...)})``.

    ``make(name, dtype, shape, start, end)`` builds each tensor record (the caller's type).
    Each entry must be ``{"dtype": str, "shape": [int >= 0, ...], "data_offsets": [start, end]}``
    with ``0 <= start <= end <= MAX_OFFSET`` and ``end - start = bits(dtype) x prod(shape) / 8``;
    ``__metadata__`` (optional) maps strings to strings (safetensors' README, "Format").

    Raises:
        HeaderJSONInvalid: a malformed entry or metadata, offsets that do not hold dtype x shape.
        UnknownDtype: a dtype string not in :data:`DTYPE_BITS`.
    """
    metadata = header.get("__metadata__")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise HeaderJSONInvalid(path, "__metadata__ is not an object of strings")
    out: dict[str, T] = {}
    bits_of = DTYPE_BITS.get
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if type(entry) is not dict:
            raise HeaderJSONInvalid(path, f"tensor {name!r}: entry is a JSON {type(entry).__name__}, not an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if type(dtype) is not str or type(shape) is not list or type(offsets) is not list or len(offsets) != 2:
            raise HeaderJSONInvalid(path, f"tensor {name!r}: entry needs a dtype string, a shape list and two "
                                          f"data_offsets (got dtype {dtype!r}, shape {shape!r}, data_offsets {offsets!r})")
        bits = bits_of(dtype)
        if bits is None:
            raise UnknownDtype(path, f"tensor {name!r} has unknown dtype {dtype!r} (known: {', '.join(DTYPE_BITS)})")
        numel = 1
        for d in shape:
            if type(d) is not int or not 0 <= d <= MAX_OFFSET:
                raise HeaderJSONInvalid(path, f"tensor {name!r}: shape must be integers in 0..2^63-1, got {shape!r}")
            numel *= d
        start, end = offsets
        if type(start) is not int or type(end) is not int or not 0 <= start <= end <= MAX_OFFSET \
                or (end - start) * 8 != bits * numel:
            raise HeaderJSONInvalid(path, f"tensor {name!r}: offsets {offsets!r} do not hold {dtype} x {shape}")
        out[name] = make(name, dtype, tuple(shape), start, end)
    return metadata, out


def index_weight_map(path: str | Path, raw: bytes) -> tuple[dict[str, Any], dict[str, str]]:
    """Parse ``model.safetensors.index.json`` bytes; returns ``(index, weight_map)``.

    ``weight_map`` must map tensor names to shard file names: strings without a path separator
    (an index cannot send the reader outside the checkpoint folder); ``metadata``, when present,
    an object.

    Raises:
        IndexInvalid: too large, too deep, not JSON, or a field of the wrong type.
    """
    index = load_json_bounded(path, raw, what="index", max_bytes=MAX_INDEX_BYTES, error=IndexInvalid)
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
        raise IndexInvalid(path, "index is not JSON with a weight_map object")
    if not isinstance(index.get("metadata", {}), dict | None):
        raise IndexInvalid(path, f"index metadata is a {type(index['metadata']).__name__}, not an object")
    weight_map = index["weight_map"]
    for name, shard in weight_map.items():
        if type(shard) is not str or not shard or "/" in shard or "\\" in shard or shard in (".", ".."):
            raise IndexInvalid(path, f"weight_map[{name!r}] = {shard!r} is not a shard file name in the folder")
    return index, weight_map


# --- config.json -------------------------------------------------------------------------------
#: integer fields the audit and the quantizer read (null allowed unless listed in REQUIRED_INTS).
CONFIG_INTS = ("num_hidden_layers", "num_experts", "num_nextn_predict_layers", "hidden_size",
               "moe_intermediate_size", "first_k_dense_replace", "layer_group_size", "n_group", "topk_group",
               "num_experts_per_tok", "num_shared_experts", "moe_shared_expert_intermediate_size",
               "max_position_embeddings")
REQUIRED_INTS = ("num_hidden_layers",)
#: every other integer SGLang 0.5.23's config class and model read: ``BailingHybridConfig.__init__``
#: arguments (``configs/bailing_hybrid.py`` 52-101) and the model's ``config.*`` reads
#: (``models/bailing_moe_v3.py``, ``bailing_moe_nextn.py``); a float there breaks tensor shapes.
SGLANG_CONFIG_INTS = ("vocab_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                      "max_window_layers", "head_dim", "group_norm_size", "kv_lora_rank", "q_lora_rank",
                      "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim", "short_conv_kernel_size",
                      "rotary_dim")
#: token ids (an integer, or a list of integers for ``eos_token_id``), ``configs/bailing_hybrid.py`` 74-75.
CONFIG_TOKEN_IDS = ("pad_token_id", "eos_token_id", "bos_token_id")
#: real-valued fields of the same class and model: finite numbers (JSON ``NaN``, ``Infinity`` and
#: ``1e400`` parse as non-finite floats in Python's ``json``).
CONFIG_FLOATS = ("rms_norm_eps", "embedding_dropout", "attention_dropout", "output_dropout",
                 "initializer_range", "rope_theta", "mtp_loss_scaling_factor", "routed_scaling_factor",
                 "kda_lower_bound", "partial_rotary_factor")
#: objects whose numbers SGLang reads (RoPE parameters, ``layers/rotary_embedding`` via
#: ``config.rope_parameters``): every number inside must be finite.
CONFIG_NUMBER_OBJECTS = ("rope_scaling", "rope_parameters")
#: per-layer SwiGLU clamp limits (numbers), indexed by layer id in SGLang.
CONFIG_LIMIT_LISTS = ("expert_swiglu_limit_list", "share_expert_swiglu_limit_list")


def _is_int(v: Any) -> bool:
    return type(v) is int  # bool is an int subclass; JSON true is not a count


def _is_number(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def config_from_bytes(path: str | Path, raw: bytes, *, check: bool = True) -> dict[str, Any]:
    """Parse ``config.json`` bytes into a dict and check its fields (:func:`check_config_fields`;
    ``check=False`` leaves that to the caller, e.g. after its own presence checks).

    Raises:
        CheckpointConfigError: too large, too deep, not JSON, or not an object.
        ConfigFieldInvalid: a field of the wrong type or range.
    """
    cfg = load_json_bounded(path, raw, what="config.json", max_bytes=MAX_CONFIG_BYTES, error=CheckpointConfigError)
    if not isinstance(cfg, dict):
        raise CheckpointConfigError(path, f"config.json is a JSON {type(cfg).__name__}, not an object")
    if check:
        check_config_fields(path, cfg)
    return cfg


def check_config_fields(path: str | Path, cfg: dict[str, Any], *, required: tuple[str, ...] = REQUIRED_INTS) -> None:
    """Type and range of every ``config.json`` field the study reads.

    Integers (:data:`CONFIG_INTS`): absent/null or an integer >= 0 (``required`` ones must be
    present); every other number SGLang's config class and model read (:func:`_check_sglang_fields`);
    limit lists: absent/null or a list of finite numbers; ``quantization_config``:
    absent/null or an object checked by :func:`check_quantization_config`.

    Raises:
        ConfigFieldInvalid: names the field, what it holds and what it must hold.
    """
    for key in CONFIG_INTS:
        v = cfg.get(key)
        if v is None and key not in required:
            continue
        if not _is_int(v) or v < 0:
            raise ConfigFieldInvalid(path, f"{key} must be an integer >= 0, got {v!r}")
    for key in CONFIG_LIMIT_LISTS:
        v = cfg.get(key)
        if v is not None and (type(v) is not list or not all(_is_number(x) for x in v)):
            raise ConfigFieldInvalid(path, f"{key} must be a list of finite numbers, got {_short(v)}")
    _check_sglang_fields(path, cfg)
    qc = cfg.get("quantization_config")
    if qc is not None:
        if not isinstance(qc, dict):
            raise ConfigFieldInvalid(path, f"quantization_config must be an object, got {_short(qc)}")
        check_quantization_config(path, qc)


def _check_sglang_fields(path: str | Path, cfg: dict[str, Any]) -> None:
    """The fields of :data:`SGLANG_CONFIG_INTS`, :data:`CONFIG_TOKEN_IDS`, :data:`CONFIG_FLOATS` and
    :data:`CONFIG_NUMBER_OBJECTS`: absent/null, or integral / finite as SGLang needs them; a token
    id must lie inside ``vocab_size`` when both are given (the embedding has ``vocab_size`` rows).

    Raises:
        ConfigFieldInvalid: names the field, what it holds and what it must hold.
    """
    for key in SGLANG_CONFIG_INTS:
        v = cfg.get(key)
        if v is not None and (not _is_int(v) or v < 0):
            raise ConfigFieldInvalid(path, f"{key} must be an integer >= 0 (SGLang sizes tensors by it), got {_short(v)}")
    for key in CONFIG_TOKEN_IDS:
        v = cfg.get(key)
        ids = v if type(v) is list else [v]
        if v is not None and (not ids or not all(_is_int(x) and x >= 0 for x in ids)):
            raise ConfigFieldInvalid(path, f"{key} must be a token id (integer >= 0) or a list of them, got {_short(v)}")
        vocab = cfg.get("vocab_size")
        if v is not None and vocab is not None and max(ids) >= vocab:
            raise ConfigFieldInvalid(path, f"{key} {_short(v)} is outside the vocabulary (vocab_size {vocab})")
    for key in CONFIG_FLOATS:
        v = cfg.get(key)
        if v is not None and not _is_number(v):
            raise ConfigFieldInvalid(path, f"{key} must be a finite number, got {_short(v)}")
    for key in CONFIG_NUMBER_OBJECTS:
        v = cfg.get(key)
        if v is None:
            continue
        if type(v) is not dict:
            raise ConfigFieldInvalid(path, f"{key} must be an object or null, got {_short(v)}")
        bad = [k for k, x in v.items() if type(x) is float and not math.isfinite(x)]
        if bad:
            raise ConfigFieldInvalid(path, f"{key}.{bad[0]} must be a finite number, got {_short(v[bad[0]])}")


_ARG_STRS = ("type", "strategy", "observer", "scale_dtype", "zp_dtype", "actorder")
_ARG_INTS = ("num_bits", "group_size")


def check_quantization_config(path: str | Path, qc: dict[str, Any]) -> None:
    """Fields of a compressed-tensors ``quantization_config`` the audit reads.

    ``quant_method``/``format``/``quantization_status``: string or null; ``ignore``: list of
    strings or null; ``config_groups``: object of objects or null, each with ``targets`` (list of
    strings), ``weights`` / ``input_activations`` (object or null) whose ``num_bits`` /
    ``group_size`` are integers >= 0 or null and ``type``/``strategy``/... strings or null
    (compressed-tensors' ``QuantizationArgs`` field types).

    Raises:
        ConfigFieldInvalid: names the field.
    """
    for key in ("quant_method", "format", "quantization_status"):
        if qc.get(key) is not None and type(qc[key]) is not str:
            raise ConfigFieldInvalid(path, f"quantization_config.{key} must be a string, got {_short(qc[key])}")
    ig = qc.get("ignore")
    if ig is not None and (type(ig) is not list or not all(type(x) is str for x in ig)):
        raise ConfigFieldInvalid(path, f"quantization_config.ignore must be a list of strings, got {_short(ig)}")
    groups = qc.get("config_groups")
    if groups is None:
        return
    if type(groups) is not dict:
        raise ConfigFieldInvalid(path, f"quantization_config.config_groups must be an object, got {_short(groups)}")
    for gname, g in groups.items():
        where = f"quantization_config.config_groups.{gname}"
        if g is None:
            continue
        if type(g) is not dict:
            raise ConfigFieldInvalid(path, f"{where} must be an object, got {_short(g)}")
        t = g.get("targets")
        if t is not None and (type(t) is not list or not all(type(x) is str for x in t)):
            raise ConfigFieldInvalid(path, f"{where}.targets must be a list of strings, got {_short(t)}")
        for part in ("weights", "input_activations"):
            a = g.get(part)
            if a is None:
                continue
            if type(a) is not dict:
                raise ConfigFieldInvalid(path, f"{where}.{part} must be an object or null, got {_short(a)}")
            for k in _ARG_INTS:
                if a.get(k) is not None and (not _is_int(a[k]) or a[k] < 0):
                    raise ConfigFieldInvalid(path, f"{where}.{part}.{k} must be an integer >= 0, got {_short(a[k])}")
            for k in _ARG_STRS:
                if a.get(k) is not None and type(a[k]) is not str:
                    raise ConfigFieldInvalid(path, f"{where}.{part}.{k} must be a string, got {_short(a[k])}")
            if a.get("dynamic") is not None and type(a["dynamic"]) not in (bool, str):
                raise ConfigFieldInvalid(path, f"{where}.{part}.dynamic must be true/false/a string, got {_short(a['dynamic'])}")


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."
