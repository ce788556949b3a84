"""checkpoint.quantize: the real model_free_ptq on a tiny Ling-layout checkpoint, the serving rewrite, bad input."""

from __future__ import annotations

import json
import re
import shutil
import sys

import pytest
import torch
from safetensors import safe_open

from ling_fixtures import TINY, tree_digest
from nvfp4study.checkpoint import generate as G
from nvfp4study.checkpoint import layout as L
from nvfp4study.checkpoint import ptq as P
from nvfp4study.checkpoint import quantize as Q
from nvfp4study.checkpoint import recipe as R
from nvfp4study.core.errors import OutputExists, QuantizeFailed, SourceCheckpointMissing
from nvfp4study.core.params import QuantizeParams

N_ROUTED = 3 * TINY.num_experts * (TINY.num_hidden_layers - TINY.first_k_dense_replace)  # 48


def _split_pairs(src):
    wm = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    return [n for n in wm if re.match(r"model\.layers\.[12]\.mlp\.experts\.\d+\.gate_proj\.weight$", n)
            and wm[n] != wm[n.replace("gate_proj", "up_proj")]]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("q")
    # enough shards that some expert's gate and up land in different files (cross-shard pairing)
    for shards in range(5, 40):
        src = G.write_checkpoint(TINY, root / f"src{shards}", shards=shards, seed=1)
        if _split_pairs(src):
            break
    before = tree_digest(src)
    shared = Q.quantize_checkpoint(src, root / "shared", QuantizeParams())
    unshared = Q.quantize_checkpoint(src, root / "unshared", QuantizeParams(share_gate_up_global_scale=False))
    return {"root": root, "src": src, "before": before, "shared": shared, "unshared": unshared}


