#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Writes a SimGrid platform (XML, DTD 4.1) of NODES GPU nodes to stdout, and with -H FILE the
# matching hostfile (one host a line, node first: rank r on GPU r % G of node r / G):
#
#   bench/smpi/platform.sh NODES [-H HOSTFILE] > platform.xml
#
# The cluster (every figure a knob, in the environment):
#   - nodes of GPUS_PER_NODE (8) GPUs; each GPU has its own NVLink port (NVLINK_GBPS = 450 GB/s
#     each way, full duplex) to the node's NVSwitch: GPU -> GPU inside a node crosses the sender's
#     port, the switch and the receiver's port, NVLINK_US = 1 us in all;
#   - one NIC per GPU (IB_GBPS = 50 GB/s each way, full duplex), rail-aligned: NIC i of every node
#     of a scalable unit of NODES_PER_LEAF (32) nodes plugs into that unit's leaf switch of rail i;
#     GPU -> GPU between nodes takes IB_US = 5 us in all, on any rail pair;
#   - a fat tree above the leaves: every leaf has an uplink to the core of the leaf's total NIC
#     bandwidth divided by IB_TAPER (1: non-blocking; 2: a 2:1 tapered tree), and cross-rail and
#     cross-unit traffic goes leaf -> core -> leaf.
# Routing: one DijkstraCache zone whose edges are the cables. Dijkstra counts links, and the
# graph is weighted so that each GPU pair's shortest path is its real one (3 links inside a node,
# 2 on one leaf, 4 through the core; a detour through another GPU costs at least 5).
set -euo pipefail
usage() { echo "usage: $0 NODES [-H HOSTFILE]   (env: GPUS_PER_NODE NVLINK_GBPS NVLINK_US IB_GBPS IB_US NODES_PER_LEAF IB_TAPER)" >&2; exit 2; }
[ $# -ge 1 ] || usage
N=$1; shift
hostfile=""
while [ $# -gt 0 ]; do
  case $1 in
    -H) hostfile=$2; shift 2 ;;
    *) usage ;;
  esac
done
[[ "$N" =~ ^[1-9][0-9]*$ ]] || usage
G=${GPUS_PER_NODE:-8}; NVBW=${NVLINK_GBPS:-450}; NVUS=${NVLINK_US:-1}; IBBW=${IB_GBPS:-50}; IBUS=${IB_US:-5}; U=${NODES_PER_LEAF:-32}; TAPER=${IB_TAPER:-1}
half() { awk -v x="$1" 'BEGIN { printf "%.6g", x / 2 }'; }
nvl=$(half "$NVUS"); nic=$(half "$IBUS")
units=$(( (N + U - 1) / U ))
{
cat <<HEAD
<?xml version='1.0'?>
<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">
<!-- bench/smpi/platform.sh $N: $N nodes x $G GPUs ($((N * G)) ranks); NVLink ${NVBW} GB/s, ${NVUS} us a hop
     inside a node; one NIC a GPU, ${IBBW} GB/s, ${IBUS} us between nodes, rail-aligned leaves of $U nodes,
     fat tree above, uplinks tapered ${TAPER}:1. Generated: edit the script, not this file. -->
<platform version="4.1">
<zone id="cluster" routing="DijkstraCache">
HEAD
for ((n = 0; n < N; ++n)); do
  for ((g = 0; g < G; ++g)); do echo "  <host id=\"n${n}g${g}\" speed=\"1Gf\"/>"; done
done
for ((n = 0; n < N; ++n)); do echo "  <router id=\"s${n}\"/>"; done
for ((u = 0; u < units; ++u)); do
  for ((g = 0; g < G; ++g)); do echo "  <router id=\"u${u}r${g}\"/>"; done
done
echo "  <router id=\"core\"/>"
for ((n = 0; n < N; ++n)); do
  echo "  <link id=\"sw${n}\" bandwidth=\"$((NVBW * G))GBps\" latency=\"0us\" sharing_policy=\"FATPIPE\"/>"
  for ((g = 0; g < G; ++g)); do
    echo "  <link id=\"nv${n}g${g}\" bandwidth=\"${NVBW}GBps\" latency=\"${nvl}us\" sharing_policy=\"SPLITDUPLEX\"/>"
    echo "  <link id=\"ib${n}g${g}\" bandwidth=\"${IBBW}GBps\" latency=\"${nic}us\" sharing_policy=\"SPLITDUPLEX\"/>"
  done
done
for ((u = 0; u < units; ++u)); do
  in_unit=$(( N - u * U < U ? N - u * U : U ))
  for ((g = 0; g < G; ++g)); do
    echo "  <link id=\"up${u}r${g}\" bandwidth=\"$(awk -v b="$IBBW" -v n="$in_unit" -v t="$TAPER" 'BEGIN { printf "%.6g", b * n / t }')GBps\" latency=\"0us\" sharing_policy=\"SPLITDUPLEX\"/>"
  done
done
for ((n = 0; n < N; ++n)); do
  u=$((n / U))
  for ((g = 0; g < G; ++g)); do
    h="n${n}g${g}"
    echo "  <route src=\"$h\" dst=\"s${n}\" symmetrical=\"NO\"><link_ctn id=\"nv${n}g${g}\" direction=\"UP\"/></route>"
    echo "  <route src=\"s${n}\" dst=\"$h\" symmetrical=\"NO\"><link_ctn id=\"sw${n}\"/><link_ctn id=\"nv${n}g${g}\" direction=\"DOWN\"/></route>"
    echo "  <route src=\"$h\" dst=\"u${u}r${g}\" symmetrical=\"NO\"><link_ctn id=\"ib${n}g${g}\" direction=\"UP\"/></route>"
    echo "  <route src=\"u${u}r${g}\" dst=\"$h\" symmetrical=\"NO\"><link_ctn id=\"ib${n}g${g}\" direction=\"DOWN\"/></route>"
  done
done
for ((u = 0; u < units; ++u)); do
  for ((g = 0; g < G; ++g)); do
    echo "  <route src=\"u${u}r${g}\" dst=\"core\" symmetrical=\"NO\"><link_ctn id=\"up${u}r${g}\" direction=\"UP\"/></route>"
    echo "  <route src=\"core\" dst=\"u${u}r${g}\" symmetrical=\"NO\"><link_ctn id=\"up${u}r${g}\" direction=\"DOWN\"/></route>"
  done
done
echo "</zone>"
echo "</platform>"
}
if [ -n "$hostfile" ]; then
  : > "$hostfile"
  for ((n = 0; n < N; ++n)); do for ((g = 0; g < G; ++g)); do echo "n${n}g${g}" >> "$hostfile"; done; done
fi
