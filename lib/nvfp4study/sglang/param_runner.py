"""What a path's runner does beyond the steps the audit lists (:mod:`nvfp4study.sglang.param_audit`).

Two readings of SGLang's source that the parameter audit adds to a path's run
(:func:`~nvfp4study.sglang.audit_run.run_path`), each found by what the source registers, not by name:

- **the post-permute**: the function a runner registers for ``(runner backend, dispatch format)``
  (``@register_post_permute``), which ``MoeRunner.run`` calls after the runner core: where deep_gemm and
  triton_kernels apply the routed scaling factor (:func:`run_post_permute`);
- **registered custom ops**: a function decorated ``@register_custom_op`` is called through
  ``torch.ops.sglang.<name>``, whose schema comes from its annotations: a call handing it None where the
  schema takes an int raises (:func:`custom_op_rejects`);
- **the TRT-LLM routing kernel's shape checks**: a FlashInfer TRT-LLM-Gen kernel that routes from the
  router logits with a routing method whose grouped kernel checks the routing shape (``checks_groups`` of
  ``applications.routing_methods``: DeepSeekV3 with n_group > 1) raises for Ling's shape
  (:func:`routing_kernel_rejects`, the study's own check :func:`~nvfp4study.checkpoint.quant_rules.check_routing`).

And one fact of the weights a runner kernel gets, read from what the path ran: :func:`e8m0_scales`, the
expert scales cast to E8M0 (``fused_marlin_moe`` sums an E8M0-scale MXFP4 layer's experts plainly).
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path
from typing import Any

from . import clamp_values as cv
from . import moe_params, path_keys
from .audit_run import _short, registered_permutes, runner_and_format
from .clamp_values import _parse, unparse
from .param_routing import routing_methods_of
from .platforms import PLATFORMS
from .routing_shape import kernel_shape_fails
from .source import SGLangTree
from .tree_files import tree_stamp


def run_post_permute(tree: SGLangTree, spec: dict, run: Any) -> str | None:
    """Run, in the path's interpreter, the post-permute its runner core's output goes through.

    A runner core's output reaches the dispatcher through the function registered for
    ``(runner backend, dispatch format)`` (``@register_post_permute``, layers/moe/moe_runner/base.py
    341-358 in 0.5.23; ``MoeRunner.run`` calls it after ``runner_core.run``, runner.py); the path's steps
    stop at the core, so a product there (0.5.23 deep_gemm.py 1253-1300: ``post_reorder_deepgemm(...,
    runner_config.routed_scaling_factor)``) was not seen. Only where the path ran a core's ``run`` (not a
    fused function, not a method that returns before its runner). Returns ``"file:line name"`` run, or None."""
    if run.interp is None or run.skipped_runner or not any(q.endswith("RunnerCore.run") for _, q in run.steps):
        return None
    found = registered_permutes(tree.root, "register_post_permute").get(runner_and_format(spec))
    if found is None:
        return None
    rel, name, line = found
    run.interp.run_function(rel, name, [], {})
    return f"{_short(rel)}:{line} {name}"


def custom_op_rejects(tree: SGLangTree, run: Any) -> tuple[str, int, str] | None:
    """``(file, line, what)`` of a call the run reached that hands None to a registered torch custom op
    for a parameter annotated ``int``/``float``/``bool`` (not Optional); None when there is none.

    ``@register_custom_op`` registers the function as ``torch.ops.sglang.<name>`` with the schema
    ``torch.library.infer_schema`` reads from its annotations (utils/custom_op.py 119-165,
    utils/common.py 2824-2830 in 0.5.19), and calls go through that op (``real_impl``), which takes no
    None for such a parameter: BailingMoeV3 passes no ``routing_method_type`` (FusedMoE's None), and
    ``trtllm_fp8_block_scale_moe_out_wrapper(..., routing_method_type: int = 0)`` (layers/moe/
    flashinfer_trtllm_moe.py 40-65 in 0.5.19) gets it. Only sink calls the run recorded are read, and
    only when every one of them that is such an op rejects (a method path; a runner-level path spans
    methods whose quant info differ); an argument counts when each value it may take is None or not
    known (never a value the op accepts)."""
    ops, found = _custom_ops(tree.root, tree_stamp(tree.root)), []
    for h in run.interp.hits if run.interp is not None else ():
        sig = ops.get(h.callee)
        if sig is None:
            continue
        rel, line, params = sig
        bound = {**{params[i][0]: a for i, a in enumerate(h.args) if i < len(params)}, **h.kwargs}
        bad = None
        for name, ann in params:
            v = bound.get(name, cv.UNK)
            opts = v.options if isinstance(v, cv.Multi) else (v,)
            if ann in ("int", "float", "bool") and any(o is None for o in opts) \
                    and all(o is None or o is cv.UNK for o in opts):
                bad = (_short(h.file), h.line, f"{h.callee}() gets {name}=None, a custom op whose schema takes "
                       f"{ann} ({_short(rel)}:{line} @register_custom_op)")
                break
        found.append(bad)
    return found[0] if found and all(found) else None


def routing_kernel_rejects(run: Any, param: Any, pin: str | None) -> tuple[str, int, str] | None:
    """``(file, line, what)`` of a TRT-LLM routing kernel call the run reached that raises for Ling's
    routing shape; None when there is none, or when some such call the run reached does not raise. ``pin``: the
    flashinfer-python version the release pins (:func:`~nvfp4study.sglang.audit_sinks.flashinfer_pin`): a check
    read from another version decides nothing.

    A sink with ``groups`` (the argument holding n_group; the ops that route from ``routing_logits``, not the
    ``*_routed_moe`` variants) whose routing method(s) all have ``checks_groups`` for ``pin`` (DeepSeekV3:
    FlashInfer's routingDeepSeek runs for n_group > 1 and checks ``mNumExperts / mNumExpertGroups <= WarpSize``)
    raises where Ling's shape fails that check (:func:`~nvfp4study.sglang.routing_shape.kernel_shape_fails`). Only
    when every sink call the run reached (of the parameter's table) is such a raising call: a branch reaching
    another kernel, a routed variant included, runs."""
    methods = param.applications.get("routing_methods", {})
    found: dict = {}
    for h in run.interp.hits if run.interp is not None else ():
        sink = param.sinks.get(h.callee)
        if sink is None or (h.file, h.line, h.callee) in found:
            continue
        names = routing_methods_of(h, sink, param) if sink.get("groups") else None
        bad = None  # another kernel (a routed variant, TopK's own routing ...): a branch that runs
        if names and all(pin in methods[m].get("checks_groups", {}) for m in names):
            fails = kernel_shape_fails(h, sink, param, names)
            if fails is not None:
                bad = (_short(h.file), h.line, f"{h.callee}() {fails} (flashinfer-python {pin} "
                       f"{methods[names[0]]['checks_groups'][pin]}: FLASHINFER_CHECK(mNumExperts / mNumExpertGroups "
                       "<= WarpSize))")
        found[(h.file, h.line, h.callee)] = bad
    return next(iter(found.values())) if found and all(found.values()) else None


def runnable_callers(tree: SGLangTree, spec: dict, specs: list[dict], clamp_by_id: dict[str, Any]) -> list[dict]:
    """``specs`` less the method paths that run a runner-level ``spec``'s backend but cannot run Ling: their
    clamp row (``clamp_by_id``, audited here where absent: an audit of some paths only) ABSENT, UNUSABLE or
    REFUSED. Such a method is no caller whose top-k decides the runner-level path's
    (:func:`~nvfp4study.sglang.param_audit.topk_fused`): 0.5.22 CompressedTensorsW8A8Fp8MoE reaches the routed
    TRT-LLM fused function with a quant info it raises a TypeError for (flashinfer_trtllm.py 1738-1766).
    ``specs`` unchanged for a method path."""
    from . import path_keys
    from .audit import audit_tree
    from .audit_sinks import ClampVerdict

    key = spec.get("via", spec["id"])
    if path_keys.method(key) is not None:
        return specs
    mine = [s["id"] for s in specs if "missing" not in s and path_keys.method(k := s.get("via", s["id"]))
            and path_keys.runner(k) == path_keys.runner(key)]
    rows = dict(clamp_by_id)
    todo = [i for i in mine if i not in rows]
    rows.update({r.path: r for r in audit_tree(tree, todo)} if todo else {})
    bad = {i for i in mine if getattr(rows.get(i), "verdict", None) in
           (ClampVerdict.ABSENT, ClampVerdict.UNUSABLE, ClampVerdict.REFUSED)}
    return [s for s in specs if s["id"] not in bad]


@lru_cache(maxsize=16)
def _custom_ops(root: Any, _stamp: tuple) -> dict[str, tuple[str, int, tuple[tuple[str, str], ...]]]:
    """``name -> (file, line, ((parameter, annotation), ...))`` of every function of ``sglang/srt``
    decorated ``@register_custom_op`` (with or without arguments), read once per state of the tree
    (``_stamp``: :func:`~nvfp4study.sglang.tree_files.tree_stamp`; a tree patched in place is read again)."""
    out = {}
    base = Path(root) / "sglang/srt"
    for f in sorted(base.rglob("*.py")):
        text = f.read_text(encoding="utf-8", errors="replace")
        if "@register_custom_op" not in text:
            continue
        for node in ast.walk(_module_of(f, text)):
            if isinstance(node, ast.FunctionDef) and any(
                    (d.func if isinstance(d, ast.Call) else d).__dict__.get("id") == "register_custom_op"
                    for d in node.decorator_list):
                args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                out.setdefault(node.name, ("sglang/srt/" + str(f.relative_to(base)), node.lineno, tuple(
                    (a.arg, unparse(a.annotation) if a.annotation is not None else "") for a in args)))
    return out


def _module_of(path: Path, text: str) -> ast.Module:
    """``ast.parse(text)`` of ``path``'s text (read with bad bytes replaced), taken from the audit's
    parse cache (:func:`~nvfp4study.sglang.clamp_values._parse`, the same tree: shared by every
    release and copy with the file's bytes) where the text is the file's strict UTF-8 with no BOM
    and no coding line; parsed here otherwise, or when the cache's parse fails, so a file that does
    not parse raises the SyntaxError it always did."""
    head = "\n".join(text.split("\n", 2)[:2])
    if "\ufffd" not in text and not text.startswith("\ufeff") and "coding" not in head:
        try:
            return _parse(path)
        except SyntaxError:
            pass
    return ast.parse(text)


def runner_device_spec(spec: dict, param: moe_params.ParamSpec) -> dict:
    """The path's spec restricted to the device classes its runner backend can run on
    (``applications.runner_devices``: {backend: [device class]}, data), so a branch of another device
    class (an XPU-only kernel call) does not decide the path; the spec unchanged where its backend is
    not listed or no listed class is one of the path's own (:data:`~nvfp4study.sglang.platforms.PLATFORMS`).

    Args:
        spec: one path spec of ``audit_run.path_specs`` (its ``via`` or ``id`` is a path key).
        param: the followed parameter.
    Returns:
        ``spec`` itself, or a copy whose ``platforms`` is the listed classes among the path's own.
    """
    table = param.applications.get("runner_devices") or {}
    listed = table.get(path_keys.runner(spec.get("via", spec["id"])) or "")
    own = tuple(spec.get("platforms", PLATFORMS))
    keep = tuple(p for p in own if p in (listed or ()))
    return {**spec, "platforms": keep} if keep and keep != own else spec


#: the dtype ``fused_marlin_moe`` tests for its MXFP4 branch (``is_mxfp4_marlin``: ``w1_scale.dtype ==
#: torch.float8_e8m0fnu``, fused_moe_triton/fused_marlin_moe.py 204-210 in 0.5.20)
E8M0 = "float8_e8m0fnu"


def _casts_to_e8m0(mod: Any, fn: ast.AST, depth: int = 2) -> bool:
    """Whether ``fn`` (of parsed module ``mod``) or a module-level function of ``mod`` it calls (as far
    as ``depth`` calls down) holds ``x.to(torch.float8_e8m0fnu)``."""
    for n in ast.walk(fn):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "to" \
                and any(unparse(a).endswith(E8M0) for a in n.args):
            return True
    if depth == 0:
        return False
    callees = {n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return any(_casts_to_e8m0(mod, mod.functions[c], depth - 1) for c in sorted(callees) if c in mod.functions)


def e8m0_scales(interp: Any) -> str | None:
    """``file:line name()`` of the first call the path ran (``interp.named_calls``, on the branches it took)
    to an in-tree function that casts to E8M0 (:func:`_casts_to_e8m0`): 0.5.20 ``Mxfp4MoEMethod.
    process_weights_after_loading`` calls ``prepare_moe_mxfp4_layer_for_marlin(layer)`` on its Marlin branch
    (mxfp4.py 618-643), whose scales go through ``mxfp4_marlin_process_scales``: ``.to(torch.float8_e8m0fnu)``
    (marlin_utils_fp4.py 224). None when no such call ran."""
    seen: set[int] = set()
    for mod, imports, name in interp.named_calls:
        if id(name) in seen:
            continue
        seen.add(id(name))
        src = imports.get(name.id) or mod.imports.get(name.id)
        target = interp.module_for(src[0]) if src else mod
        fn = target.functions.get(src[1] if src else name.id) if target is not None else None
        if fn is not None and _casts_to_e8m0(target, fn):
            return f"{_short(mod.rel)}:{name.lineno} {name.id}()"
    return None


__all__ = ["custom_op_rejects", "e8m0_scales", "routing_kernel_rejects", "run_post_permute", "runnable_callers",
           "runner_device_spec"]
