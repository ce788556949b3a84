"""Stage 03's claim rules: one function per ``03_patch_sglang`` claim and per study finding.

Every rule reads :class:`SGLangMeasurements`, the data files stage 03 wrote (the clamp audit of
the stage's release and of every audited release, the other source checks, the patch round
trip, the clamp numerics, the card's own patch files and the stored GPU measurement of the
clamp forms), and returns its ledger row; ``checked_on`` is the stage's release unless a rule
says otherwise.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ...core.claim_rules import Row, claim_rule, finding_rule
from ...core.errors import StageInputMissing
from ...core.ledger import Verdict
from ...core.paths import RunPaths
from ...sglang.agreement import CLAIM as AGREEMENT_CLAIM

#: The version the model card describes (its patch targets this release).
CARD_VERSION = "0.5.20"

#: the forms the audit reads from the code (README, "The SwiGLU clamp"), which the GPU run tests
READ_FORMS = {"flashinfer_cutlass/sglang_swiglu": "pre_silu", "flashinfer_cutlass/swiglu_step": "post_silu",
              "sglang_triton/clamp": "post_silu"}

#: the card's runner names -> the audit's path names (sglang/data/sglang_clamp_paths.yaml)
CARD_RUNNERS = {"triton": ["triton"], "marlin": ["marlin"], "ascend": ["ascend"],
                "deep_gemm": ["deep-gemm", "deep-gemm-contiguous"], "mxint4": ["mxint4-trtllm"]}

#: a clamp path's verdicts that say nothing about forwarding (skipped, listed in the note)
UNDECIDED = ("ABSENT", "UNDECIDED", "UNUSABLE")  # tell nothing about forwarding (UNUSABLE: never runs)


def _load(paths: RunPaths, stem: str) -> Any:
    p = paths.data(stem)
    if not p.is_file():
        raise StageInputMissing(f"{p} is missing: run the cells above first")
    return json.loads(p.read_text())


def _by(rows: list[dict], version: str, path: str) -> dict:
    return next(r for r in rows if r["sglang_version"] == version and r["path"] == path)


def where(r: dict) -> str:
    """``file:line`` of an audit row, or ``-``."""
    return f"{r['file']}:{r['line']}" if r.get("file") else "-"


def literal_none(r: dict) -> str | None:
    """``file:line`` of the literal ``gemm1_clamp_limit=None`` a TRT-LLM row's rule reports: the
    row's own place when the rule starts with it, else the place the rule names (issue 36: the row is
    UNUSABLE at the routing_method_type assert, the literal None kept as "the path alone"); None if none."""
    if r["rule"].startswith("literal"):
        return where(r)
    m = re.search(r"literal gemm1_clamp_limit=None at (?:sglang/srt/)?(\S+?:\d+)", r["rule"])
    return m.group(1) if m else None


def _per_version(allv: list[dict], version: str) -> dict[str, Any]:
    cut, trt = _by(allv, version, "nvfp4-w4a4-cutlass"), _by(allv, version, "nvfp4-w4a4-trtllm")
    return {"cutlass": cut["verdict"], "trtllm": trt["verdict"], "literal_none": literal_none(trt)}


@dataclass(frozen=True)
class SGLangMeasurements:
    """Stage 03's data files, read once (:meth:`gather`), as the rules read them."""

    STAGE: ClassVar[str] = "03_patch_sglang"
    paths: RunPaths
    version: str  # the stage's release
    allv: list[dict]  # data/sglang_audit_versions.json
    m: dict[str, dict]  # data/sglang_audit.json by path
    chk: dict[str, dict]  # data/sglang_checks.json by release
    rt: list[dict]  # data/sglang_patch_roundtrip.json
    num: dict[str, Any]  # data/clamp_numerics.json
    cpf: dict[str, Any]  # data/sglang_card_patches.json, or {"run": False, "reason"}
    kernels: dict[str, Any]  # the GPU measurement: {"doc", "summary", "copy"}
    agreement: dict[str, Any] | None = None  # sglang.agreement.write's result (the stage adds it)
    params: dict[str, list[dict]] | None = None  # data/sglang_param_audit.json's "params", None if not written
    param_agreement: dict[str, Any] | None = None  # data/sglang_param_agreement.json, None if not written

    @classmethod
    def gather(cls, paths: RunPaths, version: str, kernels: dict[str, Any]) -> SGLangMeasurements:
        """Read the files; raises StageInputMissing when one the cells above write is missing."""
        cpf_file = paths.data("sglang_card_patches")
        cpf = json.loads(cpf_file.read_text()) if cpf_file.is_file() else {"run": False, "reason": "cell not run"}
        main = _load(paths, "sglang_audit")
        opt = {k: json.loads(paths.data(k).read_text()) if paths.data(k).is_file() else None
               for k in ("sglang_param_audit", "sglang_param_agreement")}
        return cls(paths, version, _load(paths, "sglang_audit_versions"), {r["path"]: r for r in main},
                   _load(paths, "sglang_checks"), _load(paths, "sglang_patch_roundtrip"),
                   _load(paths, "clamp_numerics"), cpf, kernels,
                   params=(opt["sglang_param_audit"] or {}).get("params") if opt["sglang_param_audit"] else None,
                   param_agreement=opt["sglang_param_agreement"])

    @property
    def on(self) -> str:
        return f"sglang {self.version}"

    def d(self, stem: str) -> Path:
        return self.paths.data(stem)

    @property
    def versions(self) -> list[str]:
        return list(dict.fromkeys(r["sglang_version"] for r in self.allv))

    @property
    def per(self) -> dict[str, dict[str, Any]]:
        """Per audited release: the CUTLASS and TRT-LLM verdicts and where TRT-LLM's literal None is."""
        return {v: _per_version(self.allv, v) for v in self.versions}

    @property
    def cut(self) -> dict:
        return self.m["nvfp4-w4a4-cutlass"]

    @property
    def trt(self) -> dict:
        return self.m["nvfp4-w4a4-trtllm"]

    def roundtrip(self, version: str, mode: str) -> dict | None:
        return next((r for r in self.rt if r["sglang"] == version and r["mode"] == mode), None)

    @property
    def gpu_sentence(self) -> str:
        return f"GPU check ({self.kernels['summary']['sentence']})."


