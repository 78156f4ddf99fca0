// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Element types: what a tensor's bytes mean, where ulysses must know (summing the copies
///        of a replicated head in the backward of seq→head), and the exact arithmetic it uses.
///
/// Data movement never looks at values; only a sum needs the type. The rules (fp32 for 16-bit
/// types, ascending rank order, canonical NaN; no -ffast-math): docs/design.md, "Sum rules";
/// docs/headers.md, "layout/element.hpp".
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../detail/cpu.hpp"
#include "../version.hpp"
#if ULYSSES_HOST_AVX2
#include <immintrin.h>
#endif

ULYSSES_NAMESPACE_BEGIN

/// What a tensor's elements are. `opaque` (the default for types ulysses does not know) can be
/// moved but not summed.
enum class ElementType : int {
  opaque = 0,  ///< any trivially copyable type: bytes only
  float16,     ///< IEEE 754 binary16 (__half, _Float16)
  bfloat16,    ///< bfloat16 (__nv_bfloat16, at::BFloat16): the upper half of a float32
  float32,     ///< IEEE 754 binary32
  float64,     ///< IEEE 754 binary64
};

/// Name of an element type ("float16", ...).
inline const char* to_string(ElementType t) noexcept {
  switch (t) {
    case ElementType::opaque: return "opaque";
    case ElementType::float16: return "float16";
    case ElementType::bfloat16: return "bfloat16";
    case ElementType::float32: return "float32";
    case ElementType::float64: return "float64";
  }
  return "?";
}

/// Bytes of one element of type t; 0 for opaque (any size).
constexpr std::size_t size_of(ElementType t) noexcept {
  switch (t) {
    case ElementType::float16:
    case ElementType::bfloat16: return 2;
    case ElementType::float32: return 4;
    case ElementType::float64: return 8;
    case ElementType::opaque: break;
  }
  return 0;
}

/// True when ulysses can sum elements of type t (every type but opaque).
constexpr bool summable(ElementType t) noexcept { return t != ElementType::opaque; }

/// The ElementType of a C++ type T: float32 for float, float64 for double, opaque otherwise.
/// Specialise it for your 16-bit types so that TensorSpec::of<T> knows them, e.g.
/// `template <> struct ulysses::element_type_of<at::BFloat16> : std::integral_constant<ulysses::ElementType, ulysses::ElementType::bfloat16> {};`
/// (<ulysses/cuda/element.cuh> does it for __half and __nv_bfloat16; GCC/Clang's _Float16 is known here).
template <class T>
struct element_type_of {
  static constexpr ElementType value = ElementType::opaque;
};
template <>
struct element_type_of<float> {
  static constexpr ElementType value = ElementType::float32;
};
template <>
struct element_type_of<double> {
  static constexpr ElementType value = ElementType::float64;
};
#if defined(__FLT16_MANT_DIG__) && !defined(__CUDACC__)
template <>
struct element_type_of<_Float16> {
  static constexpr ElementType value = ElementType::float16;
};
#endif
/// element_type_of<T>::value.
template <class T>
inline constexpr ElementType element_type_of_v = element_type_of<T>::value;

