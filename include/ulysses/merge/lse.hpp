// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Merging partial attention outputs by their log-sum-exp (LSE): the pairwise (streaming)
///        step of a ring attention and the n-way merge of a decode exchange, with one arithmetic.
///
/// Attention of a query row over a set of keys K = K_0 ∪ K_1 ∪ ... (disjoint) can be computed per
/// part: part i gives the partial output out_i = Σ_{k∈K_i} softmax_i(k)·v_k (normalised over its
/// own keys) and its log-sum-exp lse_i = log Σ_{k∈K_i} exp(q·k·scale). The whole is
///
///     lse = log(Σ_i exp(lse_i)),      out = Σ_i exp(lse_i − lse) · out_i
///
/// (the online softmax of Milakov & Gimelshein, "Online normalizer calculation for softmax",
/// arXiv:1805.02867, 2018; the rescaling FlashAttention-2 (Dao, arXiv:2307.08691) does between
/// its KV blocks and ring attention (Liu et al., arXiv:2310.01889) between its ring steps; vLLM's
/// `merge_attn_states` and its decode-context-parallel `dcp_a2a_lse_reduce`, TensorRT-LLM's Helix
/// and SGLang's DCP between ranks).
///
/// The arithmetic (the same in every form here, on the host and on the GPU):
/// - everything in fp32; 16-bit partial outputs (fp16, bf16) are widened exactly
///   (layout/element.hpp) and a 16-bit result is rounded once, at the end (to nearest, ties to
///   even; a NaN becomes the canonical quiet NaN);
/// - the merge is a left fold of one pairwise step, over the contributions in a FIXED order
///   (ascending rank for the decode exchange, ascending step for a ring): the state (out, lse)
///   starts empty (0, −inf), and each step merges one (out_i, lse_i) into it (lse_step()). So a
///   ring that streams i = 0..n−1 through merge() and the n-way merge_rows() give the same bits,
///   and so does every backend, transport and executor;
/// - one step, state (o, l) and contribution (x, li): if li is empty (−inf; also +inf or NaN, see
///   below) the state is kept (x is not read: an empty KV shard's output may be NaN or garbage and
///   still adds nothing); else if l is empty the state becomes (x, li) exactly; else with hi = max(l, li), lo = min(l, li) (hi = l on
///   a tie), e = exp(lo − hi) ∈ (0, 1], s = 1 + e:
///       l' = hi + log1p(e),  o' = o·w_l + x·w_li,  w_hi = 1/s, w_lo = e/s
///   (w_l is w_hi when l is the larger, else w_lo). Each product and sum is rounded separately
///   (no fused multiply-add: device code uses __fmul_rn / __fadd_rn / __fdiv_rn, which the
///   compiler never contracts);
/// - exp and log1p are ulysses' own (detail::exp2_nonpos, detail::log1p_unit: a degree-7 Taylor
///   polynomial of 2^f on |f| ≤ 1/2 and the atanh series of log(1+e) on e ∈ [0, 1], both within
///   about 2 ulp) made of correctly rounded fp32 operations only, so the host and every GPU give
///   the same bits (libm's and CUDA's expf/logf differ in their last bits). exp(lo − hi) is
///   flushed to 0 below 2^−126 (a weight that small changes no fp32 output of a finite partial);
/// - an EMPTY partial is one whose LSE is not finite: −inf, +inf (what FlashAttention-2's forward
///   returns for a fully masked row) or NaN (some kernels' value there); FlashInfer's rule, and
///   vLLM's mapping of +inf to −inf before it merges (C18). An empty contribution is kept out of
///   the fold exactly as −inf is (its output row is not read), so a partial with +inf or NaN gives
///   the same bits as the same partial with −inf, and every finite input the bits it gave before.
///   A state whose LSE is not finite is empty too (it takes the next finite contribution);
/// - with every contribution empty (no key anywhere, e.g. every rank's KV shard empty for that
///   row) the output is 0 and the LSE −inf (never +inf or NaN): documented, never NaN;
/// - LseBase::two (FlashInfer's convention, lse = log2 Σ 2^lse_i) uses 2^x and log2 in place of
///   exp and log; nothing else changes.
/// Preconditions: partial outputs of finite-LSE contributions are finite (any LSE is accepted).
/// Build ulysses code without -ffast-math / --use_fast_math, and for the host's bits to equal the
/// GPU's also without FMA contraction across statements (GCC's default -ffp-contract=fast
/// contracts o·w + x·w' on aarch64, e.g. GH200, and on x86-64 with -mfma / -march=native): the
/// ulysses CMake target and ulysses.pc add -ffp-contract=off. Host and device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../layout/element.hpp"
#include "../detail/limits.hpp"
#include "../version.hpp"

