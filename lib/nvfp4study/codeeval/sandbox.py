"""Run a generated program against its assertions, inside bubblewrap.

Generated code is never executed in the harness process. :func:`check_program` builds the
program (the task's prompt, then the code), sends it on stdin to a small runner script inside a
``bwrap`` sandbox, and reads back one JSON result line on a private pipe.

The sandbox (``bwrap`` 0.8; flags from ``bwrap --help``; reference ``evaluation.md``):

* namespaces: ``--unshare-all --unshare-user``: no network (only a private loopback), own PID,
  IPC, UTS and cgroup namespaces; ``--uid 65534 --gid 65534`` (nobody) inside;
  ``--cap-drop ALL``; ``--new-session`` (no terminal injection); ``--die-with-parent``.
* file system: a fresh root holding only ``/usr`` (plus the ``/bin``, ``/lib``... links),
  ``/etc/ld.so.cache``, the interpreter's own prefix (read-only, so a Python under a 0700
  ``/root`` works), ``/proc`` of the new PID namespace, a minimal ``/dev`` and a private
  size-limited ``/tmp`` (tmpfs); the root is then remounted read-only. ``/work``, ``/root``'s
  other contents, ``/home`` and ``/etc/shadow`` do not exist inside. The environment is cleared.
* limits, set by the runner before the program starts (soft = hard, so the program cannot raise
  them): ``RLIMIT_AS`` (memory_mb), ``RLIMIT_CPU`` (cpu_s; SIGXCPU), ``RLIMIT_FSIZE``
  (file_size_mb), ``RLIMIT_CORE`` 0, ``RLIMIT_NOFILE`` 256. ``RLIMIT_NPROC`` is not used: it
  counts every task of the real user (threads included) and the kernel ignores it for root
  (kernel/fork.c exempts INIT_USER; as root the sandbox's nobody is root outside its user
  namespace). Processes are bounded by a watchdog instead: every 20 ms the harness walks the
  sandbox's process tree (``/proc/<pid>/task/*/children``) and kills the sandbox above
  ``max_processes`` processes or ``memory_mb`` of total RSS. Killing the PID namespace's init
  (bwrap) kills every process in it, so nothing survives a run.
* wall clock: after ``timeout_s`` the process group is killed with SIGKILL.
* output: stdout/stderr are drained continuously; the last ``output_tail_bytes`` are kept and a
  program that prints more than ``file_size_mb`` in total is killed (``killed``, "output limit").

Where ``bwrap`` is missing or cannot create its namespaces (e.g. user namespaces disabled), and
``isolation`` is ``auto``, the same runner runs as a plain subprocess in a fresh temporary
folder with the same rlimits, a cleared environment, its own session and the same watchdog, and
every result says ``isolation="subprocess"`` with the reason: this fallback has network access
and can read and write what the harness's user can. ``isolation: bwrap`` refuses to fall back.

Outcomes (:class:`Outcome`): the runner classifies what the program raised; the harness
classifies deaths (signal, watchdog, timeout) and silent exits. The result line is protected
against accidents (a program that exits, prints, closes stdout, or monkeypatches ``os``), not
against code written to forge the runner's protocol.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import psutil

from ..core.errors import SandboxUnavailable
from ..core.params import SandboxParams
from .tasks import Task

BWRAP = "bwrap"
NOBODY = 65534
POLL_S = 0.02  # watchdog period (seconds)


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


class Isolation(StrEnum):
    BWRAP = "bwrap"
    SUBPROCESS = "subprocess"


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
        isolation: ``bwrap`` or ``subprocess``.
        isolation_note: why the fallback was used ("" under bwrap).
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


# --- the runner (executed inside the sandbox by the sandbox's python -I) -----------------------
RUNNER = r'''
import json, os, resource, sys, traceback
_write, _exit, _dumps = os.write, os._exit, json.dumps
job = json.loads(sys.stdin.buffer.read().decode("utf-8"))
RFD, NONCE = job["result_fd"], job["nonce"]
for _key, (_soft, _hard) in job["limits"].items():
    try:
        resource.setrlimit(getattr(resource, _key), (_soft, _hard))
    except (ValueError, OSError, AttributeError):
        pass
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)

def _lineno(exc):
    line = getattr(exc, "lineno", None) if isinstance(exc, SyntaxError) else None
    for frame, lno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == "<candidate>":
            line = lno
    return line

def _report(outcome, phase, exc=None):
    rec = {"nonce": NONCE, "outcome": outcome, "phase": phase, "exception": None,
           "name": None, "message": "", "lineno": None}
    if exc is not None:
        rec["exception"] = type(exc).__name__
        try:
            rec["message"] = str(exc)[:300]
        except BaseException:
            rec["message"] = "<unprintable>"
        rec["lineno"] = _lineno(exc)
        if isinstance(exc, NameError):
            rec["name"] = getattr(exc, "name", None)
            if rec["name"] is None:  # UnboundLocalError carries no .name (3.11)
                import re
                m = re.search(r"'([A-Za-z_][A-Za-z0-9_]*)'", rec["message"])
                rec["name"] = m.group(1) if m else None
        try:
            traceback.print_exception(type(exc), exc, exc.__traceback__, limit=8)
        except BaseException:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    try:
        _write(RFD, (_dumps(rec) + "\n").encode())
    finally:
        _exit(0)

def _classify(exc):
    if isinstance(exc, SystemExit):
        return "exited"
    if isinstance(exc, AssertionError):
        return "assertion_failure"
    if isinstance(exc, NameError):
        return "name_error"
    if isinstance(exc, MemoryError):
        return "memory"
    return "exception"

ns = {"__name__": "candidate", "__builtins__": __builtins__}
try:
    code = compile(job["program"], "<candidate>", "exec")
except BaseException as exc:
    _report("syntax_error" if isinstance(exc, SyntaxError) else _classify(exc), "define", exc)
try:
    exec(code, ns)
except BaseException as exc:
    _report(_classify(exc), "define", exc)
fn = ns.get(job["entry_point"])
if not callable(fn):
    _report("entry_point_missing", "entry")
try:
    exec(compile(job["test"], "<test>", "exec"), ns)
except BaseException as exc:
    _report(_classify(exc), "test", exc)
try:
    ns["check"](fn)
except BaseException as exc:
    _report(_classify(exc), "check", exc)
_report("pass", "check")
'''


def prompt_preamble(task: Task) -> str:
    """The task's prompt without the entry point's own ``def`` (imports, constants and helper
    functions stay). Falls back to the whole prompt when it does not parse."""
    try:
        tree = ast.parse(task.prompt)
    except SyntaxError:
        return task.prompt
    lines = task.prompt.splitlines(keepends=True)
    drop: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == task.entry_point:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            drop.update(range(first - 1, node.end_lineno or node.lineno))
    return "".join(line for i, line in enumerate(lines) if i not in drop)


def build_program(task: Task, code: str, prepend_prompt: bool = True) -> str:
    """The program that is executed.

    * ``code`` whose first non-blank line is indented is a body completing the prompt's function (HumanEval's
      canonical solutions): ``prompt + code``.
    * any other ``code`` is a full program: :func:`prompt_preamble` (the prompt's imports and
      helpers, e.g. 23 HumanEval prompts import from ``typing`` and HumanEval/10 defines
      ``is_palindrome``, but NOT the entry point's docstring-only ``def``), then ``code``. So
      junk on the function's name (``def binary_searchulp``) leaves the entry point undefined
      and is reported as ``entry_point_missing``, not hidden by the prompt's stub.
    * ``prepend_prompt=False``: ``code`` alone.
    """
    return _assemble(task, code, prepend_prompt)[0]


def _assemble(task: Task, code: str, prepend_prompt: bool) -> tuple[str, int]:
    """(program, number of program lines before ``code``'s first line)."""
    if not prepend_prompt:
        return code, 0
    first = next((line for line in code.splitlines() if line.strip()), "")
    if first[:1] in (" ", "\t"):
        prompt = task.prompt if task.prompt.endswith("\n") else task.prompt + "\n"
        return prompt + code, prompt.count("\n")
    preamble = prompt_preamble(task).rstrip()
    if not preamble:
        return code, 0
    return f"{preamble}\n\n{code}", preamble.count("\n") + 2


def _limits(params: SandboxParams) -> dict[str, tuple[int, int]]:
    mb = 1024 * 1024
    return {
        "RLIMIT_AS": (params.memory_mb * mb, params.memory_mb * mb),
        "RLIMIT_CPU": (params.cpu_s, params.cpu_s + 1),  # SIGXCPU at soft, SIGKILL at hard
        "RLIMIT_FSIZE": (params.file_size_mb * mb, params.file_size_mb * mb),
        "RLIMIT_CORE": (0, 0),
        "RLIMIT_NOFILE": (256, 256),
    }


def sandbox_python(params: SandboxParams) -> str:
    """The interpreter run in the sandbox: ``params.python`` or the real path of this one.

    The real path of a venv's ``python`` is its base interpreter, which (run with ``-I``) has
    only the standard library: generated code gets no site-packages of the study's venv.
    """
    return os.path.realpath(params.python or sys.executable)


@functools.lru_cache(maxsize=8)
def python_roots(python: str) -> tuple[str, ...]:
    """Folders the interpreter needs, bound read-only into the sandbox: ``<prefix>`` of
    ``<prefix>/bin/pythonX.Y`` (a venv or an installation) and the stdlib's base prefix and
    exec prefix (asked from the interpreter itself, once), minus anything under ``/usr``."""
    roots = {str(Path(python).parent.parent)}
    try:
        out = subprocess.run([python, "-I", "-c",
                              "import sys; print(sys.base_prefix); print(sys.base_exec_prefix)"],
                             capture_output=True, text=True, timeout=30)
        roots |= {os.path.realpath(line) for line in out.stdout.splitlines() if line.strip()}
    except (OSError, subprocess.TimeoutExpired):
        pass
    keep = [r for r in roots if r != "/" and r != "/usr" and not r.startswith("/usr/")]
    return tuple(sorted(keep, key=lambda r: (r.count("/"), r)))  # outer folders first


def _bwrap_path() -> str | None:
    return shutil.which(BWRAP)


def bwrap_args(python: str, params: SandboxParams) -> list[str]:
    """The ``bwrap`` command line (without the program) for ``python``."""
    args = [
        _bwrap_path() or BWRAP, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
        "--cap-drop", "ALL", "--uid", str(NOBODY), "--gid", str(NOBODY), "--hostname", "sandbox",
        "--ro-bind", "/usr", "/usr",
    ]
    for d in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / d
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
             "--proc", "/proc", "--dev", "/dev",
             "--size", str(params.tmp_size_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    for root in python_roots(python):
        args += ["--ro-bind", root, root]  # after --tmpfs: a prefix under /tmp stays visible
    args += ["--remount-ro", "/", "--chdir", "/tmp", "--clearenv",
             "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
             "--setenv", "TMPDIR", "/tmp", "--setenv", "LANG", "C.UTF-8"]
    return args


@functools.lru_cache(maxsize=8)
def _bwrap_probe(python: str, tmp_size_mb: int) -> tuple[bool, str]:
    """(usable, reason): can bwrap run ``python`` here? Cached per interpreter."""
    if _bwrap_path() is None:
        return False, "bwrap not found on PATH"
    args = bwrap_args(python, SandboxParams(tmp_size_mb=tmp_size_mb))
    try:
        r = subprocess.run([*args, "--", python, "-I", "-c", "print('ok')"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bwrap failed to start: {exc}"
    if r.returncode != 0 or r.stdout.strip() != "ok":
        return False, f"bwrap cannot run here: {(r.stderr or r.stdout).strip()[:200]}"
    return True, ""


@functools.lru_cache(maxsize=1)
def _bwrap_version() -> str | None:
    path = _bwrap_path()
    if path is None:
        return None
    try:
        return subprocess.run([path, "--version"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def sandbox_status(params: SandboxParams) -> dict[str, Any]:
    """Which isolation :func:`check_program` will use with ``params``, and why.

    Returns:
        ``{"isolation": "bwrap"|"subprocess", "note": str, "python": path, "bwrap_version": str|None}``.

    Raises:
        SandboxUnavailable: ``params.isolation == "bwrap"`` and bwrap cannot run.
    """
    python = sandbox_python(params)
    version = _bwrap_version()
    if params.isolation == "subprocess":
        return {"isolation": "subprocess", "note": "isolation: subprocess requested in params",
                "python": python, "bwrap_version": version}
    ok, reason = _bwrap_probe(python, params.tmp_size_mb)
    if ok:
        return {"isolation": "bwrap", "note": "", "python": python, "bwrap_version": version}
    if params.isolation == "bwrap":
        raise SandboxUnavailable(f"sandbox.isolation is 'bwrap' but {reason}")
    return {"isolation": "subprocess", "note": f"fallback (weaker isolation): {reason}",
            "python": python, "bwrap_version": version}


class _Tail:
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


def _descendants(pid: int, limit: int = 100_000) -> list[int]:
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


def _proc_stat(pid: int) -> tuple[int, float, int] | None:
    """(RSS bytes, CPU seconds user+system, start time in clock ticks) from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is field 3 (state): utime 14, stime 15, starttime 22, rss 24 (proc(5))
    return int(fields[21]) * _PAGE, (int(fields[11]) + int(fields[12])) / _CLK_TCK, int(fields[19])


def _kill(proc: subprocess.Popen, seen: dict[int, int]) -> None:
    """SIGKILL the sandbox's process group and every descendant ever seen (``{pid: start
    time}``; a pid whose start time changed was recycled and is left alone)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid, start in seen.items():
        st = _proc_stat(pid)
        if st is not None and st[2] == start:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


MARKER_ENV = "NVFP4STUDY_SANDBOX"  # fallback mode: marks every process a run started


def _reap_marked(marker: str, since: float) -> int:
    """Fallback mode: SIGKILL processes started since ``since`` (epoch s) whose environment
    carries ``MARKER_ENV=marker`` (children that left the process group with setsid).
    Repeats until a pass finds none (at most 5 passes). Returns how many were killed."""
    killed = 0
    for _ in range(5):
        found = 0
        for p in psutil.process_iter(["create_time"]):
            if (p.info.get("create_time") or 0) < since - 1:
                continue
            try:
                if p.environ().get(MARKER_ENV) == marker:
                    p.kill()
                    found += 1
            except psutil.Error:
                continue
        killed += found
        if not found:
            break
    return killed


def _signal_of(rc: int | None, isolation: str) -> int | None:
    if rc is None:
        return None
    if rc < 0:
        return -rc
    if isolation == Isolation.BWRAP and rc > 128 and (rc - 128) in signal.valid_signals():
        return rc - 128  # bwrap exits with 128 + signal when its child is killed
    return None


def _result_line(data: bytes, nonce: str) -> dict[str, Any] | None:
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("nonce") == nonce:
            return rec
    return None


def check_program(task: Task, code: str, params: SandboxParams | None = None, *,
                  prepend_prompt: bool = True) -> ExecResult:
    """Run ``code`` against ``task``'s checks in the sandbox and classify what happened.

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
    python = status["python"]
    isolation = status["isolation"]
    nonce = secrets.token_hex(16)
    rfd, wfd = os.pipe()
    program, offset = _assemble(task, code, prepend_prompt)
    job = {"program": program, "test": task.test,
           "entry_point": task.entry_point, "nonce": nonce, "result_fd": wfd,
           "limits": _limits(params)}
    argv = [python, "-I", "-c", RUNNER]
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
    start, started_epoch = time.monotonic(), time.time()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, pass_fds=(wfd,), cwd=cwd, env=env,
                                start_new_session=True, close_fds=True)
    except OSError as exc:
        os.close(rfd)
        os.close(wfd)
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        return ExecResult(task.task_id, Outcome.SANDBOX_ERROR.value, None, None, str(exc), None,
                          None, "could not start", isolation, status["note"], 0.0, None, None,
                          "", "", 0)
    os.close(wfd)
    try:
        proc.stdin.write(json.dumps(job).encode())
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass
    out, err = _Tail(params.output_tail_bytes), _Tail(params.output_tail_bytes)
    result_buf = bytearray()
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    sel.register(rfd, selectors.EVENT_READ, None)
    seen: dict[int, int] = {}  # pid -> start time (clock ticks) of every descendant seen
    reason = ""
    max_cpu = 0.0  # largest CPU time (s) seen for one sandbox process (RLIMIT_CPU is per process)
    exited_at = None
    base = 1 if isolation == Isolation.BWRAP else -1  # bwrap's own init inside the namespace
    output_cap = params.file_size_mb * 1024 * 1024
    try:
        next_poll = start + POLL_S
        while True:
            now = time.monotonic()
            remaining = start + params.timeout_s - now
            if remaining <= 0:
                reason = f"wall clock {params.timeout_s:g} s"
                break
            if not sel.get_map():  # all pipes closed: only the exit is left to wait for
                try:
                    proc.wait(timeout=min(POLL_S, remaining))
                except subprocess.TimeoutExpired:
                    pass
            for key, _ in sel.select(timeout=min(POLL_S, remaining)) if sel.get_map() else ():
                fd = key.fd
                data = os.read(fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                elif key.data is None:
                    result_buf += data
                else:
                    key.data.add(data)
            if out.total + err.total > output_cap:
                reason = "output limit"
                break
            if proc.poll() is not None:
                exited_at = exited_at or time.monotonic()
                if not sel.get_map() or time.monotonic() - exited_at > 0.5:
                    break  # all pipes closed (or held by an orphan: killed below)
                continue
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + POLL_S
                pids = _descendants(proc.pid)
                if len(pids) - base > params.max_processes:
                    reason = "process limit"
                    break
                rss = 0
                for pid in pids:
                    st = _proc_stat(pid)
                    if st is None:
                        continue
                    seen.setdefault(pid, st[2])
                    rss += st[0]
                    max_cpu = max(max_cpu, st[1])
                if rss > params.memory_mb * 1024 * 1024:
                    reason = "memory limit"
                    break
    finally:
        _kill(proc, seen)
        proc.wait()
        if isolation == Isolation.SUBPROCESS:
            _reap_marked(nonce, started_epoch)
        for key in list(sel.get_map().values()):
            try:
                os.set_blocking(key.fd, False)  # an escaped orphan may still hold the pipe
                data = os.read(key.fd, 65536)
                (result_buf.extend(data) if key.data is None else key.data.add(data))
            except OSError:
                pass
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
        os.close(rfd)
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    duration = time.monotonic() - start
    rc = proc.returncode
    rec = _result_line(bytes(result_buf), nonce)
    sig = _signal_of(rc, isolation)
    signame = signal.Signals(sig).name if sig else None
    common = dict(task_id=task.task_id, isolation=isolation, isolation_note=status["note"],
                  duration_s=round(duration, 4), returncode=rc, signal=signame,
                  stdout_tail=out.text(), stderr_tail=err.text(),
                  output_bytes=out.total + err.total)
    if rec is not None:
        return ExecResult(outcome=rec["outcome"], exception=rec["exception"], name=rec["name"],
                          message=rec["message"], phase=rec["phase"],
                          lineno=_code_line(rec["lineno"], offset),
                          detail="", signal=None, **{k: v for k, v in common.items()
                                                     if k != "signal"})
    if not reason and sig == signal.SIGKILL and max_cpu >= params.cpu_s - 0.05:
        reason = "cpu limit"  # the hard RLIMIT_CPU (SIGXCPU ignored or not delivered in time)
    return ExecResult(**_death(reason, sig, signame, rc, err.text(), isolation), **common)


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
