#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Real, throttled links on one machine: two "nodes" as Linux network namespaces joined by a veth
# pair, 2 MPI ranks each (Open MPI: shared memory, vader, inside a namespace; TCP over the veth
# between them), the veth throttled with tc's token bucket (tbf: bandwidth only; no netem here, so
# no added delay). The Ulysses exchanges are timed on every path, the cost model's terms fitted
# to these runs (ulysses_perf --fit) and checked against them (ulysses_perf --check):
#
#   bench/netns/netns.sh up | run [OUTDIR] | check [OUTDIR] | down | all [OUTDIR]     (default OUTDIR: bench/results/netns)
#
#   (also: netns.sh bands [OUTDIR], the band pipeline; netns.sh layer [OUTDIR], bands x ring steps;
#   netns.sh wire [OUTDIR], the fp8 wire: see them below)
#   up    namespaces ulys-n1 (10.77.0.1, veth ulys-v1) and ulys-n2 (10.77.0.2, veth ulys-v2)
#   run   ulysses_perf --backend mpi -c 1 (bit for bit) into OUTDIR/runs/NAME.{json,txt}: 4 ranks in
#         ulys-n1 alone (intra_flat: shared memory only); then for every RATES entry, tbf on both
#         veth ends, 1 rank in each namespace (RATE_calib: the link only), and 4 ranks (2 nodes x 2)
#         on each path (RATE_{flat,alltoallv,two-level,rail}: one message per peer and tensor, one
#         MPI_Alltoallv, two-level with one forwarder per node pair, rail-aligned); per rate the
#         model fitted to intra_flat + RATE_calib (OUTDIR/params-RATE.json) and its prediction
#         checked on the 4 paths, then fitted to all (params-RATE-all.json): OUTDIR/check.txt
#   check the fit and check of step run again, from OUTDIR/runs (also writes OUTDIR/times.md)
#   down  removes both namespaces (and with them the veth pair and its qdiscs)
#   all   up, run, down; down also on failure or interrupt (trap)
#
# The launch: mpirun runs inside ulys-n1 with its own UTS namespace (hostname ulys-node1); the
# hostfile names the two veth addresses; Open MPI's rsh launcher starts the orted of 10.77.0.2
# through this script's `agent` verb, which enters ulys-n2 with its own hostname (ulys-node2).
# Each namespace needs its own hostname: Open MPI's shared-memory segments in /dev/shm (shared by
# both namespaces) are named after it, and two "nodes" of one name collide.
#
# Knobs: RANKS_PER_NIC (2: the ranks of a namespace share its one veth; the model's ranks_per_nic,
# given to --fit; 1: a link per rank, the model before it had the term), RATES ("none 1gbit 200mbit"; none: the veth unthrottled), MODEL (Llama-3.1-8B), DTYPE (bf16), S0, S1 (1024, 8192: S = S0,
# 2 S0, ... <= S1), ITERS (3, after 1 warm-up), PERF (ulysses_perf of a normal build; default
# build-sim/bench/ulysses_perf). Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2 and
# Open MPI; where namespaces cannot be made it says so and exits 0.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
self="$here/$(basename "${BASH_SOURCE[0]}")"
root="$(cd "$here/../.." && pwd)"
ns1=ulys-n1 ns2=ulys-n2 if1=ulys-v1 if2=ulys-v2 ip1=10.77.0.1 ip2=10.77.0.2 net=10.77.0.0/24
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

# Whether this machine lets us make network namespaces; says why not on stderr.
allowed() {
  command -v ip >/dev/null && command -v tc >/dev/null || { echo "netns.sh: iproute2 (ip, tc) not installed" >&2; return 1; }
  if ! ip netns add ulys-probe 2>/dev/null; then
    echo "netns.sh: cannot create network namespaces here (uid $(id -u); needs root or CAP_NET_ADMIN + CAP_SYS_ADMIN)" >&2
    return 1
  fi
  ip netns del ulys-probe
}

