"""The Hugging Face Hub through ``huggingface_hub``: repo references, revisions, downloads, errors.

A Hub source is ``repo_id`` + ``revision``; a branch or tag is resolved to its commit (``HfApi.
repo_info(...).sha``, which reads ``GET {endpoint}/api/models/{repo}/revision/{rev}``,
huggingface_hub ``hf_api.py`` ``repo_info``/``model_info``) and the commit is what a manifest
records and a re-run reuses. Downloads are ``snapshot_download`` (its cache, ``.incomplete``
blobs resumed with a Range request, a tqdm bar; ``_snapshot_download.py``). Only complete files
are linked into ``snapshots/{commit}/`` (``file_download.py`` ``_download_to_tmp_and_move``), so a
half-downloaded shard is never seen as part of a snapshot.

The environment is read at call time, not at import (huggingface_hub's ``constants`` are frozen
when it is imported): ``HF_ENDPOINT`` (default https://huggingface.co), ``HF_HUB_CACHE`` (else
``HF_HOME/hub``, else ``~/.cache/huggingface/hub``), ``HF_HUB_OFFLINE`` and ``HF_TOKEN`` (or the
token ``hf auth login`` stored). Every failure becomes a :class:`~.errors.HubError` subclass whose
message says what to do.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .errors import (
    HubAccessDenied,
    HubError,
    HubFileNotFound,
    HubNotCached,
    HubRepoNotFound,
    HubRevisionNotFound,
    HubUnreachable,
)

DEFAULT_ENDPOINT = "https://huggingface.co"
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
LOGIN_HINT = ("log in with `hf auth login` (or `huggingface-cli login`) or set HF_TOKEN to a token "
              "that has access; for a gated repo, accept its terms on the repo page first")
T = TypeVar("T")


def endpoint() -> str:
    """``HF_ENDPOINT`` now (no trailing slash), else the public Hub."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def offline() -> bool:
    """``HF_HUB_OFFLINE`` is set to a true value (1, true, yes, on), as huggingface_hub reads it."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def cache_dir() -> Path:
    """The Hub cache folder huggingface_hub would use with the environment as it is now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


@dataclass(frozen=True)
class HubRef:
    """A repository at a revision. ``revision`` is what the user gave (branch, tag or commit)."""

    repo_id: str
    revision: str = "main"

    @classmethod
    def parse(cls, text: str) -> HubRef:
        """``hf:OWNER/NAME[@REV]`` (the ``hf:`` prefix optional).

        Raises:
            HubError: not of that form.
        """
        body = text[3:] if text.startswith("hf:") else text
        repo, _, rev = body.partition("@")
        if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", repo):
            raise HubError(f"{text!r} is not a Hub reference: write hf:OWNER/NAME or hf:OWNER/NAME@REVISION")
        return cls(repo, rev or "main")

    def __str__(self) -> str:
        return f"hf:{self.repo_id}@{self.revision}"


def translate(exc: BaseException, ref: HubRef, what: str = "") -> HubError:
    """Map a huggingface_hub / httpx exception to the study's named error (message says what to do)."""
    import httpx
    from huggingface_hub import errors as he

    where = f"{ref.repo_id}@{ref.revision}" + (f" ({what})" if what else "")
    ep = endpoint()
    if isinstance(exc, HubError):
        return exc
    if isinstance(exc, he.GatedRepoError):
        return HubAccessDenied(f"{where}: gated repository at {ep}: {LOGIN_HINT}")
    if isinstance(exc, he.RevisionNotFoundError):
        return HubRevisionNotFound(f"{where}: revision {ref.revision!r} does not exist in {ref.repo_id} at {ep}")
    if isinstance(exc, he.RepositoryNotFoundError):
        return HubRepoNotFound(f"{where}: repository {ref.repo_id!r} not found at {ep} (check the name; "
                               f"if it is private, {LOGIN_HINT})")
    if isinstance(exc, he.RemoteEntryNotFoundError):
        return HubFileNotFound(f"{where}: file not in the repository at this revision")
    if isinstance(exc, he.HfHubHTTPError):
        code = getattr(getattr(exc, "response", None), "status_code", None)
        if code in (401, 403):
            return HubAccessDenied(f"{where}: HTTP {code} from {ep}: {LOGIN_HINT}")
        return HubError(f"{where}: HTTP {code} from {ep}: {str(exc).splitlines()[0]}")
    if isinstance(exc, (he.OfflineModeIsEnabled, he.LocalEntryNotFoundError)) and offline():
        return HubNotCached(f"{where}: HF_HUB_OFFLINE=1 and not in the cache {cache_dir()}: run once with "
                            f"network (unset HF_HUB_OFFLINE) to populate it, or set HF_HUB_CACHE to a populated cache")
    if isinstance(exc, (httpx.TransportError, ConnectionError, he.LocalEntryNotFoundError)):
        return HubUnreachable(f"{where}: cannot reach HF_ENDPOINT={ep} ({type(exc).__name__}): check the "
                              f"network or HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use the local cache {cache_dir()}")
    return HubError(f"{where}: {type(exc).__name__}: {exc}")


