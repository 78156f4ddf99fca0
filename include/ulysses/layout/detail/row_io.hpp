// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The one-rounding load and store of a head row in double (layout/transform.hpp's row
///        transforms run between them): load_row(), store_row(), round_row(), round_to(), and
///        rounding to odd (float_round_odd(): a later rounding to 16 bits then rounds once).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../../detail/cpu.hpp"
#include "../element.hpp"
#include "row_lanes.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {
/// double → float rounded to odd (truncate, then set the last bit when inexact): a later rounding
/// to a type of at most 22 fraction bits (bfloat16, float16) then rounds once, as if from the
/// double (Boldo & Melquiond, "When double rounding is odd", 2005). NaN and infinities pass.
inline float float_round_odd(double d) {
  const float f = static_cast<float>(d);
  const double back = static_cast<double>(f);
  const std::uint32_t inexact = back != d && d == d ? 1u : 0u;  // (branch-free: the loops over rows vectorise)
  const std::uint32_t away = (back < 0 ? -back : back) > (d < 0 ? -d : d) ? 1u : 0u;  // rounded away from zero
  return bits_float((float_bits(f) - (inexact & away)) | inexact);
}

/// float_round_odd(d) for d of magnitude in [2^-126, 2^128), ±0, ±infinity or NaN (a NaN stays
/// a NaN, its payload not kept): the double's 29 bits below float precision cleared, the lowest
/// kept bit set when any of them was set (truncation, then odd when inexact), then converted to
/// float exactly. Integer operations on the double's lanes: it vectorises without narrowing
/// masks, as float_round_odd() must. Elsewhere (float subnormals, beyond FLT_MAX) it differs:
/// outside_float_normals() says where.
inline float float_round_odd_normal(double d) {
  std::uint64_t b;
  std::memcpy(&b, &d, 8);
  const std::uint64_t low = b & 0x1fffffffull;
  b = (b & ~0x1fffffffull) | (static_cast<std::uint64_t>(low != 0) << 29);
  std::memcpy(&d, &b, 8);
  return static_cast<float>(d);
}
/// Non-zero where float_round_odd_normal(d) may differ from float_round_odd(d): 0 < |d| < 2^-126
/// or 2^128 <= |d| < infinity. On the double's bits (its biased exponent e: [897, 1150] is the
/// float normal range; 0 with a zero mantissa is ±0; 2047 is infinity or NaN), so that an OR of
/// it over a loop vectorises.
inline std::uint64_t outside_float_normals(double d) {
  std::uint64_t b;
  std::memcpy(&b, &d, 8);
  const std::uint64_t e = (b >> 52) & 0x7ffu;
  return static_cast<std::uint64_t>(e - 897u > 253u) & static_cast<std::uint64_t>(e != 2047u) & static_cast<std::uint64_t>((b << 1) != 0);
}

/// Loads n elements of `type` at p (misaligned allowed) into row, exactly.
/// @pre type is float16, bfloat16, float32 or float64
inline void load_row(ElementType type, const std::byte* p, double* row, std::int64_t n) {
  // One copy of the row's bytes into a typed buffer, then AVX2 lanes (bfloat16, float32:
  // detail/row_lanes.hpp) and a plain loop for the rest.
  constexpr std::int64_t kChunk = 256;
  with_sum_arith(type, [&](auto a) {
    using A = decltype(a);
    using Bits = typename A::Bits;
    Bits b[kChunk];
    for (std::int64_t i0 = 0; i0 < n; i0 += kChunk) {
      const std::int64_t m = n - i0 < kChunk ? n - i0 : kChunk;
      std::memcpy(b, p + i0 * static_cast<std::int64_t>(sizeof(Bits)), static_cast<std::size_t>(m) * sizeof(Bits));
      std::int64_t i = 0;
#if ULYSSES_HOST_AVX2
      if constexpr (std::is_same_v<A, SumArith<ElementType::bfloat16>>) i = host_has_avx2() ? bf16_to_double_avx2(b, row + i0, m) : 0;
      if constexpr (std::is_same_v<A, SumArith<ElementType::float32>>) i = host_has_avx2() ? float_to_double_avx2(b, row + i0, m) : 0;
#endif
      for (; i < m; ++i) row[i0 + i] = static_cast<double>(A::widen(b[i]));
    }
  });
}