@finding_rule("finding.clamp-kernels-measured", SGLangMeasurements,
              claim="On a GPU, SGLang 0.5.23's NVFP4 CUTLASS call (FlashInfer 0.7.2, Swiglu + limit) computes the "
                    "pre-SiLU form, FlashInfer's SwigluStep and SGLang's Triton MoE the post-SiLU (Ling) form.")
def clamp_kernels_measured(x: SGLangMeasurements) -> Row:
    """The stored GPU measurement (:mod:`nvfp4study.sglang.kernel_evidence`, made on an NVIDIA H200
    by ``make gpu-clamp-check``, not by this run): reproduced when the kernels compute the forms
    the audit reads from the code (:data:`READ_FORMS`)."""
    from ...sglang import kernel_evidence as ke

    summ = x.kernels["summary"]
    got = {k: summ["forms"].get(k) for k in READ_FORMS}
    agree = all(got[k] == v for k, v in READ_FORMS.items())
    return Row(got, Verdict.REPRODUCED if agree else Verdict.CONTRADICTED, [x.kernels["copy"]],
               summ["sentence"] + ". Probe inputs make each output one SwiGLU value; a form is the kernel's when "
               f">= {ke.MATCH:.0%} of the elements that separate the forms match it bit for bit.",
               f"{summ['machine']}, {summ['date']} (stored measurement, not made by this run)")


