// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The host executor of a ring attention's merge: one step's partial output block (out, LSE)
///        merged into a rank's running (out, LSE) over its [B, S_q, H, Dv] queries (RingMergeShape,
///        ring_merge_init(), ring_merge_block(), ring_merge_finish()), and the layout of the kv
///        block that travels the ring (RingKvBlock).
///
/// The arithmetic is merge/lse.hpp's merge() (fp32; empty contributions add nothing); merging in
/// step order gives the same bits on every run. See docs/ring.md ("Guarantees").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "../error.hpp"
#include "../layout/element.hpp"
#include "../merge/lse.hpp"
#include "../partition/heads.hpp"

ULYSSES_NAMESPACE_BEGIN

/// The shape of a rank's ring-attention output: B batches, S_q query tokens (its L_r ring-local
/// tokens), H heads (its query heads after seq→head), Dv elements a row.
/// The state: out fp32 [B, S_q, H, Dv] (bshd, contiguous: element (b, s, h, d) at
/// ((b·S_q + s)·H + h)·Dv + d) and lse fp32 [B, H, S_q] (FlashAttention's softmax_lse layout:
/// (b, h, s) at (b·H + h)·S_q + s).
struct RingMergeShape {
  std::int64_t B = 1;    ///< batches
  std::int64_t S_q = 0;  ///< query tokens
  std::int64_t H = 1;    ///< heads
  std::int64_t Dv = 1;   ///< elements of an output row
  std::int64_t out_elems() const { return B * S_q * H * Dv; }  ///< elements of out
  std::int64_t lse_elems() const { return B * H * S_q; }       ///< elements of lse
};

namespace detail {
inline void check_merge_shape(const RingMergeShape& s, const char* who) {
  if (s.B < 0 || s.S_q < 0 || s.H < 0 || s.Dv < 0)
    fail(Errc::invalid_shape, std::string(who) + ": B=" + std::to_string(s.B) + ", S_q=" + std::to_string(s.S_q) + ", H=" +
                                  std::to_string(s.H) + ", Dv=" + std::to_string(s.Dv) + " must be >= 0");
}
/// The head range of a merge: {0, -1} is all H heads. @throws Error(invalid_shape) outside [0, H).
inline HeadRun merge_heads(const RingMergeShape& s, HeadRun h, const char* who) {
  if (h.lo == 0 && h.hi == -1) return {0, s.H};
  if (h.lo < 0 || h.hi < h.lo || h.hi > s.H)
    fail(Errc::invalid_shape, std::string(who) + ": heads [" + std::to_string(h.lo) + ", " + std::to_string(h.hi) + ") are outside [0, " +
                                  std::to_string(s.H) + ")");
  return h;
}
}  // namespace detail

/// Empties the running state: out = 0, lse = −inf (no key seen). Host.
/// @param s   the state's shape (RingMergeShape)
/// @param out fp32 [B, S_q, H, Dv]
/// @param lse fp32 [B, H, S_q]
/// @throws Error(invalid_shape) a negative extent.
inline void ring_merge_init(const RingMergeShape& s, float* out, float* lse) {
  detail::check_merge_shape(s, "ring_merge_init");
  for (std::int64_t i = 0; i < s.out_elems(); ++i) out[i] = 0.0f;
  for (std::int64_t i = 0; i < s.lse_elems(); ++i) lse[i] = detail::neg_inf();
}

