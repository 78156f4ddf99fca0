// SPDX-License-Identifier: Apache-2.0
// element.hpp: element types, the 16-bit conversions (checked against the compiler's _Float16 and
// an exact-arithmetic bfloat16 reference at every rounding boundary), and the summation rules.
#include <doctest/doctest.h>
#include <ulysses/layout/element.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

using namespace ulysses;
using namespace ulysses::detail;

namespace {

float f(std::uint32_t bits) { return bits_float(bits); }

/// float → bfloat16 by exact arithmetic (double): the nearer of the two neighbours, ties to the
/// one with an even last bit; NaN stays NaN.
std::uint16_t bf16_reference(float x) {
  const std::uint32_t u = float_bits(x);
  if (std::isnan(x)) return 0x7fc0;
  const std::uint16_t lo = static_cast<std::uint16_t>(u >> 16), hi = static_cast<std::uint16_t>(lo + 1);
  const double dx = x, dlo = bfloat16_to_float(lo);
  if ((lo & 0x7fff) == 0x7f7f && (u & 0xffff) >= 0x8000) {  // above the largest finite value's midpoint
    const double mid = dlo + (std::ldexp(1.0, 128) - std::abs(dlo)) / 2 * (dlo < 0 ? -1 : 1);
    if (std::abs(dx) > std::abs(mid) || ((u & 0xffff) == 0x8000 && (lo & 1))) return static_cast<std::uint16_t>((lo & 0x8000) | 0x7f80);
    return lo;
  }
  const double dhi = bfloat16_to_float(hi);
  const double a = std::abs(dx - dlo), b = std::abs(dhi - dx);
  if (a < b) return lo;
  if (b < a) return hi;
  return (lo & 1) ? hi : lo;
}

std::uint16_t bits_of(_Float16 h) {
  std::uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

}  // namespace

TEST_CASE("element types: names, sizes, what can be summed, and the trait") {
  CHECK(size_of(ElementType::float16) == 2);
  CHECK(size_of(ElementType::bfloat16) == 2);
  CHECK(size_of(ElementType::float32) == 4);
  CHECK(size_of(ElementType::float64) == 8);
  CHECK(size_of(ElementType::opaque) == 0);
  CHECK(!summable(ElementType::opaque));
  CHECK(summable(ElementType::bfloat16));
  CHECK(std::string(to_string(ElementType::bfloat16)) == "bfloat16");
  CHECK(element_type_of_v<float> == ElementType::float32);
  CHECK(element_type_of_v<double> == ElementType::float64);
  CHECK(element_type_of_v<_Float16> == ElementType::float16);
  CHECK(element_type_of_v<std::uint16_t> == ElementType::opaque);
}

TEST_CASE("binary16 → float32 is exact for all 65536 patterns (the compiler's _Float16 agrees)") {
  int wrong = 0;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    _Float16 x;
    const auto b = static_cast<std::uint16_t>(h);
    std::memcpy(&x, &b, 2);
    const float want = static_cast<float>(x), got = half_to_float(b);
    if (std::isnan(want) ? !std::isnan(got) : float_bits(want) != float_bits(got)) ++wrong;
    if (!std::isnan(got) && bits_of(static_cast<_Float16>(got)) != b) ++wrong;  // and back
  }
  CHECK(wrong == 0);
}

TEST_CASE("float32 → binary16 rounds to nearest, ties to even: every rounding boundary and a sweep") {
  // At every boundary between two consecutive binary16 values (both signs): the exact midpoint
  // and the floats one ulp on either side; plus a stride-7919 sweep over all 2^32 patterns.
  std::vector<float> xs;
  for (std::uint32_t h = 0; h < 0x7c00; ++h)
    for (std::uint32_t sign : {0u, 0x8000u}) {
      const double lo = half_to_float(static_cast<std::uint16_t>(h | sign)),
                   hi = h + 1 == 0x7c00 ? (sign ? -65536.0 : 65536.0) : half_to_float(static_cast<std::uint16_t>((h + 1) | sign));
      const float mid = static_cast<float>((lo + hi) / 2);  // exact: midpoints of binary16 values are floats
      xs.push_back(mid), xs.push_back(std::nextafter(mid, 0.f)), xs.push_back(std::nextafter(mid, sign ? -INFINITY : INFINITY));
    }
  for (std::uint64_t u = 0; u < (1ull << 32); u += 7919) xs.push_back(f(static_cast<std::uint32_t>(u)));
  int wrong = 0;
  for (float x : xs) {
    const std::uint16_t got = float_to_half(x), want = bits_of(static_cast<_Float16>(x));
    if (std::isnan(x) ? (got & 0x7c00) != 0x7c00 || !(got & 0x3ff) : got != want) {
      if (++wrong < 5) MESSAGE("x bits " << float_bits(x) << " got " << got << " want " << want);
    }
  }
  CHECK(wrong == 0);
  CHECK(xs.size() > 500000);
}

