"""The audit's derived-path verdicts against the blind hand readings (``sglang.agreement``).

Expected numbers are counted here by hand from ``sglang/data/hand_readings.yaml`` (read with
yaml, not through the module) and the audit of the released trees; the module's functions are
only the thing under test. Also: the readings are exactly the documented random sample (so none
was dropped or swapped), and the headline counts only trustworthy verdicts.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from nvfp4study.core.errors import HandReadingsError
from nvfp4study.report import findings
from nvfp4study.sglang import agreement as ag
from nvfp4study.sglang import model_guards, moe_params
from nvfp4study.sglang.audit import audit_tree
from nvfp4study.sglang.audit_sinks import ClampVerdict
from nvfp4study.sglang.code_index import tree_stamp
from sglang_fixtures import VERSIONS, released

DATA = Path(ag.__file__).parent / "data" / "hand_readings.yaml"


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return yaml.safe_load(DATA.read_text())


@pytest.fixture(scope="module")
def rows() -> list[Any]:
    """The audit of every released tree (PathResult rows), as stage 03's audit_versions makes it."""
    return [r for v in VERSIONS for r in audit_tree(released(v))]


def _verdict_of(rows: list[Any]) -> dict[tuple[str, str], str]:
    return {(r.sglang_version, r.path): r.verdict.value for r in rows}


def _kind(key: str) -> str:  # written out again here: Method/b -> b, fused:a/b -> fused:b, core:b
    head, _, tail = key.partition("/")
    if head.startswith("core:"):
        return head
    return ("fused:" + tail) if head.startswith("fused:") else tail


def _wilson(k: int, n: int) -> tuple[float, float]:
    z, p = 1.959963984540054, k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return c - h, c + h


def _redraw(sample: dict[str, Any], rows: list[Any], exclude: list[list[str]]) -> list[list[str]]:
    """The header's rule, written out again: sorted derived keys per release (less ``exclude``),
    rng.sample per release in order, then one shuffle; a ``pooled: n`` sample (the fourteenth: 51 derived
    paths left unread) samples n from all releases' keys together (releases in order, keys sorted)."""
    rng, pairs = random.Random(sample["seed"]), []
    if "pooled" in sample:
        pool = [[v, p] for v in sample["releases"] for p in sorted(
            r.path for r in rows if r.sglang_version == v and not r.catalogued and [v, r.path] not in exclude)]
        pairs = rng.sample(pool, sample["pooled"])
        rng.shuffle(pairs)
        return pairs
    for v in sample["releases"]:
        keys = sorted(r.path for r in rows if r.sglang_version == v and not r.catalogued
                      and [v, r.path] not in exclude)
        pairs += [[v, k] for k in rng.sample(keys, sample["per_release"])]
    rng.shuffle(pairs)
    return pairs


