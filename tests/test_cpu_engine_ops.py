"""The CPU engine's stand-in ``sgl_kernel`` ops against independent plain-torch / Python readings.

The ops module (``serving/cpu_engine/site/sgl_kernel/cpu_ops.py``) imports only torch; it is
loaded from its file so the stand-in package (which installs ``torch.ops.sgl_kernel``) is not.
Attention is checked against ``torch.nn.functional.scaled_dot_product_attention`` with an explicit
mask; the KV-slot ops against list code; the tree ops against a reading of the tree from its
parent rule (``selected_index // topk`` -> ``parent_list``) and of greedy verification as "follow
the first child whose draft token is the target's argmax".
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F

from nvfp4study.serving import cpu_engine


def _load_ops():
    path = cpu_engine.SITE_DIR / "sgl_kernel" / "cpu_ops.py"
    spec = importlib.util.spec_from_file_location("_cpu_engine_ops_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ops = _load_ops()


def test_the_op_list_is_the_engine_description():
    assert sorted(ops.__all__) == cpu_engine.replaced_ops() == sorted(cpu_engine.describe()["replaced_ops"])
    assert len(ops.__all__) == 10
    assert cpu_engine.summary().startswith("SGLang 0.5.23 engine on CPU; 10 kernel ops replaced by torch code (")


# --- attention -----------------------------------------------------------------------------------
def _sdpa(q, k, v, mask, scale):
    """q [n, H, D], k/v [m, Hkv, D]; mask [n, m] bool or None -> [n, H, Dv] (fp32)."""
    h, hkv = q.shape[1], k.shape[1]
    k = k.repeat_interleave(h // hkv, dim=1)
    v = v.repeat_interleave(h // hkv, dim=1)
    o = F.scaled_dot_product_attention(q.transpose(0, 1).float(), k.transpose(0, 1).float(),
                                       v.transpose(0, 1).float(), attn_mask=mask, scale=scale)
    return o.transpose(0, 1)


def _pool(slots, hkv, dk, dv, mla=False):
    k = torch.randn(slots, hkv, dk)
    v = k[..., :dv] if mla else torch.randn(slots, hkv, dv)
    return k, v


@pytest.mark.parametrize("h,hkv,dk,dv,mla", [(4, 4, 16, 16, False), (4, 2, 16, 8, False),
                                             (4, 1, 24, 16, True)])
def test_decode_attention_matches_sdpa_and_writes_the_new_kv(h, hkv, dk, dv, mla):
    torch.manual_seed(0)
    slots, bs = 64, 3
    k_buf, v_buf = _pool(slots, hkv, dk, dv, mla)
    seq_lens = torch.tensor([5, 9, 1])
    perm = torch.randperm(slots)
    req_to_token = torch.zeros(4, 16, dtype=torch.int32)
    rows = torch.tensor([2, 0, 3])
    used = 0
    for b in range(bs):
        req_to_token[rows[b], :seq_lens[b]] = perm[used:used + seq_lens[b]].int()
        used += int(seq_lens[b])
    loc = torch.stack([req_to_token[rows[b], seq_lens[b] - 1] for b in range(bs)]).long()
    q = torch.randn(bs, h, dk)
    key = torch.randn(bs, hkv, dk)
    value = key[..., :dv].clone() if mla else torch.randn(bs, hkv, dv)
    out = torch.empty(bs, h, dv)
    scale = 1 / math.sqrt(dk)
    ops.decode_attention_cpu(q, k_buf, v_buf, 1.0, 1.0, out, key, value, loc,
                             torch.zeros(bs, h, 8, dv + 1), req_to_token, rows, seq_lens.long(), scale,
                             0.0, False, 0, None, None)
    assert torch.equal(k_buf[loc], key) and torch.equal(v_buf[loc], value)
    for b in range(bs):
        idx = req_to_token[rows[b], :seq_lens[b]].long()
        ref = _sdpa(q[b:b + 1], k_buf[idx], v_buf[idx], None, scale)
        torch.testing.assert_close(out[b:b + 1], ref, rtol=1e-5, atol=1e-5)


def test_decode_attention_logit_cap_and_sink():
    torch.manual_seed(1)
    k_buf, v_buf = _pool(8, 1, 4, 4)
    q = torch.randn(1, 2, 4) * 5
    r2t = torch.arange(8, dtype=torch.int32).view(1, 8)
    out = torch.empty(1, 2, 4)
    sinks = torch.tensor([0.5, -1.0])
    ops.decode_attention_cpu(q, k_buf, v_buf, 1.0, 1.0, out, None, None, None, None, r2t,
                             torch.tensor([0]), torch.tensor([6]), 0.5, 2.0, False, 0, None, sinks)
    for hd in range(2):
        s = [2.0 * math.tanh(float(q[0, hd] @ k_buf[j, 0]) * 0.5 / 2.0) for j in range(6)]
        w = [math.exp(x) for x in s]
        z = sum(w) + math.exp(float(sinks[hd]))
        ref = sum(w[j] / z * v_buf[j, 0] for j in range(6))
        torch.testing.assert_close(out[0, hd], ref, rtol=1e-5, atol=1e-6)


def _extend_case(h, hkv, dk, dv, prefix_lens, ext_lens, seed=0):
    torch.manual_seed(seed)
    slots = 128
    k_buf, v_buf = _pool(slots, hkv, dk, dv)
    bs = len(prefix_lens)
    r2t = torch.zeros(bs, 64, dtype=torch.int64)
    perm = torch.randperm(slots)
    used = 0
    for b in range(bs):
        n = prefix_lens[b] + ext_lens[b]
        r2t[b, :n] = perm[used:used + n]
        used += n
    total = sum(ext_lens)
    q = torch.randn(total, h, dk)
    k = torch.randn(total, hkv, dk)
    v = torch.randn(total, hkv, dv)
    starts = torch.tensor([sum(ext_lens[:b]) for b in range(bs)])
    seq_lens = torch.tensor([p + e for p, e in zip(prefix_lens, ext_lens, strict=True)])
    return k_buf, v_buf, r2t, q, k, v, starts, seq_lens


@pytest.mark.parametrize("h,hkv", [(4, 4), (4, 2)])
def test_extend_attention_causal_matches_sdpa(h, hkv):
    prefix_lens, ext_lens = [0, 3, 7], [5, 4, 1]
    dk, dv = 16, 8
    k_buf, v_buf, r2t, q, k, v, starts, seq_lens = _extend_case(h, hkv, dk, dv, prefix_lens, ext_lens)
    out = torch.empty(q.shape[0], h, dv)
    ops.extend_attention_cpu(q, k, v, out, k_buf, v_buf, 1.0, 1.0, r2t, torch.arange(3), seq_lens,
                             torch.tensor(ext_lens), starts, max(ext_lens), 0.25, 0.0, False, 0, None,
                             None, None, True)
    for b, (p, e) in enumerate(zip(prefix_lens, ext_lens, strict=True)):
        s = int(starts[b])
        idx = r2t[b, :p]
        kk = torch.cat([k_buf[idx], k[s:s + e]])
        vv = torch.cat([v_buf[idx], v[s:s + e]])
        mask = torch.ones(e, p + e, dtype=torch.bool)
        mask[:, p:] = torch.tril(torch.ones(e, e, dtype=torch.bool))
        torch.testing.assert_close(out[s:s + e], _sdpa(q[s:s + e], kk, vv, mask, 0.25),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["qlen_only", "full"])
def test_extend_attention_tree_mask_and_no_prefix_mha_beside_a_latent_cache(layout):
    # tree mask: per request an [e, e] block (QLEN_ONLY, the CPU's) or an [e, seq_len] block
    prefix_lens, ext_lens = [4, 2], [3, 3]
    k_buf, v_buf, r2t, q, k, v, starts, seq_lens = _extend_case(2, 2, 8, 8, prefix_lens, ext_lens, 3)
    blocks, masks = [], []
    for p, e in zip(prefix_lens, ext_lens, strict=True):
        m = torch.ones(e, p + e, dtype=torch.bool)
        m[:, p:] = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # 2 branches
        masks.append(m)
        blocks.append((m[:, p:] if layout == "qlen_only" else m).reshape(-1))
    out = torch.empty(q.shape[0], 2, 8)
    ops.extend_attention_cpu(q, k, v, out, k_buf, v_buf, 1.0, 1.0, r2t, torch.arange(2), seq_lens,
                             torch.tensor(ext_lens), starts, 3, 0.3, 0.0, False, 0, None, None,
                             torch.cat(blocks), True)
    for b, (p, e) in enumerate(zip(prefix_lens, ext_lens, strict=True)):
        s = int(starts[b])
        kk = torch.cat([k_buf[r2t[b, :p]], k[s:s + e]])
        vv = torch.cat([v_buf[r2t[b, :p]], v[s:s + e]])
        torch.testing.assert_close(out[s:s + e], _sdpa(q[s:s + e], kk, vv, masks[b], 0.3),
                                   rtol=1e-5, atol=1e-5)
    # MLA prefill through the MHA branch: 4-head K/V, a 1-head latent cache, no prefix
    torch.manual_seed(4)
    q, k, v = torch.randn(5, 4, 24), torch.randn(5, 4, 24), torch.randn(5, 4, 16)
    latent = torch.randn(32, 1, 40)
    out = torch.empty(5, 4, 16)
    ops.extend_attention_cpu(q, k, v, out, latent, latent[..., :32], 1.0, 1.0,
                             torch.zeros(1, 8, dtype=torch.int64), torch.tensor([0]), torch.tensor([5]),
                             torch.tensor([5]), torch.tensor([0]), 5, 0.2, 0.0, False, 0, None, None,
                             None, True)
    causal = torch.tril(torch.ones(5, 5, dtype=torch.bool))
    torch.testing.assert_close(out, _sdpa(q, k, v, causal, 0.2), rtol=1e-5, atol=1e-5)


# --- KV-slot bookkeeping -------------------------------------------------------------------------
def test_req_to_token_scatter_and_gather_are_inverse_list_copies():
    r2t = torch.full((4, 12), -1, dtype=torch.int32)
    rows, start, end = torch.tensor([3, 1]), torch.tensor([2, 0]), torch.tensor([5, 4])
    locs = torch.arange(100, 107)
    ops.assign_req_to_token_pool_cpu(rows, r2t, start, end, locs, 12)
    assert r2t[3].tolist() == [-1, -1, 100, 101, 102] + [-1] * 7
    assert r2t[1].tolist() == [103, 104, 105, 106] + [-1] * 8
    back = torch.zeros(7, dtype=torch.int64)
    ops.assign_extend_cache_locs_cpu(rows, r2t, start, end, back, 12)
    assert back.tolist() == list(range(100, 107))


def test_draft_cache_locs_bonus_tokens_accepted_slots_and_draft_rows():
    r2t = torch.arange(40, dtype=torch.int64).view(4, 10)
    out = torch.zeros(2 * 2 * 3, dtype=torch.int64)
    ops.assign_draft_cache_locs_contiguous_cpu(torch.tensor([2, 0]), r2t, torch.tensor([1, 4]), out,
                                               10, 2, 3)
    assert out.tolist() == [21, 22, 23, 24, 25, 26, 4, 5, 6, 7, 8, 9]

    tokens = torch.tensor([[7, 8, 9], [4, 5, 6]])
    bonus = torch.zeros(2, dtype=torch.int64)
    ops.fill_bonus_tokens_cpu(tokens, torch.tensor([2, 3]), bonus, 3)
    assert bonus.tolist() == [8, 6]

    accept_index = torch.tensor([[0, 2, -1], [3, -1, -1]])
    out_cache = torch.tensor([50, 51, 52, 53, 54, 55])
    packed = torch.full((6,), -7)
    ops.fill_accept_out_cache_loc_cpu(accept_index, out_cache, packed)
    assert packed.tolist() == [50, 52, 53, -7, -7, -7]

    table = ops.build_draft_decode_metadata_cpu(r2t, torch.tensor([1, 3]), torch.tensor([2, 3]), 2, 2, 10)
    assert table.shape == (4, 10)
    assert table[0, :4].tolist() == [10, 11, 12, 13]          # prefix 10, 11, branch 0: 12, 13
    assert table[1, :4].tolist() == [10, 11, 14, 15]          # branch 1: columns 2 + 2 + [0, 2)
    assert table[3, :5].tolist() == [30, 31, 32, 35, 36]


# --- the tree --------------------------------------------------------------------------------------
def _reference_tree(parent_list, selected, topk, n):
    """parent node of each draft node (0 = root) from the parent rule, children ascending."""
    parent = {}
    for i in range(1, n):
        row = int(selected[i - 1]) // topk
        if row == 0:
            parent[i] = 0
        else:
            tok = int(parent_list[row])
            parent[i] = 1 + [int(x) for x in selected].index(tok)
    children = {j: sorted(i for i, p in parent.items() if p == j) for j in range(n)}
    return parent, children


def _ancestors(parent, i):
    out = [i]
    while i:
        i = parent[i]
        out.append(i)
    return out


def _build(parent_list, selected, seq_lens, topk, depth, n, mode=0):
    bs = len(seq_lens)
    seq = torch.tensor(seq_lens)
    size = sum((s + n) * n for s in seq_lens) if mode == 0 else bs * n * n
    mask = torch.ones(size, dtype=torch.bool)
    positions = torch.zeros(bs * n, dtype=torch.int64)
    r_index = torch.zeros(bs, n, dtype=torch.int64)
    r_next = torch.full((bs, n), -1, dtype=torch.int64)
    r_sib = torch.full((bs, n), -1, dtype=torch.int64)
    ops.build_tree_kernel_efficient_cpu(parent_list, selected, seq, mask, positions, r_index, r_next,
                                        r_sib, topk, depth, n, mode)
    return mask, positions, r_index, r_next, r_sib


TREES = {
    # topk 1 chain of 3 drafts: parent_list rows are the previous step's token
    "chain": (1, 3, 4, torch.tensor([[-1, 0, 1, 2]]), torch.tensor([[0, 1, 2]])),
    # topk 2, depth 2: tokens 0,1 from the root, 2-5 children of 0 and 1; pick 0, 1, 2
    "two-branches": (2, 2, 4, torch.tensor([[-1, 0, 1]]), torch.tensor([[0, 1, 2]])),
    # topk 2, depth 3, deeper: pick 0, 2, 3, 6 (6 // 2 = 3 -> parent_list[3] = 2)
    "deep": (2, 3, 5, torch.tensor([[-1, 0, 1, 2, 3]]), torch.tensor([[0, 2, 3, 6]])),
}


@pytest.mark.parametrize("name", sorted(TREES))
@pytest.mark.parametrize("mode", [0, 1])
def test_build_tree_matches_the_parent_rule(name, mode):
    topk, depth, n, parent_list, selected = TREES[name]
    seq_lens = [5, 2]
    parent_list = parent_list.repeat(2, 1)
    selected = selected.repeat(2, 1)
    mask, positions, r_index, r_next, r_sib = _build(parent_list, selected, seq_lens, topk, depth, n, mode)
    parent, children = _reference_tree(parent_list[0], selected[0], topk, n)
    off = 0
    for b, s in enumerate(seq_lens):
        assert r_index[b].tolist() == [b * n + i for i in range(n)]
        for j in range(n):
            kids = children[j]
            assert int(r_next[b, j]) == (kids[0] if kids else -1)
            for a, c in zip(kids, kids[1:], strict=False):
                assert int(r_sib[b, a]) == c
            if kids:
                assert int(r_sib[b, kids[-1]]) == -1
        for x in range(n):
            anc = _ancestors(parent, x)
            assert int(positions[b * n + x]) == s + len(anc) - 1
            width = s + n if mode == 0 else n
            row = mask[off + x * width: off + (x + 1) * width]
            drafts = row[s:] if mode == 0 else row
            assert drafts.tolist() == [i in anc for i in range(n)], (b, x)
            if mode == 0:
                assert row[:s].all()
        off += (s + n) * n if mode == 0 else n * n


def _reference_verify(children, candidates, target):
    """Follow the first child whose draft token equals the target's argmax at the current node."""
    node, path = 0, [0]
    while True:
        nxt = [c for c in children[node] if int(candidates[c]) == int(target[node])]
        if not nxt or len(path) == candidates.numel():
            return path
        node = nxt[0]
        path.append(node)


