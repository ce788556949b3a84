"""The sandbox's hard cap on tasks (a pids cgroup per run): it holds while the watchdog is blind,
a cgroup that cannot be joined stops the run before the program, and nothing is left behind.

The kernel's own counters (``pids.peak``, ``pids.events``) and the program's own count of
successful forks are the independent readings here; the watchdog is switched off where the test
is about what the cap alone bounds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nvfp4study.codeeval import sandbox, task_cap
from nvfp4study.codeeval.isolation import sandbox_status
from nvfp4study.codeeval.sandbox import Outcome, check_program
from nvfp4study.codeeval.task_cap import (
    JOIN_SCRIPT,
    PREFIX,
    TASK_SLACK,
    TaskCap,
    cap_parent,
    pids_folders,
    sweep_stale,
)
from nvfp4study.codeeval.tasks import card_tasks
from nvfp4study.core.params import SandboxParams

TASK = card_tasks()[0]  # card/binary_search
GOOD = "def binary_search(arr, x):\n    return arr.index(x) if x in arr else -1\n"
PARENT = cap_parent()
needs_cap = pytest.mark.skipif(PARENT is None, reason="no pids cgroup can be made on this machine "
                               "(needs root or a delegated cgroup with the pids controller)")
#: forks up to 300 children that sleep, prints how many forks succeeded, then defines GOOD
FORKER = textwrap.dedent("""\
    import os, time
    n = 0
    for _ in range(300):
        try:
            pid = os.fork()
        except BlockingIOError:
            break
        if pid == 0:
            os.closerange(0, 256)  # hold no pipe of the harness's
            time.sleep(60)
            os._exit(0)
        n += 1
    print("forked", n, flush=True)
    """) + GOOD
PARAMS = SandboxParams(timeout_s=20.0, cpu_s=10, memory_mb=512, max_processes=16)


def _ours(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f"{PREFIX}{os.getpid()}-"))


def _mountinfo(root: str, mount: str, fstype: str, options: str) -> str:
    return f"30 25 0:26 {root} {mount} rw,relatime shared:9 - {fstype} cgroup {options}\n"


def test_pids_folders_reads_v1_and_v2_mounts(tmp_path):
    v2 = tmp_path / "unified"
    (v2 / "user.slice").mkdir(parents=True)
    (v2 / "user.slice" / "cgroup.subtree_control").write_text("cpu memory pids\n")
    text = (_mountinfo("/", "/sys/fs/cgroup/cpu", "cgroup", "rw,cpu")
            + _mountinfo("/", "/sys/fs/cgroup/pids", "cgroup", "rw,pids")
            + _mountinfo("/", str(v2), "cgroup2", "rw")
            + _mountinfo("/", "/proc", "proc", "rw"))
    own = {"cpu": "/a", "pids": "/a/b", "": "/user.slice"}
    assert pids_folders(text, own) == [Path("/sys/fs/cgroup/pids/a/b"), v2 / "user.slice"]
    # a mount whose root is the container's own cgroup: the path is taken relative to it
    assert pids_folders(_mountinfo("/a", "/cg", "cgroup", "rw,pids"), own) == [Path("/cg/b")]
    # a cgroup outside the mount's root, or a v2 folder that does not delegate pids: none
    assert pids_folders(_mountinfo("/other", "/cg", "cgroup", "rw,pids"), own) == []
    assert pids_folders(_mountinfo("/a/bc", "/cg", "cgroup", "rw,pids"), {"pids": "/a/b"}) == []
    (v2 / "user.slice" / "cgroup.subtree_control").write_text("cpu memory\n")
    assert pids_folders(_mountinfo("/", str(v2), "cgroup2", "rw"), own) == []
    assert pids_folders("garbage line\n", own) == []


@needs_cap
def test_the_cap_refuses_forks_beyond_its_limit():
    with TaskCap(PARENT, 20) as cap:
        code = ("import os, time\nn = 0\nfor _ in range(100):\n    try:\n        pid = os.fork()\n"
                "    except BlockingIOError:\n        break\n    if pid == 0:\n        os.closerange(0, 256)\n"
                "        time.sleep(60)\n        os._exit(0)\n    n += 1\nprint(n)\n")
        out = subprocess.run(["/bin/sh", "-c", JOIN_SCRIPT, cap.procs, "nonce", sys.executable, "-c", code],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert int(out.stdout) == 19  # the python itself is the 20th task
        assert len(cap.members()) == 19 and cap.times_full() >= 1
        assert int((cap.path / "pids.peak").read_text()) == 20  # the limit's level counts its child's tasks
        assert (cap.path / "run" / "cgroup.procs").read_text().split() and not (cap.path / "cgroup.procs").read_text().split()
    assert not cap.path.exists() and cap.members() == []


@needs_cap
@pytest.mark.parametrize("isolation", ["bwrap", "subprocess-unsafe"])
def test_a_fork_bomb_is_bounded_while_the_watchdog_is_blind(monkeypatch, isolation):
    """With the watchdog's poll switched off, the forks that succeed stop at the cap; the run is a
    process-limit kill, as where the watchdog alone bounds it (the program caught its EAGAIN and
    would have passed); every sleeping child is gone after the run (the kernel removes a cgroup
    only once it holds no task)."""
    monkeypatch.setattr(sandbox, "_watch", lambda *a: "")
    r = check_program(TASK, FORKER, PARAMS.model_copy(update={"isolation": isolation}),
                      prepend_prompt=False)
    assert (r.outcome, r.detail) == (Outcome.KILLED, "process limit"), (r.outcome, r.message, r.stderr_tail)
    forked = int(r.stdout_tail.split()[1])
    assert 0 < forked <= PARAMS.max_processes + TASK_SLACK < 300
    assert _ours(PARENT) == []


@needs_cap
def test_a_cgroup_that_cannot_be_joined_stops_the_run_before_the_program(monkeypatch, tmp_path):
    marker = tmp_path / "ran"
    monkeypatch.setattr(TaskCap, "procs", property(lambda self: str(tmp_path / "no" / "cgroup.procs")))
    code = f"open({str(marker)!r}, 'w').write('x')\n" + GOOD
    r = check_program(TASK, code, PARAMS.model_copy(update={"isolation": "subprocess-unsafe"}),
                      prepend_prompt=False)
    assert (r.outcome, r.detail) == (Outcome.SANDBOX_ERROR, "pids cgroup failed"), r
    assert "cannot join the sandbox's pids cgroup" in r.message
    assert not marker.exists() and _ours(PARENT) == []


@needs_cap
def test_a_program_cannot_pass_for_a_failed_join():
    """The join's failure line carries the run's nonce: a program that prints the line and exits
    with the join's status is an exit, not a sandbox error."""
    code = (f"import os, sys\nsys.stderr.write({task_cap.JOIN_MESSAGE!r} + ' [0123] x\\n')\n"
            f"sys.stderr.flush()\nos._exit({task_cap.JOIN_FAILED})\n")
    r = check_program(TASK, code, PARAMS.model_copy(update={"isolation": "subprocess-unsafe"}),
                      prepend_prompt=False)
    assert r.outcome == Outcome.EXITED and r.detail == f"exit status {task_cap.JOIN_FAILED}", r


