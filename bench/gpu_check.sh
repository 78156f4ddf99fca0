#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# GPU check in two halves, for a GPU machine that reaches no package registry and has no doctest,
# Google Benchmark or MPI (CUDA 13, CMake, ninja and PyTorch with NCCL only as its wheel):
#
#   bench/gpu_check.sh build DIR       here (no GPU needed): builds the CUDA tests, the demo and
#                                      the CUDA benchmarks for sm_90 (H100/H200) and puts into DIR
#                                      (a git-ignored folder of the repository, <= 64 MiB) the
#                                      binaries, the shared libraries the GPU machine lacks
#                                      (Google Benchmark, the CUDA runtime) and doctest's headers
#                                      (for the fallback below). Carry DIR to the GPU machine.
#   bench/gpu_check.sh run DIR OUT     there: runs everything from DIR and writes into OUT:
#                                      summary.txt (each step: exit status and seconds),
#                                      nvidia-smi.txt, test_cuda_copy.log, test_comm_nccl.log,
#                                      demo.log, demo_backward.log, bench.log + bench_cuda.json,
#                                      perf_cuda_local.log + .json (ulysses_perf --backend
#                                      cuda-local: 4 virtual ranks, forward and backward, -c 1),
#                                      perf_nccl.log + .json (--backend nccl: one process, P = 1,
#                                      as the build has no MPI and the machine one GPU),
#                                      ds_baseline.log + ds_baseline.json (DeepSpeed's op sequence
#                                      with the machine's PyTorch, bench/ds_baseline.py);
#                                      the device window across processes (CUDA IPC on the ONE
#                                      GPU, under the Open MPI carried in DIR/mpi): ipc_test.log
#                                      (test_comm_mpi_device_window, mpiexec -n 2), perf_ipc_2 and
#                                      perf_ipc_4 .log + .json (ulysses_perf --backend cuda-ipc,
#                                      2 and 4 processes, Llama-3.1-8B, S = 4096 and 16384, -c 1;
#                                      its bare column: one cudaMemcpyAsync of the same bytes) and
#                                      perf_nccl_ipc_sizes .log + .json (NCCL, P = 1, the same
#                                      sizes).
#                                      Without a CUDA device it stops at once: "no CUDA device",
#                                      exit 3. If the carried binaries cannot load (other system
#                                      libraries there), it rebuilds the tests, the demo and
#                                      ulysses_perf there (nvcc, CMake, ninja, the carried doctest;
#                                      no Google Benchmark, so no bench_cuda).
#
# Budget of the run half on one H200: about 2-3 minutes (tests ~1 min, demo ~20 s, benchmarks
# ~1 min, ulysses_perf ~30 s at small sizes, PyTorch baseline ~20 s) plus the IPC steps (each
# bounded by its timeout, 150 s; expected well under a minute each), so that a rerun fits in
# 15 minutes of device time. Every step has its own timeout and the script goes on after a
# failing one.
# NCCL: the binaries need libnccl.so.2, which the GPU machine has in PyTorch's wheel
# (nvidia/nccl/lib); the run half finds it (or NCCL_LIB_DIR). Exit status of the run half: the
# number of failed steps (0: all passed), 3 without a device, 4 when DIR is incomplete.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=$(cd "$here/.." && pwd)
BINARIES=(test_cuda_copy test_comm_nccl ulysses_attention bench_cuda ulysses_perf)
# Built with MPI (a second build dir), optional: the IPC steps say "not available" without them.
IPC_BINARIES=(test_comm_mpi_device_window ulysses_perf_mpi)

usage() {
  echo "usage: $0 build DIR | $0 run DIR OUT" >&2
  exit 2
}

