"""Claim rules: one function per ledger row, registered by decorator, run by the stage that owns it.

A stage gathers its measurements once into a small typed object (a dataclass whose class
attribute ``STAGE`` names the notebook, e.g. ``"02_inspect_checkpoint"``), then
:func:`record_rules` runs every rule registered for that measurements type and writes the rows.
A rule is a pure function ``measurements -> Row`` (``Row | None`` for a study finding that only
some runs have); it decides the verdict and writes nothing. The registry works the way
lm-evaluation-harness registers its metrics (``@register_metric``): importing the module that
defines the rules registers them, in definition order, which is the order they are recorded in.

``claim_rule`` rows are card claims (``core/claims.yaml``); ``finding_rule`` rows are the study's
own findings, recorded with :func:`nvfp4study.core.ledger.add_finding`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .errors import LedgerError
from .ledger import Verdict


@dataclass(frozen=True)
class Row:
    """What a rule decided for one ledger row (the fields of :func:`nvfp4study.core.ledger.record`)."""

    measured: Any
    verdict: Verdict
    evidence: list[str | Path] = field(default_factory=list)
    note: str = ""
    checked_on: str | None = None
    sources: dict[str, str] | None = None
    #: a finding's claim text for this run, when it depends on the params (e.g. 07's repeat count);
    #: None: the text registered with the rule. A card claim's text is claims.yaml's, never a row's.
    claim: str | None = None

    @classmethod
    def not_run(cls, reason: str, *, evidence: list[str | Path] | None = None) -> Row:
        """The row :func:`nvfp4study.core.ledger.record_not_run` writes: ``note = "not run: <reason>"``."""
        return cls(None, Verdict.NOT_RUN, list(evidence or []), f"not run: {reason}")


@dataclass(frozen=True)
class Rule:
    """One registered rule: the row id it decides, for which measurements type, and how."""

    id: str
    kind: Literal["claim", "finding"]
    measurements: type
    fn: Callable[[Any], Row | None]
    claim: str = ""  # a finding's claim text (a card claim's is in claims.yaml)

    @property
    def stage(self) -> str:
        return self.measurements.STAGE


#: every registered rule by id, in registration order
RULES: dict[str, Rule] = {}


def _register(rule: Rule) -> Callable[[Any], Row | None]:
    if rule.id in RULES:
        raise LedgerError(f"two rules for {rule.id!r}: {RULES[rule.id].fn.__qualname__} and {rule.fn.__qualname__}")
    if not isinstance(getattr(rule.measurements, "STAGE", None), str):
        raise LedgerError(f"{rule.measurements.__name__} has no STAGE naming its notebook")
    RULES[rule.id] = rule
    return rule.fn


def claim_rule(claim_id: str, measurements: type) -> Callable[[Callable[[Any], Row]], Callable[[Any], Row]]:
    """Register ``fn(measurements) -> Row`` as the rule deciding card claim ``claim_id``."""
    def deco(fn: Callable[[Any], Row]) -> Callable[[Any], Row]:
        _register(Rule(claim_id, "claim", measurements, fn))
        return fn
    return deco


def finding_rule(finding_id: str, measurements: type, *, claim: str) -> Callable:
    """Register ``fn(measurements) -> Row | None`` for study finding ``finding_id`` (None: not
    recorded in this run, e.g. the round trip it reads did not run)."""
    def deco(fn: Callable[[Any], Row | None]) -> Callable[[Any], Row | None]:
        _register(Rule(finding_id, "finding", measurements, fn, claim))
        return fn
    return deco


def rules_for(measurements: type, kind: str | None = None) -> list[Rule]:
    """The rules registered for a measurements type (``kind``: only claims or only findings)."""
    return [r for r in RULES.values() if r.measurements is measurements and kind in (None, r.kind)]


def write_row(stage: Any, rule: Rule, row: Row) -> dict[str, Any]:
    """Write one decided row through the stage's ledger helpers; returns the ledger row."""
    kw: dict[str, Any] = dict(measured=row.measured, verdict=row.verdict, evidence=row.evidence,
                              note=row.note, checked_on=row.checked_on)
    if rule.kind == "finding":
        return stage.add_finding(rule.id, claim=row.claim or rule.claim, **kw)
    if row.claim is not None:
        raise LedgerError(f"claim rule {rule.fn.__qualname__} set a claim text for card claim {rule.id!r}")
    return stage.record(rule.id, sources=row.sources, **kw)


def record_rules(stage: Any, m: Any, *, kind: str | None = None,
                 ids: set[str] | None = None) -> list[dict[str, Any]]:
    """Run the rules registered for ``type(m)`` (only ``ids`` when given) and write their rows.

    Args:
        stage: a :class:`nvfp4study.core.stage.Stage` (``record`` / ``add_finding``).
        m: the stage's measurements, built once.
        kind: ``"claim"`` or ``"finding"`` to run only those.
        ids: row ids to run (others are left as they are).

    Returns:
        The ledger rows written, in registration order (a finding rule returning None writes none).
    """
    out = []
    for rule in rules_for(type(m), kind):
        if ids is not None and rule.id not in ids:
            continue
        row = rule.fn(m)
        if row is None:
            if rule.kind == "claim":
                raise LedgerError(f"claim rule {rule.fn.__qualname__} returned no row for {rule.id!r}")
            continue
        out.append(write_row(stage, rule, row))
    return out
