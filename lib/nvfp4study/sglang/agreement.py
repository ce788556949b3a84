"""How far the clamp audit's verdicts for derived paths agree with a blind hand reading.

The audit (:mod:`nvfp4study.sglang.audit`) judges ~100 paths per release that it found by
following SGLang's dispatch and that no one catalogued by hand (``catalogued`` False). Five
readers read a random sample of them by hand, blind to the audit
(``data/hand_readings.yaml``: how the sample was drawn and read, the verdict definitions). This
module compares the two and decides which derived verdicts may be counted:

- :func:`compare`: overall agreement k/n with a Wilson 95 % interval, per path kind
  (:func:`~nvfp4study.sglang.path_keys.kind`), per release, and the hand x audit confusion table. A path the audit did
  not list counts as a disagreement (the audit's verdicts include ``UNUSABLE``, so every hand
  verdict can be matched).
- :func:`counted_verdicts`: the trust rule (:data:`RULE`) applied to an audit's rows: each row is
  ``counted`` (catalogued, hand-read, or of a kind that agrees well enough) or a ``machine``
  reading, counted separately.

Audit rows are :class:`~nvfp4study.sglang.audit.PathResult` or their JSON form (the rows of
``data/sglang_audit_versions.json``); both carry ``path``, ``verdict``, ``sglang_version`` and
``catalogued``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..core.errors import HandReadingsError
from ..core.files import write_json
from ..core.ledger import Verdict
from . import path_keys
from .double_reading import (
    _named,
    _rate,
    _two,
    _verdict_of,
    between_readers,
    double_reading,
    readers_clause,
    readers_of,
)

#: a derived kind's verdicts are counted when its sampled agreement is at least this ...
MIN_AGREEMENT = 0.95
#: ... over at least this many hand readings of the kind
MIN_READINGS = 3
RULE = (f"A derived path's verdict is counted only when the path was hand-read (the hand verdict "
        f"is used) or its path kind agreed with the hand reading on at least {MIN_AGREEMENT * 100:.0f} % of "
        f"at least {MIN_READINGS} sampled readings; the others are the audit's machine reading, "
        f"counted separately. Catalogued (hand-catalogued) paths are always counted.")
#: the verdicts in the order tables show them (the audit's ClampVerdict values, hand and audit alike)
ORDER = ["EXACT", "APPROX", "DROPPED", "REFUSED", "UNUSABLE", "UNDECIDED", "ABSENT"]
#: the audit's column for a hand-read path that is not among its rows of that release
NOT_LISTED = "NOT LISTED"
#: the sample no one who changed the audit has seen (data/hand_readings.yaml header): its
#: agreement is the held-out measurement of the latest change; the earlier samples guided it
HELD_OUT = "fifteenth"
#: the ``method`` keys of the samples, in the order they were drawn
SAMPLE_KEYS = ("sample", "second_sample", "third_sample", "fourth_sample", "fifth_sample", "sixth_sample",
               "seventh_sample", "eighth_sample", "ninth_sample",
               "tenth_sample", "eleventh_sample", "twelfth_sample", "thirteenth_sample",
               "fourteenth_sample", "fifteenth_sample")


@dataclass(frozen=True)
class Reading:
    """One hand reading: ``deciding`` are ``file:line what`` strings relative to ``sglang/srt``."""

    release: str
    path: str
    verdict: str
    device: str
    deciding: tuple[str, ...]
    reason: str
    reader: str
    sample: str = "first"  # "second" ... "fifteenth" (:data:`HELD_OUT`; data/hand_readings.yaml header)
    #: why the reading is left out of the comparison (added by the study, never by the reader: it
    #: answers another question than the audit's row); "" when it is compared
    not_compared: str = ""
    #: (reader, verdict) of each of two blind readers where the pair was read twice (:func:`double_reading`);
    #: ``verdict`` is then theirs when they agree, else :attr:`adjudicator`'s
    readers: tuple[tuple[str, str], ...] = ()
    adjudicator: str = ""  # the blind reader who decided between two disagreeing readings


@cache
def hand_readings() -> tuple[dict[str, Any], tuple[Reading, ...]]:
    """``(method, readings)`` from ``data/hand_readings.yaml`` (method: the sample's seed,
    releases and pairs, and the verdict definitions under ``"verdicts"``).

    Raises:
        HandReadingsError: a reading lacks a field, repeats a (release, path) or has an
            undefined verdict.
    """
    return clamp_readings(yaml.safe_load(resources.files(__package__).joinpath("data/hand_readings.yaml").read_text()))


def clamp_readings(doc: dict[str, Any]) -> tuple[dict[str, Any], tuple[Reading, ...]]:
    """:func:`hand_readings` of a parsed document (``{"method", "verdicts", "readings"}``).

    Raises:
        HandReadingsError: as :func:`hand_readings`, and a pair read twice whose verdicts do not
            follow :func:`double_reading`.
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("readings") or [], list):
        raise HandReadingsError(f"hand readings: expected a mapping with a `readings` list, got {type(doc).__name__}")
    verdicts = doc.get("verdicts") or {}
    out, seen = [], set()
    for i, r in enumerate(doc.get("readings") or []):
        try:
            rd = Reading(str(r["release"]), r["path"], r["verdict"], r["device"], tuple(r["deciding"]),
                         r["reason"], r["reader"], str(r.get("sample", "first")), str(r.get("not_compared") or ""))
        except (KeyError, TypeError) as exc:
            raise HandReadingsError(f"hand reading #{i} lacks {exc}") from exc
        if not all(isinstance(x, str) and x for x in (rd.path, rd.verdict, rd.reader)):
            raise HandReadingsError(f"hand reading #{i}: path, verdict and reader must be non-empty strings")
        if "double" in r:
            readers, adj = double_reading(f"hand reading {rd.release} {rd.path}", rd.verdict,
                                          [_verdict_of(x) for x in _two(r["double"], f"hand reading {rd.release} {rd.path}")], r.get("adjudication"))
            rd = replace(rd, readers=readers, adjudicator=adj)
        if rd.verdict not in verdicts:
            raise HandReadingsError(f"hand reading {rd.release} {rd.path}: verdict {rd.verdict!r} is not defined")
        if (rd.release, rd.path) in seen:
            raise HandReadingsError(f"hand reading {rd.release} {rd.path} appears twice")
        seen.add((rd.release, rd.path))
        out.append(rd)
    return {**doc.get("method", {}), "verdicts": verdicts}, tuple(out)


