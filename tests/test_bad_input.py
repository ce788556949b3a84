"""Wrong types and ranges inside otherwise valid JSON: a named error, never a traceback.

Each case was a Python traceback before the boundary checks of ``checkpoint/validate.py``
(TypeError, OverflowError, RecursionError, KeyError, JSONDecodeError, ...). The exit-status
tests check that a named error (2) and an internal error (3) stay apart from an error finding (1).
"""

from __future__ import annotations

import errno
import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ling_fixtures import TINY
from nvfp4study.checkpoint import generate as G
from nvfp4study.checkpoint import quantize as Q
from nvfp4study.checkpoint import validate as V
from nvfp4study.checkpoint.audit import audit_checkpoint
from nvfp4study.cli import main as cli_main
from nvfp4study.core.errors import (
    CheckpointConfigError,
    ConfigFieldInvalid,
    HeaderJSONInvalid,
    HeaderTooDeep,
    HeaderTooLarge,
    IndexInvalid,
    OutputNotWritable,
    StudyError,
)
from nvfp4study.core.params import QuantizeParams
from test_checkpoint_audit import _rewrite_header, build, shard


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad") / "c"
    build(root, shards=2)
    return root


@pytest.fixture
def ck(pristine, tmp_path):
    import shutil

    return Path(shutil.copytree(pristine, tmp_path / "c"))


def _raw_header(p: Path, blob: bytes) -> None:
    """Replace a shard's header by ``blob`` (padded), keeping its data section."""
    data = p.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    blob += b" " * (-len(blob) % 8)
    p.write_bytes(struct.pack("<Q", len(blob)) + blob + data[8 + n:])


NAME = "model.word_embeddings.weight"


@pytest.mark.parametrize("edit", [
    {"dtype": ["BF16"]},                     # a list: unhashable in the dtype table (TypeError)
    {"dtype": None},
    {"shape": 4096},                         # an int: not iterable (TypeError)
    {"shape": [64, "128"]},
    {"shape": [64, True]},
    {"data_offsets": [0, 2**64]},            # >= 2^64: OverflowError in the overlap check
    {"data_offsets": [2**64, 2**64 + 16384]},
    {"data_offsets": "ab"},                  # unpacks into two strings
    {"data_offsets": [0, 1, 2]},
    {"data_offsets": [-16384, 0]},
])
def test_header_entry_of_the_wrong_type_is_named(ck, edit):
    p = shard(ck)
    _rewrite_header(p, lambda h: h[NAME].update(edit))
    with pytest.raises(HeaderJSONInvalid) as ei:
        audit_checkpoint(ck)
    assert str(p) in str(ei.value) and NAME in str(ei.value)


@pytest.mark.parametrize("edit", [lambda h: h.update({NAME: [1, 2]}), lambda h: h.update({NAME: "x"}),
                                  lambda h: h.update({"__metadata__": {"format": 5}}),
                                  lambda h: h.update({"__metadata__": [1]})])
def test_header_entry_not_an_object_or_bad_metadata(ck, edit):
    _rewrite_header(shard(ck), edit)
    with pytest.raises(HeaderJSONInvalid):
        audit_checkpoint(ck)


def test_header_nested_200k_deep_is_refused_fast(ck):
    p = shard(ck)
    _raw_header(p, b'{"a":' + b"[" * 200_000 + b"]" * 200_000 + b"}")
    t0 = time.perf_counter()
    with pytest.raises(HeaderTooDeep, match="200001 deep"):
        audit_checkpoint(ck)
    assert time.perf_counter() - t0 < 2.0


def test_brackets_inside_strings_do_not_count():
    assert V.json_depth(b'{"a[[[[": "]]]{{{\\"[[["}') == 1
    assert V.json_depth(b'{"a": [[1], {"b": []}]}') == 4
    assert V.json_depth(b"") == 0


