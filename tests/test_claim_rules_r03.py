"""Stage 03's claim rules (``stages/claim_rules/r03_sglang.py``) row by row, every field, on
hand-made audit rows, source checks, round trips and numerics (issue 37's mutation benchmark; the
stage's tests build SGLang trees, too slow for it): each verdict's edges on both sides, each
refusal's words. Expected notes are written out here."""

from __future__ import annotations

import json

import pytest

from nvfp4study.core.claim_rules import Row
from nvfp4study.core.errors import StageInputMissing
from nvfp4study.core.paths import RunPaths
from nvfp4study.stages.claim_rules import r03_sglang as r03

V = "0.5.23"
ON = "sglang 0.5.23"
GPU = "GPU check (kernels measured)."
PROMOTES = ": FlashInfer promotes Swiglu + swiglu_limit to SwigluBias, the pre-SiLU GPT-OSS form"


def arow(path: str, verdict: str, rule: str = "r", version: str = V, file: str | None = "moe.py", line: int = 10,
         **kw) -> dict:
    return {"sglang_version": version, "path": path, "verdict": verdict, "rule": rule, "file": file, "line": line,
            **kw}


def allv(*per: tuple[str, str, str, str]) -> list[dict]:
    """``(version, cutlass verdict, trtllm verdict, trtllm rule)`` -> the audit rows of each release."""
    out = []
    for v, c, t, rule in per:
        out += [arow("nvfp4-w4a4-cutlass", c, f"cut rule {v}", v, "cut.py", 100),
                arow("nvfp4-w4a4-trtllm", t, rule, v, "trt.py", 200), arow("triton", "EXACT", "x", v)]
    return out


LIT = "literal gemm1_clamp_limit=None passed"
ALLV = allv(("0.5.21", "APPROX", "UNUSABLE", "assert; literal gemm1_clamp_limit=None at sglang/srt/a/b.py:7 kept"),
            (V, "DROPPED", "UNUSABLE", LIT))


def checks(alloc="torch.empty", scheme=None, fusion=None, md=None) -> dict:
    return {"input_global_scales": {"w13": {"alloc": alloc, "line": 11}, "w2": {"alloc": "torch.empty", "line": 12}},
            "moe_scheme": {"W4A16@sm100": scheme or {"error": "AttributeError: 'NoneType' has no num_bits",
                                                     "function": "get_moe_scheme", "line": 5}},
            "shared_fusion": fusion if fusion is not None else {
                "evaluations": {"shared experts in ignore (regex)": {"fusion_disabled": False},
                                "shared experts only untargeted": {"fusion_disabled": False}},
                "considers_clamp_lists": True, "file": "bailing.py", "line": 77},
            "min_deepgemm_dim": md or {"value": 16, "line": 40, "guard": "N < 16", "guard_lines": [41],
                                       "n32_to_deepgemm": True, "reraise_line": 55, "other": 1}}


KERNELS = {"summary": {"forms": {"flashinfer_cutlass/sglang_swiglu": "pre_silu",
                                 "flashinfer_cutlass/swiglu_step": "post_silu", "sglang_triton/clamp": "post_silu",
                                 "extra/form": "x"},
                       "sentence": "kernels measured", "machine": "NVIDIA H200", "date": "2026-01-02"},
           "copy": "data/kernels.json"}


@pytest.fixture
def mk(tmp_path):
    def make(**over) -> r03.SGLangMeasurements:
        f = {"paths": RunPaths(tmp_path), "version": V, "allv": ALLV,
             "m": {r["path"]: r for r in ALLV if r["sglang_version"] == V},
             "chk": {"0.5.21": checks(alloc="torch.zeros"), V: checks()}, "rt": [], "num": {"rows": []},
             "cpf": {"run": False, "reason": "cell not run"}, "kernels": KERNELS, "agreement": None}
        return r03.SGLangMeasurements(**{**f, **over})
    return make


def d(tmp_path, stem: str) -> str:
    return tmp_path / "data" / f"{stem}.json"


# --- helpers and the measurements -----------------------------------------------------------------
def test_where_and_literal_none():
    assert r03.where({"file": "a.py", "line": 3}) == "a.py:3"
    assert r03.where({"file": None, "line": 3}) == "-" and r03.where({"file": ""}) == "-" and r03.where({}) == "-"
    assert r03.literal_none({"rule": "literal None", "file": "t.py", "line": 9}) == "t.py:9"
    assert r03.literal_none({"rule": "x literal gemm1_clamp_limit=None at sglang/srt/a/b.py:7 kept"}) == "a/b.py:7"
    assert r03.literal_none({"rule": "y literal gemm1_clamp_limit=None at a/b.py:17, then"}) == "a/b.py:17"
    assert r03.literal_none({"rule": "UNUSABLE: assert routing_method_type", "file": "t.py", "line": 9}) is None
    assert r03.literal_none({"rule": "y literal gemm1_clamp_limit=None at a/b.py:x"}) is None


