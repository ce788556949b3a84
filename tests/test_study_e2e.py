"""One end-to-end run of the default study, as `make study` runs it (the CLI, all notebooks)."""

import json
import subprocess
import sys

import pytest

from nvfp4study.core.ledger import card_claims
from nvfp4study.core.params import REPO_ROOT

STAGES = ["00_environment", "01_quantize", "02_inspect_checkpoint", "03_patch_sglang",
          "04_launch_server", "05_corruption", "06_mtp_sweep", "07_determinism", "99_report"]


@pytest.fixture(scope="module")
def study_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("e2e") / "run"
    r = subprocess.run([sys.executable, "-m", "nvfp4study.cli", "run", "--run-dir", str(run)],
                       capture_output=True, text=True, cwd=REPO_ROOT, timeout=1500)
    return run, r


def test_default_study_runs_every_notebook(study_run):
    run, r = study_run
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    manifest = json.loads((run / "manifest.json").read_text())
    assert [n["notebook"] for n in manifest["notebooks"]] == STAGES
    assert all(n["status"] == "ok" for n in manifest["notebooks"])
    for line in STAGES:
        assert line in r.stdout  # one progress line per notebook


def test_report_has_every_card_claim(study_run):
    run, _ = study_run
    html = (run / "report.html").read_text()
    ledger = json.loads((run / "ledger.json").read_text())["rows"]
    ids = {row["id"] for row in ledger}
    for claim in card_claims():
        assert claim["id"] in ids and claim["id"] in html
    # every stage ran, so no card claim is left with the initial placeholder note
    assert [row["id"] for row in ledger if row["note"] == "stage did not run"] == []
    # GPU stages say why they did not run
    gpu = [row for row in ledger if row["stage"] in ("04_launch_server", "06_mtp_sweep", "07_determinism")
           and row["id"] != "mtp.bandwidth-ceiling"]
    # ... except 06's bandwidth ceiling: arithmetic on the card's numbers and the layout, no GPU needed
    assert next(r for r in ledger if r["id"] == "mtp.bandwidth-ceiling")["verdict"] == "reproduced"
    assert gpu and all(row["verdict"] == "not run" and "GPU" in row["note"] for row in gpu)
    # ours is never the card's: a row not run carries no value; every measured row names
    # evidence files that exist in the run folder and a value that is not the card's own
    for row in ledger:
        if row["verdict"] == "not run":
            assert row["measured"] is None, row["id"]
        else:
            assert row["measured"] is not None and row["measured"] != row["card"], row["id"]
            assert row["evidence"], row["id"]
            for ev in row["evidence"]:
                assert (run / ev).exists(), (row["id"], ev)


def test_run_folder_contents(study_run):
    run, _ = study_run
    for stage in STAGES:
        assert (run / f"{stage}.ipynb").exists() and (run / "html" / f"{stage}.html").exists()
    assert list((run / "figures").glob("*.png")), "stages draw figures"
    assert list((run / "data").glob("*.json")), "stages write data files"
