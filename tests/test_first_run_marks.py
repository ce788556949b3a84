"""What the simulated first runs (``tests/simulate``, ``make simulate``) rely on, and the bugs they
found, tested in the ordinary suite: a simulated run is marked wherever its results show, and the
library code paths the simulations broke hold on the data that broke them."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from nvfp4study.core import environment, ledger
from nvfp4study.core.params import load_params
from nvfp4study.stages import s99_report
from nvfp4study.stages.claim_rules.r05_corruption import UNSAFE_NOTE, unsafe_suffix
from nvfp4study.workstation import preflight

SAID = "simulated gb10 first run: nvidia-smi prints recorded answers (stand-ins)"


def test_a_simulated_run_is_marked_in_environment_ledger_and_report(run_dir, monkeypatch):
    """Unset (a real run): no mark anywhere. Set: environment.json's record, every ledger row
    recorded (note opens with SIMULATED, checked_on names the stand-ins) and the report's banner."""
    monkeypatch.delenv(environment.SIMULATED_ENV, raising=False)
    assert "simulated" not in environment.collect()
    real = ledger.record(run_dir, "fit.single-gpu", measured=1, verdict="reproduced", note="n", checked_on="x")
    assert "simulated" not in real and real["note"] == "n" and real["checked_on"] == "x"
    assert s99_report.simulated_html(run_dir, ledger.read_ledger(run_dir)) == ""
    monkeypatch.setenv(environment.SIMULATED_ENV, SAID)
    assert environment.collect()["simulated"] == SAID
    row = ledger.record(run_dir, "fit.single-gpu", measured=1, verdict="reproduced", note="n", checked_on="x")
    assert row["simulated"] == SAID and row["note"] == "SIMULATED (stand-ins, not a measurement): n"
    assert row["checked_on"] == "simulated stand-ins (x)"
    found = ledger.add_finding(run_dir, "finding.x", stage="04_launch_server", claim="c", measured=2, note="m")
    assert found["simulated"] == SAID and found["note"].startswith("SIMULATED")
    banner = s99_report.simulated_html(run_dir, ledger.read_ledger(run_dir))
    assert "SIMULATED RUN" in banner and SAID in banner
    monkeypatch.delenv(environment.SIMULATED_ENV)
    (run_dir / "ledger.json").write_text(json.dumps({"rows": []}))  # the environment record alone
    (run_dir / "data").mkdir()
    (run_dir / "data" / "environment.json").write_text(json.dumps({"simulated": SAID}))
    assert SAID in s99_report.simulated_html(run_dir, [])


def test_a_simulated_run_folder_says_so(tmp_path, monkeypatch):
    """A new run folder of a simulated run is ``<UTC>-<profile>-simulated``; a real run's is not."""
    from nvfp4study.core import runner

    nbs = tmp_path / "nbs"
    nbs.mkdir()
    (nbs / "00_x.ipynb").write_text("{}")
    monkeypatch.setattr(runner, "execute_notebook", lambda *a, **k: None)
    monkeypatch.setattr(runner, "to_html", lambda *a, **k: None)
    monkeypatch.setenv(environment.SIMULATED_ENV, SAID)
    sim, manifest = runner.run_study(None, outputs=tmp_path / "out", notebook_dir=nbs, echo=lambda *a: None)
    assert sim.name.endswith("-default-simulated") and manifest["simulated"] == SAID
    monkeypatch.delenv(environment.SIMULATED_ENV)
    real, manifest = runner.run_study(None, outputs=tmp_path / "out", notebook_dir=nbs, echo=lambda *a: None)
    assert real.name.endswith("-default") and "simulated" not in manifest


@pytest.mark.parametrize("isolations", [np.array([], dtype=object), pd.Series([], dtype=object).unique(), (), None])
def test_unsafe_suffix_of_no_sandboxed_answer(isolations):
    """Found by the simulated first runs: when no answer ran in the sandbox the isolation column
    is empty, ``.dropna().unique()`` an empty array, and ``isolations or ()`` raised ValueError."""
    assert unsafe_suffix(isolations) == ""


def test_unsafe_suffix_still_names_an_unsafe_run():
    assert unsafe_suffix(np.array(["bwrap", "subprocess-unsafe"], dtype=object)) == f" {UNSAFE_NOTE}."
    assert unsafe_suffix("bwrap, subprocess-unsafe") == f" {UNSAFE_NOTE}."


def test_preflight_sandbox_advice_names_values_params_accept():
    """The bubblewrap row's fix names ``-p key=value`` settings: each one loads (the issue's
    ``sandbox.isolation: auto`` did not)."""
    given = re.findall(r"-p (\S+=\S+)", preflight.SANDBOX_FIX)
    assert given == ["corruption.sandbox.isolation=subprocess-unsafe"]
    for override in given:
        key, value = override.split("=", 1)
        assert str(load_params(None, [override]).corruption.sandbox.isolation) == value


def test_long_cells_show_progress_with_an_eta(capsys, monkeypatch):
    """05's sweep and 06/07's requests go through ``core.progress``: a tqdm bar of done/total with
    the remaining time (in a terminal, text on stderr); the items come back unchanged, in order."""
    from nvfp4study.core.progress import progress

    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    items = list(range(5))
    assert list(progress(items, "05_corruption clamp=none t0-off-a")) == items
    err = capsys.readouterr().err
    assert "05_corruption clamp=none t0-off-a" in err and "5/5" in err and "<" in err  # elapsed<remaining
    assert progress([7], "one") == [7] and progress([], "none") == []


def test_the_collection_loops_use_the_progress_bar():
    """The one request loop of the long cells (04-07, 05's sweep and arms included: they go through
    ``measure._serve``) is wrapped (read from the source: the loop needs a server to run)."""
    import inspect

    from nvfp4study.serving import measure

    assert "in progress(pending," in inspect.getsource(measure._serve)


def test_findings_refuse_to_write_a_simulated_run_into_the_readme(run_dir, tmp_path, monkeypatch, capsys):
    """``nvfp4study findings RUN --write`` never puts a simulated run's rows into the README."""
    from nvfp4study.report import findings

    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{findings.START}\nold\n{findings.END}\n")
    monkeypatch.setenv(environment.SIMULATED_ENV, SAID)
    ledger.record(run_dir, "fit.single-gpu", measured=1, verdict="reproduced", note="n")
    assert findings.main([str(run_dir), "--write", "--readme", str(readme)]) == 1
    assert "simulated run" in capsys.readouterr().err and "old" in readme.read_text()
