"""server.launcher: docker: the real argv, the lifecycle against a fake ``docker`` CLI (put first
on PATH) that runs the fake SGLang detached like a container, and the preflight rows."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

import fake_docker
import fake_sglang
from nvfp4study.core.errors import DockerUnavailable
from nvfp4study.core.params import load_params
from nvfp4study.serving import docker as dk
from nvfp4study.serving import process, server
from nvfp4study.serving.server import build_command, card_config
from nvfp4study.sglang import patch as sglang_patch
from nvfp4study.sglang import source as sglang_source
from nvfp4study.workstation import preflight
from serving_fixtures import GPU_ENGINE, fake_params, no_leftover, stage_for  # noqa: F401
from sglang_fixtures import released

pytestmark = pytest.mark.usefixtures("no_leftover")
IMAGE = "lmsysorg/sglang:v0.5.23"


def test_real_docker_argv(monkeypatch, tmp_path):
    monkeypatch.setenv("TZ", "Europe/Berlin")  # the host's zone goes into the container (log times)
    monkeypatch.setenv("NVFP4STUDY_CACHE", str(tmp_path / "cache"))  # FlashInfer's JIT builds persist there
    p = load_params(None, [*GPU_ENGINE, "server.port=30013",  # the GPU engine, as a docker launch serves
                           "server.launcher=docker", f"server.docker.image={IMAGE}", "server.model_path=/models/q",
                           "server.docker.extra_args=[--shm-size, 32g]", "server.env={HF_HUB_OFFLINE: '1'}"])
    p2 = p.model_copy(update={"server": p.server.model_copy(update={"python": "python3"})})
    serve = build_command(p2, card_config(p), model_path="/models/q")
    cmd = dk.docker_command(p, serve, "nvfp4study-sglang-1-abcd", "/models/q",
                            [("/run/work/x/sglang/srt/a.py", "/sgl-workspace/sglang/python/sglang/srt/a.py")])
    assert cmd == [
        "docker", "run", "--rm", "--name", "nvfp4study-sglang-1-abcd", "--gpus", "all", "--ipc=host",
        "--network", "host", "-v", "/models/q:/models/q:ro",
        "-v", "/run/work/x/sglang/srt/a.py:/sgl-workspace/sglang/python/sglang/srt/a.py:ro",
        "-v", f"{tmp_path / 'cache' / 'docker-flashinfer'}:/nvfp4study-flashinfer",
        "-e", "HF_HUB_OFFLINE=1", "-e", "TZ=Europe/Berlin", "-e", "FLASHINFER_WORKSPACE_BASE=/nvfp4study-flashinfer",
        "--shm-size", "32g", IMAGE,
        "python3", "-m", "sglang.launch_server", "--model-path", "/models/q", "--trust-remote-code",
        "--host", "127.0.0.1", "--port", "30013", "--tp-size", "1", "--ep-size", "1",
        "--mem-fraction-static", "0.75", "--context-length", "32768", "--max-running-requests", "1",
        "--chunked-prefill-size", "2048", "--disable-shared-experts-fusion", "--tool-call-parser", "glm45",
        "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "3", "--enable-metrics"]
    assert dk.container_name("pre") != dk.container_name("pre")


def test_docker_params_strict():
    with pytest.raises(Exception, match="launcher"):
        load_params(None, ["server.launcher=podman"])
    with pytest.raises(Exception, match="container_name_prefix"):
        load_params(None, ["server.docker.container_name_prefix=bad name"])


@pytest.fixture
def docker_env(tmp_path, monkeypatch):
    """Params whose server runs through the fake docker; returns (params, run, state folder)."""
    p, _, run = fake_params(tmp_path, "server.launcher=docker", f"server.docker.image={IMAGE}",
                            "sglang.apply_to_install=true")
    exe = fake_sglang.make_interpreter(tmp_path / "image-env")
    bin_dir = tmp_path / "bin"
    fake_docker.make_docker(bin_dir, exe)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    p = p.model_copy(update={"server": p.server.model_copy(update={"python": None})})
    (tmp_path / "jit").mkdir()
    monkeypatch.setattr(dk, "flashinfer_jit_cache", lambda: tmp_path / "jit")  # not the shared study cache
    return p, run, bin_dir / "state"


def _calls(state: Path) -> list[list[str]]:
    return [json.loads(ln) for ln in (state / "calls.jsonl").read_text().splitlines()]


def test_serving_through_docker(docker_env):
    p, run, state = docker_env
    released("0.5.23")  # the released tree the launcher copies (downloaded once into the cache)
    rec: dict = {}
    with server.serving(stage_for(p, run), card_config(p), launch_record=rec) as url:
        assert httpx.get(url + "/health_generate").status_code == 200
        name = rec["container"]
        pid = int((state / f"{name}.pid").read_text())
        assert os.path.exists(f"/proc/{pid}")
    run_call = next(c for c in _calls(state) if c[:1] == ["run"] and "--name" in c)
    assert run_call == rec["command"][1:] and rec["command"][0] == "docker"
    assert _calls(state)[-2:] == [["stop", "-t", "3", name], ["rm", "-f", name]]
    assert not (state / f"{name}.pid").exists() and not fake_docker._alive(pid)  # a zombie is not running
    # every clamp file mounted read-only, from a copy in the run's work folder in the card's mode
    mounts = [run_call[i + 1] for i, a in enumerate(run_call) if a == "-v"][1:]
    assert f"{run.parent / 'jit'}:{dk.JIT_IN_CONTAINER}" in mounts  # FlashInfer's JIT builds outlive the container
    mounts = [m for m in mounts if m.endswith(":ro")]
    files = {e["path"] for m in ("none", "exact", "det") for e in sglang_patch._files("0.5.23", m)}
    assert {m.split(":")[1] for m in mounts} == {f"/sgl-workspace/sglang/python/{f}" for f in files}
    copy = Path(mounts[0].split(":")[0]).parents[len(Path(sorted(files)[0]).parts) - 1]
    assert copy.is_relative_to(run / "work")
    assert sglang_patch.status(sglang_source.SGLangTree(copy, "0.5.23"))["clamp_mode"] == "exact"
    log = (run / rec["log"]).read_text()
    assert '"docker", "run"' in log and "Uvicorn running" in log and rec["returncode"] == 0


def test_interrupt_and_atexit_stop_the_container(docker_env):
    p, run, state = docker_env
    p = p.model_copy(update={"sglang": p.sglang.model_copy(update={"apply_to_install": False})})
    with pytest.raises(KeyboardInterrupt):
        with server.serving(stage_for(p, run), replace(card_config(p), spec_depth=None)) as url:
            raise KeyboardInterrupt
    assert [c[0] for c in _calls(state)][-2:] == ["stop", "rm"]
    assert not list(state.glob("*.pid"))
    # the atexit hook: a live launch nobody stopped
    name = dk.container_name("t")
    serve = build_command(p.model_copy(update={"server": p.server.model_copy(update={"python": "python3"})}),
                          card_config(p), model_path=p.server.model_path)
    sp = dk.DockerServerProcess(dk.docker_command(p, serve, name, p.server.model_path, []), run / "logs" / "x.log",
                                p.server.host, p.server.port, grace_s=2, container=name)
    sp.start()
    sp.wait_healthy(20, 0.05)
    url = sp.base_url
    assert httpx.get(url + "/health_generate").status_code == 200
    process._stop_all()
    assert not (state / f"{name}.pid").exists() and process.process_for(url) is None


def test_image_problems_are_named(docker_env):
    p, run, state = docker_env
    bad = p.model_copy(update={"server": p.server.model_copy(update={
        "docker": p.server.docker.model_copy(update={"image": "lmsysorg/sglang:nope"})})})
    with pytest.raises(DockerUnavailable, match="reports no sglang"):
        dk.image_sglang(bad)
    old = p.model_copy(update={"sglang": p.sglang.model_copy(update={"version": "0.5.22"})})
    with pytest.raises(DockerUnavailable, match="has sglang 0.5.23, the params want 0.5.22"):
        with server.serving(stage_for(old, run), card_config(old)):
            pass


def test_image_files_are_hash_checked_before_mounting(docker_env, tmp_path):
    """Before patched copies are mounted, each image file they replace is hashed in the image
    and compared with the released wheel's: equal files launch; one edited byte or a missing file
    is refused by name (both digests given) before any server starts."""
    import hashlib
    import zipfile

    from nvfp4study.core.errors import ImageFilesDiffer

    p, run, state = docker_env
    files = dk.mounted_files("0.5.23")
    assert files and {e["path"] for e in sglang_patch._files("0.5.23", "exact")} <= set(files)
    image = tmp_path / "image-root"
    with zipfile.ZipFile(sglang_source.wheel_path("0.5.23")) as z:
        z.extractall(image, files)
    wheel = {f: hashlib.sha256((image / f).read_bytes()).hexdigest() for f in files}
    exe = fake_sglang.make_interpreter(tmp_path / "image-env")
    fake_docker.make_docker(state.parent, exe, image_tree=image)
    assert dk.check_image_files(p, "0.5.23", "/sgl-workspace/sglang/python") == wheel
    edited = image / files[0]
    edited.write_bytes(edited.read_bytes() + b"# local edit\n")
    digest = hashlib.sha256(edited.read_bytes()).hexdigest()
    with pytest.raises(ImageFilesDiffer, match=f"{files[0]}: image {digest}, wheel {wheel[files[0]]}"):
        dk.check_image_files(p, "0.5.23", "/sgl-workspace/sglang/python")
    before = len(_calls(state))
    with pytest.raises(ImageFilesDiffer, match="1 of"):
        with server.serving(stage_for(p, run), card_config(p)):
            pass
    assert not any("--name" in c for c in _calls(state)[before:])  # refused before any container served
    edited.unlink()
    with pytest.raises(ImageFilesDiffer, match=f"{files[0]}: image absent"):
        dk.check_image_files(p, "0.5.23", "/sgl-workspace/sglang/python")


def _rows(p):
    return {r.name: r for r in preflight.docker_checks(p)}


def test_preflight_docker_rows(docker_env, tmp_path, monkeypatch):
    p, run, state = docker_env
    rows = _rows(p)
    assert [r.verdict for r in rows.values()] == ["ok"] * 4, rows
    cfg = json.loads((state / "config.json").read_text())
    (state / "config.json").write_text(json.dumps({**cfg, "images": [], "runtimes": ["runc"]}))
    rows = _rows(p)
    assert rows["docker image"].verdict == "blocker" and "docker pull" in rows["docker image"].fix
    assert rows["NVIDIA container runtime"].verdict == "blocker"
    (state / "config.json").write_text(json.dumps({**cfg, "daemon": False}))
    rows = _rows(p)
    assert rows["docker daemon"].verdict == "blocker" and rows["docker image"].verdict == "blocker"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    rows = _rows(p)
    assert all(r.verdict == "blocker" for r in rows.values()) and "install Docker" in rows["docker CLI"].fix
    local = {r.name: r.verdict for r in preflight.docker_checks(load_params(None, ["server.enabled=true"]))}
    assert set(local.values()) == {"not applicable"} and len(local) == 4


def test_serve_dry_run_prints_the_docker_command(capsys, monkeypatch, tmp_path):
    from nvfp4study.serving import serve_cli

    monkeypatch.setenv("NVFP4STUDY_CACHE", str(tmp_path / "cache"))  # the JIT cache folder is made there
    # the default profile serves on the CPU engine, which runs only locally (a ParamsError)
    assert serve_cli.main(["--dry-run", "-p", "server.engine=gpu", "-p", "server.launcher=docker",
                           "-p", f"server.docker.image={IMAGE}",
                           "-p", "server.model_path=/m"]) == 0
    out = capsys.readouterr().out.split()
    assert out[:4] == ["docker", "run", "--rm", "--name"] and out[out.index(IMAGE) + 1:][:3] == [
        "python3", "-m", "sglang.launch_server"] and "/m:/m:ro" in out


def test_readme_docker_route_needs_no_local_sglang(docker_env, tmp_path, monkeypatch):
    """The README's command (ling3-flash.yaml with ``-p server.launcher=docker -p
    server.docker.image=...``; ``sglang.source: installed`` and a ``server.python`` that does not
    exist here): preflight's SGLang rows do not look for a local SGLang, the docker rows and the
    patch row pass, and stage 03 audits the released wheel instead of a local install."""
    from nvfp4study.core.params import REPO_ROOT
    from nvfp4study.stages import s03_sglang

    p = load_params(REPO_ROOT / "params" / "ling3-flash.yaml",
                    ["server.launcher=docker", f"server.docker.image={IMAGE}",
                     f"server.python={tmp_path / 'no-such-env' / 'python'}"], overlay=False)
    assert p.sglang.source == "installed"
    rows = {r.name: r for r in preflight.preflight(p, outputs=tmp_path)}
    for name in ("SGLang interpreter", "SGLang packages"):
        assert rows[name].verdict == "not applicable" and "no local SGLang is needed" in rows[name].detail
    assert rows["SGLang install patchable"].verdict == "ok"
    assert [rows[n].verdict for n in ("docker CLI", "docker daemon", "docker image", "NVIDIA container runtime")] == ["ok"] * 4
    stage = type("S", (), {"params": p})()
    tree = s03_sglang.stage_tree(stage)
    assert tree.origin == "wheel" and tree.version == "0.5.23"
    assert tree.root == released("0.5.23").root
    from nvfp4study.core.paths import RunPaths
    from nvfp4study.core.stage import Stage

    before = sorted(str(f) for f in tree.root.rglob("*") if ".nvfp4study-patch" in str(f))
    st = Stage(name="03_patch_sglang", params=p, paths=RunPaths(tmp_path / "run"))
    text = s03_sglang.prepare_install(st, tree)
    assert "nothing installed is changed" in text
    state = json.loads(st.paths.data("sglang_patch_state").read_text())
    assert state["install"] is None and state["needed_modes"] == ["none", "exact"]
    assert sorted(str(f) for f in tree.root.rglob("*") if ".nvfp4study-patch" in str(f)) == before  # cache untouched


def test_docker_driver_row_without_a_local_torch():
    from nvfp4study.workstation import preflight_gpu

    smi = {"driver": "580.126.09", "cuda": "13.0", "gpus": [], "processes": []}
    row = preflight_gpu.driver_check(smi, None, True, docker=True)
    assert row.verdict == "ok" and "the image's" in row.detail
    row = preflight_gpu.driver_check({**smi, "cuda": "12.4"}, None, True, docker=True)
    assert row.verdict == "blocker" and "12.8" in row.detail
    assert preflight_gpu.driver_check(smi, None, True).verdict == "blocker"  # local: torch must be probed


def test_a_hub_snapshot_is_mounted_with_its_blobs(monkeypatch, tmp_path):
    """The card's checkpoint in the Hub cache is a snapshot of links into ../../blobs: the repo
    folder is mounted (at the same path), so the links resolve inside the container."""
    monkeypatch.setenv("NVFP4STUDY_CACHE", str(tmp_path / "cache"))
    repo = tmp_path / "hub" / "models--kingjones777--Ling-3.0-flash-NVFP4-SGLang-MTP"
    snap = repo / "snapshots" / ("c" * 40)
    assert dk.model_mount(str(snap)) == str(repo)
    assert dk.model_mount("/models/q") == "/models/q"
    p = load_params(None, [*GPU_ENGINE, "server.launcher=docker", f"server.docker.image={IMAGE}"])
    p2 = p.model_copy(update={"server": p.server.model_copy(update={"python": "python3"})})
    cmd = dk.docker_command(p, build_command(p2, card_config(p), model_path=str(snap)), "n", str(snap), [])
    assert f"{repo}:{repo}:ro" in cmd and cmd[cmd.index("--model-path") + 1] == str(snap)
    assert (tmp_path / "cache" / "docker-flashinfer").is_dir()
