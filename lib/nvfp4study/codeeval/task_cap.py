"""The sandbox's hard cap on tasks: a pids cgroup of its own for each run, where one can be made.

Why: the watchdog (:mod:`nvfp4study.codeeval.watchdog`) counts the sandbox's processes every
``POLL_S`` and kills it above ``max_processes``, but between two polls, or while the harness waits
for a CPU, a fork bomb goes on forking. Measured here: ``while True: os.fork()`` reached 1,580
processes on an idle 2-core machine before its 20 ms poll, and under two test workers it filled
the machine's pid space (``/proc/sys/kernel/pid_max``, 32768), so every fork on the machine failed
with EAGAIN (``BlockingIOError: [Errno 11]`` in the other worker's subprocesses) and the load it
made starved the rest. ``RLIMIT_NPROC`` cannot bound it for root (see
:mod:`nvfp4study.codeeval.isolation`). The pids controller can: once a cgroup holds ``pids.max``
tasks (threads count), ``fork``/``clone`` inside it fail with EAGAIN, whatever the watchdog's
latency (Linux ``Documentation/admin-guide/cgroup-v1/pids.rst``; ``cgroup-v2.rst``, "PID").

How: :func:`cap_parent` finds a pids hierarchy this process may create cgroups in (cgroup v1's
``pids`` mount, or a cgroup v2 folder whose ``cgroup.subtree_control`` enables ``pids``), by
making and removing a probe cgroup once. :class:`TaskCap` makes ``nvfp4study-sandbox-<pid>-<hex>``
there with ``pids.max`` set; the sandbox is started as ``/bin/sh -c JOIN_SCRIPT`` which moves
itself into the cgroup (writing ``0`` to ``cgroup.procs`` moves the writer) and then ``exec``\\ s
bwrap, so every task the program makes is inside before it can run. :meth:`TaskCap.close` kills
whatever is still in it and removes it. Where no pids hierarchy is writable (an unprivileged
user without a delegated cgroup), the watchdog is the only bound and :func:`cap_description`
says so.
"""

from __future__ import annotations

import functools
import os
import secrets
import signal
import time
from pathlib import Path

PREFIX = "nvfp4study-sandbox-"
PROBE_PREFIX = "nvfp4study-probe-"
#: tasks the cap allows beyond ``max_processes``: bwrap (outside and its init), /bin/sh before
#: its exec, and threads of the program (the pids controller counts threads, the watchdog counts
#: processes). The cap only backs the watchdog up: it keeps a bomb to tens of tasks, not 32768.
TASK_SLACK = 64
#: exit status of the join script when it cannot move itself into the cgroup (nothing ran)
JOIN_FAILED = 125
JOIN_MESSAGE = "nvfp4study: cannot join the sandbox's pids cgroup"
#: ``$0`` is the cgroup's ``cgroup.procs``, ``$1`` the run's nonce (a program cannot print a
#: failure of the join in its name), the rest the sandbox command.
JOIN_SCRIPT = (f'echo 0 2>/dev/null >"$0" || {{ echo "{JOIN_MESSAGE} [$1] $0" >&2; exit {JOIN_FAILED}; }}; '
               'shift; exec "$@"')


def join_failed(returncode: int | None, stderr: str, nonce: str) -> bool:
    """Whether a run ended in the join script's own failure (nothing of the program ran)."""
    return returncode == JOIN_FAILED and stderr.lstrip().startswith(f"{JOIN_MESSAGE} [{nonce}]")


def _own_cgroups() -> dict[str, str]:
    """``{controller list: path}`` of this process's cgroups (``/proc/self/cgroup``; v2 is ``""``)."""
    out = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            out[controllers] = path
    except (OSError, ValueError):
        pass
    return out


def pids_folders(mountinfo: str, own: dict[str, str]) -> list[Path]:
    """Folders where a pids cgroup might be made: this process's own cgroup in each mounted
    hierarchy with the pids controller.

    Args:
        mountinfo: the text of ``/proc/self/mountinfo`` (proc(5): field 4 the mount's root,
            field 5 its mount point; after `` - ``: file system type, source, super options).
        own: ``{controller list: cgroup path}`` as :func:`_own_cgroups` reads it.

    Returns:
        cgroup v1 folders of a ``pids`` hierarchy, and cgroup v2 folders whose
        ``cgroup.subtree_control`` lists ``pids`` (read from disk), in mount order.
    """
    out = []
    for line in mountinfo.splitlines():
        pre, _, post = line.partition(" - ")
        fields, tail = pre.split(), post.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, mount, fstype, options = fields[3], fields[4], tail[0], tail[2].split(",")
        if fstype == "cgroup" and "pids" in options:
            path = next((p for c, p in own.items() if "pids" in c.split(",")), None)
        elif fstype == "cgroup2":
            path = own.get("")
        else:
            continue
        if path is None or not (path + "/").startswith(root.rstrip("/") + "/"):
            continue
        folder = Path(mount) / path[len(root.rstrip("/")):].lstrip("/")
        if fstype == "cgroup2" and "pids" not in _read_words(folder / "cgroup.subtree_control"):
            continue
        out.append(folder)
    return out


