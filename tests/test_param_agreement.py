"""Agreement of the parameter audit (``audit-sglang --param``) with blind hand readings (issue 36).

The readings (``sglang/data/param_hand_readings.yaml``) are made by readers who did not write the
audit; this file tests the machinery on synthetic readings and holds the audit to >= 95 % over
whatever real readings the file has (a clear skip while it is absent or empty)."""

from __future__ import annotations

import math
import textwrap
from collections import Counter

import pytest

from nvfp4study.core.errors import HandReadingsError
from nvfp4study.sglang import agreement as ag
from nvfp4study.sglang.audit import audit_tree
from nvfp4study.sglang.param_audit import audit_param
from sglang_fixtures import released


def _wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return c - h, c + h


SYNTH = textwrap.dedent("""\
    method: {blind: true, seeds: [1], readers: 2}
    readings:
      - release: "0.5.23"
        path: nvfp4-w4a4-cutlass
        device: NVIDIA Blackwell (CUDA)
        reader: r1
        readings:
          routed_scaling_factor: {verdict: DROPPED, deciding: ["x.py:1 what"], reason: r}
          grouped_topk: {verdict: APPLIED, deciding: ["y.py:2 what"], reason: r}
      - release: "0.5.23"
        path: triton
        device: NVIDIA GPU (CUDA)
        reader: r2
        readings:
          routed_scaling_factor: {verdict: APPLIED, deciding: ["z.py:3 what"], reason: r}
      - release: "0.5.23"
        path: marlin
        device: NVIDIA GPU (CUDA)
        reader: r2
        readings:
          routed_scaling_factor: {verdict: DOUBLE, deciding: ["z.py:4 what"], reason: r}
      - release: "0.5.18"
        path: triton
        device: NVIDIA GPU (CUDA)
        reader: r2
        readings:
          routed_scaling_factor: {verdict: APPLIED, deciding: ["z.py:5 what"], reason: r}
    """)


def _rows(param: str, verdicts: dict[str, str]) -> list[dict]:
    return [{"path": p, "verdict": v, "sglang_version": "0.5.23", "catalogued": True, "param": param}
            for p, v in verdicts.items()]


def test_synthetic_readings_are_compared_per_parameter(tmp_path):
    f = tmp_path / "param_hand_readings.yaml"
    f.write_text(SYNTH)
    method, readings = ag.param_hand_readings(f)
    assert method["readers"] == 2 and sorted(readings) == ["grouped_topk", "routed_scaling_factor"]
    assert len(readings["routed_scaling_factor"]) == 4
    rows = {"routed_scaling_factor": _rows("routed_scaling_factor", {
        "nvfp4-w4a4-cutlass": "DROPPED", "triton": "APPLIED", "marlin": "APPLIED"})}
    res = ag.param_agreement(rows, readings)
    rsf = res["routed_scaling_factor"]
    # 2 of the 3 readings on the audited release agree; the 0.5.18 one is left out
    assert (rsf["overall"]["agree"], rsf["overall"]["n"]) == (2, 3)
    lo, hi = _wilson(2, 3)
    assert rsf["overall"]["wilson95"] == pytest.approx([lo, hi], abs=1e-9)
    assert rsf["confusion"] == {"DROPPED": {"DROPPED": 1}, "APPLIED": {"APPLIED": 1}, "DOUBLE": {"APPLIED": 1}}
    assert rsf["not_audited"] == ["0.5.18 triton"]
    assert "2 of 3 paths (66.7 %, Wilson 95 %" in rsf["sentence"]
    # a parameter read by hand but not audited is not run, said so
    assert res["grouped_topk"] == {"not_run": "no audit rows of it"}
    assert "grouped_topk: agreement not run (no audit rows of it)." in ag.param_agreement_sentence(res)


