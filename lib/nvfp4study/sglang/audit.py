"""Clamp-plumbing audit of an SGLang source tree, read with Python's ``ast`` (nothing imported).

For each MoE runner / quantization-scheme path (``data/sglang_clamp_paths.yaml``) it decides, for
a model that sets ``gemm1_clamp_limit`` and no ``gemm1_alpha`` (Ling-3.0-flash), whether the
routed-expert SwiGLU clamp is

- ``EXACT``: it reaches a kernel in Ling's post-SiLU form ``min(silu(g), L) * clamp(u, -L, L)``;
- ``APPROX``: it reaches a kernel in the GPT-OSS pre-SiLU form (``min(g, L)`` before the SiLU);
- ``DROPPED``: no clamp reaches the kernel, silently;
- ``REFUSED``: the path raises when the limit is set;

plus ``ABSENT`` (the path does not exist in this version) and ``UNDECIDED`` (the audit cannot
tell; never expected for the catalogued paths). Every row carries file, function, line and the
rule that decided. The values are traced by :mod:`nvfp4study.sglang.clamp_flow`; the kernel form comes
from the hand-kept sink table in the same YAML file, with its sources.

The other checks (:func:`extra_checks`) live in :mod:`nvfp4study.sglang.checks`.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..core.errors import AuditError, NoBailingMoeV3
from . import clamp_values as cv
from .clamp_flow import Interp
from .model_side import MODEL_FILE, ModelSide, model_side, no_model_line
from .source import SGLangTree, installed_tree, open_tree, unpack_wheel


class ClampVerdict(StrEnum):
    EXACT = "EXACT"
    APPROX = "APPROX"
    DROPPED = "DROPPED"
    REFUSED = "REFUSED"
    ABSENT = "ABSENT"
    UNDECIDED = "UNDECIDED"


#: Order used when several kernel calls of one path disagree: the path is as bad as its worst.
_SEVERITY = [ClampVerdict.DROPPED, ClampVerdict.APPROX, ClampVerdict.UNDECIDED,
             ClampVerdict.REFUSED, ClampVerdict.EXACT]


@dataclass
class PathResult:
    """One audited path. ``file`` is relative to ``sglang/srt``; ``line`` is 1-based."""

    path: str
    label: str
    verdict: ClampVerdict
    rule: str
    file: str | None
    function: str | None
    line: int | None
    sglang_version: str
    sink: str | None = None
    live_mentions: list[str] = field(default_factory=list)
    dead_mentions: list[str] = field(default_factory=list)
    flashinfer_check: str | None = None

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["verdict"] = self.verdict.value
        return d


@cache
def catalog() -> dict[str, Any]:
    """The sink table and path catalog (``data/sglang_clamp_paths.yaml``)."""
    text = resources.files(__package__).joinpath("data/sglang_clamp_paths.yaml").read_text()
    return yaml.safe_load(text)


def flashinfer_pin(tree: SGLangTree) -> str | None:
    """The flashinfer-python version the release pins (``Requires-Dist: flashinfer_python...==X``
    in its dist-info ``METADATA``, e.g. ``0.7.2`` for SGLang 0.5.23); None when not recorded."""
    import re

    for meta in sorted(tree.root.glob("sglang-*.dist-info/METADATA")):
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            m = re.match(r"Requires-Dist:\s*flashinfer[-_]python(\[[^\]]*\])?\s*==\s*([\w.]+)\s*$", line)
            if m:
                return m.group(2)
    return None


def _flashinfer_check(tree: SGLangTree, sink_name: str, sink: dict) -> str | None:
    """A note when the sink's facts were read from other FlashInfer releases than the pinned one."""
    if "flashinfer" not in sink:
        return None
    pin = flashinfer_pin(tree)
    if pin in sink["flashinfer"]:
        return None
    return (f"{sink_name}() facts read from flashinfer-python {', '.join(sink['flashinfer'])}; SGLang "
            f"{tree.version} pins {pin or 'no recorded version'} (not re-read)")


def _split(step: str) -> tuple[str, str]:
    rel, qual = step.split("::")
    return "sglang/srt/" + rel, qual