@finding_rule("finding.audit-agreement", SGLangMeasurements, claim=AGREEMENT_CLAIM)
def audit_agreement(x: SGLangMeasurements) -> Row:
    """The derived paths' verdicts against the blind hand readings
    (:func:`nvfp4study.sglang.agreement.finding`): what derived-path counts may use."""
    from ...sglang import agreement as ag

    if x.agreement is None:
        raise StageInputMissing("the audit agreement was not computed: run the cell that writes "
                                "data/sglang_audit_agreement.json first")
    f = ag.finding(x.agreement, list(x.m.values()), x.version)
    return Row(f["measured"], f["verdict"], [x.d("sglang_audit_agreement"), x.d("sglang_audit_versions")],
               f["note"], f["checked_on"])


@claim_rule("clamp.nvfp4-dropped", SGLangMeasurements)
def clamp_nvfp4_dropped(x: SGLangMeasurements) -> Row:
    """Reproduced when the CUTLASS branch drops the clamp AND the TRT-LLM branch has the literal
    None; partly when one of the two holds."""
    per, cut, trt = x.per, x.cut, x.trt
    literal = literal_none(trt) is not None
    verdict = Verdict.REPRODUCED if cut["verdict"] == "DROPPED" and literal else \
        Verdict.PARTLY if literal or cut["verdict"] == "DROPPED" else Verdict.CONTRADICTED
    return Row(per, verdict, [x.d("sglang_audit"), x.d("sglang_audit_versions"), x.kernels["copy"]],
               f"On {x.version} the literal gemm1_clamp_limit=None is in the TRT-LLM branch ({literal_none(trt)}; "
               f"the branch is {trt['verdict']} at {where(trt)}), "
               f"while the CUTLASS branch Ling runs on is {cut['verdict']} ({where(cut)}: {cut['rule'][:120]}). "
               + "; ".join(f"{v}: CUTLASS {p['cutlass']}, TRT-LLM {p['trtllm']}" for v, p in per.items()) + ". "
               + x.gpu_sentence, x.on)


@claim_rule("clamp.others-forward", SGLangMeasurements)
def clamp_others_forward(x: SGLangMeasurements) -> Row:
    """Every decided path of each card runner forwards (EXACT or APPROX); a runner with no decided
    path is not counted (partly), since ABSENT / UNDECIDED / UNUSABLE tells nothing about forwarding."""
    m = x.m
    skipped = [f"{p} ({m[p]['verdict'] if p in m else 'not audited'})" for ps in CARD_RUNNERS.values()
               for p in ps if p not in m or m[p]["verdict"] in UNDECIDED]
    fw = {k: {p: m[p]["verdict"] for p in ps if p in m and m[p]["verdict"] not in UNDECIDED}
          for k, ps in CARD_RUNNERS.items()}
    fw = {k: v for k, v in fw.items() if v}
    fwd = {k: all(v in ("EXACT", "APPROX") for v in paths.values()) for k, paths in fw.items()}
    unchecked = [k for k in CARD_RUNNERS if k not in fw]
    verdict = (Verdict.NOT_RUN if not fw else Verdict.CONTRADICTED if not all(fwd.values())
               else Verdict.PARTLY if unchecked else Verdict.REPRODUCED)
    return Row(fw or None, verdict, [x.d("sglang_audit")],
               "Forward the limit: " + (", ".join(k for k, ok in fwd.items() if ok) or "none") + ". Drop it: "
               + (", ".join(f"{k} ({'; '.join(m[p]['rule'] for p in fw[k])})" for k, ok in fwd.items() if not ok)
                  or "none") + "."
               + (f" Skipped (no decided audit row): {', '.join(skipped)}." if skipped else "")
               + (f" Runners not checked: {', '.join(unchecked)}." if unchecked else ""), x.on)


def _form_verdict(v: str | None) -> Verdict:
    """A fix's verdict from the CUTLASS path's after it: EXACT reproduced, APPROX partly."""
    return Verdict.REPRODUCED if v == "EXACT" else Verdict.PARTLY if v == "APPROX" else Verdict.CONTRADICTED


