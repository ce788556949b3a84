"""Run the study: the ordered notebooks under ``notebooks/`` executed with papermill.

``nvfp4study run [--params FILE] [--only 02,05] [--from 03] [-p k=v] [--run-dir DIR]``

Per run folder (see :mod:`nvfp4study.core.paths`): executed ``NN_*.ipynb``, ``html/`` copies
without code, ``data/``, ``figures/``, ``params.yaml``, ``manifest.json``, ``ledger.json`` and
``report.html`` (``99_report`` converted with nbconvert, no input cells).

A cell error or a cell timeout fails the run: papermill turns a cell's error output into
``PapermillExecutionError`` (papermill ``execute.py`` 200-230), but a timeout is nbclient's
``CellTimeoutError`` (nbclient ``client.py`` 791, 856), raised before any error output is
written, so the saved notebook does not show it; both are caught here.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import secrets
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from . import environment, ledger, runlock
from .errors import NotebookFailed, ParamsError, ResultParamsChanged, RunDirError, StudyError
from .files import atomic_write, write_json
from .params import REPO_ROOT, Params, dump_params, load_params
from .params_keys import OPERATIONAL_KEYS, result_changes
from .paths import OUTPUTS, RunPaths, ensure_writable, new_run_dir, point_latest

NOTEBOOK_DIR = REPO_ROOT / "notebooks"
REPORT_NOTEBOOK = "99_report"


def notebooks(notebook_dir: Path = NOTEBOOK_DIR) -> list[Path]:
    """The study's notebooks, ``NN_name.ipynb``, in order."""
    return sorted(p for p in notebook_dir.glob("[0-9][0-9]_*.ipynb"))


def select(all_nbs: list[Path], only: str | None = None, start: str | None = None) -> list[Path]:
    """Pick notebooks by number prefix: ``only="02,05"`` or ``start="03"`` (inclusive).

    Raises:
        ParamsError: a prefix that names no notebook.
    """
    prefixes = {p.name[:2]: p for p in all_nbs}

    def _check(tok: str) -> str:
        tok = tok.strip()
        key = tok.zfill(2)
        if not tok.isdigit() or key not in prefixes:
            raise ParamsError(f"no notebook numbered {tok!r}; have {', '.join(prefixes)}")
        return key

    chosen = all_nbs
    if only:
        wanted = {_check(t) for t in only.split(",") if t.strip()}
        chosen = [p for p in chosen if p.name[:2] in wanted]
    if start:
        s = _check(start)
        chosen = [p for p in chosen if p.name[:2] >= s]
    if not chosen:
        raise ParamsError(f"--only {only!r} with --from {start!r} selects no notebook")
    return chosen


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")




def _previous_manifest(root: Path, params: Params) -> dict[str, Any]:
    """The manifest of a run folder being continued ({} for a new folder).

    Only result keys must match (:func:`nvfp4study.core.params_keys.result_changes`): a changed
    time-out, port, concurrency, launcher, environment or interpreter path continues the run.

    Raises:
        ResultParamsChanged: the folder's earlier stages ran with other result params (their
            files would not match the new ones); names each key, old and new value.
    """
    path = RunPaths(root).manifest
    if not path.is_file():
        return {}
    previous = json.loads(path.read_text())
    if isinstance(previous.get("params"), dict):
        changed = result_changes(previous["params"], params)
    else:  # a manifest without its params: only the hash can be compared
        changed = [f"params hash: {previous['params_hash']} -> {params.digest()}"] \
            if previous.get("params_hash") not in (None, params.digest()) else []
    if changed:
        raise ResultParamsChanged(f"{root} was run with other params: {'; '.join(changed)}. Only "
                                  f"operational keys ({', '.join(OPERATIONAL_KEYS)}) may change when a run is "
                                  "continued: continue it with the same result params, or use a new run folder")
    return previous


def kernel_socket_prefix() -> str:
    """A new, unique path prefix for one kernel's five ipc sockets (``<prefix>-<n>``).

    In the temp folder; where that folder's path is too long for a unix socket (``sun_path`` holds
    108 bytes on Linux, 104 on macOS), a relative name in the working folder instead, of the pattern
    jupyter_client's own default has there (``.gitignore`` lists ``kernel-*-ipc-*``).
    """
    tag = secrets.token_hex(6)  # as quantize names its temporary folder
    prefix = os.path.join(tempfile.gettempdir(), f"nvfp4study-kernel-{tag}")
    return prefix if len(os.fsencode(prefix)) + 3 < 100 else f"kernel-{tag}-ipc"