def sink_form_in_code(tree: SGLangTree, verify: dict) -> tuple[str | None, str]:
    """Read an SGLang activation function and say whether it clamps the gate after SiLU.

    Returns ``("post" | "pre" | None, "file:line")``: ``post`` when a ``silu`` call is applied to
    the gate at or before the first gate clamp (``clamp``/``minimum`` with ``max``), ``pre`` when
    the gate is clamped first.
    """
    rel = "sglang/srt/" + verify["file"]
    path = tree.file(rel)
    if not path.is_file():
        return None, f"{verify['file']} missing"
    mod = ast.parse(path.read_text(encoding="utf-8"))
    parts = verify["function"].split(".")
    fn: Any = mod
    for p in parts:
        fn = next((n for n in ast.walk(fn) if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                   and n.name == p), None)
        if fn is None:
            return None, f"{verify['function']} not in {verify['file']}"
    silu_line = clamp_line = None
    for n in ast.walk(fn):
        if isinstance(n, ast.Call):
            name = ast.unparse(n.func)
            if name.endswith("silu") and silu_line is None:
                silu_line = n.lineno
            if (name.endswith("clamp") or name.endswith("minimum")) and any(
                    k.arg == "max" for k in n.keywords) and "gate" in ast.unparse(n):
                clamp_line = n.lineno if clamp_line is None else min(clamp_line, n.lineno)
    where = f"{verify['file']}:{fn.lineno}"
    if silu_line is None or clamp_line is None:
        return None, where
    return ("post" if silu_line <= clamp_line else "pre"), where


def _arg(hit: cv.SinkHit, spec: str) -> tuple[bool, Any, ast.AST | None]:
    """(present, value, keyword node) for one clamp/alpha spec of a sink call."""
    if spec.startswith("#"):
        i = int(spec[1:])
        return (i < len(hit.args)), (hit.args[i] if i < len(hit.args) else None), None
    if "." in spec:
        kw, attr = spec.split(".", 1)
        if kw in hit.kwargs and hit.kwargs[kw] is cv.CONFIG:
            return True, cv.LING_FACTS.get(attr, cv.UNK), None
        return False, None, None
    if spec in hit.kwargs:
        return True, hit.kwargs[spec], hit.kw_nodes.get(spec)
    return False, None, None


def _form_verdict(form: str, hit: cv.SinkHit, sink: dict, tree: SGLangTree) -> tuple[ClampVerdict, str]:
    alpha = None
    for spec in sink.get("alpha", []):
        present, v, _ = _arg(hit, spec)
        if present:
            alpha = v
            break
    if form == "cutlass":
        act = hit.kwargs.get(sink.get("activation", "activation_type"), cv.Act("Swiglu"))
        names = {o.name for o in (act.options if isinstance(act, cv.Multi) else (act,))
                 if isinstance(o, cv.Act)}
        if names == {"SwigluStep"}:
            return ClampVerdict.EXACT, "cutlass: activation_type SwigluStep (post-SiLU)"
        if names and "SwigluStep" not in names:
            return ClampVerdict.APPROX, (f"cutlass: activation_type {'/'.join(sorted(names))} + "
                                         "swiglu_limit -> SwigluBias (pre-SiLU)")
        return ClampVerdict.UNDECIDED, f"cutlass: activation_type undecided ({act!r})"
    if form in ("sglang-triton", "marlin"):
        if alpha is None:
            if form == "marlin":
                return ClampVerdict.APPROX, "fused_marlin_moe: alpha None + limit -> swiglu_limit_func (pre-SiLU)"
            f, where = sink_form_in_code(tree, sink["verify"]) if "verify" in sink else ("post", "")
            if f == "post":
                return ClampVerdict.EXACT, f"triton: alpha None -> post-SiLU clamp ({where})"
            if f == "pre":
                return ClampVerdict.APPROX, f"triton: alpha None, but the code clamps the gate before SiLU ({where})"
            return ClampVerdict.UNDECIDED, f"triton: form not confirmed in code ({where})"
        return ClampVerdict.APPROX, "alpha set -> GPT-OSS form (pre-SiLU)"
    if form == "alpha-only":
        if alpha is None:
            return ClampVerdict.DROPPED, "kernel uses the limit only when gemm1_alpha > 0"
        return ClampVerdict.APPROX, "alpha set -> GPT-OSS form"
    if form == "post":
        if "verify" in sink:
            f, where = sink_form_in_code(tree, sink["verify"])
            if f == "pre":
                return ClampVerdict.APPROX, f"the code clamps the gate before SiLU ({where})"
            if f != "post":
                return ClampVerdict.UNDECIDED, f"sink form not confirmed in code ({where})"
            return ClampVerdict.EXACT, f"post-SiLU clamp ({where})"
        return ClampVerdict.EXACT, "post-SiLU clamp"
    if form == "pre":
        return ClampVerdict.APPROX, "kernel clamps the gate before SiLU (GPT-OSS form)"
    return ClampVerdict.DROPPED, "kernel takes no clamp"


