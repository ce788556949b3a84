"""checkpoint.layout: names, counts, config and files of the Ling-layout generator."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from ling_fixtures import TINY, tree_digest
from nvfp4study.checkpoint import generate as G
from nvfp4study.checkpoint import layout as L
from nvfp4study.core.errors import LayoutError, OutputExists
from nvfp4study.core.params import LingShape

REAL = LingShape()


# --- counts on the real sizes, counted independently from the names ---------------------------
def _by_layer(specs):
    per = {}
    for name, shape, dtype in specs:
        m = re.match(r"model\.layers\.(\d+)\.(.*)", name)
        if m:
            per.setdefault(int(m.group(1)), []).append((m.group(2), shape, dtype))
    return per


def test_real_layout_counts_match_the_card_and_reference():
    specs = L.tensor_specs(REAL)
    per = _by_layer(specs)
    assert sorted(per) == list(range(43))  # layers 0..41 + MTP layer 42
    experts = {i: [n for n, _, _ in t if re.fullmatch(r"mlp\.experts\.\d+\.(gate|up|down)_proj\.weight", n)]
               for i, t in per.items()}
    # the card: 61,440 quantized expert tensors = 40 MoE layers (2-41) x 512 x 3
    assert sum(len(experts[i]) for i in range(2, 42)) == 61_440
    assert not experts[0] and not experts[1]
    assert len(experts[42]) == 1_536
    others = sorted(n for n, _, _ in per[42] if n not in set(experts[42]))
    # what the reference's name list puts in layer 42 besides expert projections
    assert others == sorted([
        "attention.q_proj.weight", "attention.kv_a_proj_with_mqa.weight", "attention.kv_a_layernorm.weight",
        "attention.kv_b_proj.weight", "attention.g_proj.weight", "attention.dense.weight",
        "input_layernorm.weight", "post_attention_layernorm.weight", "mlp.gate.weight", "mlp.gate.expert_bias",
        "mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight",
        "mlp.shared_experts.down_proj.weight", "eh_proj.weight", "enorm.weight", "hnorm.weight",
        "final_layernorm.weight"])
    # 16 of them are ".weight" tensors (1,536 + 16 = 1,552, the card's number); expert_bias is the 17th
    assert sum(1 for n in others if n.endswith(".weight")) == 16
    f = L.count_formulas(REAL)
    assert f["routed_expert_projections"]["value"] == 61_440
    assert f["mtp_layer_tensors"]["value"] == len(per[42]) == 1_553
    assert f["mtp_other_tensors"]["value"] == 17
    mla = sorted(i for i, t in per.items() if any(n == "attention.kv_b_proj.weight" for n, _, _ in t))
    assert mla == [5, 11, 17, 23, 29, 35, 41, 42]
    assert f["mla_layers"]["value"] == 8


def test_real_shapes_from_reference():
    s = dict((n, (sh, dt)) for n, sh, dt in L.tensor_specs(REAL))
    p = "model.layers.41.attention."
    assert s[p + "q_proj.weight"][0] == (6144, 2560)
    assert s[p + "kv_a_proj_with_mqa.weight"][0] == (576, 2560)
    assert s[p + "kv_b_proj.weight"][0] == (8192, 512)
    assert s[p + "g_proj.weight"][0] == (32, 2560)
    assert s["model.layers.2.mlp.gate.weight"][0] == (512, 2560)
    assert s["model.layers.2.mlp.gate.expert_bias"] == ((512,), "F32")
    assert s["model.layers.2.mlp.experts.511.gate_proj.weight"][0] == (768, 2560)
    assert s["model.layers.2.mlp.experts.0.down_proj.weight"][0] == (2560, 768)
    assert s["model.layers.0.attention.q_conv1d.weight"][0] == (4096, 1, 4)
    assert s["model.layers.0.attention.A_log"] == ((32,), "F32")
    assert s["model.layers.0.attention.dt_bias"] == ((4096,), "F32")
    assert s["model.layers.0.mlp.gate_proj.weight"][0] == (6144, 2560)
    assert s["model.word_embeddings.weight"][0] == (157184, 2560)
    assert s["lm_head.weight"][0] == (157184, 2560)
    # the BF16 source is about 250 GB: ~125 G parameters x 2 bytes
    total = sum(L.spec_nbytes(x) for x in L.tensor_specs(REAL))
    assert 240e9 < total < 260e9


def test_config_keys():
    c = L.config_dict(REAL, seed=3)
    assert c["architectures"] == ["BailingMoeV3ForCausalLM"] and c["model_type"] == "bailing_hybrid"
    assert c["num_nextn_predict_layers"] == 1 and c["mtp_use_kda"] is False
    exp, sh = c["expert_swiglu_limit_list"], c["share_expert_swiglu_limit_list"]
    assert len(exp) == len(sh) == 42
    assert [i for i, v in enumerate(exp) if v] == list(range(35, 42)) and set(exp[35:]) == {4}
    assert [i for i, v in enumerate(sh) if v == 5] == list(range(34, 40)) and sh[40:] == [7, 7]
    assert c["n_group"] == 8 and c["topk_group"] == 4 and c["num_experts"] == 512
    assert c["q_lora_rank"] is None and c["kv_lora_rank"] == 512 and c["rope_theta"] == 6000000
    assert c["_nvfp4study"]["weights"] == "random" and c["_nvfp4study"]["seed"] == 3
    assert "quantization_config" not in c


def test_schedule_tiny():
    rows = L.layer_schedule(TINY)
    assert [(r["attention"], r["mlp"], r["mtp"]) for r in rows] == [
        ("KDA", "dense", False), ("KDA", "moe", False), ("MLA", "moe", False), ("MLA", "moe", True)]
    assert sum(r["tensors"] for r in rows) + 3 == len(L.tensor_specs(TINY))  # + embeddings, norm, lm_head


@pytest.mark.parametrize("bad", [dict(num_experts=6, n_group=4), dict(hidden_size=72),
                                 dict(moe_intermediate_size=40), dict(topk_group=9),
                                 dict(expert_swiglu_limits={3: 4.0})])
def test_bad_shapes(bad, tmp_path):
    shape = TINY.model_copy(update=bad)
    with pytest.raises(LayoutError):
        G.write_checkpoint(shape, tmp_path / "x", shards=2)
    assert list(tmp_path.iterdir()) == []


def test_split_shards():
    specs = L.tensor_specs(TINY)
    for n in (1, 2, 3, 7, len(specs)):
        groups = G.split_shards(specs, n)
        assert len(groups) == n and all(groups) and [s for g in groups for s in g] == specs
    with pytest.raises(LayoutError):
        G.split_shards(specs, len(specs) + 1)
    with pytest.raises(LayoutError):
        G.split_shards(specs, 0)


# --- files -------------------------------------------------------------------------------------
def test_write_is_deterministic_and_hub_like(tmp_path):
    a = G.write_checkpoint(TINY, tmp_path / "a", shards=3, seed=5)
    b = G.write_checkpoint(TINY, tmp_path / "b", shards=3, seed=5)
    c = G.write_checkpoint(TINY, tmp_path / "c", shards=3, seed=6)
    da, db, dc = tree_digest(a), tree_digest(b), tree_digest(c)
    strip = lambda d: {k: v.split(":")[0] for k, v in d.items()}  # noqa: E731
    assert strip(da) == strip(db)
    assert strip(da)["model-00002-of-00003.safetensors"] != strip(dc)["model-00002-of-00003.safetensors"]
    assert sorted(os.listdir(a)) == ["README.md", "config.json", "generation_config.json",
                                     "model-00001-of-00003.safetensors",
                                     "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
                                     "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json"]
    assert "RANDOM WEIGHTS" in (a / "README.md").read_text()
    assert json.loads((a / "config.json").read_text()) == json.loads(json.dumps(L.config_dict(TINY, seed=5)))
    index = json.loads((a / "model.safetensors.index.json").read_text())
    specs = {n: (sh, dt) for n, sh, dt in L.tensor_specs(TINY)}
    assert set(index["weight_map"]) == set(specs)
    total = 0
    for shard in sorted(a.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as fh:
            for k in fh.keys():
                assert index["weight_map"][k] == shard.name
                t = fh.get_tensor(k)
                assert tuple(t.shape) == specs[k][0]
                assert t.dtype == {"BF16": torch.bfloat16, "F32": torch.float32}[specs[k][1]]
                total += t.numel() * t.element_size()
    assert index["metadata"]["total_size"] == total
    with safe_open(str(a / index["weight_map"]["model.layers.1.mlp.experts.3.up_proj.weight"]), "pt") as fh:
        w = fh.get_tensor("model.layers.1.mlp.experts.3.up_proj.weight").float()
    assert 0.015 < float(w.std()) < 0.025  # N(0, 0.02)
    assert not list(tmp_path.glob(".*"))  # no temp folder left


def test_header_only_is_valid_and_sparse(tmp_path):
    shape = TINY.model_copy(update={"hidden_size": 1024, "moe_intermediate_size": 256})
    out = G.write_checkpoint(shape, tmp_path / "h", shards=2, header_only=True)
    specs = {n: (sh, dt) for n, sh, dt in L.tensor_specs(shape)}
    seen = {}
    for shard in out.glob("*.safetensors"):
        with safe_open(str(shard), "pt") as fh:  # safetensors' own reader accepts the header
            assert fh.metadata() == {"format": "pt"}
            for k in fh.keys():
                sl = fh.get_slice(k)
                seen[k] = (tuple(sl.get_shape()), sl.get_dtype())
        st = shard.stat()
        assert st.st_blocks * 512 < st.st_size / 4  # data regions were never written
    assert seen == specs
    with safe_open(str(out / json.loads((out / "model.safetensors.index.json").read_text())["weight_map"][
            "model.layers.0.attention.A_log"]), "pt") as fh:
        a_log = fh.get_tensor("model.layers.0.attention.A_log")  # small: real values
        big = fh.get_tensor("model.layers.0.attention.q_proj.weight")  # sparse: zeros
    assert bool((a_log > 0).all()) and float(big.abs().sum()) == 0.0


def test_header_only_nvfp4_layout_reads(tmp_path):
    out = G.write_checkpoint(TINY, tmp_path / "n", shards=2, header_only=True, layout="nvfp4")
    cfg = json.loads((out / "config.json").read_text())
    qc = cfg["quantization_config"]
    assert qc["ignore"][0] == r"re:.*layers\.3\..*"
    assert next(iter(qc["config_groups"].values()))["input_activations"]["dynamic"] == "local"
    names = {}
    for shard in out.glob("*.safetensors"):
        with safe_open(str(shard), "pt") as fh:
            for k in fh.keys():
                if k.endswith("global_scale"):
                    names[k] = float(fh.get_tensor(k)[0])
    n_experts = 3 * TINY.num_experts * (TINY.num_hidden_layers - TINY.first_k_dense_replace)
    assert sum(k.endswith("input_global_scale") for k in names) == n_experts
    assert all(v == 1.0 for k, v in names.items() if k.endswith("input_global_scale"))
    assert all(2688 / 0.2 <= v <= 2688 / 0.05 for k, v in names.items() if k.endswith("weight_global_scale"))
    with pytest.raises(LayoutError):
        G.write_checkpoint(TINY, tmp_path / "m", layout="nvfp4")  # nvfp4 is header-only


# --- bad input ---------------------------------------------------------------------------------
def test_output_exists(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep").write_text("mine")
    with pytest.raises(OutputExists, match="x"):
        G.write_checkpoint(TINY, tmp_path / "x", shards=2)
    assert os.listdir(tmp_path / "x") == ["keep"]


def test_failure_leaves_nothing(tmp_path, monkeypatch):
    import safetensors.torch as st

    calls = Counter()

    def boom(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk full (simulated)")
        return real(*a, **k)

    real = st.save_file
    monkeypatch.setattr(st, "save_file", boom)
    with pytest.raises(OSError):
        G.write_checkpoint(TINY, tmp_path / "y", shards=3)
    assert list(tmp_path.iterdir()) == []


def test_read_header_errors(tmp_path):
    f = tmp_path / "bad.safetensors"
    f.write_bytes((10_000).to_bytes(8, "little") + b"{}")
    with pytest.raises(LayoutError, match="beyond the file size"):
        L.read_header(f)
    f.write_bytes((4).to_bytes(8, "little") + b"{no}")
    with pytest.raises(LayoutError, match="invalid header JSON"):
        L.read_header(f)


def test_cli(tmp_path, capsys):
    params = tmp_path / "p.yaml"
    params.write_text(Path(L.__file__).resolve().parents[3].joinpath("params/default.yaml").read_text())
    assert G.main([str(tmp_path / "c"), "--params", str(params), "--header-only", "--shards", "2"]) == 0
    out = capsys.readouterr().out
    from nvfp4study.core.params import load_params

    n = len(L.tensor_specs(load_params(params).checkpoint.shape))
    assert f"{n} tensors" in out and "header-only" in out
    with pytest.raises(SystemExit):
        G.main(["--help"])
