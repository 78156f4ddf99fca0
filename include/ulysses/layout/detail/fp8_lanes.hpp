// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The fp8 codec on vector lanes (layout/fp8.hpp's kernels): fp8_code() and fp8_value() of 16
///        lanes in AVX-512 and of 8 in AVX2, and the lanes of row_amax(). The same bits as the
///        scalar codec; written in intrinsics, not left to the compiler's vectoriser, so that a
///        build at -O2 runs as fast as one at -O3. Host only; nothing here where the CPU lacks AVX2.
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
/// 16 lanes of the 32-bit value v (the AVX-512 kernels' constants).
ULYSSES_TARGET_AVX512 inline __m512i u32x16(std::uint32_t v) { return _mm512_set1_epi32(static_cast<int>(v)); }
/// 8 lanes of the 32-bit value v (the AVX2 kernels' constants; a lambda would not inherit the target).
ULYSSES_TARGET_AVX2 inline __m256i u32x8(std::uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }
/// row_amax_loop()'s rule on 16 lanes in AVX-512, in intrinsics so that its speed does not depend
/// on the user's optimisation flags (GCC's -O2 leaves the loop scalar: 2.5x slower fp8 rows):
/// the running maximum m of the magnitudes as unsigned integers. A NaN's magnitude is above every
/// other (> 0x7f800000), so m tells at the end whether any lane was NaN: one AND and one max a
/// step, where a separate NaN mask cost two more operations on the port the codec needs.
struct Amax16 {
  __m512i m;
};
ULYSSES_TARGET_AVX512 inline void amax_add_x16(Amax16& a, __m512 x) {
  a.m = _mm512_maskz_max_epu32(0xffff, a.m, _mm512_and_si512(_mm512_castps_si512(x), u32x16(0x7fffffffu)));
}
/// The amax of the lanes seen: NaN when any was NaN (row_amax_loop()'s result, bit for bit).
ULYSSES_TARGET_AVX512 inline float amax_of_x16(const Amax16& a) {
  // halves, max, halves (not _mm512_reduce_max_epu32(): GCC 12's starts from an undefined vector)
  const __m256i h = _mm256_max_epu32(_mm512_maskz_extracti64x4_epi64(0xf, a.m, 0), _mm512_maskz_extracti64x4_epi64(0xf, a.m, 1));
  __m128i q = _mm_max_epu32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  q = _mm_max_epu32(q, _mm_shuffle_epi32(q, 0x4e));
  q = _mm_max_epu32(q, _mm_shuffle_epi32(q, 0xb1));
  const auto m = static_cast<std::uint32_t>(_mm_cvtsi128_si32(q));
  return bits_float(m > 0x7f800000u ? kFloatNanBits : m);
}
/// fp8_code() of 16 lanes in AVX-512, packed to bytes: the same codes (tests/layout/test_fp8.cpp
/// compares quantize_fp8() with fp8_code() over 101M floats; every float32 was checked once).
/// - normal: fp8_code()'s rounding of the magnitude's bits (the lowest kept bit added back for
///   ties to even), the exponent rebased in the same addition, min for the saturation;
/// - subnormal (below 2^(1 - B)): one float addition of 2^(1 - B - M + 23), whose ulp is the
///   subnormal step, rounds to nearest even (the default MXCSR mode); its bits less the addend's
///   are the code (2^M where it rounds up to the smallest normal, as fp8_code() gives);
/// - NaN: NanCode without the sign, through the min's mask and the sign's.
/// 15 vector operations (the compiler's vectorisation of fp8_code() spills and shuffles). All-lanes
/// masked forms: GCC 12's unmasked ones start from an undefined vector, which
/// -Wmaybe-uninitialized reports.
template <std::uint32_t M, std::uint32_t B, std::uint32_t MaxCode, std::uint32_t NanCode>
ULYSSES_TARGET_AVX512 inline __m128i fp8_code_x16(__m512 x) {
  constexpr std::uint32_t drop = 23u - M, min_normal = (128u - B) << 23, magic = (151u - B - M) << 23;
  constexpr __mmask16 all = 0xffff;
  const auto k = u32x16;
  const __m512i u = _mm512_castps_si512(x), ax = _mm512_and_si512(u, k(0x7fffffffu));
  const __mmask16 is_sub = _mm512_cmplt_epu32_mask(ax, k(min_normal)), not_nan = _mm512_cmple_epu32_mask(ax, k(0x7f800000u));
  const __m512i lsb = _mm512_and_si512(_mm512_maskz_srli_epi32(all, ax, drop), k(1u));
  const __m512i r = _mm512_add_epi32(_mm512_add_epi32(ax, lsb), k((1u << (drop - 1u)) - 1u - ((127u - B) << 23)));
  const __m512i normal = _mm512_mask_min_epu32(k(NanCode), not_nan, _mm512_maskz_srli_epi32(all, r, drop), k(MaxCode));
  const __m512 sum = _mm512_add_ps(_mm512_castsi512_ps(ax), _mm512_castsi512_ps(k(magic)));
  const __m512i sub = _mm512_sub_epi32(_mm512_castps_si512(sum), k(magic));
  const __m512i sign = _mm512_maskz_srli_epi32(not_nan, u, 24);  // 0x80 of it: the sign, none for NaN
  return _mm512_maskz_cvtepi32_epi8(all, _mm512_ternarylogic_epi32(_mm512_mask_blend_epi32(is_sub, normal, sub), sign, k(0x80u), 0xf8));
}
/// fp8_value() of 16 codes (one a 32-bit lane) in AVX-512, its operations one for one, times
/// the scale, a NaN made canonical: dequantize_codes()' values (tests/layout/test_fp8.cpp: every
/// code of both formats).
template <std::uint32_t M, std::uint32_t B, bool E4M3>
ULYSSES_TARGET_AVX512 inline __m512 fp8_value_x16(__m512i code, __m512 scale) {
  constexpr std::uint32_t top = (1u << (7u - M)) - 1u;
  constexpr __mmask16 all = 0xffff;
  const auto k = u32x16;
  const __m512i sign = _mm512_maskz_slli_epi32(all, _mm512_and_si512(code, k(0x80u)), 24), mag = _mm512_and_si512(code, k(0x7fu));
  const __m512i exp = _mm512_maskz_srli_epi32(all, mag, M), mant = _mm512_and_si512(mag, k((1u << M) - 1u));
  const __m512i normal = _mm512_or_si512(_mm512_or_si512(sign, _mm512_maskz_slli_epi32(all, _mm512_add_epi32(exp, k(127u - B)), 23)),
                                         _mm512_maskz_slli_epi32(all, mant, 23u - M));
  const __m512 sub_abs = _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(all, mant), _mm512_castsi512_ps(k((128u - B - M) << 23)));
  const __m512i sub = _mm512_or_si512(sign, _mm512_castps_si512(sub_abs));
  const __mmask16 is_special = E4M3 ? _mm512_cmpeq_epi32_mask(mag, k(0x7fu)) : _mm512_cmpeq_epi32_mask(exp, k(top));
  const __mmask16 is_sub = _mm512_cmpeq_epi32_mask(exp, k(0u)), has_mant = _mm512_cmpneq_epi32_mask(mant, k(0u));
  const __m512i spec = _mm512_or_si512(sign, _mm512_mask_mov_epi32(k(0x7f800000u), has_mant, k(0x7fc00000u)));
  const __m512i bits = _mm512_mask_mov_epi32(_mm512_mask_mov_epi32(normal, is_sub, sub), is_special, spec);
  const __m512 v = _mm512_mul_ps(_mm512_castsi512_ps(bits), scale);
  return _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_castsi512_ps(k(kFloatNanBits)));
}

