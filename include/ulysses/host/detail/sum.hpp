// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The host executor's sums: run_sum_range() adds the terms of a BlockOp::sum block in
///        order by the rules of layout/element.hpp, in batches on the stack, bfloat16 in
///        registers (SSE2, AVX2 where the CPU has it). Every path gives the same bits
///        (host/executor.hpp; docs/design.md, "Sum rules").
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../../layout/blocks.hpp"
#include "../../layout/element.hpp"
#include "../../layout/rows.hpp"
#include "copy_rows.hpp"

// The bfloat16 sums' AVX2 loop (sum_run_bf16 below): compiled for AVX2 by a target
// attribute (GCC, Clang; not in CUDA translation units, whose front end is not asked to), taken
// when the CPU has it (checked once at run time); SSE2 otherwise. The same bits either way.
#include "../../detail/cpu.hpp"  // ULYSSES_HOST_AVX2, host_has_avx2()
#if ULYSSES_HOST_AVX2
#include <immintrin.h>
#endif

ULYSSES_NAMESPACE_BEGIN

namespace detail {

#if ULYSSES_HOST_STREAMING
/// float → bfloat16 of 8 floats in two registers, SSE2 (the rounding of element.hpp
/// float_to_bfloat16: add 0x7fff plus the kept lowest bit, keep the upper half; NaN to 0x7fc0),
/// packed with a signed pack of the sign-extended upper halves (exact: they fit in 16 bits).
inline __m128i narrow_bf16x8(__m128 lo, __m128 hi) {
  const __m128i one = _mm_set1_epi32(1), bias = _mm_set1_epi32(0x7fff), qnan = _mm_set1_epi32(0x7fc0);
  auto half = [&](__m128 f) {
    const __m128i x = _mm_castps_si128(f);
    const __m128i lsb = _mm_and_si128(_mm_srli_epi32(x, 16), one);
    const __m128i r = _mm_srai_epi32(_mm_add_epi32(x, _mm_add_epi32(bias, lsb)), 16);
    const __m128i nan = _mm_castps_si128(_mm_cmpunord_ps(f, f));
    return _mm_or_si128(_mm_andnot_si128(nan, r), _mm_and_si128(nan, qnan));
  };
  return _mm_packs_epi32(half(lo), half(hi));
}
#endif

/// raw[i] = A::narrow(acc[i]) for i < m: a plain loop the compiler vectorises, except bfloat16 on
/// x86-64, whose 32-to-16-bit narrowing SSE2 has no unsigned pack for: there narrow_bf16x8, eight
/// lanes at a time. Same bits either way.
template <class A>
inline void narrow_batch(const typename A::Acc* acc, typename A::Bits* raw, std::int64_t m) {
  std::int64_t i = 0;
#if ULYSSES_HOST_STREAMING
  if constexpr (std::is_same_v<A, SumArith<ElementType::bfloat16>>) {
    for (; i + 8 <= m; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(raw + i), narrow_bf16x8(_mm_loadu_ps(acc + i), _mm_loadu_ps(acc + i + 4)));
  }
#endif
  for (; i < m; ++i) raw[i] = A::narrow(acc[i]);
}

#if ULYSSES_HOST_AVX2
/// sum_run_bf16's loop, 16 lanes at a time with AVX2: the first m - m % 16 elements; returns how
/// many it did. The 256-bit unpacks and pack work within each 128-bit half, so the widened
/// elements are permuted (0-3 and 8-11 low, 4-7 and 12-15 high) and the pack puts them back in order.
__attribute__((target("avx2"))) inline std::int64_t sum_run_bf16_avx2(std::byte* d, const std::byte* const* src, int n, std::int64_t m,
                                                                       bool streaming) {
  const __m256i zero = _mm256_setzero_si256(), one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff),
                qnan = _mm256_set1_epi32(0x7fc0);
  const bool nt = streaming && (reinterpret_cast<std::uintptr_t>(d) & 15) == 0;  // (stream_store_x32())
  std::int64_t i = 0;
  for (; i + 16 <= m; i += 16) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src[0] + 2 * i));
    __m256 lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, x)), hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, x));
    for (int j = 1; j < n; ++j) {
      const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src[j] + 2 * i));
      lo = _mm256_add_ps(lo, _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, y)));
      hi = _mm256_add_ps(hi, _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, y)));
    }
    __m256 f[2] = {lo, hi};
    __m256i h[2];
    for (int k = 0; k < 2; ++k) {  // narrow_bf16x8's rounding, 8 lanes (in the loop: a lambda would not be compiled for AVX2)
      const __m256i b = _mm256_castps_si256(f[k]);
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), one);
      const __m256i rounded = _mm256_srai_epi32(_mm256_add_epi32(b, _mm256_add_epi32(bias, lsb)), 16);
      h[k] = _mm256_blendv_epi8(rounded, qnan, _mm256_castps_si256(_mm256_cmp_ps(f[k], f[k], _CMP_UNORD_Q)));
    }
    const __m256i r = _mm256_packs_epi32(h[0], h[1]);
    if (nt) stream_store_x32(d + 2 * i, r);
    else _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + 2 * i), r);
  }
  return i;
}
#endif

