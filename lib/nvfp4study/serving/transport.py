"""One HTTP session factory for everything that talks to a server (client requests, health polls).

Kept apart from :mod:`.client` so that :mod:`.process` can poll ``/health_generate`` without
importing the client, which itself asks :mod:`.process` for a server's log tail.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def _ssl() -> ssl.SSLContext:
    """One SSL context for every client (building one per request costs ~40 ms)."""
    return ssl.create_default_context()


def http(timeout: float | httpx.Timeout) -> httpx.Client:
    """An ``httpx.Client`` with ``timeout`` (seconds, or an ``httpx.Timeout``) and a shared SSL context."""
    return httpx.Client(timeout=timeout, verify=_ssl())
