"""MTP estimators and verdicts checked by hand on a small recorded set (F-08, F-10)."""

from __future__ import annotations

import pytest

from ledger_fixtures import ledger_row
from nvfp4study.serving import acceptance, measure
from nvfp4study.stages import s06_mtp as mtp
from nvfp4study.stages.claim_rules import r06_mtp as r06

C = "sglang:generation_tokens_total"
V = "sglang:spec_verify_calls_total"


def _chunks(points):
    """``[(t, cumulative tokens)]`` -> role chunk, content chunks, finish/sglext/usage chunks."""
    out = [{"t": 0.05, "kind": "role", "chars": 0, "tokens": None}]
    out += [{"t": t, "kind": "content", "chars": 3, "tokens": n} for t, n in points]
    last = points[-1][0] + 0.01
    out += [{"t": last, "kind": k, "chars": 0, "tokens": None} for k in ("finish", "sglext", "usage")]
    return out


def _spec_request_row(n, points, end_s, spec, before, after, status="ok"):
    """A request's record with speculative-decoding details and the server's counters around it."""
    return {"status": status, "usage": {"completion_tokens": n}, "chunks": _chunks(points), "ttft_s": points[0][0],
            "end_s": end_s, "spec_tokens_details": spec,
            "metrics_before": {C: before[0], V: before[1]}, "metrics_after": {C: after[0], V: after[1]}}


def _spec(n, verify, correct, draft=3):
    proposed = verify * (draft - 1)
    return {"spec_accept_length": n / verify, "spec_accept_rate": correct / proposed, "spec_verify_ct": verify,
            "spec_num_correct_drafts": correct, "spec_num_proposed_drafts": proposed}


# A: 10 tokens, 4 verify passes, 6 of 8 drafts accepted; counters scoped to it.
A = _spec_request_row(10, [(0.10, 1), (0.20, 4), (0.30, 7), (0.40, 10)], 0.42, _spec(10, 4, 6), (100, 50), (110, 54))
# B: 20 tokens, 10 verify passes, 8 of 20 drafts; another client added 20 tokens / 6 verifies meanwhile.
B = _spec_request_row(20, [(0.20, 1), (1.20, 20)], 1.25, _spec(20, 10, 8), (110, 54), (150, 70))
# C: a request whose stream was cut: a row with its status, never a placeholder.
CUT = {**_spec_request_row(5, [(0.1, 1), (0.2, 5)], None, None, (150, 70), (150, 70), status="stream_cut"), "usage": None}


def test_request_metrics_by_hand():
    a = measure.request_metrics(A)
    assert a["ttft_s"] == 0.10
    assert a["decode_tok_s"] == pytest.approx(9 / 0.30)  # tokens after the first chunk / first->last
    assert a["e2e_tok_s"] == pytest.approx(10 / 0.42)
    assert a["token_count"] == "per-chunk usage"
    assert (a["accept_len"], a["accept_rate"], a["verify_ct"]) == (2.5, 0.75, 4)
    assert (a["d_gen"], a["d_verify"], a["counter_scoped"]) == (10, 4, True)
    b = measure.request_metrics(B)
    assert b["decode_tok_s"] == pytest.approx(19.0) and b["counter_scoped"] is False
    c = measure.request_metrics(CUT)
    assert c["status"] == "stream_cut" and c["decode_tok_s"] is None and c["d_gen"] is None


def test_decode_rate_without_per_chunk_usage():
    row = _spec_request_row(10, [(0.1, None), (0.4, None)], 0.5, None, (0, 0), (10, 0))
    m = measure.request_metrics(row)
    assert m["token_count"] == "completion_tokens - 1" and m["decode_tok_s"] == pytest.approx(9 / 0.3)


def test_estimators_by_hand_give_different_numbers():  # F-10
    ms = [measure.request_metrics(r) for r in (A, B, CUT)]
    rows = {e["estimator"]: e for e in acceptance.estimators(ms, draft_tokens=3, session={"d_gen": 300, "d_verify": 100})}
    med = rows["request-weighted median"]
    assert med["accept_len"] == pytest.approx(2.25) and med["accept_rate"] == pytest.approx(0.575)
    assert (med["len_min"], med["len_max"], med["rate_min"], med["rate_max"]) == (2.0, 2.5, 0.4, 0.75)
    assert med["n"] == 2  # the cut request is not counted
    tw = rows["token-weighted"]
    assert tw["accept_len"] == pytest.approx(30 / 14) and tw["accept_rate"] == pytest.approx(14 / 28)
    sc = rows["counter-delta, scoped to each request"]
    assert sc["accept_len"] == pytest.approx(50 / 20) and sc["accept_rate"] == pytest.approx(0.75) and sc["rate_derived"]
    ses = next(e for k, e in rows.items() if k.startswith("counter-delta, whole session"))
    assert ses["accept_len"] == pytest.approx(3.0) and ses["accept_rate"] == pytest.approx(1.0)
    lens = [rows[k]["accept_len"] for k in rows]
    assert len({round(x, 6) for x in lens if x is not None}) == 4  # mean == median with two values


