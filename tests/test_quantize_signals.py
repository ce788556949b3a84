"""quantize under SIGTERM and with --json: the temporary folder goes as on SIGINT; stdout is JSON only;
the probe finds model_free_ptq's quantizing step in llmcompressor 0.13 and 0.14."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from ling_fixtures import TINY
from nvfp4study.checkpoint import generate as G
from nvfp4study.checkpoint import ptq as P
from nvfp4study.checkpoint import quantize as Q

LIB = str(Path(Q.__file__).resolve().parents[2])


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return G.write_checkpoint(TINY, tmp_path_factory.mktemp("sig") / "src", shards=2, seed=1)


def _cli(args: list[str], **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=LIB, LLM_COMPRESSOR_LOG_LEVEL="INFO")  # loguru's stdout sink on
    return subprocess.Popen([sys.executable, "-m", "nvfp4study.cli", "quantize", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


@pytest.mark.parametrize("point", ["temp folder created", "inside model_free_ptq"])
def test_sigterm_removes_the_temporary_folder(src, tmp_path, point):
    out = tmp_path / "out"
    proc = _cli([str(src), str(out)])
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            tmp = list(tmp_path.glob(".out.tmp-*"))
            if tmp and (point == "temp folder created" or (tmp[0] / "ckpt").exists()):
                break
            time.sleep(0.005)
        assert proc.poll() is None, f"quantize ended before {point}: {proc.communicate()}"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "a partial checkpoint was left beside the target"


def test_json_stdout_is_only_json(src, tmp_path):
    proc = _cli([str(src), str(tmp_path / "out"), "--json"])
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    rep = json.loads(out)  # nothing before or after the report
    assert rep["quantized"] == str(tmp_path / "out")


def test_probe_finds_the_quantizing_step_of_the_installed_release():
    import inspect

    import llmcompressor.entrypoints.model_free as mf

    assert P.quantizing_calls(inspect.getsource(mf.model_free_ptq)) == {"exec_jobs"}  # 0.13.0


def test_probe_stops_before_quantizing(src, tmp_path):
    res = P.ptq(str(src), str(tmp_path / "p"), ignore=Q.card_ignore(TINY.num_hidden_layers), probe=True)
    assert res["ok"] and not list((tmp_path / "p").glob("*.safetensors"))  # nothing quantized


@pytest.mark.network
def test_probe_follows_llmcompressor_0_14(tmp_path):
    """0.14.0 quantizes through ``exec_jobs_dynamic`` (``model_free/__init__.py`` 111-117); read its
    released source (downloaded with pip, no install) and check the probe would stop there."""
    r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "llmcompressor==0.14.0",
                        "-d", str(tmp_path)], capture_output=True, text=True, timeout=300)
    wheels = list(tmp_path.glob("llmcompressor-0.14.0-*.whl"))
    if r.returncode or not wheels:
        pytest.skip(f"not run: cannot download llmcompressor 0.14.0 ({r.stderr.strip()[-200:]})")
    with zipfile.ZipFile(wheels[0]) as z:
        source = z.read("llmcompressor/entrypoints/model_free/__init__.py").decode()
    assert P.quantizing_calls(source) == {"exec_jobs_dynamic"}
