"""The sandbox's isolation: the ``bwrap`` command line, the probe, and the subprocess fallback.

Generated code runs inside bubblewrap (``bwrap`` 0.8, Debian package ``bubblewrap``; every flag
below is in ``bwrap --help``), as uid 65534 inside:

* namespaces: ``--unshare-all --unshare-user``: no network (only a private loopback), own PID,
  IPC, UTS and cgroup namespaces; ``--disable-userns``: no further user namespace inside (without
  it, ``unshare(CLONE_NEWUSER|CLONE_NEWNS|CLONE_NEWCGROUP)`` gave the program the privilege to
  mount a cgroup file system of its own and reach its pids cgroup's limit;
  bwrap 0.8.0 and newer); ``--uid 65534 --gid 65534`` (nobody) inside;
  ``--cap-drop ALL``; ``--new-session`` (no terminal injection); ``--die-with-parent``.
* file system: a fresh root holding only ``/usr`` (plus the ``/bin``, ``/lib``... links),
  ``/etc/ld.so.cache``, the interpreter's own prefix (read-only, so a Python under a 0700
  ``/root`` works), ``/proc`` of the new PID namespace, a minimal ``/dev`` and a private
  size-limited ``/tmp`` (tmpfs); the root is then remounted read-only. ``/work``, ``/root``'s
  other contents, ``/home`` and ``/etc/shadow`` do not exist inside. The environment is cleared.
  The interpreter's prefix is bound after ``--tmpfs /tmp``, because the tmpfs would otherwise
  hide an interpreter (a venv) that lives under ``/tmp``.
* limits (:func:`rlimits`), set by the runner before the program starts (soft = hard, so the
  program cannot raise them): ``RLIMIT_AS`` (memory_mb), ``RLIMIT_CPU`` (cpu_s; SIGXCPU),
  ``RLIMIT_FSIZE`` (file_size_mb), ``RLIMIT_CORE`` 0, ``RLIMIT_NOFILE`` 256. ``RLIMIT_NPROC``
  is not used: it counts every task of the real user (threads included) and the kernel ignores
  it for root (kernel/fork.c exempts INIT_USER; as root the sandbox's nobody is root outside
  its user namespace). Processes are bounded by the watchdog
  (:mod:`nvfp4study.codeeval.watchdog`) and, where a pids cgroup can be made, by a hard cap on
  tasks that holds between its polls (:mod:`nvfp4study.codeeval.task_cap`).

The sandbox fails closed. ``isolation: bwrap`` (the default) needs a working bubblewrap: where
``bwrap`` is missing or cannot set up its sandbox (no user namespaces, a bad ``--size``...),
:func:`sandbox_status` raises :class:`~nvfp4study.core.errors.SandboxUnavailable` with the
probe's reason, and the stage stops; nothing falls back by itself. Only ``isolation:
subprocess-unsafe``, asked for by that name, runs the same runner as a plain subprocess in a
fresh temporary folder with the same rlimits, a cleared environment, its own session and the
same watchdog. That mode has network access and can read and write what the harness's user can
(as root: everything); every result says ``isolation="subprocess-unsafe"`` with
:data:`UNSAFE_NOTE`, and stage 05 repeats it in the notebook and in every ledger note.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from enum import StrEnum
from pathlib import Path
from typing import Any

from ..core.errors import SandboxUnavailable
from ..core.params import SandboxParams
from .task_cap import cap_description

BWRAP = "bwrap"
NOBODY = 65534


class Isolation(StrEnum):
    """How a program was run: inside bwrap, or (asked for by name) as a plain subprocess."""

    BWRAP = "bwrap"
    SUBPROCESS_UNSAFE = "subprocess-unsafe"


#: the note every result of ``isolation: subprocess-unsafe`` carries.
UNSAFE_NOTE = ("UNSAFE: sandbox.isolation is 'subprocess-unsafe' (asked for in params): generated "
               "code ran as a plain subprocess of the harness's user, with its file and network "
               "access, not inside bubblewrap")


def rlimits(params: SandboxParams) -> dict[str, tuple[int, int]]:
    """``{resource name: (soft, hard)}`` for the runner's ``resource.setrlimit`` (bytes, seconds)."""
    mb = 1024 * 1024
    return {
        "RLIMIT_AS": (params.memory_mb * mb, params.memory_mb * mb),
        "RLIMIT_CPU": (params.cpu_s, params.cpu_s + 1),  # SIGXCPU at soft, SIGKILL at hard
        "RLIMIT_FSIZE": (params.file_size_mb * mb, params.file_size_mb * mb),
        "RLIMIT_CORE": (0, 0),
        "RLIMIT_NOFILE": (256, 256),
    }


#: How the sandboxed interpreter runs: ``-I`` (isolated: no PYTHON* variables, no user site, no
#: script folder on sys.path) and ``-S`` (no ``site``: no site-packages at all). Without ``-S`` the
#: base interpreter's own site-packages stayed on sys.path (on these machines pyenv's, with IPython,
#: awscli and a ``.pth`` that imports certifi at every start): generated code could import
#: whatever the machine had installed, and ``site`` took 30 of the 40 ms of each start.
PYTHON_FLAGS = ("-I", "-S")


def sandbox_python(params: SandboxParams) -> str:
    """The interpreter run in the sandbox: ``params.python`` or the real path of this one.

    The real path of a venv's ``python`` is its base interpreter; run with :data:`PYTHON_FLAGS`
    it has only the standard library: generated code gets no site-packages, neither the study
    venv's nor the base interpreter's.
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
        _bwrap_path() or BWRAP, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
        "--new-session",
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
    args = bwrap_args(python, SandboxParams().model_copy(update={"tmp_size_mb": tmp_size_mb}))
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
    """Which isolation :func:`check_program` will use with ``params``; fails closed.

    Returns:
        ``{"isolation": "bwrap"|"subprocess-unsafe", "note": str, "python": path,
        "bwrap_version": str|None, "process_cap": str}``; ``note`` is "" under bwrap and
        :data:`UNSAFE_NOTE` else; ``process_cap`` says how the processes are bounded
        (:func:`~nvfp4study.codeeval.task_cap.cap_description`).

    Raises:
        SandboxUnavailable: ``params.isolation == "bwrap"`` and bwrap cannot run here (the
            message gives the probe's reason and how to ask for the unsafe mode by name).
    """
    python = sandbox_python(params)
    version = _bwrap_version()
    if params.isolation == Isolation.SUBPROCESS_UNSAFE:
        return {"isolation": Isolation.SUBPROCESS_UNSAFE.value, "note": UNSAFE_NOTE,
                "python": python, "bwrap_version": version, "process_cap": cap_description()}
    ok, reason = _bwrap_probe(python, params.tmp_size_mb)
    if not ok:
        raise SandboxUnavailable(
            f"the sandbox (corruption.sandbox.isolation: bwrap) cannot be set up: {reason}. "
            "Generated code is not run without it; fix bubblewrap, or set "
            "corruption.sandbox.isolation: subprocess-unsafe to run it as a plain subprocess "
            "with the harness's file and network access")
    return {"isolation": Isolation.BWRAP.value, "note": "", "python": python,
            "bwrap_version": version, "process_cap": cap_description()}
