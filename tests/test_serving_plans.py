"""The stages' serving plans (serving/plans.py): each serving stage declares what it serves in its
own module, and the serving wing, the shared collector and ``nvfp4study plan`` read those plans.
A served configuration added in a temporary stage module is launched and asked against the fake
server with nothing else touched."""

from __future__ import annotations

import sys
import textwrap

import pytest

import nvfp4study.stages as stages_pkg
from nvfp4study.codeeval.tasks import load_tasks
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


def _temporary_stage(folder, monkeypatch, module: str, source: str):
    """Write stage module ``module`` (``sNN_name``) into ``folder``, put it on the stages package's
    path for this test only and yield its notebook name (``NN_name``); undone after the test."""
    folder.mkdir()
    (folder / f"{module}.py").write_text(source)
    monkeypatch.setattr(stages_pkg, "__path__", [*stages_pkg.__path__, str(folder)])
    plans.planning_modules.cache_clear()
    yield module[1:]
    plans.planning_modules.cache_clear()
    sys.modules.pop(f"nvfp4study.stages.{module}", None)


@pytest.fixture
def extra_stage(tmp_path, monkeypatch):
    """A stage module ``s42_extra_served`` on the stages package's path for this test only."""
    yield from _temporary_stage(tmp_path / "more-stages", monkeypatch, EXTRA, EXTRA_SOURCE)


def test_the_serving_stages_declare_their_plans():
    p = load_params(None, list(GPU_ENGINE))
    assert list(plans.stage_plans(p)) == ["04_launch_server", "05_corruption", "06_mtp_sweep", "07_determinism"]
    assert plans.planning_modules() == tuple(f"nvfp4study.stages.{m}" for m in
                                             ("s04_launch", "s05_corruption", "s06_mtp", "s07_determinism"))
    card = card_config(p)
    # by hand from the GPU_ENGINE params: depths 0-3, one card-style 05 launch per clamp mode,
    # 07's off / depth 2 / both deterministic. 05's sweep in mode exact is the card's
    # configuration: one launch with 05's requests (stage order: 05 first), then 06's and 07's,
    # each once: 07's repeat 0 is 06's request (same prompt, budget, thinking)
    ids = [t.task_id for t in load_tasks(p.corruption.humaneval_count, p.corruption.card_tasks)]
    sweep = [f"corruption/{s}/{t}" for s in ("t0-off-a", "t0-off-b", "t06-on", "t06-off") for t in ids]
    assert p.corruption.protocol == "extended" and len(ids) == 15 + p.corruption.humaneval_count
    got = plans.needs(p, card)
    assert [r.key for r in got[:len(sweep)]] == sweep
    assert got[len(sweep):] == [*mtp_requests(p), *(r for r in det_requests(p) if r.repeat > 0)]
    assert plans.needs(p, ServerConfig(clamp="exact", spec_depth=3)) == mtp_requests(p)
    assert [r.key for r in plans.needs(p, ServerConfig(clamp="none", spec_depth=2))] == sweep  # 05's alone
    probe = ServerConfig(clamp="exact", spec_depth=2, reasoning_parser=p.corruption.reasoning_probe_parser)
    first = ids[:p.corruption.reasoning_probe_tasks]
    assert [r.key for r in plans.needs(p, probe)] == [f"probe/{t}/stream={s}" for t in first for s in ("on", "off")]
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


CODE = "s43_extra_code"
CODE_SOURCE = textwrap.dedent('''
    """A temporary stage that asks for code as stage 05 does: one configuration of its own and
    05's corruption-sweep configuration in mode none (shared with 05)."""
    from dataclasses import replace

    from nvfp4study.codeeval.served_collect import CorruptionRequest
    from nvfp4study.core.params import SamplingConfig
    from nvfp4study.serving.plans import Served
    from nvfp4study.serving.server import ServerConfig, card_config

    NOTEBOOK = "43_extra_code"


    def serving_plan(params):
        """card/dedupe streamed on speculation depth 1 in deterministic mode; card/fibonacci not
        streamed on 05's sweep configuration in mode none; both greedy, 64 tokens, thinking off."""
        mine = SamplingConfig(name="t0-mine", temperature=0.0, max_tokens=64)
        return [Served(ServerConfig(clamp=params.server.clamp_mode, spec_depth=1, deterministic=True),
                       (CorruptionRequest.of("card/dedupe", mine),), what="43 code on depth 1"),
                Served(replace(card_config(params), clamp="none"),
                       (CorruptionRequest.of("card/fibonacci", mine, stream=False),), what="43 code beside 05")]
''')


