"""Read safetensors headers (and the hub index) without touching tensor data.

A safetensors file is ``u64 little-endian N`` + ``N`` bytes of UTF-8 JSON + the data section.
The JSON maps each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` with
offsets relative to the data section; ``"__metadata__"`` holds string pairs. (Format:
safetensors' README, "Format" section; dtype names as in ``safetensors/torch.py`` ``_TYPES``
and the Rust ``Dtype`` enum of safetensors 0.8.)

Reading only the header makes a 76 GB checkpoint with about 245k tensors an I/O of a few MB.
Every problem raises a named :class:`~nvfp4study.core.errors.CheckpointFileError` that names the file.
"""

from __future__ import annotations

import os
import struct
from collections import defaultdict
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..core.errors import (
    CheckpointFileError,
    HeaderJSONInvalid,
    HeaderLengthBeyondFile,
    HeaderTooLarge,
    IndexShardMissing,
    IndexTensorMissing,
    ShardTruncated,
)
from .validate import (
    DTYPE_BITS,
    MAX_HEADER_BYTES,
    header_entries,
    index_weight_map,
    parse_header_bytes,
)

if TYPE_CHECKING:
    from .reader import Reader

INDEX_FILE = "model.safetensors.index.json"
__all__ = ["DTYPE_BITS", "INDEX_FILE", "CheckpointHeaders", "ShardHeader", "TensorHeader", "file_size_on_disk",
           "read_checkpoint_headers", "read_scalars", "read_shard_header", "shard_data_offset"]


