"""Documents that cannot drift: every repository path and dotted module name that README.md and
CONTRIBUTING.md name (in backticks or as a link target) exists.

A path is ours when its first part is a tracked top-level entry (``tests/...``, ``docs/...``) or a
part of the package (``checkpoint/audit.py`` is ``lib/nvfp4study/checkpoint/audit.py``); other
paths name upstream source (SGLang's ``layers/moe/...``, ``sglang/srt``), a run folder's files
(``data/...``), this machine, or a file the user makes (gitignored: ``params/local.yaml``). A dotted name that starts with ``nvfp4study`` or a package part must import (module,
then attributes), or be a params key (``checkpoint.shards``).
"""

from __future__ import annotations

import importlib
import re
import subprocess

import pytest

from nvfp4study.core.params import REPO_ROOT, load_params

PKG = REPO_ROOT / "lib" / "nvfp4study"
DOCS = ("README.md", "CONTRIBUTING.md")
#: a run folder's parts (``outputs/<run>/data/...``): named in the documents, never in the repository
RUN_FOLDER = {"outputs", "data", "figures", "logs", "html", "work"}
#: SGLang's own package layout, which shares its first part with our ``sglang`` wing
UPSTREAM = ("sglang/srt",)
FILE_SUFFIX = re.compile(r"\.(py|md|html|json|jsonl|yaml|yml|toml|txt|png|parquet|ipynb|cu|cuh)$")
PLACEHOLDER = re.compile(r"[<>*{}]|\.\.\.|\bNN|\bsNN|~")


def spans(text: str) -> list[str]:
    """Backticked spans and link targets of a Markdown text."""
    return re.findall(r"`([^`\n]+)`", text) + re.findall(r"\]\(([^)\s]+)\)", text)


def top_level() -> set[str]:
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    return {t.split("/")[0] for t in tracked} - RUN_FOLDER


def package_parts() -> set[str]:
    return {p.stem if p.suffix == ".py" else p.name for p in PKG.iterdir()
            if p.suffix == ".py" or (p / "__init__.py").exists()} - {"__init__"}


def named_paths(text: str) -> list[str]:
    """The spans that name a path of ours, line suffixes (``:12``, ``:3-9``) and qualified names
    (``:Class.method``, the long-function list) dropped."""
    ours_top, ours_pkg = top_level(), package_parts()
    out = []
    for s in spans(text):
        if " " in s or "://" in s or PLACEHOLDER.search(s) or "/" not in s:
            continue
        path = re.sub(r":(\d+(-\d+)?|[A-Za-z_][\w.]*)$", "", s).rstrip("/")
        first = path.split("/")[0]
        if (first in ours_top or first in ours_pkg) and not path.startswith(UPSTREAM) and not ignored(path):
            out.append(path)
    return out


def ignored(path: str) -> bool:
    """Whether git ignores ``path`` (a file each user makes, e.g. ``params/local.yaml``)."""
    return subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO_ROOT).returncode == 0


def path_exists(path: str) -> bool:
    first = path.split("/")[0]
    base = REPO_ROOT if first in top_level() else PKG
    return (base / path).exists()


def named_dotted(text: str) -> list[str]:
    """Spans like ``nvfp4study.sglang.kernel_evidence``, ``cli.COMMANDS`` or ``checkpoint.shards``."""
    heads = package_parts() | {"nvfp4study"}
    return [s.removesuffix("()") for s in spans(text)
            if re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(\(\))?", s) and s.split(".")[0] in heads
            and not FILE_SUFFIX.search(s)]


def dotted_exists(name: str) -> bool:
    parts = name.split(".")
    parts = parts if parts[0] == "nvfp4study" else ["nvfp4study", *parts]
    for i in range(len(parts), 1, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
            return True
        except AttributeError:
            break
    obj = load_params()  # a params key: section.field[.field]
    try:
        for attr in name.split("."):
            obj = getattr(obj, attr)
    except AttributeError:
        return False
    return True


def test_the_finders_see_ours_and_skip_the_rest():
    text = ("`checkpoint/audit.py` `checkpoint/checks.py` `tests/test_docs.py:12` `layers/moe/fused.py:4` "
            "`data/quantize.json` `notebooks/NN_name.py` `~/.cache/x` [a](docs/faults.md) `sglang/srt/` "
            "`params/local.yaml` `cli.py` "
            "`nvfp4study.core.ledger.record` `cli.COMMANDS` `checkpoint.shards` `core.nowhere` `x.y`")
    assert named_paths(text) == ["checkpoint/audit.py", "checkpoint/checks.py", "tests/test_docs.py",
                                 "docs/faults.md"]
    assert [path_exists(p) for p in named_paths(text)] == [True, False, True, True]
    assert named_dotted(text) == ["nvfp4study.core.ledger.record", "cli.COMMANDS", "checkpoint.shards",
                                  "core.nowhere"]
    assert [dotted_exists(d) for d in named_dotted(text)] == [True, True, True, False]


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_a_document_names_exists(doc):
    text = (REPO_ROOT / doc).read_text()
    missing = sorted({p for p in named_paths(text) if not path_exists(p)})
    assert named_paths(text), f"{doc}: no paths found (the finder is broken)"
    assert not missing, f"{doc} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS)
def test_every_dotted_name_a_document_names_exists(doc):
    text = (REPO_ROOT / doc).read_text()
    missing = sorted({d for d in named_dotted(text) if not dotted_exists(d)})
    assert not missing, f"{doc} names modules or params that do not exist: {missing}"
