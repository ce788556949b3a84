"""``make workstation-envs``: the two environments the real study needs, and the params overlay
that names their interpreters.

Creates (or reuses) two virtual environments, installs the pinned recipe of each from ``envs/``
(``quantize.txt``: the study's llmcompressor 0.13.0 / compressed-tensors 0.18.0, or with
``--card-quantizer`` ``quantize-card.txt``: the card's 0.12.0.1 / 0.17.1 with torch<=2.12;
``sglang.txt``: sglang 0.5.23 with its own pins), then writes ``params/local.yaml``
(gitignored; :data:`nvfp4study.core.params.LOCAL_OVERLAY`) with ``quantize.python`` and
``server.python``. :func:`nvfp4study.core.params.load_params` merges that overlay over any params
file, so ``nvfp4study run --params params/ling3-flash.yaml`` uses the new interpreters without an
edit of the profile.

``python -m nvfp4study.workstation.envs [--quantize-venv DIR] [--sglang-venv DIR]
[--card-quantizer] [--overlay FILE] [--python EXE] [--dry-run]``; ``--dry-run`` prints the commands
and the overlay it would write and changes nothing (no download).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import yaml

from ..core.errors import StudyError
from ..core.files import atomic_write
from ..core.params import LOCAL_OVERLAY, REPO_ROOT

ENVS = REPO_ROOT / "envs"
DEFAULT_VENVS = {"quantize": Path("~/.venvs/nvfp4study-quantize"), "sglang": Path("~/.venvs/nvfp4study-sglang")}


class EnvSetupFailed(StudyError):
    """A venv or pip command failed; the overlay is not written."""


def commands(python: str, venvs: dict[str, Path], card_quantizer: bool = False) -> list[list[str]]:
    """The commands that create and fill both environments, in order (argv lists)."""
    reqs = {"quantize": ENVS / ("quantize-card.txt" if card_quantizer else "quantize.txt"),
            "sglang": ENVS / "sglang.txt"}
    out = []
    for name, venv in venvs.items():
        py = str(venv / "bin" / "python")
        out += [[python, "-m", "venv", str(venv)], [py, "-m", "pip", "install", "-q", "--upgrade", "pip"],
                [py, "-m", "pip", "install", "-r", str(reqs[name])]]
    return out


def overlay(venvs: dict[str, Path]) -> dict:
    """The overlay mapping: ``quantize.python`` and ``server.python`` of the two venvs."""
    return {"quantize": {"python": str(venvs["quantize"] / "bin" / "python")},
            "server": {"python": str(venvs["sglang"] / "bin" / "python")}}


def main(argv: list[str]) -> int:
    """Create the environments and write the overlay (``--dry-run``: print only). Exit 0, or
    raises :class:`EnvSetupFailed` naming the failing command."""
    ap = argparse.ArgumentParser(prog="make workstation-envs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quantize-venv", type=Path, default=DEFAULT_VENVS["quantize"])
    ap.add_argument("--sglang-venv", type=Path, default=DEFAULT_VENVS["sglang"])
    ap.add_argument("--card-quantizer", action="store_true",
                    help="the card's llmcompressor 0.12.0.1 / compressed-tensors 0.17.1 instead of the study's")
    ap.add_argument("--overlay", type=Path, default=LOCAL_OVERLAY)
    ap.add_argument("--python", default=sys.executable, help="interpreter that creates the venvs (3.11+ for sglang)")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    venvs = {"quantize": a.quantize_venv.expanduser().absolute(), "sglang": a.sglang_venv.expanduser().absolute()}
    text = "# written by make workstation-envs (nvfp4study.workstation.envs); merged over any params file\n" \
        + yaml.safe_dump(overlay(venvs), sort_keys=False)
    for cmd in commands(a.python, venvs, a.card_quantizer):
        print("+ " + " ".join(cmd), flush=True)
        if not a.dry_run and subprocess.run(cmd).returncode != 0:
            raise EnvSetupFailed(f"failed: {' '.join(cmd)} (overlay {a.overlay} not written)")
    print(f"{'would write' if a.dry_run else 'writing'} {a.overlay}:\n{text}", end="")
    if not a.dry_run:
        atomic_write(a.overlay, lambda tmp: tmp.write_text(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
