"""The served checkpoint (checkpoint/served.py), the tokenizer (checkpoint/tokenizer.py) and the
shape rules SGLang 0.5.23 imposes (core/params.py shape_problems)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from nvfp4study.checkpoint import layout as L
from nvfp4study.checkpoint import served as S
from nvfp4study.checkpoint import tokenizer as T
from nvfp4study.core.errors import (
    LayoutError,
    OutputExists,
    ParamsError,
    ServedCheckpointError,
    ShapeInvalid,
)
from nvfp4study.core.params import PARAMS_DIR, LingShape, load_params

DEFAULT = load_params(None, overlay=False).checkpoint.shape


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    return {d: S.write_served_checkpoint(root / d, DEFAULT, seed=0, draft=d) for d in S.DRAFTS} | {"root": root}


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(shard)))
    return out


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """SGLang's RMSNorm: x / rms(x) * weight (layers/layernorm.py forward_native)."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float()


# --- shapes ----------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, words", [
    (dict(num_hidden_layers=8, layer_group_size=6), "multiple of layer_group_size"),
    (dict(num_nextn_predict_layers=2), "0 or 1"),
    (dict(num_hidden_layers=1, layer_group_size=1, first_k_dense_replace=1), "num_hidden_layers >= 2"),
    (dict(num_experts=16, n_group=16, topk_group=2), ">= 2"),
    (dict(num_experts_per_tok=12), "topk_group x experts per"),
    (dict(num_shared_experts=2), "num_shared_experts"),
    (dict(num_shared_experts=0), "num_shared_experts"),
    (dict(qk_rope_head_dim=15), "even"),
    (dict(vocab_size=32), "vocab_size"),
    (dict(topk_group=5), "exceeds n_group"),
])
def test_bad_shapes_are_named(bad, words):
    base = DEFAULT.model_dump() | {"expert_swiglu_limits": {}, "share_expert_swiglu_limits": {}}
    with pytest.raises(ShapeInvalid, match=words) as ei:
        LingShape(**(base | bad))
    assert isinstance(ei.value, ParamsError) and isinstance(ei.value, LayoutError)
    unvalidated = DEFAULT.model_copy(update=bad | {"expert_swiglu_limits": {}, "share_expert_swiglu_limits": {}})
    with pytest.raises(ShapeInvalid, match=words):
        L.tensor_specs(unvalidated)


def test_assignment_and_params_file_are_checked():
    s = LingShape()
    with pytest.raises(ShapeInvalid, match="layer_group_size"):
        s.layer_group_size = 5
    with pytest.raises(ShapeInvalid, match=r"-p checkpoint.shape.layer_group_size: key 'checkpoint.shape'"):
        load_params(None, ["checkpoint.shape.layer_group_size=3"], overlay=False)


@pytest.mark.parametrize("params", sorted(PARAMS_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_every_profile_shape_is_one_sglang_builds(params):
    s = load_params(params, overlay=False).checkpoint.shape
    assert s.num_hidden_layers % s.layer_group_size == 0  # models/bailing_moe_v3.py:1224
    assert any(L.is_mla_layer(s, i) for i in range(s.num_hidden_layers))


def test_default_shape_keeps_clamps_on_mla_and_kda_layers():
    sched = {r["layer"]: r["attention"] for r in L.layer_schedule(DEFAULT)}
    assert [i for i, a in sched.items() if a == "MLA"] == [3, 7, 8]
    clamped = set(DEFAULT.expert_swiglu_limits) | set(DEFAULT.share_expert_swiglu_limits)
    assert {sched[i] for i in clamped} == {"MLA", "KDA"}


# --- tokenizer -------------------------------------------------------------------------------
def test_config_ids_inside_vocab_and_named_by_tokenizer(ckpts):
    for d in S.DRAFTS:
        c = json.loads((ckpts[d] / "config.json").read_text())
        g = json.loads((ckpts[d] / "generation_config.json").read_text())
        tok = json.loads((ckpts[d] / "tokenizer.json").read_text())
        added = {a["content"]: a["id"] for a in tok["added_tokens"]}
        for key, name in (("bos_token_id", T.BOS), ("eos_token_id", T.EOS), ("pad_token_id", T.PAD)):
            assert 0 <= c[key] < c["vocab_size"] and c[key] == g[key] == added[name]
    cfg = L.config_dict(LingShape())  # the full-size vocabulary too
    assert cfg["eos_token_id"] == 157184 - len(T.SPECIAL_TOKENS) + 1


def test_tokenizer_round_trip_and_chat_template(ckpts):
    from transformers import AutoTokenizer

    tk = AutoTokenizer.from_pretrained(str(ckpts["agree"]))
    ids = T.special_token_ids(DEFAULT.vocab_size)
    assert len(tk) == DEFAULT.vocab_size
    assert (tk.bos_token_id, tk.eos_token_id, tk.pad_token_id) == (ids[T.BOS], ids[T.EOS], ids[T.PAD])
    text = "def add(a: int, b: int) -> int:\n    \"\"\"Return a + b. héllo ✓ 漢字\"\"\"\n\treturn a+b\n"
    enc = tk(text, add_special_tokens=True)["input_ids"]
    assert max(enc) < DEFAULT.vocab_size and tk.decode(enc) == text
    assert tk.convert_ids_to_tokens(S.TARGET_TOKEN) not in T.SPECIAL_TOKENS  # the "agree" token is text
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add 1 and 2."},
            {"role": "assistant", "content": "3"}, {"role": "user", "content": "Why?"}]
    out = tk.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert out == ("<role>SYSTEM</role>Be brief.<|role_end|><role>HUMAN</role>Add 1 and 2.<|role_end|>"
                   "<role>ASSISTANT</role>3<|role_end|><role>HUMAN</role>Why?<|role_end|><role>ASSISTANT</role>")
    for flag in (True, False):
        assert tk.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=flag) == out
    chat_ids = tk.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert chat_ids.count(ids[T.ROLE_OPEN]) == 5 and chat_ids.count(ids[T.ROLE_END]) == 4


