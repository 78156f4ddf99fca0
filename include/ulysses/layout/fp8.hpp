// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The OCP FP8 codec (E4M3FN, E5M2) and per-row fp8 scales: float ↔ fp8 bits, rounded to
///        nearest, ties to even, saturating; the scale of a row floored at FLT_MIN (fault case C23).
///
/// Host and device give the same bytes (integer bit manipulation and IEEE division and
/// multiplication only; no -ffast-math / --use_fast_math / -ftz=true). The rules: docs/headers.md,
/// "fp8 codec (layout/fp8.hpp)".
#pragma once

#include <cstdint>
#include <cstring>

#include "../detail/cpu.hpp"
#include "../version.hpp"
#include "detail/fp8_lanes.hpp"
#include "element.hpp"
#if ULYSSES_HOST_AVX2
#include <immintrin.h>
#endif

ULYSSES_NAMESPACE_BEGIN

/// An OCP 8-bit floating-point format (OCP "OFP8" specification, 2023).
enum class Fp8Format : int {
  e4m3 = 1,  ///< E4M3FN: 4 exponent bits (bias 7), 3 mantissa bits; max 448, no infinity, NaN = S.1111.111
  e5m2 = 2,  ///< E5M2: 5 exponent bits (bias 15), 2 mantissa bits; max 57344; IEEE-like infinities and NaNs
};

/// Name of an fp8 format: "e4m3" or "e5m2" ("?" for any other value).
inline const char* to_string(Fp8Format f) noexcept {
  switch (f) {
    case Fp8Format::e4m3: return "e4m3";
    case Fp8Format::e5m2: return "e5m2";
  }
  return "?";
}