ULYSSES_NAMESPACE_BEGIN

/// The base of a log-sum-exp: natural (FlashAttention, vLLM, TensorRT-LLM: lse = log Σ e^s) or 2
/// (FlashInfer: lse = log2 Σ 2^s).
enum class LseBase : std::int32_t {
  natural = 0,  ///< lse = ln Σ exp(s)
  two = 1,      ///< lse = log2 Σ 2^s
};

/// Name of an LSE base ("natural", "two").
inline const char* to_string(LseBase b) noexcept { return b == LseBase::two ? "two" : "natural"; }

namespace detail {

/// fp32 operations rounded to nearest one by one, never contracted into a fused multiply-add
/// (on the device the _rn intrinsics, which nvcc does not contract; on the host plain operators).
ULYSSES_HOST_DEVICE inline float f_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
ULYSSES_HOST_DEVICE inline float f_add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
ULYSSES_HOST_DEVICE inline float f_sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
ULYSSES_HOST_DEVICE inline float f_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

/// −infinity as a float (host and device, no <cmath> or <limits> needed).
ULYSSES_HOST_DEVICE inline float neg_inf() { return bits_float(0xff800000u); }

/// +infinity as a float (host and device).
ULYSSES_HOST_DEVICE inline float pos_inf() { return bits_float(0x7f800000u); }

/// True when `lse` marks an empty partial (no key): −inf, +inf or NaN, i.e. not finite (see the
/// file comment; FlashAttention-2 returns +inf for a fully masked row). Host and device.
ULYSSES_HOST_DEVICE inline bool lse_empty(float lse) { return !(lse > neg_inf() && lse < pos_inf()); }

/// 2^x for x <= 0, within about 2 ulp; 0 for x <= −126 (flushed); NaN for NaN.
/// x = n + f with n = round(x) (an integer ≥ −126) and |f| ≤ 1/2 exactly (Sterbenz), 2^f by its
/// Taylor polynomial of degree 7 in Horner form (truncation below 6e−9), times 2^n by exponent bits.
ULYSSES_HOST_DEVICE inline float exp2_nonpos(float x) {
  if (!(x > -126.0f)) return x == x ? 0.0f : x;
  const int n = static_cast<int>(f_sub(x, 0.5f));  // round to nearest for x in (−126, 0] (truncation toward 0)
  const float f = f_sub(x, static_cast<float>(n));  // exact
  // c_k = ln(2)^k / k!, k = 7 .. 1 (fp32-rounded).
  float p = 1.5252734e-05f;
  p = f_add(f_mul(p, f), 1.5403530e-04f);
  p = f_add(f_mul(p, f), 1.3333558e-03f);
  p = f_add(f_mul(p, f), 9.6181291e-03f);
  p = f_add(f_mul(p, f), 5.5504109e-02f);
  p = f_add(f_mul(p, f), 2.4022651e-01f);
  p = f_add(f_mul(p, f), 6.9314718e-01f);
  p = f_add(f_mul(p, f), 1.0f);
  return f_mul(p, bits_float(static_cast<std::uint32_t>(n + 127) << 23));
}

/// log(1 + e) for e in [0, 1], in base `base` (natural or 2), within about 2 ulp: with t = e/(2+e)
/// ∈ [0, 1/3], log(1+e) = 2·atanh(t) = 2t + 2t·(t²/3 + t⁴/5 + ... + t¹⁴/15) (truncation below 2e−9),
/// times log2(e) for base 2.
ULYSSES_HOST_DEVICE inline float log1p_unit(float e, LseBase base) {
  const float t = f_div(e, f_add(2.0f, e)), z = f_mul(t, t);
  float p = 1.0f / 15.0f;
  p = f_add(f_mul(p, z), 1.0f / 13.0f);
  p = f_add(f_mul(p, z), 1.0f / 11.0f);
  p = f_add(f_mul(p, z), 1.0f / 9.0f);
  p = f_add(f_mul(p, z), 1.0f / 7.0f);
  p = f_add(f_mul(p, z), 1.0f / 5.0f);
  p = f_add(f_mul(p, z), 1.0f / 3.0f);
  const float two_t = f_mul(base == LseBase::two ? 2.8853900817779268f : 2.0f, t);  // 2·log2(e)·t or 2t
  return f_add(two_t, f_mul(two_t, f_mul(p, z)));  // the small tail added last
}

}  // namespace detail