def test_header_over_the_size_limit(ck, monkeypatch):
    import nvfp4study.checkpoint.header as H

    monkeypatch.setattr(H, "MAX_HEADER_BYTES", 64)  # the real limit is 100 MB; same branch
    with pytest.raises(HeaderTooLarge, match="over the 64-byte limit"):
        audit_checkpoint(ck)
    with pytest.raises(HeaderTooLarge):
        V.parse_header_bytes("x", b" " * (V.MAX_HEADER_BYTES + 1))


@pytest.mark.parametrize("index", [
    {"weight_map": {NAME: 5}},                          # an int: sorted(set(...)) TypeError before
    {"weight_map": {NAME: ["a"]}},
    {"weight_map": {NAME: "../elsewhere.safetensors"}},  # outside the folder
    {"weight_map": []},
    {"weight_map": {}, "metadata": 3},
    [1, 2],
])
def test_index_field_of_the_wrong_type(ck, index):
    idx = ck / "model.safetensors.index.json"
    idx.write_text(json.dumps(index))
    with pytest.raises(IndexInvalid) as ei:
        audit_checkpoint(ck)
    assert str(idx) in str(ei.value)
    idx.write_text("[" * 100_000)
    with pytest.raises(IndexInvalid, match="deep"):
        audit_checkpoint(ck)


CONFIG_EDITS = [
    ("quantization_config.ignore", lambda c: c["quantization_config"].update(ignore=5)),
    ("quantization_config.ignore", lambda c: c["quantization_config"].update(ignore="lm_head")),
    ("quantization_config.config_groups", lambda c: c["quantization_config"].update(config_groups=[1, 2])),
    ("config_groups.NVFP4A16", lambda c: c["quantization_config"]["config_groups"].update(NVFP4A16=7)),
    ("targets", lambda c: c["quantization_config"]["config_groups"]["NVFP4A16"].update(targets="Linear")),
    ("weights.num_bits", lambda c: c["quantization_config"]["config_groups"]["NVFP4A16"]["weights"].update(num_bits="4")),
    ("input_activations", lambda c: c["quantization_config"]["config_groups"]["NVFP4A16"].update(input_activations=[1])),
    ("quant_method", lambda c: c["quantization_config"].update(quant_method=["compressed-tensors"])),
    ("num_nextn_predict_layers", lambda c: c.update(num_nextn_predict_layers="one")),
    ("hidden_size", lambda c: c.update(hidden_size="256")),
    ("num_experts", lambda c: c.update(num_experts=True)),
    ("num_hidden_layers", lambda c: c.update(num_hidden_layers=-1)),
    ("n_group", lambda c: c.update(n_group=2.5)),
    ("expert_swiglu_limit_list", lambda c: c.update(expert_swiglu_limit_list="0044")),  # was counted by its length
    ("share_expert_swiglu_limit_list", lambda c: c.update(share_expert_swiglu_limit_list=[0, "5", 5, 7])),
    ("moe_intermediate_size", lambda c: c.update(moe_intermediate_size={"a": 1})),
]


@pytest.mark.parametrize("field,edit", CONFIG_EDITS, ids=[f for f, _ in CONFIG_EDITS])
def test_config_field_of_the_wrong_type(ck, field, edit):
    path = ck / "config.json"
    cfg = json.loads(path.read_text())
    edit(cfg)
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigFieldInvalid) as ei:
        audit_checkpoint(ck)
    assert field in str(ei.value) and str(path) in str(ei.value)


def test_config_too_deep(ck):
    (ck / "config.json").write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(CheckpointConfigError, match="deep"):
        audit_checkpoint(ck)


# --- quantize: bad source / destination ------------------------------------------------------------
@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return G.write_checkpoint(TINY, tmp_path_factory.mktemp("qsrc") / "src", shards=2, seed=1)


@pytest.fixture
def src(source, tmp_path):
    import shutil

    return Path(shutil.copytree(source, tmp_path / "src"))


def _edit_config(src: Path, edit) -> None:
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps(edit(cfg)))


