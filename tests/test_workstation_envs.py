"""The params overlay (params/local.yaml) and the environments command in dry-run mode."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nvfp4study.core.errors import ParamsError
from nvfp4study.core.params import REPO_ROOT, load_params
from nvfp4study.workstation import envs

LING = REPO_ROOT / "params" / "ling3-flash.yaml"


def test_overlay_names_the_interpreters_without_editing_the_profile(tmp_path, monkeypatch):
    before = LING.read_bytes()
    ov = tmp_path / "local.yaml"
    ov.write_text("quantize: {python: /venvs/q/bin/python}\nserver: {python: /venvs/s/bin/python}\n")
    monkeypatch.setenv("NVFP4STUDY_OVERLAY", str(ov))
    p = load_params(LING)
    assert (p.quantize.python, p.server.python) == ("/venvs/q/bin/python", "/venvs/s/bin/python")
    assert p.quantize.device == "cuda" and p.server.port == load_params(LING, overlay=False).server.port
    assert load_params(LING, ["server.python=/x"]).server.python == "/x"  # -p still wins
    assert load_params(LING, overlay=False).server.python == "/opt/envs/sglang/bin/python"
    assert LING.read_bytes() == before
    ov.write_text("server: {pyhton: /typo}\n")
    with pytest.raises(ParamsError, match="overlay"):
        load_params(LING)
    monkeypatch.setenv("NVFP4STUDY_OVERLAY", str(tmp_path / "missing.yaml"))
    with pytest.raises(ParamsError, match="overlay not found"):
        load_params(LING)


def test_the_local_overlay_is_read_when_present(tmp_path, monkeypatch):
    from nvfp4study.core import params as P

    local = tmp_path / "local.yaml"
    monkeypatch.setattr(P, "LOCAL_OVERLAY", local)
    monkeypatch.delenv("NVFP4STUDY_OVERLAY")
    assert P.overlay_path() is None
    local.write_text("server: {python: /from/local}\n")
    assert P.overlay_path() == local and load_params(LING).server.python == "/from/local"


def test_dry_run_prints_commands_and_writes_nothing(tmp_path):
    ov = tmp_path / "local.yaml"
    r = subprocess.run([sys.executable, "-m", "nvfp4study.workstation.envs", "--dry-run", "--overlay", str(ov),
                        "--quantize-venv", str(tmp_path / "q"), "--sglang-venv", str(tmp_path / "s"),
                        "--card-quantizer"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"-m venv {tmp_path / 'q'}" in r.stdout and "quantize-card.txt" in r.stdout and "sglang.txt" in r.stdout
    assert f"python: {tmp_path / 's'}/bin/python" in r.stdout
    assert not ov.exists() and not (tmp_path / "q").exists()


def test_recipes_carry_the_metadata_pins():
    text = {f.name: f.read_text() for f in envs.ENVS.glob("*.txt")}
    assert "llmcompressor==0.13.0" in text["quantize.txt"] and "compressed-tensors==0.18.0" in text["quantize.txt"]
    assert "llmcompressor==0.12.0.1" in text["quantize-card.txt"] and "torch==2.12.0" in text["quantize-card.txt"]
    for pin in ("sglang==0.5.23", "torch==2.14.1", "sglang-kernel==0.4.10", "flashinfer-python[cu13]==0.7.2"):
        assert pin in text["sglang.txt"]


def test_make_target_runs_the_script_in_dry_run(tmp_path):
    r = subprocess.run(["make", "-n", "workstation-envs", f"QUANTIZE_VENV={tmp_path}/q", "ENVS_ARGS=--dry-run"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "nvfp4study.workstation.envs" in r.stdout and "--dry-run" in r.stdout