def test_a_path_the_audit_does_not_list_disagrees(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text(SYNTH)
    _, readings = ag.param_hand_readings(f)
    res = ag.param_agreement({"routed_scaling_factor": _rows("routed_scaling_factor", {"triton": "APPLIED"})},
                             readings)["routed_scaling_factor"]
    assert (res["overall"]["agree"], res["overall"]["n"]) == (1, 3)
    assert res["confusion"]["DROPPED"] == {ag.NOT_LISTED: 1}


def test_absent_or_empty_file_is_not_run(tmp_path):
    assert ag.param_hand_readings(tmp_path / "none.yaml") == ({}, {})
    (tmp_path / "empty.yaml").write_text("")
    assert ag.param_hand_readings(tmp_path / "empty.yaml") == ({}, {})
    assert ag.param_agreement_sentence({}).startswith("Parameters other than the clamp: not run")


@pytest.mark.parametrize(("edit", "message"), [
    ("verdict: DOUBLE, deciding: [\"z.py:4 what\"]", None),
    ("verdict: EXACT, deciding: [\"z.py:4 what\"]", "verdict 'EXACT' is not one of APPLIED, DROPPED, DOUBLE"),
])
def test_bad_verdict_is_a_named_error(tmp_path, edit, message):
    text = SYNTH.replace("verdict: DOUBLE, deciding: [\"z.py:4 what\"]", edit)
    f = tmp_path / "r.yaml"
    f.write_text(text)
    if message is None:
        ag.param_hand_readings(f)
    else:
        with pytest.raises(HandReadingsError, match=message):
            ag.param_hand_readings(f)


@pytest.mark.parametrize(("old", "new", "message"), [
    ("grouped_topk: {verdict", "routing_bias: {verdict", "'routing_bias' is not a followed parameter"),
    ("    reader: r1\n", "", "lacks 'reader'"),
    ('deciding: ["z.py:3 what"], reason: r}', 'deciding: ["z.py:3 what"]}', "lacks 'reason'"),
    ("path: marlin", "path: triton", "0.5.23 triton routed_scaling_factor appears twice"),
])
def test_malformed_readings_are_named_errors(tmp_path, old, new, message):
    assert old in SYNTH
    f = tmp_path / "r.yaml"
    f.write_text(SYNTH.replace(old, new, 1))
    with pytest.raises(HandReadingsError, match=message):
        ag.param_hand_readings(f)


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "issue 36's bar, not met: the tenth sample of parameter readings (30 paths drawn at 36d2531, after the "
    "audit's last change, 9227d9e, each read by two blind readers of D1 .. D6 under R8.md, the two disagreements "
    "decided blind by Y5c, seen by no one who changed the audit) agreed on 2026-12-07 for routed_scaling_factor on "
    "27 of 30 (90.0 %), norm_topk_prob 28, correction_bias 28, grouped_topk 28 (93.3 %), held out (its readers "
    "agreed with each other on 28 / 30 / 30 / 30; misses: 0.5.20 fused:flashinfer/flashinfer_cutlass, whose prefill "
    "gets a dispatch output without moe_output (the ninth's class, not yet in the audit), read UNUSABLE, audited "
    "DOUBLE / APPLIED; 0.5.23 fp8-trtllm, read UNUSABLE for FlashInfer's DeepSeekV3 routing from the logits with 64 "
    "experts per group (F-05; its SGLang-side top-k fallback needs padding or expert remapping, off on one GPU), "
    "audited APPLIED while 0.5.22's is UNUSABLE; 0.5.22 MoeWNA16Method/triton, decided APPLIED on SGLang's comment "
    "that the compiled moe_sum_reduce applies the factor, audited UNDECIDED); "
    "the ninth sample of parameter readings (30 paths drawn at 99b5b98, after the "
    "parameter audit's then last change, each read by two blind readers of B1 .. B6 under R8.md, disagreements decided "
    "blind by Y4a, seen by no one who changed the audit) agreed on 2026-12-07 on 27 of 30 for each parameter "
    "(90.0 %), held out (its readers agreed with each other on 25 / 27 / 27 / 27; misses: the BF16 TRT-LLM and TRT-LLM "
    "routed paths round 12 calls UNUSABLE for a fused shared expert that SGLang's server arguments turn off for those "
    "backends, read UNDECIDED / APPLIED; 0.5.19 fused:flashinfer/flashinfer_cutlass, whose prefill reaches the fused "
    "function as a standard dispatch output without moe_output, decided UNUSABLE, audited DOUBLE / APPLIED; a clamp "
    "reader's citation of the server-argument overrides then guided a fix, r13a: 29 of 30 each after it, not held-out "
    "evidence); the eighth "
    "(drawn at 1eb349a, read twice the same way by Z1 .. Z6 under R7.md, decided by Y3a) agreed on 2026-12-07 for "
    "routed_scaling_factor on 25 of 30, "
    "norm_topk_prob 28, correction_bias 28, grouped_topk 28, held out (its readers agreed with each other on 27 / 28 / "
    "28 / 28; misses: four Triton/Marlin paths whose tail hands the factor to the compiled sgl-kernel moe_sum_reduce "
    "above 32 tokens, read UNDECIDED under KP.md (its source applies it once but is not tied to the pinned wheels), "
    "audited APPLIED; a MiniMax-M3-only method that reads a layer attribute only that model sets, read UNUSABLE, "
    "audited APPLIED; a Quark MXFP4 aiter scheme that re-routes from the logits with aiter's softmax top-k on gfx1250, "
    "read WRONG / DROPPED for the routing parameters, audited APPLIED; it then guided the twelfth round: 29 / 29 / "
    "29 / 29 after it, not held-out evidence); the seventh (drawn at 3e6eca3, read twice "
    "the same way by U1 .. U6 under R6.md, decided by Y2a) agreed on 2026-12-07 for "
    "routed_scaling_factor on 27 of 30, norm_topk_prob 30, correction_bias 30, grouped_topk 30, held out (its readers "
    "agreed with each other on 29 of 30 for each parameter; routed_scaling_factor misses: the compiled sgl-kernel "
    "moe_sum_reduce the Triton path hands it above 32 tokens, not in KP.md, adjudicated UNDECIDED and audited "
    "APPLIED; two TRT-LLM routed paths read APPLIED, audited UNDECIDED for an XPU branch or an unread per-tensor "
    "routed op; it then guided the eleventh round: 29 / 30 / 30 / 30 after it, not held-out evidence); the sixth (drawn at 67ab0f0, read twice the same way by W1 .. W6 under R5.md, decided by Y1) agreed "
    "for routed_scaling_factor on 24 of 30, norm_topk_prob 28, correction_bias 28, grouped_topk 28, held out (its "
    "readers agreed with each other on 28 of 30 for each parameter; misses: TRT-LLM routed paths whose other "
    "branches the readers found raising, read APPLIED, audited UNDECIDED; modelopt-nvfp4-trtllm's Default routing "
    "method read DROPPED, audited UNDECIDED; two LoRA paths read ABSENT / APPLIED, audited UNUSABLE / ABSENT; it then guided the tenth round: 28 / 29 / 29 / 29 "
    "after it, not held-out evidence); the "
    "fifth (drawn at d61ebe3) agreed on 25 / 22 / 23 / 23 held out, then guided the change (names imported only "
    "under a false `if`, /native keys never run, E8M0 scales on Marlin, KP.md's kernel facts and F-05's routing "
    "check: 27 / 24 / 25 / 25 after it, not held-out evidence); the fourth (drawn at 462e3cd) agreed on 24 / 28 / 27 / 28 held out, then guided the change (combine kernels in a method's own "
    "call, the runner a method builds, methods selected for another model, LoRA-only cores, pre-permute payload "
    "reads: 27 / 28 / 27 / 28 after it, not held-out evidence); the third (drawn at e94a230) agreed on 20 / 25 / 24 / 24 "
    "held out, then guided the change (26 / 25 / 24 / 24 after it, 27 / 26 / 25 / 25 after the fourth's, not held-out "
    "evidence); the second (drawn at 990a2a1: 21 / 19 / 19 / 20 held out) then guided the change and agrees on "
    "27 / 25 / 25 / 26 (27 / 25 / 24 / 25 after F-05's check); the first (35, guiding) on 29 / 31 / 31 / 31; "
    "strict: passing means every parameter reached the bar on the held-out sample, and this mark must go"))
