"""Build the report page from a run folder's files (``99_report`` computes nothing new).

The page, top to bottom: a summary (what was studied on what, the verdict counts, the headline
findings as sentences from :mod:`nvfp4study.report.findings`, what is still open with its command
and hardware), then one section per part of the card (:mod:`nvfp4study.report.sections`)
with its ledger rows and its figures (caption, reading guide, alt text), then the run's
notebooks and manifest. Values are rendered by :mod:`nvfp4study.report.readable` (no raw JSON);
the card's value and ours sit in separate, labelled columns, and a card value is never shown as
ours. Stages that did not run appear once, in the summary's open work, not under every row.
"""

from __future__ import annotations

import base64
import contextlib
import html
import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

from ..core import ledger
from ..core.stage import Stage, open_stage_named
from ..report import findings
from ..report import sections as layout
from ..report.readable import breakable, cell_html, value_text

NOTEBOOK = "99_report"
CARD_URL = "https://huggingface.co/kingjones777/Ling-3.0-flash-NVFP4-SGLang-MTP"


def open_stage(params_file: str = "", run_dir: str = "") -> Stage:
    """:func:`nvfp4study.core.stage.open_stage_named` for notebook ``99_report`` (quiet: the
    report's reader needs no line about which folder the notebook opened)."""
    return open_stage_named(NOTEBOOK, params_file, run_dir, quiet=True)


VERDICT_COLOURS = {
    "reproduced": "#c8e6c9",
    "partly": "#fff3c4",
    "contradicted": "#ffcdd2",
    "not run": "#e0e0e0",
}


def _e(text: Any) -> str:
    return html.escape(str(text))


def md_inline(text: str) -> str:
    """A sentence with Markdown backticks as HTML (escaped, ```x``` -> ``<code>x</code>``)."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", _e(text))


def badge(text: str, verdict: str | None = None) -> str:
    """A coloured label (class ``v-<verdict>``; ``verdict`` defaults to ``text``)."""
    v = (verdict or text).replace(" ", "-")
    return f'<span class="badge v-{_e(v)}">{_e(text)}</span>'


def read_manifest(run_dir: str | Path) -> dict[str, Any]:
    """The run's manifest.json (an empty dict when the folder has none, e.g. opened by hand)."""
    p = Path(run_dir) / "manifest.json"
    return json.loads(p.read_text()) if p.is_file() else {}


def ledger_frame(run_dir: str | Path) -> pd.DataFrame:
    """The run's ledger as a DataFrame of text: id, stage, origin, claim, card says, we measured,
    verdict, checked on, note, evidence (values as one readable line each, never JSON)."""
    rows = ledger.read_ledger(run_dir)
    return pd.DataFrame([{
        "id": r["id"], "stage": r["stage"], "origin": r.get("origin", "card"), "claim": r["claim"],
        "card says": "" if r.get("card") is None else value_text(r["card"]),
        "we measured": "" if r.get("measured") is None else value_text(r["measured"]),
        "verdict": r["verdict"], "checked on": r.get("checked_on") or "", "note": r.get("note", ""),
        "evidence": ", ".join(r.get("evidence") or []),
    } for r in rows])


def verdict_counts(run_dir: str | Path) -> pd.DataFrame:
    """Number of rows per verdict (columns), card claims and study findings (rows)."""
    c = findings.verdict_counts(ledger.read_ledger(run_dir))
    return pd.DataFrame(c).T[list(VERDICT_COLOURS)]


# --- summary ---------------------------------------------------------------------------------
def _checkpoint_text(params: dict[str, Any]) -> str:
    cp = params.get("checkpoint") or {}
    shape = cp.get("shape") or {}
    if cp.get("quantized_path"):
        return f"the checkpoint at <code>{_e(cp['quantized_path'])}</code>"
    if cp.get("source") == "generate":
        return (f"a generated checkpoint in Ling-3.0-flash's layout with random weights, scaled down "
                f"({shape.get('num_hidden_layers', '?')} layers, {shape.get('num_experts', '?')} experts, "
                f"hidden size {shape.get('hidden_size', '?')}; seed {cp.get('seed', '?')}), quantized "
                f"with the card's recipe")
    return f"the BF16 checkpoint <code>{_e(cp.get('source_path'))}</code>, quantized with the card's recipe"


