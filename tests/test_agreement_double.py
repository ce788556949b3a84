"""Pairs read by two blind readers, with a third deciding where they disagree (issue 36: the
reference's own error rate). The protocol: docs/blind-readings/A.md; the loader's checks:
agreement.double_reading."""

from __future__ import annotations

import copy
import math

import pytest
import yaml

from nvfp4study.core.errors import HandReadingsError
from nvfp4study.sglang import agreement as ag

VERDICTS = {v: "..." for v in ag.ORDER}


def _one(reader: str, verdict: str) -> dict:
    return {"reader": reader, "verdict": verdict, "device": "GPU", "deciding": ["a.py:1 x"], "reason": "r"}


def _entry(path: str, a: str, b: str, adjudicated: str | None = None) -> dict:
    e = {"release": "0.5.23", "path": path, "device": "GPU", "deciding": ["a.py:1 x"], "reason": "r",
         "reader": "M1+M2", "sample": "eleventh", "double": [_one("M1", a), _one("M2", b)]}
    if adjudicated is None:
        e["verdict"] = a
    else:
        e["verdict"] = adjudicated
        e["adjudication"] = {"reader": "X1", "verdict": adjudicated, "chose": "a" if adjudicated == a else "b",
                             "deciding": ["b.py:2 y"], "reason": "r"}
    return e


def _doc(*entries: dict) -> dict:
    return {"method": {}, "verdicts": VERDICTS, "readings": list(entries)}


ROWS = [{"path": p, "verdict": v, "sglang_version": "0.5.23", "catalogued": False}
        for p, v in (("A/x", "DROPPED"), ("B/x", "EXACT"), ("C/x", "APPROX"), ("D/x", "ABSENT"))]


def test_agreeing_and_adjudicated_pairs_are_compared_with_their_verdict():
    _, rds = ag.clamp_readings(_doc(_entry("A/x", "DROPPED", "DROPPED"), _entry("B/x", "EXACT", "APPROX", "EXACT"),
                                    _entry("C/x", "DROPPED", "APPROX", "DROPPED"), _entry("D/x", "ABSENT", "ABSENT")))
    assert [(r.verdict, r.adjudicator) for r in rds] == [("DROPPED", ""), ("EXACT", "X1"), ("DROPPED", "X1"),
                                                         ("ABSENT", "")]
    a = ag.compare(ROWS, rds)
    # the audit against the reference: A, B, D agree; C (reference DROPPED, audit APPROX) does not
    assert (a.overall["agree"], a.overall["n"]) == (3, 4)
    # the readers with each other: A and D agreed, B and C did not
    got = a.between_readers["eleventh"]
    assert (got["agree"], got["n"], got["rate"]) == (2, 4, 0.5)
    # Wilson 95 % of 2/4 written out: (p + z^2/2n -/+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)
    z, n, p = 1.959963984540054, 4, 0.5
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    assert got["wilson95"] == pytest.approx([(p + z * z / (2 * n) - half) / (1 + z * z / n),
                                             (p + z * z / (2 * n) + half) / (1 + z * z / n)])
    assert a.as_json()["between_readers"]["eleventh"]["agree"] == 2
    assert [p["adjudicator"] for p in a.pairs] == ["", "X1", "X1", ""]
    assert ag.readers_of(rds) == {"M1", "M2", "X1"}


def test_a_sample_read_once_has_no_reader_agreement():
    once = {"release": "0.5.23", "path": "A/x", "verdict": "DROPPED", "device": "GPU", "deciding": ["a.py:1"],
            "reason": "r", "reader": "L1", "sample": "tenth"}
    _, rds = ag.clamp_readings(_doc(once))
    assert ag.between_readers(rds) == {} and ag.readers_of(rds) == {"L1"}


@pytest.mark.parametrize("edit, message", [
    (lambda e: e.update(verdict="EXACT"), "must be theirs"),                      # agreeing, stored otherwise
    (lambda e: e.update(adjudication={"reader": "X1", "verdict": "DROPPED"}), "nothing adjudicated"),
    (lambda e: e["double"].pop(), "two readers' readings"),
    (lambda e: e["double"][1].update(reader="M1"), "two readings by two readers"),
    (lambda e: e["double"][1].pop("verdict"), "lacks 'verdict'"),
    (lambda e: e.update(double="M1, M2"), "two readers' readings"),
    (lambda e: e.update(adjudication={}), "nothing adjudicated"),              # even an empty one
    (lambda e: e["double"][0].update(reader=None), "reader must be a non-empty string"),
    (lambda e: e["double"][1].update(verdict=["DROPPED"]), "verdict must be a non-empty string"),
    (lambda e: e.update(verdict=["DROPPED"]), "must be non-empty strings"),
    (lambda e: e.update(path=["A/x"]), "must be non-empty strings"),
])
def test_an_agreeing_pair_that_breaks_the_protocol_is_a_named_error(edit, message):
    e = _entry("A/x", "DROPPED", "DROPPED")
    edit(e)
    with pytest.raises(HandReadingsError, match=message):
        ag.clamp_readings(_doc(e))