/// What one merge step does to the state.
enum class LseStepKind : std::int32_t {
  keep = 0,   ///< the contribution is empty (LSE −inf, +inf or NaN): the state is kept (its output is not read)
  take = 1,   ///< the state is empty (LSE not finite): it becomes the contribution, exactly
  blend = 2,  ///< out' = out·w_state + out_block·w_block
};

/// One merge step of a row: the merged LSE and the two weights (see the file comment).
struct LseStep {
  float lse = 0;                       ///< the LSE after the step
  float w_state = 1;                   ///< weight of the state's output (blend)
  float w_block = 0;                   ///< weight of the contribution's output (blend)
  LseStepKind kind = LseStepKind::keep;  ///< keep, take or blend
};

/// The merge step of a row's state LSE `lse` with a contribution's LSE `lse_block`, in base `base`
/// (the scalar part of merge(); the same for every element of the row). Host and device.
/// Formula and sources: the file comment (online softmax; FlashAttention-2 / ring attention's
/// rescaling; vLLM's merge_attn_states). Any LSE is accepted: a non-finite one (−inf, +inf, NaN)
/// is an empty partial (detail::lse_empty()): a non-finite `lse_block` gives keep with the state's
/// LSE (−inf when the state is empty too, never +inf or NaN), a non-finite state LSE with a finite
/// `lse_block` gives take. Finite inputs: the blend of the file comment.
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

/// Most contributions per row that the host's step tables hold (merge_rows_with(), merge_rows_batch());
/// beyond it the fold runs in chunks (merge_chunk()), the same bits.
inline constexpr int kMergeStepsMax = kMaxTableRanks;  // the one limit (detail/limits.hpp)

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
      if (n <= detail::kMergeStepsMax) {  // the LSE fold once, then the elements in register tiles
        detail::FoldWeights steps[detail::kMergeStepsMax];
        const std::byte* x[detail::kMergeStepsMax];
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
/// @param n        contributions per row (>= 0; more than detail::kMergeStepsMax: row by row)
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
        if (n > detail::kMergeStepsMax) {
          for (int k = 0; k < m; ++k) {
            const std::size_t at = static_cast<std::size_t>(r0 + k) * static_cast<std::size_t>(n);
            const float l = merge_rows(rows + at, in_type, lses + at, n, dv, outs[r0 + k], out_type, base);
            if (out_lses) out_lses[r0 + k] = l;
          }
          continue;
        }
        detail::FoldWeights steps[kMergeBatchRows][detail::kMergeStepsMax];
        const std::byte* x[kMergeBatchRows][detail::kMergeStepsMax];
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
