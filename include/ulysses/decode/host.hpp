// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief HostDecodeExecutor: the decode exchange's passes (pack, unpack + merge, gather unpack)
///        with host loads and stores, on the calling thread.
///
/// It runs the bodies of decode/kernels.hpp in loops, so it is also the reference the CUDA
/// executor (cuda/merge.cuh) is compared with. Allocation-free; every call returns done.
#pragma once

#include <cstdint>

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
    const std::int64_t n = detail::decode_other_rows(a);
    for (std::int64_t r = 0; r < n; ++r) detail::decode_pack_unit(a, r, 0, 1);
  }

  /// Unpack + merge: every row of this rank's heads, merged over the P ranks' partials (its own
  /// in place, the others' from the receive region) into the output (and output LSE); for
  /// DecodeOutput::all_heads also into the merged chunk it sends.
  void merge(const DecodeArgs& a) const {
    constexpr int kChunk = 64;
    const std::int64_t n = detail::decode_own_rows(a);
    detail::with_merge_arith(a.partial_type, [&](auto in) {
      detail::with_merge_arith(a.out_type, [&](auto o) {
        for (std::int64_t r = 0; r < n; ++r)
          for (std::int64_t d0 = 0; d0 < a.Dv; d0 += kChunk) detail::decode_merge_unit_typed<kChunk, decltype(in), decltype(o)>(a, r, d0);
      });
    });
  }

  /// Gather unpack (DecodeOutput::all_heads): every row of the heads other ranks merged, from the
  /// gather-receive region into the output (and output LSE).
  void unpack_gathered(const DecodeArgs& a) const {
    const std::int64_t n = detail::decode_other_rows(a);
    for (std::int64_t r = 0; r < n; ++r) detail::decode_gather_unit(a, r, 0, 1);
  }
};

ULYSSES_NAMESPACE_END
