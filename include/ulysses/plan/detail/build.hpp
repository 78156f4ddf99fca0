// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The planner's list building (StageBuilder): the wire chunks, the pieces, this rank's
///        own chunk and the sums of replicated heads of one stage of one direction.
///
/// Pure host computation over the plan's inputs (PlanInputs); Plan's constructor runs it once
/// per (direction, stage). The wire format it lays out is docs/wire-format.md.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../../layout/blocks.hpp"
#include "../../partition/heads.hpp"
#include "../../partition/seq.hpp"
#include "../spec.hpp"
#include "../stage.hpp"

ULYSSES_NAMESPACE_BEGIN
namespace detail {

/// A container index from a rank, tensor or holder number.
template <class I>
constexpr std::size_t at(I i) {
  return static_cast<std::size_t>(i);
}

/// What the list building reads: the plan's validated inputs (layouts resolved).
struct PlanInputs {
  Group group;
  std::int64_t batch = 1;
  const SeqPartition* seq = nullptr;
  const std::vector<TensorSpec>* tensors = nullptr;
  int stages = 1;
  /// cuts[t]: how the stages take tensor t's heads (StageCut; the query partition under head bands).
  std::vector<StageCut> cuts;
  /// sums[t]: head→seq sums tensor t's replicated heads (Plan::sums_replicas(t)), whatever the direction.
  std::vector<char> sums;
};

/// The RowOrigin of a block of tensor t (spec x) whose first row is (b, token, head), in a
/// group of P ranks; null (a plain block) unless x is planned with_row_transforms().
inline const RowOrigin* row_origin(const TensorSpec& x, int t, int P, std::int64_t b, std::int64_t token, std::int64_t head,
                                   RowOrigin& o) {
  if (!x.by_rows()) return nullptr;
  o = RowOrigin{{b, token, head}, t, P, static_cast<int>(x.wire)};
  return &o;
}

/// Makes the wire side (`src`: the source, else the destination) of the transformed block c an
/// fp8 wire of rows of W bytes: its strides along each coordinate (BlockCopy::axis) become
/// stride_bytes[axis] (batch, token, head), its offset `offset`; c.wire the format. The geometry
/// was built with the element strides, so only the wire side's numbers change.
inline void rewire(BlockCopy& c, bool src, const std::int64_t stride_bytes[3], std::int64_t offset, std::int64_t W, Wire wire) {
  std::int64_t* st = src ? c.src_stride : c.dst_stride;
  for (int i = 0; i < 4; ++i) st[i] = c.axis[i] >= 0 ? stride_bytes[c.axis[i]] : 0;
  (src ? c.src_offset : c.dst_offset) = offset;
  (src ? c.src_row_bytes : c.row_bytes) = W;  // (row_bytes: the destination's rows)
  c.wire = static_cast<std::int32_t>(wire);
}

/// Appends the block copying extents `ext` from (src buffer, byte offset, element strides) to
/// (dst buffer, byte offset, element strides); nothing for an empty block. With `rows`, a
/// transformed block of elements of `type` (make_blocks()).
inline void add_block(std::vector<BlockCopy>& list, const std::int64_t ext[4], std::int64_t elem_bytes, int src_buffer,
                      std::int64_t src_offset, const std::int64_t src_stride[4], int dst_buffer, std::int64_t dst_offset,
                      const std::int64_t dst_stride[4], const RowOrigin* rows = nullptr, ElementType type = ElementType::opaque) {
  BlockCopy c;
  if (make_block(ext, src_stride, dst_stride, elem_bytes, src_offset, dst_offset, src_buffer, dst_buffer, c, rows, type))
    list.push_back(c);
}

/// Marks a piece in place when its blocks are one contiguous range of the user's tensor that
/// covers all its bytes (sending: one pack block; receiving: one unpack block, and no byte of it
/// is a term of a sum).
inline Piece place_piece(Piece pc, const std::vector<BlockCopy>& list, bool sending) {
  if (pc.last - pc.first != 1) return pc;
  const BlockCopy& c = list[pc.first];
  if (c.row_tensor >= 0 || c.rows() != 1 || static_cast<std::size_t>(c.bytes()) != pc.bytes) return pc;
  pc.buffer = sending ? c.src_buffer : c.dst_buffer;
  pc.offset = sending ? c.src_offset : c.dst_offset;
  return pc;
}

/// Builds the StageLists of one (direction, stage) for one rank. Where the chunks lie: back to
/// back from `send_base` / `recv_base`, or (two-level plans) at the route's offsets per peer.
class StageBuilder {
 public:
  StageBuilder(const PlanInputs& in, Direction dir, int stage) : in_(in), s2h_(dir == Direction::seq_to_head), k_(stage) {
    const int P = in_.group.size, T = static_cast<int>(in_.tensors->size());
    wire_.resize(at(T));
    for (int t = 0; t < T; ++t) sums_.push_back(!s2h_ && in_.sums[at(t)]);  // only head→seq sums
    for (int t = 0; t < T; ++t) {
      const TensorSpec& x = tensor(t);
      const WireHeads which = s2h_ ? WireHeads::held : sums_[at(t)] ? WireHeads::held_for_sum : WireHeads::owned;
      for (int r = 0; r < P; ++r) wire_[at(t)].push_back(wire_heads(x.heads, r, which, k_, in_.cuts[at(t)]));
    }
  }

