// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The peer copy's block lists (Path::direct) of a plan, built from every rank's layouts:
///        what transport/peer_copy.hpp keeps in the communicator's ExchangeState. Pure host
///        computation (it allocates), made once per plan and group.
///
/// Included by plan/plan.hpp at its end.
#pragma once

#include <algorithm>
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

/// Rank q's layout of tensor t (seq-sharded side or head-sharded side): this rank's own for q ==
/// plan.rank(), else from its record (peer_layout()). @throws Error(plan_mismatch).
inline Layout rank_layout(const Plan& plan, const LayoutRecord* all, int q, int t, bool seq_side) {
  if (q == plan.rank()) return seq_side ? *plan.tensor(t).seq_layout : *plan.tensor(t).head_layout;
  return peer_layout(plan, all, q, t, seq_side);
}

/// seq→head of tensor t: this rank's heads of every rank's tokens, from that rank's seq-sharded input.
/// The peers in rotated order, this rank first (rank r reads r, r+1, ..., r-1): at any moment
/// the ranks read different peers' inputs rather than all the same one (the copies are disjoint,
/// so the order changes no bit).
/// @param reader whose list (-1: this rank's; another rank's list is built from its record, the
///        same blocks that rank builds) @param source only the blocks reading rank source's input (-1: all)
/// @param stage only the heads of this stage (the rank's wire heads of it, wire_heads(); -1: all)
inline void peer_copy_seq_to_head(const Plan& plan, const LayoutRecord* all, int t, std::vector<BlockCopy>& out, int reader = -1,
                                  int source = -1, int stage = -1) {
  const TensorSpec& x = plan.tensor(t);
  const int me = reader < 0 ? plan.rank() : reader;
  const Layout hl = rank_layout(plan, all, me, t, false);
  const std::int64_t e = static_cast<std::int64_t>(x.elem_bytes), hb = x.heads.begin(me);
  const std::vector<HeadRun> runs = stage < 0 ? std::vector<HeadRun>{{hb, x.heads.end(me)}}
                                              : wire_heads(x.heads, me, WireHeads::held, stage, plan.stage_cut(t));
  for (int i = 0; i < plan.degree(); ++i) {
    const int p = (me + i) % plan.degree();
    if (source >= 0 && p != source) continue;
    const Layout lp = peer_layout(plan, all, p, t, true);
    for (const SeqChunk& c : plan.seq().chunks_of(p))
      for (const HeadRun& h : runs) {
        const std::int64_t ext[4] = {plan.batch(), c.length, h.size(), x.head_dim};
        RowOrigin o;
        add_block(out, ext, e, BufferIndex::peer_input(p, t), lp.offset(0, c.local_offset, h.lo, 0) * e, lp.stride, BufferIndex::output(t),
                  hl.offset(0, c.offset, h.lo - hb, 0) * e, hl.stride, row_origin(x, t, plan.degree(), 0, c.offset, h.lo, o), x.type);
      }
  }
}

/// Bytes of this rank's input one tile of the pushed seq→head reads (the batch and every head
/// included): small enough to stay in a core's L2 while it is written to every peer, large
/// enough that a tile's blocks cost little next to their bytes.
inline constexpr std::int64_t kPushTileBytes = std::int64_t{64} << 10;

/// seq→head of tensor t pushed: this rank's tokens of rank p's heads, from this rank's own
/// seq-sharded input into p's head-sharded output (BufferIndex::peer_output), for every p. The
/// tokens go tile by tile (kPushTileBytes of input each) and every peer's share of a tile before
/// the next: each row of the input is read from memory once, in order, rather than a slice of it
/// by every peer at a stride (the pull; docs/headers.md, "plan/peer_lists.hpp", has the
/// measurement). The same element mapping as
/// peer_copy_seq_to_head; the peers in rotated order, this rank first.
/// @param plan this rank's plan; @param all every rank's layout record, in rank order;
/// @param t the tensor; @param out where the blocks are appended.
/// @throws Error(plan_mismatch) when a record's extents are not rank p's local shape.
inline void peer_push_seq_to_head(const Plan& plan, const LayoutRecord* all, int t, std::vector<BlockCopy>& out) {
  const TensorSpec& x = plan.tensor(t);
  const Layout& sl = *x.seq_layout;
  const int me = plan.rank(), P = plan.degree();
  const std::int64_t e = static_cast<std::int64_t>(x.elem_bytes);
  std::vector<Layout> lp;
  for (int p = 0; p < P; ++p) lp.push_back(peer_layout(plan, all, p, t, false));
  const std::int64_t token_bytes = std::max<std::int64_t>(1, plan.batch() * x.heads.num_heads() * x.head_dim * e);
  const std::int64_t tile = std::max<std::int64_t>(1, kPushTileBytes / token_bytes);
  for (const SeqChunk& c : plan.seq().chunks_of(me))
    for (std::int64_t k0 = 0; k0 < c.length; k0 += tile) {
      const std::int64_t len = std::min(tile, c.length - k0);
      for (int i = 0; i < P; ++i) {
        const int p = (me + i) % P;
        const std::int64_t ext[4] = {plan.batch(), len, x.heads.count(p), x.head_dim};
        RowOrigin o;
        add_block(out, ext, e, BufferIndex::input(t), sl.offset(0, c.local_offset + k0, x.heads.begin(p), 0) * e, sl.stride,
                  BufferIndex::peer_output(p, t, P), lp[at(p)].offset(0, c.offset + k0, 0, 0) * e, lp[at(p)].stride,
                  row_origin(x, t, P, 0, c.offset + k0, x.heads.begin(p), o), x.type);
      }
    }
}

