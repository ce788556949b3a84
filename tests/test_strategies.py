"""Engine and launcher as strategies (serving/strategies.py, core/kinds.py): the registry has one
strategy per supported pair, params refuse the others by name, and each strategy starts the
launcher class it names."""

from __future__ import annotations

import pytest

from nvfp4study.core.errors import ParamsError
from nvfp4study.core.kinds import SUPPORTED, Engine, LauncherKind, RequestStatus, unsupported_pair
from nvfp4study.core.params import load_params
from nvfp4study.serving import launchers, strategies
from nvfp4study.serving.launch_env import server_env
from nvfp4study.serving.server import gpu_refusal

DEFAULT = "params/default.yaml"


def params(engine: str, launcher: str):
    from nvfp4study.core.params import REPO_ROOT

    return load_params(REPO_ROOT / DEFAULT, [f"server.engine={engine}", f"server.launcher={launcher}"],
                       overlay=False)


def test_the_registry_has_exactly_the_supported_pairs():
    assert set(strategies.STRATEGIES) == set(SUPPORTED)
    # the three pairs written out by hand: the CPU engine runs only locally
    assert SUPPORTED == {("gpu", "local"), ("gpu", "docker"), ("cpu", "local")}
    assert all(s.launch in launchers.LAUNCHERS for s in strategies.STRATEGIES.values())


def test_cpu_engine_in_docker_is_a_named_params_error():
    assert unsupported_pair(Engine.CPU, LauncherKind.DOCKER).startswith(
        "server.engine cpu cannot run with server.launcher docker")
    assert unsupported_pair("gpu", "docker") is None
    with pytest.raises(ParamsError, match="server.engine cpu cannot run with server.launcher docker"):
        params("cpu", "docker")


@pytest.mark.parametrize("engine, launcher, cls, standin, image", [
    ("gpu", "local", launchers.LocalLauncher, False, False),
    ("gpu", "docker", launchers.DockerLauncher, False, True),
    ("cpu", "local", launchers.CpuEngineLauncher, True, False),
])
def test_each_pair_gets_its_launcher_and_answers(engine, launcher, cls, standin, image):
    p = params(engine, launcher)
    assert p.server.engine == engine and isinstance(p.server.engine, Engine)
    s = strategies.strategy_for(p)
    assert (s.engine, s.launcher) == (engine, launcher)
    assert type(launchers.launcher_for(p)) is cls
    assert strategies.serves_standin(p) is standin and strategies.in_image(p) is image
    # only a pair serving the card's checkpoint settles the card's rows of 04-07 (each stage's one
    # record_claims asks this, through measure.Mode)
    assert s.settles_card_claims is (engine == "gpu")


def test_a_live_run_asks_its_strategy_what_it_settles(tmp_path):
    """measure.resolve_mode carries the strategy's answer; a replay analyses recorded data as the
    card's (as before the one record_claims)."""
    from nvfp4study.core.paths import RunPaths
    from nvfp4study.core.stage import Stage
    from nvfp4study.serving import measure

    p = params("cpu", "local").model_copy(update={"server": params("cpu", "local").server.model_copy(
        update={"enabled": True})})
    live = measure.resolve_mode(Stage(name="06_mtp_sweep", params=p, paths=RunPaths(tmp_path)))
    assert (live.kind, live.standin, live.settles_card_claims) == ("live", True, False)
    replay = measure.resolve_mode(Stage(name="06_mtp_sweep", params=p.model_copy(update={"replay_from": str(tmp_path)}),
                                        paths=RunPaths(tmp_path)))
    assert (replay.kind, replay.standin, replay.settles_card_claims) == ("replay", False, True)


def test_the_cpu_engine_needs_no_gpu_and_gets_its_environment(tmp_path):
    from nvfp4study.core.paths import RunPaths
    from nvfp4study.core.stage import Stage

    p = params("cpu", "local").model_copy(deep=True)
    p.server.enabled, p.server.require_gpu = True, True
    assert gpu_refusal(p) is None  # the stand-in is served on this CPU whatever the machine
    env = server_env(Stage(name="t", params=p, paths=RunPaths(tmp_path)), None)
    assert env.get("SGLANG_USE_CPU_ENGINE") == "1"


def test_params_keep_their_text_form():
    p = params("gpu", "docker")
    dumped = p.model_dump(mode="json")["server"]
    assert (dumped["engine"], dumped["launcher"]) == ("gpu", "docker")
    assert type(dumped["engine"]) is str
    assert f"{RequestStatus.STREAM_CUT}" == "stream_cut" and RequestStatus("ok") is RequestStatus.OK