class TensorHeader(NamedTuple):
    """One tensor's header entry.

    ``start``/``end`` are byte offsets into the shard's data section (which begins at
    ``8 + header_len``); ``shard`` is the shard's file name.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int
    shard: str

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def numel(self) -> int:
        return prod(self.shape)


@dataclass
class ShardHeader:
    """A parsed shard header: file size, header length, metadata and tensors by name."""

    path: Path
    file_size: int
    header_len: int
    metadata: dict[str, str]
    tensors: dict[str, TensorHeader]
    data_complete: bool = True  # False: the data section is absent (a header-only layout)

    @property
    def data_start(self) -> int:
        return 8 + self.header_len


def read_shard_header(path: str | Path, *, allow_missing_data: bool = False) -> ShardHeader:
    """Parse one shard's header and check it against the file size.

    Args:
        path: a ``.safetensors`` file.
        allow_missing_data: accept a file whose data section is shorter than the offsets
            (a header-only layout, e.g. the audit benchmark's); ``data_complete`` is then False.

    Returns:
        The :class:`ShardHeader`.

    Raises:
        ShardTruncated: fewer than 8 bytes, or data ending before the last tensor's end offset.
        HeaderLengthBeyondFile: the header length exceeds the file size minus 8.
        HeaderJSONInvalid: not UTF-8 JSON, not an object, a malformed entry (wrong types), offsets
            that do not match dtype x shape, or overlapping tensors; its subclasses HeaderTooLarge /
            HeaderTooDeep for a header over the size or nesting bound (checked before parsing).
        UnknownDtype: a dtype not in :data:`DTYPE_BITS`.
        (Field checks: :func:`nvfp4study.checkpoint.validate.header_entries`.)
    """
    from .reader import LocalReader

    path = Path(path)
    return read_shard_header_from(LocalReader(path.parent), path.name, allow_missing_data=allow_missing_data)


def read_shard_header_from(reader: Reader, name: str, *, allow_missing_data: bool = False) -> ShardHeader:
    """:func:`read_shard_header` of file ``name`` through a :class:`~.reader.Reader` (local or
    remote): two reads, the 8-byte length then the JSON header. Same errors; a read that returns
    fewer bytes than the file size promises (a server cutting the header) is ShardTruncated."""
    path = Path(reader.where(name))
    size = reader.size(name)
    head = reader.read_ranges({name: [(0, 8)]})[name][0]
    if len(head) < 8:
        raise ShardTruncated(path, f"file is {size} bytes, shorter than the 8-byte header length"
                             if size < 8 else f"only {len(head)} of the 8 header-length bytes could be read")
    (n,) = struct.unpack("<Q", head)
    if n > size - 8:
        raise HeaderLengthBeyondFile(
            path, f"header length {n} bytes but only {size - 8} bytes follow the length field"
        )
    if n > MAX_HEADER_BYTES:  # refused before reading it (safetensors' own limit)
        raise HeaderTooLarge(path, f"header length {n} bytes, over the {MAX_HEADER_BYTES}-byte limit")
    raw = reader.read_ranges({name: [(8, 8 + n)]})[name][0]
    if len(raw) < n:
        raise ShardTruncated(path, f"header is {n} bytes but only {len(raw)} could be read (cut short)")
    shard = name
    metadata, tensors = header_entries(path, parse_header_bytes(path, raw),
                                       lambda name, dt, shape, a, b: TensorHeader(name, dt, shape, a, b, shard))
    data_end = _check_overlaps(path, tensors)
    have = size - 8 - n
    complete = have >= data_end
    if not complete and not allow_missing_data:
        last = max(tensors.values(), key=lambda t: t.end).name
        raise ShardTruncated(
            path, f"data section is {have} bytes but tensor {last!r} ends at byte {data_end} of it"
        )
    return ShardHeader(path, size, n, metadata, tensors, complete)


def _check_overlaps(path: Path, tensors: dict[str, TensorHeader]) -> int:
    """Raise HeaderJSONInvalid when two tensors' data overlap; return the data section's end."""
    if not tensors:
        return 0
    import numpy as np

    ts = list(tensors.values())
    starts = np.fromiter((t.start for t in ts), dtype=np.int64, count=len(ts))
    ends = np.fromiter((t.end for t in ts), dtype=np.int64, count=len(ts))
    order = np.lexsort((ends, starts))
    s, e = starts[order], ends[order]
    bad = np.nonzero(s[1:] < np.maximum.accumulate(e)[:-1])[0]
    if bad.size:
        a, b = ts[order[bad[0]]], ts[order[bad[0] + 1]]
        raise HeaderJSONInvalid(path, f"tensor {b.name!r} overlaps {a.name!r} in the data section")
    return int(e.max())


@dataclass
class CheckpointHeaders:
    """All shard headers of a checkpoint folder, plus what the index says.

    ``tensors`` maps each name to the header entry of the shard it was found in (first shard in
    file-name order when a name occurs twice; ``duplicates`` lists such names with all shards).
    ``unlisted`` are tensors present in a shard but absent from the index's ``weight_map``.
    """

    root: Path
    shards: dict[str, ShardHeader]
    tensors: dict[str, TensorHeader]
    index: dict | None = None
    duplicates: dict[str, list[str]] = field(default_factory=dict)
    unlisted: list[str] = field(default_factory=list)
    reader: Any = None  # the Reader the headers came through (None: read from ``root``)

    @property
    def file_bytes(self) -> int:
        """Sum of the shard files' sizes (bytes)."""
        return sum(s.file_size for s in self.shards.values())

    @property
    def data_bytes(self) -> int:
        """Sum of the tensors' data sizes from the headers (bytes)."""
        return sum(t.nbytes for t in self.tensors.values())

    @property
    def data_complete(self) -> bool:
        return all(s.data_complete for s in self.shards.values())


def read_checkpoint_headers(root: str | Path, *, allow_missing_data: bool = False,
                            reader: Reader | None = None) -> CheckpointHeaders:
    """Read the index (when present) and every shard header of a checkpoint folder.

    With ``model.safetensors.index.json`` the shards are the files its ``weight_map`` names;
    without it, every ``*.safetensors`` file in the folder. ``reader`` (default: a
    :class:`~.reader.LocalReader` of ``root``) says where the bytes come from; a remote reader's
    shard headers are read in parallel.

    Raises:
        CheckpointFileError: not a folder, no shard at all, an unreadable index.
        IndexInvalid: an index that is not JSON or has fields of the wrong type.
        IndexShardMissing: the index names a shard file that does not exist.
        IndexTensorMissing: the index maps a tensor to a shard whose header lacks it.
        and every error of :func:`read_shard_header`.
    """
    from .reader import LocalReader, cpu_threads, is_local

    root = Path(root)
    if reader is None:
        if not root.is_dir():
            raise CheckpointFileError(root, "not a checkpoint folder")
        reader = LocalReader(root)
    index_path = Path(reader.where(INDEX_FILE))
    index = None
    if reader.exists(INDEX_FILE):
        try:
            raw = reader.read_small(INDEX_FILE)
        except OSError as exc:
            raise CheckpointFileError(index_path, f"cannot read: {exc.strerror or exc}") from None
        index, weight_map = index_weight_map(index_path, raw)
        names = sorted(set(weight_map.values()))
        for shard in names:
            if not reader.exists(shard):
                users = sum(1 for v in weight_map.values() if v == shard)
                raise IndexShardMissing(index_path, f"names shard {shard!r} ({users} tensors), which is not in {reader.label}")
    else:
        weight_map = None
        names = reader.list_shards()
    if not names:
        raise CheckpointFileError(root, "no .safetensors files and no index")
    if is_local(reader) or len(names) == 1:
        shards = {n: read_shard_header_from(reader, n, allow_missing_data=allow_missing_data) for n in names}
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(len(names), cpu_threads())) as pool:
            got = list(pool.map(lambda n: read_shard_header_from(reader, n, allow_missing_data=allow_missing_data), names))
        shards = dict(zip(names, got, strict=True))
    tensors: dict[str, TensorHeader] = {}
    duplicates: dict[str, list[str]] = {}
    for n in names:
        for name, t in shards[n].tensors.items():
            if name in tensors:
                duplicates.setdefault(name, [tensors[name].shard]).append(n)
            else:
                tensors[name] = t
    unlisted: list[str] = []
    if weight_map is not None:
        for name, shard in weight_map.items():
            if name not in shards[shard].tensors:
                raise IndexTensorMissing(index_path, f"maps tensor {name!r} to {shard!r}, whose header does not contain it")
        unlisted = sorted(set(tensors) - set(weight_map))
    return CheckpointHeaders(root, shards, tensors, index, duplicates, unlisted, reader)


