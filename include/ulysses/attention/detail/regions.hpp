// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The regions a distributed attention call carves out of the engine's `saved` and
///        workspace spans (each 64-byte aligned): their sizes (AttentionRegions, filled by
///        DistributedAttentionPlan) and the carving (AttentionCarve). docs/attention.md ("Buffers").
#pragma once

#include <cstddef>
#include <cstdint>

#include "../../error.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {
/// The buffers a call carves out of the engine's spans, in bytes, in order (each rounded up to 64).
struct AttentionRegions {
  std::size_t saved[4] = {};  // q_h, the own k|v block, o_h, lse
  std::size_t fwd[6] = {};    // kv0, kv1, merge acc (fp32), partial out, partial lse, exchange workspace
  std::size_t bwd[10] = {};   // do_h, kv0, kv1, g0, g1, dq acc, dq partial, dk|dv partial, dq|dk|dv in the element type, exchange workspace
};
constexpr std::size_t kAttentionAlign = 64;
inline std::size_t attention_round(std::size_t n) { return (n + kAttentionAlign - 1) / kAttentionAlign * kAttentionAlign; }
template <std::size_t N>
std::size_t attention_total(const std::size_t (&r)[N]) {
  std::size_t t = kAttentionAlign;  // (the span's own misalignment)
  for (std::size_t n : r) t += attention_round(n);
  return t;
}
/// Hands out the regions of one of the engine's spans in order, each 64-byte aligned.
class AttentionCarve {
 public:
  explicit AttentionCarve(const void* base)
      : p_(static_cast<std::byte*>(const_cast<void*>(base)) +
           (kAttentionAlign - reinterpret_cast<std::uintptr_t>(base) % kAttentionAlign) % kAttentionAlign) {}
  /// The next region of n bytes (null when n is 0).
  std::byte* take(std::size_t n) {
    std::byte* r = n ? p_ : nullptr;
    p_ += attention_round(n);
    return r;
  }

 private:
  std::byte* p_;
};

}  // namespace detail

ULYSSES_NAMESPACE_END
