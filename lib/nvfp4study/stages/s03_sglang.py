"""Stage 03 (``notebooks/03_patch_sglang``): one function per notebook cell.

Each function reads the stage's params, writes its data files under the run folder and returns
something to show (a DataFrame, a figure path, a Markdown string). Files written:

- ``data/sglang_audit.json``: the clamp audit of ``params.sglang.version`` (one object per path);
- ``data/sglang_audit_versions.json``: the audit of every ``params.sglang.audit_versions``;
- ``data/sglang_audit_agreement.json``: the derived paths' verdicts against the blind hand readings;
- ``data/sglang_checks.json``: the other checks per version (MIN_DEEPGEMM_DIM, scales, W4A16, ...);
- ``data/sglang_patch_roundtrip.json``: apply / audit / compile / revert of each mode on a copy;
- ``data/clamp_numerics.json``: the clamp-form comparison;
- ``data/sglang_card_patches.json``: the card's own patch files replayed on each release (or why not);
- ``data/sglang_patch_state.json``: which mode the serving install is in (and which it can take);
- ``figures/sglang_clamp_matrix.png``, ``figures/clamp_forms.png``.
"""

from __future__ import annotations

import hashlib
import json
import math
import py_compile
import shutil
from pathlib import Path
from typing import Any

from ..core.display import markdown, text_table  # noqa: F401  (markdown: for the notebook)
from ..core.errors import NoBailingMoeV3
from ..core.files import write_json
from ..core.stage import Stage, open_stage_named
from ..sglang import agreement as ag
from ..sglang import card_patches as cpt
from ..sglang import clamp_numerics as cn
from ..sglang import patch as sp
from ..sglang.audit import PathResult, audit_tree
from ..sglang.audit_report import catalogued, dispatch_summary, matrix_figure, results_frame
from ..sglang.checks import extra_checks
from ..sglang.releases import expand_versions
from ..sglang.source import SGLangTree, copy_tree, resolve_tree, unpack_wheel

NOTEBOOK = "03_patch_sglang"


def open_stage(params_file: str = "", run_dir: str = "") -> Stage:
    """:func:`nvfp4study.core.stage.open_stage_named` for notebook ``03_patch_sglang``."""
    return open_stage_named(NOTEBOOK, params_file, run_dir)

#: The version the model card describes (its patch targets this release).
CARD_VERSION = "0.5.20"




def stage_tree(stage: Stage) -> SGLangTree:
    """The tree ``params.sglang`` names: the released wheel's source (default), the install of
    ``params.server.python`` (GPU profile), or a folder."""
    s = stage.params.sglang
    return resolve_tree(s.source, version=s.version, path=s.path, python=stage.params.server.python)


def describe_tree(tree: SGLangTree) -> str:
    return f"SGLang **{tree.version}** from the {tree.origin} source at `{tree.root}`."


def audit_main(stage: Stage, tree: SGLangTree):
    """Audit the stage's tree; writes ``data/sglang_audit.json``; returns the table (left-aligned,
    wrapped, so the deciding rule is readable without scrolling)."""
    results = audit_tree(tree)
    write_json(stage.paths.data("sglang_audit"), [r.as_json() for r in results])
    return text_table(results_frame(catalogued(results)).drop(columns=["sglang"]))


def found_paths(results: list[PathResult]):
    """The paths found by following each release's dispatch that the catalogue does not name,
    counted per release and verdict (their rows are in ``data/sglang_audit_versions.json``)."""
    return text_table(dispatch_summary(results))


def audit_versions(stage: Stage) -> list[PathResult]:
    """Audit every ``params.sglang.audit_versions`` from its released wheel; writes
    ``data/sglang_audit_versions.json``."""
    out: list[PathResult] = []
    for v in expand_versions(stage.params.sglang.audit_versions):
        try:
            out += audit_tree(unpack_wheel(v))
        except NoBailingMoeV3 as exc:
            print(exc)  # one line, no matrix rows for a release Ling cannot load on
    write_json(stage.paths.data("sglang_audit_versions"), [r.as_json() for r in out])
    return out


