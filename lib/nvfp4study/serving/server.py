"""SGLang server lifecycle: the ``sglang serve`` command, launch, health wait, clean shutdown.

The command is the model card's (``--tp-size 1 --ep-size 1 --mem-fraction-static 0.75
--context-length 32768 --max-running-requests 1 --chunked-prefill-size 2048
--disable-shared-experts-fusion --tool-call-parser glm45 --speculative-algorithm NEXTN
--speculative-num-steps 2 --speculative-eagle-topk 1 --speculative-num-draft-tokens 3``) built
from params, plus ``--enable-metrics`` and, per configuration, ``--enable-deterministic-inference``.
Every flag is defined in SGLang 0.5.23 (:data:`~nvfp4study.sglang.flags.FLAG_SOURCES` gives file
and line; :func:`command_table` and the tests re-read them from the released wheel).

It runs as ``<server.python> -c <SERVE_CODE> serve --model-path ...``: ``sglang serve`` is the
console script ``sglang = sglang.cli.main:main`` (``sglang-0.5.23.dist-info/entry_points.txt``);
``sglang/cli/main.py`` has no ``__main__`` guard, so ``python -m sglang.cli.main`` would do
nothing, and ``-c`` runs the same ``main()`` the console script runs, with the interpreter
named in params.

:func:`serving` starts the server in its own session/process group (``start_new_session``),
writes its output to ``logs/`` of the run, waits for ``GET /health_generate`` to answer 200
(it answers 503 while starting: ``entrypoints/http_server.py`` 721-736), detects an early exit,
and always terminates the whole process group (the launcher's stop signal, then SIGKILL after a
grace period) on normal exit, on exceptions and on KeyboardInterrupt; an ``atexit`` hook is the last resort
(the process itself: :mod:`nvfp4study.serving.process`). How the process is started (a local
interpreter, the CPU engine's, or ``docker run``) is a launcher of :mod:`nvfp4study.serving.launchers`,
chosen once from params.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ..core.errors import NoCapableGPU, StageInputMissing, WrongInterpreter
from ..core.params import REPO_ROOT, Params  # noqa: F401  (REPO_ROOT: tests)
from ..core.stage import Stage
from ..sglang.flags import FLAG_SOURCES, cached_wheel, sglang_cli_flags  # noqa: F401
from .gpu_probe import (  # noqa: F401  (re-exported)
    GPU_PROBE,
    NVFP4_CAPABILITY_MAJORS,
    card_refusal,
    gpu_capability,
    gpu_info,
    gpu_refusal,
    no_gpu_device,
    nvfp4_w4a4_supported,
    probe_python,
)
from .launch_env import (  # noqa: F401  (re-exported: stages and tests name them here)
    CONTROL_LABELS,
    LIFECYCLE_STEM,
    PROBE_LABELS,
    STANDIN_DRAFTS,
    STANDIN_NOTE,
    engine_description,
    install_overlay,
    lifecycle,
    lifecycle_row,
    probe_checkpoint,
    process_tree,
    server_env,
    server_python,
    standin_path,
)
from .launchers import SGLANG_STOP_SIGNAL, launcher_for  # noqa: F401  (SGLANG_STOP_SIGNAL: re-exported)
from .process import (  # noqa: F401
    VERSION_PROBE,
    ServerProcess,
    check_interpreter,
    check_port_free,
    log_tail,
    process_for,
)
from .strategies import serves_standin

# ``sglang serve`` == console script ``sglang = sglang.cli.main:main`` (entry_points.txt).
SERVE_CODE = "import sys; from sglang.cli.main import main; sys.argv[0] = 'sglang'; sys.exit(main())"



# --- configurations --------------------------------------------------------------------------
@dataclass(frozen=True)
class ServerConfig:
    """One distinct server launch. Measurements are grouped by this so each launches once.

    Attributes:
        clamp: clamp mode of the serving install (the patch modes of :mod:`nvfp4study.sglang.patch`: stock / none / exact).
        spec_depth: NEXTN draft depth k (``--speculative-num-steps k``); ``None`` = speculation off.
        deterministic: add ``--enable-deterministic-inference``.
        model_path: served checkpoint; ``None`` = ``server.model_path`` or the run's quantized one.
        model_label: a short name for the checkpoint in file names ("study", "broken-draft").
        tp_size, ep_size: overrides of ``server.tp_size``/``ep_size`` (the upstream 4-GPU reference).
        max_running_requests: ``server.max_running_requests`` override (``corruption.concurrency``).
        native: CPU engine only: native MoE patch axes for this launch, ``(("moe_clamp", "exact"),)``,
            over ``server.cpu.moe_clamp`` / ``routed_scaling`` (:data:`nvfp4study.sglang.patch.NATIVE_AXES`).
        reasoning_parser: ``--reasoning-parser`` override of ``server.reasoning_parser`` (05's
            reasoning-parser probe); tag ``parser``.
        instance: a second launch of an otherwise equal configuration, by name (05's null control
            "again": the same model launched again); tag ``instance``.

    The last two are left out of :meth:`to_dict` while unset, so records of configurations
    without them read as before they existed.
    """

    clamp: str = "exact"
    spec_depth: int | None = 2
    deterministic: bool = False
    model_path: str | None = None
    model_label: str = "study"
    tp_size: int | None = None
    ep_size: int | None = None
    max_running_requests: int | None = None
    native: tuple[tuple[str, str], ...] = ()
    reasoning_parser: str | None = None
    instance: str = ""

    @property
    def tags(self) -> dict[str, str]:
        """Configuration as ``k=v`` tags for file names (``paths.data(stem, ext, **tags)``)."""
        t = {"clamp": self.clamp, "spec": "off" if self.spec_depth is None else str(self.spec_depth),
             "det": "on" if self.deterministic else "off"}
        if self.model_label != "study":
            t["model"] = self.model_label
        if self.tp_size not in (None, 1):
            t["tp"] = str(self.tp_size)
        if self.ep_size not in (None, 1):
            t["ep"] = str(self.ep_size)
        if self.max_running_requests is not None:
            t["mrr"] = str(self.max_running_requests)
        t.update({k.replace("_", "-"): v for k, v in self.native})
        if self.reasoning_parser:
            t["parser"] = self.reasoning_parser
        if self.instance:
            t["instance"] = self.instance
        return t

    @property
    def key(self) -> str:
        """``clamp=exact-spec=2-det=off``: the configuration's name in tables and files."""
        return "-".join(f"{k}={v}" for k, v in self.tags.items())

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict; ``reasoning_parser`` and ``instance`` only when set."""
        d = asdict(self)
        for k in ("reasoning_parser", "instance"):
            if not d[k]:
                del d[k]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ServerConfig:
        kw = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        if "native" in kw:  # JSON gives lists
            kw["native"] = tuple(tuple(x) for x in kw["native"])
        return cls(**kw)


def card_config(params: Params, **overrides: Any) -> ServerConfig:
    """The card's serving configuration from params (clamp ``server.clamp_mode``, depth
    ``server.speculative.num_steps``, or off when ``speculative.algorithm`` is null)."""
    spec = params.server.speculative
    base = ServerConfig(clamp=params.server.clamp_mode,
                        spec_depth=spec.num_steps if spec.algorithm else None)
    return replace(base, **overrides)


# --- the command -----------------------------------------------------------------------------
def _config_flags(params: Params, config: ServerConfig) -> list[str]:
    s = params.server
    flags: list[str] = []
    if config.spec_depth is not None:
        k = config.spec_depth
        if k < 1:
            raise ValueError(f"spec_depth must be >= 1 or None, got {k}")
        spec = s.speculative
        # depth k: k draft steps; with top-k 1 the verify pass checks k+1 tokens (the card's
        # k=2 -> 3 draft tokens). The params' own triple is used as given at its own depth.
        draft = spec.num_draft_tokens if k == spec.num_steps else k * spec.eagle_topk + 1
        flags += ["--speculative-algorithm", spec.algorithm or "NEXTN",
                  "--speculative-num-steps", str(k),
                  "--speculative-eagle-topk", str(spec.eagle_topk),
                  "--speculative-num-draft-tokens", str(draft)]
    if config.deterministic:
        flags.append("--enable-deterministic-inference")
    return flags


def num_draft_tokens(params: Params, config: ServerConfig) -> int | None:
    """``--speculative-num-draft-tokens`` of a configuration (None when speculation is off)."""
    flags = _config_flags(params, config)
    return int(flags[flags.index("--speculative-num-draft-tokens") + 1]) if config.spec_depth else None


def build_command(params: Params, config: ServerConfig, model_path: str | None = None) -> list[str]:
    """The argv that launches SGLang for ``config``: ``[python, -c, SERVE_CODE, serve, ...]``.

    Args:
        params: study params (``server`` section: interpreter, host/port, the card's flags).
        config: the configuration (depth, deterministic mode, tp/ep overrides, model).
        model_path: the checkpoint; default ``config.model_path`` or ``server.model_path``.

    Returns:
        The argument list (no shell). Flags and their 0.5.23 definitions: :data:`FLAG_SOURCES`.
        With ``server.engine: cpu`` the CPU engine's flags
        (:func:`nvfp4study.serving.cpu_engine.engine_flags`) follow the card's, before
        ``server.extra_args``; nothing else differs.

    Raises:
        WrongInterpreter: ``server.python`` is not set.
        StageInputMissing: no model path anywhere.
    """
    s = params.server
    if not s.python:
        raise WrongInterpreter("server.python is not set: name the SGLang environment's interpreter "
                               "(e.g. -p server.python=/opt/envs/sglang/bin/python)")
    path = model_path or config.model_path or s.model_path
    if not path:
        raise StageInputMissing("no model path: set server.model_path or run 01_quantize first")
    cmd = [server_python(params) or s.python, "-c", SERVE_CODE, "serve", "--model-path", str(path)]
    if s.trust_remote_code:
        cmd.append("--trust-remote-code")
    cmd += ["--host", s.host, "--port", str(s.port),
            "--tp-size", str(config.tp_size or s.tp_size), "--ep-size", str(config.ep_size or s.ep_size),
            "--mem-fraction-static", str(s.mem_fraction_static),
            "--context-length", str(s.context_length),
            "--max-running-requests", str(config.max_running_requests or s.max_running_requests),
            "--chunked-prefill-size", str(s.chunked_prefill_size)]
    if s.disable_shared_experts_fusion:
        cmd.append("--disable-shared-experts-fusion")
    if s.tool_call_parser:
        cmd += ["--tool-call-parser", s.tool_call_parser]
    if config.reasoning_parser or s.reasoning_parser:
        cmd += ["--reasoning-parser", config.reasoning_parser or s.reasoning_parser]
    cmd += _config_flags(params, config)
    if s.enable_metrics:
        cmd.append("--enable-metrics")
    if serves_standin(params):
        from . import cpu_engine

        cmd += _new_flags(cmd, cpu_engine.engine_flags(config.spec_depth))
    cmd += list(s.extra_args)
    return cmd


def _new_flags(cmd: list[str], extra: list[str]) -> list[str]:
    """``extra`` less the switches (flags without a value, e.g. ``--enable-metrics``) ``cmd``
    already has; flags with values are kept as given (the card's flags come first)."""
    out = []
    for i, a in enumerate(extra):
        switch = a.startswith("--") and (i + 1 == len(extra) or extra[i + 1].startswith("--"))
        if not (switch and a in cmd):
            out.append(a)
    return out


def command_flags(cmd: list[str]) -> list[str]:
    """The ``--flags`` of a command built by :func:`build_command` (after ``serve``)."""
    tail = cmd[cmd.index("serve") + 1:] if "serve" in cmd else cmd
    return [a.split("=", 1)[0] for a in tail if a.startswith("--")]


def command_table(params: Params, config: ServerConfig | None = None):
    """The launch command flag by flag, with where SGLang defines each flag.

    The "defined in" column is re-read from the cached wheel of ``sglang.version`` when it is
    there (else it shows :data:`FLAG_SOURCES`, marked "(recorded)"). Needs no GPU.
    """
    import pandas as pd

    config = config or card_config(params)
    p = params if params.server.python else params.model_copy(
        update={"server": params.server.model_copy(update={"python": "<server.python>"})})
    cmd = build_command(p, config, model_path=(config.model_path or p.server.model_path or "<model>"))
    wheel = cached_wheel(params.sglang.version)
    live = sglang_cli_flags(wheel) if wheel else {}
    rows, tail = [], cmd[cmd.index("serve") + 1:]
    for i, a in enumerate(tail):
        if not a.startswith("--"):
            continue
        value = tail[i + 1] if i + 1 < len(tail) and not tail[i + 1].startswith("--") else ""
        where = live.get(a, "NOT DEFINED") if wheel else FLAG_SOURCES.get(a, "?") + " (recorded)"
        rows.append({"flag": a, "value": value, f"defined in sglang {params.sglang.version}": where})
    return pd.DataFrame(rows)


# --- the process -----------------------------------------------------------------------------
def _next_log(paths, config: ServerConfig) -> Path:
    path = paths.log(f"sglang-{config.key}.log")
    n = 1
    while path.exists():
        n += 1
        path = paths.log(f"sglang-{config.key}-{n}.log")
    return path


def served_model_path(stage: Stage, config: ServerConfig) -> str:
    """The checkpoint to serve: ``config.model_path``, ``server.model_path``, on the CPU engine
    the run's stand-in (:func:`standin_path`), else the quantized checkpoint 01 recorded in
    ``data/quantize.json`` of the run (its ``quantized`` key, as ``stages/s01_quantize.run_quantize``
    writes it).

    Raises:
        StageInputMissing: none of them is available.
    """
    if config.model_path or stage.params.server.model_path:
        return str(config.model_path or stage.params.server.model_path)
    if serves_standin(stage.params):
        return str(standin_path(stage, config.model_label))
    q = stage.paths.data("quantize")
    if q.is_file():
        data = json.loads(q.read_text())
        for k in ("quantized", "serving_checkpoint", "output", "checkpoint", "quantized_path", "path"):
            if isinstance(data.get(k), str):
                return data[k]
    raise StageInputMissing(f"no model to serve: set server.model_path or run 01_quantize ({q} missing)")


#: ports handed to launches of this process that are still running: a launch that picks a free
#: port while another one is still importing SGLang (not yet bound) must not pick the same one.
_PORTS_HELD: set[tuple[str, int]] = set()


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (``/proc/sys/net/ipv4/ip_local_port_range``; Linux's
    default 32768-60999 where it cannot be read)."""
    try:
        lo, hi = (int(x) for x in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str) -> int:
    """A TCP port nothing listens on at ``host`` now, below the kernel's ephemeral range, and none
    a running launch of this process holds.

    Below the ephemeral range because a launch binds its port only after SGLang has imported
    (seconds): a port the kernel handed out for port 0 and took back could meanwhile be handed to
    any socket bound to port 0, such as another loading server's gloo connections ("address
    already in use", then a health timeout; seen with several CPU launches loading at once).
    Falls back to the kernel's choice when no port below the range is free.
    """
    import random
    import socket

    lo = min(_ephemeral_range()[0], 65536)
    candidates = random.Random().sample(range(10000, lo), min(200, max(0, lo - 10000)))
    for port in [*candidates, 0]:
        if (host, port) in _PORTS_HELD:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            port = int(sock.getsockname()[1])
        if (host, port) not in _PORTS_HELD:
            return port
    raise OSError(f"no free TCP port at {host}")


@dataclass
class StartedLaunch:
    """A started SGLang server of :func:`launched`: its process and launch record (load time and
    process tree filled in by :meth:`wait_healthy`)."""

    process: ServerProcess
    record: dict[str, Any]
    timeout_s: float
    poll_s: float

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return self.process.base_url

    def wait_healthy(self) -> str:
        """Wait for ``/health_generate`` (``record["load_s"]``: seconds from the process start);
        returns :attr:`url`.

        Raises:
            ServerExitedDuringLoad, HealthTimeout: as :meth:`ServerProcess.wait_healthy`.
        """
        self.record["load_s"] = round(self.process.wait_healthy(self.timeout_s, self.poll_s), 3)
        self.record["healthy_at"] = round(time.time(), 3)
        self.record["process_tree"] = process_tree(self.process)
        return self.url


@contextlib.contextmanager
def serving(stage: Stage, config: ServerConfig, *, startup_timeout_s: float | None = None,
            launch_record: dict | None = None) -> Iterator[str]:
    """Run an SGLang server for ``config`` and yield its base URL once healthy; always stop it
    afterwards (:func:`launched`, then :meth:`StartedLaunch.wait_healthy`).

    Args:
        stage: the :class:`~nvfp4study.core.stage.Stage` (params, run paths; log -> ``logs/``).
        config: the configuration to launch.
        startup_timeout_s: default ``server.startup_timeout_s``.
        launch_record: if given, filled with the command, log path, load time (s from launch to
            a healthy ``/health_generate``), the interpreter's sglang version and GPU.

    Yields:
        ``http://host:port``.

    Raises:
        the errors of :func:`launched` and of :meth:`StartedLaunch.wait_healthy`.
    """
    with launched(stage, config, startup_timeout_s=startup_timeout_s, launch_record=launch_record) as launch:
        yield launch.wait_healthy()


@contextlib.contextmanager
def launched(stage: Stage, config: ServerConfig, *, startup_timeout_s: float | None = None,
             launch_record: dict | None = None) -> Iterator[StartedLaunch]:
    """Start an SGLang server for ``config`` and yield its :class:`StartedLaunch` without waiting for it
    to load (several can load at once: :func:`nvfp4study.serving.measure.collect`); always stop
    it afterwards, then restore the install.

    Launches entered one inside another must serve one install state (the same clamp mode and
    deterministic edit): each one's install change is undone when it exits, innermost first.

    Raises:
        WrongInterpreter, NoCapableGPU, PortInUse, StageInputMissing: before launch.
        the patcher's errors (``PatchConflict``, ``PatchTargetReadOnly``, ...) when
            ``sglang.apply_to_install`` is true and the install cannot be switched.
        ServerDied: on leaving the block, if the server exited while it was in use.
    """
    params: Params = stage.params
    s = params.server
    launcher = launcher_for(params)
    version = launcher.sglang_version(params)
    cpu_only = serves_standin(params) and no_gpu_device()  # nothing to probe
    gpu = None if cpu_only else gpu_info(probe_python(params))
    if s.require_gpu and not nvfp4_w4a4_supported(None if gpu is None else gpu["capability"]):
        raise NoCapableGPU(gpu_refusal(params) or "needs an NVFP4-capable GPU")
    if s.port == 0:  # a free port chosen now (a shared machine: no fixed port to collide on)
        s = s.model_copy(update={"port": free_port(s.host)})
        params = params.model_copy(update={"server": s})
    check_port_free(s.host, s.port)
    model = served_model_path(stage, config)
    p = params if s.python else params.model_copy(
        update={"server": s.model_copy(update={"python": "python3"})})  # docker: no local interpreter
    cmd = build_command(p, config, model_path=model)
    log_path = _next_log(stage.paths, config)
    rec = launch_record if launch_record is not None else {}
    rec.update(config=config.to_dict(), config_key=config.key, launcher=s.launcher,
               log=str(log_path.relative_to(stage.run_dir)), sglang_version=version, gpu=gpu,
               model_path=model, port=s.port)
    _PORTS_HELD.add((s.host, s.port))
    try:
        with contextlib.ExitStack() as install:  # closes (restores the install) after sp.stop()
            sp, entries = launcher.process(stage, params, config, cmd, model, log_path, install)
            rec.update(entries)
            rec["command"] = sp.command
            try:
                sp.start()
                rec["started_at"] = round(time.time(), 3)  # epoch s: overlapping loads show here
                rec["started"] = sp.started  # exec, or forked by the fork server
                rec["marker"] = sp.marker  # in each of its processes' environment (NVFP4STUDY_SERVER)
                yield StartedLaunch(sp, rec, startup_timeout_s or s.startup_timeout_s, s.health_poll_s)
                sp.check_alive()
            finally:
                sp.stop()
                rec["returncode"] = sp.returncode
                rec["left_after_stop"] = process_tree(sp)
                lifecycle_row(stage, rec)
    finally:
        _PORTS_HELD.discard((s.host, s.port))