@pytest.mark.parametrize("name", sorted(TREES))
def test_verify_tree_greedy_follows_the_first_matching_child(name):
    topk, depth, n, parent_list, selected = TREES[name]
    _, children = _reference_tree(parent_list[0], selected[0], topk, n)
    g = torch.Generator().manual_seed(7)
    for trial in range(40):
        bs = 2
        _, _, r_index, r_next, r_sib = _build(parent_list.repeat(bs, 1), selected.repeat(bs, 1), [3, 4],
                                              topk, depth, n)
        candidates = torch.randint(0, 3, (bs, n), generator=g)
        target = torch.randint(0, 3, (bs, n), generator=g)
        steps = depth + 1
        accept_index = torch.full((bs, steps), -1, dtype=torch.int64)
        accept_num = torch.zeros(bs, dtype=torch.int64)
        predicts = torch.full((bs * n,), -5, dtype=torch.int64)
        ops.verify_tree_greedy_cpu(predicts=predicts, accept_index=accept_index,
                                   accept_token_num=accept_num, candidates=candidates,
                                   retrive_index=r_index, retrive_next_token=r_next,
                                   retrive_next_sibling=r_sib, target_predict=target)
        for b in range(bs):
            path = _reference_verify(children, candidates[b], target[b])[:steps]
            assert int(accept_num[b]) == len(path) - 1, (trial, b)
            assert accept_index[b, :len(path)].tolist() == [b * n + i for i in path]
            assert (accept_index[b, len(path):] == -1).all()
            for i in path:  # the target's token at every accepted node (the last is the bonus)
                assert int(predicts[b * n + i]) == int(target[b, i])
            others = set(range(n)) - set(path)
            assert all(int(predicts[b * n + i]) == -5 for i in others)


