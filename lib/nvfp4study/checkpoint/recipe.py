"""The card's NVFP4 recipe as data: the ignore list, the quantization config, the NVFP4 layout.

The model card's "Provenance" section: ``model_free_ptq`` with scheme NVFP4A16 and an ignore
list that keeps the MTP layer first, then a serving rewrite that declares W4A4 activations.
:mod:`.quantize` runs it; :mod:`.generate` uses :func:`nvfp4_layout` for header-only layouts.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from ..core.params import LingShape
from .layout import EXPERT_RE, Spec

# --- 1. the ignore list --------------------------------------------------------------------
#: The card's ignore list, in order; ``{mtp}`` is the MTP layer's number (42 on the real model).
#: Matched by compressed-tensors against MODULE names (tensor name minus ``.weight``) with
#: ``re.match`` (compressed_tensors/utils/match.py:422-445, 499-523).
CARD_IGNORE: list[tuple[str, str]] = [
    (r"re:.*layers\.{mtp}\..*",
     "MTP/NEXTN layer first: the card keeps all its tensors BF16 so the draft head loads unquantized"),
    ("lm_head", "untied output head, BF16 in the card's table"),
    (r"re:.*word_embeddings.*", "embeddings, BF16 in the card's table (a .weight tensor, so targeted unless ignored)"),
    (r"re:.*attention\..*",
     "all KDA and MLA attention (q/k/v/o/f/g/b_proj, MLA q_proj/kv_a/kv_b/dense/g_proj) is BF16; "
     "also keeps the 3-D *_conv1d weights out (model_free_ptq refuses non-2-D targets)"),
    (r"re:.*mlp\.gate$", "MoE router (mlp.gate.weight), BF16 in the card's table"),
    (r"re:.*shared_experts\..*", "shared experts BF16 (served with --disable-shared-experts-fusion)"),
    (r"re:.*mlp\.(gate|up|down)_proj$", "dense MLP of layers 0..first_k_dense_replace-1, BF16"),
    (r"re:.*eh_proj$", "MTP eh_proj (already under the MTP pattern; kept should MTP be renumbered)"),
]


def card_ignore(num_hidden_layers: int) -> list[str]:
    """The ignore patterns for a model with ``num_hidden_layers`` (the MTP layer's number)."""
    return [p.replace("{mtp}", str(num_hidden_layers)) for p, _ in CARD_IGNORE]


def ignore_table(specs: list[Spec], num_hidden_layers: int) -> Any:
    """pandas DataFrame: each ignore pattern, why, and how many tensors it is the first to match."""
    import pandas as pd

    pats = card_ignore(num_hidden_layers)
    first = Counter()
    for name, _, _ in specs:
        module = name.rpartition(".")[0]
        hit = next((p for p in pats if _match(module, p)), None)
        if hit:
            first[hit] += 1
    return pd.DataFrame([{"pattern": p, "why": why, "tensors (first match)": first[p]}
                         for p, (_, why) in zip(pats, CARD_IGNORE, strict=True)])


def _match(name: str, target: str) -> bool:
    """compressed-tensors ``match_name`` without fused names (utils/match.py:442-445)."""
    return re.match(target[3:], name) is not None if target.startswith("re:") else name == target


def is_quantized(name: str, shape: tuple[int, ...], ignore: list[str]) -> bool:
    """Whether model_free_ptq (targets ``["Linear"]``) quantizes this tensor: its parameter is
    ``weight``, its module does not end in ``norm``, no ignore pattern matches the module
    (compressed_tensors/utils/match.py:499-523), and it is 2-D (else it refuses the run)."""
    module, _, param = name.rpartition(".")
    return (param == "weight" and not module.endswith("norm") and len(shape) == 2
            and not any(_match(module, p) for p in ignore))


# --- quantization config (as llmcompressor writes it) ----------------------------------------
def nvfp4a16_quantization_config(ignore: list[str], serving: bool = True) -> dict[str, Any]:
    """The ``quantization_config`` model_free_ptq writes for NVFP4A16 (built with
    compressed-tensors like llmcompressor's save_utils.update_config), plus the serving block
    when ``serving``. Used for the header-only NVFP4 layout."""
    from compressed_tensors import __version__ as ct_version
    from compressed_tensors.config import CompressionFormat
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    # compress_module sets this on the scheme llmcompressor later saves
    # (compressed_tensors/compressors/base.py:189-190); here no module is compressed.
    scheme.format = CompressionFormat.nvfp4_pack_quantized.value
    qc = QuantizationConfig.model_validate({"config_groups": {"NVFP4A16": scheme}, "ignore": ignore,
                                            "quantization_status": "compressed", "format": scheme.format})
    data = {"version": ct_version, "quant_method": "compressed-tensors", "transform_config": {},
            **qc.model_dump(mode="json", exclude={"quant_method"})}
    return set_w4a4_serving_block(data) if serving else data


def w4a4_input_activations() -> dict[str, Any]:
    """The compressed-tensors ``NVFP4`` preset's ``input_activations`` (``dynamic: "local"``)."""
    from compressed_tensors.quantization import preset_name_to_scheme

    return preset_name_to_scheme("NVFP4", ["Linear"]).input_activations.model_dump(mode="json")


def set_w4a4_serving_block(qconfig: dict[str, Any]) -> dict[str, Any]:
    """Replace ``input_activations: null`` of every config group by the W4A4 block (in place)."""
    block = w4a4_input_activations()
    for group in qconfig.get("config_groups", {}).values():
        group["input_activations"] = dict(block)
    return qconfig


def nvfp4_layout(shape: LingShape, specs: list[Spec], config: dict[str, Any]) -> tuple[list[Spec], dict]:
    """Specs and config of the quantized + serving layout of a BF16 layout (header-only use).

    Each quantized ``X.weight`` [o, i] becomes ``X.weight_global_scale`` F32 [1],
    ``X.weight_packed`` U8 [o, i/2], ``X.weight_scale`` F8_E4M3 [o, i/16], and, for routed
    experts, ``X.input_global_scale`` F32 [1] (what llmcompressor's ``model_free_ptq`` writes:
    compressed-tensors ``nvfp4-pack-quantized``, ``compressors/nvfp4``).
    """
    ignore = card_ignore(shape.num_hidden_layers)
    config = dict(config, quantization_config=nvfp4a16_quantization_config(ignore))
    return nvfp4_specs(shape, specs), config


def nvfp4_specs(shape: LingShape, specs: list[Spec]) -> list[Spec]:
    """The tensor specs of the quantized + serving layout (no config; imports no
    compressed-tensors, so it is cheap enough for size predictions): see :func:`nvfp4_layout`."""
    ignore = card_ignore(shape.num_hidden_layers)
    out: list[Spec] = []
    for name, shp, dtype in specs:
        if not is_quantized(name, shp, ignore):
            out.append((name, shp, dtype))
            continue
        mod = name[: -len(".weight")]
        o, i = shp
        out += [(mod + ".weight_global_scale", (1,), "F32"), (mod + ".weight_packed", (o, i // 2), "U8"),
                (mod + ".weight_scale", (o, i // 16), "F8_E4M3")]
        if EXPERT_RE.match(name):
            out.append((mod + ".input_global_scale", (1,), "F32"))
    return out


