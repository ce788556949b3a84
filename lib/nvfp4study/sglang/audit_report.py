"""The clamp audit's reports: its table, the version x path figure, ``nvfp4study audit-sglang``.

The audit itself is :mod:`nvfp4study.sglang.audit` (:func:`~nvfp4study.sglang.audit.audit_tree`,
one :class:`~nvfp4study.sglang.audit.PathResult` per catalogued path).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..core.errors import NoBailingMoeV3
from . import moe_params
from .audit import PathResult, audit_tree
from .audit_sinks import ClampVerdict
from .model_side import model_side
from .source import installed_tree, open_tree, unpack_wheel


def results_frame(results: list[PathResult]):
    """A pandas DataFrame: one row per (version, path)."""
    import pandas as pd

    rows = [{"sglang": r.sglang_version, "path": r.path, "verdict": r.verdict.value,
             "where": f"{r.file}:{r.line}" if r.file and r.line else r.file or "", "function": r.function or "",
             "rule": r.rule} for r in results]
    return pd.DataFrame(rows, columns=["sglang", "path", "verdict", "where", "function", "rule"])


def text_rows(df, width: int = 100) -> str:
    """One block per row for a terminal: ``path  VERDICT  where  function``, then the whole rule
    wrapped and indented (nothing cut off, so a lost trail's place is always shown)."""
    import textwrap

    out = []
    for r in df.itertuples(index=False):
        out.append(f"{r.path}  {r.verdict}  {r.where}  {r.function}".rstrip())
        out += textwrap.wrap(r.rule, width=width, initial_indent="    ", subsequent_indent="    ",
                             break_long_words=False, break_on_hyphens=False)
    return "\n".join(out)


def catalogued(results: list[PathResult]) -> list[PathResult]:
    """The rows of the paths the catalogue names (the hand-read ones)."""
    return [r for r in results if r.catalogued]


def dispatch_summary(results: list[PathResult]):
    """The paths found by following the dispatch that the catalogue does not name: one row per
    (release, verdict) with the count and the paths (pandas DataFrame)."""
    import pandas as pd

    rows: dict[tuple[str, str], list[str]] = {}
    for r in results:
        if not r.catalogued:
            rows.setdefault((r.sglang_version, r.verdict.value), []).append(r.path)
    return pd.DataFrame([{"sglang": v, "verdict": k, "paths": len(p), "which": ", ".join(sorted(p))}
                         for (v, k), p in rows.items()], columns=["sglang", "verdict", "paths", "which"])


def matrix_figure(results: list[PathResult], out: str | Path) -> Path:
    """A version x path heatmap of the catalogued paths' verdicts (seaborn), written to ``out`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    order = [ClampVerdict.EXACT, ClampVerdict.APPROX, ClampVerdict.DROPPED, ClampVerdict.REFUSED,
             ClampVerdict.UNUSABLE, ClampVerdict.UNDECIDED, ClampVerdict.ABSENT]
    colors = ["#1a9850", "#fdae61", "#d73027", "#7b3294", "#5e3c99", "#999999", "#f0f0f0"]
    df = results_frame(catalogued(results))
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
    """``nvfp4study audit-sglang PATH | --installed [--python EXE] | --version X [--json]``, or
    ``--matrix [--version X]`` (:mod:`nvfp4study.sglang.backend_matrix`; the newest release
    carrying BailingMoeV3 by default)."""
    ap = argparse.ArgumentParser(
        prog="nvfp4study audit-sglang",
        description="Audit where SGLang sends Ling's SwiGLU clamp (gemm1_clamp_limit set, no alpha).",
        epilog="examples: nvfp4study audit-sglang --version 0.5.23 --json; nvfp4study audit-sglang --matrix",
    )
    src = ap.add_mutually_exclusive_group()
    src.add_argument("path", nargs="?", help="an SGLang tree (folder holding sglang/, or a checkout)")
    src.add_argument("--installed", action="store_true", help="the SGLang installed for --python")
    src.add_argument("--version", help="a released version, read from its wheel (downloaded if needed)")
    ap.add_argument("--python", help="interpreter whose installed SGLang to audit (with --installed)")
    ap.add_argument("--json", action="store_true", help="one JSON object per path on stdout")
    ap.add_argument("--checks", action="store_true", help="also print the other checks (JSON)")
    ap.add_argument("--all", action="store_true",
                    help="list every path found by following the dispatch, not only the catalogued ones")
    ap.add_argument("--param", default=None, metavar="NAME",
                    help="the MoE parameter to follow (data/moe_params.yaml): gemm1_clamp_limit (the default, "
                         "today's rows), routed_scaling_factor, norm_topk_prob, correction_bias, grouped_topk")
    ap.add_argument("--matrix", action="store_true",
                    help="format x device matrix: the --moe-runner-backend values reaching a MoE path, "
                         "what auto picks, each verdict (--json: the matrix as JSON)")
    a = ap.parse_args(argv)
    if a.matrix:
        return _matrix_main(a)
    if not (a.path or a.installed or a.version is not None):
        ap.error("one of the arguments path --installed --version is required")
    if a.installed:
        tree = installed_tree(a.python)
    elif a.version is not None:  # --version "" is a bad release number, not "no version"
        tree = unpack_wheel(a.version)
    else:
        tree = open_tree(a.path)
    if a.param is not None and a.param != moe_params.names()[0]:
        return _param_main(a, tree)
    try:
        results = audit_tree(tree)
    except NoBailingMoeV3 as exc:
        print(exc)
        return 0
    if a.json:
        for r in results:
            d = r.as_json()
            print(json.dumps({k: d[k] for k in ("path", "file", "function", "line", "verdict", "rule",
                                                "sglang_version", "catalogued", "found_by")}))
    else:
        print(f"SGLang {tree.version} ({tree.origin}: {tree.root})")
        shown = results if a.all else catalogued(results)
        print(text_rows(results_frame(shown)))
        if not a.all:
            rest = dispatch_summary(results)
            if len(rest):
                print(f"\n{int(rest['paths'].sum())} more paths found by following the dispatch "
                      "(not catalogued; --all lists them):")
                print(rest.drop(columns=["sglang", "which"]).to_string(index=False))
    if a.checks:
        from .checks import extra_checks

        print(json.dumps({**extra_checks(tree), "model_side": model_side(tree).as_json()},
                         indent=1, default=str))
    return 0


def _param_main(a: argparse.Namespace, tree: Any) -> int:
    """``--param NAME`` for a parameter other than the clamp (:mod:`nvfp4study.sglang.param_audit`):
    one JSON object per path (``--json``) or a table; the catalogued paths unless ``--all``.

    Raises:
        AuditError: ``NAME`` is no parameter of ``data/moe_params.yaml``.
    """
    from .param_audit import audit_param

    moe_params.param(a.param)  # a bad name is a named error before any work
    try:
        rows = audit_param(tree, a.param)
    except NoBailingMoeV3 as exc:
        print(exc)
        return 0
    shown = rows if a.all or a.json else [r for r in rows if r.catalogued]
    if a.json:
        for r in shown:
            d = r.as_json()
            print(json.dumps({k: d[k] for k in ("path", "param", "file", "line", "verdict", "rule", "evidence",
                                                "parts", "sglang_version", "catalogued")}))
        return 0
    print(f"SGLang {tree.version} ({tree.origin}: {tree.root}): {a.param}")
    width = max((len(r.path) for r in shown), default=4)
    for r in shown:
        where = f"{r.file}:{r.line}" if r.file else "-"
        print(f"{r.path:<{width}}  {r.verdict.value:<9}  {where}  {r.rule[:160]}")
    return 0


def _matrix_main(a: argparse.Namespace) -> int:
    """``--matrix``: the release's matrix (a released wheel by ``--version``, else a ``path``
    tree, else the newest BailingMoeV3 release).

    Raises:
        SGLangSourceError: ``--version`` names no release carrying BailingMoeV3.
    """
    from ..core.errors import SGLangSourceError
    from .backend_matrix import build_matrix, text_report
    from .releases import bailing_releases

    known = list(bailing_releases())
    if a.installed:
        tree = installed_tree(a.python)
    elif a.path:
        tree = open_tree(a.path)
    else:
        version = a.version if a.version is not None else known[-1]
        if version not in known:
            raise SGLangSourceError(f"no SGLang release {version!r} with BailingMoeV3 to build the matrix of; "
                                    f"releases: {', '.join(known)}")
        tree = unpack_wheel(version)
    try:
        results = audit_tree(tree)
    except NoBailingMoeV3 as exc:
        print(exc)
        return 0
    matrix = build_matrix(tree, results)
    print(json.dumps(matrix, indent=1) if a.json else text_report(matrix), end="" if not a.json else "\n")
    return 0


__all__ = ["catalogued", "dispatch_summary", "main", "matrix_figure", "results_frame", "text_rows"]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