def test_scoped_counter_equals_token_weighted_without_other_traffic():
    ms = [measure.request_metrics(A)]
    rows = {e["estimator"]: e for e in acceptance.estimators(ms, draft_tokens=3)}
    assert rows["counter-delta, scoped to each request"]["accept_len"] == rows["token-weighted"]["accept_len"] == 2.5


@pytest.mark.parametrize("length,rate,draft,broken", [
    (1.00, 0.00, 3, True), (1.02, 0.02, 4, True), (1.05, 0.05, 2, True),
    (1.00, 0.00, None, False), (1.3, 0.15, 3, False), (2.6, 0.82, 3, False), (1.0, 0.0, 1, False),
])
def test_broken_draft_rule(length, rate, draft, broken):  # F-08
    assert acceptance.broken_draft(length, rate, draft) is broken


def test_card_marks_come_from_the_claims_file():
    marks = mtp.card_marks()
    assert marks[0]["tok_s"] == 22.60 and marks[2]["accept_len"] == [2.62, 2.70] and marks[3]["accept_rate"] == [0.53, 0.63]


BROKEN_CARD = {"accept_len": 1.0, "accept_rate": 0.0, "speedup": {1: 0.94, 2: 0.80, 3: 0.71}}


def _summary(model, depth, length, rate, speedup, draft=None):
    draft = depth + 1 if draft is None else draft
    flag = "draft broken: check layer 42" if acceptance.broken_draft(length, rate, draft) else ""
    return {"model": model, "depth": depth, "accept len (token-weighted)": length,
            "accept rate (token-weighted)": rate, "speedup vs off (decode medians)": speedup, "flag": flag}


def _study():
    return [_summary("study", 0, None, None, None), _summary("study", 1, 1.9, 0.9, 1.8),
            _summary("study", 2, 2.6, 0.8, 2.0)]


def test_broken_draft_reproduced_with_every_value():
    recs = _study() + [_summary("broken-draft", 0, None, None, None),
                       _summary("broken-draft", 1, 1.0, 0.0, 0.95), _summary("broken-draft", 2, 1.0, 0.0, 0.78)]
    res = acceptance.broken_draft_result(recs, BROKEN_CARD)
    assert res["verdict"] == "reproduced"
    assert res["measured"] == {"accept_len": 1.0, "accept_rate": 0.0, "speedup": {"1": 0.95, "2": 0.78}}


def test_broken_draft_missing_speedup_is_not_slower():
    # depth 0 of the broken checkpoint failed: no speedup; the old rule counted None as 0 (< 1, "slower")
    recs = _study() + [_summary("broken-draft", 1, 1.0, 0.0, None), _summary("broken-draft", 2, 1.0, 0.0, None)]
    res = acceptance.broken_draft_result(recs, BROKEN_CARD)
    assert res["verdict"] == "partly"
    assert "speedup missing" in res["note"] and "not measured: k=1 (speedup), k=2 (speedup)" in res["note"]
    # one depth with no acceptance either
    recs = _study() + [_summary("broken-draft", 1, 1.0, 0.0, 0.94), _summary("broken-draft", 2, None, None, None)]
    res = acceptance.broken_draft_result(recs, BROKEN_CARD)
    assert res["verdict"] == "partly" and "k=2 (acceptance)" in res["note"]
    # no acceptance at any depth: nothing measured
    recs = _study() + [_summary("broken-draft", 1, None, None, None)]
    assert "not_run" in acceptance.broken_draft_result(recs, BROKEN_CARD)


def test_broken_draft_contradicted_when_the_draft_works():
    recs = _study() + [_summary("broken-draft", 1, 1.85, 0.85, 1.7), _summary("broken-draft", 2, 2.5, 0.75, 1.9)]
    res = acceptance.broken_draft_result(recs, BROKEN_CARD)
    assert res["verdict"] == "contradicted" and "the draft works" in res["note"]
    # between the broken signature and clearly working: partly, not contradicted
    recs = _study() + [_summary("broken-draft", 1, 1.2, 0.2, 1.0), _summary("broken-draft", 2, 1.0, 0.0, 0.8)]
    assert acceptance.broken_draft_result(recs, BROKEN_CARD)["verdict"] == "partly"


