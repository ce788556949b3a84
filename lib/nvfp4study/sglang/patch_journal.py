"""Crash-safe writes for ``nvfp4study patch``: a journal that lets the next command finish the job.

A patch changes several files; a process killed between two renames (SIGKILL, power cut of the
process, OOM killer) must not leave a half-patched tree that no command can repair. Every write
of :func:`write_all` goes through one folder, :data:`JOURNAL_DIR` in the tree root (beside the
``sglang`` package, on the same file system, so the renames are atomic):

1. the new bytes of every target (``<i>.new``) and a copy of its current bytes (``<i>.old``);
2. ``journal.json`` (written to ``journal.json.tmp``, then renamed): per target its path (relative
   to the tree root), ``sha256_before`` (its bytes now) and ``sha256_after`` (the new bytes);
3. one ``os.replace(<i>.new, target)`` per target;
4. ``journal.json`` removed (the commit point), then the folder.

:func:`recover` (run first by every ``patch`` command: apply, revert, status, switch, verify)
looks at that folder. Without ``journal.json`` no target was touched yet (steps 1-2) or all were
(step 4): the folder's leftovers are deleted. With it, every target is checked: already
``sha256_after``, or still ``sha256_before`` with its ``<i>.new`` in place and renamed now (the
interrupted command is finished). A target in any other state is a :class:`PatchStateError` and
the journal is kept. So after any kill the tree is wholly before or wholly after the command,
no temporary file stays in the package, and the folder is gone.

An exception inside the writing process (including KeyboardInterrupt between two renames) rolls
back at once instead, by content, from the ``old`` bytes held in memory.

Test hook: with ``NVFP4STUDY_PATCH_KILL_AT=N`` in the environment the process SIGKILLs itself
just before its N-th write, rename or removal (:func:`_step`), so a test can kill it at each one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
from pathlib import Path

from ..core.errors import PatchStateError, PatchTargetReadOnly

JOURNAL_DIR = ".nvfp4study-patch"
JOURNAL = "journal.json"
KILL_ENV = "NVFP4STUDY_PATCH_KILL_AT"
_steps = 0


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _step() -> None:
    """Count one write/rename/removal; SIGKILL this process at step ``$NVFP4STUDY_PATCH_KILL_AT``."""
    global _steps
    _steps += 1
    if os.environ.get(KILL_ENV) == str(_steps):
        os.kill(os.getpid(), signal.SIGKILL)


def _write_file(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode & 0o7777)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(path, mode & 0o7777)


def journal_dir(root: Path) -> Path:
    """The journal folder of the tree rooted at ``root``."""
    return Path(root) / JOURNAL_DIR


def write_all(root: Path, new: dict[Path, bytes], old: dict[Path, bytes]) -> None:
    """Write ``new`` ({absolute path under ``root``: bytes}) through the journal (module docstring).

    ``old`` holds each target's current bytes. On any exception in this process every target
    whose bytes differ from ``old`` is put back, the journal folder removed, and the exception
    re-raised (an OSError as :class:`PatchTargetReadOnly`).

    Raises:
        PatchStateError: a journal of an earlier command is still pending (call :func:`recover`).
        PatchTargetReadOnly: a write failed (earlier files restored).
    """
    root = Path(root)
    jdir = journal_dir(root)
    if jdir.exists():
        raise PatchStateError(f"{jdir} exists: an interrupted patch command is pending; run "
                              "`nvfp4study patch status` to finish it")
    target: Path | None = None
    try:
        _step()
        jdir.mkdir()
        entries = []
        for i, (target, data) in enumerate(new.items()):
            mode = target.stat().st_mode
            _step()
            _write_file(jdir / f"{i}.new", data, mode)
            _step()
            _write_file(jdir / f"{i}.old", old[target], mode)
            entries.append({"path": str(target.relative_to(root)), "new": f"{i}.new",
                            "old": f"{i}.old", "sha256_before": _sha(old[target]),
                            "sha256_after": _sha(data)})
        tmp = jdir / (JOURNAL + ".tmp")
        _step()
        _write_file(tmp, json.dumps({"files": entries}, indent=1).encode(), 0o644)
        _step()
        os.replace(tmp, jdir / JOURNAL)
        for e in entries:
            target = root / e["path"]
            _step()
            os.replace(jdir / e["new"], target)
        _step()
        os.unlink(jdir / JOURNAL)  # the commit point
        _step()
        shutil.rmtree(jdir)
    except BaseException as exc:
        # Roll back by content, not by a list of renames done: an interrupt can land just after
        # os.replace and before any bookkeeping.
        for q, data in old.items():
            if q.is_file() and q.read_bytes() != data:
                q.write_bytes(data)
        shutil.rmtree(jdir, ignore_errors=True)
        if isinstance(exc, OSError):
            raise PatchTargetReadOnly(f"writing {target} failed ({exc}); earlier files restored") from exc
        raise


def pending(root: Path) -> bool:
    """Whether an interrupted command left its journal folder in ``root``."""
    return journal_dir(root).exists()


def recover(root: Path) -> list[str]:
    """Finish the command an earlier process was killed in (module docstring); returns what was
    done, one line each ([] when nothing was pending).

    Raises:
        PatchStateError: the journal is unreadable, or a target is neither in its before nor in
            its after state (changed by someone else since); the journal is then kept.
        PatchTargetReadOnly: a rename or removal failed.
    """
    root = Path(root)
    jdir = journal_dir(root)
    if not jdir.exists():
        return []
    jfile = jdir / JOURNAL
    try:
        if not jfile.is_file():  # killed before the journal (nothing renamed) or after the commit
            shutil.rmtree(jdir)
            return [f"removed the temporary files of an interrupted patch command ({jdir})"]
        try:
            entries = json.loads(jfile.read_text())["files"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PatchStateError(f"{jfile}: unreadable patch journal ({exc}); kept for inspection") from None
        done = []
        for e in entries:
            target = root / e["path"]
            h = _sha(target.read_bytes()) if target.is_file() else None
            if h == e["sha256_after"]:
                continue
            new = jdir / e["new"]
            if h == e["sha256_before"] and new.is_file() and _sha(new.read_bytes()) == e["sha256_after"]:
                os.replace(new, target)
                done.append(e["path"])
                continue
            raise PatchStateError(
                f"{e['path']} (sha256 {str(h)[:12]}) is neither in the state before nor after the "
                f"interrupted patch command recorded in {jfile}; nothing changed, journal kept")
        os.unlink(jfile)
        shutil.rmtree(jdir)
    except OSError as exc:
        raise PatchTargetReadOnly(f"finishing the interrupted patch command in {jdir} failed: {exc}") from exc
    return [f"finished an interrupted patch command: {len(entries)} file(s) in the after state"
            + (f", renamed now: {', '.join(done)}" if done else "")]
