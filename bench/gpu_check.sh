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
#   bench/gpu_check.sh run DIR [OUT]  there: the ladder below, from DIR, into OUT (default $OUT,
#                                      else ./gpu_check_out): summary.txt (one line per rung:
#                                      "ok", "FAIL exit N: ...", "TIMEOUT ...", "skipped: why")
#                                      and each rung's log. If the carried binaries cannot load or
#                                      the driver is older than their CUDA runtime (a build
#                                      mismatch), it rebuilds them there when nvcc is there.
#
# The ladder, each rung with its own timeout, one failure costing only its rung, the whole bounded
# by LADDER_BUDGET (560 s: one 10-minute device call):
#   0 versions: the CUDA runtime carried, the driver and the NCCL loaded (ulysses_gpu_probe), and
#     whether this machine can run the build: "no CUDA driver", "build mismatch" (driver older
#     than the runtime: cudaErrorInsufficientDriver with a driver), "no device", or ok
#   1 one tiny kernel; 2 the copy kernel against cudaMemcpyAsync, then bit for bit against the host
#     executor; 3 DeviceLocalGroup (P = 2, 4, 8 virtual ranks); 4 NCCL at P = 1; 5 two processes
#     over CUDA IPC (mpiexec -n 2, the Open MPI carried in DIR/mpi); 6 the CUDA tests in full, the
#     demo, bench_cuda, ulysses_perf (cuda-local, nccl, cuda-ipc at 2 and 4 processes), DeepSpeed's
#     op sequence with the machine's PyTorch (bench/ds_baseline.py); 7 compute-sanitizer memcheck,
#     racecheck and synccheck over the CUDA tests, when compute-sanitizer is there.
# Rungs 0-2 answer within a minute. Without a device every device rung says "skipped: no device"
# at once, and the exit status is 3; else it is the number of failed rungs (4: DIR incomplete).
# NCCL: the binaries need libnccl.so.2, which the GPU machine has in PyTorch's wheel
# (nvidia/nccl/lib); the run half finds it (or NCCL_LIB_DIR). Optional NCCL functions
# (ncclCommRevoke, the window API) are looked up at run time, so an older NCCL still loads.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=$(cd "$here/.." && pwd)
BINARIES=(ulysses_gpu_probe test_cuda_copy test_cuda_merge test_cuda_bands test_comm_nccl ulysses_attention bench_cuda ulysses_perf)
# Built with MPI (a second build dir), optional: the IPC steps say "not available" without them.
IPC_BINARIES=(test_comm_mpi_device_window ulysses_perf_mpi)

