"""Raw request records of the serving stages (04, 06, 07): what to ask each server, asking it,
appending every answer to JSONL as it arrives, and re-using a recorded run (replay).

Files (under ``data/`` of the run; ``<cfg>`` is :attr:`ServerConfig.tags`, e.g.
``clamp=exact-spec=2-det=off``):

- ``serve-raw-<cfg>.jsonl``: one row per request: the :func:`nvfp4study.serving.client.chat_completion`
  record plus ``config``, ``config_key``, ``request_key``, ``prompt_id``, ``repeat``, ``warmup``,
  ``launch`` (the launch number) and ``metrics_before`` / ``metrics_after`` (Prometheus counters
  read just before and after this request, so deltas are scoped to it).
- ``serve-launch-<cfg>.jsonl``: one row per launch: command, log path, load time, GPU,
  ``/server_info``, ``/model_info``, counters at the start and end of the session, status.

Grouping: what each stage serves is its own ``serving_plan(params)`` (:mod:`nvfp4study.serving.plans`).
When a server is up, every request any stage's plan asks of that configuration is sent (not only
the running notebook's), so each distinct configuration is launched once across the notebooks;
requests already recorded with status "ok" are not sent again (resume).

Modes (:func:`resolve_mode`): "replay" when ``replay_from`` is set (recorded files are copied in;
missing ones are :class:`ReplayDataMissing`, never a live run); "not run" when no server can
start here (the reason is recorded in the ledger); else "live".
"""

from __future__ import annotations

import contextlib
import html
import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import ReplayDataMissing
from ..core.files import atomic_write
from ..core.progress import progress
from ..core.stage import Stage
from . import client
from .plans import Served, needs, plan_of, stage_plans

# what to ask and where it is recorded (serving/records.py; re-exported: stages and tests name them here)
from .records import (  # noqa: E402, F401
    LAUNCH_STEM,
    RAW_STEM,
    RequestSpec,
    ServedRequest,
    all_prompts,
    append_jsonl,
    counters,
    det_requests,
    launch_path,
    launches,
    mtp_requests,
    prompts,
    raw_path,
    read_jsonl,
    recorded,
)
from .server import (
    STANDIN_NOTE,
    ServerConfig,
    StartedLaunch,
    engine_description,
    gpu_refusal,
    launched,
    served_model_path,
)
from .sglang_log import REFUSAL_LINE, refusal_message  # noqa: F401  (the one log parser)
from .strategies import strategy_for


# --- mode ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mode:
    """How a serving stage runs here: "live", "replay" (of ``source``) or "not run" (``reason``)."""

    kind: str
    reason: str = ""
    source: Path | None = None

    stage: str = ""
    standin: bool = False  # a live run serving the CPU engine's stand-in (strategies.serves_standin)
    engine_summary: str = ""  # cpu_engine.summary() of a live CPU-engine run
    #: whether the card's rows can be settled: a live run's strategy says
    #: (:attr:`~nvfp4study.serving.strategies.ServingStrategy.settles_card_claims`); a replay analyses
    #: the recorded data as the card's
    settles_card_claims: bool = True

    def markdown(self):
        """What the notebook shows once, under "How this stage runs here": for "not run" one box
        with why, what the stage would measure, the command and the hardware (the stage's
        other cells then show nothing, see :class:`Quiet`)."""
        from IPython.display import HTML

        from ..core.display import markdown
        from ..report.findings import GPU_COMMAND, GPU_HARDWARE, REPLAY_COMMAND, STAGE_MEASURES

        if self.kind == "not run":
            what = STAGE_MEASURES.get(self.stage, "the stage's claims")
            return HTML(
                '<div class="notrun" style="border:2px solid #999;background:#f3f3f3;padding:.5em 1em;'
                f'border-radius:6px"><b>Not run: {html.escape(self.reason)}.</b> This stage {html.escape(what)}; '
                "its claims are recorded as not run and the sections below stay empty.<br>"
                f"To run it: <code>{html.escape(GPU_COMMAND)}</code> on {html.escape(GPU_HARDWARE)}.<br>"
                f"Without a GPU, re-analyse a recorded run: <code>{html.escape(REPLAY_COMMAND)}</code>.</div>")
        if self.kind == "replay":
            return markdown(f"**Replay** of the recorded run `{self.source}`: its raw files are copied "
                            "into this run and analysed; no server is started.")
        if self.standin:
            return markdown(f"**Live on the CPU engine**: {self.engine_summary}. Each configuration below "
                            f"is launched with the study's own command, lifecycle and client; {STANDIN_NOTE}. "
                            "Every answer is appended to `data/serve-raw-*.jsonl` as it arrives. The card's rows "
                            "stay *not run* (they need the real model on an NVFP4 GPU); what this run measures "
                            "are study findings about the serving pipeline and its estimators.")
        return markdown("**Live**: SGLang is launched for each configuration below; every answer is "
                        "appended to `data/serve-raw-*.jsonl` as it arrives.")