  /// Builds the lists: chunk layout, then per peer the pieces sent and received, then this
  /// rank's own chunk, the sums of replicated heads, and the message path's staged lists.
  StageLists build(std::size_t send_base, std::size_t recv_base, const std::vector<std::size_t>& send_off,
                   const std::vector<std::size_t>& recv_off) {
    StageLists sc;
    lay_out_chunks(sc, send_base, recv_base, send_off, recv_off);
    const int me = in_.group.rank;
    for (int p = 0; p < in_.group.size; ++p) {
      if (p == me) continue;
      for (int t = 0; t < num_tensors(); ++t) {
        pieces(sc, p, t, true);
        pieces(sc, p, t, false);
      }
    }
    const std::size_t own_first = sc.unpack.size();
    own_chunk(sc);
    for (int t = 0; t < num_tensors(); ++t)
      if (sums_[at(t)]) replica_sums(sc, t);
    staged_lists(sc, own_first);
    return sc;
  }

 private:
  int num_tensors() const { return static_cast<int>(in_.tensors->size()); }
  const TensorSpec& tensor(int t) const { return (*in_.tensors)[at(t)]; }
  const SeqPartition& seq() const { return *in_.seq; }
  /// The heads head-sharded rank r puts on the wire for tensor t in this stage.
  const std::vector<HeadRun>& wire(int t, int r) const { return wire_[at(t)][at(r)]; }

  /// Bytes of tensor t in the chunk between seq-sharded rank sr and head-sharded rank hr.
  std::size_t piece_bytes(int t, int sr, int hr) const {
    const TensorSpec& x = tensor(t);
    return static_cast<std::size_t>(in_.batch * seq().local_length(sr) * total_heads(wire(t, hr))) * x.wire_row_bytes();
  }

  /// Byte counts and offsets of every chunk, where each tensor's part starts in them, and the
  /// replica bytes (heads this rank holds below its owned range, sent only to be summed).
  void lay_out_chunks(StageLists& sc, std::size_t send_base, std::size_t recv_base, const std::vector<std::size_t>& send_off,
                      const std::vector<std::size_t>& recv_off) {
    const int P = in_.group.size, me = in_.group.rank, T = num_tensors();
    sc.send_bytes.assign(at(P), 0);
    sc.send_offsets.assign(at(P), 0);
    sc.recv_bytes.assign(at(P), 0);
    sc.recv_offsets.assign(at(P), 0);
    send_at_.assign(at(P), std::vector<std::size_t>(at(T)));
    recv_at_ = send_at_;
    std::size_t send_cursor = send_base, recv_cursor = recv_base;
    for (int p = 0; p < P; ++p) {
      if (!send_off.empty() && p != me) {  // the chunk may lie in a gathered / received area
        send_cursor = send_off[at(p)];
        recv_cursor = recv_off[at(p)];
      }
      sc.send_offsets[at(p)] = send_cursor;
      sc.recv_offsets[at(p)] = recv_cursor;
      if (p != me)
        for (int t = 0; t < T; ++t) {
          send_at_[at(p)][at(t)] = send_cursor;
          recv_at_[at(p)][at(t)] = recv_cursor;
          const std::size_t sent = s2h_ ? piece_bytes(t, me, p) : piece_bytes(t, p, me);
          const std::size_t received = s2h_ ? piece_bytes(t, p, me) : piece_bytes(t, me, p);
          send_cursor += sent;
          recv_cursor += received;
          sc.send_bytes[at(p)] += sent;
          sc.recv_bytes[at(p)] += received;
          if (sums_[at(t)]) sc.replica_bytes += replica_bytes_to(t, p);
        }
      sc.send_total += sc.send_bytes[at(p)];
      sc.recv_total += sc.recv_bytes[at(p)];
    }
    sc.send_span = sc.send_total;  // a two-level plan sets its own
    sc.recv_span = sc.recv_total;
  }

