"""The kernel end of the clamp audit: does a kernel call receive Ling's limit, and in which form.

:mod:`nvfp4study.sglang.audit` traces each MoE path to the kernel calls it reaches (the *sinks*
of ``data/sglang_clamp_paths.yaml``); :func:`judge_hit` gives one call its
:class:`ClampVerdict` from the sink table's facts (which argument carries the clamp, the form the
kernel computes) and, where the table says so, from the activation code itself
(:func:`sink_form_in_code`: SiLU before or after the gate clamp). FlashInfer sinks also carry the
FlashInfer releases their facts were read from (:func:`flashinfer_check`).
"""

from __future__ import annotations

import ast
import re
from enum import StrEnum
from typing import Any

from . import clamp_values as cv
from . import moe_params
from .code_index import walk
from .source import SGLangTree


class ClampVerdict(StrEnum):
    """A path's (or one kernel call's) clamp verdict; the module docstring of
    :mod:`nvfp4study.sglang.audit` says what each means."""

    EXACT = "EXACT"
    APPROX = "APPROX"
    DROPPED = "DROPPED"
    REFUSED = "REFUSED"
    UNUSABLE = "UNUSABLE"
    ABSENT = "ABSENT"
    UNDECIDED = "UNDECIDED"




def flashinfer_pin(tree: SGLangTree) -> str | None:
    """The flashinfer-python version the release pins (``Requires-Dist: flashinfer_python...==X``
    in its dist-info ``METADATA``, e.g. ``0.7.2`` for SGLang 0.5.23); None when not recorded."""
    for meta in sorted(tree.root.glob("sglang-*.dist-info/METADATA")):
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            m = re.match(r"Requires-Dist:\s*flashinfer[-_]python(\[[^\]]*\])?\s*==\s*([\w.]+)\s*$", line)
            if m:
                return m.group(2)
    return None


def flashinfer_check(tree: SGLangTree, sink_name: str, sink: dict) -> str | None:
    """A note when the sink's facts were read from other FlashInfer releases than the pinned one."""
    if "flashinfer" not in sink:
        return None
    pin = flashinfer_pin(tree)
    if pin in sink["flashinfer"]:
        return None
    return (f"{sink_name}() facts read from flashinfer-python {', '.join(sink['flashinfer'])}; SGLang "
            f"{tree.version} pins {pin or 'no recorded version'} (not re-read)")


def sink_form_in_code(tree: SGLangTree, verify: dict) -> tuple[str | None, str]:
    """Read an SGLang activation function and say whether it clamps the gate after SiLU.

    Returns ``("post" | "pre" | None, "file:line")``: ``post`` when a ``silu`` call is applied to
    the gate at or before the first gate clamp (``clamp``/``minimum`` with ``max``), ``pre`` when
    the gate is clamped first.
    """
    rel = "sglang/srt/" + verify["file"]
    path = tree.file(rel)
    if not path.is_file():
        return None, f"{verify['file']} missing"
    mod = cv._parse(path)
    parts = verify["function"].split(".")
    fn: Any = mod
    for p in parts:
        fn = next((n for n in walk(fn) if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                   and n.name == p), None)
        if fn is None:
            return None, f"{verify['function']} not in {verify['file']}"
    silu_line = clamp_line = None
    for n in walk(fn):
        if isinstance(n, ast.Call):
            name = ast.unparse(n.func)
            if name.endswith("silu") and silu_line is None:
                silu_line = n.lineno
            if (name.endswith("clamp") or name.endswith("minimum")) and any(
                    k.arg == "max" for k in n.keywords) and "gate" in ast.unparse(n):
                clamp_line = n.lineno if clamp_line is None else min(clamp_line, n.lineno)
    where = f"{verify['file']}:{fn.lineno}"
    if silu_line is None or clamp_line is None:
        return None, where
    return ("post" if silu_line <= clamp_line else "pre"), where


def stated_form(tree: SGLangTree, statement: dict) -> str | None:
    """``"file:line"`` where ``statement["text"]`` stands in ``statement["file"]`` (relative to
    ``sglang/srt``) of ``tree``, or None when the file or the text is not there: a kernel form the
    sink table takes from SGLang's own words holds only in a release that still says it."""
    path = tree.file("sglang/srt/" + statement["file"])
    if not path.is_file():
        return None
    for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if statement["text"] in line:
            return f"{statement['file']}:{i}"
    return None


