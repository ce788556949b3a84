"""Gather what the GPU check needs into one small payload folder (runs on any machine, no GPU).

    python gpu/clamp_kernels/prepare.py [--wheels DIR] [--payload gpu/clamp_kernels/.payload]

Takes ``flashinfer_python-0.7.2`` and ``sglang-0.5.23`` wheels from ``--wheels`` (default ``.whl``
at the repository root), downloading them there with ``pip download --no-deps`` when absent, and
the small wheels the GPU machine may lack (``apache-tvm-ffi`` that FlashInfer's JIT loads modules
with, ``msgspec``, ``pydantic``, ``dill`` that SGLang's MoE imports) for CPython 3.12 x86-64. Then:

- ``flashinfer-moe-src.tar.gz``: FlashInfer's Python package and only the fused-MoE JIT inputs
  (``data/include``, ``data/cutlass``, ``data/cccl``, ``data/spdlog``, ``data/csrc/nv_internal``,
  ``data/csrc/fused_moe/cutlass_backend`` and the headers under ``data/csrc``); the whole wheel is
  65 MB, this about a third of it;
- ``sglang-py.tar.gz``: SGLang's Python files, the tuned Triton MoE configs and the dist-info;
- ``wheels/``: the small wheels.
"""

from __future__ import annotations

import argparse
import glob
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
FLASHINFER = "flashinfer-python==0.7.2"
SGLANG = "sglang==0.5.23"
SMALL = ["apache-tvm-ffi>=0.1.11,<0.2", "msgspec", "pydantic", "dill"]
SKIP_SMALL = ("typing_extensions",)  # the GPU machine's own copy stays
PLATFORM = ["--only-binary=:all:", "--implementation", "cp",
            *[x for n in (17, 24, 27, 28) for x in ("--platform", f"manylinux_2_{n}_x86_64")],
            "--platform", "manylinux2014_x86_64"]
HEADERS = (".h", ".cuh", ".hpp", ".inl", ".hxx")
FI_DATA_KEEP = ("flashinfer/data/include/", "flashinfer/data/cutlass/", "flashinfer/data/cccl/",
                "flashinfer/data/spdlog/", "flashinfer/data/csrc/nv_internal/",
                "flashinfer/data/csrc/fused_moe/cutlass_backend/")


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", *args], check=True)


def wheel(wheels: Path, pattern: str, requirement: str, download: bool) -> Path:
    """The wheel in ``wheels`` matching ``pattern``; pip-downloads ``requirement`` when absent."""
    found = sorted(glob.glob(str(wheels / pattern)))
    if not found and download:
        _pip("--no-deps", "-d", str(wheels), requirement)
        found = sorted(glob.glob(str(wheels / pattern)))
    if not found:
        raise SystemExit(f"no {pattern} in {wheels} (and no download): pip download --no-deps "
                         f"-d {wheels} {requirement}")
    return Path(found[-1])


def _keep_flashinfer(name: str) -> bool:
    if not name.startswith("flashinfer/data/"):
        return not name.endswith((".so", ".cubin"))
    if name.startswith(FI_DATA_KEEP):
        return True
    return name.startswith("flashinfer/data/csrc/") and name.endswith(HEADERS)


def _keep_sglang(name: str) -> bool:
    if ".dist-info/" in name:
        return True
    return (name.endswith(".py") or "/triton_utils/configs/" in name
            or name.startswith("sglang/kernels/jit/"))


def zip_to_tar(whl: Path, tar: Path, keep) -> int:
    """Copy the members of ``whl`` that ``keep(name)`` accepts into a gzip tarball; returns count."""
    n = 0
    tmp = tar.with_suffix(".part")
    with zipfile.ZipFile(whl) as z, tarfile.open(tmp, "w:gz", compresslevel=6) as t:
        for info in z.infolist():
            if info.is_dir() or not keep(info.filename):
                continue
            ti = tarfile.TarInfo(info.filename)
            ti.size = info.file_size
            ti.mode = 0o644
            with z.open(info) as f:
                t.addfile(ti, f)
            n += 1
    tmp.replace(tar)
    return n


def main(argv: list[str] | None = None) -> int:
    """Fill the payload folder; prints what went in."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels", type=Path, default=ROOT / ".whl")
    ap.add_argument("--payload", type=Path, default=HERE / ".payload")
    ap.add_argument("--no-download", action="store_true", help="use only what --wheels holds")
    ap.add_argument("--python-version", default="3.12", help="of the GPU machine's python3")
    a = ap.parse_args(argv)
    a.wheels.mkdir(parents=True, exist_ok=True)
    (a.payload / "wheels").mkdir(parents=True, exist_ok=True)
    dl = not a.no_download
    fi = wheel(a.wheels, "flashinfer_python-0.7.2-*.whl", FLASHINFER, dl)
    sg = wheel(a.wheels, "sglang-0.5.23-*.whl", SGLANG, dl)
    small = a.wheels / "small-cp312"
    if dl and not glob.glob(str(small / "*.whl")):
        _pip(*PLATFORM, "--python-version", a.python_version, "-d", str(small), *SMALL)
    for w in sorted(glob.glob(str(small / "*.whl"))):
        if not Path(w).name.startswith(SKIP_SMALL):
            (a.payload / "wheels" / Path(w).name).write_bytes(Path(w).read_bytes())
    n_fi = zip_to_tar(fi, a.payload / "flashinfer-moe-src.tar.gz", _keep_flashinfer)
    n_sg = zip_to_tar(sg, a.payload / "sglang-py.tar.gz", _keep_sglang)
    (a.payload / "READY").write_text(f"{fi.name}\n{sg.name}\n")
    total = sum(p.stat().st_size for p in a.payload.rglob("*") if p.is_file())
    print(f"payload {a.payload}: {n_fi} FlashInfer files, {n_sg} SGLang files, "
          f"{len(list((a.payload / 'wheels').glob('*.whl')))} wheels, {total / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
