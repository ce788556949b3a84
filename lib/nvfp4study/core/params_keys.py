"""Which params keys change results: the operational keys a continued run may change, and the
comparison the runner makes when a run folder is continued.

:meth:`nvfp4study.core.params.Params.digest` hashes every key but these; ``nvfp4study run --from
NN --run-dir`` refuses a change of any other key (:func:`result_changes`, the runner's
``_previous_manifest``), naming it.
"""

from __future__ import annotations

from typing import Any

#: Keys that change how a run is carried out, never what it measures: time-outs, concurrency,
#: ports and host, the launcher and its container names and GPUs, the server's extra environment,
#: interpreter paths and worker counts. A run folder is continued (``nvfp4study run --from NN
#: --run-dir``) after any of them changed; a change of any other key is refused
#: (:func:`result_changes`). A key here covers every key below it. ``corruption.concurrency``
#: batches the corruption sweep's requests: each recorded row names the server configuration
#: that answered it (``server``, with ``-mrr=<n>``), so a sweep continued at another
#: concurrency says which rows were batched. ``server.env`` is meant for paths, caches, ``TZ``
#: and device selection; a variable that changes SGLang's numerics belongs in a new run folder.
OPERATIONAL_KEYS: tuple[str, ...] = (
    "description",
    "execution_timeout_s",
    "quantize.python",
    "quantize.max_workers",
    "quantize.assumed_mb_per_s",
    "server.python",
    "server.host",
    "server.port",
    "server.launcher",
    "server.docker.gpus",
    "server.docker.container_name_prefix",
    "server.env",
    "server.startup_timeout_s",
    "server.request_timeout_s",
    "server.shutdown_grace_s",
    "server.health_poll_s",
    "server.parallel_loads",
    "server.cpu.fork_server",
    "corruption.max_workers",
    "corruption.concurrency",
)


def is_operational(key: str) -> bool:
    """Whether the dotted ``key`` is, or lies below, one of :data:`OPERATIONAL_KEYS`."""
    return any(key == k or key.startswith(k + ".") for k in OPERATIONAL_KEYS)


def flat_keys(data: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as ``{dotted key: leaf value}`` (lists and empty mappings are leaves)."""
    if not isinstance(data, dict) or not data:
        return {prefix: data}
    out: dict[str, Any] = {}
    for k, v in data.items():
        out.update(flat_keys(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def result_changes(recorded: dict[str, Any], params: Any) -> list[str]:
    """The result keys whose values differ between ``recorded`` (a run's params as
    ``model_dump(mode="json")``, e.g. its manifest's ``params``) and ``params`` (a
    :class:`nvfp4study.core.params.Params`; not imported here, which imports this), each as
    ``"key: old -> new"``, sorted; ``[]`` when only operational keys differ. A key present on
    one side only (params of another release of the study) counts as changed."""
    old = {k: v for k, v in flat_keys(recorded).items() if not is_operational(k)}
    new = params.result_fields()
    missing = object()
    return [f"{k}: {old.get(k, missing)!r} -> {new.get(k, missing)!r}".replace(repr(missing), "(absent)")
            for k in sorted(set(old) | set(new)) if old.get(k, missing) != new.get(k, missing)]
