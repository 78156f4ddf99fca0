#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The peer copy between MPI processes (bench_mpi_window.cpp): builds it, runs it under mpiexec for
# each group size (the JSON: JSON_DIR/window_pN.json), and bench/report turns the JSON into the
# tables and issue 18's targets (OUTDIR/window.md).
#
#   bench/run_window.sh [OUTDIR]          (default OUTDIR: bench/results; writes window.md there)
#
# Per case (Llama-3.1-8B q, k, v seq->head and o head->seq; S in {4096, 16384}, B in {1, 4}, fp32
# and bf16): the time of each variant (fastest of REPS repetitions, the run least disturbed by other
# load), window / MPI_Alltoall (target <= 1.0), deepspeed / window (target >= 1.5) and
# window_staged / MPI_Alltoall (inputs outside the window, outputs private: Cross Memory Attach) and
# window_staged_outputs / MPI_Alltoall (inputs outside the window, outputs in it: seq->head pushes)
# (target <= 1.3).
# Environment knobs: BUILD_DIR (default build-bench), JSON_DIR (default BUILD_DIR/bench_json),
# MIN_TIME (default 0.2), REPS (default 5), FILTER (default: all), MPI_RANKS (default "4").
# Needs: CMake, a C++17 compiler, Google Benchmark, MPI, python3.
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ub_paths "${1:-}" "$root/bench/results" "$root/build-bench"
ranks="${MPI_RANKS-4}"

ub_configure
ub_build bench_mpi_window
ub_mpi_env
ub_load "$raw/window_load.txt" before
jsons=()
for n in $ranks; do
  echo "== mpiexec -n $n bench_mpi_window -> $raw/window_p$n.json"
  mpiexec -n "$n" "${mpi_flags[@]}" "$build/bench/bench_mpi_window" --benchmark_min_time="${MIN_TIME:-0.2}" \
    --benchmark_repetitions="${REPS:-5}" --benchmark_display_aggregates_only=true --benchmark_filter="${FILTER:-.}" \
    --benchmark_out_format=json --benchmark_out="$raw/window_p$n.json"
  jsons+=("$raw/window_p$n.json")
done

ub_load "$raw/window_load.txt" after
python3 "$here/report" "${jsons[@]}" -o "$out" --name window