def _row(r: Any) -> dict[str, Any]:
    d = r.as_json() if hasattr(r, "as_json") else r
    return {"path": d["path"], "verdict": d["verdict"], "release": d["sglang_version"],
            "catalogued": d.get("catalogued", True)}


def pct(x: float) -> str:
    """A fraction as the project writes percentages: ``0.4 -> "40.0 %"``."""
    return f"{x * 100:.1f} %"


@dataclass
class Agreement:
    """The comparison (:func:`compare`). Rates are fractions in [0, 1]; ``wilson95`` is the
    Wilson 95 % interval ``[low, high]``; ``pairs`` has one row per reading compared."""

    overall: dict[str, Any]
    by_kind: dict[str, dict[str, Any]]
    by_release: dict[str, dict[str, Any]]
    confusion: dict[str, dict[str, int]]   # hand verdict -> audit verdict -> readings
    pairs: list[dict[str, Any]]
    not_audited: list[str] = field(default_factory=list)  # "release path" of readings left out
    not_compared: list[str] = field(default_factory=list)  # "release path: why" (Reading.not_compared)
    trusted_kinds: list[str] = field(default_factory=list)
    by_sample: dict[str, dict[str, Any]] = field(default_factory=dict)  # "first" ... "fifteenth"
    #: per sample read twice, the two blind readers' agreement with each other (:func:`between_readers`)
    between_readers: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"overall": self.overall, "by_kind": self.by_kind, "by_release": self.by_release,
                "confusion": self.confusion, "trusted_kinds": self.trusted_kinds,
                "not_audited": self.not_audited, "not_compared": self.not_compared, "rule": RULE, "by_sample": self.by_sample,
                "between_readers": self.between_readers, "pairs": self.pairs}

    def sentence(self) -> str:
        """E.g. "18 of 45 sampled derived paths (40.0 %, Wilson 95 % 27.0-54.5 %) ..."."""
        o = self.overall
        if not o["n"]:
            return "No hand reading falls on an audited release: agreement not measured."
        lo, hi = o["wilson95"]
        kinds = ", ".join(f"`{k}`" for k in self.trusted_kinds) or "none"
        held = self.by_sample.get(HELD_OUT)
        held_s = ((f" On the {HELD_OUT} sample alone, drawn and read blind while the audit was being changed "
                   f"and never seen by whoever changed it (a held-out measurement of that change), {held['agree']} of "
                   f"{held['n']} ({pct(held['rate'])}, Wilson 95 % {pct(held['wilson95'][0])} to "
                   f"{pct(held['wilson95'][1])})" + readers_clause(self.between_readers.get(HELD_OUT)) + ".")
                  if held and held["n"] else "")
        return (f"The audit's verdict agreed with a blind hand reading on {o['agree']} of {o['n']} "
                f"sampled derived paths ({pct(o['rate'])}, Wilson 95 % {pct(lo)} to {pct(hi)}); path "
                f"kinds trusted (>= {MIN_AGREEMENT * 100:.0f} % over >= {MIN_READINGS} readings): {kinds}."
                + held_s)


