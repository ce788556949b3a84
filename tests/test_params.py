from pathlib import Path

import pytest

from nvfp4study.core.errors import ParamsError
from nvfp4study.core.params import PARAMS_DIR, load_params


@pytest.mark.parametrize("name", sorted(p.name for p in PARAMS_DIR.glob("*.yaml")))
def test_every_profile_validates(name):
    p = load_params(PARAMS_DIR / name)
    assert p.profile == Path(name).stem


def test_default_is_cpu_without_server():
    p = load_params()
    assert p.server.enabled is False and p.quantize.device == "cpu"
    assert p.checkpoint.source == "generate"


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
