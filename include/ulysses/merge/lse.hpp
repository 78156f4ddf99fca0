// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Merging partial attention outputs by their log-sum-exp (LSE): the pairwise (streaming)
///        step of a ring attention and the n-way merge of a decode exchange, with one arithmetic.
///
/// lse = log Σ exp(lse_i), out = Σ exp(lse_i − lse)·out_i, as a left fold of one pairwise step in
/// a fixed order, in fp32 with ulysses' own exp and log1p (merge/arith.hpp): the same bits on the
/// host and every GPU. A partial whose LSE is not finite (−inf, +inf, NaN) is empty. The rules,
/// the preconditions and the build flags they need: docs/headers.md, "merge/lse.hpp".
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../layout/element.hpp"
#include "../detail/limits.hpp"
#include "../version.hpp"
#include "arith.hpp"  // LseBase, the fp32 operations, exp2_nonpos(), log1p_unit()

ULYSSES_NAMESPACE_BEGIN


/// What one merge step does to the state.
enum class LseStepKind : std::int32_t {
  keep = 0,   ///< the contribution is empty (LSE −inf, +inf or NaN): the state is kept (its output is not read)
  take = 1,   ///< the state is empty (LSE not finite): it becomes the contribution, exactly
  blend = 2,  ///< out' = out·w_state + out_block·w_block
};

/// One merge step of a row: the merged LSE and the two weights (docs/headers.md, "merge/lse.hpp").
struct LseStep {
  float lse = 0;                       ///< the LSE after the step
  float w_state = 1;                   ///< weight of the state's output (blend)
  float w_block = 0;                   ///< weight of the contribution's output (blend)
  LseStepKind kind = LseStepKind::keep;  ///< keep, take or blend
};

/// The merge step of a row's state LSE `lse` with a contribution's LSE `lse_block`, in base `base`
/// (the scalar part of merge(); the same for every element of the row). Host and device.
/// Formula and sources: docs/headers.md, "merge/lse.hpp" (online softmax; FlashAttention-2 / ring attention's
/// rescaling; vLLM's merge_attn_states). Any LSE is accepted: a non-finite one (−inf, +inf, NaN)
/// is an empty partial (detail::lse_empty()): a non-finite `lse_block` gives keep with the state's
/// LSE (−inf when the state is empty too, never +inf or NaN), a non-finite state LSE with a finite
/// `lse_block` gives take. Finite inputs: the blend of docs/headers.md, "merge/lse.hpp".
ULYSSES_HOST_DEVICE inline LseStep lse_step(float lse, float lse_block, LseBase base = LseBase::natural) {
  LseStep s;
  if (detail::lse_empty(lse_block)) {
    s.lse = detail::lse_empty(lse) ? detail::neg_inf() : lse;
    s.kind = LseStepKind::keep;
    return s;
  }
  if (detail::lse_empty(lse)) {
    s.lse = lse_block;
    s.kind = LseStepKind::take;
    return s;
  }
  const bool state_hi = !(lse < lse_block);  // ties: the state is "hi" (both finite here)
  const float hi = state_hi ? lse : lse_block, lo = state_hi ? lse_block : lse;
  float d = detail::f_sub(lo, hi);
  if (base == LseBase::natural) d = detail::f_mul(d, 1.44269504088896341f);  // e^d = 2^(d·log2 e)
  const float e = detail::exp2_nonpos(d);
  const float sum = detail::f_add(1.0f, e);
  const float w_hi = detail::f_div(1.0f, sum), w_lo = detail::f_div(e, sum);
  s.lse = detail::f_add(hi, detail::log1p_unit(e, base));
  s.w_state = state_hi ? w_hi : w_lo;
  s.w_block = state_hi ? w_lo : w_hi;
  s.kind = LseStepKind::blend;
  return s;
}

/// One element of a merge step: the state's output element `out` merged with the contribution's
/// `out_block` (fp32) by step `s`. Host and device.
ULYSSES_HOST_DEVICE inline float lse_apply(const LseStep& s, float out, float out_block) {
  if (s.kind == LseStepKind::keep) return out;
  if (s.kind == LseStepKind::take) return out_block;
  return detail::f_add(detail::f_mul(out, s.w_state), detail::f_mul(out_block, s.w_block));
}