def compare(rows: list[Any], readings: tuple[Reading, ...] | None = None) -> Agreement:
    """Compare audit ``rows`` (any releases) with the hand ``readings`` (default: the stored ones).

    A reading of a release the rows do not cover is left out (listed in ``not_audited``), as is one
    marked :attr:`Reading.not_compared` (listed in ``not_compared`` with why); on a covered release a
    path the rows lack is compared as :data:`NOT_LISTED` (a disagreement).
    """
    readings = hand_readings()[1] if readings is None else readings
    audit = {(x["release"], x["path"]): x["verdict"] for x in map(_row, rows)}
    covered = {rel for rel, _ in audit}
    pairs, left, apart, compared = [], [], [], []
    for rd in readings:
        if rd.not_compared:
            apart.append(f"{rd.release} {rd.path}: {rd.not_compared}")
            continue
        if rd.release not in covered:
            left.append(f"{rd.release} {rd.path}")
            continue
        got = audit.get((rd.release, rd.path), NOT_LISTED)
        pairs.append({"release": rd.release, "path": rd.path, "kind": path_keys.kind(rd.path),
                      "hand": rd.verdict, "audit": got, "agree": got == rd.verdict, "reader": rd.reader,
                      "sample": rd.sample, "readers": [list(x) for x in rd.readers], "adjudicator": rd.adjudicator})
        compared.append(rd)

    def group(key: str) -> dict[str, dict[str, Any]]:
        n, k = Counter(p[key] for p in pairs), Counter(p[key] for p in pairs if p["agree"])
        return {g: _rate(k[g], n[g]) for g in sorted(n)}

    by_kind = group("kind")
    confusion: dict[str, dict[str, int]] = {}
    for p in pairs:
        row = confusion.setdefault(p["hand"], {})
        row[p["audit"]] = row.get(p["audit"], 0) + 1
    trusted = [g for g, x in by_kind.items() if x["n"] >= MIN_READINGS and x["rate"] >= MIN_AGREEMENT]
    return Agreement(_rate(sum(p["agree"] for p in pairs), len(pairs)), by_kind, group("release"),
                     confusion, pairs, left, apart, trusted, group("sample"), between_readers(compared))


def counted_verdicts(rows: list[Any], agreement: Agreement,
                     readings: tuple[Reading, ...] | None = None) -> list[dict[str, Any]]:
    """Each audit row with the verdict that may be counted (:data:`RULE`): ``{"release", "path",
    "verdict", "source"}``, source ``catalogued`` / ``hand`` (the hand verdict replaces the
    audit's) / ``trusted kind`` / ``machine`` (the audit's reading, not counted with the others)."""
    readings = hand_readings()[1] if readings is None else readings
    hand = {(r.release, r.path): r.verdict for r in readings if not r.not_compared}
    trusted = set(agreement.trusted_kinds)
    out = []
    for x in map(_row, rows):
        key = (x["release"], x["path"])
        if x["catalogued"]:
            src, v = "catalogued", x["verdict"]
        elif key in hand:
            src, v = "hand", hand[key]
        else:
            src, v = ("trusted kind" if path_keys.kind(x["path"]) in trusted else "machine"), x["verdict"]
        out.append({"release": x["release"], "path": x["path"], "verdict": v, "source": src})
    return out


def release_counts(counted: list[dict[str, Any]], derived_only: bool = True) -> dict[str, dict[str, Any]]:
    """Per release: ``{"counted": {verdict: paths}, "machine reading": {verdict: paths}}`` from
    :func:`counted_verdicts` rows (derived paths only unless ``derived_only`` is False)."""
    out: dict[str, dict[str, Any]] = {}
    for c in counted:
        if derived_only and c["source"] == "catalogued":
            continue
        part = "machine reading" if c["source"] == "machine" else "counted"
        d = out.setdefault(c["release"], {"counted": {}, "machine reading": {}})[part]
        d[c["verdict"]] = d.get(c["verdict"], 0) + 1
    return out


