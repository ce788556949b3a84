"""The study's own PyTorch reference of what SGLang 0.5.23 computes for a BailingMoeV3 model
with every layer MLA (the served stand-in's shape), used to train the trained stand-in and to
check SGLang's numbers against.

Every formula follows the 0.5.23 wheel (paths relative to ``sglang/srt/``):

- embeddings ``model.word_embeddings``; pre-norm residual decoder layers; final
  ``RMSNorm(model.norm)`` then ``lm_head`` (``models/bailing_moe_v3.py`` 1342-1372, 1751-1770).
  RMSNorm is ``x / sqrt(mean(x^2) + eps) * weight`` (no ``1 + weight``), eps ``rms_norm_eps``.
- MLA (``models/deepseek_v2.py`` 2010-2180 ``DeepseekV2AttentionMLA``, no q LoRA):
  ``q = q_proj(x)`` split into nope/rope parts per head; ``kv_a_proj_with_mqa(x)`` gives the
  latent (``kv_lora_rank``) and one shared rope key; the latent goes through ``kv_a_layernorm``
  and ``kv_b_proj`` into per-head ``k_nope`` and ``v``. Scale ``(qk_nope + qk_rope) ** -0.5``
  (2059). RoPE on the rope parts, interleaved pairs (``is_neox_style = not rope_interleave``,
  2166, ``rope_interleave: true``), base ``rope_theta``; SGLang builds it as ``deepseek_yarn``
  with factor 1.0 here (``rope_scaling`` absent: its log says so), which leaves the frequencies
  and the attention scale unchanged (mscale 1). Head-wise output gate
  ``o * sigmoid(g_proj(x))[:, :, None]`` before ``dense`` (``bailing_moe_v3.py`` 199-236).
- MoE (``bailing_moe_v3.py`` 434-800): router logits in fp32 (``router_dtype`` absent: fp32,
  482-487); ``layers/moe/topk.py`` 1780-1846 ``biased_grouped_topk_impl``: sigmoid scores,
  choice = scores + ``expert_bias``, group score = sum of the two best choices per group, the
  ``topk_group`` best groups, the top-k experts of those, weights = the sigmoid scores (no bias)
  renormalised by their sum + 1e-20 (``norm_topk_prob``), times ``routed_scaling_factor`` only
  where a path applies it (the CPU engine's native path does not: :class:`Forms`). Routed
  experts ``down(act(gate(x)) * up(x))`` summed with the weights (``fused_moe_native.py`` 60-150);
  the shared expert added unscaled (``forward_normal`` 713-742).
- SwiGLU clamp, Ling's post-SiLU form ``min(silu(g), L) * clamp(u, -L, L)`` (``BailingMLP.forward``
  348-380); the "approx" pre-SiLU form ``silu(min(g, L)) * clamp(u, -L, L)`` is GPT-OSS's, what
  the NVFP4 CUTLASS call computes (the study's ``sglang/clamp_numerics`` reading).
- MTP (``models/bailing_moe_nextn.py`` 100-200): ``eh_proj(cat(enorm(embed(t_{i+1})),
  hnorm(h_i)))`` with ``h_i`` the target's hidden state AFTER ``model.norm`` (what the logits
  processor captures: ``layers/logits_processor.py`` 866-895), one decoder layer, then
  ``final_layernorm`` and the TARGET's ``lm_head``.

Tensors are float32 here (SGLang's CPU engine serves this model in float32: its ``server_args``
log line says ``'dtype': 'float32'``); the checkpoint stores BF16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

#: routed clamp forms: ``exact`` Ling's post-SiLU, ``approx`` pre-SiLU (GPT-OSS), ``dropped``.
CLAMP_FORMS = ("exact", "approx", "dropped")
#: ``biased_grouped_topk_impl``'s epsilon (``layers/moe/topk.py:158``).
RENORMALIZE_EPS = 1e-20


@dataclass(frozen=True)
class Forms:
    """How a path computes the parts a runner may drop.

    Attributes:
        routed_clamp: one of :data:`CLAMP_FORMS`, the routed experts' SwiGLU clamp.
        shared_clamp: whether the shared expert's clamp is applied (``BailingMLP`` always does).
        routed_scaling: whether the routed output is multiplied by ``routed_scaling_factor``.
    """

    routed_clamp: str = "exact"
    shared_clamp: bool = True
    routed_scaling: bool = True

    def __post_init__(self) -> None:
        if self.routed_clamp not in CLAMP_FORMS:
            raise ValueError(f"routed_clamp must be one of {CLAMP_FORMS}, not {self.routed_clamp!r}")


#: what the model is trained with and what a faithful server computes.
TRAINED = Forms()


def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float | None, form: str) -> torch.Tensor:
    """SwiGLU with the clamp ``limit`` in ``form`` (:data:`CLAMP_FORMS`); ``limit`` None or 0:
    plain ``silu(gate) * up``. Shapes: any, ``gate`` and ``up`` alike."""
    if not limit or form == "dropped":
        return F.silu(gate) * up
    u = up.clamp(min=-limit, max=limit)
    if form == "exact":
        return F.silu(gate).clamp(max=limit) * u
    return F.silu(gate.clamp(max=limit)) * u


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2, -1) + eps) * weight``, computed in float32 (SGLang's RMSNorm)."""
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def rope_interleaved(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE on the last dim of ``x`` [..., T, heads, d] (d even) at positions ``pos`` [T],
    rotating interleaved pairs ``(x[2i], x[2i+1])`` (GPT-J style, SGLang's ``is_neox_style=False``)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.float()[:, None] * inv[None, :]  # [T, d/2]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]  # [T, 1, d/2]
    x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
    out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.flatten(-2).type_as(x)


class MLA(nn.Module):
    """Multi-head latent attention with the head-wise output gate (see the module docstring)."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        H, h = c["hidden_size"], c["num_attention_heads"]
        self.h, self.nope, self.rope = h, c["qk_nope_head_dim"], c["qk_rope_head_dim"]
        self.vd, self.lora, self.theta = c["v_head_dim"], c["kv_lora_rank"], float(c["rope_theta"])
        self.eps = c["rms_norm_eps"]
        self.q_proj = nn.Linear(H, h * (self.nope + self.rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(H, self.lora + self.rope, bias=False)
        self.kv_a_layernorm = nn.Parameter(torch.ones(self.lora))
        self.kv_b_proj = nn.Linear(self.lora, h * (self.nope + self.vd), bias=False)
        self.g_proj = nn.Linear(H, h, bias=False)
        self.dense = nn.Linear(h * self.vd, H, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [B, T, H] -> [B, T, H], causal over T (positions 0..T-1)."""
        B, T, _ = x.shape
        pos = torch.arange(T, device=x.device)
        q = self.q_proj(x).view(B, T, self.h, self.nope + self.rope)
        lat = self.kv_a_proj_with_mqa(x)
        c, k_pe = lat.split([self.lora, self.rope], dim=-1)
        c = rms_norm(c, self.kv_a_layernorm, self.eps).type_as(x)
        kv = self.kv_b_proj(c).view(B, T, self.h, self.nope + self.vd)
        k_nope, v = kv.split([self.nope, self.vd], dim=-1)
        q_pe = rope_interleaved(q[..., self.nope:], pos, self.theta)
        k_pe = rope_interleaved(k_pe[:, :, None, :], pos, self.theta).expand(B, T, self.h, self.rope)
        qq = torch.cat((q[..., : self.nope], q_pe), -1).transpose(1, 2)
        kk = torch.cat((k_nope, k_pe), -1).transpose(1, 2)
        o = F.scaled_dot_product_attention(qq, kk, v.transpose(1, 2), is_causal=True,
                                           scale=(self.nope + self.rope) ** -0.5)
        o = o.transpose(1, 2) * torch.sigmoid(self.g_proj(x).float()).type_as(x)[..., None]
        return self.dense(o.reshape(B, T, self.h * self.vd))


class DenseMLP(nn.Module):
    """``down(swiglu(gate(x), up(x)))`` with an optional clamp (``BailingMLP``)."""

    def __init__(self, H: int, inter: int, limit: float | None) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(H, inter, bias=False)
        self.up_proj = nn.Linear(H, inter, bias=False)
        self.down_proj = nn.Linear(inter, H, bias=False)
        self.limit = limit

    def forward(self, x: torch.Tensor, clamp: bool = True) -> torch.Tensor:
        """``x`` [..., H] -> [..., H]; ``clamp`` False drops the limit."""
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x), self.limit if clamp else None, "exact"))


