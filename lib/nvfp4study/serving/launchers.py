"""How a server is started: one :class:`Launcher` per kind of launch, chosen once from params by
:func:`launcher_for`; :func:`nvfp4study.serving.server.serving` does the rest (checks, command,
health wait, teardown, lifecycle row) the same way for each.

- :class:`LocalLauncher`: ``server.python`` as a local process group; the install it imports
  (or ``sglang.path``) is switched to the configuration's clamp mode for the launch.
- :class:`CpuEngineLauncher`: the local launcher on the CPU engine: the run's overlay of the
  install is switched instead (first on the server's ``PYTHONPATH``), a missing environment names
  its build command, and the record names the engine and its environment.
- :class:`DockerLauncher`: ``docker run`` of ``server.docker.image``
  (:mod:`~nvfp4study.serving.docker`), patched copies of the clamp files mounted over the image's.
"""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..core.errors import WrongInterpreter
from ..core.params import Params
from ..core.stage import Stage
from . import docker as dk
from .launch_env import (
    engine_description,
    install_overlay,
    server_env,
    server_python,
)
from .process import ServerProcess, check_interpreter
from .strategies import strategy_for

if TYPE_CHECKING:
    from ..sglang.source import SGLangTree

#: The signal a local launch's first process (SGLang's HTTP server and tokenizer manager) gets
#: when the study stops it; SIGKILL to the whole group follows after ``server.shutdown_grace_s``.
#: A signal sent to the group reaches the scheduler and the detokenizer too: their exit looks like
#: a crash to SGLang's subprocess watchdog (``srt/utils/watchdog.py`` 219), whose handler sleeps
#: 5 s "to let GPU activity settle" before crash diagnostics (``srt/managers/tokenizer_manager.py``
#: 3483), and SIGTERM itself is only polled every 5 s (``sigterm_watchdog``, 3508-3510). SIGINT to
#: that process alone is uvicorn's graceful stop, after which SGLang kills its own children
#: (``kill_process_tree``): the group is gone in under a second instead of 5-7 s.
SGLANG_STOP_SIGNAL = signal.SIGINT


class LaunchChoice(Protocol):
    """What a launcher reads of the configuration: a
    :class:`~nvfp4study.serving.server.ServerConfig` (not imported: that module imports this one)."""

    @property
    def clamp(self) -> str: ...

    @property
    def deterministic(self) -> bool: ...

    @property
    def native(self) -> tuple[tuple[str, str], ...]: ...


class Launcher(Protocol):
    """One way of starting a server. :meth:`sglang_version` runs first (before any GPU or port
    check), :meth:`process` once the command is built."""

    def sglang_version(self, params: Params) -> str:
        """The sglang version the launch will run; raises when it cannot run the params' one."""
        ...

    def process(self, stage: Stage, params: Params, config: LaunchChoice, cmd: list[str], model: str,
                log_path: Path, install: contextlib.ExitStack) -> tuple[ServerProcess, dict[str, Any]]:
        """The server process for ``cmd`` (not started) and this launcher's entries of the launch
        record (``install`` first). Install changes are entered on ``install``, which closes after
        the server has stopped."""
        ...


def launcher_for(params: Params) -> Launcher:
    """The launcher of the run's serving strategy (:func:`~nvfp4study.serving.strategies.strategy_for`;
    a fresh one per launch: the docker one keeps its image probe)."""
    return LAUNCHERS[strategy_for(params).launch]()


