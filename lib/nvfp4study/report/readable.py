"""Ledger values as text a person reads: small HTML tables and phrases, never raw JSON.

A ledger value (``card`` or ``measured``, see :mod:`nvfp4study.core.ledger`) is any JSON value.
:func:`value_html` turns it into HTML by its shape, so every claim kind reads as text:

- SGLang versions x paths (a dict keyed by versions such as ``"0.5.21"``) -> a versions table;
- a count with its layout formula (``{"count": 288, "formula": "3 x 16 x (8 - 2)"}``) ->
  ``288 = 3 x 16 x (8 - 2)``;
- a two-number list (``accept_len: [1.85, 1.95]``) -> a range ``1.85 – 1.95``;
- numbers carry the unit named by their key (``_gb`` GB = 1e9 bytes, ``_s`` seconds, ``tok_s``
  tok/s; the units of ``claims.yaml``), fractions (``recall``, ``fraction``, ``rel_``) as percent;
- any other dict -> a two-column table of readable keys and values (nested dicts inline).

The compact form (table cells) clips long strings, long inline lines and long tables (and a
matrix with long cells reads as rows); :func:`cell_html` then adds
the whole value, rendered the same way, in a collapsed ``<details>`` element. The JSON itself
stays in ``ledger.json`` and the evidence files.
"""

from __future__ import annotations

import html
import re
from typing import Any

VERSION_RE = re.compile(r"^\d+\.\d+(\.\d+)?$")
MAX_TEXT = 180   # characters of one string in a compact cell
MAX_ROWS = 8     # rows of one table in a compact cell
MAX_COLS = 6     # a dict of dicts with more distinct inner keys reads better as inline rows
MAX_CELL = 32    # characters of one matrix cell; longer values read better as inline rows

_UNITS = (("tok_s", "tok/s"), ("_gb", "GB"), ("_mb", "MB"), ("_bytes", "B"), ("_s", "s"))
_PERCENT_KEYS = ("recall", "fraction", "rel_", "relative")


class _Clip:
    """Whether a compact rendering left something out (so the whole value is offered)."""

    def __init__(self) -> None:
        self.clipped = False


def label(key: Any) -> str:
    """A dict key as words: ``"median_rel_diff"`` -> ``"median rel diff"``."""
    return "tok/s" if key == "tok_s" else str(key).replace("_", " ")


def unit_for(key: Any) -> str:
    """The unit a ledger key names (``load_s`` -> ``"s"``), or ``""``."""
    k = str(key).lower()
    if k in ("tok_s", "s"):
        return {"tok_s": "tok/s", "s": "s"}[k]
    for suffix, unit in _UNITS:
        if k.endswith(suffix):
            return unit
    return ""