up() {
  down 2>/dev/null || true
  ip netns add $ns1
  ip netns add $ns2
  ip link add $if1 netns $ns1 type veth peer name $if2 netns $ns2
  ip -n $ns1 addr add $ip1/24 dev $if1
  ip -n $ns2 addr add $ip2/24 dev $if2
  for n in $ns1 $ns2; do ip -n $n link set lo up; done
  ip -n $ns1 link set $if1 up
  ip -n $ns2 link set $if2 up
  echo "netns.sh: up: $ns1 ($ip1, $if1) <-> $ns2 ($ip2, $if2)"
}

down() {
  local rc=0
  for n in $ns1 $ns2; do ip netns del $n 2>/dev/null || rc=1; done
  return $rc
}

# RATE (a tc rate: 1gbit, 200mbit, or "none"): a token bucket on the egress of both veth ends.
# The burst (128 KiB) holds one segmentation-offloaded packet (64 KiB) and is 1 ms at 1 Gbit/s.
# TBF_LATENCY (200ms): the longest a packet may wait in the bucket's queue, i.e. its depth (200 ms
# is 25 MB at 1 Gbit/s: a message's handshake or a TCP ack can queue behind that much data; a
# switch port buffers a few MB).
throttle() {
  for p in "$ns1 $if1" "$ns2 $if2"; do
    set -- $p
    tc -n "$1" qdisc del dev "$2" root 2>/dev/null || true
    [ "$RATE" = none ] || tc -n "$1" qdisc add dev "$2" root tbf rate "$RATE" burst 128kb latency "${TBF_LATENCY:-200ms}"
  done
}

# agent HOST COMMAND...: Open MPI's rsh agent; runs COMMAND (one shell string, as ssh would) in
# the namespace of HOST (one of the veth addresses) under its own hostname.
agent() {
  local host="$1"; shift
  case "$host" in
    "$ip1"|ulys-node1) exec ip netns exec $ns1 unshare --uts sh -c "hostname ulys-node1 && $*" ;;
    "$ip2"|ulys-node2) exec ip netns exec $ns2 unshare --uts sh -c "hostname ulys-node2 && $*" ;;
    *) echo "netns.sh agent: unknown host $host" >&2; exit 2 ;;
  esac
}

# launch N1 N2 ARGS...: mpirun of N1 + N2 ranks, N1 on ulys-node1 and N2 on ulys-node2, node first
# (ranks 0 .. N1-1 on ulys-node1), from inside ulys-n1.
launch() {
  local n1="$1" n2="$2" hosts rc=0; shift 2
  hosts="$(mktemp)"
  echo "$ip1 slots=$n1" > "$hosts"
  [ "$n2" -eq 0 ] || echo "$ip2 slots=$n2" >> "$hosts"
  ip netns exec $ns1 unshare --uts sh -c 'hostname ulys-node1 && exec "$@"' sh \
    timeout 600 mpirun -n $((n1 + n2)) --hostfile "$hosts" --map-by slot --bind-to none \
      --mca plm rsh --mca plm_rsh_agent "$self agent" --mca plm_rsh_no_tree_spawn 1 \
      --mca pml ob1 --mca btl tcp,self,vader --mca btl_tcp_if_include $net --mca oob_tcp_if_include $net \
      "$@" || rc=$?
  rm -f "$hosts"
  return $rc
}

