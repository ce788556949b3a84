"""Stage 00: what the study runs on (Python, packages, CPU, GPU and compute capability, free disk),
the preflight table and the plan of the run.

Notebook ``00_environment``. The probes live in :mod:`nvfp4study.core.environment` (the runner's
manifest uses them too); the preflight checks and the plan in :mod:`nvfp4study.workstation`. This
stage writes ``data/environment.json``, ``data/preflight.json`` and ``data/plan.json``.
"""

from __future__ import annotations

from ..core.display import markdown  # noqa: F401  (for the notebook)
from ..core.environment import collect, gpu_table, machine_table, package_table, write_info
from ..core.files import write_json
from ..core.stage import Stage, open_stage_named
from ..workstation import plan, preflight

NOTEBOOK = "00_environment"
__all__ = ["markdown", "NOTEBOOK", "collect", "gpu_table", "machine_table", "open_stage", "package_table",
           "plan_table", "preflight_table", "write_info"]


def open_stage(params_file: str = "", run_dir: str = "") -> Stage:
    """:func:`nvfp4study.core.stage.open_stage_named` for notebook ``00_environment``."""
    return open_stage_named(NOTEBOOK, params_file, run_dir)


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
