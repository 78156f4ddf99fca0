#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The decode exchange against the all-gather baseline, in process (bench_decode) and between MPI
# processes (bench_mpi_decode, one run per group size), then bench/report's decode tables.
#
#   bench/run_decode.sh [OUTDIR]          (default OUTDIR: bench/results; writes decode.md there)
#
# Per (P, B), B in {1, 4, 16, 64, 256, 1024}, Llama-3.1-8B decode (H=32, Dv=128, T=1, bf16 O):
# the time of the baseline (all-gather of O and LSE, local merge) and of the library's variants
# (default path; Path::direct), the fastest of REPS repetitions, and the gains against the
# issue's targets (>= 1.5x at B >= 64, >= 1.0x at B = 1).
# Environment knobs: BUILD_DIR (default build-bench), JSON_DIR (default BUILD_DIR/bench_json),
# MIN_TIME (default 0.2), REPS (default 5), FILTER (default: all), MPI_RANKS (default "2 4";
# empty: in process only), INTERLEAVE (default true: the in-process repetitions in random order).
# decode.md ends with ulysses_perf --op decode's tables (P in MPI_RANKS, in process and under MPI).
# Needs: CMake, a C++17 compiler, Google Benchmark, MPI for bench_mpi_decode, python3.
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ub_paths "${1:-}" "$root/bench/results" "$root/build-bench"
ranks="${MPI_RANKS-2 4}"

ub_configure
targets=(bench_decode ulysses_perf)
if [ -n "$ranks" ] && ub_has_target bench_mpi_decode; then
  targets+=(bench_mpi_decode)  # only when MPI was found
fi
ub_build "${targets[@]}"
ub_load "$raw/decode_load.txt" before

common=(--benchmark_min_time="${MIN_TIME:-0.2}" --benchmark_repetitions="${REPS:-5}" --benchmark_filter="${FILTER:-.}"
        --benchmark_out_format=json)
[ "${REPS:-5}" -gt 1 ] && common+=(--benchmark_display_aggregates_only=true)  # the JSON keeps every repetition

echo "== bench_decode -> $raw/decode.json"
# In process the repetitions of the variants are interleaved in random order, so that a burst of
# other load on the machine hits every variant alike (not under MPI: the ranks' orders would differ).
"$build/bench/bench_decode" "${common[@]}" --benchmark_enable_random_interleaving="${INTERLEAVE:-true}" \
  --benchmark_out="$raw/decode.json"
jsons=("$raw/decode.json")

if [ -n "$ranks" ] && [ -x "$build/bench/bench_mpi_decode" ]; then
  ub_mpi_env
  for n in $ranks; do
    echo "== mpiexec -n $n bench_mpi_decode -> $raw/decode_mpi_p$n.json"
    mpiexec -n "$n" "${mpi_flags[@]}" "$build/bench/bench_mpi_decode" "${common[@]}" --benchmark_out="$raw/decode_mpi_p$n.json"
    jsons+=("$raw/decode_mpi_p$n.json")
  done
else
  echo "== bench_mpi_decode skipped (not built or MPI_RANKS empty)"
fi

ub_load "$raw/decode_load.txt" after
python3 "$here/report" "${jsons[@]}" -o "$out" --name decode
{
  printf '\n## The decode exchange as ulysses_perf --op decode times it\n\nThe call against the bare all-to-all-v of its bytes, alternating per iteration (docs/performance.md#ulysses_perf):\n'
  ub_perf_tables decode "$ranks" --model llama-3.1-8b --dtype bf16 -b 1 -e 1024 -f 4 -c 1
} >>"$out/decode.md"
