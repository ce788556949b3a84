"""A fake ``docker`` CLI for tests (test code only): ``make_docker(folder, python=...)`` writes
``folder/docker``; put ``folder`` first on PATH. State lives in ``folder/state``.

Implements what the study calls: ``info`` (``--format {{json .Runtimes}}`` too), ``image inspect
IMAGE``, ``run ... IMAGE python3 -m sglang.launch_server FLAGS`` (starts the fake SGLang
``python`` with ``-c <serve code> serve FLAGS`` in its own session, detached from this CLI like a
container is, with a clean environment; records its pid under ``--name``; stays attached until it
exits, its output on this CLI's stdout), ``run --rm --entrypoint python3 IMAGE -c CODE`` (the
image probe and the image-files probe, answered from the config; other code goes to the fake
interpreter), ``stop [-t N]
NAME`` and ``rm -f NAME``. Every call is appended to ``state/calls.jsonl``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SERVE_CODE = "import sys; from sglang.cli.main import main; sys.argv[0] = 'sglang'; sys.exit(main())"
VALUE_OPTS = {"--name", "--gpus", "--network", "-v", "-e", "--entrypoint"}


def make_docker(folder: Path, python: Path, images=("lmsysorg/sglang:v0.5.23",), version="0.5.23",
                root="/sgl-workspace/sglang/python", daemon=True, runtimes=("nvidia", "runc"),
                image_tree: Path | None = None) -> Path:
    """``image_tree``: a host folder standing for the image's ``root`` (its files are hashed for
    the image-files probe); None: the image holds the released wheel's files of ``version``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "state").mkdir(exist_ok=True)
    (folder / "state" / "config.json").write_text(json.dumps(
        {"python": str(python), "images": list(images), "version": version, "root": root,
         "daemon": daemon, "runtimes": list(runtimes), "image_tree": str(image_tree) if image_tree else None}))
    exe = folder / "docker"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} {folder / 'state'} \"$@\"\n")
    exe.chmod(0o755)
    return exe


def image_tree(cfg: dict) -> Path:
    """The host folder standing for the image's ``root``: ``image_tree``, else the released
    wheel of the image's version as the study unpacks it."""
    if cfg.get("image_tree"):
        return Path(cfg["image_tree"])
    from nvfp4study.sglang.source import unpack_wheel

    return unpack_wheel(cfg["version"]).root


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _kill(pid: int, grace: float) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        end = time.monotonic() + wait
        while _alive(pid) and time.monotonic() < end:
            time.sleep(0.05)
        if not _alive(pid):
            return


def main(state: Path, argv: list[str]) -> int:
    cfg = json.loads((state / "config.json").read_text())
    with open(state / "calls.jsonl", "a") as f:
        f.write(json.dumps(argv) + "\n")
    if not cfg["daemon"] and argv[:1] != ["--version"]:
        print("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?",
              file=sys.stderr)
        return 1
    cmd, rest = (argv[0] if argv else ""), argv[1:]
    if cmd == "info":
        print(json.dumps({r: {"path": r} for r in cfg["runtimes"]}) if "--format" in rest else "Server Version: fake")
        return 0
    if cmd == "image" and rest[:1] == ["inspect"]:
        ok = rest[-1] in cfg["images"]
        print("[{}]" if ok else f"Error: No such image: {rest[-1]}", file=sys.stdout if ok else sys.stderr)
        return 0 if ok else 1
    if cmd == "stop":
        name, grace = rest[-1], float(rest[rest.index("-t") + 1]) if "-t" in rest else 10.0
        rec = state / f"{name}.pid"
        if not rec.is_file():
            print(f"Error: No such container: {name}", file=sys.stderr)
            return 1
        _kill(int(rec.read_text()), grace)
        rec.unlink(missing_ok=True)  # --rm
        print(name)
        return 0
    if cmd == "rm":
        rec = state / f"{rest[-1]}.pid"
        if not rec.is_file():
            print(f"Error: No such container: {rest[-1]}", file=sys.stderr)
            return 1
        _kill(int(rec.read_text()), 0.0)
        rec.unlink(missing_ok=True)
        return 0
    if cmd != "run":
        print(f"fake docker: unsupported {argv}", file=sys.stderr)
        return 2
    opts, i = {}, 0
    while i < len(rest) and rest[i].startswith("-"):
        if rest[i] in VALUE_OPTS:
            opts.setdefault(rest[i], []).append(rest[i + 1])
            i += 2
        else:
            opts.setdefault(rest[i], []).append(True)
            i += 1
    image, tail = rest[i], rest[i + 1:]
    if image not in cfg["images"]:
        print(f"Unable to find image '{image}' locally", file=sys.stderr)
        return 125
    for m in opts.get("-v", []):  # a mount source must exist, as docker requires for -v files
        if not Path(m.split(":")[0]).exists():
            print(f"docker: invalid mount {m}", file=sys.stderr)
            return 125
    if opts.get("--entrypoint") == ["python3"]:
        if "nvfp4study-image-probe" in tail[1]:
            print(json.dumps({"version": cfg["version"], "root": cfg["root"]}))
            return 0
        if "nvfp4study-image-files" in tail[1]:  # the study's own code, run on the image's files
            root = str(image_tree(cfg)) if tail[2] == cfg["root"] else tail[2]
            return subprocess.run([sys.executable, "-c", tail[1], root, *tail[3:]]).returncode
        return subprocess.run([cfg["python"], *tail]).returncode
    if tail[:3] != ["python3", "-m", "sglang.launch_server"]:
        print(f"fake docker: unsupported command {tail}", file=sys.stderr)
        return 2
    name = opts["--name"][0]
    if (state / f"{name}.pid").exists():
        print(f"docker: Conflict. The container name \"/{name}\" is already in use", file=sys.stderr)
        return 125
    env = {"PATH": os.environ.get("PATH", "")}
    if os.environ.get("NVFP4STUDY_TEST_SESSION"):
        env["NVFP4STUDY_TEST_SESSION"] = os.environ["NVFP4STUDY_TEST_SESSION"]
    r, w = os.pipe()
    if os.fork() == 0:  # the "daemon": a grandchild in its own session, re-parented away from us
        os.close(r)
        p = subprocess.Popen([cfg["python"], "-c", SERVE_CODE, "serve", *tail[3:]], env=env,
                             start_new_session=True, stdin=subprocess.DEVNULL)
        os.write(w, str(p.pid).encode())
        os._exit(0)
    os.close(w)
    pid = int(os.read(r, 64).decode())
    os.wait()
    (state / f"{name}.pid").write_text(str(pid))
    while _alive(pid):  # attached: return when the "container" exits
        time.sleep(0.05)
    (state / f"{name}.pid").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2:]))
