"""Stage 00: what the study runs on (Python, packages, CPU, GPU and compute capability, free disk).

Notebook ``00_environment``. The probes live in :mod:`nvfp4study.core.environment` (the runner's
manifest uses them too); this stage writes ``data/environment.json`` and shows the tables.
"""

from __future__ import annotations

from ..core.environment import collect, gpu_table, machine_table, package_table, write_info
from ..core.stage import Stage, open_stage_named

NOTEBOOK = "00_environment"
__all__ = ["NOTEBOOK", "collect", "gpu_table", "machine_table", "open_stage", "package_table", "write_info"]


def open_stage(params_file: str = "", run_dir: str = "") -> Stage:
    """:func:`nvfp4study.core.stage.open_stage_named` for notebook ``00_environment``."""
    return open_stage_named(NOTEBOOK, params_file, run_dir)
