// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Path::two_level: pack, three rounds of messages along PlanOptions::nodes (intra-node
///        gather into each node's forwarders, one message per ordered node pair and lane, the
///        intra-node delivery; topology/route.hpp), unpack. Open MPI han's and NCCL PXN's idea.
///        Needs, lists and copies: TwoLevelTransport; docs/multinode.md, "The two-level exchange".
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "alltoallv.hpp"
#include "common.hpp"
#include "messages.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Needs: exchange_messages(), the executor's memory the communicator's, a plan with
/// Plan::two_level(). Lists: pack, unpack, hop_send, hop_recv. Copies per element: 2 as
/// alltoallv; transport: every byte received in the three rounds, forwarded chunks included
/// (1-3 links a chunk). Not the decode exchange's (its wire is flat).
/// The two-level transport (see the file comment). Its pack and unpack are the all-to-all-v's
/// (inherited); what it needs of the types is the message path's.
struct TwoLevelTransport : AlltoallvTransport {
  static constexpr Path path = Path::two_level;  ///< the Path it serves
  /// exchange_messages() and the executor's memory the communicator's (as MessagesTransport).
  template <class Comm, class Exec>
  static constexpr bool supported = MessagesTransport::supported<Comm, Exec>;
  /// Never serves the decode exchange: its wire is flat (a decode plan has no node layout).
  template <class Comm, class Exec>
  static constexpr bool serves_decode = false;
  /// The three rounds of stage k, one exchange_messages() each; every rank calls every round.
  /// @pre the cross-rank check is done; plan.two_level(); comm_traits<Comm>::exchange_messages.
  template <class Comm>
  static void exchange(const Plan& plan, Direction d, Comm& comm, const BufferTable& t, int k) {
    const StageLists& s = plan.stage_lists(d, k);
    for (std::size_t round = 0; round < 3; ++round) detail::post_messages(comm, t, s.hop_send[round], s.hop_recv[round]);
  }
  /// Bytes this rank receives in the three rounds of a stage, forwarded chunks included.
  static double hop_bytes(const StageLists& s) {
    double n = 0;
    for (const auto& round : s.hop_recv)
      for (const Hop& h : round) n += static_cast<double>(h.bytes);
    return n;
  }
  /// Copies per element of direction d (Plan::copies()): the transport counts every hop received.
  static CopyCount copies(const Plan& plan, Direction d) { return detail::count_copies(plan, d, &WireStage::pack, &WireStage::unpack, hop_bytes); }
  /// Traffic of stage k for the cost model: the three rounds of the route the plan's node layout
  /// gives (laid out here from `chunks`, so a flat plan is counted as if it were two-level), each
  /// round's busiest rank; every rank's regions in `spans`.
  static void traffic(const Plan& plan, Direction d, int k, const std::vector<std::size_t>& chunks, ExchangeTraffic& t,
                      detail::TrafficSpans& spans) {
    const StageLists& s = plan.stage_lists(d, k);
    detail::add_copies(t, s.pack, s.unpack);
    const int P = plan.degree();
    const NodeLayout& nodes = plan.nodes();
    const std::vector<std::size_t> zero(detail::at(P), 0);
    const detail::TwoLevelRoute route(nodes, chunks, zero, zero, plan.options().lanes);
    for (int x = 0; x < P; ++x) {
      const auto sp = route.spans(x);
      spans.send[detail::at(x)] += sp.first;
      spans.recv[detail::at(x)] += sp.second;
    }
    for (int round = 0; round < 3; ++round) {
      std::vector<detail::RankLoad> send(detail::at(P)), recv(detail::at(P));
      for (int x = 0; x < P; ++x)
        for (const auto& tr : route.sends(x, round)) {
          const std::size_t cl = nodes.node(tr.from) == nodes.node(tr.to) ? 0 : 1;
          send[detail::at(tr.from)].msgs[cl] += 1;
          send[detail::at(tr.from)].bytes[cl] += static_cast<double>(tr.bytes);
          recv[detail::at(tr.to)].msgs[cl] += 1;
          recv[detail::at(tr.to)].bytes[cl] += static_cast<double>(tr.bytes);
        }
      detail::add_busiest(t, send, recv, nodes);
    }
  }
  /// The workspace of the busiest forwarder.
  static double traffic_workspace(const detail::TrafficSpans& spans) {
    double w = 0;
    for (std::size_t x = 0; x < spans.send.size(); ++x) w = std::max(w, detail::workspace_of(spans.send[x], spans.recv[x]));
    return w;
  }
};

ULYSSES_NAMESPACE_END