namespace detail {

/// The constants of an fp8 format: mantissa bits, exponent bias, the largest finite magnitude's
/// code, the canonical NaN code (sign clear).
struct Fp8Params {
  std::uint32_t mant_bits;
  std::uint32_t bias;
  std::uint32_t max_code;
  std::uint8_t nan_code;
};

/// The constants of f (any value other than e4m3 is taken as e5m2).
ULYSSES_HOST_DEVICE inline Fp8Params fp8_params(Fp8Format f) {
  if (f == Fp8Format::e4m3) return Fp8Params{3u, 7u, 0x7eu, 0x7fu};
  return Fp8Params{2u, 15u, 0x7bu, 0x7eu};
}

/// Magnitude bits (sign clear) of the fp8 value nearest |x| for a finite |x| below the format's
/// smallest normal: a subnormal or zero code, rounded to nearest, ties to even.
/// @param ax  the float32 bits of |x|, below the format's smallest normal
/// @param p   the format's constants
ULYSSES_HOST_DEVICE inline std::uint32_t fp8_subnormal_code(std::uint32_t ax, const Fp8Params& p) {
  const std::uint32_t e = ax >> 23;  // biased float32 exponent
  if (e == 0) return 0;              // float32 zero or subnormal: far below half the smallest fp8 step
  // |x| = m * 2^(e - 150); the fp8 step is 2^(1 - bias - mant_bits): |x| / step = m >> shift.
  const std::uint32_t shift = 151u - p.bias - p.mant_bits - e;
  if (shift > 24) return 0;  // |x| < step / 2: rounds to zero
  const std::uint32_t m = (ax & 0x7fffffu) | 0x800000u;
  std::uint32_t q = m >> shift;
  const std::uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // q == 2^mant_bits is the smallest normal's code
  return q;
}

/// float_to_fp8() of a format given as constants (M mantissa bits, bias B, the largest finite
/// and the NaN code), without branches, so that a row's loop vectorises: the normal code by the
/// same integer rounding, the subnormal code by scaling |x| exactly to units of the smallest step
/// and rounding to an integer with the 2^23 addend (nearest, ties to even), the NaN and saturation
/// by selects. The same bits as float_to_fp8() for every float32 (checked over all of them).
template <std::uint32_t M, std::uint32_t B, std::uint32_t MaxCode, std::uint32_t NanCode>
ULYSSES_HOST_DEVICE inline std::uint8_t fp8_code(float x) {
  const std::uint32_t u = float_bits(x), ax = u & 0x7fffffffu, sign = (u >> 24) & 0x80u;
  constexpr std::uint32_t drop = 23u - M, min_normal = (128u - B) << 23;
  const std::uint32_t is_sub = 0u - static_cast<std::uint32_t>(ax < min_normal);   // all ones: a subnormal code
  const std::uint32_t is_nan = 0u - static_cast<std::uint32_t>(ax > 0x7f800000u);  // all ones: NaN
  std::uint32_t r = ax - ((127u - B) << 23);
  r += (1u << (drop - 1u)) - 1u + ((r >> drop) & 1u);
  const std::uint32_t n0 = r >> drop, over = 0u - static_cast<std::uint32_t>(n0 > MaxCode);
  const std::uint32_t normal = (MaxCode & over) | (n0 & ~over);
  // |x| / 2^(1 - B - M), exact, for the subnormal range only (others: 0), rounded to an integer.
  const float units = bits_float(ax & is_sub) * bits_float((127u + B + M - 1u) << 23);
  const auto sub = static_cast<std::uint32_t>(static_cast<std::int32_t>((units + 8388608.0f) - 8388608.0f));
  const std::uint32_t code = sign | (sub & is_sub) | (normal & ~is_sub);
  return static_cast<std::uint8_t>((NanCode & is_nan) | (code & ~is_nan));
}

/// quantize_fp8()'s loops (fp8_code() per element): the device's and the CPU without AVX2's, and
/// the reference of the AVX2 and AVX-512 kernels (detail/fp8_lanes.hpp).
ULYSSES_ALWAYS_INLINE ULYSSES_HOST_DEVICE inline void quantize_codes(const float* x, std::int64_t n, float scale, Fp8Format f,
                                                                     std::uint8_t* out) {
  if (f == Fp8Format::e4m3) {
    for (std::int64_t i = 0; i < n; ++i) out[i] = fp8_code<3, 7, 0x7e, 0x7f>(x[i] / scale);
  } else {
    for (std::int64_t i = 0; i < n; ++i) out[i] = fp8_code<2, 15, 0x7b, 0x7e>(x[i] / scale);
  }
}
/// row_amax()'s loop, written once: magnitudes compare as unsigned integers, with no branch, so
/// that it vectorises (with AVX2's unsigned max in its twin).
ULYSSES_ALWAYS_INLINE ULYSSES_HOST_DEVICE inline float row_amax_loop(const float* x, std::int64_t n) {
  std::uint32_t m = 0, nan = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t a = float_bits(x[i]) & 0x7fffffffu;
    nan |= a > 0x7f800000u ? 1u : 0u;
    m = a > m ? a : m;
  }
  return bits_float(nan ? kFloatNanBits : m);
}
#if ULYSSES_HOST_AVX2
ULYSSES_TARGET_AVX512 inline float row_amax_avx512(const float* x, std::int64_t n) {
  Amax16 a{_mm512_setzero_si512()};
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) amax_add_x16(a, _mm512_loadu_ps(x + i));
  if (i < n) amax_add_x16(a, _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << (n - i)) - 1u), x + i));  // zeros: no effect
  return amax_of_x16(a);
}
/// The same in AVX2, 8 lanes a step (a NaN known by its magnitude, as in amax_add_x16()), the tail
/// by row_amax_loop().
ULYSSES_TARGET_AVX2 inline float row_amax_avx2(const float* x, std::int64_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  __m256i m = _mm256_setzero_si256();
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), abs_mask));
  std::uint32_t lanes[8];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes), m);
  std::uint32_t r = float_bits(row_amax_loop(x + i, n - i));  // NaN bits when the tail has one
  for (std::uint32_t l : lanes) r = l > r ? l : r;
  return bits_float(r > 0x7f800000u ? kFloatNanBits : r);
}
/// quantize_codes() of one format in AVX-512: 16 elements a step (x / scale, then fp8_code_x16()),
/// the tail in one masked step.
template <std::uint32_t M, std::uint32_t B, std::uint32_t MaxCode, std::uint32_t NanCode>
ULYSSES_TARGET_AVX512 inline void quantize_format_avx512(const float* x, std::int64_t n, float scale, std::uint8_t* out) {
  const __m512 s = _mm512_set1_ps(scale);
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), fp8_code_x16<M, B, MaxCode, NanCode>(_mm512_div_ps(_mm512_loadu_ps(x + i), s)));
  if (i < n) {
    const auto m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm_mask_storeu_epi8(out + i, m, fp8_code_x16<M, B, MaxCode, NanCode>(_mm512_div_ps(_mm512_maskz_loadu_ps(m, x + i), s)));
  }
}
ULYSSES_TARGET_AVX512 inline void quantize_fp8_avx512(const float* x, std::int64_t n, float scale, Fp8Format f, std::uint8_t* out) {
  if (f == Fp8Format::e4m3) return quantize_format_avx512<3, 7, 0x7e, 0x7f>(x, n, scale, out);
  quantize_format_avx512<2, 15, 0x7b, 0x7e>(x, n, scale, out);
}
/// quantize_codes() of one format in AVX2: 8 elements a step (fp8_code_x8()), the tail by the loop.
template <std::uint32_t M, std::uint32_t B, std::uint32_t MaxCode, std::uint32_t NanCode>
ULYSSES_TARGET_AVX2 inline void quantize_format_avx2(const float* x, std::int64_t n, float scale, std::uint8_t* out) {
  const __m256 s = _mm256_set1_ps(scale);
  const std::int64_t body = n > 0 ? n - n % 8 : 0;
  for (std::int64_t i = 0; i < body; i += 8)
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), low_bytes_x8(fp8_code_x8<M, B, MaxCode, NanCode>(_mm256_div_ps(_mm256_loadu_ps(x + i), s))));
  for (std::int64_t i = body; i < n; ++i) out[i] = fp8_code<M, B, MaxCode, NanCode>(x[i] / scale);
}
ULYSSES_TARGET_AVX2 inline void quantize_fp8_avx2(const float* x, std::int64_t n, float scale, Fp8Format f, std::uint8_t* out) {
  if (f == Fp8Format::e4m3) return quantize_format_avx2<3, 7, 0x7e, 0x7f>(x, n, scale, out);
  quantize_format_avx2<2, 15, 0x7b, 0x7e>(x, n, scale, out);
}
#endif