#if ULYSSES_HOST_STREAMING
/// Most terms the fused bfloat16 sum takes (more go through run_sum_range_as' batches).
inline constexpr int kFusedSumTerms = 64;

/// m bfloat16 elements at d = the sum of the terms src[0..n) in order (((t0 + t1) + t2) + ...),
/// in float, rounded once: the rules of element.hpp, the bits of run_sum_range_as' batches. Eight
/// lanes at a time in registers (each term widened by a shift into the upper half, added, the
/// sum narrowed by narrow_bf16x8): no accumulator array, one load per term and element, one
/// store per element (non-temporal when `streaming` and d is 16-byte aligned; the caller fences).
inline void sum_run_bf16(std::byte* d, const std::byte* const* src, int n, std::int64_t m, bool streaming) {
  using A = SumArith<ElementType::bfloat16>;
  const __m128i zero = _mm_setzero_si128();
  const bool nt = streaming && (reinterpret_cast<std::uintptr_t>(d) & 15) == 0;
  std::int64_t i = 0;
#if ULYSSES_HOST_AVX2
  if (host_has_avx2()) i = sum_run_bf16_avx2(d, src, n, m, streaming);
#endif
  for (; i + 8 <= m; i += 8) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src[0] + 2 * i));
    __m128 lo = _mm_castsi128_ps(_mm_unpacklo_epi16(zero, x)), hi = _mm_castsi128_ps(_mm_unpackhi_epi16(zero, x));
    for (int j = 1; j < n; ++j) {
      const __m128i y = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src[j] + 2 * i));
      lo = _mm_add_ps(lo, _mm_castsi128_ps(_mm_unpacklo_epi16(zero, y)));
      hi = _mm_add_ps(hi, _mm_castsi128_ps(_mm_unpackhi_epi16(zero, y)));
    }
    const __m128i r = narrow_bf16x8(lo, hi);
    if (nt) _mm_stream_si128(reinterpret_cast<__m128i*>(d + 2 * i), r);
    else _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * i), r);
  }
  for (; i < m; ++i) {
    float acc = A::load(src[0] + 2 * i);
    for (int j = 1; j < n; ++j) acc = acc + A::load(src[j] + 2 * i);
    A::store(d + 2 * i, acc);
  }
}
#endif