  /// Bytes of tensor t's heads this rank holds without owning them, in its chunk to seq-sharded rank p.
  std::size_t replica_bytes_to(int t, int p) const {
    const TensorSpec& x = tensor(t);
    const std::int64_t own = x.heads.owned_begin(in_.group.rank);
    std::int64_t n = 0;
    for (const HeadRun& r : wire(t, in_.group.rank)) n += std::max<std::int64_t>(0, std::min(r.hi, own) - r.lo);
    return static_cast<std::size_t>(in_.batch * seq().local_length(p) * n) * x.wire_row_bytes();
  }

  // The chunk between this rank and a peer holds, per tensor, the wire block [B, Ts, n, D] (Ts:
  // the seq-side rank's local tokens, n: the head-side rank's heads of this stage). It is cut into
  // one piece per (b, chunk of the seq-side rank): the same cut on both sides (it depends on B and
  // the sequence partition only), and each piece is contiguous in the user's tensor more often
  // than the whole (bshd: seq→head receives, head→seq sends every piece in place, at any B, for
  // zigzag splits too).

  /// The pieces of tensor t this rank sends to p (`sending`: their pack blocks, inputs → send
  /// region) or receives from p (their unpack blocks, receive region → outputs; heads summed on
  /// receipt are read by replica_sums(), not copied here). Either way the seq side of the chunk is
  /// this rank when it sends in seq→head or receives in head→seq, else p; and the user's tensor
  /// the blocks touch is then this rank's seq-sharded one, else its head-sharded one.
  void pieces(StageLists& sc, int p, int t, bool sending) {
    const int me = in_.group.rank;
    const TensorSpec& x = tensor(t);
    const Layout& sl = *x.seq_layout;
    const Layout& hl = *x.head_layout;
    const std::int64_t e = static_cast<std::int64_t>(x.elem_bytes), D = x.head_dim, hb = x.heads.begin(me);
    const auto W = static_cast<std::int64_t>(x.wire_row_bytes());  // bytes of a head row on the wire (D * e but for an fp8 wire)
    const bool seq_is_me = s2h_ == sending;
    const std::vector<SeqChunk> chunks = seq().chunks_of(seq_is_me ? me : p);
    const std::int64_t Ts = seq().local_length(seq_is_me ? me : p);
    const std::vector<HeadRun>& hs = wire(t, seq_is_me ? p : me);
    const std::int64_t n = total_heads(hs);
    const std::int64_t wire_stride[4] = {Ts * n * D, n * D, D, 1};
    const std::vector<HeadRun> moved = !sending && sums_[at(t)] ? shared_runs(x.heads, hs, false) : hs;
    std::vector<BlockCopy>& list = sending ? sc.pack : sc.unpack;
    const int wire_buffer = sending ? BufferIndex::send : BufferIndex::recv;
    const auto base = static_cast<std::int64_t>(sending ? send_at_[at(p)][at(t)] : recv_at_[at(p)][at(t)]);
    for (std::int64_t b = 0; b < in_.batch; ++b)
      for (const SeqChunk& c : chunks) {
        const std::int64_t off = base + ((b * Ts + c.local_offset) * n) * W;
        Piece pc{p, t, static_cast<std::size_t>(c.length * n * W), wire_buffer, off, static_cast<std::size_t>(off)};
        pc.first = static_cast<std::uint32_t>(list.size());
        for (const HeadRun& r : moved) {
          const std::int64_t ext[4] = {1, c.length, r.size(), D};
          const std::int64_t user = (seq_is_me ? sl.offset(b, c.local_offset, r.lo, 0) : hl.offset(b, c.offset, r.lo - hb, 0)) * e;
          const std::int64_t* user_stride = seq_is_me ? sl.stride : hl.stride;
          const std::int64_t on_wire = off + position_of(hs, r.lo) * W;
          RowOrigin o;
          const RowOrigin* rows = row_origin(x, t, in_.group.size, b, c.offset, r.lo, o);
          const std::size_t first = list.size();
          if (sending)
            add_block(list, ext, e, BufferIndex::input(t), user, user_stride, wire_buffer, on_wire, wire_stride, rows, x.type);
          else
            add_block(list, ext, e, wire_buffer, on_wire, wire_stride, BufferIndex::output(t), user, user_stride, rows, x.type);
          const std::int64_t wire_bytes[3] = {Ts * n * W, n * W, W};  // (b, s, h) on the wire
          if (x.wire != Wire::element && list.size() > first) rewire(list.back(), !sending, wire_bytes, on_wire, W, x.wire);
        }
        pc.last = static_cast<std::uint32_t>(list.size());
        if (pc.bytes) (sending ? sc.send_pieces : sc.recv_pieces).push_back(place_piece(pc, list, sending));
      }
  }

