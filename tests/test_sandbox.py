"""The sandbox: hostile programs contained, outcomes classified, the harness unharmed.

HOSTILE below is the list of hostile programs (32). Each runs inside bubblewrap against the
``card/binary_search`` task; the test checks its outcome and then that the harness is unharmed:
no file with the session's marker on the host (/, the repo, $HOME, /tmp), no process left (no
child of the test process, no process whose command line carries the marker), the canaries
still in place, the harness's cwd unchanged, and nothing secret in the program's output.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from nvfp4study.codeeval import isolation
from nvfp4study.codeeval.isolation import Isolation, sandbox_status
from nvfp4study.codeeval.program import build_program, prompt_preamble
from nvfp4study.codeeval.sandbox import Outcome, check_many, check_program
from nvfp4study.codeeval.tasks import card_tasks, humaneval_tasks, task_index
from nvfp4study.core.errors import SandboxUnavailable
from nvfp4study.core.params import SandboxParams

REPO = Path(__file__).resolve().parents[1]
HOME = Path(os.path.expanduser("~"))
TOKEN = "nvfp4hostile" + secrets.token_hex(6)  # marks every file/process a hostile program makes
SECRET = "s3cret-" + secrets.token_hex(8)
TASK = card_tasks()[0]  # card/binary_search
GOOD = """
def binary_search(arr, x):
    lo, hi = 0, len(arr) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if arr[mid] == x:
            return mid
        if arr[mid] < x:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1