build_half() {
  local dir=$1 build=${BUILD_DIR:-$SRC/build-gpu} jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
  mkdir -p "$dir/bin" "$dir/lib" "$dir/doctest" || exit 1
  cmake -S "$SRC" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DULYSSES_BUILD_TESTS=ON -DULYSSES_BUILD_EXAMPLES=ON -DULYSSES_BUILD_BENCHMARKS=ON -DULYSSES_ENABLE_MPI=OFF \
    -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON -DCMAKE_BUILD_RPATH='$ORIGIN/../lib' || exit 1
  cmake --build "$build" -j "$jobs" --target "${BINARIES[@]}" || exit 1
  local missing=0
  for b in "${BINARIES[@]}"; do
    local f
    f=$(find "$build" -type f -name "$b" -perm -u+x | head -n 1)
    if [ -z "$f" ]; then
      echo "gpu_check build: $b was not built (is doctest / Google Benchmark / NCCL installed here?)" >&2
      missing=1
      continue
    fi
    cp "$f" "$dir/bin/"
  done
  [ $missing -eq 0 ] || exit 1
  build_ipc "$dir" "$jobs"
  # Shared libraries the GPU machine lacks (NCCL is there, in PyTorch's wheel; glibc and
  # libstdc++ are the system's).
  for b in "${BINARIES[@]}"; do ldd "$dir/bin/$b"; done | awk '/=>/ {print $1, $3}' | sort -u |
    while read -r name path; do
      case "$name" in
        libbenchmark* | libcudart*) cp -L "$path" "$dir/lib/$name" ;;
      esac
    done
  # doctest (one header) and a CMake package file for it, for a rebuild there.
  local dh
  dh=$(find /usr/include /usr/local/include -path '*doctest/doctest.h' 2>/dev/null | head -n 1)
  [ -n "$dh" ] || { echo "gpu_check build: doctest.h not found (apt-get install doctest-dev)" >&2; exit 1; }
  mkdir -p "$dir/doctest/include/doctest" "$dir/doctest/cmake"
  cp "$dh" "$dir/doctest/include/doctest/"
  cat >"$dir/doctest/cmake/doctestConfig.cmake" <<'CMAKE'
# doctest carried by bench/gpu_check.sh build: the header beside this folder.
if(NOT TARGET doctest::doctest)
  add_library(doctest::doctest INTERFACE IMPORTED)
  get_filename_component(_doctest_root "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
  set_target_properties(doctest::doctest PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_doctest_root}/include")
endif()
set(doctest_FOUND TRUE)
CMAKE
  git -C "$SRC" rev-parse HEAD >"$dir/commit.txt" 2>/dev/null || true
  local size
  size=$(du -sm "$dir" | cut -f1)
  echo "gpu_check build: $dir holds ${size} MiB: $(ls "$dir/bin" | tr '\n' ' ')+ $(ls "$dir/lib" | tr '\n' ' ')"
  if [ "$size" -gt 64 ]; then
    echo "gpu_check build: $dir is over the 64 MiB the device tool carries" >&2
    exit 1
  fi
}

# The device window across processes needs MPI, which the GPU machine lacks: a second build with
# MPI (test_comm_mpi_device_window, ulysses_perf as ulysses_perf_mpi) and Open MPI's runtime
# (the Debian packages of its libraries, mpiexec and PMIx, paths kept) under DIR/mpi/root, which
# the run half relocates (OPAL_PREFIX). Failing here only leaves the IPC steps out.
build_ipc() {
  local dir=$1 jobs=$2 build=${BUILD_DIR_MPI:-$SRC/build-gpu-mpi}
  command -v mpiexec >/dev/null && command -v dpkg >/dev/null ||
    { echo "gpu_check build: no mpiexec or dpkg here: the IPC steps are left out" >&2; return 0; }
  cmake -S "$SRC" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DULYSSES_BUILD_TESTS=ON -DULYSSES_BUILD_EXAMPLES=OFF -DULYSSES_BUILD_BENCHMARKS=ON -DULYSSES_ENABLE_MPI=ON \
    -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON -DCMAKE_BUILD_RPATH='$ORIGIN/../lib' >/dev/null &&
    cmake --build "$build" -j "$jobs" --target test_comm_mpi_device_window ulysses_perf ||
    { echo "gpu_check build: the MPI build failed: the IPC steps are left out" >&2; return 0; }
  cp "$build/tests/test_comm_mpi_device_window" "$dir/bin/" && cp "$build/bench/ulysses_perf" "$dir/bin/ulysses_perf_mpi" || return 0
  carry_mpi "$dir" "$dir/bin/ulysses_perf_mpi"
}

