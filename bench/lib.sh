# SPDX-License-Identifier: Apache-2.0
# What the bench/run_*.sh scripts share; sourced (`. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"`), not run.
# Sets `here` (bench/) and `root` (the checkout); ub_paths sets `out`, `build` and `raw` from the
# script's OUTDIR argument and BUILD_DIR / JSON_DIR; ub_configure, ub_build (JOBS, default 1) and
# ub_has_target drive CMake; ub_mpi_env fills `mpi_flags` (Open MPI: --oversubscribe, and the
# root permission when run as root); ub_load appends the load (uptime) to a file; ub_python
# prints a python3 that has matplotlib (else python3).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"

# ub_paths OUTDIR_ARG DEFAULT_OUT DEFAULT_BUILD: out (created), build, raw (JSON_DIR, created).
ub_paths() {
  out="${1:-$2}"
  build="${BUILD_DIR:-$3}"
  raw="${JSON_DIR:-$build/bench_json}"
  mkdir -p "$out" "$raw"
}

# A Release configuration of the checkout in $build, unless one is there.
ub_configure() {
  [ -f "$build/CMakeCache.txt" ] || cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
}

# ub_build TARGET...: only those targets, JOBS parallel jobs (default 1: small shared machines).
ub_build() {
  cmake --build "$build" --target "$@" -j "${JOBS:-1}"
}

# ub_has_target NAME: whether the configuration has that target (e.g. MPI or Google Benchmark found).
ub_has_target() {
  local available
  available=$(cmake --build "$build" --target help 2>/dev/null || true)  # (no grep -q in a pipe: SIGPIPE + pipefail)
  grep -q "$1" <<<"$available"
}

# mpi_flags for mpiexec: more ranks than cores on small machines; Open MPI refuses root unless told.
ub_mpi_env() {
  mpi_flags=()
  if grep -qi "open mpi\|openrte" <<<"$(mpiexec --version 2>&1 || true)"; then
    mpi_flags+=(--oversubscribe)
    if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
  fi
}

# ub_load FILE [LABEL]: appends "LABEL: <uptime>" to FILE and prints it (before and after a run).
ub_load() {
  echo "${2:-load}: $(uptime)" | tee -a "$1"
}

# A python3 that can draw the charts (matplotlib), else python3.
ub_python() {
  local c
  for c in python3 /usr/bin/python3; do
    if command -v "$c" >/dev/null && "$c" -c 'import matplotlib' 2>/dev/null; then echo "$c"; return; fi
  done
  echo python3
}

# ub_perf_table OP BACKEND N ARGS...: one ulysses_perf --op OP table (built in $build) in a
# Markdown code block under its command: --backend local --ranks N in process, else (mpi, window)
# under mpiexec -n N.
ub_perf_table() {
  local op="$1" backend="$2" n="$3" perf="$build/bench/ulysses_perf"
  shift 3
  [ -x "$perf" ] || { echo "(ulysses_perf not built: no --op $op table)"; return 0; }
  if [ "$backend" = local ]; then
    printf '\n`ulysses_perf --op %s --backend local --ranks %s %s`:\n\n```\n' "$op" "$n" "$*"
    "$perf" --op "$op" --backend local --ranks "$n" "$@"
  else
    printf '\n`mpiexec -n %s ulysses_perf --op %s --backend %s %s`:\n\n```\n' "$n" "$op" "$backend" "$*"
    mpiexec -n "$n" "${mpi_flags[@]}" "$perf" --op "$op" --backend "$backend" "$@"
  fi
  printf '```\n'
}

# ub_perf_tables OP RANKS ARGS...: ulysses_perf --op OP (built in $build) in process and under
# mpiexec -n N, for each N in RANKS, each table in a Markdown code block under its command
# (UB_PERF_BACKENDS: the backends of each N, default "local mpi").
ub_perf_tables() {
  local op="$1" ranks="$2" n b
  shift 2
  for n in $ranks; do
    for b in ${UB_PERF_BACKENDS:-local mpi}; do ub_perf_table "$op" "$b" "$n" "$@"; done
  done
}
