import json

import pytest
import yaml

from nvfp4study.core import ledger
from nvfp4study.core.errors import LedgerError
from nvfp4study.core.params import REPO_ROOT

NOTEBOOK_STAGES = {p.stem for p in (REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.py")}


def test_claims_cover_the_card():
    ids = {c["id"] for c in ledger.card_claims()}
    # The minimum list of card claims, by topic.
    for needed in ["fit.single-gpu", "size.disk", "size.resident", "load.time", "clamp.nvfp4-dropped",
                   "clamp.others-forward", "clamp.log-lines", "corruption.t0-off-15",
                   "corruption.t0-off-10", "corruption.t06-on", "corruption.t06-off",
                   "corruption.executed", "detect.ascii-junk", "clamp.trtllm-routing",
                   "mtp.layer42-bf16", "mtp.broken-draft", "mtp.off", "mtp.k1", "mtp.k2", "mtp.k3",
                   "det.spec-off", "det.spec-on", "det.deterministic-mode", "det.min-deepgemm-dim",
                   "layout.routed-experts", "scales.input-global-scale", "scales.input-empty-nan",
                   "sglang.w4a16-unservable", "serve.shared-fusion-off", "serve.reasoning-parser",
                   "counts.quantized-experts", "counts.mla-unpacked", "config.context",
                   "provenance.fused-maps", "provenance.model-free-ptq"]:
        assert needed in ids, needed


def test_every_claim_names_a_real_stage():
    for c in ledger.card_claims():
        assert c["stage"] in NOTEBOOK_STAGES, c


def test_init_then_record(run_dir):
    rows = ledger.read_ledger(run_dir)
    assert all(r["verdict"] == "not run" for r in rows)
    assert len(rows) == len(ledger.card_claims())
    ledger.record(run_dir, "mtp.k2", measured={"tok_s": 12.5}, verdict="contradicted",
                  evidence=run_dir / "data" / "x.json", note="n")
    row = next(r for r in ledger.read_ledger(run_dir) if r["id"] == "mtp.k2")
    assert row["measured"] == {"tok_s": 12.5} and row["verdict"] == "contradicted"
    assert row["evidence"] == ["data/x.json"]
    # the card value is untouched
    assert row["card"]["tok_s"] == 45.1


def test_unknown_claim_and_bad_verdict(run_dir):
    with pytest.raises(LedgerError, match="unknown claim id"):
        ledger.record(run_dir, "nope", measured=1, verdict="reproduced")
    with pytest.raises(LedgerError, match="invalid verdict"):
        ledger.record(run_dir, "mtp.k2", measured=1, verdict="great")


def test_findings_are_separate_rows(run_dir):
    ledger.add_finding(run_dir, "study.x", stage="03_patch_sglang", claim="c", measured=2)
    ledger.add_finding(run_dir, "study.x", stage="03_patch_sglang", claim="c", measured=3)
    rows = [r for r in ledger.read_ledger(run_dir) if r["id"] == "study.x"]
    assert len(rows) == 1 and rows[0]["measured"] == 3 and rows[0]["origin"] == "study"
    assert rows[0]["card"] is None
    with pytest.raises(LedgerError):
        ledger.add_finding(run_dir, "mtp.k2", stage="x", claim="c", measured=1)


def test_not_run_reason(run_dir):
    ledger.record_not_run(run_dir, ["mtp.k1"], "needs a GPU")
    row = next(r for r in ledger.read_ledger(run_dir) if r["id"] == "mtp.k1")
    assert row["note"] == "not run: needs a GPU" and row["measured"] is None


def test_corrupt_ledger_is_named(tmp_path):
    (tmp_path / "ledger.json").write_text(json.dumps({"nope": 1}))
    with pytest.raises(LedgerError, match="not a study ledger"):
        ledger.read_ledger(tmp_path)


def test_claims_yaml_parses_to_unique_ids():
    rows = yaml.safe_load((REPO_ROOT / "lib/nvfp4study/core/claims.yaml").read_text())
    assert len({r["id"] for r in rows}) == len(rows)