def _read_words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def _candidates() -> list[Path]:
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return []
    return pids_folders(mountinfo, _own_cgroups())


@functools.lru_cache(maxsize=1)
def cap_parent() -> Path | None:
    """The folder :class:`TaskCap` makes its cgroups in, or None where none can be made here.

    Probed once per process: a cgroup ``nvfp4study-probe-<hex>`` is made, its ``pids.max``
    written and read back, and removed. Never raises.
    """
    for folder in _candidates():
        probe = folder / f"{PROBE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            probe.mkdir()
        except OSError:
            continue
        try:
            (probe / "pids.max").write_text("8")
            if (probe / "pids.max").read_text().strip() == "8":
                return folder
        except OSError:
            pass
        finally:
            _rmdir(probe)
    return None


def cap_description() -> str:
    """One line for the environment record and the stage 05 notebook."""
    parent = cap_parent()
    if parent is None:
        return ("no pids cgroup can be made here: the watchdog's poll is the only bound on the "
                "sandbox's processes")
    return f"each run in a pids cgroup of its own (pids.max = max_processes + {TASK_SLACK})"


def _rmdir(folder: Path, wait_s: float = 0.0) -> bool:
    """Remove an empty cgroup, retrying while its last tasks exit; True when it is gone."""
    end = time.monotonic() + wait_s
    while True:
        try:
            folder.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= end:
                return False
            time.sleep(0.01)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: a cgroup younger than this is never swept: its owner may live in another pid namespace (not
#: visible here) and be about to join it; an empty cgroup this old is a leftover.
STALE_AFTER_S = 60.0


def sweep_stale(parent: Path, now: float | None = None) -> None:
    """Remove empty cgroups left by harness processes that died: ``nvfp4study-sandbox-<pid>-*``
    and ``nvfp4study-probe-<pid>-*`` whose ``<pid>`` is gone and that are older than
    :data:`STALE_AFTER_S` (by their folder's change time). A cgroup still holding a task cannot be
    removed and is left alone."""
    now = time.time() if now is None else now
    try:
        names = [p for p in parent.iterdir() if p.name.startswith((PREFIX, PROBE_PREFIX))]
    except OSError:
        return
    for folder in names:
        owner = folder.name.split("-")[2]
        try:
            old = now - folder.stat().st_ctime > STALE_AFTER_S
        except OSError:
            continue
        if old and owner.isdigit() and not _pid_alive(int(owner)):
            _rmdir(folder / "run")
            _rmdir(folder)


class TaskCap:
    """One run's pids cgroup (a context manager: ``with TaskCap(parent, limit) as cap``).

    Two levels: ``nvfp4study-sandbox-<pid>-<hex>`` holds ``pids.max``, and the sandbox joins its
    child ``run/``. bwrap's cgroup namespace then starts at ``run/``, so the file that holds the
    limit is outside anything the sandbox could mount; bwrap's ``--disable-userns`` keeps it from
    making the user namespace such a mount needs (:mod:`nvfp4study.codeeval.isolation`). The
    pids controller is hierarchical: the limit counts every task below it.

    Args:
        parent: a folder from :func:`cap_parent`.
        limit: ``pids.max``, tasks (threads count), int >= 1.

    Raises:
        OSError: the cgroup could not be made or limited (nothing is left behind).
    """

    def __init__(self, parent: Path, limit: int):
        sweep_stale(parent)
        self.path = parent / f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        self.run = self.path / "run"
        self.path.mkdir()
        try:
            (self.path / "pids.max").write_text(str(int(limit)))
            self.run.mkdir()
        except OSError:
            _rmdir(self.path)
            raise

    @property
    def procs(self) -> str:
        """The path the join script writes to (``run/cgroup.procs``)."""
        return str(self.run / "cgroup.procs")

    def members(self) -> list[int]:
        """Pids of the processes in the cgroup now (empty when it is gone)."""
        out: list[int] = []
        for folder in (self.run, self.path):
            try:
                out += [int(x) for x in (folder / "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                pass
        return out

    def times_full(self) -> int:
        """How many forks the cap refused: the ``max`` counts of ``pids.events`` of both levels
        (kernels differ in which level counts a refusal); 0 where unreadable."""
        total = 0
        for folder in (self.path, self.run):
            try:
                for line in (folder / "pids.events").read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "max":
                        total += int(value)
            except (OSError, ValueError):
                pass
        return total

    def close(self, wait_s: float = 5.0) -> bool:
        """SIGKILL every task still in the cgroup (an orphan that left the process tree too) and
        remove both levels; True when they are gone. Safe to call twice."""
        end = time.monotonic() + wait_s
        while members := self.members():
            for pid in members:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if time.monotonic() >= end:
                break
            time.sleep(0.01)
        left = lambda: max(0.0, end - time.monotonic())  # noqa: E731
        return _rmdir(self.run, left()) and _rmdir(self.path, left())

    def __enter__(self) -> TaskCap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
