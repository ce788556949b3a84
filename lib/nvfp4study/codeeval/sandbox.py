"""Run a generated program against its assertions, inside bubblewrap, and classify the outcome.

Generated code is never executed in the harness process. :func:`check_program` builds the
program (:mod:`nvfp4study.codeeval.program`: the task's prompt, then the code), sends it on
stdin to a small runner script inside a ``bwrap`` sandbox (:mod:`nvfp4study.codeeval.isolation`:
namespaces, read-only root, rlimits; fails closed, a plain subprocess only when asked
for by name), and reads back one JSON result
line on a private pipe, while the watchdog (:mod:`nvfp4study.codeeval.watchdog`) bounds the
process count and total RSS. After ``timeout_s`` (wall clock) the process group is killed with
SIGKILL. :func:`check_many` runs several sandboxes at a time.

Outcomes (:class:`Outcome`): the runner classifies what the program raised; the harness
classifies deaths (signal, watchdog, timeout) and silent exits (:func:`_death`).
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from ..core.params import SandboxParams
from .isolation import PYTHON_FLAGS, Isolation, bwrap_args, rlimits, sandbox_status
from .program import RUNNER, assemble, result_line
from .task_cap import JOIN_SCRIPT, TASK_SLACK, TaskCap, cap_parent, join_failed
from .tasks import Task
from .watchdog import (
    MARKER_ENV,
    POLL_S,
    OutputTail,
    descendants,
    kill_tree,
    proc_stat,
    reap_marked,
)


class Outcome(StrEnum):
    """What happened to one program (one value per run)."""

    PASS = "pass"  # check(entry_point) returned
    ASSERTION_FAILURE = "assertion_failure"  # an AssertionError (the checks, or the code's own)
    NAME_ERROR = "name_error"  # NameError / UnboundLocalError; ``name`` says which name
    EXCEPTION = "exception"  # any other exception; ``exception`` is its class name
    SYNTAX_ERROR = "syntax_error"  # the program does not compile
    ENTRY_POINT_MISSING = "entry_point_missing"  # ran, but defines no callable entry point
    TIMEOUT = "timeout"  # wall clock or CPU-time limit
    MEMORY = "memory"  # MemoryError, or total RSS above the limit
    KILLED = "killed"  # died by a signal, or the process / output limit
    EXITED = "exited"  # sys.exit / os._exit before the checks finished
    SANDBOX_ERROR = "sandbox_error"  # the sandbox itself failed to start



@dataclass
class ExecResult:
    """The result of one sandboxed run (one row of a results table; :meth:`to_dict`).

    Attributes:
        task_id: the task's id.
        outcome: an :class:`Outcome` value.
        exception: the exception's class name (``"NameError"``, ``"SystemExit"``...) or None.
        name: for NameError / UnboundLocalError, the undefined name; else None.
        message: the exception's message (first 300 characters) or a harness explanation.
        phase: where it happened: ``define`` (running the program), ``entry`` (looking up the
            entry point), ``test`` (defining check), ``check`` (running it), or None.
        lineno: the line of ``code`` (1-based) of the innermost frame in it, when known.
        detail: the harness's reason for a kill ("wall clock 10.0 s", "cpu limit", "process
            limit", "memory limit", "output limit", "SIGSEGV") or "".
        isolation: ``bwrap`` or ``subprocess-unsafe``.
        isolation_note: "" under bwrap, else the UNSAFE note of
            :data:`~nvfp4study.codeeval.isolation.UNSAFE_NOTE`.
        duration_s: wall-clock seconds from start to end of the sandbox (monotonic clock).
        returncode: the sandbox process's exit status (negative = signal, subprocess mode).
        signal: name of the signal that ended the program, if any.
        stdout_tail, stderr_tail: the last ``output_tail_bytes`` of each (UTF-8, replaced).
        output_bytes: total bytes the program wrote to stdout + stderr.
    """

    task_id: str
    outcome: str
    exception: str | None
    name: str | None
    message: str
    phase: str | None
    lineno: int | None
    detail: str
    isolation: str
    isolation_note: str
    duration_s: float
    returncode: int | None
    signal: str | None
    stdout_tail: str
    stderr_tail: str
    output_bytes: int

    @property
    def passed(self) -> bool:
        return self.outcome == Outcome.PASS

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)



def _signal_of(rc: int | None, isolation: str) -> int | None:
    if rc is None:
        return None
    if rc < 0:
        return -rc
    if isolation == Isolation.BWRAP and rc > 128 and (rc - 128) in signal.valid_signals():
        return rc - 128  # bwrap exits with 128 + signal when its child is killed
    return None


def check_program(task: Task, code: str, params: SandboxParams | None = None, *,
                  prepend_prompt: bool = True) -> ExecResult:
    """Run ``code`` against ``task``'s checks in the sandbox and classify what happened.

    Three steps, as evalplus splits its child and parent sides: :func:`_spawn` starts the
    sandboxed child, :func:`_pump` reads its output under the limits and the watchdog (and
    always kills, reaps and cleans up), :func:`_classify` turns what was seen into the result.

    Args:
        task: supplies ``prompt`` (prepended, see :func:`build_program`), ``test`` (defines
            ``check``) and ``entry_point``.
        code: the extracted program or a body completing the prompt (str).
        params: limits and isolation; default :class:`SandboxParams`.
        prepend_prompt: False runs ``code`` alone.

    Returns:
        An :class:`ExecResult`. A program that misbehaves (loops, forks, allocates, exits,
        kills, writes, connects) is a result, never an exception of this function.

    Raises:
        SandboxUnavailable: ``params.isolation == "bwrap"`` and bwrap cannot run here.
    """
    params = params or SandboxParams()
    status = sandbox_status(params)
    program, offset = assemble(task, code, prepend_prompt)
    try:
        child = _spawn(task, program, params, status)
    except _NotStarted as exc:
        return ExecResult(task.task_id, Outcome.SANDBOX_ERROR.value, None, None, str(exc), None,
                          None, "could not start", status["isolation"], status["note"], 0.0, None,
                          None, "", "", 0)
    return _classify(task, child, _pump(child, params), params, status, offset)


class _NotStarted(Exception):
    """The sandbox process could not be started (its ``OSError`` message)."""


@dataclass
class _Child:
    """A started sandbox: its process, the read end of its private result pipe, and what the
    teardown needs (the nonce marking its processes, the temp folder of subprocess mode)."""

    proc: subprocess.Popen
    result_fd: int
    nonce: str
    isolation: str
    workdir: str | None
    start: float  # monotonic, just before the launch
    started_epoch: float  # wall clock, for :func:`reap_marked`
    cap: TaskCap | None = None  # the run's pids cgroup, where one can be made (:mod:`.task_cap`)


@dataclass
class _Pumped:
    """What the parent saw of one run: the output tails, the result pipe's bytes, the watchdog's
    reason for a kill ("" when it did not kill), and the largest per-process CPU time seen."""

    out: OutputTail
    err: OutputTail
    result: bytearray = field(default_factory=bytearray)
    reason: str = ""
    max_cpu: float = 0.0  # seconds, one sandbox process (RLIMIT_CPU is per process)
    pids: dict[int, int] = field(default_factory=dict)  # every descendant seen -> its start time (ticks)
    duration_s: float = 0.0
    cap_refused: int = 0  # forks the pids cgroup refused (:meth:`TaskCap.times_full`)


def _spawn(task: Task, program: str, params: SandboxParams, status: dict[str, Any]) -> _Child:
    """Start the runner (under bwrap, or as a plain subprocess when asked for by name) and send it
    the job on stdin; the result comes back on a pipe only the runner holds.

    Raises:
        _NotStarted: the process could not be started (the pipe and temp folder are gone).
    """
    python, isolation = status["python"], status["isolation"]
    nonce = secrets.token_hex(16)
    rfd, wfd = os.pipe()
    job = {"program": program, "test": task.test,
           "entry_point": task.entry_point, "nonce": nonce, "result_fd": wfd,
           "limits": rlimits(params)}
    argv = [python, *PYTHON_FLAGS, "-c", RUNNER]
    workdir = None
    if isolation == Isolation.BWRAP:
        argv = [*bwrap_args(python, params), "--", *argv]
        # bwrap's own environment is readable inside (/proc/1/environ): give it nothing.
        cwd, env = "/", {"PATH": "/usr/bin:/bin"}
    else:
        workdir = tempfile.mkdtemp(prefix="nvfp4study-sandbox-")
        cwd = workdir
        env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
               MARKER_ENV: nonce}
    try:
        cap = _make_cap(params)
    except OSError as exc:
        _discard(rfd, wfd, workdir, None)
        raise _NotStarted(f"the sandbox's pids cgroup could not be made: {exc}") from exc
    if cap is not None:  # the shell joins the cgroup, then execs: every task is born inside
        argv = ["/bin/sh", "-c", JOIN_SCRIPT, cap.procs, nonce, *argv]
    start, started_epoch = time.monotonic(), time.time()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, pass_fds=(wfd,), cwd=cwd, env=env,
                                start_new_session=True, close_fds=True)
    except OSError as exc:
        _discard(rfd, wfd, workdir, cap)
        raise _NotStarted(str(exc)) from exc
    os.close(wfd)  # the runner holds the only write end: EOF means it (or an orphan) is done
    try:
        proc.stdin.write(json.dumps(job).encode())
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass  # it died before reading: the outcome says how
    return _Child(proc, rfd, nonce, isolation, workdir, start, started_epoch, cap)


def _make_cap(params: SandboxParams) -> TaskCap | None:
    """The run's pids cgroup (``max_processes`` + :data:`TASK_SLACK` tasks), or None where this
    machine lets none be made (the watchdog alone bounds the processes there)."""
    parent = cap_parent()
    return None if parent is None else TaskCap(parent, params.max_processes + TASK_SLACK)


def _discard(rfd: int, wfd: int, workdir: str | None, cap: TaskCap | None) -> None:
    """Undo a start that failed: the result pipe, the temp folder, the pids cgroup."""
    os.close(rfd)
    os.close(wfd)
    if workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    if cap is not None:
        cap.close()


def _pump(child: _Child, params: SandboxParams) -> _Pumped:
    """Read the child's stdout, stderr and result pipe until it exits, the wall clock runs out or
    the watchdog (output size, process count, total RSS) stops it; then, whatever happened, kill
    its tree, reap it and drain, close and remove what it had."""
    got = _Pumped(OutputTail(params.output_tail_bytes), OutputTail(params.output_tail_bytes))
    sel = selectors.DefaultSelector()
    sel.register(child.proc.stdout, selectors.EVENT_READ, got.out)
    sel.register(child.proc.stderr, selectors.EVENT_READ, got.err)
    sel.register(child.result_fd, selectors.EVENT_READ, None)
    try:
        got.reason = _read_until_done(child, params, sel, got)
    finally:
        _teardown(child, sel, got)
    got.duration_s = time.monotonic() - child.start
    return got


def _read_until_done(child: _Child, params: SandboxParams, sel: selectors.BaseSelector,
                     got: _Pumped) -> str:
    """The parent's loop: returns the reason for a kill, or "" when the child ended by itself."""
    proc = child.proc
    exited_at = None
    output_cap = params.file_size_mb * 1024 * 1024
    next_poll = child.start + POLL_S
    while True:
        now = time.monotonic()
        remaining = child.start + params.timeout_s - now
        if remaining <= 0:
            return f"wall clock {params.timeout_s:g} s"
        if not sel.get_map():  # all pipes closed: only the exit is left to wait for
            try:
                proc.wait(timeout=min(POLL_S, remaining))
            except subprocess.TimeoutExpired:
                pass
        for key, _ in sel.select(timeout=min(POLL_S, remaining)) if sel.get_map() else ():
            data = os.read(key.fd, 65536)
            if not data:
                sel.unregister(key.fileobj)
            elif key.data is None:
                got.result += data
            else:
                key.data.add(data)
        if got.out.total + got.err.total > output_cap:
            return "output limit"
        if proc.poll() is not None:
            exited_at = exited_at or time.monotonic()
            if not sel.get_map() or time.monotonic() - exited_at > 0.5:
                return ""  # all pipes closed (or held by an orphan: killed in the teardown)
            continue
        if time.monotonic() >= next_poll:
            next_poll = time.monotonic() + POLL_S
            if reason := _watch(child, params, got):
                return reason