def test_gather_reads_the_files(tmp_path):
    p = RunPaths(tmp_path)
    with pytest.raises(StageInputMissing, match=r"sglang_audit\.json is missing: run the cells above first$"):
        r03.SGLangMeasurements.gather(p, V, KERNELS)
    main = [arow("triton", "EXACT")]
    for stem, val in (("sglang_audit", main), ("sglang_audit_versions", ALLV), ("sglang_checks", {V: 1}),
                      ("sglang_patch_roundtrip", [{"rt": 1}])):
        p.data(stem).write_text(json.dumps(val))
    with pytest.raises(StageInputMissing, match=r"clamp_numerics\.json is missing"):
        r03.SGLangMeasurements.gather(p, V, KERNELS)
    p.data("clamp_numerics").write_text(json.dumps({"rows": [1]}))
    x = r03.SGLangMeasurements.gather(p, V, KERNELS)
    assert (x.paths, x.version, x.allv, x.m, x.chk, x.rt, x.num, x.cpf, x.kernels, x.agreement) == (
        p, V, ALLV, {"triton": main[0]}, {V: 1}, [{"rt": 1}], {"rows": [1]}, {"run": False, "reason": "cell not run"},
        KERNELS, None)
    p.data("sglang_card_patches").write_text(json.dumps({"run": True}))
    assert r03.SGLangMeasurements.gather(p, V, KERNELS).cpf == {"run": True}


def test_measurement_properties(mk, tmp_path):
    x = mk(rt=[{"sglang": V, "mode": "card", "n": 1}, {"sglang": "0.5.20", "mode": "exact", "n": 2},
               {"sglang": "0.5.20", "mode": "card", "n": 3}])
    assert x.on == ON and x.d("s") == d(tmp_path, "s") and x.versions == ["0.5.21", V]
    assert x.per == {"0.5.21": {"cutlass": "APPROX", "trtllm": "UNUSABLE", "literal_none": "a/b.py:7"},
                     V: {"cutlass": "DROPPED", "trtllm": "UNUSABLE", "literal_none": "trt.py:200"}}
    assert x.cut["rule"] == "cut rule 0.5.23" and x.trt["rule"] == LIT
    assert x.roundtrip("0.5.20", "card")["n"] == 3 and x.roundtrip(V, "card")["n"] == 1
    assert x.roundtrip(V, "exact") is None and x.gpu_sentence == GPU


# --- the stored GPU measurement and the agreement -------------------------------------------------
def test_clamp_kernels_measured(mk):
    note = ("kernels measured. Probe inputs make each output one SwiGLU value; a form is the kernel's when >= 99% "
            "of the elements that separate the forms match it bit for bit.")
    on = "NVIDIA H200, 2026-01-02 (stored measurement, not made by this run)"
    forms = {"flashinfer_cutlass/sglang_swiglu": "pre_silu", "flashinfer_cutlass/swiglu_step": "post_silu",
             "sglang_triton/clamp": "post_silu"}
    assert r03.clamp_kernels_measured(mk()) == Row(forms, "reproduced", ["data/kernels.json"], note, on)
    for k in forms:
        for bad in ("pre_silu" if forms[k] == "post_silu" else "post_silu", None):
            fm = {**forms, k: bad} if bad else {f: v for f, v in forms.items() if f != k}
            kern = {**KERNELS, "summary": {**KERNELS["summary"], "forms": fm}}
            row = r03.clamp_kernels_measured(mk(kernels=kern))
            assert row == Row({**forms, k: bad}, "contradicted", ["data/kernels.json"], note, on), (k, bad)


def test_audit_agreement(mk, monkeypatch, tmp_path):
    from nvfp4study.sglang import agreement as ag

    with pytest.raises(StageInputMissing, match=r"^the audit agreement was not computed: run the cell that writes "
                                                r"data/sglang_audit_agreement\.json first$"):
        r03.audit_agreement(mk())
    seen = []

    def fake(res, rows, version):
        seen.append((res, rows, version))
        return {"measured": {"n": 3}, "verdict": "partly", "note": "agree", "checked_on": "hand"}

    monkeypatch.setattr(ag, "finding", fake)
    x = mk(agreement={"a": 1})
    assert r03.audit_agreement(x) == Row({"n": 3}, "partly", [d(tmp_path, "sglang_audit_agreement"),
                                                               d(tmp_path, "sglang_audit_versions")], "agree", "hand")
    assert seen == [({"a": 1}, list(x.m.values()), V)]


# --- the card's claims -----------------------------------------------------------------------------
def dropped_note(cut: str, lit: str, trt: str, per: str) -> str:
    return (f"On 0.5.23 the literal gemm1_clamp_limit=None is in the TRT-LLM branch ({lit}; the branch is {trt} at "
            f"trt.py:200), while the CUTLASS branch Ling runs on is {cut} (cut.py:100: {'c' * 120}). {per}. " + GPU)


@pytest.mark.parametrize("cut,rule,verdict", [
    ("DROPPED", LIT, "reproduced"), ("DROPPED", "UNUSABLE", "partly"),
    ("APPROX", LIT, "partly"), ("APPROX", "UNUSABLE", "contradicted"),
])
def test_clamp_nvfp4_dropped(mk, tmp_path, cut, rule, verdict):
    rows = allv(("0.5.21", "APPROX", "DROPPED", "r"), (V, cut, "UNUSABLE", rule))
    rows[3] = {**rows[3], "rule": "c" * 121}
    x = mk(allv=rows, m={r["path"]: r for r in rows if r["sglang_version"] == V})
    lit = "trt.py:200" if rule == LIT else None
    per = f"0.5.21: CUTLASS APPROX, TRT-LLM DROPPED; 0.5.23: CUTLASS {cut}, TRT-LLM UNUSABLE"
    assert r03.clamp_nvfp4_dropped(x) == Row(
        {"0.5.21": {"cutlass": "APPROX", "trtllm": "DROPPED", "literal_none": None},
         V: {"cutlass": cut, "trtllm": "UNUSABLE", "literal_none": lit}}, verdict,
        [d(tmp_path, "sglang_audit"), d(tmp_path, "sglang_audit_versions"), "data/kernels.json"],
        dropped_note(cut, str(lit), "UNUSABLE", per), ON)