#: FlashInfer's promotion that makes the card's fix the pre-SiLU form
_PROMOTES = ": FlashInfer promotes Swiglu + swiglu_limit to SwigluBias, the pre-SiLU GPT-OSS form"


@claim_rule("clamp.cutlass-fix", SGLangMeasurements)
def clamp_cutlass_fix(x: SGLangMeasurements) -> Row:
    """The card's own patch files when read (else our reconstruction of its three edits on
    :data:`CARD_VERSION`), judged by the CUTLASS path's verdict after them."""
    card_rt, exact_rt = x.roundtrip(CARD_VERSION, "card"), x.roundtrip(x.version, "exact")
    fix = {"card_patch_on_" + CARD_VERSION: card_rt["cutlass_verdict"] if card_rt else None,
           f"stock_{x.version}": x.cut["verdict"],
           f"exact_patch_on_{x.version}": exact_rt["cutlass_verdict"] if exact_rt else None}
    fv = fix["card_patch_on_" + CARD_VERSION]
    others = (f"Stock SGLang {x.version}: CUTLASS {x.cut['verdict']}; our 'exact' patch on {x.version}: "
              f"{fix[f'exact_patch_on_{x.version}'] or 'not run'}.")
    cpf = x.cpf
    if cpf["run"]:  # the card's own files, as published
        sm, label = cpf["summary"], cpf["origin"].get("label") or cpf["origin"].get("path")
        on_v = next(iter(sm["cutlass"]), None)
        cv = sm["cutlass"].get(on_v)
        targets = sorted({t for r in cpf["results"][:1] for p in r["patches"] for t in p["targets"]})
        return Row({"card_files": cpf["origin"]["files"], "target_files": targets, "applies_to": sm["applies_to"],
                    "fails_on": sm["fails_on"], "cutlass_after_card_files": sm["cutlass"], **fix},
                   Verdict.CONTRADICTED if cv is None else _form_verdict(cv),
                   [x.d("sglang_card_patches"), x.d("sglang_audit_versions")],
                   f"The card's own files ({label}) applied with `patch -p1` in sglang/srt to "
                   f"{', '.join(sm['applies_to']) or 'no release'}"
                   + (f" make the NVFP4 CUTLASS path {cv} on {on_v}" if cv else "")
                   + (_PROMOTES if cv == "APPROX" else "")
                   + ". Do not apply: " + ("; ".join(f"{v}: {w}" for v, w in sm["fails_on"].items()) or "none")
                   + f". Our reconstruction on {CARD_VERSION}: {fv or 'not run'}. {others}",
                   f"{label} on sglang {on_v or 'no release'}")
    evidence = [x.d("sglang_patch_roundtrip"), x.d("sglang_audit_versions")]
    if fv is None:
        return Row(None, Verdict.NOT_RUN, evidence,
                   f"The card's patch was not replayed on SGLang {CARD_VERSION} in this run. " + others, x.on)
    return Row(fix, _form_verdict(fv), evidence,
               f"OUR reconstruction of the card's three edits (patches/{CARD_VERSION}/card; the card's own files: "
               f"not run: {cpf['reason']}), applied to SGLang {CARD_VERSION}, makes the NVFP4 CUTLASS path {fv}"
               + (_PROMOTES if fv == "APPROX" else "")
               + f". {others} An exact fix selects ActivationType.SwigluStep, which our 'exact' patch does.", x.on)


@claim_rule("scales.input-empty-nan", SGLangMeasurements)
def scales_input_empty_nan(x: SGLangMeasurements) -> Row:
    """torch.empty allocation in the source: partly (the NaN logits need an NVFP4 GPU)."""
    alloc = {v: {k: f"{s['alloc']} L{s['line']}" for k, s in c["input_global_scales"].items()}
             for v, c in x.chk.items()}
    empty = all(s["alloc"] == "torch.empty" for s in x.chk[x.version]["input_global_scales"].values())
    return Row(alloc, Verdict.PARTLY if empty else Verdict.CONTRADICTED, [x.d("sglang_checks")],
               "w13/w2_input_global_scale are allocated with torch.empty in every audited version; "
               "the NaN-logit consequence of a checkpoint without them needs an NVFP4 GPU and was not run."
               if empty else "The input global scales are not allocated with torch.empty here.", x.on)


