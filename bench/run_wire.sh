#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The fp8 wire (TensorSpec::with_wire, docs/transforms.md "Wires"): seq->head of q, k, v with q and
# k on an fp8 wire (v on its element wire: mixed types, "qk") and with q, k and v on it ("qkv": the
# fp8 wire alone, 0.50x the bytes plus the scales) against the same call with every tensor on its
# element wire (the bf16 baseline), ulysses_perf --wire [--wire-tensors qkv], in one alternating
# run each (sections 2-4 run both; section 1 runs qk):
#
#   bench/run_wire.sh [OUT.md]        (default bench/results/wire.md)
#
# 1. in-process (LocalGroup, 4 ranks on threads): --wire fp8_e4m3, and --wire bfloat16 of fp32
#    tensors (a cast wire: half the bytes), one size;
# 2. the MPI processes of this node (mpiexec -n 4): over MpiWindowComm (the peer copy), then plain
#    MpiComm messages (--mpi-window 0);
# 3. throttled links: bench/netns/netns.sh wire (two network namespaces, tbf on the veth; P=2 and
#    P=4, MpiComm; skipped where namespaces cannot be made);
# 4. SMPI (SimGrid), 64 ranks on bench/smpi/platforms/nodes-8.xml (8 nodes x 8, NVLink 450 GB/s
#    inside, InfiniBand 50 GB/s between): Llama-3.1-70B P=64 (one group across the 8 nodes) and
#    Llama-3.1-8B P=8 x 8 groups (--groups 8: a group a node), MpiComm (--mpi-window 0), -c 0 with
#    memory folding; and one -c 1 run (P=64, small S) for the bits. Simulated time: host work
#    takes none (smpi/simulate-computation:no), so the quantization is free there.
# Every in-process, MPI and netns table checked bit for bit (-c 1: the fp8 call against the
# reference quantizer, the baseline against the oracle). Knobs: BUILD_DIR (build), ITERS (5),
# S0, S1 (1024, 4096: sections 1-2), SMPI_BUILD (build-smpi: ulysses_perf built there with smpicxx
# when missing), SMPI_S (32768: P=64), SMPI_GS (4096: P=8 x 8; a rank holds 8x the tokens of P=64, and the
# row path's host work of 64 ranks on one core is the wall time), SMPI_ITERS (2), SMPI_TIMEOUT (600 s a run), SMPI (1; 0 skips section 4: simulated time does not
# count host work, so a change to the host's arithmetic leaves it as it was), NETNS (1; 0 skips section 3), WIRE_RATES
# (netns.sh: "1gbit 200mbit"), WIRE_S0, WIRE_S1 (2048, 8192), WIRE_TENSORS ("qk qkv").
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
out_md="${1:-$root/bench/results/wire.md}"
build="${BUILD_DIR:-$root/build}"
iters="${ITERS:-5}"
smpi_build="${SMPI_BUILD:-$root/build-smpi}"
ub_configure
ub_build ulysses_perf
ub_mpi_env
perf="$build/bench/ulysses_perf"
if [ "${SMPI:-1}" != 0 ] && [ ! -x "$smpi_build/ulysses_perf" ] && command -v smpicxx >/dev/null; then
  mkdir -p "$smpi_build"  # bench/smpi/smpi.sh build's flags, ulysses_perf alone
  smpicxx -std=c++17 -O2 -fno-gnu-unique -I"$root/include" -I"$root/tests/support" -I"$root/examples/common" \
    -DULYSSES_PERF_MPI=1 -DULYSSES_PERF_JSON=1 "$root/bench/ulysses_perf.cpp" "$root/bench/smpi/fold.cpp" -o "$smpi_build/ulysses_perf"