def number(value: float | int, key: Any = "") -> str:
    """A number as text: thousands separators for ints, 4 significant digits for floats, the
    key's unit, and percent for fractions (``recall 0.3964`` -> ``39.6 %``)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    k = str(key).lower()
    if isinstance(value, float) and any(p in k for p in _PERCENT_KEYS) and abs(value) <= 1.0:
        text = f"{value * 100:.3g} %"
    elif isinstance(value, int):
        text = f"{value:,}"
    else:
        text = f"{value:.4g}"
    unit = unit_for(key)
    return f"{text} {unit}" if unit and not text.endswith("%") else text


def scalar(value: Any, key: Any = "", clip: _Clip | None = None) -> str:
    """One scalar (or None) as escaped HTML text."""
    if value is None:
        return "none"
    if isinstance(value, bool | int | float):
        return html.escape(number(value, key))
    text = str(value)
    if clip is not None and len(text) > MAX_TEXT:
        clip.clipped = True
        text = text[:MAX_TEXT].rstrip() + " …"
    return breakable(text) if text else "(empty)"


def breakable(text: str) -> str:
    """``text`` escaped, with a line-break opportunity (``<wbr>``) after every ``/``: a path in a
    narrow cell breaks between its folders rather than letter by letter."""
    return html.escape(text).replace("/", "/<wbr>")


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, str | int | float | bool)


def _inline(value: Any, key: Any, clip: _Clip | None, depth: int) -> str:
    """A value on one line: lists joined by commas, dicts as ``key: value; key: value``."""
    if _is_scalar(value):
        return scalar(value, key, clip)
    if isinstance(value, list):
        if len(value) == 2 and all(isinstance(x, int | float) and not isinstance(x, bool) for x in value):
            return f"{number(value[0])} – {html.escape(number(value[1], key))}"
        items = value
        if clip is not None and len(items) > MAX_ROWS * 2:
            clip.clipped = True
            items = items[:MAX_ROWS * 2]
            return _joined([_inline(x, key, clip, depth + 1) for x in items], ", ", clip, True)
        return _joined([_inline(x, key, clip, depth + 1) for x in items], ", ", clip)
    if isinstance(value, dict):
        if "count" in value and "formula" in value:
            return _count(value, clip)
        # the parent's key names the unit / percent of its children (recall_all -> detector: 96.7 %)
        parts = [f"{html.escape(label(k))}: {_inline(v, f'{key}.{k}' if key else k, clip, depth + 1)}"
                 for k, v in value.items()]
        return _joined(parts, "; ", clip)
    return scalar(str(value), key, clip)


def _text_len(h: str) -> int:
    return len(html.unescape(re.sub(r"<[^>]+>", "", h)))


def _joined(parts: list[str], sep: str, clip: _Clip | None, more: bool = False) -> str:
    """``parts`` on one line; in the compact form only as many as fit in about :data:`MAX_TEXT`
    characters (an inline dict is one long string in a narrow cell), then ``…``."""
    if not parts:
        return "(none)"
    shown, used = [], 0
    for p in parts:
        if clip is not None and used > MAX_TEXT:
            clip.clipped = more = True
            break
        shown.append(p)
        used += _text_len(p) + len(sep)
    return sep.join(shown) + (f"{sep.rstrip()} …" if more else "")


def _count(value: dict, clip: _Clip | None) -> str:
    rest = {k: v for k, v in value.items() if k not in ("count", "formula")}
    formula = str(value["formula"]).split(" = ", 1)[-1]
    text = f"{number(value['count'])} = {html.escape(formula)}"
    if rest:
        text += "; " + _inline(rest, "", clip, 1)
    return text


def _table(head: list[str], rows: list[list[str]], clip: _Clip | None) -> str:
    shown = rows
    more = ""
    if clip is not None and len(rows) > MAX_ROWS:
        clip.clipped = True
        shown = rows[:MAX_ROWS]
        more = f'<tr><td colspan="{len(head)}">… {len(rows) - MAX_ROWS} more rows</td></tr>'
    th = "".join(f"<th>{h}</th>" for h in head) if any(head) else ""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in shown)
    return (f'<table class="kv">{"<thead><tr>" + th + "</tr></thead>" if th else ""}'
            f"<tbody>{body}{more}</tbody></table>")


def value_html(value: Any, clip: _Clip | None = None, depth: int = 0) -> str:
    """A ledger value as HTML (see the module docstring for the shapes).

    Args:
        value: any JSON value (dict, list, str, number, bool, None).
        clip: pass a :class:`_Clip` for the compact form (long strings / tables clipped; its
            ``clipped`` is set when something was left out); None renders the whole value.
        depth: nesting level (deeper dicts render inline).
    """
    if _is_scalar(value) or isinstance(value, list) or depth >= 1:
        return _inline(value, "", clip, depth)
    if not value:
        return "(none)"
    if "count" in value and "formula" in value:
        return _count(value, clip)
    keys = list(value)
    nested = [v for v in value.values() if isinstance(v, dict)]
    if len(nested) == len(keys) and len(keys) >= 2:
        inner = list(dict.fromkeys(k for v in nested for k in v))
        corner = "SGLang" if all(VERSION_RE.match(str(k)) for k in keys) else ""
        dense = all(2 * len(v) >= len(inner) for v in nested)  # a sparse matrix reads worse than rows
        # ... and so does one whose cells are long (a path or a dict squeezed into a narrow column)
        short = all(_is_scalar(x) and len(str(x)) <= MAX_CELL for v in nested for x in v.values())
        if len(inner) <= MAX_COLS and dense and short:
            rows = [[f"<b>{html.escape(str(k))}</b>"] + [_inline(value[k].get(i, "—"), i, clip, 2)
                                                       if i in value[k] else "—" for i in inner]
                    for k in keys]
            return _table([corner] + [html.escape(label(i)) for i in inner], rows, clip)
        rows = [[f"<b>{breakable(str(k))}</b>", _inline(value[k], k, clip, 2)] for k in keys]
        return _table([corner, ""] if corner else ["", ""], rows, clip)
    if all(VERSION_RE.match(str(k)) for k in keys):
        rows = [[f"<b>{html.escape(str(k))}</b>", _inline(v, k, clip, 1)] for k, v in value.items()]
        return _table(["SGLang", ""], rows, clip)
    rows = [[breakable(label(k)), _inline(v, k, clip, 1)] for k, v in value.items()]
    return _table(["", ""], rows, clip)


def cell_html(value: Any, empty: str = "—") -> str:
    """A ledger cell: the compact rendering, plus the whole value in a collapsed ``<details>``
    when the compact one left something out."""
    if value is None:
        return f'<span class="muted">{empty}</span>'
    clip = _Clip()
    compact = value_html(value, clip)
    if not clip.clipped:
        return compact
    return (f'{compact}<details class="whole"><summary>whole value</summary>'
            f"{value_html(value)}</details>")


def value_text(value: Any) -> str:
    """A ledger value as one plain-text line (for Markdown: the README, sentences)."""
    return html.unescape(re.sub(r"<[^>]+>", "", _inline(value, "", None, 0)))
