"""Stage 02 on the card's own checkpoint: a fixture repository served by tests/hub_server.py stands
in for the card's repo; the claim rows are then measured on it (``checked_on`` = repo@commit), the
gate/up test runs on its scales, and the default params touch no network.

The fixture is the generator's header-only NVFP4 layout (small sizes, real ``[1]`` scales) with one
expert's up_proj global scale edited in place, so the gate/up test has exactly one pair to find,
and without the generator's ``_nvfp4study`` marker in config.json (the card's has none).
"""

from __future__ import annotations

import json

import pytest

from hub_server import HubServer, Repo
from nvfp4study.core.ledger import read_ledger
from test_hub_audit import SHAPE, UP_SCALE, _poke

CARD = "study-fixture/card-nvfp4"
SHA = "c" * 40
E, NL, DENSE = SHAPE.num_experts, SHAPE.num_hidden_layers, SHAPE.first_k_dense_replace


@pytest.fixture(scope="module")
def card_repo(tmp_path_factory):
    from nvfp4study.checkpoint.generate import write_checkpoint

    root = write_checkpoint(SHAPE, tmp_path_factory.mktemp("card") / "ckpt", shards=2, header_only=True, layout="nvfp4")
    _poke(root, UP_SCALE, 12345.0)
    cfg = json.loads((root / "config.json").read_text())
    cfg.pop("_nvfp4study", None)  # the generator's marker: the card's config has none
    (root / "config.json").write_text(json.dumps(cfg))
    return root


@pytest.fixture
def hub(card_repo, tmp_path, monkeypatch):
    srv = HubServer([Repo(CARD, card_repo, SHA)])
    with srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        yield srv


def _stage(tmp_path, ours, card_block: str):
    from nvfp4study.stages import s02_inspect as ins

    pf = tmp_path / "p.yaml"
    pf.write_text("profile: cardtest\ncheckpoint:\n  source: generate\n" + card_block)
    stage = ins.open_stage(str(pf), str(tmp_path / "run"))
    stage.paths.data("quantize", "json").write_text(json.dumps({"quantized": str(ours), "random_weights": True}))
    ck = ins.resolve_checkpoint(stage)
    return ins, stage, ck, ins.run_audit(stage, ck)


def test_stage02_measures_the_card_rows_on_the_card_files(card_repo, hub, tmp_path):
    ins, stage, ck, rep = _stage(tmp_path, card_repo, f"  card_checkpoint: {{repo_id: {CARD}, revision: main}}\n")
    card = ins.card_audit(stage)
    assert card["run"], card
    assert card["ck"]["hub"]["commit"] == SHA  # the branch resolved to the commit
    saved = json.loads(stage.paths.data("card_checkpoint_audit", "json").read_text())
    assert saved["source"]["hub"]["commit"] == SHA and saved["traffic"]["requests"] > 0
    total = sum(p.stat().st_size for p in card_repo.iterdir())
    assert 0 < saved["traffic"]["bytes"] < 0.01 * total  # headers and scales, not the weights

    table = ins.comparison_table(rep, card)
    row = table.set_index("quantity").loc["quantized routed-expert tensors"]
    assert row["card says"] == "61440" and row["ours"] == str(3 * E * (NL - DENSE))
    assert row[f"card's checkpoint ({SHA[:12]})"] == str(3 * E * (NL - DENSE))

    ins.record_ledger(stage, rep, ck, {"run": False}, card)
    rows = {r["id"]: r for r in read_ledger(stage.run_dir)}
    on = f"hf:{CARD}@{SHA}"
    for cid in ("counts.quantized-experts", "scales.input-global-scale", "mtp.ignore-first", "config.w4a4", "size.disk"):
        assert rows[cid]["checked_on"].startswith(on), (cid, rows[cid]["checked_on"])
    # the fixture is not the card: its count (96) is compared with the card's 61,440 directly
    assert rows["counts.quantized-experts"]["measured"]["count"] == 3 * E * (NL - DENSE)
    assert rows["counts.quantized-experts"]["verdict"] == "contradicted"
    assert rows["mtp.ignore-first"]["verdict"] == "reproduced"  # re:.*layers\.3\..* first, the MTP layer here
    assert rows["config.w4a4"]["verdict"] == "reproduced"
    # the clamp lists and context are now read from the card's config, not "not run"
    assert rows["config.context"]["verdict"] == "reproduced"  # 262144, rope_scaling null, as the generator wrote
    assert rows["config.clamp-lists"]["verdict"] == "contradicted"  # layer 2 only, not 35-41
    assert rows["clamp.trtllm-routing"]["measured"]["experts_per_group"] == E / SHAPE.n_group
    assert rows["clamp.trtllm-routing"]["verdict"] == "contradicted"  # 8 per group, within the kernel's 32
    gu = rows["audit.card-gate-up-scales"]
    assert gu["verdict"] == "reproduced" and gu["measured"]["mismatched"] == 1
    assert gu["measured"]["pairs"] == E * (NL - DENSE)
    assert rows["audit.card-checkpoint"]["verdict"] == "reproduced" and rows["audit.card-checkpoint"]["checked_on"].startswith(on)
    # the study's own findings stay on our checkpoint
    assert rows["audit.gate-up-shared"]["checked_on"].startswith("audit of")


def test_rerun_reuses_the_recorded_commit(card_repo, hub, tmp_path):
    ins, stage, ck, rep = _stage(tmp_path, card_repo, f"  card_checkpoint: {{repo_id: {CARD}, revision: main}}\n")
    assert ins.card_audit(stage)["ck"]["hub"]["commit"] == SHA
    repo = hub.repos[CARD]
    repo.revisions = {SHA, "d" * 40}  # main moved away: a re-run must not ask for it
    hub.reset_counters()
    again = ins.card_audit(stage)
    assert again["run"] and again["ck"]["hub"]["commit"] == SHA
    assert not any("/revision/main" in p for _, p, _ in hub.log)


def test_default_params_touch_no_network(card_repo, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    ins, stage, ck, rep = _stage(tmp_path, card_repo, "")
    card = ins.card_audit(stage)
    assert not card["run"] and "nvfp4study run --params params/card-files.yaml" in card["reason"]
    ins.record_ledger(stage, rep, ck, {"run": False}, card)
    rows = {r["id"]: r for r in read_ledger(stage.run_dir)}
    for fid in ("audit.card-checkpoint", "audit.card-gate-up-scales"):
        assert rows[fid]["verdict"] == "not run" and "no Hub access" in rows[fid]["note"]
        assert "params/card-files.yaml" in rows[fid]["note"]
    assert rows["counts.quantized-experts"]["verdict"] == "partly"  # the stand-in's rows as before
    assert "card's checkpoint" in ins.comparison_table(rep, card).columns


def test_unreachable_hub_is_a_not_run_row_not_a_crash(card_repo, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    ins, stage, ck, rep = _stage(tmp_path, card_repo, f"  card_checkpoint: {{repo_id: {CARD}, revision: main}}\n")
    card = ins.card_audit(stage)
    assert not card["run"] and "HubUnreachable" in card["reason"] and "HF_ENDPOINT" in card["reason"]
    assert not stage.paths.data("card_checkpoint_audit", "json").exists()