usage() {
  echo "usage: $0 build DIR | $0 run DIR [OUT]   (OUT: default \$OUT, else ./gpu_check_out)" >&2
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

# The ladder (run half): rungs from the smallest to the largest, each with its own timeout and a
# one-line verdict in OUT/summary.txt ("ok", "FAIL ...", "TIMEOUT ...", "skipped: ..."), so that
# one failure costs only its rung; the whole ladder is bounded by LADDER_BUDGET seconds (default
# 560: one 10-minute device call), a rung that would not fit is skipped saying so, and the
# sanitizer rungs keep SANITIZER_RESERVE seconds (default 140) of it. Without a device every
# device rung says "skipped: no device" at once. CUDA_MODULE_LOADING=EAGER: no lazy loading of a
# kernel behind a spinning one (docs/gpu.md). LADDER_REHEARSE=1 (a rehearsal without a device):
# the device rungs run anyway, to show that each binary ends cleanly, saying it has no device.
run_half() {
  local dir out
  dir=$(cd "$1" && pwd) || exit 4
  out=${2:-${OUT:-$PWD/gpu_check_out}}
  mkdir -p "$out" && out=$(cd "$out" && pwd)
  local summary=$out/summary.txt budget=${LADDER_BUDGET:-560} reserve=0 t_start=$SECONDS
  local failed=0 skipped=0 device=0 why="not probed"
  : >"$summary"
  note() { echo "$*" | tee -a "$summary"; }
  export CUDA_MODULE_LOADING=EAGER
  # NCCL from PyTorch's wheel (or NCCL_LIB_DIR), the CUDA runtime carried in DIR/lib.
  local nccl=${NCCL_LIB_DIR:-}
  if [ -z "$nccl" ]; then
    nccl=$(timeout 20 python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null ||
      dirname "$(timeout 20 find /opt /usr /root -name 'libnccl.so.2' 2>/dev/null | head -n 1)" 2>/dev/null)
  fi
  export LD_LIBRARY_PATH="$dir/lib${nccl:+:$nccl}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local bin=$dir/bin
  [ -x "$bin/ulysses_gpu_probe" ] || { note "gpu_check run: $bin/ulysses_gpu_probe is missing: run '$0 build DIR' first"; exit 4; }
  [ -f "$dir/commit.txt" ] && note "commit $(cat "$dir/commit.txt")"
  note "gpu_check ladder: budget ${budget} s, NCCL library folder: ${nccl:-none found}, CUDA_MODULE_LOADING=EAGER"

  # rung NUMBER NAME LIMIT_S NEEDS_DEVICE(1/0) LOG COMMAND...: one rung, its verdict on one line.
  rung() {
    local num=$1 name=$2 limit=$3 needs=$4 log=$5 t0=$SECONDS verdict
    shift 5
    local left=$((budget - (SECONDS - t_start) - reserve))
    if [ "$needs" = 1 ] && [ "$device" != 1 ] && [ "${LADDER_REHEARSE:-0}" != 1 ]; then
      verdict="skipped: no device ($why)"
      skipped=$((skipped + 1))
    elif [ ! -x "$1" ] && ! command -v "$1" >/dev/null 2>&1; then
      verdict="skipped: not available ($1)"
      skipped=$((skipped + 1))
    elif [ "$left" -lt 15 ]; then
      verdict="skipped: ladder budget spent (${left} s left of ${budget} s)"
      skipped=$((skipped + 1))
    else
      [ "$limit" -gt $((left - 5)) ] && limit=$((left - 5))
      timeout --kill-after=5 "$limit" "$@" >"$out/$log" 2>&1
      local rc=$? s=$((SECONDS - t0)) said
      # What a binary says when it finds no device (the tests then run their host suite only).
      said=$(grep -m1 -iE 'no CUDA device|no usable device|needs a CUDA device|no CUDA driver|skipping the' "$out/$log" | cut -c1-160)
      if [ $rc -eq 0 ]; then
        verdict="ok (${s} s)$(grep -m1 -E '^(versions|kernel|copy) ok' "$out/$log" | sed 's/^[a-z]* ok/:/')${said:+; said: $said}"
      elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        verdict="TIMEOUT after ${s} s (limit ${limit} s; $log)"
        failed=$((failed + 1))
      elif [ "$device" != 1 ] && [ -n "$said" ]; then
        verdict="skipped by the binary (exit $rc, ${s} s): $said"
        skipped=$((skipped + 1))
      else
        local why_failed
        why_failed=$(grep -m1 -iE 'FAIL|ERROR|mismatch|what\(\)|not installed' "$out/$log" || grep -v '^[[:space:]]*$' "$out/$log" | tail -n 1)
        verdict="FAIL exit $rc (${s} s): $(echo "$why_failed" | cut -c1-200) ($log)"
        failed=$((failed + 1))
      fi
    fi
    printf '%-3s %-22s %s\n' "$num" "$name" "$verdict" | tee -a "$summary"
  }

  # 0. The versions this machine loads (the CUDA runtime carried, the driver, NCCL), the verdict.
  "$bin/ulysses_gpu_probe" versions >"$out/versions.log" 2>&1
  local vrc=$?
  if [ $vrc -ne 0 ] && [ $vrc -ne 3 ] && [ -x "$(command -v nvcc)" ] &&
    { [ $vrc -eq 5 ] || grep -qE "error while loading shared libraries|not found|GLIBC" "$out/versions.log"; }; then
    note "the carried binaries cannot run here ($(head -n 1 "$out/versions.log")); rebuilding them here (nvcc $(nvcc --version | tail -n 1))"
    rebuild_here "$dir" "$out" "$nccl" && bin=$out/bin
    "$bin/ulysses_gpu_probe" versions >"$out/versions.log" 2>&1
    vrc=$?
  fi
  note "0   versions               $(cat "$out/versions.log")"
  case $vrc in
    0) device=1 why="" ;;
    5) why="build mismatch: see versions.log" ;;
    3) why=$(head -n 1 "$out/versions.log" | sed 's/^versions FAIL: //; s/; NCCL.*//; s/^CUDA runtime [^:]*: //') ;;
    *) why="the probe did not run (exit $vrc): see versions.log" ;;
  esac
  (timeout 20 nvidia-smi || echo "nvidia-smi not available") >"$out/nvidia-smi.txt" 2>&1

  # 1-2. One tiny kernel; the copy kernel against cudaMemcpy (bytes and GB/s), then bit for bit
  # against the host executor on every list and alignment.
  rung 1 kernel 30 1 kernel.log "$bin/ulysses_gpu_probe" kernel
  rung 2 copy_vs_memcpy 45 1 copy.log "$bin/ulysses_gpu_probe" copy
  rung 2b copy_exact 60 1 copy_exact.log "$bin/test_cuda_copy" -tc='CudaExecutor == HostExecutor*'
  # 3. DeviceLocalGroup, P = 2, 4, 8 virtual ranks on the GPU (the shared cases).
  rung 3 device_local_P4 90 1 device_local.log "$bin/test_cuda_copy" -tc='DeviceLocalGroup end to end: C1*'
  # 4. NCCL at P = 1 (the host fakes run too).
  rung 4 nccl_P1 90 1 nccl.log "$bin/test_comm_nccl"
  # 5. Two processes over CUDA IPC on the one GPU (the carried Open MPI).
  if mpi_env "$dir" && [ -x "$bin/test_comm_mpi_device_window" ]; then
    rung 5 ipc_2_processes 120 1 ipc_test.log env LD_LIBRARY_PATH="$MPI_LD:$LD_LIBRARY_PATH" "$MPIEXEC" -n 2 "$bin/test_comm_mpi_device_window"
  else
    rung 5 ipc_2_processes 120 1 ipc_test.log "$dir/mpi/root/usr/bin/orterun (no carried Open MPI)"
  fi
  # 6. The rest: the CUDA tests in full, the demo, the benchmarks (bit for bit where they check).
  local sanitizer
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
  [ -n "$sanitizer" ] && reserve=${SANITIZER_RESERVE:-140}
  rung 6a tests_copy 120 1 test_cuda_copy.log "$bin/test_cuda_copy"
  rung 6b tests_merge 60 1 test_cuda_merge.log "$bin/test_cuda_merge"
  rung 6b2 tests_bands 60 1 test_cuda_bands.log "$bin/test_cuda_bands"
  rung 6c demo 40 1 demo.log "$bin/ulysses_attention" --device cuda --seq 1024
  rung 6d demo_backward 40 1 demo_backward.log "$bin/ulysses_attention" --device cuda --backward
  rung 6e0 bench_throwing_rank 20 1 bench_throwing_rank.log "$bin/bench_cuda" --check-throwing-rank
  rung 6e bench_cuda 120 1 bench.log "$bin/bench_cuda" --benchmark_out="$out/bench_cuda.json" --benchmark_out_format=json --benchmark_min_time=0.05
  local perf=(--model llama-3.1-8b -b 1024 -e 4096 -f 2 -n 10 -w 2 -c 1 --backward)
  rung 6f perf_cuda_local 60 1 perf_cuda_local.log "$bin/ulysses_perf" --backend cuda-local --ranks 4 "${perf[@]}" --json "$out/perf_cuda_local.json"
  rung 6g perf_nccl 45 1 perf_nccl.log "$bin/ulysses_perf" --backend nccl "${perf[@]}" --json "$out/perf_nccl.json"
  local ipc=(--model llama-3.1-8b -b 4096 -e 16384 -f 4 -n 10 -w 2 -c 1)
  for n in 2 4; do
    if [ -n "${MPIEXEC:-}" ] && [ -x "$bin/ulysses_perf_mpi" ]; then
      rung "6h$n" "perf_ipc_$n" 60 1 "perf_ipc_$n.log" env LD_LIBRARY_PATH="$MPI_LD:$LD_LIBRARY_PATH" "$MPIEXEC" -n "$n" "$bin/ulysses_perf_mpi" \
        --backend cuda-ipc "${ipc[@]}" --json "$out/perf_ipc_$n.json"
    else
      rung "6h$n" "perf_ipc_$n" 60 1 "perf_ipc_$n.log" "$bin/ulysses_perf_mpi (or no carried Open MPI)"
    fi
  done
  rung 6i perf_nccl_ipc_sizes 45 1 perf_nccl_ipc_sizes.log "$bin/ulysses_perf" --backend nccl "${ipc[@]}" --json "$out/perf_nccl_ipc_sizes.json"
  rung 6j ds_baseline 60 1 ds_baseline.log python3 "$here/ds_baseline.py" --out "$out/ds_baseline.json"
  # 7. compute-sanitizer over the CUDA tests (memcheck on the copy and merge suites' device cases,
  # racecheck and synccheck on the copy kernel's exact comparison, the kernels with shared memory).
  reserve=0
  local cs=(--error-exitcode 99 --print-limit 20)
  if [ -n "$sanitizer" ]; then
    rung 7a memcheck_copy 50 1 memcheck_copy.log "$sanitizer" --tool memcheck "${cs[@]}" "$bin/test_cuda_copy" -tc='CudaExecutor*,pack and unpack capture*'
    rung 7b memcheck_merge 40 1 memcheck_merge.log "$sanitizer" --tool memcheck "${cs[@]}" "$bin/test_cuda_merge"
    rung 7c racecheck_copy 50 1 racecheck_copy.log "$sanitizer" --tool racecheck "${cs[@]}" "$bin/test_cuda_copy" -tc='CudaExecutor == HostExecutor*'
    rung 7d synccheck_copy 50 1 synccheck_copy.log "$sanitizer" --tool synccheck "${cs[@]}" "$bin/test_cuda_copy" -tc='CudaExecutor == HostExecutor*'
  else
    for r in "7a memcheck_copy" "7b memcheck_merge" "7c racecheck_copy" "7d synccheck_copy"; do
      set -- $r
      rung "$1" "$2" 50 1 "$2.log" "compute-sanitizer (not found on PATH or in /usr/local/cuda*/bin)"
    done
  fi
  grep -hE "^(pack|unpack|seq_to_head|pipeline|summed|path)" "$out/bench.log" >>"$summary" 2>/dev/null
  for f in perf_cuda_local perf_nccl perf_ipc_2 perf_ipc_4 perf_nccl_ipc_sizes; do
    grep -hE "^ +[0-9]|wrong elements" "$out/$f.log" 2>/dev/null | sed "s/^/$f: /" >>"$summary"
  done
  note "gpu_check: $failed rung(s) failed, $skipped skipped, $((SECONDS - t_start)) s; logs in $out"
  [ "$device" = 1 ] || exit 3
  exit "$failed"
}