RUNNERS = ("triton", "marlin", "ascend", "deep-gemm", "deep-gemm-contiguous", "mxint4-trtllm")


def runners(**verdicts) -> dict:
    """Audit rows of every card runner's paths, EXACT unless given (None: not audited)."""
    out = {}
    for p in RUNNERS:
        v = verdicts.get(p.replace("-", "_"), "EXACT")
        if v is not None:
            out[p] = arow(p, v, f"rule of {p}")
    return out


def test_others_forward_reproduced(mk, tmp_path):
    m = runners(marlin="APPROX")
    assert r03.clamp_others_forward(mk(m=m)) == Row(
        {"triton": {"triton": "EXACT"}, "marlin": {"marlin": "APPROX"}, "ascend": {"ascend": "EXACT"},
         "deep_gemm": {"deep-gemm": "EXACT", "deep-gemm-contiguous": "EXACT"}, "mxint4": {"mxint4-trtllm": "EXACT"}},
        "reproduced", [d(tmp_path, "sglang_audit")],
        "Forward the limit: triton, marlin, ascend, deep_gemm, mxint4. Drop it: none.", ON)


def test_others_forward_dropped_and_skipped(mk):
    m = runners(marlin="DROPPED", deep_gemm="ABSENT", deep_gemm_contiguous="DROPPED", ascend=None,
                mxint4_trtllm="UNUSABLE")
    row = r03.clamp_others_forward(mk(m=m))
    assert row.measured == {"triton": {"triton": "EXACT"}, "marlin": {"marlin": "DROPPED"},
                            "deep_gemm": {"deep-gemm-contiguous": "DROPPED"}}
    assert row.verdict == "contradicted"
    assert row.note == ("Forward the limit: triton. Drop it: marlin (rule of marlin), deep_gemm (rule of "
                        "deep-gemm-contiguous). Skipped (no decided audit row): ascend (not audited), deep-gemm "
                        "(ABSENT), mxint4-trtllm (UNUSABLE). Runners not checked: ascend, mxint4.")
    two = r03.clamp_others_forward(mk(m=runners(deep_gemm="DROPPED", deep_gemm_contiguous="OTHER")))
    assert two.verdict == "contradicted"
    assert two.note == ("Forward the limit: triton, marlin, ascend, mxint4. Drop it: deep_gemm (rule of deep-gemm; "
                        "rule of deep-gemm-contiguous).")
    one = r03.clamp_others_forward(mk(m=runners(deep_gemm="EXACT", deep_gemm_contiguous="DROPPED")))
    assert one.verdict == "contradicted" and "Drop it: deep_gemm (rule of deep-gemm; rule of " in one.note


def test_others_forward_partly_and_not_run(mk, tmp_path):
    row = r03.clamp_others_forward(mk(m=runners(triton="UNDECIDED", marlin="APPROX")))
    assert row.verdict == "partly" and "triton" not in row.measured
    assert row.note == ("Forward the limit: marlin, ascend, deep_gemm, mxint4. Drop it: none. Skipped (no decided "
                        "audit row): triton (UNDECIDED). Runners not checked: triton.")
    part = r03.clamp_others_forward(mk(m=runners(deep_gemm="UNUSABLE")))
    assert part.verdict == "reproduced" and part.measured["deep_gemm"] == {"deep-gemm-contiguous": "EXACT"}
    assert part.note.endswith("Drop it: none. Skipped (no decided audit row): deep-gemm (UNUSABLE).")
    none = r03.clamp_others_forward(mk(m={"other": arow("other", "EXACT")}))
    assert none == Row(None, "not run", [d(tmp_path, "sglang_audit")],
                       "Forward the limit: none. Drop it: none. Skipped (no decided audit row): triton (not audited), "
                       "marlin (not audited), ascend (not audited), deep-gemm (not audited), deep-gemm-contiguous (not "
                       "audited), mxint4-trtllm (not audited). Runners not checked: triton, marlin, ascend, deep_gemm, "
                       "mxint4.", ON)


def test_form_verdict():
    assert [r03._form_verdict(v) for v in ("EXACT", "APPROX", "DROPPED", None)] == [
        "reproduced", "partly", "contradicted", "contradicted"]


RT = [{"sglang": "0.5.20", "mode": "card", "cutlass_verdict": "APPROX", "cutlass_rule": "k" * 201},
      {"sglang": V, "mode": "exact", "cutlass_verdict": "EXACT", "verify_ok": True, "idempotent": True,
       "byte_identical_after_revert": True, "extra": 0},
      {"sglang": V, "mode": "card", "cutlass_verdict": "DROPPED"},
      {"sglang": "0.5.20", "mode": "exact", "cutlass_verdict": "DROPPED"}]
OTHERS = "Stock SGLang 0.5.23: CUTLASS DROPPED; our 'exact' patch on 0.5.23: EXACT."


