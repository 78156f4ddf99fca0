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

#include "common.hpp"

ULYSSES_NAMESPACE_BEGIN

/// The two-level transport (see the file comment).
struct TwoLevelTransport {
  static constexpr Path path = Path::two_level;  ///< the Path it serves
  /// exchange_messages() and the executor's memory the communicator's.
  template <class Comm, class Exec>
  static constexpr bool supported = comm_traits<Comm>::exchange_messages && detail::same_memory_v<Comm, Exec>;
  /// Before the exchange: the pack (into this rank's own send region or its node's gathered area).
  static const std::vector<BlockCopy>& pack_list(const Plan& plan, Direction d, int k) { return plan.stage_lists(d, k).pack; }
  /// After it: the unpack, the own chunk and the sums.
  static const std::vector<BlockCopy>& unpack_list(const Plan& plan, Direction d, int k) { return plan.stage_lists(d, k).unpack; }
  /// The three rounds of stage k, one exchange_messages() each; every rank calls every round.
  /// @pre the cross-rank check is done; plan.two_level(); comm_traits<Comm>::exchange_messages.
  template <class Comm>
  static void exchange(const Plan& plan, Direction d, Comm& comm, const BufferTable& t, int k) {
    const StageLists& s = plan.stage_lists(d, k);
    for (std::size_t round = 0; round < 3; ++round) detail::post_messages(comm, t, s.hop_send[round], s.hop_recv[round]);
  }
  /// Copies per element of direction d (Plan::copies()): the transport counts every hop received.
  static CopyCount copies(const Plan& plan, Direction d) {
    return detail::count_copies(
        plan, d, [](const StageLists& s) -> const std::vector<BlockCopy>& { return s.pack; },
        [](const StageLists& s) -> const std::vector<BlockCopy>& { return s.unpack; },
        [](const StageLists& s) {
          double n = 0;
          for (const auto& round : s.hop_recv)
            for (const Hop& h : round) n += static_cast<double>(h.bytes);
          return n;
        });
  }
};

ULYSSES_NAMESPACE_END
