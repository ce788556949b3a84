"""The fork server (``serving/forkserver.py``, ``cpu_engine/site/nvfp4study_forkserver.py``) with
this venv's interpreter and a small probe module: a forked server is the launcher's child in its
own session, carries its own marker, draws its own random numbers, exits and is stopped as an
exec'd one; it dies with its launcher; what cannot be forked is exec'd, saying why. The CPU engine
itself, forked and exec'd, is compared in ``test_cpu_engine.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from nvfp4study.codeeval.watchdog import marked_processes
from nvfp4study.serving import forkserver
from nvfp4study.serving.cpu_engine import SITE_DIR
from nvfp4study.serving.process import SERVER_MARKER_ENV, ServerProcess

SHOW = ("import json, os, random, sys; print(json.dumps({'pid': os.getpid(), 'argv': sys.argv, "
        "'stdin': sys.stdin.read(), 'random': random.random(), 'name': __name__}), flush=True); "
        "import time; time.sleep(float(sys.argv[1]))")


@pytest.fixture(autouse=True)
def small_probe(monkeypatch):
    monkeypatch.setattr(forkserver, "PROBE_MODULE", "json")  # the CPU engine's takes seconds
    yield
    forkserver.close_all()


def server(tmp_path: Path, code: str, *args: str, env: dict | None = None, name: str = "s") -> ServerProcess:
    sp = ServerProcess([sys.executable, "-c", code, *args], tmp_path / f"{name}.log", "127.0.0.1", 1,
                       env={"PYTHONPATH": str(SITE_DIR)} if env is None else env, grace_s=5,
                       preloaded=tmp_path / "cache")
    sp.start()
    return sp


def shown(sp: ServerProcess, timeout_s: float = 30) -> dict:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        lines = [ln for ln in sp.log_path.read_text().splitlines() if ln.startswith("{")]
        if lines:
            return json.loads(lines[-1])
        time.sleep(0.05)
    raise AssertionError(sp.log_path.read_text())


def test_a_forked_server_is_our_child_in_its_own_session_with_its_marker(tmp_path):
    sp = server(tmp_path, SHOW, "30", "x")
    try:
        assert sp.started.startswith("forked by the fork server"), sp.started
        got = shown(sp)
        proc = psutil.Process(sp.proc.pid)
        assert got["pid"] == sp.proc.pid and proc.ppid() == os.getpid()
        assert os.getpgid(sp.proc.pid) == sp.proc.pid == os.getsid(sp.proc.pid)
        assert got["argv"] == ["-c", "30", "x"] and got["stdin"] == "" and got["name"] == "__main__"
        # the environment an exec'd server gets, marker included, where psutil reads it
        want = {**os.environ, "PYTHONPATH": str(SITE_DIR), SERVER_MARKER_ENV: sp.marker}
        assert proc.environ() == want
        assert [p.pid for p in marked_processes(sp.marker, sp.t_launch_epoch, SERVER_MARKER_ENV)] == [sp.proc.pid]
        assert sp.alive() and sp.proc.poll() is None
    finally:
        sp.stop()
    assert sp.returncode == -signal.SIGTERM and not sp.alive()
    assert marked_processes(sp.marker, 0, SERVER_MARKER_ENV) == []


def test_launches_share_one_fork_server_and_draw_their_own_random_numbers(tmp_path):
    a = server(tmp_path, SHOW, "30", name="a")
    b = server(tmp_path, SHOW, "30", name="b")
    try:
        ra, rb = shown(a), shown(b)
        assert ra["pid"] != rb["pid"] and ra["random"] != rb["random"]
        (fs,) = forkserver.pids()
        assert f"(pid {fs}," in a.started and f"(pid {fs}," in b.started
        assert fs not in {p.pid for p in a.group_members() + b.group_members()}
        (listed,) = (tmp_path / "cache").glob("preload-*.json")
        assert "json" in json.loads(listed.read_text())
    finally:
        a.stop()
        b.stop()
    assert forkserver.pids() == {fs}  # kept for the next launch


def test_exit_status_and_a_group_that_ignores_sigterm(tmp_path):
    done = server(tmp_path, "import sys; sys.exit(3)", name="three")
    assert done.proc.wait(timeout=20) == 3
    done.stop()
    assert done.returncode == 3
    stubborn = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); os.fork(); "
                "print('{}', flush=True); time.sleep(60)")
    sp = server(tmp_path, stubborn, name="stubborn")
    shown(sp)
    assert len(sp.group_members()) == 2
    sp.grace_s = 1
    sp.stop()
    assert sp.returncode == -signal.SIGKILL and sp.group_members() == []
    assert marked_processes(sp.marker, 0, SERVER_MARKER_ENV) == []


def test_the_server_and_the_fork_server_die_with_their_launcher(tmp_path):
    helper = (f"import json, sys, time; sys.path[:0] = {sys.path!r}\n"
              "from pathlib import Path\n"
              "from nvfp4study.serving import forkserver\n"
              "from nvfp4study.serving.process import ServerProcess\n"
              "forkserver.PROBE_MODULE = 'json'\n"
              f"sp = ServerProcess([sys.executable, '-c', 'import time; time.sleep(60)'], Path({str(tmp_path / 'h.log')!r}),"
              f" '127.0.0.1', 1, env={{'PYTHONPATH': {str(SITE_DIR)!r}}}, preloaded=Path({str(tmp_path / 'cache')!r}))\n"
              "sp.start()\n"
              "print(json.dumps([sp.proc.pid, *forkserver.pids(), sp.started]), flush=True)\n"
              "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", helper], stdout=subprocess.PIPE, text=True)
    try:
        *pids, started = json.loads(proc.stdout.readline())
        assert started.startswith("forked") and len(pids) == 2
        assert all(psutil.pid_exists(p) for p in pids)
    finally:
        proc.kill()
        proc.wait()
    end = time.monotonic() + 15
    alive = pids
    while alive and time.monotonic() < end:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.1)
    assert alive == []


@pytest.mark.parametrize("case", ["script", "wrapper", "site-folder", "probe-fails"])
def test_what_cannot_be_forked_is_execd_saying_why(tmp_path, monkeypatch, case):
    if case == "script":
        (tmp_path / "s.py").write_text("print('{}', flush=True)\nimport time\ntime.sleep(30)\n")
        sp = ServerProcess([sys.executable, str(tmp_path / "s.py")], tmp_path / "s.log", "127.0.0.1", 1,
                           env={"PYTHONPATH": str(SITE_DIR)}, preloaded=tmp_path / "cache")
        sp.start()
        why = "only `python -c` commands"
    elif case == "wrapper":  # as the tests' fake SGLang environments: it may not run `-c` as Python
        wrapper = tmp_path / "python"
        wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        wrapper.chmod(0o755)
        sp = ServerProcess([str(wrapper), "-c", SHOW, "30"], tmp_path / "w.log", "127.0.0.1", 1,
                           env={"PYTHONPATH": str(SITE_DIR)}, preloaded=tmp_path / "cache")
        sp.start()
        why = "is a script, not Python itself"
    elif case == "site-folder":
        sp = server(tmp_path, SHOW, "30", env={"PYTHONPATH": ""})
        why = "site folder is not on PYTHONPATH"
    else:
        monkeypatch.setattr(forkserver, "PROBE_MODULE", "no_such_module_here")
        sp = server(tmp_path, SHOW, "30")
        why = "the fork server did not start"
    try:
        assert sp.started.startswith("exec (") and why in sp.started, sp.started
        shown(sp)
        assert "# nvfp4study: started by exec: " in sp.log_path.read_text()
        assert psutil.Process(sp.proc.pid).environ()[SERVER_MARKER_ENV] == sp.marker
    finally:
        sp.stop()
    assert forkserver.pids() == set()


def test_the_preload_skips_sglang_and_the_site_folder():
    sys.path.insert(0, str(SITE_DIR))
    try:
        import nvfp4study_forkserver as z
    finally:
        sys.path.remove(str(SITE_DIR))
    roots = ("/venv/lib/python3.11/site-packages/", "/usr/lib/python3.11/")
    assert z._third_party("torch.nn", "/venv/lib/python3.11/site-packages/torch/nn/__init__.py", roots)
    assert z._third_party("posix", "built-in", roots) and z._third_party("ns_pkg", None, roots)
    for name, origin in (("sglang.srt.server_args", "/venv/lib/python3.11/site-packages/sglang/srt/server_args.py"),
                         ("sgl_kernel", "/venv/lib/python3.11/site-packages/sgl_kernel/__init__.py"),
                         ("sitecustomize", "/site/sitecustomize.py"),
                         ("overlay_mod", "/run/work/overlay/overlay_mod.py")):
        assert not z._third_party(name, origin, roots), name


def test_numpy_is_reseeded_and_the_server_holds_only_its_stdio(tmp_path, monkeypatch):
    """numpy's global generator is not re-seeded at fork by numpy itself (Python's ``random`` is,
    by CPython): each forked server draws its own. Nothing of the fork server (its socket, other
    launches' log files) stays open in a server: fds 0, 1, 2 only, as an exec'd one."""
    monkeypatch.setattr(forkserver, "PROBE_MODULE", "numpy.random")  # `import numpy` alone loads no generator
    code = ("import json, os, sys, numpy.random; print(json.dumps({'np': numpy.random.random(), "
            "'fds': sorted(int(f) for f in os.listdir('/proc/self/fd'))}), flush=True); "
            "import time; time.sleep(30)")
    env = {"PYTHONPATH": str(SITE_DIR), "OMP_NUM_THREADS": "1"}  # as engine_env: OpenBLAS starts no thread
    a, b = server(tmp_path, code, env=env, name="a"), server(tmp_path, code, env=env, name="b")
    try:
        assert a.started.startswith("forked") and b.started.startswith("forked"), a.started
        ra, rb = shown(a), shown(b)
        assert ra["np"] != rb["np"]
        assert ra["fds"] == rb["fds"] == [0, 1, 2, 3]  # 3: the listing's own descriptor
    finally:
        a.stop()
        b.stop()


def test_poll_of_a_status_reaped_elsewhere_reads_zero_and_stays():
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(5)"])
    os.waitpid(child.pid, 0)  # reaped by someone else
    fp = forkserver.ForkedProcess(["x"], child.pid)
    assert fp.poll() == 0 and fp.poll() == 0 and fp.wait(1) == 0
    child.returncode = 5  # keep Popen's destructor quiet


def _fork_server(tmp_path: Path) -> forkserver.ForkServer:
    env = {**os.environ, "PYTHONPATH": str(SITE_DIR)}
    fs = forkserver.ForkServer(sys.executable, env, SERVER_MARKER_ENV, tmp_path / "cache", "json")
    with open(tmp_path / "fs.log", "ab") as log:
        fs.start(log)
    return fs


def _zombies() -> list[int]:
    return [c.pid for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE]


def test_a_server_that_fails_after_the_handover_is_reaped(tmp_path):
    """A wrong-length marker fails in the server after it became our child (the placeholder it
    overwrites has 24 characters): the answer names its pid and the launcher reaps it."""
    from nvfp4study.serving.process import _set_subreaper

    fs = _fork_server(tmp_path)
    _set_subreaper(True)
    try:
        with open(tmp_path / "s.log", "ab") as log, pytest.raises(forkserver.ForkServerUnavailable,
                                                                   match="placeholder has 24 characters"):
            fs.fork([sys.executable, "-c", "pass"], "short", log.fileno())
        assert _zombies() == [] and fs.alive()
    finally:
        _set_subreaper(False)
        fs.close()


def test_an_unanswered_request_closes_the_fork_server_and_kills_its_server(tmp_path, monkeypatch):
    """The first fork's answer is given up (a zero wait): that fork server is closed, the server
    it forked anyway is killed, and the next launch, exec'd (that environment's fork server is not
    tried again), tracks its own pid."""
    real = forkserver.ForkServer._answer
    calls = []

    def impatient(self, timeout_s):
        calls.append(timeout_s)
        return {"error": "no answer after 0 s"} if len(calls) == 2 else real(self, timeout_s)

    monkeypatch.setattr(forkserver.ForkServer, "_answer", impatient)  # 1: the start, 2: the first fork
    a = server(tmp_path, SHOW, "30", name="a")
    try:
        assert a.started.startswith("exec (the fork server did not answer"), a.started
        time.sleep(0.5)
        assert [p.pid for p in marked_processes(a.marker, 0, SERVER_MARKER_ENV)] == [a.proc.pid]
        b = server(tmp_path, SHOW, "30", name="b")
        try:
            assert b.started.startswith("exec (this environment's fork server failed earlier: the fork server "
                                        "did not answer"), b.started
            assert shown(b)["pid"] == b.proc.pid and forkserver.pids() == set()
        finally:
            b.stop()
    finally:
        a.stop()
    assert _zombies() == []


def test_a_command_too_long_to_send_is_execd_and_the_fork_server_stays(tmp_path):
    a = server(tmp_path, SHOW, "30", name="a")
    big = server(tmp_path, SHOW, "30", "x" * 70_000, name="big")
    try:
        assert a.started.startswith("forked") and big.started.startswith("exec (the command is too long")
        assert shown(big)["argv"][2] == "x" * 70_000
        assert len(forkserver.pids()) == 1
    finally:
        a.stop()
        big.stop()


def test_a_failed_start_is_not_tried_again_and_no_subreaper_means_exec(tmp_path, monkeypatch):
    monkeypatch.setattr(forkserver, "PROBE_MODULE", "no_such_module_here")
    first = server(tmp_path, SHOW, "30", name="first")
    second = server(tmp_path, SHOW, "30", name="second")
    try:
        assert "the fork server did not start" in first.started
        assert "this environment's fork server failed earlier" in second.started
    finally:
        first.stop()
        second.stop()
    monkeypatch.setattr(forkserver, "PROBE_MODULE", "json")
    sp = ServerProcess([sys.executable, "-c", SHOW, "30"], tmp_path / "n.log", "127.0.0.1", 1,
                       env={"PYTHONPATH": str(SITE_DIR)}, preloaded=tmp_path / "cache", subreaper=False)
    sp.start()
    try:
        assert sp.started.startswith("exec (this process is not a child subreaper"), sp.started
    finally:
        sp.stop()


def test_concurrent_polls_all_read_the_exit_status():
    """As Popen: one thread reaps, the others read None meanwhile, never a made-up 0."""
    import threading

    for _ in range(30):
        pid = os.fork()
        if pid == 0:
            os._exit(3)
        fp = forkserver.ForkedProcess(["x"], pid)
        seen: list = []
        threads = [threading.Thread(target=lambda fp=fp, seen=seen: seen.append(fp.wait(5))) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert seen == [3, 3, 3, 3] and fp.returncode == 3


def test_the_fork_server_outlives_the_thread_that_started_it(tmp_path):
    """``PR_SET_PDEATHSIG`` follows the starting thread: the fork server has none, and a launch
    from a short-lived thread leaves it serving the next launch."""
    import threading

    box: list = []
    t = threading.Thread(target=lambda: box.append(server(tmp_path, SHOW, "30", name="a")))
    t.start()
    t.join()
    a = box[0]
    time.sleep(0.5)
    b = server(tmp_path, SHOW, "30", name="b")
    try:
        (fs,) = forkserver.pids()
        assert f"(pid {fs}," in a.started and f"(pid {fs}," in b.started
    finally:
        a.stop()
        b.stop()


def test_a_server_being_handed_over_is_not_an_orphan_of_another_launch(tmp_path):
    """Between its hand-over and its registration a server is our child carrying its marker;
    another launch's orphan search (``process._adopted``) must not take it (nor a fork server,
    whose marker is the placeholder)."""
    from nvfp4study.serving import process

    t0 = time.time()
    mark = "ab" * 12
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             env={**os.environ, SERVER_MARKER_ENV: mark})
    fs = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                          env={**os.environ, SERVER_MARKER_ENV: forkserver.PLACEHOLDER})
    try:
        time.sleep(0.3)
        assert child.pid in {p.pid for p in process._adopted(t0)}  # an orphan as far as it knows
        assert fs.pid not in {p.pid for p in process._adopted(t0)}
        process._IN_FLIGHT.add(mark)
        assert child.pid not in {p.pid for p in process._adopted(t0)}
    finally:
        process._IN_FLIGHT.discard(mark)
        for p in (child, fs):
            p.kill()
            p.wait()


def test_an_execd_fallback_gets_its_whole_startup_budget(tmp_path, monkeypatch):
    """A fork server that takes 1 s and fails: the exec'd server's loading is timed from its own
    start, not from the fork server's."""
    def slow_failure(self, log, timeout_s=300.0):
        time.sleep(1.0)
        raise forkserver.ForkServerUnavailable("the fork server did not start: slow and broken")

    monkeypatch.setattr(forkserver.ForkServer, "start", slow_failure)
    t0 = time.monotonic()
    sp = server(tmp_path, SHOW, "30")
    try:
        assert sp.started.startswith("exec (the fork server did not start: slow and broken")
        assert sp.t_launch - t0 >= 1.0
    finally:
        sp.stop()


@pytest.mark.parametrize("preloaded", [True, False])
def test_a_stop_after_the_exit_signals_no_reused_pid(tmp_path, monkeypatch, preloaded):
    """Once the server has exited and been reaped its pid (and group id) may belong to another
    process: stop() must not signal it (the first stop, or a second one)."""
    sp = ServerProcess([sys.executable, "-c", "import sys; sys.exit(3)"], tmp_path / "x.log", "127.0.0.1", 1,
                       env={"PYTHONPATH": str(SITE_DIR)}, preloaded=tmp_path / "cache" if preloaded else None,
                       stop_signal=signal.SIGINT, stop_leader_only=True)
    sp.start()
    assert sp.proc.wait(timeout=20) == 3
    sent: list = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append(("kill", pid, sig)))
    monkeypatch.setattr(os, "killpg", lambda pid, sig: sent.append(("killpg", pid, sig)))
    sp.stop()
    sp.stop_leader_only = False
    sp.stop()
    assert sent == [] and sp.returncode == 3
