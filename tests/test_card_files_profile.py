"""``params/card-files.yaml`` end to end for notebooks 02 and 03, against a fixture Hub.

The fixture server answers as the card's own repo id (HF_ENDPOINT points at it), serving a small
header-only NVFP4 checkpoint (one expert's up_proj global scale edited, the generator's marker
removed) and the card's two patch files in the card's layout (made from our reconstruction). Our
stand-in for 02 is a second copy of the generated layout, named by a ``data/quantize.json`` as 01
would write it. The profile file is used as it is.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from hub_server import HubServer, Repo
from nvfp4study.checkpoint.compare import CARD_REPO
from nvfp4study.core.params import REPO_ROOT, load_params
from test_card_patches import write_patches
from test_hub_audit import SHAPE, UP_SCALE, _poke

SHA = "f0" * 20


def test_card_files_profile_names_the_card_repo():
    p = load_params(REPO_ROOT / "params" / "card-files.yaml")
    assert p.checkpoint.card_checkpoint.repo_id == CARD_REPO == p.sglang.card_patches.repo_id
    assert not p.server.enabled


@pytest.fixture(scope="module")
def card_run(tmp_path_factory):
    from nvfp4study.checkpoint.generate import write_checkpoint

    base = tmp_path_factory.mktemp("cardfiles")
    ours = write_checkpoint(SHAPE, base / "ours", shards=2, header_only=True, layout="nvfp4")
    repo = shutil.copytree(ours, base / "card")
    _poke(repo, UP_SCALE, 12345.0)
    cfg = json.loads((repo / "config.json").read_text())
    cfg.pop("_nvfp4study", None)
    (repo / "config.json").write_text(json.dumps(cfg))
    write_patches(repo)
    run = base / "run"
    (run / "data").mkdir(parents=True)
    (run / "data" / "quantize.json").write_text(json.dumps({"quantized": str(ours), "random_weights": True}))
    with HubServer([Repo(CARD_REPO, repo, SHA)]) as srv:
        env = os.environ | {"HF_ENDPOINT": srv.url, "HF_HUB_CACHE": str(base / "hf"), "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
        env.pop("HF_HUB_OFFLINE", None)
        r = subprocess.run([sys.executable, "-m", "nvfp4study.cli", "run", "--params", "params/card-files.yaml",
                            "--only", "02,03", "--run-dir", str(run)],
                           capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=1500)
        log = list(srv.log)
    return run, r, log


def test_02_and_03_run_on_the_card_files(card_run):
    run, r, log = card_run
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = {x["id"]: x for x in json.loads((run / "ledger.json").read_text())["rows"]}
    on = f"hf:{CARD_REPO}@{SHA}"
    for cid in ("counts.quantized-experts", "mtp.ignore-first", "scales.input-global-scale", "config.clamp-lists"):
        assert rows[cid]["checked_on"].startswith(on), cid
    assert rows["audit.card-gate-up-scales"]["verdict"] == "reproduced"
    assert rows["audit.card-gate-up-scales"]["measured"]["mismatched"] == 1
    fix = rows["clamp.cutlass-fix"]
    assert fix["checked_on"] == f"{on} on sglang 0.5.20"
    assert fix["measured"]["applies_to"] == ["0.5.20"] and set(fix["measured"]["fails_on"]) == {"0.5.21", "0.5.22", "0.5.23"}
    assert fix["verdict"] == "partly" and fix["measured"]["cutlass_after_card_files"] == {"0.5.20": "APPROX"}
    # only headers, scales and the patch files were asked for: no shard was downloaded whole
    shard_gets = [rng for m, p, rng in log if m == "GET" and p.endswith(".safetensors")]
    assert shard_gets and all(shard_gets)