def test_broken_draft_not_run_without_broken_checkpoint():
    res = acceptance.broken_draft_result(_study(), BROKEN_CARD)
    assert set(res) == {"not_run"} and "k=1 rate 0.90" in res["not_run"]


def test_broken_draft_measured_values_come_from_the_rows_not_the_card():
    # numbers unlike the card's 1.00 / 0.00: a measured value copied from the card would show
    recs = _study() + [_summary("broken-draft", 1, 1.03, 0.04, 0.91), _summary("broken-draft", 2, 1.06, 0.02, 0.77)]
    res = acceptance.broken_draft_result(recs, BROKEN_CARD)
    assert res["measured"] == {"accept_len": 1.06, "accept_rate": 0.04, "speedup": {"1": 0.91, "2": 0.77}}
    assert res["verdict"] == "reproduced"
    assert "k=2" in res["sources"]["accept_len"] and "accept len (token-weighted)" in res["sources"]["accept_len"]
    assert "k=1" in res["sources"]["accept_rate"] and res["sources"]["accept_rate"].startswith("data/mtp-summary.json")


def test_ledger_records_sources_of_measured_values(run_dir):
    from nvfp4study.core import ledger
    from nvfp4study.core.errors import LedgerError

    row = ledger.record(run_dir, "mtp.broken-draft", measured={"accept_len": 1.06}, verdict="reproduced",
                        sources={"accept_len": "data/mtp-summary.json: k=2"})
    assert row["sources"] == {"accept_len": "data/mtp-summary.json: k=2"}
    assert ledger_row(run_dir, "mtp.broken-draft")["sources"] == row["sources"]
    with pytest.raises(LedgerError, match="sources"):
        ledger.record(run_dir, "mtp.broken-draft", measured={"accept_len": 1.0}, verdict="reproduced",
                      sources={"accept_rate": "x"})


def _depth_row(depth, **kw):
    row = {"depth": depth, "requests ok": "3/3", "decode tok/s median": 30.0, "decode tok/s min": 28.0,
           "decode tok/s max": 31.0, "e2e tok/s median": 27.0, "speedup vs off (decode medians)": 1.3,
           "accept len (token-weighted)": 2.2, "accept len min": 2.0, "accept len max": 2.4,
           "accept rate (token-weighted)": 0.6, "accept rate min": 0.5, "accept rate max": 0.7,
           "texts identical to off": "1/3", "note": "", "log lines": 4, "log gen tok/s median": 44.0,
           "log gen tok/s min": 40.0, "log gen tok/s max": 47.0, "log accept len median": 2.66,
           "log accept rate median": 0.83, "speedup vs off (log gen tok/s medians)": 1.9}
    return {**row, **kw}


K2 = {"tok_s": 45.1, "speedup": 2.0, "accept_len": [2.62, 2.70], "accept_rate": [0.81, 0.85]}


def _depth(rule, row, card_id, card):
    """One depth rule on a sweep whose summary holds ``row`` (model "study") alone."""
    return rule(r06.MtpMeasurements([{"model": "study", **row}], [], "sglang 0.5.23", {card_id: card}))


def test_the_card_estimator_decides_when_the_log_has_lines():
    res = _depth(r06.mtp_k2, _depth_row(2), "mtp.k2", K2)
    # log: 44.0 vs 45.1 (2.4 %), 1.9 vs 2.0 (5 %), 2.66 in [2.62, 2.70], 0.83 in [0.81, 0.85]: 4/4
    assert res.verdict == "reproduced" and res.note.startswith("4/4")
    assert "decided by SGLang decode log" in res.note and "within 15%" in res.note
    m = res.measured
    assert (m["estimator"], m["tok_s"], m["accept_len"], m["accept_rate"]) == ("decode log", 44.0, 2.66, 0.83)
    # the per-request family is kept beside it: 30 tok/s, 2.2, 0.6 would have failed all four checks
    assert m["per_request"]["decode_tok_s"] == 30.0 and m["per_request"]["accept_len_token_weighted"] == 2.2
    # per-request values alone (no log line in our windows): contradicted, and the note names them
    res = _depth(r06.mtp_k2, _depth_row(2, **{"log lines": 0, "log gen tok/s median": None}), "mtp.k2", K2)
    assert res.verdict == "contradicted" and "NOT the card's" in res.note
    assert res.measured["estimator"] == "per request" and res.measured["tok_s"] == 30.0
    # a depth not swept (or with no successful request) is not run
    assert _depth(r06.mtp_k1, _depth_row(2), "mtp.k1", K2).note == (
        "not run: depth 1 not in mtp.depths or no successful request")