  /// This rank's own chunk: input → output, for the heads it would send itself (not those summed).
  void own_chunk(StageLists& sc) const {
    const int me = in_.group.rank;
    const std::vector<SeqChunk> chunks = seq().chunks_of(me);
    for (int t = 0; t < num_tensors(); ++t) {
      const TensorSpec& x = tensor(t);
      const Layout& sl = *x.seq_layout;
      const Layout& hl = *x.head_layout;
      const std::int64_t e = static_cast<std::int64_t>(x.elem_bytes), D = x.head_dim, hb = x.heads.begin(me);
      const int in = BufferIndex::input(t), out = BufferIndex::output(t);
      const std::vector<HeadRun> own = sums_[at(t)] ? shared_runs(x.heads, wire(t, me), false) : wire(t, me);
      for (const HeadRun& r : own)
        for (const SeqChunk& c : chunks) {
          const std::int64_t ext[4] = {in_.batch, c.length, r.size(), D};
          const std::int64_t seq_off = sl.offset(0, c.local_offset, r.lo, 0) * e, head_off = hl.offset(0, c.offset, r.lo - hb, 0) * e;
          RowOrigin o;
          const RowOrigin* rows = row_origin(x, t, in_.group.size, 0, c.offset, r.lo, o);
          if (s2h_)
            add_block(sc.unpack, ext, e, in, seq_off, sl.stride, out, head_off, hl.stride, rows, x.type);
          else
            add_block(sc.unpack, ext, e, in, head_off, hl.stride, out, seq_off, sl.stride, rows, x.type);
        }
    }
  }

  /// Sums (head→seq, Replicas::sum) of tensor t: each head of this stage held by several ranks,
  /// from every holder's copy in ascending rank order (a peer's from the receive region, this
  /// rank's own from its input), one sum run per run of heads with the same holders.
  void replica_sums(StageLists& sc, int t) const {
    const TensorSpec& x = tensor(t);
    const HeadPartition& hp = x.heads;
    for (const HeadRun& run : shared_runs(hp, stage_heads(hp, k_, in_.cuts[at(t)]), true))
      for (std::int64_t a = run.lo; a < run.hi;) {
        const HeadRun same = same_holders(hp, a, run.hi);
        for (const SeqChunk& c : seq().chunks_of(in_.group.rank)) sum_block(sc, t, same, c);
        a = same.hi;
      }
  }

