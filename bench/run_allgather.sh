#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# All-gather KV (allgather.hpp) against the bare all-gather of the same bytes, every place this
# machine runs it (ulysses_perf --allgather-kv, bench/perf_allgather.hpp):
#
#   bench/run_allgather.sh [OUT.md]        (default bench/results/allgather.md)
#
# 1. in-process (LocalGroup, 4 ranks on threads): against exchange_messages() of each rank's k|v;
# 2. the MPI processes of this node (2 ranks, one a core; then 4) over MpiComm (--mpi-window 0):
#    against MPI_Allgatherv of the same bytes (target: ratio <= 1.10); every buffer of a line in one
#    huge-page arena (perf_allgather.hpp), the library's and the bare's alike;
# 3. the same over MpiWindowComm (--mpi-window 1, the peer copy; k, v, k_all, v_all in the window):
#    against MPI_Allgatherv between private buffers and between buffers of the same window (target:
#    ratio <= 1.0).
# Llama-3.1-8B (Hkv = 8, D = Dv = 128), bf16, B = 1, S = 1024, 4096, 16384, even and zigzag splits,
# every gathered byte checked (-c 1). Knobs: BUILD (build), ITERS (20; the committed run: 50), SIZES ("-b 1024 -e 16384 -f 4").
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="${BUILD:-$root/build}"
out="${1:-$root/bench/results/allgather.md}"
perf="$build/bench/ulysses_perf"
iters="${ITERS:-20}"
read -r -a sizes <<< "${SIZES:--b 1024 -e 16384 -f 4}"
[ -x "$perf" ] || { echo "run_allgather.sh: no $perf (cmake --build $build --target ulysses_perf)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
common=(--allgather-kv --model Llama-3.1-8B --dtype bf16 "${sizes[@]}" -n "$iters" -w 3 -c 1)
run() {  # the command, then its table
  echo
  echo '```'
  echo "\$ ${*/#$build\//build/}"
  "$@"
  echo '```'
}
{
  echo "# bench/run_allgather.sh, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(uname -sr), $(mpiexec --version 2>/dev/null | head -1)"
  echo
  echo "$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'); other builds may share the cores (4 ranks on $(nproc): oversubscribed)."
  echo
  echo "## In-process (LocalGroup, 4 ranks on threads)"
  run "$perf" "${common[@]}" --backend local --ranks 4
  echo
  echo "## The MPI processes of one node (2 ranks, one a core) over MpiComm"
  run mpiexec -n 2 "$perf" "${common[@]}" --backend mpi --mpi-window 0
  echo
  echo "## The MPI processes of one node (4 ranks) over MpiComm"
  run mpiexec --oversubscribe -n 4 "$perf" "${common[@]}" --backend mpi --mpi-window 0
  echo
  echo "## The MPI processes of one node (4 ranks) over MpiWindowComm (the peer copy)"
  run mpiexec --oversubscribe -n 4 "$perf" "${common[@]}" --backend mpi --mpi-window 1
} > "$out"
echo "run_allgather.sh: $out"