def test_depth_zero_tolerance_bands():
    off = {"tok_s": 22.60}
    for tok, verdict in ((22.0, "reproduced"), (17.0, "partly"), (15.0, "contradicted")):  # 2.7 %, 24.8 %, 33.6 %
        row = _depth_row(0, **{"log gen tok/s median": tok, "log accept len median": None})
        assert _depth(r06.mtp_off, row, "mtp.off", off).verdict == verdict


def test_best_depth_by_the_deciding_tok_s():
    rows = [{"model": "study", **_depth_row(d, **{"log gen tok/s median": t})} for d, t in ((0, 22.0), (1, 40.0),
                                                                                              (2, 45.0), (3, 41.0))]
    res = r06.mtp_k2_best(r06.MtpMeasurements(rows, [], "sglang 0.5.23", {}))
    assert res.verdict == "reproduced" and res.measured == {"best_depth": 2, "tok_s": {"0": 22.0, "1": 40.0,
                                                                                      "2": 45.0, "3": 41.0}}
    rows[3]["log gen tok/s median"] = 46.0
    assert r06.mtp_k2_best(r06.MtpMeasurements(rows, [], "", {})).measured["best_depth"] == 3
    assert r06.mtp_k2_best(r06.MtpMeasurements(rows[:1], [], "", {})).note == "not run: fewer than two depths measured"


def test_speed_rows_on_another_gpu_compare_speedup_and_acceptance_only():
    """The card's tok/s are a GB10-class number: on a B200 (or an unknown GPU) absolute tok/s are
    shown but not judged; speedup and acceptance still decide. On a GB10 nothing changes."""
    def run(rule, row, card_id, card, gpu):
        return rule(r06.MtpMeasurements([{"model": "study", **row}], [], "sglang 0.5.23", {card_id: card}, gpu=gpu))

    # 90 tok/s on a B200 (twice the card's 45.1) with the card's speedup and acceptance
    fast = _depth_row(2, **{"log gen tok/s median": 90.0})
    assert run(r06.mtp_k2, fast, "mtp.k2", K2, None).verdict == "partly"  # judged as given: 3/4
    b200 = run(r06.mtp_k2, fast, "mtp.k2", K2, "NVIDIA B200")
    assert b200.verdict == "reproduced" and b200.note.startswith("3/3 of speedup, accept length, accept rate")
    assert "NVIDIA B200 (8000 GB/s)" in b200.note and b200.measured["tok_s"] == 90.0
    gb10 = run(r06.mtp_k2, fast, "mtp.k2", K2, "NVIDIA GB10")
    assert gb10.verdict == "partly" and gb10.note.startswith("3/4 of tok/s, speedup")
    off = _depth_row(0, **{"log gen tok/s median": 200.0, "log accept len median": None})
    row = run(r06.mtp_off, off, "mtp.off", {"tok_s": 22.60}, "NVIDIA B200")
    assert row.verdict == "not run" and row.note.startswith("not run: tok/s not compared") and row.measured["tok_s"] == 200.0
    assert run(r06.mtp_off, off, "mtp.off", {"tok_s": 22.60}, "NVIDIA GB10").verdict == "contradicted"
    unknown = run(r06.mtp_k2, fast, "mtp.k2", K2, "NVIDIA H100 80GB HBM3")  # no bandwidth on record: not compared
    assert unknown.note.endswith("this run served on NVIDIA H100 80GB HBM3") and unknown.verdict == "reproduced"


# Each tolerance band (core/claims.yaml's mtp.k2 range, widened by 0.05; tok/s and speedup within
# 15 % of the card): a value inside the card's exact range, inside the band only, on the band's
# edge, and just past it. The log's values decide; the other three checks stay at agreeing values,
# so one check alone moves the verdict between reproduced (4/4) and partly (3/4).
BAND_CASES = [
    ("log accept len median", 2.66, True), ("log accept len median", 2.73, True),
    ("log accept len median", 2.70 + 0.05, True), ("log accept len median", 2.76, False),
    ("log accept len median", 2.62 - 0.05, True), ("log accept len median", 2.56, False),
    ("log accept rate median", 0.84, True), ("log accept rate median", 0.88, True),
    ("log accept rate median", 0.85 + 0.05, True), ("log accept rate median", 0.91, False),
    ("log accept rate median", 0.81 - 0.05, True), ("log accept rate median", 0.75, False),
    ("log gen tok/s median", 45.1 * 1.14, True), ("log gen tok/s median", 45.1 * 0.86, True),
    ("log gen tok/s median", 45.1 * 1.16, False), ("log gen tok/s median", 45.1 * 0.84, False),
    ("speedup vs off (log gen tok/s medians)", 2.0 * 1.15, True),
    ("speedup vs off (log gen tok/s medians)", 1.71, True),  # 2.0 x 0.85 is 15.000000000000002 % in floats
    ("speedup vs off (log gen tok/s medians)", 2.31, False), ("speedup vs off (log gen tok/s medians)", 1.69, False),
]

