"""Stage 00: what the study runs on (Python, packages, CPU, GPU and compute capability, free disk),
the preflight table and the plan of the run.

Notebook ``00_environment``. The probes live in :mod:`nvfp4study.core.environment` (the runner's
manifest uses them too); the preflight checks and the plan in :mod:`nvfp4study.workstation`. This
stage writes ``data/environment.json``, ``data/preflight.json`` and ``data/plan.json``.
"""

from __future__ import annotations

from typing import Any

from ..core import display
from ..core import environment as env
from ..core.files import write_json
from ..core.stage import Stage, open_stage_named
from ..serving.launch_env import engine_description
from ..workstation import plan, preflight

NOTEBOOK = "00_environment"
__all__ = ["markdown", "NOTEBOOK", "engine_table", "environment", "gpu_table", "machine_table",
           "open_stage", "package_table", "plan_table", "preflight_table"]


def open_stage(params_file: str = "", run_dir: str = "") -> Stage:
    """:func:`nvfp4study.core.stage.open_stage_named` for notebook ``00_environment``."""
    return open_stage_named(NOTEBOOK, params_file, run_dir)


def markdown(text: str) -> Any:
    """The notebook's Markdown output (:func:`nvfp4study.core.display.markdown`)."""
    return display.markdown(text)


def environment(stage: Stage) -> dict:
    """The environment record (:func:`nvfp4study.core.environment.collect`) plus the serving
    engine stages 04-07 use: on the CPU engine :func:`nvfp4study.serving.launch_env.engine_description`
    (what the ``sgl_kernel`` stand-in replaces, the in-memory patches, the flags and why, the served
    stand-in), else ``{"engine": "SGLang on a GPU"}``. Writes ``data/environment.json``."""
    info = env.collect(stage.params, stage.run_dir)
    info["serving_engine"] = engine_description(stage.params) or {
        "engine": "SGLang on a GPU (server.engine: gpu)", "summary": "SGLang on a GPU (server.engine: gpu)"}
    env.write_info(info, stage.paths.data("environment"))
    return info


def engine_table(info: dict):
    """What the serving engine replaces and patches, one row each (kind, name, why or file:line),
    from ``info["serving_engine"]``; empty for the GPU engine."""
    import pandas as pd

    e = info.get("serving_engine") or {}
    rows = [{"kind": "kernel op replaced by torch code", "name": op, "detail": "sgl_kernel stand-in"}
            for op in e.get("replaced_ops", [])]
    rows += [{"kind": "in-memory patch", "name": p["target"], "detail": p["why"]} for p in e.get("patches", [])]
    rows += [{"kind": "CPU flag", "name": f["flag"], "detail": f["why"]} for f in e.get("flags", [])]
    return pd.DataFrame(rows, columns=["kind", "name", "detail"])


def preflight_table(stage: Stage):
    """The preflight rows for this run's params (check, verdict, detail, fix) as a DataFrame;
    writes ``data/preflight.json``. A blocker here is what ``nvfp4study run`` stopped on (or
    was told to skip with ``--skip-preflight``)."""
    rows = preflight.preflight(stage.params, outputs=stage.run_dir)
    write_json(stage.paths.data("preflight"), {"rows": preflight.rows_as_dicts(rows),
                                               "blockers": len(preflight.blockers(rows))})
    return preflight.table(rows)


def plan_table(stage: Stage):
    """The server launches of this run with requests, tokens and estimated minutes from the
    card's load time and tok/s (labelled); writes ``data/plan.json``."""
    write_json(stage.paths.data("plan"), plan.summary(stage.params))
    return plan.table(stage.params)


def gpu_table(info: dict[str, Any]) -> Any:
    """GPUs of :func:`environment`'s record as a DataFrame (:func:`nvfp4study.core.environment.gpu_table`)."""
    return env.gpu_table(info)


def package_table(info: dict[str, Any]) -> Any:
    """Tracked packages and versions as a DataFrame (:func:`nvfp4study.core.environment.package_table`)."""
    return env.package_table(info)


def machine_table(info: dict[str, Any]) -> Any:
    """Python, CPU, memory, git commit and free disk (:func:`nvfp4study.core.environment.machine_table`)."""
    return env.machine_table(info)
