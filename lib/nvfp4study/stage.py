"""What every notebook does first: resolve params and the run folder, then call the library.

A notebook's parameters cell holds two literals, ``params_file`` and ``run_dir``. The runner
passes the run's resolved params and its folder; opened by hand in Jupyter the defaults apply
(``../params/default.yaml`` and ``""``), and :func:`open_stage` then uses ``outputs/latest``
when it exists (so a stage can read what earlier stages wrote) or starts a new run folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import ledger
from .params import Params, dump_params, load_params
from .paths import OUTPUTS, RunPaths, ensure_writable, new_run_dir, point_latest


@dataclass
class Stage:
    """A stage's context: its name, validated params and run paths, plus ledger helpers."""

    name: str
    params: Params
    paths: RunPaths

    @property
    def run_dir(self) -> Path:
        return self.paths.root

    def claims(self) -> list[str]:
        """Ids of the card claims this stage tests."""
        return ledger.claims_for_stage(self.name)

    def record(self, claim_id: str, **kw: Any) -> dict[str, Any]:
        """:func:`nvfp4study.ledger.record` for this run."""
        return ledger.record(self.run_dir, claim_id, **kw)

    def not_run(self, reason: str, claim_ids: list[str] | None = None) -> list[str]:
        """Mark this stage's claims (or ``claim_ids``) "not run: <reason>"; returns the ids."""
        ids = self.claims() if claim_ids is None else claim_ids
        ledger.record_not_run(self.run_dir, ids, reason)
        return ids

    def add_finding(self, finding_id: str, **kw: Any) -> dict[str, Any]:
        """:func:`nvfp4study.ledger.add_finding` with this stage's name."""
        return ledger.add_finding(self.run_dir, finding_id, stage=self.name, **kw)


def open_stage(name: str, params_file: str = "", run_dir: str = "") -> Stage:
    """Resolve a stage's params and run folder.

    Args:
        name: the notebook's stem, e.g. ``"02_inspect_checkpoint"``.
        params_file: params YAML; ``""`` = the default profile.
        run_dir: the run folder; ``""`` = ``outputs/latest`` if it exists, else a new folder.

    Returns:
        A :class:`Stage` whose run folder has ``params.yaml`` and ``ledger.json``.

    Raises:
        ParamsError, RunDirError: invalid params or an unwritable folder.
    """
    params = load_params(params_file or None)
    if run_dir:
        root = ensure_writable(Path(run_dir))
    elif (OUTPUTS / "latest").is_dir():
        root = (OUTPUTS / "latest").resolve()
    else:
        root = new_run_dir(params.profile, suffix="interactive")
        point_latest(root)
    paths = RunPaths(root)
    if not paths.params_file.exists():
        dump_params(params, paths.params_file)
    ledger.init_ledger(root)
    return Stage(name=name, params=params, paths=paths)
