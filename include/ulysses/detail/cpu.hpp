// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The host CPU's AVX2, for loops the compiler vectorises only with it: ULYSSES_HOST_AVX2
///        (1 where AVX2 code is compiled: GCC or Clang on x86-64, not in CUDA translation units),
///        ULYSSES_TARGET_AVX2 (the function attribute), ULYSSES_ALWAYS_INLINE (a body shared by
///        both twins), host_has_avx2() (whether this CPU runs it, asked once). An AVX2 twin
///        computes the same IEEE operations as its plain one, so both give the same bits.
#pragma once

#include "../version.hpp"

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define ULYSSES_HOST_AVX2 1
#define ULYSSES_TARGET_AVX2 __attribute__((target("avx2")))
#else
#define ULYSSES_HOST_AVX2 0
#define ULYSSES_TARGET_AVX2
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
}  // namespace detail
ULYSSES_NAMESPACE_END
