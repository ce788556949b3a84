"""Whether BailingMoeV3 fuses Ling's shared expert into the routed FusedMoE, per MoE path (``ast``
only), and the runner and method checks that raise on a fused shared expert.

BailingMoeV3 runs its one shared expert as an extra routed slot of the FusedMoE
(``num_fused_shared_experts`` 1, top-k + 1; ``models/bailing_moe_v3.py`` 565-580 in 0.5.23) unless
its gate ``shared_experts_fusion_disable_reason`` (1429-1515 in 0.5.23, 1354-1440 in 0.5.19)
returns a reason, consulted before the model is built (``layers/moe/utils.py``
``resolve_shared_experts_config`` 601-623 in 0.5.23, ``install_shared_experts_fusion_decision``
515-545 in 0.5.19) unless ``--disable-shared-experts-fusion`` is given or the server arguments force it
(:mod:`.fusion_overrides`: 0.5.20 ``arg_groups/overrides.py`` 1575-1620 for the FlashInfer CuteDSL and
TRT-LLM runners and some all-to-all backends). The gate vetoes fusion for
an all-to-all backend, another architecture, a device that is not CUDA >= (8, 0) or ROCm >= (9, 4),
a ``w4afp8`` or ``is_fp4_experts`` quant config, a compressed-tensors ignore list that treats the
shared and routed experts differently, different intermediate sizes, or FP8 blocks that do not
divide the per-partition intermediate size.

:func:`path_fusion` first replays the server arguments' forced writes
(:func:`~nvfp4study.sglang.fusion_overrides.forced_off`, with the path's runner and all-to-all
backend), then the gate for one path: the all-to-all backend of its key, the device
classes it runs on, the quant config its dispatch trail names (the config's ``get_name``), and
Ling's values the source does not hold (``data/sglang_clamp_paths.yaml`` ``shared_fusion``: the
model's config.json values, the server's default TP size, the card's ignore list). The answer is
a path fact (``num_fused_shared_experts``) the interpreter reads, so a runner check that raises on
it (:func:`fusion_refusals`: hpc_ops' ``_check_runner_config_supported``, 0.5.20
``layers/moe/moe_runner/hpc_ops.py`` 102-105, before its clamp check 116-124) ends the branch.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from . import path_keys
from .clamp_values import _parse as parse_file
from .code_index import SRT, source_files, walk
from .fusion_overrides import forced_off
from .platforms import PLATFORMS
from .source import SGLangTree
from .tree_files import tree_stamp

MODEL = "models/bailing_moe_v3.py"
GATE = "shared_experts_fusion_disable_reason"
#: the fact the interpreter reads (``runner_config.num_fused_shared_experts``, ``layer.num_fused_shared_experts``)
FACT = "num_fused_shared_experts"
#: ``layers/quantization/__init__.py:63 'fp8' -> Fp8Config.get_quant_method -> ...``: the config class
_TRAIL = re.compile(r"'[\w-]+' -> (\w+)\.get_")


@dataclass(frozen=True)
class Fusion:
    """One path's fusion decision: ``fused`` the number of shared experts fused (0: not fused,
    None: the source does not decide it for this path), ``why`` with the gate's file:line."""

    fused: int | None
    why: str
    #: ``file:line`` of the server-argument write that forced fusion off (:mod:`.fusion_overrides`)
    forced: str | None = None


def _gate(root: Path) -> ast.FunctionDef | None:
    p = Path(root) / SRT / MODEL
    mod = parse_file(p) if p.is_file() else None
    return next((n for n in walk(mod) if isinstance(n, ast.FunctionDef) and n.name == GATE), None) if mod else None


def _vetoes(fn: ast.FunctionDef) -> dict[str, int]:
    """``{kind: line}`` of each test of the gate that returns a reason: ``a2a``, ``arch``, ``device``,
    ``quant`` (named configs and ``is_fp4_experts``), ``ignore``, ``sizes``, ``block``."""
    kinds = [("a2a", "a2a_backend"), ("arch", "architectures"), ("device", "get_device_capability"),
             ("quant", "is_fp4_experts"), ("ignore", "compressed_tensors"), ("sizes", "intermediate_size"),
             ("block", "weight_block_size")]
    out: dict[str, int] = {}
    for node in walk(fn):
        if isinstance(node, ast.If):
            text = ast.unparse(node.test)
            for kind, word in kinds:
                if word in text and kind not in out:
                    out[kind] = node.lineno
    return out


def _vetoed_names(fn: ast.FunctionDef) -> set[str]:
    """The quant config names the gate vetoes outright (``quant_config.get_name() == "w4afp8"``)."""
    out = set()
    for node in walk(fn):
        if isinstance(node, ast.If) and "is_fp4_experts" in ast.unparse(node.test):
            out |= {c.value for c in walk(node.test) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                    and c.value not in ("is_fp4_experts",)}
    return out


