#!/usr/bin/env bash
# One GPU run, at most 25 minutes on one H100/H200-class card (a 15-minute lease needs SKIP), everything it measures written to $OUT
# (default benchmarks/results); copy it back under benchmarks/results/. Stages, each under its own
# timeout so one failure still leaves the others' results:
#   1. the target's SPS curve (random-weight SmolLM2-135M and Qwen3-8B architectures, bf16)
#   2. the paper-scale kernel checks, then kernel == reference tests with CUDA (the CI's derandomized
#      hypothesis examples, on CUDA tensors)
#   3. the kernel benchmark (Triton vs PyTorch module at paper scale, R = 1, 16, 64, 256, with each op's
#      bandwidth floor; each inference op as called, slim and captured into a CUDA graph)
#   4. what a speculative round costs in target steps at batch 1 and 4, Triton and PyTorch drafting
#      (random-weight SmolLM2-135M target and a drafter of the shipped shapes)
#   5. training-step tokens/s and memory: the CPU recipe's step (bf16, reduced vocabulary) against the
#      plain and fused loss, then plain vs fused at paper scale
#   A. first, the draft side of a decode round at R = 1, 16, 64, 256 (Qwen3-8B shapes, random weights), dynamic,
#      static and captured into CUDA graphs, against the target's pass and its weight-read floor; then captured
#      rounds against eager ones, bit for bit (tests/gpu/test_gpu_graphs.py)
#   0. then the batched training step at the recipe shape: ATen ops and slots/s at 1, 4 and 16
#      sequences per step, eager, compiled and compiled into CUDA graphs (TrainConfig(compile="reduce-overhead")),
#      against the committed training_cuda_recipe.json's 96 ms step
# SKIP names stages to leave out (a lease is short: skip what an earlier run already measured at the same
# code): draft-side, graphs, training-step, sps, paper-checks, kernel-tests, kernel-benchmark, round-cost, training-recipe, training-paper. The
# compile matrix needs no GPU: run benchmarks/compile_matrix.py on a CPU under each Triton version.
#
#   OUT=/some/dir DSPARK_COMMIT=$(git rev-parse --short HEAD) SKIP="sps kernel-benchmark" bash benchmarks/gpu_check.sh
#
# The lent machine has torch, Triton, pytest and hypothesis but no registry: the install is --no-deps.
set -uo pipefail
cd "$(dirname "$0")/.."
for id in ${SKIP:-}; do
  case $id in
    draft-side|graphs|training-step|sps|paper-checks|kernel-tests|kernel-benchmark|round-cost|training-recipe|training-paper) ;;
    *) echo "SKIP names an unknown stage: $id" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
export PYTHONUNBUFFERED=1
log() { echo "== $(date +%T) $*" | tee -a "$LOG"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$LOG"
python -c "import torch, triton, transformers, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, \
'triton', triton.__version__, 'transformers', transformers.__version__)" 2>&1 | tee -a "$LOG"
# An editable install does not map reference/ and kernels/ into the package when the tree's own dspark/
# is first on sys.path, so link them in (the links are git-ignored).
ln -sfn ../reference dspark/reference
ln -sfn ../kernels dspark/kernels
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

status=0
stage() {  # stage ID NAME SECONDS COMMAND...
  local id=$1 name=$2 limit=$3
  shift 3
  if [[ " ${SKIP:-} " == *" $id "* ]]; then
    log "$name skipped (SKIP)"
    return
  fi
  log "$name"
  timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  log "$name exit $rc"
  [ "$rc" -eq 0 ] || status=1
}
stage draft-side "draft side of a round" 240 python benchmarks/bench_draft_side.py --device cuda --out "$OUT"
stage graphs "captured against eager rounds" 150 python -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_graphs.py
stage training-step "batched training step" 150 python benchmarks/bench_training.py --study batching --device cuda \
  --steps 10 --repeats 1 --out "$OUT"
stage sps "SPS profile" 90 python benchmarks/bench_sps.py --device cuda --out "$OUT"
# The paper-scale checks first: the hypothesis suite after them is the one a timeout may cut short. On a fresh
# machine Triton compiles every kernel first: the paper-scale checks took over 120 s there and 21 s once
# compiled, the kernel tests 16 tests in 200 s there and all 36 in 88 s once compiled (H200, Triton 3.6).
stage paper-checks "paper-scale kernel checks" 180 python -m pytest -q -p no:cacheprovider tests/gpu
stage kernel-tests "kernel tests" 200 env HYPOTHESIS_PROFILE=ci python -m pytest -q --maxfail=5 -p no:cacheprovider \
  tests/kernels --deselect tests/kernels/test_compile_matrix.py
stage kernel-benchmark "kernel benchmark" 240 env DSPARK_AUTOTUNE=1 python benchmarks/bench_kernels.py --device cuda \
  --out "$OUT"
stage round-cost "round cost" 90 python benchmarks/bench_round.py --device cuda --out "$OUT"
stage training-recipe "training, recipe scale" 60 python benchmarks/bench_training.py --device cuda --scale recipe \
  --variants plain bf16-vocab fused --steps 20 --repeats 1 --out "$OUT"
stage training-paper "training, paper scale" 80 python benchmarks/bench_training.py --device cuda --scale paper \
  --variants plain fused --steps 3 --repeats 1 --out "$OUT"
log "overall status $status"
exit "$status"