def audit_agreement(stage: Stage, rows: list[PathResult] | list[dict[str, Any]]) -> dict[str, Any]:
    """The derived paths' verdicts in ``rows`` against the blind hand readings; writes
    ``data/sglang_audit_agreement.json``; returns :func:`nvfp4study.sglang.agreement.write`'s tables."""
    return ag.write(stage.paths.data("sglang_audit_agreement"), rows)


def verdict_matrix(results: list[PathResult]):
    """Path x version table of the catalogued paths' verdicts."""
    df = results_frame(catalogued(results))
    versions = list(dict.fromkeys(df["sglang"]))
    return df.pivot(index="path", columns="sglang", values="verdict").reindex(
        index=list(dict.fromkeys(df["path"])), columns=versions)


def matrix_png(stage: Stage, results: list[PathResult]) -> Path:
    return matrix_figure(results, stage.paths.figure("sglang_clamp_matrix"))


def checks(stage: Stage):
    """The other checks for every audited version; writes ``data/sglang_checks.json`` and
    returns a one-row-per-version summary."""
    import pandas as pd

    allc = {v: extra_checks(unpack_wheel(v)) for v in expand_versions(stage.params.sglang.audit_versions)}
    write_json(stage.paths.data("sglang_checks"), allc)
    rows = []
    for v, c in allc.items():
        md, sf = c["min_deepgemm_dim"], c["shared_fusion"]
        w16 = c["moe_scheme"]["W4A16@sm100"]
        rows.append({
            "sglang": v,
            "MIN_DEEPGEMM_DIM": f"{md.get('value')} (L{md.get('line')}; guard '{md.get('guard')}' L{md.get('guard_lines')})",
            "N=32 to DeepGEMM": md.get("n32_to_deepgemm"),
            "input global scales": ", ".join(f"{k}: {x['alloc']} L{x['line']}" for k, x in c["input_global_scales"].items()),
            "gate/up scales differ (W4A4)": c["gate_up_scale_policy"].get("W4A4", {}).get("action"),
            "gate/up scales differ (W4A16)": c["gate_up_scale_policy"].get("W4A16", {}).get("action", "no scheme"),
            "W4A16 on Blackwell": w16.get("scheme") or f"{w16['error']} in {w16['function']} L{w16['line']}",
            "W4A4 below Blackwell": c["moe_scheme"]["W4A4@sm90"].get("error") or c["moe_scheme"]["W4A4@sm90"]["scheme"],
            "fusion auto-off (shared in ignore)": sf["evaluations"].get("shared experts in ignore (regex)", {}).get("fusion_disabled"),
            "fusion auto-off (shared untargeted)": sf["evaluations"].get("shared experts only untargeted", {}).get("fusion_disabled"),
            "fusion veto sees clamp lists": sf.get("considers_clamp_lists"),
        })
    return pd.DataFrame(rows)


