"""Shared fixtures. Tests of each module live in test_<module>.py."""

from __future__ import annotations

import fnmatch
import os
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Every process this test session starts inherits this marker, so the leftover-process checks
# (serving_fixtures.fake_processes) look only at our own processes, not at another test run's
# (nor, under pytest-xdist, at another worker's: each worker imports this file and draws its own).
SESSION_ENV = "NVFP4STUDY_TEST_SESSION"
os.environ[SESSION_ENV] = uuid.uuid4().hex
sys.path.insert(0, str(Path(__file__).resolve().parent))  # test helpers (e.g. fake_sglang)
# the suite never reads a workstation's params/local.yaml (tests of the overlay name theirs)
os.environ["NVFP4STUDY_OVERLAY"] = ""


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """An empty run folder with the default params and a fresh ledger."""
    from nvfp4study.core.ledger import init_ledger
    from nvfp4study.core.params import dump_params, load_params

    d = tmp_path / "run"
    d.mkdir()
    dump_params(load_params(), d / "params.yaml")
    init_ledger(d)
    return d


# --- memory: the SGLang audit's per-file caches ----------------------------------------------------
# The audit caches every parsed file and every derived path per (path, mtime, size), unbounded: right
# for a study run (a handful of trees), but the suite audits dozens of copied trees (each test edits
# its own copy under tmp_path), about 150 MB of ASTs each, and they stay until exit: the process
# grew to 5.8 GB, every full garbage collection walked all of it (slow tests) and the final one at
# interpreter exit took minutes. Parsed modules are now shared by content (a copy costs no new ASTs),
# and after each test, once the caches hold more than TREE_CACHE_FILES distinct files, they are
# emptied (the released trees are parsed again by the next test that reads them). 800 emptied them
# every few tests; 4000 keeps the five releases' parsed files between tests: the audit and parameter
# tests 322 s -> 298 s on 2 workers, at most 1.8 GB resident per worker (2026-12-07).
TREE_CACHE_MODULES = ("nvfp4study.sglang.",)
TREE_CACHE_FILES = 4000  # distinct parsed files kept (a release's MoE-relevant sources are about 160)


def _tree_caches() -> list:
    out = []
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith(TREE_CACHE_MODULES):
            continue
        for obj in vars(mod).values():
            if callable(getattr(obj, "cache_clear", None)) and getattr(obj, "__module__", None) == name:
                out.append(obj)
    return out


def clear_tree_caches() -> None:
    for fn in _tree_caches():
        fn.cache_clear()


@pytest.fixture(autouse=True)
def _bounded_tree_caches():
    yield
    parse = getattr(sys.modules.get("nvfp4study.sglang.clamp_values"), "_parse_source", None)
    if parse is not None and parse.cache_info().currsize > TREE_CACHE_FILES:
        clear_tree_caches()


@pytest.fixture(scope="module", autouse=True)
def _fork_servers_closed_after_each_file():
    """A launching process keeps its fork servers (``serving/forkserver.py``) for its next launch;
    a test file's are closed after it, so the next file starts with no child processes of its
    own (``test_sandbox`` checks that the harness has none)."""
    yield
    fs = sys.modules.get("nvfp4study.serving.forkserver")
    if fs is not None:
        fs.close_all()


# --- order: the longest files first -----------------------------------------------------------------
# `make test` runs two workers, a whole file each at a time (pytest-xdist --dist loadfile, with
# --no-loadscope-reorder: xdist keeps this order instead of sorting files by their number of tests): the
# files that take minutes start first, so that neither worker is left with one of them at the end.
# Within a file the order is unchanged. A pattern names files by fnmatch; earlier runs first.
SLOW_FIRST = ("test_study_e2e.py", "test_card_files_profile.py", "test_real_engine*.py",
              "test_cpu_engine*.py", "test_real_sglang*.py", "test_sglang_dispatch_hostile.py",
              "test_sglang_model_side.py", "test_corruption_served.py", "test_serving_replay.py",
              "test_real_vs_fake.py", "test_sglang_audit.py", "test_checkpoint_audit.py",
              "test_sandbox.py", "test_sglang_dispatch.py", "test_quantize*.py",
              "test_sglang_patch.py", "test_sglang_stage.py", "test_server.py")


def _slow_rank(item) -> int:
    name = item.path.name
    return next((i for i, pat in enumerate(SLOW_FIRST) if fnmatch.fnmatch(name, pat)), len(SLOW_FIRST))


def pytest_collection_modifyitems(items) -> None:
    items.sort(key=_slow_rank)  # stable: files and tests keep their order within a rank


def pytest_sessionfinish() -> None:
    clear_tree_caches()  # nothing big left for the interpreter's last collection at exit
