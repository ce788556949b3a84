"""Read a Hub checkpoint without downloading its weights: HTTP Range requests on resolve URLs.

:class:`HubReader` is the :class:`~.reader.Reader` of a repository at one commit. It lists the
files and their sizes with one tree call (``HfApi.list_repo_tree``, ``GET /api/models/{repo}/
tree/{commit}?recursive=true``), fetches small files whole and everything else as byte ranges of
``{endpoint}/{repo}/resolve/{commit}/{file}`` (``huggingface_hub.hf_hub_url``) with the shared
``huggingface_hub`` HTTP client (``get_session``, redirects followed to the CDN) and its auth
headers (``build_hf_headers``: ``HF_TOKEN`` or the stored login).

Range reads are coalesced (ranges closer than ``max_gap`` bytes become one request) and run in
parallel; the real NVFP4 checkpoint's ``[1]`` scales sit between the weights (about one span per
expert projection), so parallelism, not merging, is what bounds the time. A response that is not
``206`` for the asked span, or that ends early, is never taken as the data: an early end gives a
short read (the header reader then raises ShardTruncated), a wrong status a HubRangeError.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..core import hub
from ..core.errors import HubError, HubFileNotFound, HubRangeError
from .reader import ReadStats, coalesce, cpu_threads, decode_scalar

#: ranges closer than this many bytes are read as one request (64 KiB: ~5 ms at 100 Mbit/s, less
#: than a 50 ms round trip even shared by many parallel requests).
MAX_GAP = 64 * 1024
#: retries of a request whose connection failed before any byte came back (0.2, 0.4, 0.8 s apart).
RETRIES = 3


class HubReader:
    """A Hub repository at one commit, read by ranges. ``stats`` counts requests and bytes.

    Args:
        ref: repo and revision (a branch or tag is resolved to its commit first).
        token: a Hub token (None: ``HF_TOKEN`` or the stored login).
        workers: parallel requests (default :func:`~.reader.cpu_threads`).
        max_gap: coalescing gap in bytes.

    Raises:
        the errors of :func:`nvfp4study.core.hub.resolve_commit` (404, 401/403, no network).
    """

    def __init__(self, ref: hub.HubRef, *, token: str | None = None, workers: int | None = None,
                 max_gap: int = MAX_GAP):
        self.stats = ReadStats()
        self.ref = ref
        self.token = token
        self.commit = hub.resolve_commit(ref, token)
        self.stats.add(1, 0)
        self.pinned = hub.HubRef(ref.repo_id, self.commit)
        self.label = f"hf:{ref.repo_id}@{self.commit}"
        self.workers = workers or cpu_threads()
        self.max_gap = max_gap
        self._endpoint = hub.endpoint()
        self._client: Any = None
        self._client_lock = threading.Lock()
        entries = hub.call(ref, lambda: list(hub.api().list_repo_tree(
            ref.repo_id, revision=self.commit, recursive=True, token=token)), "file list")
        self.stats.add(1, 0)
        self.sizes: dict[str, int] = {e.path: int(e.size) for e in entries if getattr(e, "size", None) is not None
                                      and type(e).__name__ == "RepoFile"}

    # --- Reader interface ----------------------------------------------------------------
    def where(self, name: str) -> str:
        return f"{self.label}/{name}"

    def exists(self, name: str) -> bool:
        return name in self.sizes

    def list_shards(self) -> list[str]:
        return sorted(n for n in self.sizes if n.endswith(".safetensors") and "/" not in n)

    def size(self, name: str) -> int:
        if name not in self.sizes:
            raise HubFileNotFound(f"{self.where(name)}: not in the repository at this commit")
        return self.sizes[name]

    def read_small(self, name: str) -> bytes:
        if name not in self.sizes:
            raise FileNotFoundError(self.where(name))
        return self._get(name, None)

    def read_ranges(self, ranges: dict[str, list[tuple[int, int]]]) -> dict[str, list[bytes]]:
        jobs: list[tuple[str, int, int, list[int]]] = []
        for name, rs in ranges.items():
            for a, b, members in coalesce(rs, self.max_gap):
                jobs.append((name, a, b, members))
        if len(jobs) == 1:
            blobs = [self._get(jobs[0][0], (jobs[0][1], jobs[0][2]))]
        else:
            with ThreadPoolExecutor(min(self.workers, len(jobs))) as pool:
                blobs = list(pool.map(lambda j: self._get(j[0], (j[1], j[2])), jobs))
        out = {name: [b""] * len(rs) for name, rs in ranges.items()}
        for (name, a, _b, members), blob in zip(jobs, blobs, strict=True):
            for i in members:
                s, e = ranges[name][i]
                out[name][i] = blob[s - a:e - a]
        with self.stats._lock:
            self.stats.ranges += sum(len(rs) for rs in ranges.values())
        return out

    def read_scalars(self, headers: Any, names: list[str]) -> dict[str, float]:
        """:func:`read_scalars_remote` (``headers`` is the :class:`~.header.CheckpointHeaders`)."""
        return read_scalars_remote(headers, names)

    # --- HTTP -------------------------------------------------------------------------------
    def _session(self) -> Any:
        """One ``httpx.Client`` for this reader whose keep-alive pool holds a connection per worker.
        huggingface_hub's shared client (``utils/_http.py`` ``default_client_factory``) uses httpx's
        default ``Limits`` (20 keep-alive connections), so with more workers every request beyond
        20 in flight opened a new TCP (and, on the Hub, TLS) connection: 1-3 extra round trips each."""
        import httpx

        with self._client_lock:
            if self._client is None:
                self._client = httpx.Client(follow_redirects=True, timeout=60, limits=httpx.Limits(
                    max_connections=self.workers, max_keepalive_connections=self.workers))
            return self._client

    def close(self) -> None:
        """Close this reader's connections (also done when it is garbage-collected)."""
        with self._client_lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def _get(self, name: str, span: tuple[int, int] | None) -> bytes:
        """GET a file (``span`` None) or the bytes ``[a, b)`` of it; a body cut short comes back short."""
        import httpx
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

        url = hf_hub_url(self.ref.repo_id, name, revision=self.commit, endpoint=self._endpoint)
        headers = build_hf_headers(token=self.token)
        headers["Accept-Encoding"] = "identity"  # byte offsets are of the stored file
        if span is not None:
            if span[1] <= span[0]:
                return b""
            headers["Range"] = f"bytes={span[0]}-{span[1] - 1}"
        for attempt in range(RETRIES + 1):
            chunks: list[bytes] = []
            try:
                with self._session().stream("GET", url, headers=headers) as r:
                    if r.status_code >= 400:
                        r.read()
                        hf_raise_for_status(r)
                    if span is not None and r.status_code != 206:
                        raise HubRangeError(f"{self.where(name)}: asked for bytes {span[0]}-{span[1] - 1}, the "
                                            f"server answered HTTP {r.status_code} (it must support Range requests: 206)")
                    try:
                        for c in r.iter_bytes():
                            chunks.append(c)
                    except (httpx.RemoteProtocolError, httpx.ReadError):
                        if not chunks and attempt < RETRIES:
                            raise
                        # the body ended early: a short read, checked by the caller
                break
            except HubError:
                raise
            except httpx.TransportError as exc:  # reset / refused connection: retry, then give up named
                self.stats.add(1, 0)
                if attempt == RETRIES:
                    raise hub.translate(exc, self.pinned, name) from None
                time.sleep(0.2 * 2 ** attempt)
            except Exception as exc:  # huggingface_hub HTTP errors become named ones
                raise hub.translate(exc, self.pinned, name) from None
        data = b"".join(chunks)
        self.stats.add(1, len(data))
        return data


def read_scalars_remote(headers: Any, names: list[str]) -> dict[str, float]:
    """:func:`~.header.read_scalars` over a remote reader: the scales' byte ranges, coalesced and
    fetched in parallel, decoded little-endian. Tensors with more than one element map to NaN.

    Raises:
        HubRangeError: a scale came back short (the shard is cut on the server).
    """
    reader: Any = headers.reader
    by_shard: dict[str, list[tuple[str, int, int]]] = {}
    for n in names:
        t = headers.tensors[n]
        start = headers.shards[t.shard].data_start + t.start
        by_shard.setdefault(t.shard, []).append((n, start, start + t.nbytes))
    got = reader.read_ranges({s: [(a, b) for _, a, b in v] for s, v in by_shard.items()})
    out: dict[str, float] = {}
    for shard, items in by_shard.items():
        for (n, a, b), raw in zip(items, got[shard], strict=True):
            if len(raw) != b - a:
                raise HubRangeError(f"{reader.where(shard)}: tensor {n!r}: {len(raw)} of {b - a} bytes came back")
            t = headers.tensors[n]
            out[n] = decode_scalar(t.dtype, raw) if t.numel == 1 else float("nan")
    return out
