// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The row path's conversions on vector lanes (layout/transform.hpp's load_row, store_row
///        and round_row): bfloat16 and float32 rows to and from double, 8 elements a step in AVX2.
///        The same bits as the SumArith loops they replace; intrinsics, so that a build at -O2
///        (which leaves those loops scalar) and one at -O3 (which vectorises them for SSE2 only)
///        both get AVX2's width. Host only; nothing here where the CPU lacks AVX2.
#pragma once

#include <cstdint>

#include "../../detail/cpu.hpp"
#include "../element.hpp"
#if ULYSSES_HOST_AVX2
#include <immintrin.h>
#endif

ULYSSES_NAMESPACE_BEGIN
namespace detail {
#if ULYSSES_HOST_AVX2
/// 8 floats to 8 doubles at row (cvtps2pd: exact; a NaN stays a NaN, as a scalar conversion).
ULYSSES_TARGET_AVX2 inline void store_doubles_x8(double* row, __m256 f) {
  _mm256_storeu_pd(row, _mm256_cvtps_pd(_mm256_castps256_ps128(f)));
  _mm256_storeu_pd(row + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
}
/// bfloat16_to_float() of 8 elements (the bits shifted into a float's upper half).
ULYSSES_TARGET_AVX2 inline __m256 bf16_widen_x8(const std::uint16_t* b) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b))), 16));
}
/// float_to_bfloat16_canonical() of 8 lanes, each in its lane's low 16 bits (sign-extended):
/// ties to even by the lowest kept bit, a NaN the canonical 0x7fc0.
ULYSSES_TARGET_AVX2 inline __m256i bf16_narrow_x8(__m256 f) {
  const __m256i x = _mm256_castps_si256(f);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srai_epi32(_mm256_add_epi32(x, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q)));
}
/// row[i] = bfloat16_to_float(b[i]) as double, i < m - m % 8; @returns how many it did.
ULYSSES_TARGET_AVX2 inline std::int64_t bf16_to_double_avx2(const std::uint16_t* b, double* row, std::int64_t m) {
  std::int64_t i = 0;
  for (; i + 8 <= m; i += 8) store_doubles_x8(row + i, bf16_widen_x8(b + i));
  return i;
}
/// f[i] = bfloat16_to_float(b[i]), i < m - m % 8; @returns how many it did.
ULYSSES_TARGET_AVX2 inline std::int64_t bf16_to_float_avx2(const std::uint16_t* b, float* f, std::int64_t m) {
  std::int64_t i = 0;
  for (; i + 8 <= m; i += 8) _mm256_storeu_ps(f + i, bf16_widen_x8(b + i));
  return i;
}
/// row[i] = b[i] (float32 bits) as double, i < m - m % 8; @returns how many it did.
ULYSSES_TARGET_AVX2 inline std::int64_t float_to_double_avx2(const std::uint32_t* b, double* row, std::int64_t m) {
  std::int64_t i = 0;
  for (; i + 8 <= m; i += 8) store_doubles_x8(row + i, _mm256_loadu_ps(reinterpret_cast<const float*>(b + i)));
  return i;
}
/// b[i] = float_to_bfloat16_canonical(f[i]), i < m - m % 8; @returns how many it did.
ULYSSES_TARGET_AVX2 inline std::int64_t float_to_bf16_avx2(const float* f, std::uint16_t* b, std::int64_t m) {
  std::int64_t i = 0;
  for (; i + 8 <= m; i += 8) {
    const __m256i h = bf16_narrow_x8(_mm256_loadu_ps(f + i));
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(h, h), 0x08);  // (the pack works by 128-bit halves)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b + i), _mm256_castsi256_si128(packed));
  }
  return i;
}
/// row[i] = bfloat16_to_float(float_to_bfloat16_canonical(f[i])) as double (round_row()'s
/// bfloat16 step), i < m - m % 8; @returns how many it did.
ULYSSES_TARGET_AVX2 inline std::int64_t bf16_round_double_avx2(const float* f, double* row, std::int64_t m) {
  std::int64_t i = 0;
  for (; i + 8 <= m; i += 8) store_doubles_x8(row + i, _mm256_castsi256_ps(_mm256_slli_epi32(bf16_narrow_x8(_mm256_loadu_ps(f + i)), 16)));
  return i;
}
/// b[i] = the float32 bits of (float) r[i], a NaN the canonical 0x7fc00000 (SumArith<float32>'s
/// narrow() of the conversion), i < m - m % 8; @returns how many it did.
ULYSSES_TARGET_AVX2 inline std::int64_t double_to_float_avx2(const double* r, std::uint32_t* b, std::int64_t m) {
  std::int64_t i = 0;
  for (; i + 8 <= m; i += 8) {
    const __m256 f = _mm256_set_m128(_mm256_cvtpd_ps(_mm256_loadu_pd(r + i + 4)), _mm256_cvtpd_ps(_mm256_loadu_pd(r + i)));
    const __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000));
    _mm256_storeu_ps(reinterpret_cast<float*>(b + i), _mm256_blendv_ps(f, nan, _mm256_cmp_ps(f, f, _CMP_UNORD_Q)));
  }
  return i;
}
/// row[i] = (double)(float) row[i] (round_row()'s float32 step; a NaN stays a NaN), i < m - m % 4;
/// @returns how many it did.
ULYSSES_TARGET_AVX2 inline std::int64_t round_float_double_avx2(double* row, std::int64_t m) {
  std::int64_t i = 0;
  for (; i + 4 <= m; i += 4) _mm256_storeu_pd(row + i, _mm256_cvtps_pd(_mm256_cvtpd_ps(_mm256_loadu_pd(row + i))));
  return i;
}
#endif
}  // namespace detail
ULYSSES_NAMESPACE_END
