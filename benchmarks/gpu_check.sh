#!/usr/bin/env bash
# One GPU run, under 8 minutes on one H100/H200-class card: the kernel tests with CUDA (hypothesis
# "gpu" profile), the paper-scale checks in tests/gpu, then the kernel benchmark. Everything it
# measures lands in $OUT (default benchmarks/results); copy it back under benchmarks/results/.
#
#   OUT=/some/dir bash benchmarks/gpu_check.sh
#
# The lent machine has torch and Triton but may lack a registry, pytest or hypothesis: the install is
# --no-deps, and without pytest the paper-scale checks run through their own __main__ runner.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
log() { echo "== $*" | tee -a "$OUT/gpu_check.log"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu_check.log"
python - <<'PY' | tee -a "$OUT/gpu_check.log"
import torch, triton, sys
print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)
PY
if ! pip install --no-deps --no-build-isolation -e . >/dev/null 2>&1; then
  log "pip install failed; linking reference/ and kernels/ into the package instead"
  ln -sfn ../reference dspark/reference
  ln -sfn ../kernels dspark/kernels
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi

status=0
if python -c "import pytest, hypothesis" 2>/dev/null; then
  log "kernel tests (CUDA, hypothesis profile gpu)"
  HYPOTHESIS_PROFILE=gpu timeout 240 python -m pytest -q tests/kernels tests/gpu 2>&1 | tee -a "$OUT/gpu_check.log"
  status=${PIPESTATUS[0]}
else
  log "pytest/hypothesis missing: running tests/gpu through its own runner"
  timeout 240 python -m tests.gpu.test_gpu_kernels 2>&1 | tee -a "$OUT/gpu_check.log"
  status=${PIPESTATUS[0]}
fi
log "kernel benchmark"
DSPARK_AUTOTUNE=1 timeout 200 python benchmarks/bench_kernels.py --device cuda --out "$OUT" 2>&1 | tee -a "$OUT/gpu_check.log"
log "tests exit status $status"
exit "$status"