def _watch(child: _Child, params: SandboxParams, got: _Pumped) -> str:
    """One watchdog poll of the child's descendants: "process limit", "memory limit" or ""."""
    base = 1 if child.isolation == Isolation.BWRAP else -1  # bwrap's own init inside the namespace
    pids = descendants(child.proc.pid)
    if len(pids) - base > params.max_processes:
        return "process limit"
    rss = 0
    for pid in pids:
        st = proc_stat(pid)
        if st is None:
            continue
        got.pids.setdefault(pid, st[2])
        rss += st[0]
        got.max_cpu = max(got.max_cpu, st[1])
    return "memory limit" if rss > params.memory_mb * 1024 * 1024 else ""


def _teardown(child: _Child, sel: selectors.BaseSelector, got: _Pumped) -> None:
    """Kill the process group (and every descendant seen), reap it, read what is left in the
    pipes, close them and remove the temp folder."""
    proc = child.proc
    kill_tree(proc, got.pids)
    proc.wait()
    if child.isolation == Isolation.SUBPROCESS_UNSAFE:
        reap_marked(child.nonce, child.started_epoch)
    if child.cap is not None:
        got.cap_refused = child.cap.times_full()
        child.cap.close()  # kills what is left in the cgroup (an escaped orphan too), removes it
    for key in list(sel.get_map().values()):
        try:
            os.set_blocking(key.fd, False)  # an escaped orphan may still hold the pipe
            data = os.read(key.fd, 65536)
            (got.result.extend(data) if key.data is None else key.data.add(data))
        except OSError:
            pass
    sel.close()
    proc.stdout.close()
    proc.stderr.close()
    os.close(child.result_fd)
    if child.workdir:
        shutil.rmtree(child.workdir, ignore_errors=True)


