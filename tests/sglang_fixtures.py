"""Helpers for the SGLang tests: released trees (unpacked once into the study cache) and small
synthetic trees for the audit's traps and the patcher's refusals."""

from __future__ import annotations

import shutil
import textwrap
from functools import cache
from pathlib import Path

from nvfp4study.sglang.source import SGLangTree, open_tree, unpack_wheel

VERSIONS = ("0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")


@cache
def released(version: str) -> SGLangTree:
    """The released wheel's source (cached in ``$NVFP4STUDY_CACHE``; unpacked once)."""
    return unpack_wheel(version)


def mini_tree(root: Path, version: str, files: dict[str, str] | None = None,
              copy_from: SGLangTree | None = None, copy_files: tuple[str, ...] = ()) -> SGLangTree:
    """A minimal SGLang tree: the package markers, a version file, ``files`` (path -> source),
    and ``copy_files`` copied from a released tree."""
    pkg = root / "sglang"
    (pkg / "srt" / "layers" / "moe").mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_version.py").write_text(f"__version__ = version = '{version}'\n")
    for rel, src in (files or {}).items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(src))
    for rel in copy_files:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(copy_from.file(rel), p)
    return open_tree(root)
