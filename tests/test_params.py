from pathlib import Path

import pytest

from nvfp4study.core.errors import ParamsError
from nvfp4study.core.params import PARAMS_DIR, load_params


@pytest.mark.parametrize("name", sorted(p.name for p in PARAMS_DIR.glob("*.yaml")))
def test_every_profile_validates(name):
    p = load_params(PARAMS_DIR / name)
    assert p.profile == Path(name).stem


def test_default_is_cpu_with_the_cpu_engine():
    p = load_params()
    assert p.server.enabled is True and p.server.engine == "cpu" and p.server.require_gpu is False
    assert p.server.python == ".venv-sglang/bin/python"  # relative to the repo root, never absolute
    assert p.quantize.device == "cpu" and p.checkpoint.source == "generate"


def test_unknown_key_names_key_file_and_suggestion(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("profile: x\nquantize:\n  devise: cpu\n")
    with pytest.raises(ParamsError) as e:
        load_params(f)
    msg = str(e.value)
    assert "quantize.devise" in msg and str(f) in msg and "did you mean 'device'" in msg


def test_unknown_top_level_key(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("profile: x\ncheckpont: {}\n")
    with pytest.raises(ParamsError, match="unknown key 'checkpont'.*did you mean 'checkpoint'"):
        load_params(f)


def test_wrong_type(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("profile: x\nmtp:\n  prompts: many\n")
    with pytest.raises(ParamsError, match="mtp.prompts"):
        load_params(f)


def test_missing_file():
    with pytest.raises(ParamsError, match="not found"):
        load_params("/nonexistent/params.yaml")


def test_invalid_yaml(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("profile: [unclosed\n")
    with pytest.raises(ParamsError, match="cannot read"):
        load_params(f)


def test_overrides_parse_yaml_values():
    p = load_params(None, ["mtp.depths=[0, 2]", "quantize.device=cuda", "server.enabled=true"])
    assert p.mtp.depths == [0, 2] and p.quantize.device == "cuda" and p.server.enabled is True


def test_override_unknown_key_is_an_error():
    with pytest.raises(ParamsError, match=r"^-p mtp.depht: unknown key 'mtp.depht' \(did you mean 'depths'"):
        load_params(None, ["mtp.depht=3"])


def test_override_without_equals():
    with pytest.raises(ParamsError, match="key=value"):
        load_params(None, ["mtp.depths"])


def test_digest_changes_with_params():
    assert load_params().digest() != load_params(None, ["mtp.prompts=3"]).digest()
    assert load_params().digest() == load_params().digest()


# --- hostile params (issue 14, item 2) ---------------------------------------------
@pytest.mark.parametrize("override,key", [
    ("corruption.sandbox.timeout_s=-1", "corruption.sandbox.timeout_s"),
    ("corruption.sandbox.timeout_s=.inf", "corruption.sandbox.timeout_s"),
    ("corruption.sandbox.tmp_size_mb=0", "corruption.sandbox.tmp_size_mb"),
    ("checkpoint.shards=0", "checkpoint.shards"),
    ("checkpoint.seed=-1", "checkpoint.seed"),
    ("mtp.depths=[-1]", "mtp.depths.0"),
    ("mtp.depths=[1.5]", "mtp.depths.0"),
    ("corruption.humaneval_count=-5", "corruption.humaneval_count"),
    ("corruption.humaneval_count=165", "corruption.humaneval_count"),
    ("server.port=99999", "server.port"),
    ("server.port=-1", "server.port"),
    ("server.mem_fraction_static=1.5", "server.mem_fraction_static"),
    ("checkpoint.shape.num_experts=true", "checkpoint.shape.num_experts"),
    ("checkpoint.shape.hidden_size=2.0", "checkpoint.shape.hidden_size"),
    ("checkpoint.shape.num_experts_per_tok=99", "checkpoint.shape"),
    ("checkpoint.shape.expert_swiglu_limits={3: -1.0}", "checkpoint.shape.expert_swiglu_limits"),
    ("server.enabled=1", "server.enabled"),
    ("server.startup_timeout_s=false", "server.startup_timeout_s"),
    ("determinism.repeats=0", "determinism.repeats"),
    ("execution_timeout_s=0", "execution_timeout_s"),
    ("corruption.sampling=[{name: a, temperature: 0, top_k: 0}]", "corruption.sampling.0"),
    ("corruption.sampling=[{name: a, temperature: -0.1}]", "corruption.sampling.0.temperature"),
])
def test_out_of_range_rejected(override, key):
    with pytest.raises(ParamsError, match=f"-p {key.split('.')[0]}.*key '{key}"):
        load_params(None, [override])


def test_in_range_edges_accepted():
    p = load_params(None, ["corruption.humaneval_count=0", "server.port=65535", "mtp.depths=[0]",
                           "server.chunked_prefill_size=-1", "corruption.sandbox.timeout_s=1"])
    assert (p.corruption.humaneval_count, p.server.port, p.mtp.depths) == (0, 65535, [0])
    assert p.corruption.sandbox.timeout_s == 1.0  # an int is a valid float


def test_run_params_round_trip(tmp_path):
    """A run's params.yaml (YAML dump: clamp-list keys become strings) loads again."""
    from nvfp4study.core.params import dump_params

    p = load_params()
    dump_params(p, tmp_path / "params.yaml")
    assert load_params(tmp_path / "params.yaml") == p


def test_override_value_not_yaml():
    with pytest.raises(ParamsError, match=r"-p checkpoint.shards: the value '\[' is not valid YAML"):
        load_params(None, ["checkpoint.shards=["])
    with pytest.raises(ParamsError, match="empty part"):
        load_params(None, ["checkpoint..shards=1"])


def test_non_utf8_file(tmp_path):
    f = tmp_path / "latin1.yaml"
    f.write_bytes(b"profile: x\ndescription: caf\xe9\n")
    with pytest.raises(ParamsError, match=rf"{f}: line 2: not UTF-8 .*0xe9"):
        load_params(f)


def test_duplicate_keys_rejected(tmp_path):
    f = tmp_path / "dup.yaml"
    f.write_text("profile: x\ncheckpoint:\n  shards: 2\n  seed: 1\n  shards: 3\n")
    with pytest.raises(ParamsError, match=rf"{f}: .*line 5.*duplicate key 'shards' \(first on line 3\)"):
        load_params(f)
    f.write_text("profile: x\nprofile: y\n")
    with pytest.raises(ParamsError, match="duplicate key 'profile'"):
        load_params(f)
    with pytest.raises(ParamsError, match="-p server.env.*duplicate key 'A'"):
        load_params(None, ["server.env={A: '1', A: '2'}"])
    # a YAML merge key ("<<") is not a duplicate: explicit keys override merged ones
    g = tmp_path / "merge.yaml"
    g.write_text("profile: x\ncorruption:\n  sampling:\n    - &b {name: a, temperature: 0.0}\n"
                 "    - {<<: *b, name: b}\n")
    assert [s.name for s in load_params(g).corruption.sampling] == ["a", "b"]


def test_run_refuses_bad_params_before_any_notebook(tmp_path):
    """``nvfp4study run`` with an out-of-range value: exit 2, one line, no run folder."""
    import subprocess
    import sys

    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "nvfp4study.cli", "run", "--run-dir", str(run),
                        "-p", "corruption.sandbox.timeout_s=-1"], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "corruption.sandbox.timeout_s" in r.stderr and "Traceback" not in r.stderr
    assert not run.exists()


def test_digest_by_hand():
    """SHA-256 of the JSON (sorted keys) of the flattened params without the operational keys, its
    first 16 hex digits; the same params in another key order give the same digest; an operational
    key leaves it, a result key changes it."""
    import hashlib
    import json

    from nvfp4study.core.params_keys import OPERATIONAL_KEYS

    def flat(d, prefix=""):
        out = {}
        for k, v in d.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict) and v:
                out.update(flat(v, key + "."))
            else:
                out[key] = v
        return out

    p = load_params(None, ["mtp.prompts=3"])
    data = p.model_dump(mode="json")
    kept = {k: v for k, v in flat(data).items()
            if not any(k == o or k.startswith(o + ".") for o in OPERATIONAL_KEYS)}
    assert "mtp.prompts" in kept and "server.port" not in kept
    assert p.digest() == hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]
    reordered = type(p).model_validate(dict(reversed(list(data.items()))))
    assert reordered.digest() == p.digest() and len(p.digest()) == 16
    assert load_params(None, ["mtp.prompts=3", "server.port=1234"]).digest() == p.digest()
    assert load_params(None, ["mtp.prompts=4"]).digest() != p.digest()