/// True for the element types merge() and merge_rows() read and write: float32, float16, bfloat16.
ULYSSES_HOST_DEVICE constexpr bool mergeable(ElementType t) {
  return t == ElementType::float32 || t == ElementType::float16 || t == ElementType::bfloat16;
}

namespace detail {

/// What with_merge_arith() hands with_sum_arith(): f, called for the fp32-accumulated types only.
template <class F>
struct MergeArithOnly {
  F& f;
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
  template <class A>
  ULYSSES_HOST_DEVICE void operator()(A a) const {
    if constexpr (sizeof(typename A::Acc) == sizeof(float)) f(a);
  }
};

/// Calls f(SumArith<t>{}) for a mergeable type t (float32, float16, bfloat16; nothing otherwise):
/// element.hpp's dispatch without float64. Host and device, whatever f is (the execution-space
/// check is off, as for with_sum_arith: f's own space decides where an instantiation can run).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class F>
ULYSSES_HOST_DEVICE inline void with_merge_arith(ElementType t, F&& f) {
  with_sum_arith(t, MergeArithOnly<F>{f});
}

/// Bytes of one element of a mergeable type (4 or 2; 0 otherwise): size_of() for host and device.
ULYSSES_HOST_DEVICE constexpr std::int64_t merge_elem_bytes(ElementType t) {
  return t == ElementType::float32 ? 4 : (t == ElementType::float16 || t == ElementType::bfloat16) ? 2 : 0;
}

/// The element part of one merge step (lse_apply() over a row, the branch out of the loop so
/// that it vectorises): acc[0..len) (fp32 state) absorbs the contribution's elements at x (of
/// `In`, packed) by step s. Host and device.
template <class In>
ULYSSES_HOST_DEVICE inline void apply_step(const LseStep& s, float* acc, const std::byte* x, int len) {
  constexpr std::int64_t in_bytes = sizeof(typename In::Bits);
  if (s.kind == LseStepKind::keep) return;
  if (s.kind == LseStepKind::take) {
    for (int k = 0; k < len; ++k) acc[k] = In::load(x + k * in_bytes);
    return;
  }
  const float ws = s.w_state, wb = s.w_block;
  for (int k = 0; k < len; ++k) acc[k] = f_add(f_mul(acc[k], ws), f_mul(In::load(x + k * in_bytes), wb));
}

/// The n-way merge of elements [d0, d0 + len) of a row, len <= N: the left fold of lse_step() over
/// i = 0..n−1 with an fp32 state; contribution i's row starts at row(i) (elements of `In`, packed)
/// and its LSE is lse(i); the result is stored at out (elements of `Out`, packed, starting at
/// element d0 of the row). Returns the merged LSE. Every chunking of a row gives the same bits
/// (the steps' scalars are the same for every element). Host and device.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <int N, class In, class Out, class RowAt, class LseAt>
ULYSSES_HOST_DEVICE inline float merge_chunk(int n, const RowAt& row, const LseAt& lse, std::int64_t d0, int len, std::byte* out,
                                             LseBase base) {
  constexpr std::int64_t in_bytes = sizeof(typename In::Bits), out_bytes = sizeof(typename Out::Bits);
  float acc[static_cast<std::size_t>(N)];
  for (int k = 0; k < len; ++k) acc[k] = 0.0f;
  float l = neg_inf();
  for (int i = 0; i < n; ++i) {
    const LseStep s = lse_step(l, lse(i), base);
    l = s.lse;
    if (s.kind == LseStepKind::keep) continue;
    float x[static_cast<std::size_t>(N)];
    In::template load_n<N>(row(i) + d0 * in_bytes, len, x);  // 16-byte loads where aligned (the same bits)
    if (s.kind == LseStepKind::take) {
      for (int k = 0; k < len; ++k) acc[k] = x[k];
    } else {  // apply_step()'s operations, in its order
      for (int k = 0; k < len; ++k) acc[k] = f_add(f_mul(acc[k], s.w_state), f_mul(x[k], s.w_block));
    }
  }
  Out::template store_n<N>(out + d0 * out_bytes, len, acc);
  return l;
}

/// The weights of one blend step as fold_tile() reads them (no initialisers: tables of them cost
/// nothing to declare, unlike LseStep's).
struct FoldWeights {
  float w_state;  ///< LseStep::w_state
  float w_block;  ///< LseStep::w_block
};

/// Elements of a row the host's fold keeps in one tile (fold_row()): 32 fp32 states, 8 SSE or 4
/// AVX registers.
inline constexpr int kFoldTile = 32;

/// Elements [d0, d0 + len) of a row's element fold, len <= W: steps s[0..n) applied in order to the
/// contributions' elements at x[i] (of `In`, packed), the result stored at out (of `Out`, packed,
/// element d0 of the row); n = 0 stores zeros. s holds the weights of the steps that change the
/// state only (LseStepKind::keep dropped), so step 0 is the take (s[0] unread) (the state becomes x[0] exactly: what
/// apply_step() does from the state 0) and every later step a blend. The per-element operations
/// of apply_step() in the same order (so the same bits), in one pass over the tile: the state
/// stays in registers (one load per contribution element, one store per output element), and
/// with len == W a compile-time trip count the compiler vectorises.
template <int W, class In, class Out>
ULYSSES_HOST_DEVICE inline void fold_tile(const FoldWeights* s, const std::byte* const* x, int n, std::int64_t d0, int len, std::byte* out) {
  constexpr std::int64_t in_bytes = sizeof(typename In::Bits), out_bytes = sizeof(typename Out::Bits);
  float acc[static_cast<std::size_t>(W)];
  if (n == 0) {
    for (int k = 0; k < len; ++k) acc[k] = 0.0f;
  } else {
    const std::byte* x0 = x[0] + d0 * in_bytes;
    for (int k = 0; k < len; ++k) acc[k] = In::load(x0 + k * in_bytes);
  }
  for (int i = 1; i < n; ++i) {
    const std::byte* xi = x[i] + d0 * in_bytes;
    const float ws = s[i].w_state, wb = s[i].w_block;  // a blend
    for (int k = 0; k < len; ++k) acc[k] = f_add(f_mul(acc[k], ws), f_mul(In::load(xi + k * in_bytes), wb));
  }
  for (int k = 0; k < len; ++k) Out::store(out + (d0 + k) * out_bytes, acc[k]);
}

/// The element fold of one row of dv elements, given its steps that change the state (s[0] the
/// take, the rest blends: see fold_tile()) and their contributions' rows x[0..n): the output row
/// at out. In tiles of kFoldTile elements; every tiling gives the same bits. Host and device.
template <class In, class Out>
ULYSSES_HOST_DEVICE inline void fold_row(const FoldWeights* s, const std::byte* const* x, int n, std::int64_t dv, std::byte* out) {
  std::int64_t d0 = 0;
  for (; d0 + kFoldTile <= dv; d0 += kFoldTile) fold_tile<kFoldTile, In, Out>(s, x, n, d0, kFoldTile, out);
  if (d0 < dv) fold_tile<kFoldTile, In, Out>(s, x, n, d0, static_cast<int>(dv - d0), out);
}


}  // namespace detail

