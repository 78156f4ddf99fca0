#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The ring benchmarks of issue 19 in one run: bench_ring (in process, R = 2 and 4) and
# bench_ring_mpi (mpiexec -n 2 and -n 4), then bench/report (the ring tables, the 1.1x target)
# and ulysses_perf --check-ring (the cost model's ring step and exposed communication against
# the measurements), written to OUTDIR/ring.md.
#
#   bench/run_ring.sh [OUTDIR]          (default OUTDIR: bench/results)
#
# Environment: BUILD_DIR (default build-bench), JSON_DIR (default BUILD_DIR/bench_json),
# MIN_TIME (--benchmark_min_time, default 0.1), REPS (default 5; the report takes the fastest,
# in process the repetitions interleaved at random so that load drift spreads over every benchmark;
# not under MPI, where each process would draw its own order), FILTER,
# PARAMS (the exchanges' fit for the out-of-sample check, default bench/results/cost/params.json),
# REPORT_ONLY=1 (no benchmark: the tables again from the JSON of the last run in JSON_DIR).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
out="${1:-$root/bench/results}"
build="${BUILD_DIR:-$root/build-bench}"
raw="${JSON_DIR:-$build/bench_json}"
cd "$root"
params="${PARAMS:-bench/results/cost/params.json}"
mkdir -p "$out" "$raw"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$build" --target bench_ring bench_ring_mpi ulysses_perf -j "${JOBS:-1}"
jsons=("$raw/ring_local.json" "$raw/ring_mpi_p2.json" "$raw/ring_mpi_p4.json")
if [ "${REPORT_ONLY:-0}" = 1 ]; then  # the tables again from the last run's JSON (no benchmark)
  skip=1
else
  skip=0
fi
common=(--benchmark_min_time="${MIN_TIME:-0.1}" --benchmark_repetitions="${REPS:-5}" --benchmark_filter="${FILTER:-.}"
        --benchmark_display_aggregates_only=true --benchmark_out_format=json)
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMPI_MCA_rmaps_base_oversubscribe=1
if [ "$skip" = 0 ]; then
  uptime | tee "$raw/ring_load.txt"
  echo "== bench_ring -> $raw/ring_local.json"
  "$build/bench/bench_ring" "${common[@]}" --benchmark_enable_random_interleaving=true --benchmark_out="$raw/ring_local.json"
  for n in 2 4; do
    echo "== mpiexec -n $n bench_ring_mpi -> $raw/ring_mpi_p$n.json"
    mpiexec -n "$n" "$build/bench/bench_ring_mpi" "${common[@]}" --benchmark_out="$raw/ring_mpi_p$n.json"
  done
  uptime | tee -a "$raw/ring_load.txt"
fi
python3 "$here/report" "${jsons[@]}" -o "$out" --name ring
{
  echo
  echo "Load (uptime) before and after the run: $(paste -sd ';' "$raw/ring_load.txt")."
  echo
  "$build/bench/ulysses_perf" --check-ring "$params" "${jsons[@]}"
} >>"$out/ring.md"
echo "run_ring.sh: wrote $out/ring.md"