def _origin(node: ast.AST | None, origin: dict) -> tuple | None:
    """Where a payload field passed to a sink was set (``quant_info.f`` -> the ``f=`` keyword)."""
    if isinstance(node, ast.Attribute) and node.attr in origin:
        return origin[node.attr]
    return None


def judge_hit(hit: cv.SinkHit, sink: dict, tree: SGLangTree,
              origin: dict | None = None) -> tuple[ClampVerdict, str, tuple | None]:
    """Verdict for one kernel call: does the limit reach it, and in which form.

    Returns ``(verdict, rule, where)``; ``where`` is ``(file, line, text)`` when the deciding
    line is not the call itself (a payload field set to a literal None upstream).
    """
    v, rule, where = _judge(hit, sink, tree, origin or {})
    return v, rule, where


def _judge(hit, sink, tree, origin):
    specs = sink.get("clamp", [])
    if not specs:
        return ClampVerdict.DROPPED, f"{hit.callee}() takes no clamp argument", None
    value, node, present_any = None, None, False
    for spec in specs:
        present, v, n = _arg(hit, spec)
        if present:
            present_any = True
            if cv.has_limit(v) or value is None:
                value, node = v, n
    if cv.has_limit(value):
        if isinstance(value, cv.Multi) and not all(cv.has_limit(o) for o in value.options):
            return ClampVerdict.UNDECIDED, f"{hit.callee}(): limit reaches it on some branches only", None
        v, rule = _form_verdict(sink["form"], hit, sink, tree)
        return v, f"{hit.callee}(): {rule}", None
    carriers = [k for k, v in hit.kwargs.items() if cv.has_limit(v) and k not in specs]
    if carriers:
        why = "; ".join(sink.get("siblings", {}).get(k, f"{k} carries it") for k in carriers)
        literal = isinstance(node, ast.Constant) and node.value is None
        return ClampVerdict.DROPPED, (f"{hit.callee}(): clamp argument {'literal None' if literal else 'None'} "
                                      f"but the limit is passed as {', '.join(carriers)} ({why})"), None
    if not present_any:
        return ClampVerdict.DROPPED, f"{hit.callee}(): no clamp argument ({'/'.join(specs)})", None
    if isinstance(node, ast.Constant) and node.value is None:
        return ClampVerdict.DROPPED, f"{hit.callee}(): literal {specs[0]}=None", None
    if value is None:
        src = ast.unparse(node) if node is not None else specs[0]
        org = next((hit.origins[sp] for sp in specs if sp in hit.origins), None) or _origin(node, origin)
        if org and org[2].startswith("literal"):
            return ClampVerdict.DROPPED, (f"{org[2]} at {org[0][11:]}:{org[1]}, passed on as {src} "
                                          f"to {hit.callee}()"), org
        return ClampVerdict.DROPPED, f"{hit.callee}(): clamp argument is None for Ling ({src[:140]})", None
    return ClampVerdict.UNDECIDED, f"{hit.callee}(): clamp argument undecided ({value!r})", None


def registered_fused_funcs(mod: ast.Module) -> dict[tuple[str, ...], str]:
    """``{(a2a backend, runner backend): function name}`` for the ``@register_fused_func(...)``
    decorators of one module (SGLang's runner registry, ``layers/moe/moe_runner/base.py``)."""
    out = {}
    for n in mod.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in n.decorator_list:
                if isinstance(d, ast.Call) and ast.unparse(d.func).endswith("register_fused_func") \
                        and all(isinstance(a, ast.Constant) for a in d.args):
                    out[tuple(a.value for a in d.args)] = n.name
    return out