def _facts(run_dir: Path, params: dict[str, Any], description: str) -> str:
    m = read_manifest(run_dir)
    pk = m.get("packages") or {}
    sg = params.get("sglang") or {}
    gpus = m.get("gpus") or []
    gpu = ", ".join(f"{g['name']} (compute capability {g['capability']})" for g in gpus) or \
        f"none. {m.get('nvfp4_gpu') or ''}"
    from ..sglang.releases import expand_versions

    audited = expand_versions(list(sg.get("audit_versions") or []))
    versions = [f"SGLang source audited: {', '.join(audited)}"
                f" (installed: {pk.get('sglang') or 'none'})"]
    versions += [f"{k} {pk[k]}" for k in ("llmcompressor", "compressed-tensors", "torch") if pk.get(k)]
    facts = [
        ("Studied", f'the model card <a href="{CARD_URL}">kingjones777/Ling-3.0-flash-NVFP4-SGLang-MTP</a>, '
                    "claim by claim"),
        ("Profile", f"<b>{_e(params.get('profile', m.get('profile', '?')))}</b>: {_e(description)}"),
        ("Checkpoint", _checkpoint_text(params)),
        ("Versions", _e("; ".join(versions))),
        ("GPU", _e(gpu)),
    ]
    return '<div class="facts">' + "".join(f"<b>{k}</b><span>{v}</span>" for k, v in facts) + "</div>"


def counts_html(rows: list[dict[str, Any]]) -> str:
    """The verdict counts as one line of coloured labels per origin (card claims, study findings)."""
    c = findings.verdict_counts(rows)
    lines = []
    for origin, what in (("card", "card claims"), ("study", "study findings")):
        n = sum(c[origin].values())
        if n:
            lines.append(f"<b>{n} {what}:</b> " + " ".join(
                badge(f"{c[origin][v]} {v}", v) for v in VERDICT_COLOURS if c[origin][v]))
    return f'<p class="counts">{"&emsp;".join(lines)}</p>'


def open_work_html(rows: list[dict[str, Any]]) -> str:
    """One box per group of "not run" claims: why, what it would measure, command and hardware."""
    items = findings.open_items(rows)
    if not items:
        return "<p>Nothing is left open: every claim was run.</p>"
    out = []
    for o in items:
        ids = ", ".join(f'<a href="#claim-{_e(i)}">{_e(i)}</a>' for i in o.rows)
        cmds = "".join(f"<li><code>{_e(c)}</code></li>" for c in o.commands)
        out.append(f'<div class="notrun"><b>Not run: {_e(o.reason)}</b> ({len(o.rows)} claims of '
                   f"{_e(o.stage)}).<br>What it would measure: {_e(o.measures or 'the claims below')}."
                   f"<br>To run it: <ul>{cmds}</ul>"
                   f"Hardware: {_e(o.hardware)}.<br><span class=\"meta\">Claims: {ids}</span></div>")
    return "".join(out)


def simulated_html(run_dir: Path, rows: list[dict[str, Any]]) -> str:
    """A banner naming the stand-ins of a simulated run (``simulated`` in ``data/environment.json``
    or the manifest, or on any ledger row: :func:`nvfp4study.core.environment.simulated`); "" for
    a real run."""
    said = next((r["simulated"] for r in rows if r.get("simulated")), None)
    for f in (run_dir / "data" / "environment.json", run_dir / "manifest.json"):
        if said is None and f.is_file():
            with contextlib.suppress(ValueError):
                said = json.loads(f.read_text()).get("simulated")
    if not said:
        return ""
    return (f'<p class="simulated"><b>SIMULATED RUN: no value on this page is a measurement.</b> '
            f"{_e(said)}</p>")


def summary_html(run_dir: str | Path, params: dict[str, Any], description: str = "") -> str:
    """The summary block at the top of the report (see the module docstring)."""
    run_dir = Path(run_dir)
    rows = ledger.read_ledger(run_dir)
    items = []
    for f in findings.headlines(rows):
        links = [f'<a href="#claim-{_e(i)}">{_e(i)}</a>' for i in f.rows]
        links += [f'<a href="#fig-{_e(s)}">figure {_e(s)}</a>' for s in f.figures]
        items.append(f"<li><b>{_e(f.title)}</b> {badge(f.verdict) if f.verdict in VERDICT_COLOURS else _e(f.verdict)} "
                     f"{md_inline(f.sentence)} <span class=\"meta\">Evidence: {', '.join(links)}</span></li>")
    return (f'<div class="nv"><style>{layout.CSS}</style><section class="summary" id="summary">'
            f"<h2>Summary</h2>{simulated_html(run_dir, rows)}{_facts(run_dir, params, description)}"
            f"{counts_html(rows)}"
            f"<h3>Headline findings</h3><ul class=\"headlines\">{''.join(items)}</ul>"
            f"<h3>Still open</h3>{open_work_html(rows)}</section></div>")


