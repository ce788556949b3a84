"""One SGLang server process: launch in its own process group, wait for health, stop it all.

The server is started with ``start_new_session=True`` (its own session and process group, so
SGLang's scheduler/detokenizer children share one group id), its output appended to a log file,
and ``PR_SET_PDEATHSIG`` set so it gets SIGTERM if the launching process dies. :meth:`stop`
sends :attr:`ServerProcess.stop_signal` (SIGTERM unless set) to the group, or to the launched
process alone (SGLang's launches: SIGINT, :data:`nvfp4study.serving.launchers.SGLANG_STOP_SIGNAL`),
waits a grace period, then SIGKILLs whatever is left and waits until none is alive. An ``atexit``
hook stops every server this interpreter started, as a last resort.

"Whatever is left" includes processes that left the group or the session (``setsid``, a double
fork, a daemon): every launch carries a random marker in :data:`SERVER_MARKER_ENV`, which such
processes inherit (:func:`nvfp4study.codeeval.watchdog.marked_processes` finds them), and while
a server is live the launcher is a child subreaper (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``), so
an orphaned descendant is re-parented to the launcher instead of init and stays in the
launcher's process tree even if it cleared its environment. Orphans the launcher adopted are
reaped after they are killed (no zombie is left).

``GET /health_generate`` answers 503 while the server is starting and 200 once a one-token
generation went through (0.5.23 ``entrypoints/http_server.py`` 721-799).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ..codeeval.watchdog import marked_processes
from ..core.errors import (
    HealthTimeout,
    PortInUse,
    ServerDied,
    ServerExitedDuringLoad,
    WrongInterpreter,
)
from . import forkserver
from .sglang_log import ERROR_LINE, log_tail  # noqa: F401  (the one log parser; re-exported: server names them)


def check_port_free(host: str, port: int) -> None:
    """Raise :class:`PortInUse` when something listens on host:port (bind test, SO_REUSEADDR
    set as uvicorn does, so only a listener, not a TIME_WAIT socket, makes it fail)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                raise PortInUse(f"{host}:{port} is already in use (another server? stop it or set "
                                f"server.port)") from None
            raise


def _set_pdeathsig() -> None:  # runs in the child before exec (Linux): die with the launcher
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
#: environment variable whose random value marks every process one launch started.
SERVER_MARKER_ENV = "NVFP4STUDY_SERVER"


def _set_subreaper(on: bool) -> bool:
    """Make this process a child subreaper (or stop being one); False where unsupported."""
    if sys.platform != "linux":
        return False
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


_LIVE: dict[int, ServerProcess] = {}
_IN_FLIGHT: set[str] = set()  # markers of launches whose server is being handed over
_BY_URL: dict[str, ServerProcess] = {}


