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
#                                      with the machine's PyTorch, bench/ds_baseline.py).
#                                      Without a CUDA device it stops at once: "no CUDA device",
#                                      exit 3. If the carried binaries cannot load (other system
#                                      libraries there), it rebuilds the tests, the demo and
#                                      ulysses_perf there (nvcc, CMake, ninja, the carried doctest;
#                                      no Google Benchmark, so no bench_cuda).
#
# Budget of the run half on one H200: about 2-3 minutes (tests ~1 min, demo ~20 s, benchmarks
# ~1 min, ulysses_perf ~30 s at small sizes, PyTorch baseline ~20 s), under 5, so that a rerun
# fits in 15 minutes of device time.
# NCCL: the binaries need libnccl.so.2, which the GPU machine has in PyTorch's wheel
# (nvidia/nccl/lib); the run half finds it (or NCCL_LIB_DIR). Exit status of the run half: the
# number of failed steps (0: all passed), 3 without a device, 4 when DIR is incomplete.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=$(cd "$here/.." && pwd)
BINARIES=(test_cuda_copy test_comm_nccl ulysses_attention bench_cuda ulysses_perf)

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
  grep -hE "^(pack|unpack|seq_to_head|pipeline|summed|path)" "$out/bench.log" >>"$out/summary.txt" 2>/dev/null
  for f in perf_cuda_local perf_nccl; do grep -hE "^ +[0-9]|wrong elements" "$out/$f.log" | sed "s/^/$f: /" >>"$out/summary.txt" 2>/dev/null; done
  cat "$out/ds_baseline.log" >>"$out/summary.txt" 2>/dev/null
  note "gpu_check: $failed step(s) failed; logs in $out"
  exit "$failed"
}

case "${1:-}" in
  build) [ $# -eq 2 ] || usage; build_half "$2" ;;
  run) [ $# -eq 3 ] || usage; run_half "$2" "$3" ;;
  *) usage ;;
esac