# --- sections --------------------------------------------------------------------------------
NOTE_CHARS = 160     # a longer note shows its start; the rest folds into the row's detail
CHECKED_CHARS = 100  # the same for the "checked on" line (the CPU engine's line names its kernels)
EVIDENCE_SHOWN = 3   # more evidence files than this fold into the row's detail


def _clip_words(text: str, n: int) -> tuple[str, str]:
    """``text`` cut before character ``n`` at a space: ``(head, rest)``; ``rest`` is "" when it fits."""
    if len(text) <= n:
        return text, ""
    head = text[:n].rsplit(" ", 1)[0] or text[:n]
    return head, text[len(head):].lstrip()


def _evidence_html(row: dict[str, Any]) -> str:
    links = []
    for ev in row.get("evidence") or []:
        href = f"#fig-{Path(ev).stem}" if ev.startswith("figures/") else ev
        links.append(f'<a href="{_e(href)}">{breakable(ev)}</a>')
    if len(links) <= EVIDENCE_SHOWN:
        return f'<div class="meta">evidence: {", ".join(links)}</div>'
    # a long list is a detail: the row names the first file and how many more (also on paper)
    first = (row.get("evidence") or [""])[0]
    return (f'<details class="more evidence"><summary class="meta">evidence: {breakable(first)} and '
            f'{len(links) - 1} more files</summary><div class="meta">{", ".join(links)}</div></details>')


def _folded(text: str, n: int, what: str) -> str:
    """``text`` as HTML: its first clause (or first ``n`` characters) shown, the rest in a
    collapsed ``<details class="more fold">`` labelled "rest of the ``what``" (not printed)."""
    if len(text) <= n:
        return breakable(text)
    clause = findings.first_clause(text)
    head, rest = (clause, text[len(clause):].lstrip(" ;.")) if len(clause) <= n else _clip_words(text, n)
    if not rest:
        return breakable(text)
    return (f'{breakable(head)} …<details class="more fold"><summary class="meta">rest of the {what}'
            f"</summary>{breakable(rest)}</details>")


def row_html(row: dict[str, Any]) -> str:
    """One ledger row as a table row: the verdict sentence
    (:func:`nvfp4study.report.findings.row_verdict`, its verdict word as the coloured label) over
    the claim, card says, we measured, how/why (the rest of the note; a long note and a long
    evidence list folded into a ``<details>``)."""
    origin = "study finding" if row.get("origin") == "study" else "card claim"
    word, reason, rest = findings.row_verdict_parts(row)
    lead = (f'<div class="lead">{badge(word, row["verdict"])}{":" if reason else "."} {breakable(reason)}'
            f'{"" if not reason or reason.endswith(("…", ".")) else "."}</div>')
    why = _folded(rest, NOTE_CHARS, "note")
    if row.get("checked_on"):
        why += f'<div class="meta">checked on {_folded(row["checked_on"], CHECKED_CHARS, "line")}</div>'
    if row.get("evidence"):
        why += _evidence_html(row)
    no_card = row.get("card") is None
    card = cell_html(row.get("card"), "— (not a card claim)" if row.get("origin") == "study" else "—")
    ours = cell_html(row.get("measured"), "not measured")
    return (f'<tr id="claim-{_e(row["id"])}" class="row-{row["verdict"].replace(" ", "-")}">'
            f'<td class="c-claim">{lead}<div class="what"><div class="claim">{_e(row["claim"])}</div>'
            f'<div class="meta">{_e(row["id"])} · {_e(row["stage"])} · {origin}</div></div></td>'
            f'<td class="c-card{" none" if no_card else ""}">{card}</td>'
            f'<td class="c-ours{" none" if row.get("measured") is None else ""}">{ours}</td>'
            f'<td class="c-why">{why}</td></tr>')


