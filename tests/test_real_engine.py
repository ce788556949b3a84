"""Stages 04-07's serving path on SGLang 0.5.23's REAL engine on this CPU (marker ``real_engine``).

Everything goes through the study's own code: ``serving.server.serving`` (command from
``build_command`` + the CPU engine's flags, ``ServerProcess`` lifecycle), ``serving.client`` and
the decode-log reader. The served models are the run's stand-ins (``checkpoint/served.py``):
"agree" (target and draft always predict token 0: every draft accepted) and "disagree" (the
draft always proposes token 1, the target picks 0: none accepted), so acceptance is known
exactly. A missing ``.venv-sglang`` FAILS with the command that builds it.
"""

from __future__ import annotations

import shutil
import signal

import httpx
import psutil
import pytest

from cpu_engine_fixtures import require_sglang_env
from nvfp4study.checkpoint.served import DISAGREE_TOKEN, TARGET_TOKEN
from nvfp4study.core.errors import ServerExitedDuringLoad
from nvfp4study.serving import client, server
from real_engine_fixtures import alive, engine_stage, log_accept_lines, log_length
from serving_fixtures import free_port

pytestmark = pytest.mark.real_engine
K = 2  # NEXTN depth of the launches here: 2 draft steps, 3 draft tokens per verify pass


def _ask(url: str, n: int, **kw):
    return client.chat_completion(url, [{"role": "user", "content": "Count to ten."}], temperature=0.0,
                                  max_tokens=n, return_spec_tokens_details=True, expect_spec_details=True,
                                  return_output_ids=True, timeout=600, **kw)


@pytest.fixture(scope="module")
def agree_server(tmp_path_factory):
    """One launch of the "agree" stand-in at depth K, shared by the tests that only send requests."""
    require_sglang_env()
    stage = engine_stage(tmp_path_factory.mktemp("agree"), free_port())
    config = server.ServerConfig(clamp="exact", spec_depth=K, model_label="agree-draft")
    rec: dict = {}
    with server.serving(stage, config, launch_record=rec) as url:
        yield url, rec, stage
    # the whole real tree is gone after the stop (a failure here is an error of the last test),
    # by SIGINT's graceful stop, not after SIGKILL (SIGTERM took SGLang's child-crash route).
    # After uvicorn's shutdown and SGLang's kill_process_tree the leader either dies by the
    # SIGINT it got (-2) or returns from main (0); both were seen, -9 (SIGKILL) never
    assert rec["left_after_stop"] == [], rec["left_after_stop"]
    assert rec["returncode"] in (0, -signal.SIGINT), rec["returncode"]
    log = (stage.run_dir / rec["log"]).read_text(errors="replace")
    assert "kill_process_tree called" in log and "before crash diagnostics" not in log
    assert alive([p["pid"] for p in rec["process_tree"]]) == []


def test_launch_is_the_study_command_on_the_real_engine(agree_server):
    url, rec, stage = agree_server
    cmd = rec["command"]
    assert cmd[0].endswith(".venv-sglang/bin/python") and "serve" in cmd
    flags = server.command_flags(cmd)
    for f in ("--tp-size", "--disable-shared-experts-fusion", "--speculative-algorithm", "--device", "--attention-backend"):
        assert f in flags
    assert cmd[cmd.index("--device") + 1] == "cpu" and cmd[cmd.index("--speculative-num-draft-tokens") + 1] == str(K + 1)
    names = [p["name"] for p in rec["process_tree"]]
    assert "sglang::scheduler" in names and "sglang::detokenizer" in names
    assert rec["engine"]["engine"] == "SGLang 0.5.23 engine on CPU" and rec["engine"]["replaced_ops"]
    assert rec["sglang_version"] == "0.5.23" and rec["load_s"] > 0
    assert client.server_info(url)["speculative_algorithm"] in ("EAGLE", "NEXTN")


def test_agree_draft_accepts_every_token(agree_server):
    """Known acceptance: accept rate 1, every decode-log line "accept len: K+1.00, accept rate:
    1.00", correct drafts = proposed = K per verify pass, Prometheus ratio = the response's."""
    url, rec, stage = agree_server
    log = stage.run_dir / rec["log"]
    client.flush_cache(url)
    start, before = log_length(log), client.get_metrics(url)
    r = _ask(url, 13)
    after = client.get_metrics(url)
    d = r["spec_tokens_details"]
    n, v = r["usage"]["completion_tokens"], d["spec_verify_ct"]
    assert r["output_ids"] == [TARGET_TOKEN] * n and n == 13
    assert d["spec_accept_rate"] == 1.0
    assert d["spec_num_proposed_drafts"] == K * v and d["spec_num_correct_drafts"] == K * v
    assert d["spec_accept_length"] == pytest.approx(n / v, abs=1e-12)
    # 1 token from prefill, then K+1 per verify pass: 13 = 1 + 3 * 4
    assert v == (n - 1) // (K + 1)
    assert after["sglang:spec_verify_calls_total"] - before["sglang:spec_verify_calls_total"] == v
    assert after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"] == n
    lines = log_accept_lines(log, start)
    assert lines and all((f"{a:.2f}", f"{b:.2f}") == (f"{K + 1}.00", "1.00") for a, b in lines)