def test_the_readings_are_the_documented_samples_none_dropped(doc, rows):
    """>= 40 readings over all five releases: the first sample (9 per release, five readers, 9
    each) and the second (8 per release, four readers, 10 each), exactly the pairs the
    header's rule draws from the audit's derived keys (re-drawn here): a dropped, added or
    swapped reading fails."""
    rd = doc["readings"]
    first = [r for r in rd if r.get("sample", "first") == "first"]
    second = [r for r in rd if r.get("sample") == "second"]
    third = [r for r in rd if r.get("sample") == "third"]
    fourth = [r for r in rd if r.get("sample") == "fourth"]
    fifth = [r for r in rd if r.get("sample") == "fifth"]
    sixth = [r for r in rd if r.get("sample") == "sixth"]
    seventh = [r for r in rd if r.get("sample") == "seventh"]
    eighth = [r for r in rd if r.get("sample") == "eighth"]
    ninth = [r for r in rd if r.get("sample") == "ninth"]
    tenth = [r for r in rd if r.get("sample") == "tenth"]
    eleventh = [r for r in rd if r.get("sample") == "eleventh"]
    twelfth = [r for r in rd if r.get("sample") == "twelfth"]
    thirteenth = [r for r in rd if r.get("sample") == "thirteenth"]
    fourteenth = [r for r in rd if r.get("sample") == "fourteenth"]
    fifteenth = [r for r in rd if r.get("sample") == "fifteenth"]
    assert (len(first), len(second), len(third), len(fourth), len(fifth), len(sixth), len(seventh), len(eighth),
            len(ninth), len(tenth), len(eleventh), len(twelfth), len(thirteenth), len(fourteenth), len(fifteenth)) == (
                45, 40, 20, 35, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 21)
    assert sum(map(len, (first, second, third, fourth, fifth, sixth, seventh, eighth, ninth, tenth, eleventh,
                         twelfth, thirteenth, fourteenth, fifteenth))) == len(rd)
    assert len({(r["release"], r["path"]) for r in rd}) == len(rd)
    s1, s2, s3 = doc["method"]["sample"], doc["method"]["second_sample"], doc["method"]["third_sample"]
    s4, s5, s6 = doc["method"]["fourth_sample"], doc["method"]["fifth_sample"], doc["method"]["sixth_sample"]
    for s, got, readers, per in ((s1, first, range(1, 6), 9), (s2, second, range(6, 10), 10),
                                 (s3, third, range(10, 14), 5)):
        # the sample's releases are its own (a later release is audited, not sampled) and all audited
        assert s["releases"] == list(VERSIONS[: len(s["releases"])])
        assert Counter(r["release"] for r in got) == {v: s["per_release"] for v in s["releases"]}
        assert Counter(r["reader"] for r in got) == {f"part{i}": per for i in readers}
    p1 = _redraw(s1, rows, [])
    assert p1 == s1["pairs"]
    for i in range(1, 6):
        assert [[r["release"], r["path"]] for r in first if r["reader"] == f"part{i}"] == p1[i - 1::5]
    p2 = _redraw(s2, rows, p1)
    assert p2 == s2["pairs"] and not {tuple(x) for x in p1} & {tuple(x) for x in p2}
    for i in range(6, 10):
        assert [[r["release"], r["path"]] for r in second if r["reader"] == f"part{i}"] == p2[i - 6::4]
    p3 = _redraw(s3, rows, p1 + p2)
    assert p3 == s3["pairs"] and not {tuple(x) for x in p1 + p2} & {tuple(x) for x in p3}
    for i in range(10, 14):
        assert [[r["release"], r["path"]] for r in third if r["reader"] == f"part{i}"] == p3[i - 10::4]
    # the fourth: five readers C1 .. C5, 7 each, every fifth pair
    assert Counter(r["release"] for r in fourth) == {v: s4["per_release"] for v in s4["releases"]}
    assert Counter(r["reader"] for r in fourth) == {f"C{i}": 7 for i in range(1, 6)}
    p4 = _redraw(s4, rows, p1 + p2 + p3)
    assert p4 == s4["pairs"] and not {tuple(x) for x in p1 + p2 + p3} & {tuple(x) for x in p4}
    for i in range(1, 6):
        assert [[r["release"], r["path"]] for r in fourth if r["reader"] == f"C{i}"] == p4[i - 1::5]
    # the fifth: five readers F1 .. F5, 6 each, every fifth pair, none read before
    assert Counter(r["release"] for r in fifth) == {v: s5["per_release"] for v in s5["releases"]}
    assert Counter(r["reader"] for r in fifth) == {f"F{i}": 6 for i in range(1, 6)}
    p5 = _redraw(s5, rows, p1 + p2 + p3 + p4)
    assert p5 == s5["pairs"] and not {tuple(x) for x in p1 + p2 + p3 + p4} & {tuple(x) for x in p5}
    for i in range(1, 6):
        assert [[r["release"], r["path"]] for r in fifth if r["reader"] == f"F{i}"] == p5[i - 1::5]
    # the sixth: drawn after the audit's last change, readers S1 .. S5, 6 each, every fifth pair
    assert Counter(r["release"] for r in sixth) == {v: s6["per_release"] for v in s6["releases"]}
    assert Counter(r["reader"] for r in sixth) == {f"S{i}": 6 for i in range(1, 6)}
    p6 = _redraw(s6, rows, p1 + p2 + p3 + p4 + p5)
    assert p6 == s6["pairs"] and not {tuple(x) for x in p1 + p2 + p3 + p4 + p5} & {tuple(x) for x in p6}
    for i in range(1, 6):
        assert [[r["release"], r["path"]] for r in sixth if r["reader"] == f"S{i}"] == p6[i - 1::5]
    # the seventh to tenth, each drawn after the changes the one before guided, four readers each getting every
    # fourth pair: the seventh (G) under the sixth's rules plus the compiled kernels' forms (instructions K); the
    # eighth (H) with the default environment stated and SGLang's own kernels readable; the ninth (J) plus the
    # line defining Method/native keys; the tenth (L) under the ninth's rules
    before = p1 + p2 + p3 + p4 + p5 + p6
    for name, got, reader in (("seventh", seventh, "G"), ("eighth", eighth, "H"), ("ninth", ninth, "J"),
                              ("tenth", tenth, "L")):
        sm = doc["method"][f"{name}_sample"]
        assert Counter(r["release"] for r in got) == {v: sm["per_release"] for v in sm["releases"]}, name
        assert Counter(r["reader"] for r in got) == {f"{reader}1": 8, f"{reader}2": 8, f"{reader}3": 7, f"{reader}4": 7}
        drawn = _redraw(sm, rows, before)
        assert drawn == sm["pairs"] and not {tuple(x) for x in before} & {tuple(x) for x in drawn}, name
        for i in range(1, 5):
            assert sorted([r["release"], r["path"]] for r in got if r["reader"] == f"{reader}{i}") == sorted(
                drawn[i - 1::4]), (name, i)
        before = before + drawn
    # the eleventh to thirteenth, each drawn after the changes the one before guided: each pair read by two
    # readers, pairs[t::3] by M(2t+1) and M(2t+2) (N for the twelfth, O for the thirteenth, E for the
    # fourteenth and I for the fifteenth, each drawn pooled), in draw order; where they disagree an X reader decided
    # (A.md); the fifteenth drew every derived path left unread (21), so nothing is left for a later one
    for name, got, reader in (("eleventh", eleventh, "M"), ("twelfth", twelfth, "N"), ("thirteenth", thirteenth, "O"),
                              ("fourteenth", fourteenth, "E"), ("fifteenth", fifteenth, "I")):
        sm = doc["method"][f"{name}_sample"]
        drawn = _redraw(sm, rows, before)
        assert drawn == sm["pairs"] and [[r["release"], r["path"]] for r in got] == drawn, name
        assert not {tuple(x) for x in before} & {tuple(x) for x in drawn}, name
        for i, r in enumerate(got):
            t = i % 3
            assert [x["reader"] for x in r["double"]] == [f"{reader}{2 * t + 1}", f"{reader}{2 * t + 2}"], r["path"]
            agree = r["double"][0]["verdict"] == r["double"][1]["verdict"]
            assert ("adjudication" in r) != agree and (r["adjudication"]["reader"].startswith("X") if not agree else True)
        before = before + drawn
    # every derived path of the audited releases has now been read once by some sample
    read = {tuple(x) for x in before}
    assert not [(r.sglang_version, r.path) for r in rows if not r.catalogued and (r.sglang_version, r.path) not in read]
    assert all(r["verdict"] in doc["verdicts"] and r["deciding"] and r["reason"] for r in rd)


