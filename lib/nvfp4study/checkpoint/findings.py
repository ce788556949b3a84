"""Audit findings: the :class:`AuditCode` of every result, its :class:`Severity` and the :class:`AuditFinding` record.

Codes ``F0n-*`` are the verdicts of the five checkpoint faults the study checks (one line each;
``docs/faults.md`` has the full text):

- F-01 ``F01-*``: routed-expert projections without their per-expert ``input_global_scale``, or
  with a 0/NaN/inf one; an engine that allocates the missing scale uninitialised loads without
  error and gives NaN or pad tokens only on prompts routed to those experts.
- F-02 ``F02-*``: the MTP (NEXTN) layer missing, stored BF16 but not ignored by the config, or
  packed while the config ignores it; the draft then loads garbage or nothing.
- F-03 ``F03-*``: the MTP layer's experts in a different FP4 format (MXFP4) from the trunk's NVFP4.
- F-04 ``F04-config-w4a16``: a weight-only (W4A16, ``input_activations: null``) NVFP4 config; which
  SGLang versions serve it on which GPU generation is in the finding's message.
- F-05 ``F05-*``: a routing shape outside FlashInfer's grouped-routing limits (TRT-LLM MoE backend).

The other codes are the audit's own. Severity ``error`` makes ``nvfp4study audit-checkpoint`` exit 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class AuditCode(StrEnum):
    """Audit finding codes. ``F0n-*`` are the verdicts of the faults F-01..F-05 (module docstring)."""

    F01_INPUT_SCALE_MISSING = "F01-input-scale-missing"
    F01_INPUT_SCALE_NONFINITE = "F01-input-scale-nonfinite"
    F02_MTP_MISSING = "F02-mtp-missing"
    F02_MTP_BF16_NOT_IGNORED = "F02-mtp-bf16-not-ignored"
    F02_MTP_PACKED_BUT_IGNORED = "F02-mtp-packed-but-ignored"
    F03_MTP_FORMAT_DIFFERS = "F03-mtp-format-differs"
    F04_CONFIG_W4A16 = "F04-config-w4a16"
    F05_ROUTING_OVER_LIMIT = "F05-routing-over-limit"
    F05_ROUTING_AT_LIMIT = "F05-routing-at-limit"
    F05_ROUTING_INVALID = "F05-routing-invalid"
    CONFIG_W4A4 = "config-w4a4"
    CONFIG_SCHEME_OTHER = "config-scheme-other"
    CONFIG_NOT_COMPRESSED_TENSORS = "config-not-compressed-tensors"
    ROUTING_WITHIN = "routing-within-limits"
    ROUTING_UNKNOWN = "routing-unknown"
    MTP_BF16_IGNORED = "mtp-bf16-ignored"
    MTP_QUANTIZED = "mtp-quantized"
    MTP_UNDECLARED = "mtp-undeclared"
    TARGETED_BUT_PLAIN = "targeted-but-plain"
    PACKED_BUT_IGNORED = "packed-but-ignored"
    FORMAT_MISMATCH = "format-mismatch"
    UNMATCHED_LINEAR = "unmatched-linear"
    MOE_SCHEME_SPLIT = "moe-scheme-split"
    IGNORE_SEMANTICS_DIFFER = "ignore-semantics-differ"
    PACKED_LAYOUT_INVALID = "packed-layout-invalid"
    SCALE_LAYOUT_INVALID = "scale-layout-invalid"
    WEIGHT_SCALE_NONFINITE = "weight-scale-nonfinite"
    INPUT_SCALE_UNEXPECTED = "input-scale-unexpected"
    GATE_UP_SCALE_MISMATCH = "gate-up-scale-mismatch"
    GATE_UP_SCALE_SHARED = "gate-up-scale-shared"
    SCALES_ALL_IDENTICAL = "scales-all-identical"
    SCALE_VALUE_IMPLAUSIBLE = "scale-value-implausible"
    DUPLICATE_TENSOR = "duplicate-tensor"
    INDEX_UNLISTED_TENSOR = "index-unlisted-tensor"
    CLAMP_LIST_LENGTH = "clamp-list-length"
    COUNT_FORMULA_MISMATCH = "count-formula-mismatch"
    EXPERT_COUNT_MISMATCH = "expert-count-mismatch"
    VALUES_NOT_READ = "values-not-read"
    SHARED_FUSION_VETOED = "shared-fusion-vetoed"
    SHARED_FUSION_ON = "shared-fusion-on"


FAULT_CODES = frozenset(c for c in AuditCode if c.value.startswith("F0"))


@dataclass
class AuditFinding:
    """One audit result: a code, a severity, what it concerns and a sentence."""

    code: AuditCode
    severity: Severity
    message: str
    tensors: list[str] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code.value, "severity": self.severity.value, "tensors": self.tensors,
                "layers": self.layers, "message": self.message, "details": self.details}
