// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Path::alltoallv: pack every peer's chunk into the send region of the workspace, one
///        all-to-all-v of the wire, unpack from the receive region (DeepSpeed-Ulysses' op
///        sequence, with q, k, v in one exchange); also the decode exchange's wire.
///        Needs, lists and copies: AlltoallvTransport; docs/design.md, "Transports".
#pragma once

#include <algorithm>
#include <vector>

#include "common.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {
/// Whether an MPI_Alltoallv of P ranks runs as P - 1 pairwise steps (step s: rank r sends to
/// r + s and receives from r - s, mod P) rather than every message at once: Open MPI's fixed
/// decision of coll/tuned (ompi_coll_tuned_alltoallv_intra_dec_fixed, Open MPI 4.1 and 5; SimGrid
/// SMPI's `smpi/coll-selector:ompi` follows it), which keys on the communicator's size only:
/// pairwise for P < 4, 64 <= P < 128 and 256 <= P < 1024, linear (all at once) otherwise.
inline bool alltoallv_pairwise(int P) { return P < 4 || (P >= 64 && P < 128) || (P >= 256 && P < 1024); }
}  // namespace detail

/// Needs: any communicator (alltoallv()), any executor. Lists: StageLists::pack, unpack. Copies
/// per element: 2 for peers' bytes (pack + unpack), 1 for the own chunk; transport 1. Traffic:
/// every chunk once, straight from its sender to its receiver (chunk_matrix()). The decode
/// exchange: exchange_chunks(), one alltoallv() of its chunks.
/// The all-to-all-v transport (see the file comment). Heavy lifting: Comm::alltoallv.
struct AlltoallvTransport : detail::MovesChunks<AlltoallvTransport> {
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
  /// One exchange of a flat chunk wire (the decode exchange's): `step.before()` (the pack), one
  /// alltoallv() of `w`, `step.after()` (the unpack / merge).
  template <class Comm, class Step>
  static void exchange_chunks(Comm& comm, const ChunkWire& w, Step& step) {
    step.before();
    comm.alltoallv(w.send, w.send_bytes, w.send_offsets, w.recv, w.recv_bytes, w.recv_offsets);
    step.after();
  }
  /// Copies per element of direction d (Plan::copies()).
  static CopyCount copies(const Plan& plan, Direction d) { return detail::count_copies(plan, d, &WireStage::pack, &WireStage::unpack); }
  /// Traffic of stage k (`chunks`: its chunk_matrix()) for the cost model: one message per pair
  /// with bytes, all at once or in P - 1 pairwise steps (detail::alltoallv_pairwise(); each step
  /// pays the latency of its slowest pair's link, and the busiest rank's steps add up), after the
  /// latency steps of the ranks' agreement on the path; the pack and the unpack on the executor;
  /// this rank's regions in `spans`.
  static void traffic(const Plan& plan, Direction d, int k, const std::vector<std::size_t>& chunks, ExchangeTraffic& t,
                      detail::TrafficSpans& spans) {
    const StageLists& s = plan.stage_lists(d, k);
    detail::add_copies(t, s.pack, s.unpack);
    const int P = plan.degree();
    const bool pairwise = detail::alltoallv_pairwise(P);
    detail::add_flat_round(plan, chunks, t, [](int, int) { return 1.0; }, !pairwise);
    for (int step = 1; pairwise && step < P; ++step) {
      int slowest = -1;
      for (int r = 0; r < P; ++r) {
        const int to = (r + step) % P;
        if (chunks[detail::at(r) * detail::at(P) + detail::at(to)] > 0)
          slowest = std::max(slowest, plan.nodes().node(r) == plan.nodes().node(to) ? 0 : 1);
      }
      if (slowest >= 0) t.latency_steps[detail::at(slowest)] += 1;
    }
    // Before it the ranks agree on the path (MpiComm::alltoallv: one 4-byte allreduce), taken as
    // recursive doubling: ceil(log2 P) steps, partner r xor d, across nodes when the node differs.
    for (int dist = 1; dist < P; dist *= 2) {
      bool across = false;
      for (int r = 0; r < P && !across; ++r) across = (r ^ dist) < P && plan.nodes().node(r) != plan.nodes().node(r ^ dist);
      t.latency_steps[across ? 1 : 0] += 1;
    }
    spans.send[0] += s.send_span;  // flat: this rank's (rank 0 holds the most under balanced splits)
    spans.recv[0] += s.recv_span;
  }
  /// The workspace the stages' regions need (this rank's).
  static double traffic_workspace(const detail::TrafficSpans& spans) { return detail::workspace_of(spans.send[0], spans.recv[0]); }
};

ULYSSES_NAMESPACE_END