@claim_rule("sglang.w4a16-unservable", SGLangMeasurements)
def sglang_w4a16_unservable(x: SGLangMeasurements) -> Row:
    """CompressedTensorsConfig.get_moe_scheme replayed: reproduced when W4A16 on Blackwell raises
    the card's AttributeError ... num_bits on the stage's release."""
    def scheme(c: dict) -> str:
        s = c["moe_scheme"]["W4A16@sm100"]
        return s.get("scheme") or f"{s['error']} ({s['function']} L{s['line']})"

    w16 = {v: scheme(c) for v, c in x.chk.items()}
    raises = "AttributeError" in w16[x.version] and "num_bits" in w16[x.version]
    marlin = x.m.get("nvfp4-w4a16-marlin", {}).get("verdict")
    return Row(w16, Verdict.REPRODUCED if raises else Verdict.CONTRADICTED,
               [x.d("sglang_checks"), x.d("sglang_audit")],
               "Replayed CompressedTensorsConfig.get_moe_scheme from each tree. "
               + "; ".join(f"{v}: {s}" for v, s in w16.items())
               + (f". On {x.version} W4A16 loads through Marlin, whose clamp verdict is {marlin}." if not raises else ""),
               x.on)


def _fusion(c: dict) -> dict[str, Any]:
    def off(label: str) -> bool | None:
        return c["shared_fusion"].get("evaluations", {}).get(label, {}).get("fusion_disabled")

    return {"auto_off_shared_in_ignore": off("shared experts in ignore (regex)"),
            "auto_off_shared_untargeted": off("shared experts only untargeted"),
            "veto_sees_clamp_lists": c["shared_fusion"].get("considers_clamp_lists"),
            "veto_line": f"{c['shared_fusion'].get('file')}:{c['shared_fusion'].get('line')}"}


@claim_rule("serve.shared-fusion-off", SGLangMeasurements)
def serve_shared_fusion_off(x: SGLangMeasurements) -> Row:
    """The card says the flag is required. It is, for the card's reason, where SGLang leaves fusion
    on for BF16 shared experts; a veto blind to the clamp lists makes it required for the clamp."""
    sf = {v: _fusion(c) for v, c in x.chk.items()}
    s_v = sf.get(x.version)
    fields = (s_v["auto_off_shared_in_ignore"], s_v["auto_off_shared_untargeted"], s_v["veto_sees_clamp_lists"]) \
        if s_v else (None, None, None)
    if None in fields:
        return Row(None, Verdict.NOT_RUN, [x.d("sglang_checks")],
                   f"The shared-expert fusion veto of SGLang {x.version} was not found or not evaluated "
                   f"({'no checks for this version' if not s_v else s_v['veto_line']}).", x.on)
    in_ign, untgt, sees = fields
    verdict = (Verdict.REPRODUCED if not in_ign and not untgt
               else Verdict.CONTRADICTED if in_ign and untgt and sees else Verdict.PARTLY)
    return Row(sf, verdict, [x.d("sglang_checks")],
               f"SGLang {x.version}, BailingMoeV3.shared_experts_fusion_disable_reason ({s_v['veto_line']}): fusion is "
               f"turned off by itself when the ignore list names the shared experts: {in_ign}; when the shared "
               f"experts are only left out of the targets: {untgt}. The veto looks at the clamp lists: {sees}"
               + ("" if sees else " - a fused shared expert would run inside FusedMoE with the routed "
                  "gemm1_clamp_limit, so the flag is needed for Ling's clamp whatever the layout") + ".", x.on)


