"""The study's one append-only JSONL record file: each row appended and fsynced as it arrives,
and read back with one rule for a line cut by a crash.

Rule: a row is written as one ``write`` of its JSON text and a newline, then fsynced, so a crash
can cut only the last line, and a cut line is exactly a last line without its newline.
- Reading (:func:`read_jsonl`): a cut last line is dropped and reported (``JsonlRows.cut``); a
  complete line (one that ends in a newline) that is not a JSON object is a :class:`JsonlError`
  naming the file and line, wherever it is.
- Appending (:func:`append_jsonl`): a cut last line is removed before the new row is written
  (and returned), so a cut line never ends up in the middle of a file.

Used by the serving records (``serve-raw-*``, ``serve-launch-*``), the launch lifecycle file and
05's corruption files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .errors import JsonlError


class JsonlRows(list):
    """The rows of a JSONL file (a ``list`` of dicts), with ``cut``: the text of a last line cut
    by a crash, which was dropped (``None`` when the file ends in a complete line)."""

    cut: str | None = None


def _cut_tail(data: bytes) -> bytes:
    """The bytes after the last newline of ``data`` (empty when ``data`` ends in one)."""
    return data[data.rfind(b"\n") + 1:]


def _tail_length(fh) -> int:
    """How many bytes of the open binary file ``fh`` follow its last newline (0: it ends in one
    or is empty); reads backwards from the end in 64 KiB steps, not the whole file."""
    end = pos = fh.seek(0, os.SEEK_END)
    while pos > 0:
        step = min(pos, 1 << 16)
        pos -= step
        fh.seek(pos)
        nl = fh.read(step).rfind(b"\n")
        if nl >= 0:
            return end - (pos + nl + 1)
    return end


def append_jsonl(path: Path, row: dict[str, Any], *, ensure_ascii: bool = True) -> str | None:
    """Append ``row`` to ``path`` as one JSON line (values JSON cannot hold via ``str``;
    non-ASCII escaped unless ``ensure_ascii`` is False) and fsync it. The folder is created.

    Returns:
        The text of a last line cut by an earlier crash, which was removed first, or None.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(row, default=str, ensure_ascii=ensure_ascii) + "\n").encode("utf-8")
    tail = b""
    with open(path, "a+b") as fh:
        n = _tail_length(fh)
        if n:
            fh.seek(-n, os.SEEK_END)
            tail = fh.read()
            fh.truncate(fh.seek(0, os.SEEK_END) - n)
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())
    return tail.decode("utf-8", errors="replace") if tail else None


def read_jsonl(path: Path) -> JsonlRows:
    """The JSON objects of ``path``, one per line, in file order; blank lines are skipped.

    A last line without its newline (a write cut by a crash) is dropped and reported in the
    result's ``cut``.

    Raises:
        JsonlError: a complete line that does not parse as a JSON object (names file and line).
        FileNotFoundError: ``path`` does not exist.
    """
    data = Path(path).read_bytes()
    tail = _cut_tail(data)
    rows = JsonlRows()
    rows.cut = tail.decode("utf-8", errors="replace") if tail else None
    for i, raw in enumerate(data[:len(data) - len(tail)].split(b"\n")[:-1]):
        line = raw.decode("utf-8", errors="replace")
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise JsonlError(f"{path}: line {i + 1} is not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise JsonlError(f"{path}: line {i + 1} is not a JSON object")
        rows.append(row)
    return rows
