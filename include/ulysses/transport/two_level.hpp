// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Path::two_level: pack, three rounds of messages along PlanOptions::nodes (intra-node
///        gather into each node's forwarders, one message per ordered node pair and lane, the
///        intra-node delivery; topology/route.hpp), unpack. Open MPI han's and NCCL PXN's idea.
///
/// | needs          | lists                        | copies per element                      |
/// |----------------|------------------------------|-----------------------------------------|
/// | exchange_messages(), the executor's memory the communicator's; a plan with Plan::two_level() | pack, unpack, hop_send, hop_recv | 2 as alltoallv; transport: every byte received in the three rounds, forwarded chunks included (1-3 links a chunk) |
#pragma once

#include <cstddef>
#include <vector>

#include "alltoallv.hpp"
#include "common.hpp"
#include "messages.hpp"

ULYSSES_NAMESPACE_BEGIN

/// The two-level transport (see the file comment). Its pack and unpack are the all-to-all-v's
/// (inherited); what it needs of the types is the message path's.
struct TwoLevelTransport : AlltoallvTransport {
  static constexpr Path path = Path::two_level;  ///< the Path it serves
  /// exchange_messages() and the executor's memory the communicator's (as MessagesTransport).
  template <class Comm, class Exec>
  static constexpr bool supported = MessagesTransport::supported<Comm, Exec>;
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
};

ULYSSES_NAMESPACE_END
