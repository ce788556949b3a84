"""Determinism comparisons checked by hand (F-09): lengths first, first divergence, labelled
speedups."""

from __future__ import annotations

import pytest

from nvfp4study.serving import measure
from nvfp4study.stages import s07_determinism as determinism
from nvfp4study.stages.claim_rules import r07_determinism as r07


def _output_row(ids, rate, status="ok", text=None):
    """A request's record with its output token ids, decoded at ``rate`` tokens/s."""
    n = len(ids)
    t1 = 0.1 + (n - 1) / rate
    return {"status": status, "output_ids": ids, "content": text, "usage": {"completion_tokens": n},
            "chunks": [{"t": 0.1, "kind": "content", "chars": 1, "tokens": 1},
                       {"t": t1, "kind": "content", "chars": 1, "tokens": n}], "ttft_s": 0.1, "end_s": t1 + 0.01}


def test_compare_lengths_first():
    same = measure.compare_outputs(_output_row([1, 2, 3], 10), _output_row([1, 2, 3], 10))
    assert same == {"comparable": True, "identical": True, "unit": "token", "len_a": 3, "len_b": 3,
                    "first_divergence": None}
    prefix = measure.compare_outputs(_output_row([1, 2, 3], 10), _output_row([1, 2, 3, 4], 10))
    assert prefix["identical"] is False and prefix["first_divergence"] == 3  # zip() would call it equal
    diverge = measure.compare_outputs(_output_row([1, 2, 9, 4], 10), _output_row([1, 2, 3, 4], 10))
    assert diverge["first_divergence"] == 2
    text = measure.compare_outputs({"status": "ok", "content": "abcX"}, {"status": "ok", "content": "abcY"})
    assert (text["unit"], text["first_divergence"]) == ("char", 3)
    failed = measure.compare_outputs(_output_row([1], 10, status="stream_cut"), _output_row([1], 10))
    assert failed["comparable"] is False and failed["identical"] is None


ROWS = {
    "spec-off": {("pA", 0): _output_row([1, 2, 3], 10), ("pA", 1): _output_row([1, 2, 3], 10),
                 ("pB", 0): _output_row([5, 6], 20), ("pB", 1): _output_row([5, 6], 20)},
    "spec-on": {("pA", 0): _output_row([1, 2, 3], 25), ("pA", 1): _output_row([1, 2, 3], 25),
                ("pB", 0): _output_row([5, 7], 30), ("pB", 1): _output_row([5, 7], 30)},
}


def test_pairs_and_counts_by_hand():
    pairs = determinism.pair_rows(ROWS, ["pA", "pB"], repeats=2)
    cross = [p for p in pairs if p["comparison"] == "spec-on vs spec-off"]
    assert [(p["prompt_id"], p["identical"], p["first_divergence"]) for p in cross] == [("pA", True, None), ("pB", False, 1)]
    counts = {c["comparison"]: c for c in determinism.identity_counts(pairs)}
    assert counts["spec-off self-reproducibility"]["identical prompts"] == 2
    assert counts["spec-on self-reproducibility"]["identical prompts"] == 2
    on = counts["spec-on vs spec-off"]
    assert (on["identical prompts"], on["prompts compared"], on["first divergence (min..max)"]) == (1, 2, "1..1")
    assert not any(c["comparison"].startswith("det") for c in counts.values())


def test_speedup_is_labelled_when_texts_differ():
    pairs = determinism.pair_rows(ROWS, ["pA", "pB"], repeats=2)
    rows = {r["row"]: r for r in determinism.throughput_rows(ROWS, pairs)}
    assert rows["spec-off"]["decode tok/s median"] == pytest.approx(15.0)
    allp = rows["speedup spec-on vs spec-off, all pairs"]
    assert allp["decode tok/s median"] == pytest.approx(27.5 / 15.0)
    assert allp["pairs"] == 2 and allp["identical pairs"] == 1
    assert "texts differ in 1 of 2 pairs" in allp["label"] and "different text" in allp["label"]
    same = rows["speedup spec-on vs spec-off, identical pairs only"]
    assert same["decode tok/s median"] == pytest.approx(2.5) and same["pairs"] == 1