@pytest.fixture
def code_stage(tmp_path, monkeypatch):
    """A stage module ``s43_extra_code`` on the stages package's path for this test only."""
    yield from _temporary_stage(tmp_path / "code-stages", monkeypatch, CODE, CODE_SOURCE)


def test_a_code_request_added_in_a_stage_module_is_served_beside_05(code_stage, tmp_path, no_leftover):  # noqa: F811
    """05-style requests (codeeval's CorruptionRequest) in a temporary stage: its own
    configuration is launched for it alone; on 05's sweep configuration one launch carries 05's
    sweep and this stage's request, so 05 launches nothing afterwards; ``nvfp4study plan`` lists both."""
    from nvfp4study.codeeval import served_data
    from nvfp4study.codeeval.tasks import CARD_TASK_IDS
    from nvfp4study.workstation import plan as ws_plan

    p, pf, run = fake_params(tmp_path, "corruption.clamp_modes=[none]", "corruption.humaneval_count=0",
                             "corruption.protocol=card", "corruption.reasoning_probe_tasks=0",
                             "corruption.sampling=[{name: t0-off-a, temperature: 0.0, max_tokens: 64}]")
    own = ServerConfig(clamp="exact", spec_depth=1, deterministic=True)
    sweep = card_config(p, clamp="none")
    launches = {x.config: x for x in ws_plan.launches(p)}
    assert launches[own.key].requests == 1 and launches[own.key].reason == "43 code on depth 1"
    # 05's 15 card tasks (corruption.protocol card: t0-off-a's claim set), then ours
    assert launches[sweep.key].requests == 16 and launches[sweep.key].stage == "05_corruption"
    assert launches[sweep.key].reason.endswith("; 43 code beside 05")

    stage = Stage(name=code_stage, params=p, paths=RunPaths(run))
    out = measure.collect(stage).set_index("config")
    assert list(out.index) == [own.key, sweep.key]
    assert out.launched.all() and list(out.sent) == [1, 16]
    mine = served_data.read_rows(served_data.raw_path(stage.paths, "exact", "t0-mine"))
    assert [(r["task_id"], r["status"], r["server"], r["stream"]) for r in mine] == [
        ("card/dedupe", "ok", own.key, True)]
    beside = served_data.read_rows(served_data.raw_path(stage.paths, "none", "t0-mine"))
    assert [(r["task_id"], r["status"], r["server"], r["stream"]) for r in beside] == [
        ("card/fibonacci", "ok", sweep.key, False)]
    assert beside[0]["max_tokens"] == 64 and beside[0]["request"]["temperature"] == 0.0
    theirs = served_data.read_rows(served_data.raw_path(stage.paths, "none", "t0-off-a"))
    assert [r["task_id"] for r in theirs] == list(CARD_TASK_IDS) and all(r["status"] == "ok" for r in theirs)
    assert len(measure.read_jsonl(measure.launch_path(stage.paths, sweep))) == 1
    assert not fake_processes()
    # 05 finds its sweep answered on the shared launch: nothing launched, nothing sent
    s05 = Stage(name="05_corruption", params=p, paths=RunPaths(run))
    again = measure.collect(s05)
    assert not again.launched.any() and len(served_data.read_rows(served_data.raw_path(stage.paths, "none", "t0-off-a"))) == 15
    # resume: a lost row is asked again, alone
    f = served_data.raw_path(stage.paths, "exact", "t0-mine")
    f.write_text("")
    out = measure.collect(stage).set_index("config")
    assert list(out.launched) == [True, False] and list(out.sent) == [1, 0]
    assert [r["task_id"] for r in served_data.read_rows(f)] == ["card/dedupe"]


