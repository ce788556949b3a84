"""The claims ledger: every card claim, the card's value, what we measured and a verdict.

Claims live in ``claims.yaml`` (data, never measurements). A run's ledger is
``outputs/<run>/ledger.json``: a JSON object ``{"rows": [...]}``; each row has the claim fields
plus ``measured`` (JSON value or null), ``verdict`` (:class:`Verdict`), ``evidence`` (paths
relative to the run folder), ``note`` and ``checked_on`` (e.g. an SGLang version). Rows the
card does not have (the study's own findings) carry ``origin: "study"``.

Writes are atomic (temp file + rename) so a failing stage never leaves half a ledger.
"""

from __future__ import annotations

import json
from enum import StrEnum
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from .errors import LedgerError
from .files import write_json

LEDGER_FILE = "ledger.json"


class Verdict(StrEnum):
    """Outcome of testing one claim."""

    REPRODUCED = "reproduced"
    CONTRADICTED = "contradicted"
    PARTLY = "partly"
    NOT_RUN = "not run"


@cache
def _claims_text() -> str:
    return resources.files(__package__).joinpath("claims.yaml").read_text()


def card_claims() -> list[dict[str, Any]]:
    """The card's claims as a list of dicts: ``id``, ``stage``, ``claim``, ``card``.

    Raises:
        LedgerError: duplicate ids or a row missing a field (a broken claims.yaml).
    """
    rows = yaml.safe_load(_claims_text())
    seen: set[str] = set()
    for r in rows:
        missing = {"id", "stage", "claim", "card"} - set(r)
        if missing:
            raise LedgerError(f"claims.yaml: row {r.get('id')!r} lacks {sorted(missing)}")
        if r["id"] in seen:
            raise LedgerError(f"claims.yaml: duplicate id {r['id']!r}")
        seen.add(r["id"])
    return rows


def claims_for_stage(stage: str) -> list[str]:
    """Ids of the card claims a stage (e.g. ``"05_corruption"``) is responsible for."""
    return [c["id"] for c in card_claims() if c["stage"] == stage]


def _blank_row(c: dict[str, Any]) -> dict[str, Any]:
    return {
        **c,
        "origin": "card",
        "measured": None,
        "verdict": Verdict.NOT_RUN.value,
        "evidence": [],
        "note": "stage did not run",
        "checked_on": None,
    }


def init_ledger(run_dir: str | Path) -> Path:
    """Write a fresh ledger (every card claim, verdict "not run") unless one exists.

    Returns the ledger path. An existing ledger is kept, so ``--from``/``--only`` re-runs add to it.
    """
    path = Path(run_dir) / LEDGER_FILE
    if not path.exists():
        _write(path, {"rows": [_blank_row(c) for c in card_claims()]})
    return path


def read_ledger(run_dir: str | Path) -> list[dict[str, Any]]:
    """All rows of a run's ledger, card claims first in card order, then study findings.

    Raises:
        LedgerError: no ledger in the folder, or a file that is not a ledger.
    """
    path = Path(run_dir) / LEDGER_FILE
    if not path.is_file():
        raise LedgerError(f"no ledger at {path} (run the study with `nvfp4study run`)")
    try:
        data = json.loads(path.read_text())
        return list(data["rows"])
    except (ValueError, KeyError, TypeError) as exc:
        raise LedgerError(f"{path}: not a study ledger ({exc})") from exc


def _write(path: Path, data: dict) -> None:
    write_json(path, data)


def _evidence(run_dir: Path, evidence: str | Path | list | None) -> list[str]:
    items = [] if evidence is None else evidence if isinstance(evidence, list) else [evidence]
    out = []
    for e in items:
        p = Path(e)
        out.append(str(p.relative_to(run_dir)) if p.is_absolute() and p.is_relative_to(run_dir) else str(p))
    return out