class Quiet:
    """What a table function of a stage that did not run returns: nothing is displayed (the
    stage's one not-run box, :meth:`Mode.markdown`, says why), ``data`` keeps the sentence."""

    def __init__(self, text: str) -> None:
        self.data = text

    def _ipython_display_(self) -> None:
        return None

    def __repr__(self) -> str:
        return self.data


def resolve_mode(stage: Stage) -> Mode:
    """Replay when ``replay_from`` is set, "not run" when :func:`gpu_refusal` gives a reason."""
    p = stage.params
    if p.replay_from:
        src = Path(p.replay_from).expanduser()
        if not src.is_absolute():
            src = (Path.cwd() / src)
        return Mode("replay", source=src.resolve(), stage=stage.name)
    reason = gpu_refusal(p)
    if reason:
        return Mode("not run", reason=reason, stage=stage.name)
    strategy = strategy_for(p)
    if strategy.standin:
        return Mode("live", stage=stage.name, standin=True, engine_summary=engine_description(p)["summary"],
                    settles_card_claims=strategy.settles_card_claims)
    return Mode("live", stage=stage.name, settles_card_claims=strategy.settles_card_claims)


def params_of(stage: Stage):
    """The params that define what was measured: the recorded run's own ``params.yaml`` when
    replaying (so its configurations, prompts and depths are analysed as they were recorded,
    whatever this run's profile), else the stage's params.

    Raises:
        ReplayDataMissing: the recorded run has no ``params.yaml``.
    """
    from ..core.params import load_params

    p = stage.params
    if not p.replay_from:
        return p
    src = resolve_mode(stage).source
    if not src.is_dir():
        raise ReplayDataMissing(f"replay_from {src} is not a folder")
    f = src / "params.yaml"
    if not f.is_file():
        raise ReplayDataMissing(f"replay_from {src}: no params.yaml (not a recorded run folder)")
    return load_params(f).model_copy(update={"replay_from": p.replay_from})


def _copy(src: Path, dst: Path, same: bool) -> Path:
    if not same:
        atomic_write(dst, lambda tmp: shutil.copyfile(src, tmp))
    return dst


# --- asking ----------------------------------------------------------------------------------
def ask(stage: Stage, url: str, config: ServerConfig, spec: RequestSpec, *, launch: int, warmup: bool = False,
        text: str | None = None) -> dict[str, Any]:
    """Send one timed chat request and append its row (:meth:`RequestSpec.send`). Returns the row."""
    return spec.send(stage, url, config, launch, warmup=warmup, text=text)


def collect(stage: Stage, select: Callable[[Served], bool] | None = None):
    """Run the stage's live collection (or the replay import, or record "not run").

    What the stage serves is its own ``serving_plan(params)`` (:mod:`nvfp4study.serving.plans`);
    ``select`` keeps only some of its items (05 collects its corruption sweep and its trained
    arms in separate cells). Live: :func:`collect_items`. Returns a DataFrame (one row per
    configuration: launched or skipped, requests sent, failures) or a Markdown sentence.
    """
    mode = resolve_mode(stage)
    if mode.kind == "not run":
        stage.not_run(mode.reason)
        return Quiet(f"not run: {mode.reason}")
    items = [s for s in plan_of(params_of(stage), stage.name) if select is None or select(s)]
    if mode.kind == "replay":
        return _replay(stage, mode.source, items)
    return collect_items(stage, items)


def collect_items(stage: Stage, items: list[Served]):
    """Launch each item's configuration once if anything is missing: the launch itself (a
    ``launch_measured`` item, 04) or any request any stage asks of it (:func:`needs`; requests
    whose row is recorded with status "ok" are not sent again). Launches of one install state
    load together (``server.parallel_loads``). Returns the DataFrame of :func:`collect`."""
    import pandas as pd

    every = stage_plans(stage.params)  # read once: needs() below asks every stage's plan
    rows, group = [], []
    for item in items:
        c = item.config
        pending = _pending(stage, c, needs(stage.params, c, every))
        must_launch = item.launch_measured and not any(r.get("status") == "ok" for r in launches(stage.paths, c))
        if not pending and not must_launch:
            rows.append({"config": c.key, "launched": False, "sent": 0, "failed": 0,
                         "note": "all requests already recorded"})
            continue
        if group and (item.refusable or not _same_install(group[0][0], c)):
            rows += _sessions(stage, group)  # launches keep the configurations' order
            group = []
        if item.refusable:
            rows.append(_refusable_session(stage, c, pending))
            continue
        group.append((c, pending))
        if len(group) == _parallel_loads(stage.params):
            rows += _sessions(stage, group)
            group = []
    if group:
        rows += _sessions(stage, group)
    return pd.DataFrame(rows)


