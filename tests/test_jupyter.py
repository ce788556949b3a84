"""The stored notebooks opened as JupyterLab opens them: cwd notebooks/, no injected parameters,
the kernel the notebook names (the one `make setup` installs)."""

from __future__ import annotations

import os

import nbclient
import nbformat
import pytest

from nvfp4study.core.params import REPO_ROOT

NB_DIR = REPO_ROOT / "notebooks"
OUTPUTS = REPO_ROOT / "outputs"


def _state() -> dict[str, str | None]:
    """Where outputs/latest and outputs/interactive point (None: absent)."""
    return {n: (os.readlink(OUTPUTS / n) if (OUTPUTS / n).is_symlink() else None)
            for n in ("latest", "interactive")}


def _run_as_jupyterlab(name: str) -> tuple[nbformat.NotebookNode, Exception | None]:
    nb = nbformat.read(NB_DIR / f"{name}.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name=nb.metadata["kernelspec"]["name"],
                                     resources={"metadata": {"path": str(NB_DIR)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        return nb, exc
    return nb, None


@pytest.mark.slow
def test_env_var_chooses_the_run_and_the_first_output_says_why(tmp_path, monkeypatch):
    run = tmp_path / "explore"
    monkeypatch.setenv("NVFP4STUDY_RUN_DIR", str(run))
    before = _state()
    nb, err = _run_as_jupyterlab("00_environment")
    assert err is None, err
    first = next(o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert f"run folder: {run}" in first["text"] and "$NVFP4STUDY_RUN_DIR" in first["text"]
    assert "params:" in first["text"]
    assert (run / "params.yaml").is_file() and (run / "data" / "environment.json").is_file()
    assert _state() == before  # neither latest nor interactive moved


@pytest.mark.slow
def test_a_failing_notebook_moves_nothing(tmp_path, monkeypatch):
    # 02 before 01: its input is missing, the notebook fails with the named error
    monkeypatch.setenv("NVFP4STUDY_RUN_DIR", str(tmp_path / "empty"))
    before = _state()
    nb, err = _run_as_jupyterlab("02_inspect_checkpoint")
    assert err is not None and "StageInputMissing" in str(err)
    assert _state() == before