/// The n-way merge of one row (the decode exchange's unpack): merges the n partial output rows
/// `row(i)` (dv elements of type in_type, contiguous) with LSEs `lse(i)`, i = 0..n−1 in that order,
/// and writes the merged row (dv elements of out_type, contiguous) to `out`; returns the merged
/// LSE. `row` and `lse` are callables (int i → const std::byte*, int i → float), so that a kernel
/// can read contributions from anywhere. The same bits as streaming i = 0..n−1 through merge().
/// All contributions empty (LSE −inf, +inf or NaN): the output row is 0, the returned LSE −inf.
/// Host and device.
/// @pre mergeable(in_type) and mergeable(out_type) (else nothing is written and −inf returned);
///      n >= 0, dv >= 0; out does not overlap a contribution.
template <class RowAt, class LseAt>
ULYSSES_HOST_DEVICE inline float merge_rows_with(int n, const RowAt& row, const LseAt& lse, ElementType in_type, std::int64_t dv,
                                                 std::byte* out, ElementType out_type, LseBase base = LseBase::natural) {
#if defined(__CUDA_ARCH__)
  constexpr int kChunk = 32;  // registers / local memory of one thread
#else
  constexpr int kChunk = 256;  // a whole row up to Dv = 256: the LSE steps run once per row and contribution
#endif
  float l = detail::neg_inf();
  detail::with_merge_arith(in_type, [&](auto in) {
    detail::with_merge_arith(out_type, [&](auto o) {
      using In = decltype(in);
      using Out = decltype(o);
#if !defined(__CUDA_ARCH__)
      if (n <= kMaxTableRanks) {  // the LSE fold once, then the elements in register tiles
        detail::FoldWeights steps[kMaxTableRanks];
        const std::byte* x[kMaxTableRanks];
        int m = 0;
        for (int i = 0; i < n; ++i) {
          const LseStep s = lse_step(l, lse(i), base);
          l = s.lse;
          if (s.kind == LseStepKind::keep) continue;
          steps[m] = {s.w_state, s.w_block};
          x[m++] = row(i);
        }
        detail::fold_row<In, Out>(steps, x, m, dv, out);
        return;
      }
#endif
      for (std::int64_t d0 = 0; d0 < dv; d0 += kChunk) {
        const int len = dv - d0 < kChunk ? static_cast<int>(dv - d0) : kChunk;
        l = detail::merge_chunk<kChunk, In, Out>(n, row, lse, d0, len, out, base);
      }
      if (dv == 0)  // the LSE alone
        for (int i = 0; i < n; ++i) l = lse_step(l, lse(i), base).lse;
    });
  });
  return l;
}

