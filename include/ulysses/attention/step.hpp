// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What distributed_attention() hands the engine's attention kernel once per ring step
///        (AttentionStep, forward) and its backward (AttentionGradStep): q, k, v as strided
///        views of the head-sharded tensors, the step's ranges, mask, heads and global tokens,
///        and where the partial outputs go. Shaped like FlashAttention's flash_attn_func /
///        _flash_attn_forward (pointers + batch/row/head strides, causal, softmax_scale, out,
///        softmax_lse fp32 [B, H, S]). See docs/attention.md ("The step").
#pragma once

#include <cstddef>
#include <cstdint>

#include "../layout/element.hpp"
#include "../ring/schedule.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Strides of a 4-D view [B, rows, heads, dim] in ELEMENTS (the dim is contiguous, stride 1):
/// element (b, i, h, d) at base + b·batch + i·row + h·head + d. FlashAttention's
/// q_batch_stride, q_row_stride, q_head_stride.
struct AttentionStrides {
  std::int64_t batch = 0;  ///< elements between batches
  std::int64_t row = 0;    ///< elements between tokens (rows)
  std::int64_t head = 0;   ///< elements between heads
};

/// Strides of an fp32 LSE view [B, heads, rows] in elements: (b, h, i) at base + b·batch +
/// h·head + i (FlashAttention's softmax_lse [B, H, S] when contiguous).
struct LseStrides {
  std::int64_t batch = 0;  ///< elements between batches
  std::int64_t head = 0;   ///< elements between heads (rows are contiguous)
};

/// The global token indices of a step's rows: ascending ranges of global tokens, in row order;
/// row i of the step is global token global(i). Up to two ranges (a zigzag ring rank's two
/// chunks) sit in begin / length; more (packed documents: two chunks of every document, or a
/// balanced split's runs) are all in `runs` (count of them, SeqChunk::offset and length), which
/// the plan owns, and begin / length then hold the first two.
struct TokenRanges {
  int count = 0;                     ///< ranges (0: no rows)
  std::int64_t begin[2] = {0, 0};    ///< first global token of the first two ranges
  std::int64_t length[2] = {0, 0};   ///< tokens of the first two ranges
  const SeqChunk* runs = nullptr;    ///< all `count` ranges when count > 2 (else null)
  /// Rows in all: the ranges' lengths summed.
  std::int64_t rows() const {
    if (runs) {
      std::int64_t n = 0;
      for (int i = 0; i < count; ++i) n += runs[i].length;
      return n;
    }
    return (count > 0 ? length[0] : 0) + (count > 1 ? length[1] : 0);
  }
  /// The global token of row i (0 .. rows() − 1). @pre 0 <= i < rows(). O(count) with runs.
  std::int64_t global(std::int64_t i) const {
    if (runs) {
      for (int r = 0; r < count; ++r) {
        if (i < runs[r].length) return runs[r].offset + i;
        i -= runs[r].length;
      }
      return -1;
    }
    return i < length[0] ? begin[0] + i : begin[1] + (i - length[0]);
  }
};

/// The heads of one call, local to this rank's head-sharded tensors: query heads [q_begin,
/// q_begin + q_count) use kv heads [kv_begin, kv_begin + kv_count). The view pointers of the
/// step already start at q_begin and kv_begin; query head h of the call (0 .. q_count − 1) uses
/// kv head kv_of(h) of the call. distributed_attention() passes the rank's whole local range,
/// or one head band per call (DistributedAttentionOptions::bands).
struct AttentionHeads {
  std::int64_t q_begin = 0;          ///< first local query head of the call
  std::int64_t q_count = 0;          ///< query heads of the call (H_u for the whole range)
  std::int64_t kv_begin = 0;         ///< first local kv head they use
  std::int64_t kv_count = 0;         ///< kv heads of the call
  std::int64_t q_global = 0;         ///< global index of query head q_begin (RoPE tables, ALiBi slopes)
  std::int64_t kv_global = 0;        ///< global index of kv head kv_begin
  /// True when kv_of(h) = h / (q_count / kv_count): FlashAttention's GQA rule (q_count a
  /// multiple of kv_count), so its kernel takes the views as they are.
  bool grouped = true;
  const std::int64_t* kv_map = nullptr;  ///< kv_of() for each query head of the call (q_count entries; valid during the call)
  /// The kv head (of the call) that query head h (of the call) uses.
  std::int64_t kv_of(std::int64_t h) const { return kv_map ? kv_map[h] : h / (q_count / kv_count); }
};