def _classify(task: Task, child: _Child, got: _Pumped, params: SandboxParams,
              status: dict[str, Any], offset: int) -> ExecResult:
    """The result: the runner's own result line when it wrote one (what the program raised),
    else the harness's reading of the death or exit (:func:`_death`)."""
    rc = child.proc.returncode
    # a run that hit the pids cgroup is a process-limit kill, as where only the watchdog bounds it
    # (whatever the program made of its EAGAIN): the same outcome on every machine
    rec = None if got.cap_refused else result_line(bytes(got.result), child.nonce)
    sig = _signal_of(rc, child.isolation)
    signame = signal.Signals(sig).name if sig else None
    common = dict(task_id=task.task_id, isolation=child.isolation, isolation_note=status["note"],
                  duration_s=round(got.duration_s, 4), returncode=rc, signal=signame,
                  stdout_tail=got.out.text(), stderr_tail=got.err.text(),
                  output_bytes=got.out.total + got.err.total)
    if rec is not None:
        return ExecResult(outcome=rec["outcome"], exception=rec["exception"], name=rec["name"],
                          message=rec["message"], phase=rec["phase"],
                          lineno=_code_line(rec["lineno"], offset),
                          detail="", signal=None, **{k: v for k, v in common.items()
                                                     if k != "signal"})
    reason = got.reason or ("process limit" if got.cap_refused else "")
    if child.cap is not None and join_failed(rc, got.err.text(), child.nonce):
        return ExecResult(outcome=Outcome.SANDBOX_ERROR.value, exception=None, name=None, phase=None,
                          lineno=None, message=got.err.text().strip()[:300], detail="pids cgroup failed",
                          **common)
    if not reason and sig == signal.SIGKILL and got.max_cpu >= params.cpu_s - 0.05:
        reason = "cpu limit"  # the hard RLIMIT_CPU (SIGXCPU ignored or not delivered in time)
    return ExecResult(**_death(reason, sig, signame, rc, got.err.text(), child.isolation), **common)


