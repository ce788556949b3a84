"""``nvfp4study serve``: start SGLang with the study's flags (local or docker launcher) and keep
it up until Ctrl-C; ``--dry-run`` prints the command."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import time
from pathlib import Path
from typing import Any

from ..core.errors import WrongInterpreter
from ..core.stage import Stage
from .process import process_for
from .server import build_command, card_config, serving
from .strategies import in_image


def main(argv: list[str]) -> int:
    """``nvfp4study serve``: start SGLang with the study's flags and keep it up until Ctrl-C."""
    from ..core.params import load_params
    from ..core.paths import RunPaths, ensure_writable, new_run_dir

    ap = argparse.ArgumentParser(
        prog="nvfp4study serve",
        description="Start SGLang with the card's flags from params; Ctrl-C stops its process group.",
        epilog="example: nvfp4study serve --params params/ling3-flash.yaml --depth 2")
    ap.add_argument("--params", default=None, help="params YAML (default params/default.yaml)")
    ap.add_argument("--depth", type=int, default=None, help="NEXTN depth k (0 = speculation off)")
    ap.add_argument("--clamp", default=None, help="clamp mode of the install (stock/none/exact)")
    ap.add_argument("--deterministic", action="store_true", help="add --enable-deterministic-inference")
    ap.add_argument("--run-dir", default=None, help="folder for the log (default: a new run folder)")
    ap.add_argument("-p", dest="overrides", action="append", default=[], help="key=value override")
    ap.add_argument("--dry-run", action="store_true", help="print the command and exit")
    a = ap.parse_args(argv)
    params = load_params(a.params, a.overrides)
    over: dict[str, Any] = {"deterministic": a.deterministic}
    if a.depth is not None:
        over["spec_depth"] = None if a.depth == 0 else a.depth
    if a.clamp:
        over["clamp"] = a.clamp
    config = card_config(params, **over)
    if a.dry_run:
        shown = params if params.server.python else params.model_copy(
            update={"server": params.server.model_copy(update={"python": "<server.python>"})})
        cmd = build_command(shown, config, model_path=params.server.model_path or "<model>")
        if in_image(params):  # the mounts of the patched files are made at launch
            from .docker import docker_command

            cmd = docker_command(params, cmd, "<container>", params.server.model_path or "<model>", [])
        print(" ".join(cmd))
        return 0
    if not params.server.python and not in_image(params):
        raise WrongInterpreter("server.python is not set: name the SGLang environment's interpreter "
                               "(e.g. -p server.python=/opt/envs/sglang/bin/python)")
    root = ensure_writable(Path(a.run_dir)) if a.run_dir else new_run_dir(params.profile, suffix="serve")
    stage = Stage(name="serve", params=params, paths=RunPaths(root))
    try:
        with serving(stage, config) as url:
            print(f"serving {config.key} at {url} (log in {root / 'logs'}); Ctrl-C to stop", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(1)
                    process_for(url).check_alive()
    finally:
        if not a.run_dir and not any(p.is_file() for p in root.rglob("*")):
            shutil.rmtree(root)  # a launch refused before anything was written leaves no folder
    return 0
