"""A local HTTP server that answers the Hub endpoints huggingface_hub 1.x calls (a test fixture).

Serves folders as repositories at fixed commits, for ``HF_ENDPOINT=http://127.0.0.1:PORT``:

- ``GET /api/models/{repo}/revision/{rev}``: ``{"id", "sha", "siblings": [{"rfilename"}]}``
  (``HfApi.repo_info``; snapshot_download's first call).
- ``GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=...``: ``[{"type": "file", "path",
  "size", "oid", "lfs"?}]`` (``HfApi.list_repo_tree``; snapshot_download's file list).
- ``HEAD|GET /{repo}/resolve/{rev}/{path}``: ``X-Repo-Commit``, ``ETag``/``X-Linked-Etag``,
  ``Content-Length``/``X-Linked-Size`` (``get_hf_file_metadata``), ``Accept-Ranges``; one-range
  ``Range: bytes=a-b`` answered 206 with ``Content-Range``.
- Errors as the Hub sends them (``X-Error-Code`` read by ``hf_raise_for_status``): RepoNotFound
  404, RevisionNotFound 404, EntryNotFound 404, GatedRepo 401 without the right bearer token.

Faults for the bad-input tests: ``cut_after`` (``{path: n}``: a response body stops after n bytes
of the file and the connection closes), ``fail_once`` (cut only the first GET of that file).
Simulation for the benchmark: ``latency_s`` per request, ``bandwidth_bps`` shared by all
responses (a token bucket), and counters of requests and body bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


class Repo:
    """A folder served as repo ``repo_id`` at commit ``sha`` (branch ``main`` and the sha itself)."""

    def __init__(self, repo_id: str, folder: Path, sha: str | None = None, *, token: str | None = None,
                 branches: tuple[str, ...] = ("main",)):
        self.repo_id, self.folder = repo_id, Path(folder)
        self.sha = sha or hashlib.sha1(repo_id.encode()).hexdigest()
        self.token = token  # gated: only this bearer token gets in
        self.revisions = {self.sha, *branches}

    def files(self) -> list[str]:
        return sorted(str(p.relative_to(self.folder)) for p in self.folder.rglob("*") if p.is_file())


class _Link:
    """Token bucket shared by all responses: ``bps`` bytes per second."""

    def __init__(self, bps: float | None):
        self.bps, self.lock, self.t = bps, threading.Lock(), time.monotonic()

    def take(self, n: int) -> None:
        if not self.bps:
            return
        with self.lock:
            now = time.monotonic()
            self.t = max(self.t, now) + n / self.bps
            wait = self.t - now
        if wait > 0:
            time.sleep(wait)


class HubServer:
    """``with HubServer([Repo(...)]) as hs: os.environ["HF_ENDPOINT"] = hs.url``."""

    def __init__(self, repos: list[Repo], *, latency_s: float = 0.0, bandwidth_bps: float | None = None,
                 cut_after: dict[str, int] | None = None, fail_once: bool = False):
        self.repos = {r.repo_id: r for r in repos}
        self.latency_s, self.link = latency_s, _Link(bandwidth_bps)
        self.cut_after, self.fail_once = dict(cut_after or {}), fail_once
        self.lock = threading.Lock()
        self.requests = 0
        self.bytes = 0
        self.log: list[tuple[str, str, str]] = []  # (method, path, range)
        self._cut_done: set[str] = set()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):
                server._handle(self, head=False)

            def do_HEAD(self):
                server._handle(self, head=True)

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address):  # a client hanging up is not news
                pass

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.request_queue_size = 256
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)

    def reset_counters(self) -> None:
        with self.lock:
            self.requests, self.bytes, self.log = 0, 0, []

    # --- request handling -------------------------------------------------------------------
    def _send(self, h, code: int, body: bytes = b"", headers: dict[str, str] | None = None, head: bool = False) -> None:
        h.send_response(code)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        if "Content-Length" not in (headers or {}):
            h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head and body:
            self.link.take(len(body))
            h.wfile.write(body)
            with self.lock:
                self.bytes += len(body)

    def _error(self, h, code: int, err: str, msg: str, head: bool) -> None:
        body = json.dumps({"error": msg}).encode()
        self._send(h, code, body, {"X-Error-Code": err, "X-Error-Message": msg,
                                   "Content-Type": "application/json"}, head)

    def _repo(self, h, repo_id: str, rev: str | None, head: bool) -> Repo | None:
        repo = self.repos.get(repo_id)
        if repo is None:
            self._error(h, 404, "RepoNotFound", "Repository not found", head)
            return None
        if repo.token is not None and h.headers.get("Authorization") != f"Bearer {repo.token}":
            self._error(h, 401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access to it "
                        "and be authenticated to access it. Please log in.", head)
            return None
        if rev is not None and unquote(rev) not in repo.revisions:
            self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
            return None
        return repo

    def _handle(self, h, head: bool) -> None:
        if self.latency_s:
            time.sleep(self.latency_s)
        url = urlparse(h.path)
        path = unquote(url.path)
        with self.lock:
            self.requests += 1
            self.log.append((h.command, path, h.headers.get("Range", "")))
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", path)
        if m:
            repo = self._repo(h, m.group(1), m.group(2), head)
            if repo:
                body = {"id": repo.repo_id, "modelId": repo.repo_id, "sha": repo.sha, "private": False,
                        "siblings": [{"rfilename": f} for f in repo.files()]}
                self._send(h, 200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head)
            return
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?", path)
        if m:
            repo = self._repo(h, m.group(1), m.group(2), head)
            if repo:
                sub = (m.group(3) or "").strip("/")
                entries = []
                for f in repo.files():
                    if sub and not f.startswith(sub + "/"):
                        continue
                    size = (repo.folder / f).stat().st_size
                    e = {"type": "file", "path": f, "size": size, "oid": self._etag(repo, f)}
                    if f.endswith(".safetensors"):
                        e["lfs"] = {"oid": self._etag(repo, f), "size": size, "pointerSize": 134}
                    entries.append(e)
                self._send(h, 200, json.dumps(entries).encode(), {"Content-Type": "application/json"}, head)
            return
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if not m:
            self._error(h, 404, "EntryNotFound", f"no route {path}", head)
            return
        repo = self._repo(h, m.group(1), m.group(2), head)
        if not repo:
            return
        rel = m.group(3)
        f = repo.folder / rel
        if not f.is_file():
            self._error(h, 404, "EntryNotFound", f"{rel} does not exist on {m.group(2)}", head)
            return
        self._serve_file(h, repo, rel, f, head)

    @staticmethod
    def _etag(repo: Repo, rel: str) -> str:
        st = (repo.folder / rel).stat()
        return hashlib.sha256(f"{repo.sha}/{rel}/{st.st_size}/{st.st_mtime_ns}".encode()).hexdigest()

    def _serve_file(self, h, repo: Repo, rel: str, f: Path, head: bool) -> None:
        size = f.stat().st_size
        etag = self._etag(repo, rel)
        base = {"X-Repo-Commit": repo.sha, "ETag": f'"{etag}"', "Accept-Ranges": "bytes",
                "Content-Type": "application/octet-stream"}
        if f.suffix == ".safetensors":
            base.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(size)})
        rng = h.headers.get("Range")
        a, b, code = 0, size - 1, 200
        if rng:
            mm = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip())
            if not mm or "," in rng:
                self._send(h, 416, b"", {**base, "Content-Range": f"bytes */{size}"}, head)
                return
            if mm.group(1):
                a = int(mm.group(1))
                b = min(int(mm.group(2)), size - 1) if mm.group(2) else size - 1
            else:  # suffix range
                a, b = max(0, size - int(mm.group(2))), size - 1
            if a >= size:
                self._send(h, 416, b"", {**base, "Content-Range": f"bytes */{size}"}, head)
                return
            code = 206
            base["Content-Range"] = f"bytes {a}-{b}/{size}"
        n = b - a + 1
        h.send_response(code)
        for k, v in base.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(n))
        h.end_headers()
        if head:
            return
        cut = self.cut_after.get(rel)
        if cut is not None and self.fail_once:
            with self.lock:
                if rel in self._cut_done:
                    cut = None
                else:
                    self._cut_done.add(rel)
        end = b + 1 if cut is None else min(b + 1, max(a, cut))
        with open(f, "rb") as fh:
            fh.seek(a)
            pos = a
            while pos < end:
                chunk = fh.read(min(1 << 20, end - pos))
                if not chunk:
                    break
                self.link.take(len(chunk))
                h.wfile.write(chunk)
                pos += len(chunk)
        with self.lock:
            self.bytes += pos - a
        if end < b + 1:  # the fault: stop mid-body and drop the connection
            h.wfile.flush()
            h.close_connection = True
            try:
                import socket

                h.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
