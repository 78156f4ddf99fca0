// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief An α-β cost model of one exchange of a plan (flat or two-level): its parameters
///        (CostModel, LinkCost), the traffic it prices (ExchangeTraffic, exchange_traffic()) and
///        its prediction (predict_seconds()). Its calibration from measurements is tune/fit.hpp,
///        advice on the Ulysses degree of a world of ranks tune/advise.hpp.
///
/// Hockney's α-β model, one (α, β, λ) per link class, plus the executor's copies (γ, δ) and a
/// cached regime for working sets that fit the last-level cache: a prediction, to calibrate on
/// the machine at hand. The formula and its sources: docs/cost-model.md; docs/headers.md,
/// "tune/cost.hpp".
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../plan/plan.hpp"
#include "../transport/dispatch.hpp"
#include "../topology/nodes.hpp"
#include "../topology/route.hpp"

ULYSSES_NAMESPACE_BEGIN

/// The link classes of the model.
enum class LinkClass : int {
  intra = 0,  ///< between ranks of one node (NVLink / NVSwitch, PCIe, shared memory)
  inter = 1,  ///< between nodes (InfiniBand, RoCE, Ethernet)
};

/// α, β and λ of one link class.
struct LinkCost {
  double alpha_s = 0;           ///< α: seconds per message (per-message overhead, paid message after message)
  double seconds_per_byte = 0;  ///< β: inverse bandwidth of one rank's link, seconds per byte
  double latency_s = 0;         ///< λ: seconds per sequential step of messages (the link's latency, overlapped within a step)
  /// β_f: inverse bandwidth of ONE message (flow), seconds per byte; 0: no per-flow cap (one message
  /// can fill the link). k concurrent messages move at min(1 / β, k / β_f) bytes a second: a
  /// message of p bytes takes at least p · β_f however idle the link (predict_flow_seconds()). What
  /// makes cutting a ring block into pieces pay (best_ring_messages(), tune/ring_cost.hpp); not
  /// fitted by fit_cost_model() (an exchange does not see it) but by fit_flow_cost() from steps of
  /// 1 and of several messages, or set by hand (ulysses_perf --inter-flow-GBps).
  double flow_seconds_per_byte = 0;
  /// From microseconds per message, GB/s (1e9 bytes per second; 0 GB/s means no bandwidth term)
  /// and microseconds of latency per step.
  /// @param alpha_us   α in µs per message
  /// @param GBps       1 / β in GB/s (0: no byte term)
  /// @param latency_us λ in µs per step
  /// @param flow_GBps  1 / β_f in GB/s, one message's most (0: no per-flow cap)
  static LinkCost of(double alpha_us, double GBps, double latency_us = 0, double flow_GBps = 0) {
    return {alpha_us * 1e-6, GBps > 0 ? 1e-9 / GBps : 0, latency_us * 1e-6, flow_GBps > 0 ? 1e-9 / flow_GBps : 0};
  }
  double GBps() const { return seconds_per_byte > 0 ? 1e-9 / seconds_per_byte : 0; }  ///< 1 / β in GB/s
  double flow_GBps() const { return flow_seconds_per_byte > 0 ? 1e-9 / flow_seconds_per_byte : 0; }  ///< 1 / β_f in GB/s (0: no cap)
};