# rebuild_here DIR OUT NCCL_DIR: the tests, the demo, ulysses_perf and the probe rebuilt with this
# machine's nvcc (the carried doctest; no Google Benchmark, so no bench_cuda), into OUT/bin.
rebuild_here() {
  local dir=$1 out=$2 nccl=$3 build=$2/build
  timeout 300 cmake -S "$SRC" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DULYSSES_ENABLE_MPI=OFF \
    -DULYSSES_BUILD_BENCHMARKS=ON -Ddoctest_DIR="$dir/doctest/cmake" ${nccl:+-DNCCL_ROOT=$(dirname "$nccl")} >"$out/rebuild.log" 2>&1 &&
    timeout 300 cmake --build "$build" -j 16 --target ulysses_gpu_probe test_cuda_copy test_cuda_merge test_cuda_bands test_comm_nccl ulysses_attention ulysses_perf \
      >>"$out/rebuild.log" 2>&1 || { note "rebuild failed: see rebuild.log"; return 1; }
  mkdir -p "$out/bin"
  for b in ulysses_gpu_probe test_cuda_copy test_cuda_merge test_cuda_bands test_comm_nccl ulysses_attention ulysses_perf; do
    cp "$(find "$build" -type f -name "$b" -perm -u+x | head -n 1)" "$out/bin/" 2>/dev/null || note "$b: not rebuilt"
  done
}

case "${1:-}" in
  build) [ $# -eq 2 ] || usage; build_half "$2" ;;
  run) [ $# -ge 2 ] && [ $# -le 3 ] || usage; run_half "$2" "${3:-}" ;;
  *) usage ;;
esac