def test_cutlass_fix_from_our_reconstruction(mk, tmp_path):
    ev = [d(tmp_path, "sglang_patch_roundtrip"), d(tmp_path, "sglang_audit_versions")]
    fix = {"card_patch_on_0.5.20": "APPROX", "stock_0.5.23": "DROPPED", "exact_patch_on_0.5.23": "EXACT"}
    tail = (f". {OTHERS} An exact fix selects ActivationType.SwigluStep, which our 'exact' patch does.")
    assert r03.clamp_cutlass_fix(mk(rt=RT)) == Row(
        fix, "partly", ev, "OUR reconstruction of the card's three edits (patches/0.5.20/card; the card's own files: "
        "not run: cell not run), applied to SGLang 0.5.20, makes the NVFP4 CUTLASS path APPROX" + PROMOTES + tail, ON)
    rt = [{**RT[0], "cutlass_verdict": "EXACT"}, RT[2]]
    row = r03.clamp_cutlass_fix(mk(rt=rt, cpf={"run": False, "reason": "no files"}))
    assert row == Row({**fix, "card_patch_on_0.5.20": "EXACT", "exact_patch_on_0.5.23": None}, "reproduced", ev,
                      "OUR reconstruction of the card's three edits (patches/0.5.20/card; the card's own files: not "
                      "run: no files), applied to SGLang 0.5.20, makes the NVFP4 CUTLASS path EXACT. Stock SGLang "
                      "0.5.23: CUTLASS DROPPED; our 'exact' patch on 0.5.23: not run. An exact fix selects "
                      "ActivationType.SwigluStep, which our 'exact' patch does.", ON)
    assert r03.clamp_cutlass_fix(mk(rt=[{**RT[0], "cutlass_verdict": "DROPPED"}])).verdict == "contradicted"
    assert r03.clamp_cutlass_fix(mk(rt=RT[1:])) == Row(
        None, "not run", ev, "The card's patch was not replayed on SGLang 0.5.20 in this run. " + OTHERS, ON)


def card_files(**sm) -> dict:
    summary = {"cutlass": {"0.5.20": "APPROX", "0.5.21": "EXACT"}, "applies_to": ["0.5.20", "0.5.21"],
               "fails_on": {"0.5.22": "hunk 2 FAILED", "0.5.23": "no file"}, **sm}
    return {"run": True, "summary": summary, "origin": {"label": "card files", "path": "p/q", "files": ["a.patch"]},
            "results": [{"patches": [{"targets": ["b.py", "a.py"]}, {"targets": ["a.py"]}]},
                        {"patches": [{"targets": ["zzz.py"]}]}]}


def test_cutlass_fix_from_the_card_files(mk, tmp_path):
    ev = [d(tmp_path, "sglang_card_patches"), d(tmp_path, "sglang_audit_versions")]
    fix = {"card_patch_on_0.5.20": "APPROX", "stock_0.5.23": "DROPPED", "exact_patch_on_0.5.23": "EXACT"}
    sm = card_files()["summary"]
    assert r03.clamp_cutlass_fix(mk(rt=RT, cpf=card_files())) == Row(
        {"card_files": ["a.patch"], "target_files": ["a.py", "b.py"], "applies_to": ["0.5.20", "0.5.21"],
         "fails_on": sm["fails_on"], "cutlass_after_card_files": sm["cutlass"], **fix}, "partly", ev,
        "The card's own files (card files) applied with `patch -p1` in sglang/srt to 0.5.20, 0.5.21 make the NVFP4 "
        "CUTLASS path APPROX on 0.5.20" + PROMOTES + ". Do not apply: 0.5.22: hunk 2 FAILED; 0.5.23: no file. Our "
        f"reconstruction on 0.5.20: APPROX. {OTHERS}", "card files on sglang 0.5.20")
    ex = r03.clamp_cutlass_fix(mk(cpf=card_files(cutlass={"0.5.21": "EXACT"}, fails_on={})))
    assert ex.verdict == "reproduced" and ex.checked_on == "card files on sglang 0.5.21"
    assert ex.note == ("The card's own files (card files) applied with `patch -p1` in sglang/srt to 0.5.20, 0.5.21 "
                       "make the NVFP4 CUTLASS path EXACT on 0.5.21. Do not apply: none. Our reconstruction on "
                       "0.5.20: not run. Stock SGLang 0.5.23: CUTLASS DROPPED; our 'exact' patch on 0.5.23: not run.")
    cpf = card_files(cutlass={}, applies_to=[])
    cpf["origin"] = {"label": "", "path": "p/q", "files": []}
    none = r03.clamp_cutlass_fix(mk(cpf=cpf))
    assert none.verdict == "contradicted" and none.checked_on == "p/q on sglang no release"
    assert none.note.startswith("The card's own files (p/q) applied with `patch -p1` in sglang/srt to no release. "
                                "Do not apply: 0.5.22")
    cpf = card_files(cutlass={"0.5.20": "DROPPED"})
    del cpf["origin"]["label"]
    dr = r03.clamp_cutlass_fix(mk(cpf=cpf))
    assert dr.verdict == "contradicted" and "(p/q)" in dr.note and PROMOTES not in dr.note
    assert "CUTLASS path DROPPED on 0.5.20. Do not apply" in dr.note


def test_input_empty_nan(mk, tmp_path):
    alloc = {"0.5.21": {"w13": "torch.zeros L11", "w2": "torch.empty L12"},
             V: {"w13": "torch.empty L11", "w2": "torch.empty L12"}}
    assert r03.scales_input_empty_nan(mk()) == Row(
        alloc, "partly", [d(tmp_path, "sglang_checks")],
        "w13/w2_input_global_scale are allocated with torch.empty in every audited version; the NaN-logit "
        "consequence of a checkpoint without them needs an NVFP4 GPU and was not run.", ON)
    row = r03.scales_input_empty_nan(mk(chk={V: checks(alloc="torch.zeros")}))
    assert row == Row({V: {"w13": "torch.zeros L11", "w2": "torch.empty L12"}}, "contradicted",
                      [d(tmp_path, "sglang_checks")], "The input global scales are not allocated with torch.empty here.",
                      ON)