def _pending(stage: Stage, config: ServerConfig, wanted: list[ServedRequest]) -> list[ServedRequest]:
    """The requests of ``wanted`` without a row with status "ok" in their files (each file read once)."""
    done: set[str] = set()
    read: set[Path] = set()
    for r in wanted:
        f = r.path(stage.paths, config)
        if f in read:
            continue
        read.add(f)
        if f.is_file():
            done |= {k for row in read_jsonl(f) if row.get("status") == "ok" and (k := r.row_key(row)) is not None}
    return [r for r in wanted if r.key not in done]


def _item_files(paths, item: Served) -> list[Path]:
    """The recorded files an item's replay copies: its launch file (unless ``replay_launch`` is
    off) and its requests' files (unless ``replay_requests`` is off)."""
    files = [launch_path(paths, item.config)] if item.replay_launch else []
    if item.replay_requests:
        files += list(dict.fromkeys(r.path(paths, item.config) for r in item.requests)) or \
            [raw_path(paths, item.config)]
    return files


def _replay(stage: Stage, source: Path, items: list[Served]):
    """Import the recorded files of the stage's plan; an optional item (04's clamp probe, 05's
    reasoning-parser probe: a run recorded before it, or without it, has none; its rule says so)
    is skipped when the recorded run lacks its files.

    Raises:
        ReplayDataMissing: the source folder, or a file of an item that is not optional, is missing.
    """
    import pandas as pd

    from ..core.paths import RunPaths

    if not source.is_dir():
        raise ReplayDataMissing(f"replay_from {source} is not a folder")
    src = RunPaths(source)
    items = [s for s in items if not s.replay_optional or all(f.is_file() for f in _item_files(src, s))]
    missing = [str(f) for s in items for f in _item_files(src, s) if not f.is_file()]
    if missing:
        raise ReplayDataMissing("recorded data missing (no live run is started in replay mode): "
                                + ", ".join(dict.fromkeys(missing)))
    same = source.resolve() == stage.run_dir.resolve()
    copied: list[Path] = []
    for s in items:
        for f in _item_files(src, s):
            dst = stage.paths.data_dir / f.name
            if dst not in copied:
                copied.append(_copy(f, dst, same))
        if s.replay_launch:
            for row in read_jsonl(launch_path(src, s.config)):
                if row.get("log") and (source / row["log"]).is_file():
                    copied.append(_copy(source / row["log"], stage.run_dir / row["log"], same))
    return pd.DataFrame({"copied from " + str(source): [str(f.relative_to(stage.run_dir)) for f in copied]})


def _refusable_session(stage: Stage, config: ServerConfig, pending: list[ServedRequest]) -> dict[str, Any]:
    """A launch SGLang may refuse on the CPU engine (deterministic mode with this attention
    backend): a refusal (:class:`~nvfp4study.core.errors.ServerExitedDuringLoad`) is kept in the
    launch record (``status`` "refused", ``refusal`` = SGLang's message from the log) instead of
    stopping the stage; a launch that comes up is an ordinary session."""
    from ..core.errors import ServerExitedDuringLoad

    try:
        return _session(stage, config, pending)
    except ServerExitedDuringLoad:
        rows = launches(stage.paths, config)
        rec = rows[-1]
        rec["refusal"] = refusal_message(stage.run_dir / rec["log"]) if rec.get("log") else None
        rec["status"] = "refused"
        _rewrite_last(launch_path(stage.paths, config), rec)
        return {"config": config.key, "launched": True, "sent": 0, "failed": 0, "load_s": None,
                "note": f"refused by SGLang: {rec['refusal']}"}


def _rewrite_last(path: Path, row: dict[str, Any]) -> None:
    rows = read_jsonl(path)[:-1] + [row]
    atomic_write(path, lambda tmp: tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows)))