fi
wire=(--wire fp8_e4m3 --model Llama-3.1-8B --dtype bf16 -b "${S0:-1024}" -e "${S1:-4096}" -f 2 -n "$iters" -w 2 -c 1)
cast=(--wire bfloat16 --model Llama-3.1-8B --dtype fp32 -b 2048 -e 2048 -n "$iters" -w 2 -c 1)
tensors="${WIRE_TENSORS:-qk qkv}"
smpi_s="${SMPI_S:-32768}" smpi_gs="${SMPI_GS:-4096}" smpi_iters="${SMPI_ITERS:-2}"
mkdir -p "$(dirname "$out_md")"
tmp="$(mktemp)" nsdir="$(mktemp -d)"
section() {  # section TITLE COMMAND...: a heading, the command, its output in a code block
  local title="$1"; shift
  echo "## $title"
  echo
  echo "\`$*\`:" | sed "s#$root/##g"
  echo
  echo '```'
  local t0 rc=0
  t0=$(date +%s)
  "$@" 2>&1 || rc=$?
  echo '```'
  echo
  echo "(wall $(($(date +%s) - t0)) s$([ $rc = 0 ] || echo ", exit $rc: FAILED"))"
  echo
}
{
  echo "# bench/run_wire.sh, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "Machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), $(uname -sr), git $(git -C "$root" rev-parse --short HEAD)."
  echo "Load before: $(uptime)"
  echo
  section "fp8 wire, in-process (LocalGroup, 4 ranks on threads)" "$perf" --backend local --ranks 4 "${wire[@]}"
  section "bfloat16 cast wire of fp32 tensors, in-process (4 ranks)" "$perf" --backend local --ranks 4 "${cast[@]}"
  for t in $tensors; do
    section "fp8 wire, the MPI processes of this node (mpiexec -n 4, MpiWindowComm), wire tensors $t" \
      mpiexec -n 4 "${mpi_flags[@]}" "$perf" --backend mpi "${wire[@]}" --wire-tensors "$t"
    section "fp8 wire, the MPI processes of this node (mpiexec -n 4, MpiComm messages), wire tensors $t" \
      mpiexec -n 4 "${mpi_flags[@]}" "$perf" --backend mpi --mpi-window 0 "${wire[@]}" --wire-tensors "$t"
  done
  if [ "${NETNS:-1}" != 0 ]; then
    section "fp8 wire across throttled links (bench/netns/netns.sh wire: MpiComm, P=2 = 1 + 1 ranks, P=4 = 2 + 2)" \
      env PERF="$perf" WIRE_RATES="${WIRE_RATES:-1gbit 200mbit}" WIRE_S0="${WIRE_S0:-2048}" WIRE_S1="${WIRE_S1:-8192}" \
      WIRE_TENSORS="$tensors" "$here/netns/netns.sh" wire "$nsdir"
  fi
  if [ "${SMPI:-1}" != 0 ] && [ -x "$smpi_build/ulysses_perf" ]; then
    smpi=(env BUILD="$smpi_build" TIMEOUT="${SMPI_TIMEOUT:-600}" "$here/smpi/smpi.sh" perf 8)
    section "fp8 wire under SMPI, 64 ranks (8 nodes x 8), Llama-3.1-70B, P=64, checked (S=1024)" \
      "${smpi[@]}" --model Llama-3.1-70B --dtype bf16 --wire fp8_e4m3 --mpi-window 0 -b 1024 -e 1024 -n 1 -w 0 -c 1
    for t in $tensors; do
      section "fp8 wire under SMPI, 64 ranks (8 nodes x 8), Llama-3.1-70B, P=64 (one group across the nodes), wire tensors $t" \
        env ULYSSES_SMPI_FOLD_BYTES=1048576 "${smpi[@]}" --model Llama-3.1-70B --dtype bf16 --wire fp8_e4m3 --wire-tensors "$t" \
        --mpi-window 0 -b "$smpi_s" -e "$smpi_s" -n "$smpi_iters" -w 1 -c 0
      section "fp8 wire under SMPI, 64 ranks (8 nodes x 8), Llama-3.1-8B, P=8 x 8 groups (a group a node; every group's table), wire tensors $t" \
        env ULYSSES_SMPI_FOLD_BYTES=1048576 "${smpi[@]}" --model Llama-3.1-8B --dtype bf16 --wire fp8_e4m3 --wire-tensors "$t" \
        --mpi-window 0 --groups 8 -b "$smpi_gs" -e "$smpi_gs" -n "$smpi_iters" -w 1 -c 0
    done
  fi
  echo "Load after: $(uptime)"
} > "$tmp"
rm -rf "$nsdir"
# The summary table at the top: every row of the tables above (the groups' run: group 0's, the first
# table), with the targets.
{
  sed -n '1,4p' "$tmp"
  echo
  echo "Wire tensors: qk = q and k on the fp8 wire, v on its element wire (mixed types); qkv = q, k and v on it."
  echo
  echo "| run | wire tensors | S | element (us) | wire (us) | wire/element | target | wire bytes q,k | wire bytes q,k,v | #wrong | #wrong (wire) |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  awk '/^## / {wt = /wire tensors qkv/ ? "qkv" : "qk"}
       /^## fp8 wire, in-process/ {run="in-process P=4, fp8_e4m3"; tgt="-"}
       /^## bfloat16 cast wire/ {run="in-process P=4, bfloat16 wire of fp32"; tgt="-"}
       /^## fp8 wire, the MPI processes .*MpiWindowComm/ {run="MPI window P=4"; tgt="<= 0.80"}
       /^## fp8 wire, the MPI processes .*MpiComm messages/ {run="MpiComm P=4 (one node)"; tgt="-"}
       /^## the veth at/ {p = $NF; gsub(/[()P=]/, "", p); run = "netns " $5 ", MpiComm P=" p; tgt = "<= 0.60"}
       /^## fp8 wire under SMPI.*checked/ {run="SMPI 64 ranks, 70B P=64 (checked)"; tgt="-"}
       /^## fp8 wire under SMPI.*P=64 \(one group/ {run="SMPI 64 ranks, 70B P=64"; tgt="<= 0.60"}
       /^## fp8 wire under SMPI.*P=8 x 8/ {run="SMPI 64 ranks, 8B P=8 x 8 groups"; tgt="<= 0.60"}
       run != "" && /^ +[0-9]+ +[0-9]+ / && !seen[run, wt, $1]++ {
         printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", run, wt, $1, $4, $5, $6, tgt, $8, $9, $10, $11 }' "$tmp"
  echo
  failed=$(grep -c 'FAILED)$' "$tmp" || true)
  [ "$failed" = 0 ] || { echo "**$failed section(s) FAILED (their rows are missing above): see \"FAILED\" below.**"; echo; }
  sed -n '5,$p' "$tmp"
} > "$out_md"
failed=$(grep -c 'FAILED)$' "$tmp" || true)
rm -f "$tmp"
echo "run_wire.sh: $out_md"
[ "$failed" = 0 ] || { echo "run_wire.sh: $failed section(s) FAILED" >&2; exit 1; }