@claim_rule("det.min-deepgemm-dim", SGLangMeasurements)
def det_min_deepgemm_dim(x: SGLangMeasurements) -> Row:
    """MIN_DEEPGEMM_DIM 16 with N=32 sent to DeepGEMM and its failure re-raised: partly (the
    failure itself needs a GPU; the router attribution is questioned in the note)."""
    keys = ("value", "line", "guard", "guard_lines", "n32_to_deepgemm", "reraise_line")
    md = {v: {k: c["min_deepgemm_dim"].get(k) for k in keys} for v, c in x.chk.items()}
    det_rt = x.roundtrip(x.version, "det")
    s = md[x.version]
    ok = s["value"] == 16 and s["n32_to_deepgemm"] and s.get("reraise_line")
    return Row({**md, "edit_applies": bool(det_rt and det_rt["verify_ok"])},
               Verdict.PARTLY if ok else Verdict.CONTRADICTED, [x.d("sglang_checks"), x.d("sglang_patch_roundtrip")],
               f"MIN_DEEPGEMM_DIM = {s['value']} (batch_invariant_ops.py:{s['line']}), guard '{s['guard']}' sends "
               f"N=32 bf16 GEMMs to DeepGEMM and a DeepGEMM failure is re-raised (L{s.get('reraise_line')}), no "
               "fallback; our 64 edit applies and reverts. Not checked here: the DeepGEMM failure itself (GPU), and the "
               "card's attribution to the router (Ling's router weight is [512, 2560], N=512; an N=32, K=2560 GEMM "
               "matches the MLA g_proj [32, 2560]).", x.on)


# --- the study's own findings -------------------------------------------------------------------
@finding_rule("finding.nvfp4-cutlass-approx", SGLangMeasurements,
              claim="From SGLang 0.5.21 the NVFP4 CUTLASS path applies Ling's clamp in the pre-SiLU GPT-OSS form "
                    "(FlashInfer SwigluBias), not Ling's post-SiLU form (SwigluStep).")
def nvfp4_cutlass_approx(x: SGLangMeasurements) -> Row:
    per = x.per
    approx_from = [v for v in x.versions if per[v]["cutlass"] == "APPROX"]
    return Row({v: per[v]["cutlass"] for v in x.versions},
               Verdict.REPRODUCED if x.cut["verdict"] == "APPROX" else Verdict.CONTRADICTED,
               [x.d("sglang_audit_versions"), x.kernels["copy"]],
               f"APPROX on {', '.join(approx_from) or 'none'}; {where(x.cut)} ({x.cut['rule'][:140]}). "
               + x.gpu_sentence, x.on)


@finding_rule("finding.trtllm-literal-none", SGLangMeasurements,
              claim="The TRT-LLM branch of the compressed-tensors NVFP4 MoE scheme passes a literal "
                    "gemm1_clamp_limit=None in every audited release (and asserts routing_method_type, which "
                    "Bailing never sets).")
def trtllm_literal_none(x: SGLangMeasurements) -> Row:
    per = x.per
    return Row({v: per[v]["literal_none"] for v in x.versions},
               Verdict.REPRODUCED if all(per[v]["literal_none"] for v in x.versions) else Verdict.PARTLY,
               [x.d("sglang_audit_versions")], x.trt["rule"][:300], x.on)


@finding_rule("finding.runners-drop-clamp", SGLangMeasurements,
              claim="Several MoE runners / schemes silently drop Ling's clamp (limit set, alpha None).")
def runners_drop_clamp(x: SGLangMeasurements) -> Row:
    m = x.m
    dropped = sorted(p for p, r in m.items() if r["verdict"] == "DROPPED")
    named = [p for p in dropped if m[p].get("catalogued", True)]
    return Row({p: where(m[p]) for p in dropped}, Verdict.REPRODUCED if dropped else Verdict.CONTRADICTED,
               [x.d("sglang_audit")],
               "; ".join(f"{p}: {m[p]['rule']}" for p in named)
               + (f"; and {len(dropped) - len(named)} more of the {len(m)} paths found by following the dispatch "
                  "(the audit's machine reading, mostly not hand-read: finding.audit-agreement)"
                  if len(dropped) > len(named) else ""), x.on)