def _code_line(lineno: int | None, offset: int) -> int | None:
    """A program line number as a line of ``code`` (None when it lies in the prompt)."""
    if lineno is None or lineno - offset < 1:
        return None
    return lineno - offset


def _death(reason: str, sig: int | None, signame: str | None, rc: int | None, stderr: str,
           isolation: str) -> dict[str, Any]:
    """Classify a run that produced no result line."""
    blank = dict(exception=None, name=None, phase=None, lineno=None)
    if reason.startswith("wall clock"):
        return dict(outcome=Outcome.TIMEOUT.value, message="killed after the wall-clock limit",
                    detail=reason, **blank)
    if reason == "cpu limit":
        return dict(outcome=Outcome.TIMEOUT.value, message="CPU-time limit (SIGKILL at the hard "
                    "limit)", detail=reason, **blank)
    if reason == "memory limit":
        return dict(outcome=Outcome.MEMORY.value, message="total RSS above the limit",
                    detail=reason, **blank)
    if reason:
        return dict(outcome=Outcome.KILLED.value, message=f"killed by the watchdog ({reason})",
                    detail=reason, **blank)
    if sig == signal.SIGXCPU:
        return dict(outcome=Outcome.TIMEOUT.value, message="CPU-time limit (SIGXCPU)",
                    detail="cpu limit", **blank)
    if sig is not None:
        return dict(outcome=Outcome.KILLED.value, message=f"died by {signame}", detail=signame,
                    **blank)
    if isolation == Isolation.BWRAP and rc == 1 and stderr.lstrip().startswith("bwrap:"):
        return dict(outcome=Outcome.SANDBOX_ERROR.value, message=stderr.strip()[:300],
                    detail="bwrap failed", **blank)
    return dict(outcome=Outcome.EXITED.value,
                message=f"process ended with status {rc} before the checks finished",
                detail=f"exit status {rc}", **blank)


def check_many(items: list[tuple[Task, str]], params: SandboxParams | None = None,
               workers: int = 2) -> list[ExecResult]:
    """:func:`check_program` over ``(task, code)`` pairs, ``workers`` sandboxes at a time.

    Returns:
        The results in the order of ``items``.
    """
    params = params or SandboxParams()
    sandbox_status(params)  # probe once (and raise SandboxUnavailable) before the threads
    if workers <= 1 or len(items) <= 1:
        return [check_program(t, c, params) for t, c in items]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda tc: check_program(tc[0], tc[1], params), items))
