"""How tables look in notebooks and in the report: whole cells, no index, wrapped text."""

from __future__ import annotations

from typing import Any


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


