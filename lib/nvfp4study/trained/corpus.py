"""The trained stand-in's corpus: Python source that a Python install and PyPI packages ship,
listed file by file (package, version, path, sha256) so anyone can rebuild it.

Sources (:data:`SOURCES`): the standard library of the interpreter that builds it (CPython
3.11.7 for the committed model) and the ``networkx`` package (pure Python, BSD). Files are the
``.py`` files of 500 bytes to 200 kB (the size window of the clamp-trained reference run), read as
UTF-8 (a file that is not is skipped and not listed), in sorted order, shuffled with a fixed seed;
:data:`HELD_OUT_SHARE` of the files (at least one) are held out for evaluation.

The manifest (``corpus_manifest.json``) is what is committed; :func:`check_manifest` re-reads the
installed files and names every one that is missing or differs. The packed corpus
(``corpus.npz``: token ids, uint16) is what a GPU machine without these packages trains on;
:func:`load_packed` checks it against the manifest's hash of the ids before use.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import random
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: ``(package, how to find its root)``; ``"python"`` is the interpreter's standard library.
SOURCES: tuple[str, ...] = ("python", "networkx")
MIN_BYTES, MAX_BYTES = 500, 200_000
HELD_OUT_SHARE = 0.02
SHUFFLE_SEED = 0


class CorpusError(RuntimeError):
    """The corpus cannot be built or does not match its manifest (what differs is named)."""


@dataclass(frozen=True)
class SourceFile:
    """One corpus file: its package, version, path inside the package root, sha256 and text."""

    package: str
    version: str
    path: str
    sha256: str
    text: str


def package_root(package: str) -> tuple[Path, str]:
    """``(root folder, version)`` of a source; the stdlib's root excludes ``site-packages``.

    Raises:
        CorpusError: the package is not installed.
    """
    if package == "python":
        return Path(sysconfig.get_paths()["stdlib"]), ".".join(map(str, sys.version_info[:3]))
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError as exc:
        raise CorpusError(f"corpus source {package!r} is not installed") from exc
    return Path(str(dist.locate_file(package))), dist.version


def _files(package: str) -> list[SourceFile]:
    root, version = package_root(package)
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if "site-packages" in rel.parts or "__pycache__" in rel.parts:
            continue
        raw = p.read_bytes()
        if not MIN_BYTES <= len(raw) <= MAX_BYTES:
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        out.append(SourceFile(package, version, rel.as_posix(), hashlib.sha256(raw).hexdigest(), text))
    return out


def collect(sources: tuple[str, ...] = SOURCES) -> tuple[list[SourceFile], list[SourceFile]]:
    """``(train files, held-out files)``: every source's files, shuffled with
    :data:`SHUFFLE_SEED`; the first ``max(1, round(HELD_OUT_SHARE * n))`` are held out.

    Raises:
        CorpusError: a source is missing or ships no file in the size window.
    """
    files = [f for s in sources for f in _files(s)]
    if not files:
        raise CorpusError(f"no source file of {MIN_BYTES}-{MAX_BYTES} bytes in {sources}")
    random.Random(SHUFFLE_SEED).shuffle(files)
    n_held = max(1, round(HELD_OUT_SHARE * len(files)))
    return files[n_held:], files[:n_held]


def manifest(train: list[SourceFile], held: list[SourceFile]) -> dict[str, Any]:
    """The committed list: packages with versions, and per file ``[package, path, sha256, bytes,
    split]`` in corpus order (train first, then held-out)."""
    versions = {f.package: f.version for f in train + held}
    return {
        "sources": list(dict.fromkeys(f.package for f in train + held)),
        "versions": versions,
        "size_window_bytes": [MIN_BYTES, MAX_BYTES],
        "shuffle_seed": SHUFFLE_SEED,
        "files": [[f.package, f.path, f.sha256, len(f.text.encode()), split]
                  for split, fs in (("train", train), ("held_out", held)) for f in fs],
    }


def check_manifest(man: dict[str, Any]) -> list[str]:
    """Problems rebuilding ``man`` from what is installed here (empty: identical corpus):
    a version that differs, a listed file missing or with another sha256, a file that is here
    and not listed."""
    problems = []
    here: dict[tuple[str, str], str] = {}
    for pkg in man["sources"]:
        try:
            root, version = package_root(pkg)
        except CorpusError as exc:
            problems.append(str(exc))
            continue
        if version != man["versions"][pkg]:
            problems.append(f"{pkg} is {version} here, the manifest lists {man['versions'][pkg]}")
        here.update({(f.package, f.path): f.sha256 for f in _files(pkg)})
    listed = {(p, path): sha for p, path, sha, _, _ in man["files"]}
    problems += [f"{p}/{path}: missing or outside the size window" for (p, path) in listed if (p, path) not in here]
    problems += [f"{p}/{path}: sha256 differs" for k, sha in listed.items() if k in here and here[k] != sha
                 for p, path in [k]]
    problems += [f"{p}/{path}: here but not listed" for (p, path) in here if (p, path) not in listed]
    return problems


def ids_sha256(ids: Any) -> str:
    """sha256 of a uint16 id array's little-endian bytes."""
    import numpy as np

    return hashlib.sha256(np.ascontiguousarray(ids, dtype="<u2").tobytes()).hexdigest()


def load_packed(path: Path, expect: dict[str, str]) -> dict[str, Any]:
    """The packed corpus (``train``, ``held_out`` uint16 ids; ``held_out_bytes``), each id
    array's hash compared with ``expect`` (``{"train": sha, "held_out": sha}``).

    Raises:
        CorpusError: the file is missing or a hash differs.
    """
    import numpy as np

    if not Path(path).is_file():
        raise CorpusError(f"packed corpus {path} not found")
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    for split in ("train", "held_out"):
        got = ids_sha256(data[split])
        if got != expect[split]:
            raise CorpusError(f"packed corpus {path}: {split} ids sha256 {got}, expected {expect[split]}")
    return data


def main(argv: list[str] | None = None) -> int:
    """``python -m nvfp4study.trained.corpus --check MANIFEST``: exit 0 when the installed
    packages rebuild the listed corpus, 1 with the problems printed otherwise."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", type=Path, required=True, help="corpus_manifest.json to compare with")
    args = ap.parse_args(argv)
    problems = check_manifest(json.loads(args.check.read_text()))
    for p in problems[:50]:
        print(p)
    print("corpus matches its manifest" if not problems else f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
