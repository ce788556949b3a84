"""serving/server.py: the command (checked against the real 0.5.23 wheel), the plan, GPU checks and the
process lifecycle against a fake SGLang run as a real subprocess."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import httpx
import psutil
import pytest

import fake_sglang
from nvfp4study.core.errors import (
    HealthTimeout,
    NoCapableGPU,
    PortInUse,
    ServerDied,
    ServerExitedDuringLoad,
    StreamCut,
    WrongInterpreter,
)
from nvfp4study.core.params import load_params
from nvfp4study.serving import client, plans, serve_cli, server
from nvfp4study.serving.server import ServerConfig, build_command, card_config
from serving_fixtures import (  # noqa: F401
    GPU_ENGINE,
    fake_params,
    fake_processes,
    free_port,
    installed_sglang,
    no_leftover,
    stage_for,
)

pytestmark = pytest.mark.usefixtures("no_leftover")


def _params(*over):
    return load_params(None, ["server.python=/opt/sglang/bin/python", "server.model_path=/m", "server.port=30013",
                              *GPU_ENGINE, *over])


def test_cpu_engine_command_is_the_card_command_plus_the_engine_flags():
    """server.engine cpu: the same builder, the card's flags first, then exactly the flags
    cpu_engine.engine_flags names (a switch the card's part already has is not repeated)."""
    from nvfp4study.serving import cpu_engine

    cpu = load_params(None, ["server.model_path=/m"])
    gpu = load_params(None, ["server.model_path=/m", "server.engine=gpu"])
    for depth in (None, 2):
        c = ServerConfig(clamp="exact", spec_depth=depth)
        a, b = build_command(cpu, c), build_command(gpu, c)
        assert a[:len(b)] == b
        extra = [x for x in cpu_engine.engine_flags(depth) if not (x == "--enable-metrics" and x in b)]
        assert a[len(b):] == extra
        assert a[0] == str(server.REPO_ROOT / ".venv-sglang/bin/python")
    assert server.gpu_refusal(cpu) is None and "NVFP4-capable GPU" in server.card_refusal(cpu)


def _pairs(cmd):
    tail = cmd[cmd.index("serve") + 1:]
    return {a: (tail[i + 1] if i + 1 < len(tail) and not tail[i + 1].startswith("--") else True)
            for i, a in enumerate(tail) if a.startswith("--")}


# --- the command -----------------------------------------------------------------------------
def test_card_command():
    p = _params()
    cmd = build_command(p, card_config(p))
    assert cmd[:4] == ["/opt/sglang/bin/python", "-c", server.SERVE_CODE, "serve"]
    assert "from sglang.cli.main import main" in cmd[2]  # the `sglang` console script's target
    f = _pairs(cmd)
    assert f == {"--model-path": "/m", "--trust-remote-code": True, "--host": "127.0.0.1", "--port": "30013",
                 "--tp-size": "1", "--ep-size": "1", "--mem-fraction-static": "0.75",
                 "--context-length": "32768", "--max-running-requests": "1", "--chunked-prefill-size": "2048",
                 "--disable-shared-experts-fusion": True, "--tool-call-parser": "glm45",
                 "--speculative-algorithm": "NEXTN", "--speculative-num-steps": "2",
                 "--speculative-eagle-topk": "1", "--speculative-num-draft-tokens": "3", "--enable-metrics": True}


@pytest.mark.parametrize("depth,steps,draft", [(1, "1", "2"), (2, "2", "3"), (3, "3", "4")])
def test_depth_sets_steps_and_draft_tokens(depth, steps, draft):
    p = _params()
    f = _pairs(build_command(p, ServerConfig(spec_depth=depth)))
    assert (f["--speculative-num-steps"], f["--speculative-num-draft-tokens"]) == (steps, draft)
    assert server.num_draft_tokens(p, ServerConfig(spec_depth=depth)) == int(draft)


def test_spec_off_deterministic_upstream_and_parsers():
    p = _params("server.reasoning_parser=ling3", "server.extra_args=[--decode-log-interval, '10']")
    f = _pairs(build_command(p, ServerConfig(spec_depth=None, deterministic=True, tp_size=4, ep_size=4)))
    assert not any(k.startswith("--speculative") for k in f)
    assert f["--enable-deterministic-inference"] is True
    assert (f["--tp-size"], f["--ep-size"]) == ("4", "4")  # the upstream 4-GPU reference
    assert f["--reasoning-parser"] == "ling3" and f["--decode-log-interval"] == "10"
    assert server.num_draft_tokens(p, ServerConfig(spec_depth=None)) is None


def test_command_needs_interpreter_and_model():
    with pytest.raises(WrongInterpreter):
        build_command(load_params(None, ["server.python="]), card_config(load_params()))
    from nvfp4study.core.errors import StageInputMissing

    with pytest.raises(StageInputMissing):
        build_command(load_params(None, ["server.python=/x", "server.model_path="]), card_config(load_params()))


def test_every_flag_is_defined_in_sglang_0_5_23():
    from nvfp4study.sglang.source import wheel_path

    wheel = wheel_path("0.5.23")  # downloaded once into the cache (a fresh CI machine has none)
    defined = server.sglang_cli_flags(wheel)
    assert "--tensor-parallel-size" in defined and "--speculative-depth" not in defined
    assert "--disable-cuda-graph" in defined  # a hand-registered flag of server_args.py
    p = _params("server.reasoning_parser=ling3")
    used = set()
    for c in (card_config(p), ServerConfig(spec_depth=None, deterministic=True)):
        used |= set(server.command_flags(build_command(p, c)))
    assert used == set(server.FLAG_SOURCES)
    for flag in used:
        assert defined.get(flag) == server.FLAG_SOURCES[flag], flag


def test_command_table_verifies_against_the_wheel():
    wheel = server.cached_wheel("0.5.23")
    df = server.command_table(load_params())
    col = "defined in sglang 0.5.23"
    assert list(df.flag[:2]) == ["--model-path", "--trust-remote-code"]
    assert "NOT DEFINED" not in set(df[col])
    if wheel:
        assert df.set_index("flag").loc["--enable-metrics", col] == "arg_groups/fields/observability.py:70"


# --- the plan --------------------------------------------------------------------------------
def test_plan_launches_each_configuration_once():
    p = load_params(None, list(GPU_ENGINE))
    plan = plans.plan_servers(p)  # read from the stages' own plan(params)
    # 04-07's six exact configurations, 05's reasoning-parser probe (a configuration of its own:
    # ServerConfig.reasoning_parser) and 05's sweep in mode none
    assert len(plan) == len(set(plan)) == 8
    needed = {c for cs in plans.stage_configs(p).values() for c in cs}
    assert set(plan) == needed
    assert [c.clamp for c in plan] == ["exact"] * 7 + ["none"]  # one switch of the install
    assert "clamp=exact-spec=2-det=off-parser=ling3" in [c.key for c in plan]
    keys = [c.key for c in plan]
    assert keys[:4] == ["clamp=exact-spec=off-det=off", "clamp=exact-spec=1-det=off",
                        "clamp=exact-spec=2-det=off", "clamp=exact-spec=3-det=off"]
    table = plans.plan_table(p)
    row = table.set_index("config").loc["clamp=exact-spec=2-det=off"]
    assert row.stages == "04_launch_server, 05_corruption, 06_mtp_sweep, 07_determinism"


def test_plan_adds_broken_checkpoint():
    p = load_params(None, ["mtp.broken_model_path=/broken", "determinism.deterministic_mode=false", *GPU_ENGINE])
    plan = plans.plan_servers(p)
    broken = [c for c in plan if c.model_label == "broken-draft"]
    assert len(broken) == 4 and all(c.model_path == "/broken" for c in broken)
    assert broken[0].key == "clamp=exact-spec=off-det=off-model=broken-draft"


# --- GPU -------------------------------------------------------------------------------------
def test_nvfp4_capability_rule():
    # is_blackwell: major in {10, 11, 12} (sglang/srt/utils/common.py 297-303)
    assert [server.nvfp4_w4a4_supported(c) for c in [(10, 0), (11, 0), (12, 1), (9, 0), (8, 9), (13, 0), None]] \
        == [True, True, True, False, False, False, False]


def test_no_gpu_device_nodes(tmp_path):
    node = tmp_path / "nvidia0"
    assert server.no_gpu_device((str(node),)) is True
    node.write_text("")
    assert server.no_gpu_device((str(tmp_path / "dxg"), str(node))) is False


def test_gpu_probe_and_refusal(tmp_path):
    hopper = fake_sglang.make_interpreter(tmp_path / "h", gpu=[9, 0, "H100", 80_000_000_000])
    none = fake_sglang.make_interpreter(tmp_path / "n", gpu=None)
    blackwell = fake_sglang.make_interpreter(tmp_path / "b")
    assert server.gpu_capability(str(hopper)) == (9, 0)
    assert server.gpu_capability(str(none)) is None
    assert server.gpu_info(str(blackwell)) == {"capability": (10, 0), "name": "NVIDIA Fake Blackwell",
                                               "memory_gb": 128.0}
    refuse = lambda exe: server.gpu_refusal(load_params(None, ["server.enabled=true", f"server.python={exe}",  # noqa: E731
                                                               "server.engine=gpu", "server.require_gpu=true"]))
    assert refuse(hopper) == "needs an NVFP4-capable GPU (compute capability 9.0 < 10.0)"
    assert refuse(none) == "needs an NVFP4-capable GPU (no CUDA GPU visible)"
    assert refuse(blackwell) is None
    assert "server.enabled is false" in server.gpu_refusal(load_params(None, ["server.enabled=false"]))
    assert server.gpu_refusal(load_params()) is None  # the default profile's CPU engine needs no GPU


# --- lifecycle -------------------------------------------------------------------------------
def test_serving_starts_and_stops_the_whole_group(tmp_path):
    p, _, run = fake_params(tmp_path)
    st = stage_for(p, run)
    rec = {}
    with server.serving(st, card_config(p), launch_record=rec) as url:
        assert httpx.get(url + "/health_generate").status_code == 200
        members = server.process_for(url).group_members()
        assert len(members) == 2  # the server and its "scheduler" child, in one process group
        assert len(fake_processes()) == 2
    assert not fake_processes()
    assert rec["load_s"] > 0 and rec["returncode"] is not None and rec["sglang_version"] == "0.5.23"
    log = (run / rec["log"]).read_text()
    assert "[swiglu-clamp-patch] cutlass nvfp4 limit=4" in log and rec["command"][0].endswith("python")
    assert server.process_for(url) is None


def test_server_that_dies_while_loading(tmp_path):
    p, _, run = fake_params(tmp_path, fake={"die_during_load": True})
    with pytest.raises(ServerExitedDuringLoad) as e:
        with server.serving(stage_for(p, run), card_config(p)):
            pytest.fail("must not yield")
    assert "exited with status 1" in str(e.value)
    assert "does not support NVFP4" in e.value.log_tail and e.value.log.endswith(".log")


def test_server_never_healthy(tmp_path):
    p, _, run = fake_params(tmp_path, "server.startup_timeout_s=1.5", fake={"never_healthy": True})
    t = time.monotonic()
    with pytest.raises(HealthTimeout) as e:
        with server.serving(stage_for(p, run), card_config(p)):
            pytest.fail("must not yield")
    assert time.monotonic() - t < 10
    assert "HTTP 503" in str(e.value) and "Uvicorn running" in e.value.log_tail


def test_port_in_use_is_refused_before_launch(tmp_path):
    port = free_port()
    p, _, run = fake_params(tmp_path, port=port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        with pytest.raises(PortInUse, match=str(port)):
            with server.serving(stage_for(p, run), card_config(p)):
                pytest.fail("must not yield")
    assert not list((run / "logs").glob("*.log")) if (run / "logs").exists() else True


def test_wrong_interpreter(tmp_path):
    p, _, run = fake_params(tmp_path)
    bad = p.model_copy(update={"server": p.server.model_copy(update={"python": str(tmp_path / "nope/python")})})
    with pytest.raises(WrongInterpreter, match="does not exist"):
        with server.serving(stage_for(bad, run), card_config(p)):
            pass
    old = fake_sglang.make_interpreter(tmp_path / "old", version="0.5.22")
    with pytest.raises(WrongInterpreter, match="0.5.22"):
        server.check_interpreter(str(old), "0.5.23")
    nosg = tmp_path / "nosg" / "python"
    nosg.parent.mkdir()
    nosg.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'sglang'\" >&2\nexit 1\n")
    nosg.chmod(0o755)
    with pytest.raises(WrongInterpreter, match="has no sglang"):
        server.check_interpreter(str(nosg))
    notexe = tmp_path / "notexe"
    notexe.write_text("")
    with pytest.raises(WrongInterpreter, match="not executable"):
        server.check_interpreter(str(notexe))


def test_no_capable_gpu_refuses_to_launch(tmp_path):
    p, _, run = fake_params(tmp_path, "server.require_gpu=true", fake={"gpu": [9, 0, "H100", 80e9]})
    with pytest.raises(NoCapableGPU, match="9.0 < 10.0"):
        with server.serving(stage_for(p, run), card_config(p)):
            pass


def test_sglang_is_stopped_by_sigint_to_its_first_process(tmp_path):
    # a signal to the whole group takes SGLang's child-crash route (serving.server.SGLANG_STOP_SIGNAL)
    p, _, run = fake_params(tmp_path)
    with server.serving(stage_for(p, run), card_config(p)) as url:
        sp = server.process_for(url)
    assert (sp.stop_signal, sp.stop_leader_only) == (signal.SIGINT, True)
    assert sp.returncode == 0 and not fake_processes()  # the fake's own graceful exit


def test_sigterm_ignored_escalates_to_sigkill(tmp_path):
    p, _, run = fake_params(tmp_path, "server.shutdown_grace_s=1", fake={"ignore_sigterm": True})
    t = time.monotonic()
    with server.serving(stage_for(p, run), card_config(p)) as url:
        sp = server.process_for(url)
        t = time.monotonic()
    assert time.monotonic() - t >= 1.0  # waited the grace period, then SIGKILL
    assert sp.returncode == -signal.SIGKILL
    assert not fake_processes()


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_stopped_on_error_and_interrupt(tmp_path, exc):
    p, _, run = fake_params(tmp_path)
    with pytest.raises(exc):
        with server.serving(stage_for(p, run), card_config(p)) as url:
            pid = server.process_for(url).proc.pid
            raise exc("stop")
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not fake_processes()


def test_server_dying_mid_stream(tmp_path):
    p, _, run = fake_params(tmp_path)
    with pytest.raises(ServerDied) as died:
        with server.serving(stage_for(p, run), card_config(p)) as url:
            with pytest.raises(StreamCut) as cut:
                client.chat_completion(url, [{"role": "user", "content": "x [[fake:die]]"}],
                                       temperature=0, max_tokens=20)
            assert "Load weight end" in cut.value.log_tail and cut.value.record["status"] == "stream_cut"
            server.process_for(url).check_alive(wait_s=5)
    assert "status 3" in str(died.value)


def test_atexit_stops_a_server_left_running(tmp_path):
    exe = fake_sglang.make_interpreter(tmp_path / "env")
    port = free_port()
    script = textwrap.dedent(f"""
        from pathlib import Path
        from nvfp4study.serving.server import ServerProcess
        sp = ServerProcess([{str(exe)!r}, "-c", "from sglang.cli.main import main", "serve", "--port", "{port}",
                            "--host", "127.0.0.1"], Path({str(tmp_path / 'a.log')!r}), "127.0.0.1", {port}, grace_s=2)
        sp.start()
        sp.wait_healthy(20, 0.05)
        print(sp.proc.pid, flush=True)
        # the script ends without stopping it: the atexit hook must
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.split()[0])
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_serve_cli_dry_run(capsys):
    assert serve_cli.main(["--dry-run", "--depth", "3", "-p", "server.python=/py", "-p", "server.model_path=/m"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("/py -c ") and "serve --model-path /m" in out and "--speculative-num-steps 3" in out


def test_config_keys_and_roundtrip():
    c = ServerConfig(clamp="none", spec_depth=None, deterministic=True)
    assert c.key == "clamp=none-spec=off-det=on"
    assert ServerConfig.from_dict(c.to_dict()) == c
    assert replace(c, tp_size=4).key == "clamp=none-spec=off-det=on-tp=4"


def test_install_switched_for_the_launch_and_restored(tmp_path):
    from nvfp4study.sglang import patch as sglang_patch
    from nvfp4study.sglang.source import open_tree

    site, files = installed_sglang(tmp_path / "site")  # the package files the patches touch
    before = {f: (site / f).read_bytes() for f in files}
    p, _, run = fake_params(tmp_path, "sglang.apply_to_install=true", "sglang.source=installed",
                            fake={"clamp_form": "install", "sglang_origin": str(site / "sglang/__init__.py")})
    rec = {}
    with server.serving(stage_for(p, run), ServerConfig(clamp="exact", spec_depth=2, deterministic=True),
                        launch_record=rec):
        st = sglang_patch.status(open_tree(site))
        assert (st["clamp_mode"], st["det"]) == ("exact", True)
    st = sglang_patch.status(open_tree(site))
    assert (st["clamp_mode"], st["det"]) == ("stock", False)
    assert {f: (site / f).read_bytes() for f in files} == before  # restored byte for byte
    log = (run / rec["log"]).read_text()
    assert "[swiglu-clamp-patch] cutlass nvfp4 limit=4 mode=exact form=SwigluStep layer=35" in log
    assert "clamp mode 'exact'" in rec["install"] and (run / "data" / "sglang_patch_state.json").is_file()


def _daemons() -> list[psutil.Process]:
    return [p for p in fake_processes() if "fake-sglang-daemon" in " ".join(p.cmdline())]


@pytest.mark.parametrize("daemon", ["keep_env", "clear_env"])
@pytest.mark.parametrize("way", ["exit_during_load", "health_timeout", "interrupt"])
def test_daemon_that_left_the_session_is_ended(tmp_path, way, daemon):
    """A server that leaves a setsid + double-fork daemon behind (ignoring SIGTERM, with or
    without its environment): teardown ends it too, in all three ways a launch ends early, and
    leaves no zombie child."""
    fake = {"daemonize": daemon, "die_during_load": way == "exit_during_load",
            "never_healthy": way == "health_timeout"}
    p, _, run = fake_params(tmp_path, "server.shutdown_grace_s=1", "server.startup_timeout_s=3",
                            fake=fake)
    expected = {"exit_during_load": ServerExitedDuringLoad, "health_timeout": HealthTimeout,
                "interrupt": KeyboardInterrupt}[way]
    seen = []
    with pytest.raises(expected):
        with server.serving(stage_for(p, run), card_config(p)):
            deadline = time.monotonic() + 5
            while not seen and time.monotonic() < deadline:
                seen = _daemons()
                time.sleep(0.05)
            raise KeyboardInterrupt
    if way == "interrupt":
        assert seen, "the fake left no daemon: the test would prove nothing"
    deadline = time.monotonic() + 3
    while fake_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = fake_processes()
    for q in left:
        q.kill()
    assert not left, [q.cmdline() for q in left]
    zombies = [c for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE]
    assert not zombies


def test_cpu_engine_without_its_environment_names_the_build_command(tmp_path):
    """A missing .venv-sglang is a named error with `make sglang-env`, before anything starts."""
    from nvfp4study.core.errors import WrongInterpreter

    params = load_params(None, [f"server.python={tmp_path / 'no-venv' / 'bin' / 'python'}", "server.model_path=/m"])
    stage = stage_for(params, tmp_path / "run")
    with pytest.raises(WrongInterpreter, match="make sglang-env"), server.serving(stage, card_config(params)):
        pass
    assert not (tmp_path / "run" / "logs").exists()


# 06's spec-off and k=2 launches also serve 07's requests (each configuration is launched once):
# two short ones, so that these tests time loads, not the fake's 512-token determinism replies
SHORT_DETERMINISM = ("determinism.prompts=1", "determinism.repeats=2", "determinism.max_tokens=8")


def _launch_rows(run: Path, key: str) -> list[dict]:
    return [json.loads(x) for x in (run / "data" / f"serve-launch-{key}.jsonl").read_text().splitlines()]


@pytest.mark.usefixtures("no_leftover")
def test_parallel_loads_overlap_loading_not_requests(tmp_path):
    """``server.parallel_loads=2``: two launches of one install state load at the same time, then
    each serves its requests while the other waits; a third loads alone; the install is back in
    its state afterwards (each launch restores what it found, innermost first)."""
    from nvfp4study.core.stage import open_stage
    from nvfp4study.serving import measure
    from nvfp4study.sglang import patch as sglang_patch
    from nvfp4study.sglang.source import open_tree

    site, files = installed_sglang(tmp_path / "site")
    before = {f: (site / f).read_bytes() for f in files}
    _, pf, run = fake_params(tmp_path, "server.parallel_loads=2", "server.port=0", "mtp.depths=[0,1,2]",
                             "mtp.prompts=1", "mtp.max_tokens=8", *SHORT_DETERMINISM, "sglang.apply_to_install=true",
                             "sglang.source=installed",
                             fake={"clamp_form": "install", "sglang_origin": str(site / "sglang/__init__.py"),
                                   "listen_delay_s": 1.0})
    measure.collect(open_stage("06_mtp_sweep", str(pf), str(run)))
    a, b, c = (_launch_rows(run, f"clamp=exact-spec={d}-det=off")[0] for d in ("off", "1", "2"))
    assert [r["status"] for r in (a, b, c)] == ["ok"] * 3
    assert (a["loaded_with"], b["loaded_with"], c["loaded_with"]) == (1, 1, 0)
    assert b["started_at"] < a["healthy_at"] and a["started_at"] < b["healthy_at"]  # loads overlapped
    assert c["started_at"] > max(a["healthy_at"], b["healthy_at"])
    assert a["port"] != b["port"]
    raw = {k: [json.loads(x) for x in (run / "data" / f"serve-raw-clamp=exact-spec={k}-det=off.jsonl")
               .read_text().splitlines()] for k in ("off", "1")}
    assert all(r["status"] == "ok" for rows in raw.values() for r in rows)
    st = sglang_patch.status(open_tree(site))
    assert (st["clamp_mode"], st["det"]) == ("stock", False)
    assert {f: (site / f).read_bytes() for f in files} == before


@pytest.mark.usefixtures("no_leftover")
def test_parallel_load_failure_stops_the_other_launch(tmp_path):
    """When one of two launches loading together dies, the error is raised at once and the other
    one is stopped too; both records say how they ended and no process is left."""
    from nvfp4study.core.errors import ServerExitedDuringLoad
    from nvfp4study.core.stage import open_stage
    from nvfp4study.serving import measure

    _, pf, run = fake_params(tmp_path, "server.parallel_loads=2", "server.port=0", "mtp.depths=[0,1]",
                             "mtp.prompts=1", "mtp.max_tokens=8", *SHORT_DETERMINISM, fake={"die_during_load": True})
    with pytest.raises(ServerExitedDuringLoad):
        measure.collect(open_stage("06_mtp_sweep", str(pf), str(run)))
    rows = [_launch_rows(run, f"clamp=exact-spec={d}-det=off")[0] for d in ("off", "1")]
    assert all(r["status"].startswith("ServerExitedDuringLoad") for r in rows)
    assert all(r["left_after_stop"] == [] for r in rows)
    assert not fake_processes()


@pytest.mark.usefixtures("no_leftover")
def test_interrupt_while_two_launches_load_stops_both_and_restores_the_install(tmp_path, monkeypatch):
    """Ctrl-C while two launches are loading together: both process groups are stopped, both
    launch records say KeyboardInterrupt, and the install is back in its state byte for byte.
    The interrupt arrives in the health wait after 1 s (``_thread.interrupt_main`` cannot reach
    the thread an xdist worker runs tests in)."""
    from nvfp4study.core.stage import open_stage
    from nvfp4study.serving import measure
    from nvfp4study.serving.process import ServerProcess

    def interrupted(self, timeout_s, poll_s=2.0):
        time.sleep(1.0)
        raise KeyboardInterrupt

    site, files = installed_sglang(tmp_path / "site")
    before = {f: (site / f).read_bytes() for f in files}
    _, pf, run = fake_params(tmp_path, "server.parallel_loads=2", "server.port=0", "mtp.depths=[0,1]",
                             "mtp.prompts=1", "mtp.max_tokens=8", *SHORT_DETERMINISM, "sglang.apply_to_install=true",
                             "sglang.source=installed",
                             fake={"clamp_form": "install", "sglang_origin": str(site / "sglang/__init__.py"),
                                   "listen_delay_s": 30.0})
    monkeypatch.setattr(ServerProcess, "wait_healthy", interrupted)
    with pytest.raises(KeyboardInterrupt):
        measure.collect(open_stage("06_mtp_sweep", str(pf), str(run)))
    rows = [_launch_rows(run, f"clamp=exact-spec={d}-det=off")[0] for d in ("off", "1")]
    assert [r["status"].split(":")[0] for r in rows] == ["KeyboardInterrupt"] * 2
    assert all("started_at" in r and "healthy_at" not in r for r in rows)  # both were loading
    assert not fake_processes()
    assert {f: (site / f).read_bytes() for f in files} == before


@pytest.mark.parametrize("override", ["server.cpu.clamp_probe_prompts=11", "server.cpu.clamp_probe_prompts=0",
                                      "server.cpu.clamp_probe_limit=-1", "server.cpu.clamp_probe_limit=.nan",
                                      "server.cpu.clamp_probe_limit=true", "server.cpu.clamp_probe_max_tokens=0",
                                      "server.cpu.scaling_probe_ratio=1", "server.cpu.scaling_probe_ratio=0",
                                      "server.cpu.moe_clamp=post", "server.cpu.routed_scaling=twice"])
def test_bad_clamp_probe_params_are_named(override):
    from nvfp4study.core.errors import ParamsError

    with pytest.raises(ParamsError, match=override.split("=")[0]):
        load_params(None, [override])


def test_cpu_engine_plan_adds_the_clamp_probe_to_04():
    from nvfp4study.serving.plans import needs
    from nvfp4study.serving.records import probe_requests
    from nvfp4study.stages import s04_launch as s04

    p = load_params(None)
    assert p.server.engine == "cpu"
    probes = s04.probe_configs(p)
    assert [c.model_label for c in probes] == ["clamp-probe-off", "clamp-probe-routed", "clamp-probe-shared",
                                               "clamp-probe-off-again", "scaling-probe-factor",
                                               "scaling-probe-weights"]
    assert all(c.spec_depth is None and not c.deterministic and c.clamp == p.server.clamp_mode for c in probes)
    # the routed-scaling probe's patched arm: the factor model with the native routed_scaling patch
    # (and its down_proj control, so the control runs the same patch)
    patched = list(s04.scaling_patched_configs(p).values())
    assert [(c.model_label, c.native, c.spec_depth) for c in patched] == [
        (label, (("routed_scaling", "applied"),), None) for label in ("scaling-probe-factor", "scaling-probe-weights")]
    assert plans.stage_configs(p)["04_launch_server"][1:] == [*probes, *patched]
    assert set(probes) | set(patched) <= set(plans.plan_servers(p))
    reqs = probe_requests(p)
    assert len(reqs) == p.server.cpu.clamp_probe_prompts and {r.max_tokens for r in reqs} == {
        p.server.cpu.clamp_probe_max_tokens}
    assert all(needs(p, c) == reqs for c in [*probes, *patched])
    # off: limit 0, the GPU engine, or one model named for every launch
    assert s04.probe_configs(load_params(None, ["server.cpu.clamp_probe_limit=0"])) == []
    assert s04.probe_configs(load_params(None, list(GPU_ENGINE))) == []
    assert s04.probe_configs(load_params(None, ["server.model_path=some/model"])) == []
    assert s04.scaling_patched_configs(load_params(None, ["server.cpu.clamp_probe_limit=0"])) == {}