run() {
  local out="${1:-$root/bench/results/netns}"
  local perf="${PERF:-$root/build-sim/bench/ulysses_perf}"
  local model="${MODEL:-Llama-3.1-8B}" dtype="${DTYPE:-bf16}" s0="${S0:-1024}" s1="${S1:-8192}" iters="${ITERS:-3}"
  [ -x "$perf" ] || { echo "netns.sh: no $perf (cmake --build build-sim --target ulysses_perf)" >&2; return 1; }
  mkdir -p "$out/runs"
  {
    echo "# bench/netns/netns.sh run, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load: $(uptime | sed 's/.*load average/load average/')"
    echo "# $(uname -sr); Open MPI $(mpirun --version | head -1 | awk '{print $NF}'); $model $dtype, S = $s0 .. $s1, -n $iters -w 1, 4 ranks = 2 namespaces x 2"
  } > "$out/env.txt"
  # measure NAME N1 N2 ULYSSES_PERF_ARGS...: one run into runs/NAME.{json,txt}
  measure() {
    local f="$out/runs/$1" n1="$2" n2="$3"; shift 3
    echo "netns.sh: $(basename "$f")"
    launch "$n1" "$n2" "$perf" --backend mpi --model "$model" --dtype "$dtype" -b "$s0" -e "$s1" -f 2 -n "$iters" -w 1 \
      -c 1 --bare 0 "$@" --json "$f.json" > "$f.txt" 2>&1 \
      || { echo "netns.sh: run failed ($f.txt):" >&2; tail -20 "$f.txt" >&2; return 1; }
    grep -v '^#' "$f.txt"
  }
  # intra-node only: 4 ranks in one namespace (shared memory), the calibration of the intra-node terms
  measure intra_flat 4 0 --ranks-per-node 4 --path messages
  for RATE in ${RATES:-none 1gbit 200mbit}; do
    throttle
    # inter-node only: 1 rank a namespace, the calibration of the link
    measure "${RATE}_calib" 1 1 --ranks-per-node 1 --path messages
    for v in flat alltoallv two-level rail; do
      case $v in
        flat) args=(--path messages) ;;
        alltoallv) args=(--path alltoallv) ;;
        two-level) args=(--lanes 1) ;;
        rail) args=(--lanes 0) ;;
      esac
      measure "${RATE}_$v" 2 2 --ranks-per-node 2 "${args[@]}"
    done
  done
  RATE=none throttle
  echo "# load at the end: $(uptime | sed "s/.*load average/load average/")" >> "$out/env.txt"
  check "$out"
}

# by_path: the --rows lines on stdin (model P= S= direction path backend measured model error)
# summarised per exchange path: n, median, p90 and max of |error|, the share within 15%.
by_path() {
  awk '/ P=/ { p = $5; if ($0 ~ /lanes 0/) p = "rail"; else if (p == "two_level") p = "two-level"
               e = $NF; sub(/%/, "", e); e += 0; if (e < 0) e = -e; n[p]++; v[p, n[p]] = e }
       END { printf "| path | n | median | p90 | max | within 15%% |\n|---|---|---|---|---|---|\n"
             split("messages alltoallv two-level rail", order, " ")
             for (k = 1; k <= 4; k++) { p = order[k]; m = n[p]; if (!m) continue
               for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[p, j] < v[p, i]) { t = v[p, i]; v[p, i] = v[p, j]; v[p, j] = t }
               w = 0; for (i = 1; i <= m; i++) if (v[p, i] <= 15) w++
               med = (m % 2 ? v[p, (m + 1) / 2] : (v[p, m / 2] + v[p, m / 2 + 1]) / 2)
               printf "| %s | %d | %.1f%% | %.1f%% | %.1f%% | %.0f%% |\n", p, m, med, v[p, int(0.9 * m + 0.999)], v[p, m], 100 * w / m } }'
}

# times_table RATE: the --rows lines on stdin as one table, the 4 paths side by side (ms; the
# model's prediction in parentheses).
times_table() {
  awk -v rate="$1" '/ P=/ { p = $5; if ($0 ~ /lanes 0/) p = "rail"; else if (p == "two_level") p = "two-level"
               k = $3 " " $4; if (!(k in seen)) { seen[k] = 1; keys[++nk] = k }
               t[k, p] = sprintf("%.1f (%.1f)", $(NF - 2) / 1000, $(NF - 1) / 1000) }
       END { printf "| %s | exchange | flat, messages (ms) | flat, MPI_Alltoallv | two-level, lanes 1 | rail-aligned, lanes 0 |\n|---|---|---|---|---|---|\n", rate
             for (i = 1; i <= nk; i++) { split(keys[i], f, " ")
               printf "| %s | %s | %s | %s | %s | %s |\n", f[1], f[2], t[keys[i], "messages"], t[keys[i], "alltoallv"], t[keys[i], "two-level"], t[keys[i], "rail"] } }'
}

