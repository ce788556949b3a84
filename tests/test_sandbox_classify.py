"""The sandbox's deciding functions by hand (issue 37's mutation benchmark: the fast covering
selection for ``codeeval/sandbox.py``): how a run's end becomes an outcome (``_classify``,
``_death``, ``_signal_of``, ``_code_line``), a start that fails (``check_program``'s
``_NotStarted`` path and ``_spawn``'s clean-up), and ``check_many``'s two paths. The process
handling itself is tested by running the hostile programs (tests/test_sandbox.py)."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import types
from pathlib import Path

import pytest

from nvfp4study.codeeval import sandbox as sb
from nvfp4study.codeeval.isolation import UNSAFE_NOTE, Isolation
from nvfp4study.codeeval.task_cap import JOIN_FAILED, JOIN_MESSAGE
from nvfp4study.codeeval.tasks import Task
from nvfp4study.codeeval.watchdog import OutputTail
from nvfp4study.core.params import SandboxParams

TASK = Task("T/1", "def f():\n    pass\n", "f", "def check(fn):\n    assert fn() == 1\n", "    return 1\n", "card")
BW, UN = Isolation.BWRAP, Isolation.SUBPROCESS_UNSAFE
BLANK = {"exception": None, "name": None, "phase": None, "lineno": None}
STATUS = {"note": "the note", "isolation": BW}
CPU_2 = SandboxParams(cpu_s=2)


@pytest.mark.parametrize("rc,iso,sig", [
    (None, BW, None), (0, BW, None), (1, BW, None), (-9, UN, 9), (-15, BW, 15),
    (128 + 9, BW, 9), (129, BW, 1), (128 + 64, BW, 64), (128 + 65, BW, None), (128, BW, None), (137, UN, None),
])
def test_signal_of(rc, iso, sig):
    assert sb._signal_of(rc, iso) == sig


@pytest.mark.parametrize("lineno,offset,want", [(None, 0, None), (0, 0, None), (1, 0, 1), (3, 3, None), (2, 3, None),
                                                (4, 3, 1), (10, 3, 7)])
def test_code_line(lineno, offset, want):
    assert sb._code_line(lineno, offset) == want


def test_death_each_cause():
    d = sb._death
    assert d("wall clock 1.5 s", None, None, None, "", BW) == {
        "outcome": "timeout", "message": "killed after the wall-clock limit", "detail": "wall clock 1.5 s", **BLANK}
    assert d("cpu limit", 9, "SIGKILL", -9, "", BW) == {
        "outcome": "timeout", "message": "CPU-time limit (SIGKILL at the hard limit)", "detail": "cpu limit", **BLANK}
    assert d("memory limit", 9, "SIGKILL", -9, "", BW) == {
        "outcome": "memory", "message": "total RSS above the limit", "detail": "memory limit", **BLANK}
    assert d("output limit", 9, "SIGKILL", -9, "", BW) == {
        "outcome": "killed", "message": "killed by the watchdog (output limit)", "detail": "output limit", **BLANK}
    assert d("", signal.SIGXCPU, "SIGXCPU", -24, "", UN) == {
        "outcome": "timeout", "message": "CPU-time limit (SIGXCPU)", "detail": "cpu limit", **BLANK}
    assert d("", 11, "SIGSEGV", 139, "", BW) == {
        "outcome": "killed", "message": "died by SIGSEGV", "detail": "SIGSEGV", **BLANK}
    err = "  bwrap: Can't mount proc: Operation not permitted\n" + "x" * 400
    assert d("", None, None, 1, err, BW) == {
        "outcome": "sandbox_error", "message": err.strip()[:300], "detail": "bwrap failed", **BLANK}
    for rc, iso, stderr in ((1, UN, "bwrap: no"), (2, BW, "bwrap: no"), (1, BW, "python: bwrap: no")):
        assert d("", None, None, rc, stderr, iso) == {
            "outcome": "exited", "message": f"process ended with status {rc} before the checks finished",
            "detail": f"exit status {rc}", **BLANK}, (rc, iso, stderr)


def tail(data: bytes) -> OutputTail:
    t = OutputTail(1000)
    t.add(data)
    return t


def run(rc, *, result=b"", reason="", max_cpu=0.0, cap_refused=0, cap=None, iso=BW, err=b"e" * 3,
        params=CPU_2, offset=0, nonce="n0"):
    child = sb._Child(types.SimpleNamespace(returncode=rc), -1, nonce, iso, None, 0.0, 0.0, cap)
    got = sb._Pumped(tail(b"out!"), tail(err), bytearray(result), reason, max_cpu, {}, 1.234567, cap_refused)
    return sb._classify(TASK, child, got, params, STATUS, offset)


COMMON = {"task_id": "T/1", "isolation": BW, "isolation_note": "the note", "duration_s": 1.2346,
          "stdout_tail": "out!", "stderr_tail": "eee", "output_bytes": 7}


def line(nonce="n0", **kw) -> bytes:
    rec = {"nonce": nonce, "outcome": "name_error", "exception": "NameError", "name": "culp", "message": "m",
           "phase": "check", "lineno": 5, **kw}
    return b"noise\n" + json.dumps(rec).encode() + b"\n"


def test_classify_the_runners_result_line():
    r = run(0, result=line(), offset=2)
    assert r.to_dict() == {**COMMON, "outcome": "name_error", "exception": "NameError", "name": "culp",
                           "message": "m", "phase": "check", "lineno": 3, "detail": "", "returncode": 0,
                           "signal": None}
    assert not r.passed and run(0, result=line(outcome="pass")).passed
    assert run(0, result=line(lineno=2), offset=2).lineno is None  # in the prompt
    # a line with another run's nonce is not this run's: the exit is judged instead
    assert run(0, result=line(nonce="other")).outcome == "exited"


def test_classify_a_pids_cgroup_refusal_wins_over_the_result_line():
    r = run(-9, result=line(), cap_refused=2, iso=UN)
    assert (r.outcome, r.detail, r.message) == ("killed", "process limit", "killed by the watchdog (process limit)")
    assert r.signal == "SIGKILL" and r.returncode == -9


def test_classify_join_failure_only_with_a_cap():
    err = f"{JOIN_MESSAGE} [n0]: no such cgroup\n".encode()
    r = run(JOIN_FAILED, cap=object(), err=err)
    assert r.to_dict() == {**COMMON, "stderr_tail": err.decode(), "output_bytes": 4 + len(err),
                           "outcome": "sandbox_error", "exception": None, "name": None, "phase": None, "lineno": None,
                           "message": err.decode().strip()[:300], "detail": "pids cgroup failed",
                           "returncode": JOIN_FAILED, "signal": None}
    assert run(JOIN_FAILED, cap=None, err=err).outcome == "exited"
    assert run(JOIN_FAILED, cap=object(), err=f"{JOIN_MESSAGE} [other]".encode()).outcome == "exited"


def test_classify_hard_cpu_limit_by_the_cpu_seen():
    """SIGKILL with a process at the CPU limit (within 0.05 s) is the hard RLIMIT_CPU; below it, a
    plain kill; a watchdog reason wins."""
    at = run(-9, iso=UN, max_cpu=1.95)
    assert (at.outcome, at.detail, at.signal) == ("timeout", "cpu limit", "SIGKILL")
    assert at.message == "CPU-time limit (SIGKILL at the hard limit)"
    below = run(-9, iso=UN, max_cpu=1.9)
    assert (below.outcome, below.detail, below.message) == ("killed", "SIGKILL", "died by SIGKILL")
    assert run(-15, iso=UN, max_cpu=5.0).detail == "SIGTERM"  # not SIGKILL: no CPU-limit reading
    assert run(-9, iso=UN, max_cpu=5.0, reason="memory limit").outcome == "memory"
    r = run(137, reason="wall clock 4.0 s")
    assert r.to_dict() == {**COMMON, "outcome": "timeout", "message": "killed after the wall-clock limit",
                           "detail": "wall clock 4.0 s", "returncode": 137, "signal": "SIGKILL", **BLANK}


def test_check_program_that_cannot_start(monkeypatch):
    def fail(*a, **k):
        raise sb._NotStarted("no such file: /nowhere/python")

    monkeypatch.setattr(sb, "_spawn", fail)
    r = sb.check_program(TASK, "def f():\n    return 1\n", SandboxParams(isolation="subprocess-unsafe"))
    assert r.to_dict() == {"task_id": "T/1", "outcome": "sandbox_error", "exception": None, "name": None,
                           "message": "no such file: /nowhere/python", "phase": None, "lineno": None,
                           "detail": "could not start", "isolation": UN, "isolation_note": UNSAFE_NOTE,
                           "duration_s": 0.0, "returncode": None, "signal": None, "stdout_tail": "",
                           "stderr_tail": "", "output_bytes": 0}


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _workdirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("nvfp4study-sandbox-*")}


def test_a_failed_start_leaves_nothing_behind(monkeypatch):
    """The pids cgroup or the process cannot be made: the result pipe's two ends, the temp folder
    and the cgroup are undone, and check_program says why."""
    params = SandboxParams(isolation="subprocess-unsafe")
    fds, dirs = _fds(), _workdirs()

    def no_cap(p):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sb, "_make_cap", no_cap)
    r = sb.check_program(TASK, "def f():\n    return 1\n", params)
    assert (r.outcome, r.detail) == ("sandbox_error", "could not start")
    assert r.message == "the sandbox's pids cgroup could not be made: [Errno 28] No space left on device"
    assert _fds() == fds and _workdirs() == dirs
    closed = []
    cap = types.SimpleNamespace(procs="/nonexistent/cgroup.procs", close=lambda: closed.append(True))
    monkeypatch.setattr(sb, "_make_cap", lambda p: cap)

    def no_popen(*a, **k):
        raise OSError(2, "No such file or directory")

    monkeypatch.setattr(sb.subprocess, "Popen", no_popen)
    r = sb.check_program(TASK, "def f():\n    return 1\n", params)
    assert (r.outcome, r.message) == ("sandbox_error", "[Errno 2] No such file or directory")
    assert closed == [True] and _fds() == fds and _workdirs() == dirs


def test_check_many_serial_and_pooled_keep_order_and_params():
    params = SandboxParams(isolation="subprocess-unsafe", timeout_s=10)
    codes = ["def f():\n    return 1\n", "def f():\n    return 2\n", "def f():\n    return culp\n"]
    for workers in (1, 2):
        rs = sb.check_many([(TASK, c) for c in codes], params, workers=workers)
        assert [r.outcome for r in rs] == ["pass", "assertion_failure", "name_error"], workers
        assert {r.isolation for r in rs} == {UN}
    (one,) = sb.check_many([(TASK, codes[2])], params, workers=4)
    assert (one.outcome, one.name, one.isolation) == ("name_error", "culp", UN)
    assert sb.check_many([], params) == []


def test_no_pids_cgroup_where_the_machine_lets_none_be_made(monkeypatch):
    monkeypatch.setattr(sb, "cap_parent", lambda: None)
    assert sb._make_cap(SandboxParams()) is None


def test_classify_bwrap_failure_and_long_join_message():
    """bwrap's own error (status 1, stderr starting 'bwrap:') is a sandbox error with its message;
    a join failure's message is cut at 300 characters."""
    r = run(1, err=b"bwrap: Creating new namespace failed: Operation not permitted\n")
    assert (r.outcome, r.detail, r.message) == ("sandbox_error", "bwrap failed",
                                                "bwrap: Creating new namespace failed: Operation not permitted")
    err = f"{JOIN_MESSAGE} [n0]: ".encode() + b"x" * 400
    r = run(JOIN_FAILED, cap=object(), err=err)
    assert r.message == err.decode()[:300] and len(r.message) == 300
