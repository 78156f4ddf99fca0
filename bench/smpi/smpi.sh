#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The MPI backend on a simulated cluster (SimGrid's SMPI: Debian package libsimgrid-dev). The
# unmodified MPI programs are compiled with smpicxx and run by smpirun on a platform file; what
# MPI_Wtime reports is simulated time. docs/simulation.md explains the choices below.
#
#   bench/smpi/smpi.sh build                       exchange_check and ulysses_perf with smpicxx, in $BUILD
#   bench/smpi/smpi.sh check NODES [ARGS...]        exchange_check (bit-exact) on NODES nodes of 8 GPUs
#   bench/smpi/smpi.sh perf NODES [ARGS...]         ulysses_perf --backend mpi (simulated time) on NODES nodes
#   bench/smpi/smpi.sh run PLATFORM.xml PROGRAM [ARGS...]   any program of $BUILD on any platform (all its hosts)
#   bench/smpi/smpi.sh platforms                   regenerates bench/smpi/platforms/*.xml (platform.sh)
#   bench/smpi/smpi.sh ci                          what CI runs: build, check 2 --quick, the check's check, a perf check
#
# NODES picks bench/smpi/platforms/nodes-NODES.xml when shipped, else generates it with platform.sh
# (link figures from the environment: GPUS_PER_NODE NVLINK_GBPS NVLINK_US IB_GBPS IB_US NODES_PER_LEAF
# IB_TAPER; any of them set generates the platform into $BUILD instead).
# Knobs: BUILD (build-smpi), TIMEOUT (seconds a run may take, 1800), SMPI_CFG (more --cfg=... flags),
# SMPIRUN_FLAGS (more smpirun flags, e.g. -no-privatize), CXXFLAGS_EXTRA, and for ulysses_perf
# ULYSSES_SMPI_FOLD_BYTES=N: memory folding of every allocation of N bytes or more (bench/smpi/fold.cpp;
# timings only: give -c 0).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="${BUILD:-$root/build-smpi}"
timeout_s="${TIMEOUT:-1800}"

# The simulation's configuration:
#  - coll-selector ompi: Open MPI's collective algorithms (SMPI's default selector makes a 12-byte
#    MPI_Allgather take minutes at 512 ranks);
#  - send-is-detached-thresh 0: no send is buffered by the simulator (no copy of every message);
#  - simulate-computation no: the host work between MPI calls (the executor's copies, the checks)
#    takes no simulated time: the times are the network's alone (GPU copies are not what this CPU does);
#  - bw-factor / lat-factor 1, weight-S 0, crosstraffic 0, TCP-gamma 0: the links are what the platform
#    says (SMPI's defaults are corrections measured on a TCP / Ethernet cluster): a message of n bytes
#    alone on a path takes latency + n / bandwidth, flows share a link max-min fairly;
#  - shared-malloc local: SMPI_SHARED_MALLOC (ulysses_perf's memory folding, bench/smpi/fold.cpp) from
#    one shared-memory segment in /dev/shm; the default (global) maps a file in /tmp, and on a disk
#    file system every page a rank writes goes through the file system (fold.cpp says more).
cfg=(--cfg=smpi/coll-selector:ompi --cfg=smpi/send-is-detached-thresh:0 --cfg=smpi/simulate-computation:no
     --cfg=smpi/bw-factor:0:1 --cfg=smpi/lat-factor:0:1 --cfg=network/weight-S:0 --cfg=network/crosstraffic:0
     --cfg=network/TCP-gamma:0 --cfg=smpi/shared-malloc:local
     --log=xbt_cfg.thres:warning --log=smpi_coll.thres:warning --log=smpi_colls.thres:warning --log=smpi_config.thres:error)
# shellcheck disable=SC2206
cfg+=(${SMPI_CFG:-})

need() {
  command -v smpicxx >/dev/null && command -v smpirun >/dev/null && return 0
  echo "smpi.sh: smpicxx / smpirun not found: install SimGrid (Debian: apt-get install libsimgrid-dev)" >&2
  exit 2
}