def model_config_for(stage: Stage, model_path: str | None) -> dict[str, Any]:
    """The served checkpoint's ``config.json`` keys the checks need (params' shape when unreadable)."""
    keys = ("num_hidden_layers", "first_k_dense_replace", "num_nextn_predict_layers",
            "expert_swiglu_limit_list", "share_expert_swiglu_limit_list", "routed_scaling_factor")
    cfg = Path(model_path or "") / "config.json"
    if model_path and cfg.is_file():
        from ..checkpoint.validate import config_from_bytes  # types and ranges, named errors

        data = config_from_bytes(cfg, cfg.read_bytes())
        return {k: data.get(k) for k in keys} | {"source": str(cfg)}
    sh = params_of(stage).checkpoint.shape
    n = sh.num_hidden_layers
    return {"num_hidden_layers": n, "first_k_dense_replace": sh.first_k_dense_replace,
            "num_nextn_predict_layers": sh.num_nextn_predict_layers,
            "expert_swiglu_limit_list": [sh.expert_swiglu_limits.get(i, 0) for i in range(n)],
            "share_expert_swiglu_limit_list": [sh.share_expert_swiglu_limits.get(i, 0) for i in range(n)],
            "source": "params checkpoint.shape"}


def _parallel_loads(params) -> int:
    """``server.parallel_loads``, or 1 with a fixed ``server.port`` (one port serves one launch)."""
    return params.server.parallel_loads if params.server.port == 0 else 1


def _same_install(a: ServerConfig, b: ServerConfig) -> bool:
    """Whether two launches serve one install state (clamp mode, deterministic edit, native MoE
    patches), so that they may load at the same time (:func:`~nvfp4study.serving.server.launched`)."""
    return (a.clamp, a.deterministic, a.native) == (b.clamp, b.deterministic, b.native)


def _session(stage: Stage, config: ServerConfig, pending: list[ServedRequest]) -> dict[str, Any]:
    """One launch of ``config`` that sends ``pending``; the row of :func:`collect`'s table."""
    return _sessions(stage, [(config, pending)])[0]


def _sessions(stage: Stage, group: list[tuple[ServerConfig, list[ServedRequest]]]) -> list[dict[str, Any]]:
    """Launch the group's configurations at once, wait until each is healthy, then send their
    requests in the waves of :func:`_waves` while the others wait idle (``--sleep-on-idle`` on the
    CPU engine: an idle scheduler sleeps on its sockets), so no timed request shares the machine
    with a loading server or another launch's requests. All are stopped when the last is done,
    innermost first. One launch per config."""
    with contextlib.ExitStack() as stack:
        started = [(c, pending, stack.enter_context(_recorded_launch(stage, c, len(group))))
                   for c, pending in group]
        _wait_all([launch for _, _, launch in started])
        for wave in _waves(stage, started):
            _serve_wave(stage, wave)
    return [{"config": c.key, "launched": True, "sent": launch.record["sent"],
             "failed": launch.record["failed"], "load_s": launch.record.get("load_s"),
             "note": launch.record.get("install", "")} for c, _, launch in started]