# carry_mpi DIR BINARY: the Debian packages of BINARY's Open MPI libraries, of mpiexec and of PMIx,
# their files copied under DIR/mpi/root with their paths.
carry_mpi() {
  local dir=$1 exe=$2 pkgs
  pkgs=$({
    ldd "$exe" | awk '/=>/ {print $3}' | grep -E 'libmpi|libopen-|pmix|hwloc|libevent' |
      while read -r f; do dpkg -S "$(readlink -f "$f")" || dpkg -S "$f"; done
    dpkg -S "$(readlink -f "$(command -v mpiexec)")"
    dpkg -S 'libpmix.so.2'
    dpkg -S 'help-mpi-api.txt'
  } 2>/dev/null | cut -d: -f1 | tr ',' '\n' | tr -d ' ' | sort -u)
  rm -rf "$dir/mpi" && mkdir -p "$dir/mpi/root"
  for p in $pkgs; do
    dpkg -L "$p" | while read -r f; do
      if [ -f "$f" ] || [ -L "$f" ]; then mkdir -p "$dir/mpi/root$(dirname "$f")" && cp -a "$f" "$dir/mpi/root$f"; fi
    done
  done
  echo "$pkgs" | tr '\n' ' ' >"$dir/mpi/packages.txt"
  echo "gpu_check build: Open MPI carried ($(cat "$dir/mpi/packages.txt")), $(du -sm "$dir/mpi" | cut -f1) MiB"
}

# The carried Open MPI, relocated: sets MPIEXEC and MPI_LD (its library folders) and Open MPI's
# settings for one host, as root, in a sandbox (no single-copy mechanism, no binding); false
# when DIR carries none.
mpi_env() {
  local root=$1/mpi/root ml pl
  MPIEXEC=$root/usr/bin/orterun
  [ -x "$MPIEXEC" ] || { MPIEXEC=; return 1; }
  ml=$(dirname "$(find "$root" -name 'libmpi.so.40*' | head -n 1)")
  pl=$(dirname "$(find "$root" -name 'libpmix.so.2*' | head -n 1)")
  MPI_LD=$ml:$pl:$root/usr/lib/x86_64-linux-gnu
  export OPAL_PREFIX=$root/usr
  PMIX_MCA_mca_base_component_path=$(find "$root" -type d -path '*pmix*/lib/pmix' | head -n 1)
  export PMIX_MCA_mca_base_component_path
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_plm_rsh_agent=false \
    OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_hwloc_base_binding_policy=none
}

