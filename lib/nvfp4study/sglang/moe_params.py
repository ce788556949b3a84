"""Ling's MoE parameters the SGLang audit follows, as data (``data/moe_params.yaml``).

Each parameter (the SwiGLU clamp ``gemm1_clamp_limit``, the routed scaling factor, the routing
parameters) is a :class:`ParamSpec`: the names that mention it, the words that make a raise refuse
it, the words that make the interpreter enter a helper, the ``MoeRunnerConfig`` facts of Ling with
the followed value marked ``tracked`` (a :class:`~nvfp4study.sglang.clamp_values.Tracked` labelled
with the parameter), and its sink table. The interpreter (:mod:`nvfp4study.sglang.clamp_flow`)
takes one spec and names no parameter in its code; ``tests/test_sglang_params.py`` checks that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml

from ..core.errors import AuditError
from .clamp_values import Tracked

#: the verdict words of each kind of parameter (besides REFUSED / UNUSABLE / ABSENT / UNDECIDED)
KIND_VERDICTS = {"clamp": ("EXACT", "APPROX", "DROPPED"), "scalar": ("APPLIED", "DROPPED", "DOUBLE"),
                 "routing": ("APPLIED", "DROPPED", "WRONG")}


@dataclass(frozen=True, eq=False)
class ParamSpec:
    """One followed parameter (a row of ``data/moe_params.yaml``'s ``params``).

    ``facts`` maps a ``MoeRunnerConfig`` field to Ling's value, the followed one a :class:`Tracked`;
    ``layer_facts`` FusedMoE attributes Bailing leaves at their defaults; ``quant_info_defaults``
    the fields SGLang's ``...QuantInfo`` dataclasses default (``shared`` in the YAML)."""

    name: str
    label: str
    kind: str
    mentions: tuple[str, ...]
    refusal_words: tuple[str, ...]
    enter_when: tuple[str, ...]
    facts: dict[str, Any]
    sinks: dict[str, dict]
    layer_facts: dict[str, Any] = field(default_factory=dict)
    quant_info_defaults: dict[str, Any] = field(default_factory=dict)
    ling: float | None = None
    positive: bool = False
    applications: dict[str, Any] = field(default_factory=dict)  # where else it is applied (param_audit)
    config_names: tuple[str, ...] = ()  # more names whose attributes are ``facts`` (TopK's ``topk_config``)
    assume: dict[str, Any] = field(default_factory=dict)  # name facts the interpreter starts from
    config_methods: dict[str, str] = field(default_factory=dict)  # config method -> the field it returns

    def tracked(self, how: str = "") -> Tracked:
        """The labelled tracked value of this parameter (``how``: how it was derived, for evidence)."""
        return Tracked(self.name, how or self.name, positive=self.positive, value=self.ling if not how else None)


def _read(name: str) -> dict:
    text = resources.files(__package__).joinpath(f"data/{name}").read_text()
    return yaml.safe_load(text) or {}


@cache
def _table() -> dict:
    return _read("moe_params.yaml")


def shared() -> dict[str, Any]:
    """The ``shared`` section of ``data/moe_params.yaml`` (facts and audit policies for every parameter)."""
    return dict(_table().get("shared") or {})


def names() -> list[str]:
    """The followed parameters' names, the default (the clamp) first."""
    return list(_table()["params"])


@cache
def param(name: str | None = None) -> ParamSpec:
    """The spec of parameter ``name`` (None: the first, the clamp).

    Raises:
        AuditError: no such parameter in ``data/moe_params.yaml`` (the message lists them).
    """
    table = _table()
    name = name or names()[0]
    if name not in table["params"]:
        raise AuditError(f"no MoE parameter {name!r}; followed: {', '.join(names())}")
    row = table["params"][name]
    sinks = row.get("sinks") or {}
    if isinstance(sinks, str):
        sinks = _read(sinks).get("sinks", {})
        sinks = sinks[name] if name in sinks else sinks  # a file of several parameters' tables
    shared = table.get("shared", {})
    spec = ParamSpec(name=name, label=row.get("label", name), kind=row["kind"],
                     mentions=tuple(row.get("mentions", [name])), refusal_words=tuple(row.get("refusal_words", [])),
                     enter_when=tuple(row.get("enter_when", [])), facts={}, sinks=dict(sinks),
                     layer_facts=dict(shared.get("layer_facts", {})),
                     quant_info_defaults=dict(shared.get("quant_info_defaults", {})), ling=row.get("ling"),
                     positive=bool(row.get("positive", False)), applications=dict(row.get("applications") or {}),
                     config_names=tuple(row.get("config_names", [])), assume=dict(row.get("assume") or {}),
                     config_methods=dict(row.get("config_methods") or {}))
    spec.facts.update({k: (spec.tracked() if v == "tracked" else v) for k, v in (row.get("facts") or {}).items()})
    return spec


def verdicts(name: str) -> tuple[str, ...]:
    """The verdict words a parameter's paths can get (its kind's, then the shared four)."""
    return KIND_VERDICTS[param(name).kind] + ("REFUSED", "UNUSABLE", "ABSENT", "UNDECIDED")


__all__ = ["KIND_VERDICTS", "ParamSpec", "names", "param", "shared", "verdicts"]