class LocalLauncher:
    """``server.python`` as a local process group (:class:`ServerProcess`)."""

    def sglang_version(self, params: Params) -> str:
        """``server.python``'s sglang version (:func:`check_interpreter`)."""
        if not params.server.python:
            raise WrongInterpreter("server.python is not set: name the SGLang environment's interpreter")
        return check_interpreter(server_python(params),
                                 params.sglang.version if params.server.check_version else None)

    def install_tree(self, stage: Stage) -> SGLangTree:
        """The install the server imports: ``sglang.path`` when ``sglang.source`` is "path", else
        the one ``server.python`` imports."""
        from ..sglang import source as sglang_source

        p = stage.params
        if p.sglang.source == "path" and p.sglang.path:
            return sglang_source.open_tree(p.sglang.path)
        return sglang_source.installed_tree(server_python(p))

    def overlay(self, stage: Stage) -> Path | None:
        """A folder put first on the server's ``PYTHONPATH`` (none: the install is served as is)."""
        return None

    def native_modes(self, stage: Stage, config: LaunchChoice) -> dict[str, str] | None:
        """The native MoE patch axes to set for the launch (:data:`nvfp4study.sglang.patch.NATIVE_AXES`);
        None: left as found (a GPU install)."""
        return None

    def install_mode(self, stack: contextlib.ExitStack, stage: Stage, config: LaunchChoice) -> str:
        """Put the serving install in ``config.clamp`` mode (and the ``MIN_DEEPGEMM_DIM`` edit for
        deterministic mode) for the server's lifetime, when ``sglang.apply_to_install`` is true.

        Uses the SGLang patcher's :func:`nvfp4study.sglang.patch.serving_mode` entered on
        ``stack``: the install (:meth:`install_tree`) returns to its previous state when the stack
        closes, after the server has stopped; the state is recorded in
        ``data/sglang_patch_state.json``. Returns a sentence saying what was done (the launch's
        clamp log lines are the evidence).
        """
        if not stage.params.sglang.apply_to_install:
            return (f"install served as found (sglang.apply_to_install is false): clamp mode "
                    f"{config.clamp!r} not enforced; the clamp log lines show what ran")
        from ..sglang import patch as sglang_patch

        tree = self.install_tree(stage)
        native = self.native_modes(stage, config)
        st = stack.enter_context(sglang_patch.serving_mode(
            tree, config.clamp, det=True if config.deterministic else None,
            state_file=stage.paths.data("sglang_patch_state"), native=native))
        return (f"install {tree.root} (SGLang {tree.version}) in clamp mode {st['clamp_mode']!r}, "
                f"MIN_DEEPGEMM_DIM edit {'on' if st['det'] else 'off'}"
                + (f", native MoE {st['native']}" if native else "") + ", for this launch; restored afterwards")

    def process(self, stage: Stage, params: Params, config: LaunchChoice, cmd: list[str], model: str,
                log_path: Path, install: contextlib.ExitStack) -> tuple[ServerProcess, dict[str, Any]]:
        """A local :class:`ServerProcess`, stopped by :data:`SGLANG_STOP_SIGNAL` to its leader."""
        s = params.server
        entries: dict[str, Any] = {"install": self.install_mode(install, stage, config)}
        sp = ServerProcess(cmd, log_path, s.host, s.port, env=server_env(stage, self.overlay(stage)),
                           grace_s=s.shutdown_grace_s, stop_signal=SGLANG_STOP_SIGNAL,
                           stop_leader_only=True)
        return sp, entries