  /// The sum run of heads `heads` (one set of holders) over the tokens of chunk c.
  void sum_block(StageLists& sc, int t, HeadRun heads, const SeqChunk& c) const {
    const int me = in_.group.rank;
    const TensorSpec& x = tensor(t);
    const Layout& sl = *x.seq_layout;
    const Layout& hl = *x.head_layout;
    const std::int64_t e = static_cast<std::int64_t>(x.elem_bytes), D = x.head_dim, Tm = seq().local_length(me);
    const auto W = static_cast<std::int64_t>(x.wire_row_bytes());
    const auto [first, last] = x.heads.holders(heads.lo);
    const int n = last - first;
    const std::int64_t ext[4] = {in_.batch, c.length, heads.size(), D};
    std::vector<std::array<std::int64_t, 4>> strides(at(n));
    std::vector<const std::int64_t*> stride_of(at(n));
    std::vector<std::int64_t> src_off(at(n));
    std::vector<int> src_buf(at(n));
    for (int j = 0; j < n; ++j) {
      const int q = first + j;
      if (q == me) {
        strides[at(j)] = {hl.stride[0], hl.stride[1], hl.stride[2], hl.stride[3]};
        src_off[at(j)] = hl.offset(0, c.offset, heads.lo - x.heads.begin(me), 0) * e;
        src_buf[at(j)] = BufferIndex::input(t);
      } else {
        const std::int64_t nq = total_heads(wire(t, q));
        strides[at(j)] = {Tm * nq * D, nq * D, D, 1};
        src_off[at(j)] = static_cast<std::int64_t>(recv_at_[at(q)][at(t)]) + (c.local_offset * nq + position_of(wire(t, q), heads.lo)) * W;
        src_buf[at(j)] = BufferIndex::recv;
      }
      stride_of[at(j)] = strides[at(j)].data();
    }
    std::vector<BlockCopy> g(at(n));
    RowOrigin o;
    const RowOrigin* rows = row_origin(x, t, in_.group.size, 0, c.offset, heads.lo, o);
    if (make_blocks(ext, n, stride_of.data(), sl.stride, e, src_off.data(), sl.offset(0, c.local_offset, heads.lo, 0) * e,
                    src_buf.data(), BufferIndex::output(t), x.type, g.data(), rows)) {
      for (int j = 0; j < n && x.wire != Wire::element; ++j) {  // the terms from the receive region: fp8 rows
        if (src_buf[at(j)] != BufferIndex::recv) continue;
        const std::int64_t nq = total_heads(wire(t, first + j)), wire_bytes[3] = {Tm * nq * W, nq * W, W};
        rewire(g[at(j)], true, wire_bytes, src_off[at(j)], W, x.wire);
      }
      sc.unpack.insert(sc.unpack.end(), g.begin(), g.end());
    }
  }

  /// The message path's lists: the staged blocks of the pieces that are not in place, then (after
  /// the exchange) the own chunk's blocks and the sums, which always run.
  static void staged_lists(StageLists& sc, std::size_t own_first) {
    for (const Piece& pc : sc.send_pieces)
      if (!pc.in_place()) sc.pack_staged.insert(sc.pack_staged.end(), sc.pack.begin() + pc.first, sc.pack.begin() + pc.last);
    for (const Piece& pc : sc.recv_pieces)
      if (!pc.in_place()) sc.unpack_staged.insert(sc.unpack_staged.end(), sc.unpack.begin() + pc.first, sc.unpack.begin() + pc.last);
    sc.unpack_staged.insert(sc.unpack_staged.end(), sc.unpack.begin() + static_cast<std::ptrdiff_t>(own_first), sc.unpack.end());
  }

  const PlanInputs& in_;
  bool s2h_;
  int k_;
  std::vector<bool> sums_;  // [tensor]: this direction sums its replicated heads
  std::vector<std::vector<std::vector<HeadRun>>> wire_;  // [tensor][head-sharded rank]
  std::vector<std::vector<std::size_t>> send_at_, recv_at_;  // [peer][tensor]: where the tensor's part starts in the chunk
};

}  // namespace detail
ULYSSES_NAMESPACE_END
