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

from ...core.claim_rules import Row, claim_rule, finding_rule
from ...core.ledger import Verdict

TOKS_TOL = (0.15, 0.30)  # deterministic mode's tok/s vs the card: within [0] agrees
NO_PAIR = "no comparable pair: all requests failed"


@dataclass(frozen=True)
class IdentityCount:
    """One comparison's identity count, typed: a row of ``s07_determinism.identity_counts``, whose
    display labels are read here only (:meth:`from_row`)."""

    identical: int  # prompts all of whose pairs are identical
    compared: int  # prompts compared (every pair comparable)
    not_comparable: int  # prompts with a failed request
    first_divergence: str  # "min..max" token index of the first difference; "-" when none differs

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> IdentityCount:
        """The typed count of one ``identity_counts`` row."""
        return cls(row["identical prompts"], row["prompts compared"], row["not comparable (failed request)"],
                   row["first divergence (min..max)"])


def counts_by_comparison(rows: list[dict[str, Any]]) -> dict[str, IdentityCount]:
    """``{comparison label: IdentityCount}`` of ``identity_counts`` rows."""
    return {r["comparison"]: IdentityCount.from_row(r) for r in rows}


@dataclass(frozen=True)
class DeterminismMeasurements:
    """The determinism comparisons, as the stage-07 rules read them (the stage builds it once)."""

    STAGE: ClassVar[str] = "07_determinism"
    counts: dict[str, IdentityCount]  # comparison label -> its count (counts_by_comparison)
    det_tok_s: float | None  # median decode tok/s of "det spec-on" (None when unknown)
    cards: dict[str, Any]  # claim id -> the card's value (claims.yaml)
    spec_depth: int  # determinism.spec_depth
    repeats: int  # determinism.repeats
    deterministic_mode: bool  # determinism.deterministic_mode
    evidence: list[Path] = field(default_factory=list)  # det-pairs / -identity / -throughput .json, raw files
    checked: str | None = None  # checked_on: "sglang <version>" (and the replayed run)


def no_pair(c: IdentityCount | None) -> str:
    """The not-run reason when a comparison (its count, or None) has no comparable prompt."""
    if c is None:
        return "no comparable pair: no request of this comparison was recorded"
    return f"{NO_PAIR} ({c.not_comparable} prompt(s) with a failed request)"


def _row(x: DeterminismMeasurements, measured: dict[str, Any], verdict: Verdict, note: str) -> Row:
    return Row(measured, verdict, x.evidence, note, x.checked)


@claim_rule("det.spec-off", DeterminismMeasurements)
def det_spec_off(x: DeterminismMeasurements) -> Row:
    """Reproduced when every greedy repeat without speculation equals the first, on every prompt."""
    off = x.counts.get("spec-off self-reproducibility")
    if not (off and off.compared):
        return Row.not_run(no_pair(off))
    return _row(x, {"identical": off.identical, "n": off.compared, "repeats": x.repeats},
                Verdict.REPRODUCED if off.identical == off.compared else Verdict.CONTRADICTED,
                "every greedy repeat equal to the first, token by token")