TEST_CASE("float32 → bfloat16 rounds to nearest, ties to even: every rounding boundary and a sweep") {
  std::vector<float> xs;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const std::uint32_t mid = (b << 16) | 0x8000u;
    xs.push_back(f(mid)), xs.push_back(f(mid - 1)), xs.push_back(f(mid + 1)), xs.push_back(f(b << 16));
  }
  for (std::uint64_t u = 0; u < (1ull << 32); u += 7919) xs.push_back(f(static_cast<std::uint32_t>(u)));
  int wrong = 0;
  for (float x : xs) {
    const std::uint16_t got = float_to_bfloat16(x), want = bf16_reference(x);
    if (std::isnan(x) ? (got & 0x7f80) != 0x7f80 || !(got & 0x7f) : got != want) {
      if (++wrong < 5) MESSAGE("x bits " << float_bits(x) << " got " << got << " want " << want);
    }
  }
  CHECK(wrong == 0);
  CHECK(bfloat16_to_float(0x3f80) == 1.0f);
}

namespace {
template <class T>
std::vector<std::byte> bytes_of(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}
/// sum_element over the terms (stored back to back), as the result's bits.
template <class U>
U sum_bits(ElementType type, const std::vector<U>& terms) {
  const auto b = bytes_of(terms);
  std::vector<const std::byte*> p;
  for (std::size_t i = 0; i < terms.size(); ++i) p.push_back(b.data() + i * sizeof(U));
  U out;
  std::byte o[sizeof(U)];
  sum_element(type, p.data(), static_cast<int>(p.size()), o);
  std::memcpy(&out, o, sizeof(U));
  return out;
}
}  // namespace

TEST_CASE("sums: 16-bit terms add in float32 in order and round once; float32 and float64 add in their own type") {
  // bfloat16: 1 + 2^-8 + 2^-8: each term alone rounds away in bf16 (8 bits), in float32 they add
  // up to 1 + 2^-7, which bf16 holds: rounding once keeps it.
  const std::uint16_t one = 0x3f80, tiny = float_to_bfloat16(std::ldexp(1.0f, -8));
  CHECK(sum_bits<std::uint16_t>(ElementType::bfloat16, {one, tiny, tiny}) == float_to_bfloat16(1.0f + std::ldexp(1.0f, -7)));
  CHECK(sum_bits<std::uint16_t>(ElementType::bfloat16, {one, tiny}) == one);  // a tie: to even (1.0)
  // float16: 2048 + 1 + 1 = 2050 (float32), representable; 2048 + 1 alone rounds to 2048 (tie, even).
  const std::uint16_t h2048 = float_to_half(2048.f), h1 = float_to_half(1.f);
  CHECK(sum_bits<std::uint16_t>(ElementType::float16, {h2048, h1, h1}) == float_to_half(2050.f));
  CHECK(sum_bits<std::uint16_t>(ElementType::float16, {h2048, h1}) == h2048);
  // Overflow: 65504 + 16 = 65520 rounds to infinity in binary16.
  CHECK(sum_bits<std::uint16_t>(ElementType::float16, {float_to_half(65504.f), float_to_half(16.f)}) == 0x7c00);
  // Order: (1e8 + 1) - 1e8 in float32 is 0, not 1: terms are added left to right.
  CHECK(sum_bits<float>(ElementType::float32, {1e8f, 1.f, -1e8f}) == 0.f);
  CHECK(sum_bits<double>(ElementType::float64, {1e16, 1.0, -1e16}) == 0.0);
  // Signed zeros: -0 + -0 = -0; the first term starts the sum (no +0 is added to it).
  CHECK(float_bits(sum_bits<float>(ElementType::float32, {-0.f, -0.f})) == 0x80000000u);
  CHECK(sum_bits<std::uint16_t>(ElementType::bfloat16, {0x8000, 0x8000}) == 0x8000);
  // NaN results are the canonical quiet NaN, whatever the payloads.
  CHECK(float_bits(sum_bits<float>(ElementType::float32, {f(0x7f800001u), 1.f})) == 0x7fc00000u);
  CHECK(float_bits(sum_bits<float>(ElementType::float32, {INFINITY, -INFINITY})) == 0x7fc00000u);
  CHECK(sum_bits<std::uint16_t>(ElementType::float16, {0x7c01, 0x3c00}) == 0x7e00);
  CHECK(sum_bits<std::uint16_t>(ElementType::bfloat16, {0xffc1, 0x3f80}) == 0x7fc0);
  std::uint64_t nan64;
  const double dn = sum_bits<double>(ElementType::float64, {std::nan("7"), 1.0});
  std::memcpy(&nan64, &dn, 8);
  CHECK(nan64 == 0x7ff8000000000000ull);
  // One term: rounds nothing, copies it (a NaN still becomes canonical).
  CHECK(sum_bits<std::uint16_t>(ElementType::bfloat16, {0x1234}) == 0x1234);
}