def test_chain_verify_accepts_the_matching_prefix():
    n = 4
    _, _, r_index, r_next, r_sib = _build(torch.tensor([[-1, 0, 1, 2]]), torch.tensor([[0, 1, 2]]),
                                          [6], 1, 3, n)
    candidates = torch.tensor([[9, 11, 12, 40]])   # node 0 = the last verified token
    target = torch.tensor([[11, 12, 13, 14]])      # target agrees on 11, 12, then says 13 != 40
    accept_index = torch.full((1, 4), -1)
    accept_num = torch.zeros(1, dtype=torch.int64)
    predicts = torch.zeros(4, dtype=torch.int64)
    ops.verify_tree_greedy_cpu(predicts, accept_index, accept_num, candidates, r_index, r_next, r_sib,
                               target)
    assert accept_num.tolist() == [2] and accept_index.tolist() == [[0, 1, 2, -1]]
    assert predicts.tolist() == [11, 12, 13, 0]


def test_missing_kernels_fail_loudly_and_probed_names_stay_absent():
    import subprocess
    import sys

    code = ("import sgl_kernel, torch\n"
            "from sgl_kernel import fused_experts\n"
            "from sgl_kernel.kvcacheio import transfer_kv_all_layer_mla\n"
            "assert not hasattr(torch.ops.sgl_kernel, 'convert_weight_packed')\n"
            "assert not hasattr(sgl_kernel, 'convert_weight_packed')\n"
            "assert torch.ops.sgl_kernel.decode_attention_cpu is sgl_kernel.decode_attention_cpu\n"
            "torch.ops.sgl_kernel.fused_experts_cpu.default  # module-level references resolve\n"
            "try:\n    fused_experts(1)\nexcept NotImplementedError as e:\n    print('NIE', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "PYTHONPATH": str(cpu_engine.SITE_DIR)})
    assert r.returncode == 0, r.stderr
    assert "NIE sgl_kernel.fused_experts: no CPU stand-in" in r.stdout
