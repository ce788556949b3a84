"""Where the audit's bytes come from: a local folder or a Hub repository, behind one interface.

The header reader (:mod:`.header`) and so the whole audit ask a :class:`Reader` for a file list,
small files (``config.json``, the index), a shard's size and byte ranges. :class:`LocalReader`
reads a folder; :class:`~.remote.HubReader` reads a Hub revision by HTTP Range requests. Both
count what they read (:class:`ReadStats`), so a remote audit can print its bytes and requests.

Scalar scales are decoded here from raw bytes (little-endian, as the safetensors format stores
every dtype; safetensors README "Format"); only the float dtypes a ``[1]`` scale can have.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..core.errors import CheckpointFileError

#: numpy dtype of the float dtypes a global scale can be stored in (little-endian, safetensors spec).
SCALAR_DTYPES: dict[str, str] = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "BF16": "bf16"}


@dataclass
class ReadStats:
    """Bytes and requests a reader used (thread-safe counters); ``ranges`` = ranges asked for."""

    requests: int = 0
    bytes: int = 0
    ranges: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, requests: int, nbytes: int, ranges: int = 0) -> None:
        with self._lock:
            self.requests += requests
            self.bytes += nbytes
            self.ranges += ranges

    def to_dict(self) -> dict[str, int]:
        return {"requests": self.requests, "bytes": self.bytes, "ranges": self.ranges}


class Reader(Protocol):
    """What the audit reads through. ``label`` names the checkpoint in reports and errors."""

    label: str
    stats: ReadStats

    def where(self, name: str) -> str:
        """A printable location of file ``name`` (for error messages)."""

    def exists(self, name: str) -> bool:
        """Whether file ``name`` exists in the checkpoint."""

    def list_shards(self) -> list[str]:
        """All ``*.safetensors`` file names (used when there is no index)."""

    def read_small(self, name: str) -> bytes:
        """A whole small file (config.json, the index). Raises FileNotFoundError when absent."""

    def size(self, name: str) -> int:
        """File size in bytes."""

    def read_ranges(self, ranges: dict[str, list[tuple[int, int]]]) -> dict[str, list[bytes]]:
        """For each file, the bytes of each ``[start, end)`` range (same order). A range past the
        end of the file comes back short; callers check lengths."""


class LocalReader:
    """A checkpoint folder on disk."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.label = str(self.root)
        self.stats = ReadStats()

    def where(self, name: str) -> str:
        return str(self.root / name)

    def exists(self, name: str) -> bool:
        return (self.root / name).is_file()

    def list_shards(self) -> list[str]:
        return sorted(p.name for p in self.root.glob("*.safetensors"))

    def read_small(self, name: str) -> bytes:
        data = (self.root / name).read_bytes()
        self.stats.add(1, len(data))
        return data

    def size(self, name: str) -> int:
        try:
            return (self.root / name).stat().st_size
        except OSError as exc:
            raise CheckpointFileError(self.root / name, f"cannot read: {exc.strerror or exc}") from exc

    def read_ranges(self, ranges: dict[str, list[tuple[int, int]]]) -> dict[str, list[bytes]]:
        out: dict[str, list[bytes]] = {}
        for name, rs in ranges.items():
            path = self.root / name
            try:
                with open(path, "rb") as fh:
                    got = []
                    for a, b in rs:
                        fh.seek(a)
                        got.append(fh.read(b - a))
            except OSError as exc:
                raise CheckpointFileError(path, f"cannot read: {exc.strerror or exc}") from exc
            self.stats.add(len(rs), sum(len(g) for g in got), len(rs))
            out[name] = got
        return out


def coalesce(ranges: list[tuple[int, int]], max_gap: int) -> list[tuple[int, int, list[int]]]:
    """Merge ``[start, end)`` ranges whose gap is at most ``max_gap`` bytes.

    Returns ``(start, end, members)`` spans in file order; ``members`` are indices into ``ranges``.
    One request per span instead of per range: reading a small gap costs less than a round trip.
    """
    order = sorted(range(len(ranges)), key=lambda i: ranges[i])
    spans: list[tuple[int, int, list[int]]] = []
    for i in order:
        a, b = ranges[i]
        if spans and a - spans[-1][1] <= max_gap:
            s, e, m = spans[-1]
            spans[-1] = (s, max(e, b), m + [i])
        else:
            spans.append((a, b, [i]))
    return spans


def decode_scalar(dtype: str, raw: bytes) -> float:
    """The first element of a little-endian tensor of ``dtype`` as a Python float (NaN when the
    dtype is not a float dtype :data:`SCALAR_DTYPES` knows or the bytes are short)."""
    import numpy as np

    kind = SCALAR_DTYPES.get(dtype)
    if kind is None:
        return float("nan")
    if kind == "bf16":  # bfloat16 = the high 16 bits of a float32
        if len(raw) < 2:
            return float("nan")
        return float(np.frombuffer(b"\0\0" + raw[:2], dtype="<f4")[0])
    width = np.dtype(kind).itemsize
    if len(raw) < width:
        return float("nan")
    return float(np.frombuffer(raw[:width], dtype=kind)[0])


def is_local(reader: object) -> bool:
    """True for a :class:`LocalReader` (the audit then keeps reading scales with safetensors)."""
    return isinstance(reader, LocalReader)


def cpu_threads() -> int:
    """Worker threads for parallel HTTP reads (I/O bound, so more than the cores)."""
    return max(8, min(64, 16 * (os.cpu_count() or 1)))