def stage_counts(main_rows: list[Any], agreement: Agreement, version: str,
                 readings: tuple[Reading, ...] | None = None) -> dict[str, Any]:
    """The headline's counts for the stage's own audit (``data/sglang_audit.json``, SGLang
    ``version``): paths whose counted verdict is DROPPED (catalogued / hand-read derived /
    trusted-kind derived) and the derived paths the machine reading alone calls DROPPED."""
    c = counted_verdicts(main_rows, agreement, readings)
    drop = Counter(x["source"] for x in c if x["verdict"] == "DROPPED")
    src = Counter(x["source"] for x in c)
    return {"sglang": version, "paths": len(c), "derived": len(c) - src["catalogued"],
            "hand_read": src["hand"], "trusted_kind": src["trusted kind"], "machine": src["machine"],
            "dropped_catalogued": drop["catalogued"], "dropped_hand": drop["hand"],
            "dropped_trusted_kind": drop["trusted kind"], "dropped_machine": drop["machine"],
            "dropped_counted": drop["catalogued"] + drop["hand"] + drop["trusted kind"]}


def ledger_measured(agreement: Agreement, counted: list[dict[str, Any]], stage: dict[str, Any]) -> dict[str, Any]:
    """The ``finding.audit-agreement`` row's ``measured``: overall (agree, n, rate, wilson95), per
    kind and release ``{"agree", "n"}``, the trusted kinds, the confusion table, the derived
    paths' per-release counts (:func:`release_counts`) and the stage's counts (:func:`stage_counts`)."""
    def short(d: dict[str, dict[str, Any]]) -> dict[str, dict[str, int]]:
        return {k: {"agree": x["agree"], "n": x["n"]} for k, x in d.items()}

    return {"overall": agreement.overall, "by_kind": short(agreement.by_kind),
            "by_release": short(agreement.by_release), "trusted_kinds": agreement.trusted_kinds,
            "confusion_hand_x_audit": agreement.confusion, "derived_counts": release_counts(counted),
            "stage_counts": stage}


def write(out: Path, rows: list[Any]) -> dict[str, Any]:
    """Compare ``rows`` with the stored readings and write ``out`` (JSON: the comparison, each
    row's counted verdict and the per-release counts). Returns ``{"sentence", "rule",
    "agreement", "counted"}`` plus the DataFrames of :func:`tables`."""
    a = compare(rows)
    counted = counted_verdicts(rows, a)
    write_json(out, {**a.as_json(), "derived_counts": release_counts(counted), "counted": counted})
    return {"sentence": a.sentence(), "rule": RULE, "agreement": a, "counted": counted, **tables(a, counted)}


#: the claim of ``finding.audit-agreement`` (its rule: stages/claim_rules/r03_sglang.py)
CLAIM = (f"The audit's verdicts for the derived MoE paths (found by following SGLang's dispatch, not "
         f"catalogued) agree with a blind hand reading of a random sample of them on at least "
         f"{MIN_AGREEMENT * 100:.0f} % of it.")


def finding(res: dict[str, Any], main_rows: list[Any], version: str) -> dict[str, Any]:
    """The ``finding.audit-agreement`` row's fields (measured, verdict as a
    :class:`~nvfp4study.core.ledger.Verdict`, checked_on, note) from :func:`write`'s result and
    the stage's own audit rows."""
    a, o = res["agreement"], res["agreement"].overall
    method = hand_readings()[0]
    samples = [method[k] for k in SAMPLE_KEYS if method.get(k)]
    drawn = " and ".join((f"{x['pooled']} pooled over the releases" if "pooled" in x else
                          f"{x['per_release']} per release") + f", seed {x['seed']}" for x in samples)
    readers = len(readers_of(hand_readings()[1]))
    return dict(
        measured=ledger_measured(a, res["counted"], stage_counts(main_rows, a, version)),
        verdict=(Verdict.NOT_RUN if not o["n"] else Verdict.REPRODUCED if o["rate"] >= MIN_AGREEMENT
                 else Verdict.PARTLY if a.trusted_kinds else Verdict.CONTRADICTED),
        checked_on=(f"{o['n']} blind hand readings ({readers} readers; {len(samples)} samples: {drawn}; "
                    f"lib/nvfp4study/sglang/data/hand_readings.yaml) against the audit of sglang "
                    f"{', '.join(sorted(a.by_release))}"),
        note=res["sentence"] + " " + RULE
             + (f" Left out (release not audited): {', '.join(a.not_audited)}." if a.not_audited else "")
             + (f" Not compared ({len(a.not_compared)} readings that answer another question, kept as read): "
                f"{'; '.join(a.not_compared)}." if a.not_compared else ""))


