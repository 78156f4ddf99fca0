#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds and runs every CPU benchmark, then bench/report: one command, about 5-8 minutes on 2 cores.
#
#   bench/run_cpu.sh [OUTDIR]          (default OUTDIR: bench/results)
#
# Writes OUTDIR/cpu.md + OUTDIR/cpu.png (bench/report) from the Google Benchmark JSON it keeps in
# JSON_DIR (host.json, mpi_p2.json, mpi_p4.json). Environment knobs:
#   BUILD_DIR  build directory (default build-bench; configured with CMAKE_BUILD_TYPE=Release);
#              JOBS parallel build jobs (default 1); the load before and after: JSON_DIR/cpu_load.txt
#   JSON_DIR   where the raw JSON goes (default BUILD_DIR/bench_json, outside the source tree)
#   MIN_TIME   --benchmark_min_time per repetition, seconds (default 0.2)
#   REPS       --benchmark_repetitions (default 5; the report takes the fastest: the run least
#              disturbed by other load; bench/report --stat median for the median)
#   FILTER     --benchmark_filter regex (default: all)
#   MPI_RANKS  group sizes run under mpiexec (default "2 4"; empty: skip MPI)
#   PERF_LOCAL 1 (default): also run ulysses_perf --backend local --ranks 4 --model llama-3.1-8b at
#              S = 4096, 16384, fp32 and bf16, and append its tables to the report (the tool and
#              bench_host time the in-process calls the same way: they should agree within noise);
#              0: skip
# Needs: CMake >= 3.25, a C++17 compiler, Google Benchmark (libbenchmark-dev), MPI for bench_mpi
# (e.g. openmpi-bin libopenmpi-dev), python3 (+ python3-matplotlib for the chart).
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ub_paths "${1:-}" "$root/bench/results" "$root/build-bench"
min_time="${MIN_TIME:-0.2}"
reps="${REPS:-5}"
filter="${FILTER:-.}"
ranks="${MPI_RANKS-2 4}"

ub_configure
perf_local="${PERF_LOCAL:-1}"
targets=(bench_host)
[ "$perf_local" = 1 ] && targets+=(ulysses_perf)
if [ -n "$ranks" ] && ub_has_target bench_mpi; then
  targets+=(bench_mpi)  # only when MPI was found and MPI runs are asked for
fi
ub_build "${targets[@]}"
[ -x "$build/bench/bench_host" ] || { echo "run_cpu.sh: bench_host was not built (is Google Benchmark installed? apt-get install libbenchmark-dev)" >&2; exit 1; }

common=(--benchmark_min_time="$min_time" --benchmark_repetitions="$reps" --benchmark_filter="$filter"
        --benchmark_out_format=json)
[ "$reps" -gt 1 ] && common+=(--benchmark_display_aggregates_only=true)  # JSON keeps every repetition

jsons=("$raw/host.json")
ub_load "$raw/cpu_load.txt" before
echo "== bench_host -> $raw/host.json"
"$build/bench/bench_host" "${common[@]}" --benchmark_out="$raw/host.json"

if [ "$perf_local" = 1 ] && [ -x "$build/bench/ulysses_perf" ]; then
  for dt in fp32 bf16; do
    echo "== ulysses_perf --backend local --ranks 4 --dtype $dt -> $raw/perf_local_$dt.json"
    "$build/bench/ulysses_perf" --backend local --ranks 4 --direction both --model llama-3.1-8b --dtype "$dt" -b 4096 -e 16384 -f 4 -n 15 -w 3 \
      --json "$raw/perf_local_$dt.json"
    jsons+=("$raw/perf_local_$dt.json")
  done
fi

if [ -n "$ranks" ] && [ -x "$build/bench/bench_mpi" ]; then
  ub_mpi_env
  for n in $ranks; do
    echo "== mpiexec -n $n bench_mpi -> $raw/mpi_p$n.json"
    mpiexec -n "$n" "${mpi_flags[@]}" "$build/bench/bench_mpi" "${common[@]}" --benchmark_out="$raw/mpi_p$n.json"
    jsons+=("$raw/mpi_p$n.json")
  done
else
  echo "== bench_mpi skipped (not built or MPI_RANKS empty)"
fi

ub_load "$raw/cpu_load.txt" after
# The report needs python3; the chart needs matplotlib.
"$(ub_python)" "$here/report" "${jsons[@]}" -o "$out"
