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
# REPORT_ONLY=1 (no benchmark: the tables again from the JSON of the last run in JSON_DIR),
# ONLY_PERF=1 (only the ulysses_perf --op ring tables below, written to OUTDIR/ring_perf.md; builds
# ulysses_perf alone).
# ring.md ends with ulysses_perf --op ring's tables (issue 34): R = 4, in process (--backend local
# --ranks 4), under mpiexec -n 4 over MpiComm (--backend mpi) and over MpiWindowComm in place
# (--backend window), Llama-3.1-8B bf16 U=1, blocks of 4-64 MiB (S = 4096 .. 65536), each rotation
# against its baselines in the same alternating run, checked (-c 1); PERF_ITERS (default 10) and
# PERF_WARMUP (default 2) their -n and -w, RING_MESSAGES (default 1) their --ring-messages; then
# the same in process and over the window with --ring-access zero_copy (each step's block read in
# its owner's buffer: no block moves).
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ub_paths "${1:-}" "$root/bench/results" "$root/build-bench"
cd "$root"
params="${PARAMS:-bench/results/cost/params.json}"
ub_configure
ub_mpi_env
# The --op ring tables: the rotation against MPI_Sendrecv, plain MPI's best k-message split and
# ring-flash-attention's pattern (docs/performance.md#ulysses_perf).
ring_perf_tables() {
  local args=(--model llama-3.1-8b --dtype bf16 --ring-u 1 -b 4096 -e 65536 -f 2 -n "${PERF_ITERS:-10}" -w "${PERF_WARMUP:-2}" -c 1)
  UB_PERF_BACKENDS="local mpi window" ub_perf_tables ring 4 "${args[@]}" --ring-messages "${RING_MESSAGES:-1}"
  local b
  for b in local window; do ub_perf_table ring "$b" 4 "${args[@]}" --ring-access zero_copy; done
}
if [ "${ONLY_PERF:-0}" = 1 ]; then
  ub_build ulysses_perf
  {
    printf '# ulysses_perf --op ring\n\nThe rotation against its baselines, alternating per iteration (docs/performance.md#ulysses_perf); load (uptime) at the start: %s.\n' "$(uptime)"
    ring_perf_tables
  } >"$out/ring_perf.md"
  echo "run_ring.sh: wrote $out/ring_perf.md"
  exit 0
fi
ub_build bench_ring bench_ring_mpi ulysses_perf
jsons=("$raw/ring_local.json" "$raw/ring_mpi_p2.json" "$raw/ring_mpi_p4.json")
if [ "${REPORT_ONLY:-0}" = 1 ]; then  # the tables again from the last run's JSON (no benchmark)
  skip=1
else
  skip=0
fi
common=(--benchmark_min_time="${MIN_TIME:-0.1}" --benchmark_repetitions="${REPS:-5}" --benchmark_filter="${FILTER:-.}"
        --benchmark_display_aggregates_only=true --benchmark_out_format=json)
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
    printf '\n## The rotation as ulysses_perf --op ring times it\n\nA rotation against its baselines, alternating per iteration (docs/performance.md#ulysses_perf):\n'
    ring_perf_tables
  fi
} >>"$out/ring.md"
echo "run_ring.sh: wrote $out/ring.md"
