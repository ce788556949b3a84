"""One end-to-end run of the default study, as `make study` runs it (the CLI, all notebooks)."""

import json
import subprocess
import sys

import pytest

from nvfp4study.core.ledger import card_claims
from nvfp4study.core.params import REPO_ROOT

#: 05's served rows (the card's before/after table, executed tests, the reasoning-parser probe)
SERVED_05 = ("corruption.t0-off-15", "corruption.t0-off-10", "corruption.t06-on", "corruption.t06-off",
             "corruption.executed", "serve.reasoning-parser")
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
    # the served stages ran on SGLang's real engine on the CPU: the card's rows say what settles them
    gpu = [row for row in ledger if row.get("origin", "card") == "card" and (
        row["stage"] in ("04_launch_server", "06_mtp_sweep", "07_determinism") or row["id"] in SERVED_05)]
    assert next(r for r in ledger if r["id"] == "mtp.bandwidth-ceiling")["verdict"] == "reproduced"
    assert gpu and all(row["verdict"] == "not run" and "NVFP4-capable GPU" in row["note"] for row in gpu)
    # ... and the study's findings from the real engine, each with evidence in the run
    by_id = {r["id"]: r for r in ledger}
    for fid in ("serve.cpu-engine-launch", "corruption.cpu-pipeline", "mtp.cpu-known-acceptance",
                "mtp.cpu-broken-draft-signature", "mtp.cpu-estimators", "det.cpu-spec-off-self",
                "serve.cpu-engine-teardown", "serve.cpu-engine-patched-modes", "audit.cpu-moe-clamp",
                "audit.cpu-routed-scaling"):
        assert by_id[fid]["verdict"] == "reproduced", (fid, by_id[fid]["note"])
        assert "SGLang 0.5.23 engine on CPU" in by_id[fid]["checked_on"], fid
    assert by_id["det.cpu-deterministic-mode"]["verdict"] == "not run"
    assert "refuses" in by_id["det.cpu-deterministic-mode"]["note"]
    assert by_id["serve.cpu-engine-teardown"]["measured"]["processes_left"] == 0
    # the clamp probe: SGLang 0.5.23's moe_forward_native applies SiluAndMul without the limit when
    # gemm1_alpha is None (fused_moe_native.py 84-85, 130-140), so the routed limit changes nothing
    probe = by_id["audit.cpu-moe-clamp"]["measured"]
    assert probe["audit_verdict"] == "DROPPED" and probe["dynamic_reading"] == "not applied"
    assert probe["routed_limit_outputs_equal_to_no_limit"] == probe["prompts"] and probe["shared_limit_outputs_changed"] >= 1
    # the routed-scaling probe: released, the native path never reads routed_scaling_factor
    # (fused_moe_native.py 157-163, unquant.py 1382-1391), so the factor x 4 changes nothing
    scaling = by_id["audit.cpu-routed-scaling"]["measured"]
    assert scaling["dynamic_reading"] == "not applied" and scaling["patch"] == "released"
    assert scaling["factor_outputs_equal_to_unchanged"] == scaling["prompts"] and scaling["down_proj_control_changed"] >= 1
    # ... and with the native routed_scaling patch (the probe's patched arm) it is applied once: the
    # patched factor launch gives the patched down_proj control's outputs token for token
    assert (scaling["patched_patch"], scaling["patched_dynamic_reading"]) == ("applied", "applied once")
    assert scaling["patched_factor_outputs_equal_to_down_proj_control"] == scaling["prompts"]
    # stage 03's static reading of the card's path, with its prediction for 04 read from 03's file
    rsf = by_id["finding.routed-scaling-dropped"]
    assert set(rsf["measured"]["card_path"].values()) == {"DROPPED"} and rsf["verdict"] in ("reproduced", "partly")
    assert scaling["audit_verdict"] == "DROPPED"
    # the trained stand-in on the real engine: each finding measured, its arms named, the null
    # control held (the reference relaunched gave the same tokens), never beside the card's numbers
    for fid, arms in (("corruption.trained-before-after", ("released-bf16",)),
                      ("corruption.trained-weights-vs-clamp", ("exact-nvfp4", "released-bf16")),
                      ("corruption.trained-approx-gap", ("approx-bf16", "released-bf16")),
                      ("mtp.trained-acceptance", ("k=1", "k=2", "k=3"))):
        row = by_id[fid]
        assert row["verdict"] in ("reproduced", "contradicted") and row["card"] is None, (fid, row["note"])
        assert all(a in row["note"] for a in arms) and "toy scale" in row["note"].lower(), fid
        assert "SGLang 0.5.23 engine on CPU" in row["checked_on"], fid
    assert by_id["corruption.trained-before-after"]["measured"]["null_control_identical"] == \
        by_id["corruption.trained-before-after"]["measured"]["prompts"]
    # the card's corruption rows stay not run, citing the outside measurements as theirs
    for cid in SERVED_05:
        if cid.startswith("corruption."):
            assert "jundot/omlx/pull/2571" in by_id[cid]["note"] and "theirs" in by_id[cid]["note"], cid
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


def test_readme_findings_match_the_default_run(study_run):
    """The README's findings section is what `nvfp4study findings` writes for the default run."""
    from nvfp4study.report import findings

    run, _ = study_run
    generated = findings.markdown(json.loads((run / "ledger.json").read_text())["rows"])
    readme = findings.current_section((REPO_ROOT / "README.md").read_text())
    assert readme == generated, ("README findings are stale: run the default study, then "
                                 "`nvfp4study findings outputs/latest --write`")
    assert all(f.generated == "data" for f in findings.headlines(json.loads((run / "ledger.json").read_text())["rows"]))