namespace detail {

/// Bits of a float (host and device).
ULYSSES_HOST_DEVICE inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
ULYSSES_HOST_DEVICE inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
/// The smallest normal float32, FLT_MIN = 2^-126 (1.17549435e-38f), as bits.
inline constexpr std::uint32_t kFloatMinBits = 0x00800000u;
/// The largest finite float32, FLT_MAX (3.40282347e38f), as bits.
inline constexpr std::uint32_t kFloatMaxBits = 0x7f7fffffu;
/// The canonical quiet float32 NaN.
inline constexpr std::uint32_t kFloatNanBits = 0x7fc00000u;

/// binary16 bits → float32, exactly (subnormals, infinities and NaN payloads included). Rebias
/// the exponent; infinities and NaNs get the top exponent; subnormals are renormalised by one
/// exact float32 subtraction (as in F. Giesen's well-known conversion). Needs denormals on
/// (never -ffast-math / --use_fast_math: see docs/headers.md, "layout/element.hpp").
ULYSSES_HOST_DEVICE inline float half_to_float(std::uint16_t h) {
  constexpr std::uint32_t shifted_exp = 0x7c00u << 13;
  std::uint32_t o = static_cast<std::uint32_t>(h & 0x7fffu) << 13;
  const std::uint32_t exp = o & shifted_exp;
  o += (127u - 15u) << 23;
  if (exp == shifted_exp) {
    o += (128u - 16u) << 23;  // infinity or NaN
  } else if (exp == 0) {      // zero or subnormal: value = mantissa * 2^-24, exactly
    o += 1u << 23;
    o = float_bits(bits_float(o) - bits_float(113u << 23));
  }
  return bits_float(o | (static_cast<std::uint32_t>(h & 0x8000u) << 16));
}

/// float32 → binary16 bits, rounded to nearest, ties to even; overflow gives infinity, a NaN
/// stays a (quiet) NaN.
ULYSSES_HOST_DEVICE inline std::uint16_t float_to_half(float f) {
  const std::uint32_t x = float_bits(f), ax = x & 0x7fffffffu;
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  if (ax > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x1ffu));
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: infinity
  if (ax < 0x38800000u) {                                                    // below 2^-14: subnormal or zero
    const std::uint32_t e = ax >> 23;
    if (e < 102) return sign;  // below 2^-25: rounds to zero
    const std::uint32_t mant = (ax & 0x7fffffu) | 0x800000u, shift = 126 - e;  // value in units of 2^-24
    std::uint32_t q = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
  std::uint32_t r = ax - 0x38000000u;  // rebias the exponent (127 → 15)
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (r >> 13));
}

/// bfloat16 bits → float32 (exact).
ULYSSES_HOST_DEVICE inline float bfloat16_to_float(std::uint16_t b) { return bits_float(static_cast<std::uint32_t>(b) << 16); }

/// float32 → bfloat16 bits, rounded to nearest, ties to even; a NaN stays a (quiet) NaN.
/// (Branch-free, so that loops over it vectorise.)
ULYSSES_HOST_DEVICE inline std::uint16_t float_to_bfloat16(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16, quiet = (x >> 16) | 0x40u;
  return static_cast<std::uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

/// float32 → bfloat16 bits, rounded to nearest, ties to even; a NaN becomes the canonical quiet
/// NaN 0x7fc0 (SumArith's narrow(); branch-free, one compare).
ULYSSES_HOST_DEVICE inline std::uint16_t float_to_bfloat16_canonical(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return static_cast<std::uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : rounded);
}

/// The arithmetic of a sum of elements of type T (see docs/headers.md, "layout/element.hpp"): `Acc` the type terms
/// are added in, `Bits` the stored element, widen() one term to Acc (exactly), narrow() the
/// result back (rounded; a NaN becomes the canonical quiet NaN); load() / store() the same from /
/// to bytes (which may be misaligned: read through memcpy). Branch-free where it matters, so that
/// the host's batch loops vectorise. Host and device.
template <ElementType T>
struct SumArith;

/// True when p is a multiple of `align` (a power of two). Host and device.
ULYSSES_HOST_DEVICE inline bool aligned_to(const void* p, std::size_t align) {
  return (reinterpret_cast<std::uintptr_t>(p) & (align - 1)) == 0;
}