"""
# tight limits so the slow cases stay short
HOSTILE_PARAMS = SandboxParams(timeout_s=4.0, cpu_s=2, memory_mb=512, file_size_mb=4,
                               tmp_size_mb=8, max_processes=16)
#: the allocation case's CPU limit: filling 512 MB costs about 0.3 s of CPU on an idle machine, but once
#: took over 2 s under memory pressure (page reclaim is charged to the process: SIGXCPU before the
#: memory limit, a fresh-clone `make test`); the case is about the memory limit, so the CPU limit is
#: lifted to the wall clock's
ALLOC_CPU = {"cpu_s": 4}


def _params_for(name: str, **update) -> SandboxParams:
    return HOSTILE_PARAMS.model_copy(update={**update, **(ALLOC_CPU if name == "unbounded_allocation" else {})})

try:
    BWRAP_OK = sandbox_status(SandboxParams())["isolation"] == Isolation.BWRAP
except SandboxUnavailable:
    BWRAP_OK = False
needs_bwrap = pytest.mark.skipif(not BWRAP_OK, reason="bubblewrap cannot run on this machine")

E, K, T, P, X, M = (Outcome.EXCEPTION, Outcome.KILLED, Outcome.TIMEOUT, Outcome.PASS,
                    Outcome.EXITED, Outcome.MEMORY)

# (id, program template, accepted outcomes, accepted exception classes or None = any)
# Templates are formatted with TOKEN, REPO, HOME, PORT, CANARY_TMP, CANARY_HOME, GOOD.
HOSTILE: list[tuple[str, str, set[str], set[str] | None]] = [
    ("fork_bomb", "import os\nwhile True:\n    os.fork()\n", {K, E}, {"BlockingIOError", None}),
    ("infinite_loop", "while True:\n    pass\n", {T}, None),
    ("unbounded_allocation", "x = []\nwhile True:\n    x.append(bytearray(10**7))\n", {M}, None),
    ("write_root", "open('/{TOKEN}', 'w').write('x')\n", {E}, {"OSError", "PermissionError"}),
    ("write_work", "open('{REPO}/{TOKEN}', 'w').write('x')\n", {E},
     {"FileNotFoundError", "PermissionError", "OSError"}),
    ("write_home", "open('{HOME}/{TOKEN}', 'w').write('x')\n", {E},
     {"FileNotFoundError", "PermissionError", "OSError"}),
    ("write_tmp", "open('/tmp/{TOKEN}', 'w').write('x')\n{GOOD}", {P}, None),
    ("connect_localhost",
     "import socket\nsocket.create_connection(('127.0.0.1', {PORT}), timeout=2)\n", {E},
     {"ConnectionRefusedError", "OSError", "TimeoutError"}),
    ("connect_internet",
     "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)\n", {E},
     {"OSError", "TimeoutError"}),
    ("dns_lookup", "import socket\nsocket.getaddrinfo('pypi.org', 443)\n", {E}, {"gaierror"}),
    ("sys_exit_before_asserts", "{GOOD}\nimport sys\nsys.exit(0)\n", {X}, {"SystemExit"}),
    ("os_exit", "{GOOD}\nimport os\nos._exit(0)\n", {X}, {None}),
    ("kill_parent", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n{GOOD}", {P}, None),
    ("kill_everything", "import os, signal\nos.kill(-1, signal.SIGKILL)\n{GOOD}", {E, K, P},
     None),
    ("signal_tricks",
     "import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGXCPU,"
     " signal.SIGALRM):\n    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass\n",
     {T}, None),
    ("read_etc_shadow", "print(open('/etc/shadow').read())\n", {E},
     {"FileNotFoundError", "PermissionError"}),
    ("read_root", "import os\nprint(sorted(os.listdir('/root')))\n"
     "print(open('{CANARY_HOME}').read())\n", {E}, {"FileNotFoundError", "PermissionError"}),
    ("huge_stdout", "while True:\n    print('x' * 100000)\n", {K}, None),
    ("deep_recursion", "def f(n):\n    return f(n + 1)\nf(0)\n", {E}, {"RecursionError"}),
    ("threads_spinning",
     "import threading\nfor _ in range(4):\n    threading.Thread(target=lambda: [0 for _ in"
     " iter(int, 1)]).start()\n{GOOD}", {P}, None),
    ("subprocess_spawn",
     "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; "
     "time.sleep(600)  # {TOKEN}'], start_new_session=True)\n{GOOD}", {P}, None),
    ("shell_escape", "import os\nos.system('echo x > /{TOKEN}; (sleep 600; : {TOKEN}) &')\n{GOOD}",
     {P}, None),
    ("ctypes_segfault", "import ctypes\nctypes.string_at(0)\n", {K}, None),
    ("change_cwd", "import os\nos.chdir('/')\n{GOOD}", {P}, None),
    ("delete_files", "import os\nos.remove('{CANARY_TMP}')\n", {E}, {"FileNotFoundError"}),
    ("delete_home_file", "import os\nos.remove('{CANARY_HOME}')\n", {E},
     {"FileNotFoundError", "PermissionError", "OSError"}),
    ("env_var_leak",
     "import glob, os\nprint(dict(os.environ))\nfor f in glob.glob('/proc/*/environ'):\n"
     "    try:\n        print(open(f, 'rb').read())\n    except OSError:\n        pass\n{GOOD}",
     {P}, None),
    ("raise_rlimits", "import resource\nresource.setrlimit(resource.RLIMIT_AS, "
     "(resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n", {E}, {"ValueError"}),
    ("write_huge_file", "open('/tmp/big', 'wb').write(b'x' * (5 * 2**20))\n", {E}, {"OSError"}),
    ("fill_tmp", "i = 0\nwhile True:\n    open(f'/tmp/f{{i}}', 'wb').write(b'x' * 2**20)\n"
     "    i += 1\n", {E}, {"OSError"}),
    ("close_result_pipe", "import os\nos.closerange(3, 256)\n{GOOD}", {X}, None),
    ("become_root", "import os\nos.setuid(0)\n", {E}, {"PermissionError", "OSError"}),
    # a user namespace of its own would let the program mount a cgroup file system and reach its
    # pids cgroup's limit (bwrap --disable-userns refuses it: ENOSPC)
    ("nested_user_namespace", "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
     "if libc.unshare(0x10000000 | 0x00020000 | 0x02000000) != 0:\n"
     "    raise OSError(ctypes.get_errno(), 'unshare refused')\n{GOOD}", {E}, {"OSError"}),
    ("read_stdin", "input()\n", {E}, {"EOFError"}),
]


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """A listening socket on 127.0.0.1, canaries in /tmp and $HOME, the secret in the env."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    canary_tmp = tmp_path_factory.mktemp("canary") / f"{TOKEN}-canary"
    canary_tmp.write_text("canary")
    canary_home = HOME / f".{TOKEN}-canary"
    canary_home.write_text("canary")
    os.environ["NVFP4STUDY_TEST_SECRET"] = SECRET
    try:
        yield {"server": server, "PORT": server.getsockname()[1], "CANARY_TMP": str(canary_tmp),
               "CANARY_HOME": str(canary_home)}
    finally:
        os.environ.pop("NVFP4STUDY_TEST_SECRET", None)
        canary_home.unlink(missing_ok=True)
        server.close()
        for d in (Path("/"), REPO, HOME, Path("/tmp")):
            for p in d.glob(f"{TOKEN}*"):
                p.unlink(missing_ok=True)


