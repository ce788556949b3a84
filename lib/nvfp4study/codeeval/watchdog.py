"""The sandbox's watchdog: the process tree of one run, its output, and killing all of it.

Every :data:`POLL_S` the harness walks the sandbox's process tree (:func:`descendants`, from
``/proc/<pid>/task/*/children``) and reads each process's RSS and CPU time
(:func:`proc_stat`); :func:`nvfp4study.codeeval.sandbox.check_program` kills the sandbox above
``max_processes`` processes or ``memory_mb`` of total RSS. Killing the PID namespace's init
(bwrap) kills every process in it; :func:`kill_tree` also kills the process group and every
descendant ever seen, and in the subprocess fallback :func:`reap_marked` finds processes that
left the group (``setsid``) by a marker in their environment, so nothing survives a run.
stdout/stderr are drained continuously into :class:`OutputTail`, which keeps only the last
``output_tail_bytes`` and counts the rest (a program that prints more than ``file_size_mb`` in
total is killed, "output limit").
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil

POLL_S = 0.02  # watchdog period (seconds)


class OutputTail:
    """Keeps the last ``keep`` bytes of a stream and counts all of them."""

    def __init__(self, keep: int):
        self.keep, self.total, self.buf = keep, 0, bytearray()

    def add(self, data: bytes) -> None:
        self.total += len(data)
        self.buf += data
        if len(self.buf) > self.keep:
            del self.buf[: len(self.buf) - self.keep]

    def text(self) -> str:
        return self.buf.decode("utf-8", errors="replace")


_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
_HAVE_CHILDREN = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists()


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` from ``/proc/<pid>/task/*/children`` (CONFIG_PROC_CHILDREN)."""
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out += [int(x) for x in fh.read().split()]
    except (OSError, ValueError):
        pass
    return out


def descendants(pid: int, limit: int = 100_000) -> list[int]:
    """All descendants of ``pid``: a walk of the children files (cheap: only the tree is read),
    or psutil's scan of every process where the kernel lacks them."""
    if not _HAVE_CHILDREN:
        try:
            return [p.pid for p in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return []
    out, todo = [], [pid]
    while todo and len(out) < limit:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def proc_stat(pid: int) -> tuple[int, float, int] | None:
    """(RSS bytes, CPU seconds user+system, start time in clock ticks) from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is field 3 (state): utime 14, stime 15, starttime 22, rss 24 (proc(5))
    return int(fields[21]) * _PAGE, (int(fields[11]) + int(fields[12])) / _CLK_TCK, int(fields[19])


def kill_tree(proc: subprocess.Popen, seen: dict[int, int]) -> None:
    """SIGKILL the sandbox's process group and every descendant ever seen (``{pid: start
    time}``; a pid whose start time changed was recycled and is left alone)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid, start in seen.items():
        st = proc_stat(pid)
        if st is not None and st[2] == start:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


MARKER_ENV = "NVFP4STUDY_SANDBOX"  # fallback mode: marks every process a run started


def marked_processes(marker: str, since: float, env_name: str = MARKER_ENV) -> list[psutil.Process]:
    """Live processes started since ``since`` (epoch s) whose environment carries
    ``env_name=marker``: what a launch started, even after it left the process group or session
    (``setsid``, a double fork). Processes whose environment cannot be read (another user's) are
    not ours and are skipped. Also used by :mod:`nvfp4study.serving.process`."""
    out = []
    for p in psutil.process_iter(["create_time", "status"]):
        if (p.info.get("create_time") or 0) < since - 1 or p.info.get("status") == psutil.STATUS_ZOMBIE:
            continue
        try:
            if p.environ().get(env_name) == marker:
                out.append(p)
        except psutil.Error:
            continue
    return out


def reap_marked(marker: str, since: float, env_name: str = MARKER_ENV) -> int:
    """SIGKILL :func:`marked_processes` (fallback mode: children that left the process group
    with setsid). Repeats until a pass finds none (at most 5 passes). Returns how many were
    killed."""
    killed = 0
    for _ in range(5):
        found = 0
        for p in marked_processes(marker, since, env_name):
            try:
                p.kill()
                found += 1
            except psutil.Error:
                continue
        killed += found
        if not found:
            break
    return killed
