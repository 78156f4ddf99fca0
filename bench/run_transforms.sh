#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# RoPE fused into the pack of seq->head (layout/rope.hpp, RowTransforms) against the plain call and
# against a separate RoPE pass + the plain call, and the row transforms' one-thread throughput:
#
#   bench/run_transforms.sh [OUT.md]        (default bench/results/transforms.md)
#
# 1. in-process (LocalGroup, 4 ranks on threads): ulysses_perf --op seq_to_head --rope;
# 2. the MPI processes of this node (mpiexec -n 4): --rope over MpiWindowComm (the peer copy);
# 3. ulysses_perf --op transform: the transformed copy with Rope (bf16, fp32) and the fp8 e4m3
#    quantize of the fp32 rows, against std::memcpy of the same bytes, one thread.
# Llama-3.1-8B shapes (H=32, Hkv=8, D=128), bf16, S = 4096, 8192, 16384; every table checked bit
# for bit (-c 1: (b) fused == (c) separate). Knobs: BUILD_DIR (build), ITERS (10), JOBS (1), S0 and
# S1 (the --rope sweep, 4096 and 16384), T0 and T1 (--op transform's tokens, 1024 and 4096).
# The flags a consumer builds with are its own: BUILD_DIR=build-o2 after
# `cmake -B build-o2 -DCMAKE_BUILD_TYPE=RelWithDebInfo` (-O2) times what such a build gets
# (bench/results/transforms-o2.md).
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
out_md="${1:-$root/bench/results/transforms.md}"
build="${BUILD_DIR:-$root/build}"
iters="${ITERS:-10}"
ub_configure
ub_build ulysses_perf
ub_mpi_env
perf="$build/bench/ulysses_perf"
rope=(--rope --model Llama-3.1-8B --dtype bf16 -b "${S0:-4096}" -e "${S1:-16384}" -f 2 -n "$iters" -w 2 -c 1)
mkdir -p "$(dirname "$out_md")"
tmp="$(mktemp)"
{
  echo "# bench/run_transforms.sh, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "Machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), $(uname -sr), git $(git -C "$root" rev-parse --short HEAD)."
  echo "Build: $build, CMAKE_BUILD_TYPE $(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt") ($(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt"))."
  echo "Load before: $(uptime)"
  echo
  echo "## RoPE fused into seq->head, in-process (LocalGroup, 4 ranks on threads)"
  echo
  echo "\`ulysses_perf --backend local --ranks 4 ${rope[*]}\`:"
  echo
  echo '```'
  "$perf" --backend local --ranks 4 "${rope[@]}"
  echo '```'
  echo
  echo "## RoPE fused into seq->head, the MPI processes of this node (mpiexec -n 4, MpiWindowComm)"
  echo
  echo "\`mpiexec -n 4 ulysses_perf --backend mpi ${rope[*]}\`:"
  echo
  echo '```'
  mpiexec -n 4 "${mpi_flags[@]}" "$perf" --backend mpi "${rope[@]}"
  echo '```'
  echo
  echo "## The transforms' one-thread throughput (--op transform, rows of T tokens x 32 heads x 128)"
  echo
  echo "\`ulysses_perf --op transform --model Llama-3.1-8B -b ${T0:-1024} -e ${T1:-4096} -f 4 -n $iters -w 2 -c 1\`:"
  echo
  echo '```'
  "$perf" --op transform --model Llama-3.1-8B -b "${T0:-1024}" -e "${T1:-4096}" -f 4 -n "$iters" -w 2 -c 1
  echo '```'
  echo
  echo "Load after: $(uptime)"
} > "$tmp"
# The summary table at the top: every figure of the tables above, with the targets.
{
  sed -n '1,5p' "$tmp"
  echo
  echo "| run | S / T | plain (us) | fused (us) | separate (us) | fused/plain (target <= 1.10) | separate/plain (expected >= 1.4) | #diff |"
  echo "|---|---|---|---|---|---|---|---|"
  awk '/^## RoPE fused into seq->head, in-process/ {run="in-process P=4"} /^## RoPE fused into seq->head, the MPI/ {run="MPI window P=4"}
       /^## The transforms/ {run=""}
       run != "" && /^ +[0-9]+ +[0-9]+ / {printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", run, $1, $4, $5, $6, $7, $8, $10}' "$tmp"
  echo
  echo "| transform | dtype | T | rows | time (us) | GB/s | memcpy (us) | memcpy GB/s | ratio to memcpy (target >= 0.8) | #wrong |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  awk '/^## The transforms/ {on=1}
       on && /^ rope / {printf "| rope | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $2, $3, $4, $6, $7, $8, $9, $10, $11}
       on && /^ fp8 / {printf "| fp8 %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $2, $3, $4, $5, $7, $8, $9, $10, $11, $12}' "$tmp"
  echo
  sed -n '6,$p' "$tmp"
} > "$out_md"
rm -f "$tmp"
echo "run_transforms.sh: $out_md"
