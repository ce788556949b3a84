"""Pairs of SGLang MoE paths read by two blind readers, with a third deciding where they disagree (issue 36).

A single blind reading has its own error rate: readers of different samples split on whole classes (a
runner core built only under ``--enable-lora``, compiled routing ops). From the eleventh clamp sample and
the sixth parameter sample on, each pair is read by two readers independently; where their verdicts
differ, a third blind reader, given both readings unnamed, decides (``docs/blind-readings/A.md``). The
pair's verdict (what the audit is compared with) is the readers' common verdict or the adjudicator's, and
how often the two readers agreed with each other is a measured error rate of the reference itself.
:mod:`nvfp4study.sglang.agreement` loads the readings and calls these checks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from ..codeeval.served_analysis import wilson_interval
from ..core.errors import HandReadingsError


def _rate(k: int, n: int) -> dict[str, Any]:
    """``{agree, n, rate, wilson95}`` of k agreements in n (rate None and no interval when n is 0); the one
    form every agreement figure of :mod:`nvfp4study.sglang.agreement` takes."""
    lo, hi = wilson_interval(k, n)
    return {"agree": k, "n": n, "rate": k / n if n else None, "wilson95": [lo, hi] if n else None}


def _two(double: Any, where: Any) -> list[Any]:
    if not isinstance(double, list) or len(double) != 2 or not all(isinstance(x, dict) for x in double):
        raise HandReadingsError(f"{where}: `double` must list the two readers' readings")
    return double


def _named(value: Any, what: str) -> str:
    """``value`` if it is a non-empty string (a reader's code name, a verdict), else a named error: a
    reader ``null`` or ``[c]`` must not become the reader ``"None"`` or ``"['c']"``."""
    if not isinstance(value, str) or not value:
        raise HandReadingsError(f"{what} must be a non-empty string, got {value!r}")
    return value


def _verdict_of(x: dict[str, Any]) -> tuple[str, str]:
    try:
        return _named(x["reader"], "a double reading's reader"), _named(x["verdict"], "a double reading's verdict")
    except KeyError as exc:
        raise HandReadingsError(f"a double reading lacks {exc}") from exc


def double_reading(where: str, verdict: str, readings: list[tuple[str, str]],
                   adjudication: Any) -> tuple[tuple[tuple[str, str], ...], str]:
    """Check a pair read by two blind readers and return ``((reader, verdict), (reader, verdict))`` and
    the adjudicator (``""`` when the readers agreed).

    The protocol (``docs/blind-readings/A.md``): two readers read the pair independently; when their
    verdicts agree, that is the pair's verdict; when not, a third blind reader, given both readings
    unnamed, decides (``adjudication: {reader, verdict, chose, deciding, reason}``) and that is the
    verdict. ``verdict`` is the stored verdict the audit is compared with.

    Raises:
        HandReadingsError: not two readings from two readers; agreeing readers with a stored verdict
            not theirs, or with an adjudication (even an empty one); disagreeing readers without an
            adjudication, with a stored verdict not the adjudicator's, or decided by one of themselves.
    """
    pair = tuple(readings)
    if len(pair) != 2 or pair[0][0] == pair[1][0]:
        raise HandReadingsError(f"{where}: a double reading needs two readings by two readers, got {pair}")
    if pair[0][1] == pair[1][1]:
        if verdict != pair[0][1] or adjudication is not None:
            raise HandReadingsError(f"{where}: both readers read {pair[0][1]}: the verdict must be theirs "
                                    f"(stored {verdict!r}) and nothing adjudicated")
        return pair, ""
    if not isinstance(adjudication, dict) or adjudication.get("verdict") != verdict \
            or not isinstance(adjudication.get("reader"), str) or not adjudication["reader"]:
        raise HandReadingsError(f"{where}: the readers disagree ({pair[0][1]} / {pair[1][1]}): the verdict must be "
                                f"an adjudicator's (adjudication: {{reader, verdict}}), stored {verdict!r}")
    if adjudication["reader"] in (pair[0][0], pair[1][0]):
        raise HandReadingsError(f"{where}: the adjudicator {adjudication['reader']} is one of the pair's readers: "
                                "the decision must be a third reader's")
    return pair, adjudication["reader"]


def between_readers(readings: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """Per sample, how often the two blind readers of a pair read twice agreed with each other before
    adjudication: ``{sample: {agree, n, rate, wilson95}}`` over the readings with :attr:`Reading.readers`
    (samples read once are left out). A measured error rate of the reference itself: where the readers
    disagree, at least one of them is wrong."""
    n, k = Counter(), Counter()
    for rd in readings:
        if rd.readers:
            n[rd.sample] += 1
            k[rd.sample] += rd.readers[0][1] == rd.readers[1][1]
    return {s: _rate(k[s], n[s]) for s in sorted(n)}


def readers_of(readings: Iterable[Any]) -> set[str]:
    """Every blind reader behind ``readings``: the reader of a pair read once; both readers and the
    adjudicator (if any) of a pair read twice."""
    out: set[str] = set()
    for rd in readings:
        out |= {r for r, _ in rd.readers} | ({rd.adjudicator} - {""}) if rd.readers else {rd.reader}
    return out


def readers_clause(x: dict[str, Any] | None) -> str:
    """`` (each pair read by two blind readers, who agreed with each other on k of n before
    adjudication)``, or ``""`` for a sample read once."""
    return (f" (each pair read by two blind readers, who agreed with each other on {x['agree']} of {x['n']} "
            f"before adjudication)") if x and x["n"] else ""


__all__ = ["between_readers", "double_reading", "readers_clause", "readers_of"]