/// The parameters of the model (see docs/headers.md, "tune/cost.hpp").
struct CostModel {
  LinkCost intra;                      ///< intra-node link of one rank (working set beyond the cache)
  LinkCost inter;                      ///< inter-node link of one rank
  double copy_seconds_per_byte = 0;    ///< γ: seconds per byte the executor writes (pack, unpack, sums, direct copies)
  double cache_bytes = 0;              ///< C: a rank's share of the last-level cache, bytes (0: no cache regime)
  double intra_cached_seconds_per_byte = 0;  ///< β_intra' of cache-resident bytes
  double copy_cached_seconds_per_byte = 0;   ///< γ' of cache-resident bytes
  double copy_seconds_per_row = 0;           ///< δ: seconds per contiguous row the executor copies (short rows cost more a byte)
  double round_seconds = 0;                  ///< ε: fixed cost of one communication round (its synchronisation)
  /// s: how many ranks of a node share one inter-node NIC (1: a NIC per GPU, as on a rail-optimised
  /// fabric; the node's ranks: one NIC a node). Not fitted: a fact of the machine. When s > 1 the
  /// concurrent inter-node flows of a node's ranks divide the NIC's bandwidth: a round's inter-node
  /// bytes are those of its busiest NIC, max(busiest rank's, busiest node's × min(s, g) / g) for
  /// nodes of g ranks (the node's bytes spread evenly over its g / s NICs; exact for s = 1 and s = g)
  double ranks_per_nic = 1;
  /// Link classes of an 8-GPU H100/H200 node on a rail-optimised InfiniBand NDR fabric, as
  /// placeholders until calibrated: NVLink 4 moves 450 GB/s per direction per GPU (NVIDIA H100
  /// datasheet), of which an all-to-all reaches about 350 GB/s (nccl-tests alltoall busbw);
  /// one 400 Gb/s NDR NIC per GPU, about 45 GB/s achieved; per-message costs of a few µs
  /// (NCCL's grouped send/recv); HBM3 copies at about 1.5 TB/s of written bytes.
  static CostModel nvlink_infiniband() { return {LinkCost::of(3, 350), LinkCost::of(6, 45), 1.0 / 1.5e12}; }
  /// The parameters as text: "intra 3 us + 1/350 GB/s, inter ..., copy 1500 GB/s".
  std::string str() const {
    auto f = [](double v) {
      char b[32];
      std::snprintf(b, sizeof b, "%.4g", v);
      return std::string(b);
    };
    auto gbps = [&f](double spb) { return spb > 0 ? f(1e-9 / spb) + " GB/s" : std::string("no byte term"); };
    auto lat = [&f, &gbps](const LinkCost& l) {
      return (l.latency_s > 0 ? ", " + f(l.latency_s * 1e6) + " us/step" : std::string()) +
             (l.flow_seconds_per_byte > 0 ? ", one message <= " + gbps(l.flow_seconds_per_byte) : std::string());
    };
    std::string s = "intra " + f(intra.alpha_s * 1e6) + " us/msg, " + gbps(intra.seconds_per_byte) + lat(intra) + "; inter " +
                    f(inter.alpha_s * 1e6) + " us/msg, " + gbps(inter.seconds_per_byte) + lat(inter) + "; copy " + gbps(copy_seconds_per_byte);
    if (cache_bytes > 0)
      s += "; within " + f(cache_bytes / 1048576.0) + " MiB of cache: intra " + gbps(intra_cached_seconds_per_byte) + ", copy " +
           gbps(copy_cached_seconds_per_byte);
    if (copy_seconds_per_row > 0) s += "; " + f(copy_seconds_per_row * 1e9) + " ns a copied row";
    if (round_seconds > 0) s += "; " + f(round_seconds * 1e6) + " us a round";
    if (ranks_per_nic > 1) s += "; " + f(ranks_per_nic) + " ranks a NIC";
    return s;
  }
};

/// The traffic of one exchange of `plan` in direction `dir` on `path` (see ExchangeTraffic):
/// alltoallv: one message per peer with bytes; messages: one per (peer, tensor, b, sequence chunk);
/// two_level: the three rounds of the plan's route (a plan without one is laid out with its
/// PlanOptions::nodes for the count); direct: one synchronisation per peer and every output byte
/// copied once. A peer on another node (PlanOptions::nodes) is an inter-node link. Pure: builds
/// the global picture from the plan's shared inputs (O(P^2) per stage).
/// @throws Error(path_unsupported) Path::automatic (choose one: choose_path()).
inline ExchangeTraffic exchange_traffic(const Plan& plan, Direction dir, Path path) {
  if (path == Path::automatic) detail::fail(Errc::path_unsupported, "exchange_traffic: give the path the exchange takes (choose_path())");
  ExchangeTraffic t;
  for (int n = 0; n < plan.nodes().num_nodes(); ++n)
    t.node_ranks = std::max(t.node_ranks, static_cast<double>(plan.nodes().num_nodes() > 1 ? plan.nodes().members(n).size() : 1));
  for (int i = 0; i < plan.num_tensors(); ++i)
    t.working_set_bytes += static_cast<double>(plan.input_bytes(dir, i) + plan.output_bytes(dir, i));
  if (path != Path::direct) t.working_set_bytes += static_cast<double>(plan.workspace_bytes());
  detail::TrafficSpans spans(plan.degree());
  for (int k = 0; k < plan.num_stages(); ++k) {
    const std::vector<std::size_t> c = plan.chunk_matrix(dir, k);
    visit_transport(path, [&](auto tr) { decltype(tr)::traffic(plan, dir, k, c, t, spans); });
  }
  t.workspace_bytes = visit_transport(path, [&](auto tr) { return decltype(tr)::traffic_workspace(spans); });
  return t;
}

