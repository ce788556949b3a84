"""Stage 01_quantize: what the notebook calls, one function per cell.

Plan (source and output), build or check the BF16 source, quantize with
:func:`nvfp4study.checkpoint.quantize.quantize_checkpoint`, measure the tool's behaviour on the Ling layout
(probes), round-trip a sample of experts, write ``data/quantize.json`` (read by 02) and record
the ledger rows of ``provenance.model-free-ptq`` / ``provenance.fused-maps`` plus the study's
findings, each decided by its rule (:mod:`~nvfp4study.stages.claim_rules.r01_quantize`). Every number shown comes from files this stage wrote in the run folder.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from ..checkpoint import generate, ptq, quantize, recipe, roundtrip
from ..checkpoint import layout as ling_layout
from ..core import display
from ..core.claim_rules import record_rules, rules_for
from ..core.errors import OutputExists, SourceCheckpointMissing, StageInputMissing
from ..core.files import atomic_write, write_json
from ..core.hub import CHECKPOINT_PATTERNS
from ..core.params import HubSource, Params
from ..core.paths import RunPaths
from ..core.stage import Stage, open_stage_named
from .claim_rules import r01_quantize as rules

NOTEBOOK = "01_quantize"


def open_stage(params_file: str = "", run_dir: str = "") -> Stage:
    """:func:`nvfp4study.core.stage.open_stage_named` for notebook ``01_quantize``."""
    return open_stage_named(NOTEBOOK, params_file, run_dir)


def markdown(text: str) -> Any:
    """The notebook's Markdown output (:func:`nvfp4study.core.display.markdown`)."""
    return display.markdown(text)

SOURCE_DIR = "source-bf16"
QUANTIZED_DIR = "quantized-nvfp4"
UNSHARED_DIR = "quantized-nvfp4-unshared"


def plan(params: Params, paths: RunPaths) -> dict[str, Any]:
    """Decide what the stage does.

    Returns ``{"action": "quantize"|"reuse"|"skip"|"card", "source_kind": "generate"|"path"|None,
    "source", "quantized", "reason"}``; skipping when ``checkpoint.quantized_path`` is set (that
    checkpoint is audited as given) or ``quantize.enabled`` is false; "card" with
    ``checkpoint.serve: card`` (:func:`build_source` downloads it and fills ``quantized``).

    Raises:
        SourceCheckpointMissing: ``checkpoint.source: path`` without ``source_path``, or
            ``checkpoint.serve: card`` without ``card_checkpoint``.
    """
    cp, qp = params.checkpoint, params.quantize
    src_kind = cp.source
    src = (cp.source_path if src_kind == "path" else str(paths.work(SOURCE_DIR)))
    if cp.quantized_path:
        return {"action": "skip", "source_kind": "path" if src_kind == "path" else None,
                "source": cp.source_path if src_kind == "path" else None, "quantized": cp.quantized_path,
                "reason": f"checkpoint.quantized_path is set: {cp.quantized_path} is used as given, no quantization"}
    if cp.serve == "card":
        if cp.card_checkpoint is None:
            raise SourceCheckpointMissing("checkpoint.serve is 'card' but checkpoint.card_checkpoint is not set")
        ref = f"hf:{cp.card_checkpoint.repo_id}@{cp.card_checkpoint.revision}"
        return {"action": "card", "source_kind": None, "source": None, "quantized": None, "card": ref,
                "reason": f"checkpoint.serve is card: the card's own checkpoint {ref} is downloaded, audited and "
                          "served, nothing is quantized (-p checkpoint.serve=ours quantizes the BF16 release instead)"}
    if not qp.enabled:
        return {"action": "skip", "source_kind": None, "source": None, "quantized": None,
                "reason": "quantize.enabled is false"}
    if src_kind == "path" and not cp.source_path:
        raise SourceCheckpointMissing("checkpoint.source is 'path' but checkpoint.source_path is not set")
    if src_kind == "hub":
        if cp.source_hub is None:
            raise SourceCheckpointMissing("checkpoint.source is 'hub' but checkpoint.source_hub is not set")
        src = f"hf:{cp.source_hub.repo_id}@{cp.source_hub.revision}"
    plan = {"action": "quantize", "source_kind": src_kind, "source": src,
            "quantized": str(paths.work(QUANTIZED_DIR)), "reason": "",
            "source_bytes": _source_bytes(params, src_kind, src)}
    plan["estimate_s"] = plan["source_bytes"] / (qp.assumed_mb_per_s * 1e6)
    earlier = _earlier_output(params, paths)
    if earlier and not qp.redo:
        plan.update(action="reuse", quantized=earlier["quantized"],
                    reason=f"this run folder already holds the output of an identical quantization "
                           f"(data/quantize.json, {earlier.get('seconds', 0):.0f} s then); "
                           "set quantize.redo=true to quantize again")
    return plan