/// head→seq of tensor t: every head of this rank's tokens from its owner, or (Replicas::sum)
/// summed over its holders in ascending rank order; one run of heads with the same holders at a time.
/// @param reader, source as peer_copy_seq_to_head() (with `source`, a sum keeps only its terms
///        reading that rank's input: for measuring reads, not for running)
/// @param stage only the heads head→seq moves in this stage (stage_heads(); -1: all)
inline void peer_copy_head_to_seq(const Plan& plan, const LayoutRecord* all, int t, std::vector<BlockCopy>& out, int reader = -1,
                                  int source = -1, int stage = -1) {
  const TensorSpec& x = plan.tensor(t);
  const HeadPartition& hp = x.heads;
  const int me = reader < 0 ? plan.rank() : reader;
  const Layout sl = rank_layout(plan, all, me, t, true);
  const std::int64_t e = static_cast<std::int64_t>(x.elem_bytes);
  const std::vector<HeadRun> runs = stage < 0 ? std::vector<HeadRun>{{0, hp.num_heads()}} : stage_heads(hp, stage, plan.stage_cut(t));
  for (const HeadRun& stage_run : runs)
  for (std::int64_t a = stage_run.lo; a < stage_run.hi;) {
    const HeadRun run = same_holders(hp, a, stage_run.hi);
    const auto [first, last] = hp.holders(a);
    const int n = plan.sums_replicas(t) ? last - first : 1;
    std::vector<Layout> lq;
    std::vector<int> bufs;
    if (source >= 0 && (source < first || source >= first + n)) {  // no term reads rank source's input
      a = run.hi;
      continue;
    }
    for (int j = 0; j < n; ++j) {
      lq.push_back(peer_layout(plan, all, first + j, t, false));
      bufs.push_back(BufferIndex::peer_input(first + j, t));
    }
    for (const SeqChunk& c : plan.seq().chunks_of(me)) {
      const std::int64_t ext[4] = {plan.batch(), c.length, run.size(), x.head_dim};
      std::vector<const std::int64_t*> strides;
      std::vector<std::int64_t> offsets;
      for (int j = 0; j < n; ++j) {
        strides.push_back(lq[at(j)].stride);
        offsets.push_back(lq[at(j)].offset(0, c.offset, a - hp.begin(first + j), 0) * e);
      }
      std::vector<BlockCopy> g(at(n));
      RowOrigin o;
      if (make_blocks(ext, n, strides.data(), sl.stride, e, offsets.data(), sl.offset(0, c.local_offset, a, 0) * e, bufs.data(),
                      BufferIndex::output(t), x.type, g.data(), row_origin(x, t, plan.degree(), 0, c.offset, a, o)))
        for (const BlockCopy& b : g)
          if (source < 0 || b.src_buffer == BufferIndex::peer_input(source, t)) out.push_back(b);
    }
    a = run.hi;
  }
}
}  // namespace detail

/// The peer copy's lists of `plan` (see PeerCopyLists: per direction, all stages at once, and
/// for a plan of several stages each stage's, the head bands one by one) from
/// every rank's Plan::layout_record(): `all` holds P of them, in rank order. seq→head copies this
/// rank's heads of every rank's tokens from that rank's seq-sharded input; head→seq copies every
/// head of this rank's tokens from its owner, or sums it over its holders in ascending rank order
/// (Replicas::sum). One copy per element, no workspace. push_seq_to_head: seq→head as this rank
/// writing its input into every rank's outputs (peer_push_seq_to_head), for ranks of one address space.
/// @throws Error(plan_mismatch) when a record's extents are not the ones rank p's local shape has
///         (the ranks' plans differ).
inline PeerCopyLists peer_copy_lists(const Plan& plan, const LayoutRecord* all) {
  PeerCopyLists lists;
  for (int t = 0; t < plan.num_tensors(); ++t) {
    detail::peer_copy_seq_to_head(plan, all, t, lists.list[0]);
    detail::peer_push_seq_to_head(plan, all, t, lists.push_seq_to_head);
    detail::peer_copy_head_to_seq(plan, all, t, lists.list[1]);
  }
  for (int d = 0; d < 2 && plan.num_stages() > 1; ++d) {
    lists.stage_list[d].resize(static_cast<std::size_t>(plan.num_stages()));
    for (int k = 0; k < plan.num_stages(); ++k)
      for (int t = 0; t < plan.num_tensors(); ++t) {
        std::vector<BlockCopy>& l = lists.stage_list[d][static_cast<std::size_t>(k)];
        if (d == 0) detail::peer_copy_seq_to_head(plan, all, t, l, -1, -1, k);
        else detail::peer_copy_head_to_seq(plan, all, t, l, -1, -1, k);
      }
  }
  return lists;
}

ULYSSES_NAMESPACE_END
