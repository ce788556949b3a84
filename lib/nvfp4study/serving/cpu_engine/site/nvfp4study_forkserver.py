"""The CPU engine's fork server: one interpreter that has imported SGLang's third-party closure
(torch, transformers, fastapi, ... about 4,300 modules) forks each server of a launching process.

Started by :mod:`nvfp4study.serving.forkserver` with the server's environment (this folder first on
``PYTHONPATH``, so ``sitecustomize`` runs here exactly as in a server) plus the launch marker's
variable last, set to a placeholder of the marker's length. Stdlib only: it runs in SGLang's venv.

Why: every ``sglang serve`` of the CPU engine spent about 9 s of CPU importing before it did
anything, 7 s of it in modules that are the same for every launch (measured 2026-12-07, 2 cores:
``import sglang.srt.entrypoints.http_server`` 9.2 CPU-s in a fresh interpreter, 1.5 CPU-s in a
child forked after the modules below). SGLang's own modules are never imported here: the run's
overlay switches them per launch (clamp modes), so each server imports them itself.

Protocol, over the Unix ``SOCK_SEQPACKET`` socket whose fd is ``argv[1]`` (one JSON message each way):

1. at start: ``{"ready": true, "pid", "preloaded", "failed"}`` or ``{"error": "..."}`` (then exit);
2. per request ``{"args": [...], "launcher": pid, "marker_env": name, "marker": hex}`` with the log file's fd
   (``SCM_RIGHTS``): a child forks the server and exits, so the server is re-parented to the
   launcher (a child subreaper, ``PR_SET_CHILD_SUBREAPER``), which waits for it as for a
   ``Popen``; the answer is ``{"marker", "pid": n}`` or ``{"marker", "error": "...", "pid": n or
   null}`` (a pid with an error: a server that failed after it became the launcher's child);
3. end of file on the socket: exit.

The server, before it runs ``python -c CODE ARGS`` as the interpreter would: waits to be the
launcher's child, starts its own session (``setsid``: its pid is the process group the launcher
signals), asks for SIGTERM at the launcher's death (``PR_SET_PDEATHSIG``), writes the launch
marker over the placeholder in its initial environment block (what ``/proc/<pid>/environ`` shows,
so the launcher's leftover checks find it as they find an exec'd server) and in ``os.environ``,
re-seeds numpy's global generator as a fresh interpreter would have it (CPython re-seeds ``random``
in a forked child itself), and points
stdin at ``/dev/null``, stdout and stderr at the log. One thing cannot be drawn again: the string
hash seed (``PYTHONHASHSEED``) is fixed when an interpreter starts, so the servers of one fork
server share it (exec'd servers each draw their own); iteration over a set of strings is then
ordered alike in them.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import json
import os
import socket
import sys
import sysconfig
import threading
import time

#: modules never preloaded: SGLang's (the overlay switches them per launch) and the kernel ops
#: (the CPU engine's stand-in lives beside this file; a real build would be SGLang's too)
OWN = ("sglang", "sgl_kernel", "__main__", "nvfp4study_forkserver")
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _third_party(name: str, origin: str | None, roots: tuple[str, ...]) -> bool:
    if name.split(".")[0] in OWN or name in ("sitecustomize",):
        return False
    return origin in (None, "built-in", "frozen") or origin.startswith(roots)


def _roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(sorted({os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")}))


def _probe(module: str) -> list[str]:
    """Import ``module`` in a forked child; the modules it loaded from the interpreter's own
    library folders, in import order."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the probe: never returns
        os.close(r)
        code = 1
        try:
            importlib.import_module(module)
            roots = _roots()
            names = [n for n, m in list(sys.modules.items())
                     if _third_party(n, _origin(m), roots)]
            os.write(w, json.dumps(names).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"importing {module} failed in the probe")
    return json.loads(data)


def _origin(mod) -> str | None:
    spec = getattr(mod, "__spec__", None)
    origin = getattr(spec, "origin", None) or getattr(mod, "__file__", None)
    return os.path.realpath(origin) if origin and origin not in ("built-in", "frozen") else origin


