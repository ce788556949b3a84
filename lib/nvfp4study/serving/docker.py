"""``server.launcher: docker``: SGLang from a published image, with a local process's guarantees.

The launch is one attached ``docker run`` whose stdout/stderr (the container's output) go to the
run's log like a local server's::

    docker run --rm --name <prefix>-<pid>-<random> --gpus <gpus> --ipc=host --network host
        -v <checkpoint>:<checkpoint>:ro -v <patched file>:<image's file>:ro ...
        -v <study cache>/docker-flashinfer:/nvfp4study-flashinfer [-e K=V ...] [-e TZ=<host's>]
        -e FLASHINFER_WORKSPACE_BASE=/nvfp4study-flashinfer
        <server.docker.extra_args> <image> python3 -m sglang.launch_server <the local flags>

``python3 -m sglang.launch_server`` takes the same server flags as ``sglang serve``
(0.5.23 ``sglang/launch_server.py`` parses them with ``prepare_server_args``); the flags are the
tail of :func:`nvfp4study.serving.server.build_command`. ``--network host`` keeps
``server.host:server.port`` as they are, ``--ipc=host`` gives NCCL and the scheduler processes
the host's shared memory (SGLang's own ``docker run`` examples pass both).

The clamp patch: the image's SGLang files are never written. The released files of the image's
SGLang version (the wheel the study already unpacks under ``~/.cache/nvfp4study/src``) are copied
to ``work/`` of the run, put in the configuration's mode by the study's patcher
(:func:`nvfp4study.sglang.patch.switch_mode`) and mounted read-only over the image's copies, at
the package folder the image itself reports (:data:`IMAGE_PROBE`). Every file any mode touches is
mounted, so the container runs exactly the released files plus this configuration's patch. Before
the first mount the image's own copies are hashed in the image (:data:`IMAGE_FILES_PROBE`) and
compared with the wheel's (:func:`check_image_files`): an image whose files differ is refused
(``ImageFilesDiffer``), since its edits would be silently replaced.

Teardown: :class:`DockerServerProcess` runs ``docker stop -t <grace> <name>`` then
``docker rm -f <name>`` before stopping the ``docker run`` process group as a local server's; it
is registered like a local server, so ``atexit`` and every ``finally`` path stop the container.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import DockerUnavailable, ImageFilesDiffer
from ..core.params import Params
from .process import ServerProcess

#: Run inside the image (``--entrypoint python3``): its sglang version (package metadata) and the
#: folder holding the ``sglang`` package (found without importing it). Prints one JSON line.
IMAGE_PROBE = ("import importlib.metadata as m, importlib.util as u, json, os  # nvfp4study-image-probe\n"
               "s = u.find_spec('sglang')\n"
               "print(json.dumps({'version': m.version('sglang'), "
               "'root': os.path.dirname(os.path.dirname(s.origin)) if s else None}))")


#: Run inside the image: ``python3 -c CODE ROOT FILES_JSON`` prints ``{file: sha256 or null}`` of
#: each file (relative to ROOT, the folder holding ``sglang``) as the image holds it.
IMAGE_FILES_PROBE = ("import hashlib, json, os, sys  # nvfp4study-image-files\n"
                     "root, files = sys.argv[1], json.loads(sys.argv[2])\n"
                     "def h(p):\n"
                     "    try:\n"
                     "        return hashlib.sha256(open(p, 'rb').read()).hexdigest()\n"
                     "    except OSError:\n"
                     "        return None\n"
                     "print(json.dumps({f: h(os.path.join(root, f)) for f in files}))")


def docker_exe() -> str:
    """The ``docker`` CLI on PATH.

    Raises:
        DockerUnavailable: none on PATH.
    """
    exe = shutil.which("docker")
    if not exe:
        raise DockerUnavailable("server.launcher is docker but no 'docker' is on PATH (install Docker Engine)")
    return exe


def container_name(prefix: str) -> str:
    """A name no other launch uses: ``<prefix>-<our pid>-<8 random hex>``."""
    return f"{prefix}-{os.getpid()}-{os.urandom(4).hex()}"


def probe_prefix(params: Params) -> list[str]:
    """``docker run --rm --gpus G --entrypoint python3 IMAGE``: run ``-c CODE`` in the image."""
    d = params.server.docker
    if not d.image:
        raise DockerUnavailable("server.launcher is docker but server.docker.image is not set "
                                "(e.g. lmsysorg/sglang:v0.5.23)")
    return ["docker", "run", "--rm", "--gpus", d.gpus, "--entrypoint", "python3", d.image]


def image_sglang(params: Params, timeout_s: float = 300.0) -> dict[str, Any]:
    """The image's SGLang: ``{"version": "0.5.23", "root": "/path/holding/sglang"}``.

    Raises:
        DockerUnavailable: no docker / no image set, the container fails, prints no JSON, or
            exceeds ``timeout_s`` seconds.
    """
    docker_exe()
    cmd = probe_prefix(params) + ["-c", IMAGE_PROBE]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DockerUnavailable(f"{' '.join(cmd[:-2])}: {exc}") from None
    try:
        out = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        out = None
    if r.returncode != 0 or not isinstance(out, dict) or not out.get("root"):
        raise DockerUnavailable(f"image {params.server.docker.image!r} reports no sglang (exit {r.returncode}): "
                                f"{(r.stderr or r.stdout).strip()[-400:]}")
    return out


def mounted_files(version: str) -> list[str]:
    """The files (relative to the folder holding ``sglang``) a patched copy is mounted over:
    every file a GPU clamp mode or the deterministic edit touches for ``version``."""
    from ..sglang import patch as sglang_patch

    # the native MoE modes patch the CPU engine's path only; a GPU image gets the clamp and det files
    modes = [m for m in sglang_patch.modes_for(version) if m != "stock" and m not in sglang_patch.NATIVE_MODES]
    return sorted({e["path"] for m in modes for e in sglang_patch._files(version, m)})


def check_image_files(params: Params, version: str, image_root: str, timeout_s: float = 300.0) -> dict[str, str]:
    """Compare the image's copy of every :func:`mounted_files` file with the released
    ``sglang==version`` wheel's (sha256) before patched copies are mounted over them.

    Returns:
        ``{file: sha256}`` (equal in both).

    Raises:
        ImageFilesDiffer: a file differs or the image lacks it (each named with both digests).
        DockerUnavailable: the probe container fails or prints no JSON.
        SGLangSourceError: the wheel cannot be had.
    """
    import hashlib

    from ..sglang import source as sglang_source

    files = mounted_files(version)
    cmd = probe_prefix(params) + ["-c", IMAGE_FILES_PROBE, image_root, json.dumps(files)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        image = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, IndexError, json.JSONDecodeError) as exc:
        raise DockerUnavailable(f"image {params.server.docker.image!r}: hashing its SGLang files failed: {exc}") from None
    if not isinstance(image, dict):
        raise DockerUnavailable(f"image {params.server.docker.image!r}: hashing its SGLang files failed "
                                f"(exit {r.returncode}): {(r.stderr or r.stdout).strip()[-400:]}")
    released = sglang_source.unpack_wheel(version)
    wheel = {f: hashlib.sha256(released.file(f).read_bytes()).hexdigest() for f in files}
    bad = [f"{f}: image {image.get(f) or 'absent'}, wheel {wheel[f]}" for f in files if image.get(f) != wheel[f]]
    if bad:
        raise ImageFilesDiffer(
            f"image {params.server.docker.image!r} (sglang {version} at {image_root}): {len(bad)} of {len(files)} files "
            f"the study mounts patched copies over are not the released wheel's: {'; '.join(bad)}. Use an image "
            "with the released files, or sglang.apply_to_install=false to serve the image as found")
    return wheel


def patched_mounts(stage, config, version: str, image_root: str) -> tuple[list[tuple[str, str]], str]:
    """Patched copies of the clamp files for ``config`` and where they go in the image.

    Copies the released ``sglang==version`` files every patch mode touches (plus the package
    markers the patcher needs) from the unpacked wheel to ``work/sglang-docker-<mode>-det-<on|off>``,
    switches that copy to ``config.clamp`` (and the deterministic edit) with the study's patcher.

    Returns:
        ``([(host file, image file), ...], sentence)``.

    Raises:
        SGLangSourceError: the wheel cannot be had; UnknownPatchVersion / PatchError from the patcher.
    """
    from ..sglang import patch as sglang_patch
    from ..sglang import source as sglang_source

    released = sglang_source.unpack_wheel(version)
    files = mounted_files(version)
    dest = stage.paths.work(f"sglang-docker-{config.clamp}-det-{'on' if config.deterministic else 'off'}")
    if dest.exists():
        shutil.rmtree(dest)
    for rel in ["sglang/__init__.py", "sglang/version.py", "sglang/_version.py", *files]:
        src = released.file(rel)
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest / rel)
    (dest / "sglang/srt/layers/moe").mkdir(parents=True, exist_ok=True)
    tree = sglang_source.SGLangTree(root=dest, version=version, origin="path")
    st = sglang_patch.switch_mode(tree, config.clamp, det=bool(config.deterministic),
                                  state_file=stage.paths.data("sglang_patch_state"))
    mounts = [(str(dest / rel), f"{image_root.rstrip('/')}/{rel}") for rel in files]
    return mounts, (f"patched copies of SGLang {version}'s {len(files)} clamp files in {dest} (clamp mode "
                    f"{st['clamp_mode']!r}, MIN_DEEPGEMM_DIM edit {'on' if st['det'] else 'off'}) mounted "
                    f"read-only over the image's {image_root}; the image is not modified")


def docker_command(params: Params, serve_cmd: list[str], name: str, model_path: str,
                   mounts: list[tuple[str, str]]) -> list[str]:
    """The ``docker run`` argv (module docstring) around the flags of ``serve_cmd``
    (:func:`~nvfp4study.serving.server.build_command`, whose interpreter part is dropped)."""
    s, d = params.server, params.server.docker
    if not d.image:
        raise DockerUnavailable("server.docker.image is not set (e.g. lmsysorg/sglang:v0.5.23)")
    flags = serve_cmd[serve_cmd.index("serve") + 1:]
    model_root = model_mount(model_path)
    cmd = ["docker", "run", "--rm", "--name", name, "--gpus", d.gpus, "--ipc=host", "--network", "host",
           "-v", f"{model_root}:{model_root}:ro"]
    for host, inside in mounts:
        cmd += ["-v", f"{host}:{inside}:ro"]
    env = dict(s.env)
    if "TZ" not in env and (tz := host_timezone()):
        # SGLang stamps its log lines in the process's local time (logging's asctime,
        # srt/utils/common.py 2629-2637): the container keeps the host's zone, not the image's
        env["TZ"] = tz
    if "FLASHINFER_WORKSPACE_BASE" not in env:
        jit_host = flashinfer_jit_cache()
        cmd += ["-v", f"{jit_host}:{JIT_IN_CONTAINER}"]
        env["FLASHINFER_WORKSPACE_BASE"] = JIT_IN_CONTAINER
    for k, v in env.items():
        cmd += ["-e", f"{k}={v}"]
    return cmd + list(d.extra_args) + [d.image, "python3", "-m", "sglang.launch_server", *flags]


#: where the container's FlashInfer keeps its JIT builds: FlashInfer 0.7.2 builds under
#: ``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/<arch>`` (``flashinfer/jit/env.py``
#: 67-70, 391-396); a host folder is mounted there so the fused-MoE kernel compiled by the first
#: launch (tens of minutes) is reused by the next ``--rm`` containers instead of compiled again.
JIT_IN_CONTAINER = "/nvfp4study-flashinfer"


def flashinfer_jit_cache() -> Path:
    """The host folder mounted at :data:`JIT_IN_CONTAINER`: ``<study cache>/docker-flashinfer``
    (``$NVFP4STUDY_CACHE`` or ``~/.cache/nvfp4study``), made when missing so that docker does not
    make it root-owned."""
    from ..sglang.source import cache_dir

    folder = cache_dir() / "docker-flashinfer"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def model_mount(model_path: str) -> str:
    """The folder to mount for ``model_path``: for a Hub-cache snapshot
    (``.../models--<org>--<name>/snapshots/<commit>``, whose files are links into ``../../blobs``,
    huggingface_hub's cache layout) the repository folder that holds both, so the links resolve in
    the container; otherwise ``model_path`` itself."""
    p = Path(model_path)
    if p.parent.name == "snapshots" and p.parent.parent.name.startswith("models--"):
        return str(p.parent.parent)
    return model_path


def host_timezone() -> str | None:
    """This machine's time zone for the container's ``TZ``: ``$TZ``, else the zone
    ``/etc/localtime`` links to (``.../zoneinfo/<Area/City>``), else ``/etc/timezone``; None
    when none is known (the container then keeps the image's zone)."""
    if os.environ.get("TZ"):
        return os.environ["TZ"]
    link = Path("/etc/localtime")
    if link.is_symlink() and "zoneinfo/" in (target := os.readlink(link)):
        return target.split("zoneinfo/", 1)[1]
    f = Path("/etc/timezone")
    return (f.read_text().strip() or None) if f.is_file() else None


def _docker(args: list[str], timeout_s: float) -> subprocess.CompletedProcess | None:
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    return None


@dataclass
class DockerServerProcess(ServerProcess):
    """A :class:`ServerProcess` whose command is ``docker run --name container``: :meth:`stop`
    stops and removes the container first (the container's processes are the daemon's, not ours:
    signals to the ``docker run`` group do not reach them)."""

    container: str = ""
    subreaper: bool = False  # nothing of the container is ever re-parented to us

    def stop(self) -> None:
        """``docker stop -t grace``, ``docker rm -f``, then the local teardown. Idempotent."""
        if self.proc is not None and self.container:
            grace = max(1, int(round(self.grace_s)))
            _docker(["stop", "-t", str(grace), self.container], grace + 60)
            _docker(["rm", "-f", self.container], 60)
            # the attached ``docker run`` client exits on its own once its container is gone; a
            # signal sent before it notices would record a stop by us (-15) as its exit status
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        super().stop()
