"""The physical bound: decode tok/s cannot exceed memory bandwidth / bytes read per token.

Derivation. Decoding one request (batch 1) is memory-bound: every forward pass streams the
weights it uses from GPU memory once, and at batch 1 the arithmetic is far below the compute
roof, so the time of a pass is at least ``bytes read / bandwidth``. Bytes read per pass, from the
served layout (:func:`nvfp4study.checkpoint.layout.tensor_specs` of the shape, quantized by
:func:`nvfp4study.checkpoint.recipe.nvfp4_specs`: every quantized ``[o, i]`` projection is
``weight_packed`` U8 ``[o, i/2]`` + ``weight_scale`` F8_E4M3 ``[o, i/16]`` + F32 global scales):

- ``W_dense``: every tensor of the main layers that is not a routed expert (attention, norms,
  router and expert bias, the shared expert, the dense MLPs, final norm) and ``lm_head``, all
  read whole;
- ``W_expert``: the bytes of ONE routed expert (gate/up/down with their block and global scales)
  summed over the main MoE layers; a token's router picks ``top_k = num_experts_per_tok`` of
  ``num_experts`` per layer, so a token reads ``top_k x W_expert``;
- ``W_embed``: one row of ``word_embeddings`` per token (a lookup, not a matmul);
- ``W_draft``: what one NEXTN draft step reads: the MTP layer (BF16 in the card's recipe: its
  non-expert tensors whole, ``top_k`` of its experts) plus ``lm_head`` and one embedding row.

Without speculation one pass decodes one token::

    bytes/token = W_dense + top_k * W_expert + W_embed,   ceiling = B / bytes/token

With NEXTN depth k (``--speculative-num-steps k``, ``--speculative-num-draft-tokens k+1``) a
cycle runs k draft steps and one verify pass of k+1 tokens. The verify pass reads the dense
weights once for all k+1 tokens; its routed experts are the union of the tokens' choices, between
``top_k`` (every token picks the same experts: the ceiling, ``distinct = top_k``) and
``min(E, (k+1) * top_k)``; under independent uniform routing the expected union is
``E * (1 - (1 - top_k/E)^(k+1))`` (given beside the ceiling). Expected tokens per cycle =
accept length L (accepted drafts + the bonus token)::

    bytes/cycle = W_dense + distinct * W_expert + (k+1) * W_embed + k * W_draft
    ceiling     = B * L / bytes/cycle

Not counted, so the true limit is lower still: KV cache and KDA state reads, activations, kernel
launch gaps, and the sampling pass. Units: bytes, bytes/s (vendor figures are decimal: 1 TB/s =
1e12 B/s), tok/s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..checkpoint.layout import EXPERT_RE, LAYER_RE, spec_nbytes, tensor_specs
from ..checkpoint.recipe import nvfp4_specs
from ..core.errors import StudyError
from ..core.params import LingShape

_NOT_VERIFIED = ("NVIDIA's product page figure as quoted by the third-party page cited; the vendor page itself "
                 "was not reachable from the study's machine (no network): check it there")

#: Memory bandwidth of GPUs by name (decimal GB/s), with where the figure comes from.
GPUS: dict[str, dict[str, Any]] = {
    "NVIDIA RTX PRO 6000 Blackwell": {
        "bandwidth_gbs": 1792, "memory_gb": 96, "cc": "12.0",
        "source": "https://www.nvidia.com/en-us/products/workstations/professional-desktop-gpus/rtx-pro-6000/ "
                  "(1,792 GB/s GDDR7, 512-bit; quoted at https://hardware-corner.net/rtx-5090-vs-rtx-pro-6000-spec-comparison-20250321)",
        "verified": _NOT_VERIFIED},
    "NVIDIA DGX Spark (GB10)": {
        "bandwidth_gbs": 273, "memory_gb": 128, "cc": "12.1",
        "source": "https://www.nvidia.com/en-us/products/workstations/dgx-spark/ (273 GB/s LPDDR5x, 128 GB unified; "
                  "quoted at https://ai-infrastructure.net/dgx-spark/)",
        "verified": _NOT_VERIFIED},
    "NVIDIA B200": {
        "bandwidth_gbs": 8000, "memory_gb": 180, "cc": "10.0",
        "source": "https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200: 8 TB/s per GPU; quoted at "
                  "https://docs.vultr.com/inference-cookbook/cuda/getting-started/hardware-overview)",
        "verified": _NOT_VERIFIED},
    "NVIDIA H200": {
        "bandwidth_gbs": 4800, "memory_gb": 141, "cc": "9.0",
        "source": "https://www.nvidia.com/en-us/data-center/h200/ (4.8 TB/s HBM3e, 141 GB)",
        "verified": "NVIDIA's published figure, not verified from the page here (no network); Hopper: the "
                    "study's NVFP4 W4A4 MoE path does not run on it"},
}
#: The Blackwell GPUs a "128 GB-class" single-GPU card can mean (the card does not name its GPU).
CARD_CLASS = ["NVIDIA RTX PRO 6000 Blackwell", "NVIDIA DGX Spark (GB10)", "NVIDIA B200"]


class UnknownGPU(StudyError):
    """A GPU name not in :data:`GPUS` (give the bandwidth yourself)."""


def gpu_bandwidth(name: str) -> tuple[str, float]:
    """``(table name, bytes/s)`` for a GPU name as ``nvidia-smi`` prints it (case-insensitive
    containment, e.g. "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "NVIDIA H200").

    Raises:
        UnknownGPU: no table entry matches.
    """
    low = name.lower()
    keys = {"NVIDIA DGX Spark (GB10)": ("gb10", "dgx spark")}
    for k in GPUS:
        needles = keys.get(k, (k.lower().replace("nvidia ", ""),))
        if any(n in low for n in needles):
            return k, GPUS[k]["bandwidth_gbs"] * 1e9
    raise UnknownGPU(f"no memory bandwidth known for GPU {name!r} (known: {', '.join(GPUS)})")


@dataclass(frozen=True)
class ReadBytes:
    """Bytes read per decode step of the served NVFP4 layout (see the module docstring)."""

    dense: int       # W_dense: non-expert main-model tensors + lm_head, read whole
    expert: int      # W_expert: one routed expert summed over the main MoE layers
    embed_row: int   # W_embed: one row of word_embeddings
    draft: int       # W_draft: one NEXTN draft step (MTP layer with top_k experts, lm_head, one row)
    top_k: int
    num_experts: int

    def per_token(self) -> int:
        """Bytes per decoded token without speculation."""
        return self.dense + self.top_k * self.expert + self.embed_row

    def per_cycle(self, k: int, distinct: float | None = None) -> float:
        """Bytes of one speculative cycle at depth k (k draft steps + a verify of k+1 tokens);
        ``distinct`` routed experts per MoE layer in the verify (default ``top_k``: the ceiling)."""
        d = self.top_k if distinct is None else distinct
        return self.dense + d * self.expert + (k + 1) * self.embed_row + k * self.draft

    def independent_distinct(self, k: int) -> float:
        """Expected distinct experts of k+1 tokens routed independently and uniformly."""
        e, t = self.num_experts, self.top_k
        return e * (1 - (1 - t / e) ** (k + 1))


def distinct_experts(num_experts: int, top_k: int, tokens: float) -> float:
    """Expected number of distinct routed experts one MoE layer reads for ``tokens`` tokens.

    Each token's router picks ``top_k`` of ``num_experts`` experts; if routing were uniform and
    the tokens independent, a given expert escapes one token with probability ``1 - top_k/E``,
    so the expected union is::

        E * (1 - (1 - top_k / E) ** tokens)

    (exact for one token: ``top_k``). Ling-3.0-flash (E = 512, top_k = 8): 8 (1 token),
    16 (2), 31 (4), 61 (8), 114 (16), 203 (32). Real routing is skewed towards popular
    experts, so the real union is smaller and batching saves a little more than this says.

    Raises:
        StudyError: ``num_experts`` < 1, ``top_k`` outside 1..E, or ``tokens`` < 0.
    """
    if num_experts < 1 or not 1 <= top_k <= num_experts or tokens < 0:
        raise StudyError(f"distinct_experts needs 1 <= top_k <= num_experts and tokens >= 0, got "
                         f"E={num_experts}, top_k={top_k}, tokens={tokens}")
    return num_experts * (1 - (1 - top_k / num_experts) ** tokens)


def batch_speedup(rb: ReadBytes, concurrency: int, depth: int = 0) -> float:
    """How much faster ``concurrency`` requests decode together than one, in aggregate tok/s,
    when every pass is bound by the bytes it reads (the decode model of this module).

    One pass of a batch of c requests at NEXTN depth k verifies c x (k+1) tokens: it reads the
    dense weights once, the routed experts of the union of those tokens' choices
    (:func:`distinct_experts`), one embedding row per token and c x k draft steps. Against
    one request (the same formula at c = 1), the aggregate rate grows by::

        c x bytes(1) / bytes(c)

    which is c only if no expert were added by the batch. Ling's 512-expert top-8 layout reads
    most of its bytes from experts, so at c = 8, k = 2 the saving is about 2.1x, not 8x.
    Attention over the KV cache, prefill and compute limits are not counted: an upper bound.

    Raises:
        StudyError: ``concurrency`` < 1 or ``depth`` < 0.
    """
    if concurrency < 1 or depth < 0:
        raise StudyError(f"batch_speedup needs concurrency >= 1 and depth >= 0, got {concurrency}, {depth}")

    def nbytes(c: int) -> float:
        tokens = c * (depth + 1)
        return (rb.dense + distinct_experts(rb.num_experts, rb.top_k, tokens) * rb.expert
                + tokens * rb.embed_row + c * depth * rb.draft)

    return concurrency * nbytes(1) / nbytes(concurrency)


def read_bytes(shape: LingShape) -> ReadBytes:
    """:class:`ReadBytes` of the card's NVFP4 layout of ``shape``.

    Raises:
        LayoutError: the shape is invalid (:func:`nvfp4study.checkpoint.layout.check_shape`).
    """
    specs = nvfp4_specs(shape, tensor_specs(shape))
    mtp0 = shape.num_hidden_layers
    dense = expert_all = mtp_other = mtp_expert_all = embed_row = lm_head = 0
    for spec in specs:
        name, shp, _ = spec
        n = spec_nbytes(spec)
        m = LAYER_RE.match(name)
        layer = int(m.group(1)) if m else None
        is_expert = EXPERT_RE.match(name) is not None
        if name.startswith("model.word_embeddings."):
            embed_row = n // shp[0]
        elif name.startswith("lm_head."):
            lm_head = n
        elif layer is not None and layer >= mtp0:
            if layer == mtp0:  # the draft uses the first NEXTN layer
                if is_expert:
                    mtp_expert_all += n
                else:
                    mtp_other += n
        elif is_expert:
            expert_all += n
        else:
            dense += n
    e, t = shape.num_experts, shape.num_experts_per_tok
    draft = (mtp_other + t * mtp_expert_all // e + lm_head + embed_row) if shape.num_nextn_predict_layers else 0
    return ReadBytes(dense=dense + lm_head, expert=expert_all // e, embed_row=embed_row, draft=draft,
                     top_k=t, num_experts=e)


def ceiling(rb: ReadBytes, bandwidth: float, depth: int = 0, accept_len: float | None = None) -> dict[str, Any]:
    """Decode tok/s ceiling of one request at NEXTN ``depth`` (0 = off) on ``bandwidth`` bytes/s.

    Args:
        accept_len: expected tokens per cycle at ``depth`` > 0 (required there; tokens per verify).

    Returns:
        ``{"bytes_per_pass", "tokens_per_pass", "ceiling_tok_s", "independent_routing_tok_s"}``
        (the second figure with the expected union of independently routed experts).

    Raises:
        StudyError: depth > 0 without an accept length, or a non-positive bandwidth.
    """
    if bandwidth <= 0:
        raise StudyError(f"bandwidth must be positive, got {bandwidth}")
    if depth == 0:
        b = rb.per_token()
        return {"bytes_per_pass": b, "tokens_per_pass": 1.0, "ceiling_tok_s": bandwidth / b,
                "independent_routing_tok_s": bandwidth / b}
    if not accept_len or accept_len < 1:
        raise StudyError(f"depth {depth} needs an accept length >= 1 (tokens per verify pass), got {accept_len}")
    b = rb.per_cycle(depth)
    bi = rb.per_cycle(depth, rb.independent_distinct(depth))
    return {"bytes_per_pass": b, "tokens_per_pass": accept_len, "ceiling_tok_s": bandwidth * accept_len / b,
            "independent_routing_tok_s": bandwidth * accept_len / bi}


def card_table(shape: LingShape, gpus: list[str] | None = None) -> list[dict[str, Any]]:
    """The card's tok/s per depth against the ceiling on each GPU of ``gpus`` (default
    :data:`CARD_CLASS`), with the accept length of each depth taken as the middle of the card's
    range (claims.yaml ``mtp.k1``-``k3``). Rows: ``{"gpu", "bandwidth GB/s", "depth",
    "card tok/s", "accept len (card, mid)", "ceiling tok/s", "independent-routing tok/s",
    "card / ceiling", "source"}``; card values labelled "card"."""
    from ..core.ledger import card_claims

    c = {r["id"]: r["card"] for r in card_claims()}
    ids = {0: "mtp.off", 1: "mtp.k1", 2: "mtp.k2", 3: "mtp.k3"}
    rb = read_bytes(shape)
    rows = []
    for g in gpus or CARD_CLASS:
        bw = GPUS[g]["bandwidth_gbs"] * 1e9
        for d, cid in ids.items():
            card = c[cid]
            al = None if d == 0 else sum(card["accept_len"]) / 2
            cl = ceiling(rb, bw, d, al)
            rows.append({"gpu": g, "bandwidth GB/s": GPUS[g]["bandwidth_gbs"], "depth": d,
                         "card tok/s": card["tok_s"], "accept len (card, mid)": al,
                         "ceiling tok/s": cl["ceiling_tok_s"], "independent-routing tok/s": cl["independent_routing_tok_s"],
                         "card / ceiling": card["tok_s"] / cl["ceiling_tok_s"], "source": GPUS[g]["source"]})
    return rows
