#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The README's degree-advice table: ulysses_perf --advise for Llama-3.1-70B and -405B at S = 128k
# and 1M on 64, 512 and 4096 GPUs (8 per node), printed as Markdown. A model, not a measurement.
#
#   bench/advice_table.sh [ulysses_perf] [extra --advise flags, e.g. --params FILE or --budget-GiB G]
#
# docs/cost-model.md's table: the model checked against the simulated cluster (bench/smpi/scale.sh's
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
echo "| model | S | GPUs | best: P x outer (path) | ms / layer | intra MB | inter MB | GiB / rank | runner-up | P = 8 (one node) |"
# --advise columns: 1 P, 2 outer, 3 nodes, 4 path, 5 time, 6 flat, 7 2-level, 8 rail, 9 intra MB, 10 inter MB, 11 GiB, 12 fits
echo "|---|---|---|---|---|---|---|---|---|---|"
for model in Llama-3.1-70B Llama-3.1-405B; do
  for S in 131072 1048576; do
    for W in 64 512 4096; do
      rows=$("$perf" --advise --model "$model" --seq "$S" --world "$W" --ranks-per-node 8 "${budget[@]}" "$@" | grep -v '^#')
      best=$(sed -n 1p <<<"$rows"); second=$(sed -n 2p <<<"$rows")
      p8=$(awk '$1 == 8' <<<"$rows")
      fmt() { awk '{ printf "%s x %s (%s)", $1, $2, $4 }' <<<"$1"; }
      ms() { awk '{ printf "%.2f", $5 }' <<<"$1"; }
      echo "| $model | $S | $W | $(fmt "$best")$(awk '$12 == "no" { printf " — over budget" }' <<<"$best") | $(ms "$best") | $(awk '{print $9}' <<<"$best") | $(awk '{print $10}' <<<"$best") | $(awk '{print $11}' <<<"$best") | $(fmt "$second"): $(ms "$second") ms | $(ms "$p8") ms, $(awk '{printf "%s GiB%s", $11, ($12 == "no" ? ", over budget" : "")}' <<<"$p8") |"
    done
  done
done
