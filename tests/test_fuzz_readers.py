"""Fuzz the checkpoint readers: a valid result or a named error, never anything else.

Two generators, both bounded so the file runs in well under 30 s: ``hypothesis`` builds
headers, indexes and configs field by field (valid values mixed with arbitrary JSON), and a
seeded byte mutator damages the real headers of a fixture checkpoint (flips, inserts, deletes,
truncations, the 8-byte length). A "valid result" is also checked: every tensor a header
accepts has offsets that hold exactly dtype x shape, and every config the validator accepts
runs through all the audit's config checks without an exception.
"""

from __future__ import annotations

import json
import random
import struct
import tempfile
from math import prod
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvfp4study.checkpoint import quant_rules as qr
from nvfp4study.checkpoint import validate as V
from nvfp4study.checkpoint.audit import load_config
from nvfp4study.checkpoint.check_config import (
    check_clamp_lists,
    check_config,
    check_routing_shape,
    check_shared_fusion,
)
from nvfp4study.checkpoint.check_modules import count_formulas
from nvfp4study.checkpoint.header import read_shard_header
from nvfp4study.core.errors import CheckpointFileError, StudyError
from test_checkpoint_audit import NVFP4_W, W4A4_ACT, build

FUZZ = settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow], database=None)

json_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8)
json_values = st.recursive(json_scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
                           max_leaves=12)
dims = st.integers(-2, 9) | st.integers(2**62, 2**66) | json_values
dtypes = st.sampled_from(sorted(V.DTYPE_BITS)) | json_values


