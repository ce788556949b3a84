"""``audit-checkpoint hf:REPO[@REV]``: open a Hub revision for the audit, online or from the cache.

Online, a :class:`~.remote.HubReader` reads config, index, shard headers and the ``[1]`` scales
by range requests (no weights). With ``HF_HUB_OFFLINE=1`` the revision's snapshot folder in the
local Hugging Face cache is audited as a local folder; huggingface_hub links only complete files
into ``snapshots/{commit}/`` (a download cut half-way stays a ``.incomplete`` blob), so a partial
shard is reported missing (IndexShardMissing), never audited as complete.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core import hub
from ..core.errors import HubNotCached
from .reader import LocalReader, Reader

HUB_PREFIX = "hf:"


def is_hub_spec(target: str) -> bool:
    """True for ``hf:OWNER/NAME[@REV]``."""
    return target.startswith(HUB_PREFIX)


def snapshot_folder(ref: hub.HubRef, commit: str) -> Path:
    """``{cache}/models--OWNER--NAME/snapshots/{commit}`` (huggingface_hub's cache layout,
    ``file_download.py`` ``repo_folder_name``)."""
    return hub.cache_dir() / f"models--{ref.repo_id.replace('/', '--')}" / "snapshots" / commit


def open_target(target: str, *, token: str | None = None) -> tuple[Path, Reader | None, dict[str, Any]]:
    """``(path, reader, source)`` for :func:`~.audit.audit_checkpoint`.

    ``source`` says what was opened: ``{"kind": "folder"|"hub"|"cache", "repo_id", "revision",
    "commit"}``. A plain path gives ``reader=None``.

    Raises:
        HubError subclasses (404, 401/403, no network, offline and not cached).
    """
    if not is_hub_spec(target):
        return Path(target), None, {"kind": "folder", "path": target}
    ref = hub.HubRef.parse(target)
    if hub.offline():
        commit = hub.resolve_commit(ref, token)
        folder = snapshot_folder(ref, commit)
        if not (folder / "config.json").is_file():
            raise HubNotCached(f"{ref}: HF_HUB_OFFLINE=1 and the cache {hub.cache_dir()} holds no files of commit "
                               f"{commit}: download it with network first (snapshot_download), or unset "
                               "HF_HUB_OFFLINE to audit it remotely by range requests")
        return folder, LocalReader(folder), {"kind": "cache", "repo_id": ref.repo_id, "revision": ref.revision,
                                             "commit": commit, "path": str(folder)}
    from .remote import HubReader

    reader = HubReader(ref, token=token)
    return Path(reader.label), reader, {"kind": "hub", "repo_id": ref.repo_id, "revision": ref.revision,
                                        "commit": reader.commit, "endpoint": hub.endpoint()}


def traffic_line(reader: Reader | None, report_bytes: int) -> str:
    """``fetched B bytes in R requests (x % of the checkpoint's N bytes)`` for a reader."""
    if reader is None:
        return ""
    st = reader.stats
    share = 100.0 * st.bytes / report_bytes if report_bytes else 0.0
    return (f"fetched {st.bytes} bytes in {st.requests} requests ({st.ranges} ranges; {share:.4f} % of the "
            f"checkpoint's {report_bytes} bytes)")
