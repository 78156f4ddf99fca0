#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What numbering the library calls costs (issue 30: <= 1%): ulysses_perf --call-numbers both, which
# times each exchange numbered and not numbered alternately, per call (the median of -n calls of
# each, the slowest rank), in one run: on the in-process group (--backend local) and across
# processes on the window path (--backend mpi, mpiexec -n MPI_RANKS). Writes OUTDIR/call_numbers.md.
#
#   bench/run_call_numbers.sh [OUTDIR]      (default OUTDIR: bench/results)
#
# Environment knobs: BUILD_DIR (default build), MPI_RANKS (default 4),
# ARGS (default: Llama-3.1-8B, bf16, S 4096 and 16384, -n 60 -w 10, both directions and their backward).
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ub_paths "${1:-}" "$root/bench/results" "$root/build"
ranks="${MPI_RANKS:-4}"
args=(${ARGS:---direction both --model Llama-3.1-8B --dtype bf16 -b 4096 -e 16384 -f 4 -n 60 -w 10 --backward})
tmp="$(mktemp -d)"
ub_configure
ub_build ulysses_perf
perf="$build/bench/ulysses_perf"
ub_mpi_env
ub_load "$raw/call_numbers_load.txt" before
"$perf" --backend local --ranks "$ranks" "${args[@]}" --call-numbers both --json "$tmp/local.json"
mpiexec -n "$ranks" "${mpi_flags[@]}" "$perf" --backend mpi "${args[@]}" --call-numbers both --json "$tmp/mpi.json"
ub_load "$raw/call_numbers_load.txt" after
python3 - "$tmp" "$out/call_numbers.md" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)" "${args[*]}" <<'PY'
import json, sys
tmp, dst, cores, load, args = sys.argv[1:6]
lines = ["# What numbering the library calls costs", "",
         f"One run of `bench/run_call_numbers.sh` (ulysses_perf {args} --call-numbers both; {cores} cores, load {load}):",
         "each exchange timed numbered and not numbered alternately, per call; the median of each, the slowest rank;",
         "ratio = numbered / not numbered (target <= 1.01).", "",
         "| backend | S | direction | path | numbered (us) | not numbered (us) | ratio |", "|---|---|---|---|---|---|---|"]
worst = 0
for be in ("local", "mpi"):
    for row in json.load(open(f"{tmp}/{be}.json"))["rows"]:
        r = row["time_us"] / row["bare_us"]
        worst = max(worst, r)
        lines.append(f"| {be} | {row['S']} | {row['direction']} | {row['path']} | {row['time_us']:.1f} | {row['bare_us']:.1f} | {r:.3f} |")
lines += ["", f"Largest ratio: {worst:.3f}."]
open(dst, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