def test_the_audit_agrees_with_the_stored_readings():
    """>= 95 % per parameter over the held-out sample of blind readings (:data:`agreement.PARAM_HELD_OUT`,
    drawn after the parameter audit's last change; not run while there are none)."""
    from held_out import audit_commits_since, drawn_at

    method, readings = ag.param_hand_readings()
    if not readings:
        pytest.skip(f"not run: no blind hand readings in sglang/{ag.PARAM_READINGS} yet")
    since = audit_commits_since(drawn_at(method[f"{ag.PARAM_HELD_OUT}_sample"]))
    assert not since, f"the {ag.PARAM_HELD_OUT} sample no longer held out: the audit changed after its draw ({since})"
    clamp = {v: audit_tree(released(v)) for v in sorted({rd.release for rds in readings.values() for rd in rds})}
    rows = {name: [r.as_json() for v in sorted({rd.release for rd in rds})
                   for r in audit_param(released(v), name, clamp_rows=clamp[v])]  # one clamp audit per release
            for name, rds in readings.items()}
    res = ag.param_agreement(rows, readings)
    held = {k: x.get("by_sample", {}).get(ag.PARAM_HELD_OUT) for k, x in res.items()}
    low = {k: (h["agree"], h["n"]) if h else None for k, h in held.items()
           if not h or h["n"] < 30 or h["rate"] < ag.MIN_AGREEMENT}
    assert not low, low