def resolve_step(interp: Interp, rel: str, qual: str) -> str:
    """The function a step names: a qualname, or ``@fused_func(a2a,runner)``, the function the
    runner registry dispatches to for that backend pair (found by its decorator, whatever its
    name). An unresolvable registration is returned as written (then reported missing)."""
    if not qual.startswith("@fused_func("):
        return qual
    key = tuple(x.strip() for x in qual[len("@fused_func("):-1].split(","))
    mod = interp.module(rel)
    if mod is None:
        return qual
    return registered_fused_funcs(mod.tree).get(key, qual)


def audit_path(tree: SGLangTree, spec: dict) -> PathResult:
    """Audit one catalogued path in ``tree`` (see the module docstring for the verdicts)."""
    sinks = catalog()["sinks"]
    steps = [_split(s) for s in spec["steps"]]
    base = {"path": spec["id"], "label": spec["label"], "sglang_version": tree.version}
    interp = Interp(tree.root, set(sinks), spec.get("assume"))
    steps = [(r, resolve_step(interp, r, q)) for r, q in steps]
    interp.entry_names = {q.split(".")[-1] for _, q in steps}
    missing = [(r, q) for r, q in steps if interp.find(r, q) is None]
    if missing:
        r0, q0 = steps[0]
        mod = interp.module(r0)
        entry_exists = mod is not None and ("." not in q0 or q0.split(".")[0] in mod.classes)
        r, q = missing[0]
        if not entry_exists:
            return PathResult(**base, verdict=ClampVerdict.ABSENT, rule=f"not in this version: {r}::{q}",
                              file=None, function=None, line=None)
        # The entry code exists: the trail is lost, not the path (a function renamed or inlined).
        have = "the file exists" if interp.module(r) is not None else "the file is missing"
        return PathResult(**base, verdict=ClampVerdict.UNDECIDED,
                          rule=f"trail lost at {r[11:]}::{q} ({have}; the path's entry {r0[11:]}::{q0} exists)",
                          file=r[11:] if interp.module(r) is not None else r0[11:], function=q, line=None)
    for r, q in steps:
        interp.run_step(r, q)
    mentions = []
    for r, q in steps:
        mentions += [(r, ln) for ln in cv.clamp_mentions(interp.find(r, q))]
    live = sorted({f"{r[11:]}:{ln}" for r, ln in mentions if (r, ln) in interp.live})
    dead = sorted({f"{r[11:]}:{ln}" for r, ln in mentions if (r, ln) not in interp.live})
    extra = {"live_mentions": live, "dead_mentions": dead}
    refusals = [x for x in interp.refusals if x.mentions_clamp and x.certain]
    if refusals:
        x = refusals[0]
        return PathResult(**base, verdict=ClampVerdict.REFUSED, rule=f"raises when the limit is set: {x.text}",
                          file=x.file[11:], function=x.function, line=x.line, **extra)
    if "returns_clamp" in spec:
        r, q = steps[-1]
        fn = interp.find(r, q)
        frame = cv.Frame(interp.module(r), None, q)
        interp._bind(fn, frame, [], {}, method_call=False)
        interp.exec_body(fn.body, frame)
        vals = [v.items.get(spec["returns_clamp"]) for v in frame.returns if isinstance(v, cv.DictV)]
        key = spec["returns_clamp"]
        if vals and all(v is None for v in vals):
            return PathResult(**base, verdict=ClampVerdict.DROPPED,
                              rule=f"returns {key}=None for Ling (reads swiglu_limit, not gemm1_clamp_limit)",
                              file=r[11:], function=q, line=fn.lineno, **extra)
        if vals and all(cv.has_limit(v) for v in vals):
            v = ClampVerdict.EXACT if spec.get("form") == "post" else ClampVerdict.APPROX
            return PathResult(**base, verdict=v, rule=f"returns {key}=limit ({spec.get('form')} form)",
                              file=r[11:], function=q, line=fn.lineno, **extra)
    only = set(spec.get("sinks", sinks))
    judged = [(judge_hit(h, sinks[h.callee], tree, interp.origin), h) for h in interp.hits
              if h.callee in only]
    if judged:
        (verdict, rule, where), hit = min(judged, key=lambda j: _SEVERITY.index(j[0][0]))
        kinds = sorted({(j[0].value, h.callee) for j, h in judged})
        if len({k[0] for k in kinds}) > 1:
            rule += " | mixed: " + ", ".join(f"{c}() {v}" for v, c in kinds)
        blockers = [x for x in interp.refusals if not x.mentions_clamp and x.certain
                    and x.text.startswith("assert")]
        if blockers:
            rule += f" | note: {blockers[0].text} fails for Ling ({blockers[0].file[11:]}:{blockers[0].line})"
        if dead and verdict == ClampVerdict.DROPPED:
            rule += f" | gemm1_clamp_limit mentioned only where dead for Ling: {', '.join(dead[:3])}"
        file, line, func = hit.file[11:], hit.line, hit.function
        if where is not None:
            file, line, func = where[0][11:], where[1], _function_at(tree, where[0], where[1])
        # only a verdict that rests on the kernel's form depends on the FlashInfer release
        fcheck = _flashinfer_check(tree, hit.callee, sinks[hit.callee]) if verdict in (
            ClampVerdict.EXACT, ClampVerdict.APPROX, ClampVerdict.UNDECIDED) else None
        if fcheck:
            rule += f" | check: {fcheck}"
        return PathResult(**base, verdict=verdict, rule=rule, file=file, function=func,
                          line=line, sink=hit.callee, flashinfer_check=fcheck, **extra)
    r, q = steps[-1]
    fn = interp.find(r, q)
    if not live:
        why = "mentioned only in branches dead for Ling" if dead else "never reads gemm1_clamp_limit"
        return PathResult(**base, verdict=ClampVerdict.DROPPED, rule=f"no kernel receives it: {why}",
                          file=r[11:], function=q, line=fn.lineno, **extra)
    return PathResult(**base, verdict=ClampVerdict.UNDECIDED, rule="limit read but no known sink reached",
                      file=r[11:], function=q, line=fn.lineno, **extra)


