"""Stage 05: generated-code corruption: the detector validated on real code, then the served study.

Notebook ``05_corruption``. Part 1 (:mod:`nvfp4study.codeeval.validation`) measures each
detection method's recall on HumanEval solutions with the card's kinds of junk injected; part 2
(:mod:`nvfp4study.codeeval.corruption`) serves the card's tasks before and after the clamp fix
and classifies every completion. The notebook reaches both through this module only.
"""

from __future__ import annotations

from ..codeeval import corruption as served
from ..codeeval import validation
from ..core.stage import Stage, open_stage_named

NOTEBOOK = "05_corruption"
__all__ = ["NOTEBOOK", "open_stage", "served", "validation"]


def open_stage(params_file: str = "", run_dir: str = "") -> Stage:
    """:func:`nvfp4study.core.stage.open_stage_named` for notebook ``05_corruption``."""
    return open_stage_named(NOTEBOOK, params_file, run_dir)