def record(
    run_dir: str | Path,
    claim_id: str,
    *,
    measured: Any,
    verdict: Verdict | str,
    evidence: str | Path | list | None = None,
    note: str = "",
    checked_on: str | None = None,
    sources: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Record what a stage measured for one claim (replaces any earlier record of it).

    Args:
        run_dir: the run folder holding ``ledger.json``.
        claim_id: an id from ``claims.yaml`` or of a study finding added with :func:`add_finding`.
        measured: our value, JSON-serialisable, in the same structure as the card's where possible;
            ``None`` when not run.
        verdict: a :class:`Verdict` or its string value.
        evidence: file path(s) backing the value, stored relative to ``run_dir``.
        note: one or two sentences: how it was measured, or why it was not run.
        checked_on: what it was checked against (e.g. ``"sglang 0.5.23"``).
        sources: where each measured value came from, ``{key of measured: "evidence file: key or
            row"}``, so a value can be traced to the raw data it was computed from (a value copied
            from the card has no such source). Stored as the row's ``sources``.

    Returns:
        The updated row.

    Raises:
        LedgerError: unknown claim id, invalid verdict, or ``sources`` naming a key that
            ``measured`` does not have (or given for a non-dict ``measured``).
    """
    run_dir = Path(run_dir)
    if sources is not None and (not isinstance(measured, dict) or set(sources) - set(measured)
                                or not all(isinstance(v, str) and v for v in sources.values())):
        raise LedgerError(f"{claim_id}: sources {sorted(sources)} must name keys of measured "
                          f"{sorted(measured) if isinstance(measured, dict) else measured!r} with a non-empty origin")
    try:
        verdict = Verdict(verdict)
    except ValueError:
        raise LedgerError(f"invalid verdict {verdict!r}; valid: {[v.value for v in Verdict]}") from None
    init_ledger(run_dir)
    path = run_dir / LEDGER_FILE
    data = {"rows": read_ledger(run_dir)}
    for row in data["rows"]:
        if row["id"] == claim_id:
            row.update(
                measured=measured,
                verdict=verdict.value,
                evidence=_evidence(run_dir, evidence),
                note=note,
                checked_on=checked_on,
            )
            if sources is not None:
                row["sources"] = dict(sources)
            else:
                row.pop("sources", None)
            _mark_simulated(row)
            _write(path, data)
            return row
    valid = [r["id"] for r in data["rows"]]
    raise LedgerError(f"unknown claim id {claim_id!r}; valid ids: {', '.join(valid)}")


def _mark_simulated(row: dict[str, Any]) -> None:
    """A simulated run's row (:func:`nvfp4study.core.environment.simulated`) names its stand-ins
    in ``simulated`` and opens its note with "SIMULATED", so no value of it reads as measured."""
    from .environment import simulated

    if simulated():
        row["simulated"] = simulated()
        row["note"] = f"SIMULATED (stand-ins, not a measurement): {row['note']}"
        row["checked_on"] = "simulated stand-ins" + (f" ({row['checked_on']})" if row.get("checked_on") else "")


def record_not_run(run_dir: str | Path, claim_ids: list[str], reason: str) -> None:
    """Mark claims as not run, with the reason (e.g. "needs an NVFP4-capable GPU")."""
    for cid in claim_ids:
        record(run_dir, cid, measured=None, verdict=Verdict.NOT_RUN, note=f"not run: {reason}")


def add_finding(
    run_dir: str | Path,
    finding_id: str,
    *,
    stage: str,
    claim: str,
    measured: Any,
    verdict: Verdict | str = Verdict.REPRODUCED,
    evidence: str | Path | list | None = None,
    note: str = "",
    checked_on: str | None = None,
) -> dict[str, Any]:
    """Add (or replace) a row the card does not have: the study's own finding.

    ``card`` is null for these rows; ``verdict`` says whether the finding held in this run.
    """
    run_dir = Path(run_dir)
    init_ledger(run_dir)
    path = run_dir / LEDGER_FILE
    rows = [r for r in read_ledger(run_dir) if r["id"] != finding_id]
    if any(c["id"] == finding_id for c in card_claims()):
        raise LedgerError(f"{finding_id!r} is a card claim id; use record()")
    rows.append({"id": finding_id, "stage": stage, "claim": claim, "card": None, "origin": "study",
                 "measured": None, "verdict": Verdict.NOT_RUN.value, "evidence": [], "note": "",
                 "checked_on": None})
    _write(path, {"rows": rows})
    return record(run_dir, finding_id, measured=measured, verdict=verdict, evidence=evidence,
                  note=note, checked_on=checked_on)