def test_tiny_vocab_tokenizer_has_exact_size():
    tok = T.build_tokenizer(64)
    assert tok.get_vocab_size() == 64 and tok.token_to_id(T.EOS) == 64 - len(T.SPECIAL_TOKENS) + 1
    with pytest.raises(LayoutError):
        T.build_tokenizer(63)


def test_tokenizer_bytes_same_in_another_process(ckpts):
    code = "import sys; from nvfp4study.checkpoint import tokenizer as T; sys.stdout.write(T.build_tokenizer(512).to_str())"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert other + "\n" == (ckpts["random"] / "tokenizer.json").read_text()


# --- layout ----------------------------------------------------------------------------------
def test_all_mla_with_mtp_and_the_shapes_other_sizes(ckpts):
    c = json.loads((ckpts["random"] / "config.json").read_text())
    assert c["layer_group_size"] == 1 and c["short_conv_kernel_size"] == DEFAULT.short_conv_kernel_size
    for k in ("num_hidden_layers", "num_experts", "n_group", "topk_group", "first_k_dense_replace",
              "num_shared_experts", "num_nextn_predict_layers", "vocab_size"):
        assert c[k] == getattr(DEFAULT, k), k
    assert c["expert_swiglu_limit_list"] == L.config_dict(DEFAULT)["expert_swiglu_limit_list"]
    assert c["share_expert_swiglu_limit_list"] == L.config_dict(DEFAULT)["share_expert_swiglu_limit_list"]
    assert c["moe_router_enable_expert_bias"] is True and c["_nvfp4study"]["served"]["draft"] == "random"
    names = {n for _, n, _, _ in L.iter_header_specs(ckpts["random"])}
    n = DEFAULT.num_hidden_layers
    for i in range(n + 1):
        assert f"model.layers.{i}.attention.kv_a_proj_with_mqa.weight" in names
    assert not any(x in name for name in names for x in ("A_log", "dt_bias", "conv1d", "o_norm"))
    assert {f"model.layers.{n}.{x}.weight" for x in ("eh_proj", "enorm", "hnorm", "final_layernorm")} <= names
    assert f"model.layers.{n}.mlp.gate.expert_bias" in names
    assert f"model.layers.{n}.mlp.shared_experts.down_proj.weight" in names
    assert DEFAULT.layer_group_size == 4  # the input shape is not modified


def test_same_bytes_twice_and_seed_matters(ckpts, tmp_path):
    again = S.write_served_checkpoint(tmp_path / "again", DEFAULT, seed=0, draft="agree")
    assert _digest(again) == _digest(ckpts["agree"])
    other = S.write_served_checkpoint(tmp_path / "seed1", DEFAULT, seed=1, draft="agree")
    d0, d1 = _digest(ckpts["agree"]), _digest(other)
    assert d0["tokenizer.json"] == d1["tokenizer.json"]
    assert d0["model-00001-of-00001.safetensors"] != d1["model-00001-of-00001.safetensors"]


def test_constructions_leave_other_tensors_random(ckpts):
    rnd, dis = _tensors(ckpts["random"]), _tensors(ckpts["disagree"])
    assert rnd.keys() == dis.keys()
    assert torch.equal(rnd["model.layers.0.attention.q_proj.weight"], dis["model.layers.0.attention.q_proj.weight"])
    assert all(t.dtype in (torch.bfloat16, torch.float32) for t in dis.values())