def test_stage_writes_the_parameter_agreement(tmp_path, monkeypatch):
    """Stage 03's cell: synthetic readings of 0.5.23 against the real audit of 0.5.23; the JSON is written."""
    import json

    from nvfp4study.core.params import DEFAULT_PARAMS
    from nvfp4study.core.stage import open_stage
    from nvfp4study.stages import s03_sglang as s3

    f = tmp_path / "r.yaml"
    f.write_text(SYNTH)
    synth = ag.param_hand_readings(f)
    monkeypatch.setattr(ag, "param_hand_readings", lambda path=None: synth)
    st = open_stage("03_patch_sglang", str(DEFAULT_PARAMS), str(tmp_path / "run"))
    rows = s3.param_audit(st, [{"path": "triton", "verdict": "EXACT", "sglang_version": "0.5.23"}])
    written = json.loads((tmp_path / "run" / "data" / "sglang_param_audit.json").read_text())["params"]
    assert written == rows and set(rows) == {"routed_scaling_factor", "norm_topk_prob", "correction_bias",
                                             "grouped_topk"}
    assert {r["sglang_version"] for rs in rows.values() for r in rs} == {"0.5.23"}
    # routing: followed (param_routing): the card's path routes in TopK with Ling's groups, triton_kernels
    # routes without them
    by_path = {r["path"]: r["verdict"] for r in rows["grouped_topk"]}
    assert by_path["nvfp4-w4a4-cutlass"] == "APPLIED" and by_path["triton-kernels"] == "DROPPED"
    assert {r["verdict"] for r in rows["norm_topk_prob"]} <= {"APPLIED", "DROPPED", "WRONG", "REFUSED", "UNUSABLE",
                                                             "ABSENT", "UNDECIDED"}
    res = s3.param_agreement(st, rows)
    rsf = res["agreement"]["routed_scaling_factor"]
    # the audit: card path DROPPED, Triton UNDECIDED (round 12: its epilogue hands the factor to the compiled
    # sgl-kernel moe_sum_reduce on CUDA above 32 tokens, whose form for the pinned wheels is not known; the
    # synthetic reading says APPLIED), Marlin DROPPED (the synthetic reading says DOUBLE); the Marlin runner's row
    # takes its worst caller, Mxfp4MoEMethod/marlin, whose E8M0 scales fused_marlin_moe sums plainly
    assert (rsf["overall"]["agree"], rsf["overall"]["n"]) == (1, 3)
    assert rsf["confusion"]["DOUBLE"] == {"DROPPED": 1} and rsf["confusion"]["APPLIED"] == {"UNDECIDED": 1}
    assert json.loads((tmp_path / "run" / "data" / "sglang_param_agreement.json").read_text()) == res["agreement"]
    assert "routed_scaling_factor: the audit agreed with a blind hand reading on 1 of 3" in res["sentence"]


