"""The ``*_cpu`` kernels SGLang 0.5.23's CPU engine calls, written in plain torch.

Stand-ins for the ops of sgl-kernel's CPU build (not on the package index; the CUDA wheel has
none of them). Signatures are those of SGLang's call sites (paths relative to ``sglang/`` of the
0.5.23 wheel); tree ops are line-by-line ports of SGLang's own Triton kernels in
``kernels/ops/speculative/spec_tree.py``. Every op writes its outputs in place, as the kernels do,
and returns None. This module imports only torch (the server and the project's tests load it).

Index tensors are integer tensors (int32 or int64); ``req_to_token`` is
``[pool_rows, pool_len]`` of KV-slot indices. Attention tensors: ``q [tokens, heads, d_qk]``,
KV buffers ``[slots, kv_heads, d]`` (MLA: one latent head, the value buffer a view of the key
buffer's first ``kv_lora_rank`` channels), outputs ``[tokens, heads, d_v]``.
"""

from __future__ import annotations

import torch

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "decode_attention_cpu",
    "extend_attention_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "verify_tree_greedy_cpu",
]


# --- attention ---------------------------------------------------------------------------------
def _attend(q, k, v, mask, sm_scale, logit_cap, sink):
    """softmax(q k^T * scale [capped], masked) v in fp32 for one request.

    q [n, H, Dqk], k [m, Hkv, Dqk], v [m, Hkv, Dv], mask [n, m] bool (True = visible) or None;
    sink: [H] extra per-head logit in the softmax denominator (attention sinks) or None.
    Returns [n, H, Dv] fp32. Rows that see nothing give 0.
    """
    h, hkv = q.shape[1], k.shape[1]
    if h % hkv:
        raise ValueError(f"query heads {h} are not a multiple of KV heads {hkv}")
    k = k.float().repeat_interleave(h // hkv, dim=1)
    v = v.float().repeat_interleave(h // hkv, dim=1)
    s = torch.einsum("nhd,mhd->hnm", q.float(), k) * sm_scale
    if logit_cap and logit_cap > 0:
        s = logit_cap * torch.tanh(s / logit_cap)
    if mask is not None:
        s = s.masked_fill(~mask.unsqueeze(0), float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink.float().view(h, 1, 1).expand(h, s.shape[1], 1)], dim=2)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    if sink is not None:
        p = p[..., :-1]
    return torch.einsum("hnm,mhd->nhd", p, v)


def _window(q_pos, k_pos, sliding_window_size):
    """Visibility by sliding window (SGLang passes ``layer.sliding_window_size + 1``, 0 = off):
    a key is visible while ``q_pos - k_pos < sliding_window_size``."""
    if sliding_window_size is None or sliding_window_size <= 0:
        return None
    return (q_pos.view(-1, 1) - k_pos.view(1, -1)) < sliding_window_size


def decode_attention_cpu(query, k_cache, v_cache, k_scale, v_scale, output, key, value, loc,
                         attn_logits, req_to_token, req_pool_indices, seq_lens, sm_scale,
                         logit_cap, is_cross_attention, sliding_window_size, encoder_lens, sinks):
    """One query token per request against its cached keys (``srt/layers/attention/
    intel_amx_backend.py`` 395-415 calls it with these positional arguments).

    Writes ``key``/``value`` ([B, Hkv, D], when not None) into the caches at ``loc`` [B] first,
    then for request b attends over the slots ``req_to_token[req_pool_indices[b],
    :seq_lens[b]]``. ``k_scale``/``v_scale`` (float) multiply cached keys/values (1.0 for
    bf16/fp32 caches). ``attn_logits`` is the kernel's split-K scratch: unused here.

    Raises:
        NotImplementedError: cross-attention (encoder KV), which no text model here uses.
    """
    if is_cross_attention:
        raise NotImplementedError("decode_attention_cpu stand-in: cross-attention")
    if key is not None and value is not None:
        k_cache[loc.long()] = key.to(k_cache.dtype)
        v_cache[loc.long()] = value.to(v_cache.dtype)
    for b in range(query.shape[0]):
        n = int(seq_lens[b])
        slots = req_to_token[int(req_pool_indices[b]), :n].long()
        k = k_cache[slots].float() * float(k_scale)
        v = v_cache[slots].float() * float(v_scale)
        pos = torch.arange(n)
        mask = _window(pos[-1:], pos, sliding_window_size)
        o = _attend(query[b:b + 1], k, v, mask, sm_scale, logit_cap, sinks)
        output[b:b + 1] = o.to(output.dtype)


def extend_attention_cpu(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, k_scale,
                         v_scale, req_to_token, req_pool_indices, seq_lens, extend_seq_lens,
                         extend_start_loc, max_len_extend, sm_scale, logit_cap,
                         is_cross_attention, sliding_window_size, encoder_lens, sinks,
                         tree_mask, is_causal):
    """Prefill/verify: each request's new tokens against its cached prefix and themselves
    (``srt/layers/attention/intel_amx_backend.py`` 290-313).

    Request b has ``e = extend_seq_lens[b]`` new tokens at rows ``extend_start_loc[b] + [0, e)``
    of ``q_extend``/``k_extend``/``v_extend`` and a prefix of ``seq_lens[b] - e`` tokens whose
    keys/values are read from ``k_buffer``/``v_buffer`` through ``req_to_token`` (the buffers are
    not written: the backend stored the new K/V before the call; with no prefix they are not
    read, so DeepSeek-style MLA's MHA prefill may pass full-head K/V beside a latent cache). The prefix is fully visible;
    the new tokens see each other causally when ``is_causal``, or as ``tree_mask`` says: a flat
    bool tensor holding, per request in batch order, an ``[e, e]`` row-major block over the new
    tokens (QLEN_ONLY, what SGLang builds on the CPU: ``srt/speculative/eagle_utils.py`` 132-135;
    the prefix stays visible) or an ``[e, seq_lens[b]]`` block (FULL_MASK); True = visible. The
    layout is told apart by the mask's size.

    Raises:
        NotImplementedError: cross-attention.
    """
    if is_cross_attention:
        raise NotImplementedError("extend_attention_cpu stand-in: cross-attention")
    mask_off = 0
    qlen_only = False
    if tree_mask is not None:  # which layout: [e, e] per request (QLEN_ONLY) or [e, seq_len]
        e_all = [int(x) for x in extend_seq_lens]
        qlen_only = tree_mask.numel() == sum(e * e for e in e_all)
    for b in range(int(seq_lens.shape[0])):
        e = int(extend_seq_lens[b])
        total = int(seq_lens[b])
        prefix = total - e
        start = int(extend_start_loc[b])
        k = k_extend[start:start + e].float()
        v = v_extend[start:start + e].float()
        if prefix:  # (MLA's MHA prefill passes full-head K/V and no prefix: buffers unread)
            slots = req_to_token[int(req_pool_indices[b]), :prefix].long()
            k = torch.cat([k_buffer[slots].float() * float(k_scale), k])
            v = torch.cat([v_buffer[slots].float() * float(v_scale), v])
        q_pos = torch.arange(prefix, total)
        k_pos = torch.arange(total)
        if tree_mask is not None and qlen_only:
            mask = torch.ones(e, total, dtype=torch.bool)
            mask[:, prefix:] = tree_mask.reshape(-1)[mask_off:mask_off + e * e].view(e, e).bool()
            mask_off += e * e
        elif tree_mask is not None:
            mask = tree_mask.reshape(-1)[mask_off:mask_off + e * total].view(e, total).bool()
            mask_off += e * total
        elif is_causal:
            mask = k_pos.view(1, -1) <= q_pos.view(-1, 1)
        else:
            mask = None
        win = _window(q_pos, k_pos, sliding_window_size)
        if win is not None:
            mask = win if mask is None else mask & win
        o = _attend(q_extend[start:start + e], k, v, mask, sm_scale, logit_cap, sinks)
        o_extend[start:start + e] = o.to(o_extend.dtype)


# --- KV-slot bookkeeping -----------------------------------------------------------------------
def _spans(start_offset, end_offset):
    """(b, start, end, out_offset) per request; out_offset = sum of earlier (end - start)."""
    off = 0
    for b in range(int(start_offset.shape[0])):
        s, e = int(start_offset[b]), int(end_offset[b])
        yield b, s, e, off
        off += e - s


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset,
                                 out_cache_loc, pool_len):
    """``req_to_token[req_pool_indices[b], start[b]:end[b]] = out_cache_loc[o_b : o_b + len_b]``
    with ``o_b`` the sum of earlier lengths (Triton ``assign_req_to_token_pool``,
    ``srt/mem_cache/allocation.py`` 699-731; called at 745-753). ``pool_len`` = row length."""
    for b, s, e, off in _spans(start_offset, end_offset):
        req_to_token[int(req_pool_indices[b]), s:e] = out_cache_loc[off:off + e - s].to(
            req_to_token.dtype)


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset,
                                 out_cache_loc, pool_len):
    """The reverse gather: ``out_cache_loc[o_b : o_b + len_b] = req_to_token[req_pool_indices[b],
    start[b]:end[b]]`` (Triton ``assign_extend_cache_locs``, ``kernels/ops/speculative/
    cache_locs.py`` 500-531; called at 740 and 763)."""
    for b, s, e, off in _spans(start_offset, end_offset):
        out_cache_loc[off:off + e - s] = req_to_token[int(req_pool_indices[b]), s:e].to(
            out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens,
                                           out_cache_loc, pool_len, topk, num_steps):
    """``out_cache_loc[b*topk*num_steps : (b+1)*topk*num_steps] = req_to_token[req_pool_indices[b],
    seq_lens[b] : seq_lens[b] + topk*num_steps]`` (Triton ``assign_draft_cache_locs_contiguous``
    without positions, ``kernels/ops/speculative/cache_locs.py`` 43-82; called at 99)."""
    n = topk * num_steps
    for b in range(int(seq_lens.shape[0])):
        s = int(seq_lens[b])
        out_cache_loc[b * n:(b + 1) * n] = req_to_token[int(req_pool_indices[b]), s:s + n].to(
            out_cache_loc.dtype)


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    """``bonus_tokens[b] = accept_tokens.flat[accept_stride*b + accept_lens[b] - 1]``: the last
    accepted token of each request (Triton ``fill_bonus_tokens``, ``kernels/ops/speculative/
    eagle.py`` 13-27; called at 40)."""
    flat = accept_tokens.reshape(-1)
    for b in range(int(accept_lens.shape[0])):
        bonus_tokens[b] = flat[accept_stride * b + int(accept_lens[b]) - 1]


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc):
    """Pack the KV slots of accepted draft tokens: for each ``i`` with ``accept_index[i] != -1``
    (flattened), ``accept_out_cache_loc[#{j < i: accept_index[j] != -1}] =
    out_cache_loc[accept_index[i]]`` (Triton ``fill_accept_out_cache_loc``, ``kernels/ops/
    speculative/eagle.py`` 57-69; called at 80)."""
    idx = accept_index.reshape(-1).long()
    kept = idx[idx != -1]
    accept_out_cache_loc[:kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def build_draft_decode_metadata_cpu(req_to_token, req_pool_indices, seq_lens, topk, num_steps,
                                    pool_len):
    """The ``req_to_token`` rows the multi-step draft decode reads (``srt/layers/attention/
    intel_amx_backend.py`` 456-476): a new ``[bs*topk, pool_len]`` table whose row ``b*topk + t``
    holds request b's prefix ``req_to_token[req_pool_indices[b], :seq_lens[b]]`` followed by
    branch t's draft slots, which the contiguous draft layout puts at columns
    ``seq_lens[b] + t*num_steps + [0, num_steps)`` of the request's row (see
    ``assign_draft_cache_locs_contiguous_cpu`` and ``srt/speculative/eagle_worker_v2.py``
    ``per_step_draft_out_cache_loc``). Returns the new table (same dtype as ``req_to_token``)."""
    bs = int(seq_lens.shape[0])
    out = torch.zeros((bs * topk, pool_len), dtype=req_to_token.dtype, device=req_to_token.device)
    for b in range(bs):
        row = req_to_token[int(req_pool_indices[b])]
        s = int(seq_lens[b])
        for t in range(topk):
            out[b * topk + t, :s] = row[:s]
            src = s + t * num_steps
            out[b * topk + t, s:s + num_steps] = row[src:src + num_steps]
    return out


# --- the EAGLE tree ----------------------------------------------------------------------------
def build_tree_kernel_efficient_cpu(parent_list, selected_index, verified_seq_len, tree_mask,
                                    positions, retrieve_index, retrieve_next_token,
                                    retrieve_next_sibling, topk, depth, draft_token_num,
                                    tree_mask_mode):
    """Build the draft tree's mask, positions and retrieve links: a port of SGLang's Triton
    ``sgl_build_tree_kernel_efficient_triton`` (``kernels/ops/speculative/spec_tree.py`` 52-207;
    CPU call at 352-366). ``selected_index [bs, draft_token_num-1]`` are the chosen candidates
    (``// topk`` = their parent's slot in ``parent_list [bs, *]``); ``tree_mask`` flat bool
    (mode 0 FULL_MASK: per request ``[draft, seq_len + draft]`` rows; mode 1 QLEN_ONLY:
    ``[draft, draft]``); ``positions [bs*draft]``; the three ``retrieve_*`` ``[bs, draft]``
    (next token/sibling pre-filled with -1 by the caller).

    Raises:
        NotImplementedError: tree_mask_mode 2 (QLEN_ONLY_BITPACKING), as in SGLang's port.
    """
    mode = int(tree_mask_mode)
    if mode == 2:
        raise NotImplementedError("QLEN_ONLY_BITPACKING is not supported (as in SGLang's Triton port)")
    n = draft_token_num
    mask = tree_mask.view(-1)
    pos = positions.view(-1)
    r_index = retrieve_index.view(-1)
    r_next = retrieve_next_token.view(-1)
    r_sib = retrieve_next_sibling.view(-1)
    sel = selected_index.reshape(selected_index.shape[0], -1)
    par = parent_list.reshape(parent_list.shape[0], -1) if parent_list.dim() > 1 else \
        parent_list.view(1, -1)
    prefix_sum = 0
    for b in range(int(verified_seq_len.shape[0])):
        seq_len = int(verified_seq_len[b])
        seq_tree_idx = n * n * b + prefix_sum * n
        prefix_sum += seq_len
        pos[b * n] = seq_len
        for i in range(n - 1, 0, -1):
            r_index[b * n + i] = b * n + i
            parent_tb_idx = int(sel[b, i - 1]) // topk
            parent_position, found = 0, parent_tb_idx == 0
            if not found:
                parent_token_idx = int(par[b, parent_tb_idx])
                for pp in range(n - 1):
                    if int(sel[b, pp]) == parent_token_idx:
                        parent_position, found = pp + 1, True
                        break
            if found:
                nxt = int(r_next[b * n + parent_position])
                r_next[b * n + parent_position] = i
                if nxt != -1:
                    r_sib[b * n + i] = nxt
        r_index[b * n] = b * n
        for x in range(n):
            if mode == 0:
                tok = seq_tree_idx + (seq_len + n) * x + seq_len + 1
            else:
                tok = n * n * b + n * x + 1
            mask[tok - 1] = True
            mask[tok:tok + n - 1] = False
            if x > 0:
                cur, position = x - 1, 0
                for _ in range(depth):
                    position += 1
                    mask[tok + cur] = True
                    parent_tb_idx = int(sel[b, cur]) // topk
                    if parent_tb_idx == 0:
                        break
                    parent_token_idx = int(par[b, parent_tb_idx])
                    hits = [cp for cp in range(n - 1) if int(sel[b, cp]) == parent_token_idx]
                    if not hits:
                        break
                    cur = hits[0]
                pos[b * n + x] = position + seq_len


def verify_tree_greedy_cpu(predicts, accept_index, accept_token_num, candidates, retrive_index,
                           retrive_next_token, retrive_next_sibling, target_predict):
    """Greedy verification of the draft tree: a port of SGLang's Triton
    ``verify_tree_greedy_kernel_triton`` (``kernels/ops/speculative/spec_tree.py`` 211-315; CPU
    call, keyword arguments ``retrive_*``, at 450-462).

    Per request b, from the root, repeatedly walk the current node's children
    (``retrive_next_token`` then ``retrive_next_sibling``) and accept the first child whose
    ``candidates`` token equals the target's greedy token at the last accepted node; stop when
    none matches or ``accept_index.shape[1] - 1`` drafts were accepted. Writes
    ``accept_index [bs, spec_tokens]`` (flat indices of the accepted nodes, root first; the rest
    untouched), ``accept_token_num [bs]`` (accepted drafts, bonus excluded) and
    ``predicts [bs*draft]`` (the target token at every accepted node, the bonus last).
    ``target_predict [bs, draft]``: the target model's argmax per node.
    """
    bs = candidates.shape[0]
    steps = accept_index.shape[1]
    pred = predicts.view(-1)
    tgt = target_predict.reshape(-1)
    for b in range(bs):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        num, cur = 0, 0
        for _ in range(1, steps):
            cur = int(retrive_next_token[b, cur])
            target = int(tgt[last])
            matched = False
            while cur != -1:
                if int(candidates[b, cur]) == target:
                    pred[last] = target
                    num += 1
                    accept_index[b, num] = int(retrive_index[b, cur])
                    last = int(retrive_index[b, cur])
                    matched = True
                    break
                cur = int(retrive_next_sibling[b, cur])
            if not matched:
                break
        accept_token_num[b] = num
        pred[last] = tgt[last]


# the ops are registered under torch.ops.sgl_kernel by the package (see __init__.py)
OPS = {name: globals()[name] for name in __all__}

