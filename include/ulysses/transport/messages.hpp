// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Path::messages: one message per (peer, tensor, batch index, sequence chunk), sent from
///        the user's input where the piece is contiguous there and from the send region
///        otherwise, received into the output where contiguous and into the receive region
///        otherwise (heFFTe's point-to-point reshape; NCCL grouped send/recv).
///        Needs, lists and copies: MessagesTransport; docs/design.md, "Transports".
#pragma once

#include <vector>

#include "common.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Needs: exchange_messages() on the communicator, the executor's memory the communicator's.
/// Lists: StageLists::pack_staged, unpack_staged, send_pieces, recv_pieces. Copies per element:
/// 0-2 for peers' bytes (a piece in place skips its pack or unpack), 1 for the own chunk;
/// transport 1. Traffic: as alltoallv, in as many messages as pieces. The decode exchange:
/// exchange_chunks(), one message per peer with a non-empty chunk.
/// The message transport (see the file comment).
struct MessagesTransport : detail::MovesChunks<MessagesTransport> {
  static constexpr Path path = Path::messages;  ///< the Path it serves
  /// exchange_messages() and the executor's memory the communicator's.
  template <class Comm, class Exec>
  static constexpr bool supported = comm_traits<Comm>::exchange_messages && detail::same_memory_v<Comm, Exec>;
  /// Before the exchange: the pack blocks of the pieces that are not in place.
  static const std::vector<BlockCopy>& pack_list(const Plan& plan, Direction d, int k) { return plan.stage_lists(d, k).pack_staged; }
  /// After it: the unpack blocks of the pieces that are not in place, the own chunk, the sums.
  static const std::vector<BlockCopy>& unpack_list(const Plan& plan, Direction d, int k) { return plan.stage_lists(d, k).unpack_staged; }
  /// One exchange_messages() of every piece of stage k (in place or staged).
  /// @pre the cross-rank check is done; a flat plan; comm_traits<Comm>::exchange_messages.
  template <class Comm>
  static void exchange(const Plan& plan, Direction d, Comm& comm, const BufferTable& t, int k) {
    const StageLists& s = plan.stage_lists(d, k);
    detail::post_messages(comm, t, s.send_pieces, s.recv_pieces);
  }
  /// One exchange of a flat chunk wire (the decode exchange's): `step.before()`, one message per
  /// peer with a non-empty chunk in each direction (one exchange_messages()), `step.after()`.
  /// @pre comm_traits<Comm>::exchange_messages.
  template <class Comm, class Step>
  static void exchange_chunks(Comm& comm, const ChunkWire& w, Step& step) {
    step.before();
    detail::post_chunks(comm, w);
    step.after();
  }
  /// Copies per element of direction d (Plan::copies()).
  static CopyCount copies(const Plan& plan, Direction d) {
    return detail::count_copies(plan, d, &MessageStage::pack_staged, &MessageStage::unpack_staged);
  }
  /// Traffic of stage k for the cost model: one message per (tensor, batch index, non-empty
  /// sequence chunk of the seq-sharded side) and pair with bytes; the staged lists on the executor.
  static void traffic(const Plan& plan, Direction d, int k, const std::vector<std::size_t>& chunks, ExchangeTraffic& t,
                      detail::TrafficSpans& spans) {
    const StageLists& s = plan.stage_lists(d, k);
    detail::add_copies(t, s.pack_staged, s.unpack_staged);
    const bool s2h = d == Direction::seq_to_head;
    const double per_chunk = static_cast<double>(plan.num_tensors() * plan.batch());
    detail::add_flat_round(plan, chunks, t, [&](int i, int j) {
      double n = 0;
      for (const SeqChunk& ch : plan.seq().chunks_of(s2h ? i : j)) n += ch.length > 0 ? 1 : 0;
      return n * per_chunk;
    });
    spans.send[0] += s.send_span;
    spans.recv[0] += s.recv_span;
  }
  /// The workspace the stages' regions need (this rank's).
  static double traffic_workspace(const detail::TrafficSpans& spans) { return detail::workspace_of(spans.send[0], spans.recv[0]); }
};

ULYSSES_NAMESPACE_END