def _function_at(tree: SGLangTree, rel: str, line: int) -> str | None:
    """Qualified name of the innermost function holding ``line`` in ``rel``."""
    mod = cv._parse(tree.file(rel))
    best = None

    def visit(node, qual):
        nonlocal best
        for c in ast.iter_child_nodes(node):
            if isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                q = qual + [c.name]
                if c.lineno <= line <= (c.end_lineno or c.lineno) and not isinstance(c, ast.ClassDef):
                    best = ".".join(q)
                visit(c, q)

    visit(mod, [])
    return best


def audit_tree(tree: SGLangTree, path_ids: list[str] | None = None) -> list[PathResult]:
    """Audit every catalogued path (or ``path_ids``) of one tree, the model side first.

    When BailingMoeV3 does not hand the routed-expert limit to its MoE layer
    (:func:`nvfp4study.sglang.model_side.model_side`), every path is DROPPED with that reason
    and the model file's line, whatever the path alone would give (kept in the rule).

    Raises:
        NoBailingMoeV3: the tree has no ``models/bailing_moe_v3.py``.
        AuditError: a file the catalogue names does not parse.
    """
    try:
        side = model_side(tree)
    except SyntaxError as exc:
        raise AuditError(f"{tree.root}: cannot parse {exc.filename}: {exc.msg}") from exc
    if not side.present:
        raise NoBailingMoeV3(no_model_line(tree.version))
    out = []
    for spec in catalog()["paths"]:
        if path_ids and spec["id"] not in path_ids:
            continue
        try:
            out.append(audit_path(tree, spec))
        except SyntaxError as exc:
            raise AuditError(f"{tree.root}: cannot parse {exc.filename}: {exc.msg}") from exc
    if not side.ok:
        out = [_model_dropped(r, side) for r in out]
    return out


def _model_dropped(r: PathResult, side: ModelSide) -> PathResult:
    h = side.routed
    return PathResult(path=r.path, label=r.label, verdict=ClampVerdict.DROPPED,
                      rule=(f"BailingMoeV3 does not hand the limit to the MoE layer: {h.reason} "
                            f"(the path alone: {r.verdict.value})"),
                      file=MODEL_FILE, function=h.function, line=h.line, sglang_version=r.sglang_version,
                      sink=r.sink)