def shard_data_offset(shards: dict[str, ShardHeader], t: TensorHeader) -> int:
    """Absolute byte offset of tensor ``t`` in its shard file."""
    return shards[t.shard].data_start + t.start


def file_size_on_disk(path: Path) -> int:
    """Allocated bytes of a file (``st_blocks * 512``): less than its size when sparse."""
    return os.stat(path).st_blocks * 512


def read_scalars(headers: CheckpointHeaders, names: list[str]) -> dict[str, float]:
    """Values of single-element tensors, read with ``safetensors.safe_open`` (numpy), one open per
    shard. Tensors with more than one element map to NaN (their layout is reported separately).

    Raises:
        CheckpointFileError: safetensors cannot open a shard (names it).
    """
    from math import nan

    from safetensors import safe_open

    from .reader import is_local

    if headers.reader is not None and not is_local(headers.reader):
        return headers.reader.read_scalars(headers, names)  # e.g. remote.HubReader: coalesced ranges
    by_shard: dict[str, list[str]] = defaultdict(list)
    for n in names:
        by_shard[headers.tensors[n].shard].append(n)
    out: dict[str, float] = {}
    for shard, ns in by_shard.items():
        path = headers.root / shard
        try:
            with safe_open(str(path), framework="numpy") as fh:
                for n in ns:
                    a = fh.get_tensor(n)
                    out[n] = a.item() if a.size == 1 else nan
        except Exception as exc:  # safetensors raises its own SafetensorError / OSError
            raise CheckpointFileError(path, f"safetensors cannot read scales: {exc}") from exc
    return out
