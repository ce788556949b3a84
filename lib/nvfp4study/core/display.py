"""How tables look in notebooks and in the report: whole cells, no index, wrapped text."""

from __future__ import annotations

import re
from typing import Any

_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)*?\1", re.S)


def escape_dollars(text: str) -> str:
    """``text`` with every ``$`` outside code spans written ``\\$``, so that JupyterLab (MathJax)
    and nbconvert's HTML show a dollar sign instead of typesetting what follows as maths (for
    example a regex ``weight$`` in a ledger note). Code spans are left alone: they are never
    typeset, and a backslash there would show."""
    out, last = [], 0
    for m in _CODE_SPAN.finditer(text):
        out.append(re.sub(r"(?<!\\)\$", r"\\$", text[last:m.start()]))
        out.append(m.group(0))
        last = m.end()
    out.append(re.sub(r"(?<!\\)\$", r"\\$", text[last:]))
    return "".join(out)


def markdown(text: str) -> Any:
    """An ``IPython.display.Markdown`` of ``text`` with its dollar signs escaped (:func:`escape_dollars`)."""
    from IPython.display import Markdown

    return Markdown(escape_dollars(text))


def display_options() -> None:
    """Tables in notebooks show whole cells (pandas clips at 50 characters by default)."""
    import pandas as pd

    pd.set_option("display.max_colwidth", 400)
    pd.set_option("display.max_rows", 200)
    pd.set_option("display.max_columns", 50)


def text_table(df: Any) -> Any:
    """A pandas ``Styler`` for a ``DataFrame`` of long text: no index, left-aligned, wrapped cells."""
    return df.style.hide(axis="index").set_table_styles(
        [{"selector": "td, th", "props": [("text-align", "left"), ("vertical-align", "top"),
                                          ("overflow-wrap", "break-word"), ("white-space", "normal")]}])


