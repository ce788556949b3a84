"""Ling's routing shape against FlashInfer's TRT-LLM-Gen routing kernel (fault F-05; docs/blind-readings/KP.md).

A TRT-LLM-Gen call that routes from the router logits with a routing method whose kernel checks the routing
shape (``checks_groups`` of ``applications.routing_methods`` in ``data/moe_params.yaml``: DeepSeekV3, whose
routingDeepSeek runs for n_group > 1 and checks ``mNumExperts / mNumExpertGroups <= WarpSize``) raises for
Ling-3.0-flash's 512 experts in 8 groups. The shape is the study's (:class:`~nvfp4study.core.params.LingShape`),
judged by the study's own check (:func:`~nvfp4study.checkpoint.quant_rules.check_routing`); no parameter is
named here (the argument holding n_group is the sink table's ``groups``).
"""

from __future__ import annotations

import ast

from . import clamp_values as cv
from . import moe_params
from .audit_sinks import _arg


def _n_group(hit: cv.SinkHit, specs: list[str]) -> int | None:
    """The n_group a TRT-LLM call gets (its ``groups`` argument): an int, Ling's number where it carries the
    followed value, or, where not known, the TopKConfig field its argument reads (``topk_config.num_expert_group``)
    as Ling's routing parameters hold it (the first routing parameter's facts); None otherwise (branches, unknown)."""
    for s in specs:
        present, v, node = _arg(hit, s)
        if not present:
            continue
        if isinstance(v, cv.Multi):
            return None
        t = cv.tracked_in(v)
        if t is not None:
            v = int(t.value) if t.value is not None else cv.UNK
        if v is cv.UNK and isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            routing = next((moe_params.param(n) for n in moe_params.names() if moe_params.param(n).kind == "routing"),
                           None)
            if routing is not None and node.value.id in routing.config_names:
                v = routing.facts.get(node.attr, cv.UNK)
                v = int(v.value) if isinstance(v, cv.Tracked) and v.value is not None else v
        return v if isinstance(v, int) and not isinstance(v, bool) else None
    return None


def kernel_shape_fails(hit: cv.SinkHit, sink: dict, param: moe_params.ParamSpec, names: list[str]) -> str | None:
    """What a TRT-LLM call routing from the logits with routing method(s) ``names`` meets in the grouped
    routing kernel, where it fails for Ling: ``"routes from the router logits with routing method DeepSeekV3 and
    n_group 8: ... 64 experts per group > 32"``; None where a method has no ``checks_groups``, the n_group
    is not decided > 1 (routingDeepSeek's checks sit under ``mNumExpertGroups > 1``), or Ling's shape passes.

    Ling's shape: :class:`~nvfp4study.core.params.LingShape` defaults (512 experts, topk_group 4, top-k 8)
    with the call's n_group, judged by the study's check :func:`~nvfp4study.checkpoint.quant_rules.check_routing`
    against ``WARP_SIZE`` (32, FlashInfer's ``WarpSize``)."""
    from ..checkpoint import quant_rules as qr
    from ..core.params import LingShape

    methods = param.applications.get("routing_methods", {})
    n_group = _n_group(hit, sink.get("groups", []))
    if not names or not all(methods[m].get("checks_groups") for m in names) or n_group is None or n_group <= 1:
        return None
    shape = LingShape()
    rc = qr.check_routing(shape.num_experts, n_group, shape.topk_group, shape.num_experts_per_tok)
    if rc.experts_per_group <= qr.WARP_SIZE:
        return None
    return (f"routes from the router logits with routing method {', '.join(names)} and n_group {n_group}: FlashInfer's "
            f"grouped routing kernel raises for Ling's {shape.num_experts} experts / {n_group} groups = "
            f"{rc.experts_per_group:g} experts per group > {qr.WARP_SIZE}")


__all__ = ["kernel_shape_fails"]