def module_list(cache_dir: str, module: str) -> list[str]:
    """The probe's list, kept in ``cache_dir`` per interpreter, module and state of its
    site-packages (their folder's mtime changes when a package is added or removed): a stale
    list only costs speed (a missing module is skipped)."""
    purelib = sysconfig.get_paths()["purelib"]
    key = hashlib.sha256(f"{os.path.realpath(sys.executable)}\0{module}\0"
                         f"{os.stat(purelib).st_mtime_ns}".encode()).hexdigest()[:16]
    path = os.path.join(cache_dir, f"preload-{key}.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        pass
    names = _probe(module)
    os.makedirs(cache_dir, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(names, f)
    os.replace(tmp, path)
    return names


def preload(names: list[str]) -> tuple[int, int]:
    """Import ``names`` in order; returns (imported, failed)."""
    done = failed = 0
    for n in names:
        if n in sys.modules:
            continue
        try:
            importlib.import_module(n)
            done += 1
        except Exception:  # noqa: BLE001 - a module that imports only in some context: skipped
            failed += 1
    return done, failed


def _send(sock: socket.socket, msg: dict) -> None:
    try:
        sock.send(json.dumps(msg).encode())
    except OSError:  # the launcher closed its end (it gave up on us, or exited): nothing to serve
        os._exit(0)


def _fit_to_fork() -> str | None:
    """Why this interpreter must not fork servers, or None: SGLang's own modules loaded (the
    overlay's would be shadowed) or a second thread (a fork copies only the calling thread)."""
    own = sorted(n for n in sys.modules if n.split(".")[0] in OWN[:2])
    if own:
        return f"SGLang's modules were imported by the preload ({', '.join(own[:3])})"
    if threading.active_count() != 1 or len(os.listdir("/proc/self/task")) != 1:
        return "the preload started a thread"
    return None


MAX_REQUEST = 1 << 16  # bytes of one request (the launcher refuses larger ones first)


def serve(sock: socket.socket):
    """Answer fork requests until end of file; in a forked server, returns its request. Each
    answer names the request's marker; a malformed request is answered with an error."""
    while True:
        msg, fds, flags, _ = socket.recv_fds(sock, MAX_REQUEST, 1)
        if not msg:
            os._exit(0)
        try:
            req = json.loads(msg)
            marker = str(req["marker"])
        except (ValueError, KeyError, TypeError):
            req, marker = None, None
        if req is None or flags & socket.MSG_TRUNC or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            _send(sock, {"marker": marker, "error": f"malformed request ({len(msg)} bytes, {len(fds)} fds)"})
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        r, w = os.pipe()
        first = os.fork()
        if first == 0:
            if os.fork() == 0:
                os.close(r)
                return req, fds[0], w, sock
            os._exit(0)  # the server is re-parented to the launcher, its subreaper
        os.close(w)
        os.close(fds[0])
        os.waitpid(first, 0)
        with os.fdopen(r, "rb") as f:
            answer = f.read().decode()
        try:
            answer_msg = json.loads(answer)
        except ValueError:
            answer_msg = {"error": "the server exited before it was handed over"}
        _send(sock, {"marker": marker, **answer_msg})


def _handed_over(launcher: int, timeout_s: float = 10.0) -> bool:
    """Wait until this process is the launcher's child (its parent, the forked child, exited)."""
    end = time.monotonic() + timeout_s
    while os.getppid() != launcher:
        if time.monotonic() > end:
            return False
        time.sleep(0.001)
    return True


def _write_marker(name: str, marker: str) -> None:
    """Overwrite the placeholder value of variable ``name`` in the initial environment block (the
    bytes ``/proc/self/environ`` shows, fields 50-51 of ``/proc/self/stat``) with ``marker``, the
    same length; every other byte stays, so C code holding pointers into the block is unaffected."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    start, end = int(fields[47]), int(fields[48])  # env_start, env_end (fields 50, 51)
    block = ctypes.string_at(start, end - start)
    key = f"\0{name}=".encode()
    at = block.rfind(key)
    if at < 0:
        raise RuntimeError(f"{name} is not in the initial environment")
    old = block[at + len(key):].split(b"\0", 1)[0]
    if len(old) != len(marker):
        raise RuntimeError(f"the marker placeholder has {len(old)} characters, the marker {len(marker)}")
    ctypes.memmove(start + at + len(key), marker.encode(), len(marker))
    os.environ[name] = marker


def become_server(req: dict, log_fd: int, status_fd: int, sock: socket.socket) -> tuple[str, list[str]]:
    """Turn this forked child into the launch's server process (module docstring); returns the
    ``-c`` code and ``sys.argv`` to run. When it cannot, it says why on ``status_fd`` (with its pid
    once it is the launcher's child, which then collects its exit status) and exits (status 70)."""
    sock.close()
    handed = False
    try:
        if not _handed_over(int(req["launcher"])):
            raise RuntimeError(f"not re-parented to the launcher (parent {os.getppid()}); is it a subreaper?")
        handed = True
        os.setsid()
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, 15)  # SIGTERM
        if os.getppid() != int(req["launcher"]):
            raise RuntimeError("the launcher exited")
        _write_marker(str(req["marker_env"]), str(req["marker"]))
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()  # numpy's global generator is not re-seeded at fork
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(null)
        os.close(log_fd)
        args = list(req["args"])
        if len(args) < 2 or args[0] != "-c":
            raise RuntimeError(f"only `python -c CODE ...` is forked, got {args[:1]}")
    except Exception as exc:  # noqa: BLE001 - reported to the launcher, which falls back to exec
        os.write(status_fd, json.dumps({"error": str(exc), "pid": os.getpid() if handed else None}).encode())
        os._exit(70)
    os.write(status_fd, json.dumps({"pid": os.getpid()}).encode())
    os.close(status_fd)
    return args[1], ["-c", *args[2:]]


def main() -> None:
    """``python -c "import nvfp4study_forkserver as f; f.main()" SOCKET_FD CACHE_DIR MODULE``:
    preload, then serve; in each forked server, run its code as ``-c`` would."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    try:
        done, failed = preload(module_list(sys.argv[2], sys.argv[3]))
        why = _fit_to_fork()
    except Exception as exc:  # noqa: BLE001 - reported; the launcher falls back to exec
        why, done, failed = f"{type(exc).__name__}: {exc}", 0, 0
    if why:
        _send(sock, {"error": why})
        os._exit(1)
    _send(sock, {"ready": True, "pid": os.getpid(), "preloaded": done, "failed": failed})
    req, log_fd, status_fd, sock = serve(sock)
    code, argv = become_server(req, log_fd, status_fd, sock)
    main_mod = sys.modules["__main__"]
    for k in [k for k in vars(main_mod) if k not in ("__name__", "__doc__", "__package__", "__loader__",
                                                        "__spec__", "__annotations__", "__builtins__")]:
        delattr(main_mod, k)  # the -c globals of the server, as a fresh interpreter has them
    sys.argv = argv
    exec(compile(code, "<string>", "exec"), vars(main_mod))  # noqa: S102 - the launch's own command