namespace detail {
/// The inter-node bytes one NIC carries in a round whose busiest rank moves `rank` bytes across
/// nodes and busiest node `node` bytes, when `links.ranks_per_nic` ranks of a node of `node_ranks`
/// share a NIC (CostModel::ranks_per_nic): max(rank, node × min(s, g) / g); `rank` when s <= 1.
inline double nic_bytes(double rank, double node, double node_ranks, const CostModel& links) {
  if (!(links.ranks_per_nic > 1) || !(node_ranks > 1)) return rank;
  return std::max(rank, node * std::min(links.ranks_per_nic, node_ranks) / node_ranks);
}
/// The model's features of `t` for a cache of `cache_bytes`, in the order of cost_params(): the
/// inter-node bytes those of each round's busiest NIC (nic_bytes()); in every overlapped round
/// (ExchangeTraffic::overlapped) the bytes of the class that `links` moves faster are left out
/// (its transfer hides under the other's).
inline constexpr std::size_t kCostParams = 11;
inline std::array<double, kCostParams> cost_features(const ExchangeTraffic& t, double cache_bytes, const CostModel& links) {
  const double f = cache_bytes > 0 && t.working_set_bytes > 0 ? std::min(1.0, cache_bytes / t.working_set_bytes) : 0;
  std::array<double, 2> bytes = t.bytes;
  for (const auto& r : t.inter_rounds) bytes[1] += nic_bytes(r[0], r[1], t.node_ranks, links) - r[0];  // what the NIC's sharers add
  const double intra_spb = (1 - f) * links.intra.seconds_per_byte + f * links.intra_cached_seconds_per_byte;
  for (const auto& b : t.overlapped) {
    const std::array<double, 2> round{b[0], nic_bytes(b[1], b[2], t.node_ranks, links)};
    const std::size_t hidden = round[0] * intra_spb >= round[1] * links.inter.seconds_per_byte ? 1 : 0;
    bytes[hidden] = std::max(0.0, bytes[hidden] - round[hidden]);
  }
  return {t.messages[0], bytes[0] * (1 - f), bytes[0] * f, t.messages[1], bytes[1], t.copy_bytes * (1 - f), t.copy_bytes * f,
          t.copy_rows, static_cast<double>(t.rounds), t.latency_steps[0], t.latency_steps[1]};
}
/// The model's parameters, in the order of cost_features().
inline std::array<double*, kCostParams> cost_params(CostModel& m) {
  return {&m.intra.alpha_s, &m.intra.seconds_per_byte, &m.intra_cached_seconds_per_byte, &m.inter.alpha_s, &m.inter.seconds_per_byte,
          &m.copy_seconds_per_byte, &m.copy_cached_seconds_per_byte, &m.copy_seconds_per_row, &m.round_seconds, &m.intra.latency_s,
          &m.inter.latency_s};
}
}  // namespace detail

/// The model's time of an exchange with this traffic, in seconds (see docs/headers.md, "tune/cost.hpp").
/// @param t the exchange's traffic (exchange_traffic())
/// @param m the model's parameters
inline double predict_seconds(const ExchangeTraffic& t, const CostModel& m) {
  CostModel c = m;
  const auto x = detail::cost_features(t, m.cache_bytes, m);
  const auto p = detail::cost_params(c);
  double s = 0;
  for (std::size_t i = 0; i < x.size(); ++i) s += x[i] * *p[i];
  return s;
}

namespace detail {
/// The seconds predict_seconds() gives `t`'s link bytes, per link class [intra, inter] (β terms,
/// the cache regime and the overlapped rounds included).
inline std::array<double, 2> link_byte_seconds(const ExchangeTraffic& t, const CostModel& m) {
  const auto x = cost_features(t, m.cache_bytes, m);
  return {x[1] * m.intra.seconds_per_byte + x[2] * m.intra_cached_seconds_per_byte, x[4] * m.inter.seconds_per_byte};
}
}  // namespace detail

/// The model's time of an exchange whose largest message on each link class is
/// `largest_message[c]` bytes, under the per-flow cap (LinkCost::flow_seconds_per_byte, β_f): per
/// class, the link's byte time (predict_seconds()'s β terms) or the largest message at one flow's
/// rate, whichever is longer: predict_seconds(t, m) + Σ_c max(0, largest_c · β_f,c − bytes time_c).
/// With β_f = 0 (the default) exactly predict_seconds(t, m). For a step whose k messages are in
/// flight at once (a ring step cut into pieces: tune/ring_cost.hpp, ring_step_seconds()), k even
/// pieces of b bytes in all take k·α + λ + b · max(β, β_f / k).
/// @param t               the traffic (its bytes and messages)
/// @param largest_message bytes of the largest message per link class [intra, inter], >= 0
/// @param m               the model's parameters
inline double predict_flow_seconds(const ExchangeTraffic& t, const std::array<double, 2>& largest_message, const CostModel& m) {
  const std::array<double, 2> link = detail::link_byte_seconds(t, m);
  const std::array<double, 2> flow{largest_message[0] * m.intra.flow_seconds_per_byte, largest_message[1] * m.inter.flow_seconds_per_byte};
  return predict_seconds(t, m) + std::max(0.0, flow[0] - link[0]) + std::max(0.0, flow[1] - link[1]);
}

/// The model's time of one exchange of `plan` in direction `dir` on `path`, in seconds
/// (exchange_traffic() then predict_seconds()). @throws as exchange_traffic().
inline double predict_seconds(const Plan& plan, Direction dir, Path path, const CostModel& m) {
  return predict_seconds(exchange_traffic(plan, dir, path), m);
}

ULYSSES_NAMESPACE_END
