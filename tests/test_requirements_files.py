"""Every requirements and environment file the project installs resolves from a package index by
name and version: no ``file://`` URL, no absolute or local path, no direct reference
(``name @ url``), no package listed twice in one file.

A frozen ``sglang @ file:///tmp/...`` line once passed every check on the machine that made it and
broke ``make test`` on every other one; this test reads the files the Makefile, conda and pip read
(``envs/*.txt``, ``tests/**/requirements*.txt``, ``environment.yml``, ``pyproject.toml``).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
#: the only pip options a file may carry: the project itself, installed editable from the checkout.
EDITABLE_SELF = re.compile(r"^-e\s+\.(\[[A-Za-z0-9_,-]+\])?$")
LOCAL = re.compile(r"(^|[\s=@])(file:|/|~|\.\.?/)")


def requirement_problems(lines: list[str], where: str) -> list[str]:
    """Problems of one file's requirement lines (comments and blanks already allowed): each line
    must parse as a PEP 508 requirement without a URL, name no local path, and name a package
    not named before in the same file."""
    problems, seen = [], {}
    for n, raw in enumerate(lines, 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#") or EDITABLE_SELF.match(line):
            continue
        if "file://" in line or LOCAL.search(line):
            problems.append(f"{where}:{n}: a local path or file:// URL: {line!r}")
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement as e:
            problems.append(f"{where}:{n}: not a requirement ({e}): {line!r}")
            continue
        if req.url:
            problems.append(f"{where}:{n}: a direct reference, not resolvable by name and version: {line!r}")
        name = canonicalize_name(req.name)
        if name in seen:
            problems.append(f"{where}:{n}: {req.name} is listed twice (first on line {seen[name]})")
        seen.setdefault(name, n)
    return problems


def _pip_lists() -> dict[str, list[str]]:
    """Every list of requirements the project installs, by a name that says where it is."""
    out = {str(p.relative_to(REPO)): p.read_text().splitlines()
           for p in sorted([*REPO.glob("envs/*.txt"), *REPO.glob("tests/**/requirements*.txt")])}
    py = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    out["pyproject.toml [project.dependencies]"] = list(py["dependencies"])
    for extra, deps in py.get("optional-dependencies", {}).items():
        out[f"pyproject.toml [optional-dependencies.{extra}]"] = list(deps)
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            out["environment.yml pip:"] = [str(x) for x in dep.get("pip", [])]
    return out


def test_the_files_are_found():
    lists = _pip_lists()
    assert {"envs/sglang.txt", "tests/real_sglang/requirements.txt", "environment.yml pip:",
            "pyproject.toml [project.dependencies]"} <= set(lists)


@pytest.mark.parametrize("where", sorted(_pip_lists()))
def test_every_requirement_resolves_by_name(where):
    assert requirement_problems(_pip_lists()[where], where) == []


@pytest.mark.parametrize("line, says", [
    ("sglang @ file:///tmp/sgl/wheels/sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl", "file://"),
    ("/tmp/wheels/torch-2.13.0-cp311-cp311-linux_x86_64.whl", "local path"),
    ("./wheels/torch-2.13.0.whl", "local path"),
    ("~/wheels/torch-2.13.0.whl", "local path"),
    ("-e /home/me/project", "local path"),
    ("sglang @ https://example.org/sglang-0.5.23-py3-none-any.whl", "direct reference"),
    ("torch==2.13.0 --find-links /opt/wheels", "local path"),
])
def test_a_bad_line_is_named(line, says):
    problems = requirement_problems(["numpy==2.3.0", line], "x.txt")
    assert len(problems) == 1 and says in problems[0] and "x.txt:2" in problems[0]


def test_a_package_listed_twice_is_named():
    problems = requirement_problems(["sglang==0.5.23", "Pillow==12.0", "SGLang==0.5.23", "pillow"], "r.txt")
    assert problems == ["r.txt:3: SGLang is listed twice (first on line 1)",
                        "r.txt:4: pillow is listed twice (first on line 2)"]


def test_good_lines_pass():
    assert requirement_problems(["# a comment", "", "torch==2.13.0+cpu", "flashinfer-python[cu13]==0.7.2",
                                 "safetensors>=0.4  # why", "-e .[dev]"], "ok.txt") == []