@pytest.mark.parametrize("edit,err", [
    (lambda c: {k: v for k, v in c.items() if k != "num_hidden_layers"}, ConfigFieldInvalid),  # KeyError before
    (lambda c: [c], CheckpointConfigError),                                                     # TypeError before
    (lambda c: c | {"num_hidden_layers": "3"}, ConfigFieldInvalid),
])
def test_quantize_bad_source_config(src, tmp_path, edit, err):
    _edit_config(src, edit)
    with pytest.raises(err):
        Q.quantize_checkpoint(src, tmp_path / "out", QuantizeParams())
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))


def test_quantize_invalid_index(src, tmp_path):
    (src / "model.safetensors.index.json").write_text("{not json")  # JSONDecodeError before
    with pytest.raises(IndexInvalid):
        Q.quantize_checkpoint(src, tmp_path / "out", QuantizeParams())
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": 1}}))
    with pytest.raises(IndexInvalid):
        Q.quantize_checkpoint(src, tmp_path / "out", QuantizeParams())


def test_quantize_unwritable_destination(src, tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(OutputNotWritable, match="nothing was written"):  # the parent is a file
        Q.quantize_checkpoint(src, tmp_path / "afile" / "out", QuantizeParams())

    real_mkdir = Q.os.mkdir

    def read_only(path, *a, **k):  # the tests run as root, for whom chmod does not make a folder read-only
        if ".tmp-" in str(path):
            raise OSError(errno.EROFS, "Read-only file system")
        return real_mkdir(path, *a, **k)

    monkeypatch.setattr(Q.os, "mkdir", read_only)
    with pytest.raises(OutputNotWritable, match="Read-only"):
        Q.quantize_checkpoint(src, tmp_path / "out", QuantizeParams())
    assert not list(tmp_path.glob(".out.tmp-*")) and not (tmp_path / "out").exists()


def test_quantize_never_removes_a_temporary_name_it_did_not_make(src, tmp_path, monkeypatch):
    """The temporary folder is made by name inside the cleanup's ``try`` (so a SIGTERM right after
    it appears removes it); a folder of that name that was already there is someone else's."""
    monkeypatch.setattr(Q.secrets, "token_hex", lambda n: "f" * (2 * n))
    theirs = tmp_path / f".out.tmp-{'f' * 12}"
    theirs.mkdir()
    (theirs / "replaced").mkdir()
    with pytest.raises(OutputNotWritable, match="nothing was written"):
        Q.quantize_checkpoint(src, tmp_path / "out", QuantizeParams())
    assert (theirs / "replaced").is_dir() and not (tmp_path / "out").exists()


# --- exit statuses ---------------------------------------------------------------------------------
def test_exit_statuses_keep_crashes_apart_from_findings(ck, capsys, monkeypatch):
    assert cli_main(["audit-checkpoint", str(ck)]) == 0
    cfg = json.loads((ck / "config.json").read_text())
    cfg["quantization_config"]["config_groups"]["NVFP4A16"]["input_activations"] = None  # W4A16 + input scales
    cfg["num_nextn_predict_layers"] = 2  # MTP layer 5 missing: an error finding
    (ck / "config.json").write_text(json.dumps(cfg))
    assert cli_main(["audit-checkpoint", str(ck)]) == 1
    cfg["hidden_size"] = "256"
    (ck / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    assert cli_main(["audit-checkpoint", str(ck)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ConfigFieldInvalid" in err[0] and "hidden_size" in err[0]

    import nvfp4study.checkpoint.audit as A

    def bug(*a, **k):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(A, "audit_checkpoint", bug)
    monkeypatch.delenv("NVFP4STUDY_DEBUG", raising=False)
    assert cli_main(["audit-checkpoint", str(ck)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "internal error ZeroDivisionError" in err[0] and "please report" in err[0]
    monkeypatch.setenv("NVFP4STUDY_DEBUG", "1")
    assert cli_main(["audit-checkpoint", str(ck)]) == 3
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_named_errors_are_study_errors():
    for cls in (HeaderTooDeep, HeaderTooLarge, IndexInvalid, ConfigFieldInvalid, OutputNotWritable):
        assert issubclass(cls, StudyError)


def test_cli_subprocess_internal_error_has_no_traceback(tmp_path):
    # an unexpected exception in a real process: status 3, one line, no traceback
    code = ("import sys; import nvfp4study.checkpoint.audit as A\n"
            "A.main = lambda argv: 1 // 0\n"
            "from nvfp4study.cli import main; sys.exit(main(['audit-checkpoint', 'x']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


# --- every number SGLang's config class reads: finite, and integral where it sizes tensors ---------
def _sglang_config_numbers() -> tuple[set[str], set[str]]:
    """(integer fields, float fields) of ``BailingHybridConfig.__init__`` in SGLang 0.5.23's released
    source, read from its keyword defaults (an int default: an integer field; a float default: a
    real-valued one): an independent list against which the study's checks are compared."""
    import ast

    from sglang_fixtures import released

    src = released("0.5.23").file("sglang/srt/configs/bailing_hybrid.py").read_text()
    cls = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ClassDef) and n.name == "BailingHybridConfig")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    args = init.args.args[-len(init.args.defaults):]
    ints, floats = set(), set()
    for a, d in zip(args, init.args.defaults, strict=True):
        if isinstance(d, ast.Constant) and type(d.value) is int:
            ints.add(a.arg)
        elif isinstance(d, ast.Constant) and type(d.value) is float:
            floats.add(a.arg)
    return ints, floats


def test_every_number_of_sglangs_config_class_is_checked():
    from nvfp4study.checkpoint import validate as V

    ints, floats = _sglang_config_numbers()
    assert {"vocab_size", "hidden_size", "num_experts", "eos_token_id", "layer_group_size"} <= ints  # the reading works
    checked_ints = set(V.CONFIG_INTS) | set(V.SGLANG_CONFIG_INTS) | set(V.CONFIG_TOKEN_IDS)
    assert ints - checked_ints - set(V.CONFIG_FLOATS) == set()  # mtp_loss_scaling_factor=0 is a real number
    assert floats - set(V.CONFIG_FLOATS) == set()


@pytest.mark.parametrize("raw", ["NaN", "1e400", "-Infinity"])
@pytest.mark.parametrize("field", ["num_experts", "hidden_size", "vocab_size", "num_attention_heads",
                                   "eos_token_id", "rms_norm_eps", "rope_theta", "routed_scaling_factor"])
def test_a_non_finite_config_number_is_a_named_error(ck, capsys, field, raw):
    path = ck / "config.json"
    cfg = json.loads(path.read_text())
    cfg[field] = "@@"
    path.write_text(json.dumps(cfg).replace('"@@"', raw))  # JSON text as a damaged file has it
    capsys.readouterr()
    assert cli_main(["audit-checkpoint", str(ck)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ConfigFieldInvalid" in err[0] and field in err[0], err


@pytest.mark.parametrize("field", ["num_attention_heads", "kv_lora_rank", "head_dim", "pad_token_id"])
def test_a_fractional_integer_field_is_a_named_error(ck, field):
    path = ck / "config.json"
    cfg = json.loads(path.read_text()) | {field: 4.5}
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigFieldInvalid, match=field):
        audit_checkpoint(ck)


def test_a_token_id_outside_the_vocabulary_is_a_named_error(ck):
    path = ck / "config.json"
    cfg = json.loads(path.read_text())
    path.write_text(json.dumps(cfg | {"vocab_size": 512, "eos_token_id": [1, 511]}))
    audit_checkpoint(ck)  # the last id of the vocabulary is inside it
    path.write_text(json.dumps(cfg | {"vocab_size": 512, "eos_token_id": [1, 512]}))
    with pytest.raises(ConfigFieldInvalid, match="outside the vocabulary"):
        audit_checkpoint(ck)