SHORT = {"log accept len median": "len", "log accept rate median": "rate", "log gen tok/s median": "tok_s",
         "speedup vs off (log gen tok/s medians)": "speedup"}


@pytest.mark.parametrize("key,value,agrees", BAND_CASES, ids=[f"{SHORT[k]}-{v:.4g}" for k, v, _ in BAND_CASES])
def test_tolerance_bands_inside_on_and_past(key, value, agrees):
    res = _depth(r06.mtp_k2, _depth_row(2, **{key: value}), "mtp.k2", K2)
    assert (res.verdict, res.note[:3]) == (("reproduced", "4/4") if agrees else ("partly", "3/4"))


def test_within_bands_by_hand():
    """``_within``: 2 within 15 % of the card, 1 within 30 %, 0 past it or missing (both sides)."""
    for x, want in ((100.0, 2), (115.0, 2), (85.0, 2), (116.0, 1), (84.0, 1), (130.0, 1), (70.0, 1),
                    (131.0, 0), (69.0, 0), (None, 0)):
        assert r06._within(x, 100.0, (0.15, 0.30)) == want, x


# A summary row with a different value in every field (4 decimals and more, so rounding shows).
FULL = {"depth": 2, "requests ok": "3/4", "decode tok/s median": 30.123456, "decode tok/s min": 28.11111,
        "decode tok/s max": 31.22222, "e2e tok/s median": 27.33333, "speedup vs off (decode medians)": 1.344444,
        "accept len (token-weighted)": 2.255555, "accept len min": 2.066666, "accept len max": 2.477777,
        "accept rate (token-weighted)": 0.588888, "accept rate min": 0.499999, "accept rate max": 0.711111,
        "texts identical to off": "1/3", "note": "one stream cut", "log lines": 4,
        "log gen tok/s median": 44.044444, "log gen tok/s min": 40.055555, "log gen tok/s max": 47.066666,
        "log accept len median": 2.660006, "log accept rate median": 0.830007,
        "speedup vs off (log gen tok/s medians)": 1.900008}


def test_depth_row_in_full():
    """Every field of a depth row's ledger row, by hand from FULL (rounded to 4 decimals)."""
    x = r06.MtpMeasurements([{"model": "study", **FULL}], ["data/mtp-summary.json"], "sglang 0.5.23", {"mtp.k2": K2})
    res = r06.mtp_k2(x)
    assert res.measured == {
        "estimator": "decode log", "tok_s": 44.0444, "n": "3/4",
        "decode_log": {"lines": 4, "gen_tok_s": 44.0444, "gen_tok_s_range": [40.0556, 47.0667],
                       "accept_len": 2.66, "accept_rate": 0.83, "speedup": 1.9},
        "per_request": {"decode_tok_s": 30.1235, "decode_tok_s_range": [28.1111, 31.2222], "e2e_tok_s": 27.3333,
                        "speedup": 1.3444, "accept_len_token_weighted": 2.2556, "accept_len_range": [2.0667, 2.4778],
                        "accept_rate_token_weighted": 0.5889, "accept_rate_range": [0.5, 0.7111]},
        "speedup": 1.9, "accept_len": 2.66, "accept_rate": 0.83, "texts_identical_to_off": "1/3"}
    assert (res.verdict, res.evidence, res.checked_on) == ("reproduced", ["data/mtp-summary.json"], "sglang 0.5.23")
    assert res.note == f"4/4 of tok/s, speedup, accept length, accept rate agree; decided by {r06.LOG_NAME}; " \
                       f"{r06.TOL_NOTE}; one stream cut"
    off = r06.mtp_off(r06.MtpMeasurements([{"model": "study", **FULL, "depth": 0}], ["e.json"], "sglang 0.5.23",
                                          {"mtp.off": {"tok_s": 44.0}}))
    assert off.measured == {
        "estimator": "decode log", "tok_s": 44.0444, "n": "3/4",
        "decode_log": {"lines": 4, "gen_tok_s": 44.0444, "gen_tok_s_range": [40.0556, 47.0667]},
        "per_request": {"decode_tok_s": 30.1235, "decode_tok_s_range": [28.1111, 31.2222], "e2e_tok_s": 27.3333}}
    assert (off.verdict, off.evidence, off.checked_on) == ("reproduced", ["e.json"], "sglang 0.5.23")
    assert off.note == f"decided by {r06.LOG_NAME}; {r06.TOL_NOTE}"
    # depth 1 has the speculative fields too (only depth 0 leaves them out)
    k1 = r06.mtp_k1(r06.MtpMeasurements([{"model": "study", **FULL, "depth": 1}], [], "", {"mtp.k1": K2}))
    assert k1.measured["accept_len"] == 2.66 and k1.measured["per_request"]["speedup"] == 1.3444