# --- draft constructions ---------------------------------------------------------------------
def test_agree_both_logits_are_zero(ckpts):
    t = _tensors(ckpts["agree"])
    n = DEFAULT.num_hidden_layers
    assert not t["model.norm.weight"].any() and not t[f"model.layers.{n}.final_layernorm.weight"].any()
    h = torch.randn(32, DEFAULT.hidden_size)
    target = _rms(h, t["model.norm.weight"]) @ t["lm_head.weight"].float().T
    draft = _rms(h * 3, t[f"model.layers.{n}.final_layernorm.weight"]) @ t["lm_head.weight"].float().T
    assert not target.any() and not draft.any()
    assert (target.argmax(-1) == S.TARGET_TOKEN).all() and (draft.argmax(-1) == S.TARGET_TOKEN).all()


def test_disagree_draft_never_proposes_the_target_token(ckpts):
    """A plain-torch NEXTN forward (models/bailing_moe_nextn.py:146-189) for EVERY token id with
    random target hidden states; the decoder layer's contributions to the residual stream are its
    attention output through ``attention.dense`` and its MoE output through the ``down_proj``s,
    all zero here, so its output is its input."""
    t = _tensors(ckpts["disagree"])
    n, H = DEFAULT.num_hidden_layers, DEFAULT.hidden_size
    p = f"model.layers.{n}."
    assert not t[p + "attention.dense.weight"].any()
    downs = [k for k in t if k.startswith(p + "mlp.") and k.endswith("down_proj.weight")]
    assert len(downs) == DEFAULT.num_experts + 1 and not any(t[k].any() for k in downs)
    emb, head = t["model.word_embeddings.weight"], t["lm_head.weight"].float()
    tokens = torch.arange(DEFAULT.vocab_size)
    hid = torch.randn(len(tokens), H) * 5
    x = torch.cat([_rms(emb[tokens], t[p + "enorm.weight"]), _rms(hid, t[p + "hnorm.weight"])], -1)
    x = x @ t[p + "eh_proj.weight"].float().T  # eh_proj (ReplicatedLinear, no bias)
    y = _rms(x, t[p + "final_layernorm.weight"])  # decoder adds 0; final_layernorm
    draft = (y @ head.T).argmax(-1)
    target = (_rms(torch.randn(64, H), t["model.norm.weight"]) @ head.T).argmax(-1)
    assert (draft == S.DISAGREE_TOKEN).all() and (target == S.TARGET_TOKEN).all()
    assert S.DISAGREE_TOKEN != S.TARGET_TOKEN
    assert not t["model.norm.weight"].any()  # the target's logits are 0 whatever lm_head is


# --- bad input -------------------------------------------------------------------------------
def test_bad_input_writes_nothing(tmp_path, ckpts):
    with pytest.raises(ServedCheckpointError, match="draft"):
        S.write_served_checkpoint(tmp_path / "x", DEFAULT, draft="half")
    with pytest.raises(ServedCheckpointError, match="MTP"):
        S.write_served_checkpoint(tmp_path / "x", DEFAULT.model_copy(update={"num_nextn_predict_layers": 0}))
    with pytest.raises(OutputExists):
        S.write_served_checkpoint(ckpts["agree"], DEFAULT, draft="agree")
    assert list(tmp_path.iterdir()) == []


def test_cli(tmp_path, capsys):
    assert S.main([str(tmp_path / "c"), "--draft", "disagree"]) == 0
    c = json.loads((tmp_path / "c" / "config.json").read_text())
    assert c["_nvfp4study"]["served"] == {"draft": "disagree", "layer_group_size": 1, "target_token": 0,
                                          "draft_token": 1, "clamp_probe": None}


# --- the clamp probe (04) ----------------------------------------------------------------------
def test_clamp_probe_changes_only_the_clamp_lists(tmp_path, ckpts):
    """The three probe checkpoints hold the random model's bytes; config.json differs only in the
    two clamp lists: the limit on layers first_k_dense_replace..num_hidden_layers-1 of one list."""
    base = ckpts["random"]
    first, n = DEFAULT.first_k_dense_replace, DEFAULT.num_hidden_layers
    want = {"off": ([0] * n, [0] * n),
            "routed": ([0] * first + [0.25] * (n - first), [0] * n),
            "shared": ([0] * n, [0] * first + [0.25] * (n - first))}
    cfg0 = json.loads((base / "config.json").read_text())
    for probe, (routed, shared) in want.items():
        out = S.write_served_checkpoint(tmp_path / probe, DEFAULT, seed=0, clamp_probe=(probe, 0.25))
        for f in sorted(base.glob("*.safetensors")):
            assert hashlib.sha256((out / f.name).read_bytes()).digest() == hashlib.sha256(f.read_bytes()).digest()
        cfg = json.loads((out / "config.json").read_text())
        assert (cfg["expert_swiglu_limit_list"], cfg["share_expert_swiglu_limit_list"]) == (routed, shared)
        assert cfg["_nvfp4study"]["served"]["clamp_probe"] == {"probe": probe, "limit": 0.25}
        rest = lambda c: {k: v for k, v in c.items() if not k.endswith("swiglu_limit_list") and k != "_nvfp4study"}  # noqa: E731
        assert rest(cfg) == rest(cfg0)


