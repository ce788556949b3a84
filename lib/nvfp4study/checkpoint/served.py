"""The checkpoint SGLang's real engine serves on a CPU: BF16, every layer MLA, one MTP layer,
and a draft whose acceptance is known by construction.

Why all MLA: SGLang 0.5.23's KDA (linear attention) prefill has no CPU path
(``layers/attention/linear/kda_backend.py:1031`` always calls the Triton ``causal_conv1d_fn``;
paths relative to ``sglang/srt/`` of the 0.5.23 wheel), so the served shape is the given shape
with ``layer_group_size: 1`` (``(layer + 1) % 1 == 0`` on every layer,
``models/bailing_moe_v3.py:241`` ``is_linear_layer``). Everything else is kept: the layer count,
dense layers, experts, groups, shared expert, router bias, both clamp lists, the MTP layer, and
``short_conv_kernel_size`` in ``config.json`` (SGLang treats the model as Ling-V3 only with it:
``configs/bailing_hybrid.py:158`` ``use_kda``, read by ``models/bailing_moe_nextn.py:66``).

How SGLang computes the two predictions (0.5.23):

- target: ``lm_head(RMSNorm(h, model.norm.weight))``: ``models/bailing_moe_v3.py:1365``
  (``final_norm`` with ``self.norm``) and ``:1770`` (``logits_processor`` with ``self.lm_head``);
- MTP draft (``models/bailing_moe_nextn.py``): ``x = eh_proj(cat(enorm(embed(token)),
  hnorm(target hidden)))`` (:152-163), one MLA + MoE decoder layer with residuals (:176),
  ``RMSNorm(., final_layernorm.weight)`` (:187), then the TARGET's ``lm_head`` and embeddings (the
  EAGLE worker shares them: ``speculative/eagle_worker_v2.py:378`` ``set_embed_and_head``);
  the MTP layer's own ``shared_head``/``embed_tokens`` are skipped (``models/bailing_moe_v3.py:275``).
- RMSNorm is ``x / rms(x) * weight`` (no ``1 + weight``); greedy picks the first maximal logit.

Draft constructions (``draft=``):

- ``"agree"``: ``model.norm.weight = 0`` and the MTP ``final_layernorm.weight = 0``: both logit
  vectors are exactly 0, both argmaxes are token 0 (``!``, never a special token: :mod:`.tokenizer`
  puts those at the top). Every draft token is accepted: accept length k + 1 with k draft steps.
- ``"disagree"``: the target as in "agree" (always token 0); the draft always proposes token
  :data:`DISAGREE_TOKEN` (1): ``word_embeddings[:, 0] > 0`` and ``enorm.weight[0] = 1`` make the
  first input feature positive for every token; ``eh_proj`` keeps only that feature
  (``eh_proj[0, 0] = 1``, else 0), the MTP layer adds nothing to the residual stream
  (``attention.dense`` and every ``down_proj`` of its experts and shared expert are 0), so after
  ``final_layernorm`` (weight 1) the hidden state is ``c * e_0`` with ``c > 0``; ``lm_head[:, 0]`` is
  0 except ``lm_head[1, 0] = 1``, so the draft logits are ``c`` at token 1 and 0 elsewhere. The
  target's logits do not depend on ``lm_head`` (its input is 0). Accept length 1.00, rate 0.00.
- ``"random"``: the generator's random weights (:mod:`.generate`), all-MLA shape.

The clamp probe (:func:`probe_shape`): the ``"random"`` model with its clamp lists replaced, so
its launches differ only in ``config.json``: ``"routed"`` (limit on every MoE layer's routed
experts), ``"shared"`` (on every shared expert) and ``"off"`` (nowhere; stage 04 launches it twice). SGLang reads each layer's
entry (``models/bailing_moe_v3.py`` 435-439, 469-478: 0 is no clamp) and hands the routed one to
FusedMoE as ``gemm1_clamp_limit`` (578); the shared expert applies it in ``BailingMLP.forward``
(371-374: ``silu(gate).clamp(max=L) * up.clamp(-L, L)``). With a limit far below the activations'
size, a clamp that is applied changes the outputs; the shared launch shows how often it does.

The routed-scaling probe (:data:`SCALING_PROBES`, ``scaling_probe=(kind, ratio)``): the clamp
probe's ``"off"`` model (same weights, no clamp lists) with ``"factor"``: ``routed_scaling_factor``
x ratio in ``config.json`` only (SGLang reads it at ``models/bailing_moe_v3.py`` 463), or
``"weights"``: every routed expert's ``down_proj`` x ratio, the factor unchanged (the positive
control: what an applied factor x ratio would do to the routed output). With ratio a power of two
both are exact in BF16/FP32, so a factor applied once gives the weights launch's outputs bit for bit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..core.errors import ServedCheckpointError
from ..core.params import LingShape
from .generate import write_checkpoint

DRAFTS = ("agree", "disagree", "random")
#: the token every target of the "agree"/"disagree" constructions picks (first of equal logits).
TARGET_TOKEN = 0
#: the token the "disagree" draft always proposes.
DISAGREE_TOKEN = 1


def served_shape(shape: LingShape | None = None) -> LingShape:
    """``shape`` (default: ``params/default.yaml``'s ``checkpoint.shape``, no overlay) with
    ``layer_group_size`` 1: every layer MLA.

    Raises:
        ServedCheckpointError: the shape has no MTP layer (``num_nextn_predict_layers`` != 1).
        ShapeInvalid: the served shape breaks a rule of ``shape_problems``.
    """
    if shape is None:
        from ..core.params import load_params

        shape = load_params(None, overlay=False).checkpoint.shape
    if shape.num_nextn_predict_layers != 1:
        raise ServedCheckpointError(f"the served checkpoint needs exactly one MTP layer "
                                    f"(num_nextn_predict_layers is {shape.num_nextn_predict_layers})")
    return LingShape.model_validate({**shape.model_dump(), "layer_group_size": 1})


CLAMP_PROBES = ("off", "routed", "shared")
SCALING_PROBES = ("factor", "weights")


def probe_shape(shape: LingShape, probe: str, limit: float) -> LingShape:
    """``shape`` with its clamp lists set for clamp probe ``probe`` (module docstring): ``limit`` on
    every MoE layer (``first_k_dense_replace`` .. ``num_hidden_layers - 1``) of the routed list
    ("routed") or of the shared list ("shared"), the other list (both for "off") empty.

    Args:
        shape: the served shape (or any Ling shape); not modified.
        probe: one of :data:`CLAMP_PROBES`.
        limit: the clamp limit, finite and > 0.

    Raises:
        ServedCheckpointError: an unknown probe, or a limit that is not a finite number > 0.
    """
    if probe not in CLAMP_PROBES:
        raise ServedCheckpointError(f"clamp probe must be one of {', '.join(CLAMP_PROBES)}, got {probe!r}")
    if isinstance(limit, bool) or not isinstance(limit, int | float) or not 0 < limit < float("inf"):
        raise ServedCheckpointError(f"the clamp probe's limit must be a finite number > 0, got {limit!r}")
    moe = {i: float(limit) for i in range(shape.first_k_dense_replace, shape.num_hidden_layers)}
    return LingShape.model_validate({**shape.model_dump(),
                                     "expert_swiglu_limits": moe if probe == "routed" else {},
                                     "share_expert_swiglu_limits": moe if probe == "shared" else {}})


def _editor(shape: LingShape, draft: str) -> Any:
    """The ``edit(name, tensor)`` of :func:`write_checkpoint` for ``draft`` (None for random)."""
    if draft == "random":
        return None
    mtp = f"model.layers.{shape.num_hidden_layers}."

    def edit(name: str, t: Any) -> Any:
        if name == "model.norm.weight" or (draft == "agree" and name == mtp + "final_layernorm.weight"):
            return t.zero_()
        if draft != "disagree":
            return t
        if name == "model.word_embeddings.weight":
            t[:, 0] = t[:, 0].abs() + 0.02
        elif name == mtp + "enorm.weight":
            t.zero_()[0] = 1
        elif name == mtp + "eh_proj.weight":
            t.zero_()[0, 0] = 1
        elif name == mtp + "attention.dense.weight" or (name.startswith(mtp + "mlp.")
                                                        and name.endswith("down_proj.weight")):
            t.zero_()
        elif name == mtp + "final_layernorm.weight":
            t.fill_(1)
        elif name == "lm_head.weight":
            t[:, 0] = 0
            t[DISAGREE_TOKEN, 0] = 1
        return t

    return edit


def _scaling_editor(ratio: float) -> Any:
    """``edit(name, tensor)``: every routed expert's ``down_proj`` (``.mlp.experts.<e>.down_proj``,
    MTP layer included; not the shared expert's) multiplied by ``ratio``."""
    def edit(name: str, t: Any) -> Any:
        return t.mul_(ratio) if ".mlp.experts." in name and name.endswith(".down_proj.weight") else t

    return edit


def _check_scaling_probe(scaling_probe: Any, draft: str) -> None:
    """Raises ServedCheckpointError unless ``scaling_probe`` is ``(kind, ratio)`` with a kind of
    :data:`SCALING_PROBES`, a finite ratio > 0 other than 1, and the random draft."""
    ok = isinstance(scaling_probe, tuple | list) and len(scaling_probe) == 2 and \
        scaling_probe[0] in SCALING_PROBES and isinstance(scaling_probe[1], int | float) and \
        not isinstance(scaling_probe[1], bool) and 0 < scaling_probe[1] < float("inf") and scaling_probe[1] != 1
    if not ok or draft != "random":
        raise ServedCheckpointError(f"scaling_probe must be (kind in {SCALING_PROBES}, ratio > 0, != 1) on the "
                                    f"random draft, got {scaling_probe!r} with draft {draft!r} (nothing was written)")


def write_served_checkpoint(out_dir: Path, shape: LingShape | None = None, *, seed: int = 0,
                            draft: str = "random", clamp_probe: tuple[str, float] | None = None,
                            scaling_probe: tuple[str, float] | None = None) -> Path:
    """Write the checkpoint the CPU engine serves (module docstring): BF16, all layers MLA, the
    MTP (NEXTN) layer, the generated tokenizer, one shard.

    Args:
        out_dir: folder to create; must not exist (written beside it in a temporary folder and
            renamed at the end: a failure leaves nothing).
        shape: sizes; default ``params/default.yaml``'s shape. Not modified: the served shape is a
            copy with ``layer_group_size`` 1 (:func:`served_shape`).
        seed: random seed of every tensor the construction does not set.
        draft: ``"agree"`` (accept length k + 1), ``"disagree"`` (accept length 1, rate 0) or
            ``"random"``; recorded in ``config.json`` under ``_nvfp4study.served``.
        clamp_probe: ``(probe, limit)``: the clamp lists of :func:`probe_shape` (the weights are
            those of the same draft and seed without it); recorded beside ``draft``.
        scaling_probe: ``(kind, ratio)`` (module docstring; random draft only): ``"factor"``
            multiplies ``config.json``'s ``routed_scaling_factor``, ``"weights"`` the routed
            experts' ``down_proj``, by ``ratio``; recorded beside ``draft``.

    Returns:
        ``out_dir`` as a Path. Tensors: BF16 except ``A_log``/``dt_bias`` (none here: no KDA) and
        the router ``expert_bias`` (F32), shapes as :func:`.layout.tensor_specs`.

    Raises:
        ServedCheckpointError: unknown ``draft``, clamp or scaling probe, a probe limit that is
            not > 0, a scaling ratio not > 0 or 1, or a shape without exactly one MTP layer.
        ShapeInvalid: the served shape breaks a rule of ``shape_problems``.
        OutputExists: ``out_dir`` exists.
    """
    if draft not in DRAFTS:
        raise ServedCheckpointError(f"draft must be one of {', '.join(DRAFTS)}, got {draft!r} "
                                    "(nothing was written)")
    s = served_shape(shape)
    if clamp_probe is not None:
        if not isinstance(clamp_probe, tuple | list) or len(clamp_probe) != 2:
            raise ServedCheckpointError(f"clamp_probe must be (probe, limit), got {clamp_probe!r} (nothing was written)")
        s = probe_shape(s, *clamp_probe)
    if scaling_probe is not None:
        _check_scaling_probe(scaling_probe, draft)
    extra = {"served": {"draft": draft, "layer_group_size": 1,
                        "target_token": TARGET_TOKEN if draft != "random" else None,
                        "draft_token": {"agree": TARGET_TOKEN, "disagree": DISAGREE_TOKEN}.get(draft),
                        "clamp_probe": None if clamp_probe is None else
                        {"probe": clamp_probe[0], "limit": float(clamp_probe[1])}}}
    if scaling_probe is not None:
        extra["served"]["scaling_probe"] = {"kind": scaling_probe[0], "ratio": float(scaling_probe[1])}
    if scaling_probe is None or scaling_probe[0] != "factor":
        edit = _scaling_editor(float(scaling_probe[1])) if scaling_probe else _editor(s, draft)
        return write_checkpoint(s, out_dir, shards=1, seed=seed, edit=edit, config_extra=extra)
    return _with_factor(s, Path(out_dir), seed, extra, float(scaling_probe[1]))


def _with_factor(s: LingShape, out_dir: Path, seed: int, extra: dict, ratio: float) -> Path:
    """The random-weight checkpoint with ``config.json``'s ``routed_scaling_factor`` x ``ratio``:
    written beside ``out_dir`` (``.partial``), the config edited there, then renamed into place, so
    no folder with the unchanged factor ever stands at ``out_dir``.

    Raises:
        OutputExists: ``out_dir`` exists.
    """
    import json
    import shutil

    from ..core.errors import OutputExists
    from ..core.files import write_json

    if out_dir.exists():
        raise OutputExists(f"{out_dir} exists; nothing was written")
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    write_checkpoint(s, tmp, shards=1, seed=seed, edit=None, config_extra=extra)
    cfg = tmp / "config.json"
    data = json.loads(cfg.read_text())
    data["routed_scaling_factor"] = data["routed_scaling_factor"] * ratio
    write_json(cfg, data)
    tmp.rename(out_dir)
    return out_dir


# --- CLI -----------------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    """``nvfp4study make-served-checkpoint OUT [--draft agree|disagree|random] [--params FILE] [--seed N]``"""
    ap = argparse.ArgumentParser(
        prog="nvfp4study make-served-checkpoint",
        description="Write the BF16 all-MLA checkpoint with an MTP layer that SGLang serves on a CPU, "
                    "with a draft of known acceptance.",
        epilog="example: nvfp4study make-served-checkpoint /tmp/ling-served --draft agree",
    )
    ap.add_argument("out", help="folder to create (must not exist)")
    ap.add_argument("--draft", choices=DRAFTS, default="random",
                    help="agree: accept length k+1; disagree: accept length 1; random: random weights")
    ap.add_argument("--params", help="params YAML whose checkpoint.shape/seed are used "
                    "(default: params/default.yaml)")
    ap.add_argument("--seed", type=int, help="random seed (default: from params)")
    args = ap.parse_args(argv)
    from ..core.params import load_params

    cp = load_params(args.params, overlay=False).checkpoint
    out = write_served_checkpoint(Path(args.out), cp.shape, seed=cp.seed if args.seed is None else args.seed,
                                  draft=args.draft)
    print(f"wrote {out}: served checkpoint, draft {args.draft}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
