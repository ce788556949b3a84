"""Helpers for the serving tests: a fake SGLang interpreter, params pointing at it, and a check
that no process outlives a test."""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path

import psutil
import pytest

import fake_sglang
from nvfp4study.core.params import dump_params, load_params
from nvfp4study.core.paths import RunPaths
from nvfp4study.core.stage import Stage

MARKERS = ("fake_sglang.py", "fake-sglang-scheduler", "fake-sglang-daemon", "serve_stub.py")
#: marks the fake processes of this test session (in their environment, inherited, or in a
#: cleared-environment daemon's command line): other sessions' fakes are not ours to judge or kill.
SESSION_ENV = "NVFP4STUDY_TEST_SESSION"
SESSION = os.environ.setdefault(SESSION_ENV, secrets.token_hex(8))


def free_port() -> int:
    """A free port below the kernel's ephemeral range (the study's own choice, so a port 0 bind
    elsewhere, such as a loading server's gloo sockets, cannot take it before the server binds it)."""
    from nvfp4study.serving.server import free_port as study_free_port

    return study_free_port("127.0.0.1")


def fake_processes() -> list[psutil.Process]:
    """Live (non-zombie) processes of this test session started from the fake server, its
    "scheduler" child or its daemon."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if not any(m in cmd for m in MARKERS) or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if SESSION in cmd or p.environ().get(SESSION_ENV) == SESSION:
                out.append(p)
        except psutil.Error:
            continue
    return out


@pytest.fixture
def no_leftover():
    """Fails the test if any fake-server process is still alive after it (polls up to 5 s)."""
    before = {p.pid for p in fake_processes()}
    yield
    deadline = time.monotonic() + 5
    left = [p for p in fake_processes() if p.pid not in before]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in fake_processes() if p.pid not in before]
    for p in left:  # clean up so one failure does not cascade, then fail
        p.kill()
    assert not left, f"processes outlived the test: {[(p.pid, p.info.get('cmdline')) for p in left]}"


def ling_model_dir(folder: Path, layers: int = 42) -> Path:
    """A folder with the real Ling-3.0-flash clamp config (no weights: the fake never reads them)."""
    folder.mkdir(parents=True, exist_ok=True)
    expert = [4 if 35 <= i <= 41 else 0 for i in range(layers)]
    shared = [5 if 34 <= i <= 39 else 7 if i in (40, 41) else 0 for i in range(layers)]
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["BailingMoeV3ForCausalLM"], "num_hidden_layers": layers,
        "first_k_dense_replace": 2, "num_nextn_predict_layers": 1,
        "expert_swiglu_limit_list": expert, "share_expert_swiglu_limit_list": shared}))
    return folder


#: the default profile serves on the CPU engine with small request sets; the fakes and the stub
#: stand for the GPU engine's server, so their runs take the GPU engine and the params' own
#: request sizes (what these tests were written against), the install served as found.
GPU_ENGINE = ("server.engine=gpu", "sglang.apply_to_install=false", "server.context_length=32768",
              "server.chunked_prefill_size=2048", "mtp.prompts=10", "mtp.max_tokens=512",
              "determinism.prompts=5", "determinism.max_tokens=512", "corruption.clamp_modes=[none, exact]",
              "corruption.sampling=[{name: t0-off-a, temperature: 0.0}, {name: t0-off-b, temperature: 0.0}, "
              "{name: t06-on, temperature: 0.6, top_p: 0.95, top_k: 20, thinking: true}, "
              "{name: t06-off, temperature: 0.6, top_p: 0.95, top_k: 20}]")


#: a live run's 05 sweep in mode none only: in mode exact it is the card's configuration, whose
#: launch would carry 05's 716 requests beside 04/06/07's (the one collector shares it); tests
#: of 05 set their modes in their overrides.
LIVE_05 = ("corruption.clamp_modes=[none]",)


def live_params(tmp_path: Path, exe: Path, timing: list[str], overrides: tuple[str, ...],
                port: int | None = None):
    """Params for a live run of interpreter ``exe`` (a fake or the real layer) on a free port, with
    the Ling clamp config as the model; returns ``(params, params_file, run_dir)``."""
    model = ling_model_dir(tmp_path / "model")
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    p = load_params(None, [f"server.python={exe}", "server.enabled=true", f"server.model_path={model}",
                           f"server.port={port or free_port()}", "server.require_gpu=false",
                           *GPU_ENGINE, *timing, *LIVE_05, *overrides])
    pf = run / "params.yaml"
    dump_params(p, pf)
    return p, pf, run


def fake_params(tmp_path: Path, *overrides: str, fake: dict | None = None, port: int | None = None):
    """Params for a live run against the fake server; returns ``(params, params_file, run_dir)``."""
    exe = fake_sglang.make_interpreter(tmp_path / "fake-env", **(fake or {}))
    return live_params(tmp_path, exe, ["server.health_poll_s=0.05", "server.shutdown_grace_s=3",
                                       "server.startup_timeout_s=20", "server.request_timeout_s=20"],
                       overrides, port)


def installed_sglang(folder: Path) -> tuple[Path, list[str]]:
    """A minimal "installed" SGLang 0.5.23 under ``folder``: the package markers and the files the
    study's patches touch, from the released wheel (downloaded once into the cache).
    Returns ``(site, files)``; the fake reads the clamp mode from it with ``clamp_form: install``
    and ``sglang_origin: site/sglang/__init__.py``."""
    import zipfile

    from nvfp4study.sglang import patch as sglang_patch
    from nvfp4study.sglang.source import wheel_path

    wheel = wheel_path("0.5.23")  # downloaded once into the cache (a fresh CI machine has none)
    files = ["sglang/__init__.py", "sglang/_version.py"] + sorted(
        {e["path"] for m in ("exact", "none", "det") for e in sglang_patch._files("0.5.23", m)})
    with zipfile.ZipFile(wheel) as z:
        for f in files:
            (folder / f).parent.mkdir(parents=True, exist_ok=True)
            (folder / f).write_bytes(z.read(f))
    (folder / "sglang/srt/layers/moe").mkdir(parents=True, exist_ok=True)
    return folder, files


def stage_for(params, run: Path, name: str = "test") -> Stage:
    return Stage(name=name, params=params, paths=RunPaths(run))