#: the files a checkpoint on the Hub is downloaded with: weights, config, tokenizer and custom
#: modelling code (what the quantizer reads of a BF16 source and SGLang of the card's checkpoint)
CHECKPOINT_PATTERNS = ["*.json", "*.safetensors", "*.py", "*.txt", "*.model", "*.tiktoken"]


def call(ref: HubRef, fn: Callable[[], T], what: str = "") -> T:
    """Run ``fn`` (a huggingface_hub call), translating its failures with :func:`translate`."""
    try:
        return fn()
    except HubError:
        raise
    except Exception as exc:  # huggingface_hub raises many types; all are translated to named ones
        raise translate(exc, ref, what) from None


def api() -> Any:
    """An ``HfApi`` on the current ``HF_ENDPOINT``."""
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint())


def resolve_commit(ref: HubRef, token: str | None = None) -> str:
    """The 40-hex commit a branch/tag/commit names. Offline: the cache's ``refs/{revision}``
    (written by huggingface_hub on download; ``file_download.py`` ``_cache_commit_hash_for_specific_revision``).

    Raises:
        HubRepoNotFound, HubRevisionNotFound, HubAccessDenied, HubUnreachable, HubNotCached.
    """
    if offline():
        if COMMIT_RE.match(ref.revision):
            return ref.revision
        refs = cache_dir() / f"models--{ref.repo_id.replace('/', '--')}" / "refs" / ref.revision
        if refs.is_file():
            return refs.read_text().strip()
        raise HubNotCached(f"{ref}: HF_HUB_OFFLINE=1 and the cache {cache_dir()} has no ref {ref.revision!r} "
                           "for this repo: run once with network to populate it")
    info = call(ref, lambda: api().repo_info(ref.repo_id, revision=ref.revision, token=token), "revision info")
    if not info.sha:
        raise HubError(f"{ref}: the Hub's revision info carries no commit sha")
    return str(info.sha)


def download(ref: HubRef, allow_patterns: list[str] | None = None, token: str | None = None) -> tuple[Path, str]:
    """``snapshot_download`` of the files matching ``allow_patterns`` (all when None) into the cache.

    Resumable (an interrupted file continues from its ``.incomplete`` blob), offline from the cache
    when ``HF_HUB_OFFLINE=1``. Returns ``(snapshot folder, commit)``.

    Raises:
        the errors of :func:`resolve_commit`; HubNotCached when offline and a file is absent.
    """
    from huggingface_hub import snapshot_download

    if offline():
        resolve_commit(ref, token)  # a named HubNotCached before huggingface_hub's generic error
    # snapshot_download resolves the revision itself and records refs/{revision} in the cache,
    # which is what a later offline run reads; the snapshot folder is named by the commit.
    folder = Path(call(ref, lambda: snapshot_download(
        ref.repo_id, revision=ref.revision, allow_patterns=allow_patterns, cache_dir=str(cache_dir()),
        token=token, endpoint=endpoint(), local_files_only=offline()), "download"))
    return folder, folder.name


def snapshot_bytes(ref: HubRef, allow_patterns: list[str] | None = None, token: str | None = None) -> int:
    """Bytes :func:`download` would fetch for ``ref``: the ``size`` of every file of the repo at
    the revision (``HfApi.list_repo_tree``, recursive) that ``allow_patterns`` selects, with the
    rule ``snapshot_download`` itself applies (``huggingface_hub.utils.filter_repo_objects``).

    Raises:
        HubRepoNotFound, HubRevisionNotFound, HubAccessDenied, HubUnreachable.
    """
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils import filter_repo_objects

    entries = call(ref, lambda: list(api().list_repo_tree(ref.repo_id, revision=ref.revision, recursive=True,
                                                           token=token)), "file list")
    files = {e.path: e.size for e in entries if isinstance(e, RepoFile)}
    return sum(files[f] for f in filter_repo_objects(list(files), allow_patterns=allow_patterns))