def test_w4a16_unservable(mk, tmp_path):
    err = "AttributeError: 'NoneType' has no num_bits (get_moe_scheme L5)"
    ev = [d(tmp_path, "sglang_checks"), d(tmp_path, "sglang_audit")]
    chk = {"0.5.21": checks(scheme={"scheme": "CompressedTensorsW4A16"}), V: checks()}
    assert r03.sglang_w4a16_unservable(mk(chk=chk)) == Row(
        {"0.5.21": "CompressedTensorsW4A16", V: err}, "reproduced", ev,
        "Replayed CompressedTensorsConfig.get_moe_scheme from each tree. 0.5.21: CompressedTensorsW4A16; "
        f"0.5.23: {err}", ON)
    m = {"nvfp4-w4a16-marlin": arow("nvfp4-w4a16-marlin", "EXACT")}
    for s in ({"scheme": "W4A16Marlin"}, {"error": "AttributeError: x", "function": "f", "line": 1},
              {"error": "KeyError: num_bits", "function": "f", "line": 1}):
        row = r03.sglang_w4a16_unservable(mk(chk={V: checks(scheme=s)}, m=m))
        want = s.get("scheme") or f"{s['error']} (f L1)"
        assert row == Row({V: want}, "contradicted", ev, "Replayed CompressedTensorsConfig.get_moe_scheme from each "
                          f"tree. 0.5.23: {want}. On 0.5.23 W4A16 loads through Marlin, whose clamp verdict is EXACT.",
                          ON)
    empty = r03.sglang_w4a16_unservable(mk(chk={V: checks(scheme={"scheme": "", "error": "E", "function": "g",
                                                                  "line": 2})}))
    assert empty.measured == {V: "E (g L2)"}
    assert empty.note.endswith("0.5.23: E (g L2). On 0.5.23 W4A16 loads through Marlin, whose clamp verdict is None.")


def fusion(in_ign, untgt, sees, file="bailing.py", line=77) -> dict:
    ev = {}
    if in_ign is not None:
        ev["shared experts in ignore (regex)"] = {"fusion_disabled": in_ign}
    if untgt is not None:
        ev["shared experts only untargeted"] = {"fusion_disabled": untgt}
    return {"evaluations": ev, "considers_clamp_lists": sees, "file": file, "line": line}


BLIND = (" - a fused shared expert would run inside FusedMoE with the routed gemm1_clamp_limit, so the flag is needed "
         "for Ling's clamp whatever the layout")


@pytest.mark.parametrize("f,verdict", [
    ((False, False, True), "reproduced"), ((False, False, False), "reproduced"),
    ((True, True, True), "contradicted"), ((True, True, False), "partly"),
    ((True, False, True), "partly"), ((False, True, True), "partly"),
])
def test_shared_fusion_off_verdicts(mk, tmp_path, f, verdict):
    chk = {"0.5.21": checks(fusion=fusion(True, True, True, "old.py", 5)), V: checks(fusion=fusion(*f))}
    row = r03.serve_shared_fusion_off(mk(chk=chk))
    assert row == Row(
        {"0.5.21": {"auto_off_shared_in_ignore": True, "auto_off_shared_untargeted": True,
                    "veto_sees_clamp_lists": True, "veto_line": "old.py:5"},
         V: {"auto_off_shared_in_ignore": f[0], "auto_off_shared_untargeted": f[1], "veto_sees_clamp_lists": f[2],
             "veto_line": "bailing.py:77"}}, verdict, [d(tmp_path, "sglang_checks")],
        "SGLang 0.5.23, BailingMoeV3.shared_experts_fusion_disable_reason (bailing.py:77): fusion is turned off by "
        f"itself when the ignore list names the shared experts: {f[0]}; when the shared experts are only left out of "
        f"the targets: {f[1]}. The veto looks at the clamp lists: {f[2]}" + ("" if f[2] else BLIND) + ".", ON)


def test_shared_fusion_off_refusals(mk, tmp_path):
    ev = [d(tmp_path, "sglang_checks")]
    head = "The shared-expert fusion veto of SGLang 0.5.23 was not found or not evaluated "
    assert r03.serve_shared_fusion_off(mk(chk={"0.5.21": checks()})) == Row(
        None, "not run", ev, head + "(no checks for this version).", ON)
    for f in ((None, False, True), (False, None, True), (False, False, None)):
        assert r03.serve_shared_fusion_off(mk(chk={V: checks(fusion=fusion(*f))})) == Row(
            None, "not run", ev, head + "(bailing.py:77).", ON), f
    row = r03.serve_shared_fusion_off(mk(chk={V: checks(fusion={"x": 1})}))
    assert row == Row(None, "not run", ev, head + "(None:None).", ON)


MD = {"value": 16, "line": 40, "guard": "N < 16", "guard_lines": [41], "n32_to_deepgemm": True, "reraise_line": 55}
MD_NOTE = ("MIN_DEEPGEMM_DIM = {v} (batch_invariant_ops.py:40), guard 'N < 16' sends N=32 bf16 GEMMs to DeepGEMM and a "
           "DeepGEMM failure is re-raised (L{r}), no fallback; our 64 edit applies and reverts. Not checked here: the "
           "DeepGEMM failure itself (GPU), and the card's attribution to the router (Ling's router weight is "
           "[512, 2560], N=512; an N=32, K=2560 GEMM matches the MLA g_proj [32, 2560]).")


