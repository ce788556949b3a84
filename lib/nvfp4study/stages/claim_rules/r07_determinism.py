"""Stage 07's claim rules: the three ``07_determinism`` claims of ``core/claims.yaml`` (speculation
off self-reproducible, speculation on not byte-identical, deterministic mode), one function per
ledger row.

Every rule reads :class:`DeterminismMeasurements`: per comparison, how many prompts have all their
pairs identical (``s07_determinism.identity_counts``), the deterministic spec-on decode tok/s and
the stage's determinism params. A comparison with no comparable prompt (every such request
failed) is "not run": with no data there is nothing to reproduce or contradict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ...core.claim_rules import Row, claim_rule
from ...core.ledger import Verdict

TOKS_TOL = (0.15, 0.30)  # deterministic mode's tok/s vs the card: within [0] agrees
NO_PAIR = "no comparable pair: all requests failed"


@dataclass(frozen=True)
class DeterminismMeasurements:
    """The determinism comparisons, as the stage-07 rules read them (the stage builds it once)."""

    STAGE: ClassVar[str] = "07_determinism"
    counts: dict[str, dict[str, Any]]  # comparison label -> its identity_counts row
    det_tok_s: float | None  # median decode tok/s of "det spec-on" (None when unknown)
    cards: dict[str, Any]  # claim id -> the card's value (claims.yaml)
    spec_depth: int  # determinism.spec_depth
    repeats: int  # determinism.repeats
    deterministic_mode: bool  # determinism.deterministic_mode
    evidence: list[Path] = field(default_factory=list)  # det-pairs / -identity / -throughput .json, raw files
    checked: str | None = None  # checked_on: "sglang <version>" (and the replayed run)


def no_pair(c: dict | None) -> str:
    """The not-run reason when a comparison (its identity_counts row, or None) has no comparable prompt."""
    if c is None:
        return "no comparable pair: no request of this comparison was recorded"
    return f"{NO_PAIR} ({c['not comparable (failed request)']} prompt(s) with a failed request)"


def _row(x: DeterminismMeasurements, measured: dict[str, Any], verdict: Verdict, note: str) -> Row:
    return Row(measured, verdict, x.evidence, note, x.checked)


@claim_rule("det.spec-off", DeterminismMeasurements)
def det_spec_off(x: DeterminismMeasurements) -> Row:
    """Reproduced when every greedy repeat without speculation equals the first, on every prompt."""
    off = x.counts.get("spec-off self-reproducibility")
    if not (off and off["prompts compared"]):
        return Row.not_run(no_pair(off))
    return _row(x, {"identical": off["identical prompts"], "n": off["prompts compared"], "repeats": x.repeats},
                Verdict.REPRODUCED if off["identical prompts"] == off["prompts compared"] else Verdict.CONTRADICTED,
                "every greedy repeat equal to the first, token by token")


@claim_rule("det.spec-on", DeterminismMeasurements)
def det_spec_on(x: DeterminismMeasurements) -> Row:
    """The claim tested is that speculation is not byte-identical: reproduced when some prompt's
    spec-on text differs from spec-off's, contradicted when all are identical (the card's count
    depends on its prompts)."""
    on = x.counts.get("spec-on vs spec-off")
    on_n = on["prompts compared"] if on else 0
    if not on_n:
        return Row.not_run(no_pair(on))
    card = x.cards["det.spec-on"]
    return _row(x, {"identical": on["identical prompts"], "n": on_n, "first_divergence": on["first divergence (min..max)"]},
                Verdict.CONTRADICTED if on["identical prompts"] == on_n else Verdict.REPRODUCED,
                f"NEXTN k={x.spec_depth} vs speculation off, repeat 0 of each. "
                f"The card's count ({card['identical']}/{card['n']}) depends "
                "on its prompts; the claim tested is that speculation is not byte-identical. Whether the "
                "differences are paraphrases was not judged automatically (texts in det-pairs.json).")


@claim_rule("det.deterministic-mode", DeterminismMeasurements)
def det_deterministic_mode(x: DeterminismMeasurements) -> Row:
    """Reproduced when deterministic spec-on matches deterministic spec-off on more prompts than
    plain spec-on matches spec-off (or on all) AND its decode tok/s is within :data:`TOKS_TOL`
    ``[0]`` of the card's; partly when one holds; contradicted when neither."""
    if not x.deterministic_mode:
        return Row.not_run("determinism.deterministic_mode is false")
    det = x.counts.get("det spec-on vs det spec-off")
    det_n = det["prompts compared"] if det else 0
    if not det_n:
        return Row.not_run(no_pair(det))
    on = x.counts.get("spec-on vs spec-off")
    on_n = on["prompts compared"] if on else 0
    card, tok = x.cards["det.deterministic-mode"], x.det_tok_s
    on_rate = on["identical prompts"] / on_n if on_n else None
    better = det["identical prompts"] == det_n or (on_rate is not None and det["identical prompts"] / det_n > on_rate)
    r = abs(tok - card["tok_s"]) / card["tok_s"] if tok else None
    tok_ok = r is not None and r <= TOKS_TOL[0]
    return _row(x, {"identical": det["identical prompts"], "n": det_n, "tok_s": None if tok is None else round(tok, 4),
                    "identical_vs_plain_spec_off": x.counts.get("det spec-on vs plain spec-off", {}).get("identical prompts")},
                Verdict.REPRODUCED if better and tok_ok else Verdict.PARTLY if (better or tok_ok) else Verdict.CONTRADICTED,
                "deterministic spec-on vs deterministic spec-off; 'reproduced' needs more identical prompts "
                "than without the mode (or all identical) and decode tok/s within 15 % of the card "
                "(hardware-dependent)" + ("" if on_n else "; plain spec-on had no comparable pair"))
