import importlib
import subprocess
import sys

import pytest

from nvfp4study import cli
from nvfp4study.core.params import REPO_ROOT


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_command_has_help_and_is_documented(name):
    module = importlib.import_module(cli.COMMANDS[name][0])
    assert callable(module.main)
    r = subprocess.run([sys.executable, "-m", "nvfp4study.cli", name, "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "usage" in r.stdout.lower()
    assert f"nvfp4study {name}" in (REPO_ROOT / "README.md").read_text()


def test_unknown_command():
    assert cli.main(["frobnicate"]) == 2


def test_study_error_is_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("profile: x\nbogus: 1\n")
    assert cli.main(["run", "--params", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ParamsError" in err[0] and "bogus" in err[0]
