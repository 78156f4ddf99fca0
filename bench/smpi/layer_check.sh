#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One attention layer's forward through distributed_attention() on the simulated cluster (SMPI, 8
# nodes of 8 GPUs: 64 ranks), for layouts of every kind, U alone, U x Ring and all-gather KV, with
# packed documents, against what advise_hybrid() predicts for the same rows (the platform's own
# link figures as the model: bench/results/smpi/platform-params.json, scale.sh's):
#
#   bench/smpi/layer_check.sh [OUT.md]        (default bench/results/smpi/layer.md)
#
# Each row is ulysses_perf --op layer --layer U,R,KV (bench/perf_layer.hpp) under smpi.sh perf 8:
# a stand-in attention sleeps (simulated time) for each ring step's pairs at --attn-TFLOPS, the
# exchanges and the ring move on the simulated links, host work takes no simulated time (smpi.sh).
# added = the call's time - the balanced attention; predicted = advise_hybrid()'s HybridChoice::seconds
# of the same row. The table lists the rows by predicted time with each measured rank, the error
# (predicted / added - 1), and whether the measured order is the predicted one.
# Knobs: ROWS ("U,R,KV ..."), MODEL (Llama-3.1-70B), S (131072), DOCS (lognormal:2048), TFLOPS (500),
# ITERS (2, after 1 warm-up), NODES (8), FROM_LOG (render the rows an earlier run printed). Needs
# bench/smpi/smpi.sh build first.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/bench/results/smpi/layer.md}"
rows="${ROWS:-8,1,none 16,1,none 64,1,none 8,2,ring 8,4,ring 2,4,ring 8,8,ring 16,2,ring 4,2,ring 1,2,allgather 1,4,allgather 1,8,allgather 4,2,allgather 2,4,allgather 8,2,allgather}"
model="${MODEL:-Llama-3.1-70B}"; S="${S:-131072}"; docs="${DOCS:-lognormal:2048}"; tflops="${TFLOPS:-500}"
iters="${ITERS:-2}"; nodes="${NODES:-8}"
params="$root/bench/results/smpi/platform-params.json"
export ULYSSES_SMPI_FOLD_BYTES="${ULYSSES_SMPI_FOLD_BYTES:-1048576}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
lines="$tmp/lines.txt"
: > "$lines"
# FROM_LOG=FILE: no simulation, the rows from the "== U,R,KV: line wall" lines an earlier run printed
# on stderr (a run cut short: its finished rows), then the table as below.
if [ -n "${FROM_LOG:-}" ]; then
  sed -n 's/^== [0-9,a-z]*: *//p' "$FROM_LOG" > "$lines"
  rows=""
  header="# (rows from $(basename "$FROM_LOG"): each row's first header lines are in that run's output)"
fi
for row in $rows; do
  start=$(date +%s)
  log="$tmp/$(tr ',' '_' <<<"$row").log"
  "$here/smpi.sh" perf "$nodes" --op layer --layer "$row" --model "$model" -b "$S" -e "$S" --docs "$docs" --ranks-per-node 8 \
    -n "$iters" -w 1 -c 0 --dtype bf16 --attn-TFLOPS "$tflops" --params "$params" --params-backend mpi > "$log" 2>&1 ||
    { cat "$log"; echo "layer_check.sh: row $row failed" >&2; exit 1; }
  line=$(grep -E '^ +[0-9]+ +[0-9]+ +(none|ring|allgather) ' "$log" | tail -1)
  [ -n "$line" ] || { cat "$log"; echo "layer_check.sh: row $row printed no line" >&2; exit 1; }
  echo "$line $(( $(date +%s) - start ))" >> "$lines"
  echo "== $row: $line $(( $(date +%s) - start ))" >&2
done
if [ -z "${FROM_LOG:-}" ]; then
  logs=("$tmp"/*.log)
  header=$(grep -h -m3 '^# ' "${logs[0]}")  # (one file, no pipe: a pipe into head broke grep under pipefail, exit 141)
fi
{
  echo "# bench/smpi/layer_check.sh, $(date -u +%Y-%m-%dT%H:%MZ), SimGrid $(smpirun -version 2>/dev/null | head -1 | sed 's/.*SimGrid version //'), $((nodes * 8)) simulated ranks"
  echo
  echo "One layer's forward, \`distributed_attention()\`, $model, S = $S, packed documents ($docs), stand-in attention at $tflops TFLOP/s;"
  echo "predicted: \`advise_hybrid()\` with the platform's link figures (\`$(basename "$params")\`), the same documents. Each row:"
  echo "\`bench/smpi/smpi.sh perf $nodes --op layer --layer U,R,KV ...\` (first lines of one row's header below)."
  echo
  echo '```'
  echo "$header"
  echo '```'
  echo
  python3 - "$lines" <<'EOF'
import sys
rows = []
for l in open(sys.argv[1]):
    f = l.split()
    U, R, kv, S, t, attn, added, pred, ratio = f[:9]
    rows.append(dict(U=int(U), R=int(R), kv=kv, t=float(t), attn=float(attn), added=float(added), pred=float(pred), wall=f[9] if len(f) > 9 else '-'))
by_pred = sorted(rows, key=lambda r: r['pred'])
by_meas = sorted(rows, key=lambda r: r['added'])
rank = {id(r): i + 1 for i, r in enumerate(by_meas)}
print("| predicted rank | U x R (kv) | predicted added (ms) | measured added (ms) | measured rank | error | call (ms) | balanced attention (ms) | wall (s) |")
print("|---|---|---|---|---|---|---|---|---|")
worst = 0
for i, r in enumerate(by_pred):
    err = r['pred'] / r['added'] - 1 if r['added'] > 0 else float('inf')
    worst = max(worst, abs(err))
    print(f"| {i + 1} | {r['U']} x {r['R']} ({r['kv']}) | {r['pred']:.3f} | {r['added']:.3f} | {rank[id(r)]} | {err:+.1%} | {r['t']:.3f} | {r['attn']:.3f} | {r['wall']} |")
same = [r['U'] for r in by_pred] == [r['U'] for r in by_meas] and [r['R'] for r in by_pred] == [r['R'] for r in by_meas] and \
       [r['kv'] for r in by_pred] == [r['kv'] for r in by_meas]
pairs = [(a, b) for i, a in enumerate(rows) for b in rows[i + 1:]]
agree = sum(1 for a, b in pairs if (a['pred'] - b['pred']) * (a['added'] - b['added']) > 0)
print()
print(f"Measured order {'=' if same else '!='} predicted order; {agree} of {len(pairs)} pairs ordered alike; the largest error {worst:.1%} (target: within 15%).")
best = {}
for r in rows:
    k = 'U alone' if r['kv'] == 'none' else 'U x Ring' if r['kv'] == 'ring' else 'all-gather KV'
    if k not in best or r['added'] < best[k]['added']: best[k] = r
print()
print("Best of each kind, measured: " + "; ".join(f"{k} {v['U']} x {v['R']}: {v['added']:.3f} ms" for k, v in sorted(best.items(), key=lambda kv: kv[1]['added'])) + ".")
EOF
} > "$out"
echo "layer_check.sh: $out"