/// Loads / stores one T at p: on the device a typed access when p is aligned for T (one
/// ld/st of sizeof(T) bytes; through a std::byte* memcpy nvcc emits one byte access per byte),
/// else memcpy (any alignment). The same bits either way. Host and device.
/// (On the device the misaligned branch moves bytes one by one through a register array, not
/// memcpy: the compiler would merge a memcpy's align-1 access with the typed one into a single
/// align-1 access, i.e. byte accesses on both branches.)
template <class T>
ULYSSES_HOST_DEVICE inline T load_bits(const std::byte* p) {
  T b;
#if defined(__CUDA_ARCH__)
  if (aligned_to(p, alignof(T))) return *reinterpret_cast<const T*>(p);
  unsigned char c[sizeof(T)];
  for (std::size_t i = 0; i < sizeof(T); ++i) c[i] = static_cast<unsigned char>(p[i]);
  std::memcpy(&b, c, sizeof b);
#else
  std::memcpy(&b, p, sizeof b);
#endif
  return b;
}
template <class T>
ULYSSES_HOST_DEVICE inline void store_bits(std::byte* p, const T& b) {
#if defined(__CUDA_ARCH__)
  if (aligned_to(p, alignof(T))) {
    *reinterpret_cast<T*>(p) = b;
    return;
  }
  unsigned char c[sizeof(T)];
  std::memcpy(c, &b, sizeof b);
  for (std::size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<std::byte>(c[i]);
#else
  std::memcpy(p, &b, sizeof b);
#endif
}

/// 16 bytes, 16-aligned: one vector access on the device (ld/st.v4.u32).
struct alignas(16) Bytes16 {
  std::uint32_t w[4];
};

/// Copies n bytes from src to dst in the widest accesses both addresses and n allow (16, 8, 4, 2
/// or 1 bytes each, the same on the host and the device). Host and device.
ULYSSES_HOST_DEVICE inline void copy_bytes(std::byte* dst, const std::byte* src, std::size_t n) {
  const std::uintptr_t m = reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src) | n;
  if ((m & 15) == 0) {
    for (std::size_t i = 0; i < n; i += 16) store_bits(dst + i, load_bits<Bytes16>(src + i));
  } else if ((m & 7) == 0) {
    for (std::size_t i = 0; i < n; i += 8) store_bits(dst + i, load_bits<std::uint64_t>(src + i));
  } else if ((m & 3) == 0) {
    for (std::size_t i = 0; i < n; i += 4) store_bits(dst + i, load_bits<std::uint32_t>(src + i));
  } else {
    std::memcpy(dst, src, n);
  }
}

/// load() / store() of a SumArith: the element's bits (load_bits / store_bits: typed where
/// aligned on the device, misaligned pointers are fine), widened to / narrowed from Acc by the
/// derived type's widen() / narrow(); load_n() / store_n(): N consecutive elements, in 16-byte
/// vectors where the address is 16-aligned and the N elements are whole vectors.
template <class Derived, class AccT, class BitsT>
struct SumArithBytes {
  using Acc = AccT;
  using Bits = BitsT;
  ULYSSES_HOST_DEVICE static Acc load(const std::byte* p) { return Derived::widen(load_bits<Bits>(p)); }
  ULYSSES_HOST_DEVICE static void store(std::byte* p, Acc x) { store_bits<Bits>(p, Derived::narrow(x)); }
  /// out[k] = load(p + k * sizeof(Bits)), k < len (len <= N).
  template <int N>
  ULYSSES_HOST_DEVICE static void load_n(const std::byte* p, int len, Acc* out) {
    constexpr std::size_t kBytes = static_cast<std::size_t>(N) * sizeof(Bits);
    if constexpr (kBytes % 16 == 0) {
      if (len == N && aligned_to(p, 16)) {
        Bytes16 v[kBytes / 16];
        Bits b[static_cast<std::size_t>(N)];
        for (std::size_t i = 0; i < kBytes / 16; ++i) v[i] = load_bits<Bytes16>(p + 16 * i);
        std::memcpy(b, v, kBytes);  // registers: no memory access
        for (std::size_t k = 0; k < static_cast<std::size_t>(N); ++k) out[k] = Derived::widen(b[k]);
        return;
      }
    }
    for (int k = 0; k < len; ++k) out[k] = load(p + k * static_cast<std::ptrdiff_t>(sizeof(Bits)));
  }
  /// store(p + k * sizeof(Bits), x[k]), k < len (len <= N).
  template <int N>
  ULYSSES_HOST_DEVICE static void store_n(std::byte* p, int len, const Acc* x) {
    constexpr std::size_t kBytes = static_cast<std::size_t>(N) * sizeof(Bits);
    if constexpr (kBytes % 16 == 0) {
      if (len == N && aligned_to(p, 16)) {
        Bytes16 v[kBytes / 16];
        Bits b[static_cast<std::size_t>(N)];
        for (std::size_t k = 0; k < static_cast<std::size_t>(N); ++k) b[k] = Derived::narrow(x[k]);
        std::memcpy(v, b, kBytes);
        for (std::size_t i = 0; i < kBytes / 16; ++i) store_bits(p + 16 * i, v[i]);
        return;
      }
    }
    for (int k = 0; k < len; ++k) store(p + k * static_cast<std::ptrdiff_t>(sizeof(Bits)), x[k]);
  }
};
template <>
struct SumArith<ElementType::float64> : SumArithBytes<SumArith<ElementType::float64>, double, std::uint64_t> {
  ULYSSES_HOST_DEVICE static Acc widen(Bits b) {
    double x;
    std::memcpy(&x, &b, 8);
    return x;
  }
  ULYSSES_HOST_DEVICE static Bits narrow(Acc x) {
    Bits b;
    std::memcpy(&b, &x, 8);
    return x != x ? Bits{0x7ff8000000000000ull} : b;
  }
};
template <>
struct SumArith<ElementType::float32> : SumArithBytes<SumArith<ElementType::float32>, float, std::uint32_t> {
  ULYSSES_HOST_DEVICE static Acc widen(Bits b) { return bits_float(b); }
  ULYSSES_HOST_DEVICE static Bits narrow(Acc x) { return x != x ? Bits{0x7fc00000u} : float_bits(x); }
};
template <>
struct SumArith<ElementType::float16> : SumArithBytes<SumArith<ElementType::float16>, float, std::uint16_t> {
  ULYSSES_HOST_DEVICE static Acc widen(Bits b) { return half_to_float(b); }
  ULYSSES_HOST_DEVICE static Bits narrow(Acc x) { return x != x ? Bits{0x7e00} : float_to_half(x); }
};
template <>
struct SumArith<ElementType::bfloat16> : SumArithBytes<SumArith<ElementType::bfloat16>, float, std::uint16_t> {
  ULYSSES_HOST_DEVICE static Acc widen(Bits b) { return bfloat16_to_float(b); }
  ULYSSES_HOST_DEVICE static Bits narrow(Acc x) { return float_to_bfloat16_canonical(x); }
};

