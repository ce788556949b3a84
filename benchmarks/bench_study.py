"""Wall time of the default study run, per notebook, and the kernel start cost per notebook.

Usage: .venv/bin/python benchmarks/bench_study.py [--skip-study]
Prints figures; asserts nothing (speed targets live here, not in tests).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import nbformat

from nvfp4study.core import runner


def kernel_start_seconds(repeats: int = 5) -> list[float]:
    """Seconds to execute a notebook holding only the parameters cell (kernel start + teardown)."""
    with tempfile.TemporaryDirectory() as d:
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        cell = nbformat.v4.new_code_cell('params_file: str = ""\nrun_dir: str = ""')
        cell.metadata["tags"] = ["parameters"]
        nb.cells = [cell]
        src = Path(d) / "00_empty.ipynb"
        nbformat.write(nb, str(src))
        times = []
        for i in range(repeats):
            t0 = time.monotonic()
            runner.execute_notebook(src, Path(d) / f"out{i}.ipynb", src, Path(d), 60)
            times.append(time.monotonic() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--skip-study", action="store_true", help="only measure the kernel start")
    args = ap.parse_args()
    ks = kernel_start_seconds()
    print(f"kernel start per notebook: median {statistics.median(ks):.2f} s "
          f"(min {min(ks):.2f}, max {max(ks):.2f}, n={len(ks)})")
    if args.skip_study:
        return
    with tempfile.TemporaryDirectory() as d:
        t0 = time.monotonic()
        _, manifest = runner.run_study(run_dir=Path(d) / "run", echo=lambda s: None)
        total = time.monotonic() - t0
    print(f"default study: {total:.1f} s wall, status {manifest['status']}")
    for nb in manifest["notebooks"]:
        print(f"  {nb['notebook']:<24} {nb['seconds']:7.1f} s  {nb['status']}")


if __name__ == "__main__":
    main()
