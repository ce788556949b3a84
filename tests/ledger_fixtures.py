"""Helpers for tests that read what a run recorded in its ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nvfp4study.core.ledger import read_ledger


def ledger_row(run_dir: Path, claim_id: str) -> dict[str, Any]:
    """The ledger row of ``claim_id`` in ``run_dir`` (the first, as the report reads it);
    StopIteration when the claim was never recorded."""
    return next(r for r in read_ledger(run_dir) if r["id"] == claim_id)