def test_the_stored_readings_are_the_documented_sample():
    """The first 35 readings are exactly the header's draw: 7 per release, readers R1 .. R5 got every
    fifth pair; the second to tenth 30 each (the tenth held out: drawn after the parameter audit's last change)
    are re-drawn here from today's audit keys less the earlier samples' pairs: 6 per release, readers
    Q1 .. Q4, P1 .. P4, T1 .. T4 and V1 .. V4 every fourth pair; the sixth's pairs each read by two readers
    (W1 .. W6), the seventh's to tenth's too (U1 .. U6, Z1 .. Z6, B1 .. B6, D1 .. D6). One reading per pair, each with the four parameters, file:line evidence and a reason."""
    import random

    method, readings = ag.param_hand_readings()
    pairs = method["sample"]["pairs"]
    assert len(pairs) == 35 and len({tuple(p) for p in pairs}) == 35
    assert Counter(v for v, _ in pairs) == {v: 7 for v in method["sample"]["releases"]}
    keys = {v: sorted(r.path for r in audit_tree(released(v))) for v in method["sample"]["releases"]}

    def redraw(sample: dict, exclude: list) -> list:
        rng, out = random.Random(sample["seed"]), []
        for v in sample["releases"]:
            out += [[v, k] for k in rng.sample([k for k in keys[v] if [v, k] not in exclude], sample["per_release"])]
        rng.shuffle(out)
        return out

    # each later sample re-drawn from the keys less every earlier sample's pairs, in the order drawn
    drawn, before = {}, list(pairs)
    for s in ("second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth"):
        drawn[s] = redraw(method[f"{s}_sample"], before)
        assert method[f"{s}_sample"]["pairs"] == drawn[s] and len(drawn[s]) == 30, s
        assert not {tuple(p) for p in before} & {tuple(p) for p in drawn[s]}, s
        before += drawn[s]
    want, third, fourth, fifth = drawn["second"], drawn["third"], drawn["fourth"], drawn["fifth"]
    for name in ("routed_scaling_factor", "norm_topk_prob", "correction_bias", "grouped_topk"):
        got = readings[name]
        by = {s: [r for r in got if r.sample == s]
              for s in ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth")}
        assert sum(map(len, by.values())) == len(got) and ag.PARAM_HELD_OUT == "tenth"
        # the sixth to tenth: each pair read by two readers, pairs[t::3] by W(2t+1) and W(2t+2) (U for the
        # seventh, Z for the eighth, B for the ninth, D for the tenth), in draw order; where they disagree on this parameter a Y
        # reader decided (A.md)
        for s, prefix in (("sixth", "W"), ("seventh", "U"), ("eighth", "Z"), ("ninth", "B"), ("tenth", "D")):
            assert [[r.release, r.path] for r in by[s]] == drawn[s], (name, s)
            for i, r in enumerate(by.pop(s)):
                t = i % 3
                assert [x for x, _ in r.readers] == [f"{prefix}{2 * t + 1}", f"{prefix}{2 * t + 2}"], (name, r.path)
                assert (r.adjudicator.startswith("Y")) == (r.readers[0][1] != r.readers[1][1]), (name, r.path)
        for s, single, prefix, k in (("first", pairs, "R", 5), ("second", want, "Q", 4), ("third", third, "P", 4),
                                     ("fourth", fourth, "T", 4), ("fifth", fifth, "V", 4)):
            assert sorted([r.release, r.path] for r in by[s]) == sorted(single), (name, s)
            for i in range(1, k + 1):
                assert sorted([r.release, r.path] for r in by[s] if r.reader == f"{prefix}{i}") == sorted(
                    single[i - 1::k]), (name, s, i)
        assert all(r.deciding and r.reason for r in got)
