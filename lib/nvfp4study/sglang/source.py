"""SGLang source trees without installing SGLang: released wheels unpacked to a cache, an
installed copy, or any folder.

A *tree* is the folder that holds the ``sglang/`` package (``site-packages``, the unpacked wheel,
or ``<checkout>/python``). The audit and the patcher only read and write ``.py`` files under it.

Cache layout (``$NVFP4STUDY_CACHE``, default ``~/.cache/nvfp4study``)::

    wheels/sglang-<version>-*.whl      from ``pip download --no-deps sglang==<version>``
    src/sglang-<version>/              the wheel unpacked once (compiled ``.so`` files skipped)

Unpacking is atomic: the wheel goes to a temporary folder beside the target, then one
``os.rename``; a concurrent unpack of the same version loses the race harmlessly.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import NotAnSGLangTree, SGLangNotInstalled, SGLangSourceError

#: Members of a wheel that are not unpacked (compiled extensions: the audit reads Python only).
SKIP_SUFFIXES = (".so",)
#: Top-level folders of ``sglang/`` that :func:`copy_tree` leaves out: nothing the study does to a
#: copy reads them (the audit walks ``srt/`` and names files in ``kernels/``; the patches edit
#: ``srt/``). They are about a third of a release's files (0.5.23: 1,787 of 5,766).
COPY_SKIP_DIRS = ("multimodal_gen", "test", "benchmark")
_MARKER = ".nvfp4study-unpacked"


def cache_dir() -> Path:
    """The study's download cache: ``$NVFP4STUDY_CACHE`` or ``~/.cache/nvfp4study``."""
    return Path(os.environ.get("NVFP4STUDY_CACHE") or Path.home() / ".cache" / "nvfp4study")


@dataclass(frozen=True)
class SGLangTree:
    """An SGLang source tree: ``root/sglang/srt/...``.

    Attributes:
        root: the folder holding the ``sglang`` package.
        version: the release it reports (``sglang/_version.py`` or dist-info), e.g. ``"0.5.23"``.
        origin: ``"wheel"``, ``"installed"`` or ``"path"``.
    """

    root: Path
    version: str
    origin: str = "path"

    @property
    def package(self) -> Path:
        return self.root / "sglang"

    @property
    def srt(self) -> Path:
        return self.root / "sglang" / "srt"

    def file(self, rel: str) -> Path:
        """Absolute path of ``rel`` (relative to the tree root, e.g. ``sglang/srt/...py``)."""
        return self.root / rel


def _looks_like_tree(root: Path) -> bool:
    return (root / "sglang" / "__init__.py").is_file() and (
        root / "sglang" / "srt" / "layers" / "moe"
    ).is_dir()


def find_root(path: str | Path) -> Path:
    """The tree root for ``path``: the folder holding ``sglang/``, the ``sglang`` package itself,
    ``sglang/srt``, or a source checkout (``<checkout>/python``).

    Raises:
        NotAnSGLangTree: none of those layouts is found under ``path``.
    """
    p = Path(path).expanduser().resolve()
    candidates = [p, p / "python", p.parent, p.parent.parent]
    for c in candidates:
        if _looks_like_tree(c):
            return c
    raise NotAnSGLangTree(
        f"{p} is not an SGLang source tree (no sglang/__init__.py with sglang/srt/layers/moe "
        "beside it, nor in python/)"
    )


def read_version(root: str | Path) -> str:
    """The SGLang version of a tree.

    Read, in order, from ``sglang/_version.py`` (``__version__ = version = '0.5.23'``, written by
    the release build), ``sglang/version.py`` (older releases keep a literal there) and a
    ``sglang-<version>.dist-info`` folder beside the package. Returns ``"unknown"`` when none
    gives one (a git checkout without a build).
    """
    root = Path(root)
    for rel in ("sglang/_version.py", "sglang/version.py"):
        f = root / rel
        if not f.is_file():
            continue
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                if {"__version__", "version"} & set(names) and isinstance(node.value.value, str):
                    return node.value.value
    for d in sorted(root.glob("sglang-*.dist-info")):
        m = re.fullmatch(r"sglang-(.+)\.dist-info", d.name)
        if m:
            return m.group(1)
    return "unknown"


def open_tree(path: str | Path, origin: str = "path") -> SGLangTree:
    """Validate ``path`` as an SGLang tree and read its version.

    Raises:
        NotAnSGLangTree: not an SGLang tree.
    """
    root = find_root(path)
    return SGLangTree(root=root, version=read_version(root), origin=origin)


def check_release(version: object) -> str:
    """``version`` if it reads as an SGLang release number (``0.5.23``, ``0.5.10rc1``,
    ``0.5.3.post1``; at most 32 characters), else :class:`SGLangSourceError` naming it."""
    if not (isinstance(version, str) and len(version) <= 32
            and re.fullmatch(r"\d+(\.\d+)*([a-z]+\d*)?(\.post\d+)?", version)):
        shown = repr(version) if len(repr(version)) <= 40 else repr(version)[:37] + "..."
        raise SGLangSourceError(f"{shown} is not an SGLang release number (e.g. 0.5.23)")
    return version