@finding_rule("finding.card-patch-approx", SGLangMeasurements,
              claim=f"The card's patch as described, on SGLang {CARD_VERSION}, yields the pre-SiLU form, not Ling's.")
def card_patch_approx(x: SGLangMeasurements) -> Row | None:
    """Only when our reconstruction of the card's patch ran on :data:`CARD_VERSION`."""
    card_rt = x.roundtrip(CARD_VERSION, "card")
    if not card_rt:
        return None
    return Row({"cutlass_verdict_after_card_patch": card_rt["cutlass_verdict"]},
               Verdict.REPRODUCED if card_rt["cutlass_verdict"] == "APPROX" else Verdict.CONTRADICTED,
               [x.d("sglang_patch_roundtrip")], card_rt["cutlass_rule"][:200], f"sglang {CARD_VERSION}")


@finding_rule("finding.exact-patch", SGLangMeasurements,
              claim="Selecting SwigluStep for the NVFP4 CUTLASS call makes the path EXACT; apply/revert is byte-exact.")
def exact_patch(x: SGLangMeasurements) -> Row | None:
    """Only when the 'exact' mode's round trip ran on the stage's release."""
    rt = x.roundtrip(x.version, "exact")
    if not rt:
        return None
    return Row({k: rt[k] for k in ("cutlass_verdict", "verify_ok", "idempotent", "byte_identical_after_revert")},
               Verdict.REPRODUCED if rt["cutlass_verdict"] == "EXACT" and rt["byte_identical_after_revert"]
               else Verdict.CONTRADICTED, [x.d("sglang_patch_roundtrip")], "", x.on)


def _gap_holds(r: dict) -> bool:
    """Measured on the grid vs the closed forms L - silu(L) and 1 - sigmoid(L) (clamp_numerics)."""
    le, gt, rel = r.get("gate_gap_le_L"), r.get("gate_gap_gt_L"), r.get("gate_gap_rel_gt_L")
    return (le is not None and gt is not None and rel is not None and math.isclose(le, 0.0, abs_tol=1e-12)
            and math.isclose(gt, r["gate_gap"], rel_tol=1e-9, abs_tol=1e-15)
            and math.isclose(rel, r["gate_gap_rel"], rel_tol=1e-9, abs_tol=1e-15))


@finding_rule("finding.approx-size", SGLangMeasurements,
              claim="Pre-SiLU and post-SiLU clamps agree for gate <= L; above it the gate factor differs by at most "
                    "L - silu(L), i.e. 1 - sigmoid(L) relative.")
def approx_size(x: SGLangMeasurements) -> Row:
    pp = [r for r in x.num["rows"] if r["pair"] == "pre vs post"]
    gaps = {f"L={r['limit']:g}": {"max_gate_gap_g_le_L": r.get("gate_gap_le_L"),
                                  "max_gate_gap_g_gt_L": r.get("gate_gap_gt_L"),
                                  "max_relative_gate_gap_g_gt_L": r.get("gate_gap_rel_gt_L")} for r in pp}
    bad = [f"L={r['limit']:g}" for r in pp if not _gap_holds(r)]
    return Row(gaps or None, Verdict.NOT_RUN if not pp else Verdict.CONTRADICTED if bad else Verdict.REPRODUCED,
               [x.d("clamp_numerics"), x.paths.figure("clamp_forms")],
               "Largest |post - pre| gate factor measured on the grid's gate values, against L - silu(L) = "
               + ", ".join(f"{r['gate_gap']:.6g} (L={r['limit']:g})" for r in pp)
               + (f"; does not hold for {', '.join(bad)}" if bad else "") + ".", "CPU float64")


#: the routed-scaling finding's paths: the card's, the Triton and Marlin runners (a runner's row takes the worst
#: method that runs it), and NVFP4 on Marlin (compressed-tensors W4A16, the pre-Blackwell fallback for W4A4)
RSF_PATHS = {"card": "nvfp4-w4a4-cutlass", "triton": "triton", "marlin": "marlin",
             "marlin_nvfp4": "nvfp4-w4a16-marlin"}