def results_frame(results: list[PathResult]):
    """A pandas DataFrame: one row per (version, path)."""
    import pandas as pd

    rows = [{"sglang": r.sglang_version, "path": r.path, "verdict": r.verdict.value,
             "where": f"{r.file}:{r.line}" if r.file else "", "function": r.function or "",
             "rule": r.rule} for r in results]
    return pd.DataFrame(rows)


def matrix_figure(results: list[PathResult], out: str | Path) -> Path:
    """A version x path heatmap of verdicts (seaborn), written to ``out`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    order = [ClampVerdict.EXACT, ClampVerdict.APPROX, ClampVerdict.DROPPED, ClampVerdict.REFUSED,
             ClampVerdict.UNDECIDED, ClampVerdict.ABSENT]
    colors = ["#1a9850", "#fdae61", "#d73027", "#7b3294", "#999999", "#f0f0f0"]
    df = results_frame(results)
    paths = list(dict.fromkeys(df["path"]))
    versions = sorted(set(df["sglang"]), key=lambda v: [int(x) if x.isdigit() else x for x in v.split(".")])
    codes = df.assign(code=df["verdict"].map({v.value: i for i, v in enumerate(order)}))
    mat = codes.pivot(index="path", columns="sglang", values="code").reindex(index=paths, columns=versions)
    lab = df.pivot(index="path", columns="sglang", values="verdict").reindex(index=paths, columns=versions)
    fig, ax = plt.subplots(figsize=(2.0 + 1.3 * len(versions), 0.38 * len(paths) + 1.5))
    cmap = matplotlib.colors.ListedColormap(colors)
    sns.heatmap(mat, annot=lab, fmt="", cmap=cmap, vmin=-0.5, vmax=len(order) - 0.5, cbar=False,
                linewidths=0.5, linecolor="white", ax=ax, annot_kws={"fontsize": 7})
    ax.set_title("Ling's routed-expert clamp per SGLang path (limit set, alpha None)", fontsize=9)
    ax.set_xlabel("SGLang release")
    ax.set_ylabel("")
    handles = [matplotlib.patches.Patch(color=c, label=v.value) for v, c in zip(order, colors, strict=True)]
    ax.legend(handles=handles, bbox_to_anchor=(1.01, 1), loc="upper left", fontsize=7, frameon=False)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    """``nvfp4study audit-sglang PATH | --installed [--python EXE] | --version X [--json]``."""
    ap = argparse.ArgumentParser(
        prog="nvfp4study audit-sglang",
        description="Audit where SGLang sends Ling's SwiGLU clamp (gemm1_clamp_limit set, no alpha).",
        epilog="example: nvfp4study audit-sglang --version 0.5.23 --json",
    )
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("path", nargs="?", help="an SGLang tree (folder holding sglang/, or a checkout)")
    src.add_argument("--installed", action="store_true", help="the SGLang installed for --python")
    src.add_argument("--version", help="a released version, read from its wheel (downloaded if needed)")
    ap.add_argument("--python", help="interpreter whose installed SGLang to audit (with --installed)")
    ap.add_argument("--json", action="store_true", help="one JSON object per path on stdout")
    ap.add_argument("--checks", action="store_true", help="also print the other checks (JSON)")
    a = ap.parse_args(argv)
    if a.installed:
        tree = installed_tree(a.python)
    elif a.version:
        tree = unpack_wheel(a.version)
    else:
        tree = open_tree(a.path)
    try:
        results = audit_tree(tree)
    except NoBailingMoeV3 as exc:
        print(exc)
        return 0
    if a.json:
        for r in results:
            d = r.as_json()
            print(json.dumps({k: d[k] for k in ("path", "file", "function", "line", "verdict", "rule",
                                                "sglang_version")}))
    else:
        df = results_frame(results)
        print(f"SGLang {tree.version} ({tree.origin}: {tree.root})")
        print(df.drop(columns=["sglang"]).to_string(index=False, max_colwidth=90))
    if a.checks:
        from .checks import extra_checks

        print(json.dumps({**extra_checks(tree), "model_side": model_side(tree).as_json()},
                         indent=1, default=str))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