def test_deciding_by_hand():
    """The decode log decides only with lines, a gen tok/s median and (at a depth) an accept
    length; otherwise every value comes from the per-request columns."""
    per_request = {"estimator": r06.REQ_NAME, "tok_s": 30.123456, "speedup": 1.344444, "accept_len": 2.255555,
                   "accept_rate": 0.588888}
    for change in ({"log lines": 0}, {"log gen tok/s median": None}, {"log accept len median": None}):
        assert r06.deciding({**FULL, **change}) == per_request, change
    assert r06.deciding({**FULL, "depth": 0, "log accept len median": None})["estimator"] == r06.LOG_NAME
    assert r06.deciding(FULL) == {"estimator": r06.LOG_NAME, "tok_s": 44.044444, "speedup": 1.900008,
                                  "accept_len": 2.660006, "accept_rate": 0.830007}


def _m(status, verify, length, rate, toks, corr, prop, d_gen, d_verify):
    """One request's metrics (the fields of measure.request_metrics the estimators read)."""
    return {"status": status, "verify_ct": verify, "accept_len": length, "accept_rate": rate,
            "completion_tokens": toks, "correct": corr, "proposed": prop, "d_gen": d_gen, "d_verify": d_verify}


def test_estimator_rows_in_full():
    """Every row and field by hand: ok requests with verify passes count (a cut request and one
    without verify passes do not); None acceptance is skipped; counters use each ok request
    with a counter delta."""
    ms = [_m("ok", 4, 2.5, 0.75, 10, 6, 8, 10, 4), _m("ok", 10, 2.0, 0.4, 20, 8, 20, 40, 16),
          _m("ok", 5, None, None, 5, None, None, 5, 0), _m("stream_cut", 3, 9.0, 0.9, 100, 50, 50, 100, 10),
          _m("ok", 0, 7.0, 0.7, 3, 1, 1, 3, 1), _m("ok", 2, 1.0, 0.1, 2, 0, 4, 2, 2)]
    rng = {"len_min": 1.0, "len_max": 2.5, "rate_min": 0.1, "rate_max": 0.75}
    none = dict.fromkeys(rng)
    rows = acceptance.estimators(ms, draft_tokens=3, session={"d_gen": 90, "d_verify": 30})
    assert rows == [
        {"estimator": "request-weighted median", "accept_len": 2.0, "accept_rate": 0.4, "rate_derived": False,
         "n": 4, **rng},
        {"estimator": "request-weighted mean", "accept_len": pytest.approx(5.5 / 3),
         "accept_rate": pytest.approx(1.25 / 3), "rate_derived": False, "n": 4, **rng},
        {"estimator": "token-weighted", "accept_len": pytest.approx(37 / 21), "accept_rate": 14 / 32,
         "rate_derived": False, "n": 4, **none},
        {"estimator": "counter-delta, scoped to each request", "accept_len": pytest.approx(55 / 23),
         "accept_rate": pytest.approx((55 / 23 - 1) / 2), "rate_derived": True, "n": 4, **none},
        {"estimator": "counter-delta, whole session (incl. warm-up, other requests and clients)",
         "accept_len": 3.0, "accept_rate": 1.0, "rate_derived": True, "n": None, **none}]
    # the derived rate needs two draft tokens or more: (len - 1) / (draft - 1)
    by = {r["estimator"]: r for r in acceptance.estimators(ms, draft_tokens=2, session={"d_gen": 90, "d_verify": 30})}
    assert by["counter-delta, scoped to each request"]["accept_rate"] == pytest.approx(55 / 23 - 1)
    for draft in (1, 0, None):
        rows = acceptance.estimators(ms, draft_tokens=draft, session={"d_gen": 90, "d_verify": 30})
        assert [r["accept_rate"] for r in rows[3:]] == [None, None], draft
    # a session without verify passes adds no row; no request at all gives None everywhere
    assert len(acceptance.estimators(ms, 3, {"d_gen": 5, "d_verify": 0})) == 4
    assert len(acceptance.estimators(ms, 3, None)) == 4
    assert acceptance.estimators([], 3) == [
        {"estimator": "request-weighted median", "accept_len": None, "accept_rate": None, "rate_derived": False,
         "n": 0, **none},
        {"estimator": "request-weighted mean", "accept_len": None, "accept_rate": None, "rate_derived": False,
         "n": 0, **none},
        {"estimator": "token-weighted", "accept_len": None, "accept_rate": None, "rate_derived": False, "n": 0,
         **none},
        {"estimator": "counter-delta, scoped to each request", "accept_len": None, "accept_rate": None,
         "rate_derived": True, "n": 0, **none}]
    assert acceptance.median([]) is None and acceptance.median([3.0, 1.0, 2.0]) == 2.0