/// Merges one ring step's partial attention into the running state (merge/lse.hpp's merge() per
/// row): the block covers query rows [q_begin, q_begin + q_len) of the state. Host.
/// @param s          the state's shape (RingMergeShape)
/// @param out, lse    the state (see RingMergeShape)
/// @param out_block   the step's partial output [B, q_len, H, Dv], bshd contiguous, of `type`
/// @param lse_block   its LSE, fp32 [B, H, q_len] (−inf, or +inf / NaN as FlashAttention-2 gives
///                    for a fully masked row: the row saw no key at this step; its output row is
///                    not read, and the bits are those of −inf)
/// @param type        the element type of out_block (float32, float16, bfloat16)
/// @param q_begin, q_len the query rows of the state the block covers
/// @param base        the LSE's base (natural: FlashAttention; two: FlashInfer)
/// @param heads       the heads merged (a head band): [lo, hi) of [0, H); the others are left as they are
/// A block with q_len = 0 (an empty step, RingWork::empty()) changes nothing.
/// @throws Error(invalid_shape) a negative extent, or [q_begin, q_begin + q_len) outside [0, S_q),
///         or `heads` outside [0, H); Error(tensor_mismatch) `type` not mergeable (float32, float16, bfloat16).
inline void ring_merge_block(const RingMergeShape& s, float* out, float* lse, const void* out_block, ElementType type, const float* lse_block,
                             std::int64_t q_begin, std::int64_t q_len, LseBase base = LseBase::natural, HeadRun heads = {0, -1}) {
  detail::check_merge_shape(s, "ring_merge_block");
  if (q_begin < 0 || q_len < 0 || q_begin + q_len > s.S_q)
    detail::fail(Errc::invalid_shape, "ring_merge_block: query rows [" + std::to_string(q_begin) + ", " + std::to_string(q_begin + q_len) +
                                          ") are outside the state's [0, " + std::to_string(s.S_q) + ")");
  heads = detail::merge_heads(s, heads, "ring_merge_block");
  if (!mergeable(type))
    detail::fail(Errc::tensor_mismatch, std::string("ring_merge_block: partial outputs of ") + to_string(type) +
                                            " cannot be merged; use float32, float16 or bfloat16");
  const auto* x = static_cast<const std::byte*>(out_block);
  const std::int64_t eb = detail::merge_elem_bytes(type);
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t i = 0; i < q_len; ++i)
      for (std::int64_t h = heads.lo; h < heads.hi; ++h) {
        const std::int64_t row = ((b * s.S_q + q_begin + i) * s.H + h) * s.Dv;
        const std::int64_t brow = ((b * q_len + i) * s.H + h) * s.Dv;
        merge(out + row, lse[(b * s.H + h) * s.S_q + q_begin + i], x + brow * eb, type, lse_block[(b * s.H + h) * q_len + i], s.Dv, base);
      }
}

/// Writes the merged output, rounded once to `type` (float32: copied; 16-bit: to nearest, ties to
/// even), as [B, S_q, H, Dv] bshd contiguous at dst. Rows that saw no key (every step's LSE −inf,
/// +inf or NaN) are 0 (their LSE −inf). `heads` (a head band): only heads [lo, hi) of [0, H) are
/// written (default: all). Host.
/// @throws Error(invalid_shape) a negative extent, `heads` outside [0, H); Error(tensor_mismatch) `type` not mergeable.
inline void ring_merge_finish(const RingMergeShape& s, const float* out, void* dst, ElementType type, HeadRun heads = {0, -1}) {
  detail::check_merge_shape(s, "ring_merge_finish");
  heads = detail::merge_heads(s, heads, "ring_merge_finish");
  if (!mergeable(type))
    detail::fail(Errc::tensor_mismatch, std::string("ring_merge_finish: cannot write ") + to_string(type) + "; use float32, float16 or bfloat16");
  auto* d = static_cast<std::byte*>(dst);
  detail::with_merge_arith(type, [&](auto a) {
    using A = decltype(a);
    constexpr auto eb = static_cast<std::int64_t>(sizeof(typename A::Bits));
    if (heads.lo == 0 && heads.hi == s.H) {
      for (std::int64_t i = 0; i < s.out_elems(); ++i) A::store(d + i * eb, out[i]);
      return;
    }
    for (std::int64_t row = 0; row < s.B * s.S_q; ++row)
      for (std::int64_t i = (row * s.H + heads.lo) * s.Dv; i < (row * s.H + heads.hi) * s.Dv; ++i) A::store(d + i * eb, out[i]);
  });
}

/// The kv block that travels the ring: k [B, L, Hkv, D] then v [B, L, Hkv, Dv], each bshd contiguous,
/// back to back in one buffer (one message a step). L is the block's ring-local tokens (L_source,
/// RingPartition::ring_length()), Hkv the rank's kv heads after seq→head (the ring carries those
/// only: under GQA fewer than its query heads), element_bytes the size of one element.
struct RingKvBlock {
  std::int64_t B = 1;              ///< batches
  std::int64_t L = 0;              ///< tokens of the block
  std::int64_t Hkv = 1;            ///< kv heads
  std::int64_t D = 1;              ///< head dim of k
  std::int64_t Dv = 1;             ///< head dim of v
  std::size_t element_bytes = 2;   ///< bytes of one element (the same for k and v)
  /// Elements of k.
  std::int64_t k_elems() const { return B * L * Hkv * D; }
  /// Elements of v.
  std::int64_t v_elems() const { return B * L * Hkv * Dv; }
  /// Byte offset of k in the block (0).
  std::size_t k_offset() const { return 0; }
  /// Byte offset of v in the block (after k).
  std::size_t v_offset() const { return static_cast<std::size_t>(k_elems()) * element_bytes; }
  /// Bytes of the whole block (what one ring step sends).
  std::size_t bytes() const { return static_cast<std::size_t>(k_elems() + v_elems()) * element_bytes; }
};

ULYSSES_NAMESPACE_END
