"""FlashInfer 0.7.2's SM90 CUTLASS fused-MoE module, cut down to BF16 x BF16 experts.

The full module (``flashinfer/jit/fused_moe.py`` 163-181 ``gen_cutlass_fused_moe_sm90_module``,
sources 220-273) compiles about 249 sources, roughly 45-50 min on 16 cores. This keeps FlashInfer's
own JIT build (its flags, include paths, ninja file and module name ``fused_moe_90``) and changes
only the source list:

- the CUTLASS kernel generator (``flashinfer/jit/gemm/cutlass/generate_kernels.py``
  ``generate_gemm_operations``) emits only the BF16 x BF16 grouped GEMMs (SM90 TMA warp-specialized
  and the SM80 fallback), by filtering ``generate_sm90_operations`` / ``generate_sm80_operations``;
- of the fixed sources, the other-dtype ``moe_gemm_kernels_*.cu``, ``fp8_blockscale_gemm.cu``,
  ``moe_gemm_mixed_utils.cu`` and ``deepgemm_jit_setup.cu`` are dropped;
- ``cutlass_fused_moe_instantiation.cu`` is replaced by a copy holding only the
  ``CutlassMoeFCRunner<__nv_bfloat16, __nv_bfloat16>`` line and the finalize-routing lines;
- ``deepgemm_jit_setup.cu`` is replaced by a copy whose ``set_deepgemm_jit_include_dirs`` does
  nothing (``fused_moe/core.py`` 666-672 calls it after loading; DeepGEMM serves FP8 block scale);
- the symbols of the other dtypes' runners that the binding still names
  (``flashinfer_cutlass_fused_moe_binding.cu`` 130-310 builds a runner per dtype) are defined by a
  generated ``stubs.cpp`` whose functions trap: a call to any of them aborts, none returns a value;
- ``-lnvrtc`` (needed only by DeepGEMM's JIT) is dropped from the link flags.

Import this module and call :func:`install` before FlashInfer builds or loads the module, in the
build and in every process that runs it (otherwise FlashInfer rewrites its ninja file with the full
source list and starts the 45-minute build).
"""

from __future__ import annotations

import re
from pathlib import Path

KEEP_FIXED = (
    "moe_gemm_tma_warp_specialized_input.cu",
    "moe_gemm_kernels_bf16_bf16.cu",
    "flashinfer_cutlass_fused_moe_binding.cu",
    "envUtils.cpp",
    "logger.cpp",
    "stringUtils.cpp",
    "tllmException.cpp",
    "memoryUtils.cu",
    "preQuantScaleKernel.cu",
    "cutlass_heuristic.cpp",
    "lora.cpp",
)

_INSTALLED: dict = {}


def subset_dir() -> Path:
    """Where the replacement sources and ``stubs.cpp`` live (inside FlashInfer's workspace)."""
    from flashinfer.jit import env as jit_env

    return jit_env.FLASHINFER_WORKSPACE_DIR / "clamp_check_subset"


def _is_bf16_pair(op) -> bool:
    from flashinfer.jit.gemm.cutlass.cutlass_library import DataType

    if type(op).__name__ == "GemmSm80LauncherConfig":
        return op.dtype == DataType.bf16
    return (op.act_type == DataType.bf16 and op.weight_type == DataType.bf16
            and str(op.gemm_kind).endswith("Grouped"))


def _write_replacements(csrc: Path) -> list[Path]:
    out = subset_dir()
    out.mkdir(parents=True, exist_ok=True)
    backend = csrc / "fused_moe" / "cutlass_backend"
    inst = (backend / "cutlass_fused_moe_instantiation.cu").read_text()
    kept = []
    for line in inst.splitlines():
        s = line.strip()
        if s.startswith("template class CutlassMoeFCRunner<") and \
                s != "template class CutlassMoeFCRunner<__nv_bfloat16, __nv_bfloat16>;":
            continue
        if s.startswith("__nv_bfloat16, false, Sm90Wfp4Afp8ScaleMode") or \
                s.startswith("__nv_bfloat16, true>;") or s.startswith("Sm90Wfp4Afp8ScaleMode"):
            continue
        kept.append(line)
    text = "\n".join(kept) + "\n"
    # continuation lines of multi-line instantiations that were dropped above
    text = re.sub(r"^\s+[^\n]*>;\n", "", text, flags=re.M)
    inst_out = out / "cutlass_fused_moe_instantiation_bf16.cu"
    _write_if_different(inst_out, text.replace('#include "cutlass_fused_moe_kernels.cuh"',
                                               f'#include "{backend}/cutlass_fused_moe_kernels.cuh"'))
    dg = (backend / "deepgemm_jit_setup.cu").read_text()
    dg = dg.replace('#include "nv_internal/tensorrt_llm/deep_gemm/compiler.cuh"\n', "")
    dg = re.sub(r"(set_deepgemm_jit_include_dirs\(tvm::ffi::Array<tvm::ffi::String> include_dirs\) \{)"
                r".*?\n\}\n", r"\1\n  (void)include_dirs;  // clamp check: DeepGEMM not built\n}\n",
                dg, flags=re.S)
    dg_out = out / "deepgemm_jit_setup_noop.cu"
    _write_if_different(dg_out, dg)
    files = [inst_out, dg_out]
    stubs = out / "stubs.cpp"
    if stubs.exists():
        files.append(stubs)
    return files


def _write_if_different(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def install() -> dict:
    """Patch FlashInfer's generator and JIT spec so ``fused_moe_90`` is the BF16 subset.

    Returns a dict describing the subset (filled in as FlashInfer calls the patched functions:
    ``sources`` is the list it builds). Idempotent.
    """
    if _INSTALLED:
        return _INSTALLED
    import flashinfer.jit.fused_moe as fm
    import flashinfer.jit.gemm.cutlass.generate_kernels as gk

    orig90, orig80 = gk.generate_sm90_operations, gk.generate_sm80_operations
    gk.generate_sm90_operations = lambda enabled: [o for o in orig90(enabled) if _is_bf16_pair(o)]
    gk.generate_sm80_operations = lambda enabled: [o for o in orig80(enabled) if _is_bf16_pair(o)]
    orig_spec = fm.gen_jit_spec

    def subset_spec(name, sources, **kw):
        if not name.startswith("fused_moe_90"):
            return orig_spec(name, sources, **kw)
        csrc = Path(fm.jit_env.FLASHINFER_CSRC_DIR)
        keep = [Path(s) for s in sources
                if Path(s).name in KEEP_FIXED or str(s).endswith(".generated.cu")]
        keep += _write_replacements(csrc)
        kw["extra_ldflags"] = [f for f in (kw.get("extra_ldflags") or []) if f != "-lnvrtc"]
        _INSTALLED["sources"] = [str(s) for s in keep]
        _INSTALLED["generated"] = sorted(Path(s).name for s in keep
                                         if str(s).endswith(".generated.cu"))
        _INSTALLED["nvcc_flags"] = list(kw.get("extra_cuda_cflags") or [])
        return orig_spec(name, keep, **kw)

    fm.gen_jit_spec = subset_spec
    _INSTALLED["installed"] = True
    return _INSTALLED