build() {
  need
  mkdir -p "$build"
  # -fno-gnu-unique: SMPI loads one copy of the program per rank (dlopen privatization); symbols
  # that g++ marks STB_GNU_UNIQUE (static locals of inline functions, static members of templates)
  # would be merged across the copies, i.e. shared between ranks.
  local flags=(-std=c++17 -O2 -fno-gnu-unique -I"$root/include" -I"$root/tests/support" -I"$root/examples/common")
  # shellcheck disable=SC2206
  flags+=(${CXXFLAGS_EXTRA:-})
  local perf_flags=(-DULYSSES_PERF_MPI=1)
  if echo '#include <nlohmann/json.hpp>' | smpicxx -std=c++17 -x c++ -fsyntax-only - 2>/dev/null; then perf_flags+=(-DULYSSES_PERF_JSON=1); fi
  echo "== smpicxx: $build/exchange_check"
  # (tests/support/harness.hpp runs the deprecated HostPipeline::run on purpose: quiet here)
  smpicxx "${flags[@]}" -Wno-deprecated-declarations "$here/exchange_check.cpp" -o "$build/exchange_check"
  echo "== smpicxx: $build/ulysses_perf"
  # fold.cpp: ULYSSES_SMPI_FOLD_BYTES=N folds every allocation of N bytes or more (SMPI_SHARED_MALLOC)
  smpicxx "${flags[@]}" "${perf_flags[@]}" "$root/bench/ulysses_perf.cpp" "$here/fold.cpp" -o "$build/ulysses_perf"
}

# The platform file of NODES nodes (shipped, else generated into $build).
platform_of() {
  local n=$1 f="$here/platforms/nodes-$1.xml"
  if [ -f "$f" ] && [ -z "${GPUS_PER_NODE:-}${NVLINK_GBPS:-}${NVLINK_US:-}${IB_GBPS:-}${IB_US:-}${NODES_PER_LEAF:-}${IB_TAPER:-}" ]; then
    echo "$f"
    return
  fi
  mkdir -p "$build"
  f="$build/nodes-$n${IB_TAPER:+-taper$IB_TAPER}${NODES_PER_LEAF:+-leaf$NODES_PER_LEAF}.xml"
  "$here/platform.sh" "$n" > "$f"
  echo "$f"
}

# run PLATFORM PROGRAM ARGS...: every host of the platform a rank, in file order (node first).
run() {
  need
  local platform=$1 prog=$2
  shift 2
  [ -x "$prog" ] || prog="$build/$prog"
  [ -x "$prog" ] || { echo "smpi.sh: $prog not built (bench/smpi/smpi.sh build)" >&2; exit 2; }
  local hosts
  hosts="$build/hosts-$(basename "$platform" .xml).txt"
  mkdir -p "$build"
  grep -o '<host id="[^"]*"' "$platform" | sed 's/<host id="//; s/"$//' > "$hosts"
  local np
  np=$(wc -l < "$hosts")
  echo "== smpirun: $np ranks on $(basename "$platform"): $(basename "$prog") $*" >&2
  # shellcheck disable=SC2086
  timeout "$timeout_s" smpirun ${SMPIRUN_FLAGS:-} -platform "$platform" -hostfile "$hosts" -np "$np" "$prog" "${cfg[@]}" "$@"
}

case "${1:-}" in
  build) build ;;
  check) [ $# -ge 2 ] || { echo "usage: $0 check NODES [ARGS...]" >&2; exit 2; }
         n=$2; shift 2; run "$(platform_of "$n")" exchange_check --ranks-per-node "${GPUS_PER_NODE:-8}" "$@" ;;
  perf)  [ $# -ge 2 ] || { echo "usage: $0 perf NODES [ARGS...]" >&2; exit 2; }
         n=$2; shift 2; run "$(platform_of "$n")" ulysses_perf --backend mpi "$@" ;;
  run)   [ $# -ge 3 ] || { echo "usage: $0 run PLATFORM.xml PROGRAM [ARGS...]" >&2; exit 2; }
         shift; run "$@" ;;
  ci)    # CI (.ci/run): the build, the bit-exact check on 16 ranks (2 nodes), the check of the check,
         # and ulysses_perf's own check on the two-level exchange; fails on any failure.
         timeout_s=${TIMEOUT:-300}
         build
         run "$(platform_of 2)" exchange_check --ranks-per-node 8 --quick
         log="$build/inject-fault.log"
         if run "$(platform_of 2)" exchange_check --ranks-per-node 8 --inject-fault > "$log" 2>&1; then
           cat "$log"; echo "smpi.sh ci: exchange_check --inject-fault passed: the check is blind" >&2; exit 1
         fi
         grep "inject-fault: the fault detected" "$log"
         grep -q "(all: the check sees it)" "$log" || { cat "$log"; echo "smpi.sh ci: a fault went unseen" >&2; exit 1; }
         out="$build/perf-ci.txt"
         run "$(platform_of 2)" ulysses_perf --backend mpi --model llama-3.1-8b -b 1000 -e 1000 -n 1 -w 0 -c 1 \
           --ranks-per-node 8 --lanes 0 --backward --dtype bf16 | tee "$out"
         grep -q "wrong elements (all sizes, all ranks): 0 OK" "$out" ;;
  platforms)
    for n in 2 8 64; do
      echo "== $here/platforms/nodes-$n.xml ($((n * 8)) ranks)"
      "$here/platform.sh" "$n" > "$here/platforms/nodes-$n.xml"
    done ;;
  *) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
