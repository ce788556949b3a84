"""CPU-engine servers forked from a preloaded interpreter: the launcher's side of
``cpu_engine/site/nvfp4study_forkserver.py`` (whose docstring says what the server does before it
runs and why it is equivalent to an exec'd one).

One fork server per (interpreter, environment, working folder) of a launching process, started at
its first launch and kept until the process exits (``atexit``; it exits at end of file on its
socket, which the process's death also causes). Each launch asks it for a server; the server is
re-parented to the launching process (a child subreaper while a server is live: the caller,
:class:`~nvfp4study.serving.process.ServerProcess`, sets it first), so it is waited for, signalled
and torn down exactly as a ``Popen`` child in its own session: :class:`ForkedProcess` stands for
the ``Popen``. When the fork server cannot start or answer, :class:`ForkServerUnavailable` says
why and the caller starts the server with ``exec`` as before.

Measured (2026-12-07, 2 cores): a CPU-engine launch spent about 9 CPU-s importing in a fresh
interpreter; forked, 1.5 CPU-s; the fork server itself imports in about 5 CPU-s once.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .cpu_engine import SITE_DIR

#: the module whose import closure (minus SGLang's own modules) a fork server preloads (read at
#: each start: tests name a small one)
PROBE_MODULE = "sglang.srt.entrypoints.http_server"
BOOT = "import nvfp4study_forkserver as f; f.main()"
PLACEHOLDER = "0" * 24  # the launch marker's length: os.urandom(12).hex()
KEEP = 2  # fork servers kept per process (the oldest is closed first)


class ForkServerUnavailable(RuntimeError):
    """The fork server could not start a server; the message says why (the caller execs instead)."""


@dataclass
class ForkedProcess:
    """The ``Popen`` side of a forked server that this process adopted (it is our child): the
    attributes :class:`~nvfp4study.serving.process.ServerProcess` uses."""

    args: list[str]
    pid: int
    returncode: int | None = None
    _waitpid_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def poll(self) -> int | None:
        """The exit status once exited (negative: killed by that signal, as ``Popen``), else None.
        As ``Popen.poll``: one thread reaps at a time (another gets None meanwhile), and a status
        reaped elsewhere reads 0."""
        if self.returncode is not None or not self._waitpid_lock.acquire(False):
            return self.returncode
        try:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # reaped elsewhere: as Popen.poll, status unknown
                    self.returncode = 0
                else:
                    if pid == self.pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
        finally:
            self._waitpid_lock.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit; raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        return self.returncode  # type: ignore[return-value]


@dataclass
class ForkServer:
    """One preloaded interpreter (module docstring). ``env`` is the servers' whole environment
    without the launch marker; ``cache_dir`` keeps the probe's module list."""

    python: str
    env: dict[str, str]
    marker_env: str
    cache_dir: Path
    probe: str = PROBE_MODULE
    proc: subprocess.Popen | None = None
    sock: socket.socket | None = None
    info: dict = field(default_factory=dict)

    def start(self, log, timeout_s: float = 300.0) -> None:
        """Start it (its output appended to ``log``, an open file) and wait until it has preloaded.
        No ``PR_SET_PDEATHSIG``: that signal follows the starting *thread*; the fork server exits
        at end of file on its socket instead, which the launcher's exit (or death) closes.

        Raises:
            ForkServerUnavailable: it exited or answered an error (the message names why).
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: v for k, v in self.env.items() if k != self.marker_env}
        env[self.marker_env] = PLACEHOLDER  # last in the block: the server overwrites it in place
        try:
            self.proc = subprocess.Popen(
                [self.python, "-c", BOOT, str(theirs.fileno()), str(self.cache_dir), self.probe],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                pass_fds=(theirs.fileno(),), start_new_session=True)
        finally:
            theirs.close()
        self.sock = ours  # its placeholder marker tells process._adopted it is no launch's orphan
        self.info = self._answer(timeout_s)
        if "error" in self.info:
            self.close()
            raise ForkServerUnavailable(f"the fork server did not start: {self.info['error']}")

    def _answer(self, timeout_s: float) -> dict:
        assert self.sock is not None and self.proc is not None
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            self.sock.settimeout(1.0)
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                if self.proc.poll() is not None:
                    return {"error": f"it exited with status {self.proc.returncode}"}
                continue
            except OSError as exc:
                return {"error": f"its socket failed: {exc}"}
            return json.loads(data) if data else {"error": "it closed its socket"}
        return {"error": f"no answer after {timeout_s:.0f} s"}

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.sock is not None

    def fork(self, command: list[str], marker: str, log_fd: int, timeout_s: float = 60.0) -> ForkedProcess:
        """A server running ``command`` (``[python, "-c", code, *args]``) with ``marker``, its
        output on ``log_fd``; this process must be a child subreaper (the server is handed to it).
        An answer is matched to its request by the marker. When no server results, none is left:
        a server that failed after it became our child is reaped; on no answer the fork server is
        closed and whatever carries the marker is killed and reaped.

        Raises:
            ForkServerUnavailable: the fork server is gone, the request is too large, or the
                server could not be handed over (the message says which).
        """
        if not self.alive():
            raise ForkServerUnavailable("the fork server is not running")
        assert self.sock is not None
        msg = json.dumps({"args": command[1:], "launcher": os.getpid(), "marker_env": self.marker_env,
                          "marker": marker}).encode()
        if len(msg) > MAX_REQUEST:
            raise ForkServerUnavailable(f"the command is too long to send ({len(msg)} bytes > {MAX_REQUEST})")
        try:
            socket.send_fds(self.sock, [msg], [log_fd])
        except OSError as exc:
            raise ForkServerUnavailable(f"the fork server's socket failed: {exc}") from None
        answer = self._answer(timeout_s)
        if answer.get("marker") != marker:  # no answer, or not to this request: start afresh
            self.close()
            _kill_marked(self.marker_env, marker)
            raise ForkServerUnavailable(f"the fork server did not answer this request: {answer.get('error', answer)}")
        if "error" in answer:
            if answer.get("pid"):
                _collect(int(answer["pid"]))
            raise ForkServerUnavailable(f"the fork server could not start the server: {answer['error']}")
        return ForkedProcess(list(command), int(answer["pid"]))

    def close(self) -> None:
        """Close its socket (it exits at end of file); SIGKILL it after 5 s. Idempotent."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