/// fp8_to_float() of a format given as constants (M mantissa bits, bias B; E4M3: e4m3's NaN
/// encoding, else e5m2's infinities and NaNs), without branches, so that a row's loop vectorises:
/// the same bits for each of the 256 codes (tests/layout/test_fp8.cpp).
template <std::uint32_t M, std::uint32_t B, bool E4M3>
ULYSSES_HOST_DEVICE inline float fp8_value(std::uint32_t code) {
  constexpr std::uint32_t top = (1u << (7u - M)) - 1u;  // the all-ones exponent field
  const std::uint32_t sign = (code & 0x80u) << 24, mag = code & 0x7fu, exp = mag >> M, mant = mag & ((1u << M) - 1u);
  const std::uint32_t normal = sign | ((exp + 127u - B) << 23) | (mant << (23u - M));
  const std::uint32_t sub = sign | float_bits(static_cast<float>(static_cast<std::int32_t>(mant)) * bits_float((128u - B - M) << 23));
  const std::uint32_t is_special = 0u - static_cast<std::uint32_t>(E4M3 ? mag == 0x7fu : exp == top);  // all ones: NaN or infinity
  const std::uint32_t is_sub = 0u - static_cast<std::uint32_t>(exp == 0);                              // all ones: zero or subnormal
  const std::uint32_t spec = sign | (0x7f800000u + ((0u - static_cast<std::uint32_t>(mant != 0)) & 0x400000u));
  return bits_float((spec & is_special) | (sub & is_sub) | (normal & ~(is_special | is_sub)));
}
/// dequantize_fp8()'s loops (fp8_value() per code, times the scale, a NaN made canonical): the
/// device's and the CPU without AVX2's, the AVX2 kernel's tail, and the kernels' reference.
ULYSSES_ALWAYS_INLINE ULYSSES_HOST_DEVICE inline void dequantize_codes(const std::uint8_t* q, std::int64_t n, float scale, Fp8Format f,
                                                                       float* out) {
  const float nan = bits_float(kFloatNanBits);
  float o[64];  // (written in runs of 64 to a local array: the codes, which are bytes, cannot alias it)
  for (std::int64_t i0 = 0; i0 < n; i0 += 64) {
    const std::int64_t m = n - i0 < 64 ? n - i0 : 64;
    const std::uint8_t* c = q + i0;
    if (f == Fp8Format::e4m3) {
      for (std::int64_t i = 0; i < m; ++i) {
        const float v = fp8_value<3, 7, true>(c[i]) * scale;
        o[i] = v != v ? nan : v;
      }
    } else {
      for (std::int64_t i = 0; i < m; ++i) {
        const float v = fp8_value<2, 15, false>(c[i]) * scale;
        o[i] = v != v ? nan : v;
      }
    }
    if (m == 64)
      std::memcpy(out + i0, o, sizeof(o));  // (a fixed size: inline vector moves)
    else
      std::memcpy(out + i0, o, static_cast<std::size_t>(m) * sizeof(float));
  }
}
#if ULYSSES_HOST_AVX2
/// dequantize_codes() of one format in AVX-512: 16 codes a step, the tail in one masked step.
template <std::uint32_t M, std::uint32_t B, bool E4M3>
ULYSSES_TARGET_AVX512 inline void dequantize_format_avx512(const std::uint8_t* q, std::int64_t n, float scale, float* out) {
  const __m512 s = _mm512_set1_ps(scale);
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i c = _mm512_maskz_cvtepu8_epi32(0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i)));
    _mm512_storeu_ps(out + i, fp8_value_x16<M, B, E4M3>(c, s));
  }
  if (i < n) {
    const auto m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512i c = _mm512_maskz_cvtepu8_epi32(0xffff, _mm_maskz_loadu_epi8(m, q + i));
    _mm512_mask_storeu_ps(out + i, m, fp8_value_x16<M, B, E4M3>(c, s));
  }
}
ULYSSES_TARGET_AVX512 inline void dequantize_fp8_avx512(const std::uint8_t* q, std::int64_t n, float scale, Fp8Format f, float* out) {
  if (f == Fp8Format::e4m3) return dequantize_format_avx512<3, 7, true>(q, n, scale, out);
  dequantize_format_avx512<2, 15, false>(q, n, scale, out);
}
/// dequantize_codes() of one format in AVX2: 8 codes a step (fp8_value_x8()), the tail by the loop.
template <std::uint32_t M, std::uint32_t B, bool E4M3>
ULYSSES_TARGET_AVX2 inline void dequantize_format_avx2(const std::uint8_t* q, std::int64_t n, float scale, Fp8Format f, float* out) {
  const __m256 s = _mm256_set1_ps(scale);
  const std::int64_t body = n > 0 ? n - n % 8 : 0;
  for (std::int64_t i = 0; i < body; i += 8)
    _mm256_storeu_ps(out + i, fp8_value_x8<M, B, E4M3>(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i))), s));
  dequantize_codes(q + body, n - body, scale, f, out + body);
}
ULYSSES_TARGET_AVX2 inline void dequantize_fp8_avx2(const std::uint8_t* q, std::int64_t n, float scale, Fp8Format f, float* out) {
  if (f == Fp8Format::e4m3) return dequantize_format_avx2<3, 7, true>(q, n, scale, f, out);
  dequantize_format_avx2<2, 15, false>(q, n, scale, f, out);
}
#endif

}  // namespace detail