/// The element of `type` nearest to x (one rounding, ties to even; a NaN the canonical NaN of
/// element.hpp), as stored bits widened back to double: what a store then load gives.
/// @pre type is float16, bfloat16, float32 or float64
inline double round_to(ElementType type, double x) {
  switch (type) {
    case ElementType::float64: return x;  // (a NaN is stored as the canonical NaN: SumArith::narrow)
    case ElementType::float32: return x != x ? static_cast<double>(bits_float(0x7fc00000u)) : static_cast<double>(static_cast<float>(x));
    case ElementType::bfloat16:
      return static_cast<double>(SumArith<ElementType::bfloat16>::widen(SumArith<ElementType::bfloat16>::narrow(float_round_odd(x))));
    case ElementType::float16:
      return static_cast<double>(SumArith<ElementType::float16>::widen(SumArith<ElementType::float16>::narrow(float_round_odd(x))));
    case ElementType::opaque: break;
  }
  return x;
}

/// o[i] = float_round_odd(r[i]), i < m: the plain loops. The AVX2 and AVX-512 twins below do
/// the same operations in intrinsics (the same bits), so that their speed does not depend on the
/// user's optimisation flags (GCC's -O2 leaves these loops scalar: 4x slower).
ULYSSES_ALWAYS_INLINE inline void round_odd_n(const double* r, float* o, std::int64_t m) {
  std::uint64_t outside = 0;  // float_round_odd_normal() first (cheaper); all again where a value is outside its range
  for (std::int64_t i = 0; i < m; ++i) {
    o[i] = float_round_odd_normal(r[i]);
    outside |= outside_float_normals(r[i]);
  }
  if (outside)
    for (std::int64_t i = 0; i < m; ++i) o[i] = float_round_odd(r[i]);
}
#if ULYSSES_HOST_AVX2
/// round_odd_n() 8 lanes a step: float_round_odd_normal() (the low 29 bits cleared, bit 29 set
/// where any was set, then an exact conversion) and outside_float_normals() on the lanes' bits,
/// the tail in one masked step; all again by float_round_odd() where a lane is outside.
ULYSSES_TARGET_AVX512 inline void round_odd_n_avx512(const double* r, float* o, std::int64_t m) {
  const __m512i low = _mm512_set1_epi64(0x1fffffff), odd = _mm512_set1_epi64(0x20000000);
  __mmask8 outside = 0;
  for (std::int64_t i = 0; i < m; i += 8) {
    const auto k = static_cast<__mmask8>(m - i >= 8 ? 0xff : (1u << (m - i)) - 1u);  // zero lanes: not outside
    const __m512i b = _mm512_maskz_loadu_epi64(k, r + i);
    const __m512i kept = _mm512_maskz_andnot_epi64(0xff, low, b);  // (masked: GCC 12's unmasked andnot warns)
    const __m512i t = _mm512_mask_or_epi64(kept, _mm512_test_epi64_mask(b, low), kept, odd);
    _mm256_mask_storeu_ps(o + i, k, _mm512_maskz_cvtpd_ps(0xff, _mm512_castsi512_pd(t)));
    const __m512i e = _mm512_and_si512(_mm512_maskz_srli_epi64(0xff, b, 52), _mm512_set1_epi64(0x7ff));
    const __mmask8 off = _mm512_cmpgt_epu64_mask(_mm512_sub_epi64(e, _mm512_set1_epi64(897)), _mm512_set1_epi64(253));
    const __mmask8 finite = _mm512_cmpneq_epi64_mask(e, _mm512_set1_epi64(2047));
    const __m512i b2 = _mm512_add_epi64(b, b);  // b << 1: zero only for ±0
    outside = static_cast<__mmask8>(outside | (off & finite & _mm512_test_epi64_mask(b2, b2)));
  }
  if (outside)
    for (std::int64_t i = 0; i < m; ++i) o[i] = float_round_odd(r[i]);
}
/// The same in AVX2, 4 lanes a step (signed compares: the exponent field is below 2^11), the tail
/// one by one.
ULYSSES_TARGET_AVX2 inline void round_odd_n_avx2(const double* r, float* o, std::int64_t m) {
  const __m256i low = _mm256_set1_epi64x(0x1fffffff), zero = _mm256_setzero_si256();
  __m256i outside = zero;
  std::int64_t i = 0;
  for (; i + 4 <= m; i += 4) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + i));
    const __m256i exact = _mm256_cmpeq_epi64(_mm256_and_si256(b, low), zero);
    const __m256i t = _mm256_or_si256(_mm256_andnot_si256(low, b), _mm256_andnot_si256(exact, _mm256_set1_epi64x(0x20000000)));
    _mm_storeu_ps(o + i, _mm256_cvtpd_ps(_mm256_castsi256_pd(t)));
    const __m256i e = _mm256_and_si256(_mm256_srli_epi64(b, 52), _mm256_set1_epi64x(0x7ff));
    const __m256i off = _mm256_or_si256(_mm256_cmpgt_epi64(_mm256_set1_epi64x(897), e), _mm256_cmpgt_epi64(e, _mm256_set1_epi64x(1150)));
    const __m256i special = _mm256_or_si256(_mm256_cmpeq_epi64(e, _mm256_set1_epi64x(2047)), _mm256_cmpeq_epi64(_mm256_add_epi64(b, b), zero));
    outside = _mm256_or_si256(outside, _mm256_andnot_si256(special, off));
  }
  bool any = !_mm256_testz_si256(outside, outside);
  for (; i < m; ++i) {
    o[i] = float_round_odd_normal(r[i]);
    any = any || outside_float_normals(r[i]) != 0;
  }
  if (any)  // all again, as round_odd_n() does (the same bits: a NaN's payload too)
    for (std::int64_t j = 0; j < m; ++j) o[j] = float_round_odd(r[j]);
}
#endif
/// round_odd_n() through the widest twin this CPU runs.
inline void round_odd_to(const double* r, float* o, std::int64_t m) {
#if ULYSSES_HOST_AVX2
  if (host_has_avx512()) return round_odd_n_avx512(r, o, m);
  if (host_has_avx2()) return round_odd_n_avx2(r, o, m);
#endif
  round_odd_n(r, o, m);
}

