"""The derived path keys of the clamp audit, made and read in one place.

:mod:`~nvfp4study.sglang.dispatch` names each MoE path it derives from a release by a key of one
of these forms (a catalogued path's ``via`` is one too):

- ``Method/<runner>``: a quant method's ``apply`` run with a ``--moe-runner-backend`` value
  (``Fp8MoEMethod/cutlass``);
- ``fused:<a2a>/<runner>``: a function registered with ``@register_fused_func(a2a, runner)``
  (``fused:none/flashinfer_mxfp4``);
- ``core:<runner>``: a runner core that ``MoeRunner.__init__`` builds (``core:triton``);
- ``quantization:<name>``: a registered quantization whose method class was not found (a lost
  trail, no runner).

Method and runner names never hold ``/`` or ``:`` (Python identifiers and enum values), so a key
has at most one ``/``. A catalogued id without a ``via`` (``cpu-amx``) has neither part.
"""

from __future__ import annotations

FUSED = "fused:"
CORE = "core:"


def fused_key(a2a: str, runner: str) -> str:
    """``fused:<a2a>/<runner>``."""
    return f"{FUSED}{a2a}/{runner}"


def core_key(runner: str) -> str:
    """``core:<runner>``."""
    return f"{CORE}{runner}"


def is_runner_level(key: str) -> bool:
    """A fused function or a runner core (no quant method of its own)."""
    return key.startswith((FUSED, CORE))


def method(key: str) -> str | None:
    """The quant method of a ``Method/<runner>`` key, else None."""
    return key.split("/", 1)[0] if "/" in key and not is_runner_level(key) else None


def runner(key: str) -> str | None:
    """The ``--moe-runner-backend`` value the path runs with: ``<runner>`` of every form above
    (the part after the ``/``, or after ``core:``); None for a key with neither."""
    if key.startswith(CORE):
        return key[len(CORE):]
    return key.split("/", 1)[1] if "/" in key else None


def a2a(key: str) -> str:
    """The ``--moe-a2a-backend`` a path runs with: ``<a2a>`` of a ``fused:<a2a>/<runner>`` key,
    else the server's default ``none`` (server_args ``moe_a2a_backend``)."""
    return key[len(FUSED):].split("/", 1)[0] if key.startswith(FUSED) else "none"


def backends(key: str) -> set[str]:
    """Every backend value the path runs with: ``{runner}``; for a fused key ``{a2a, runner}``
    without ``none``; empty for a key without a runner."""
    if key.startswith(FUSED):
        return set(key[len(FUSED):].split("/")) - {"none"}
    r = runner(key)
    return {r} if r is not None else set()


def kind(key: str) -> str:
    """The kind of code a key reads, for agreement by kind: ``<runner>`` for a method's own
    handling of a backend, ``fused:<runner>`` for a fused function, ``core:<runner>`` unchanged
    (a fused function or a runner core is other code than a method's handling of that backend);
    a key without a runner is its own kind."""
    if key.startswith(CORE):
        return key
    if key.startswith(FUSED):
        return FUSED + (runner(key) or "")
    return runner(key) or key


__all__ = ["CORE", "FUSED", "a2a", "backends", "core_key", "fused_key", "is_runner_level", "kind", "method", "runner"]
