"""The params digest covers only what changes results: each operational key may change when a
run is continued, each result key is refused with its name and both values."""

from __future__ import annotations

import json

import pytest

from nvfp4study.core import runner
from nvfp4study.core.errors import ResultParamsChanged
from nvfp4study.core.params import REPO_ROOT, load_params
from nvfp4study.core.params_keys import OPERATIONAL_KEYS, flat_keys, is_operational, result_changes

LING = REPO_ROOT / "params" / "ling3-flash.yaml"
# one changed value per operational key (ling3-flash.yaml's values differ from each)
CHANGED = {
    "description": "description=another machine",
    "execution_timeout_s": "execution_timeout_s=43200",
    "quantize.python": "quantize.python=/elsewhere/bin/python",
    "quantize.max_workers": "quantize.max_workers=16",
    "quantize.assumed_mb_per_s": "quantize.assumed_mb_per_s=600",
    "server.python": "server.python=/elsewhere/sglang/bin/python",
    "server.host": "server.host=0.0.0.0",
    "server.port": "server.port=30099",
    "server.launcher": "server.launcher=docker",
    "server.docker.gpus": "server.docker.gpus=device=0",
    "server.docker.container_name_prefix": "server.docker.container_name_prefix=mine",
    "server.env": "server.env={TZ: UTC, HF_HOME: /data/hf}",
    "server.startup_timeout_s": "server.startup_timeout_s=3600",
    "server.request_timeout_s": "server.request_timeout_s=1200",
    "server.shutdown_grace_s": "server.shutdown_grace_s=60",
    "server.health_poll_s": "server.health_poll_s=5",
    "server.parallel_loads": "server.parallel_loads=2",
    "server.cpu.fork_server": "server.cpu.fork_server=false",
    "corruption.max_workers": "corruption.max_workers=8",
    "corruption.concurrency": "corruption.concurrency=4",
}
RESULT = {  # result keys, and the text the refusal must carry
    "mtp.prompts=3": "mtp.prompts: 10 -> 3",
    "server.mem_fraction_static=0.8": "server.mem_fraction_static: 0.75 -> 0.8",
    "server.docker.image=lmsysorg/sglang:v0.5.23": "server.docker.image: None -> 'lmsysorg/sglang:v0.5.23'",
    "corruption.sandbox.timeout_s=20": "corruption.sandbox.timeout_s: 10.0 -> 20.0",
    "server.clamp_mode=none": "server.clamp_mode: 'exact' -> 'none'",
}


def test_every_operational_key_has_a_test():
    assert set(CHANGED) == set(OPERATIONAL_KEYS)


def _manifest(tmp_path, params):
    (tmp_path / "manifest.json").write_text(json.dumps({"params": params.model_dump(mode="json"),
                                                        "params_hash": params.digest()}))
    return tmp_path


@pytest.mark.parametrize("key", sorted(CHANGED))
def test_operational_key_continues_a_run(key, tmp_path):
    base = load_params(LING, overlay=False)
    new = load_params(LING, [CHANGED[key]], overlay=False)
    differing = [k for k, v in flat_keys(new.model_dump(mode="json")).items()
                 if flat_keys(base.model_dump(mode="json")).get(k) != v]
    assert differing and all(k == key or k.startswith(key + ".") for k in differing)  # the override took
    assert new.digest() == base.digest()
    assert result_changes(base.model_dump(mode="json"), new) == []
    assert runner._previous_manifest(_manifest(tmp_path, base), new)["params_hash"] == base.digest()


@pytest.mark.parametrize("override", sorted(RESULT))
def test_result_key_is_refused_by_name(override, tmp_path):
    base = load_params(LING, overlay=False)
    new = load_params(LING, [override], overlay=False)
    assert new.digest() != base.digest()
    assert result_changes(base.model_dump(mode="json"), new) == [RESULT[override]]
    with pytest.raises(ResultParamsChanged) as err:
        runner._previous_manifest(_manifest(tmp_path, base), new)
    assert RESULT[override] in str(err.value) and "server.request_timeout_s" in str(err.value)


def test_prefix_rules_and_a_hash_only_manifest(tmp_path):
    assert is_operational("server.env.TZ") and is_operational("server.docker.gpus")
    assert not is_operational("server.docker.image") and not is_operational("server.environment")
    assert not is_operational("corruption.sandbox.timeout_s")
    base = load_params(LING, overlay=False)
    (tmp_path / "manifest.json").write_text(json.dumps({"params_hash": "0" * 16}))
    with pytest.raises(ResultParamsChanged, match="params hash: 0000000000000000 -> " + base.digest()):
        runner._previous_manifest(tmp_path, base)
    (tmp_path / "manifest.json").write_text(json.dumps({"params_hash": base.digest()}))
    assert runner._previous_manifest(tmp_path, base)


def test_a_key_on_one_side_only_is_a_change(tmp_path):
    """Issue 37, the resume rule from both sides: a result key the recorded params lack (a run
    folder of an older release of the study) or have and the new params lack is a change, named
    with ``(absent)``; an operational key on one side only is not."""
    base = load_params(LING, overlay=False)
    recorded = base.model_dump(mode="json")
    del recorded["mtp"]["prompts"]
    assert result_changes(recorded, base) == ["mtp.prompts: (absent) -> 10"]
    recorded = base.model_dump(mode="json")
    recorded["mtp"]["retired_knob"] = 1
    assert result_changes(recorded, base) == ["mtp.retired_knob: 1 -> (absent)"]
    (tmp_path / "manifest.json").write_text(json.dumps({"params": recorded, "params_hash": base.digest()}))
    with pytest.raises(ResultParamsChanged, match=r"mtp\.retired_knob: 1 -> \(absent\)"):
        runner._previous_manifest(tmp_path, base)
    recorded = base.model_dump(mode="json")
    del recorded["server"]["port"]
    recorded["server"]["env"] = {"ONLY_HERE": "1"}
    assert result_changes(recorded, base) == []


def test_refusal_message_in_full(tmp_path):
    """The runner's refusal names every changed key, '; '-separated, and lists the operational keys
    ', '-separated, as written out here."""
    base = load_params(LING, overlay=False)
    new = load_params(LING, ["mtp.prompts=3", "server.clamp_mode=none"], overlay=False)
    with pytest.raises(ResultParamsChanged) as err:
        runner._previous_manifest(_manifest(tmp_path, base), new)
    assert str(err.value) == (
        f"{tmp_path} was run with other params: mtp.prompts: 10 -> 3; server.clamp_mode: 'exact' -> 'none'. Only "
        "operational keys (description, execution_timeout_s, quantize.python, quantize.max_workers, "
        "quantize.assumed_mb_per_s, server.python, server.host, server.port, server.launcher, server.docker.gpus, "
        "server.docker.container_name_prefix, server.env, server.startup_timeout_s, server.request_timeout_s, "
        "server.shutdown_grace_s, server.health_poll_s, server.parallel_loads, server.cpu.fork_server, corruption.max_workers, "
        "corruption.concurrency) may change when a run is continued: continue it with the same result params, or "
        "use a new run folder")
