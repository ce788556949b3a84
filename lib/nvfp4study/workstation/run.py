"""``nvfp4study run``: preflight first, then the study's runner (:mod:`nvfp4study.core.runner`).

``nvfp4study run [--skip-preflight] [runner options]``: the checks of
:func:`nvfp4study.workstation.preflight.preflight` run with the same ``--params`` and ``-p``
overrides; any blocker prints the table and exits 1 before a run folder or a stage exists.
Without a blocker, the plan's per-cell warnings (:func:`nvfp4study.workstation.plan.cell_warnings`:
a stage estimated near or past ``execution_timeout_s``) are printed before the run starts.
``--skip-preflight`` goes straight to the runner. The core runner cannot call preflight itself
(core imports no wing), hence this front door.
"""

from __future__ import annotations

import argparse
import sys

from ..core import runner


def main(argv: list[str]) -> int:
    """Preflight (unless ``--skip-preflight``), then :func:`nvfp4study.core.runner.main`.

    Returns 1 on a preflight blocker (nothing started), else the runner's exit status."""
    argv = list(argv)
    skip = "--skip-preflight" in argv
    argv = [a for a in argv if a != "--skip-preflight"]
    if "-h" in argv or "--help" in argv:
        print("nvfp4study run [--skip-preflight] ...: preflight checks first (a blocker stops the run "
              "before any stage); the runner's options follow.\n")
        return runner.main(argv)
    if not skip:
        from ..core.params import load_params
        from . import preflight

        ap = argparse.ArgumentParser(add_help=False)
        ap.add_argument("--params", default=None)
        ap.add_argument("-p", dest="overrides", action="append", default=[])
        known, _ = ap.parse_known_args(argv)
        rows = preflight.preflight(load_params(known.params, known.overrides))
        if preflight.blockers(rows):
            print(preflight.format_rows(rows), file=sys.stderr)
            print("nvfp4study run: stopped before any stage (fix the blockers, or --skip-preflight)",
                  file=sys.stderr)
            return 1
        print(f"preflight: {len(rows)} checks, no blocker")
        from . import plan

        for w in plan.summary(load_params(known.params, known.overrides))["warnings"]:
            print(f"plan: WARNING: {w}", file=sys.stderr)  # a warning, not a stop: the user may know better
    return runner.main(argv)
