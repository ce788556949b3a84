"""The stages' serving plans (serving/plans.py): each serving stage declares what it serves in its
own module, and the serving wing, the shared collector and ``nvfp4study plan`` read those plans.
A served configuration added in a temporary stage module is launched and asked against the fake
server with nothing else touched."""

from __future__ import annotations

import sys
import textwrap

import pytest

import nvfp4study.stages as stages_pkg
from nvfp4study.core.params import load_params
from nvfp4study.core.paths import RunPaths
from nvfp4study.core.stage import Stage
from nvfp4study.serving import measure, plans
from nvfp4study.serving.records import det_requests, mtp_requests, prompts
from nvfp4study.serving.server import ServerConfig, card_config
from serving_fixtures import GPU_ENGINE, fake_params, fake_processes, no_leftover  # noqa: F401

EXTRA = "s42_extra_served"
EXTRA_SOURCE = textwrap.dedent('''
    """A temporary stage that serves one configuration no other stage serves and one they share."""
    from nvfp4study.serving.plans import Served
    from nvfp4study.serving.records import RequestSpec, prompts
    from nvfp4study.serving.server import ServerConfig, card_config

    NOTEBOOK = "42_extra_served"


    def serving_plan(params):
        """Speculation at depth 1 in deterministic mode, asked the first prompt for 8 tokens; and
        the card's configuration, asked the second prompt for 8 tokens."""
        first, second = (p["id"] for p in prompts(2))
        return [Served(ServerConfig(clamp=params.server.clamp_mode, spec_depth=1, deterministic=True),
                       (RequestSpec(first, 0, 8),)),
                Served(card_config(params), (RequestSpec(second, 0, 8),))]
''')


@pytest.fixture
def extra_stage(tmp_path, monkeypatch):
    """A stage module ``s42_extra_served`` on the stages package's path for this test only."""
    folder = tmp_path / "more-stages"
    folder.mkdir()
    (folder / f"{EXTRA}.py").write_text(EXTRA_SOURCE)
    monkeypatch.setattr(stages_pkg, "__path__", [*stages_pkg.__path__, str(folder)])
    plans.planning_modules.cache_clear()
    yield "42_extra_served"
    plans.planning_modules.cache_clear()
    sys.modules.pop(f"nvfp4study.stages.{EXTRA}", None)


def test_the_serving_stages_declare_their_plans():
    p = load_params(None, list(GPU_ENGINE))
    assert list(plans.stage_plans(p)) == ["04_launch_server", "05_corruption", "06_mtp_sweep", "07_determinism"]
    assert plans.planning_modules() == tuple(f"nvfp4study.stages.{m}" for m in
                                             ("s04_launch", "s05_corruption", "s06_mtp", "s07_determinism"))
    card = card_config(p)
    # by hand from the GPU_ENGINE params: depths 0-3, one card-style 05 launch per clamp mode,
    # 07's off / depth 2 / both deterministic
    # 06's then 07's, each once: 07's repeat 0 is 06's request (same prompt, budget, thinking)
    assert plans.needs(p, card) == [*mtp_requests(p), *(r for r in det_requests(p) if r.repeat > 0)]
    assert plans.needs(p, ServerConfig(clamp="exact", spec_depth=3)) == mtp_requests(p)
    assert plans.needs(p, ServerConfig(clamp="none", spec_depth=2)) == []  # 05 collects its own
    assert [s.launch_measured for s in plans.plan_of(p, "04_launch_server")] == [True]


def test_a_configuration_added_in_a_stage_module_is_planned_and_served(extra_stage, tmp_path, no_leftover):  # noqa: F811
    p, pf, run = fake_params(tmp_path, "mtp.prompts=1", "mtp.max_tokens=8", "determinism.prompts=1",
                             "determinism.repeats=1", "determinism.max_tokens=8")
    new = ServerConfig(clamp="exact", spec_depth=1, deterministic=True)
    assert plans.plan_of(p, extra_stage)[0].config == new
    assert new in plans.plan_servers(p)  # what `nvfp4study plan` lists
    table = plans.plan_table(p).set_index("config")
    assert table.loc[new.key, "stages"] == extra_stage
    assert "42_extra_served" in table.loc[card_config(p).key, "stages"]
    first, second = (q["id"] for q in prompts(2))
    # the card's launch now carries the extra stage's request after 06's and 07's
    assert [r.prompt_id for r in plans.needs(p, card_config(p))][-1] == second

    stage = Stage(name=extra_stage, params=p, paths=RunPaths(run))
    out = measure.collect(stage).set_index("config")
    assert list(out.index) == [new.key, card_config(p).key]
    # the card's: the first prompt (06's and 07's one request: same prompt, budget and thinking) and ours
    assert out.launched.all() and list(out.sent) == [1, 2]
    rows = measure.read_jsonl(measure.raw_path(stage.paths, new))
    timed = [r for r in rows if not r["warmup"]]
    assert [(r["prompt_id"], r["status"]) for r in timed] == [(first, "ok")]
    launch = measure.read_jsonl(measure.launch_path(stage.paths, new))
    assert len(launch) == 1 and "--enable-deterministic-inference" in launch[0]["command"]
    assert not fake_processes()
    # resume: everything recorded, nothing launched again
    again = measure.collect(stage)
    assert not again.launched.any()
