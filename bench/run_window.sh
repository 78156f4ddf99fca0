#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The peer copy between MPI processes (bench_mpi_window.cpp): builds it, runs it under mpiexec for
# each group size, and writes the table of ratios the issue sets targets on.
#
#   bench/run_window.sh [OUTDIR]          (default OUTDIR: bench/results; writes window.md there)
#
# Per case (Llama-3.1-8B q, k, v seq->head and o head->seq; S in {4096, 16384}, B in {1, 4}, fp32
# and bf16): the time of each variant (fastest of REPS repetitions, the run least disturbed by other
# load), window / MPI_Alltoall (target <= 1.0) and deepspeed / window (target >= 1.5).
# Environment knobs: BUILD_DIR (default build-bench), JSON_DIR (default BUILD_DIR/bench_json),
# MIN_TIME (default 0.2), REPS (default 5), FILTER (default: all), MPI_RANKS (default "4").
# Needs: CMake, a C++17 compiler, Google Benchmark, MPI, python3.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
out="${1:-$root/bench/results}"
build="${BUILD_DIR:-$root/build-bench}"
raw="${JSON_DIR:-$build/bench_json}"
ranks="${MPI_RANKS-4}"
mkdir -p "$out" "$raw"

if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$build" --target bench_mpi_window -j "${JOBS:-1}"

flags=()
if grep -qi "open mpi\|openrte" <<<"$(mpiexec --version 2>&1 || true)"; then
  flags+=(--oversubscribe)  # more ranks than cores on small machines
  if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
fi
jsons=()
for n in $ranks; do
  echo "== mpiexec -n $n bench_mpi_window -> $raw/window_p$n.json"
  mpiexec -n "$n" "${flags[@]}" "$build/bench/bench_mpi_window" --benchmark_min_time="${MIN_TIME:-0.2}" \
    --benchmark_repetitions="${REPS:-5}" --benchmark_display_aggregates_only=true --benchmark_filter="${FILTER:-.}" \
    --benchmark_out_format=json --benchmark_out="$raw/window_p$n.json"
  jsons+=("$raw/window_p$n.json")
done

python3 - "$out/window.md" "${jsons[@]}" <<'EOF'
import json, sys
out, files = sys.argv[1], sys.argv[2:]
lines = ["# The peer copy between MPI processes (bench/run_window.sh)", "",
         "Milliseconds per exchange (fastest of the repetitions, slowest rank), window / MPI_Alltoall (target <= 1.0)",
         "and deepspeed / window (target >= 1.5). Inputs in the window for `window`, outside it (staged) for `window_staged`.", ""]
for f in files:
    d = json.load(open(f))
    ctx = d["context"]
    best = {}
    for b in d["benchmarks"]:
        if b.get("run_type") != "iteration" or b.get("error_occurred"):
            continue
        name = b["run_name"].replace("/manual_time", "")
        fam, var = name.rsplit("/", 1)
        t = b["real_time"] * {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
        best.setdefault(fam, {})
        best[fam][var] = min(t, best[fam].get(var, float("inf")))
    lines += [f"## P = {ctx.get('mpi_ranks')} ({ctx.get('num_cpus')} CPUs, load average {ctx.get('load_avg')})", "",
              "| case | MPI_Alltoall | window | window_staged | messages | deepspeed | window / MPI_Alltoall (<= 1.0) | deepspeed / window (>= 1.5) |",
              "|---|---|---|---|---|---|---|---|"]
    for fam, v in best.items():
        w, a, ds = v.get("window"), v.get("MPI_Alltoall"), v.get("deepspeed")
        r1 = f"{w / a:.2f}" + (" ok" if w <= a else " MISS") if w and a else "-"
        r2 = f"{ds / w:.2f}" + (" ok" if ds >= 1.5 * w else " MISS") if w and ds else "-"
        cell = lambda k: f"{v[k]:.2f}" if k in v else "-"
        lines.append(f"| {fam} | {cell('MPI_Alltoall')} | {cell('window')} | {cell('window_staged')} | {cell('messages')} | {cell('deepspeed')} | {r1} | {r2} |")
    lines.append("")
open(out, "w").write("\n".join(lines))
print("\n".join(lines))
EOF