# check [OUTDIR]: per rate, the model fitted to the calibration runs (intra_flat, RATE_calib) and
# its prediction checked on the 4 paths; then fitted to all of them and checked in sample.
check() {
  local out="${1:-$root/bench/results/netns}"
  local perf="${PERF:-$root/build-sim/bench/ulysses_perf}" nic="${RANKS_PER_NIC:-2}"
  echo "# measured times (ms, slowest rank, mean of the iterations; in parentheses the model fitted to the calibration runs: check.txt)" > "$out/times.md"
  {
    for RATE in ${RATES:-none 1gbit 200mbit}; do
      local paths=("$out"/runs/"${RATE}"_{flat,alltoallv,two-level,rail}.json) rows
      echo "## $RATE: predicted. The model fitted to the calibration runs only (4 ranks in one namespace; 1 rank in each:"
      echo "## intra_flat, ${RATE}_calib; params-$RATE.json), checked on the 4 paths of 2 x 2 ranks (not in the fit)"
      "$perf" --fit "$out/params-$RATE.json" --ranks-per-nic "$nic" "$out/runs/intra_flat.json" "$out/runs/${RATE}_calib.json" | sed 's/^/# /'
      rows="$("$perf" --check "$out/params-$RATE.json" --rows "${paths[@]}" || true)"
      echo "$rows"; echo; by_path <<<"$rows"; echo
      { times_table "$RATE" <<<"$rows"; echo; } >> "$out/times.md"
      echo "## $RATE: in sample. The model fitted to the calibration runs and the 4 paths (params-$RATE-all.json), checked on the 4 paths"
      "$perf" --fit "$out/params-$RATE-all.json" --ranks-per-nic "$nic" "$out/runs/intra_flat.json" "$out/runs/${RATE}_calib.json" "${paths[@]}" | sed 's/^/# /'
      rows="$("$perf" --check "$out/params-$RATE-all.json" --rows "${paths[@]}" || true)"
      echo "$rows" | grep -v ' P='; echo; by_path <<<"$rows"; echo
    done
  } | tee "$out/check.txt"
}