def test_without_a_pids_cgroup_the_watchdog_alone_bounds_the_run(monkeypatch):
    monkeypatch.setattr(sandbox, "cap_parent", lambda: None)
    monkeypatch.setattr(task_cap, "cap_parent", lambda: None)
    params = SandboxParams(isolation="subprocess-unsafe", timeout_s=20.0, max_processes=16)
    assert "watchdog's poll is the only bound" in sandbox_status(params)["process_cap"]
    r = check_program(TASK, GOOD, params, prepend_prompt=False)
    assert r.outcome == Outcome.PASS, r
    bomb = check_program(TASK, "import os\nwhile True:\n    os.fork()\n", params, prepend_prompt=False)
    assert (bomb.outcome, bomb.detail) == (Outcome.KILLED, "process limit"), bomb


@needs_cap
def test_stale_cgroups_of_dead_harnesses_are_swept_and_live_ones_kept():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale, live = PARENT / f"{PREFIX}{dead.pid}-test", PARENT / f"{PREFIX}{os.getpid()}-test"
    stale.mkdir()
    live.mkdir()
    try:
        sweep_stale(PARENT)  # young: its owner may be in another pid namespace, about to join
        assert stale.exists() and live.exists()
        sweep_stale(PARENT, now=time.time() + task_cap.STALE_AFTER_S + 1)
        assert not stale.exists() and live.exists()
    finally:
        for d in (stale, live):
            if d.exists():
                d.rmdir()


@needs_cap
def test_status_names_the_cap():
    status = sandbox_status(SandboxParams(isolation="subprocess-unsafe"))
    assert status["process_cap"] == f"each run in a pids cgroup of its own (pids.max = max_processes + {TASK_SLACK})"
