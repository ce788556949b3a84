"""The served corruption study shown: the before/after figure and the notebook's display helpers.

"Before" is ``corruption.before_mode`` (``none``: the clamp removed, the card's unpatched
state), "after" is ``corruption.after_mode`` (``exact``: the post-SiLU clamp); ``stock``
(SGLang 0.5.23's pre-SiLU clamp, the form the card's own patch gives) is shown when served.
Each helper takes the result dict of :func:`nvfp4study.stages.s05_corruption.run_served_study`
and returns something a notebook cell displays; a study that did not run says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from ..core.params import Params


def mode_label(mode: str, params: Params) -> str:
    """``mode`` with its role, e.g. ``none (before)``, ``exact (after)``; other modes bare."""
    c = params.corruption
    role = {c.before_mode: "before", c.after_mode: "after"}.get(mode)
    return f"{mode} ({role})" if role else mode


def plot(summary: pd.DataFrame, params: Params, path: Path) -> Path:
    """Bars of clean fraction per sampling config and clamp mode (before, stock, after order),
    with 95 % Wilson intervals and k/n on each bar; one panel for the card's claim sets, one for
    all tasks. Writes ``path`` (PNG) and returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = params.corruption
    modes = [m for m in dict.fromkeys([c.before_mode, "none", "stock", c.after_mode, "exact"])
             if m in set(summary.clamp)]
    samplings = list(dict.fromkeys(summary.sampling))
    panels = [(ts, title) for ts, title in (("claim", "card's task sets (n per claim)"),
                                             ("all", "all tasks")) if ts in set(summary.task_set)]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.2), squeeze=False)
    width = 0.8 / max(1, len(modes))
    for ax, (ts, title) in zip(axes[0], panels, strict=True):
        part = summary[summary.task_set == ts]
        for j, mode in enumerate(modes):
            xs, ys, lo, hi, labels, tops = [], [], [], [], [], []
            for i, s in enumerate(samplings):
                r = part[(part.clamp == mode) & (part.sampling == s)]
                if r.empty or not r.iloc[0].n:
                    continue
                r = r.iloc[0]
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(r.clean_frac)
                lo.append(r.clean_frac - r.ci_low)
                hi.append(r.ci_high - r.clean_frac)
                labels.append(f"{int(r.clean)}/{int(r.n)}")
                tops.append(r.ci_high)
            ax.bar(xs, ys, width * 0.92, yerr=[lo, hi], capsize=3, ecolor="0.25",
                   label=mode_label(mode, params))
            for x, top, text in zip(xs, tops, labels, strict=True):
                ax.annotate(text, (x, top + 0.02), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(samplings)), samplings)
        ax.set_ylim(0, 1.3)
        ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
        ax.set_ylabel("clean completions (fraction, 95 % Wilson CI)")
        ax.set_title(title)
        ax.legend(fontsize=8, loc="upper center", ncol=max(1, len(modes)), frameon=False)
    fig.suptitle("Corruption by clamp mode (measured in this run)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --- notebook helpers (each returns something to display) ---------------------------------------
def describe(result: dict[str, Any]):
    """A Markdown paragraph saying what ran and what it found (no card numbers)."""
    from ..core.display import markdown

    if result["status"] == "not run":
        return markdown(f"**Not run:** {result['reason']}. Recorded for: "
                        f"{', '.join(result['claims'])}. Re-analyse a recorded run with "
                        "`-p replay_from=<run dir>`.")
    s = result["summary"]
    params = result["params"]
    claim = s[s.task_set == "claim"]
    parts = [f"{r.clamp}/{r.sampling}: {r.clean}/{r.n} clean"
             + (f" ({r.cut} more cut at max_tokens while thinking, not judged)" if getattr(r, "cut", 0) else "")
             for r in claim.itertuples()]
    how = "replayed from the recorded run" if result["status"] == "replay" else "served live"
    return markdown(f"**{how.capitalize()}** ({len(result['classified'])} completions; "
                    f"before = `{params.corruption.before_mode}`, after = "
                    f"`{params.corruption.after_mode}`). On the card's task sets: "
                    + "; ".join(parts) + ".")


def summary_table(result: dict[str, Any]):
    """The summary DataFrame (or a Markdown "not run")."""
    from ..core.display import markdown

    if result["status"] == "not run":
        return markdown("_No served data in this run._")
    return result["summary"]


def figure(result: dict[str, Any]):
    """The bar figure as an Image (or a Markdown "not run")."""
    from IPython.display import Image

    from ..core.display import markdown

    if result["status"] == "not run":
        return markdown("_No figure: the served study did not run._")
    return Image(str(result["files"]["figure"]))


def junk_table(result: dict[str, Any]):
    """The most frequent junk fragments (or a Markdown "not run")."""
    from ..core.display import markdown

    if result["status"] == "not run":
        return markdown("_No junk fragments: the served study did not run._")
    if result["junk"].empty:
        return markdown("_No junk fragment was found in any completion._")
    return result["junk"]