/// One forward call of the engine's attention: queries [q_len rows] against keys/values
/// [kv_len rows] of one ring step (the whole sequence once for plain Ulysses), all B batches.
/// Inputs are of `type` (q's element type), strided views into the head-sharded tensors; the
/// engine writes the step's partial output and its LSE, which the library merges in step order.
struct AttentionStep {
  int step = 0;                ///< s, 0 .. steps − 1 (calls come in this order)
  int steps = 1;               ///< R (1: plain Ulysses)
  int source = 0;              ///< the ring rank whose kv block this step holds ((r − s) mod R)
  RingWork work;               ///< the step's ranges in ring-local rows (ring/schedule.hpp)
  /// none; causal: row i attends key k iff k <= i (q_len == kv_len here); or blocks (packed
  /// documents): row i attends key k iff one of `blocks` says so (RingBlock::attends), a row that
  /// no block covers attends nothing (leave its out 0 and lse −inf). A kernel that takes only a
  /// causal flag runs each block as one varlen sequence (cu_seqlens_q = q_begin, seqused_q = q_len,
  /// likewise k; causal = the block's mask).
  RingMask mask = RingMask::none;
  const RingBlock* blocks = nullptr;  ///< with mask == blocks: the step's rectangles (rows of the views), in order, disjoint
  std::int64_t block_count = 0;       ///< how many
  ElementType type = ElementType::float32;  ///< element type of q, k, v, out
  std::size_t elem_bytes = 4;  ///< bytes of one element of `type`
  std::int64_t batch = 1;      ///< B
  std::int64_t q_len = 0;      ///< query rows of the call (FlashAttention's seqlen_q)
  std::int64_t kv_len = 0;     ///< key/value rows (seqlen_k)
  std::int64_t head_dim = 0;   ///< D of q and k
  std::int64_t v_head_dim = 0; ///< Dv of v and out
  float softmax_scale = 1.0f;  ///< the scale of q·k (1/sqrt(D) unless the plan's options say otherwise)
  AttentionHeads heads;        ///< the call's heads (the views start at their first)
  TokenRanges q_tokens;        ///< the global tokens of the query rows
  TokenRanges kv_tokens;       ///< the global tokens of the key/value rows
  const void* q = nullptr;     ///< q [B, q_len, q_count, D] at q_stride
  const void* k = nullptr;     ///< k [B, kv_len, kv_count, D] at k_stride
  const void* v = nullptr;     ///< v [B, kv_len, kv_count, Dv] at v_stride
  AttentionStrides q_stride, k_stride, v_stride;  ///< their strides (elements)
  void* out = nullptr;         ///< write: the partial output [B, q_len, q_count, Dv] of `type` at out_stride
  AttentionStrides out_stride; ///< its strides (a head band's view: the whole tensor's)
  float* lse = nullptr;        ///< write: its LSE, fp32 [B, q_count, q_len] at lse_stride, natural log; −inf (or +inf / NaN) for a row with no key
  LseStrides lse_stride;       ///< its strides
  bool causal() const { return mask == RingMask::causal; }  ///< FlashAttention's causal flag (false for blocks: see them)
  /// Whether query row i attends kv row k (rows of the views): the brute-force form of the mask.
  bool attends(std::int64_t i, std::int64_t key) const {
    if (i < 0 || i >= q_len || key < 0 || key >= kv_len) return false;
    if (mask == RingMask::blocks) {
      for (std::int64_t b = 0; b < block_count; ++b)
        if (blocks[b].attends(i, key)) return true;
      return false;
    }
    return mask == RingMask::none || key <= i;
  }
};

/// One backward call of the engine's attention (FlashAttention-2's _flash_attn_backward): the
/// forward's views of the step, the merged output o and LSE of the whole ring (not the step's
/// partial), the output gradient do, and fp32 buffers for the step's partial gradients, zeroed
/// by the library before the call (write them, or add into them). The library adds dq into its
/// fp32 accumulator, dk|dv into the accumulator that travels with the block (RingGradRotation).
struct AttentionGradStep {
  AttentionStep fwd;           ///< the forward's step (q, k, v, ranges, mask, heads; out and lse null)
  const void* o = nullptr;     ///< the merged output [B, q_len, q_count, Dv] of fwd.type at o_stride (do's too)
  const void* dout = nullptr;  ///< do, the same rows and strides as o
  AttentionStrides o_stride;   ///< strides of o and dout
  const float* lse = nullptr;  ///< the merged LSE, fp32 [B, q_count, q_len] at lse_stride
  LseStrides lse_stride;       ///< its strides
  float* dq = nullptr;         ///< the step's dq, fp32 [B, q_len, q_count, D] contiguous (zeroed)
  float* dk = nullptr;         ///< the step's dk, fp32 [B, kv_len, kv_count, D] contiguous (zeroed)
  float* dv = nullptr;         ///< the step's dv, fp32 [B, kv_len, kv_count, Dv] contiguous (zeroed)
  AttentionStrides dq_stride, dk_stride, dv_stride;  ///< their strides (contiguous)
};

ULYSSES_NAMESPACE_END