verb="${1:-}"; [ $# -gt 0 ] && shift
# bands [OUTDIR]: the band pipeline (ulysses_perf --op bands) across the throttled link, 1 rank in each
# namespace (2 ranks) and 2 in each (4 ranks), the handles' progress on a worker thread (MPI's TCP
# transport moves bytes only while a thread is in MPI) and posted in start() (split; the model told so:
# --posts-progress 0): OUTDIR/bands.txt.
# Knobs: BAND_RATE (1gbit), BAND_MODEL (Llama-3.1-8B), BAND_S (4096), BAND_ITERS (5), BANDS (1,2,4,8),
# RATIOS (0.25,1,4).
# throttled NAME RATE OUTDIR FN: FN (a function that runs ulysses_perf as "$perf") with the veth at
# RATE, its output after a header line into OUTDIR/NAME.txt (and to stdout); the veth unthrottled after.
throttled() {
  local name="$1" rate="$2" out="${3:-$root/bench/results/netns}" fn="$4" perf="${PERF:-$root/build/bench/ulysses_perf}"
  [ -x "$perf" ] || { echo "netns.sh: no $perf" >&2; return 1; }
  mkdir -p "$out"
  RATE="$rate" throttle
  { echo "# bench/netns/netns.sh $name, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores; the veth at $rate (tbf, latency ${TBF_LATENCY:-200ms})"; "$fn"; } | tee "$out/$name.txt"
  RATE=none throttle
}

bands_runs() {
  for layout in "1 1" "2 2"; do
    for pr in thread in_start; do
      set -- $layout
      launch "$1" "$2" "$perf" --op bands --backend mpi --model "${BAND_MODEL:-Llama-3.1-8B}" --dtype bf16 \
        -b "${BAND_S:-4096}" -e "${BAND_S:-4096}" -n "${BAND_ITERS:-5}" -w 1 --bands "${BANDS:-1,2,4,8}" \
        --attn-ratio "${RATIOS:-0.25,1,4}" --attn-kind sleep --progress "$pr" --mpi-window 0 \
        --posts-progress "$([ "$pr" = in_start ] && echo 0 || echo 1)" || return 1
    done
  done
}
bands() { throttled bands "${BAND_RATE:-1gbit}" "${1:-}" bands_runs; }

# layer [OUTDIR]: one layer's distributed_attention() forward (ulysses_perf --op layer) as U x R =
# 2 x 2: the Ulysses groups inside each namespace (shared memory), the ring across the throttled
# veth, around a stand-in attention (a sleep) at LAYER_TFLOPS (0.5), once per band count (--bands
# LAYER_BANDS, 1,2,4: bands x ring steps) with the exchanges and the ring on worker threads
# (--progress thread, MPI_THREAD_MULTIPLE) and posted (in_start): OUTDIR/layer.txt. Knobs:
# LAYER_RATE (1gbit), LAYER_MODEL (Llama-3.1-8B), LAYER_S (8192), LAYER_ITERS (5, after 1 warm-up).
layer_runs() {
  for pr in thread in_start; do
    launch 2 2 "$perf" --op layer --layer 2,2 --backend mpi --ranks-per-node 2 --model "${LAYER_MODEL:-Llama-3.1-8B}" \
      -b "${LAYER_S:-8192}" -e "${LAYER_S:-8192}" -n "${LAYER_ITERS:-5}" -w 1 -c 0 --attn-TFLOPS "${LAYER_TFLOPS:-0.5}" \
      --bands "${LAYER_BANDS:-1,2,4}" --progress "$pr" || return 1
  done
}
layer() { throttled layer "${LAYER_RATE:-1gbit}" "${1:-}" layer_runs; }

# wire [OUTDIR]: q and k on an fp8 wire (ulysses_perf --wire) against every tensor on its element wire
# (the bf16 baseline), plain MpiComm messages (--mpi-window 0) across the throttled link, 1 rank in
# each namespace (P=2) and 2 in each (P=4), -c 1 (the wire's outputs against the reference
# quantizer, bit for bit): OUTDIR/wire.txt. Knobs: WIRE (fp8_e4m3), WIRE_RATES (1gbit), WIRE_MODEL
# (Llama-3.1-8B), WIRE_S0, WIRE_S1 (2048, 8192), WIRE_ITERS (3, after 1 warm-up), WIRE_TENSORS ("qk":
# q and k on the wire, v on its element wire; "qk qkv" runs both, qkv puts v on the wire too).
wire() {
  local out="${1:-$root/bench/results/netns}" perf="${PERF:-$root/build/bench/ulysses_perf}"
  [ -x "$perf" ] || { echo "netns.sh: no $perf" >&2; return 1; }
  mkdir -p "$out"
  {
    echo "# bench/netns/netns.sh wire, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load: $(uptime | sed 's/.*load average/load average/')"
    for RATE in ${WIRE_RATES:-1gbit}; do
      throttle
      for tensors in ${WIRE_TENSORS:-qk}; do
        for layout in "1 1" "2 2"; do
          set -- $layout
          echo "## the veth at $RATE (tbf), wire tensors $tensors, $1 + $2 ranks (P=$(($1 + $2)))"
          launch "$1" "$2" "$perf" --backend mpi --mpi-window 0 --wire "${WIRE:-fp8_e4m3}" --wire-tensors "$tensors" \
            --model "${WIRE_MODEL:-Llama-3.1-8B}" --dtype bf16 -b "${WIRE_S0:-2048}" -e "${WIRE_S1:-8192}" -f 2 -n "${WIRE_ITERS:-3}" -w 1 -c 1 ||
            return 1
        done
      done
    done
  } | tee "$out/wire.txt"
  RATE=none throttle
}

case "$verb" in
  agent) agent "$@" ;;
  wire)
    allowed || { echo "netns.sh: skipped"; exit 0; }
    trap 'down || true' EXIT INT TERM
    up
    wire "$@"
    ;;
  bands)
    allowed || { echo "netns.sh: skipped"; exit 0; }
    trap 'down || true' EXIT INT TERM
    up
    bands "$@"
    ;;
  layer)
    allowed || { echo "netns.sh: skipped"; exit 0; }
    trap 'down || true' EXIT INT TERM
    up
    layer "$@"
    ;;
  up) allowed || { echo "netns.sh: skipped"; exit 0; }; up ;;
  down) down ;;
  run) run "$@" ;;
  check) check "$@" ;;
  all)
    allowed || { echo "netns.sh: skipped"; exit 0; }
    trap 'down || true' EXIT INT TERM
    up
    run "$@"
    ;;
  *) sed -n '3,35p' "$self" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