def _activation_form(hit: cv.SinkHit, sink: dict, tree: SGLangTree) -> tuple[ClampVerdict, str]:
    """The ``by-activation`` form: the activation type the call passes, looked up in the sink's
    ``forms`` (each stated by SGLang's code at a file:line :func:`stated_form` finds); on several
    possible activation types, the worst."""
    act = hit.kwargs.get(sink.get("activation", "activation"), cv.UNK)
    opts = act.options if isinstance(act, cv.Multi) else (act,)
    names = {o.name if isinstance(o, cv.Act) else None for o in opts}
    if None in names:
        return ClampVerdict.UNDECIDED, f"activation type undecided ({act!r})"
    out = []
    for name in sorted(names):
        fact = (sink.get("forms") or {}).get(name)
        where = stated_form(tree, fact) if fact else None
        if where is None:
            return ClampVerdict.UNDECIDED, f"activation {name}: no form stated in this release"
        v = ClampVerdict.EXACT if fact["form"] == "post" else ClampVerdict.APPROX
        out.append((v, f"activation {name} -> {'post' if v == ClampVerdict.EXACT else 'pre'}-SiLU form ({where})"))
    return min(out, key=lambda x: x[0] == ClampVerdict.EXACT)


def _arg(hit: cv.SinkHit, spec: str, facts: dict | None = None) -> tuple[bool, Any, ast.AST | None]:
    """(present, value, keyword node) for one clamp/alpha spec of a sink call; ``facts``: Ling's
    ``MoeRunnerConfig`` fields (the followed parameter's, :mod:`nvfp4study.sglang.moe_params`;
    None: the clamp's)."""
    if spec.startswith("#"):
        i = int(spec[1:])
        return (i < len(hit.args)), (hit.args[i] if i < len(hit.args) else None), None
    if "." in spec:
        kw, attr = spec.split(".", 1)
        if kw in hit.kwargs and hit.kwargs[kw] is cv.CONFIG:
            facts = moe_params.param().facts if facts is None else facts
            return True, facts.get(attr, cv.UNK), None
        return False, None, None
    if spec in hit.kwargs:
        return True, hit.kwargs[spec], hit.kw_nodes.get(spec)
    return False, None, None


def _form_verdict(form: str, hit: cv.SinkHit, sink: dict, tree: SGLangTree) -> tuple[ClampVerdict, str]:
    alpha = None
    for spec in sink.get("alpha", []):
        present, v, _ = _arg(hit, spec)
        if present:
            alpha = v
            break
    if form == "by-activation":
        return _activation_form(hit, sink, tree)
    if form == "cutlass":
        act = hit.kwargs.get(sink.get("activation", "activation_type"), cv.Act("Swiglu"))
        names = {o.name for o in (act.options if isinstance(act, cv.Multi) else (act,))
                 if isinstance(o, cv.Act)}
        if names == {"SwigluStep"}:
            return ClampVerdict.EXACT, "cutlass: activation_type SwigluStep (post-SiLU)"
        if names and "SwigluStep" not in names:
            return ClampVerdict.APPROX, (f"cutlass: activation_type {'/'.join(sorted(names))} + "
                                         "swiglu_limit -> SwigluBias (pre-SiLU)")
        return ClampVerdict.UNDECIDED, f"cutlass: activation_type undecided ({act!r})"
    if form in ("sglang-triton", "marlin"):
        if alpha is None:
            if form == "marlin":
                return ClampVerdict.APPROX, "fused_marlin_moe: alpha None + limit -> swiglu_limit_func (pre-SiLU)"
            f, where = sink_form_in_code(tree, sink["verify"]) if "verify" in sink else ("post", "")
            if f == "post":
                return ClampVerdict.EXACT, f"triton: alpha None -> post-SiLU clamp ({where})"
            if f == "pre":
                return ClampVerdict.APPROX, f"triton: alpha None, but the code clamps the gate before SiLU ({where})"
            return ClampVerdict.UNDECIDED, f"triton: form not confirmed in code ({where})"
        return ClampVerdict.APPROX, "alpha set -> GPT-OSS form (pre-SiLU)"
    if form == "alpha-only":
        if alpha is None:
            return ClampVerdict.DROPPED, "kernel uses the limit only when gemm1_alpha > 0"
        return ClampVerdict.APPROX, "alpha set -> GPT-OSS form"
    if form == "post":
        if "verify" in sink:
            f, where = sink_form_in_code(tree, sink["verify"])
            if f == "pre":
                return ClampVerdict.APPROX, f"the code clamps the gate before SiLU ({where})"
            if f != "post":
                return ClampVerdict.UNDECIDED, f"sink form not confirmed in code ({where})"
            return ClampVerdict.EXACT, f"post-SiLU clamp ({where})"
        return ClampVerdict.EXACT, "post-SiLU clamp"
    if form == "pre":
        return ClampVerdict.APPROX, "kernel clamps the gate before SiLU (GPT-OSS form)"
    return ClampVerdict.DROPPED, "kernel takes no clamp"