def test_min_deepgemm_dim(mk, tmp_path):
    ev = [d(tmp_path, "sglang_checks"), d(tmp_path, "sglang_patch_roundtrip")]
    old = {**MD, "value": 8}
    chk = {"0.5.21": checks(md={**old, "more": 1}), V: checks()}
    rt = [{"sglang": V, "mode": "det", "verify_ok": True}]
    assert r03.det_min_deepgemm_dim(mk(chk=chk, rt=rt)) == Row(
        {"0.5.21": old, V: MD, "edit_applies": True}, "partly", ev, MD_NOTE.format(v=16, r=55), ON)
    assert r03.det_min_deepgemm_dim(mk(rt=[{"sglang": V, "mode": "det", "verify_ok": False}])).measured[
        "edit_applies"] is False
    assert r03.det_min_deepgemm_dim(mk(rt=[{"sglang": "0.5.21", "mode": "det", "verify_ok": True}])).measured[
        "edit_applies"] is False
    for bad, note in (({"value": 32}, MD_NOTE.format(v=32, r=55)), ({"n32_to_deepgemm": False}, None),
                      ({"reraise_line": None}, MD_NOTE.format(v=16, r=None))):
        row = r03.det_min_deepgemm_dim(mk(chk={V: checks(md={**MD, **bad})}))
        assert row.verdict == "contradicted" and row.measured == {V: {**MD, **bad}, "edit_applies": False}
        assert note is None or row.note == note
    miss = dict(MD)
    del miss["reraise_line"]
    row = r03.det_min_deepgemm_dim(mk(chk={V: checks(md=miss)}))
    assert row.verdict == "contradicted" and row.measured[V]["reraise_line"] is None


# --- the study's own findings ----------------------------------------------------------------------
def test_cutlass_approx(mk, tmp_path):
    ev = [d(tmp_path, "sglang_audit_versions"), "data/kernels.json"]
    rows = allv(("0.5.20", "DROPPED", "DROPPED", "r"), ("0.5.21", "APPROX", "DROPPED", "r"),
                (V, "APPROX", "DROPPED", "r"))
    cut = {**rows[6], "rule": "q" * 141}
    row = r03.nvfp4_cutlass_approx(mk(allv=rows, m={"nvfp4-w4a4-cutlass": cut}))
    assert row == Row({"0.5.20": "DROPPED", "0.5.21": "APPROX", V: "APPROX"}, "reproduced", ev,
                      f"APPROX on 0.5.21, 0.5.23; cut.py:100 ({'q' * 140}). " + GPU, ON)
    rows = allv(("0.5.20", "DROPPED", "DROPPED", "r"), (V, "EXACT", "DROPPED", "r"))
    row = r03.nvfp4_cutlass_approx(mk(allv=rows, m={"nvfp4-w4a4-cutlass": {**rows[3], "file": None}}))
    assert row == Row({"0.5.20": "DROPPED", V: "EXACT"}, "contradicted", ev,
                      "APPROX on none; - (cut rule 0.5.23). " + GPU, ON)


def test_trtllm_literal_none(mk, tmp_path):
    ev = [d(tmp_path, "sglang_audit_versions")]
    trt = {**ALLV[4], "rule": LIT + "z" * 300}
    assert r03.trtllm_literal_none(mk(m={"nvfp4-w4a4-trtllm": trt})) == Row(
        {"0.5.21": "a/b.py:7", V: "trt.py:200"}, "reproduced", ev, (LIT + "z" * 300)[:300], ON)
    rows = allv(("0.5.21", "APPROX", "UNUSABLE", "no literal"), (V, "DROPPED", "UNUSABLE", LIT))
    assert r03.trtllm_literal_none(mk(allv=rows)) == Row({"0.5.21": None, V: "trt.py:200"}, "partly", ev, LIT, ON)


def test_runners_drop_clamp(mk, tmp_path):
    ev = [d(tmp_path, "sglang_audit")]
    m = {"z": arow("z", "DROPPED", "rz"), "a": arow("a", "DROPPED", "ra", file="a.py", line=3),
         "b": arow("b", "EXACT"), "c": arow("c", "DROPPED", "rc", catalogued=False),
         "e": arow("e", "DROPPED", "re", catalogued=True)}
    assert r03.runners_drop_clamp(mk(m=m)) == Row(
        {"a": "a.py:3", "c": "moe.py:10", "e": "moe.py:10", "z": "moe.py:10"}, "reproduced", ev,
        "a: ra; e: re; z: rz; and 1 more of the 5 paths found by following the dispatch (the audit's machine "
        "reading, mostly not hand-read: finding.audit-agreement)", ON)
    assert r03.runners_drop_clamp(mk(m={"a": m["a"], "e": m["e"]})) == Row(
        {"a": "a.py:3", "e": "moe.py:10"}, "reproduced", ev, "a: ra; e: re", ON)
    assert r03.runners_drop_clamp(mk(m={"b": m["b"]})) == Row({}, "contradicted", ev, "", ON)


def test_card_patch_approx(mk, tmp_path):
    ev = [d(tmp_path, "sglang_patch_roundtrip")]
    assert r03.card_patch_approx(mk(rt=RT[1:])) is None
    assert r03.card_patch_approx(mk(rt=RT)) == Row({"cutlass_verdict_after_card_patch": "APPROX"}, "reproduced", ev,
                                                   "k" * 200, "sglang 0.5.20")
    row = r03.card_patch_approx(mk(rt=[{**RT[0], "cutlass_verdict": "EXACT", "cutlass_rule": "e"}]))
    assert row == Row({"cutlass_verdict_after_card_patch": "EXACT"}, "contradicted", ev, "e", "sglang 0.5.20")


