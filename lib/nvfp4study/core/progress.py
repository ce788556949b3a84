"""Progress with an ETA for the long cells (05's sweep, 06/07's requests): a tqdm bar over the
requests one launch sends. In a notebook (papermill) ``tqdm.auto`` draws a widget, in a terminal
a text line; both show done/total, rate and the remaining time. ``TQDM_DISABLE=1`` hides them
(tqdm 4.66+ reads ``TQDM_*`` variables as defaults)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def progress(items: list[T], desc: str) -> Iterator[T] | Iterable[T]:
    """``items`` wrapped in a tqdm bar named ``desc`` (one step per item, ETA from the rate so
    far); the items themselves unchanged, in order. A single item gets no bar."""
    if len(items) < 2:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, unit="request")
