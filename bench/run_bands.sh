#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The band pipeline (bands.hpp) against the serial layer, every place this machine can run it:
#
#   bench/run_bands.sh [OUT.md]        (default bench/results/bands.md)
#
# 1. in-process (LocalGroup, 2 ranks): the stand-in attention spinning (host compute: it needs the
#    cores the copies need) and sleeping (a device kernel: the host is free), Llama-3.1-8B bf16;
# 2. the MPI processes of this node (4 ranks) over MpiWindowComm (the peer copy) and MpiComm, both kinds;
# 3. throttled links between two network namespaces (bench/netns/netns.sh bands: 2 and 4 ranks,
#    1 Gbit/s), where MPI moves bytes only while a thread is in MPI: Progress::thread and in_start;
# 4. the simulated cluster (SMPI, bench/smpi/smpi.sh perf): 64 ranks on 8 nodes of 8 GPUs,
#    Llama-3.1-70B at S = 128k, Ulysses groups of 8 (in a node) and of 16 (two nodes).
# Each table is one run of ulysses_perf --op bands (f = 0.25, 1, 4; G = 1, 2, 4, 8); the advised
# G is the cost model's (band_cost() of the run's own exchanges). Knobs: BUILD (build), ITERS (9),
# NETNS_ITERS (15: over the throttled link a median of 5 moved by up to 30% between two timings of
# the same exchange in one run), SKIP ("netns smpi" to leave those out).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="${BUILD:-$root/build}"
out="${1:-$root/bench/results/bands.md}"
perf="$build/bench/ulysses_perf"
iters="${ITERS:-9}"
[ -x "$perf" ] || { echo "run_bands.sh: no $perf (cmake --build $build --target ulysses_perf)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
skip() { case " ${SKIP:-} " in *" $1 "*) return 0 ;; esac; return 1; }
common=(--op bands --model Llama-3.1-8B --dtype bf16 -n "$iters" -w 1 --bands 1,2,4,8 --attn-ratio 0.25,1,4)
{
  echo "# bench/run_bands.sh, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(uname -sr)"
  echo
  echo "## In-process (LocalGroup, 2 ranks on threads)"
  for kind in spin sleep; do
    echo
    "$perf" "${common[@]}" --backend local --ranks 2 -b 16384 -e 16384 --attn-kind "$kind"
  done
  echo
  echo "## The MPI processes of one node (4 ranks)"
  for backend in window mpi; do
    for kind in spin sleep; do
      echo
      mpiexec --oversubscribe -n 4 "$perf" "${common[@]}" --backend "$backend" --mpi-window "$([ $backend = window ] && echo 1 || echo 0)" \
        -b 16384 -e 16384 --attn-kind "$kind" --progress thread
    done
  done
  if ! skip netns; then
    echo
    echo "## Throttled links (two network namespaces, 1 Gbit/s; bench/netns/netns.sh bands)"
    echo
    PERF="$perf" BAND_ITERS="${NETNS_ITERS:-15}" bash "$here/netns/netns.sh" bands "$(mktemp -d)" | grep -v '^netns.sh:'
  fi
  if ! skip smpi && [ -x "$root/build-smpi/ulysses_perf" ]; then
    echo
    echo "## The simulated cluster (SMPI: 64 ranks, 8 nodes of 8 GPUs, NVLink 450 GB/s, IB 50 GB/s a GPU)"
    for groups in 8 4; do
      echo
      BUILD="$root/build-smpi" ULYSSES_SMPI_FOLD_BYTES=1048576 bash "$here/smpi/smpi.sh" perf 8 --op bands --model Llama-3.1-70B --dtype bf16 -b 131072 -e 131072 \
        -n 3 -w 1 --groups "$groups" --bands 1,2,4,8 --attn-ratio 0.25,1,4 -c 0 --copies 0 2>/dev/null | awk '!seen[$0]++'
    done
  fi
} > "$out"
echo "run_bands.sh: $out"
