"""The serving axes and record states as named values, shared by params and every wing.

- :class:`Engine` (``server.engine``) and :class:`LauncherKind` (``server.launcher``): the two axes of
  how a server runs. :data:`SUPPORTED` lists the pairs the study can run; params refuse any other
  (:class:`~nvfp4study.core.errors.ParamsError`). What each pair does differently lives in one
  strategy per pair (:mod:`nvfp4study.serving.strategies`, whose registry has exactly these keys).
- :class:`RequestStatus`: the ``status`` of one raw request record
  (:func:`nvfp4study.serving.client.chat_completion`).

All are ``StrEnum``: a member equals, hashes and JSON-encodes as its string value, so files and
params keep their text form.
"""

from __future__ import annotations

from enum import StrEnum


class Engine(StrEnum):
    """``server.engine``: where SGLang computes."""

    GPU = "gpu"  # the card's NVFP4 checkpoint on an NVFP4-capable GPU
    CPU = "cpu"  # SGLang's real engine on this CPU, serving the stand-in (serving/cpu_engine)


class LauncherKind(StrEnum):
    """``server.launcher``: how the server process is started."""

    LOCAL = "local"  # ``server.python`` as a local process group
    DOCKER = "docker"  # ``server.docker.image`` in a container


#: the (engine, launcher) pairs the study runs. The CPU engine needs the run's patched overlay of
#: a local install and its own environment (serving/cpu_engine), which no published image holds.
SUPPORTED: frozenset[tuple[Engine, LauncherKind]] = frozenset({
    (Engine.GPU, LauncherKind.LOCAL), (Engine.GPU, LauncherKind.DOCKER), (Engine.CPU, LauncherKind.LOCAL)})


def unsupported_pair(engine: Engine, launcher: LauncherKind) -> str | None:
    """Why ``(engine, launcher)`` cannot run (a sentence naming both keys), or None when it can."""
    if (Engine(engine), LauncherKind(launcher)) in SUPPORTED:
        return None
    ok = ", ".join(f"{e}+{la}" for e, la in sorted(SUPPORTED))
    return (f"server.engine {engine} cannot run with server.launcher {launcher} "
            f"(supported engine+launcher pairs: {ok})")


class RequestStatus(StrEnum):
    """``status`` of a raw request record: "ok" or how the request failed."""

    OK = "ok"
    HTTP_ERROR = "http_error"  # the server answered with a status other than 200
    ERROR_CHUNK = "error_chunk"  # the stream carried an error object
    STREAM_CUT = "stream_cut"  # the stream ended early or held an unparsable chunk
    MISSING_FIELDS = "missing_fields"  # the answer lacks fields the study reads
    TIMEOUT = "timeout"  # no data within server.request_timeout_s
    CONNECTION_ERROR = "connection_error"  # the server could not be reached
