#!/usr/bin/env bash
# `make gpu-clamp-check`: gather the payload (once, needs PyPI or CLAMP_WHEELS=<folder of wheels>),
# build FlashInfer's BF16 SM90 fused-MoE subset, run the check. Needs a CUDA GPU (SM90 for the
# FlashInfer part), nvcc >= 12.8, ninja and torch + triton in $PYTHON.
# Writes $CLAMP_CHECK_OUT (default gpu/clamp_kernels/.build/clamp_kernels.json).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
OUT=${CLAMP_CHECK_OUT:-$HERE/.build/clamp_kernels.json}
if [ ! -f "$HERE/.payload/READY" ]; then
  "$PY" "$HERE/prepare.py" ${CLAMP_WHEELS:+--wheels "$CLAMP_WHEELS" --no-download}
fi
"$PY" "$HERE/build.py" --payload "$HERE/.payload" --work "$HERE/.build"
"$PY" "$HERE/check.py" --work "$HERE/.build" --out "$OUT"
echo "compare with the stored H200 result: lib/nvfp4study/sglang/data/clamp_kernels_h200.json"