/// The n-way merge of one row from arrays: rows[i] the i-th partial output row (dv elements of
/// in_type), lses[i] its LSE, i = 0..n−1 in that order; writes the merged row (out_type) to out
/// and returns the merged LSE. See merge_rows_with(). Host and device.
/// @pre as merge_rows_with(); rows and lses hold n entries.
ULYSSES_HOST_DEVICE inline float merge_rows(const void* const* rows, ElementType in_type, const float* lses, int n, std::int64_t dv,
                                            void* out, ElementType out_type, LseBase base = LseBase::natural) {
  return merge_rows_with(
      n, [rows](int i) { return static_cast<const std::byte*>(rows[i]); }, [lses](int i) { return lses[i]; }, in_type, dv,
      static_cast<std::byte*>(out), out_type, base);
}

/// Rows merge_rows_batch() folds at once (their LSE steps interleaved).
inline constexpr int kMergeBatchRows = 4;

/// The n-way merge of g rows, each as merge_rows(), on the host: row k's contributions are
/// rows[k·n + i] (dv elements of in_type, contiguous) with LSEs lses[k·n + i], i = 0..n−1 in that
/// order; its merged row goes to outs[k] (dv elements of out_type) and, when out_lses is not null,
/// its merged LSE to out_lses[k]. Groups of kMergeBatchRows rows run their LSE folds interleaved
/// (independent dependency chains the CPU overlaps), then each row's elements in register tiles
/// (detail::fold_row()): the same bits as merge_rows() of each row, and as streaming them
/// through merge(). What the host decode executor and the bench's all-gather baseline run. Host.
/// @param g        number of rows (>= 0)
/// @param n        contributions per row (>= 0; more than kMaxTableRanks: row by row)
/// @param rows     g·n pointers: row k's contribution i at rows[k·n + i]
/// @param lses     g·n LSEs, the same order
/// @param in_type  element type of the contributions (float32, float16, bfloat16)
/// @param dv       elements per row (>= 0)
/// @param outs     g pointers: where row k's merged row goes (must not overlap a contribution)
/// @param out_type element type of the merged rows (rounded once)
/// @param out_lses g floats for the merged LSEs, or null
/// @param base     the LSEs' base
/// @pre mergeable(in_type) and mergeable(out_type) (else nothing is written).
inline void merge_rows_batch(int g, int n, const void* const* rows, const float* lses, ElementType in_type, std::int64_t dv,
                             void* const* outs, ElementType out_type, float* out_lses, LseBase base = LseBase::natural) {
  detail::with_merge_arith(in_type, [&](auto in) {
    detail::with_merge_arith(out_type, [&](auto o) {
      using In = decltype(in);
      using Out = decltype(o);
      for (int r0 = 0; r0 < g; r0 += kMergeBatchRows) {
        const int m = g - r0 < kMergeBatchRows ? g - r0 : kMergeBatchRows;
        if (n > kMaxTableRanks) {
          for (int k = 0; k < m; ++k) {
            const std::size_t at = static_cast<std::size_t>(r0 + k) * static_cast<std::size_t>(n);
            const float l = merge_rows(rows + at, in_type, lses + at, n, dv, outs[r0 + k], out_type, base);
            if (out_lses) out_lses[r0 + k] = l;
          }
          continue;
        }
        detail::FoldWeights steps[kMergeBatchRows][kMaxTableRanks];
        const std::byte* x[kMergeBatchRows][kMaxTableRanks];
        int cnt[kMergeBatchRows] = {};
        float l[kMergeBatchRows];
        for (int k = 0; k < kMergeBatchRows; ++k) l[k] = detail::neg_inf();
        for (int i = 0; i < n; ++i)
          for (int k = 0; k < m; ++k) {
            const std::size_t at = static_cast<std::size_t>(r0 + k) * static_cast<std::size_t>(n) + static_cast<std::size_t>(i);
            const LseStep s = lse_step(l[k], lses[at], base);
            l[k] = s.lse;
            if (s.kind == LseStepKind::keep) continue;
            steps[k][cnt[k]] = {s.w_state, s.w_block};
            x[k][cnt[k]++] = static_cast<const std::byte*>(rows[at]);
          }
        for (int k = 0; k < m; ++k) {
          detail::fold_row<In, Out>(steps[k], x[k], cnt[k], dv, static_cast<std::byte*>(outs[r0 + k]));
          if (out_lses) out_lses[r0 + k] = l[k];
        }
      }
    });
  });
}