/// row[i] = round_to(type, row[i]) for i < n, with one dispatch for the row (AVX2 lanes for
/// float32 and bfloat16, detail/row_lanes.hpp; plain loops otherwise).
inline void round_row(ElementType type, double* row, std::int64_t n) {
  constexpr std::int64_t kChunk = 256;
  with_sum_arith(type, [&](auto a) {
    using A = decltype(a);
    using Acc = typename A::Acc;
    if constexpr (std::is_same_v<Acc, double>) {
      (void)row;
    } else if constexpr (sizeof(typename A::Bits) == 4) {
      std::int64_t i = 0;
#if ULYSSES_HOST_AVX2
      if (host_has_avx2()) i = round_float_double_avx2(row, n);
#endif
      for (; i < n; ++i) row[i] = static_cast<double>(static_cast<float>(row[i]));  // (NaN stays NaN)
    } else {
      float f[kChunk];
      for (std::int64_t i0 = 0; i0 < n; i0 += kChunk) {
        const std::int64_t m = n - i0 < kChunk ? n - i0 : kChunk;
        round_odd_to(row + i0, f, m);
        std::int64_t i = 0;
#if ULYSSES_HOST_AVX2
        if constexpr (std::is_same_v<A, SumArith<ElementType::bfloat16>>) i = host_has_avx2() ? bf16_round_double_avx2(f, row + i0, m) : 0;
#endif
        for (; i < m; ++i) row[i0 + i] = static_cast<double>(A::widen(A::narrow(f[i])));
      }
    }
  });
}

/// Stores row (n values) as elements of `type` at p, each rounded once (round_to()).
inline void store_row(ElementType type, std::byte* p, const double* row, std::int64_t n) {
  constexpr std::int64_t kChunk = 256;
  with_sum_arith(type, [&](auto a) {
    using A = decltype(a);
    using Acc = typename A::Acc;
    using Bits = typename A::Bits;
    Bits b[kChunk];
    for (std::int64_t i0 = 0; i0 < n; i0 += kChunk) {
      const std::int64_t m = n - i0 < kChunk ? n - i0 : kChunk;
      const double* r = row + i0;
      std::int64_t i = 0;  // (AVX2 lanes for float32 and bfloat16: detail/row_lanes.hpp)
      if constexpr (std::is_same_v<Acc, double>) {
        for (; i < m; ++i) b[i] = A::narrow(r[i]);
      } else if constexpr (sizeof(Bits) == 4) {
#if ULYSSES_HOST_AVX2
        i = host_has_avx2() ? double_to_float_avx2(r, b, m) : 0;
#endif
        for (; i < m; ++i) b[i] = A::narrow(static_cast<float>(r[i]));
      } else {
        float f[kChunk];
        round_odd_to(r, f, m);
#if ULYSSES_HOST_AVX2
        if constexpr (std::is_same_v<A, SumArith<ElementType::bfloat16>>) i = host_has_avx2() ? float_to_bf16_avx2(f, b, m) : 0;
#endif
        for (; i < m; ++i) b[i] = A::narrow(f[i]);
      }
      std::memcpy(p + i0 * static_cast<std::int64_t>(sizeof(Bits)), b, static_cast<std::size_t>(m) * sizeof(Bits));
    }
  });
}
}  // namespace detail

ULYSSES_NAMESPACE_END
