"""Stage 03 (``notebooks/03_patch_sglang``): one function per notebook cell.

Each function reads the stage's params, writes its data files under the run folder and returns
something to show (a DataFrame, a figure path, a Markdown string). Files written:

- ``data/sglang_audit.json``: the clamp audit of ``params.sglang.version`` (one object per path);
- ``data/sglang_audit_versions.json``: the audit of every ``params.sglang.audit_versions``;
- ``data/sglang_backend_matrix.json``: per audited release, checkpoint format x device class: the
  ``--moe-runner-backend`` values reaching a MoE path, what ``auto`` picks, each verdict;
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
import py_compile
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..core import display
from ..core.claim_rules import record_rules
from ..core.display import text_table
from ..core.files import write_json
from ..core.stage import Stage, open_stage_named
from ..sglang import agreement as ag
from ..sglang import card_patches as cpt
from ..sglang import clamp_numerics as cn
from ..sglang import patch as sp
from ..sglang.audit import PathResult, audit_release, audit_tree
from ..sglang.audit_report import catalogued, dispatch_summary, matrix_figure, results_frame
from ..sglang.checks import extra_checks
from ..sglang.releases import expand_versions
from ..sglang.source import SGLangTree, copy_tree, resolve_tree, unpack_wheel
from .claim_rules import r03_sglang as rules

NOTEBOOK = "03_patch_sglang"


def open_stage(params_file: str = "", run_dir: str = "") -> Stage:
    """:func:`nvfp4study.core.stage.open_stage_named` for notebook ``03_patch_sglang``."""
    return open_stage_named(NOTEBOOK, params_file, run_dir)


def markdown(text: str) -> Any:
    """The notebook's Markdown output (:func:`nvfp4study.core.display.markdown`)."""
    return display.markdown(text)


#: The version the model card describes (its patch targets this release).
CARD_VERSION = rules.CARD_VERSION




def stage_tree(stage: Stage) -> SGLangTree:
    """The tree ``params.sglang`` names: the released wheel's source (default), the install of
    ``params.server.python`` (GPU profile), or a folder. With ``server.launcher: docker`` the
    "installed" SGLang is the image's, whose version each launch compares with ``sglang.version``
    and whose clamp files are replaced by patched copies of that release's wheel
    (:func:`nvfp4study.serving.docker.patched_mounts`): the released wheel is audited, and no
    local SGLang is needed."""
    from ..serving.strategies import in_image

    s, server = stage.params.sglang, stage.params.server
    if s.source == "installed" and in_image(stage.params):
        return resolve_tree("wheel", version=s.version)
    return resolve_tree(s.source, version=s.version, path=s.path, python=server.python)


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
    """Audit every ``params.sglang.audit_versions`` from its released wheel, one after the other
    in this process (the parse cache is keyed by file content, so a file unchanged between
    releases is parsed once: auditing them in parallel processes was no faster here, 19 s
    against 20 s on 2 cores, and slower when the cores are shared); writes
    ``data/sglang_audit_versions.json``."""
    out: list[PathResult] = []
    for v in expand_versions(stage.params.sglang.audit_versions):
        res = audit_release(v)
        if isinstance(res, str):
            print(res)  # one line, no matrix rows for a release Ling cannot load on
        else:
            out += res
    write_json(stage.paths.data("sglang_audit_versions"), [r.as_json() for r in out])
    return out


def backend_matrix(stage: Stage, results: list[PathResult], params: dict[str, list[dict[str, Any]]] | None = None):
    """The format x device matrix of every audited release (:mod:`nvfp4study.sglang.backend_matrix`,
    from the audit rows ``results`` of :func:`audit_versions`, each reached path with the other
    parameters' verdicts from ``params``, :func:`param_audit`'s rows); writes
    ``data/sglang_backend_matrix.json`` (``{"latest", "releases": {version: matrix}}``) and
    returns the latest release's compact table (format x device: what ``auto`` picks, its verdict;
    a wrapped ``Styler``, its frame in ``.data``)."""
    import pandas as pd

    from ..sglang import backend_matrix as bm
    from ..sglang.releases import release_key

    by_version: dict[str, list[PathResult]] = {}
    for r in results:
        by_version.setdefault(r.sglang_version, []).append(r)
    mats = {v: bm.build_matrix(unpack_wheel(v), rows, params) for v, rows in sorted(by_version.items(),
                                                                           key=lambda kv: release_key(kv[0]))}
    latest = list(mats)[-1] if mats else None
    write_json(stage.paths.data("sglang_backend_matrix"), {"latest": latest, "releases": mats})
    return text_table(pd.DataFrame(bm.summary_rows(mats[latest]) if latest else []))


def backend_answer(stage: Stage) -> Any:
    """The sentence a Ling user needs (what ``auto`` picks for the card's checkpoint on SM100 and
    SM120, with the verdict), read from ``data/sglang_backend_matrix.json``, as Markdown.

    Raises:
        StageInputMissing: :func:`backend_matrix` has not written its file.
    """
    from ..core.errors import StageInputMissing
    from ..sglang.backend_matrix import card_answer

    f = stage.paths.data("sglang_backend_matrix")
    if not f.is_file():
        raise StageInputMissing(f"{f} is missing: run the backend-matrix cell first")
    doc = json.loads(f.read_text())
    return markdown(card_answer(doc["releases"][doc["latest"]]) if doc["latest"] else "No release audited.")


