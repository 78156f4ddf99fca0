#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The exchanges timed on the simulated cluster (SMPI, memory folding), and the cost model priced
# with the platform's own link figures against those simulated times:
#
#   bench/smpi/scale.sh [OUTDIR]          (default OUTDIR: bench/results/smpi)
#
# 1. for every entry of CASES ("NODES MODEL P S0 S1"; P the Ulysses degree, the world of NODES x 8
#    ranks cut into NODES x 8 / P groups that exchange at once: ulysses_perf --groups) and every
#    exchange path of VARIANTS (flat: one message per peer and tensor; alltoallv: one MPI_Alltoallv;
#    two-level: one forwarder per node pair; rail: the rail-aligned two-level exchange, lanes 0),
#    ulysses_perf --backend mpi -c 0 under smpi.sh perf, both directions, S = S0, 2 S0, ... <= S1,
#    into OUTDIR/runs/*.json (and .txt), with each run's wall time in OUTDIR/walltime.txt;
# 2. the platform's figures as the model's parameters (no copy term: the simulation gives host work no
#    time), in two readings: OUTDIR/platform-params.json, alpha = the link's latency per message (the
#    model's own reading: "latency and per-message overhead"); OUTDIR/platform-params-rounds.json,
#    alpha = 0 (the platform has no per-message overhead) and the inter-node latency once per round
#    (epsilon: concurrent messages overlap their latencies);
# 3. OUTDIR/check.txt: ulysses_perf --check of both against every run in OUTDIR/runs (--rows), and
#    the error distribution per exchange path.
#
# Knobs: CASES, VARIANTS, DTYPE (bf16), ITERS (2, after 1 warm-up), TAG (a suffix of the run files, e.g.
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
while read -r nodes model P s0 s1; do
  [ -n "$nodes" ] || continue
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
      -b "$s0" -e "$s1" -f 2 -n "$iters" -w 1 -c 0 --bare 0 --groups "$groups" --ranks-per-node 8 "${args[@]}" --json "$f" \
      > "${f%.json}.txt" 2>&1 || { echo "scale.sh: run failed (see ${f%.json}.txt)" >&2; rm -f "$f"; continue; }
    t1=$(date +%s.%N)
    printf '%-70s %8.1f s wall\n' "$(basename "$f" .json)" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" | tee -a "$out/walltime.txt"
  done
done <<<"$cases"
model_json() {  # alpha_intra_us alpha_inter_us round_us
  cat <<EOF
{"tool": "bench/smpi/scale.sh: the platform's link figures as the cost model (not fitted)",
 "models": {"mpi": {"intra_alpha_us": $1, "intra_GBps": $NVLINK_GBPS, "inter_alpha_us": $2, "inter_GBps": $IB_GBPS,
                    "copy_GBps": 0, "cache_MiB": 0, "intra_cached_GBps": 0, "copy_cached_GBps": 0, "row_ns": 0, "round_us": $3}}}
EOF
}
model_json "$NVLINK_US" "$IB_US" 0 > "$out/platform-params.json"
model_json 0 0 "$IB_US" > "$out/platform-params-rounds.json"
[ "${CHECK:-1}" = 0 ] && exit 0
present=()
for f in "$out"/runs/*.json; do [ -s "$f" ] && present+=("$f"); done
[ ${#present[@]} -gt 0 ] || { echo "scale.sh: no run to check" >&2; exit 1; }
# The distribution of |error| per exchange path (messages, alltoallv, two-level, rail) of --rows.
by_path() {
  awk '$2 ~ /^P=[0-9]+$/ && $3 ~ /^S=/ && $NF ~ /%$/ {
         path = $5; if ($0 ~ /lanes 0/) path = "rail"; else if (path == "two_level") path = "two-level"
         e = $NF; sub(/%/, "", e); e += 0; e = e < 0 ? -e : e; n[path]++; v[path, n[path]] = e; all[++N] = e }
       function report(name, k, a,   i, j, t, within) {
         for (i = 1; i <= k; ++i) for (j = i + 1; j <= k; ++j) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
         within = 0; for (i = 1; i <= k; ++i) within += a[i] <= 15
         printf " %-12s %5d %8.1f%% %8.1f%% %8.1f%% %8.1f%%\n", name, k, a[int((k - 1) * 0.5) + 1], a[int((k - 1) * 0.9) + 1], a[k], 100 * within / k }
       END { printf "#%-12s %5s %9s %9s %9s %9s\n", "path", "n", "median", "p90", "max", "<=15%"
             for (p in n) { k = 0; split("", a); for (i = 1; i <= n[p]; ++i) a[++k] = v[p, i]; report(p, k, a) }
             split("", a); for (i = 1; i <= N; ++i) a[i] = all[i]; report("all", N, a) }'
}
for m in platform-params platform-params-rounds; do
  echo "## the cost model with the platform's figures ($m.json) against the simulated times"
  "$perf" --check "$out/$m.json" --rows "${present[@]}" > "$out/check-$m.txt" || true
  cat "$out/check-$m.txt"
  echo "## |error| per exchange path ($m.json)"
  by_path < "$out/check-$m.txt"
done | tee "$out/check.txt"
