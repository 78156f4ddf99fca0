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
# ring.md ends with ulysses_perf --op ring's tables (R = 2 and 4, in process and under MPI).
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ub_paths "${1:-}" "$root/bench/results" "$root/build-bench"
cd "$root"
params="${PARAMS:-bench/results/cost/params.json}"
ub_configure
ub_build bench_ring bench_ring_mpi ulysses_perf
jsons=("$raw/ring_local.json" "$raw/ring_mpi_p2.json" "$raw/ring_mpi_p4.json")
if [ "${REPORT_ONLY:-0}" = 1 ]; then  # the tables again from the last run's JSON (no benchmark)
  skip=1
else
  skip=0
fi
common=(--benchmark_min_time="${MIN_TIME:-0.1}" --benchmark_repetitions="${REPS:-5}" --benchmark_filter="${FILTER:-.}"
        --benchmark_display_aggregates_only=true --benchmark_out_format=json)
ub_mpi_env
if [ "$skip" = 0 ]; then
  rm -f "$raw/ring_load.txt"
  ub_load "$raw/ring_load.txt" before
  echo "== bench_ring -> $raw/ring_local.json"
  "$build/bench/bench_ring" "${common[@]}" --benchmark_enable_random_interleaving=true --benchmark_out="$raw/ring_local.json"
  for n in 2 4; do
    echo "== mpiexec -n $n bench_ring_mpi -> $raw/ring_mpi_p$n.json"
    mpiexec -n "$n" "${mpi_flags[@]}" "$build/bench/bench_ring_mpi" "${common[@]}" --benchmark_out="$raw/ring_mpi_p$n.json"
  done
  ub_load "$raw/ring_load.txt" after
fi
python3 "$here/report" "${jsons[@]}" -o "$out" --name ring
{
  echo
  echo "Load (uptime) before and after the run: $(paste -sd ';' "$raw/ring_load.txt")."
  echo
  "$build/bench/ulysses_perf" --check-ring "$params" "${jsons[@]}"
  if [ "$skip" = 0 ]; then
    printf '\n## The rotation as ulysses_perf --op ring times it\n\nA rotation against the bare exchanges of its blocks, alternating per iteration (docs/performance.md#ulysses_perf):\n'
    ub_perf_tables ring "2 4" --model llama-3.1-8b --dtype bf16 --ring-u 4 -b 8192 -e 32768 -f 4 -c 1
  fi
} >>"$out/ring.md"
echo "run_ring.sh: wrote $out/ring.md"
