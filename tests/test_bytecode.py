"""``core.bytecode``: the set-up step that byte-compiles what a run imports (the venvs install with
``pip install --no-compile``), and the module lists it and the CPU engine's step import."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from nvfp4study.core import bytecode
from nvfp4study.serving.cpu_engine import warm


def _package(root):
    pkg = root / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "used.py").write_text("VALUE = 1\n")
    (pkg / "unused.py").write_text("VALUE = 2\n")
    (pkg / "broken.py").write_text("import no_such_module_anywhere\n")
    return pkg


def _pycs(pkg):
    return sorted(p.name.split(".")[0] for p in (pkg / "__pycache__").glob("*.pyc")) if (pkg / "__pycache__").is_dir() else []


def test_imported_modules_are_compiled_and_only_those(tmp_path, monkeypatch, capsys):
    pkg = _package(tmp_path)
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")  # a user's setting must not undo the step
    rc = bytecode.compile_by_import(["pkg.used"], "test venv", {"PYTHONPATH": str(tmp_path)})
    assert rc == 0
    assert _pycs(pkg) == ["__init__", "used"]
    out = capsys.readouterr().out
    assert out.startswith("test venv: byte-compiled what a run imports (1 entry modules) in ")


def test_a_module_that_does_not_import_is_a_warning_not_an_exception(tmp_path, capsys):
    pkg = _package(tmp_path)
    rc = bytecode.compile_by_import(["pkg.used", "pkg.broken"], "test venv", {"PYTHONPATH": str(tmp_path)})
    assert rc == 1
    out = capsys.readouterr().out
    assert "could not import every entry module" in out and "no_such_module_anywhere" in out
    assert "used" in _pycs(pkg)  # what came before the failure is compiled


def _module_file(site_of_top, name: str) -> bool:
    """Whether dotted ``name`` is a file under its top-level package's folder (found without
    importing anything: ``find_spec`` of a dotted name would import its parents)."""
    top, *rest = name.removesuffix(".*").split(".")
    folder = site_of_top(top)
    if folder is None:
        return False
    if not rest:
        return True
    path = folder.joinpath(*rest)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _study_top(top: str):
    spec = importlib.util.find_spec(top)  # a top-level name: nothing is imported
    if spec is None:
        return None
    locs = spec.submodule_search_locations
    return Path(list(locs)[0]) if locs else Path(spec.origin).parent


def test_the_study_modules_exist_in_this_venv():
    assert [m for m in bytecode.STUDY_MODULES if not _module_file(_study_top, m)] == []
    assert len(set(bytecode.STUDY_MODULES)) == len(bytecode.STUDY_MODULES)
    assert not _module_file(_study_top, "pandas.no_such_module")  # the check can fail


def test_the_served_modules_exist_in_the_sglang_venv():
    from cpu_engine_fixtures import require_sglang_env

    site = next((require_sglang_env().parent.parent / "lib").glob("python3*/site-packages"))

    def top(name):
        return site / name if (site / name).is_dir() else None

    assert [m for m in warm.SERVED_MODULES if not _module_file(top, m)] == []
    assert not _module_file(top, "sglang.srt.speculative.eagle_worker")  # gone in 0.5.23


def test_a_package_star_compiles_the_modules_its_all_names(tmp_path):
    pkg = _package(tmp_path)
    (pkg / "__init__.py").write_text('__all__ = ["used"]\n')
    assert bytecode.compile_by_import(["pkg.*"], "test venv", {"PYTHONPATH": str(tmp_path)}) == 0
    assert _pycs(pkg) == ["__init__", "used"]
