#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# GPU check: builds the CUDA parts for sm_90 (H100/H200), runs the CUDA tests, the --device cuda
# demo, the NCCL example on one GPU and the CUDA benchmarks, and writes into OUTDIR:
#   configure.log build.log test.log demo.log bench.log bench_cuda.json nvidia-smi.txt summary.txt
# Usage: bench/gpu_check.sh OUTDIR   (env: BUILD_DIR, default <repo>/build-gpu; JOBS, default 16)
# Budget: under 8 minutes on one H200 (16 cores): build ~1-2 min, tests ~1 min, benchmarks ~2 min.
# Exit status: 0 when every step passed, else the number of failed steps.
set -uo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
mkdir -p "$1" && OUT=$(cd "$1" && pwd)
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${BUILD_DIR:-$SRC/build-gpu}
JOBS=${JOBS:-16}
failed=0
step() {  # step NAME TIMEOUT_S LOG COMMAND...: runs COMMAND with a timeout, tees its output into LOG
  local name=$1 limit=$2 log=$3
  shift 3
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  local rc=$?
  if [ $rc -eq 77 ]; then  # the program's "no CUDA device: skipping"
    echo "$name: skipped (no CUDA device), $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
    return 0
  fi
  echo "$name: exit $rc, $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
  [ $rc -eq 0 ] || { failed=$((failed + 1)); tail -n 30 "$log"; }
  return $rc
}
: >"$OUT/summary.txt"
(nvidia-smi || echo "nvidia-smi not available") >"$OUT/nvidia-smi.txt" 2>&1

step configure 120 "$OUT/configure.log" cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DULYSSES_BUILD_TESTS=ON -DULYSSES_BUILD_EXAMPLES=ON -DULYSSES_BUILD_BENCHMARKS=ON ||
  { echo "configure failed; see $OUT/configure.log"; exit 1; }
grep -E "^-- ulysses:" "$OUT/configure.log" | tee -a "$OUT/summary.txt"

# Only what the GPU check runs (the CPU suite is CI's job).
targets=()
available=$(cmake --build "$BUILD" --target help 2>/dev/null)
for t in test_cuda_copy test_comm_nccl bench_cuda ulysses_attention nccl_mpi; do
  grep -qE "(^|[ .:])$t([ :]|$)" <<<"$available" && targets+=("$t")
done
echo "targets: ${targets[*]}" | tee -a "$OUT/summary.txt"
step build 300 "$OUT/build.log" cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}" ||
  { echo "build failed; see $OUT/build.log"; exit 1; }

step tests 240 "$OUT/test.log" ctest --test-dir "$BUILD" -L cuda --output-on-failure
demo=$BUILD/examples/ulysses_attention/ulysses_attention
bench=$BUILD/bench/bench_cuda
if [ -x "$demo" ]; then
  step demo 120 "$OUT/demo.log" "$demo" --device cuda --seq 1024
else
  echo "demo: not built (examples off?)" | tee -a "$OUT/summary.txt"
fi
if [ -x "$bench" ]; then
  step bench 240 "$OUT/bench.log" "$bench" --benchmark_out="$OUT/bench_cuda.json" \
    --benchmark_out_format=json --benchmark_min_time=0.2
  cat "$OUT/bench.log" >>"$OUT/summary.txt"
else
  echo "bench: bench_cuda not built (Google Benchmark missing?)" | tee -a "$OUT/summary.txt"
  failed=$((failed + 1))
fi
echo "gpu_check: $failed step(s) failed; logs in $OUT" | tee -a "$OUT/summary.txt"
exit "$failed"
