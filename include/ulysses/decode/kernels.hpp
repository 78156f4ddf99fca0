// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The bodies of the decode exchange's three passes, as ULYSSES_HOST_DEVICE functions over
///        DecodeArgs: the pack of the partials' chunks, the unpack + merge of the received
///        partials, and (DecodeOutput::all_heads) the unpack of the merged head groups.
///
/// The host executor (decode/host.hpp) runs them in loops; the CUDA executor (cuda/merge.cuh)
/// runs the very same functions in its kernels, one thread group per unit. So the host tests,
/// which also call them lane by lane as a kernel would, check the index arithmetic the GPU runs,
/// and the merge's bits are the same on both (merge/lse.hpp).
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
#include "plan.hpp"

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
    std::memcpy(a.send + q.send_lse_offset + k * 4, a.lse + (x.b * a.lse_stride[0] + x.t * a.lse_stride[1] + x.h * a.lse_stride[2]) * 4, 4);
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
    std::memcpy(a.out_lse + (x.b * a.out_lse_stride[0] + x.t * a.out_lse_stride[1] + x.h * a.out_lse_stride[2]) * 4,
                a.gather_recv + q.gather_recv_lse_offset + k * 4, 4);
}

/// Reads the LSE at p (4 bytes, any alignment). Host and device.
ULYSSES_HOST_DEVICE inline float decode_load_lse(const std::byte* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

/// Merge unit (row r of this rank's heads, elements [d0, d0 + N) ∩ [0, Dv)): merges the P partial
/// rows in ascending rank order — this rank's own from O_rank and LSE_rank in place, every other
/// rank's from its chunk in the receive region — by merge/lse.hpp's fold, writes the merged
/// elements to the output, and (the unit with d0 == 0) the merged LSE to the output LSE when
/// given. For DecodeOutput::all_heads it also writes both into the merged chunk this rank sends.
/// `In` / `Out` are the SumArith of the partial and output types. Host and device.
template <int N, class In, class Out>
ULYSSES_HOST_DEVICE inline void decode_merge_unit_typed(const DecodeArgs& a, std::int64_t r, std::int64_t d0) {
  constexpr std::int64_t ein = sizeof(typename In::Bits), eout = sizeof(typename Out::Bits);
  const std::int64_t bt = r / a.heads, j = r - bt * a.heads, b = bt / a.T, t = bt - b * a.T, h = a.head_begin + j;
  const std::int64_t chunk_row = (b * a.T + t) * a.heads + j;  // the row's index within every received chunk
  const std::byte* own = a.partial + (b * a.partial_stride[0] + t * a.partial_stride[1] + h * a.partial_stride[2]) * ein;
  const float own_lse = decode_load_lse(a.lse + (b * a.lse_stride[0] + t * a.lse_stride[1] + h * a.lse_stride[2]) * 4);
  const DecodePeer* peers = a.peers;
  const std::byte* recv = a.recv;
  const std::int64_t row_bytes = a.Dv * ein;
  const std::uint64_t lse_at = a.recv_lse_offset;
  const int me = a.rank;
  auto row = [=](int p) -> const std::byte* { return p == me ? own : recv + peers[p].recv_offset + chunk_row * row_bytes; };
  auto lse = [=](int p) -> float { return p == me ? own_lse : decode_load_lse(recv + peers[p].recv_offset + lse_at + chunk_row * 4); };
  const int len = a.Dv - d0 < N ? static_cast<int>(a.Dv - d0) : N;
  std::byte* out = a.out + (b * a.out_stride[0] + t * a.out_stride[1] + (a.out_head0 + j) * a.out_stride[2]) * eout;
  const float l = merge_chunk<N, In, Out>(a.P, row, lse, d0, len, out, a.base);
  const bool gather = a.output == DecodeOutput::all_heads && a.P > 1;
  if (gather) std::memcpy(a.gather_send + (chunk_row * a.Dv + d0) * eout, out + d0 * eout, static_cast<std::size_t>(len * eout));
  if (d0 == 0) {
    if (a.out_lse) std::memcpy(a.out_lse + (b * a.out_lse_stride[0] + t * a.out_lse_stride[1] + (a.out_head0 + j) * a.out_lse_stride[2]) * 4, &l, 4);
    if (gather) std::memcpy(a.gather_send + a.gather_lse_offset + chunk_row * 4, &l, 4);
  }
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
