"""The preflight row type and its verdicts, shared by the preflight modules.

A :class:`Check` is one row of ``nvfp4study preflight``: ``ok``, ``blocker`` (the run would
fail), ``warning`` (it would run, weaker or slower) or ``not applicable``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.params import Params

OK, BLOCKER, WARNING, NA = "ok", "blocker", "warning", "not applicable"
GB = 1e9


@dataclass
class Check:
    """One preflight row: ``name``, ``verdict`` (ok / blocker / warning / not applicable),
    ``detail`` (what was found) and ``fix`` (what to do; empty when nothing is needed)."""

    name: str
    verdict: str
    detail: str
    fix: str = ""


def size_text(n: float) -> str:
    """``n`` bytes as "12.3 GB" (1e9) or "4.5 MB" (1e6)."""
    return f"{n / GB:.1f} GB" if n >= GB else f"{n / 1e6:.1f} MB"


def cuda_version(v: str | None) -> tuple[int, ...] | None:
    """``"12.8"`` -> ``(12, 8)``; None for a missing or unparsable version."""
    try:
        return tuple(int(x) for x in str(v).split(".")[:2]) if v else None
    except ValueError:
        return None


def serving(p: Params) -> bool:
    """Whether the run launches servers (``server.enabled`` and not a replay)."""
    return p.server.enabled and not p.replay_from


def quantizing(p: Params) -> bool:
    """Whether stage 01 quantizes (``quantize.enabled``, no ``checkpoint.quantized_path``, and
    ``checkpoint.serve`` is ours, not the card's)."""
    return p.quantize.enabled and not p.checkpoint.quantized_path and p.checkpoint.serve == "ours"


def serving_card(p: Params) -> bool:
    """Whether stage 01 downloads the card's checkpoint to serve (``checkpoint.serve: card``)."""
    return p.checkpoint.serve == "card" and not p.checkpoint.quantized_path