/// The pairwise (streaming) merge of a ring attention step, in place: the state row `out` (dv fp32
/// elements) with LSE `lse` absorbs the block's partial output row `out_block` (dv elements of
/// `type`, contiguous) with LSE `lse_block`. Start a row with out = 0, lse = −inf (or with the
/// first block's values when its LSE is finite); after blocks 0..n−1 the state holds the same bits
/// as merge_rows() of them (then round it to 16 bits once, if needed). A block whose LSE is not
/// finite (−inf, +inf, NaN) is empty: out is not changed and out_block not read; a state LSE that
/// is not finite is empty as well and becomes −inf (so a row that saw no key ends with 0 and −inf
/// from the empty start, never +inf or NaN). Host and device.
/// @pre mergeable(type) (else the state is left unchanged); out does not overlap out_block.
ULYSSES_HOST_DEVICE inline void merge(float* out, float& lse, const void* out_block, ElementType type, float lse_block, std::int64_t dv,
                                      LseBase base = LseBase::natural) {
  if (!mergeable(type)) return;
  const LseStep s = lse_step(lse, lse_block, base);
  lse = s.lse;  // unchanged by a keep unless the state's LSE was +inf or NaN (then −inf)
  if (s.kind == LseStepKind::keep) return;
  detail::with_merge_arith(type, [&](auto a) {
    using A = decltype(a);
    const auto* x = static_cast<const std::byte*>(out_block);
    for (std::int64_t k = 0; k < dv; ++k) out[k] = lse_apply(s, out[k], A::load(x + k * static_cast<std::int64_t>(sizeof(typename A::Bits))));
  });
}

/// merge() with an fp32 block row.
ULYSSES_HOST_DEVICE inline void merge(float* out, float& lse, const float* out_block, float lse_block, std::int64_t dv,
                                      LseBase base = LseBase::natural) {
  merge(out, lse, static_cast<const void*>(out_block), ElementType::float32, lse_block, dv, base);
}

ULYSSES_NAMESPACE_END
