#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The exchanges timed on the simulated cluster (SMPI, memory folding), and the cost model priced
# with the platform's own link figures against those simulated times:
#
#   bench/smpi/scale.sh [OUTDIR]          (default OUTDIR: bench/results/smpi)
#
# 1. for every entry of CASES ("NODES MODEL P S0 S1 [ITERS]"; P the Ulysses degree, the world of NODES x 8
#    ranks cut into NODES x 8 / P groups that exchange at once: ulysses_perf --groups) and every
#    exchange path of VARIANTS (flat: one message per peer and tensor; alltoallv: one MPI_Alltoallv;
#    two-level: one forwarder per node pair; rail: the rail-aligned two-level exchange, lanes 0),
#    ulysses_perf --backend mpi -c 0 --copies 0 under smpi.sh perf (the host copies skipped: the simulation
#    gives them no time, the messages are the same), both directions, S = S0, 2 S0, ... <= S1,
#    into OUTDIR/runs/*.json (and .txt), with each run's wall time in OUTDIR/walltime.txt;
# 2. the platform's figures as the model's parameters, OUTDIR/platform-params.json (not fitted): the
#    links' latencies as lambda (once per sequential step of messages: concurrent messages overlap
#    their latencies), their bandwidths as beta, no per-message overhead (alpha = 0: the platform has
#    none) and no copy term (the simulation gives host work no time);
# 3. OUTDIR/check.txt: ulysses_perf --check of it against every run in OUTDIR/runs (--rows), and
#    the error distribution per exchange path and scale (P, ranks); OUTDIR/times.md: the simulated
#    times of every case, the four paths side by side (the model's in parentheses).
#
# Knobs: CASES, VARIANTS, COPIES (0; 1: the executor's copies run too, same simulated times, much more wall time), DTYPE (bf16), ITERS (2, after 1 warm-up; a case's own ITERS field overrides it), TAG (a suffix of the run files, e.g.
# for another platform: IB_TAPER=2 TAG=taper2), CHECK (0: skip step 3), FRESH (run again runs already in
# OUTDIR/runs), PERF (a normal build's ulysses_perf for --check; default build-sim/bench/ulysses_perf,
# built when missing), RUN_TIMEOUT (1800 s a run), and the platform's figures (platform.sh's
# NVLINK_GBPS NVLINK_US IB_GBPS IB_US). Needs bench/smpi/smpi.sh build first.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/bench/results/smpi}"
cases="${CASES:-8 Llama-3.1-70B 64 131072 131072
64 Llama-3.1-70B 64 131072 131072}"
variants="${VARIANTS:-flat alltoallv two-level rail}"
dtype="${DTYPE:-bf16}"; iters="${ITERS:-2}"
mkdir -p "$out/runs"
: "${NVLINK_GBPS:=450}" "${NVLINK_US:=1}" "${IB_GBPS:=50}" "${IB_US:=5}"
perf="${PERF:-$root/build-sim/bench/ulysses_perf}"
if [ ! -x "$perf" ]; then
  [ -f "$root/build-sim/CMakeCache.txt" ] || cmake -S "$root" -B "$root/build-sim" -DCMAKE_BUILD_TYPE=Release \
    -DULYSSES_ENABLE_TORCH=OFF -DULYSSES_ENABLE_CUDA=OFF >/dev/null
  cmake --build "$root/build-sim" -j1 --target ulysses_perf
fi
files=()
while read -r nodes model P s0 s1 case_iters; do
  [ -n "$nodes" ] && [ "${nodes:0:1}" != "#" ] || continue
  ranks=$((nodes * 8)); groups=$((ranks / P))
  slug="nodes${nodes}_$(tr -c 'A-Za-z0-9\n' '_' <<<"$model")_P${P}_S${s0}-${s1}${TAG:+_$TAG}"
  for v in $variants; do
    case $v in
      flat) args=(--path messages) ;;
      alltoallv) args=(--path alltoallv) ;;
      two-level) args=(--lanes 1) ;;
      rail) args=(--lanes 0) ;;
      *) echo "scale.sh: unknown variant $v" >&2; exit 2 ;;
    esac
    f="$out/runs/${slug}_$v.json"
    files+=("$f")
    if [ -s "$f" ] && [ -z "${FRESH:-}" ]; then echo "== $f kept (FRESH=1 runs it again)"; continue; fi
    echo "== $ranks ranks ($nodes nodes), $model, P=$P x $groups groups, S=$s0..$s1, $v -> $f"
    t0=$(date +%s.%N)
    ULYSSES_SMPI_FOLD_BYTES=1048576 TIMEOUT="${RUN_TIMEOUT:-1800}" "$here/smpi.sh" perf "$nodes" --model "$model" --dtype "$dtype" \
      -b "$s0" -e "$s1" -f 2 -n "${case_iters:-$iters}" -w 1 -c 0 --copies "${COPIES:-0}" --bare 0 --groups "$groups" --ranks-per-node 8 "${args[@]}" --json "$f" \
      > "${f%.json}.txt" 2>&1 || { echo "scale.sh: run failed (see ${f%.json}.txt)" >&2; rm -f "$f"; continue; }
    t1=$(date +%s.%N)
    printf '%-70s %8.1f s wall (%s)\n' "$(basename "$f" .json)" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" \
      "$(uptime | sed 's/.*load average/load average/')" | tee -a "$out/walltime.txt"
  done