def test_failed_request_is_not_comparable():
    rows = {"spec-off": dict(ROWS["spec-off"]), "spec-on": dict(ROWS["spec-on"])}
    rows["spec-on"][("pB", 0)] = _output_row([5], 30, status="stream_cut")
    counts = {c["comparison"]: c for c in determinism.identity_counts(determinism.pair_rows(rows, ["pA", "pB"], 2))}
    on = counts["spec-on vs spec-off"]
    assert (on["identical prompts"], on["prompts compared"], on["not comparable (failed request)"]) == (1, 1, 1)


def _fail(ids, rate):
    return _output_row(ids, rate, status="stream_cut")


def _all_failed(det: bool) -> dict:
    names = ["spec-off", "spec-on"] + (["det spec-off", "det spec-on"] if det else [])
    return {n: {k: _fail(v["output_ids"], 10) for k, v in ROWS["spec-off"].items()} for n in names}


def _results(rows, det, tok=None):
    """Every stage-07 claim rule on these rows: ``{claim id: Row}``."""
    from nvfp4study.core import ledger
    from nvfp4study.core.claim_rules import rules_for

    pairs = determinism.pair_rows(rows, ["pA", "pB"], repeats=2)
    counts = r07.counts_by_comparison(determinism.identity_counts(pairs))
    cards = {c["id"]: c["card"] for c in ledger.card_claims()}
    x = r07.DeterminismMeasurements(counts, tok, cards, spec_depth=2, repeats=2, deterministic_mode=det)
    return {r.id: r.fn(x) for r in rules_for(r07.DeterminismMeasurements, "claim")}


def test_no_comparable_pair_is_not_run():
    # every request failed: 0 prompts compared, so 0 == 0 must not become a verdict
    res = _results(_all_failed(det=True), det=True)
    assert set(res) == {"det.spec-off", "det.spec-on", "det.deterministic-mode"}
    for cid, r in res.items():
        assert r.verdict == "not run" and r.measured is None and r.evidence == [], cid
        assert r.note.startswith("not run: no comparable pair: all requests failed"), cid
        assert "2 prompt(s)" in r.note


def test_spec_on_failed_only_keeps_spec_off_verdict():
    rows = {"spec-off": dict(ROWS["spec-off"]), "spec-on": {k: _fail([1], 10) for k in ROWS["spec-on"]}}
    res = _results(rows, det=False)
    assert res["det.spec-off"].verdict == "reproduced"
    assert res["det.spec-off"].measured == {"identical": 2, "n": 2, "repeats": 2}
    assert res["det.spec-on"].verdict == "not run"
    assert res["det.deterministic-mode"].note == "not run: determinism.deterministic_mode is false"


def test_verdicts_with_data():
    res = _results(ROWS, det=False)
    assert res["det.spec-on"].verdict == "reproduced"  # pB differs: not byte-identical
    assert res["det.spec-on"].measured["identical"] == 1 and res["det.spec-on"].measured["n"] == 2
    same = {"spec-off": ROWS["spec-off"], "spec-on": {k: _output_row(v["output_ids"], 25) for k, v in ROWS["spec-off"].items()}}
    assert _results(same, det=False)["det.spec-on"].verdict == "contradicted"
    # deterministic mode: all identical (better) and 38.0 tok/s within 15 % of the card's 38.26
    rows = dict(ROWS, **{"det spec-off": ROWS["spec-off"], "det spec-on": same["spec-on"]})
    assert _results(rows, det=True, tok=38.0)["det.deterministic-mode"].verdict == "reproduced"
    assert _results(rows, det=True, tok=10.0)["det.deterministic-mode"].verdict == "partly"
    rows["det spec-on"] = ROWS["spec-on"]  # 1/2 identical, same as without the mode: not better
    assert _results(rows, det=True, tok=10.0)["det.deterministic-mode"].verdict == "contradicted"


def test_identity_counts_are_typed_for_the_rules():
    # the rules read fields, not the table's display labels
    c = r07.IdentityCount.from_row({"comparison": "x", "identical prompts": 1, "prompts compared": 2,
                                    "not comparable (failed request)": 3, "first divergence (min..max)": "4..9"})
    assert (c.identical, c.compared, c.not_comparable, c.first_divergence) == (1, 2, 3, "4..9")
    assert r07.no_pair(c) == "no comparable pair: all requests failed (3 prompt(s) with a failed request)"
