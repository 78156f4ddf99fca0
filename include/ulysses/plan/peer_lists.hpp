// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The peer copy's block lists (Path::direct) of a plan, built from every rank's layouts:
///        what transport/peer_copy.hpp keeps in the communicator's ExchangeState. Pure host
///        computation (it allocates), made once per plan and group.
///
/// Included by plan/agreement.hpp (after Plan is complete).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../comm/exchange_state.hpp"
#include "../error.hpp"
#include "plan.hpp"

ULYSSES_NAMESPACE_BEGIN

/// The peer copy's lists of `plan` (see PeerCopyLists: per direction, all stages at once) from
/// every rank's Plan::layout_record(): `all` holds P of them, in rank order. seq→head copies this
/// rank's heads of every rank's tokens from that rank's seq-sharded input; head→seq copies every
/// head of this rank's tokens from its owner, or sums it over its holders in ascending rank order
/// (Replicas::sum). One copy per element, no workspace.
/// @throws Error(plan_mismatch) when a record's extents are not the ones rank p's local shape has
///         (the ranks' plans differ).
inline PeerCopyLists peer_copy_lists(const Plan& plan, const LayoutRecord* all) {
  PeerCopyLists lists;
  const SeqPartition& seq = plan.seq();
  const std::int64_t B = plan.batch();
  for (Direction dir : {Direction::seq_to_head, Direction::head_to_seq}) {
    const int P = plan.degree(), me = plan.rank(), T = plan.num_tensors();
    const bool s2h = dir == Direction::seq_to_head;
    std::vector<BlockCopy>& out = lists.list[static_cast<int>(dir)];
    const std::vector<SeqChunk> my_chunks = seq.chunks_of(me);
    for (int t = 0; t < T; ++t) {
      const TensorSpec& x = plan.tensor(t);
      const HeadPartition& hp = x.heads;
      const std::int64_t e = static_cast<std::int64_t>(x.elem_bytes), D = x.head_dim;
      auto peer_layout = [&](int p, bool seq_side) {
        const std::int64_t* v = all[p].v[t][seq_side ? 0 : 1];
        const Layout l = Layout::strided({v[0], v[1], v[2], v[3]}, {v[4], v[5], v[6], v[7]});
        const std::int64_t want[4] = {B, seq_side ? seq.local_length(p) : seq.seq_len(), seq_side ? hp.num_heads() : hp.count(p), D};
        for (int i = 0; i < 4; ++i)
          if (l.extent[i] != want[i])
            detail::fail(Errc::plan_mismatch, "rank " + std::to_string(p) + " holds tensor " + std::to_string(t) + " as " + l.str() +
                                                  ", not the local shape this rank's plan gives it; the ranks' plans differ");
        return l;
      };
      if (s2h) {  // my heads of every peer's tokens, from the peer's seq-sharded input
        const Layout& hl = *x.head_layout;
        const std::int64_t hb = hp.begin(me), n = hp.count(me);
        for (int p = 0; p < P; ++p) {
          const Layout lp = peer_layout(p, true);
          for (const SeqChunk& c : seq.chunks_of(p)) {
            const std::int64_t ext[4] = {B, c.length, n, D};
            detail::add_block(out, ext, e, BufferIndex::peer_input(p, t), lp.offset(0, c.local_offset, hb, 0) * e, lp.stride, BufferIndex::output(t),
                      hl.offset(0, c.offset, 0, 0) * e, hl.stride);
          }
        }
        continue;
      }
      // head→seq: every head of my tokens from its owner, or summed over its holders.
      const Layout& sl = *x.seq_layout;
      const bool sums = plan.sums_replicas(t);
      for (std::int64_t a = 0; a < hp.num_heads();) {
        const auto holders = hp.holders(a);
        std::int64_t b = a + 1;
        while (b < hp.num_heads() && hp.holders(b) == holders) ++b;
        const int n = sums ? holders.second - holders.first : 1;
        std::vector<Layout> lq;
        std::vector<std::array<std::int64_t, 4>> strides;
        std::vector<int> bufs;
        for (int j = 0; j < n; ++j) {
          lq.push_back(peer_layout(holders.first + j, false));
          strides.push_back({lq[detail::at(j)].stride[0], lq[detail::at(j)].stride[1], lq[detail::at(j)].stride[2], lq[detail::at(j)].stride[3]});
          bufs.push_back(BufferIndex::peer_input(holders.first + j, t));
        }
        for (const SeqChunk& c : my_chunks) {
          const std::int64_t ext[4] = {B, c.length, b - a, D};
          std::vector<const std::int64_t*> sp;
          std::vector<std::int64_t> soff;
          for (int j = 0; j < n; ++j) {
            sp.push_back(strides[detail::at(j)].data());
            soff.push_back(lq[detail::at(j)].offset(0, c.offset, a - hp.begin(holders.first + j), 0) * e);
          }
          std::vector<BlockCopy> g(static_cast<std::size_t>(n));
          if (detail::make_blocks(ext, n, sp.data(), sl.stride, e, soff.data(), sl.offset(0, c.local_offset, a, 0) * e, bufs.data(),
                                  BufferIndex::output(t), x.type, g.data()))
            out.insert(out.end(), g.begin(), g.end());
        }
        a = b;
      }
    }
  }
  return lists;
}

inline void Plan::set_peer_layouts(const LayoutRecord* all) const {
  // Deprecated API of 0.1, which kept the lists in the plan: they go to the object the plan
  // shares for it (the plan's own members do not change); the library keeps its lists in the
  // communicator's ExchangeState.
  legacy_->lists = peer_copy_lists(*this, all);
  legacy_->ready = true;
}

inline const std::vector<BlockCopy>& Plan::direct_list(Direction d) const {
  if (!legacy_->ready) detail::fail(Errc::plan_mismatch, "Plan::direct_list: set_peer_layouts() has not run (deprecated API)");
  return legacy_->lists.list[static_cast<int>(d)];
}

ULYSSES_NAMESPACE_END
