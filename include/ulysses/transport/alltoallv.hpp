// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Path::alltoallv: pack every peer's chunk into the send region of the workspace, one
///        all-to-all-v of the wire, unpack from the receive region (DeepSpeed-Ulysses' op
///        sequence, with q, k, v in one exchange).
///
/// | needs          | lists                        | copies per element                      |
/// |----------------|------------------------------|-----------------------------------------|
/// | any communicator (alltoallv), any executor | StageLists::pack, StageLists::unpack | 2 for peers' bytes (pack + unpack), 1 for the own chunk; transport 1 |
/// Traffic: every chunk once, straight from its sender to its receiver (chunk_matrix()).
#pragma once

#include <vector>

#include "common.hpp"

ULYSSES_NAMESPACE_BEGIN

/// The all-to-all-v transport (see the file comment). Heavy lifting: Comm::alltoallv.
struct AlltoallvTransport {
  static constexpr Path path = Path::alltoallv;  ///< the Path it serves
  /// Every communicator and executor.
  template <class Comm, class Exec>
  static constexpr bool supported = true;
  /// What the executor runs before the exchange of stage k: the pack of every peer's chunk.
  static const std::vector<BlockCopy>& pack_list(const Plan& plan, Direction d, int k) { return plan.stage_lists(d, k).pack; }
  /// What it runs after: the unpack, this rank's own chunk and the sums.
  static const std::vector<BlockCopy>& unpack_list(const Plan& plan, Direction d, int k) { return plan.stage_lists(d, k).unpack; }
  /// The all-to-all-v of stage k: the send region into the receive region.
  /// @pre the cross-rank check is done (the caller's detail::before_exchange()); a flat plan.
  template <class Comm>
  static void exchange(const Plan& plan, Direction d, Comm& comm, const BufferTable& t, int k) {
    const StageLists& s = plan.stage_lists(d, k);
    comm.alltoallv(t.base[BufferIndex::send], s.send_bytes.data(), s.send_offsets.data(), t.base[BufferIndex::recv],
                   s.recv_bytes.data(), s.recv_offsets.data());
  }
  /// Copies per element of direction d (Plan::copies()).
  static CopyCount copies(const Plan& plan, Direction d) { return detail::count_copies(plan, d, &WireStage::pack, &WireStage::unpack); }
  /// Traffic of stage k (`chunks`: its chunk_matrix()) for the cost model: one message per pair
  /// with bytes; the pack and the unpack on the executor; this rank's regions in `spans`.
  static void traffic(const Plan& plan, Direction d, int k, const std::vector<std::size_t>& chunks, ExchangeTraffic& t,
                      detail::TrafficSpans& spans) {
    const StageLists& s = plan.stage_lists(d, k);
    detail::add_copies(t, s.pack, s.unpack);
    detail::add_flat_round(plan, chunks, t, [](int, int) { return 1.0; });
    spans.send[0] += s.send_span;  // flat: this rank's (rank 0 holds the most under balanced splits)
    spans.recv[0] += s.recv_span;
  }
  /// The workspace the stages' regions need (this rank's).
  static double traffic_workspace(const detail::TrafficSpans& spans) { return detail::workspace_of(spans.send[0], spans.recv[0]); }
};

ULYSSES_NAMESPACE_END