@claim_rule("det.spec-on", DeterminismMeasurements)
def det_spec_on(x: DeterminismMeasurements) -> Row:
    """The claim tested is that speculation is not byte-identical: reproduced when some prompt's
    spec-on text differs from spec-off's, contradicted when all are identical (the card's count
    depends on its prompts)."""
    on = x.counts.get("spec-on vs spec-off")
    on_n = on.compared if on else 0
    if not on_n:
        return Row.not_run(no_pair(on))
    card = x.cards["det.spec-on"]
    return _row(x, {"identical": on.identical, "n": on_n, "first_divergence": on.first_divergence},
                Verdict.CONTRADICTED if on.identical == on_n else Verdict.REPRODUCED,
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
    det_n = det.compared if det else 0
    if not det_n:
        return Row.not_run(no_pair(det))
    on = x.counts.get("spec-on vs spec-off")
    on_n = on.compared if on else 0
    card, tok = x.cards["det.deterministic-mode"], x.det_tok_s
    on_rate = on.identical / on_n if on_n else None
    better = det.identical == det_n or (on_rate is not None and det.identical / det_n > on_rate)
    r = abs(tok - card["tok_s"]) / card["tok_s"] if tok else None
    tok_ok = r is not None and r <= TOKS_TOL[0]
    return _row(x, {"identical": det.identical, "n": det_n, "tok_s": None if tok is None else round(tok, 4),
                    "identical_vs_plain_spec_off": getattr(x.counts.get("det spec-on vs plain spec-off"), "identical", None)},
                Verdict.REPRODUCED if better and tok_ok else Verdict.PARTLY if (better or tok_ok) else Verdict.CONTRADICTED,
                "deterministic spec-on vs deterministic spec-off; 'reproduced' needs more identical prompts "
                "than without the mode (or all identical) and decode tok/s within 15 % of the card "
                "(hardware-dependent)" + ("" if on_n else "; plain spec-on had no comparable pair"))


# --- the CPU engine: the study's findings on SGLang's real engine -----------------------------------
@dataclass(frozen=True)
class CpuDeterminismMeasurements:
    """07 on the CPU engine, as its findings read it (the stage builds it once): the identity
    counts of the stand-in's greedy outputs, SGLang's refusals of deterministic mode and every
    launch of the run (``data/serve-lifecycle.jsonl``), judged by the stage's pure
    ``teardown_result`` / ``patched_modes_result``."""

    STAGE: ClassVar[str] = "07_determinism"
    counts: dict[str, IdentityCount]  # comparison label -> its count (counts_by_comparison)
    repeats: int  # determinism.repeats
    spec_depth: int  # determinism.spec_depth
    deterministic_mode: bool  # determinism.deterministic_mode
    evidence: list[Path]  # det-pairs / -identity .json and the raw files of the launches that served
    refusals: dict[str, str]  # configuration name -> SGLang's refusal message
    refusal_evidence: list[Path]  # the refused launches' records
    teardown: dict[str, Any]  # teardown_result: {"measured", "verdict", "note"}
    patched: dict[str, Any]  # patched_modes_result: {"measured", "verdict", "note"}
    lifecycle_evidence: list[Path]  # data/serve-lifecycle.jsonl
    checked: str  # the engine's summary
    standin_note: str  # what the engine served, in words


def _identity(x: CpuDeterminismMeasurements, label: str, claim: str) -> Row:
    c = x.counts.get(label)
    if not c or not c.compared:
        return Row(None, Verdict.NOT_RUN, [], no_pair(c), claim=claim)
    same = c.identical == c.compared
    return Row({"identical": c.identical, "n": c.compared,
                "first_divergence": c.first_divergence},
               Verdict.REPRODUCED if same else Verdict.CONTRADICTED, x.evidence,
               f"output token ids compared, lengths first; {x.standin_note}", x.checked, claim=claim)


@finding_rule("det.cpu-spec-off-self", CpuDeterminismMeasurements,
              claim="Greedy output without speculation is token-for-token identical across repeats on SGLang's "
                    "real engine.")
def cpu_spec_off_self(x: CpuDeterminismMeasurements) -> Row:
    """Reproduced when every repeat equals the first on every prompt; the claim names the repeats."""
    return _identity(x, "spec-off self-reproducibility",
                     f"Greedy output without speculation is token-for-token identical across {x.repeats} repeats "
                     "on SGLang's real engine.")


@finding_rule("det.cpu-spec-on-vs-off", CpuDeterminismMeasurements,
              claim="Greedy output with NEXTN speculation is token-for-token identical to greedy output without "
                    "speculation on SGLang's real engine (fp32 on the CPU).")
def cpu_spec_on_vs_off(x: CpuDeterminismMeasurements) -> Row:
    """Reproduced when speculation changes no greedy output; the claim names the depth."""
    return _identity(x, "spec-on vs spec-off",
                     f"Greedy output with NEXTN k={x.spec_depth} is token-for-token identical to greedy output "
                     "without speculation on SGLang's real engine (fp32 on the CPU).")


@finding_rule("det.cpu-deterministic-mode", CpuDeterminismMeasurements,
              claim="--enable-deterministic-inference on SGLang's real engine on this CPU.")
def cpu_deterministic_mode(x: CpuDeterminismMeasurements) -> Row | None:
    """Not run, with SGLang's own refusal (the CPU engine's attention backend); none when the mode is off."""
    if not x.deterministic_mode:
        return None
    msg = "; ".join(f"{k}: {v}" for k, v in x.refusals.items()) or "SGLang did not refuse it (see the det rows)"
    return Row(None, Verdict.NOT_RUN, x.refusal_evidence,
               f"needs an NVFP4-capable GPU (on this CPU SGLang refuses it with the CPU engine's "
               f"attention backend: {msg})")


@finding_rule("serve.cpu-engine-teardown", CpuDeterminismMeasurements,
              claim="Every SGLang launch of the run (04-07), refused ones included, leaves 0 processes after "
                    "the study stops it.")
def cpu_engine_teardown(x: CpuDeterminismMeasurements) -> Row:
    """The stage's ``teardown_result`` over every launch of the run."""
    t = x.teardown
    return Row(t["measured"], t["verdict"], x.lifecycle_evidence, t["note"], x.checked)


@finding_rule("serve.cpu-engine-patched-modes", CpuDeterminismMeasurements,
              claim="The study's SGLang install patched to each clamp mode the params name imports and serves "
                    "on the real engine.")
def cpu_engine_patched_modes(x: CpuDeterminismMeasurements) -> Row:
    """The stage's ``patched_modes_result`` over every launch of the run."""
    t = x.patched
    return Row(t["measured"], t["verdict"], x.lifecycle_evidence, t["note"], x.checked)
