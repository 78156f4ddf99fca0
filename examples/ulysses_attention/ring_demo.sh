#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The runs of `ulysses_attention --ring` quoted in docs/ring.md: in-process and under mpiexec,
# forward and backward, causal zigzag and non-causal, GQA with replicated kv heads, uneven S.
# Usage: examples/ulysses_attention/ring_demo.sh <build dir>   (exits non-zero if a run fails)
set -e
exe="${1:-build}/examples/ulysses_attention/ulysses_attention"
mpi="${MPIEXEC:-mpiexec}"
run() { echo "\$ $*" | sed "s|$exe|ulysses_attention|"; "$@"; echo; }
small="--heads 8 --kv-heads 2 --head-dim 32"
run "$exe" --ring 2 --causal --backward
run "$exe" --ring 2 --causal --backward --ranks 8 $small --seq 101
run "$exe" --ring 4 --ranks 8 $small --seq 90
run "$mpi" -n 4 "$exe" --backend mpi --ring 2 --causal --backward --heads 8 --kv-heads 1 --head-dim 32 --seq 101
run "$mpi" -n 4 "$exe" --backend mpi --ring 2 $small --seq 90
run "$mpi" -n 6 "$exe" --backend mpi --ring 3 --causal --backward --seq 120
