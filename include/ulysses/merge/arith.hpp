// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The arithmetic of the LSE merge (merge/lse.hpp): LseBase, fp32 operations rounded one
///        by one and never contracted, which LSE marks an empty partial, and ulysses' own
///        exp2_nonpos() and log1p_unit(), so that the host and every GPU give the same bits
///        (docs/headers.md, "merge/lse.hpp"). Host and device.
#pragma once

#include <cstdint>

#include "../layout/element.hpp"
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

/// True when `lse` marks an empty partial (no key): −inf, +inf or NaN, i.e. not finite (docs/headers.md,
/// "merge/lse.hpp"; FlashAttention-2 returns +inf for a fully masked row). Host and device.
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

ULYSSES_NAMESPACE_END