/// Calls f(SumArith<type>{}) for a summable type (nothing for opaque). Host and device, whatever
/// f is (the execution-space check is off here, as CCCL does for such dispatchers: f's own space
/// decides where the instantiation can run).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class F>
ULYSSES_HOST_DEVICE inline void with_sum_arith(ElementType type, F&& f) {
  switch (type) {
    case ElementType::float16: f(SumArith<ElementType::float16>{}); return;
    case ElementType::bfloat16: f(SumArith<ElementType::bfloat16>{}); return;
    case ElementType::float32: f(SumArith<ElementType::float32>{}); return;
    case ElementType::float64: f(SumArith<ElementType::float64>{}); return;
    case ElementType::opaque: return;
  }
}

/// Sums the n terms src[0..n) (ascending rank order) of type `type` and writes the rounded result
/// to dst, by the rules in docs/headers.md, "layout/element.hpp". Host and device; pointers may be misaligned.
/// @pre summable(type), n >= 1
ULYSSES_HOST_DEVICE inline void sum_element(ElementType type, const std::byte* const* src, int n, std::byte* dst) {
  with_sum_arith(type, [&](auto a) {
    using A = decltype(a);
    typename A::Acc acc = A::load(src[0]);
    for (int j = 1; j < n; ++j) acc = acc + A::load(src[j]);
    A::store(dst, acc);
  });
}

#if ULYSSES_HOST_AVX2
// ---- non-temporal stores at the alignment a row has: a buffer from malloc (std::vector) is only
// 16-byte aligned, and a row kernel that streamed only at 64 bytes wrote its rows with plain
// stores there (each line read for ownership first: 3 bytes of traffic per byte), where the plain
// copy streams (stream_row(): 16-byte stores). The caller fences (stream_fence()).
/// The 32 bytes v at p: one non-temporal store where p is 32-byte aligned, two of 16 bytes where
/// it is 16-byte aligned, else a plain store.
ULYSSES_TARGET_AVX2 inline void stream_store_x32(std::byte* p, __m256i v) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if ((a & 31) == 0) return _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v);
  if ((a & 15) != 0) return _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  _mm_stream_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(v));
  _mm_stream_si128(reinterpret_cast<__m128i*>(p + 16), _mm256_extracti128_si256(v, 1));
}
/// The 64 bytes v at p: non-temporal stores of 64, 32 or 16 bytes as p's alignment allows, else a
/// plain store.
ULYSSES_TARGET_AVX512 inline void stream_store_x64(std::byte* p, __m512i v) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if ((a & 63) == 0) return _mm512_stream_si512(reinterpret_cast<__m512i*>(p), v);
  if ((a & 15) != 0) return _mm512_storeu_si512(p, v);
  stream_store_x32(p, _mm512_maskz_extracti64x4_epi64(0xf, v, 0));
  stream_store_x32(p + 32, _mm512_maskz_extracti64x4_epi64(0xf, v, 1));
}