def quantize_digest(params: Params) -> str:
    """sha256 of the params that decide the quantized bytes (the checkpoint and quantize
    sections, less the knobs that only change what is printed or re-done)."""
    data = {"checkpoint": params.checkpoint.model_dump(mode="json"),
            "quantize": params.quantize.model_dump(mode="json", exclude={"redo", "assumed_mb_per_s"})}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _earlier_output(params: Params, paths: RunPaths) -> dict[str, Any] | None:
    """This run's recorded quantization when it is complete and was made with the same params:
    ``data/quantize.json`` with the same :func:`quantize_digest`, its output folder holding
    ``config.json`` and every shard its index names. None otherwise."""
    f = paths.data("quantize", "json")
    try:
        rec = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    if rec.get("action") not in ("quantize", "reuse") or rec.get("params_digest") != quantize_digest(params):
        return None
    out = Path(rec.get("quantized") or "")
    try:
        shards = set(json.loads((out / "model.safetensors.index.json").read_text())["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError):
        shards = {q.name for q in out.glob("*.safetensors")}
    if not (out / "config.json").is_file() or not shards or not all((out / s).is_file() for s in shards):
        return None
    return rec


def _source_bytes(params: Params, kind: str, src: str) -> int:
    """Bytes of the BF16 source: on disk when it is there, else the layout's prediction."""
    if kind == "path" and Path(src).is_dir():
        return sum(q.stat().st_size for q in Path(src).glob("*.safetensors"))
    return sum(ling_layout.spec_nbytes(x) for x in ling_layout.tensor_specs(params.checkpoint.shape))


def plan_markdown(p: dict[str, Any]) -> str:
    """One paragraph saying what this stage will do and, before a quantization, how long it
    should take (source bytes / ``quantize.assumed_mb_per_s``, an assumption, said so)."""
    if p["action"] in ("skip", "card"):
        return f"**Quantization skipped**: {p['reason']}."
    if p["action"] == "reuse":
        return f"**Reusing** `{p['quantized']}`: {p['reason']}."
    what = ("a small BF16 checkpoint in the Ling-3.0-flash layout with **random weights** is generated"
            if p["source_kind"] == "generate" else f"the BF16 source `{p['source']}` is read (never written)")
    est = p.get("estimate_s")
    when = (f" About {p['source_bytes'] / 1e9:.2f} GB to read: about {_duration(est)} at the assumed "
            "`quantize.assumed_mb_per_s`." if est is not None else "")
    return (f"**Plan**: {what}, then quantized with llmcompressor's `model_free_ptq` (NVFP4A16) into "
            f"`{p['quantized']}`, and the serving rewrite is applied.{when}")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def _matches(ckpt: Path, params: Params) -> bool:
    try:
        cfg = json.loads((ckpt / "config.json").read_text())["_nvfp4study"]
    except (OSError, ValueError, KeyError):
        return False
    n_shards = len(list(ckpt.glob("*.safetensors")))
    return (cfg.get("seed") == params.checkpoint.seed and n_shards == params.checkpoint.shards
            and cfg.get("shape") == params.checkpoint.shape.model_dump(mode="json"))


def build_source(params: Params, paths: RunPaths, p: dict[str, Any]) -> dict[str, Any]:
    """Generate the Ling-layout source (or reuse an identical one from an earlier execution in
    this run folder), or check the given source. Returns path, tensors, bytes, shards, seconds.

    Raises:
        SourceCheckpointMissing: a given source is incomplete.
        OutputExists: the run's source folder exists with other params (not overwritten).
    """
    if p["action"] == "card":
        rec = fetch_hub(params.checkpoint.card_checkpoint, paths.data("card_checkpoint", "json"))
        p["quantized"] = rec["path"]  # what 02 audits and 04-07 serve (data/quantize.json)
        return {"path": None, "note": f"no BF16 source: the card's checkpoint {rec['repo_id']}@{rec['commit']} "
                f"is served ({rec['path']})", "hub": rec}
    if p["source"] is None:
        return {"path": None, "note": "no source: " + p["reason"]}
    src = Path(p["source"])
    t0 = time.monotonic()
    reused = False
    hub_record = None
    if p["source_kind"] == "hub":
        hub_record = fetch_hub_source(params, paths)
        src = Path(hub_record["path"])
        p["source"] = str(src)  # later steps (quantize, round trip) read the downloaded snapshot
    elif p["source_kind"] == "generate":
        if src.exists():
            if not _matches(src, params):
                raise OutputExists(f"{src} exists but was generated with other params; use a new run folder")
            reused = True
        else:
            generate.write_checkpoint(params.checkpoint.shape, src, shards=params.checkpoint.shards,
                                         seed=params.checkpoint.seed)
    info = quantize.check_source(src) if p["action"] == "quantize" else None
    specs = list(ling_layout.iter_header_specs(src))
    return {"path": str(src), "kind": p["source_kind"], "generated": p["source_kind"] == "generate",
            "reused": reused, "random_weights": p["source_kind"] == "generate", "hub": hub_record,
            "tensors": len(specs), "shards": len({s[0] for s in specs}),
            "bytes": info["safetensors_bytes"] if info else None, "seconds": time.monotonic() - t0}


#: what the quantizer needs of a BF16 Hub source, and SGLang of the card's checkpoint
SOURCE_PATTERNS = CHECKPOINT_PATTERNS


def fetch_hub_source(params: Params, paths: RunPaths) -> dict[str, Any]:
    """Download ``checkpoint.source_hub`` (:func:`fetch_hub`, recorded in ``data/source_hub.json``).

    Raises:
        HubError subclasses (unknown repo/revision, 401/403, no network, not cached offline).
    """
    return fetch_hub(params.checkpoint.source_hub, paths.data("source_hub", "json"))


def fetch_hub(hs: HubSource, rec_file: Path) -> dict[str, Any]:
    """Download ``hs`` (the files of :data:`SOURCE_PATTERNS`) with snapshot_download into the Hub
    cache (resumable; offline from the cache with HF_HUB_OFFLINE=1) and record ``rec_file``
    (repo_id, revision asked, commit, path). A re-run in the same run folder reuses the recorded
    commit, so a branch that moved does not change the run's checkpoint.

    Raises:
        HubError subclasses (unknown repo/revision, 401/403, no network, not cached offline).
    """
    from ..core import hub

    revision = hs.revision
    if rec_file.is_file():
        old = json.loads(rec_file.read_text())
        if old.get("repo_id") == hs.repo_id and old.get("revision") == hs.revision and old.get("commit"):
            revision = old["commit"]
    folder, commit = hub.download(hub.HubRef(hs.repo_id, revision), SOURCE_PATTERNS)
    rec = {"repo_id": hs.repo_id, "revision": hs.revision, "commit": commit, "path": str(folder),
           "endpoint": hub.endpoint(), "reused_commit": revision != hs.revision}
    write_json(rec_file, rec)
    return rec


def layout_table(params: Params) -> Any:
    """pandas DataFrame of :func:`nvfp4study.checkpoint.layout.layer_schedule` for the params' shape."""
    import pandas as pd

    return pd.DataFrame(ling_layout.layer_schedule(params.checkpoint.shape))


def ignore_table(params: Params) -> Any:
    """The card's ignore list with reasons and match counts on the params' layout."""
    shape = params.checkpoint.shape
    return recipe.ignore_table(ling_layout.tensor_specs(shape), shape.num_hidden_layers)


def run_quantize(params: Params, paths: RunPaths, p: dict[str, Any], source: dict[str, Any]) -> dict[str, Any]:
    """Quantize (replacing this run's earlier output, never an input) and write
    ``data/quantize.json``: ``{"source", "quantized", "action", "reason", ...report}``."""
    out = paths.data("quantize", "json")
    if p["action"] == "quantize":
        rep = quantize.quantize_checkpoint(p["source"], p["quantized"], params.quantize, overwrite=True)
        rep["random_weights"] = bool(source.get("random_weights"))
        rep["params_digest"] = quantize_digest(params)
    elif p["action"] == "reuse":
        return json.loads(out.read_text())  # recorded by the identical quantization (see plan)
    else:
        rep = {"source": p["source"], "quantized": p["quantized"]}
        if source.get("hub") and p["action"] == "card":
            rep["card_checkpoint"] = source["hub"]  # repo, commit, snapshot folder
    rep.update(action=p["action"], reason=p["reason"])
    write_json(out, rep)
    return rep


def counts_table(rep: dict[str, Any]) -> Any:
    """What was written: tensors, packed, scales, input scales, timing and MB/s."""
    import pandas as pd

    if rep.get("action") != "quantize":
        return pd.DataFrame([{"what": "quantization", "value": "skipped: " + rep.get("reason", "")}])
    c = rep["counts"]
    rows = [("tensors written", c["tensors"]), ("weight_packed (NVFP4 Linear)", c["weight_packed"]),
            ("  of which routed experts", c["expert_weight_packed"]), ("weight_scale (FP8 block scales)", c["weight_scale"]),
            ("weight_global_scale", c["weight_global_scale"]), ("input_global_scale (serving rewrite)", c["input_global_scale"]),
            ("tensors by dtype", json.dumps(c["by_dtype"])), ("shard file modes", ", ".join(c["shard_file_modes"])),
            ("model_free_ptq seconds", round(rep["ptq_seconds"], 2)),
            ("serving rewrite seconds", round(rep["rewrite_seconds"], 2)),
            ("total seconds", round(rep["total_seconds"], 2)),
            ("BF16 input MB (1e6 B)", round(rep["source_bytes"] / 1e6, 1)),
            ("MB/s of BF16 input (model_free_ptq)", round(rep["mb_per_s"], 1)),
            ("llmcompressor / compressed-tensors", f"{rep['llmcompressor']} / {rep['compressed_tensors']}"),
            ("device", rep["device"]), ("fused maps", rep["fused_maps"])]
    return pd.DataFrame(rows, columns=["what", "value"])


def probes(params: Params, paths: RunPaths, p: dict[str, Any]) -> dict[str, Any]:
    """Measure model_free_ptq's behaviour on the Ling layout (stop before quantizing), and,
    with ``quantize.compare_unshared``, quantize once more with both tables emptied and no
    gate/up rule. Writes ``data/quantize-probes.json`` and the gate/up tables (parquet)."""
    out = paths.data("quantize-probes", "json")
    if p["action"] == "reuse" and out.is_file():
        return json.loads(out.read_text())
    if p["action"] not in ("quantize", "reuse"):
        res = {"run": False, "reason": p["reason"]}
        write_json(out, res)
        return res
    qp = params.quantize
    ignore = quantize.card_ignore(params.checkpoint.shape.num_hidden_layers
                                  if p["source_kind"] == "generate" else
                                  json.loads((Path(p["source"]) / "config.json").read_text())["num_hidden_layers"])
    res: dict[str, Any] = {"run": True, "probes": {}}
    cases = [("stock_tables", "NVFP4A16", "stock"), ("dict_only_emptied", "NVFP4A16", "dict-emptied"),
             ("list_only_emptied", "NVFP4A16", "list-emptied"), ("both_emptied", "NVFP4A16", "empty"),
             ("w4a4_scheme_NVFP4", "NVFP4", "empty")]
    for key, scheme, fused in cases:
        with tempfile.TemporaryDirectory(prefix="probe-", dir=paths.work_dir) as td:
            spec = {"src": p["source"], "out": str(Path(td) / "out"), "scheme": scheme, "ignore": ignore,
                    "fused_maps": fused, "device": qp.device, "max_workers": qp.max_workers, "probe": True}
            r = ptq.run_ptq(spec, qp.python)
        res["probes"][key] = {k: r[k] for k in ("ok", "error_type", "error", "scheme", "fused_maps")}
    shared = quantize.gate_up_scales(p["quantized"])
    atomic_write(paths.data("gate-up-scales", "parquet", share="on"), lambda tmp: shared.to_parquet(tmp, index=False))
    res["shared"] = quantize.gate_up_summary(shared)
    res["global_scales_bf16_exact"] = _bf16_exact(shared)
    if qp.compare_unshared:
        dst = paths.work(UNSHARED_DIR)
        rep = quantize.quantize_checkpoint(p["source"], dst, qp.model_copy(update={"share_gate_up_global_scale": False}),
                                           overwrite=True)
        unshared = quantize.gate_up_scales(dst)
        atomic_write(paths.data("gate-up-scales", "parquet", share="off"), lambda tmp: unshared.to_parquet(tmp, index=False))
        res["unshared"] = quantize.gate_up_summary(unshared)
        m = shared.merge(unshared, on=["layer", "expert"], suffixes=("_shared", "_unshared"))
        import numpy as np

        res["shared_is_min_of_unshared"] = bool(len(m) and np.all(
            m["gate_shared"].to_numpy() == np.minimum(m["gate_unshared"], m["up_unshared"]).to_numpy()))
        res["unshared_mb_per_s"] = rep["mb_per_s"]
        shutil.rmtree(dst, ignore_errors=True)  # only the scales are needed; keep the work dir small
    write_json(out, res)
    return res


def _bf16_exact(df: Any) -> dict[str, Any]:
    """Fraction of global scales (gate and up) that are exactly representable in bfloat16."""
    import torch

    vals = torch.tensor(list(df["gate"]) + list(df["up"]), dtype=torch.float32)
    exact = vals.to(torch.bfloat16).to(torch.float32) == vals
    return {"values": int(vals.numel()), "bf16_exact": int(exact.sum())}


def probes_table(res: dict[str, Any]) -> Any:
    """One row per probe: accepted or the tool's exact error message."""
    import pandas as pd

    if not res.get("run"):
        return pd.DataFrame([{"probe": "all", "result": "not run: " + res.get("reason", "")}])
    return pd.DataFrame([{"probe": k, "scheme": v["scheme"], "fused tables": v["fused_maps"],
                          "accepted": v["ok"], "error": f"{v['error_type']}: {v['error']}" if v["error"] else ""}
                         for k, v in res["probes"].items()])


def gate_up_figure(paths: RunPaths, res: dict[str, Any]) -> Path | None:
    """Histogram of |gate - up| / max global scale per expert, shared vs unshared runs."""
    files = {k: paths.data("gate-up-scales", "parquet", share=k) for k in ("on", "off")}
    if not files["on"].exists():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    import pandas as pd

    frames = {k: pd.read_parquet(f) for k, f in files.items() if f.exists()}
    top = max(float(df["rel_diff"].max()) for df in frames.values()) * 100
    bins = np.linspace(0, max(top * 1.05, 1.0), 31)
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for k, label in (("off", "both tables emptied (no rule)"), ("on", "gate/up pairing rule")):
        if k in frames:
            df = frames[k]
            ax.hist(df["rel_diff"] * 100, bins=bins, alpha=0.7, label=f"{label}: {int(df['equal'].sum())}/{len(df)} equal")
    ax.set(xlabel="|gate - up| / max(gate, up) of weight_global_scale, %", ylabel="experts",
           title="gate/up global scales per routed expert (random weights)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = paths.figure("gate-up-global-scale")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_roundtrip(params: Params, paths: RunPaths, p: dict[str, Any]) -> dict[str, Any]:
    """Round trip on ``quantize.roundtrip_experts`` experts; writes ``data/roundtrip.parquet``
    and ``figures/roundtrip.png``. Needs both a source and a quantized checkpoint."""
    if not p["source"] or not p["quantized"]:
        return {"run": False, "reason": "needs both a BF16 source and a quantized checkpoint", "table": None}
    df = roundtrip.roundtrip(p["source"], p["quantized"], params.quantize.roundtrip_experts)
    data = paths.data("roundtrip", "parquet")
    atomic_write(data, lambda tmp: df.to_parquet(tmp, index=False))
    fig = roundtrip.figure(df, paths.figure("roundtrip")) if not df.empty else None
    return {"run": True, "table": df, "summary": roundtrip.summary(df), "data": str(data),
            "figure": str(fig) if fig else None}


def record_ledger(stage: Stage, rep: dict[str, Any], probe: dict[str, Any], rt: dict[str, Any]) -> Any:
    """Record the stage's claims and findings, each decided by its rule
    (:mod:`~nvfp4study.stages.claim_rules.r01_quantize`) from :func:`run_quantize`'s report,
    :func:`probes` and :func:`run_roundtrip`; returns the recorded rows as a DataFrame. A
    quantization that did not run records the claims "not run" with its reason, and no finding."""
    import pandas as pd

    x = rules.QuantizeMeasurements.gather(stage.paths, rep, probe, rt)
    record_rules(stage, x)
    if not x.quantized:
        return pd.DataFrame([{k: r.get(k) for k in ("id", "verdict", "note")} for r in _rows(stage.run_dir, stage.claims())])
    ids = stage.claims() + [r.id for r in rules_for(rules.QuantizeMeasurements, "finding")]
    return pd.DataFrame([{k: r.get(k) for k in ("id", "verdict", "measured", "note")} for r in _rows(stage.run_dir, ids)])


def _rows(run: Path, ids: list[str]) -> list[dict[str, Any]]:
    from ..core.ledger import read_ledger

    return [r for r in read_ledger(run) if r["id"] in ids]


def read_quantize_json(paths: RunPaths) -> dict[str, Any]:
    """``data/quantize.json`` of a run (for later stages).

    Raises:
        StageInputMissing: 01_quantize has not written it.
    """
    f = paths.data("quantize", "json")
    if not f.is_file():
        raise StageInputMissing(f"{f} missing: run 01_quantize first")
    return json.loads(f.read_text())