def tables(agreement: Agreement, counted: list[dict[str, Any]]) -> dict[str, Any]:
    """pandas DataFrames for the notebook: ``by_kind`` (kind, agree, n, rate, Wilson 95 %,
    counted?), ``confusion`` (hand verdict rows x audit verdict columns, readings) and
    ``per_release`` (release x verdict: counted derived paths, and machine readings apart)."""
    import pandas as pd

    trusted = set(agreement.trusted_kinds)
    kinds = pd.DataFrame([{"kind": k, "agree": x["agree"], "readings": x["n"], "agreement": pct(x["rate"]),
                           "Wilson 95 %": f"{pct(x['wilson95'][0])} to {pct(x['wilson95'][1])}",
                           "verdicts counted": k in trusted} for k, x in agreement.by_kind.items()])
    hand = [v for v in ORDER if v in agreement.confusion]
    got = [v for v in [*ORDER, NOT_LISTED] if any(v in x for x in agreement.confusion.values())]
    conf = pd.DataFrame([[agreement.confusion[h].get(a, 0) for a in got] for h in hand],
                        index=pd.Index(hand, name="hand"), columns=pd.Index(got, name="audit"))
    per = []
    for rel, parts in release_counts(counted).items():
        for part, label in (("counted", "counted (hand-read or trusted kind)"), ("machine reading", "machine reading")):
            per.append({"sglang": rel, "derived paths": label, **{v: parts[part].get(v, 0) for v in ORDER}})
    return {"by_kind": kinds, "confusion": conf, "per_release": pd.DataFrame(per)}


# --- the other parameters of Ling's MoE (issue 36) ----------------------------------------------
#: the file of blind hand readings of the parameters other than the clamp (added by the readers,
#: never by whoever changes the audit): ``method:`` (blind, seeds, readers) and ``readings:``, each
#: ``{release, path, device, readings: {param: {verdict, deciding: [file:line what], reason}}, reader}``
PARAM_READINGS = "data/param_hand_readings.yaml"
#: the parameter sample no one who changed the parameter audit has seen (the file's header): drawn
#: after the audit's last change, its agreement is the held-out measurement; the first guided changes
PARAM_HELD_OUT = "tenth"


def param_hand_readings(path: Path | None = None) -> tuple[dict[str, Any], dict[str, tuple[Reading, ...]]]:
    """``(method, {parameter: readings})`` from :data:`PARAM_READINGS` (or ``path``); ``({}, {})``
    when the file is absent or empty (agreement not run). Each reading of one parameter is a
    :class:`Reading` (``sample``: the entry's ``sample``, ``"first"`` when it has none;
    :data:`PARAM_HELD_OUT`).

    Raises:
        HandReadingsError: an entry lacks a field, names a parameter the audit does not follow,
            gives a verdict its kind does not have (:func:`~nvfp4study.sglang.moe_params.verdicts`),
            or repeats a (release, path, parameter).
    """
    from . import moe_params

    src = resources.files(__package__).joinpath(PARAM_READINGS) if path is None else Path(path)
    if not src.is_file():
        return {}, {}
    doc = yaml.safe_load(src.read_text()) or {}
    entries = doc.get("readings") if isinstance(doc, dict) else doc
    out: dict[str, list[Reading]] = {}
    seen = set()
    for i, e in enumerate(entries or []):
        try:
            release, p, device, reader = str(e["release"]), e["path"], e["device"], e["reader"]
            per = e["readings"].items()
        except (KeyError, TypeError, AttributeError) as exc:
            raise HandReadingsError(f"parameter hand reading #{i} lacks {exc}") from exc
        for name, r in per:
            if name not in moe_params.names():
                raise HandReadingsError(f"parameter hand reading #{i}: {name!r} is not a followed parameter")
            try:
                rd = Reading(release, p, r["verdict"], device, tuple(r["deciding"]), r["reason"], reader,
                             str(e.get("sample", "first")))
            except (KeyError, TypeError) as exc:
                raise HandReadingsError(f"parameter hand reading #{i} ({name}) lacks {exc}") from exc
            if "double" in e:
                rd = _param_double(rd, name, e)
            if rd.verdict not in moe_params.verdicts(name):
                raise HandReadingsError(f"parameter hand reading {release} {p} {name}: verdict {rd.verdict!r} "
                                        f"is not one of {', '.join(moe_params.verdicts(name))}")
            if (release, p, name) in seen:
                raise HandReadingsError(f"parameter hand reading {release} {p} {name} appears twice")
            seen.add((release, p, name))
            out.setdefault(name, []).append(rd)
    method = doc.get("method", {}) if isinstance(doc, dict) else {}
    return method, {k: tuple(v) for k, v in out.items()}


