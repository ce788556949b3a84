"""Stored notebooks: ordered, clean (no outputs), with a literal parameters cell, in sync with
their py:percent twins."""

import ast
import json
from pathlib import Path

import jupytext
import pytest

from nvfp4study.core.params import REPO_ROOT

NB_DIR = REPO_ROOT / "notebooks"
EXPECTED = ["00_environment", "01_quantize", "02_inspect_checkpoint", "03_patch_sglang",
            "04_launch_server", "05_corruption", "06_mtp_sweep", "07_determinism", "99_report"]
NOTEBOOKS = sorted(NB_DIR.glob("[0-9][0-9]_*.ipynb"))


def test_the_study_has_its_notebooks():
    assert [p.stem for p in NOTEBOOKS] == EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_without_outputs(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None, path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_parameters_cell(path):
    nb = json.loads(path.read_text())
    tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged parameters"
    tree = ast.parse("".join(tagged[0]["source"]))
    names = {}
    for node in tree.body:
        assert isinstance(node, ast.AnnAssign), "parameters cell holds annotated literals only"
        names[node.target.id] = ast.literal_eval(node.value)
    assert names["params_file"] == "../params/default.yaml"  # runs as-is when opened in Jupyter
    assert names["run_dir"] == ""
    assert (NB_DIR / names["params_file"]).resolve().is_file()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_py_twin_in_sync(path):
    twin = path.with_suffix(".py")
    assert twin.exists(), f"{twin.name} missing (jupytext py:percent twin)"
    a = [c.source for c in jupytext.read(str(path)).cells]
    b = [c.source for c in jupytext.read(str(twin)).cells]
    assert a == b, f"{path.name} differs from {twin.name}: run `make notebooks`"




def test_stored_notebooks_name_the_kernel_make_setup_installs():
    import sys

    spec = json.loads((Path(sys.prefix) / "share/jupyter/kernels/python3/kernel.json").read_text())
    for path in NOTEBOOKS:
        ks = json.loads(path.read_text())["metadata"]["kernelspec"]
        assert (ks["name"], ks["display_name"]) == ("python3", spec["display_name"]), path.name