/// The largest finite magnitude of format f: 448 (e4m3) or 57344 (e5m2).
/// @pre f is Fp8Format::e4m3 or Fp8Format::e5m2 (any other value is taken as e5m2)
ULYSSES_HOST_DEVICE inline float fp8_max(Fp8Format f) { return f == Fp8Format::e4m3 ? 448.0f : 57344.0f; }

/// float32 → fp8 bits of format f: rounded to nearest, ties to even (an even last mantissa bit),
/// saturating. Rules:
/// - a finite |x| that rounds beyond fp8_max(f), and ±infinity, give ±fp8_max(f) (0x7e / 0xfe for
///   e4m3, 0x7b / 0xfb for e5m2): no infinity is ever produced, in either format;
/// - a NaN (any sign, any payload) gives the canonical NaN with the sign bit clear: 0x7f (e4m3),
///   0x7e (e5m2);
/// - values below the smallest normal (2^-6 for e4m3, 2^-14 for e5m2) give the format's
///   subnormals (steps of 2^-9 and 2^-16) or zero; a zero keeps the sign of x (-0 → 0x80, and a
///   negative value that rounds to zero → 0x80).
/// Integer arithmetic only: the same bits on the host and on the device.
/// @param x  the value
/// @param f  the format (e4m3 or e5m2; any other value is taken as e5m2)
/// @return the fp8 code: bit 7 the sign, then the exponent and mantissa fields
ULYSSES_HOST_DEVICE inline std::uint8_t float_to_fp8(float x, Fp8Format f) {
  const detail::Fp8Params p = detail::fp8_params(f);
  const std::uint32_t u = detail::float_bits(x), ax = u & 0x7fffffffu;
  const auto sign = static_cast<std::uint32_t>((u >> 24) & 0x80u);
  if (ax > 0x7f800000u) return p.nan_code;
  const std::uint32_t min_normal = (128u - p.bias) << 23;  // the float32 bits of 2^(1 - bias)
  if (ax < min_normal) return static_cast<std::uint8_t>(sign | detail::fp8_subnormal_code(ax, p));
  const std::uint32_t drop = 23u - p.mant_bits;  // float32 mantissa bits dropped
  std::uint32_t r = ax - ((127u - p.bias) << 23);  // rebias the exponent (127 → bias)
  r += (1u << (drop - 1u)) - 1u + ((r >> drop) & 1u);
  const std::uint32_t code = r >> drop;
  return static_cast<std::uint8_t>(sign | (code > p.max_code ? p.max_code : code));
}