RSF_CLAIM = ("SGLang's compressed-tensors W4A4 NVFP4 MoE path with the FlashInfer CUTLASS runner (the card's) applies "
             "Ling's routed_scaling_factor (2.5) nowhere, on every audited release: the routed experts run at 1/2.5 "
             "of their trained weight against the shared expert, with or without the clamp patch.")


@finding_rule("finding.routed-scaling-dropped", SGLangMeasurements, claim=RSF_CLAIM)
def routed_scaling_dropped(x: SGLangMeasurements) -> Row:
    """The routed_scaling_factor audit (``data/sglang_param_audit.json``) of the card's path on every
    audited release, with the Triton and Marlin runners beside it, and its agreement with the blind
    hand readings (``data/sglang_param_agreement.json``): reproduced when the card's path reads
    DROPPED on every release and the agreement reaches :data:`~nvfp4study.sglang.agreement.
    MIN_AGREEMENT`; partly when it reads DROPPED but the agreement is below it or not run (a machine
    reading); contradicted when a release reads otherwise."""
    from ...sglang import agreement as ag

    rows = (x.params or {}).get("routed_scaling_factor") or []
    by = {(r.get("sglang_version"), r.get("path")): r for r in rows if isinstance(r, dict)}
    got = {k: {v: by[(v, p)]["verdict"] for v in x.versions if (v, p) in by} for k, p in RSF_PATHS.items()}
    if not got["card"]:  # the parameter cell did not run (or audited another release): nothing to say
        why = ("the cell that writes data/sglang_param_audit.json did not run" if x.params is None else
               f"data/sglang_param_audit.json has no routed_scaling_factor row of {RSF_PATHS['card']} on an "
               "audited release")
        return Row(None, Verdict.NOT_RUN, [x.d("sglang_param_audit")], f"Not run: {why}.", x.on)
    at = {v: where(by[(v, RSF_PATHS["card"])]) for v in got["card"]}
    agr = ((x.param_agreement or {}).get("routed_scaling_factor") or {}).get("overall")
    dropped = all(vd == "DROPPED" for vd in got["card"].values())
    verdict = (Verdict.CONTRADICTED if not dropped else
               Verdict.REPRODUCED if agr and agr["n"] and agr["rate"] >= ag.MIN_AGREEMENT else Verdict.PARTLY)
    releases = ", ".join(f"{v} {vd} at {at[v]}" for v, vd in got["card"].items())
    agreed = (f"the audit agreed with a blind hand reading of this parameter on {agr['agree']} of {agr['n']} "
              f"paths ({ag.pct(agr['rate'])}, Wilson 95 % {ag.pct(agr['wilson95'][0])} to "
              f"{ag.pct(agr['wilson95'][1])}; the bar is {ag.pct(ag.MIN_AGREEMENT)})" if agr and agr["n"]
              else "its agreement with blind hand readings was not run")
    others = "; ".join(f"{RSF_PATHS[k]}: " + ", ".join(f"{v} {vd}" for v, vd in got[k].items())
                       for k in ("triton", "marlin", "marlin_nvfp4") if got[k])
    return Row({"card_path": got["card"], "card_path_at": at, "triton": got["triton"], "marlin": got["marlin"],
                "marlin_nvfp4": got["marlin_nvfp4"], "agreement": agr},
               verdict, [x.d("sglang_param_audit"), x.d("sglang_param_agreement")],
               f"audit-sglang --param routed_scaling_factor on the card's path ({RSF_PATHS['card']}): {releases}; "
               f"{others}; {agreed}. A static reading of the source; stage 04 measures the native path the CPU "
               "engine runs (audit.cpu-routed-scaling), and the exact patch set applies the factor on the card's "
               "path.", f"sglang {', '.join(x.versions)} (released wheels' source)")