done <<<"$cases"
cat > "$out/platform-params.json" <<EOF
{"tool": "bench/smpi/scale.sh: the platform's link figures as the cost model (not fitted)",
 "models": {"mpi": {"intra_alpha_us": 0, "intra_GBps": $NVLINK_GBPS, "intra_latency_us": $NVLINK_US,
                    "inter_alpha_us": 0, "inter_GBps": $IB_GBPS, "inter_latency_us": $IB_US,
                    "copy_GBps": 0, "cache_MiB": 0, "intra_cached_GBps": 0, "copy_cached_GBps": 0, "row_ns": 0, "round_us": 0}}}
EOF
[ "${CHECK:-1}" = 0 ] && exit 0
present=()
for f in "$out"/runs/*.json; do [ -s "$f" ] && present+=("$f"); done
[ ${#present[@]} -gt 0 ] || { echo "scale.sh: no run to check" >&2; exit 1; }
# The distribution of |error| per exchange path (messages, alltoallv, two-level, rail) and scale (P,
# world ranks) of the --rows lines, each prefixed with "ranks=N"; then per path over all scales.
by_path() {
  awk '$1 ~ /^ranks=/ && $3 ~ /^P=[0-9]+$/ && $4 ~ /^S=/ && $NF ~ /%$/ {
         path = $6; if ($0 ~ /lanes 0/) path = "rail"; else if (path == "two_level") path = "two-level"
         e = $NF; sub(/%/, "", e); e += 0; e = e < 0 ? -e : e
         P = substr($3, 3) + 0; R = substr($1, 7) + 0
         g = sprintf("1 %-10s %06d %06d|%-10s %-5s %s", path, P, R, path, $3, $1)
         n[g]++; v[g, n[g]] = e; p = "2 " path "|" path " (all)"; np[p]++; vp[p, np[p]] = e; all[++N] = e }
       function report(key, k, a,   i, j, t, within) {
         for (i = 1; i <= k; ++i) for (j = i + 1; j <= k; ++j) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
         within = 0; for (i = 1; i <= k; ++i) within += a[i] <= 15
         split(key, kk, "|")
         printf "%s| %-32s %5d %8.1f%% %8.1f%% %8.1f%% %8.1f%%\n", kk[1], kk[2], k, a[int((k - 1) * 0.5) + 1], a[int((k - 1) * 0.9) + 1], a[k], 100 * within / k }
       END { printf "0|#%-32s %5s %9s %9s %9s %9s\n", "path, P, world", "n", "median", "p90", "max", "<=15%"
             for (g in n) { split("", a); for (i = 1; i <= n[g]; ++i) a[i] = v[g, i]; report(g, n[g], a) }
             for (p in np) { split("", a); for (i = 1; i <= np[p]; ++i) a[i] = vp[p, i]; report(p, np[p], a) }
             split("", a); for (i = 1; i <= N; ++i) a[i] = all[i]; report("3|all", N, a) }' | LC_ALL=C sort | cut -d'|' -f2-
}
{
  echo "## the cost model with the platform's figures (platform-params.json) against the simulated times"
  echo "# $("$perf" --advise --params "$out/platform-params.json" --params-backend mpi --world 8 2>/dev/null | grep '^# model' | sed 's/^# //')"
  rm -f "$out/check-rows.txt"
  for nodes in $(ls "$out"/runs/ | sed -n 's/^nodes\([0-9]*\)_.*\.json$/\1/p' | sort -n | uniq); do
    files=("$out"/runs/nodes"${nodes}"_*.json)
    "$perf" --check "$out/platform-params.json" --rows "${files[@]}" | sed "s/^/ranks=$((nodes * 8)) /" >> "$out/check-rows.txt" || true
  done
  grep ' P=' "$out/check-rows.txt"
  echo "## |model / measured - 1| per exchange path and scale (P: the Ulysses degree; ranks: the simulated world, world / P groups at once)"
  by_path < "$out/check-rows.txt"
} | tee "$out/check.txt"
# The simulated times side by side (Markdown), from the same rows.
awk '$1 ~ /^ranks=/ && $3 ~ /^P=[0-9]+$/ && $4 ~ /^S=/ && $NF ~ /%$/ {
       path = $6; if ($0 ~ /lanes 0/) path = "rail"; else if (path == "two_level") path = "two-level"
       dir = $5 == "seq_to_head" ? "seq->head q,k,v" : "head->seq o"
       k = sprintf("%06d %-16s %06d %08d %d", substr($1, 7), $2, substr($3, 3), substr($4, 3), $5 == "seq_to_head" ? 1 : 2)
       row[k] = sprintf("| %d | %s | %d | %d | %s ", substr($1, 7), $2, substr($3, 3), substr($4, 3), dir)
       t[k, path] = sprintf("%.1f (%.1f)", $(NF - 2), $(NF - 1)) }
     END { for (k in row) { line = row[k]
             split("messages alltoallv two-level rail", ps, " ")
             for (i = 1; i <= 4; ++i) line = line "| " ((k, ps[i]) in t ? t[k, ps[i]] : "—") " "
             print k "|" line "|" } }' "$out/check-rows.txt" | LC_ALL=C sort | cut -d'|' -f2- |
  { echo "| ranks | model | P | S | exchange | flat, messages (µs) | flat, MPI_Alltoallv | two-level, lanes 1 | rail-aligned, lanes 0 |"
    echo "|---|---|---|---|---|---|---|---|---|"
    cat; } > "$out/times.md"
