"""What every notebook does first: resolve params and the run folder, then call the library.

A notebook's parameters cell holds two literals, ``params_file`` and ``run_dir``. The runner
passes the run's resolved params and its folder. Opened by hand in Jupyter (``run_dir`` empty),
:func:`open_stage` works in ``outputs/latest`` (the newest complete run, so a stage can read what
earlier stages wrote) with that run's own ``params.yaml``, and re-writes this stage's files there;
with no ``outputs/latest`` it starts a new run folder with ``params_file``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import ledger
from .display import display_options
from .errors import ParamsError
from .params import DEFAULT_PARAMS, Params, dump_params, load_params
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
        """:func:`nvfp4study.core.ledger.record` for this run."""
        return ledger.record(self.run_dir, claim_id, **kw)

    def not_run(self, reason: str, claim_ids: list[str] | None = None) -> list[str]:
        """Mark this stage's claims (or ``claim_ids``) "not run: <reason>"; returns the ids."""
        ids = self.claims() if claim_ids is None else claim_ids
        ledger.record_not_run(self.run_dir, ids, reason)
        return ids

    def add_finding(self, finding_id: str, **kw: Any) -> dict[str, Any]:
        """:func:`nvfp4study.core.ledger.add_finding` with this stage's name."""
        return ledger.add_finding(self.run_dir, finding_id, stage=self.name, **kw)


def open_stage_named(name: str, params_file: str = "", run_dir: str = "") -> Stage:
    """Resolve a stage's params and run folder.

    Args:
        name: the notebook's stem, e.g. ``"02_inspect_checkpoint"``.
        params_file: params YAML; ``""`` = the default profile.
        run_dir: the run folder; ``""`` = ``outputs/latest`` (with its own params) if it exists,
            else a new folder.

    Returns:
        A :class:`Stage` whose run folder has ``params.yaml`` and ``ledger.json``.

    Raises:
        ParamsError: invalid params, or non-default params for ``outputs/latest``.
        RunDirError: an unwritable folder.
    """
    params = load_params(params_file or None)
    latest = OUTPUTS / "latest"
    if run_dir:
        root = ensure_writable(Path(run_dir))
    elif latest.is_dir() and (latest / "params.yaml").is_file():
        root = latest.resolve()
        run_params = load_params(root / "params.yaml")
        if params_file and Path(params_file).resolve() != DEFAULT_PARAMS.resolve() \
                and params.digest() != run_params.digest():
            raise ParamsError(f"{params_file} differs from the params of {root}; set run_dir to a new "
                              "folder to run with them")
        params = run_params
    else:
        # No run yet: this folder becomes outputs/latest so the next notebook opened finds it.
        root = new_run_dir(params.profile, suffix="interactive")
        point_latest(root)
    display_options()
    paths = RunPaths(root)
    if not paths.params_file.exists():
        dump_params(params, paths.params_file)
    ledger.init_ledger(root)
    return Stage(name=name, params=params, paths=paths)


#: the name earlier code and tests use; each stage module's own ``open_stage`` fixes ``name``.
open_stage = open_stage_named
