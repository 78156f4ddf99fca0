#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The degree-advice tables of docs/cost-model.md: ulysses_perf --advise for Llama-3.1-70B and -405B
# at S = 128k and 1M on 64, 512 and 4096 GPUs (8 per node), printed as Markdown: the Ulysses
# degree (advise_degree) and the Ulysses x Ring x outer layouts (advise_hybrid, causal, the ring
# overlapped with attention at --attn-TFLOPS, default 500). A model, not a measurement.
#
#   bench/advice_table.sh [ulysses_perf] [extra --advise flags, e.g. --params FILE, --budget-GiB G, --attn-TFLOPS T,
#                         --band-call-us U: both tables banded, the hybrid one ranked by its banded time]
#
# docs/cost-model.md's tables: the model checked against the simulated cluster (bench/smpi/scale.sh's
# platform-params.json: the SMPI platform's links) with HBM copies at the placeholder 1.5 TB/s:
#   bench/advice_table.sh build-sim/bench/ulysses_perf --params bench/results/smpi/platform-params.json \
#       --params-backend mpi --copy-GBps 1500
# The first line printed names the model's parameters.
set -euo pipefail
perf="${1:-build/bench/ulysses_perf}"
shift || true
budget=(--budget-GiB 8)
echo "Model: $("$perf" --advise --world 8 "$@" | sed -n 's/^# model (a prediction, not a measurement): //p')"
echo
cases=()
for model in Llama-3.1-70B Llama-3.1-405B; do
  for S in 131072 1048576; do
    for W in 64 512 4096; do cases+=("$model $S $W"); done
  done
done
declare -A out
for c in "${cases[@]}"; do
  read -r model S W <<<"$c"
  out[$c]=$("$perf" --advise --model "$model" --seq "$S" --world "$W" --ranks-per-node 8 "${budget[@]}" "$@")
done
echo "| model | S | GPUs | best: P x outer (path) | ms / layer | intra MB | inter MB | GiB / rank | runner-up | P = 8 (one node) |"
# Ulysses table columns: 1 P, 2 outer, 3 nodes, 4 path, 5 time, 6 flat, 7 2-level, 8 rail, 9 intra MB, 10 inter MB, 11 GiB, 12 fits
echo "|---|---|---|---|---|---|---|---|---|---|"
for c in "${cases[@]}"; do
  read -r model S W <<<"$c"
  rows=$(awk '/^# hybrid/ { h = 1 } !/^#/ && !h' <<<"${out[$c]}")
  best=$(sed -n 1p <<<"$rows"); second=$(sed -n 2p <<<"$rows")
  p8=$(awk '$1 == 8' <<<"$rows")
  fmt() { awk '{ printf "%s x %s (%s)", $1, $2, $4 }' <<<"$1"; }
  ms() { awk '{ printf "%.2f", $5 }' <<<"$1"; }
  echo "| $model | $S | $W | $(fmt "$best")$(awk '$12 == "no" { printf " — over budget" }' <<<"$best") | $(ms "$best") | $(awk '{print $9}' <<<"$best") | $(awk '{print $10}' <<<"$best") | $(awk '{print $11}' <<<"$best") | $(fmt "$second"): $(ms "$second") ms | $(ms "$p8") ms, $(awk '{printf "%s GiB%s", $11, ($12 == "no" ? ", over budget" : "")}' <<<"$p8") |"
done
echo
echo "| model | S | GPUs | best: U x R x outer (kv) | ms / layer | Ulysses ms | ring exposed ms | merge ms | ring comm ms | attention ms | inter MB | GiB / rank | best without a ring | best all-gather kv | why |"
# hybrid columns: 1 U, 2 R, 3 outer, 4 kv, 5 msgs, 6 time, 7 ulysses, 8 exposed, 9 merge, 10 imb, 11 ring, 12 attn,
# 13 intra MB, 14 inter MB, 15 GiB, 16 fits, 17 G, 18 banded (ms; '-' without --band-call-us), 19.. why
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for c in "${cases[@]}"; do
  read -r model S W <<<"$c"
  rows=$(awk '/^# hybrid/ { h = 1 } !/^#/ && h' <<<"${out[$c]}")
  best=$(sed -n 1p <<<"$rows")
  plain=$(awk '$4 == "none"' <<<"$rows" | sed -n 1p)
  gather=$(awk '$4 == "allgather"' <<<"$rows" | sed -n 1p)
  fmt() { awk '{ printf "%s x %s x %s (%s)%s%s", $1, $2, $3, $4, ($17 != "-" && $17 > 1 ? " in " $17 " bands" : ""), ($16 == "no" ? " — over budget" : "") }' <<<"$1"; }
  ms() { awk '{ printf "%.2f%s", $6, ($18 != "-" ? " (banded " $18 ")" : "") }' <<<"$1"; }
  why=$(awk '{ s = $19; for (i = 20; i <= NF; ++i) s = s " " $i; print s }' <<<"$best")
  echo "| $model | $S | $W | $(fmt "$best") | $(ms "$best") | $(awk '{printf "%.2f", $7}' <<<"$best") | $(awk '{printf "%.2f", $8}' <<<"$best") | $(awk '{printf "%.2f", $9}' <<<"$best") | $(awk '{printf "%.2f", $11}' <<<"$best") | $(awk '{printf "%.1f", $12}' <<<"$best") | $(awk '{print $14}' <<<"$best") | $(awk '{print $15}' <<<"$best") | $(fmt "$plain"): $(ms "$plain") ms | $(fmt "$gather"): $(ms "$gather") ms | $why |"
done