def _param_double(rd: Reading, name: str, e: dict[str, Any]) -> Reading:
    """``rd`` with the two readers' verdicts of ``name`` (``e["double"]``: their whole entries) and the
    adjudicator (``e["adjudication"][name]``) checked by :func:`double_reading`."""
    where = f"parameter hand reading {rd.release} {rd.path} {name}"
    try:
        pair = [(_named(x["reader"], f"{where}: a reader"), _named(x["readings"][name]["verdict"], f"{where}: a verdict"))
                for x in _two(e["double"], where)]
    except (KeyError, TypeError) as exc:
        raise HandReadingsError(f"{where}: a double reading lacks {exc}") from exc
    adjs = e.get("adjudication")
    if adjs is not None and not isinstance(adjs, dict):
        raise HandReadingsError(f"{where}: `adjudication` must map a parameter to its decision, got {adjs!r}")
    readers, by = double_reading(where, rd.verdict, pair, (adjs or {}).get(name))
    return replace(rd, readers=readers, adjudicator=by)


def param_agreement(rows_by_param: dict[str, list[Any]],
                    readings: dict[str, tuple[Reading, ...]] | None = None) -> dict[str, dict[str, Any]]:
    """Per parameter, the audit's rows (``audit-sglang --param``: :class:`~nvfp4study.sglang.
    param_audit.ParamResult` or their JSON) against the blind readings: ``{"overall": {agree, n,
    rate, wilson95}, "by_release", "by_sample", "confusion": hand -> audit -> readings, "pairs",
    "sentence"}`` (the sentence adds the :data:`PARAM_HELD_OUT` sample alone when there is one), or
    ``{"not_run": why}`` for a parameter with no readings or no rows."""
    readings = param_hand_readings()[1] if readings is None else readings
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(set(readings) | set(rows_by_param)):
        rds, rows = readings.get(name, ()), rows_by_param.get(name, [])
        if not rds or not rows:
            out[name] = {"not_run": "no blind hand readings of it" if not rds else "no audit rows of it"}
            continue
        a = compare(rows, rds)
        o = a.overall
        held = a.by_sample.get(PARAM_HELD_OUT)
        sentence = (f"{name}: the audit agreed with a blind hand reading on {o['agree']} of {o['n']} paths"
                    + (f" ({pct(o['rate'])}, Wilson 95 % {pct(o['wilson95'][0])} to {pct(o['wilson95'][1])})"
                       if o["n"] else " (no reading on an audited release)")
                    + (f"; on the {PARAM_HELD_OUT} sample alone (drawn after the audit's last change, held out) "
                       f"{held['agree']} of {held['n']} ({pct(held['rate'])}, Wilson 95 % {pct(held['wilson95'][0])} "
                       f"to {pct(held['wilson95'][1])})" + readers_clause(a.between_readers.get(PARAM_HELD_OUT))
                       if held and held["n"] and len(a.by_sample) > 1 else ""))
        out[name] = {"overall": o, "by_release": a.by_release, "by_sample": a.by_sample, "confusion": a.confusion,
                     "pairs": a.pairs, "not_audited": a.not_audited, "between_readers": a.between_readers,
                     "sentence": sentence}
    return out


def param_agreement_sentence(result: dict[str, dict[str, Any]]) -> str:
    """One sentence per parameter (:func:`param_agreement`), or why it was not run."""
    if not result:
        return f"Parameters other than the clamp: not run (no {PARAM_READINGS})."
    return " ".join(x.get("sentence") or f"{k}: agreement not run ({x['not_run']})." for k, x in result.items())


__all__ = ["between_readers", "readers_of", "clamp_readings", "double_reading", "PARAM_HELD_OUT", "PARAM_READINGS", "param_agreement", "param_agreement_sentence", "param_hand_readings", "CLAIM", "MIN_AGREEMENT", "MIN_READINGS", "NOT_LISTED", "ORDER", "RULE", "Agreement",
           "HandReadingsError", "Reading", "compare", "counted_verdicts", "finding", "hand_readings",
           "ledger_measured", "pct", "release_counts", "stage_counts", "tables", "write"]