@dataclass
class ServerProcess:
    """One launched SGLang server: its command, log, process group and timings."""

    command: list[str]
    log_path: Path
    host: str
    port: int
    env: dict[str, str] = field(default_factory=dict)
    grace_s: float = 30.0
    tail_lines: int = 40
    proc: subprocess.Popen | forkserver.ForkedProcess | None = None
    t_launch: float | None = None
    t_healthy: float | None = None
    returncode: int | None = None
    marker: str = field(default_factory=lambda: os.urandom(12).hex())
    t_launch_epoch: float = 0.0
    subreaper: bool = True  # become a child subreaper while live (orphans come back to us)
    stop_signal: int = signal.SIGTERM  # the first signal :meth:`stop` sends
    stop_leader_only: bool = False  # send it to the launched process alone, not its whole group
    #: fork the server from a preloaded interpreter (:mod:`~nvfp4study.serving.forkserver`), which
    #: keeps its probe's module list in this folder; None: exec it
    preloaded: Path | None = None
    started: str = ""  # how it was started: "exec", or the fork server that forked it

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def tail(self) -> str:
        return log_tail(self.log_path, self.tail_lines)

    def start(self) -> None:
        """Launch in a new session (own process group), output appended to the log file."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env, SERVER_MARKER_ENV: self.marker}
        self.t_launch_epoch = time.time()
        self.t_launch = time.monotonic()  # a fork server's start counts as this launch's loading
        with open(self.log_path, "ab") as log, forkserver.LOCK:
            log.write(f"# nvfp4study launch: {json.dumps(self.command)}\n".encode())
            log.flush()
            reaper = _set_subreaper(True) if self.subreaper else False  # orphans come back to us
            _IN_FLIGHT.add(self.marker)  # a server handed over before _LIVE knows it: not an orphan
            try:
                self.proc = self._forked(env, log, reaper) if self.preloaded is not None else None
                if self.proc is None:
                    self.t_launch = time.monotonic()  # the exec'd server's loading starts now
                    self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log,
                                                 stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                                 preexec_fn=_set_pdeathsig if sys.platform == "linux" else None)
                    self.started = self.started or "exec"
                _LIVE[self.proc.pid] = self
            finally:
                _IN_FLIGHT.discard(self.marker)
        _BY_URL[self.base_url] = self

    def _forked(self, env: dict[str, str], log, reaper: bool) -> forkserver.ForkedProcess | None:
        """The server forked by the fork server, or None (said in the log) when it cannot be."""
        assert self.preloaded is not None
        try:
            if not reaper:
                raise forkserver.ForkServerUnavailable("this process is not a child subreaper (subreaper off or "
                                                       "unsupported): a forked server could not be handed to it")
            proc, fs = forkserver.start_forked(self.command, env, (SERVER_MARKER_ENV, self.marker), log,
                                               self.preloaded)
        except forkserver.ForkServerUnavailable as exc:
            self.started = f"exec ({exc})"
            log.write(f"# nvfp4study: started by exec: {exc}\n".encode())
            log.flush()
            return None
        self.started = (f"forked by the fork server (pid {fs.proc.pid if fs.proc else '?'}, "
                        f"{fs.info.get('preloaded', 0)} modules preloaded)")
        return proc

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_healthy(self, timeout_s: float, poll_s: float = 2.0) -> float:
        """Poll ``/health_generate`` until 200. Returns seconds from launch to healthy.

        Raises:
            ServerExitedDuringLoad: the process exited first.
            HealthTimeout: no 200 within ``timeout_s``.
        """
        import httpx

        from .transport import http

        assert self.proc is not None and self.t_launch is not None
        deadline = self.t_launch + timeout_s
        last = "no answer yet"
        while True:
            rc = self.proc.poll()
            if rc is not None:
                self.returncode = rc
                raise ServerExitedDuringLoad(f"the server exited with status {rc} while loading",
                                             log=self.log_path, log_tail=self.tail())
            now = time.monotonic()
            if now >= deadline:
                raise HealthTimeout(f"/health_generate not 200 after {timeout_s:.0f} s (last: {last})",
                                    log=self.log_path, log_tail=self.tail())
            try:
                with http(max(1.0, min(30.0, deadline - now))) as session:
                    r = session.get(self.base_url + "/health_generate")
                if r.status_code == 200:
                    self.t_healthy = time.monotonic()
                    return self.t_healthy - self.t_launch
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            end = min(deadline, time.monotonic() + poll_s)
            while time.monotonic() < end and self.proc.poll() is None:
                time.sleep(min(0.1, poll_s))

    def _group_pids(self) -> set[int]:
        """Every pid in the server's process group, zombies included: a server that died while
        loading leaves its scheduler and detokenizer as zombies re-parented to us, which
        :meth:`group_members` (live processes only) no longer lists."""
        out = set()
        for p in psutil.process_iter():
            with contextlib.suppress(ProcessLookupError, psutil.Error, OSError):
                if self.proc is not None and os.getpgid(p.pid) == self.proc.pid:
                    out.add(p.pid)
        return out

    def group_members(self) -> list[psutil.Process]:
        """Live (non-zombie) processes of the launch: the server's process group, its
        descendants, orphans re-parented to this (subreaper) process since the launch, and every
        process carrying this launch's marker (those that left the group or session)."""
        if self.proc is None:
            return []
        out: dict[int, psutil.Process] = {p.pid: p for p in marked_processes(
            self.marker, self.t_launch_epoch, SERVER_MARKER_ENV)}
        pgid = self.proc.pid  # start_new_session: the leader's pid is the group id
        for p in psutil.process_iter(["status"]):
            try:
                if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                    out[p.pid] = p
            except (ProcessLookupError, psutil.Error, OSError):
                continue
        roots = [self.proc.pid] + [p.pid for p in _adopted(self.t_launch_epoch)]
        for root in roots:
            with contextlib.suppress(psutil.Error):
                for c in [psutil.Process(root), *psutil.Process(root).children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        if c.pid != os.getpid() and c.status() != psutil.STATUS_ZOMBIE:
                            out[c.pid] = c
        return list(out.values())

    def _pgid_ours(self, leader_only: bool = False) -> bool:
        """Whether the launched pid (``leader_only``) or its process group still names our
        processes: the leader not yet reaped, or a member of the group left. A reaped leader's
        number can be reused (``pid_max`` is 32768 here and the suite starts thousands of
        processes), and a signal to it would reach whatever has it now, as ``Popen.send_signal``
        avoids by polling first."""
        assert self.proc is not None
        return self.proc.poll() is None or (not leader_only and bool(self._group_pids()))

    def stop(self) -> None:
        """Terminate the whole process group: :attr:`stop_signal` (SIGTERM unless set) to the group
        (or to the launched process alone, :attr:`stop_leader_only`, for a server that stops its
        own children), wait ``grace_s``, then SIGKILL the group. Idempotent."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        members = self.group_members()
        seen = {p.pid for p in members}
        if self._pgid_ours(leader_only=self.stop_leader_only):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                (os.kill if self.stop_leader_only else os.killpg)(pgid, self.stop_signal)
        for p in [] if self.stop_leader_only else members:  # descendants that left the group (one each)
            with contextlib.suppress(psutil.Error, OSError):
                if os.getpgid(p.pid) != pgid:
                    p.send_signal(self.stop_signal)
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and (self.proc.poll() is None or self.group_members()):
            time.sleep(0.05)
        if self.proc.poll() is None or self.group_members():
            if self._pgid_ours():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
            late = self.group_members()
            seen |= {p.pid for p in late}
            for p in late + members:
                with contextlib.suppress(psutil.Error):
                    p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        end = time.monotonic() + 10
        while (left := self.group_members()) and time.monotonic() < end:
            for p in left:  # started after the SIGKILL round (a daemon's late fork)
                seen.add(p.pid)
                with contextlib.suppress(psutil.Error):
                    p.kill()
            time.sleep(0.05)
        self.returncode = self.proc.returncode
        _LIVE.pop(self.proc.pid, None)
        if _BY_URL.get(self.base_url) is self:
            _BY_URL.pop(self.base_url, None)
        _reap((seen | self._group_pids()) - {self.proc.pid})
        with forkserver.LOCK:  # not while another thread's launch is being handed its server
            if not _LIVE:
                _set_subreaper(False)

    def check_alive(self, wait_s: float = 0.0) -> None:
        """Raise :class:`ServerDied` (with the log tail) if the server has exited, waiting up to
        ``wait_s`` for an exit in progress (after a cut stream the process may still be closing)."""
        if self.proc is not None and wait_s > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=wait_s)
        if self.proc is not None and self.proc.poll() is not None:
            self.returncode = self.proc.returncode
            raise ServerDied(f"the server exited with status {self.returncode} while serving",
                             log=self.log_path, log_tail=self.tail())


def _adopted(since: float) -> list[psutil.Process]:
    """Live orphans of a launch re-parented to this process (the subreaper): children of ours
    started since ``since`` that no live launch's ``Popen`` started, whose environment carries a
    launch marker or is empty (a daemon that cleared it; everything this interpreter starts
    itself inherits ``os.environ``, so no child of ours has an empty one)."""
    mine = {sp.proc.pid for sp in _LIVE.values() if sp.proc is not None}
    out = []
    with contextlib.suppress(psutil.Error):
        for c in psutil.Process().children():
            with contextlib.suppress(psutil.Error):
                if c.pid in mine or c.create_time() < since - 1 or c.status() == psutil.STATUS_ZOMBIE:
                    continue
                env = c.environ()
                mark = env.get(SERVER_MARKER_ENV)
                if mark in _IN_FLIGHT or mark == forkserver.PLACEHOLDER:
                    continue  # another launch's server being handed over, or a fork server
                if SERVER_MARKER_ENV in env or not env:
                    out.append(c)
    return out


def _reap(pids: set[int], wait_s: float = 5.0) -> None:
    """Collect the exit status of killed launch processes that are, or become, our children
    (orphans adopted as subreaper), so no zombie is left; other pids are left alone.

    A SIGKILLed process is not dead at once, and a grandchild is re-parented to us only when its
    parent dies: one ``WNOHANG`` pass right after the kill missed SGLang's scheduler and
    detokenizer, which stayed zombies of the launching process. So each pid is polled until it is
    reaped or gone, for at most ``wait_s`` seconds in all."""
    me = os.getpid()
    left, end = set(pids), time.monotonic() + wait_s
    while left:
        for pid in list(left):
            try:
                proc = psutil.Process(pid)
                if proc.ppid() == me:
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:
                        left.discard(pid)
                elif proc.status() == psutil.STATUS_ZOMBIE:
                    left.discard(pid)  # another parent's to collect
            except (psutil.Error, ChildProcessError, OSError):
                left.discard(pid)  # gone, or reaped by someone else
        if not left or time.monotonic() > end:
            return
        time.sleep(0.05)


@atexit.register
def _stop_all() -> None:  # last resort: never leave a server behind this interpreter
    for sp in list(_LIVE.values()):
        with contextlib.suppress(Exception):
            sp.stop()


def process_for(base_url: str) -> ServerProcess | None:
    """The live :class:`ServerProcess` serving ``base_url`` (to attach its log tail to errors)."""
    return _BY_URL.get(base_url.rstrip("/"))


# ``server.python`` reports its sglang version from package metadata (no import of sglang).
VERSION_PROBE = "import importlib.metadata as m; print(m.version('sglang'))"


def check_interpreter(python: str, expect_version: str | None = None) -> str:
    """Check the SGLang interpreter and return its ``sglang`` version.

    Raises:
        WrongInterpreter: missing, not executable, no ``sglang`` importable, or the version differs.
    """
    exe = shutil.which(python) if not os.path.isabs(python) else python
    if not exe or not Path(exe).is_file():
        raise WrongInterpreter(f"server.python {python!r} does not exist")
    if not os.access(exe, os.X_OK):
        raise WrongInterpreter(f"server.python {exe!r} is not executable")
    try:
        out = subprocess.run([exe, "-c", VERSION_PROBE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WrongInterpreter(f"server.python {exe!r} cannot run: {exc}") from None
    if out.returncode != 0:
        raise WrongInterpreter(f"server.python {exe!r} has no sglang: {out.stderr.strip()[-400:]}")
    version = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if expect_version and version != expect_version:
        raise WrongInterpreter(f"server.python {exe!r} has sglang {version}, the params want "
                               f"{expect_version} (set sglang.version or server.check_version=false)")
    return version
