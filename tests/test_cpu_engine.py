"""SGLang 0.5.23's REAL engine on this CPU (``nvfp4study.serving.cpu_engine``), in ``.venv-sglang``.

A tiny all-MLA BailingMoeV3 checkpoint with an MTP layer (the project's served checkpoint,
``nvfp4study.checkpoint.served``, at ``cpu_engine_fixtures.TINY_SHAPE``) is served by
``sglang serve`` with the CPU engine's environment and flags, launched and stopped by the
project's :class:`~nvfp4study.serving.process.ServerProcess`. Two servers are shared by the
module (no speculation: torch-native attention; NEXTN k=2: intel_amx attention over the stand-in
ops); k=1 and k=3 (chains) and a top-2 tree launch once each, first (while no other server takes
the CPU), on a checkpoint whose draft agrees with the target by construction. Missing ``.venv-sglang`` FAILS with ``make sglang-env``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from cpu_engine_fixtures import (
    REPO,
    no_engine_processes,
    require_sglang_env,
    write_tiny_checkpoint,
)
from nvfp4study.checkpoint.served import TARGET_TOKEN
from nvfp4study.serving import cpu_engine
from nvfp4study.serving.launchers import SGLANG_STOP_SIGNAL
from nvfp4study.serving.process import ServerProcess
from nvfp4study.sglang.source import cache_dir
from serving_fixtures import free_port

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

SERVE_CODE = "import sys; from sglang.cli.main import main; sys.argv[0] = 'sglang'; sys.exit(main())"
DECODE_LINE = re.compile(r"Decode batch,.*")
ACCEPT = re.compile(r"accept len: ([0-9.]+), accept rate: ([0-9.]+)")
SPEC_FIELDS = ("spec_accept_length", "spec_accept_rate", "spec_num_correct_drafts",
               "spec_num_proposed_drafts", "spec_verify_ct", "spec_correct_drafts_histogram")
STARTUP_S = 300
PRELOAD_CACHE = cache_dir() / "forkserver"  # where the study's launches keep the fork server's list
TRACES = Path()  # the session's trace folder (_trace_folder)


@pytest.fixture(scope="module", autouse=True)
def _trace_folder(tmp_path_factory):
    global TRACES
    TRACES = tmp_path_factory.mktemp("ops")


def spec_flags(k: int, topk: int = 1) -> list[str]:
    draft = k + 1 if topk == 1 else 2 * k  # chain: k drafts + the root; tree: a 2k-node tree
    return ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", str(k),
            "--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", str(draft)]


def launch(ckpt: Path, folder: Path, spec_depth: int | None, topk: int = 1, *,
           exec_: bool = False) -> tuple[ServerProcess, Path]:
    """Start ``sglang serve`` on the CPU engine and wait until /health_generate is 200.
    Returns the server and the file the stand-in ops record their first call in."""
    py = require_sglang_env()
    port = free_port()
    cmd = [str(py), "-c", SERVE_CODE, "serve", "--model-path", str(ckpt), "--host", "127.0.0.1",
           "--port", str(port), *(spec_flags(spec_depth, topk) if spec_depth else []),
           *cpu_engine.engine_flags(spec_depth)]
    # one trace folder for the session: the environment is the same for every launch, so the
    # fork server started by the first serves them all (each writes ops-<its group>.txt)
    env = cpu_engine.engine_env({"NVFP4STUDY_CPU_ENGINE_TRACE": str(TRACES)})
    sp = ServerProcess(command=cmd, log_path=folder / f"server-{port}.log", host="127.0.0.1",
                       port=port, env=env, grace_s=15, stop_signal=SGLANG_STOP_SIGNAL,
                       stop_leader_only=True,  # as the study stops SGLang (launchers.py says why)
                       preloaded=None if exec_ else PRELOAD_CACHE)  # as the study starts it
    sp.start()
    try:
        sp.wait_healthy(STARTUP_S, poll_s=1.0)
    except BaseException:
        sp.stop()
        raise
    return sp, TRACES / f"ops-{sp.proc.pid}.txt"


def stop_and_check(sp: ServerProcess) -> None:
    sp.stop()
    time.sleep(0.5)
    assert no_engine_processes(sp.marker) == [], "engine processes left after stop"
    assert sp.group_members() == []


def generate(sp: ServerProcess, text: str, n: int = 24) -> dict:
    r = httpx.post(sp.base_url + "/generate", timeout=120, json={
        "text": text, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    return r.json()


def chat(sp: ServerProcess, stream: bool = False, **extra) -> httpx.Response:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Write a haiku."}],
            "max_tokens": 12, "temperature": 0, "stream": stream, **extra}
    return httpx.post(sp.base_url + "/v1/chat/completions", json=body, timeout=120)


def sse_chunks(r: httpx.Response) -> list:
    lines = [ln[len("data: "):] for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert lines and lines[-1] == "[DONE]", r.text[-300:]
    return [json.loads(x) for x in lines[:-1]]


def decode_lines(sp: ServerProcess) -> list[str]:
    return DECODE_LINE.findall(sp.log_path.read_text(errors="replace"))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny")


@pytest.fixture(scope="module")
def plain(ckpt, tmp_path_factory):
    sp, trace = launch(ckpt, tmp_path_factory.mktemp("plain"), None)
    yield sp, trace
    stop_and_check(sp)


@pytest.fixture(scope="module")
def nextn(ckpt, tmp_path_factory):
    sp, trace = launch(ckpt, tmp_path_factory.mktemp("nextn"), 2)
    yield sp, trace
    stop_and_check(sp)


# --- without the engine ---------------------------------------------------------------------------
def test_missing_env_fails_with_the_build_command(monkeypatch, tmp_path):
    import cpu_engine_fixtures as fx

    monkeypatch.setattr(fx, "SGL_VENV", tmp_path / "none")
    monkeypatch.setattr(fx, "SGL_PYTHON", tmp_path / "none" / "bin" / "python")
    with pytest.raises(pytest.fail.Exception, match=r"make sglang-env"):
        fx.require_sglang_env()


def test_flags_env_and_description():
    assert cpu_engine.engine_flags(None)[-4:] == ["--attention-backend", "torch_native", "--dtype", "float32"]
    assert "intel_amx" in cpu_engine.engine_flags(3)
    with pytest.raises(ValueError):
        cpu_engine.engine_flags(0)
    env = cpu_engine.engine_env({"PYTHONPATH": "a", "X": "1"})
    assert env["PYTHONPATH"].split(":")[0] == str(cpu_engine.SITE_DIR) and env["X"] == "1"
    assert env["SGLANG_USE_CPU_ENGINE"] == "1" and env["TORCHDYNAMO_DISABLE"] == "1"
    assert env["OMP_NUM_THREADS"] == "1"
    d = cpu_engine.describe()
    assert d["engine"] == "SGLang 0.5.23 engine on CPU"
    assert all(re.search(r"\.py(:\d+| \w+)", p["target"]) and p["why"] for p in d["patches"])
    site = (cpu_engine.SITE_DIR / "sitecustomize.py").read_text()
    for p in d["patches"]:  # the description and the boot hook name the same targets
        target = p["target"].removeprefix("srt/")
        assert target.split(":")[0].split(" ")[0] in site, target


@pytest.mark.parametrize("env, expected", [
    ({"SGLANG_USE_CPU_ENGINE": "1"}, "llama,qwen3,registry"),  # the served two are scanned
    ({"SGLANG_USE_CPU_ENGINE": "1", "NVFP4STUDY_CPU_ENGINE_MODELS": "llama"},
     "bailing_moe_nextn,bailing_moe_v3,qwen3,registry"),
    ({"SGLANG_USE_CPU_ENGINE": "1", "SGLANG_DISABLED_MODEL_ARCHS": "mine"}, "mine"),  # the user's kept
    ({}, "None"),  # not a server process: nothing set
])
def test_the_registry_scan_skips_unserved_models(tmp_path, env, expected):
    models = tmp_path / "sglang" / "srt" / "models"
    models.mkdir(parents=True)
    (tmp_path / "sglang" / "__init__.py").write_text("")
    for name in ("__init__", "bailing_moe_v3", "bailing_moe_nextn", "llama", "qwen3", "registry"):
        (models / f"{name}.py").write_text("raise SystemExit('imported')\n")
    (models / "deepseek_common").mkdir()  # a package: the registry skips packages itself
    r = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('SGLANG_DISABLED_MODEL_ARCHS'))"],
                       capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{cpu_engine.SITE_DIR}:{tmp_path}", **env})
    assert r.returncode == 0 and r.stdout.strip() == expected, r.stderr


@pytest.fixture(scope="module")
def engine_checks(ckpt) -> dict[str, str]:
    """``tests/real_sglang/engine_checks.py`` run once: its ``META``/``START`` lines by tag (the two
    tests below share one import of SGLang's engine)."""
    py = require_sglang_env()
    r = subprocess.run([str(py), str(REPO / "tests" / "real_sglang" / "engine_checks.py"), str(ckpt)],
                       capture_output=True, text=True, timeout=600,
                       env={**cpu_engine.engine_env(), "PATH": "/usr/bin:/bin"})
    out = {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in r.stdout.splitlines()
           if ln.startswith(("META ", "START "))}
    out["log"] = r.stdout[-2000:] + r.stderr[-3000:]
    return out


def test_children_are_forked_not_spawned(engine_checks):
    # the speed patch (entrypoints/engine.py 1995): SGLang's own function leaves "spawn"
    assert engine_checks.get("START") == "fork spawn", engine_checks["log"]


def test_config_class_and_model_build_on_the_meta_device(ckpt, engine_checks):
    assert "META" in engine_checks, engine_checks["log"]
    meta = json.loads(engine_checks["META"])
    cfg = json.loads((ckpt / "config.json").read_text())
    assert meta["config_class"] == "BailingHybridConfig"
    assert meta["model_class"] == "BailingMoeV3ForCausalLM"
    assert meta["devices"] == ["meta"] and meta["num_params"] > 0
    assert meta["layer_group_size"] == 1 and meta["num_hidden_layers"] == cfg["num_hidden_layers"]
    assert 0 <= meta["eos_token_id"] < meta["vocab_size"] and 0 <= meta["pad_token_id"] < meta["vocab_size"]
    names = set(meta["param_names"])
    for layer in range(cfg["num_hidden_layers"]):
        assert f"model.layers.{layer}.attention.kv_b_proj.weight" in names  # every layer MLA


# --- NEXTN k=1 and k=3 on a draft that agrees by construction --------------------------------------
@pytest.fixture(scope="module")
def agree_ckpt(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("agree") / "tiny", draft="agree")


@pytest.mark.parametrize("k", [1, 3])
def test_nextn_depth_k_accepts_every_agreeing_draft(agree_ckpt, tmp_path, k):
    sp, trace = launch(agree_ckpt, tmp_path, k)
    try:
        out = generate(sp, "agree", 1 + 4 * (k + 1))
        meta = out["meta_info"]
        assert meta["spec_verify_ct"] == 4, meta
        assert meta["spec_num_correct_drafts"] == 4 * k and meta["spec_accept_rate"] == 1.0
        assert meta["spec_correct_drafts_histogram"] == [0] * k + [4]
        lines = [ACCEPT.search(ln) for ln in decode_lines(sp)]
        last = [m for m in lines if m][-1]
        assert float(last.group(1)) == k + 1 and float(last.group(2)) == 1.0
    finally:
        stop_and_check(sp)


def test_nextn_tree_draft_topk_2(agree_ckpt, tmp_path):
    """A top-2 tree (2 steps, 4 draft tokens): the agreeing draft's first choice is the target's
    token, so every verify pass accepts at least one draft; with all-equal draft scores which
    second-level node is kept is a tie, so more is not asserted. Tree drafts call the tenth op,
    fill_accept_out_cache_loc_cpu, and the verify attention gets SGLang's CPU (QLEN_ONLY) tree
    mask."""
    sp, trace = launch(agree_ckpt, tmp_path, 2, topk=2)
    try:
        out = generate(sp, "agree", 13)
        meta = out["meta_info"]
        assert set(out["output_ids"]) == {TARGET_TOKEN}  # the construction's target token
        assert meta["spec_verify_ct"] >= 1
        assert meta["spec_num_correct_drafts"] >= meta["spec_verify_ct"], meta
        assert set(trace.read_text().split()) == set(cpu_engine.replaced_ops())
    finally:
        stop_and_check(sp)


# --- no speculation: torch-native attention --------------------------------------------------------
def test_plain_generate_chat_stream_metrics(plain):
    sp, trace = plain
    out = generate(sp, "The quick brown fox")
    assert len(out["output_ids"]) == 24 and out["meta_info"]["completion_tokens"] == 24
    assert "spec_verify_ct" not in out["meta_info"]
    r = chat(sp)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["role"] == "assistant" and body["usage"]["completion_tokens"] == 12
    r = chat(sp, stream=True, stream_options={"include_usage": True})
    assert r.status_code == 200
    chunks = sse_chunks(r)
    assert any(c.get("usage") for c in chunks)
    m = httpx.get(sp.base_url + "/metrics", timeout=30)
    assert m.status_code == 200 and "sglang:generation_tokens_total" in m.text
    lines = decode_lines(sp)
    assert lines and not any("accept len" in ln for ln in lines)
    # the registry scanned only the served models (site/sitecustomize.py): SGLang logs each
    # model module whose import fails on this machine (falcon_mamba, mamba, ...) when it scans all
    assert "Ignore import error when loading sglang.srt.models" not in sp.log_path.read_text()


# --- NEXTN k=2: intel_amx attention over the stand-in ops ------------------------------------------
def test_nextn_meta_info_log_line_metrics_and_chat(nextn):
    sp, trace = nextn
    out = generate(sp, "The quick brown fox")
    meta = out["meta_info"]
    assert all(f in meta for f in SPEC_FIELDS), sorted(meta)
    assert meta["spec_verify_ct"] >= 1 and 1.0 <= meta["spec_accept_length"] <= 3.0
    lines = [ln for ln in decode_lines(sp) if ACCEPT.search(ln)]
    assert lines, decode_lines(sp)[-3:]
    length, rate = map(float, ACCEPT.search(lines[-1]).groups())
    assert 1.0 <= length <= 3.0 and 0.0 <= rate <= 1.0
    r = chat(sp, return_spec_tokens_details=True)
    assert r.status_code == 200, r.text
    assert "spec_accept_length" in r.json()["sglext"]["spec_tokens_details"]
    r = chat(sp, stream=True, stream_options={"include_usage": True}, return_spec_tokens_details=True)
    chunks = sse_chunks(r)
    assert any(c.get("usage") for c in chunks)
    m = httpx.get(sp.base_url + "/metrics", timeout=30).text
    assert "sglang:spec_accept_length" in m and "sglang:spec_accept_rate" in m


def test_speculation_keeps_the_greedy_output(plain, nextn):
    """Greedy output is the target's whatever the draft proposes: the stand-in attention and tree
    ops (NEXTN) give the same tokens as SGLang's own torch-native attention."""
    for prompt in ("The quick brown fox", "def add(a, b):"):
        assert generate(plain[0], prompt, 16)["output_ids"] == generate(nextn[0], prompt, 16)["output_ids"]


def test_a_forked_server_answers_as_an_execd_one(ckpt, plain, tmp_path):
    """The study's launches are forked by the fork server (``serving/forkserver.py``); the same
    server started by exec gives the same greedy tokens and logprobs, and each carries its own
    launch marker where the leftover checks read it (``/proc/<pid>/environ``)."""
    import psutil

    forked = plain[0]
    assert forked.started.startswith("forked by the fork server"), forked.started
    execd, _ = launch(ckpt, tmp_path, None, exec_=True)
    try:
        assert execd.started == "exec"
        for sp in (forked, execd):
            assert psutil.Process(sp.proc.pid).environ()["NVFP4STUDY_SERVER"] == sp.marker
            assert os.getpgid(sp.proc.pid) == sp.proc.pid and psutil.Process(sp.proc.pid).ppid() == os.getpid()
        for prompt in ("The quick brown fox", "def add(a, b):"):
            a, b = (httpx.post(sp.base_url + "/generate", timeout=120, json={
                "text": prompt, "return_logprob": True,
                "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}}).json()
                for sp in (forked, execd))
            assert a["output_ids"] == b["output_ids"]
            assert a["meta_info"]["output_token_logprobs"] == b["meta_info"]["output_token_logprobs"]
    finally:
        stop_and_check(execd)


def test_the_engine_called_the_stand_in_ops(plain, nextn):
    """Without speculation no stand-in op runs (SGLang's torch-native attention); NEXTN with
    top-k 1 calls nine of the ten. ``fill_accept_out_cache_loc_cpu`` serves only tree drafts
    (top-k > 1: ``srt/speculative/eagle_worker_common.py`` 503-509 ->
    ``srt/speculative/spec_utils.py`` 902)."""
    generate(nextn[0], "called ops", 4)
    called_plain = set(plain[1].read_text().split()) if plain[1].exists() else set()
    called_nextn = set(nextn[1].read_text().split())
    assert called_plain == set()
    assert called_nextn == set(cpu_engine.replaced_ops()) - {"fill_accept_out_cache_loc_cpu"}
