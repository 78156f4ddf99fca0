// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The bodies of the decode exchange's three passes, as ULYSSES_HOST_DEVICE functions over
///        DecodeArgs: the pack of the partials' chunks, the unpack + merge of the received
///        partials, and (DecodeOutput::all_heads) the unpack of the merged head groups. The host
///        executor (decode/host.hpp) runs them in loops, the CUDA executor (cuda/merge.cuh) the
///        very same functions in its kernels: the same index arithmetic and bits (docs/decode.md).
///
/// Units: a pack or gather unit is one row (Dv elements and one LSE) of a head another rank
/// merges, rows numbered over (b, t, the other ranks' heads in increasing order); a merge unit is
/// a chunk of at most N elements of one row of this rank's heads, rows numbered over (b, t, j).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../layout/element.hpp"
#include "../merge/lse.hpp"
#include "buffers.hpp"

ULYSSES_NAMESPACE_BEGIN
namespace detail {

/// The rank merging head h: the largest p whose head_begin <= h (ranges are monotone, disjoint
/// and cover [0, H); an empty range begins where the next non-empty one does). Host and device.
ULYSSES_HOST_DEVICE inline int decode_owner(const DecodePeer* peers, int P, std::int64_t h) {
  int lo = 0, hi = P;
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (peers[mid].head_begin <= h)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

/// Copies bytes [lane*16, ...) of a row in 16-byte pieces lane, lane + lanes, ... (the last one
/// shorter); with lanes == 1, the whole row at once. 16-byte vector loads and stores on the device
/// where both addresses allow. Host and device.
ULYSSES_HOST_DEVICE inline void decode_copy(std::byte* dst, const std::byte* src, std::int64_t bytes, int lane, int lanes) {
  if (lanes == 1) {
    if (bytes > 0) std::memcpy(dst, src, static_cast<std::size_t>(bytes));
    return;
  }
  for (std::int64_t at = std::int64_t{16} * lane; at < bytes; at += std::int64_t{16} * lanes) {
    const std::int64_t n = bytes - at < 16 ? bytes - at : 16;
#if defined(__CUDA_ARCH__)
    if (n == 16 && ((reinterpret_cast<std::uintptr_t>(dst + at) | reinterpret_cast<std::uintptr_t>(src + at)) & 15u) == 0) {
      *reinterpret_cast<uint4*>(dst + at) = *reinterpret_cast<const uint4*>(src + at);
      continue;
    }
#endif
    std::memcpy(dst + at, src + at, static_cast<std::size_t>(n));
  }
}

/// Rows of the pack (and of the gather unpack): B·T·(H − H_rank).
ULYSSES_HOST_DEVICE inline std::int64_t decode_other_rows(const DecodeArgs& a) { return a.B * a.T * (a.H - a.heads); }
/// Rows of the merge: B·T·H_rank.
ULYSSES_HOST_DEVICE inline std::int64_t decode_own_rows(const DecodeArgs& a) { return a.B * a.T * a.heads; }

/// Row r of the other ranks' heads: (b, t, h), the owner p of h and h's index j in p's group.
struct DecodeRow {
  std::int64_t b, t, h, j;
  int p;
};
ULYSSES_HOST_DEVICE inline DecodeRow decode_other_row(const DecodeArgs& a, std::int64_t r) {
  const std::int64_t others = a.H - a.heads, bt = r / others, hh = r - bt * others;
  DecodeRow x;
  x.b = bt / a.T;
  x.t = bt - x.b * a.T;
  x.h = hh < a.head_begin ? hh : hh + a.heads;
  x.p = decode_owner(a.peers, a.P, x.h);
  x.j = x.h - a.peers[x.p].head_begin;
  return x;
}

/// Pack unit r (lane `lane` of `lanes`): copies the partial output row and LSE of row r (a head
/// rank p merges) into p's chunk of the send region (wire format: decode/plan.hpp). Lane 0 copies
/// the LSE. Host and device.
ULYSSES_HOST_DEVICE inline void decode_pack_unit(const DecodeArgs& a, std::int64_t r, int lane, int lanes) {
  const DecodeRow x = decode_other_row(a, r);
  const DecodePeer& q = a.peers[x.p];
  const std::int64_t ein = merge_elem_bytes(a.partial_type);
  const std::int64_t k = (x.b * a.T + x.t) * q.head_count + x.j;  // row index within the chunk
  const std::int64_t row_bytes = a.Dv * ein;
  decode_copy(a.send + q.send_offset + k * row_bytes,
              a.partial + (x.b * a.partial_stride[0] + x.t * a.partial_stride[1] + x.h * a.partial_stride[2]) * ein, row_bytes, lane,
              lanes);
  if (lane == 0)
    copy_bytes(a.send + q.send_lse_offset + k * 4, a.lse + (x.b * a.lse_stride[0] + x.t * a.lse_stride[1] + x.h * a.lse_stride[2]) * 4, 4);
}

/// Gather unit r (DecodeOutput::all_heads; lane `lane` of `lanes`): copies the merged row and LSE
/// of row r (a head rank p merged) from p's chunk of the gather-receive region into the output
/// (and the output LSE, when given). Host and device.
ULYSSES_HOST_DEVICE inline void decode_gather_unit(const DecodeArgs& a, std::int64_t r, int lane, int lanes) {
  const DecodeRow x = decode_other_row(a, r);
  const DecodePeer& q = a.peers[x.p];
  const std::int64_t eout = merge_elem_bytes(a.out_type);
  const std::int64_t k = (x.b * a.T + x.t) * q.head_count + x.j, row_bytes = a.Dv * eout;
  decode_copy(a.out + (x.b * a.out_stride[0] + x.t * a.out_stride[1] + x.h * a.out_stride[2]) * eout,
              a.gather_recv + q.gather_recv_offset + k * row_bytes, row_bytes, lane, lanes);
  if (lane == 0 && a.out_lse)
    copy_bytes(a.out_lse + (x.b * a.out_lse_stride[0] + x.t * a.out_lse_stride[1] + x.h * a.out_lse_stride[2]) * 4,
               a.gather_recv + q.gather_recv_lse_offset + k * 4, 4);
}

/// Reads the LSE at p (4 bytes, any alignment; one 4-byte load where aligned). Host and device.
ULYSSES_HOST_DEVICE inline float decode_load_lse(const std::byte* p) { return load_bits<float>(p); }

/// Row r of this rank's heads in the merge: where its P contributions are — this rank's own in
/// place in O_rank and LSE_rank, every other rank's in its chunk of the receive region — and
/// where the merged row goes. Host and device.
struct DecodeMergeRow {
  const DecodeArgs* a;
  std::int64_t b, t, j, chunk_row;  ///< chunk_row: the row's index within every received chunk
  const std::byte* own;
  float own_lse;
  std::int64_t own_lse_at;  ///< byte offset of the row's LSE in LSE_rank (and, Path::direct, in every LSE_p)
  std::int64_t row_bytes;  ///< bytes of one partial row (Dv elements)

  ULYSSES_HOST_DEVICE DecodeMergeRow(const DecodeArgs& args, std::int64_t r) : a(&args) {
    const std::int64_t ein = merge_elem_bytes(args.partial_type), bt = r / args.heads;
    j = r - bt * args.heads;
    b = bt / args.T;
    t = bt - b * args.T;
    chunk_row = (b * args.T + t) * args.heads + j;
    const std::int64_t h = args.head_begin + j;
    own = args.partial + (b * args.partial_stride[0] + t * args.partial_stride[1] + h * args.partial_stride[2]) * ein;
    own_lse_at = (b * args.lse_stride[0] + t * args.lse_stride[1] + h * args.lse_stride[2]) * 4;
    own_lse = decode_load_lse(args.lse + own_lse_at);
    row_bytes = args.Dv * ein;
  }
  /// Contribution p's partial row: in its chunk of the receive region, or (Path::direct, the
  /// same layouts on every rank) at the own row's offset in rank p's O_p.
  ULYSSES_HOST_DEVICE const std::byte* row(int p) const {
    if (p == a->rank) return own;
    if (a->peer_partial) return a->peer_partial[p] + (own - a->partial);
    return a->recv + a->peers[p].recv_offset + chunk_row * row_bytes;
  }
  /// Contribution p's LSE (from the receive region, or Path::direct: rank p's LSE_p).
  ULYSSES_HOST_DEVICE float lse(int p) const {
    if (p == a->rank) return own_lse;
    if (a->peer_lse) return decode_load_lse(a->peer_lse[p] + own_lse_at);
    return decode_load_lse(a->recv + a->peers[p].recv_offset + a->recv_lse_offset + chunk_row * 4);
  }
  /// The merged row in the output.
  ULYSSES_HOST_DEVICE std::byte* out() const {
    return a->out + (b * a->out_stride[0] + t * a->out_stride[1] + (a->out_head0 + j) * a->out_stride[2]) * merge_elem_bytes(a->out_type);
  }
  /// After elements [d0, d0 + len) of the output row are written: their copy into the merged chunk
  /// this rank sends (all_heads), and, for the chunk with d0 == 0, the merged LSE `l` into the
  /// output LSE (when given) and that chunk.
  ULYSSES_HOST_DEVICE void finish(float l, std::int64_t d0, int len) const {
    const std::int64_t eout = merge_elem_bytes(a->out_type);
    const bool gather = a->output == DecodeOutput::all_heads && a->P > 1;
    if (gather) copy_bytes(a->gather_send + (chunk_row * a->Dv + d0) * eout, out() + d0 * eout, static_cast<std::size_t>(len * eout));
    if (d0 != 0) return;
    if (a->out_lse) store_bits(a->out_lse + (b * a->out_lse_stride[0] + t * a->out_lse_stride[1] + (a->out_head0 + j) * a->out_lse_stride[2]) * 4, l);
    if (gather) store_bits(a->gather_send + a->gather_lse_offset + chunk_row * 4, l);
  }
};

/// Merge unit (row r of this rank's heads, elements [d0, d0 + N) ∩ [0, Dv)): merges the P partial
/// rows in ascending rank order (DecodeMergeRow says where they are) by merge/lse.hpp's fold,
/// writes the merged elements to the output, and (the unit with d0 == 0) the merged LSE to the
/// output LSE when given; for DecodeOutput::all_heads also both into the merged chunk this rank
/// sends. `In` / `Out` are the SumArith of the partial and output types. Host and device.
template <int N, class In, class Out>
ULYSSES_HOST_DEVICE inline void decode_merge_unit_typed(const DecodeArgs& a, std::int64_t r, std::int64_t d0) {
  const DecodeMergeRow m(a, r);
  const int len = a.Dv - d0 < N ? static_cast<int>(a.Dv - d0) : N;
  const float l = merge_chunk<N, In, Out>(
      a.P, [&m](int p) { return m.row(p); }, [&m](int p) { return m.lse(p); }, d0, len, m.out(), a.base);
  m.finish(l, d0, len);
}

/// decode_merge_unit_typed() for the args' element types (one switch per unit). Host and device.
template <int N>
ULYSSES_HOST_DEVICE inline void decode_merge_unit(const DecodeArgs& a, std::int64_t r, std::int64_t d0) {
  with_merge_arith(a.partial_type, [&](auto in) {
    with_merge_arith(a.out_type, [&](auto o) { decode_merge_unit_typed<N, decltype(in), decltype(o)>(a, r, d0); });
  });
}

}  // namespace detail
ULYSSES_NAMESPACE_END