@pytest.mark.parametrize("edit", [
    lambda e: e.pop("adjudication"),
    lambda e: e.update(verdict="APPROX"),                      # not the adjudicator's
    lambda e: e["adjudication"].pop("reader"),
    lambda e: e.update(adjudication="EXACT"),
    lambda e: e["adjudication"].update(reader=["X1"]),          # not a name
    lambda e: e["adjudication"].update(reader="M2"),            # one of the pair's readers
])
def test_a_disagreeing_pair_needs_the_adjudicators_verdict(edit):
    e = _entry("B/x", "EXACT", "APPROX", "EXACT")
    edit(e)
    with pytest.raises(HandReadingsError, match="readers disagree|a third reader's"):
        ag.clamp_readings(_doc(e))


@pytest.mark.parametrize("doc", [None, [], "x", {"readings": "x"}])
def test_a_document_that_is_not_a_mapping_of_readings_is_a_named_error(doc):
    with pytest.raises(HandReadingsError, match="expected a mapping"):
        ag.clamp_readings(doc)


def _param_entry(a: dict, b: dict, adjudication: dict | None, stored: dict) -> dict:
    def whole(reader, verdicts):
        return {"reader": reader, "readings": {k: {"verdict": v, "deciding": ["a.py:1"], "reason": "r"}
                                               for k, v in verdicts.items()}}
    e = {"release": "0.5.23", "path": "A/x", "device": "GPU", "reader": "W1+W2", "sample": "sixth",
         "readings": whole("W1+W2", stored)["readings"], "double": [whole("W1", a), whole("W2", b)]}
    if adjudication:
        e["adjudication"] = {k: {"reader": "Y1", "verdict": v, "chose": "a", "deciding": [], "reason": "r"}
                             for k, v in adjudication.items()}
    return e


def test_parameter_pairs_read_twice(tmp_path):
    a = {"routed_scaling_factor": "DROPPED", "norm_topk_prob": "APPLIED"}
    b = {"routed_scaling_factor": "APPLIED", "norm_topk_prob": "APPLIED"}
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump({"method": {}, "readings": [_param_entry(a, b, {"routed_scaling_factor": "DROPPED"}, a)]}))
    _, rds = ag.param_hand_readings(f)
    rsf, norm = rds["routed_scaling_factor"][0], rds["norm_topk_prob"][0]
    assert (rsf.verdict, rsf.adjudicator, rsf.readers) == ("DROPPED", "Y1", (("W1", "DROPPED"), ("W2", "APPLIED")))
    assert (norm.verdict, norm.adjudicator) == ("APPLIED", "")
    rows = {k: [{"path": "A/x", "verdict": "DROPPED", "sglang_version": "0.5.23"}] for k in a}
    res = ag.param_agreement(rows, rds)
    assert res["routed_scaling_factor"]["between_readers"]["sixth"]["agree"] == 0
    assert res["norm_topk_prob"]["between_readers"]["sixth"]["agree"] == 1
    assert (res["routed_scaling_factor"]["overall"]["agree"], res["norm_topk_prob"]["overall"]["agree"]) == (1, 0)
    # the disagreement left undecided is a named error, nothing half-read
    bad = _param_entry(a, b, None, a)
    f.write_text(yaml.safe_dump({"method": {}, "readings": [bad]}))
    with pytest.raises(HandReadingsError, match="routed_scaling_factor: the readers disagree"):
        ag.param_hand_readings(f)
    garbage = _param_entry(a, a, None, a)
    garbage["adjudication"] = "garbage"
    f.write_text(yaml.safe_dump({"method": {}, "readings": [garbage]}))
    with pytest.raises(HandReadingsError, match="must map a parameter"):
        ag.param_hand_readings(f)
    broken = copy.deepcopy(bad)
    del broken["double"][0]["readings"]["norm_topk_prob"]
    f.write_text(yaml.safe_dump({"method": {}, "readings": [broken]}))
    with pytest.raises(HandReadingsError, match="lacks"):
        ag.param_hand_readings(f)


def test_the_held_out_sentence_says_the_readers_agreement(monkeypatch):
    monkeypatch.setattr(ag, "HELD_OUT", "eleventh")
    _, rds = ag.clamp_readings(_doc(_entry("A/x", "DROPPED", "DROPPED"), _entry("B/x", "EXACT", "APPROX", "EXACT")))
    s = ag.compare(ROWS, rds).sentence()
    assert "On the eleventh sample alone" in s
    assert "who agreed with each other on 1 of 2 before adjudication" in s