ARMS = "s44_extra_arms"
ARMS_SOURCE = textwrap.dedent('''
    """A temporary stage that serves the trained stand-in's arms as stage 05 does (its requests:
    trained.served's TrainedRequest), on whatever the run serves."""
    from nvfp4study.serving.plans import Served
    from nvfp4study.trained import served as trained

    NOTEBOOK = "44_extra_arms"


    def serving_plan(params):
        """One item per arm, in serving order (the reference's clamp form first)."""
        return [Served(trained.server_config(params, a), trained.arm_requests(params, a), what=f"44 arm {a.key}")
                for a in trained.serving_order(params)]
''')


def test_trained_arms_added_in_a_stage_module_are_served_and_assembled(tmp_path, monkeypatch, no_leftover):  # noqa: F811
    """Requests that depend on another launch's answers (each arm scores the reference arm's
    continuation) through the one collector against the fake's ``/generate``: the reference arm
    first, the null control a launch of its own, every answer appended as it arrives, read back
    by ``trained.served.assemble``; a lost answer is asked again alone."""
    from nvfp4study.trained import served as trained

    folder = tmp_path / "arm-stages"
    folder.mkdir()
    (folder / f"{ARMS}.py").write_text(ARMS_SOURCE)
    monkeypatch.setattr(stages_pkg, "__path__", [*stages_pkg.__path__, str(folder)])
    plans.planning_modules.cache_clear()
    try:
        p, pf, run = fake_params(tmp_path, "server.cpu.trained.prompts=2", "server.cpu.trained.weights=[bf16]",
                                 "server.cpu.trained.clamps=[released, exact]", "server.cpu.trained.max_new_tokens=6",
                                 "server.parallel_loads=3", "server.port=0")
        stage = Stage(name="44_extra_arms", params=p, paths=RunPaths(run))
        out = measure.collect(stage)
        keys = [trained.server_config(p, a).key for a in trained.serving_order(p)]
        assert list(out.config) == keys and keys[1] == keys[0] + "-instance=again"
        assert out.launched.all() and list(out.sent) == [2, 2, 2]
        data = trained.assemble(stage)
        assert [(r["arm"], r["task_id"]) for r in data["rows"]] == [
            (a, f"HumanEval/{i}") for a in ("exact-bf16", "exact-bf16-again", "released-bf16") for i in (0, 1)]
        # the fake's answers depend only on the input ids (no clamp on it): every arm writes what the
        # reference wrote, and scores the reference's 6 tokens at the fake's -0.25 each
        ref = {r["task_id"]: r["output_ids"] for r in data["rows"] if r["arm"] == "exact-bf16"}
        assert all(len(v) == 6 for v in ref.values())
        assert all(r["output_ids"] == ref[r["task_id"]] for r in data["rows"])
        assert all((r["reference_tokens"], r["reference_logprob_mean"]) == (6, -0.25) for r in data["rows"])
        assert len({x["log"] for x in data["launches"]}) == 3 and all(x["load_s"] for x in data["launches"])
        # the null control loads with the reference (one install state) but reads its answers, so
        # the two are served one after the other; the released arm's group is its own
        recs = {k: measure.launches(stage.paths, trained.server_config(p, a))[-1]
                for k, a in zip(keys, trained.serving_order(p), strict=True)}
        assert [(r["loaded_with"], r["served_with"]) for r in recs.values()] == [(1, 0), (1, 0), (0, 0)]
        assert not fake_processes()
        # resume: one answer lost, only it is asked again, on the released arm's launch alone
        f = trained.raw_path(stage.paths, "released-bf16")
        f.write_text(f.read_text().splitlines(keepends=True)[0])
        again = measure.collect(stage)
        assert list(again.launched) == [False, False, True] and list(again.sent) == [0, 0, 1]
        assert trained.assemble(stage)["rows"] == data["rows"]
    finally:
        plans.planning_modules.cache_clear()
        sys.modules.pop(f"nvfp4study.stages.{ARMS}", None)


# --- the order a loaded group is served in (measure._waves / _serve_wave) --------------------------

class _Ask:
    """A stand-in request: appends to ``<config>.jsonl``, reads ``reads_from``'s file."""

    def __init__(self, timed: bool = False, reads_from: str | None = None):
        self.wants_warmup, self.reads_from = timed, reads_from

    def path(self, paths, config):
        return paths.data(config, "jsonl")

    def reads(self, paths, config):
        return () if self.reads_from is None else (paths.data(self.reads_from, "jsonl"),)


