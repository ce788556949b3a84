"""Build the report's pieces from a run folder's files (``99_report`` computes nothing new).

The ledger table puts the card's value and ours in separate, labelled columns; a card value is
never shown in the "measured" column.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import pandas as pd

from ..core import ledger
from ..core.stage import Stage, open_stage_named

NOTEBOOK = "99_report"


def open_stage(params_file: str = "", run_dir: str = "") -> Stage:
    """:func:`nvfp4study.core.stage.open_stage_named` for notebook ``99_report``."""
    return open_stage_named(NOTEBOOK, params_file, run_dir)

VERDICT_COLOURS = {
    "reproduced": "#c8e6c9",
    "partly": "#fff3c4",
    "contradicted": "#ffcdd2",
    "not run": "#e0e0e0",
}


MAX_CELL_CHARS = 400  # longer values are clipped in the table; ledger.json keeps them whole


def _compact(value: Any, limit: int | None = None) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, default=str, separators=(", ", ": "))
    if limit and len(text) > limit:
        text = text[:limit].rstrip() + " … (whole value in ledger.json)"
    return text


def ledger_frame(run_dir: str | Path) -> pd.DataFrame:
    """The run's ledger as a DataFrame: id, stage, origin, claim, card, measured, verdict, note, evidence.

    ``card`` is the card's value (empty for the study's own findings); ``measured`` is ours.
    """
    rows = ledger.read_ledger(run_dir)
    return pd.DataFrame(
        [{
            "id": r["id"],
            "stage": r["stage"],
            "origin": r.get("origin", "card"),
            "claim": r["claim"],
            "card says": _compact(r.get("card")),
            "we measured": _compact(r.get("measured"), MAX_CELL_CHARS),
            "verdict": r["verdict"],
            "checked on": r.get("checked_on") or "",
            "note": r.get("note", ""),
            "evidence": ", ".join(r.get("evidence") or []),
        } for r in rows]
    )


def verdict_counts(run_dir: str | Path) -> pd.DataFrame:
    """Number of rows per verdict, split by origin (card claim / study finding)."""
    df = ledger_frame(run_dir)
    counts = df.groupby(["origin", "verdict"]).size().unstack(fill_value=0)
    return counts.reindex(columns=[v for v in VERDICT_COLOURS if v in counts.columns])


def styled_ledger(df: pd.DataFrame):
    """A pandas Styler colouring each row by its verdict (for HTML display)."""
    def _row(row: pd.Series) -> list[str]:
        colour = VERDICT_COLOURS.get(row["verdict"], "white")
        return [f"background-color: {colour}"] * len(row)

    widths = {"id": "9%", "stage": "7%", "origin": "4%", "claim": "18%", "card says": "14%",
              "we measured": "20%", "verdict": "6%", "checked on": "5%", "note": "12%",
              "evidence": "5%"}
    styles = [{"selector": "", "props": [("table-layout", "fixed"), ("width", "100%")]},
              {"selector": "td, th", "props": [("overflow-wrap", "anywhere"), ("text-align", "left"),
                                               ("vertical-align", "top"), ("font-size", "0.8em")]}]
    styles += [{"selector": f"th.col{i}", "props": [("width", widths.get(c, "auto"))]}
               for i, c in enumerate(df.columns)]
    return df.style.apply(_row, axis=1).hide(axis="index").set_table_styles(styles)


def notebook_links(run_dir: str | Path) -> str:
    """HTML list linking each executed notebook's code-free HTML copy (relative links)."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    items = []
    for nb in manifest.get("notebooks", []):
        name = nb["notebook"]
        status = nb.get("status", "?")
        secs = nb.get("seconds")
        link = f"html/{name}.html"
        items.append(f'<li><a href="{html.escape(link)}">{html.escape(name)}</a> '
                     f"({status}, {secs} s; executed notebook: "
                     f'<a href="{html.escape(name)}.ipynb">{html.escape(name)}.ipynb</a>)</li>')
    if not items:
        return "<p>No notebook has run yet in this folder.</p>"
    return "<ul>" + "".join(items) + "</ul>"


def read_manifest(run_dir: str | Path) -> dict[str, Any]:
    """The run's manifest.json (an empty dict when the folder has none, e.g. opened by hand)."""
    p = Path(run_dir) / "manifest.json"
    return json.loads(p.read_text()) if p.is_file() else {}


def manifest_summary(run_dir: str | Path) -> pd.DataFrame:
    """Key facts of the manifest as a two-column table."""
    m = read_manifest(run_dir)
    pk = m.get("packages", {})
    gpus = m.get("gpus") or []
    facts = {
        "profile": m.get("profile"),
        "params hash": m.get("params_hash"),
        "overrides": ", ".join(m.get("overrides") or []) or "none",
        "git commit": (m.get("git") or {}).get("commit"),
        "uncommitted changes": (m.get("git") or {}).get("dirty"),
        "started (UTC)": m.get("started"),
        "python": m.get("python"),
        "CPU": (m.get("cpu") or {}).get("model"),
        "GPU": ", ".join(f"{g['name']} (cc {g['capability']})" for g in gpus) or "none",
        "NVFP4 GPU check": m.get("nvfp4_gpu"),
        **{f"{k}": v for k, v in pk.items() if v},
    }
    return pd.DataFrame({"item": list(facts), "value": [str(v) for v in facts.values()]})


def figures(run_dir: str | Path) -> list[Path]:
    """Every PNG under ``figures/``, sorted by name (stage prefixes keep stage order)."""
    d = Path(run_dir) / "figures"
    return sorted(d.glob("*.png")) if d.is_dir() else []


def figures_html(run_dir: str | Path) -> str:
    """Every figure embedded as a base64 PNG (so report.html reads offline), with its file name."""
    import base64

    parts = []
    for fig in figures(run_dir):
        data = base64.b64encode(fig.read_bytes()).decode()
        parts.append(f'<figure><img src="data:image/png;base64,{data}" style="max-width:100%">'
                     f"<figcaption>figures/{html.escape(fig.name)}</figcaption></figure>")
    return "".join(parts) or "<p>No figures in this run.</p>"
