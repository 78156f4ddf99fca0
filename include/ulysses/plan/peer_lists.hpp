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

namespace detail {
/// Rank p's layout of tensor t (seq-sharded side or head-sharded side) from its record, checked
/// against the local shape this rank's plan gives rank p. @throws Error(plan_mismatch).
inline Layout peer_layout(const Plan& plan, const LayoutRecord* all, int p, int t, bool seq_side) {
  const TensorSpec& x = plan.tensor(t);
  const std::int64_t* v = all[p].v[t][seq_side ? 0 : 1];
  const Layout l = Layout::strided({v[0], v[1], v[2], v[3]}, {v[4], v[5], v[6], v[7]});
  const std::int64_t want[4] = {plan.batch(), seq_side ? plan.seq().local_length(p) : plan.seq_len(),
                                seq_side ? x.heads.num_heads() : x.heads.count(p), x.head_dim};
  for (int i = 0; i < 4; ++i)
    if (l.extent[i] != want[i])
      fail(Errc::plan_mismatch, "rank " + std::to_string(p) + " holds tensor " + std::to_string(t) + " as " + l.str() +
                                    ", not the local shape this rank's plan gives it; the ranks' plans differ");
  return l;
}

/// seq→head of tensor t: this rank's heads of every rank's tokens, from that rank's seq-sharded input.
/// The peers in rotated order, this rank first (rank r reads r, r+1, ..., r-1): at any moment
/// the ranks read different peers' inputs rather than all the same one (the copies are disjoint,
/// so the order changes no bit).
inline void peer_copy_seq_to_head(const Plan& plan, const LayoutRecord* all, int t, std::vector<BlockCopy>& out) {
  const TensorSpec& x = plan.tensor(t);
  const Layout& hl = *x.head_layout;
  const int me = plan.rank();
  const std::int64_t e = static_cast<std::int64_t>(x.elem_bytes), hb = x.heads.begin(me), n = x.heads.count(me);
  for (int i = 0; i < plan.degree(); ++i) {
    const int p = (me + i) % plan.degree();
    const Layout lp = peer_layout(plan, all, p, t, true);
    for (const SeqChunk& c : plan.seq().chunks_of(p)) {
      const std::int64_t ext[4] = {plan.batch(), c.length, n, x.head_dim};
      add_block(out, ext, e, BufferIndex::peer_input(p, t), lp.offset(0, c.local_offset, hb, 0) * e, lp.stride, BufferIndex::output(t),
                hl.offset(0, c.offset, 0, 0) * e, hl.stride);
    }
  }
}

/// head→seq of tensor t: every head of this rank's tokens from its owner, or (Replicas::sum)
/// summed over its holders in ascending rank order; one run of heads with the same holders at a time.
inline void peer_copy_head_to_seq(const Plan& plan, const LayoutRecord* all, int t, std::vector<BlockCopy>& out) {
  const TensorSpec& x = plan.tensor(t);
  const HeadPartition& hp = x.heads;
  const Layout& sl = *x.seq_layout;
  const std::int64_t e = static_cast<std::int64_t>(x.elem_bytes);
  for (std::int64_t a = 0; a < hp.num_heads();) {
    const HeadRun run = same_holders(hp, a, hp.num_heads());
    const auto [first, last] = hp.holders(a);
    const int n = plan.sums_replicas(t) ? last - first : 1;
    std::vector<Layout> lq;
    std::vector<int> bufs;
    for (int j = 0; j < n; ++j) {
      lq.push_back(peer_layout(plan, all, first + j, t, false));
      bufs.push_back(BufferIndex::peer_input(first + j, t));
    }
    for (const SeqChunk& c : plan.seq().chunks_of(plan.rank())) {
      const std::int64_t ext[4] = {plan.batch(), c.length, run.size(), x.head_dim};
      std::vector<const std::int64_t*> strides;
      std::vector<std::int64_t> offsets;
      for (int j = 0; j < n; ++j) {
        strides.push_back(lq[at(j)].stride);
        offsets.push_back(lq[at(j)].offset(0, c.offset, a - hp.begin(first + j), 0) * e);
      }
      std::vector<BlockCopy> g(at(n));
      if (make_blocks(ext, n, strides.data(), sl.stride, e, offsets.data(), sl.offset(0, c.local_offset, a, 0) * e, bufs.data(),
                      BufferIndex::output(t), x.type, g.data()))
        out.insert(out.end(), g.begin(), g.end());
    }
    a = run.hi;
  }
}
}  // namespace detail

/// The peer copy's lists of `plan` (see PeerCopyLists: per direction, all stages at once) from
/// every rank's Plan::layout_record(): `all` holds P of them, in rank order. seq→head copies this
/// rank's heads of every rank's tokens from that rank's seq-sharded input; head→seq copies every
/// head of this rank's tokens from its owner, or sums it over its holders in ascending rank order
/// (Replicas::sum). One copy per element, no workspace.
/// @throws Error(plan_mismatch) when a record's extents are not the ones rank p's local shape has
///         (the ranks' plans differ).
inline PeerCopyLists peer_copy_lists(const Plan& plan, const LayoutRecord* all) {
  PeerCopyLists lists;
  for (int t = 0; t < plan.num_tensors(); ++t) {
    detail::peer_copy_seq_to_head(plan, all, t, lists.list[0]);
    detail::peer_copy_head_to_seq(plan, all, t, lists.list[1]);
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