MAX_REQUEST = 1 << 16  # bytes of one request (nvfp4study_forkserver.MAX_REQUEST)
_SERVERS: dict[tuple, ForkServer] = {}
_FAILED: dict[tuple, str] = {}  # why a key's fork server failed to start: not tried again
#: held while a launch turns the subreaper on and is handed its server, and while a stop decides
#: to turn it off (process.py), so one thread's stop cannot leave another's server to init
LOCK = threading.RLock()


def _collect(pid: int, timeout_s: float = 5.0) -> None:
    """Reap ``pid``, a child of ours that is exiting (no zombie is left)."""
    end = time.monotonic() + timeout_s
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(pid, os.WNOHANG)[0] == 0 and time.monotonic() < end:
            time.sleep(0.01)


def _kill_marked(marker_env: str, marker: str) -> None:
    """SIGKILL and reap this process's children carrying ``marker`` (a server forked after its
    request was given up)."""
    import psutil

    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if child.environ().get(marker_env) == marker:
                child.kill()
                _collect(child.pid)


def start_forked(command: list[str], env: Mapping[str, str], marker: tuple[str, str], log,
                 cache_dir: Path) -> tuple[ForkedProcess, ForkServer]:
    """Start ``command`` (``[python, "-c", code, *args]``) as a server forked from this process's
    fork server for (python, ``env`` without the marker, working folder), starting one if needed
    (its preload output goes to ``log``, an open binary file, like the server's). A key whose fork
    server failed to start, or left a request unanswered, is not tried again in this process.

    Args:
        marker: (variable, value) of the launch marker (a 24-character value), which the server
            carries in its environment as an exec'd one would.

    Raises:
        ForkServerUnavailable: not a ``-c`` command of an interpreter binary, not Linux, or the
            fork server failed (the message says why).
    """
    marker_env, value = marker
    if len(command) < 3 or command[1] != "-c" or not Path("/proc/self/stat").exists():
        raise ForkServerUnavailable("only `python -c` commands on Linux are forked")
    if len(value) != len(PLACEHOLDER):
        raise ForkServerUnavailable(f"the launch marker must have {len(PLACEHOLDER)} characters")
    if _is_script(command[0]):  # a wrapper may run something else for `-c CODE` (the tests' fakes do)
        raise ForkServerUnavailable(f"the interpreter {command[0]} is a script, not Python itself")
    base = {k: v for k, v in env.items() if k != marker_env}
    if str(SITE_DIR) not in base.get("PYTHONPATH", "").split(os.pathsep):
        raise ForkServerUnavailable("the CPU engine's site folder is not on PYTHONPATH")
    key = (command[0], tuple(sorted(base.items())), os.getcwd())
    with LOCK:
        if key in _FAILED:
            raise ForkServerUnavailable(f"this environment's fork server failed earlier: {_FAILED[key]}")
        fs = _SERVERS.get(key)
        if fs is None or not fs.alive():
            if fs is not None:
                _SERVERS.pop(key).close()
            while len(_SERVERS) >= KEEP:
                _SERVERS.pop(next(iter(_SERVERS))).close()
            fs = ForkServer(command[0], base, marker_env, cache_dir, PROBE_MODULE)
            try:
                fs.start(log)
            except ForkServerUnavailable as exc:
                _FAILED[key] = str(exc)
                raise
            _SERVERS[key] = fs
        try:
            return fs.fork(command, value, log.fileno()), fs
        except ForkServerUnavailable as exc:
            if not fs.alive():  # it did not answer and was closed: not tried again either
                _SERVERS.pop(key, None)
                _FAILED[key] = str(exc)
            raise


def _is_script(path: str) -> bool:
    """Whether ``path`` is a ``#!`` script (or cannot be read): only an interpreter binary is
    known to run ``-c CODE`` as the fork server does."""
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return True


def pids() -> set[int]:
    """The pids of this process's live fork servers."""
    return {fs.proc.pid for fs in list(_SERVERS.values()) if fs.proc is not None and fs.alive()}


@atexit.register
def close_all() -> None:
    """Close every fork server of this process and forget earlier failures."""
    with LOCK:
        while _SERVERS:
            _SERVERS.popitem()[1].close()
        _FAILED.clear()
