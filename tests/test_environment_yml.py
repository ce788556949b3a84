"""environment.yml installs the same dependencies as pyproject.toml (through its pip section)."""

import tomllib

import yaml

from nvfp4study.core.params import REPO_ROOT


def test_same_dependencies():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((REPO_ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert sorted(p for p in pip if not p.startswith("-e")) == sorted(project)
    assert "-e .[dev]" in pip