@pytest.mark.parametrize("length,rate,draft,broken", [
    (1.09, 0.09, 3, True), (1.10, 0.09, 3, False), (1.09, 0.10, 3, False), (1.09, 0.09, 2, True),
    (None, 0.0, 3, False), (1.0, None, 3, False),
])
def test_broken_draft_edges(length, rate, draft, broken):
    """Both thresholds are strict: rate < 0.10 and length < 1.10, at two draft tokens or more."""
    assert acceptance.broken_draft(length, rate, draft) is broken


def test_session_delta_by_hand():
    G, Vc = "sglang:generation_tokens_total", "sglang:spec_verify_calls_total"
    rows = [{"launch": 1, "metrics_start": {G: 100, Vc: 10}, "metrics_end": {G: 160, Vc: 30}},
            {"launch": 2, "metrics_start": {G: 0, Vc: 0}, "metrics_end": {G: 999, Vc: 99}},
            {"launch": 3, "metrics_start": {G: 5, Vc: 1}, "metrics_end": {G: 25, Vc: 6}},
            {"launch": 4, "metrics_start": {G: 0, Vc: 0}, "metrics_end": None}]
    assert acceptance.session_delta(rows, {1, 3, 4}) == {"d_gen": 80.0, "d_verify": 25.0}
    assert acceptance.session_delta(rows, {4}) is None and acceptance.session_delta(rows, set()) is None
    assert acceptance.session_delta(rows[1:2], {2}) == {"d_gen": 999.0, "d_verify": 99.0}


def test_log_summary_by_hand():
    lines = [{"gen_tok_s": 40.0, "accept_len": 2.5, "accept_rate": 0.7},
             {"gen_tok_s": 44.0, "accept_len": 2.7, "accept_rate": 0.9},
             {"gen_tok_s": 50.0, "accept_len": 2.6, "accept_rate": 0.8}]
    assert acceptance.log_summary(lines) == {
        "log lines": 3, "log gen tok/s median": 44.0, "log gen tok/s min": 40.0, "log gen tok/s max": 50.0,
        "log accept len median": 2.6, "log accept rate median": 0.8}
    assert acceptance.log_summary([{"gen_tok_s": 30.0}]) == {
        "log lines": 1, "log gen tok/s median": 30.0, "log gen tok/s min": 30.0, "log gen tok/s max": 30.0,
        "log accept len median": None, "log accept rate median": None}


def test_fmt2_and_round4():
    assert (acceptance.fmt2(None), acceptance.fmt2(0.456), acceptance.fmt2(2)) == ("n/a", "0.46", "2.00")
    assert (acceptance.round4(None), acceptance.round4(1.234567), acceptance.round4(2)) == (None, 1.2346, 2.0)


def _src(k, col):
    return f"data/mtp-summary.json: model 'broken-draft', k={k}, {col!r}"


LENC, RATEC, SPC = "accept len (token-weighted)", "accept rate (token-weighted)", "speedup vs off (decode medians)"
SIG = "draft broken (accept rate < 0.1, length < 1.1)"


def test_broken_draft_result_in_full():
    """Every field of the verdict for each case, by hand."""
    bd = "broken-draft"
    res = acceptance.broken_draft_result(_study() + [_summary(bd, 1, 1.0, 0.0, 0.95), _summary(bd, 2, 1.0, 0.0, 0.78)],
                                         BROKEN_CARD)
    assert res == {"measured": {"accept_len": 1.0, "accept_rate": 0.0, "speedup": {"1": 0.95, "2": 0.78}},
                   "sources": {"accept_len": _src(1, LENC), "accept_rate": _src(1, RATEC), "speedup": _src("1,2", SPC)},
                   "verdict": "reproduced",
                   "note": f"model 'broken-draft': {SIG} at 2 of 2 depths; speculation slower than none at every depth"}
    res = acceptance.broken_draft_result(_study() + [_summary(bd, 2, 2.5, 0.75, 1.9), _summary(bd, 1, 1.85, 0.85, 1.7)],
                                         BROKEN_CARD)
    assert res == {"measured": {"accept_len": 2.5, "accept_rate": 0.85, "speedup": {"1": 1.7, "2": 1.9}},
                   "sources": {"accept_len": _src(2, LENC), "accept_rate": _src(1, RATEC), "speedup": _src("1,2", SPC)},
                   "verdict": "contradicted",
                   "note": "model 'broken-draft' (layer 42 mis-declared): the draft works, token-weighted accept rate "
                           "k=1 0.85, k=2 0.75 >= 0.3, far above the broken signature (< 0.1)"}
    res = acceptance.broken_draft_result(_study() + [_summary(bd, 1, 1.0, 0.0, None), _summary(bd, 2, None, None, 0.8)],
                                         BROKEN_CARD)
    assert res["verdict"] == "partly" and res["measured"] == {"accept_len": 1.0, "accept_rate": 0.0,
                                                              "speedup": {"1": None, "2": 0.8}}
    assert res["note"] == (f"model 'broken-draft': {SIG} at 1 of 2 depths; slower than none not checked at every depth "
                           "(speedup missing); not measured: k=1 (speedup), k=2 (acceptance)")


