// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief HostDecodeExecutor: the decode exchange's passes (pack, unpack + merge, gather unpack)
///        with host loads and stores, on the calling thread.
///
/// It runs the bodies of decode/kernels.hpp in loops, so it is also the reference the CUDA
/// executor (cuda/merge.cuh) is compared with. Allocation-free; every call returns done.
/// docs/decode.md.
#pragma once

#include <cstdint>
#include <cstring>

#include "../version.hpp"
#include "kernels.hpp"
#include "plan.hpp"

ULYSSES_NAMESPACE_BEGIN

/// The decode executor of host memory (see the decode executor concept in decode/exchange.hpp).
/// Stateless: one object may serve any number of plans and threads.
class HostDecodeExecutor {
 public:
  /// Host loads and stores, done when a call returns (decode/exchange.hpp's path choice).
  static constexpr bool runs_on_host = true;

  /// The plan's peer table as the args address it (host memory: plan.peers().data()).
  const DecodePeer* peer_table(const DecodePlan& plan) const { return plan.peers().data(); }

  /// Pack: every row of the heads other ranks merge, O and LSE, into their chunks of the send region.
  void pack(const DecodeArgs& a) const {
    if (a.partial_stride[2] == a.Dv) {  // heads contiguous in O_r (bshd, bshd views): one copy per (b, t, peer)
      const std::int64_t ein = detail::merge_elem_bytes(a.partial_type), row = a.Dv * ein;
      for (std::int64_t b = 0; b < a.B; ++b)
        for (std::int64_t t = 0; t < a.T; ++t) {
          const std::byte* o = a.partial + (b * a.partial_stride[0] + t * a.partial_stride[1]) * ein;
          const std::byte* l = a.lse + (b * a.lse_stride[0] + t * a.lse_stride[1]) * 4;
          for (int p = 0; p < a.P; ++p) {
            const DecodePeer& q = a.peers[p];
            if (p == a.rank || q.head_count == 0) continue;
            const std::int64_t k = (b * a.T + t) * q.head_count;  // the chunk's first row of (b, t)
            std::memcpy(a.send + q.send_offset + k * row, o + q.head_begin * row, static_cast<std::size_t>(q.head_count * row));
            for (std::int64_t j = 0; j < q.head_count; ++j)
              std::memcpy(a.send + q.send_lse_offset + (k + j) * 4, l + (q.head_begin + j) * a.lse_stride[2] * 4, 4);
          }
        }
      return;
    }
    const std::int64_t n = detail::decode_other_rows(a);
    for (std::int64_t r = 0; r < n; ++r) detail::decode_pack_unit(a, r, 0, 1);
  }

  /// Unpack + merge: every row of this rank's heads, merged over the P ranks' partials (its own
  /// in place, the others' from the receive region) into the output (and output LSE); for
  /// DecodeOutput::all_heads also into the merged chunk it sends.
  void merge(const DecodeArgs& a) const {
    const std::int64_t n = detail::decode_own_rows(a);
    if (a.P > kMaxTableRanks) {  // more contributions than the tables hold: row by row, the same bits
      for (std::int64_t r = 0; r < n; ++r)
        for (std::int64_t d0 = 0; d0 < a.Dv; d0 += 256) detail::decode_merge_unit<256>(a, r, d0);
      return;
    }
    for (std::int64_t r0 = 0; r0 < n; r0 += kMergeBatchRows) merge_group(a, r0, n - r0 < kMergeBatchRows ? static_cast<int>(n - r0) : kMergeBatchRows);
  }

  /// Gather unpack (DecodeOutput::all_heads): every row of the heads other ranks merged, from the
  /// gather-receive region into the output (and output LSE).
  void unpack_gathered(const DecodeArgs& a) const {
    const std::int64_t n = detail::decode_other_rows(a);
    for (std::int64_t r = 0; r < n; ++r) detail::decode_gather_unit(a, r, 0, 1);
  }

 private:

  /// Rows [r0, r0 + g) at once by merge_rows_batch() (merge/lse.hpp: their LSE folds interleaved,
  /// the elements in register tiles): each row's P contributions where DecodeMergeRow finds them,
  /// in ascending rank order, so the same bits as decode_merge_unit_typed().
  static void merge_group(const DecodeArgs& a, std::int64_t r0, int g) {
    const void* rows[kMergeBatchRows * kMaxTableRanks];
    float lses[kMergeBatchRows * kMaxTableRanks];
    void* outs[kMergeBatchRows];
    float l[kMergeBatchRows];
    for (int k = 0; k < g; ++k) {
      const detail::DecodeMergeRow m(a, r0 + k);
      for (int p = 0; p < a.P; ++p) {
        rows[k * a.P + p] = m.row(p);
        lses[k * a.P + p] = m.lse(p);
      }
      outs[k] = m.out();
    }
    merge_rows_batch(g, a.P, rows, lses, a.partial_type, a.Dv, outs, a.out_type, l, a.base);
    for (int k = 0; k < g; ++k) detail::DecodeMergeRow(a, r0 + k).finish(l[k], 0, static_cast<int>(a.Dv));
  }
};

ULYSSES_NAMESPACE_END