def _origin(node: ast.AST | None, origin: dict) -> tuple | None:
    """Where a payload field passed to a sink was set (``quant_info.f`` -> the ``f=`` keyword)."""
    if isinstance(node, ast.Attribute) and node.attr in origin:
        return origin[node.attr]
    return None


def judge_hit(hit: cv.SinkHit, sink: dict, tree: SGLangTree,
              origin: dict | None = None) -> tuple[ClampVerdict, str, tuple | None]:
    """Verdict for one kernel call: does the limit reach it, and in which form.

    Returns ``(verdict, rule, where)``; ``where`` is ``(file, line, text)`` when the deciding
    line is not the call itself (a payload field set to a literal None upstream).
    """
    v, rule, where = _judge(hit, sink, tree, origin or {})
    return v, rule, where


def kernel_raises(hit: cv.SinkHit, sink: dict) -> str | None:
    """The sink table's ``raises`` fact met by this call: ``"arg=value"`` when the call passes an
    argument value the kernel raises on whatever the limit (e.g. ``fused_experts_mxfp8`` with
    ``gate_up_interleaved=True``), else None (an argument not passed or not decided never counts)."""
    for arg, bad in (sink.get("raises") or {}).items():
        if arg in hit.kwargs and hit.kwargs[arg] is not cv.UNK and hit.kwargs[arg] == bad:
            return f"{arg}={bad!r}"
    return None


def _judge(hit, sink, tree, origin):
    raise_arg = kernel_raises(hit, sink)
    if raise_arg is not None:
        return ClampVerdict.UNUSABLE, f"{hit.callee}() raises for Ling whatever the limit ({raise_arg})", None
    specs = sink.get("clamp", [])
    if not specs:
        return ClampVerdict.DROPPED, f"{hit.callee}() takes no clamp argument", None
    value, node, present_any = None, None, False
    for spec in specs:
        present, v, n = _arg(hit, spec)
        if present:
            present_any = True
            if cv.has_tracked(v) or value is None:
                value, node = v, n
    if cv.has_tracked(value):
        if isinstance(value, cv.Multi) and not all(cv.has_tracked(o) for o in value.options):
            others = [o for o in value.options if isinstance(o, cv.Filled)]
            if others:
                # the worst branch: a constant of the code stands where Ling's limit should
                # (Mxfp4MoEMethod on SM120: torch.full((E,), 7.0), mxfp4.py 1392-1395 in 0.5.20)
                lits = ", ".join(sorted({f"{o.value:g}" for o in others}))
                return ClampVerdict.DROPPED, (f"{hit.callee}(): on some branches the clamp argument is a "
                                              f"tensor of the literal {lits}, not Ling's limit"), None
            return ClampVerdict.UNDECIDED, f"{hit.callee}(): limit reaches it on some branches only", None
        v, rule = _form_verdict(sink["form"], hit, sink, tree)
        return v, f"{hit.callee}(): {rule}", None
    carriers = [k for k, v in hit.kwargs.items() if cv.has_tracked(v) and k not in specs]
    if carriers:
        why = "; ".join(sink.get("siblings", {}).get(k, f"{k} carries it") for k in carriers)
        literal = isinstance(node, ast.Constant) and node.value is None
        return ClampVerdict.DROPPED, (f"{hit.callee}(): clamp argument {'literal None' if literal else 'None'} "
                                      f"but the limit is passed as {', '.join(carriers)} ({why})"), None
    if not present_any:
        return ClampVerdict.DROPPED, f"{hit.callee}(): no clamp argument ({'/'.join(specs)})", None
    if isinstance(node, ast.Constant) and node.value is None:
        return ClampVerdict.DROPPED, f"{hit.callee}(): literal {specs[0]}=None", None
    if value is None:
        src = ast.unparse(node) if node is not None else specs[0]
        org = next((hit.origins[sp] for sp in specs if sp in hit.origins), None) or _origin(node, origin)
        if org and org[2].startswith("literal"):
            return ClampVerdict.DROPPED, (f"{org[2]} at {org[0][11:]}:{org[1]}, passed on as {src} "
                                          f"to {hit.callee}()"), org
        return ClampVerdict.DROPPED, f"{hit.callee}(): clamp argument is None for Ling ({src[:140]})", None
    return ClampVerdict.UNDECIDED, f"{hit.callee}(): clamp argument undecided ({value!r})", None


__all__ = ["ClampVerdict", "flashinfer_check", "flashinfer_pin", "judge_hit", "kernel_raises", "sink_form_in_code", "stated_form"]