TEST_CASE("bfloat16 and float16 sums of 2..32 random terms equal the float32-accumulate-and-round reference") {
  std::uint64_t seed = 99;
  auto next = [&] {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::uint32_t>(seed >> 33);
  };
  int wrong = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const int n = 2 + static_cast<int>(next() % 31);
    std::vector<std::uint16_t> b, h;
    float acc_b = 0, acc_h = 0;
    for (int j = 0; j < n; ++j) {
      const float x = (static_cast<float>(next() % 2000001) - 1000000.f) * std::ldexp(1.0f, -static_cast<int>(next() % 24));
      b.push_back(float_to_bfloat16(x)), h.push_back(float_to_half(x / 64));
      const float xb = bfloat16_to_float(b.back()), xh = half_to_float(h.back());
      acc_b = j ? acc_b + xb : xb, acc_h = j ? acc_h + xh : xh;
    }
    wrong += sum_bits<std::uint16_t>(ElementType::bfloat16, b) != bf16_reference(acc_b);
    wrong += sum_bits<std::uint16_t>(ElementType::float16, h) != bits_of(static_cast<_Float16>(acc_h));
  }
  CHECK(wrong == 0);
}

#if ULYSSES_HOST_AVX2
namespace {
/// Lanes of the 32 float32 patterns from `base` where bf16x16_store / bf16x32_store differ from
/// float_to_bfloat16_canonical (twice each: the 16- and the 32-lane store). @pre host_has_avx512_bf16()
ULYSSES_TARGET_AVX512_BF16 std::uint64_t bf16_block_differ(std::uint64_t base) {
  alignas(64) float x[32];
  alignas(64) std::uint16_t got16[32], got32[32];
  for (int i = 0; i < 32; ++i) x[i] = ulysses::detail::bits_float(static_cast<std::uint32_t>(base + static_cast<std::uint64_t>(i)));
  ulysses::detail::bf16x16_store(reinterpret_cast<std::byte*>(got16), _mm512_loadu_ps(x));
  ulysses::detail::bf16x16_store(reinterpret_cast<std::byte*>(got16 + 16), _mm512_loadu_ps(x + 16), true);
  ulysses::detail::bf16x32_store(reinterpret_cast<std::byte*>(got32), _mm512_loadu_ps(x), _mm512_loadu_ps(x + 16), base % 64 == 0);
  _mm_sfence();
  std::uint64_t differ = 0;
  for (int i = 0; i < 32; ++i) {
    const std::uint16_t want = ulysses::detail::float_to_bfloat16_canonical(x[i]);
    differ += static_cast<std::uint64_t>(got16[i] != want) + static_cast<std::uint64_t>(got32[i] != want);
  }
  return differ;
}
/// stream_store_x32 / stream_store_x64 at every offset 0..63 of a 64-byte aligned buffer: the bytes
/// given written there and no other byte touched; how many bytes differ from that.
/// @pre host_has_avx512()
ULYSSES_TARGET_AVX512 std::uint64_t stream_store_differ() {
  std::uint64_t differ = 0;
  alignas(64) unsigned char v[64], buf[192];
  for (int i = 0; i < 64; ++i) v[i] = static_cast<unsigned char>(3 * i + 1);
  for (int width : {32, 64})
    for (int off = 0; off < 64; ++off) {
      std::memset(buf, 0xee, sizeof buf);
      std::byte* p = reinterpret_cast<std::byte*>(buf + off);
      if (width == 32) ulysses::detail::stream_store_x32(p, _mm256_load_si256(reinterpret_cast<const __m256i*>(v)));
      else ulysses::detail::stream_store_x64(p, _mm512_load_si512(v));
      _mm_sfence();
      for (int i = 0; i < static_cast<int>(sizeof buf); ++i)
        differ += buf[i] != (i >= off && i < off + width ? v[i - off] : 0xee);
    }
  return differ;
}
/// Lanes where bf16x16_load differs from the bits shifted up, over every bf16 pattern.
ULYSSES_TARGET_AVX512_BF16 std::uint64_t bf16_load_differ() {
  std::uint64_t differ = 0;
  std::uint16_t b[16];
  float w[16];
  for (std::uint32_t v = 0; v < 65536; v += 16) {
    for (std::uint32_t i = 0; i < 16; ++i) b[i] = static_cast<std::uint16_t>(v + i);
    _mm512_storeu_ps(w, ulysses::detail::bf16x16_load(reinterpret_cast<const std::byte*>(b)));
    for (std::uint32_t i = 0; i < 16; ++i) differ += ulysses::detail::float_bits(w[i]) != (v + i) << 16;
  }
  return differ;
}
}  // namespace
#endif