class MoE(nn.Module):
    """Sigmoid-routed grouped top-k MoE with expert bias and one shared expert.

    Routed expert weights are stacked: ``w_gate``/``w_up`` [E, I, H], ``w_down`` [E, H, I]; every
    expert is computed for every token and the unselected ones get weight 0 (the same sum as a
    sparse dispatch, faster for these sizes on a GPU).
    """

    def __init__(self, c: dict[str, Any], layer: int) -> None:
        super().__init__()
        H, E, inter = c["hidden_size"], c["num_experts"], c["moe_intermediate_size"]
        self.E, self.k, self.layer = E, c["num_experts_per_tok"], layer
        self.n_group, self.topk_group = c["n_group"], c["topk_group"]
        self.rsf = float(c["routed_scaling_factor"])
        self.norm_topk = bool(c["norm_topk_prob"])
        lim = c["expert_swiglu_limit_list"]
        self.limit = (lim[layer] or None) if layer < len(lim) else None
        slim = c["share_expert_swiglu_limit_list"]
        self.gate = nn.Linear(H, E, bias=False)
        self.register_buffer("expert_bias", torch.zeros(E, dtype=torch.float32))
        self.w_gate = nn.Parameter(torch.empty(E, inter, H))
        self.w_up = nn.Parameter(torch.empty(E, inter, H))
        self.w_down = nn.Parameter(torch.empty(E, H, inter))
        si = c["moe_shared_expert_intermediate_size"] * max(1, c["num_shared_experts"])
        self.shared_experts = DenseMLP(H, si, (slim[layer] or None) if layer < len(slim) else None)
        self.last_load: torch.Tensor | None = None
        #: selected (token, expert) pairs seen and how many had ``silu(gate) > limit`` (no grad).
        self.bind_count, self.bind_total = 0, 0

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k weights [N, k] (float32) and ids [N, k] for tokens ``x`` [N, H]."""
        scores = F.linear(x.float(), self.gate.weight.float()).sigmoid()
        choice = scores + self.expert_bias
        N = x.shape[0]
        grp = choice.view(N, self.n_group, -1).topk(2, dim=-1)[0].sum(-1)
        gidx = grp.topk(self.topk_group, dim=-1, sorted=False)[1]
        gmask = torch.zeros_like(grp).scatter_(1, gidx, 1.0)
        mask = gmask[:, :, None].expand(N, self.n_group, self.E // self.n_group).reshape(N, -1)
        ids = choice.masked_fill(mask == 0, float("-inf")).topk(self.k, dim=-1, sorted=False)[1]
        w = scores.gather(1, ids)
        if self.norm_topk:
            w = w / (w.sum(-1, keepdim=True) + RENORMALIZE_EPS)
        return w, ids

    def forward(self, x: torch.Tensor, forms: Forms = TRAINED) -> torch.Tensor:
        """``x`` [B, T, H] -> [B, T, H]."""
        shp = x.shape
        xf = x.reshape(-1, shp[-1])
        w, ids = self.route(xf)
        dense_w = torch.zeros(xf.shape[0], self.E, device=x.device, dtype=torch.float32).scatter_(1, ids, w)
        self.last_load = torch.bincount(ids.flatten(), minlength=self.E).detach()
        g = torch.einsum("nh,eih->eni", xf, self.w_gate)
        u = torch.einsum("nh,eih->eni", xf, self.w_up)
        if self.limit and not torch.is_grad_enabled():
            sel = (dense_w.t() > 0)[:, :, None]
            self.bind_count += int(((F.silu(g.float()) > self.limit) & sel).sum())
            self.bind_total += int(sel.sum()) * g.shape[-1]
        a = swiglu(g, u, self.limit, forms.routed_clamp)
        y = torch.einsum("eni,ehi->enh", a, self.w_down)
        routed = torch.einsum("enh,ne->nh", y.float(), dense_w)
        if forms.routed_scaling:
            routed = routed * self.rsf
        out = routed.type_as(x) + self.shared_experts(xf, clamp=forms.shared_clamp)
        return out.view(shp)


class Layer(nn.Module):
    """Pre-norm decoder layer: ``h + attn(norm(h))`` then ``h + mlp(norm(h))``."""

    def __init__(self, c: dict[str, Any], layer: int, moe: bool) -> None:
        super().__init__()
        H = c["hidden_size"]
        self.eps = c["rms_norm_eps"]
        self.input_layernorm = nn.Parameter(torch.ones(H))
        self.attention = MLA(c)
        self.post_attention_layernorm = nn.Parameter(torch.ones(H))
        self.mlp: nn.Module = MoE(c, layer) if moe else DenseMLP(H, c["intermediate_size"], None)

    def forward(self, h: torch.Tensor, forms: Forms) -> torch.Tensor:
        """``h`` [B, T, H] -> [B, T, H]."""
        h = h + self.attention(rms_norm(h, self.input_layernorm, self.eps).type_as(h))
        y = rms_norm(h, self.post_attention_layernorm, self.eps).type_as(h)
        return h + (self.mlp(y, forms) if isinstance(self.mlp, MoE) else self.mlp(y))


class BailingReference(nn.Module):
    """The whole model: target layers, final norm, lm_head, and the NEXTN (MTP) layer.

    Args:
        config: the checkpoint's ``config.json`` as a dict (keys of
            :func:`nvfp4study.checkpoint.layout.config_dict`); every layer is MLA here.

    Raises:
        ValueError: the config is not one MTP layer or has no grouped routing.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        c = config
        if c.get("num_nextn_predict_layers") != 1:
            raise ValueError("the reference needs exactly one NEXTN layer")
        self.config = c
        H, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
        self.eps = c["rms_norm_eps"]
        self.word_embeddings = nn.Embedding(V, H)
        self.layers = nn.ModuleList(Layer(c, i, i >= c["first_k_dense_replace"]) for i in range(L))
        self.norm = nn.Parameter(torch.ones(H))
        self.lm_head = nn.Linear(H, V, bias=False)
        # SGLang builds the NEXTN decoder with layer_id 0 (bailing_moe_nextn.py 120-128), so
        # its clamp limits are list entry 0.
        self.mtp = Layer(c, 0, True)
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.enorm = nn.Parameter(torch.ones(H))
        self.hnorm = nn.Parameter(torch.ones(H))
        self.final_layernorm = nn.Parameter(torch.ones(H))

    def hidden(self, ids: torch.Tensor, forms: Forms = TRAINED) -> torch.Tensor:
        """Target hidden states after ``model.norm``: ``ids`` [B, T] int64 -> [B, T, H]."""
        h = self.word_embeddings(ids)
        for layer in self.layers:
            h = layer(h, forms)
        return rms_norm(h, self.norm, self.eps).type_as(h)

    def forward(self, ids: torch.Tensor, forms: Forms = TRAINED) -> tuple[torch.Tensor, torch.Tensor]:
        """Target logits [B, T, V] (float32) and MTP logits [B, T-1, V]: position i of the MTP
        output predicts token i+2 from the target hidden at i and the embedding of token i+1."""
        hid = self.hidden(ids, forms)
        logits = self.lm_head(hid).float()
        x = self.eh_proj(torch.cat((rms_norm(self.word_embeddings(ids[:, 1:]), self.enorm, self.eps),
                                    rms_norm(hid[:, :-1], self.hnorm, self.eps)), -1).type_as(hid))
        m = rms_norm(self.mtp(x, forms), self.final_layernorm, self.eps).type_as(hid)
        return logits, self.lm_head(m).float()

    def init_weights(self, seed: int) -> None:
        """Normal(0, 0.02) linear/embedding weights (down projections scaled by
        1/sqrt(2 x layers), GPT-2's rule), norms 1, expert bias 0; deterministic in ``seed``."""
        g = torch.Generator().manual_seed(seed)
        depth = 2 * (len(self.layers) + 1)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p)
                continue
            std = 0.02 / math.sqrt(depth) if ("down" in name or "dense" in name) else 0.02
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * std)


