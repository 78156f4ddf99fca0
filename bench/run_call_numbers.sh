#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What numbering the library calls costs (issue 30: <= 1%): ulysses_perf with --call-numbers 1 and
# 0 alternately, ROUNDS times each, on the in-process group (--backend local) and across processes
# on the window path (--backend mpi, mpiexec -n MPI_RANKS); per row the median of each side's
# times and their ratio (numbered / not). Writes OUTDIR/call_numbers.md.
#
#   bench/run_call_numbers.sh [OUTDIR]      (default OUTDIR: bench/results)
#
# Environment knobs: BUILD_DIR (default build), ROUNDS (default 3), MPI_RANKS (default 4),
# ARGS (default: Llama-3.1-8B, bf16, S 4096 and 16384, -n 20 -w 5).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
out="${1:-$root/bench/results}"
build="${BUILD_DIR:-$root/build}"
rounds="${ROUNDS:-3}"
ranks="${MPI_RANKS:-4}"
args=(${ARGS:---model Llama-3.1-8B --dtype bf16 -b 4096 -e 16384 -f 4 -n 20 -w 5})
tmp="$(mktemp -d)"
mkdir -p "$out"
[ -f "$build/CMakeCache.txt" ] || cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" --target ulysses_perf -j "${JOBS:-2}"
perf="$build/bench/ulysses_perf"
flags=()
if grep -qi "open mpi\|openrte" <<<"$(mpiexec --version 2>&1 || true)"; then
  flags+=(--oversubscribe)
  if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
fi
for k in $(seq "$rounds"); do
  for n in 1 0; do
    echo "== round $k, --call-numbers $n"
    "$perf" --backend local --ranks "$ranks" "${args[@]}" --call-numbers "$n" --json "$tmp/local_${n}_$k.json" >/dev/null
    mpiexec -n "$ranks" "${flags[@]}" "$perf" --backend mpi "${args[@]}" --call-numbers "$n" --json "$tmp/mpi_${n}_$k.json" >/dev/null
  done
done
python3 - "$tmp" "$rounds" "$out/call_numbers.md" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PY'
import json, statistics, sys
tmp, rounds, dst, cores, load = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
lines = ["# What numbering the library calls costs", "",
         f"One run of `bench/run_call_numbers.sh` ({rounds} rounds, --call-numbers 1 and 0 alternately; {cores} cores, load {load}).",
         "Per row: the median over the rounds of ulysses_perf's time (the median of its iterations, the slowest rank),",
         "numbered and not, and their ratio (target <= 1.01).", "",
         "| backend | S | direction | path | numbered (us) | not numbered (us) | ratio |", "|---|---|---|---|---|---|---|"]
worst = 0
for be in ("local", "mpi"):
    runs = {n: [json.load(open(f"{tmp}/{be}_{n}_{k}.json"))["rows"] for k in range(1, rounds + 1)] for n in (1, 0)}
    for i, row in enumerate(runs[1][0]):
        on = statistics.median(r[i]["time_us"] for r in runs[1])
        off = statistics.median(r[i]["time_us"] for r in runs[0])
        worst = max(worst, on / off)
        lines.append(f"| {be} | {row['S']} | {row['direction']} | {row['path']} | {on:.1f} | {off:.1f} | {on / off:.3f} |")
lines += ["", f"Largest ratio: {worst:.3f}."]
open(dst, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