def test_exact_patch(mk, tmp_path):
    ev = [d(tmp_path, "sglang_patch_roundtrip")]
    assert r03.exact_patch(mk(rt=[RT[0], RT[3]])) is None
    assert r03.exact_patch(mk(rt=RT)) == Row({"cutlass_verdict": "EXACT", "verify_ok": True, "idempotent": True,
                                              "byte_identical_after_revert": True}, "reproduced", ev, "", ON)
    for bad in ({"cutlass_verdict": "APPROX"}, {"byte_identical_after_revert": False}):
        assert r03.exact_patch(mk(rt=[{**RT[1], **bad}])).verdict == "contradicted", bad


G = 0.00637746  # L - silu(L) at L = 7, about: the value only has to be carried through
GR = 0.000911


def gap_row(limit=7.0, **over) -> dict:
    return {"pair": "pre vs post", "limit": limit, "gate_gap": G, "gate_gap_rel": GR, "gate_gap_le_L": 0.0,
            "gate_gap_gt_L": G, "gate_gap_rel_gt_L": GR, **over}


def test_approx_size_row_in_full(mk, tmp_path):
    ev = [d(tmp_path, "clamp_numerics"), tmp_path / "figures" / "clamp_forms.png"]
    rows = [gap_row(), {"pair": "pre vs none", "limit": 3.0}, gap_row(2.5, gate_gap=0.1, gate_gap_gt_L=0.1)]
    assert r03.approx_size(mk(num={"rows": rows})) == Row(
        {"L=7": {"max_gate_gap_g_le_L": 0.0, "max_gate_gap_g_gt_L": G, "max_relative_gate_gap_g_gt_L": GR},
         "L=2.5": {"max_gate_gap_g_le_L": 0.0, "max_gate_gap_g_gt_L": 0.1, "max_relative_gate_gap_g_gt_L": GR}},
        "reproduced", ev, "Largest |post - pre| gate factor measured on the grid's gate values, against L - silu(L) = "
        "0.00637746 (L=7), 0.1 (L=2.5).", "CPU float64")
    bad = r03.approx_size(mk(num={"rows": [gap_row(), gap_row(3.0, gate_gap_le_L=0.5)]}))
    assert bad.verdict == "contradicted"
    assert bad.note == ("Largest |post - pre| gate factor measured on the grid's gate values, against L - silu(L) = "
                        "0.00637746 (L=7), 0.00637746 (L=3); does not hold for L=3.")
    two = r03.approx_size(mk(num={"rows": [gap_row(2.0, gate_gap_le_L=0.5), gap_row(3.0, gate_gap_le_L=0.5)]}))
    assert two.note.endswith("(L=3); does not hold for L=2, L=3.")
    none = r03.approx_size(mk(num={"rows": [{"pair": "pre vs none", "limit": 3.0}]}))
    assert none == Row(None, "not run", ev, "Largest |post - pre| gate factor measured on the grid's gate values, "
                       "against L - silu(L) = .", "CPU float64")
    miss = r03.approx_size(mk(num={"rows": [{"pair": "pre vs post", "limit": 1.0, "gate_gap": 1, "gate_gap_rel": 1}]}))
    assert miss.measured == {"L=1": {"max_gate_gap_g_le_L": None, "max_gate_gap_g_gt_L": None,
                                     "max_relative_gate_gap_g_gt_L": None}} and miss.verdict == "contradicted"


@pytest.mark.parametrize("over,holds", [
    ({}, True),
    ({"gate_gap_le_L": 1e-13}, True), ({"gate_gap_le_L": -1e-13}, True),
    ({"gate_gap_le_L": 2e-12}, False), ({"gate_gap_le_L": -2e-12}, False),
    ({"gate_gap_gt_L": G * (1 + 5e-10)}, True), ({"gate_gap_gt_L": G * (1 + 2e-9)}, False),
    ({"gate_gap_gt_L": G * (1 - 2e-9)}, False),
    ({"gate_gap_rel_gt_L": GR * (1 + 5e-10)}, True), ({"gate_gap_rel_gt_L": GR * (1 + 2e-9)}, False),
    # outputs below 1e-15: the absolute tolerance decides
    ({"gate_gap": 5e-16, "gate_gap_gt_L": 0.0}, True), ({"gate_gap": 3e-15, "gate_gap_gt_L": 0.0}, False),
    ({"gate_gap_rel": 5e-16, "gate_gap_rel_gt_L": 0.0}, True), ({"gate_gap_rel": 3e-15, "gate_gap_rel_gt_L": 0.0}, False),
    ({"gate_gap_le_L": None}, False), ({"gate_gap_gt_L": None}, False), ({"gate_gap_rel_gt_L": None}, False),
])
def test_gap_holds_edges(over, holds):
    assert r03._gap_holds(gap_row(**over)) is holds
    r = gap_row(**over)
    for k in ("gate_gap_le_L", "gate_gap_gt_L", "gate_gap_rel_gt_L"):
        if r[k] is None:
            del r[k]
    assert r03._gap_holds(r) is holds


# --- finding.routed-scaling-dropped (issue 36) ------------------------------------------------------------------

def rsf(v: str, path: str, verdict: str, line: int = 375) -> dict:
    return arow(path, verdict, "rule", v, "cts.py", line, param="routed_scaling_factor")


RSF_ROWS = [rsf("0.5.21", "nvfp4-w4a4-cutlass", "DROPPED", 361), rsf(V, "nvfp4-w4a4-cutlass", "DROPPED"),
            rsf("0.5.21", "triton", "APPLIED", 5), rsf(V, "triton", "APPLIED", 6), rsf(V, "marlin", "DROPPED", 7),
            rsf(V, "nvfp4-w4a16-marlin", "APPLIED", 9), rsf(V, "other", "DOUBLE", 8)]


