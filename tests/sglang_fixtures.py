"""Helpers for the SGLang tests: the releases they audit, released trees (unpacked once into the
study cache), release-keyed expectation tables, copies of 0.5.23 to edit (``copy23``,
``copy23_shared``; :func:`edit_once`), and small synthetic trees for the audit's traps and the
patcher's refusals."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from nvfp4study.checkpoint import quant_rules as qr
from nvfp4study.checkpoint.check_config import check_config
from nvfp4study.checkpoint.findings import AuditFinding
from nvfp4study.sglang.releases import bailing_releases
from nvfp4study.sglang.source import SGLangTree, copy_tree, open_tree, unpack_wheel

#: The releases the SGLang tests audit: the discovered ones (the study's cache, else the shipped
#: ``sglang/data/bailing_releases.json``), so a new release joins every per-release test by itself.
VERSIONS = tuple(bailing_releases())


def release_gaps(table: Mapping[str, Mapping[str, Any]], releases: Sequence[str]) -> dict[str, dict[str, list[str]]]:
    """Rows of a ``{row: {release: expected}}`` table whose keys are not exactly ``releases``:
    ``{row: {"missing": [...], "extra": [...]}}``, empty when every row covers every release.

    Expected values are keyed by release (not by position) so that a new release is one new key
    per row, and a row that lacks it is named here rather than failing as a misaligned tuple."""
    out = {}
    for row, by_release in table.items():
        missing = [v for v in releases if v not in by_release]
        extra = [v for v in by_release if v not in releases]
        if missing or extra:
            out[row] = {"missing": missing, "extra": extra}
    return out


_NVFP4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}


def scheme_messages() -> dict[str, str]:
    """The config-audit messages that name SGLang release ranges, for a weight-only (``W4A16``)
    and a ``W4A4`` NVFP4 config (``checkpoint.check_config``, rendered now)."""
    out = {}
    for scheme, acts in (("W4A16", None), ("W4A4", {**_NVFP4, "dynamic": "local"})):
        qc = {"quant_method": "compressed-tensors",
              "config_groups": {"group_0": {"targets": ["Linear"], "weights": _NVFP4, "input_activations": acts}}}
        findings: list[AuditFinding] = []
        check_config({"quantization_config": qc}, qr.parse_groups(qc), findings)
        (f,) = findings
        out[scheme] = f.message
    return out


@cache
def released(version: str) -> SGLangTree:
    """The released wheel's source (cached in ``$NVFP4STUDY_CACHE``; unpacked once)."""
    return unpack_wheel(version)


# Fixtures are named apart from their functions: a test module imports ``copy23_fixture`` and
# its tests take ``copy23``, so the parameter does not shadow the import (ruff F811).
@pytest.fixture(name="copy23")
def copy23_fixture(tmp_path: Path) -> SGLangTree:
    """A fresh copy of the released 0.5.23 tree, for one test to edit as it likes."""
    return copy_tree(released("0.5.23"), tmp_path / "t")


@pytest.fixture(name="copy23_shared", scope="module")
def copy23_shared_fixture(tmp_path_factory: pytest.TempPathFactory) -> SGLangTree:
    """One copy of the released 0.5.23 tree per test module, for tests that leave it as they found
    it (the patcher's apply / revert round trips): one copy instead of one per test."""
    return copy_tree(released("0.5.23"), tmp_path_factory.mktemp("c") / "sglang-0.5.23")


def edit_once(tree: SGLangTree, rel: str, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` in the file ``rel`` (from the tree's root) of a copied tree.

    ``old`` must occur exactly once: an edit meant for one place never lands on a second copy of
    the text, and a release that moved the code fails here rather than in the assertion after.
    """
    p = tree.file(rel)
    text = p.read_text()
    assert text.count(old) == 1, old
    p.write_text(text.replace(old, new))


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
