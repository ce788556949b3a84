"""Preflight: each check on a machine made bad on purpose (fake interpreters printing chosen
versions, a port bound here, a small disk, a Hopper or busy GPU), expected values computed here."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nvfp4study.checkpoint import layout
from nvfp4study.core.params import REPO_ROOT, LingShape, load_params
from nvfp4study.workstation import preflight as pf
from nvfp4study.workstation import probes
from nvfp4study.workstation import run as ws_run

LING = REPO_ROOT / "params" / "ling3-flash.yaml"
CLI = [sys.executable, "-m", "nvfp4study.cli"]


def fake_python(folder: Path, name: str, answer: dict | None = None, *, sleep: float = 0, rc: int = 0) -> Path:
    """An executable that ignores its arguments and prints ``answer`` as the probe's JSON."""
    exe = folder / name
    exe.write_text(f"#!{sys.executable}\nimport json, sys, time\ntime.sleep({sleep})\n"
                   f"print({json.dumps(json.dumps(answer or {}))})\nsys.exit({rc})\n")
    exe.chmod(0o755)
    return exe


def answer(**packages) -> dict:
    return {"python": "3.12.0", "executable": "/fake/python", "packages": packages, "sglang_origin": None,
            "requires": {"llmcompressor": ["torch<=2.13.0,>=2.10.0", "compressed-tensors==0.18.0"]},
            "torch_cuda": "12.9", "cuda_available": False, "gpus": []}


def by_name(rows):
    return {r.name: r for r in rows}