def _ipc_kernel_manager():
    """A kernel manager on local IPC sockets: no TCP ports, and no ipykernel warning about
    unencrypted TCP printed once per notebook.

    Each manager's sockets get a path prefix of their own in the temp folder. jupyter_client's
    default prefix is ``kernel-ipc`` in the working folder, numbered from the socket files already
    there (``jupyter_client/connect.py`` 149): two kernels started at once in one folder (two
    notebooks in ``notebooks/``, two test workers) drew the same numbers before either kernel had
    bound them, and zmq's bind of an ipc path takes over a socket file already there.
    """
    from jupyter_client.manager import AsyncKernelManager

    class IPCKernelManager(AsyncKernelManager):
        def __init__(self, **kw: Any) -> None:
            kw.setdefault("transport", "ipc")
            kw.setdefault("ip", kernel_socket_prefix())
            super().__init__(**kw)

    return IPCKernelManager


def execute_notebook(nb: Path, out: Path, params_file: Path, run_dir: Path, timeout_s: int) -> None:
    """Execute one notebook with papermill into ``out``.

    Raises:
        NotebookFailed: a cell raised, a cell timed out, or the kernel died.
    """
    import papermill as pm
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    # Batch runs report progress per notebook; progress bars would land in the notebooks as
    # stderr boxes. Set by the caller's environment to keep them.
    os.environ.setdefault("TQDM_DISABLE", "1")

    try:
        pm.execute_notebook(
            str(nb), str(out),
            parameters={"params_file": str(params_file), "run_dir": str(run_dir)},
            kernel_name="python3", cwd=str(nb.parent), execution_timeout=timeout_s,
            progress_bar=False, log_output=False, kernel_manager_class=_ipc_kernel_manager(),
        )
    except pm.PapermillExecutionError as exc:
        raise NotebookFailed(nb.stem, exc.cell_index, exc.ename, exc.evalue) from None
    except CellTimeoutError as exc:
        raise NotebookFailed(nb.stem, None, "CellTimeoutError", f"a cell ran over {timeout_s} s: {exc}") from None
    except DeadKernelError as exc:
        raise NotebookFailed(nb.stem, None, "DeadKernelError", str(exc)) from None


def to_html(executed: Path, out: Path) -> Path:
    """Convert an executed notebook to HTML without code cells (nbconvert, lab template)."""
    import nbformat
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab", exclude_input=True, exclude_input_prompt=True,
                            exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nbformat.read(str(executed), as_version=4))
    return atomic_write(out, lambda tmp: tmp.write_text(body, encoding="utf-8"))