def _loaded(tmp_path, *asks):
    stage = Stage(name="05_corruption", params=None, paths=RunPaths(tmp_path))
    return stage, [(name, [ask], {"name": name}) for name, ask in asks]


def _names(waves):
    return [[c for c, _, _ in w] for w in waves]


def test_untimed_launches_are_served_together_after_the_ones_they_read(tmp_path):
    stage, started = _loaded(tmp_path, ("ref", _Ask()), ("again", _Ask(reads_from="ref")), ("other", _Ask()))
    assert _names(measure._waves(stage, started)) == [["ref", "other"], ["again"]]
    stage, started = _loaded(tmp_path, ("a", _Ask()), ("b", _Ask()), ("c", _Ask()))
    assert _names(measure._waves(stage, started)) == [["a", "b", "c"]]
    # a file no launch of the group writes (the reference served in an earlier group) orders nothing
    stage, started = _loaded(tmp_path, ("a", _Ask(reads_from="ref")), ("b", _Ask(reads_from="ref")))
    assert _names(measure._waves(stage, started)) == [["a", "b"]]


def test_a_timed_request_serves_its_launch_alone(tmp_path):
    stage, started = _loaded(tmp_path, ("a", _Ask(timed=True)), ("b", _Ask(timed=True)), ("c", _Ask(timed=True)))
    assert _names(measure._waves(stage, started)) == [["a"], ["b"], ["c"]]
    stage, started = _loaded(tmp_path, ("a", _Ask()), ("b", _Ask(timed=True)), ("c", _Ask()))
    assert _names(measure._waves(stage, started)) == [["b"], ["a", "c"]]
    # 05's reference arm also answers 06's depth-0 timed requests: alone, then the arms reading it
    stage, started = _loaded(tmp_path, ("ref", _Ask(timed=True)), ("nvfp4", _Ask(reads_from="ref")),
                             ("again", _Ask(reads_from="ref")))
    assert _names(measure._waves(stage, started)) == [["ref"], ["nvfp4", "again"]]
    # a chain: each reads the one before it
    stage, started = _loaded(tmp_path, ("c", _Ask(reads_from="b")), ("b", _Ask(reads_from="a")), ("a", _Ask()))
    assert _names(measure._waves(stage, started)) == [["a"], ["b"], ["c"]]


def test_a_wave_runs_at_once_and_raises_the_first_failure_after_every_launch_ended(tmp_path, monkeypatch):
    import threading
    import time

    spans, barrier = {}, threading.Barrier(2, timeout=10)

    class Launch:
        def __init__(self, name):
            self.name, self.record = name, {}

    def serve(stage, launch, config, pending, *, bar=True):
        assert bar is False  # no progress bar from a thread
        t0 = time.monotonic()
        barrier.wait()  # both launches are being served at the same time, or this times out
        time.sleep(0.2 if config == "slow" else 0.0)
        spans[config] = (t0, time.monotonic())
        if config == "fails":
            raise RuntimeError("lost")

    monkeypatch.setattr(measure, "_serve", serve)
    wave = [("fails", [], Launch("fails")), ("slow", [], Launch("slow"))]
    with pytest.raises(RuntimeError, match="lost"):
        measure._serve_wave(None, wave)
    assert set(spans) == {"fails", "slow"}  # the slow one ran to its end before the raise
    assert [x[2].record["served_with"] for x in wave] == [1, 1]


def test_an_interrupt_during_a_wave_returns_at_once(tmp_path, monkeypatch):
    """Ctrl-C in the notebook while two launches are being served: the wave does not wait for their
    requests (the caller then stops the launches, which ends them)."""
    import concurrent.futures as cf
    import threading
    import time

    release = threading.Event()

    class Launch:
        record: dict = {}

    def serve(stage, launch, config, pending, *, bar=True):
        release.wait(10)

    def interrupted(futures, *a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(measure, "_serve", serve)
    monkeypatch.setattr(cf, "wait", interrupted)
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        measure._serve_wave(None, [("a", [], Launch()), ("b", [], Launch())])
    assert time.monotonic() - t0 < 5  # the serving threads were still blocked
    release.set()
