"""What every notebook does first: resolve params and the run folder, then call the library.

A notebook's parameters cell holds two literals, ``params_file`` and ``run_dir``. The runner
passes the run's resolved params and its folder. Opened by hand in Jupyter (``run_dir`` empty),
a stage works in ``$NVFP4STUDY_RUN_DIR`` when set (one choice for every notebook), else in
``outputs/latest`` (the newest complete run, so a stage can read what earlier stages wrote), else
in ``outputs/interactive`` (an exploration run an earlier notebook began), else in a new folder;
an existing run keeps its own ``params.yaml``. The choice and its reason are printed first.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import ledger, runlock
from .display import display_options
from .errors import ParamsError
from .params import DEFAULT_PARAMS, REPO_ROOT, Params, dump_params, load_params
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


#: environment variable naming the run folder every notebook opened by hand works in.
RUN_ENV = "NVFP4STUDY_RUN_DIR"
#: ``outputs/interactive``: the exploration run a notebook started (``latest`` stays for complete runs).
INTERACTIVE = "interactive"


def _from_repo(path: str) -> Path:
    """A user-given run folder; relative paths are taken from the repository root (not from
    ``notebooks/``, where Jupyter and papermill run the notebooks)."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else REPO_ROOT / p


@dataclass
class RunChoice:
    """Which run folder and params a stage uses, and why (echoed in the notebook's first output)."""

    root: Path
    params: Params
    why_run: str
    why_params: str
    note: str = ""

    def describe(self) -> str:
        text = f"run folder: {self.root}  ({self.why_run})\nparams: {self.why_params}"
        return text + (f"\n{self.note}" if self.note else "")


def _existing_run(root: Path, params: Params, params_file: str, why: str) -> RunChoice:
    """Use ``root``'s own ``params.yaml``; refuse other explicit params rather than mix them in."""
    run_params = load_params(root / "params.yaml")
    note = ""
    if params.digest() != run_params.digest():
        if params_file and Path(params_file).resolve() != DEFAULT_PARAMS.resolve():
            raise ParamsError(f"{params_file} differs from the params of {root}; set run_dir (or "
                              f"${RUN_ENV}) to a new folder to run with them")
        note = (f"note: {DEFAULT_PARAMS.relative_to(REPO_ROOT)} differs from this run's params.yaml; "
                f"the run's own params are used (set ${RUN_ENV} or run_dir to a new folder to use yours)")
    return RunChoice(root, run_params, why, f"{root / 'params.yaml'} (the run's own)", note)


def choose_run(params_file: str = "", run_dir: str = "", outputs: Path | None = None) -> RunChoice:
    """Decide the run folder and params of a stage, in this order:

    1. ``run_dir`` (the notebook parameter; the runner always sets it) with ``params_file``;
    2. ``$NVFP4STUDY_RUN_DIR``: one choice for every notebook opened by hand; an existing run
       keeps its own params, a new folder takes ``params_file``;
    3. ``outputs/latest``, the newest complete run, with its own params;
    4. ``outputs/interactive``, an exploration run an earlier notebook started;
    5. a new ``outputs/<time>-<profile>-interactive`` folder, which becomes ``outputs/interactive``
       (never ``latest``: that moves only when a whole run completes).

    Relative folders are taken from the repository root.

    Raises:
        ParamsError: invalid params, or explicit non-default params for an existing run.
        RunDirError: an unwritable folder.
    """
    outputs = Path(outputs) if outputs else OUTPUTS
    params = load_params(params_file or None)
    source = str(Path(params_file).resolve()) if params_file else str(DEFAULT_PARAMS)
    if run_dir:
        root = ensure_writable(_from_repo(run_dir))
        return RunChoice(root, params, "the notebook's run_dir parameter", source)
    env = os.environ.get(RUN_ENV, "").strip()
    if env:
        root = ensure_writable(_from_repo(env))
        if (root / "params.yaml").is_file():
            return _existing_run(root, params, params_file, f"${RUN_ENV}")
        return RunChoice(root, params, f"${RUN_ENV} (a new folder)", source)
    for name, why in (("latest", "outputs/latest: the newest complete run"),
                      (INTERACTIVE, "outputs/interactive: the exploration run a notebook started")):
        link = outputs / name
        if link.is_dir() and (link / "params.yaml").is_file():
            return _existing_run(link.resolve(), params, params_file, why)
    root = new_run_dir(params.profile, outputs=outputs, suffix="interactive")
    point_latest(root, outputs, name=INTERACTIVE)
    return RunChoice(root, params, "a new exploration run (now outputs/interactive)", source)


def open_stage_named(name: str, params_file: str = "", run_dir: str = "", *, quiet: bool = False) -> Stage:
    """Resolve a stage's params and run folder (:func:`choose_run`) and print the choice.

    Args:
        name: the notebook's stem, e.g. ``"02_inspect_checkpoint"``.
        params_file: params YAML; ``""`` = the default profile.
        run_dir: the run folder; ``""`` = decided by :func:`choose_run`.
        quiet: do not print the choice (the report, whose output is the document).

    Returns:
        A :class:`Stage` whose run folder has ``params.yaml`` and ``ledger.json``.

    Raises:
        ParamsError: invalid params, or non-default params for an existing run.
        RunDirError: an unwritable folder.
        RunLocked: another ``nvfp4study run`` is writing into the folder.
    """
    choice = choose_run(params_file, run_dir)
    runlock.check(choice.root)
    if not quiet:
        print(choice.describe())
    display_options()
    paths = RunPaths(choice.root)
    if not paths.params_file.exists():
        dump_params(choice.params, paths.params_file)
    ledger.init_ledger(choice.root)
    return Stage(name=name, params=choice.params, paths=paths)


#: the name earlier code and tests use; each stage module's own ``open_stage`` fixes ``name``.
open_stage = open_stage_named
