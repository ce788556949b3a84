"""Detector validation, part 2: each method's recall and precision per junk kind, as tables and a figure.

**Estimators.** Per method and junk kind: recall = flagged variants / variants of that kind;
precision = flagged variants / (flagged variants + flagged clean samples), over that kind's
variants plus all clean samples (so it depends on the 1:``per_kind`` mix; the false-positive
rate on clean samples is given beside it). 95 % intervals are Wilson score intervals
(Wilson 1927, JASA 22:209). ``all`` pools every kind. The input is the frame of
:func:`nvfp4study.codeeval.detector_samples.classify`.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ..core.files import atomic_write
from .detector_samples import CLEAN, METHOD_LABELS, METHODS
from .junk import JunkKind
from .served_analysis import wilson_interval


# --- statistics ------------------------------------------------------------------------------
def summarize(frame: pd.DataFrame) -> pd.DataFrame:
    """Precision and recall per method and junk kind.

    Returns:
        Rows with ``method``, ``kind`` (each junk kind, then ``all``), ``n_junk``, ``tp``,
        ``fn``, ``n_clean``, ``fp``, ``recall``, ``recall_lo``, ``recall_hi``, ``precision``,
        ``precision_lo``, ``precision_hi``, ``fp_rate_clean``. A method with no values
        (execution not run) is left out.
    """
    clean = frame[frame["kind"] == CLEAN]
    junk_rows = frame[frame["kind"] != CLEAN]
    kinds = [str(k) for k in JunkKind if (junk_rows["kind"] == str(k)).any()]
    out = []
    for m in METHODS:
        if m not in frame or frame[m].isna().all():
            continue
        fp = int(clean[m].fillna(False).astype(bool).sum())
        nc = len(clean)
        for kind in [*kinds, "all"]:
            part = junk_rows if kind == "all" else junk_rows[junk_rows["kind"] == kind]
            n = len(part)
            tp = int(part[m].fillna(False).astype(bool).sum())
            rlo, rhi = wilson_interval(tp, n)
            plo, phi = wilson_interval(tp, tp + fp)
            out.append({"method": m, "kind": kind, "n_junk": n, "tp": tp, "fn": n - tp,
                        "n_clean": nc, "fp": fp, "recall": tp / n if n else float("nan"),
                        "recall_lo": rlo, "recall_hi": rhi,
                        "precision": tp / (tp + fp) if tp + fp else float("nan"),
                        "precision_lo": plo, "precision_hi": phi,
                        "fp_rate_clean": fp / nc if nc else float("nan")})
    return pd.DataFrame(out)


def table(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary as a display table: one row per junk kind, ``recall (precision)`` per method."""
    if summary.empty:
        return pd.DataFrame()

    def cell(r: pd.Series) -> str:
        prec = "–" if math.isnan(r["precision"]) else f"{r['precision']:.2f}"
        return f"{r['tp']}/{r['n_junk']} = {r['recall']:.2f} (p {prec})"

    t = summary.assign(cell=summary.apply(cell, axis=1))
    wide = t.pivot(index="kind", columns="method", values="cell")
    order = [k for k in [*[str(k) for k in JunkKind], "all"] if k in wide.index]
    cols = [m for m in METHODS if m in wide.columns]
    wide = wide.loc[order, cols].rename(columns=METHOD_LABELS)
    fp = summary.groupby("method")[["fp", "n_clean"]].first()
    wide.loc["false positives on clean"] = [f"{fp.loc[m, 'fp']}/{fp.loc[m, 'n_clean']}" for m in cols]
    wide.columns.name = "recall (precision) by method"
    return wide


def examples(frame: pd.DataFrame) -> pd.DataFrame:
    """One variant per kind (the j-th variant of the j-th kind, so the examples come from
    different tasks): line before/after and each method's verdict."""
    if frame.empty:
        return pd.DataFrame()
    junky = frame[frame["kind"] != CLEAN]
    picks = [part.iloc[min(j, len(part) - 1)]
             for j, (_, part) in enumerate(junky.groupby("kind", sort=False))]
    rows = pd.DataFrame(picks)
    cols = ["kind", "task_id", "site", "original_line", "injected_line", "detector_label",
            *[m for m in METHODS if m in rows and not rows[m].isna().all()], "exec_outcome"]
    return rows[[c for c in cols if c in rows]].reset_index(drop=True)


def misses(frame: pd.DataFrame, method: str = "detector") -> pd.DataFrame:
    """Junk variants ``method`` did not flag, counted by kind and site (the role of the token hit)."""
    if frame.empty:
        return pd.DataFrame(columns=["kind", "site", "missed"])
    part = frame[(frame["kind"] != CLEAN) & ~frame[method].fillna(False).astype(bool)]
    return part.groupby(["kind", "site"]).size().rename("missed").reset_index()


# --- figure ----------------------------------------------------------------------------------
def plot(summary: pd.DataFrame, path: Path) -> Path:
    """Grouped bars: recall per junk kind and method, Wilson 95 % intervals; the legend gives
    each method's false positives on the clean programs. Written atomically as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in [*[str(k) for k in JunkKind], "all"] if k in set(summary["kind"])]
    methods = [m for m in METHODS if m in set(summary["method"])]
    fig, ax = plt.subplots(figsize=(11, 4.6))
    width = 0.8 / max(len(methods), 1)
    colors = ["#1b9e77", "#d95f02", "#e6ab02", "#7570b3", "#66a61e"]
    for i, m in enumerate(methods):
        s = summary[summary["method"] == m].set_index("kind").reindex(kinds)
        x = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(kinds))]
        err = [(s["recall"] - s["recall_lo"]).clip(lower=0), (s["recall_hi"] - s["recall"]).clip(lower=0)]
        fp, nc = int(s["fp"].iloc[0]), int(s["n_clean"].iloc[0])
        ax.bar(x, s["recall"], width, yerr=err, capsize=2, color=colors[i % len(colors)],
               label=f"{METHOD_LABELS[m]} (false pos. {fp}/{nc} clean)")
    ax.set_xticks(range(len(kinds)), [k.replace("_", "\n") for k in kinds])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("recall (junk variants flagged)")
    n = summary[summary["kind"] == "all"]["n_junk"].iloc[0] if "all" in kinds else 0
    ax.set_title(f"Junk detection on canonical solutions: {n} junk variants, 95% Wilson intervals")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, frameon=False)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return path
