#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The decode exchange against the all-gather baseline, in process (bench_decode) and between MPI
# processes (bench_mpi_decode, one run per group size), then bench/report's decode tables.
#
#   bench/run_decode.sh [OUTDIR]          (default OUTDIR: bench/results; writes decode.md there)
#
# Per (P, B), B in {1, 4, 16, 64, 256, 1024}, Llama-3.1-8B decode (H=32, Dv=128, T=1, bf16 O):
# the time of the baseline (all-gather of O and LSE, local merge) and of the library's variants
# (default path; DecodePath::direct), the fastest of REPS repetitions, and the gains against the
# issue's targets (>= 1.5x at B >= 64, >= 1.0x at B = 1).
# Environment knobs: BUILD_DIR (default build-bench), JSON_DIR (default BUILD_DIR/bench_json),
# MIN_TIME (default 0.2), REPS (default 5), FILTER (default: all), MPI_RANKS (default "2 4";
# empty: in process only), INTERLEAVE (default true: the in-process repetitions in random order).
# Needs: CMake, a C++17 compiler, Google Benchmark, MPI for bench_mpi_decode, python3.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
out="${1:-$root/bench/results}"
build="${BUILD_DIR:-$root/build-bench}"
raw="${JSON_DIR:-$build/bench_json}"
ranks="${MPI_RANKS-2 4}"
mkdir -p "$out" "$raw"

if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
fi
targets=(bench_decode)
available=$(cmake --build "$build" --target help 2>/dev/null || true)  # (no grep -q in a pipe: SIGPIPE + pipefail)
if [ -n "$ranks" ] && grep -q 'bench_mpi_decode' <<<"$available"; then
  targets+=(bench_mpi_decode)  # only when MPI was found
fi
cmake --build "$build" --target "${targets[@]}" -j "${JOBS:-1}"

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
  flags=()
  if grep -qi "open mpi\|openrte" <<<"$(mpiexec --version 2>&1 || true)"; then
    flags+=(--oversubscribe)  # more ranks than cores on small machines
    if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
  fi
  for n in $ranks; do
    echo "== mpiexec -n $n bench_mpi_decode -> $raw/decode_mpi_p$n.json"
    mpiexec -n "$n" "${flags[@]}" "$build/bench/bench_mpi_decode" "${common[@]}" --benchmark_out="$raw/decode_mpi_p$n.json"
    jsons+=("$raw/decode_mpi_p$n.json")
  done
else
  echo "== bench_mpi_decode skipped (not built or MPI_RANKS empty)"
fi

python3 "$here/report" "${jsons[@]}" -o "$out" --name decode
