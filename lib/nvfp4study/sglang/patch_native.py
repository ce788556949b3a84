"""The CPU engine's native MoE patches: axes of patch modes that combine with any clamp mode and
with ``det`` (:mod:`nvfp4study.sglang.patch` applies, journals and reverts them like the others).

SGLang 0.5.23's CPU engine runs Ling's routed experts through
``UnquantizedFusedMoEMethod.forward_cpu`` (``srt/layers/quantization/unquant.py`` 1342-1391)
-> ``moe_forward_native`` (``srt/layers/moe/fused_moe_native.py`` 61-164), which uses
``gemm1_clamp_limit`` only beside ``gemm1_alpha`` (129-140): Bailing sets no alpha, so the routed
clamp is dropped there. Axis ``moe_clamp`` (patch set ``patches/0.5.23/native-clamp-*``, one file,
``fused_moe_native.py``): ``exact`` adds Ling's post-SiLU form
``min(silu(g), L) * clamp(u, -L, L)`` for activation silu with a limit and no alpha, ``approx`` the
pre-SiLU (GPT-OSS) form ``silu(min(g, L)) * clamp(u, -L, L)`` (``clamp_numerics`` forms ``post`` and
``pre``); both through a function ``nvfp4study_swiglu_clamp``, a sink of the audit whose form is
read from its body (``data/sglang_clamp_paths.yaml``).

Axis ``routed_scaling`` (``patches/0.5.23/native-routed-scaling``, ``unquant.py``): ``applied``
multiplies the routed output by ``routed_scaling_factor`` once. Where 0.5.23 applies the factor
for Bailing and where not: ``models/bailing_moe_v3.py`` 463 reads it from the config and hands it
to FusedMoE (576, into ``MoeRunnerConfig.routed_scaling_factor``:
``layers/moe/fused_moe_triton/layer.py`` 473) and to TopK (590) with
``apply_routed_scaling_factor_on_output = experts.should_fuse_routed_scaling_factor_in_topk``
(591-593), which ``layer.py`` 109-131 / 615-617 makes False for ``UnquantizedFusedMoEMethod`` (no
``fuse_routed_scaling_factor_in_topk``, not ModelOpt NVFP4, no TRT-LLM or FP8-CUTLASS runner): the
top-k weights carry no factor (``layers/moe/topk.py`` 2845-2848, 2934-2962 pass the False flag;
the fold at 3104-3111 needs it True). The Triton runner would apply it in its combine
(``moe_runner/triton.py`` 111; ``moe_runner/triton_utils/fused_moe.py`` 392, 405-407), but
``forward_cpu`` (``unquant.py`` 1382-1391) calls ``moe_forward_native``, which never reads it
(``fused_moe_native.py`` 61-164: the sum at 157-163 weighs by the top-k weights only; the AMX
branch, 1361-1380, passes no factor either); ``BailingMoE`` scales the routed output itself only
on the all-to-all (DeepEP) path (``bailing_moe_v3.py`` 609-614, 841-852), not in
``forward_normal`` (713-742, shared output added unscaled at 740-741). So the factor is applied
nowhere on the CPU engine's path; the patch applies it after ``moe_forward_native`` unless
``layer.should_fuse_routed_scaling_factor_in_topk`` says top-k already did (never double).

Each axis's other value is :data:`RELEASED`: no patch.
"""

from __future__ import annotations

from typing import Any

from ..core.errors import PatchConflict, UnknownPatchMode

#: axis -> {value: patch mode}; each axis edits its own files, so axes combine freely.
NATIVE_AXES: dict[str, dict[str, str]] = {
    "moe_clamp": {"exact": "native-clamp-exact", "approx": "native-clamp-approx"},
    "routed_scaling": {"applied": "native-routed-scaling"},
}
#: patch mode -> (axis, value)
NATIVE_MODES: dict[str, tuple[str, str]] = {m: (axis, v) for axis, vals in NATIVE_AXES.items()
                                            for v, m in vals.items()}
RELEASED = "released"


def side_files(modes: dict[str, Any]) -> set[str]:
    """Files of a manifest's ``modes`` that combine with a clamp mode (``det`` and the native
    modes): the clamp mode of a tree is read from the other files."""
    return {e["path"] for m in ("det", *NATIVE_MODES) for e in modes.get(m, {"files": []})["files"]}


def native_state(modes: dict[str, Any], states: dict[str, Any]) -> dict[str, str]:
    """Each native axis a manifest's ``modes`` has a patch for -> :data:`RELEASED` (its files
    original), the value whose patch all its files carry, or ``"modified"``; ``states`` maps a file
    to its :class:`~nvfp4study.sglang.patch.FileState` (``.state``: ``original``,
    ``patched:<mode>``, ``modified``, ``missing``)."""
    out = {}
    for axis, vals in NATIVE_AXES.items():
        files = {v: [e["path"] for e in modes[m]["files"]] for v, m in vals.items() if m in modes}
        if not files:
            continue
        paths = {p for ps in files.values() for p in ps}
        if all(states[p].state == "original" for p in paths):
            out[axis] = RELEASED
            continue
        out[axis] = next((v for v, ps in files.items()
                          if all(states[p].state == f"patched:{vals[v]}" for p in ps)
                          and all(states[p].state == "original" for p in paths - set(ps))), "modified")
    return out


def native_steps(before: dict[str, str], native: dict[str, str] | None,
                 version: str) -> list[tuple[str, bool]]:
    """The ``(mode, apply?)`` steps that take the native axes from ``before`` (a status's
    ``native``) to ``native`` (axis -> value; axes not named stay as they are): the applied
    value's mode reverted first, then the wanted one applied.

    Raises:
        UnknownPatchMode: an unknown axis or value, or a value the version has no patch for.
        PatchConflict: an axis named whose files are in no known state.
    """
    steps: list[tuple[str, bool]] = []
    for axis, want in (native or {}).items():
        vals = NATIVE_AXES.get(axis)
        if vals is None or (want != RELEASED and want not in vals):
            choices = {a: [RELEASED, *v] for a, v in NATIVE_AXES.items()}
            raise UnknownPatchMode(f"native {axis}={want!r}; axes and values: {choices}")
        cur = before.get(axis)
        if cur is None:
            if want == RELEASED:
                continue
            raise UnknownPatchMode(f"SGLang {version} has no patch for native {axis}")
        if cur == "modified":
            raise PatchConflict(f"the native {axis} files are in no known state; refusing to switch")
        if cur != want:
            steps += [(vals[cur], False)] if cur != RELEASED else []
            steps += [(vals[want], True)] if want != RELEASED else []
    return steps
