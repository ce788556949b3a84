"""What a first real run on the card's machine class meets between stages, without a GPU: the
checkpoint 01 records is the one 04-07 serve."""

from __future__ import annotations

from nvfp4study.core.params import REPO_ROOT, load_params
from nvfp4study.core.paths import RunPaths
from nvfp4study.core.stage import Stage
from nvfp4study.serving.server import card_config, served_model_path
from nvfp4study.stages import s01_quantize

LING = REPO_ROOT / "params" / "ling3-flash.yaml"


def test_the_checkpoint_01_records_is_served(tmp_path):
    """ling3-flash.yaml sets no server.model_path: 04-07 serve what 01 wrote in data/quantize.json
    (its ``quantized`` key), which is what 02 audits too."""
    p = load_params(LING, overlay=False)
    assert p.server.model_path is None
    paths = RunPaths(tmp_path / "run")
    q = str(tmp_path / "run" / "work" / s01_quantize.QUANTIZED_DIR)
    s01_quantize.run_quantize(p, paths, {"action": "skip", "source": None, "quantized": q, "reason": "test"}, {})
    stage = Stage(name="04_launch_server", params=p, paths=paths)
    assert served_model_path(stage, card_config(p)) == q


def test_card_checkpoint_is_downloaded_audited_and_served(tmp_path, monkeypatch):
    """checkpoint.serve: card (ling3-flash.yaml): 01 downloads the card's repo at its revision
    (resolved to the commit and recorded), quantizes nothing, and records the snapshot as the
    checkpoint 02 audits and 04-07 serve; a re-run keeps the recorded commit."""
    import json

    import pytest

    from hub_server import HubServer, Repo
    from nvfp4study.core.errors import SourceCheckpointMissing
    from nvfp4study.stages import s02_inspect

    card = tmp_path / "card"
    card.mkdir()
    for name in ("config.json", "model-00001-of-00001.safetensors", "README.md"):
        (card / name).write_text("{}")
    sha = "c" * 40
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    p = load_params(LING, overlay=False)
    paths = RunPaths(tmp_path / "run")
    repo = Repo("kingjones777/Ling-3.0-flash-NVFP4-SGLang-MTP", card, sha)
    with HubServer([repo]) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        plan = s01_quantize.plan(p, paths)
        assert plan["action"] == "card" and "nothing is quantized" in plan["reason"]
        source = s01_quantize.build_source(p, paths, plan)
        rep = s01_quantize.run_quantize(p, paths, plan, source)
        snap = tmp_path / "hub" / "models--kingjones777--Ling-3.0-flash-NVFP4-SGLang-MTP" / "snapshots" / sha
        assert rep["quantized"] == str(snap) and rep["card_checkpoint"]["commit"] == sha
        assert sorted(f.name for f in snap.iterdir()) == ["config.json", "model-00001-of-00001.safetensors"]
        assert json.loads(paths.data("card_checkpoint", "json").read_text())["commit"] == sha
        repo.revisions = {sha, "d" * 40}  # main moves on: the run keeps its commit
        again = s01_quantize.build_source(p, paths, s01_quantize.plan(p, paths))
        assert again["hub"]["commit"] == sha and again["hub"]["reused_commit"]
    stage = Stage(name="02_inspect_checkpoint", params=p, paths=paths)
    ck = s02_inspect.resolve_checkpoint(stage)
    assert ck["path"] == str(snap)
    # named as the card's (found by the simulated first runs: 02's notes called it "the study's
    # SCALED checkpoint with RANDOM weights, quantized with the card's recipe")
    assert ck["card"] and ck["checked_on"].startswith(f"hf:kingjones777/Ling-3.0-flash-NVFP4-SGLang-MTP@{sha} ")
    from nvfp4study.stages.claim_rules.r02_inspect import audit_scope

    class Rep:
        extra = {"real_size_config": False}
        config_summary = {"random_weights": None}

    real, rnd, scope, _ = audit_scope(paths.root, Rep(), ck)
    assert real and not rnd and scope.startswith("the card's own checkpoint, hf:") and "RANDOM" not in scope
    assert served_model_path(Stage(name="04_launch_server", params=p, paths=paths), card_config(p)) == str(snap)
    assert s01_quantize.probes(p, paths, plan)["run"] is False  # nothing quantized, nothing probed
    with pytest.raises(SourceCheckpointMissing, match="card_checkpoint"):
        s01_quantize.plan(load_params(LING, ["checkpoint.card_checkpoint=null"], overlay=False), paths)