def agreement(agree: int, n: int) -> dict:
    rate = agree / n
    return {"routed_scaling_factor": {"overall": {"agree": agree, "n": n, "rate": rate, "wilson95": [0.5, 0.99]}}}


def test_routed_scaling_dropped_row_in_full(mk):
    x = mk(params={"routed_scaling_factor": RSF_ROWS}, param_agreement=agreement(34, 35))
    row = r03.routed_scaling_dropped(x)
    assert row.verdict == "reproduced"  # 34 / 35 = 97.1 % >= 95 %
    assert row.measured == {"card_path": {"0.5.21": "DROPPED", V: "DROPPED"},
                            "card_path_at": {"0.5.21": "cts.py:361", V: "cts.py:375"},
                            "triton": {"0.5.21": "APPLIED", V: "APPLIED"}, "marlin": {V: "DROPPED"},
                            "marlin_nvfp4": {V: "APPLIED"},
                            "agreement": {"agree": 34, "n": 35, "rate": 34 / 35, "wilson95": [0.5, 0.99]}}
    assert row.note == (
        "audit-sglang --param routed_scaling_factor on the card's path (nvfp4-w4a4-cutlass): 0.5.21 DROPPED at "
        "cts.py:361, 0.5.23 DROPPED at cts.py:375; triton: 0.5.21 APPLIED, 0.5.23 APPLIED; marlin: 0.5.23 DROPPED; "
        "nvfp4-w4a16-marlin: 0.5.23 APPLIED; "
        "the audit agreed with a blind hand reading of this parameter on 34 of 35 paths (97.1 %, Wilson 95 % "
        "50.0 % to 99.0 %; the bar is 95.0 %). A static reading of the source; stage 04 measures the native path "
        "the CPU engine runs (audit.cpu-routed-scaling), and the exact patch set applies the factor on the card's "
        "path.")
    assert row.checked_on == "sglang 0.5.21, 0.5.23 (released wheels' source)"
    assert [p.name for p in row.evidence] == ["sglang_param_audit.json", "sglang_param_agreement.json"]


def test_routed_scaling_dropped_verdict_edges(mk):
    rows = {"routed_scaling_factor": RSF_ROWS}
    # 33 / 35 = 94.3 %: below the bar, a machine reading; 19 / 20 = 95 % exactly: on it
    assert r03.routed_scaling_dropped(mk(params=rows, param_agreement=agreement(33, 35))).verdict == "partly"
    assert r03.routed_scaling_dropped(mk(params=rows, param_agreement=agreement(19, 20))).verdict == "reproduced"
    row = r03.routed_scaling_dropped(mk(params=rows, param_agreement=None))
    assert row.verdict == "partly" and "its agreement with blind hand readings was not run" in row.note
    row = r03.routed_scaling_dropped(mk(params=rows, param_agreement={"routed_scaling_factor": {"not_run": "x"}}))
    assert row.verdict == "partly"
    # one release that applies it contradicts the finding, whatever the agreement
    applied = [*RSF_ROWS[:1], rsf(V, "nvfp4-w4a4-cutlass", "APPLIED"), *RSF_ROWS[2:]]
    row = r03.routed_scaling_dropped(mk(params={"routed_scaling_factor": applied}, param_agreement=agreement(35, 35)))
    assert row.verdict == "contradicted" and row.measured["card_path"] == {"0.5.21": "DROPPED", V: "APPLIED"}
    # a release that is not audited by the stage is left out
    extra = [*RSF_ROWS, rsf("0.5.19", "nvfp4-w4a4-cutlass", "APPLIED")]
    assert r03.routed_scaling_dropped(mk(params={"routed_scaling_factor": extra},
                                         param_agreement=agreement(35, 35))).verdict == "reproduced"


def test_routed_scaling_dropped_not_run(mk):
    row = r03.routed_scaling_dropped(mk(params=None))
    assert (row.measured, row.verdict, row.checked_on) == (None, "not run", ON)
    assert row.note == "Not run: the cell that writes data/sglang_param_audit.json did not run."
    for params in ({"routed_scaling_factor": RSF_ROWS[2:]}, {}):
        row = r03.routed_scaling_dropped(mk(params=params))
        assert row.verdict == "not run" and row.note == (
            "Not run: data/sglang_param_audit.json has no routed_scaling_factor row of nvfp4-w4a4-cutlass on an "
            "audited release.")


def test_gather_reads_the_parameter_files_when_written(tmp_path):
    paths = RunPaths(tmp_path)
    paths.data("x").parent.mkdir(parents=True, exist_ok=True)
    for stem, obj in {"sglang_audit": ALLV, "sglang_audit_versions": ALLV, "sglang_checks": {}, "sglang_patch_roundtrip": [],
                      "clamp_numerics": {"rows": []}}.items():
        paths.data(stem).write_text(json.dumps(obj))
    x = r03.SGLangMeasurements.gather(paths, V, kernels={})
    assert x.params is None and x.param_agreement is None
    paths.data("sglang_param_audit").write_text(json.dumps({"params": {"routed_scaling_factor": RSF_ROWS}}))
    paths.data("sglang_param_agreement").write_text(json.dumps(agreement(1, 2)))
    x = r03.SGLangMeasurements.gather(paths, V, kernels={})
    assert x.params == {"routed_scaling_factor": RSF_ROWS} and x.param_agreement == agreement(1, 2)