class CpuEngineLauncher(LocalLauncher):
    """The local launcher on the CPU engine (``server.engine``): the run's overlay of the install
    is what gets patched and served, so the shared environment's files are never edited."""

    def sglang_version(self, params: Params) -> str:
        """As the local launcher's; a missing environment names its build command."""
        try:
            return super().sglang_version(params)
        except WrongInterpreter as exc:
            if not params.server.python:
                raise
            raise WrongInterpreter(f"{exc}; the CPU engine's environment is built by `make sglang-env`") from None

    def install_tree(self, stage: Stage) -> SGLangTree:
        """The run's overlay of the install (:func:`install_overlay`)."""
        from ..sglang import source as sglang_source

        return sglang_source.open_tree(install_overlay(stage))

    def overlay(self, stage: Stage) -> Path | None:
        """The overlay, when the launch patched it (``sglang.apply_to_install``)."""
        return stage.paths.work("sglang-install") if stage.params.sglang.apply_to_install else None

    def native_modes(self, stage: Stage, config: LaunchChoice) -> dict[str, str]:
        """``server.cpu.moe_clamp`` and ``server.cpu.routed_scaling`` (native MoE patches on the
        overlay; "released" = none), each overridden by the launch's own ``config.native``
        (the trained stand-in's arms set them per launch)."""
        cpu = stage.params.server.cpu
        return {"moe_clamp": cpu.moe_clamp, "routed_scaling": cpu.routed_scaling, **dict(config.native)}

    def process(self, stage: Stage, params: Params, config: LaunchChoice, cmd: list[str], model: str,
                log_path: Path, install: contextlib.ExitStack) -> tuple[ServerProcess, dict[str, Any]]:
        """The local process; the record adds the engine and its environment (less ``PYTHONPATH``)
        and, when the overlay carries a native clamp patch, the audit's reading of the patched
        overlay's native MoE path (``native_moe_audit``: ``fused-moe-native``'s row)."""
        sp, entries = super().process(stage, params, config, cmd, model, log_path, install)
        if params.server.cpu.fork_server:  # forked from a preloaded interpreter (forkserver.py)
            from ..sglang.source import cache_dir

            sp.preloaded = cache_dir() / "forkserver"
        if params.sglang.apply_to_install:
            entries["native_modes"] = self.native_modes(stage, config)
        if params.sglang.apply_to_install and self.native_modes(stage, config)["moe_clamp"] != "released":
            from ..sglang.audit import audit_tree

            (row,) = audit_tree(self.install_tree(stage), ["fused-moe-native"])
            entries["native_moe_audit"] = row.as_json()
        entries["engine"] = engine_description(params)
        entries["env"] = {k: v for k, v in sp.env.items() if k != "PYTHONPATH"}
        return sp, entries


class DockerLauncher:
    """``server.launcher: docker``: the image's SGLang in a container
    (:class:`~nvfp4study.serving.docker.DockerServerProcess`)."""

    def __init__(self) -> None:
        self.image: dict[str, Any] | None = None  # the image's probe (version, package folder)
        self.files_checked: dict[str, str] | None = None  # the image's files as the wheel's (sha256)

    def sglang_version(self, params: Params) -> str:
        """The image's sglang version (probed once; its package folder is kept for the mounts)."""
        self.image = dk.image_sglang(params)
        version = self.image["version"]
        if params.server.check_version and version != params.sglang.version:
            raise dk.DockerUnavailable(f"image {params.server.docker.image!r} has sglang {version}, the params "
                                       f"want {params.sglang.version} (set sglang.version or "
                                       f"server.check_version=false)")
        return version

    def process(self, stage: Stage, params: Params, config: LaunchChoice, cmd: list[str], model: str,
                log_path: Path, install: contextlib.ExitStack) -> tuple[ServerProcess, dict[str, Any]]:
        """``docker run`` around ``cmd``'s flags; the image itself is never modified."""
        s = params.server
        image = self.image if self.image is not None else dk.image_sglang(params)
        name = dk.container_name(s.docker.container_name_prefix)
        if params.sglang.apply_to_install and self.files_checked is None:  # once per launcher
            self.files_checked = dk.check_image_files(params, image["version"], image["root"])
        mounts, note = (dk.patched_mounts(stage, config, image["version"], image["root"])
                        if params.sglang.apply_to_install else
                        ([], f"image {s.docker.image} served as found (sglang.apply_to_install "
                             f"is false): clamp mode {config.clamp!r} not enforced"))
        if mounts:
            note += f"; the image's own {len(self.files_checked or {})} files matched the released wheel's (sha256) first"
        sp = dk.DockerServerProcess(dk.docker_command(params, cmd, name, model, mounts), log_path,
                                    s.host, s.port, grace_s=s.shutdown_grace_s, container=name)
        return sp, {"install": note, "container": name, "image": s.docker.image}


#: the launcher classes the serving strategies name (:attr:`ServingStrategy.launch`).
LAUNCHERS: dict[str, type] = {"local": LocalLauncher, "cpu-engine": CpuEngineLauncher, "docker": DockerLauncher}
