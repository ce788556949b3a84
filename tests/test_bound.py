"""The decode ceiling's byte count against a hand computation on a tiny Ling shape."""

from __future__ import annotations

import pytest

from ledger_fixtures import ledger_row
from nvfp4study.core.errors import StudyError
from nvfp4study.core.params import LingShape
from nvfp4study.workstation import bound

# H 32, 2 heads of 16, vocab 64, dense I 48, 4 experts (top 2) of 16, one shared of 16; layer 0 KDA +
# dense MLP, layer 1 MLA + MoE, layer 2 the MTP layer (MLA + MoE, BF16 in the card's recipe).
TINY = LingShape(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=2, head_dim=16, layer_group_size=2, num_experts=4, num_experts_per_tok=2,
                 n_group=2, topk_group=1, moe_intermediate_size=16, moe_shared_expert_intermediate_size=16,
                 first_k_dense_replace=1, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
                 short_conv_kernel_size=4, expert_swiglu_limits={}, share_expert_swiglu_limits={})

BF = 2
NORM = 32 * BF                                                   # [H] BF16
KDA = 5 * 32 * 32 * BF + 2 * 32 * BF + 32 * 32 * BF + 3 * 32 * 4 * BF + 16 * BF + 2 * 4 + 32 * 4
# q,k,v,f,g [P,H]; b_proj [h,H]; o_proj [H,P]; 3 conv1d [P,1,4]; o_norm [d]; A_log [h] F32; dt_bias [P] F32
MLA = (2 * 16 * 32 + 24 * 32 + 16 + 2 * 16 * 16 + 2 * 32 + 32 * 16) * BF
# q_proj [h*(8+8),H]; kv_a [16+8,H]; kv_a_layernorm [16]; kv_b [h*(8+8),16]; g_proj [h,H]; dense [H,h*8]
DENSE_MLP = 3 * 48 * 32 * BF
ROUTER = 4 * 32 * BF + 4 * 4                                     # gate [E,H] BF16 + expert_bias [E] F32
SHARED = 3 * 16 * 32 * BF
# one NVFP4 expert: per projection packed o*i/2 U8 + block scales o*i/16 F8 + weight and input global F32
EXPERT_NVFP4 = 3 * (16 * 32 // 2 + 16 * 32 // 16 + 4 + 4)
EXPERT_BF16 = 3 * 16 * 32 * BF
LM_HEAD = 64 * 32 * BF
ROW = 32 * BF
MTP_EXTRA = 32 * 64 * BF + 3 * NORM                              # eh_proj [H,2H]; enorm, hnorm, final_layernorm


def test_byte_count_by_hand():
    rb = bound.read_bytes(TINY)
    layer0 = 2 * NORM + KDA + DENSE_MLP
    layer1_not_experts = 2 * NORM + MLA + ROUTER + SHARED
    assert EXPERT_NVFP4 == 888
    assert rb.dense == layer0 + layer1_not_experts + NORM + LM_HEAD == 36120
    assert rb.expert == EXPERT_NVFP4 and rb.embed_row == ROW
    assert rb.per_token() == 36120 + 2 * 888 + 64
    mtp = 2 * NORM + MLA + ROUTER + SHARED + MTP_EXTRA
    assert rb.draft == mtp + 2 * EXPERT_BF16 + LM_HEAD + ROW == 23856


def test_ceilings_by_hand():
    rb = bound.read_bytes(TINY)
    off = bound.ceiling(rb, 1e6)
    assert off["ceiling_tok_s"] == pytest.approx(1e6 / 37960)
    k2 = bound.ceiling(rb, 1e6, depth=2, accept_len=2.5)
    per_cycle = 36120 + 2 * 888 + 3 * 64 + 2 * 23856  # one verify of 3 tokens + 2 draft steps
    assert k2["bytes_per_pass"] == per_cycle and k2["ceiling_tok_s"] == pytest.approx(2.5e6 / per_cycle)
    union = 4 * (1 - (1 - 2 / 4) ** 3)  # 3.5 of 4 experts expected under independent routing
    assert k2["independent_routing_tok_s"] == pytest.approx(2.5e6 / (per_cycle + (union - 2) * 888))
    with pytest.raises(StudyError, match="accept length"):
        bound.ceiling(rb, 1e6, depth=2)
    with pytest.raises(StudyError, match="bandwidth"):
        bound.ceiling(rb, 0)


def test_gpu_names():
    assert bound.gpu_bandwidth("NVIDIA RTX PRO 6000 Blackwell Workstation Edition") == (
        "NVIDIA RTX PRO 6000 Blackwell", 1792e9)
    assert bound.gpu_bandwidth("NVIDIA GB10")[1] == 273e9
    assert bound.gpu_bandwidth("NVIDIA H200")[1] == 4800e9
    with pytest.raises(bound.UnknownGPU, match="Tesla T4"):
        bound.gpu_bandwidth("Tesla T4")


def test_card_table_rows():
    rows = bound.card_table(TINY, ["NVIDIA DGX Spark (GB10)"])
    assert [r["depth"] for r in rows] == [0, 1, 2, 3]
    k2 = rows[2]
    assert k2["card tok/s"] == 45.1 and k2["accept len (card, mid)"] == pytest.approx(2.66)
    assert k2["card / ceiling"] == pytest.approx(45.1 / k2["ceiling tok/s"])


def test_06_records_the_ceiling_finding(tmp_path):
    from nvfp4study.core.params import dump_params, load_params
    from nvfp4study.core.stage import open_stage
    from nvfp4study.stages import s06_mtp as mtp

    pf = dump_params(load_params(), tmp_path / "params.yaml")  # default profile: no GPU, still computed
    df = mtp.ceiling_table(open_stage("06_mtp_sweep", str(pf), str(tmp_path)))
    assert set(df.gpu) == set(bound.CARD_CLASS) and len(df) == 12
    row = ledger_row(tmp_path, "mtp.bandwidth-ceiling")
    rb = bound.read_bytes(LingShape())  # the real model's layout, whatever the profile
    spark_off = 22.60 / (273e9 / rb.per_token())
    assert row["measured"]["card_over_ceiling"]["NVIDIA DGX Spark (GB10)"]["0"] == pytest.approx(spark_off, abs=1e-4)
    assert row["verdict"] == "reproduced" and row["card"] is None and "not verified" in row["note"]


def test_plan_prints_the_users_gpu_ceiling():
    from nvfp4study.core.params import REPO_ROOT, load_params
    from nvfp4study.workstation import plan

    p = load_params(REPO_ROOT / "params" / "ling3-flash.yaml")
    c = plan.ceilings(p, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition")
    rb = bound.read_bytes(p.checkpoint.shape)
    assert c["depths"][0]["ceiling_tok_s"] == pytest.approx(1792e9 / rb.per_token())
    assert c["depths"][2]["ceiling_tok_s"] == pytest.approx(1792e9 * 2.66 / rb.per_cycle(2))
    assert "reason" in plan.ceilings(p, "Tesla T4")
    text = plan.format_plan(p, plan.summary(p, gpu="NVIDIA B200"))
    assert "decode ceiling on NVIDIA B200 (8000 GB/s" in text