def _marked_processes() -> list[str]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info.get("cmdline") or [])
        if TOKEN in cmd:
            out.append(f"{p.pid}: {cmd}")
    return out


def _assert_harness_unharmed(host, cwd_before: str) -> None:
    leaked = [str(p) for d in (Path("/"), REPO, HOME, Path("/tmp")) for p in d.glob(f"{TOKEN}*")
              if not p.name.endswith("-canary")]
    assert leaked == [], f"files written on the host: {leaked}"
    assert Path(host["CANARY_TMP"]).read_text() == "canary"
    assert Path(host["CANARY_HOME"]).read_text() == "canary"
    assert psutil.Process().children(recursive=True) == []
    assert _marked_processes() == []
    assert os.getcwd() == cwd_before
    with pytest.raises(BlockingIOError):
        host["server"].accept()  # nobody connected to the harness's port


@needs_bwrap
@pytest.mark.parametrize("name,template,outcomes,exceptions", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_program_contained(host, name, template, outcomes, exceptions):
    code = template.format(TOKEN=TOKEN, REPO=REPO, HOME=HOME, GOOD=GOOD, **{
        k: host[k] for k in ("PORT", "CANARY_TMP", "CANARY_HOME")})
    cwd = os.getcwd()
    r = check_program(TASK, code, _params_for(name))
    assert r.isolation == Isolation.BWRAP and r.isolation_note == ""
    assert r.outcome in outcomes, (r.outcome, r.exception, r.detail, r.message, r.stderr_tail)
    if exceptions is not None:
        assert r.exception in exceptions, (r.exception, r.message)
    assert r.duration_s < HOSTILE_PARAMS.timeout_s + 2
    out = r.stdout_tail + r.stderr_tail + r.message
    assert SECRET not in out
    assert "root:" not in out  # no line of a real passwd/shadow file
    _assert_harness_unharmed(host, cwd)


def test_hostile_list_is_long_enough():
    assert len(HOSTILE) >= 20 and len({h[0] for h in HOSTILE}) == len(HOSTILE)


@needs_bwrap
def test_hostile_details(host):
    """Specific classifications: what killed the program, and what it could see."""
    p = HOSTILE_PARAMS.model_copy(update={"timeout_s": 10.0, "cpu_s": 1})
    loop = check_program(TASK, "while True:\n    pass\n", p)
    assert loop.outcome == T and loop.detail == "cpu limit" and loop.signal in {"SIGXCPU", "SIGKILL"}
    stubborn = check_program(TASK, "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n"
                             "while True:\n    pass\n", p)
    assert stubborn.outcome == T and stubborn.detail == "cpu limit" and stubborn.signal == "SIGKILL"
    short = p.model_copy(update={"timeout_s": 1.5})
    sleeper = check_program(TASK, "import time\ntime.sleep(100)\n", short)  # no CPU used
    assert sleeper.outcome == T and sleeper.detail == "wall clock 1.5 s"
    assert 1.5 <= sleeper.duration_s < 3.5
    flood = check_program(TASK, "while True:\n    print('x' * 100000)\n", p)
    assert flood.detail == "output limit" and len(flood.stdout_tail) <= p.output_tail_bytes
    segv = check_program(TASK, "import ctypes\nctypes.string_at(0)\n", p)
    assert segv.signal == "SIGSEGV" and segv.detail == "SIGSEGV"
    seen = check_program(TASK, "import os\nraise RuntimeError(repr((os.getuid(), os.getppid(), "
                         "sorted(os.listdir('/')), os.path.exists('/work'))))\n", p)
    uid, ppid, root, work = eval(seen.message)  # noqa: S307 (our own repr of plain values)
    assert uid == 65534 and ppid == 1 and work is False
    assert set(root) <= {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "proc",
                         "dev", "tmp", "root", "opt", "home", "run"} | {Path(isolation.sandbox_python(p)).parts[1]}
    listing = check_program(TASK, "import os\nraise RuntimeError(repr(sorted(os.listdir('/root'))"
                            " if os.path.isdir('/root') else []))\n", p)
    visible = {Path(r).relative_to("/root").parts[0] for r in isolation.python_roots(
        isolation.sandbox_python(p)) if r.startswith("/root/")}
    assert set(eval(listing.message)) <= visible  # noqa: S307 (our own repr)
    host_only = set(os.listdir("/root")) - visible if os.access("/root", os.R_OK) else set()
    assert not host_only & set(eval(listing.message))  # noqa: S307
    _assert_harness_unharmed(host, os.getcwd())


# --- classification ----------------------------------------------------------------------------
def test_outcome_classes():
    p = SandboxParams(timeout_s=5)
    cases = {
        # the card's junk, as execution sees it
        "def binary_search(arr, x):\n    seen = set()\n    seen.add(culp)\n    return -1\n":
            (Outcome.NAME_ERROR, "NameError", "culp", 3),
        "def binary_search(arr, x):\n    stack = []\n    stack.append(x)ulp\n":
            (Outcome.SYNTAX_ERROR, "SyntaxError", None, 3),
        "def binary_searchulp(arr, x):\n    return -1\n":
            (Outcome.ENTRY_POINT_MISSING, None, None, None),
        "def binary_search(arr, x):\n    return 0\n":
            (Outcome.ASSERTION_FAILURE, "AssertionError", None, None),
        "def binary_search(arr, x):\n    return arr[len(arr)]\n":
            (Outcome.EXCEPTION, "IndexError", None, 2),
        "def binary_search(arr, x):\n    count = 0\n    def inc():\n        count += 1\n"
        "    inc()\n":
            (Outcome.NAME_ERROR, "UnboundLocalError", "count", 4),
        "import numpy_does_not_exist\n": (Outcome.EXCEPTION, "ModuleNotFoundError", None, 1),
        "x = [0] * (10**12)\n": (Outcome.MEMORY, "MemoryError", None, 1),
        GOOD: (Outcome.PASS, None, None, None),
    }
    results = check_many([(TASK, c) for c in cases], p)
    for (code, (outcome, exc, name, line)), r in zip(cases.items(), results, strict=True):
        assert (r.outcome, r.exception, r.name, r.lineno) == (outcome, exc, name, line), (code, r)
    assert results[0].phase == "check" and results[1].phase == "define"
    assert results[2].phase == "entry"


def test_generated_code_sees_the_standard_library_only():
    # the machine's own site-packages (the base interpreter's: yaml, IPython, ... here) are off
    # sys.path: a program that finds one fails its own check at definition time
    base_site = [p for p in sys.path if p.endswith("site-packages")]
    assert base_site, "this interpreter has no site-packages: the test would prove nothing"
    probe = ("import sys\nassert not [p for p in sys.path if 'site-packages' in p], sys.path\n"
             + GOOD)
    r = check_program(TASK, probe, SandboxParams(timeout_s=10))
    assert r.outcome == Outcome.PASS, r


def test_body_completion_and_preamble():
    tasks = task_index(humaneval_tasks(11))
    he10 = tasks["HumanEval/10"]  # prompt defines is_palindrome, entry point make_palindrome
    pre = prompt_preamble(he10)
    assert "def is_palindrome" in pre and "def make_palindrome" not in pre
    full = "def make_palindrome(string: str) -> str:\n    return string\n"
    program = build_program(he10, full)
    assert program.count("def make_palindrome") == 1 and program.endswith(full)
    body = he10.canonical_solution
    assert build_program(he10, body) == he10.prompt + body
    assert build_program(he10, full, prepend_prompt=False) == full
    he0 = tasks["HumanEval/0"]
    # a full answer that forgot the prompt's `from typing import List` still runs
    code = he0.prompt.split("\n\n\n", 1)[1] + he0.canonical_solution
    assert not code.startswith("from typing")
    r = check_program(he0, code)
    assert r.outcome == Outcome.PASS


def test_canonical_humaneval_solutions_pass_in_sandbox():
    tasks = humaneval_tasks()
    results = check_many([(t, t.canonical_solution) for t in tasks], SandboxParams(), workers=2)
    failed = [(r.task_id, r.outcome, r.message) for r in results if not r.passed]
    assert failed == []
    assert len(results) == 164
    assert {r.isolation for r in results} == {sandbox_status(SandboxParams())["isolation"]}


# --- the fallback ------------------------------------------------------------------------------
FALLBACK_CASES = [
    ("infinite_loop", "while True:\n    pass\n", Outcome.TIMEOUT),
    ("unbounded_allocation", "x = []\nwhile True:\n    x.append(bytearray(10**7))\n", Outcome.MEMORY),
    ("fork_bomb", "import os\nwhile True:\n    os.fork()\n", None),
    ("sys_exit", "import sys\nsys.exit(0)\n", Outcome.EXITED),
    ("os_exit", "import os\nos._exit(3)\n", Outcome.EXITED),
    ("huge_stdout", "while True:\n    print('x' * 100000)\n", Outcome.KILLED),
    ("setsid_child", "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', "
     "'import time; time.sleep(600)  # {TOKEN}'], start_new_session=True)\n{GOOD}", Outcome.PASS),
    ("good", "{GOOD}", Outcome.PASS),
]


@pytest.mark.parametrize("name,template,outcome", FALLBACK_CASES, ids=[c[0] for c in FALLBACK_CASES])
def test_subprocess_fallback(name, template, outcome, tmp_path):
    params = _params_for(name, isolation="subprocess-unsafe")
    cwd = os.getcwd()
    r = check_program(TASK, template.format(TOKEN=TOKEN, GOOD=GOOD), params)
    assert r.isolation == Isolation.SUBPROCESS_UNSAFE == "subprocess-unsafe"
    assert r.isolation_note.startswith("UNSAFE:") and "subprocess-unsafe" in r.isolation_note
    if outcome is None:  # fork bomb: watchdog kill, or EAGAIN where RLIMIT_NPROC applies
        assert r.outcome in {Outcome.KILLED, Outcome.EXCEPTION}
    else:
        assert r.outcome == outcome, r
    assert psutil.Process().children(recursive=True) == []
    assert _marked_processes() == []
    assert os.getcwd() == cwd


def test_bwrap_missing_fails_closed(monkeypatch):
    """No bwrap: the default refuses (named error), nothing runs; only the unsafe mode asked for
    by name runs, and says so."""
    monkeypatch.setattr(isolation, "_bwrap_path", lambda: None)
    isolation._bwrap_probe.cache_clear()
    try:
        for params in (SandboxParams(), SandboxParams(isolation="bwrap")):
            with pytest.raises(SandboxUnavailable, match="bwrap not found.*subprocess-unsafe"):
                check_program(TASK, GOOD, params)
            with pytest.raises(SandboxUnavailable):
                check_many([(TASK, GOOD)] * 3, params)
        r = check_program(TASK, GOOD, SandboxParams(isolation="subprocess-unsafe"))
        assert r.isolation == "subprocess-unsafe" and r.isolation_note.startswith("UNSAFE:")
        assert r.outcome == Outcome.PASS
    finally:
        isolation._bwrap_probe.cache_clear()


@needs_bwrap
def test_bwrap_probe_failure_fails_closed(tmp_path):
    """A bwrap that is present but cannot set up this sandbox (``--size 0``: the probe fails)
    stops with the probe's reason; no program runs (a file it would create stays absent)."""
    params = SandboxParams.model_construct(**{**SandboxParams().model_dump(), "tmp_size_mb": 0})
    flag = tmp_path / "ran"
    code = f"open({str(flag)!r}, 'w').write('x')\n{GOOD}"
    with pytest.raises(SandboxUnavailable, match="cannot be set up.*--size"):
        check_program(TASK, code, params)
    assert not flag.exists()


def test_old_isolation_names_rejected():
    """``auto`` (the old silent fallback) and a bare ``subprocess`` are no longer values."""
    from nvfp4study.core.errors import ParamsError
    from nvfp4study.core.params import load_params

    for bad in ("auto", "subprocess"):
        with pytest.raises(ParamsError, match="corruption.sandbox.isolation"):
            load_params(None, [f"corruption.sandbox.isolation={bad}"])


def test_sandbox_python_is_base_interpreter():
    py = isolation.sandbox_python(SandboxParams())
    assert py == os.path.realpath(sys.executable)
    assert Path(py).is_file()


# Fake ``bwrap`` programs: (name, shell body, whether the probe may accept it). The probe runs
# ``bwrap ARGS -- python -I -c "print('ok')"`` and accepts only exit status 0 with exactly "ok" on
# stdout; "runs" execs what follows ``--`` (a bwrap that runs the program, without isolation).
FAKE_BWRAP = [
    ("exits-0-runs-nothing", "exit 0", False),
    ("prints-ok-exits-1", "echo ok; exit 1", False),
    ("exits-0-prints-other", "echo okay; exit 0", False),
    ("exits-0-prints-ok-on-stderr", "echo ok >&2; exit 0", False),
    ("runs", 'while [ $# -gt 0 ] && [ "$1" != "--" ]; do shift; done; shift; exec "$@"', True),
]


@pytest.mark.parametrize("name,body,usable", FAKE_BWRAP, ids=[c[0] for c in FAKE_BWRAP])
def test_bwrap_probe_needs_exit_0_and_ok(name, body, usable, tmp_path, monkeypatch):
    """Both sides of the probe: a ``bwrap`` that exits 0 without running anything (or prints "ok"
    but fails) is refused with SandboxUnavailable and the program is not run; only one that ran the
    probe's program (status 0, "ok") is accepted."""
    fake = tmp_path / "bwrap"
    fake.write_text(f"#!/bin/sh\n{body}\n")
    fake.chmod(0o755)
    monkeypatch.setattr(isolation, "_bwrap_path", lambda: str(fake))
    isolation._bwrap_probe.cache_clear()
    isolation._bwrap_version.cache_clear()
    try:
        if usable:
            assert sandbox_status(SandboxParams())["isolation"] == "bwrap"
            return
        with pytest.raises(SandboxUnavailable, match="cannot be set up: bwrap cannot run here"):
            sandbox_status(SandboxParams())
        flag = tmp_path / "ran"
        with pytest.raises(SandboxUnavailable):
            check_program(TASK, f"open({str(flag)!r}, 'w').write('x')\n{GOOD}", SandboxParams())
        assert not flag.exists()
    finally:
        isolation._bwrap_probe.cache_clear()
        isolation._bwrap_version.cache_clear()


SYSTEM_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
INSIDE = """
import os, socket
print(socket.gethostname())
print(os.getuid(), os.getgid())
print([line.split()[1] for line in open('/proc/self/status') if line.startswith('CapEff')][0])
for d in {dirs!r}:
    p = '/' + d
    print(d, os.readlink(p) if os.path.islink(p) else os.path.isdir(p))
print(os.path.isfile('/etc/ld.so.cache'))
st = os.statvfs('/tmp')
print(st.f_blocks * st.f_frsize)
print(sorted(os.environ.items()))
"""


@needs_bwrap
def test_bwrap_command_line_inside(tmp_path):
    """What the program sees inside the sandbox's command line: hostname ``sandbox``, uid/gid
    65534, no capability, the host's /bin, /sbin, /lib... as the same links (or folders), the
    loader cache where the host has one, a /tmp of tmp_size_mb MiB and only the variables set there."""
    params = SandboxParams()
    py = isolation.sandbox_python(params)
    r = subprocess.run([*isolation.bwrap_args(py, params), "--", py, "-I", "-S", "-c",
                        INSIDE.format(dirs=SYSTEM_DIRS)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    host = [f"{d} {os.readlink('/' + d) if os.path.islink('/' + d) else os.path.isdir('/' + d)}"
            for d in SYSTEM_DIRS]
    env = [("HOME", "/tmp"), ("LANG", "C.UTF-8"), ("PATH", "/usr/bin:/bin"),
           ("PWD", "/tmp"),  # bwrap sets PWD for --chdir /tmp
           ("TMPDIR", "/tmp")]
    assert r.stdout.splitlines() == ["sandbox", "65534 65534", "0000000000000000", *host,
                                     str(os.path.isfile("/etc/ld.so.cache")), str(params.tmp_size_mb * 2 ** 20),
                                     str(env)]


def test_rlimits_by_hand():
    """soft = hard (the program cannot raise them) except RLIMIT_CPU's hard one second later."""
    p = SandboxParams(memory_mb=100, cpu_s=7, file_size_mb=3)
    assert isolation.rlimits(p) == {"RLIMIT_AS": (104857600, 104857600), "RLIMIT_CPU": (7, 8),
                                    "RLIMIT_FSIZE": (3145728, 3145728), "RLIMIT_CORE": (0, 0),
                                    "RLIMIT_NOFILE": (256, 256)}


@needs_bwrap
def test_sandbox_status_under_bwrap():
    from nvfp4study.codeeval.task_cap import cap_description

    isolation._bwrap_probe.cache_clear()
    isolation._bwrap_version.cache_clear()
    st = sandbox_status(SandboxParams())
    version = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
    assert st == {"isolation": "bwrap", "note": "", "python": os.path.realpath(sys.executable),
                  "bwrap_version": version, "process_cap": cap_description()}
    assert version.startswith("bubblewrap ")


def test_sandbox_unavailable_message_names_the_unsafe_mode(monkeypatch):
    monkeypatch.setattr(isolation, "_bwrap_path", lambda: None)
    isolation._bwrap_probe.cache_clear()
    try:
        with pytest.raises(SandboxUnavailable) as exc:
            sandbox_status(SandboxParams())
    finally:
        isolation._bwrap_probe.cache_clear()
    assert str(exc.value) == (
        "the sandbox (corruption.sandbox.isolation: bwrap) cannot be set up: bwrap not found on PATH. Generated "
        "code is not run without it; fix bubblewrap, or set corruption.sandbox.isolation: subprocess-unsafe to run "
        "it as a plain subprocess with the harness's file and network access")


def test_sandbox_status_unsafe_mode_asked_by_name():
    from nvfp4study.codeeval.task_cap import cap_description

    st = sandbox_status(SandboxParams(isolation="subprocess-unsafe"))
    assert st == {"isolation": "subprocess-unsafe", "note": isolation.UNSAFE_NOTE,
                  "python": os.path.realpath(sys.executable), "bwrap_version": isolation._bwrap_version(),
                  "process_cap": cap_description()}