#: the samples whose readers' rules stated the default environment (docs/blind-readings/C8.md, C9.md)
ENV_STATED = ("eighth", "ninth", "tenth", "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth")


def _env_dependent(doc: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> set[tuple[str, str]]:
    """``(release, path)`` of the readings made under rules that did not fix the environment (every
    sample before the eighth) whose audit verdict changes when environment reads are left open instead of
    taking their defaults (moe_params.yaml shared.env_flags): what those readers judged depends on it."""
    cands = [r for r in doc["readings"] if r.get("sample", "first") not in ENV_STATED]
    by_release: dict[str, set[str]] = {}
    for r in cands:
        by_release.setdefault(r["release"], set()).add(r["path"])
    default = {(v, x.path): x.verdict.value for v, ps in by_release.items() for x in audit_tree(released(v), sorted(ps))}
    shared = {**moe_params.shared(), "env_flags": "open"}
    with monkeypatch.context() as m:
        m.setattr(moe_params, "shared", lambda: shared)
        open_ = {(v, x.path): x.verdict.value for v, ps in by_release.items() for x in audit_tree(released(v), sorted(ps))}
    return {(r["release"], r["path"]) for r in cands
            if default.get((r["release"], r["path"])) != open_.get((r["release"], r["path"]))}


def _fusion_dependent(doc: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> set[tuple[str, str]]:
    """``(release, path)`` of the readings made before Ling's intermediate sizes were in the readers' rules
    (every sample before the fourteenth, C13.md) whose verdict is the audit's with shared-expert fusion left
    out (no ``num_fused_shared_experts`` fact) and not the audit's as it is."""
    from nvfp4study.sglang import audit as sa

    cands = [r for r in doc["readings"] if r.get("sample", "first") != "fourteenth"]
    by_release: dict[str, set[str]] = {}
    for r in cands:
        by_release.setdefault(r["release"], set()).add(r["path"])
    default = {(v, x.path): x.verdict.value for v, ps in by_release.items() for x in audit_tree(released(v), sorted(ps))}
    with monkeypatch.context() as m:
        m.setattr(sa, "with_fusion", lambda tree, specs, data: specs)
        unfused = {(v, x.path): x.verdict.value for v, ps in by_release.items()
                   for x in audit_tree(released(v), sorted(ps))}
    return {(r["release"], r["path"]) for r in cands if default.get((r["release"], r["path"])) != r["verdict"]
            == unfused.get((r["release"], r["path"]))}


def test_agreement_counted_by_hand(doc, rows, monkeypatch):
    audit = _verdict_of(rows)
    apart = [r for r in doc["readings"] if r.get("not_compared")]
    pairs = [(r, audit.get((r["release"], r["path"]), "NOT LISTED")) for r in doc["readings"]
             if not r.get("not_compared")]
    k, n = sum(r["verdict"] == a for r, a in pairs), len(pairs)
    got = ag.compare(rows)
    assert (got.overall["agree"], got.overall["n"]) == (k, n) and n == len(doc["readings"]) - len(apart)
    assert got.not_audited == []  # every reading of an audited release is compared or listed apart
    assert got.not_compared == [f"{r['release']} {r['path']}: {r['not_compared']}" for r in apart]
    # left apart only where the reader's own reason says the default dispatch gives another verdict
    # and the recorded one comes from a --moe-a2a-backend the key does not name (the header's rule)
    a2a = [r for r in apart if "deepep" in r["not_compared"]]
    assert len(a2a) == 3 and all("--moe-a2a-backend deepep" in r["reason"] and "exact" in r["reason"].lower()
                                 and r["verdict"] == "DROPPED" and not r["path"].startswith("fused:") for r in a2a)
    # ... and every reading of an environment-gated fused function that judged it as registered (not
    # UNUSABLE), while the audit judges the default environment (moe_params.yaml env_gated_fused_func)
    # (samples whose rules stated the default environment are compared whatever their verdict)
    gated = [r for r in doc["readings"] if r["path"].endswith("/experimental_sgl_trtllm")
             and r.get("sample", "first") not in ENV_STATED]
    # ... and every reading of GPTQMarlinMoEKernel/marlin made under auto whose reason says the key's
    # backend fails the kernel's is_auto() assert
    auto = [r for r in doc["readings"] if r["path"] == "GPTQMarlinMoEKernel/marlin" and "assert" in r["reason"]
            and r["verdict"] != "UNUSABLE"]
    # ... and every reading, made before the eighth sample's rules stated the default environment, whose
    # audit verdict depends on environment reads taking their defaults (moe_params.yaml env_flags:
    # _use_aiter = SGLANG_USE_AITER and _is_hip): those readers judged the aiter branches taken
    env = [r for r in apart if "SGLANG_USE_AITER" in r["not_compared"]]
    assert {(r["release"], r["path"]) for r in env} == _env_dependent(doc, monkeypatch) and len(env) == 12
    # ... and every reading of a method this release selects only under another model's architecture test
    # (sglang/model_guards.py: UNUSABLE for Ling) whose reason records what the path does "if it is reached"
    guarded = {(v, c) for v in VERSIONS
               for c in model_guards.other_model_methods(released(v).root, hash(tree_stamp(released(v).root)))}
    reach = [r for r in doc["readings"] if (r["release"], r["path"].split("/")[0]) in guarded
             and "if it is reached" in r["reason"] and r["verdict"] != "UNUSABLE"]
    assert [r for r in apart if "judged as if reached" in r["not_compared"]] == reach and len(reach) == 1
    # ... and every reading made before C13.md gave Ling's intermediate sizes that judged the branch with Ling's
    # shared expert not fused, where the audit (round 12, sglang/shared_fusion.py) finds it fused
    fused = [r for r in apart if "intermediate sizes" in r["not_compared"]]
    assert {(r["release"], r["path"]) for r in fused} == _fusion_dependent(doc, monkeypatch) and len(fused) == 4
    assert {(r["release"], r["path"]) for r in apart if r not in a2a + env + reach + fused} == {
        (r["release"], r["path"]) for r in gated + auto if r["verdict"] != "UNUSABLE"} and len(apart) == 26
    assert moe_params.shared()["env_gated_fused_func"] == "unusable"
    assert moe_params.shared()["env_flags"] == "default"
    # issue 23's bar: at least 95 % over the readings of its three samples, the held-out third too
    # (issue 36's bar on the held-out sample: test_the_held_out_sample_agrees_at_95_percent)
    k3 = sum(r["verdict"] == a for r, a in pairs if r.get("sample", "first") in ("first", "second", "third"))
    n3 = sum(r.get("sample", "first") in ("first", "second", "third") for r, _ in pairs)
    assert k3 / n3 >= 0.95 and got.by_sample["third"]["rate"] >= 0.95, (k3, n3, got.by_sample)
    assert got.overall["wilson95"] == pytest.approx(list(_wilson(k, n)))
    for key, group in (("kind", got.by_kind), ("release", got.by_release), ("sample", got.by_sample)):
        want: dict[str, list[int]] = {}
        for r, a in pairs:
            g = want.setdefault({"kind": _kind(r["path"]), "release": r["release"],
                                 "sample": r.get("sample", "first")}[key], [0, 0])
            g[0] += r["verdict"] == a
            g[1] += 1
        assert {g: [x["agree"], x["n"]] for g, x in group.items()} == want, key
    conf = Counter((r["verdict"], a) for r, a in pairs)
    assert {(h, a): c for h, row in got.confusion.items() for a, c in row.items()} == dict(conf)
    # every hand verdict is one the audit can give (UNUSABLE included, issue 23): an UNUSABLE
    # reading the audit also calls UNUSABLE agrees
    assert set(doc["verdicts"]) == {v.value for v in ClampVerdict} == set(ag.ORDER)
    unusable = [(r, a) for r, a in pairs if r["verdict"] == "UNUSABLE"]
    assert unusable and sum(got.confusion["UNUSABLE"].values()) == len(unusable)
    assert got.confusion["UNUSABLE"].get("UNUSABLE", 0) == sum(a == "UNUSABLE" for _, a in unusable) > 0
    want_trusted = sorted(g for g, x in got.by_kind.items() if x["n"] >= 3 and x["agree"] / x["n"] >= 0.95)
    assert got.trusted_kinds == want_trusted


def test_a_missing_path_disagrees_and_an_unaudited_release_is_listed():
    rd = (ag.Reading("0.5.23", "M/triton", "UNUSABLE", "CUDA", ("x.py:1",), "r", "part1"),
          ag.Reading("0.5.23", "M/gone", "DROPPED", "CUDA", ("x.py:1",), "r", "part1"),
          ag.Reading("0.5.19", "M/triton", "EXACT", "CUDA", ("x.py:1",), "r", "part2"))
    rows = [{"path": "M/triton", "verdict": "EXACT", "sglang_version": "0.5.23", "catalogued": False}]
    got = ag.compare(rows, rd)
    assert (got.overall["agree"], got.overall["n"]) == (0, 2)
    assert got.confusion == {"UNUSABLE": {"EXACT": 1}, "DROPPED": {ag.NOT_LISTED: 1}}
    assert got.not_audited == ["0.5.19 M/triton"]


def test_a_reading_marked_not_compared_is_listed_and_not_counted():
    """A reading that answers another question (``not_compared``) is neither compared nor counted in
    place of the audit's verdict; it is listed with why."""
    rd = (ag.Reading("0.5.23", "M/ascend", "DROPPED", "NPU", ("x.py:1",), "r", "part5",
                     not_compared="worst over a deepep branch"),
          ag.Reading("0.5.23", "M/triton", "EXACT", "CUDA", ("x.py:1",), "r", "part1"))
    rows = [{"path": "M/ascend", "verdict": "EXACT", "sglang_version": "0.5.23", "catalogued": False},
            {"path": "M/triton", "verdict": "EXACT", "sglang_version": "0.5.23", "catalogued": False}]
    got = ag.compare(rows, rd)
    assert (got.overall["agree"], got.overall["n"]) == (1, 1)
    assert got.not_compared == ["0.5.23 M/ascend: worst over a deepep branch"]
    assert got.as_json()["not_compared"] == got.not_compared
    counted = {c["path"]: (c["verdict"], c["source"]) for c in ag.counted_verdicts(rows, got, rd)}
    assert counted["M/ascend"] == ("EXACT", "machine") and counted["M/triton"] == ("EXACT", "hand")


def _readings_file(tmp_path, monkeypatch, text: str) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "hand_readings.yaml").write_text(text)
    monkeypatch.setattr(ag.resources, "files", lambda _pkg: tmp_path)
    ag.hand_readings.cache_clear()


@pytest.mark.parametrize("body, says", [
    ("- {release: '0.5.23', path: M/t, verdict: MAYBE, device: d, deciding: [a], reason: r, reader: p}", "not defined"),
    ("- {release: '0.5.23', path: M/t, verdict: EXACT, device: d, deciding: [a], reason: r, reader: p}\n"
     "- {release: '0.5.23', path: M/t, verdict: EXACT, device: d, deciding: [a], reason: r, reader: q}", "twice"),
    ("- {release: '0.5.23', path: M/t, verdict: EXACT, device: d, reason: r, reader: p}", "lacks"),
])
def test_bad_readings_are_named(tmp_path, monkeypatch, body, says):
    _readings_file(tmp_path, monkeypatch, "verdicts: {EXACT: e}\nreadings:\n" + body + "\n")
    try:
        with pytest.raises(HandReadingsError, match=says):
            ag.hand_readings()
    finally:
        ag.hand_readings.cache_clear()


def test_headline_counts_only_trustworthy_verdicts():
    """Catalogued and hand-read verdicts count (the hand verdict replaces the audit's), a kind
    with >= 95 % over >= 3 readings counts, everything else is machine reading, apart."""
    V = "0.5.23"

    def row(p: str, v: str, cat: bool = False) -> dict[str, Any]:
        return {"path": p, "verdict": v, "sglang_version": V, "catalogued": cat}

    def reading(p: str, v: str) -> ag.Reading:
        return ag.Reading(V, p, v, "CUDA", ("x.py:1",), "r", "part1")

    rd = (reading("A/good", "DROPPED"), reading("B/good", "DROPPED"), reading("C/good", "EXACT"),
          reading("A/bad", "DROPPED"), reading("B/bad", "EXACT"), reading("C/bad", "UNUSABLE"))
    main = [row("cat-1", "DROPPED", True), row("cat-2", "EXACT", True),
            row("A/good", "DROPPED"), row("B/good", "DROPPED"), row("C/good", "EXACT"),
            row("D/good", "DROPPED"),                              # trusted kind, not read: counted
            row("A/bad", "EXACT"), row("B/bad", "DROPPED"), row("C/bad", "DROPPED"),
            row("D/bad", "DROPPED"), row("E/bad", "DROPPED")]      # kind 'bad' 0/3: machine reading
    a = ag.compare(main, rd)
    assert a.trusted_kinds == ["good"] and a.by_kind["bad"]["agree"] == 0
    c = ag.stage_counts(main, a, V, rd)
    # counted DROPPED: cat-1; hand: A/good, B/good, A/bad (hand says DROPPED, the audit EXACT); D/good
    assert (c["dropped_catalogued"], c["dropped_hand"], c["dropped_trusted_kind"]) == (1, 3, 1)
    assert c["dropped_counted"] == 5 and (c["dropped_machine"], c["machine"]) == (2, 2)
    counted = ag.counted_verdicts(main, a, rd)
    measured = ag.ledger_measured(a, counted, c)
    s = findings._trusted_drops(measured)
    assert "5 MoE paths drop it (1 catalogued, 3 of the 6 hand-read derived paths, 1 of a trusted kind)" in s
    assert "puts 2 of the other 2 paths" in s and "not counted" in s and "`good`" in s
    assert measured["derived_counts"][V] == {"counted": {"DROPPED": 4, "EXACT": 2, "UNUSABLE": 1},
                                             "machine reading": {"DROPPED": 2}}


def test_headline_on_the_released_trees(rows):
    """On 0.5.23 the headline's DROPPED count is the catalogued DROPPED rows plus the hand-read
    DROPPED ones (no kind is trusted at the measured agreement), counted here from the data."""
    V = "0.5.23"
    main = [r for r in rows if r.sglang_version == V]
    hand = {r["path"]: r["verdict"] for r in yaml.safe_load(DATA.read_text())["readings"]
            if r["release"] == V and not r.get("not_compared")}
    a = ag.compare(rows)
    c = ag.stage_counts(main, a, V)
    cat = sum(r.catalogued and r.verdict.value == "DROPPED" for r in main)
    assert (c["dropped_catalogued"], c["hand_read"]) == (cat, len(hand))
    assert c["dropped_hand"] == sum(v == "DROPPED" for v in hand.values())
    if not a.trusted_kinds:
        assert c["dropped_counted"] == cat + c["dropped_hand"]
        assert c["dropped_machine"] == sum(not r.catalogued and r.path not in hand and r.verdict.value == "DROPPED"
                                           for r in main)
    s = findings._trusted_drops(ag.ledger_measured(a, ag.counted_verdicts(rows, a), c))
    assert f"{c['dropped_counted']} MoE paths drop it" in s and f"agreed on {a.overall['agree']}" in s


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "issue 36's bar, not met: the fifteenth sample (the 21 derived paths no sample had read, every one, drawn at "
    "8b7abd8 after the audit's last change, 9227d9e, each read by two blind readers of I1 .. I6 under C13.md "
    "unchanged, seen by no one who changed the audit) agreed on 19 of 21 (90.5 %) on 2026-12-07, held out (its "
    "readers agreed with each other on 21 of 21; misses: 0.5.23 GGUFMoEMethod/direct, read UNUSABLE (no GGUF name "
    "map for Ling in SGLang, the loader's fallback needs gguf/transformers to know the architecture), audited DROPPED; "
    "0.5.23 QuarkW4A8MXFp4MoE/aiter, whose limit reaches aiter's Triton moe_gemm_a8w4 on gfx1250, not in K.md, read "
    "UNDECIDED, audited APPROX); 21 is under the bar's 30 and no derived path of 0.5.19-0.5.23 is left unread, so "
    "the bar cannot be met on these releases; "
    "the fourteenth sample (30 of the 51 derived paths never read, drawn pooled at "
    "99b5b98, after the audit's then last change, each read by two blind readers of E1 .. E6 under C13.md, "
    "disagreements decided blind by X4, seen by no one who changed the audit) agreed on 25 of 30 (83.3 %) on "
    "2026-12-07, held out (its readers agreed with each other on 29 of 30; misses: a BF16 TRT-LLM routed path "
    "round 12 calls UNUSABLE for a fused shared expert, where SGLang's server-argument post-processing turns "
    "fusion off for TRT-LLM backends, read DROPPED; a per-tensor FP8 branch both readers left out after C13's "
    "FP8 block-size line, read APPROX, audited DROPPED; an FP8 method on the Ascend runner that builds no runner "
    "for FP8 experts and a MiniMax-M3-only quantization, read UNUSABLE, audited DROPPED; an NPU W4A8 int8 scheme "
    "whose constructor the audit finds raising, audited UNUSABLE, read DROPPED; one reader's citation of those "
    "server-argument overrides then guided a fix, r13a: 26 of 30 after it, not held-out evidence); the thirteenth (drawn at "
    "1eb349a, read twice the same way by O1 .. O6 under C12.md, decided by X3) agreed on 28 of 30 (93.3 %) on "
    "2026-12-07, held out (its readers agreed with "
    "each other on 29 of 30; misses: 0.5.20 Fp8MoEMethod/hpc_ops, whose runner refuses fused shared experts before "
    "it checks the limit while BailingMoeV3 fuses Ling's shared expert (FP8 on CUDA >= 8.0, shared and routed "
    "intermediate sizes equal), read UNUSABLE, audited REFUSED; 0.5.19 Mxfp4MoEMethod/triton_kernel, whose biases "
    "are always created on CUDA so the limit reaches triton_kernels' swiglu, read APPROX, audited DROPPED; it then "
    "guided the twelfth round: 30 of 30 after it, not held-out evidence); the twelfth (drawn at 3e6eca3, read twice the same way by N1 .. N6 under C11.md, decided by X2) agreed on 25 of 30 "
    "(83.3 %) on 2026-12-07, held out (its readers agreed with "
    "each other on 26 of 30; misses: an aiter key whose method builds Triton's runner with SGLANG_USE_AITER off, "
    "read ABSENT under C11's never-built line, audited EXACT; two NPU W8A8 int8 schemes that read weight offsets "
    "they never create, read UNUSABLE, audited DROPPED; the limit reaching triton_kernels' swiglu and a TRT-LLM "
    "routed FP8 kernel, read APPROX, audited DROPPED; it then guided the eleventh round: 25 of 30 after it, "
    "not held-out evidence); the eleventh (drawn at 67ab0f0, read twice the same way by "
    "M1 .. M6 under C10.md, decided by X1) agreed on 27 of 30 (90.0 %) on 2026-12-07, held out (its readers agreed with "
    "each other on 27 of 30; the three it misses are paths whose launch fails for a condition the key does not "
    "name, read ABSENT, audited UNUSABLE or DROPPED; it then guided the tenth round: 27 of 30 after it, the boundary stated in C11.md); the tenth (drawn at d61ebe3) agreed on 25 of 30 held out, "
    "then guided the change (names imported only under a false `if`, /native keys never run: 26 of 30 after it); "
    "the ninth (drawn at "
    "462e3cd) agreed on 25 of 30 held out, then guided the change "
    "(pre-permute payload reads, methods selected for another model, LoRA-only cores, the runner a method builds: "
    "28 of 30 after it, not held-out evidence); the eighth (drawn at "
    "e94a230) agreed on 25 of 30 held out, then guided the "
    "change (environment reads at their defaults: 26 of 30 after it, 27 after the ninth's, not held-out evidence); "
    "the seventh (drawn "
    "at 990a2a1) agreed on 25 of 30 held out, then guided the change (26 of 29 after it, G4's reading not compared); "
    "strict: passing means the audit reached the bar, and this mark must go"))
def test_the_held_out_sample_agrees_at_95_percent(doc, rows):
    """Issue 36: at least 95 % over a fresh blind sample of at least 30 derived paths drawn after the
    last change of the audit and seen by no one who changed it (:data:`agreement.HELD_OUT`)."""
    from held_out import audit_commits_since, drawn_at

    since = audit_commits_since(drawn_at(doc["method"][f"{ag.HELD_OUT}_sample"]))
    assert not since, f"the {ag.HELD_OUT} sample no longer held out: the audit changed after its draw ({since})"
    audit = _verdict_of(rows)
    held = [r for r in doc["readings"] if r.get("sample") == ag.HELD_OUT]
    k = sum(r["verdict"] == audit.get((r["release"], r["path"]), "NOT LISTED") for r in held)
    assert len(held) >= 30 and k / len(held) >= 0.95, (k, len(held))
