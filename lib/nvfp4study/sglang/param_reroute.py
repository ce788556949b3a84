"""A method that routes again from the router logits itself, bypassing TopK's output (routing parameters).

TopK's standard output carries the router logits beside its weights and ids (``StandardTopKOutput``). A method's
forward may ignore the weights and route the logits again with its own routing: 0.5.20
layers/quantization/quark/schemes/quark_w4a8_mxfp4_moe.py 430-460 on gfx1250 unpacks ``topk_weights, topk_ids,
router_logits`` and calls ``aiter_w4a8_gfx1250_forward(router_logits=router_logits, ...)`` instead of its
MoeRunner, whose aiter ``routing(router_logits, topk, sm_first=...)`` is a softmax top-k with no correction bias,
no groups and no routed scaling factor (layers/moe/fused_moe_triton/aiter_mxfp4_w4a8_moe.py 153-159). On the
branch that takes such a call, TopK's routing does not decide: the call's own form does (its sink entry, with
``reroutes``: the argument that must hold the router logits, ``data/moe_param_sinks.yaml``). The path's verdict
is then the worst of its branches (TopK's routing on the others), as for any routing branches
(:func:`nvfp4study.sglang.param_routing._combine`).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from .audit_run import run_path
from .audit_sinks import _arg
from .param_routing import _WORST, _combine, judge_hit
from .source import SGLangTree


def _rerouters(param: Any) -> tuple[str, ...]:
    """The sink names of ``param`` that route again from the router logits (entries with ``reroutes``)."""
    return tuple(sorted(n for n, e in param.sinks.items() if e.get("reroutes")))


def _mentions(root: Any, rel: str, names: tuple[str, ...]) -> bool:
    """Whether file ``rel`` of the tree at ``root`` names one of ``names`` (a cheap test before a run); read
    once per state of the file (an overlay patched in place is read again)."""
    path = Path(root) / "sglang/srt" / rel
    if not path.is_file():
        return False
    st = path.stat()
    return _mentions_at(path, st.st_mtime_ns, st.st_size, names)


@lru_cache(maxsize=512)
def _mentions_at(path: Path, _mtime_ns: int, _size: int, names: tuple[str, ...]) -> bool:
    return any(n in path.read_text(encoding="utf-8", errors="replace") for n in names)


def reroute_hits(tree: SGLangTree, spec: dict, param: Any) -> list[tuple[str, str]]:
    """``[(verdict word, evidence)]`` of the calls on the path (its run, :func:`~nvfp4study.sglang.audit_run.
    run_path`, on the branches it may take) to a function that routes again from the router logits, each judged
    by its own sink form (:func:`~nvfp4study.sglang.param_routing.judge_hit`); only a call that is handed the
    logits (its ``reroutes`` argument present and not None). [] where no step's file names such a function,
    or the run stops before."""
    names = _rerouters(param)
    files = {s.split("::")[0] for s in spec.get("steps", [])}
    if not names or not any(_mentions(tree.root, f, names) for f in sorted(files)):
        return []
    run = run_path(tree, spec, param)
    if run.stop is not None or run.interp is None:
        return []
    out, seen = [], set()
    platform = run.interp.platforms[0] if len(run.interp.platforms) == 1 else None
    for h in run.interp.hits:
        entry = param.sinks.get(h.callee) if h.callee in names else None
        if entry is None or (h.file, h.line) in seen:
            continue
        present, value = next(((p, v) for p, v, _ in (_arg(h, s, param.facts) for s in entry["reroutes"]) if p),
                              (False, None))
        if present and value is not None:
            seen.add((h.file, h.line))
            word, ev = judge_hit(h, param, platform)
            out.append((word, f"{ev} (TopK's weights and ids are not used)"))
    return out


def with_reroutes(tree: SGLangTree, spec: dict, param: Any, word: str, rule: str,
                  evidence: list[str]) -> tuple[str, str, list[str]]:
    """``(word, rule, evidence)`` of a path's routing (TopK's or its runner's: ``word``, ``rule``) with the
    branches that route again from the logits (:func:`reroute_hits`): the worst of them all in the order
    DROPPED, WRONG, DOUBLE, UNDECIDED, REFUSED, APPLIED; unchanged where there are none or ``word`` is not
    a verdict of that order (a run that stops is judged as it was)."""
    judged = reroute_hits(tree, spec, param) if word in _WORST else []
    if not judged:
        return word, rule, evidence
    w, r, ev = _combine([(word, rule), *judged], "the path")
    return w, r, ev + [e for e in evidence if e not in ev]


__all__ = ["reroute_hits", "with_reroutes"]