@st.composite
def entries(draw):
    """A header entry: mostly the right keys with right-or-wrong values, sometimes anything."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    dtype = draw(dtypes)
    shape = draw(st.lists(dims, max_size=3) | json_values)
    if isinstance(dtype, str) and dtype in V.DTYPE_BITS and isinstance(shape, list) \
            and all(type(d) is int and 0 <= d < 2**62 for d in shape) and draw(st.booleans()):
        start = draw(st.integers(0, 2**64))
        offsets = [start, start + V.DTYPE_BITS[dtype] * prod(shape) // 8]  # consistent offsets
    else:
        offsets = draw(st.lists(st.integers(-5, 2**65), max_size=3) | json_values)
    e = {"dtype": dtype, "shape": shape, "data_offsets": offsets}
    for k in draw(st.sets(st.sampled_from(sorted(e)), max_size=1)):
        del e[k]
    return e


headers = st.dictionaries(st.text(max_size=10), entries(), max_size=5).flatmap(
    lambda h: st.just(h) | json_values.map(lambda m: {**h, "__metadata__": m}))


def _accept_valid_or_named(fn, *a):
    try:
        return fn(*a)
    except StudyError:
        return None  # a named error: allowed


@FUZZ
@given(headers)
def test_header_fields_fuzz(header):
    raw = json.dumps(header).encode()
    got = _accept_valid_or_named(
        lambda: V.header_entries("f", V.parse_header_bytes("f", raw), lambda *t: t))
    if got is None:
        return
    metadata, tensors = got
    assert all(isinstance(v, str) for v in metadata.values())
    for _name, dtype, shape, start, end in tensors.values():
        assert (end - start) * 8 == V.DTYPE_BITS[dtype] * prod(shape) and 0 <= start <= end < 2**63


@FUZZ
@given(st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_header_bytes_fuzz(raw):
    got = _accept_valid_or_named(V.parse_header_bytes, "f", raw)
    assert got is None or isinstance(got, dict)


@FUZZ
@given(st.dictionaries(st.text(max_size=8), json_values | st.text(max_size=12), max_size=4), json_values)
def test_index_fuzz(weight_map, extra):
    for index in ({"weight_map": weight_map}, {"weight_map": weight_map, "metadata": extra}, extra):
        got = _accept_valid_or_named(V.index_weight_map, "i", json.dumps(index).encode())
        if got is not None:
            assert all(isinstance(v, str) and "/" not in v for v in got[1].values())


BASE_CONFIG = {
    "num_hidden_layers": 4, "hidden_size": 128, "moe_intermediate_size": 64, "num_shared_experts": 1,
    "moe_shared_expert_intermediate_size": 64, "first_k_dense_replace": 1, "layer_group_size": 2, "num_experts": 8,
    "n_group": 4, "topk_group": 2, "num_experts_per_tok": 4, "num_nextn_predict_layers": 1,
    "max_position_embeddings": 4096, "expert_swiglu_limit_list": [0, 0, 4, 4], "share_expert_swiglu_limit_list": [0, 5, 5, 7],
    "quantization_config": {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                            "config_groups": {"g": {"targets": ["Linear"], "weights": NVFP4_W, "input_activations": W4A4_ACT}},
                            "ignore": ["lm_head", r"re:.*layers\.4\..*"]},
}
TOP_KEYS = sorted(k for k in BASE_CONFIG if k != "quantization_config")
QC_KEYS = ["quant_method", "format", "config_groups", "ignore", "quantization_status"]
ARG_KEYS = ["num_bits", "type", "strategy", "group_size", "dynamic", "observer"]
int_like = st.integers(-3, 600) | json_values


@st.composite
def configs(draw):
    """The base config with a few fields replaced (top level, quantization_config, group args)."""
    cfg = json.loads(json.dumps(BASE_CONFIG))
    for k in draw(st.lists(st.sampled_from(TOP_KEYS), max_size=3)):
        cfg[k] = draw(int_like | st.lists(st.integers(-1, 9) | json_values, max_size=5))
    qc = cfg["quantization_config"]
    for k in draw(st.lists(st.sampled_from(QC_KEYS), max_size=2)):
        qc[k] = draw(json_values | st.lists(st.text(max_size=6), max_size=3))
    g = (qc.get("config_groups") or {}).get("g") if isinstance(qc.get("config_groups"), dict) else None
    if isinstance(g, dict):
        for part in draw(st.lists(st.sampled_from(["weights", "input_activations", "targets"]), max_size=2)):
            if part == "targets" or draw(st.booleans()):
                g[part] = draw(json_values)
            elif isinstance(g.get(part), dict):
                g[part] = dict(g[part], **{draw(st.sampled_from(ARG_KEYS)): draw(json_values)})
    if draw(st.integers(0, 19)) == 0:
        return draw(json_values)
    return cfg


@FUZZ
@given(configs())
def test_config_fuzz_then_every_config_check_runs(cfg):
    with tempfile.TemporaryDirectory() as td:  # the audit's own reader (config_from_bytes + its checks)
        (Path(td) / "config.json").write_text(json.dumps(cfg))
        got = _accept_valid_or_named(load_config, td)
    if got is None:
        return
    # accepted: the audit's config-level checks must run on it without an exception
    qc = got["quantization_config"]
    findings = []
    groups = qr.parse_groups(qc)
    summary = check_config(got, groups, findings)
    check_routing_shape(got, findings)
    check_clamp_lists(got, findings)
    check_shared_fusion(got, [str(i) for i in (qc.get("ignore") or [])], findings)
    count_formulas(got)
    qr.serving_matrix(summary["scheme"], None, got.get("hidden_size"), got.get("moe_intermediate_size"))


def test_config_with_null_counts_is_read_as_absent():
    # found by the fuzz test above (about 1 run in 8): a null first_k_dense_replace, which the
    # config check allows, made the count formulas raise TypeError
    cfg = dict(BASE_CONFIG, first_k_dense_replace=None, num_nextn_predict_layers=None)
    assert count_formulas(cfg)["quantized_expert_modules"]["value"] == 3 * 8 * 4


# --- seeded byte mutation of real fixture headers ---------------------------------------------------
@pytest.fixture(scope="module")
def fixture_shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("fz") / "c"
    build(root, shards=2)
    return sorted(root.glob("*.safetensors"))


def _mutate(rng: random.Random, data: bytes, n: int) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        if op == 0:  # flip bits in the header
            i = rng.randrange(8, 8 + n)
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:  # a structural character in the header
            b[rng.randrange(8, 8 + n)] = rng.choice(b'{}[]",:0-9e ')
        elif op == 2:  # a digit run in an offset or dimension made huge
            i = rng.randrange(8, 8 + n)
            b[i:i + 1] = b"9" * rng.randint(1, 30)
        elif op == 3:  # delete a span
            i = rng.randrange(8, 8 + n)
            del b[i:i + rng.randint(1, 40)]
        elif op == 4:  # truncate the file
            del b[rng.randrange(0, len(b)):]
        else:  # the header length itself
            b[:8] = struct.pack("<Q", rng.choice([0, n - 1, n + 1, n * 2, 2**63, 2**64 - 1, rng.randrange(2**64)]))
        if len(b) < 8 + n:
            break
    return bytes(b)


def test_byte_mutation_of_real_headers(fixture_shards, tmp_path):
    rng = random.Random(20260114)
    target = tmp_path / "m.safetensors"
    outcomes = {"valid": 0, "named": 0}
    for i in range(400):
        src = fixture_shards[i % len(fixture_shards)]
        data = src.read_bytes()
        (n,) = struct.unpack("<Q", data[:8])
        target.write_bytes(_mutate(rng, data, n))
        for allow in (False, True):
            try:
                h = read_shard_header(target, allow_missing_data=allow)
            except CheckpointFileError:
                outcomes["named"] += 1
                continue
            outcomes["valid"] += 1
            size = Path(target).stat().st_size
            for t in h.tensors.values():
                assert t.nbytes * 8 == V.DTYPE_BITS[t.dtype] * t.numel
                assert allow or h.data_start + t.end <= size
    assert outcomes["named"] > 100 and outcomes["valid"] > 0  # both outcomes exercised