/// fp8 bits of format f → float32, exactly (every fp8 value is a float32). A NaN code (e4m3:
/// S.1111.111; e5m2: S.11111.mm with mm ≠ 0) gives a quiet float32 NaN with b's sign bit;
/// e5m2's S.11111.00 gives ±infinity; 0x80 gives -0.
/// @param b  the fp8 code
/// @param f  the format (e4m3 or e5m2; any other value is taken as e5m2)
ULYSSES_HOST_DEVICE inline float fp8_to_float(std::uint8_t b, Fp8Format f) {
  const detail::Fp8Params p = detail::fp8_params(f);
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24, mag = b & 0x7fu;
  const std::uint32_t exp = mag >> p.mant_bits, mant = mag & ((1u << p.mant_bits) - 1u);
  const std::uint32_t top = (1u << (7u - p.mant_bits)) - 1u;  // the all-ones exponent field
  if (f == Fp8Format::e4m3 ? mag == 0x7fu : exp == top) {
    return detail::bits_float(sign | (mant == 0 ? 0x7f800000u : detail::kFloatNanBits));  // e4m3: mant != 0
  }
  if (exp == 0) {  // zero or subnormal: mant * 2^(1 - bias - mant_bits), one exact multiplication
    const float step = detail::bits_float((128u - p.bias - p.mant_bits) << 23);
    const float v = static_cast<float>(mant) * step;
    return detail::bits_float(sign | detail::float_bits(v));
  }
  return detail::bits_float(sign | ((exp + 127u - p.bias) << 23) | (mant << (23u - p.mant_bits)));
}

/// The scale of a row whose largest magnitude is amax: the row is stored as fp8(x / scale), read
/// back as fp8_to_float(q) * scale. So that no NaN or infinity can appear on the wire or on the
/// way back (fault case C23: an unfloored max|x| / 448 is 0 for a row of zeros, and 0 / 0 = NaN):
/// - finite amax: scale = amax / fp8_max(f), one IEEE float32 division (rounded to nearest),
///   floored at FLT_MIN = 2^-126 (1.17549435e-38f): never 0 nor subnormal, so x / scale is never
///   0 / 0 and 1 / scale is finite. A row of ±0 (amax = 0) gets FLT_MIN and every element
///   quantizes to a zero of its own sign. Rows with amax < fp8_max(f) * FLT_MIN use the floor and
///   so only part of the fp8 range (tiny values may quantize to ±0);
/// - fp8_max(f) * scale, the largest dequantized magnitude, is finite for every amax but NaN:
///   FLT_MAX / fp8_max(f) rounds down in float32 for both formats, and both operations are
///   monotonic (tests/layout/test_fp8.cpp checks it);
/// - amax = ±infinity: the scale of amax = FLT_MAX, FLT_MAX / fp8_max(f) rounded: finite elements stay
///   finite, infinite ones saturate to ±fp8_max(f) (and come back as ±fp8_max(f) * scale);
/// - amax NaN: a quiet NaN scale; the whole row then quantizes to the canonical NaN code and
///   dequantizes to NaN (a NaN row stays NaN: the NaN is not hidden).
/// The sign of amax is ignored (|amax| is used).
/// @param amax  the row's largest magnitude (row_amax()), any float
/// @param f     the format (e4m3 or e5m2; any other value is taken as e5m2)
/// @return the scale: a normal float32 in [FLT_MIN, FLT_MAX / fp8_max(f)], or NaN when amax is NaN
ULYSSES_HOST_DEVICE inline float fp8_scale_of(float amax, Fp8Format f) {
  std::uint32_t a = detail::float_bits(amax) & 0x7fffffffu;
  if (a > 0x7f800000u) return detail::bits_float(detail::kFloatNanBits);
  if (a == 0x7f800000u) a = detail::kFloatMaxBits;
  const float m = fp8_max(f);
  const float s = detail::bits_float(a) / m;
  return detail::float_bits(s) < detail::kFloatMinBits ? detail::bits_float(detail::kFloatMinBits) : s;
}