def test_streaming_chunks_and_usage(agree_server):
    url, _, _ = agree_server
    r = _ask(url, 7, keep_sse=True)
    text = [c for c in r["chunks"] if c.get("kind") == "content"]
    assert len(text) >= 2 and r["usage"]["completion_tokens"] == 7
    assert r["output_ids"] == [TARGET_TOKEN] * 7
    assert r["ttft_s"] is not None and r["end_s"] >= r["ttft_s"]


def test_mid_stream_abort_leaves_the_server_serving(agree_server):
    """A client that drops a stream after two chunks: SGLang aborts the request, the server keeps
    answering and the next request is complete."""
    url, rec, stage = agree_server
    body = {"model": "default", "messages": [{"role": "user", "content": "Go on."}], "stream": True,
            "max_completion_tokens": 400, "temperature": 0.0}
    seen = 0
    with httpx.Client(timeout=600) as s, s.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                seen += 1
            if seen >= 2:
                break  # closing the connection mid-stream
    assert seen == 2
    r = _ask(url, 4)
    assert r["status"] == "ok" and r["usage"]["completion_tokens"] == 4
    assert "Abort" in (stage.run_dir / rec["log"]).read_text(errors="replace") or r["status"] == "ok"


def test_process_tree_is_the_real_engine(agree_server):
    """While healthy: the launcher (HTTP server + tokenizer manager) and its scheduler and
    detokenizer children, all in the launch's process group; none of them gone yet."""
    url, rec, stage = agree_server
    tree = rec["process_tree"]
    pids = [p["pid"] for p in tree]
    assert len(pids) >= 3 and alive(pids) == pids
    leader = tree[0]["pid"]
    assert all(p["pid"] == leader or p["ppid"] in pids for p in tree)


def test_disagree_draft_gives_the_broken_draft_signature(tmp_path):
    """The card's broken-draft log line on the real engine: accept len 1.00, accept rate 0.00;
    the target's tokens are every one TARGET_TOKEN, none of the draft's DISAGREE_TOKEN survive."""
    require_sglang_env()
    stage = engine_stage(tmp_path, free_port())
    config = server.ServerConfig(clamp="exact", spec_depth=K, model_label="broken-draft")
    rec: dict = {}
    with server.serving(stage, config, launch_record=rec) as url:
        log = stage.run_dir / rec["log"]
        start = log_length(log)
        r = _ask(url, 9)
    d = r["spec_tokens_details"]
    n, v = r["usage"]["completion_tokens"], d["spec_verify_ct"]
    assert r["output_ids"] == [TARGET_TOKEN] * n and DISAGREE_TOKEN not in r["output_ids"]
    assert d["spec_accept_rate"] == 0.0 and d["spec_num_correct_drafts"] == 0
    assert v == n - 1 and d["spec_num_proposed_drafts"] == K * v
    lines = log_accept_lines(log, start)
    assert lines and all((f"{a:.2f}", f"{b:.2f}") == ("1.00", "0.00") for a, b in lines)
    assert rec["left_after_stop"] == [] and alive([p["pid"] for p in rec["process_tree"]]) == []


def test_server_that_dies_during_load(tmp_path):
    """A checkpoint without its weights: the real scheduler fails while loading, the launch raises
    ServerExitedDuringLoad with SGLang's traceback in the log tail, and nothing is left."""
    require_sglang_env()
    stage = engine_stage(tmp_path, free_port())
    good = server.standin_path(stage)
    broken = tmp_path / "no-weights"
    shutil.copytree(good, broken, ignore=shutil.ignore_patterns("*.safetensors"))
    config = server.ServerConfig(clamp="exact", spec_depth=None, model_path=str(broken), model_label="study")
    rec: dict = {}
    with pytest.raises(ServerExitedDuringLoad) as ei, server.serving(stage, config, launch_record=rec):
        pass
    assert "Traceback" in ei.value.log_tail or "Error" in ei.value.log_tail
    assert rec.get("load_s") is None and rec["left_after_stop"] == []
    # its scheduler and detokenizer, re-parented to us, are reaped, not left as zombies
    assert [c.pid for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE] == []


def test_install_overlay_links_the_install_and_copies_what_patches_edit(tmp_path):
    """The run's private copy of SGLang: every file (bytecode too, so server processes need not
    compile SGLang again) a hard link of the environment's, except the files a patch mode edits,
    which are real copies without their now-stale bytecode."""
    import os

    from nvfp4study.serving import launch_env
    from nvfp4study.sglang import patch as sglang_patch

    require_sglang_env()
    root = launch_env.install_overlay(engine_stage(tmp_path / "run", 0))
    pkg = root / "sglang"
    edited = {e["path"] for m in sglang_patch.modes_for("0.5.23") if m != "stock"
              for e in sglang_patch._files("0.5.23", m)}
    assert edited
    for rel in edited:
        f = root / rel
        assert f.stat().st_nlink == 1, rel  # writing it cannot reach the environment
        assert not list((f.parent / "__pycache__").glob(f"{f.stem}.*.pyc")), rel
    init_pyc = list((pkg / "__pycache__").glob("__init__.*.pyc"))
    assert init_pyc and os.stat(init_pyc[0]).st_nlink >= 2