def config_names(root: Path, cls: str) -> set[str]:
    """The names ``cls.get_name`` returns (its string ``return`` constants; ``Fp8Config``: ``mxfp8``
    or ``fp8``, fp8.py 322-323 in 0.5.23), from the class's own definition (not a fallback alias
    such as 0.5.19's ``CompressedTensorsConfig = DummyConfig``, quantization/__init__.py 19);
    empty when the class or method is not found. Read once per class and state of the tree (the
    audit asks once per path)."""
    return set(_config_names(Path(root), cls, tree_stamp(root)))


@lru_cache(maxsize=512)  # per class and tree state: a few dozen classes, a few states
def _config_names(root: Path, cls: str, stamp: tuple) -> frozenset[str]:
    maybe = _spelled_after_class(root, stamp).files_with(cls)
    for path, text in source_files(root):
        if path.as_posix() not in maybe or f"class {cls}" not in text:
            continue
        node = next((n for n in walk(parse_file(path)) if isinstance(n, ast.ClassDef) and n.name == cls), None)
        fn = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "get_name"), None) if node else None
        if fn is not None:
            return frozenset(c.value for r in walk(fn) if isinstance(r, ast.Return) for c in walk(r)
                             if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return frozenset()


class _ClassWords:
    """The first :data:`_KEPT` characters after each ``class `` of a tree's texts (every occurrence,
    overlapping ones included), with the files they are in: a text containing ``class X`` has one
    that starts ``X`` (or is ``X``'s first characters), so :meth:`files_with` holds every file the
    text test can pass (it is still made: the index only skips the others)."""

    def __init__(self, files: list[tuple[Path, str]]):
        self.by_start: dict[str, set[str]] = {}
        for path, text in files:
            at = text.find("class ")
            while at != -1:
                self.by_start.setdefault(text[at + 6:at + 6 + _KEPT], set()).add(path.as_posix())
                at = text.find("class ", at + 1)

    def files_with(self, cls: str) -> set[str]:
        """The files (``as_posix``) where ``class `` is followed by ``cls``'s first characters."""
        if len(cls) >= _KEPT:
            return self.by_start.get(cls[:_KEPT], set())
        return set().union(*(f for start, f in self.by_start.items() if start.startswith(cls)))


_KEPT = 8  # characters kept after each "class ": a class name's first eight pick a few files


@lru_cache(maxsize=16)  # one index per tree state: each class asked for scanned every text before
def _spelled_after_class(root: Path, _stamp: tuple) -> _ClassWords:
    return _ClassWords(source_files(root))


def path_fusion(root: Path, spec: dict, data: dict, card_ignored: tuple[bool, bool] | None) -> Fusion:  # noqa: C901
    """The fusion decision for the audit path ``spec`` (:func:`~nvfp4study.sglang.audit.path_specs`)
    in the tree at ``root``.

    ``data``: the catalogue's ``shared_fusion`` section (Ling's values, device classes the gate's
    capability test passes on, runner device limits). ``card_ignored``: (shared, routed) ignored
    under the card's ignore list by the tree's ``should_ignore_layer`` (None: not evaluated).
    """
    key = spec.get("via", spec["id"])
    # the server arguments come first: a forced --disable-shared-experts-fusion skips the gate
    if forced := forced_off(root, path_keys.runner(key), path_keys.a2a(key), tuple(data.get("server_unknown", ()))):
        o = forced[0]
        return Fusion(0, f"--disable-shared-experts-fusion forced by the server arguments' {o.function} "
                         f"({o.where}, {o.test})", forced=o.where)
    fn = _gate(root)
    if fn is None:
        return Fusion(0, f"{MODEL}: no {GATE}: fusion is not decided by a Bailing gate")
    at = _vetoes(fn)
    line = lambda k: f"{MODEL}:{at.get(k, fn.lineno)}"  # noqa: E731
    model = data["model"]
    if path_keys.a2a(key) != "none":
        return Fusion(0, f"all-to-all backend {path_keys.a2a(key)!r}: vetoed ({line('a2a')})")
    if model["moe_shared_expert_intermediate_size"] != model["moe_intermediate_size"]:
        return Fusion(0, f"shared and routed intermediate sizes differ ({line('sizes')})")
    trail = next((m.group(1) for t in spec.get("found_by", []) if (m := _TRAIL.search(t))), None)
    names = config_names(root, trail) if trail else set()
    size = model["moe_intermediate_size"] // data["tp_size"]
    if names & _vetoed_names(fn):
        return Fusion(0, f"{trail} ({'/'.join(sorted(names))}): vetoed ({line('quant')})")
    if "compressed_tensors" in names and card_ignored is not None and card_ignored[0] != card_ignored[1]:
        return Fusion(0, f"{trail}: the card's ignore list keeps the shared experts BF16 and quantizes the "
                         f"routed ones: vetoed ({line('ignore')})")
    devices = set(spec.get("platforms") or PLATFORMS)
    limit = data.get("runner_devices", {}).get(path_keys.runner(key) or "")
    devices &= set(limit["devices"]) if limit else devices
    on = devices & set(data["fuses_on"])
    if not on:
        return Fusion(0, f"off on {'/'.join(sorted(devices))} (the gate's device test, {line('device')})")
    if on != devices:
        return Fusion(None, f"the device decides: on on {'/'.join(sorted(on))}, off on "
                            f"{'/'.join(sorted(devices - on))} ({line('device')})")
    if trail is None:
        return Fusion(None, "no quantization config on this path's trail (a runner-level entry: its callers' "
                            f"configs decide the gate's quant tests, {line('quant')})")
    if "compressed_tensors" in names and card_ignored is None:
        return Fusion(None, f"{trail}: the checkpoint's ignore list decides ({line('ignore')})")
    if "fp8" in names and size % data["fp8_block"]:
        return Fusion(None, f"{trail}: FP8 blocks of {data['fp8_block']} do not divide {size} ({line('block')})")
    where = f"{'/'.join(sorted(on))}, {trail}" + (f" (FP8 blocks of {data['fp8_block']} divide {size} at "
                                                   f"TP {data['tp_size']}, {line('block')})" if "fp8" in names else "")
    return Fusion(int(model["num_shared_experts"]), f"fused: BailingMoeV3's gate passes on {where} ({MODEL}:{fn.lineno})")


def with_fusion(tree: SGLangTree, specs: list[dict], data: dict) -> list[dict]:
    """``specs`` (:func:`~nvfp4study.sglang.audit.path_specs`), each path present in the tree given
    its :func:`path_fusion` (``fusion``) and, where decided, the fact ``num_fused_shared_experts``
    in its ``assume``. The card's ignore list (:func:`nvfp4study.checkpoint.recipe.card_ignore`) is
    replayed with the tree's ``should_ignore_layer`` (:func:`nvfp4study.sglang.checks.shared_fusion`)."""
    from ..checkpoint.recipe import card_ignore
    from .checks import shared_fusion

    ev = shared_fusion(tree, {"card": card_ignore(int(data["model"]["num_hidden_layers"]))})["evaluations"]
    card = (ev["card"]["shared_ignored"], ev["card"]["routed_ignored"]) if "card" in ev else None
    for sp in specs:
        if "missing" in sp:
            continue
        sp["fusion"] = path_fusion(tree.root, sp, data, card)
        if sp["fusion"].fused is not None:
            sp["assume"] = {**(sp.get("assume") or {}), FACT: sp["fusion"].fused}
    return specs


def fusion_noted(root: Path, spec: dict, row: Any) -> Any:
    """``row`` (an ``audit.PathResult`` of ``spec``) with its path's fusion decision added to the
    rule where it stops at a check on ``num_fused_shared_experts`` (:func:`fusion_refusals`), or
    where the server arguments forced fusion off on a path whose steps run a file holding such a
    check (the check then passes: the row cites the write that made it pass)."""
    fusion = spec.get("fusion")
    if fusion is None or fusion.fused is None:
        return row
    if (row.file, row.line) in fusion_refusals(root):
        return replace(row, rule=f"{row.rule} (Ling's shared expert is fused here: {fusion.why})")
    files = {s.split("::", 1)[0] for s in spec.get("steps", [])}
    if fusion.forced and files & {f for f, _ in fusion_refusals(root)}:
        return replace(row, rule=f"{row.rule} (Ling's shared expert is not fused here: {fusion.why})")
    return row


@lru_cache(maxsize=16)
def _refusals(root: Path, _stamp: tuple) -> frozenset[tuple[str, int]]:
    out = set()
    for path, text in source_files(root):
        rel = path.relative_to(Path(root) / SRT).as_posix()
        if FACT not in text or not rel.startswith(("layers/moe/", "layers/quantization/")):
            continue
        for node in walk(parse_file(path)):
            if isinstance(node, ast.If) and FACT in ast.unparse(node.test):
                first = node.body[0]
                if isinstance(first, ast.Raise):
                    out.add((rel, first.lineno))
            elif isinstance(node, ast.Assert) and FACT in ast.unparse(node.test):
                out.add((rel, node.lineno))
    return frozenset(out)


def fusion_refusals(root: Path) -> frozenset[tuple[str, int]]:
    """``{(file, line)}`` (relative to ``sglang/srt``) of every ``raise`` directly under an ``if``
    testing ``num_fused_shared_experts`` and every ``assert`` testing it, under ``layers/moe/`` and
    ``layers/quantization/`` (0.5.20: hpc_ops.py 103, flashinfer_trtllm.py 1559, expert_pack.py 99)."""
    return _refusals(Path(root), tree_stamp(root))


__all__ = ["FACT", "Fusion", "config_names", "fusion_noted", "fusion_refusals", "path_fusion", "with_fusion"]
