"""Audit a quantized checkpoint from its safetensors headers, index and config.json.

Reads only headers (:mod:`nvfp4study.checkpoint.header`), the index and ``config.json``, plus
the ``[1]`` float32 global scales where a check needs values (through ``safetensors.safe_open``).
On the real Ling-3.0-flash NVFP4 checkpoint (about 245k tensors, 76 GB) this is a few MB of I/O.

What it reports (:class:`AuditReport`): a per-tensor and per-module table, the precision table
by component (the model card's rows, derived from the files), packed / scale / plain tensor
counts per layer, the MTP layer's state, which scheme SGLang would apply to every module
against what is stored, ``input_global_scale`` presence and finiteness per expert, gate/up
global-scale agreement per expert and the up_proj scale error SGLang's W4A4 scheme would apply,
all-identical global scales, the routing shape against FlashInfer's grouped-routing limits,
W4A4 vs W4A16 and which SGLang release / GPU generation serves it, the counts with the formulas
that give the real model's numbers, and a list of :class:`AuditFinding`.

Fault verdicts (one line each in :mod:`.findings`, in full in ``docs/faults.md``): F-01 missing
or non-finite activation scales ``F01-*``, F-02 MTP layer missing / BF16 not ignored / packed but
ignored ``F02-*``, F-03 MTP experts in another FP4 format ``F03-*``, F-04 weight-only config
``F04-config-w4a16`` (vs ``config-w4a4``), F-05 routing shape ``F05-*`` (over / at / invalid).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import CheckpointConfigError, QuantizationConfigMissing
from . import quant_rules as qr
from .check_config import check_clamp_lists, check_config, check_routing_shape, check_shared_fusion
from .check_modules import apply_schemes, check_counts, check_mismatches, check_mtp, count_formulas
from .check_scales import check_scales
from .findings import FAULT_CODES, AuditCode, AuditFinding, Severity
from .header import CheckpointHeaders, read_checkpoint_headers
from .modules import CARD_ROWS, PACKED_FORMATS, CheckpointModule, build_modules, build_tables
from .reader import Reader
from .validate import check_config_fields, config_from_bytes

__all__ = ["CARD_ROWS", "FAULT_CODES", "AuditReport", "AuditCode", "AuditFinding", "Severity", "audit_checkpoint",
           "count_formulas", "format_findings", "load_config", "main", "plot_layer_heatmap", "plot_up_scale_error"]


# --- the audit -----------------------------------------------------------------------------------
def load_config(root: str | Path, reader: Reader | None = None) -> dict[str, Any]:
    """``config.json`` of a checkpoint folder (or read through ``reader``), which must carry
    ``quantization_config``.

    Every field the audit reads is checked by type and range first
    (:func:`nvfp4study.checkpoint.validate.config_from_bytes`).

    Raises:
        CheckpointConfigError: missing, unreadable, too large or deep, not a JSON object, or
            without integer ``num_hidden_layers`` / ``num_experts`` (the audit needs the layer
            and expert counts).
        ConfigFieldInvalid: a field of the wrong type or range (e.g. ``hidden_size: "256"``,
            ``quantization_config.ignore: 5``, a limit list given as a string).
        QuantizationConfigMissing: no (or an empty) ``quantization_config``.
    """
    path = Path(reader.where("config.json")) if reader is not None else Path(root) / "config.json"
    try:
        raw = reader.read_small("config.json") if reader is not None else path.read_bytes()
    except FileNotFoundError:
        raise CheckpointConfigError(path, "config.json not found") from None
    except OSError as exc:
        raise CheckpointConfigError(path, f"not readable: {exc.strerror or exc}") from None
    cfg = config_from_bytes(path, raw, check=False)
    if not cfg.get("quantization_config"):
        raise QuantizationConfigMissing(path, "no quantization_config: not a quantized checkpoint "
                                        "(audit the output of `nvfp4study quantize`)")
    check_config_fields(path, cfg)
    if not isinstance(cfg.get("num_experts"), int):
        raise CheckpointConfigError(path, f"num_experts missing or not a non-negative integer (got {cfg.get('num_experts')!r})")
    return cfg


@dataclass
class AuditReport:
    """Everything the audit derived. ``to_json()`` is what ``data/checkpoint_audit.json`` holds."""

    path: str
    config_summary: dict[str, Any]
    findings: list[AuditFinding]
    modules: dict[str, CheckpointModule]
    headers: CheckpointHeaders
    precision_table: list[dict[str, Any]]
    layer_counts: list[dict[str, Any]]
    counts: dict[str, Any]
    mtp: list[dict[str, Any]]
    input_scales: dict[str, Any]
    gate_up: list[dict[str, Any]]
    gate_up_summary: dict[str, Any]
    routing: dict[str, Any]
    serving: list[dict[str, Any]]
    size: dict[str, Any]
    timings: dict[str, float]
    extra: dict[str, Any] = field(default_factory=dict)  # what a caller adds (e.g. real-size formulas)

    @property
    def errors(self) -> list[AuditFinding]:
        return [f for f in self.findings if f.severity == Severity.ERROR]

    def codes(self) -> set[str]:
        return {f.code.value for f in self.findings}

    def fault_findings(self) -> list[AuditFinding]:
        return [f for f in self.findings if f.code in FAULT_CODES]

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path, "config": self.config_summary,
            "findings": [f.to_dict() for f in self.findings],
            "precision_table": self.precision_table, "layer_counts": self.layer_counts,
            "counts": self.counts, "mtp": self.mtp, "input_scales": self.input_scales,
            "gate_up_summary": self.gate_up_summary, "routing": self.routing, "serving": self.serving,
            "size": self.size, "timings_s": self.timings,
        }

    def tensor_rows(self) -> list[dict[str, Any]]:
        """One row per tensor: name, shard, dtype, shape, nbytes, layer, module, param, component,
        expert, proj, format (of its module), storage (packed / scale / plain), engine scheme."""
        rows = []
        for m in self.modules.values():
            for p, t in m.params.items():
                storage = ("packed" if p in ("weight_packed", "weight") else "scale") if m.packed else "plain"
                rows.append({"name": t.name, "shard": t.shard, "dtype": t.dtype, "shape": str(list(t.shape)),
                             "nbytes": t.nbytes, "layer": m.layer, "module": m.name, "param": p,
                             "component": m.component, "expert": m.expert, "proj": m.proj, "format": m.fmt,
                             "storage": storage, "engine_scheme": m.engine or "", "engine_note": m.engine_note})
        return rows


def audit_checkpoint(path: str | Path, *, read_values: bool = True, allow_missing_data: bool = False,
                     reader: Reader | None = None) -> AuditReport:
    """Audit a quantized checkpoint folder from its headers, index and config.

    Args:
        path: the checkpoint folder (config.json + shards [+ model.safetensors.index.json]).
        read_values: read the ``[1]`` F32 global scales (needed for finiteness, gate/up and
            copied-scale checks); False skips them.
        allow_missing_data: accept shards whose data section is absent (header-only layouts);
            implies ``read_values=False`` when a shard has no data.
        reader: where the bytes come from (default: the folder ``path``); a
            :class:`~.remote.HubReader` audits a Hub revision by range requests, same checks.

    Returns:
        The :class:`AuditReport`.

    Raises:
        CheckpointFileError subclasses (named in errors.py): truncated shard, header
        length beyond file size, invalid header JSON, unknown dtype, index naming a missing
        shard or tensor, missing config.json, config without quantization_config.
    """
    was_enabled = gc.isenabled()
    gc.disable()  # ~250k small objects: the cyclic collector would rescan them over and over
    try:
        return _audit(Path(path), read_values, allow_missing_data, reader)
    finally:
        if was_enabled:
            gc.enable()


def _audit(root: Path, read_values: bool, allow_missing_data: bool, reader: Reader | None) -> AuditReport:
    t0 = time.perf_counter()
    headers = read_checkpoint_headers(root, allow_missing_data=allow_missing_data, reader=reader)
    config = load_config(root, reader)
    t1 = time.perf_counter()
    qc = config["quantization_config"]
    groups = qr.parse_groups(qc)
    ignore = [str(i) for i in (qc.get("ignore") or [])]
    nl = int(config["num_hidden_layers"])
    nn = int(config.get("num_nextn_predict_layers") or 0)
    findings: list[AuditFinding] = []
    if headers.duplicates:
        findings.append(AuditFinding(AuditCode.DUPLICATE_TENSOR, Severity.ERROR, f"{len(headers.duplicates)} tensors occur in more than one shard",
                                sorted(headers.duplicates), details={"shards": headers.duplicates}))
    if headers.unlisted:
        findings.append(AuditFinding(AuditCode.INDEX_UNLISTED_TENSOR, Severity.WARNING,
                                f"{len(headers.unlisted)} tensors are in shards but not in the index weight_map", headers.unlisted))
    modules = build_modules(headers)
    config_summary = check_config(config, groups, findings)
    scheme = config_summary["scheme"]
    apply_schemes(modules, ignore, groups, findings)
    trunk = Counter(m.fmt for m in modules.values() if m.component == "routed_expert" and m.layer < nl and m.fmt in PACKED_FORMATS)
    trunk_fmt = trunk.most_common(1)[0][0] if trunk else None
    check_mismatches(modules, groups, set(range(nl, nl + nn)), trunk_fmt, findings)
    mtp = check_mtp(modules, config, ignore, trunk_fmt, findings)
    t2 = time.perf_counter()
    values = read_values and headers.data_complete
    input_scales, gate_up, gsum = check_scales(modules, headers, scheme, values, findings)
    t3 = time.perf_counter()
    routing = check_routing_shape(config, findings)
    shared = None if not gate_up else gsum["mismatched"] == 0
    config_summary.update(clamp_lists=check_clamp_lists(config, findings),
                          shared_fusion=check_shared_fusion(config, ignore, findings),
                          context={"max_position_embeddings": config.get("max_position_embeddings"),
                                   "rope_scaling": config.get("rope_scaling")},
                          num_hidden_layers=nl, num_nextn_predict_layers=nn, trunk_expert_format=trunk_fmt,
                          random_weights=bool(config.get("_nvfp4study")))
    precision_table, layer_counts = build_tables(modules, nl, nn)
    counts = check_counts(modules, config, findings, scheme)
    size = {"file_bytes": headers.file_bytes, "data_bytes": headers.data_bytes,
            "header_bytes": sum(s.header_len + 8 for s in headers.shards.values()),
            "shards": len(headers.shards), "data_complete": headers.data_complete,
            "gb": headers.file_bytes / 1e9}
    sev_rank = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
    findings.sort(key=lambda f: (sev_rank[f.severity], f.code.value))
    t4 = time.perf_counter()
    return AuditReport(reader.label if reader is not None else str(root), config_summary, findings, modules, headers, precision_table, layer_counts, counts,
                       mtp, input_scales, gate_up, gsum, routing, qr.serving_matrix(scheme, shared, config.get("hidden_size"), config.get("moe_intermediate_size")), size,
                       {"headers": t1 - t0, "schemes": t2 - t1, "values": t3 - t2, "tables": t4 - t3, "total": t4 - t0})


# --- figures and output -----------------------------------------------------------------------
def plot_layer_heatmap(report: AuditReport, out: str | Path) -> Path:
    """Heatmap: packed e2m1 weights, their scale tensors and plain tensors per layer (counts;
    colour on a log scale). Writes a PNG and returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import seaborn as sns
    from matplotlib.colors import LogNorm

    rows = [r for r in report.layer_counts if r["layer"] != "non-layer"]
    kinds = ["packed", "scale", "plain"]
    data = np.array([[r[k] for r in rows] for k in kinds], dtype=float)
    labels = [f"{r['layer']}{'*' if r['mtp'] else ''}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(8.0, 0.45 * len(rows) + 2), 2.8))
    sns.heatmap(np.where(data > 0, data, np.nan), ax=ax, annot=len(rows) <= 24, fmt=".0f", cmap="viridis",
                norm=LogNorm(vmin=1, vmax=max(1.0, float(data.max()))), xticklabels=labels, yticklabels=kinds,
                cbar_kws={"label": "tensors (log)"})
    ax.set_xlabel("layer (* = MTP)")
    ax.set_title("Tensors per layer: packed FP4 weights / their scales / plain")
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_up_scale_error(report: AuditReport, out: str | Path) -> Path:
    """Histogram of ``up/gate - 1`` per expert: the relative error SGLang's W4A4 scheme puts on
    up_proj by dequantizing it with the gate's global scale. Writes a PNG and returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    errs = [r["up_scale_error"] for r in report.gate_up]
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    if errs:
        ax.hist(errs, bins=min(60, max(10, len(errs) // 4)), color="#4c72b0")
        ax.axvline(0, color="k", lw=0.8)
    else:
        ax.text(0.5, 0.5, "no gate/up pairs with values", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("up_proj scale error = up_global_scale / gate_global_scale - 1")
    ax.set_ylabel("experts")
    s = report.gate_up_summary
    ax.set_title(f"Gate/up global scales: {s.get('mismatched', 0)} of {s.get('pairs', 0)} experts differ")
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def format_findings(findings: list[AuditFinding], limit: int = 6) -> str:
    """Human-readable findings, one block each, at most ``limit`` tensor names shown."""
    lines = []
    for f in findings:
        lines.append(f"[{f.severity.value:7}] {f.code.value}: {f.message}")
        if f.tensors:
            more = f" ... (+{len(f.tensors) - limit})" if len(f.tensors) > limit else ""
            lines.append("          " + ", ".join(f.tensors[:limit]) + more)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``nvfp4study audit-checkpoint PATH [--json] [--headers-only]``.

    Returns 0 when no finding has severity error, 1 when one has. Through :func:`nvfp4study.cli.main`
    a named input error (a damaged or mistyped file) exits 2 and an internal error 3.
    """
    ap = argparse.ArgumentParser(
        prog="nvfp4study audit-checkpoint",
        description="Audit a quantized (compressed-tensors NVFP4) checkpoint from its safetensors "
                    "headers, index and config.json. Exit status: 0 no error finding, 1 a finding of "
                    "severity error, 2 usage error or unusable input (a named error, one line), "
                    "3 internal error (please report).",
        epilog="example: nvfp4study audit-checkpoint outputs/latest/work/quantized-nvfp4 --json",
    )
    ap.add_argument("path", help="checkpoint folder (config.json, *.safetensors, index), or hf:OWNER/NAME[@REV] "
                    "for a Hub revision read by range requests (HF_ENDPOINT, HF_TOKEN; HF_HUB_OFFLINE=1: the cache)")
    ap.add_argument("--json", action="store_true", help="print the findings as a JSON list")
    ap.add_argument("--headers-only", action="store_true",
                    help="do not read scale values; accept shards without a data section")
    args = ap.parse_args(argv)
    from .hub_audit import open_target, traffic_line

    path, reader, _source = open_target(args.path)
    rep = audit_checkpoint(path, read_values=not args.headers_only, allow_missing_data=args.headers_only, reader=reader)
    if reader is not None:
        print(traffic_line(reader, rep.size["file_bytes"]), file=sys.stderr)
    if args.json:
        print(json.dumps([f.to_dict() for f in rep.findings], indent=1))
    else:
        m = rep.counts["measured"]
        print(f"{rep.path}: {m['total_tensors']} tensors in {rep.size['shards']} shards, "
              f"{rep.size['gb']:.3f} GB; scheme {rep.config_summary['scheme']}; "
              f"{m['quantized_expert_modules']} quantized expert projections; "
              f"audit {rep.timings['total']:.2f} s")
        print(format_findings(rep.findings))
    return 1 if rep.errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
