"""One writer per run folder: an ``flock`` on ``<run>/.run.lock`` held for a whole study run.

Two ``nvfp4study run`` into the same folder would interleave their notebooks and overwrite each
other's ledger and manifest. :func:`hold` takes an exclusive, non-blocking ``fcntl.flock`` on the
lock file and writes the holder's pid into it; a second run is refused with
:class:`~nvfp4study.core.errors.RunLocked` naming that pid. The kernel drops an ``flock`` when its
holder dies (even by SIGKILL), so the lock of a dead run is simply taken over; the pid left in
the file is then only history. The file itself is kept (removing it would let a waiting opener
lock an unlinked inode while a third process locks a new file).

The runner exports :data:`OWNER_ENV` (its pid) to the notebooks it executes; a stage opened in a
notebook (:func:`nvfp4study.core.stage.open_stage_named`) calls :func:`check`, which refuses when
another process holds the folder's lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from .errors import RunDirError, RunLocked

LOCK_NAME = ".run.lock"
#: set by the runner for the notebooks it executes: the pid of the run that holds the lock.
OWNER_ENV = "NVFP4STUDY_RUN_LOCK_OWNER"


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 64).decode().strip()
        if text:
            return text
    return "unknown"


def _open(root: Path) -> int:
    try:
        return os.open(Path(root) / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise RunDirError(f"cannot create the run lock in {root}: {exc.strerror or exc}") from None


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise


@contextlib.contextmanager
def hold(root: str | Path) -> Iterator[Path]:
    """Hold the run folder's lock for the ``with`` block; yields the lock file's path.

    Raises:
        RunLocked: another live process holds it (the message names its pid).
        RunDirError: the lock file cannot be created.
    """
    root = Path(root)
    fd = _open(root)
    try:
        if not _try_lock(fd):
            raise RunLocked(f"{root} is in use by another nvfp4study run (pid {_holder(fd)}, "
                            f"lock {root / LOCK_NAME}); wait for it or use another --run-dir")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield root / LOCK_NAME
    finally:
        os.close(fd)  # closing the only descriptor releases the flock


def check(root: str | Path) -> None:
    """Refuse when a process other than this one's runner (:data:`OWNER_ENV`) holds the lock.

    Raises:
        RunLocked: another run holds the folder.
    """
    lock = Path(root) / LOCK_NAME
    if not lock.is_file():
        return
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return
    try:
        if _try_lock(fd):
            return  # free: nobody runs in this folder now
        holder = _holder(fd)
        if holder == os.environ.get(OWNER_ENV):
            return  # our own runner holds it
        raise RunLocked(f"{root} is in use by nvfp4study run pid {holder} (lock {lock}); a "
                        "notebook must not write into a run folder another run is writing")
    finally:
        os.close(fd)