def _param_names(model: BailingReference) -> list[tuple[str, str, int | None]]:
    """``(checkpoint name, reference state-dict key, expert index or None)`` of every tensor."""
    c = model.config
    L = c["num_hidden_layers"]
    out: list[tuple[str, str, int | None]] = [("model.word_embeddings.weight", "word_embeddings.weight", None)]
    for i in range(L + 1):
        p, r = f"model.layers.{i}.", ("mtp." if i == L else f"layers.{i}.")
        out.append((p + "input_layernorm.weight", r + "input_layernorm", None))
        for t in ("q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "g_proj", "dense"):
            out.append((f"{p}attention.{t}.weight", f"{r}attention.{t}.weight", None))
        out.append((p + "attention.kv_a_layernorm.weight", r + "attention.kv_a_layernorm", None))
        out.append((p + "post_attention_layernorm.weight", r + "post_attention_layernorm", None))
        if i == L or i >= c["first_k_dense_replace"]:
            out += [(p + "mlp.gate.weight", r + "mlp.gate.weight", None),
                    (p + "mlp.gate.expert_bias", r + "mlp.expert_bias", None)]
            for e in range(c["num_experts"]):
                for t, key in (("gate_proj", "w_gate"), ("up_proj", "w_up"), ("down_proj", "w_down")):
                    out.append((f"{p}mlp.experts.{e}.{t}.weight", f"{r}mlp.{key}", e))
            out += [(f"{p}mlp.shared_experts.{t}.weight", f"{r}mlp.shared_experts.{t}.weight", None)
                    for t in ("gate_proj", "up_proj", "down_proj")]
        else:
            out += [(f"{p}mlp.{t}.weight", f"{r}mlp.{t}.weight", None) for t in ("gate_proj", "up_proj", "down_proj")]
        if i == L:
            out += [(p + "eh_proj.weight", "eh_proj.weight", None), (p + "enorm.weight", "enorm", None),
                    (p + "hnorm.weight", "hnorm", None), (p + "final_layernorm.weight", "final_layernorm", None)]
    return out + [("model.norm.weight", "norm", None), ("lm_head.weight", "lm_head.weight", None)]


def to_checkpoint(model: BailingReference) -> dict[str, torch.Tensor]:
    """The model's tensors under the checkpoint's names (``layout.tensor_specs`` of an all-MLA
    shape): BF16, except ``expert_bias`` float32 (as the layout stores it). Contiguous CPU copies."""
    sd = model.state_dict()
    out = {}
    for name, key, e in _param_names(model):
        t = sd[key] if e is None else sd[key][e]
        dtype = torch.float32 if name.endswith("expert_bias") else torch.bfloat16
        out[name] = t.detach().to("cpu", dtype).contiguous()
    return out


def from_checkpoint(config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> BailingReference:
    """A float32 :class:`BailingReference` holding ``tensors`` (checkpoint names).

    Raises:
        KeyError: a tensor the model needs is missing (named).
        ValueError: a tensor's shape differs from the model's (named).
    """
    model = BailingReference(config)
    sd = model.state_dict()
    for name, key, e in _param_names(model):
        if name not in tensors:
            raise KeyError(f"checkpoint lacks {name}")
        t = tensors[name].float()
        dst = sd[key] if e is None else sd[key][e]
        if tuple(t.shape) != tuple(dst.shape):
            raise ValueError(f"{name}: shape {tuple(t.shape)}, the model needs {tuple(dst.shape)}")
        dst.copy_(t)
    return model
