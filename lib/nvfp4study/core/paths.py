"""One object that builds every file name under ``outputs/<run-id>/``.

Layout of a run folder::

    outputs/<UTC-time>-<profile>/
        NN_<stage>.ipynb        executed notebooks
        html/NN_<stage>.html    the same without code (linked from report.html)
        data/                   JSON / JSONL / Parquet written by stages
        figures/                PNG figures
        work/                   large intermediates (checkpoints, SGLang copies)
        logs/                   server and tool logs
        params.yaml             the resolved params the run used
        manifest.json ledger.json report.html
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import RunDirError
from .params import REPO_ROOT

OUTPUTS = REPO_ROOT / "outputs"


def _slug(value: object) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", str(value)).strip("-")


@dataclass(frozen=True)
class RunPaths:
    """Paths inside one run folder; every stage builds its file names here."""

    root: Path

    def _sub(self, name: str) -> Path:
        p = self.root / name
        p.mkdir(parents=True, exist_ok=True)
        return p

    @property
    def data_dir(self) -> Path:
        return self._sub("data")

    @property
    def figures_dir(self) -> Path:
        return self._sub("figures")

    @property
    def work_dir(self) -> Path:
        return self._sub("work")

    @property
    def logs_dir(self) -> Path:
        return self._sub("logs")

    @property
    def html_dir(self) -> Path:
        return self._sub("html")

    @staticmethod
    def name(stem: str, ext: str, **config: object) -> str:
        """A file name that encodes its configuration: ``stem-k=v-k2=v2.ext``."""
        parts = [stem] + [f"{k}={_slug(v)}" for k, v in config.items()]
        return "-".join(parts) + "." + ext.lstrip(".")

    def data(self, stem: str, ext: str = "json", **config: object) -> Path:
        """``data/<stem>[-k=v...].<ext>`` (e.g. ``data("corruption", "jsonl", clamp="exact")``)."""
        return self.data_dir / self.name(stem, ext, **config)

    def figure(self, stem: str, **config: object) -> Path:
        """``figures/<stem>[-k=v...].png``."""
        return self.figures_dir / self.name(stem, "png", **config)

    def work(self, name: str) -> Path:
        """``work/<name>`` (not created: callers write it atomically)."""
        return self.work_dir / name

    def log(self, name: str) -> Path:
        return self.logs_dir / name

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.json"

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    @property
    def params_file(self) -> Path:
        return self.root / "params.yaml"

    @property
    def report(self) -> Path:
        return self.root / "report.html"


def new_run_dir(profile: str, outputs: Path | None = None, suffix: str = "") -> Path:
    """Create ``outputs/<UTC-time>-<profile>[-suffix]/`` and return it.

    Raises:
        RunDirError: the outputs folder cannot be created or written.
    """
    outputs = Path(outputs) if outputs else OUTPUTS
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    name = "-".join(p for p in (stamp, _slug(profile), suffix) if p)
    run = outputs / name
    n = 1
    while run.exists():
        n += 1
        run = outputs / f"{name}-{n}"
    try:
        run.mkdir(parents=True)
    except OSError as exc:
        raise RunDirError(f"cannot create run folder {run}: {exc.strerror or exc}") from exc
    return run


def ensure_writable(run: Path) -> Path:
    """Create ``run`` if needed and check we can write in it.

    Raises:
        RunDirError: not creatable or not writable.
    """
    try:
        run.mkdir(parents=True, exist_ok=True)
        probe = run / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise RunDirError(f"run folder {run} is not writable: {exc.strerror or exc}") from exc
    return run


def point_latest(run: Path, outputs: Path | None = None, name: str = "latest") -> None:
    """Make ``outputs/<name>`` (default ``latest``) a relative symlink to ``run``, replaced
    atomically (when ``run`` is under ``outputs``; else nothing is done)."""
    outputs = Path(outputs) if outputs else OUTPUTS
    link = outputs / name
    try:
        target = run.resolve().relative_to(outputs.resolve())
    except ValueError:
        return
    tmp = outputs / f".{name}.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(target)
    tmp.replace(link)