run_half() {
  local dir out failed=0
  dir=$(cd "$1" && pwd) || exit 4
  mkdir -p "$2" && out=$(cd "$2" && pwd)
  : >"$out/summary.txt"
  note() { echo "$*" | tee -a "$out/summary.txt"; }
  for b in "${BINARIES[@]}"; do
    [ -x "$dir/bin/$b" ] || { note "gpu_check run: $dir/bin/$b is missing: run '$0 build $1' first"; exit 4; }
  done
  # NCCL from PyTorch's wheel (or NCCL_LIB_DIR), the CUDA runtime carried in DIR/lib.
  local nccl=${NCCL_LIB_DIR:-}
  if [ -z "$nccl" ]; then
    nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null ||
      dirname "$(find /opt /usr /root -name 'libnccl.so.2' 2>/dev/null | head -n 1)" 2>/dev/null)
  fi
  export LD_LIBRARY_PATH="$dir/lib${nccl:+:$nccl}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local bin=$dir/bin
  # A device at all? The demo's CUDA path says so with exit 77.
  "$bin/ulysses_attention" --device cuda --ranks 2 --seq 64 >"$out/probe.log" 2>&1
  local rc=$?
  if [ $rc -eq 77 ]; then
    note "no CUDA device: nothing to check here ($(tail -n 1 "$out/probe.log"))"
    exit 3
  fi
  if [ $rc -ne 0 ] && grep -qE "error while loading shared libraries|not found|GLIBC" "$out/probe.log"; then
    note "the carried binaries cannot load here ($(head -n 1 "$out/probe.log")); rebuilding the tests, the demo and ulysses_perf here"
    local build=$out/build
    cmake -S "$SRC" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DULYSSES_ENABLE_MPI=OFF \
      -DULYSSES_BUILD_BENCHMARKS=ON -Ddoctest_DIR="$dir/doctest/cmake" \
      ${nccl:+-DNCCL_ROOT=$(dirname "$nccl")} >"$out/rebuild.log" 2>&1 &&
      cmake --build "$build" -j 16 --target test_cuda_copy test_comm_nccl ulysses_attention ulysses_perf >>"$out/rebuild.log" 2>&1 ||
      { note "rebuild failed: see rebuild.log"; tail -n 20 "$out/rebuild.log"; exit 4; }
    bin=$out/bin && mkdir -p "$bin"
    for b in test_cuda_copy test_comm_nccl ulysses_attention ulysses_perf; do
      cp "$(find "$build" -type f -name "$b" -perm -u+x | head -n 1)" "$bin/" 2>/dev/null || note "$b: not rebuilt"
    done
  fi
  (nvidia-smi || echo "nvidia-smi not available") >"$out/nvidia-smi.txt" 2>&1
  [ -f "$dir/commit.txt" ] && note "commit $(cat "$dir/commit.txt")"
  step() {  # step NAME TIMEOUT_S LOG COMMAND...
    local name=$1 limit=$2 log=$3 t0=$SECONDS
    shift 3
    if [ ! -x "$1" ] && ! command -v "$1" >/dev/null; then
      note "$name: not available ($1)"
      failed=$((failed + 1))
      return
    fi
    timeout --kill-after=10 "$limit" "$@" >"$out/$log" 2>&1
    local rc=$?
    note "$name: exit $rc, $((SECONDS - t0)) s"
    [ $rc -eq 0 ] || { failed=$((failed + 1)); tail -n 25 "$out/$log"; }
  }
  step test_cuda_copy 150 test_cuda_copy.log "$bin/test_cuda_copy"
  step test_comm_nccl 90 test_comm_nccl.log "$bin/test_comm_nccl"
  step demo 60 demo.log "$bin/ulysses_attention" --device cuda --seq 1024
  step demo_backward 60 demo_backward.log "$bin/ulysses_attention" --device cuda --backward
  step bench_cuda 150 bench.log "$bin/bench_cuda" --benchmark_out="$out/bench_cuda.json" --benchmark_out_format=json \
    --benchmark_min_time=0.05
  # ulysses_perf on the device backends, small sizes, checked bit for bit (the oracle on the host).
  local perf=(--model llama-3.1-8b -b 1024 -e 4096 -f 2 -n 10 -w 2 -c 1 --backward)
  step perf_cuda_local 90 perf_cuda_local.log "$bin/ulysses_perf" --backend cuda-local --ranks 4 "${perf[@]}" \
    --json "$out/perf_cuda_local.json"
  step perf_nccl 60 perf_nccl.log "$bin/ulysses_perf" --backend nccl "${perf[@]}" --json "$out/perf_nccl.json"
  step ds_baseline 90 ds_baseline.log python3 "$here/ds_baseline.py" --out "$out/ds_baseline.json"
  # The device window across processes: CUDA IPC between 2 and 4 processes on the one GPU, next to
  # NCCL (P = 1: NCCL takes one process per GPU) and one cudaMemcpyAsync of the same bytes (the bare
  # column of cuda-ipc) at the same sizes.
  local ipc=(--model llama-3.1-8b -b 4096 -e 16384 -f 4 -n 10 -w 2 -c 1)
  if mpi_env "$dir" && [ -x "$bin/test_comm_mpi_device_window" ] && [ -x "$bin/ulysses_perf_mpi" ]; then
    step ipc_test 150 ipc_test.log env LD_LIBRARY_PATH="$MPI_LD:$LD_LIBRARY_PATH" "$MPIEXEC" -n 2 "$bin/test_comm_mpi_device_window"
    for n in 2 4; do
      step "perf_ipc_$n" 150 "perf_ipc_$n.log" env LD_LIBRARY_PATH="$MPI_LD:$LD_LIBRARY_PATH" "$MPIEXEC" -n "$n" "$bin/ulysses_perf_mpi" \
        --backend cuda-ipc "${ipc[@]}" --json "$out/perf_ipc_$n.json"
    done
  else
    note "ipc: not available (DIR has no carried Open MPI or no IPC binaries: see the build half's output)"
    failed=$((failed + 1))
  fi
  step perf_nccl_ipc_sizes 90 perf_nccl_ipc_sizes.log "$bin/ulysses_perf" --backend nccl "${ipc[@]}" --json "$out/perf_nccl_ipc_sizes.json"
  grep -hE "^(pack|unpack|seq_to_head|pipeline|summed|path)" "$out/bench.log" >>"$out/summary.txt" 2>/dev/null
  for f in perf_cuda_local perf_nccl perf_ipc_2 perf_ipc_4 perf_nccl_ipc_sizes; do grep -hE "^ +[0-9]|wrong elements" "$out/$f.log" | sed "s/^/$f: /" >>"$out/summary.txt" 2>/dev/null; done
  cat "$out/ds_baseline.log" >>"$out/summary.txt" 2>/dev/null
  note "gpu_check: $failed step(s) failed; logs in $out"
  exit "$failed"
}

case "${1:-}" in
  build) [ $# -eq 2 ] || usage; build_half "$2" ;;
  run) [ $# -eq 3 ] || usage; run_half "$2" "$3" ;;
  *) usage ;;
esac