def _snapshot(tree: SGLangTree) -> dict[str, str]:
    return {str(p.relative_to(tree.root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(tree.package.rglob("*.py"))}


def _roundtrip(stage: Stage, src: SGLangTree, modes: list[str]) -> list[dict[str, Any]]:
    copy = copy_tree(src, stage.paths.work(f"sglang-{src.version}"))
    sp.switch_mode(copy, "stock", det=False)  # an install may arrive patched; start from release
    before = _snapshot(copy)
    rows = []
    for mode in modes:
        written = sp.apply(copy, mode)
        again = sp.apply(copy, mode)
        ok = sp.verify(copy, mode)["ok"]
        compiled = []
        for w in written:
            py_compile.compile(w, cfile=str(stage.paths.work("pycheck.pyc")), doraise=True)
            compiled.append(str(Path(w).relative_to(copy.root)))
        audit = {r.path: r for r in audit_tree(copy, ["nvfp4-w4a4-cutlass", "nvfp4-w4a4-trtllm"])}
        sp.revert(copy, mode)
        rows.append({
            "sglang": src.version, "mode": mode, "files_written": len(written),
            "idempotent": again == [], "verify_ok": ok, "py_compile_ok": compiled,
            "cutlass_verdict": audit["nvfp4-w4a4-cutlass"].verdict.value,
            "cutlass_rule": audit["nvfp4-w4a4-cutlass"].rule,
            "trtllm_verdict": audit["nvfp4-w4a4-trtllm"].verdict.value,
            "byte_identical_after_revert": _snapshot(copy) == before,
        })
    stage.paths.work("pycheck.pyc").unlink(missing_ok=True)
    shutil.rmtree(copy.root)  # ~70 MB of sources; kept only when a step above failed
    for r in rows:
        r["copy"] = f"{copy.root} (removed after the round trip)"
    return rows


def patch_roundtrip(stage: Stage, tree: SGLangTree):
    """Apply, audit, compile and revert each patch mode on a COPY of the tree in ``work/`` (and
    the card's own patch on a copy of SGLang 0.5.20); writes ``data/sglang_patch_roundtrip.json``."""
    import pandas as pd

    rows = []
    want = [m for m in stage.params.sglang.patch_modes if m != "stock"]
    have = sp.modes_for(tree.version)
    modes = [m for m in want if m in have] + ([sp.DET] if stage.params.sglang.deterministic_patch and sp.DET in have else [])
    rows += _roundtrip(stage, tree, modes)
    if tree.version != CARD_VERSION and CARD_VERSION in sp.patch_versions():
        card = unpack_wheel(CARD_VERSION)
        rows += _roundtrip(stage, card, [m for m in sp.modes_for(CARD_VERSION) if m != "stock"])
    write_json(stage.paths.data("sglang_patch_roundtrip"), rows)
    return pd.DataFrame(rows).drop(columns=["cutlass_rule", "py_compile_ok"])


def card_patch_files(stage: Stage):
    """The card's own ``sglang_patch/*.patch`` (``sglang.card_patches`` on the Hub or
    ``sglang.card_patch_dir``) applied as its instructions say, on a copy of each
    ``sglang.card_patch_versions`` release (:func:`nvfp4study.sglang.card_patches.run`); writes
    ``data/sglang_card_patches.json``; returns the release x file table."""
    import pandas as pd

    s = stage.params.sglang
    data = cpt.run(s.card_patches, s.card_patch_dir, s.card_patch_versions, stage.paths.work("card-patches"))
    write_json(stage.paths.data("sglang_card_patches"), data)
    return pd.DataFrame(cpt.table(data))


def numerics(stage: Stage, tree: SGLangTree):
    """The clamp forms compared (table + ``figures/clamp_forms.png``); writes
    ``data/clamp_numerics.json`` with the SGLang source lines of the forms in ``tree``."""
    df = cn.compare()
    fig = cn.figure(stage.paths.figure("clamp_forms"))
    write_json(stage.paths.data("clamp_numerics"), {"rows": df.to_dict(orient="records"),
                                               "sglang_sources": cn.formula_sources(tree.root),
                                               "figure": str(fig)})
    return df


def prepare_install(stage: Stage, tree: SGLangTree) -> str:
    """GPU profile (``apply_to_install``): check that every mode stage 05 needs can be applied
    to the serving install (hashes and write permission, nothing written), put the install in
    ``stock`` and record it in ``data/sglang_patch_state.json``. Stage 05 then switches modes
    with :func:`nvfp4study.sglang.patch.serving_mode` (or ``switch_mode``) and that state file.
    Otherwise write the state file saying no install is patched. Returns a Markdown sentence."""
    state_file = stage.paths.data("sglang_patch_state")
    needed = list(dict.fromkeys(stage.params.corruption.clamp_modes))
    if not stage.params.sglang.apply_to_install:
        write_json(state_file, {"install": None, "clamp_mode": None, "needed_modes": needed,
                           "note": "apply_to_install is false: patches were exercised on a copy only"})
        return ("No serving install is patched in this profile (`apply_to_install: false`); "
                "the modes were applied and reverted on a copy in `work/`.")
    for m in needed:
        sp.check_can_apply(tree, m)
    sp.switch_mode(tree, "stock", det=False, state_file=state_file)
    st = json.loads(state_file.read_text())
    st.update(needed_modes=needed, install=str(tree.root))
    write_json(state_file, st)
    return (f"The serving install `{tree.root}` (SGLang {tree.version}) accepts modes "
            f"{', '.join(needed)}; it is left in `stock`, recorded in `{state_file.name}`.")


# --- the ledger ---------------------------------------------------------------------------------
def _load(stage: Stage, stem: str) -> Any:
    p = stage.paths.data(stem)
    if not p.is_file():
        from ..core.errors import StageInputMissing

        raise StageInputMissing(f"{p} is missing: run the cells above first")
    return json.loads(p.read_text())


def _by(rows: list[dict], version: str, path: str) -> dict:
    return next(r for r in rows if r["sglang_version"] == version and r["path"] == path)


def _where(r: dict) -> str:
    return f"{r['file']}:{r['line']}" if r.get("file") else "-"


#: the forms the audit reads from the code (README, "The SwiGLU clamp"), which the GPU run tests
READ_FORMS = {"flashinfer_cutlass/sglang_swiglu": "pre_silu", "flashinfer_cutlass/swiglu_step": "post_silu",
              "sglang_triton/clamp": "post_silu"}


def _record_kernel_measurement(stage: Stage, find) -> dict[str, Any]:
    """``finding.clamp-kernels-measured``: the stored GPU measurement of the clamp forms
    (:mod:`nvfp4study.sglang.kernel_evidence`, made on an NVIDIA H200 by ``make gpu-clamp-check``,
    not by this run), copied into the run's ``data/`` as evidence; reproduced when the kernels
    compute the forms the audit reads from the code (:data:`READ_FORMS`). Returns the copy's path
    and a sentence for the clamp rows that cite it."""
    from ..sglang import kernel_evidence as ke

    doc = ke.load()
    summ = ke.summary(doc)
    copy = stage.paths.data("clamp_kernels_h200")
    write_json(copy, doc)
    got = {k: summ["forms"].get(k) for k in READ_FORMS}
    agree = all(got[k] == v for k, v in READ_FORMS.items())
    find("finding.clamp-kernels-measured",
         claim="On a GPU, SGLang 0.5.23's NVFP4 CUTLASS call (FlashInfer 0.7.2, Swiglu + limit) computes the "
               "pre-SiLU form, FlashInfer's SwigluStep and SGLang's Triton MoE the post-SiLU (Ling) form.",
         measured=got, verdict="reproduced" if agree else "contradicted", evidence=[copy],
         checked_on=f"{summ['machine']}, {summ['date']} (stored measurement, not made by this run)",
         note=summ["sentence"] + ". Probe inputs make each output one SwiGLU value; a form is the kernel's when "
              f">= {ke.MATCH:.0%} of the elements that separate the forms match it bit for bit.")
    return {"evidence": copy, "sentence": f"GPU check ({summ['sentence']})."}


def record_claims(stage: Stage, version: str):
    """Record every stage-03 claim of the card and the study's own findings, from the data
    files written above; returns the recorded rows as a table."""
    import pandas as pd

    allv = _load(stage, "sglang_audit_versions")
    main = _load(stage, "sglang_audit")
    chk = _load(stage, "sglang_checks")
    rt = _load(stage, "sglang_patch_roundtrip")
    num = _load(stage, "clamp_numerics")
    d = stage.paths.data
    versions = list(dict.fromkeys(r["sglang_version"] for r in allv))
    on = f"sglang {version}"
    m = {r["path"]: r for r in main}
    rows = []

    def rec(cid: str, **kw: Any) -> None:
        rows.append(stage.record(cid, checked_on=on, **kw))

    def find(fid: str, **kw: Any) -> None:
        rows.append(stage.add_finding(fid, checked_on=kw.pop("checked_on", on), **kw))

    gpu = _record_kernel_measurement(stage, find)  # the GPU measurement the clamp rows cite
    find("finding.audit-agreement", evidence=[d("sglang_audit_agreement"), d("sglang_audit_versions")],
         **ag.finding(audit_agreement(stage, allv), main, version))  # what derived-path counts may use

    # clamp.nvfp4-dropped ---------------------------------------------------------------------
    per = {v: {"cutlass": _by(allv, v, "nvfp4-w4a4-cutlass")["verdict"],
               "trtllm": _by(allv, v, "nvfp4-w4a4-trtllm")["verdict"],
               "literal_none": _where(_by(allv, v, "nvfp4-w4a4-trtllm"))
               if _by(allv, v, "nvfp4-w4a4-trtllm")["rule"].startswith("literal") else None} for v in versions}
    cut, trt = m["nvfp4-w4a4-cutlass"], m["nvfp4-w4a4-trtllm"]
    literal = trt["rule"].startswith("literal")
    verdict = "reproduced" if cut["verdict"] == "DROPPED" and literal else \
        "partly" if literal or cut["verdict"] == "DROPPED" else "contradicted"
    rec("clamp.nvfp4-dropped", measured=per, verdict=verdict,
        evidence=[d("sglang_audit"), d("sglang_audit_versions"), gpu["evidence"]],
        note=(f"On {version} the literal gemm1_clamp_limit=None is in the TRT-LLM branch ({_where(trt)}), "
              f"while the CUTLASS branch Ling runs on is {cut['verdict']} ({_where(cut)}: {cut['rule'][:120]}). "
              + "; ".join(f"{v}: CUTLASS {x['cutlass']}, TRT-LLM {x['trtllm']}" for v, x in per.items()) + ". " + gpu["sentence"]))

    # clamp.others-forward --------------------------------------------------------------------
    card_runners = {"triton": ["triton"], "marlin": ["marlin"], "ascend": ["ascend"],
                    "deep_gemm": ["deep-gemm", "deep-gemm-contiguous"], "mxint4": ["mxint4-trtllm"]}
    # A path missing from the audit, ABSENT from this version or UNDECIDED tells nothing about
    # forwarding: skip it (listed in the note); a runner with no decided path is not counted.
    skipped = [f"{p} ({m[p]['verdict'] if p in m else 'not audited'})" for ps in card_runners.values()
               for p in ps if p not in m or m[p]["verdict"] in ("ABSENT", "UNDECIDED")]
    fw = {k: {p: m[p]["verdict"] for p in ps if p in m and m[p]["verdict"] not in ("ABSENT", "UNDECIDED")}
          for k, ps in card_runners.items()}
    fw = {k: x for k, x in fw.items() if x}
    fwd = {k: all(v in ("EXACT", "APPROX") for v in x.values()) for k, x in fw.items()}
    unchecked = [k for k in card_runners if k not in fw]
    of_verdict = ("not run" if not fw else "contradicted" if not all(fwd.values())
                  else "partly" if unchecked else "reproduced")
    rec("clamp.others-forward", measured=fw or None, verdict=of_verdict,
        evidence=[d("sglang_audit")],
        note=("Forward the limit: " + (", ".join(k for k, ok in fwd.items() if ok) or "none") + ". Drop it: "
              + (", ".join(f"{k} ({'; '.join(m[p]['rule'] for p in fw[k])})" for k, ok in fwd.items() if not ok)
                 or "none") + "."
              + (f" Skipped (no decided audit row): {', '.join(skipped)}." if skipped else "")
              + (f" Runners not checked: {', '.join(unchecked)}." if unchecked else "")))

    # clamp.cutlass-fix -----------------------------------------------------------------------
    card_rt = next((r for r in rt if r["sglang"] == CARD_VERSION and r["mode"] == "card"), None)
    exact_rt = next((r for r in rt if r["sglang"] == version and r["mode"] == "exact"), None)
    fix = {"card_patch_on_" + CARD_VERSION: card_rt["cutlass_verdict"] if card_rt else None,
           f"stock_{version}": cut["verdict"], f"exact_patch_on_{version}": exact_rt["cutlass_verdict"] if exact_rt else None}
    fv = fix["card_patch_on_" + CARD_VERSION]
    others = (f"Stock SGLang {version}: CUTLASS {cut['verdict']}; our 'exact' patch on {version}: "
              f"{fix[f'exact_patch_on_{version}'] or 'not run'}.")
    cpf_file = d("sglang_card_patches")
    cpf = json.loads(cpf_file.read_text()) if cpf_file.is_file() else {"run": False, "reason": "cell not run"}
    if cpf["run"]:  # the card's own files, as published
        sm, label = cpf["summary"], cpf["origin"].get("label") or cpf["origin"].get("path")
        on_v = next(iter(sm["cutlass"]), None)
        cv = sm["cutlass"].get(on_v)
        targets = sorted({t for r in cpf["results"][:1] for p in r["patches"] for t in p["targets"]})
        rows.append(stage.record(
            "clamp.cutlass-fix", checked_on=f"{label} on sglang {on_v or 'no release'}",
            measured={"card_files": cpf["origin"]["files"], "target_files": targets, "applies_to": sm["applies_to"],
                      "fails_on": sm["fails_on"], "cutlass_after_card_files": sm["cutlass"], **fix},
            verdict="contradicted" if cv is None else "reproduced" if cv == "EXACT" else "partly" if cv == "APPROX"
            else "contradicted", evidence=[cpf_file, d("sglang_audit_versions")],
            note=(f"The card's own files ({label}) applied with `patch -p1` in sglang/srt to {', '.join(sm['applies_to']) or 'no release'}"
                  + (f" make the NVFP4 CUTLASS path {cv} on {on_v}" if cv else "")
                  + (": FlashInfer promotes Swiglu + swiglu_limit to SwigluBias, the pre-SiLU GPT-OSS form" if cv == "APPROX" else "")
                  + ". Do not apply: " + ("; ".join(f"{v}: {w}" for v, w in sm["fails_on"].items()) or "none")
                  + f". Our reconstruction on {CARD_VERSION}: {fv or 'not run'}. {others}")))
    elif fv is None:
        rec("clamp.cutlass-fix", measured=None, verdict="not run",
            evidence=[d("sglang_patch_roundtrip"), d("sglang_audit_versions")],
            note=f"The card's patch was not replayed on SGLang {CARD_VERSION} in this run. " + others)
    else:
        rec("clamp.cutlass-fix", measured=fix,
            verdict="reproduced" if fv == "EXACT" else "partly" if fv == "APPROX" else "contradicted",
            evidence=[d("sglang_patch_roundtrip"), d("sglang_audit_versions")],
            note=(f"OUR reconstruction of the card's three edits (patches/{CARD_VERSION}/card; the card's own files: "
                  f"not run: {cpf['reason']}), applied to SGLang {CARD_VERSION}, makes the NVFP4 CUTLASS path {fv}"
                  + (": FlashInfer promotes Swiglu + swiglu_limit to SwigluBias, the pre-SiLU GPT-OSS form"
                     if fv == "APPROX" else "")
                  + f". {others} An exact fix selects ActivationType.SwigluStep, which our 'exact' patch does."))

    # scales.input-empty-nan ------------------------------------------------------------------
    alloc = {v: {k: f"{x['alloc']} L{x['line']}" for k, x in c["input_global_scales"].items()} for v, c in chk.items()}
    empty = all(x["alloc"] == "torch.empty" for x in chk[version]["input_global_scales"].values())
    rec("scales.input-empty-nan", measured=alloc, verdict="partly" if empty else "contradicted",
        evidence=[d("sglang_checks")],
        note=("w13/w2_input_global_scale are allocated with torch.empty in every audited version; "
              "the NaN-logit consequence of a checkpoint without them needs an NVFP4 GPU and was not run."
              if empty else "The input global scales are not allocated with torch.empty here."))

    # sglang.w4a16-unservable -----------------------------------------------------------------
    w16 = {v: (c["moe_scheme"]["W4A16@sm100"].get("scheme")
               or f"{c['moe_scheme']['W4A16@sm100']['error']} ({c['moe_scheme']['W4A16@sm100']['function']} "
                  f"L{c['moe_scheme']['W4A16@sm100']['line']})") for v, c in chk.items()}
    raises = "AttributeError" in w16[version] and "num_bits" in w16[version]
    marlin = m.get("nvfp4-w4a16-marlin", {}).get("verdict")
    rec("sglang.w4a16-unservable", measured=w16, verdict="reproduced" if raises else "contradicted",
        evidence=[d("sglang_checks"), d("sglang_audit")],
        note=("Replayed CompressedTensorsConfig.get_moe_scheme from each tree. "
              + "; ".join(f"{v}: {x}" for v, x in w16.items())
              + (f". On {version} W4A16 loads through Marlin, whose clamp verdict is {marlin}." if not raises else "")))

    # serve.shared-fusion-off -----------------------------------------------------------------
    def _off(c: dict, label: str) -> bool | None:
        return c["shared_fusion"].get("evaluations", {}).get(label, {}).get("fusion_disabled")

    sf = {v: {"auto_off_shared_in_ignore": _off(c, "shared experts in ignore (regex)"),
              "auto_off_shared_untargeted": _off(c, "shared experts only untargeted"),
              "veto_sees_clamp_lists": c["shared_fusion"].get("considers_clamp_lists"),
              "veto_line": f"{c['shared_fusion'].get('file')}:{c['shared_fusion'].get('line')}"} for v, c in chk.items()}
    s_v = sf.get(version)
    fields = (s_v["auto_off_shared_in_ignore"], s_v["auto_off_shared_untargeted"], s_v["veto_sees_clamp_lists"]) \
        if s_v else (None, None, None)
    if None in fields:
        rec("serve.shared-fusion-off", measured=None, verdict="not run", evidence=[d("sglang_checks")],
            note=(f"The shared-expert fusion veto of SGLang {version} was not found or not evaluated "
                  f"({'no checks for this version' if not s_v else s_v['veto_line']})."))
    else:
        in_ign, untgt, sees = fields
        # Card: the flag is required. It is, for the card's reason, where SGLang leaves fusion on
        # for BF16 shared experts; a veto blind to the clamp lists makes it required for the clamp.
        sf_verdict = ("reproduced" if not in_ign and not untgt
                      else "contradicted" if in_ign and untgt and sees else "partly")
        rec("serve.shared-fusion-off", measured=sf, verdict=sf_verdict, evidence=[d("sglang_checks")],
            note=(f"SGLang {version}, BailingMoeV3.shared_experts_fusion_disable_reason ({s_v['veto_line']}): fusion is "
                  f"turned off by itself when the ignore list names the shared experts: {in_ign}; when the shared "
                  f"experts are only left out of the targets: {untgt}. The veto looks at the clamp lists: {sees}"
                  + ("" if sees else " - a fused shared expert would run inside FusedMoE with the routed "
                     "gemm1_clamp_limit, so the flag is needed for Ling's clamp whatever the layout") + "."))

    # det.min-deepgemm-dim --------------------------------------------------------------------
    md = {v: {k: c["min_deepgemm_dim"].get(k) for k in ("value", "line", "guard", "guard_lines",
                                                          "n32_to_deepgemm", "reraise_line")} for v, c in chk.items()}
    det_rt = next((r for r in rt if r["sglang"] == version and r["mode"] == "det"), None)
    x = md[version]
    ok = x["value"] == 16 and x["n32_to_deepgemm"] and x.get("reraise_line")
    rec("det.min-deepgemm-dim", measured={**md, "edit_applies": bool(det_rt and det_rt["verify_ok"])},
        verdict="partly" if ok else "contradicted", evidence=[d("sglang_checks"), d("sglang_patch_roundtrip")],
        note=(f"MIN_DEEPGEMM_DIM = {x['value']} (batch_invariant_ops.py:{x['line']}), guard '{x['guard']}' sends "
              f"N=32 bf16 GEMMs to DeepGEMM and a DeepGEMM failure is re-raised (L{x.get('reraise_line')}), no "
              "fallback; our 64 edit applies and reverts. Not checked here: the DeepGEMM failure itself (GPU), and the "
              "card's attribution to the router (Ling's router weight is [512, 2560], N=512; an N=32, K=2560 GEMM "
              "matches the MLA g_proj [32, 2560])."))

    # the study's own findings ----------------------------------------------------------------
    approx_from = [v for v in versions if per[v]["cutlass"] == "APPROX"]
    find("finding.nvfp4-cutlass-approx",
         claim="From SGLang 0.5.21 the NVFP4 CUTLASS path applies Ling's clamp in the pre-SiLU GPT-OSS form "
               "(FlashInfer SwigluBias), not Ling's post-SiLU form (SwigluStep).",
         measured={v: per[v]["cutlass"] for v in versions},
         verdict="reproduced" if cut["verdict"] == "APPROX" else "contradicted",
         evidence=[d("sglang_audit_versions"), gpu["evidence"]],
         note=f"APPROX on {', '.join(approx_from) or 'none'}; {_where(cut)} ({cut['rule'][:140]}). " + gpu["sentence"])
    find("finding.trtllm-literal-none",
         claim="The TRT-LLM branch of the compressed-tensors NVFP4 MoE scheme passes a literal gemm1_clamp_limit=None "
               "in every audited release (and asserts routing_method_type, which Bailing never sets).",
         measured={v: per[v]["literal_none"] for v in versions},
         verdict="reproduced" if all(per[v]["literal_none"] for v in versions) else "partly",
         evidence=[d("sglang_audit_versions")], note=trt["rule"][:300])
    dropped = sorted(p for p, r in m.items() if r["verdict"] == "DROPPED")
    named = [p for p in dropped if m[p].get("catalogued", True)]
    find("finding.runners-drop-clamp",
         claim="Several MoE runners / schemes silently drop Ling's clamp (limit set, alpha None).",
         measured={p: _where(m[p]) for p in dropped}, verdict="reproduced" if dropped else "contradicted",
         evidence=[d("sglang_audit")],
         note="; ".join(f"{p}: {m[p]['rule']}" for p in named)
         + (f"; and {len(dropped) - len(named)} more of the {len(m)} paths found by following the dispatch "
            "(the audit's machine reading, mostly not hand-read: finding.audit-agreement)"
            if len(dropped) > len(named) else ""))
    if card_rt:
        find("finding.card-patch-approx",
             claim=f"The card's patch as described, on SGLang {CARD_VERSION}, yields the pre-SiLU form, not Ling's.",
             measured={"cutlass_verdict_after_card_patch": card_rt["cutlass_verdict"]},
             verdict="reproduced" if card_rt["cutlass_verdict"] == "APPROX" else "contradicted",
             evidence=[d("sglang_patch_roundtrip")], checked_on=f"sglang {CARD_VERSION}",
             note=card_rt["cutlass_rule"][:200])
    if exact_rt:
        find("finding.exact-patch",
             claim="Selecting SwigluStep for the NVFP4 CUTLASS call makes the path EXACT; apply/revert is byte-exact.",
             measured={k: exact_rt[k] for k in ("cutlass_verdict", "verify_ok", "idempotent", "byte_identical_after_revert")},
             verdict="reproduced" if exact_rt["cutlass_verdict"] == "EXACT" and exact_rt["byte_identical_after_revert"] else "contradicted",
             evidence=[d("sglang_patch_roundtrip")])
    pp = [r for r in num["rows"] if r["pair"] == "pre vs post"]
    gaps = {f"L={r['limit']:g}": {"max_gate_gap_g_le_L": r.get("gate_gap_le_L"),
                                  "max_gate_gap_g_gt_L": r.get("gate_gap_gt_L"),
                                  "max_relative_gate_gap_g_gt_L": r.get("gate_gap_rel_gt_L")} for r in pp}

    def _holds(r: dict) -> bool:  # measured on the grid vs the closed forms L - silu(L), 1 - sigmoid(L)
        le, gt, rel = r.get("gate_gap_le_L"), r.get("gate_gap_gt_L"), r.get("gate_gap_rel_gt_L")
        return (le is not None and gt is not None and rel is not None and math.isclose(le, 0.0, abs_tol=1e-12)
                and math.isclose(gt, r["gate_gap"], rel_tol=1e-9, abs_tol=1e-15)
                and math.isclose(rel, r["gate_gap_rel"], rel_tol=1e-9, abs_tol=1e-15))

    bad = [f"L={r['limit']:g}" for r in pp if not _holds(r)]
    find("finding.approx-size",
         claim="Pre-SiLU and post-SiLU clamps agree for gate <= L; above it the gate factor differs by at most "
               "L - silu(L), i.e. 1 - sigmoid(L) relative.",
         measured=gaps or None,
         verdict="not run" if not pp else "contradicted" if bad else "reproduced",
         evidence=[d("clamp_numerics"), stage.paths.figure("clamp_forms")], checked_on="CPU float64",
         note=("Largest |post - pre| gate factor measured on the grid's gate values, against L - silu(L) = "
               + ", ".join(f"{r['gate_gap']:.6g} (L={r['limit']:g})" for r in pp)
               + (f"; does not hold for {', '.join(bad)}" if bad else "") + "."))
    return pd.DataFrame([{k: r.get(k) for k in ("id", "origin", "verdict", "checked_on", "note")} for r in rows])