@pytest.mark.parametrize("rows,verdict,tail", [
    # broken and within 15 % of the card's speedups at both depths, slower than none
    ([(1, 1.0, 0.0, 0.80), (2, 1.0, 0.0, 0.68)], "reproduced", "2 of 2 depths; speculation slower than none at every depth"),
    # one speedup 16 % off the card's (0.80 -> 0.67)
    ([(1, 1.0, 0.0, 0.80), (2, 1.0, 0.0, 0.67)], "partly", "2 of 2 depths; speculation slower than none at every depth"),
    # not slower at depth 1 (speedup 1.0)
    ([(1, 1.0, 0.0, 1.0), (2, 1.0, 0.0, 0.80)], "partly", "2 of 2 depths; not slower at every depth"),
    # broken at depth 2 only (rate 0.2 at depth 1: neither broken nor clearly working)
    ([(1, 1.2, 0.2, 0.94), (2, 1.0, 0.0, 0.80)], "partly", "1 of 2 depths; speculation slower than none at every depth"),
    # a depth the card has no speedup for is not compared with it
    ([(1, 1.0, 0.0, 0.94), (4, 1.0, 0.0, 0.20)], "reproduced", "2 of 2 depths; speculation slower than none at every depth"),
])
def test_broken_draft_result_bands(rows, verdict, tail):
    recs = _study() + [_summary("broken-draft", d, ln, r, sp) for d, ln, r, sp in rows]
    res = acceptance.broken_draft_result(recs, BROKEN_CARD)
    assert (res["verdict"], res["note"]) == (verdict, f"model 'broken-draft': {SIG} at {tail}")


def test_broken_draft_result_flagged_model_and_not_run_notes():
    # no checkpoint named broken-draft: the first flagged model is the one tested; working depths of
    # a model that is not the mis-declared one never make it contradicted
    recs = _study() + [_summary("other", 1, 1.9, 0.9, 1.8), _summary("other", 2, 1.0, 0.0, 0.8)]
    res = acceptance.broken_draft_result(recs, BROKEN_CARD)
    assert res["verdict"] == "partly" and res["note"].startswith(f"model 'other': {SIG} at 1 of 2 depths")
    assert res["sources"]["accept_len"] == "data/mtp-summary.json: model 'other', k=1, 'accept len (token-weighted)'"
    assert acceptance.broken_draft_result(_study(), BROKEN_CARD) == {
        "not_run": "the served checkpoint's draft is not broken (k=1 rate 0.90, k=2 rate 0.80); set "
                   "mtp.broken_model_path to a checkpoint with layer 42 mis-declared to test this claim"}
    assert acceptance.broken_draft_result(_study() + [_summary("broken-draft", 1, None, None, 0.9)], BROKEN_CARD) == {
        "not_run": "model 'broken-draft': no accept length/rate measured at any speculative depth (no successful request)"}


def test_broken_draft_result_working_rate_edge_and_half_measured_depth():
    # an accept rate of exactly 0.30 (WORKING_RATE) is clearly working
    recs = _study() + [_summary("broken-draft", 1, 1.6, 0.30, 1.5), _summary("broken-draft", 2, 2.0, 0.30, 1.6)]
    assert acceptance.broken_draft_result(recs, BROKEN_CARD)["verdict"] == "contradicted"
    # a depth with a length but no rate has no acceptance measured
    recs = _study() + [_summary("broken-draft", 1, 1.0, 0.0, 0.94), _summary("broken-draft", 2, 1.0, None, 0.8)]
    res = acceptance.broken_draft_result(recs, BROKEN_CARD)
    assert res["verdict"] == "partly" and res["note"].endswith("; not measured: k=2 (acceptance)")
    assert res["measured"]["accept_rate"] == 0.0
