"""Checkpoints in the Ling-3.0-flash layout: describe, generate, quantize, audit, round-trip.

The layout and the card's NVFP4 recipe as data, a safetensors header reader, llmcompressor's
``model_free_ptq`` with the serving rewrite, the header audit (precision, counts, scales), the
generated tokenizer and the all-MLA checkpoint SGLang serves on a CPU (draft acceptance by construction).
"""

__all__ = [
    "audit",
    "check_config",
    "check_modules",
    "check_scale_values",
    "check_scales",
    "compare",
    "findings",
    "generate",
    "header",
    "hub_audit",
    "layout",
    "modules",
    "ptq",
    "quant_rules",
    "quantize",
    "reader",
    "recipe",
    "remote",
    "roundtrip",
    "served",
    "tokenizer",
    "validate",
]