def test_cli_ling3_lists_every_blocker_fast_and_default_passes():
    t0 = time.monotonic()
    r = subprocess.run([*CLI, "preflight", "--params", str(LING), "--json"], capture_output=True, text=True)
    elapsed = time.monotonic() - t0
    assert r.returncode == 1, r.stderr
    data = json.loads(r.stdout)
    names = {x["name"] for x in data["rows"] if x["verdict"] == "blocker"}
    # no GPU, no /opt/envs interpreter, no Hub here: the card's checkpoint cannot be had
    assert {"GPU present", "SGLang interpreter", "card checkpoint"} <= names
    assert not {"quantizer interpreter", "BF16 source"} & names  # serve: card quantizes nothing
    assert data["blockers"] == sum(1 for x in data["rows"] if x["verdict"] == "blocker")
    assert all(x["fix"] for x in data["rows"] if x["verdict"] == "blocker")
    assert elapsed < 10
    r = subprocess.run([*CLI, "preflight"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 blocker(s)" in r.stdout


def test_missing_and_hanging_interpreters(tmp_path):
    assert "does not exist" in probes.probe_interpreter(str(tmp_path / "nope"), [])["error"]
    slow = fake_python(tmp_path, "slow", answer(), sleep=5)
    assert "within 0.5 s" in probes.probe_interpreter(str(slow), [], timeout_s=0.5)["error"]
    bad = fake_python(tmp_path, "bad", answer(), rc=3)
    assert "exited 3" in probes.probe_interpreter(str(bad), [])["error"]


def test_real_probe_of_this_interpreter():
    import importlib.metadata as md

    a = probes.probe_interpreter(sys.executable, ["llmcompressor", "no-such-package-xyz"])
    assert a["packages"] == {"llmcompressor": md.version("llmcompressor"), "no-such-package-xyz": None}


def test_quantizer_wrong_versions_named(tmp_path):
    p = load_params(None, ["quantize.python=" + str(tmp_path / "q")])
    fake_python(tmp_path, "q", answer(**{"llmcompressor": "0.13.0", "compressed-tensors": "0.17.1", "torch": "2.13.0"}))
    rows = by_name(pf.preflight(p))
    row = rows["quantizer packages"]
    assert row.verdict == pf.BLOCKER and "compressed-tensors 0.17.1" in row.detail and "llmcompressor==0.13.0" in row.fix
    # torch outside llmcompressor's own Requires-Dist range (<=2.13.0)
    fake_python(tmp_path, "q", answer(**{"llmcompressor": "0.13.0", "compressed-tensors": "0.18.0", "torch": "2.14.1"}))
    row = by_name(pf.preflight(p))["quantizer packages"]
    assert row.verdict == pf.BLOCKER and "torch<=2.13.0" in row.detail
    fake_python(tmp_path, "q", answer(**{"llmcompressor": "0.12.0.1", "compressed-tensors": "0.17.1", "torch": "2.12.0+cu128"}))
    row = by_name(pf.quantizer_checks(p, probes.probe_interpreter(str(tmp_path / "q"), [])))["quantizer packages"]
    # the fake's requires say torch<=2.13.0, so 2.12.0+cu128 passes; the card's pair is named
    assert row.verdict == pf.OK and "the card's pair" in row.detail


def test_sglang_pins_and_mismatch(tmp_path):
    pins, _ = probes.sglang_pins("0.5.23")
    assert pins == probes.RECORDED_SGLANG_PINS["0.5.23"]  # cached METADATA (if any) agrees with the record
    exe = fake_python(tmp_path, "s", answer(**{"sglang": "0.5.23", "flashinfer-python": "0.7.2",
                                               "sglang-kernel": "0.4.9", "torch": "2.14.1+cu130"}))
    p = load_params(LING, [f"server.python={exe}"])
    row = by_name(pf.sglang_checks(p, probes.probe_interpreter(str(exe), [])))["SGLang packages"]
    assert row.verdict == pf.BLOCKER and "sglang-kernel 0.4.9 (wants ==0.4.10)" in row.detail
    assert "torch" not in row.detail.split("(pins")[0]  # +cu130 local label is fine for ==2.14.1
    exe2 = fake_python(tmp_path, "s2", answer(**{"sglang": "0.5.22", "flashinfer-python": "0.7.2",
                                                 "sglang-kernel": "0.4.10", "torch": "2.14.1"}))
    row = by_name(pf.sglang_checks(p, probes.probe_interpreter(str(exe2), [])))["SGLang packages"]
    assert "sglang 0.5.22 (wants ==0.5.23)" in row.detail


def test_port_in_use_is_a_blocker():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = load_params(LING, [f"server.port={port}"])
        row = pf.port_check(p)
        assert row.verdict == pf.BLOCKER and str(port) in row.detail and "server.port" in row.fix
    assert pf.port_check(p).verdict == pf.OK


def test_small_disk(tmp_path):
    p = load_params(LING, ["checkpoint.source=path", f"checkpoint.source_path={tmp_path}"])  # only the output
    specs = layout.tensor_specs(LingShape())
    from nvfp4study.checkpoint import recipe

    nvfp4 = sum(layout.spec_nbytes(s) for s in recipe.nvfp4_specs(LingShape(), specs))
    assert probes.checkpoint_bytes(LingShape())["nvfp4"] == nvfp4
    assert 60e9 < nvfp4 < 100e9  # ~4.5 bits per routed-expert weight of a 255 GB BF16 model

    def small(path):
        return nvfp4 - 1, tmp_path

    rows = pf.disk_checks(p, tmp_path, free=small)
    assert [r.verdict for r in rows] == [pf.BLOCKER] and "free 0.0 GB" in rows[0].fix

    def big(path):
        return 2 * nvfp4, tmp_path

    assert [r.verdict for r in pf.disk_checks(p, tmp_path, free=big)] == [pf.OK]


def _smi(cap, free_mib, procs=()):
    return {"driver": "580.1", "cuda": "13.0", "processes": list(procs),
            "gpus": [{"index": 0, "name": "NVIDIA H200", "capability": cap, "total_mib": 143771.0,
                      "used_mib": 143771.0 - free_mib, "free_mib": free_mib}]}


def test_hopper_refused_by_name_and_busy_gpu():
    p = load_params(LING)
    rows = by_name(pf.gpu_checks(p, _smi((9, 0), 140000.0), {"torch_cuda": "12.9"}, 80 * 10**9))
    assert rows["GPU compute capability"].verdict == pf.BLOCKER
    assert "Hopper (9.0)" in rows["GPU compute capability"].detail
    # 0.75 x 143771 MiB pool = 113 GB: weights fit, but another process holds most of the memory
    rows = by_name(pf.gpu_checks(p, _smi((10, 0), 20000.0, [{"pid": 4242, "name": "python", "used_mib": 123771.0}]),
                                 {"torch_cuda": "12.9"}, 80 * 10**9))
    assert rows["GPU compute capability"].verdict == pf.OK
    assert rows["GPU free memory"].verdict == pf.BLOCKER and "pid 4242" in rows["GPU free memory"].detail
    rows = by_name(pf.gpu_checks(p, _smi((10, 0), 140000.0), {"torch_cuda": "12.9"}, 80 * 10**9))
    assert rows["GPU free memory"].verdict == pf.OK and rows["driver / CUDA"].verdict == pf.OK
    # weights above the pool: 0.75 x 143771 x 2**20 bytes
    pool = 0.75 * 143771.0 * 2**20
    rows = by_name(pf.gpu_checks(p, _smi((10, 0), 140000.0), {"torch_cuda": "12.9"}, int(pool) + 1))
    assert rows["GPU free memory"].verdict == pf.BLOCKER
    rows = by_name(pf.gpu_checks(p, _smi((10, 0), 140000.0), {"torch_cuda": "12.6"}, 10))
    assert rows["driver / CUDA"].verdict == pf.BLOCKER and "12.8" in rows["driver / CUDA"].detail
    rows = by_name(pf.gpu_checks(p, _smi((10, 0), 140000.0), {"torch_cuda": None}, 10))
    assert rows["driver / CUDA"].verdict == pf.BLOCKER


def test_missing_model_paths_and_hub(tmp_path):
    p = load_params(LING, ["checkpoint.serve=ours", "checkpoint.source=path", f"checkpoint.source_path={tmp_path / 'absent'}",
                           f"server.model_path={tmp_path / 'm'}"])
    rows = by_name(pf.checkpoint_checks(p, hub=lambda: (True, "reachable")))
    assert rows["BF16 source"].verdict == pf.BLOCKER and "hf download" in rows["BF16 source"].fix
    assert rows["server.model_path"].verdict == pf.BLOCKER


def test_run_stops_before_any_stage(tmp_path, capsys):
    rc = ws_run.main(["--params", str(LING), "--run-dir", str(tmp_path / "run")])
    assert rc == 1 and not (tmp_path / "run").exists()
    assert "stopped before any stage" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["stock", "exact"])
def test_patchable_install(tmp_path, mode):
    from nvfp4study.sglang import patch, source
    from sglang_fixtures import released

    tree = source.copy_tree(released("0.5.23"), tmp_path / "sg")
    if mode != "stock":
        patch.apply(tree, mode)
    p = load_params(LING, ["sglang.source=path", f"sglang.path={tree.root}"])
    row = pf.patch_check(p, None)
    assert row.verdict == (pf.OK if mode == "stock" else pf.WARNING)
    for f in patch.status(tree)["files"]:
        tree.file(f).chmod(0o444)
    assert pf.patch_check(p, None).verdict == pf.BLOCKER


def test_hub_source_rows(tmp_path, monkeypatch):
    """ling3-flash's own source (the Hub): reachable -> ok; unreachable -> blocker; a cached
    snapshot -> ok without the network; HF_HUB_OFFLINE without it -> blocker."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    p = load_params(LING, ["checkpoint.serve=ours"])  # re-quantizing, the opt-in
    assert p.checkpoint.source == "hub" and p.checkpoint.source_hub.repo_id == "inclusionAI/Ling-3.0-flash"
    row = by_name(pf.checkpoint_checks(p, hub=lambda: (True, "reachable")))["BF16 source"]
    assert row.verdict == pf.OK and "01 downloads it" in row.detail
    row = by_name(pf.checkpoint_checks(p, hub=lambda: (False, "no route")))["BF16 source"]
    assert row.verdict == pf.BLOCKER and "source: path" in row.fix
    assert any(w.startswith("BF16 source download") for w, _, _ in pf.disk_needs(p, tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert by_name(pf.checkpoint_checks(p, hub=lambda: (True, "")))["BF16 source"].verdict == pf.BLOCKER
    repo = tmp_path / "hub" / "models--inclusionAI--Ling-3.0-flash"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("a" * 40)
    (repo / "snapshots" / ("a" * 40)).mkdir(parents=True)
    (repo / "snapshots" / ("a" * 40) / "model-00001.safetensors").write_bytes(b"x")
    row = by_name(pf.checkpoint_checks(p, hub=lambda: (False, "offline")))["BF16 source"]
    assert row.verdict == pf.OK and "in the Hub cache" in row.detail
    assert not any(w.startswith("BF16 source download") for w, _, _ in pf.disk_needs(p, tmp_path))


def _toolkit(folder: Path, release: str) -> Path:
    """A CUDA toolkit folder whose bin/nvcc prints ``release`` as nvcc --version does."""
    (folder / "bin").mkdir(parents=True)
    nvcc = folder / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                    f"echo 'Cuda compilation tools, release {release}, V{release}.88'\n")
    nvcc.chmod(0o755)
    return folder


def test_flashinfer_finds_nvcc_as_flashinfer_does(tmp_path):
    """FlashInfer 0.7.2's order: CUDA_HOME, CUDA_PATH, the folder above `which nvcc`'s bin,
    /usr/local/cuda; FLASHINFER_NVCC names the compiler itself."""
    a, b, c = (_toolkit(tmp_path / n, r) for n, r in (("a", "13.0"), ("b", "12.4"), ("c", "12.9")))
    absent = str(tmp_path / "none")
    f = probes.flashinfer_nvcc({"CUDA_HOME": str(a), "CUDA_PATH": str(b), "PATH": str(c / "bin")}, default_home=absent)
    assert (f["cuda_home"], f["how"], f["release"]) == (str(a), "CUDA_HOME", "13.0")
    f = probes.flashinfer_nvcc({"CUDA_PATH": str(b), "PATH": str(c / "bin")}, default_home=absent)
    assert (f["how"], f["release"]) == ("CUDA_PATH", "12.4")
    f = probes.flashinfer_nvcc({"PATH": str(c / "bin")}, default_home=absent)
    assert f["cuda_home"] == str(c) and f["release"] == "12.9" and f["how"].startswith("which nvcc")
    f = probes.flashinfer_nvcc({"PATH": ""}, default_home=absent)
    assert f["release"] is None and f["nvcc"] == str(Path(absent) / "bin" / "nvcc") and "does not exist" in f["error"]
    f = probes.flashinfer_nvcc({"PATH": "", "FLASHINFER_NVCC": str(b / "bin" / "nvcc")}, default_home=absent)
    assert f["release"] == "12.4"


def test_flashinfer_jit_row(tmp_path):
    p = load_params(LING, overlay=False)
    torch13 = {"torch_cuda": "13.0"}
    ok = probes.flashinfer_nvcc({"CUDA_HOME": str(_toolkit(tmp_path / "t13", "13.0"))})
    row = pf.flashinfer_jit_check(p, torch13, ok)
    assert row.verdict == pf.OK and "release 13.0" in row.detail
    old = probes.flashinfer_nvcc({"CUDA_HOME": str(_toolkit(tmp_path / "t12", "12.9"))})
    row = pf.flashinfer_jit_check(p, torch13, old)
    assert row.verdict == pf.BLOCKER and "CUDA 13.x like torch" in row.detail and "CUDA_HOME" in row.fix
    missing = probes.flashinfer_nvcc({"PATH": ""}, default_home=str(tmp_path / "none"))
    row = pf.flashinfer_jit_check(p, torch13, missing)
    assert row.verdict == pf.BLOCKER and "does not exist" in row.detail
    # server.env reaches the lookup: CUDA_HOME given there is the toolkit used
    p2 = load_params(LING, [f"server.env={{CUDA_HOME: {tmp_path / 't13'}}}"], overlay=False)
    assert pf.flashinfer_jit_check(p2, torch13).verdict == pf.OK
    docker = load_params(LING, ["server.launcher=docker", "server.docker.image=x"], overlay=False)
    assert pf.flashinfer_jit_check(docker, None, missing).verdict == pf.NA
    assert pf.flashinfer_jit_check(load_params(None), None, missing).verdict == pf.NA  # the CPU engine


def test_card_checkpoint_first_rows_and_exact_disk(tmp_path, monkeypatch):
    """ling3-flash serves the card's checkpoint: one download, sized from the Hub's own file list
    (the files 01 fetches: weights, config, tokenizer, code; not README or patches); no BF16
    source, no quantizer; a cached snapshot needs no disk; re-quantizing is the opt-in."""
    from hub_server import HubServer, Repo

    card = tmp_path / "card"
    card.mkdir()
    sizes = {"model-00001-of-00002.safetensors": 3000, "model-00002-of-00002.safetensors": 2000,
             "config.json": 70, "tokenizer.json": 50, "modeling_bailing.py": 40, "README.md": 900,
             "sglang_patch/01-flashinfer_cutlass.patch": 600}
    for name, n in sizes.items():
        (card / name).parent.mkdir(parents=True, exist_ok=True)
        (card / name).write_bytes(b"x" * n)
    fetched = 3000 + 2000 + 70 + 50 + 40
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    p = load_params(LING, overlay=False)
    assert p.checkpoint.serve == "card" and not pf._quantizing(p)
    with HubServer([Repo("kingjones777/Ling-3.0-flash-NVFP4-SGLang-MTP", card, "c" * 40)]) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        needs = pf.disk_needs(p, tmp_path)
        assert [(w.split(" (")[0], n) for w, _, n in needs] == [("card's checkpoint download", fetched)]
        assert "the Hub's file sizes at main" in needs[0][0]
        rows = by_name(pf.checkpoint_checks(p))
        assert rows["card checkpoint"].verdict == pf.OK and "04-07 serve it" in rows["card checkpoint"].detail
    # no Hub: the layout's prediction, said so
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    (w, _, n), = pf.disk_needs(p, tmp_path)
    assert n == probes.checkpoint_bytes(p.checkpoint.shape)["nvfp4"] and "predicted" in w
    assert pf.quantizer_checks(p, None)[0].verdict == pf.NA
    # a cached snapshot: nothing to download, the row says where it is
    repo = tmp_path / "hub" / "models--kingjones777--Ling-3.0-flash-NVFP4-SGLang-MTP"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("c" * 40)
    (repo / "snapshots" / ("c" * 40)).mkdir(parents=True)
    (repo / "snapshots" / ("c" * 40) / "model-00001-of-00002.safetensors").write_bytes(b"x")
    assert pf.disk_needs(p, tmp_path) == []
    assert by_name(pf.checkpoint_checks(p, hub=lambda: (False, "")))["card checkpoint"].verdict == pf.OK
    ours = load_params(LING, ["checkpoint.serve=ours"], overlay=False)
    assert [w for w, _, _ in pf.disk_needs(ours, tmp_path)][-1].startswith("NVFP4 output")