def test_report_in_a_browser(study_run):
    """report.html in headless Chromium: summary above the fold, readable cells, images loaded
    and captioned, no index columns; a screenshot stays in the run folder."""
    import re

    from report_browser import VIEWPORT, render

    run, _ = study_run
    shot = run / "report-screenshot.png"
    seen = render(run / "report.html", shot)
    assert shot.is_file() and shot.stat().st_size > 10_000
    assert seen["viewport"] == list(VIEWPORT)
    # above the fold: profile, verdict counts, at least two headline sentences
    assert seen["summary_top"] is not None and seen["summary_top"] < VIEWPORT[1] / 3
    fold = seen["fold_text"]
    ledger = json.loads((run / "ledger.json").read_text())["rows"]
    n_card = sum(r.get("origin", "card") == "card" for r in ledger)
    assert "Profile" in fold and "default" in fold and f"{n_card} card claims" in fold
    assert "The SwiGLU clamp" in fold and "Other MoE runners" in fold
    # every ledger row is a table row; no cell shows a JSON object or list
    assert sorted(c["id"] for c in seen["value_cells"]) == sorted(f"claim-{r['id']}" for r in ledger)
    raw = re.compile(r"[{\[]\s*\"|\"\s*:\s*[{\[\"0-9]")
    for row in seen["value_cells"]:
        for cell in row["cells"]:
            assert not raw.search(cell), (row["id"], cell[:200])
    # every image loaded and captioned; one per figure file
    imgs = seen["images"]
    assert len(imgs) == len(list((run / "figures").glob("*.png"))) > 0
    for im in imgs:
        assert im["complete"] and im["width"] > 0 and im["alt"] and len(im["caption"]) > 40, im
    assert seen["index_headers"] == 0  # no pandas index column anywhere
    assert "needs the real model on an NVFP4-capable GPU" in seen["text"]
    assert "SGLang 0.5.23 engine on CPU" in seen["text"]  # what served 04-07, and what it replaced


def test_report_prints_on_a4(study_run):
    """report.html printed by Chromium to an A4 PDF takes at most 22 pages (20 until the trained
    stand-in's four findings and the routed-scaling probe's row: 21 pages; the rows are
    already folded to their first clause on paper); laid out as printed
    (print media, the page's content box) no table is wider than the page or than what holds
    it, no cell's content spills out of it, the ledger tables take the page's width, and every
    ledger row opens with its one-sentence verdict and fits on a page."""
    from nvfp4study.report.findings import VERDICT_WORDS
    from nvfp4study.report.sections import PAGE_MARGIN_MM
    from report_browser import A4_MM, PX_PER_MM, print_a4

    run, _ = study_run
    seen = print_a4(run / "report.html", run / "report-a4.pdf", PAGE_MARGIN_MM)
    assert seen["pages"] <= 22, f"{seen['pages']} A4 pages (report-a4.pdf in {run})"
    width = seen["content_width"]
    assert seen["print_media"] and width == round((A4_MM[0] - 2 * PAGE_MARGIN_MM) * PX_PER_MM)
    assert seen["scroll_width"] <= width
    wide = [(t["where"], t["cls"], round(t["right"])) for t in seen["tables"]
            if t["right"] > width + 1 or t["right"] > t["box_right"] + 1]
    assert wide == [], f"tables wider than the page ({width} px) or their cell: {wide}"
    assert seen["overflowing_cells"] == []
    ledgers = [t["width"] for t in seen["tables"] if t["cls"] == "ledger"]
    assert ledgers and min(ledgers) >= 0.97 * width  # the page's width, not the notebook's frame
    rows = seen["ledger_rows"]
    assert len(rows) == len(json.loads((run / "ledger.json").read_text())["rows"])
    assert all(r["lead"].startswith(tuple(VERDICT_WORDS.values())) for r in rows), rows[:3]
    assert [r["id"] for r in rows if r["height"] > seen["page_height"]] == []


def test_no_sglang_process_outlives_the_study(study_run):
    """Every process any launch of the run had while healthy is gone (psutil), and each launch's
    record says 0 were left after its stop."""
    import psutil

    run, _ = study_run
    rows = [json.loads(x) for x in (run / "data" / "serve-lifecycle.jsonl").read_text().splitlines() if x.strip()]
    assert rows and all(r["left_after_stop"] == [] for r in rows)
    recs = [json.loads(ln) for f in (run / "data").glob("serve-launch-*.jsonl") for ln in f.read_text().splitlines()
            if ln.strip()]
    pids = [p["pid"] for r in recs for p in r.get("process_tree") or []]
    markers = {r["marker"] for r in recs if r.get("marker")}
    assert pids and markers
    live = []
    for pid in pids:  # a reused pid is not ours: SGLang's titles, a command naming this run, or
        try:          # a launch's marker (a forked server's command line is its fork server's)
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE and (
                    proc.name().startswith("sglang::") or str(run) in " ".join(proc.cmdline())
                    or proc.environ().get("NVFP4STUDY_SERVER") in markers):
                live.append(pid)
        except psutil.Error:
            continue
    assert live == []