/// The sum whose terms are g[0..g[0].sources), for the destination bytes [lo, hi) (multiples of
/// the element size, numbered as in run_block_range): every element is the sum of its terms in
/// order (((t0 + t1) + t2) + ...), added and rounded by the rules of element.hpp, written once.
/// One contiguous run (a row, or its part in the range) at a time, in batches of kSumBatch
/// elements: the first term widened into accumulators on the stack, each further term added to
/// them straight from its source, the results narrowed into a stack buffer (narrow_batch()) and
/// written with one copy (streaming stores when `streaming`; the caller fences). Each loop is a plain
/// loop over contiguous elements of one type (the compiler vectorises them); no allocation, no
/// division per row. bfloat16 on x86-64 (up to kFusedSumTerms terms) adds its terms in registers
/// instead (sum_run_bf16: a third of the instructions, no stack traffic), with the same bits.
/// @pre g[0].op == BlockOp::sum; 0 <= lo <= hi <= g[0].bytes()
template <class A>
void run_sum_range_as(const BlockCopy* g, const BufferTable& t, std::int64_t lo, std::int64_t hi, bool streaming) {
  constexpr std::int64_t kSumBatch = 512;
  using Acc = typename A::Acc;
  using Bits = typename A::Bits;
  constexpr std::int64_t E = sizeof(Bits);  // == c.elem_bytes (make_blocks): a constant, so that the loops vectorise
  const BlockCopy& c = g[0];
  const int n = c.sources;
  const std::int64_t R = c.row_bytes;
  std::byte* const dst_base = buffer_at(t, c.dst_buffer) + c.dst_offset;
  Acc acc[kSumBatch];
  Bits raw[kSumBatch];  // the narrowed batch, as stored
  if (lo >= hi) return;
  RowCursor at(c, lo / R);
  std::int64_t off = lo % R;  // where the range starts in its first row (every later row: at 0)
#if ULYSSES_HOST_STREAMING
  if constexpr (std::is_same_v<A, SumArith<ElementType::bfloat16>>) {
    if (n <= kFusedSumTerms) {  // bfloat16: the terms added in registers (sum_run_bf16), same bits
      const std::byte* src[kFusedSumTerms];
      for (std::int64_t pos = lo; pos < hi; off = 0) {
        const std::int64_t run = std::min(R - off, hi - pos);
        for (int j = 0; j < n; ++j) src[j] = buffer_at(t, g[j].src_buffer) + g[j].src_offset + at.offset(g[j], true) + off;
        sum_run_bf16(dst_base + at.offset(c, false) + off, src, n, run / E, streaming);
        pos += run;
        at.next(c);
      }
      return;
    }
  }
#endif
  for (std::int64_t pos = lo; pos < hi; off = 0) {
    const std::int64_t run = std::min(R - off, hi - pos);  // this row's bytes in the range
    std::byte* const d = dst_base + at.offset(c, false) + off;
    for (std::int64_t b = 0; b < run; b += kSumBatch * E) {  // batches of this run
      const std::int64_t m = std::min(kSumBatch, (run - b) / E);
      for (int j = 0; j < n; ++j) {
        const std::byte* s = buffer_at(t, g[j].src_buffer) + g[j].src_offset + at.offset(g[j], true) + off + b;
        if (j == 0)
          for (std::int64_t i = 0; i < m; ++i) acc[i] = A::load(s + i * E);
        else
          for (std::int64_t i = 0; i < m; ++i) acc[i] = acc[i] + A::load(s + i * E);
      }
      narrow_batch<A>(acc, raw, m);
#if ULYSSES_HOST_STREAMING
      if (streaming && m * E >= kStreamMinRow) {
        const auto pf = reinterpret_cast<std::uintptr_t>(raw);  // (the sources are read in order: no prefetch needed)
        stream_row(d + b, reinterpret_cast<const std::byte*>(raw), static_cast<std::size_t>(m * E), pf);
        continue;
      }
#endif
      std::memcpy(d + b, raw, static_cast<std::size_t>(m * E));
    }
    pos += run;
    at.next(c);
  }
  (void)streaming;
}

/// run_sum_range_as for the sum's element type (one dispatch per range, none per element).
inline void run_sum_range(const BlockCopy* g, const BufferTable& t, std::int64_t lo, std::int64_t hi, bool streaming = false) {
  with_sum_arith(g[0].type, [&](auto a) { run_sum_range_as<decltype(a)>(g, t, lo, hi, streaming); });
}

}  // namespace detail

ULYSSES_NAMESPACE_END