/// fp8_code_x16() on 8 lanes in AVX2, the same operations with compares and blends for the masks
/// (signed compares: a magnitude's bits are below 2^31), each code in its lane's low byte.
template <std::uint32_t M, std::uint32_t B, std::uint32_t MaxCode, std::uint32_t NanCode>
ULYSSES_TARGET_AVX2 inline __m256i fp8_code_x8(__m256 x) {
  constexpr int drop = 23 - static_cast<int>(M);
  constexpr std::uint32_t min_normal = (128u - B) << 23, magic = (151u - B - M) << 23;
  const auto k = u32x8;
  const __m256i u = _mm256_castps_si256(x), ax = _mm256_and_si256(u, k(0x7fffffffu));
  const __m256i is_sub = _mm256_cmpgt_epi32(k(min_normal), ax), is_nan = _mm256_cmpgt_epi32(ax, k(0x7f800000u));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(ax, drop), k(1u));
  const __m256i r = _mm256_add_epi32(_mm256_add_epi32(ax, lsb), k((1u << (drop - 1)) - 1u - ((127u - B) << 23)));
  const __m256i normal = _mm256_min_epu32(_mm256_srli_epi32(r, drop), k(MaxCode));
  const __m256 sum = _mm256_add_ps(_mm256_castsi256_ps(ax), _mm256_castsi256_ps(k(magic)));
  const __m256i sub = _mm256_sub_epi32(_mm256_castps_si256(sum), k(magic));
  const __m256i sign = _mm256_andnot_si256(is_nan, _mm256_and_si256(_mm256_srli_epi32(u, 24), k(0x80u)));
  const __m256i code = _mm256_blendv_epi8(_mm256_blendv_epi8(normal, sub, is_sub), k(NanCode), is_nan);
  return _mm256_or_si256(code, sign);
}
/// The low bytes of 8 lanes of 32 bits, in order, in the low 8 bytes.
ULYSSES_TARGET_AVX2 inline __m128i low_bytes_x8(__m256i v) {
  const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i b = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, pick), _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
  return _mm256_castsi256_si128(b);
}
/// fp8_value_x16() on 8 codes (one a 32-bit lane) in AVX2, the same operations with blends for the
/// masks.
template <std::uint32_t M, std::uint32_t B, bool E4M3>
ULYSSES_TARGET_AVX2 inline __m256 fp8_value_x8(__m256i code, __m256 scale) {
  constexpr std::uint32_t top = (1u << (7u - M)) - 1u;
  const auto k = u32x8;
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(code, k(0x80u)), 24), mag = _mm256_and_si256(code, k(0x7fu));
  const __m256i exp = _mm256_srli_epi32(mag, static_cast<int>(M)), mant = _mm256_and_si256(mag, k((1u << M) - 1u));
  const __m256i normal = _mm256_or_si256(_mm256_or_si256(sign, _mm256_slli_epi32(_mm256_add_epi32(exp, k(127u - B)), 23)),
                                         _mm256_slli_epi32(mant, static_cast<int>(23u - M)));
  const __m256 sub_abs = _mm256_mul_ps(_mm256_cvtepi32_ps(mant), _mm256_castsi256_ps(k((128u - B - M) << 23)));
  const __m256i sub = _mm256_or_si256(sign, _mm256_castps_si256(sub_abs));
  const __m256i is_special = E4M3 ? _mm256_cmpeq_epi32(mag, k(0x7fu)) : _mm256_cmpeq_epi32(exp, k(top));
  const __m256i is_sub = _mm256_cmpeq_epi32(exp, _mm256_setzero_si256()), no_mant = _mm256_cmpeq_epi32(mant, _mm256_setzero_si256());
  const __m256i spec = _mm256_or_si256(sign, _mm256_blendv_epi8(k(0x7fc00000u), k(0x7f800000u), no_mant));
  const __m256i bits = _mm256_blendv_epi8(_mm256_blendv_epi8(normal, sub, is_sub), spec, is_special);
  const __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(bits), scale);
  return _mm256_blendv_ps(v, _mm256_castsi256_ps(k(kFloatNanBits)), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}
#endif
}  // namespace detail
ULYSSES_NAMESPACE_END