/// The largest magnitude max |x_i| of x[0..n), NaN-propagating: any NaN element gives a (quiet)
/// NaN; an infinite element gives +infinity; n <= 0 or an all-±0 row gives +0. The result does not
/// depend on the order of the elements (it is exact: no rounding).
/// @param x  n floats (may be null when n <= 0)
/// @param n  the number of elements
ULYSSES_HOST_DEVICE inline float row_amax(const float* x, std::int64_t n) {
#if ULYSSES_HOST_AVX2 && !defined(__CUDA_ARCH__)
  if (detail::host_has_avx512()) return detail::row_amax_avx512(x, n);
  if (detail::host_has_avx2()) return detail::row_amax_avx2(x, n);
#endif
  return detail::row_amax_loop(x, n);
}

/// Quantizes n floats with the given scale into out[0..n): out[i] = float_to_fp8(x[i] / scale, f),
/// the division one IEEE float32 division (rounded to nearest; deterministic on host and device
/// under nvcc's default -prec-div=true). With a scale from fp8_scale_of() no element gives NaN
/// unless it is NaN or the scale is (a NaN amax); ±0 elements give 0x00 / 0x80.
/// @param x      n floats
/// @param n      the number of elements (nothing is written when n <= 0)
/// @param scale  the row's scale (fp8_scale_of())
/// @param f      the format
/// @param out    n bytes (not overlapping x)
/// @pre scale is a positive normal float32 (as fp8_scale_of() gives), or NaN
ULYSSES_HOST_DEVICE inline void quantize_fp8(const float* x, std::int64_t n, float scale, Fp8Format f, std::uint8_t* out) {
#if ULYSSES_HOST_AVX2 && !defined(__CUDA_ARCH__)
  if (detail::host_has_avx512()) return detail::quantize_fp8_avx512(x, n, scale, f, out);
  if (detail::host_has_avx2()) return detail::quantize_fp8_avx2(x, n, scale, f, out);
#endif
  detail::quantize_codes(x, n, scale, f, out);
}

/// Dequantizes n fp8 codes: out[i] = fp8_to_float(q[i], f) * scale, one IEEE float32
/// multiplication (rounded to nearest). Zero codes give zeros of their sign (0x80 → -0) for any
/// positive finite scale; a NaN code or a NaN scale gives the canonical quiet NaN 0x7fc00000
/// (whatever their signs and payloads: which NaN a product of two NaNs keeps depends on the
/// compiler's operand order, so every NaN is made the same, on the host and on the device).
/// @param q      n fp8 codes
/// @param n      the number of elements (nothing is written when n <= 0)
/// @param scale  the row's scale (fp8_scale_of())
/// @param f      the format
/// @param out    n floats
ULYSSES_HOST_DEVICE inline void dequantize_fp8(const std::uint8_t* q, std::int64_t n, float scale, Fp8Format f, float* out) {
#if ULYSSES_HOST_AVX2 && !defined(__CUDA_ARCH__)
  if (detail::host_has_avx512()) return detail::dequantize_fp8_avx512(q, n, scale, f, out);
  if (detail::host_has_avx2()) return detail::dequantize_fp8_avx2(q, n, scale, f, out);
#endif
  detail::dequantize_codes(q, n, scale, f, out);
}

ULYSSES_NAMESPACE_END