def wheel_path(version: str, *, download: bool = True) -> Path:
    """The cached wheel ``sglang-<version>-*.whl``; downloads it with pip when absent.

    The download is ``python -m pip download --no-deps sglang==<version> -d <cache>/wheels``
    (the package registry's ordinary client).

    Raises:
        SGLangSourceError: absent and ``download`` is False, or pip failed.
    """
    check_release(version)
    wheels = cache_dir() / "wheels"
    found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[-1]
    if not download:
        raise SGLangSourceError(f"no cached wheel for sglang {version} in {wheels}")
    wheels.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"sglang=={version}",
           "-d", str(wheels)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    if proc.returncode != 0 or not found:
        lines = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines()
                 if ln.strip().startswith("ERROR")] or ["no error line from pip"]
        raise SGLangSourceError(f"pip download sglang=={version} failed: {lines[-1]}")
    return found[-1]


def unpack_wheel(version: str, *, download: bool = True) -> SGLangTree:
    """The released source of ``sglang==<version>``, unpacked once into the cache.

    Returns:
        An :class:`SGLangTree` with ``origin="wheel"``.

    Raises:
        SGLangSourceError: no wheel (and no download), a corrupt wheel, or an unwritable cache.
        NotAnSGLangTree: the wheel does not contain an SGLang package.
    """
    check_release(version)
    target = cache_dir() / "src" / f"sglang-{version}"
    if (target / _MARKER).is_file():
        return SGLangTree(root=target, version=read_version(target), origin="wheel")
    whl = wheel_path(version, download=download)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".sglang-{version}-", dir=target.parent))
    except OSError as exc:
        raise SGLangSourceError(f"cannot write the cache {target.parent}: {exc}") from exc
    try:
        with zipfile.ZipFile(whl) as zf:
            members = [m for m in zf.namelist() if not m.endswith(SKIP_SUFFIXES)]
            zf.extractall(tmp, members=members)
        (tmp / _MARKER).write_text(f"{whl.name}\n")
        if not _looks_like_tree(tmp):
            raise NotAnSGLangTree(f"{whl} does not contain an SGLang package")
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / _MARKER).is_file():  # lost a race only if the winner finished
                raise
    except zipfile.BadZipFile as exc:
        raise SGLangSourceError(f"corrupt wheel {whl}: {exc}") from exc
    except OSError as exc:
        raise SGLangSourceError(f"cannot unpack {whl} to {target}: {exc}") from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return SGLangTree(root=target, version=read_version(target), origin="wheel")


def installed_tree(python: str | None = None) -> SGLangTree:
    """The SGLang installed for ``python`` (default: this interpreter), found without importing
    it (``importlib.util.find_spec("sglang")`` does not run the package's ``__init__``).

    Raises:
        SGLangNotInstalled: the interpreter cannot find ``sglang`` (or cannot be run).
    """
    exe = python or sys.executable
    code = "import importlib.util as u; s = u.find_spec('sglang'); print(s.origin if s else '')"
    try:
        proc = subprocess.run([exe, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SGLangNotInstalled(f"cannot run {exe}: {exc}") from exc
    origin = proc.stdout.strip()
    if proc.returncode != 0 or not origin:
        raise SGLangNotInstalled(f"{exe} has no importable sglang package")
    return open_tree(Path(origin).parent.parent, origin="installed")


def resolve_tree(source: str = "wheel", version: str | None = None, path: str | None = None,
                 python: str | None = None) -> SGLangTree:
    """One entry point for ``params.sglang``: ``source`` is ``wheel`` (needs ``version``),
    ``installed`` (optionally for another interpreter ``python``) or ``path``.

    Raises:
        SGLangSourceError (or a subclass): the tree cannot be obtained.
    """
    if source == "wheel":
        if not version:
            raise SGLangSourceError("source 'wheel' needs a version")
        return unpack_wheel(version)
    if source == "installed":
        return installed_tree(python)
    if source == "path":
        if not path:
            raise SGLangSourceError("source 'path' needs sglang.path")
        return open_tree(path, origin="path")
    raise SGLangSourceError(f"unknown SGLang source {source!r} (wheel, installed, path)")


def copy_tree(tree: SGLangTree, dest: str | Path) -> SGLangTree:
    """Copy a tree's Python package (``sglang/`` without ``__pycache__``, compiled files or the
    top-level folders :data:`COPY_SKIP_DIRS`, plus its dist-info) to ``dest``, atomically; an
    existing ``dest`` is replaced.

    Used to patch a copy in a run's work folder. Returns the copy as an :class:`SGLangTree`.

    Raises:
        SGLangSourceError: ``dest`` cannot be written.
    """
    dest = Path(dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
        by_pattern = shutil.ignore_patterns("__pycache__", "*.pyc", *[f"*{s}" for s in SKIP_SUFFIXES])
        top = str(tree.package)

        def ignore(folder: str, names: list[str]) -> set[str]:
            skip = set(by_pattern(folder, names))
            return skip | ({n for n in names if n in COPY_SKIP_DIRS} if folder == top else set())

        shutil.copytree(tree.package, tmp / "sglang", ignore=ignore)
        for d in tree.root.glob("sglang-*.dist-info"):
            shutil.copytree(d, tmp / d.name)
        if dest.exists():
            shutil.rmtree(dest)
        os.rename(tmp, dest)
    except OSError as exc:
        raise SGLangSourceError(f"cannot copy {tree.root} to {dest}: {exc}") from exc
    return SGLangTree(root=dest, version=tree.version, origin="path")
