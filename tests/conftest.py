"""Shared fixtures. Tests of each module live in test_<module>.py."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Every process this test session starts inherits this marker, so the leftover-process checks
# (serving_fixtures.fake_processes) look only at our own processes, not at another test run's.
SESSION_ENV = "NVFP4STUDY_TEST_SESSION"
os.environ[SESSION_ENV] = uuid.uuid4().hex
sys.path.insert(0, str(Path(__file__).resolve().parent))  # test helpers (e.g. fake_sglang)
# the suite never reads a workstation's params/local.yaml (tests of the overlay name theirs)
os.environ["NVFP4STUDY_OVERLAY"] = ""


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """An empty run folder with the default params and a fresh ledger."""
    from nvfp4study.core.ledger import init_ledger
    from nvfp4study.core.params import dump_params, load_params

    d = tmp_path / "run"
    d.mkdir()
    dump_params(load_params(), d / "params.yaml")
    init_ledger(d)
    return d