@pytest.mark.parametrize("probe,limit,words", [
    ("both", 1.0, "clamp probe must be one of"), ("routed", 0, "finite number > 0"),
    ("routed", -1.0, "finite number > 0"), ("routed", float("nan"), "finite number > 0"),
    ("routed", float("inf"), "finite number > 0"), ("routed", True, "finite number > 0"),
    ("routed", "1", "finite number > 0"), (None, 1.0, "clamp probe must be one of")])
def test_bad_clamp_probe_is_named_and_writes_nothing(tmp_path, probe, limit, words):
    with pytest.raises(ServedCheckpointError, match=words):
        S.write_served_checkpoint(tmp_path / "x", DEFAULT, clamp_probe=(probe, limit))
    for bad in ("routed", ("routed",), ("routed", 1.0, 2.0), 1.0):
        with pytest.raises(ServedCheckpointError, match=r"\(probe, limit\)"):
            S.write_served_checkpoint(tmp_path / "x", DEFAULT, clamp_probe=bad)
    assert list(tmp_path.iterdir()) == []


def test_scaling_probes_change_the_factor_or_the_routed_down_proj_only(tmp_path):
    """"factor": the off probe's tensors byte for byte, config routed_scaling_factor 2.5 x 4 = 10 and
    nothing else changed; "weights": every routed expert's down_proj exactly 4 x the off probe's
    (MTP layer included), every other tensor and the factor unchanged."""
    off = S.write_served_checkpoint(tmp_path / "off", DEFAULT, seed=0, clamp_probe=("off", 0.25))
    fac = S.write_served_checkpoint(tmp_path / "factor", DEFAULT, seed=0, clamp_probe=("off", 0.25),
                                    scaling_probe=("factor", 4.0))
    wts = S.write_served_checkpoint(tmp_path / "weights", DEFAULT, seed=0, clamp_probe=("off", 0.25),
                                    scaling_probe=("weights", 4.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["factor", "off", "weights"]  # no .partial left
    cfg = {k: json.loads((f / "config.json").read_text()) for k, f in (("off", off), ("factor", fac), ("weights", wts))}
    assert (cfg["off"]["routed_scaling_factor"], cfg["factor"]["routed_scaling_factor"],
            cfg["weights"]["routed_scaling_factor"]) == (2.5, 10.0, 2.5)
    rest = lambda c: {k: v for k, v in c.items() if k not in ("routed_scaling_factor", "_nvfp4study")}  # noqa: E731
    assert rest(cfg["factor"]) == rest(cfg["off"]) == rest(cfg["weights"])
    assert cfg["factor"]["_nvfp4study"]["served"]["scaling_probe"] == {"kind": "factor", "ratio": 4.0}
    for f in sorted(off.glob("*.safetensors")):
        assert (fac / f.name).read_bytes() == f.read_bytes()
    t_off, t_w = _tensors(off), _tensors(wts)
    routed = [k for k in t_off if ".mlp.experts." in k and k.endswith("down_proj.weight")]
    n_moe = DEFAULT.num_hidden_layers - DEFAULT.first_k_dense_replace + DEFAULT.num_nextn_predict_layers
    assert len(routed) == n_moe * DEFAULT.num_experts
    for k, v in t_off.items():
        want = v.float() * 4 if k in routed else v.float()
        assert torch.equal(t_w[k].float(), want), k


@pytest.mark.parametrize("probe,draft", [(("both", 4.0), "random"), (("factor", 1.0), "random"),
                                         (("factor", 0), "random"), (("weights", float("inf")), "random"),
                                         (("factor", True), "random"), ("factor", "random"),
                                         (("factor", 4.0), "agree")])
def test_bad_scaling_probe_is_named_and_writes_nothing(tmp_path, probe, draft):
    with pytest.raises(ServedCheckpointError, match="scaling_probe must be"):
        S.write_served_checkpoint(tmp_path / "x", DEFAULT, draft=draft, scaling_probe=probe)
    assert list(tmp_path.iterdir()) == []