def ledger_table_html(rows: list[dict[str, Any]]) -> str:
    """A section's ledger rows as one fixed-layout table (no index column; wrapped cells)."""
    cols = "".join(f'<col class="c-{c}">' for c in ("claim", "card", "ours", "why"))
    head = "".join(f"<th>{h}</th>" for h in ("verdict and claim", "card says", "we measured", "how / why"))
    return (f'<table class="ledger"><colgroup>{cols}</colgroup><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(row_html(r) for r in rows)}</tbody></table>")


def figures(run_dir: str | Path) -> list[Path]:
    """Every PNG under ``figures/``, sorted by name."""
    d = Path(run_dir) / "figures"
    return sorted(d.glob("*.png")) if d.is_dir() else []


def figure_html(path: Path, info: dict[str, Any]) -> str:
    """One figure embedded as base64 PNG (report.html reads offline), with caption and alt text."""
    data = base64.b64encode(path.read_bytes()).decode()
    return (f'<figure id="fig-{_e(path.stem)}"><img src="data:image/png;base64,{data}" alt="{_e(info["alt"])}">'
            f"<figcaption><b>{_e(info['caption'])}</b> How to read it: {_e(info['read'])} "
            f'<span class="meta">(figures/{_e(path.name)})</span></figcaption></figure>')


def sections_html(run_dir: str | Path) -> str:
    """Every section of the card with its ledger rows and figures, in the card's order; after the
    clamp section, stage 03's backend matrix (:func:`backend_matrix_html`)."""
    run_dir = Path(run_dir)
    rows = ledger.read_ledger(run_dir)
    by_section: dict[str, list[dict]] = {}
    for r in rows:
        by_section.setdefault(layout.section_of(r["id"]), []).append(r)
    evidence = {}
    for r in rows:
        for ev in r.get("evidence") or []:
            if ev.startswith("figures/"):
                evidence.setdefault(Path(ev).stem, layout.section_of(r["id"]))
    figs: dict[str, list[str]] = {}
    for p in figures(run_dir):
        info = layout.figure_info(p.stem, evidence)
        figs.setdefault(info["section"], []).append(figure_html(p, info))
    parts = [f'<div class="nv"><style>{layout.CSS}</style>']
    for key, title, intro in [*layout.SECTIONS, layout.OTHER]:
        srows, sfigs = by_section.get(key, []), figs.get(key, [])
        if not srows and not sfigs:
            continue
        counts = findings.verdict_counts(srows)
        tally = ", ".join(f"{n} {v}" for v in VERDICT_COLOURS
                          if (n := counts["card"][v] + counts["study"][v]))
        parts.append(f'<section id="section-{key}"><h2>{_e(title)}</h2><p>{_e(intro)} '
                     f'<span class="meta">{len(srows)} rows: {_e(tally)}.</span></p>')
        if srows:
            parts.append(ledger_table_html(srows))
        parts.extend(sfigs)
        parts.append("</section>")
        if key == "clamp":  # which runner a Ling user gets, beside where the clamp goes
            parts.append(backend_matrix_html(run_dir))
    parts.append("</div>")
    return "".join(parts)


# --- the MoE backend matrix (stage 03's data/sglang_backend_matrix.json) ----------------------
def _short_cell(c: dict[str, Any]) -> str:
    """A matrix cell in a few words: ``flashinfer_cutlass APPROX``, or why there is none."""
    a = c.get("auto") or {}
    if c.get("method") is None:
        return "UNDECIDED" if "UNDECIDED" in (c.get("error") or "") else "not served"
    if (c.get("error") or "").startswith("raises at load"):
        return "raises at load"
    if not a.get("backend"):
        return "auto UNDECIDED"
    return f"{a['backend']} {a['verdict']}"


def backend_matrix_html(run_dir: str | Path) -> str:
    """The latest audited release's format x device table of what ``--moe-runner-backend auto``
    picks and its clamp verdict, with one sentence for Ling's checkpoint on SM100/SM120 (compact:
    formats whose cells are all alike share a row; the other releases and every backend value's
    verdict stay in the data file), as a ``<section>``; :func:`sections_html` places it after the
    clamp section. Empty when stage 03 wrote no matrix."""
    from ..sglang.backend_matrix import card_answer_short

    f = Path(run_dir) / "data" / "sglang_backend_matrix.json"
    doc = json.loads(f.read_text()) if f.is_file() else {}
    if not doc.get("latest"):
        return ""
    m = doc["releases"][doc["latest"]]
    devices = [d["key"] for d in m["devices"]]
    by = {(c["format"], c["device"]): _short_cell(c) for c in m["cells"]}
    rows: list[tuple[list[str], list[str]]] = []
    for fm in m["formats"]:
        cells = [by[(fm["key"], d)] for d in devices]
        if rows and rows[-1][1] == cells:
            rows[-1][0].append(fm["label"])
        else:
            rows.append(([fm["label"]], cells))
    body = "".join(f"<tr><th>{_e('; '.join(labels))}</th>"
                   + "".join(f"<td>{_e(c).replace('_', '_<wbr>')}</td>" for c in cells) + "</tr>"
                   for labels, cells in rows)
    head = "".join(f"<th>{_e(d)}</th>" for d in devices)
    cols = f'<col style="width:{78 / len(devices):.1f}%">' * len(devices)
    # fixed columns, a smaller face and tight cells: seven columns fit the printed page without a
    # verdict broken inside its word, in about a third of it
    return ('<style>#backend-matrix td, #backend-matrix th {padding: 1px 4px}</style>'
            '<section id="backend-matrix"><h2>Which MoE runner a Ling user gets</h2>'
            f"<p>{md_inline(card_answer_short(m))} "
            f'<span class="meta">Per checkpoint format and device: what <code>auto</code> picks and the '
            "clamp verdict of that path; every backend value and the other releases: "
            "<code>data/sglang_backend_matrix.json</code>, <code>nvfp4study audit-sglang --matrix</code>.</span></p>"
            f'<table class="plain" style="font-size:0.75em;table-layout:fixed;width:100%">'
            f'<colgroup><col style="width:22%">{cols}</colgroup>'
            f"<thead><tr><th>format</th>{head}</tr></thead><tbody>{body}</tbody></table>"
            "</section>")


# --- the run ---------------------------------------------------------------------------------
def notebook_links(run_dir: str | Path) -> str:
    """HTML list linking each executed notebook's code-free HTML copy (relative links)."""
    items = []
    for nb in read_manifest(run_dir).get("notebooks", []):
        name = nb["notebook"]
        items.append(f'<li><a href="html/{_e(name)}.html">{_e(name)}</a> ({_e(nb.get("status", "?"))}, '
                     f'{_e(nb.get("seconds"))} s; executed notebook: <a href="{_e(name)}.ipynb">'
                     f"{_e(name)}.ipynb</a>)</li>")
    if not items:
        return '<div class="nv"><p>No notebook has run yet in this folder.</p></div>'
    return '<div class="nv"><ul>' + "".join(items) + "</ul></div>"


def _engine_fact(run_dir: str | Path) -> str:
    """What stages 04-07 served on, from the run's ``params.yaml``: on the CPU engine
    :func:`nvfp4study.serving.cpu_engine.summary` (what the stand-in replaces) and the served
    stand-in; else the GPU engine, or "no server"."""
    from ..core.params import load_params
    from ..serving.server import engine_description

    f = Path(run_dir) / "params.yaml"
    if not f.is_file():
        return "unknown (no params.yaml)"
    params = load_params(f, overlay=False)
    if not params.server.enabled:
        return "no server (server.enabled is false)"
    d = engine_description(params)
    return f"{d['summary']}; {d['served_model']}" if d else "SGLang on a GPU (server.engine: gpu)"


def manifest_summary(run_dir: str | Path) -> pd.DataFrame:
    """Key facts of the manifest as a two-column table (item, value)."""
    m = read_manifest(run_dir)
    gpus = m.get("gpus") or []
    facts = {
        "profile": m.get("profile"), "params hash": m.get("params_hash"),
        "overrides": ", ".join(m.get("overrides") or []) or "none",
        "git commit": (m.get("git") or {}).get("commit"),
        "uncommitted changes": (m.get("git") or {}).get("dirty"),
        "started (UTC)": m.get("started"), "python": m.get("python"),
        "CPU": (m.get("cpu") or {}).get("model"),
        "GPU": ", ".join(f"{g['name']} (cc {g['capability']})" for g in gpus) or "none",
        "NVFP4 GPU check": m.get("nvfp4_gpu"),
        "serving engine": _engine_fact(run_dir),
        **{k: v for k, v in (m.get("packages") or {}).items() if v},
    }
    return pd.DataFrame({"item": list(facts), "value": [str(v) for v in facts.values()]})


def manifest_html(run_dir: str | Path) -> str:
    """:func:`manifest_summary` as an HTML table without an index column."""
    df = manifest_summary(run_dir)
    body = "".join(f"<tr><th>{_e(i)}</th><td>{_e(v)}</td></tr>" for i, v in zip(df["item"], df["value"], strict=True))
    return f'<div class="nv"><table class="plain manifest"><tbody>{body}</tbody></table></div>'