def audit_agreement(stage: Stage, rows: list[PathResult] | list[dict[str, Any]]) -> dict[str, Any]:
    """The derived paths' verdicts in ``rows`` against the blind hand readings; writes
    ``data/sglang_audit_agreement.json``; returns :func:`nvfp4study.sglang.agreement.write`'s tables."""
    return ag.write(stage.paths.data("sglang_audit_agreement"), rows)


def param_audit(stage: Stage, results: list[PathResult] | list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Every MoE parameter but the clamp (``sglang/data/moe_params.yaml``; ``audit-sglang --param
    NAME``, :func:`nvfp4study.sglang.param_audit.audit_param`) on every path of each release
    ``results`` audits, reusing its clamp rows; writes ``data/sglang_param_audit.json`` (``{"params":
    {name: [row, ...]}}``, rows as ``ParamResult.as_json``), which stage 04 reads for the path its CPU
    engine runs. Returns the ``params`` mapping."""
    from ..sglang import moe_params
    from ..sglang.param_audit import audit_param
    from ..sglang.source import unpack_wheel

    # the clamp rows this stage already has (a path that cannot run Ling cannot for any parameter):
    # without them each parameter re-ran the clamp audit of each release (03 went from ~25 s to ~3 min)
    clamp: dict[str, list[PathResult]] = {}
    for r in results:
        if isinstance(r, PathResult):
            clamp.setdefault(r.sglang_version, []).append(r)
    audited = list(dict.fromkeys((r.as_json() if hasattr(r, "as_json") else r)["sglang_version"] for r in results))
    rows: dict[str, list[dict[str, Any]]] = {}
    for name in moe_params.names():
        if moe_params.param(name).kind == "clamp":
            continue  # its rows are results' own
        rows[name] = [r.as_json() for v in audited
                      for r in audit_param(unpack_wheel(v), name, clamp_rows=clamp.get(v))]
    write_json(stage.paths.data("sglang_param_audit"), {"params": rows})
    return rows


def param_agreement(stage: Stage, rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """:func:`param_audit`'s rows against the blind hand readings of each parameter
    (``sglang/data/param_hand_readings.yaml``, :func:`nvfp4study.sglang.agreement.param_agreement`),
    on the releases both cover; writes ``data/sglang_param_agreement.json``. Returns ``{"sentence",
    "agreement"}``; with no readings file, every parameter is not run."""
    _, readings = ag.param_hand_readings()
    result = ag.param_agreement({n: rows.get(n, []) for n in readings}, readings)
    write_json(stage.paths.data("sglang_param_agreement"), result)
    return {"sentence": ag.param_agreement_sentence(result), "agreement": result}


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
    from ..serving.strategies import in_image

    if in_image(stage.params):  # nothing installed here is patched: copies are mounted
        write_json(state_file, {"install": None, "clamp_mode": None, "needed_modes": needed,
                                "note": f"server.launcher docker: each launch mounts copies of SGLang {tree.version}'s "
                                        "clamp files patched to its mode over the image's (the image is not modified)"})
        return (f"SGLang {tree.version}'s released files accept modes {', '.join(needed)}; with the docker launcher "
                "each launch mounts copies patched to its mode over the image's files (nothing installed is changed).")
    sp.switch_mode(tree, "stock", det=False, state_file=state_file)
    st = json.loads(state_file.read_text())
    st.update(needed_modes=needed, install=str(tree.root))
    write_json(state_file, st)
    return (f"The serving install `{tree.root}` (SGLang {tree.version}) accepts modes "
            f"{', '.join(needed)}; it is left in `stock`, recorded in `{state_file.name}`.")


# --- the ledger ---------------------------------------------------------------------------------
def _kernel_evidence(stage: Stage) -> dict[str, Any]:
    """The stored GPU measurement of the clamp forms (:mod:`nvfp4study.sglang.kernel_evidence`, made
    on an NVIDIA H200 by ``make gpu-clamp-check``, not by this run), copied into the run's
    ``data/clamp_kernels_h200.json`` as evidence; ``{"summary", "copy"}``."""
    from ..sglang import kernel_evidence as ke

    doc = ke.load()
    copy = stage.paths.data("clamp_kernels_h200")
    write_json(copy, doc)
    return {"summary": ke.summary(doc), "copy": copy}


def record_claims(stage: Stage, version: str):
    """Record every stage-03 claim of the card and the study's own findings, each decided by its
    rule (:mod:`~nvfp4study.stages.claim_rules.r03_sglang`) from the data files written above;
    returns the recorded rows as a table.

    Raises:
        StageInputMissing: a data file of the cells above is missing.
    """
    import pandas as pd

    x = rules.SGLangMeasurements.gather(stage.paths, version, kernels={})
    x = replace(x, kernels=_kernel_evidence(stage))
    # what derived-path counts may use (finding.audit-agreement); the notebook's cell wrote it too
    x = replace(x, agreement=audit_agreement(stage, x.allv))
    rows = record_rules(stage, x)
    return pd.DataFrame([{k: r.get(k) for k in ("id", "origin", "verdict", "checked_on", "note")} for r in rows])