// ---- 16 and 32 bf16 lanes in AVX-512 with BF16 (host kernels that call them run only where
// host_has_avx512_bf16()): widening exactly, narrowing as float_to_bfloat16_canonical(). The
// all-lanes masked forms: GCC 12's unmasked ones start from an undefined vector, which
// -Wmaybe-uninitialized reports.
/// 16 bf16 at p (any alignment) widened to float, exactly.
ULYSSES_TARGET_AVX512_BF16 inline __m512 bf16x16_load(const std::byte* p) {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, b), 16));
}
/// The lanes of x that VCVTNE(2)PS2BF16 narrows otherwise than float_to_bfloat16_canonical():
/// NaNs (0x01 quiet, 0x80 signalling) and float32 subnormals (0x20).
ULYSSES_TARGET_AVX512_BF16 inline __mmask16 bf16_special_lanes(__m512 x) { return _mm512_fpclass_ps_mask(x, 0xA1); }
/// Stores float_to_bfloat16_canonical() of 16 floats at p: VCVTNEPS2BF16 (RNE) where no lane is a
/// NaN or a float32 subnormal (the instruction flushes subnormals to zero and keeps a NaN's
/// payload); such a vector, rare, is narrowed lane by lane. The same bits either way. `stream`:
/// non-temporal stores where p is 16-byte aligned (stream_store_x32(); the caller fences).
ULYSSES_TARGET_AVX512_BF16 inline void bf16x16_store(std::byte* p, __m512 x, bool stream = false) {
  if (bf16_special_lanes(x) == 0) {
    const __m256bh h = _mm512_cvtneps_pbh(x);
    __m256i v;
    std::memcpy(&v, &h, 32);
    if (stream)
      stream_store_x32(p, v);
    else
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
    return;
  }
  float f[16];
  std::uint16_t b[16];
  _mm512_storeu_ps(f, x);
  for (int i = 0; i < 16; ++i) b[i] = float_to_bfloat16_canonical(f[i]);
  std::memcpy(p, b, 32);
}
/// Stores lo and hi narrowed at p as bf16x32_store() does where no lane is special: one
/// VCVTNE2PS2BF16 and one 64-byte store (`stream`: stream_store_x64()), unchecked.
/// @pre bf16_special_lanes() of lo and of hi is 0 (else its bits are not float_to_bfloat16_canonical()'s)
ULYSSES_TARGET_AVX512_BF16 inline void bf16x32_store_plain(std::byte* p, __m512 lo, __m512 hi, bool stream = false) {
  const __m512bh h = _mm512_cvtne2ps_pbh(hi, lo);  // (lo in the lower half)
  __m512i v;
  std::memcpy(&v, &h, 64);
  if (stream)
    stream_store_x64(p, v);
  else
    _mm512_storeu_si512(p, v);
}
/// bf16x16_store() of lo at p and hi at p + 32 bytes, as one 64-byte store (VCVTNE2PS2BF16)
/// where neither has a NaN or subnormal lane; `stream`: non-temporal where p is 16-byte aligned.
ULYSSES_TARGET_AVX512_BF16 inline void bf16x32_store(std::byte* p, __m512 lo, __m512 hi, bool stream = false) {
  if ((bf16_special_lanes(lo) | bf16_special_lanes(hi)) != 0) {
    bf16x16_store(p, lo, stream);
    return bf16x16_store(p + 32, hi, stream);
  }
  bf16x32_store_plain(p, lo, hi, stream);
}
#endif

}  // namespace detail

ULYSSES_NAMESPACE_END