def _tensors(folder):
    out = {}
    for shard in sorted(folder.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as fh:
            for k in fh.keys():
                out[k] = fh.get_tensor(k)
    return out


def test_source_untouched(ckpts):
    assert tree_digest(ckpts["src"]) == ckpts["before"]
    assert ckpts["shared"]["source_unchanged"] is True


def test_layout_written(ckpts):
    rep = ckpts["shared"]
    q = _tensors(ckpts["root"] / "shared")
    src = _tensors(ckpts["src"])
    packed = [k for k in q if k.endswith(".weight_packed")]
    # only routed experts of layers 1..2 are quantized; the MTP layer 3 is BF16 throughout
    assert len(packed) == N_ROUTED
    assert all(re.match(r"model\.layers\.[12]\.mlp\.experts\.\d+\.(gate|up|down)_proj\.", k) for k in packed)
    assert not any(k.startswith("model.layers.3.") and "weight_" in k for k in q)
    for k in packed:
        mod = k[: -len(".weight_packed")]
        o, i = src[mod + ".weight"].shape
        assert q[k].dtype == torch.uint8 and tuple(q[k].shape) == (o, i // 2)
        assert q[mod + ".weight_scale"].dtype == torch.float8_e4m3fn
        assert tuple(q[mod + ".weight_scale"].shape) == (o, i // 16)
        assert q[mod + ".weight_global_scale"].dtype == torch.float32 and q[mod + ".weight_global_scale"].numel() == 1
        assert q[mod + ".input_global_scale"].dtype == torch.float32
        assert float(q[mod + ".input_global_scale"]) == 1.0
        assert mod + ".weight" not in q
    # everything not quantized is copied bitwise
    for k, t in src.items():
        if k in q:
            assert torch.equal(t, q[k]), k
    assert rep["counts"]["expert_weight_packed"] == rep["counts"]["input_global_scale"] == N_ROUTED
    assert rep["counts"]["tensors"] == len(q)
    assert rep["mb_per_s"] > 0 and rep["ptq_seconds"] > 0
    idx = json.loads((ckpts["root"] / "shared" / "model.safetensors.index.json").read_text())
    assert set(idx["weight_map"]) == set(q)


def test_tokenizer_copied_through(ckpts):
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (ckpts["root"] / "shared" / name).read_bytes() == (ckpts["src"] / name).read_bytes()


def test_config_is_the_cards_serving_layout(ckpts):
    cfg = json.loads((ckpts["root"] / "shared" / "config.json").read_text())
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "nvfp4-pack-quantized"
    assert qc["ignore"][0] == r"re:.*layers\.3\..*"  # MTP layer first
    (group,) = qc["config_groups"].values()
    assert group["weights"]["num_bits"] == 4 and group["weights"]["group_size"] == 16
    ia = group["input_activations"]
    assert ia == {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 16,
                  "strategy": "tensor_group", "dynamic": "local", "observer": "static_minmax",
                  "observer_kwargs": {}, "scale_dtype": "torch.float8_e4m3fn", "zp_dtype": None,
                  "actorder": None, "block_structure": None}
    assert cfg["expert_swiglu_limit_list"] == [0, 0, 4]  # the rest of config.json is kept


def test_header_only_nvfp4_layout_equals_real_output(ckpts, tmp_path):
    """The synthetic full-size layout uses the same names/dtypes/shapes as the real pipeline."""
    real = {n: (sh, dt) for _, n, sh, dt in L.iter_header_specs(ckpts["root"] / "shared")}
    specs, cfg = R.nvfp4_layout(TINY, L.tensor_specs(TINY), L.config_dict(TINY))
    assert {n: (sh, dt) for n, sh, dt in specs} == real
    got = json.loads((ckpts["root"] / "shared" / "config.json").read_text())["quantization_config"]
    assert cfg["quantization_config"] == got


def test_is_quantized_agrees_with_compressed_tensors():
    from compressed_tensors.utils import match_quantizable_tensors

    specs = L.tensor_specs(TINY)
    ignore = Q.card_ignore(TINY.num_hidden_layers)
    fake = {n: torch.empty(0) for n, _, _ in specs}
    ct = {name for _, name in match_quantizable_tensors(fake, ignore, ["Linear"])}
    ours = {n for n, sh, _ in specs if R.is_quantized(n, sh, ignore)}
    assert ours == ct


def test_gate_up_sharing_measured(ckpts):
    root, src = ckpts["root"], _tensors(ckpts["src"])
    assert _split_pairs(ckpts["src"])  # some pairs were split across shards
    sh, un = Q.gate_up_scales(root / "shared"), Q.gate_up_scales(root / "unshared")
    assert len(sh) == len(un) == N_ROUTED // 3
    assert bool(sh["equal"].all())
    assert not bool(un["equal"].all())
    assert ckpts["unshared"]["gate_up"]["equal"] == int(un["equal"].sum())
    # independent: compressed-tensors' global scale is 448 * 6 / absmax (helpers.py generate_gparam)
    # with absmax a bf16 tensor; PyTorch evaluates python-float / bf16-tensor in bf16 as
    # 2688 x reciprocal (two roundings), hence the plain float 2688.0 here, not a bf16 2688.
    # Unshared = per tensor; shared = from the pair's larger absmax.
    for r_sh, r_un in zip(sh.itertuples(), un.itertuples(), strict=True):
        p = f"model.layers.{r_un.layer}.mlp.experts.{r_un.expert}."
        ag, au = (src[p + f"{x}_proj.weight"].abs().max() for x in ("gate", "up"))
        assert r_un.gate == float(2688.0 / ag)
        assert r_un.up == float(2688.0 / au)
        assert r_sh.gate == r_sh.up == min(r_un.gate, r_un.up)


def test_fused_tables_restored():
    from llmcompressor.entrypoints.model_free import microscale as ms

    d, lst = dict(ms.DEFAULT_FUSED_MAPPINGS), [list(x) for x in ms._DEFAULT_FUSED_MAPPINGS_LIST]
    with pytest.raises(RuntimeError):
        with P.fused_tables("gate-up"):
            assert list(ms.DEFAULT_FUSED_MAPPINGS) == [P.GATE_UP_PRIMARY]
            assert ms._DEFAULT_FUSED_MAPPINGS_LIST == [P.GATE_UP_SET]
            raise RuntimeError
    assert ms.DEFAULT_FUSED_MAPPINGS == d and ms._DEFAULT_FUSED_MAPPINGS_LIST == lst
    with pytest.raises(ValueError):
        with P.fused_tables("bogus"):
            pass


def test_probes_measure_the_tool(ckpts, tmp_path):
    ignore = Q.card_ignore(TINY.num_hidden_layers)
    res = {}
    for mode, scheme in (("stock", "NVFP4A16"), ("list-emptied", "NVFP4A16"), ("empty", "NVFP4A16"), ("empty", "NVFP4")):
        res[(mode, scheme)] = P.ptq(str(ckpts["src"]), str(tmp_path / f"{mode}-{scheme}"), scheme=scheme,
                                    ignore=ignore, fused_maps=mode, probe=True)
    assert not res[("stock", "NVFP4A16")]["ok"]
    # which table trips first depends on the shard layout: the list's q/k/v set sees an MLA q_proj
    # followed by a KDA q_proj in one shard ("twice"), or the dict asks for the MLA's missing k/v
    err = res[("stock", "NVFP4A16")]["error"]
    assert "twice before completing set" in err or re.search(r"attention\.[kv]_proj\.weight not found", err)
    assert not res[("list-emptied", "NVFP4A16")]["ok"]
    assert "not found in weight map" in res[("list-emptied", "NVFP4A16")]["error"]
    assert res[("empty", "NVFP4A16")]["ok"]
    assert "cannot calibrate activations" in res[("empty", "NVFP4")]["error"]
    # a probe stops before quantizing: no shard was written
    assert not list((tmp_path / "empty-NVFP4A16").glob("*.safetensors"))


def test_subprocess_interpreter_gives_the_same_bytes(ckpts, tmp_path):
    rep = Q.quantize_checkpoint(ckpts["src"], tmp_path / "sub", QuantizeParams(python=sys.executable))
    assert rep["python"] == sys.executable
    a, b = _tensors(ckpts["root"] / "shared"), _tensors(tmp_path / "sub")
    assert set(a) == set(b) and all(torch.equal(a[k].view(torch.uint8) if a[k].dtype == torch.float8_e4m3fn else a[k],
                                                b[k].view(torch.uint8) if b[k].dtype == torch.float8_e4m3fn else b[k])
                                    for k in a)


def test_no_rewrite_gives_plain_w4a16(ckpts, tmp_path):
    rep = Q.quantize_checkpoint(ckpts["src"], tmp_path / "plain", QuantizeParams(serving_rewrite=False))
    assert rep["counts"]["input_global_scale"] == 0
    qc = json.loads((tmp_path / "plain" / "config.json").read_text())["quantization_config"]
    assert next(iter(qc["config_groups"].values()))["input_activations"] is None


# --- bad input: named errors, nothing left behind ----------------------------------------------
def _only(path, names):
    return sorted(p.name for p in path.iterdir()) == sorted(names)


def test_output_exists(ckpts, tmp_path):
    (tmp_path / "dst").mkdir()
    with pytest.raises(OutputExists, match="dst"):
        Q.quantize_checkpoint(ckpts["src"], tmp_path / "dst", QuantizeParams())
    assert _only(tmp_path, ["dst"]) and not list((tmp_path / "dst").iterdir())
    with pytest.raises(OutputExists, match="inside the source"):
        Q.quantize_checkpoint(ckpts["src"], ckpts["src"] / "sub", QuantizeParams())
    assert tree_digest(ckpts["src"]) == ckpts["before"]


def test_source_missing_or_broken(ckpts, tmp_path):
    with pytest.raises(SourceCheckpointMissing, match="not found"):
        Q.quantize_checkpoint(tmp_path / "nope", tmp_path / "o1", QuantizeParams())
    broken = tmp_path / "broken"
    shutil.copytree(ckpts["src"], broken)
    (broken / "config.json").unlink()
    with pytest.raises(SourceCheckpointMissing, match="config.json"):
        Q.quantize_checkpoint(broken, tmp_path / "o2", QuantizeParams())
    shutil.copy(ckpts["src"] / "config.json", broken / "config.json")
    sorted(broken.glob("*.safetensors"))[-1].unlink()
    with pytest.raises(SourceCheckpointMissing, match="missing shard"):
        Q.quantize_checkpoint(broken, tmp_path / "o3", QuantizeParams())
    assert _only(tmp_path, ["broken"])


def test_already_quantized_source(ckpts, tmp_path):
    with pytest.raises(QuantizeFailed, match="already has a quantization_config"):
        Q.quantize_checkpoint(ckpts["root"] / "shared", tmp_path / "again", QuantizeParams())
    assert not list(tmp_path.iterdir())


def test_tool_failure_is_named_and_leaves_nothing(ckpts, tmp_path):
    # without the attention pattern, the 3-D *_conv1d weights are targets and model_free_ptq refuses
    ignore = [p for p in Q.card_ignore(TINY.num_hidden_layers) if "attention" not in p]
    with pytest.raises(QuantizeFailed, match="expected 2D linear weight"):
        Q.quantize_checkpoint(ckpts["src"], tmp_path / "fail", QuantizeParams(), ignore=ignore)
    assert not list(tmp_path.iterdir())


def test_overwrite_replaces_only_at_the_end(ckpts, tmp_path):
    dst = tmp_path / "ow"
    dst.mkdir()
    (dst / "old").write_text("x")
    ignore = [p for p in Q.card_ignore(TINY.num_hidden_layers) if "attention" not in p]
    with pytest.raises(QuantizeFailed):
        Q.quantize_checkpoint(ckpts["src"], dst, QuantizeParams(), ignore=ignore, overwrite=True)
    assert _only(dst, ["old"]) and _only(tmp_path, ["ow"])  # the failed run kept the old output
    Q.quantize_checkpoint(ckpts["src"], dst, QuantizeParams(), overwrite=True)
    assert not (dst / "old").exists() and (dst / "config.json").exists() and _only(tmp_path, ["ow"])


def test_cli(ckpts, tmp_path, capsys):
    assert Q.main([str(ckpts["src"]), str(tmp_path / "cli"), "--no-share-gate-up", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["fused_maps"] == "empty" and rep["counts"]["expert_weight_packed"] == N_ROUTED


def test_index_naming_a_missing_tensor_or_truncated_shard(ckpts, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(ckpts["src"], bad)
    idx = json.loads((bad / "model.safetensors.index.json").read_text())
    first = sorted(bad.glob("*.safetensors"))[0].name
    idx["weight_map"]["model.layers.1.mlp.experts.0.gate_proj.bogus"] = first
    (bad / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(QuantizeFailed, match="bogus"):
        Q.quantize_checkpoint(bad, tmp_path / "o1", QuantizeParams())
    shutil.rmtree(bad)
    shutil.copytree(ckpts["src"], bad)
    shard = sorted(bad.glob("*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(QuantizeFailed, match="model_free_ptq"):
        Q.quantize_checkpoint(bad, tmp_path / "o2", QuantizeParams())
    assert _only(tmp_path, ["bad"])


def test_overwrite_refuses_an_output_that_contains_the_source(ckpts, tmp_path):
    outer = tmp_path / "outer"
    src = shutil.copytree(ckpts["src"], outer / "src")
    before = tree_digest(src)
    with pytest.raises(OutputExists, match="source .* is inside the output"):
        Q.quantize_checkpoint(src, outer, QuantizeParams(), overwrite=True)
    assert tree_digest(src) == before and _only(tmp_path, ["outer"]) and _only(outer, ["src"])


def test_progress_bars_become_widgets_only_inside_a_kernel(monkeypatch):
    """compressed-tensors' exec_jobs reads the module-level ``tqdm`` at call time: inside a kernel
    it is pointed at tqdm.auto for the call and restored after; elsewhere nothing changes."""
    import importlib

    import tqdm
    import tqdm.auto

    # the module, not the function of the same name that the package re-exports
    cc = importlib.import_module("compressed_tensors.entrypoints.convert.convert_checkpoint")

    assert cc.tqdm is tqdm
    with P.notebook_progress([cc.exec_jobs]):
        assert cc.tqdm is tqdm  # pytest is no kernel
    monkeypatch.setattr(P, "_in_kernel", lambda: True)
    with P.notebook_progress([cc.exec_jobs, None]):
        assert cc.tqdm.tqdm is tqdm.auto.tqdm
    assert cc.tqdm is tqdm
