"""The files of an SGLang source tree and their state: every ``*.py`` under ``sglang/srt`` (linked
folders followed once), their texts read once per state, and the stamps (path, size, mtime) that
the audit's caches key on, so that a tree patched in place is read again. Split from
:mod:`~nvfp4study.sglang.code_index` (which re-exports these names), which reads what the files say.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

SRT = "sglang/srt/"


def py_files(root: Path) -> list[Path]:
    """Every ``*.py`` under ``root/sglang/srt``, sorted, following linked folders (a package moved
    and linked back is still part of the tree) but entering each real folder once (no loops)."""
    return [Path(p) for p in _py_file_names(root)]


def _py_file_names(root: Path) -> list[str]:
    """:func:`py_files` as strings (pathlib's parsing was most of a tree stamp's time), in the
    order of the paths: sorted by their parts, as ``PurePosixPath`` compares (``a/b.py`` before
    ``a-c/x.py``, which plain string order reverses)."""
    import os

    seen, out = set(), []
    for folder, dirs, files in os.walk(str(Path(root) / SRT), followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        out += [f"{folder}/{f}" for f in files if f.endswith(".py")]
    return sorted(out, key=lambda p: p.split("/"))


def source_files(root: Path, unreadable: dict[str, str] | None = None) -> list[tuple[Path, str]]:
    """``[(path, text)]`` for every regular ``*.py`` file under ``root/sglang/srt`` that reads as
    UTF-8, sorted. Links that dangle or loop and FIFOs (a read would block) are passed over;
    files that cannot be read or decoded are too, and recorded in ``unreadable`` (``{file: why}``,
    file from the root) when given. Read once per state of the files (path, size, mtime): the
    audit asks several times per tree."""
    texts, bad = _read_sources(Path(root), tree_stamp(root))
    if unreadable is not None:
        unreadable.update(bad)
    return list(texts)


#: tree_stamp's results while :func:`one_stamp_per_tree` holds (None: every call looks again)
_STAMPS: dict[str, tuple] | None = None


@contextmanager
def one_stamp_per_tree() -> Iterator[None]:
    """Within the block, :func:`tree_stamp` lists and stats a tree's files once (the audit asks
    for the stamp of the same tree several times and changes no file meanwhile)."""
    global _STAMPS
    outer = _STAMPS
    _STAMPS = {} if outer is None else outer
    try:
        yield
    finally:
        _STAMPS = outer


def listing_once(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` run inside :func:`one_stamp_per_tree`, for an entry point that reads a tree and changes
    none of its files (a listing costs about 40 ms; the fusion facts asked for it once per path)."""

    @functools.wraps(fn)
    def listed(*args: P.args, **kwargs: P.kwargs) -> R:
        with one_stamp_per_tree():
            return fn(*args, **kwargs)

    return listed


class _Same:
    """A cache-key part equal only to the very object it holds (hashed by identity, kept alive so that
    its id is not reused while the entry lives): for inputs that are unhashable dicts."""

    __slots__ = ("obj",)

    def __init__(self, obj: object):
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj


def once_per_state(depends: Callable[[], tuple] = tuple, maxsize: int = 8):
    """Decorator for ``fn(tree) -> list[dict]`` (a tree read, none of its files changed): computed once
    per tree state (:func:`tree_stamp`) and per object ``depends()`` returns (by identity: a table the
    result is built from, which a caller may swap), inside :func:`one_stamp_per_tree`. Each call gets
    a new list of shallow copies of the rows. ``cache_clear`` empties it (the suite's cache bound)."""

    def wrap(fn: Callable[[object], list[dict]]) -> Callable[[object], list[dict]]:
        @lru_cache(maxsize=maxsize)
        def per_state(tree: object, _stamp: tuple, _deps: tuple) -> list[dict]:
            return fn(tree)

        @functools.wraps(fn)
        def cached(tree) -> list[dict]:
            with one_stamp_per_tree():
                rows = per_state(tree, tree_stamp(tree.root), tuple(_Same(d) for d in depends()))
                return [dict(r) for r in rows]

        cached.cache_clear = per_state.cache_clear
        cached.cache_info = per_state.cache_info
        return cached

    return wrap


def tree_stamp(root: Path) -> tuple[tuple[str, int, int], ...]:
    """``((path, size, mtime_ns), ...)`` for every ``*.py`` of :func:`py_files`: the state of the
    tree's sources, for caches that must see a tree patched in place (-1 for a bad link); read
    once per :func:`one_stamp_per_tree` block."""
    if _STAMPS is not None:
        key = str(root)
        if key not in _STAMPS:
            _STAMPS[key] = _tree_stamp(root)
        return _STAMPS[key]
    return _tree_stamp(root)


def _tree_stamp(root: Path) -> tuple[tuple[str, int, int], ...]:
    import os

    out = []
    for p in _py_file_names(root):  # files_stamp's rows, without building a Path per file
        try:
            st = os.stat(p)
            out.append((p, st.st_size, st.st_mtime_ns))
        except OSError:  # a dangling or looping link: part of the state all the same
            out.append((p, -1, -1))
    return tuple(out)


def files_stamp(paths: Iterable[Path]) -> tuple[tuple[str, int, int], ...]:
    """``((path, size, mtime_ns), ...)`` of ``paths`` (-1, -1 for one that cannot be stat'ed): a key
    for caches that must see a file edited in place."""
    out = []
    for p in paths:
        try:
            st = p.stat()
            out.append((p.as_posix(), st.st_size, st.st_mtime_ns))
        except OSError:  # a dangling or looping link: part of the state all the same
            out.append((p.as_posix(), -1, -1))
    return tuple(out)


@lru_cache(maxsize=2)  # a tree's text is tens of MB: keep the last two
def _read_sources(root: Path, stamp: tuple) -> tuple[tuple, dict[str, str]]:
    out, bad = [], {}
    for path in (Path(x[0]) for x in stamp):
        try:
            if path.is_file():
                out.append((path, path.read_bytes().decode("utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            rel = path.relative_to(root).as_posix()
            why = "not valid UTF-8" if isinstance(exc, UnicodeDecodeError) else (exc.strerror or str(exc))
            bad[rel] = f"{rel[len(SRT):]}: cannot read: {why}"
    return tuple(out), bad


__all__ = ["SRT", "files_stamp", "listing_once", "once_per_state", "one_stamp_per_tree", "py_files", "source_files", "tree_stamp"]