@contextlib.contextmanager
def _recorded_launch(stage: Stage, config: ServerConfig, loaded_with: int) -> Iterator[StartedLaunch]:
    """:func:`~nvfp4study.serving.server.launched` whose record is appended to the config's
    launch file when it ends, with ``status`` "ok" or the exception that ended it."""
    n = len(launches(stage.paths, config)) + 1
    rec: dict[str, Any] = {"launch": n, "status": "starting", "sent": 0, "failed": 0,
                           "loaded_with": loaded_with - 1}  # other launches loading at the same time
    try:
        rec["model_config"] = model_config_for(stage, served_model_path(stage, config))
        with launched(stage, config, launch_record=rec) as launch:
            yield launch
            rec["status"] = "ok"
    except BaseException as exc:
        rec["status"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        raise
    finally:
        append_jsonl(launch_path(stage.paths, config), rec)


def _wait_all(started: list[StartedLaunch]) -> None:
    """:meth:`StartedLaunch.wait_healthy` for every launch, each in its own thread so that each load
    time is its own; the first failure is raised as soon as it happens (the caller's exit stack
    then stops every launch, which ends the other waits)."""
    if len(started) == 1:
        started[0].wait_healthy()
        return
    from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

    pool = ThreadPoolExecutor(len(started), thread_name_prefix="wait-healthy")
    try:
        futures = [pool.submit(x.wait_healthy) for x in started]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for f in futures:
            if f in done and f.exception() is not None:
                raise f.exception()
    finally:
        pool.shutdown(wait=False)  # a wait still running ends when its launch is stopped


Loaded = tuple[ServerConfig, list[ServedRequest], StartedLaunch]


def _waves(stage: Stage, started: list[Loaded]) -> list[list[Loaded]]:
    """The order a healthy group is served in, as lists of launches served at the same time.

    A launch whose requests read a file another launch's requests append to
    (:meth:`~nvfp4study.serving.records.ServedRequest.reads`: 05's trained arms read the reference
    arm's answers) is served in a later wave than that launch. Within one such level, a launch with
    a timed request (``wants_warmup``: its speed is measured; 06's depth-0 requests ride on 05's
    reference launch) is served alone; the others measure outputs only (each server answers its
    own requests one after the other with one intra-op thread, so its outputs do not depend on
    what runs beside it) and are served together."""
    n = len(started)
    if n == 1:
        return [started]
    writes = [{r.path(stage.paths, c) for r in pending} for c, pending, _ in started]
    reads = [{f for r in pending for f in r.reads(stage.paths, c)} for c, pending, _ in started]
    level = [0] * n
    for _ in range(n):  # the longest chain of readers (bounded: n rounds)
        level = [max((level[j] + 1 for j in range(n) if j != i and writes[j] & reads[i]), default=0)
                 for i in range(n)]
    waves = []
    for lv in sorted(set(level)):
        at = [i for i in range(n) if level[i] == lv]
        timed = [i for i in at if any(r.wants_warmup for r in started[i][1])]
        waves += [[started[i]] for i in timed]
        waves += [[started[i] for i in at if i not in timed]] if len(timed) < len(at) else []
    return waves


def _serve_wave(stage: Stage, wave: list[Loaded]) -> None:
    """Serve a wave's launches (:func:`_serve`), several each in a thread without a progress bar; the
    first failure, in wave order, is raised once all ended. ``served_with``: the others, counted."""
    for _, _, launch in wave:
        launch.record["served_with"] = len(wave) - 1
    if len(wave) == 1:
        _serve(stage, wave[0][2], wave[0][0], wave[0][1])
        return
    import concurrent.futures as cf

    pool = cf.ThreadPoolExecutor(len(wave), thread_name_prefix="serve")
    try:
        futures = [pool.submit(_serve, stage, launch, c, pending, bar=False) for c, pending, launch in wave]
        cf.wait(futures)
    finally:
        # not waiting on an interrupt: the caller's exit stack stops the launches next, and the
        # threads' requests then fail at once instead of running to their end
        pool.shutdown(wait=False, cancel_futures=True)
    for f in futures:
        if (exc := f.exception()) is not None:
            raise exc


def _serve(stage: Stage, launch: StartedLaunch, config: ServerConfig, pending: list[ServedRequest], *,
           bar: bool = True) -> None:
    """Send a healthy launch its warm-up requests (when a timed request is pending) and
    ``pending`` (each appends its own row, :meth:`ServedRequest.send`); ``bar``: a progress bar."""
    p, rec, url = stage.params, launch.record, launch.url
    rec["server_info"] = client.server_info(url)
    rec["model_info"] = client.model_info(url)
    rec["metrics_start"] = counters(url, p.server.enable_metrics)
    warm = p.mtp.warmup_requests if any(r.wants_warmup for r in pending) else 0
    for i in range(warm):
        ask(stage, url, config, RequestSpec(f"warmup-{i}", 0, min(64, p.mtp.max_tokens)), launch=rec["launch"],
            warmup=True, text="Say hello in one short sentence.")
    for spec in progress(pending, f"{stage.name} {config.key}") if bar else pending:  # an ETA for the cell
        row = spec.send(stage, url, config, rec["launch"])
        rec["sent"] += 1
        rec["failed"] += row.get("status") != "ok"
    rec["metrics_end"] = counters(url, p.server.enable_metrics)


def rows_for(stage: Stage, config: ServerConfig, specs: list[RequestSpec]) -> list[dict[str, Any]]:
    """The recorded rows of ``specs`` on ``config`` (from this run's files only), in spec order.

    Raises:
        StageInputMissing: a request was never recorded (run the stage live or replay a run).
    """
    from ..core.errors import StageInputMissing

    have = recorded(stage.paths, config)
    missing = [s.key for s in specs if s.key not in have]
    if missing:
        raise StageInputMissing(f"{raw_path(stage.paths, config).name}: no record of {len(missing)} "
                                f"request(s), e.g. {missing[0]}")
    return [have[s.key] for s in specs]


# --- per-request numbers shared by 06 and 07 (serving/request_numbers.py) --------------------
from .request_numbers import compare_outputs, request_metrics  # noqa: E402, F401