def run_study(
    params_path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    only: str | None = None,
    start: str | None = None,
    run_dir: str | Path | None = None,
    outputs: Path | None = None,
    notebook_dir: Path = NOTEBOOK_DIR,
    echo=print,
) -> tuple[Path, dict[str, Any]]:
    """Validate params, then execute the selected notebooks in order into one run folder.

    Args:
        params_path: params YAML (None = ``params/default.yaml``).
        overrides: ``dotted.key=value`` strings.
        only / start: notebook number selection (see :func:`select`).
        run_dir: an explicit run folder (kept and added to if it exists).
        outputs: the outputs root (default ``outputs/``) for new run folders and ``latest``.
        notebook_dir: where the ``NN_*.ipynb`` notebooks are.
        echo: where progress lines go.

    Returns:
        ``(run folder, manifest dict)``; ``manifest["status"]`` is ``"ok"`` or ``"failed"``.

    Raises:
        ParamsError: invalid params (before anything is written).
        RunDirError: the run folder cannot be created or written.
        RunLocked: another ``nvfp4study run`` is writing into the same folder (its pid named).
    """
    params: Params = load_params(params_path, overrides)
    all_nbs = notebooks(notebook_dir)
    chosen = select(all_nbs, only, start)
    outputs = Path(outputs) if outputs else OUTPUTS
    if not run_dir and (only or start):
        # A partial run continues the newest run: later stages read what earlier ones wrote.
        if not (outputs / "latest").is_dir():
            raise RunDirError(f"--only/--from continue the newest run, and {outputs / 'latest'} does not "
                              "exist: run the whole study first, or give --run-dir")
        run_dir = outputs / "latest"
    previous: dict[str, Any] = {}
    if run_dir:
        root = ensure_writable(Path(run_dir).resolve())
        previous = _previous_manifest(root, params)
    else:
        try:
            outputs.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunDirError(f"cannot create outputs folder {outputs}: {exc.strerror or exc}") from exc
        root = new_run_dir(params.profile, outputs, "simulated" if environment.simulated() else "")
    with runlock.hold(root), _owner_env():  # one run per folder (RunLocked names the holder)
        paths = RunPaths(root)
        resolved = dump_params(params, paths.params_file)
        ledger.init_ledger(root)
        manifest: dict[str, Any] = {
            **previous,
            "profile": params.profile,
            "params_source": str(params_path or "params/default.yaml"),
            "overrides": list(overrides),
            "params_hash": params.digest(),
            "params": params.model_dump(mode="json"),
            "started": previous.get("started", _now()),
            "ended": None,
            "status": "running",
            "notebooks": [n for n in previous.get("notebooks", [])
                          if n["notebook"] not in {p.stem for p in chosen}],
            **environment.collect(params, root),
        }
        write_json(paths.manifest, manifest)
        echo(f"run folder: {root}")
        failure: NotebookFailed | None = None
        # each notebook's HTML copy (nbconvert, about 0.4 s; 2.5 s for the first, which imports
        # it) is made in a thread while the next notebook's kernel runs; all are done (and any
        # error raised) before the report and the manifest's end
        html = ThreadPoolExecutor(max_workers=1)
        copies = []
        for i, nb in enumerate(chosen, 1):
            out = root / nb.name
            t0 = time.monotonic()
            entry: dict[str, Any] = {"notebook": nb.stem, "started": _now()}
            try:
                execute_notebook(nb, out, resolved, root, params.execution_timeout_s)
                entry["status"] = "ok"
            except NotebookFailed as exc:
                entry.update(status="failed", cell=exc.cell, error=f"{exc.ename}: {exc.evalue}")
                failure = exc
            entry["seconds"] = round(time.monotonic() - t0, 2)
            if out.exists():
                copies.append(html.submit(to_html, out, paths.html_dir / f"{nb.stem}.html"))
            manifest["notebooks"].append(entry)
            manifest["notebooks"].sort(key=lambda n: n["notebook"])
            write_json(paths.manifest, manifest)
            echo(f"[{i}/{len(chosen)}] {nb.stem:<24} {entry['seconds']:7.1f} s  {entry['status']}")
            if failure:
                break
        html.shutdown(wait=True)
        for c in copies:
            c.result()
        report_nb = root / f"{REPORT_NOTEBOOK}.ipynb"
        if not failure and any(n.stem == REPORT_NOTEBOOK for n in chosen) and report_nb.exists():
            to_html(report_nb, paths.report)
        manifest.update(ended=_now(), status="failed" if failure else "ok")
        manifest.pop("failure", None)
        if failure:
            manifest["failure"] = str(failure)
        write_json(paths.manifest, manifest)
        done = {n["notebook"] for n in manifest["notebooks"] if n["status"] == "ok"}
        complete = {p.stem for p in all_nbs} <= done
        # outputs/latest is what notebooks opened by hand read: only a complete, successful run.
        if complete and root.resolve().is_relative_to(outputs.resolve()):
            point_latest(root, outputs)
        if failure:
            echo(f"FAILED: {failure}")
        else:
            echo(f"report: {paths.report if paths.report.exists() else '(99_report not run)'}")
        return root, manifest


@contextlib.contextmanager
def _owner_env():
    """Tell the notebooks this process executes that their run folder's lock is their runner's."""
    old = os.environ.get(runlock.OWNER_ENV)
    os.environ[runlock.OWNER_ENV] = str(os.getpid())
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(runlock.OWNER_ENV, None)
        else:
            os.environ[runlock.OWNER_ENV] = old


def main(argv: list[str]) -> int:
    """``nvfp4study run``: parse arguments and run the study. Exit 0 ok, 1 a notebook failed."""
    ap = argparse.ArgumentParser(
        prog="nvfp4study run",
        description="Run the study's notebooks in order with papermill.",
        epilog="example: nvfp4study run --params params/default.yaml --from 03 -p corruption.humaneval_count=20",
    )
    ap.add_argument("--params", default=None, help="params YAML (default: params/default.yaml)")
    ap.add_argument("--only", default=None, help="comma-separated notebook numbers, e.g. 02,05")
    ap.add_argument("--from", dest="start", default=None, help="first notebook number to run, e.g. 03")
    ap.add_argument("-p", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a params key (dotted), e.g. -p quantize.device=cuda")
    ap.add_argument("--run-dir", default=None, help="run folder (default: outputs/<UTC-time>-<profile>)")
    args = ap.parse_args(argv)
    try:
        _, manifest = run_study(args.params, args.overrides, args.only, args.start, args.run_dir)
    except StudyError:
        raise
    except KeyboardInterrupt:
        print("interrupted: the run folder keeps what was written", file=sys.stderr)
        return 130
    return 0 if manifest["status"] == "ok" else 1
