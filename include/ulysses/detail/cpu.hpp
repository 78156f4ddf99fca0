// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The host CPU's AVX2 and AVX-512, for loops the compiler vectorises only with them:
///        ULYSSES_HOST_AVX2 (1 where such twins are compiled: GCC or Clang on x86-64, not in CUDA
///        translation units), ULYSSES_TARGET_AVX2 and ULYSSES_TARGET_AVX512 (the function
///        attributes; ULYSSES_TARGET_AVX512_BF16 for kernels written with BF16 intrinsics),
///        ULYSSES_ALWAYS_INLINE (a body shared by the twins), host_has_avx2(), host_has_avx512()
///        and host_has_avx512_bf16() (whether this CPU runs them, asked once). A twin computes the
///        same IEEE operations as its plain body, so every twin gives the same bits.
#pragma once

#include "../version.hpp"

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define ULYSSES_HOST_AVX2 1
#define ULYSSES_TARGET_AVX2 __attribute__((target("avx2")))
// AVX2 with FMA, for loops written with std::fma (an fma is one IEEE operation: the same bits
// with or without the instruction); AVX-512F implies FMA.
#define ULYSSES_TARGET_AVX2_FMA __attribute__((target("avx2,fma")))
// The AVX-512 twin (F, VL, BW, DQ) on 512-bit vectors: GCC's prefer-vector-width, Clang's min_vector_width.
#if defined(__clang__)
#define ULYSSES_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq"), min_vector_width(512)))
#elif __GNUC__ >= 11
#define ULYSSES_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,prefer-vector-width=512")))
#else
#define ULYSSES_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq")))
#endif
// AVX-512 with BF16 (VCVTNEPS2BF16), for kernels written with its intrinsics.
#define ULYSSES_TARGET_AVX512_BF16 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx512bf16")))
#else
#define ULYSSES_HOST_AVX2 0
#define ULYSSES_TARGET_AVX2
#define ULYSSES_TARGET_AVX2_FMA
#define ULYSSES_TARGET_AVX512
#define ULYSSES_TARGET_AVX512_BF16
#endif
// A loop body written once, inlined into its plain caller and its AVX2 twin (and compiled for each).
#if defined(__GNUC__) || defined(__clang__)
#define ULYSSES_ALWAYS_INLINE __attribute__((always_inline))
#else
#define ULYSSES_ALWAYS_INLINE
#endif

ULYSSES_NAMESPACE_BEGIN
namespace detail {
/// Whether this CPU runs AVX2 (asked once; false where ULYSSES_HOST_AVX2 is 0).
inline bool host_has_avx2() {
#if ULYSSES_HOST_AVX2
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#else
  return false;
#endif
}
/// Whether this CPU runs AVX2 with FMA (the ULYSSES_TARGET_AVX2_FMA twins; asked once).
inline bool host_has_avx2_fma() {
#if ULYSSES_HOST_AVX2
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}
/// Whether this CPU runs the AVX-512 twins (F, VL, BW and DQ; asked once; false where
/// ULYSSES_HOST_AVX2 is 0).
inline bool host_has_avx512() {
#if ULYSSES_HOST_AVX2
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
  return has;
#else
  return false;
#endif
}
/// Whether this CPU runs the AVX-512 twins and AVX512-BF16 too (ULYSSES_TARGET_AVX512_BF16;
/// asked once; false where ULYSSES_HOST_AVX2 is 0).
inline bool host_has_avx512_bf16() {
#if ULYSSES_HOST_AVX2
  static const bool has = host_has_avx512() && __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}
}  // namespace detail
ULYSSES_NAMESPACE_END