TEST_CASE("stream_store_x32 / stream_store_x64: the bytes at every alignment (non-temporal at 64, 32 or 16 bytes, else plain), nothing around them") {
#if ULYSSES_HOST_AVX2
  if (!ulysses::detail::host_has_avx512()) {
    MESSAGE("skipped: this CPU has no AVX-512 (the kernels that use these do not run here either)");
    return;
  }
  CHECK(stream_store_differ() == 0);
#else
  MESSAGE("skipped: no x86-64 host SIMD in this build");
#endif
}

TEST_CASE("bf16x16_store / bf16x32_store (AVX-512 BF16) == float_to_bfloat16_canonical (a sweep, and every NaN, subnormal and overflowing pattern); bf16x16_load widens exactly") {
#if ULYSSES_HOST_AVX2
  if (!ulysses::detail::host_has_avx512_bf16()) {
    MESSAGE("skipped: this CPU has no AVX512-BF16 (the kernels that use these do not run here either)");
    return;
  }
  // Every 61st block of 32 over all float32 (every binade's rounding cases), and every pattern of
  // the binades where the instruction differs or overflows: exponent fields 0 (zeros,
  // subnormals), 1, 0xfe (rounding up to infinity) and 0xff (infinities, NaNs), both signs.
  std::uint64_t differ = 0;
  for (std::uint64_t base = 0; base < (std::uint64_t{1} << 32); base += 32 * 61) differ += bf16_block_differ(base);
  for (std::uint64_t sign : {0u, 1u})
    for (std::uint64_t e : {0x00u, 0x01u, 0xfeu, 0xffu})
      for (std::uint64_t m = 0; m < (std::uint64_t{1} << 23); m += 32) differ += bf16_block_differ(sign << 31 | e << 23 | m);
  CHECK(differ == 0);
  CHECK(bf16_load_differ() == 0);
#else
  MESSAGE("skipped: no x86-64 host SIMD in this build");
#endif
}
