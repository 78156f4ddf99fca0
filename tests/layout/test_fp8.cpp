// SPDX-License-Identifier: Apache-2.0
// fp8.hpp: the OCP FP8 codec (E4M3FN, E5M2) checked exhaustively against an independent decoder
// and a round-to-nearest reference written from the format definition (double arithmetic), and
// the per-row scales on the rows of fault case C23 and on random rows.
#include <doctest/doctest.h>
#include <ulysses/layout/fp8.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fp8_rows.hpp"

using namespace ulysses;

namespace {

constexpr Fp8Format kFormats[] = {Fp8Format::e4m3, Fp8Format::e5m2};

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(std::uint32_t u) { return fp8t::from_bits(u); }

struct Def {
  int e, m, bias;
  bool e4m3;
};
Def def(Fp8Format f) { return f == Fp8Format::e4m3 ? Def{4, 3, 7, true} : Def{5, 2, 15, false}; }

/// The value of code b from the format definition, in double: NaN for NaN codes, ±inf for e5m2's
/// infinities.
double ref_decode(std::uint8_t b, Fp8Format f) {
  const Def d = def(f);
  const double sign = (b & 0x80) ? -1.0 : 1.0;
  const int exp = (b & 0x7f) >> d.m, mant = b & ((1 << d.m) - 1), top = (1 << d.e) - 1;
  if (d.e4m3 && exp == top && mant == (1 << d.m) - 1) return std::numeric_limits<double>::quiet_NaN();
  if (!d.e4m3 && exp == top) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * HUGE_VAL;
  if (exp == 0) return sign * std::ldexp(static_cast<double>(mant), 1 - d.bias - d.m);
  return sign * std::ldexp(1.0 + std::ldexp(static_cast<double>(mant), -d.m), exp - d.bias);
}

std::uint8_t max_code(Fp8Format f) { return f == Fp8Format::e4m3 ? 0x7e : 0x7b; }
std::uint8_t nan_code(Fp8Format f) { return f == Fp8Format::e4m3 ? 0x7f : 0x7e; }

/// float → fp8 by exact arithmetic: the nearer of the two neighbouring fp8 magnitudes (codes
/// 0..max_code are increasing), ties to the even code (an even last mantissa bit), saturating at
/// ±max beyond max; NaN → the canonical NaN; the sign of x on every other result.
std::uint8_t ref_encode(float x, Fp8Format f) {
  if (std::isnan(x)) return nan_code(f);
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(static_cast<double>(x));
  const std::uint8_t mc = max_code(f);
  if (a >= ref_decode(mc, f)) return static_cast<std::uint8_t>(sign | mc);
  int lo = 0, hi = mc;  // the largest code with value <= a
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (ref_decode(static_cast<std::uint8_t>(mid), f) <= a) lo = mid; else hi = mid - 1;
  }
  const double vlo = ref_decode(static_cast<std::uint8_t>(lo), f), vhi = ref_decode(static_cast<std::uint8_t>(lo + 1), f);
  int c = lo;
  if (a - vlo > vhi - a || (a - vlo == vhi - a && (lo & 1))) c = lo + 1;
  return static_cast<std::uint8_t>(sign | c);
}

/// The fp8 spacing (one step) at magnitude |y| in format f: 2^(e - m) in the binade [2^e, 2^(e+1)),
/// the subnormal step 2^(1 - bias - m) below the smallest normal, the top binade's above max.
double fp8_ulp(double y, Fp8Format f) {
  const Def d = def(f);
  const double a = std::fabs(y);
  int e = 1 - d.bias;
  while (e < (f == Fp8Format::e4m3 ? 8 : 15) && a >= std::ldexp(1.0, e + 1)) ++e;
  return std::ldexp(1.0, e - d.m);
}

bool same_bits(float a, float b) { return bits(a) == bits(b); }

}  // namespace

TEST_CASE("fp8 formats: names and maxima") {
  CHECK(std::string(to_string(Fp8Format::e4m3)) == "e4m3");
  CHECK(std::string(to_string(Fp8Format::e5m2)) == "e5m2");
  CHECK(static_cast<int>(Fp8Format::e4m3) == 1);
  CHECK(static_cast<int>(Fp8Format::e5m2) == 2);
  CHECK(fp8_max(Fp8Format::e4m3) == 448.0f);
  CHECK(fp8_max(Fp8Format::e5m2) == 57344.0f);
  CHECK(ref_decode(0x7e, Fp8Format::e4m3) == 448.0);
  CHECK(ref_decode(0x7b, Fp8Format::e5m2) == 57344.0);
}

TEST_CASE("fp8 → float is exact for all 256 codes of both formats, float → fp8 gives the code back, and dequantize_fp8 agrees") {
  for (Fp8Format f : kFormats) {
    const std::string fmt = to_string(f);
    CAPTURE(fmt);
    int wrong = 0, nans = 0, infs = 0;
    for (int c = 0; c < 256; ++c) {
      const auto b = static_cast<std::uint8_t>(c);
      const double want = ref_decode(b, f);
      const float got = fp8_to_float(b, f);
      if (std::isnan(want)) {
        ++nans;
        if (!std::isnan(got) || std::signbit(got) != ((c & 0x80) != 0)) ++wrong;
        if (float_to_fp8(got, f) != nan_code(f)) ++wrong;
        continue;
      }
      if (std::isinf(want)) ++infs;
      if (static_cast<double>(got) != want || std::signbit(got) != std::signbit(want)) ++wrong;
      // Back: every finite code is its own value's code; e5m2's infinities saturate to ±max.
      const std::uint8_t back = float_to_fp8(got, f);
      const std::uint8_t expect = std::isinf(want) ? static_cast<std::uint8_t>((c & 0x80) | max_code(f)) : b;
      if (back != expect) ++wrong;
    }
    CHECK(wrong == 0);
    CHECK(nans == (f == Fp8Format::e4m3 ? 2 : 6));
    CHECK(infs == (f == Fp8Format::e4m3 ? 0 : 2));
  }
  CHECK(same_bits(fp8_to_float(0x80, Fp8Format::e4m3), -0.0f));
  CHECK(same_bits(fp8_to_float(0x80, Fp8Format::e5m2), -0.0f));
  CHECK(fp8_to_float(0x01, Fp8Format::e4m3) == std::ldexp(1.0f, -9));
  CHECK(fp8_to_float(0x01, Fp8Format::e5m2) == std::ldexp(1.0f, -16));
  CHECK(fp8_to_float(0x7c, Fp8Format::e5m2) == HUGE_VALF);
  // The branch-free decode dequantize_fp8 runs gives fp8_to_float's bits for every code, NaNs'
  // signs included.
  for (int c = 0; c < 256; ++c) {
    CHECK(same_bits(detail::fp8_value<3, 7, true>(static_cast<std::uint32_t>(c)), fp8_to_float(static_cast<std::uint8_t>(c), Fp8Format::e4m3)));
    CHECK(same_bits(detail::fp8_value<2, 15, false>(static_cast<std::uint32_t>(c)), fp8_to_float(static_cast<std::uint8_t>(c), Fp8Format::e5m2)));
  }
  // dequantize_fp8 (that decode, in this CPU's widest twin) gives fp8_to_float(q) * scale bit for
  // bit, and the canonical NaN 0x7fc00000 for every NaN code or scale, whatever their signs and payloads.
  const float nan_scales[] = {std::nanf(""), -std::nanf(""), detail::bits_float(0x7fc12345u)};
  for (Fp8Format f : kFormats)
    for (float scale : {1.0f, 0.0078125f, 3.3f, 1.17549435e-38f, nan_scales[0], nan_scales[1], nan_scales[2]}) {
      std::uint8_t q[256];
      float got[256];
      for (int c = 0; c < 256; ++c) q[c] = static_cast<std::uint8_t>(c);
      dequantize_fp8(q, 256, scale, f, got);
      int wrong = 0;
      for (int c = 0; c < 256; ++c) {
        const float want = fp8_to_float(q[c], f) * scale;
        wrong += !same_bits(got[c], std::isnan(want) ? detail::bits_float(0x7fc00000u) : want);
      }
      CAPTURE(scale);
      CHECK(wrong == 0);
    }
}

TEST_CASE("float → fp8 rounds to nearest, ties to even, saturating: a dense sweep and every midpoint") {
  // Every float whose top 16 bits vary (low halves 0, 1, 0x7fff, 0x8000, 0xffff); then at every
  // pair of neighbouring fp8 magnitudes, the exact midpoint (a float) and the floats 1 and 2 ulps
  // either side, both signs; and the top: max, beyond it, FLT_MAX, infinity.
  std::vector<float> xs;
  for (std::uint32_t hi = 0; hi < 65536; ++hi)
    for (std::uint32_t lo : {0u, 1u, 0x7fffu, 0x8000u, 0xffffu}) xs.push_back(from_bits((hi << 16) | lo));
  for (Fp8Format f : kFormats)
    for (int c = 0; c < max_code(f); ++c) {
      const float a = fp8_to_float(static_cast<std::uint8_t>(c), f), b = fp8_to_float(static_cast<std::uint8_t>(c + 1), f);
      const float mid = (a + b) / 2;  // exact: fp8 values have few bits
      REQUIRE(static_cast<double>(mid) == (static_cast<double>(a) + b) / 2);
      for (int k = -2; k <= 2; ++k)
        for (std::uint32_t s : {0u, 0x80000000u}) xs.push_back(from_bits((bits(mid) + static_cast<std::uint32_t>(k)) ^ s));
      xs.push_back(a), xs.push_back(b);
    }
  for (float t : {448.0f, 464.0f, 479.99997f, 480.0f, 480.00003f, 57344.0f, 61439.996f, 61440.0f, 61440.004f, 1e30f,
                  from_bits(0x7f7fffffu), HUGE_VALF, std::ldexp(1.0f, -126), std::ldexp(1.0f, -149), 0.0f})
    for (float s : {1.0f, -1.0f}) xs.push_back(t * s);
  for (Fp8Format f : kFormats) {
    const std::string fmt = to_string(f);
    CAPTURE(fmt);
    long long wrong = 0, ties = 0;
    float first_wrong = 0;
    for (float x : xs) {
      const std::uint8_t got = float_to_fp8(x, f), want = ref_encode(x, f);
      if (got != want && wrong++ == 0) first_wrong = x;
      if (!std::isnan(x) && std::fabs(x) < fp8_max(f)) {
        const std::uint8_t c = static_cast<std::uint8_t>(want & 0x7f);
        if (c > 0 && std::fabs(static_cast<double>(x)) - ref_decode(static_cast<std::uint8_t>(c - 1), f) ==
                         ref_decode(c, f) - std::fabs(static_cast<double>(x)))
          ++ties;
      }
    }
    CAPTURE(first_wrong);
    CHECK(wrong == 0);
    CHECK(ties > 100);  // the sweep does hit ties (and they went to even)
    MESSAGE(fmt << ": " << xs.size() << " floats, " << ties << " ties");
  }
  // The rules by example.
  CHECK(float_to_fp8(-0.0f, Fp8Format::e4m3) == 0x80);
  CHECK(float_to_fp8(-1e-30f, Fp8Format::e5m2) == 0x80);
  CHECK(float_to_fp8(HUGE_VALF, Fp8Format::e4m3) == 0x7e);
  CHECK(float_to_fp8(-HUGE_VALF, Fp8Format::e5m2) == 0xfb);
  CHECK(float_to_fp8(-std::numeric_limits<float>::quiet_NaN(), Fp8Format::e4m3) == 0x7f);
  CHECK(float_to_fp8(from_bits(0xff800001u), Fp8Format::e5m2) == 0x7e);
  CHECK(float_to_fp8(1000.0f, Fp8Format::e4m3) == 0x7e);
  CHECK(float_to_fp8(std::ldexp(1.0f, -10), Fp8Format::e4m3) == 0x00);  // half the smallest subnormal: tie to 0
  CHECK(float_to_fp8(std::ldexp(3.0f, -10), Fp8Format::e4m3) == 0x02);  // 1.5 steps: tie to 2
  CHECK(float_to_fp8(std::ldexp(15.0f, -10), Fp8Format::e4m3) == 0x08);  // 7.5 steps: to the smallest normal
}

TEST_CASE("row_amax: the largest magnitude, NaN-propagating") {
  const float x[] = {1.0f, -3.5f, 2.0f, -0.0f};
  CHECK(row_amax(x, 4) == 3.5f);
  CHECK(row_amax(x, 0) == 0.0f);
  CHECK(!std::signbit(row_amax(x, 0)));
  const float z[] = {-0.0f, -0.0f};
  CHECK(same_bits(row_amax(z, 2), 0.0f));  // +0
  const float n[] = {1.0f, std::numeric_limits<float>::quiet_NaN(), 5.0f};
  CHECK(std::isnan(row_amax(n, 3)));
  const float i[] = {1.0f, -HUGE_VALF};
  CHECK(row_amax(i, 2) == HUGE_VALF);
}

TEST_CASE("row_amax's AVX-512 and AVX2 kernels (where the CPU has them) == row_amax_loop, bit for bit: every length 0..70, a NaN or an infinity at every position, the maximum at every position") {
  using ulysses::detail::bits_float;
  using ulysses::detail::float_bits;
  using ulysses::detail::row_amax_loop;
  std::vector<float (*)(const float*, std::int64_t)> kernels;
#if ULYSSES_HOST_AVX2
  if (ulysses::detail::host_has_avx512()) kernels.push_back(&ulysses::detail::row_amax_avx512);
  if (ulysses::detail::host_has_avx2()) kernels.push_back(&ulysses::detail::row_amax_avx2);
#endif
  if (kernels.empty()) MESSAGE("no AVX2 on this CPU: row_amax is row_amax_loop");
  std::uint64_t rows = 0, differ = 0;
  std::uint32_t seed = 12345;
  for (std::int64_t n = 0; n <= 70; ++n) {
    std::vector<float> x(static_cast<std::size_t>(n) + 1);  // one more: a kernel must not read it
    for (std::int64_t special = -1; special < n; ++special)
      for (std::uint32_t what : {0x7fc00001u, 0xffa00000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu, 0x80000000u}) {
        for (auto& v : x) {
          seed = seed * 1664525u + 1013904223u;
          v = bits_float((seed & 0x80000000u) | (seed >> 9 & 0x3fffffffu));  // any sign, magnitudes below 2
        }
        x[static_cast<std::size_t>(n)] = bits_float(0x7f900000u);  // a NaN past the end
        if (special >= 0) x[static_cast<std::size_t>(special)] = bits_float(what);
        const std::uint32_t want = float_bits(row_amax_loop(x.data(), n));
        for (auto k : kernels) differ += float_bits(k(x.data(), n)) != want;
        ++rows;
      }
  }
  MESSAGE("rows: " << rows << ", kernels: " << kernels.size());
  CHECK(rows > 10000);
  CHECK(differ == 0);
}

TEST_CASE("fp8_scale_of: amax / fp8_max, floored at FLT_MIN; the top and the non-finite amax") {
  for (Fp8Format f : kFormats) {
    const std::string fmt = to_string(f);
    CAPTURE(fmt);
    const float m = fp8_max(f), flt_min = fp8t::kFloatMin, flt_max = from_bits(0x7f7fffffu);
    CHECK(same_bits(fp8_scale_of(0.0f, f), flt_min));
    CHECK(same_bits(fp8_scale_of(-0.0f, f), flt_min));
    CHECK(same_bits(fp8_scale_of(1e-43f, f), flt_min));
    CHECK(same_bits(fp8_scale_of(1e-40f, f), flt_min));
    CHECK(same_bits(fp8_scale_of(flt_min, f), flt_min));
    CHECK(same_bits(fp8_scale_of(m * flt_min, f), flt_min));  // the first unfloored amax
    CHECK(same_bits(fp8_scale_of(2 * m * flt_min, f), 2 * flt_min));
    CHECK(fp8_scale_of(1.0f, f) == 1.0f / m);
    CHECK(fp8_scale_of(-6.0f, f) == 6.0f / m);  // the sign of amax is ignored
    CHECK(fp8_scale_of(3e38f, f) == 3e38f / m);
    CHECK(std::isnan(fp8_scale_of(std::numeric_limits<float>::quiet_NaN(), f)));
    // The top: fp8_max * scale (the largest dequantized magnitude) is finite; +inf is FLT_MAX's.
    const float top = fp8_scale_of(flt_max, f);
    CHECK(std::isfinite(m * top));
    CHECK(same_bits(top, flt_max / m));
    CHECK(static_cast<double>(top) <= static_cast<double>(flt_max) / m);  // rounded down
    CHECK(same_bits(fp8_scale_of(HUGE_VALF, f), top));
    CHECK(same_bits(fp8_scale_of(-HUGE_VALF, f), top));
    MESSAGE(fmt << ": scale of FLT_MAX and of inf = " << top << " (FLT_MAX / max = " << flt_max / m << ")");
    // Exactly amax / fp8_max (the correctly rounded quotient) over the normal range.
    std::mt19937 gen(7);
    std::uniform_int_distribution<std::uint32_t> u(bits(m * flt_min), 0x7effffffu);
    int wrong = 0;
    for (int k = 0; k < 200000; ++k) {
      const float a = from_bits(u(gen));
      const float s = fp8_scale_of(a, f);
      if (!same_bits(s, a / m) || !same_bits(s, static_cast<float>(static_cast<double>(a) / m))) ++wrong;
    }
    CHECK(wrong == 0);
  }
}

namespace {

/// Quantizes and dequantizes one row of C23 and checks it: the scale is a normal float; no code
/// decodes to NaN or infinity and no dequantized value is NaN or infinite; a zero element gives the
/// code of its sign (0x00 / 0x80) and comes back as exactly that zero; every element comes back
/// within half an fp8 step of x / scale (in fp8 units, from the float quotient), times the scale;
/// and, in floats, |dequant - x| <= (half an fp8 step at x / scale) * scale plus 2^-22 |x| (the
/// float32 roundings of x / scale and of q * scale). A tiny row (scale floored at FLT_MIN) comes
/// back as ±0 or within one fp8 step at x / scale (times the scale).
void check_row(const fp8t::Row& row, Fp8Format f) {
  CAPTURE(row.name);
  const std::int64_t n = fp8t::kD;
  const float amax = row_amax(row.x.data(), n), scale = fp8_scale_of(amax, f);
  REQUIRE(std::isfinite(scale));
  REQUIRE(scale >= fp8t::kFloatMin);
  if (row.kind != fp8t::Row::ordinary) CHECK(same_bits(scale, fp8t::kFloatMin));
  std::uint8_t q[fp8t::kD];
  float back[fp8t::kD];
  quantize_fp8(row.x.data(), n, scale, f, q);
  dequantize_fp8(q, n, scale, f, back);
  for (std::size_t i = 0; i < row.x.size(); ++i) {
    CAPTURE(i);
    const float x = row.x[i], v = fp8_to_float(q[i], f);
    CAPTURE(x);
    CAPTURE(static_cast<int>(q[i]));
    REQUIRE(std::isfinite(v));
    REQUIRE(std::isfinite(back[i]));
    if (x == 0.0f) {
      CHECK(q[i] == (std::signbit(x) ? 0x80 : 0x00));
      CHECK(same_bits(back[i], x));
      continue;
    }
    const double y = static_cast<double>(x / scale), ulp = fp8_ulp(y, f);
    CHECK(std::fabs(static_cast<double>(v) - y) <= ulp / 2);
    const double err = std::fabs(static_cast<double>(back[i]) - x);
    if (row.kind == fp8t::Row::tiny)
      CHECK((back[i] == 0.0f || err <= ulp * scale));
    CHECK(err <= ulp / 2 * scale + std::ldexp(std::fabs(static_cast<double>(x)), -22));
    if (back[i] == 0.0f) CHECK(std::signbit(back[i]) == std::signbit(x));
  }
}

}  // namespace

TEST_CASE("C23: per-(token, head) fp8 scales on zero, tiny, huge, padding and ordinary rows: no NaN or inf, zeros keep their sign") {
  const std::vector<fp8t::Row> rows = fp8t::c23_rows();
  for (Fp8Format f : kFormats) {
    const std::string fmt = to_string(f);
    CAPTURE(fmt);
    for (const fp8t::Row& row : rows) check_row(row, f);
    // The zero rows' bytes, exactly.
    std::uint8_t q[fp8t::kD];
    quantize_fp8(rows[0].x.data(), fp8t::kD, fp8_scale_of(0.0f, f), f, q);
    for (std::uint8_t b : q) CHECK(b == 0x00);
    quantize_fp8(rows[1].x.data(), fp8t::kD, fp8_scale_of(row_amax(rows[1].x.data(), fp8t::kD), f), f, q);
    for (std::uint8_t b : q) CHECK(b == 0x80);
    // 1e-43 / FLT_MIN ≈ 8.5e-6: below half e4m3's smallest subnormal (2^-10 ≈ 9.8e-4): +0; above
    // half e5m2's (2^-17 ≈ 7.6e-6): its smallest subnormal, 2^-16 * FLT_MIN ≈ 1.8e-43 back.
    quantize_fp8(rows[2].x.data(), fp8t::kD, fp8_scale_of(1e-43f, f), f, q);
    CHECK(q[5] == (f == Fp8Format::e4m3 ? 0x00 : 0x01));
    CHECK(q[6] == 0x80);
  }
}

TEST_CASE("C23 beyond the case: an infinite element saturates, a NaN row stays NaN (the documented rules)") {
  for (Fp8Format f : kFormats) {
    const std::string fmt = to_string(f);
    CAPTURE(fmt);
    std::vector<float> x = fp8t::spread(2.0f);
    x[4] = -HUGE_VALF;
    const float scale = fp8_scale_of(row_amax(x.data(), fp8t::kD), f);
    std::uint8_t q[fp8t::kD];
    float back[fp8t::kD];
    quantize_fp8(x.data(), fp8t::kD, scale, f, q);
    dequantize_fp8(q, fp8t::kD, scale, f, back);
    CHECK(q[4] == (0x80 | max_code(f)));
    for (float v : back) CHECK(std::isfinite(v));
    CHECK(back[4] == -fp8_max(f) * scale);
    CHECK(back[3] == 0.0f);  // 2 / (FLT_MAX / max): far below the smallest step
    x[4] = std::numeric_limits<float>::quiet_NaN();
    const float nan_scale = fp8_scale_of(row_amax(x.data(), fp8t::kD), f);
    CHECK(std::isnan(nan_scale));
    quantize_fp8(x.data(), fp8t::kD, nan_scale, f, q);
    dequantize_fp8(q, fp8t::kD, nan_scale, f, back);
    for (std::uint8_t b : q) CHECK(b == nan_code(f));
    for (float v : back) CHECK(std::isnan(v));
  }
}

TEST_CASE("round trip: dequantize(quantize(x)) within the fp8 bound of x for random rows, and the scale is amax / fp8_max") {
  std::mt19937 gen(20260);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-100, 100);
  for (Fp8Format f : kFormats) {
    const std::string fmt = to_string(f);
    CAPTURE(fmt);
    long long bad = 0, zeros = 0, checked = 0;
    for (int r = 0; r < 20000; ++r) {
      std::vector<float> x(64);
      const int ex = e(gen);
      for (float& v : x) v = std::ldexp(u(gen), ex);
      const float amax = row_amax(x.data(), 64), scale = fp8_scale_of(amax, f);
      if (!same_bits(scale, amax / fp8_max(f))) ++bad;
      std::vector<std::uint8_t> q(64);
      std::vector<float> back(64);
      quantize_fp8(x.data(), 64, scale, f, q.data());
      dequantize_fp8(q.data(), 64, scale, f, back.data());
      for (std::size_t i = 0; i < x.size(); ++i) {
        const double y = static_cast<double>(x[i] / scale), ulp = fp8_ulp(y, f);
        const double err = std::fabs(static_cast<double>(back[i]) - x[i]);
        if (!(std::fabs(static_cast<double>(fp8_to_float(q[i], f)) - y) <= ulp / 2)) ++bad;
        if (!(err <= ulp / 2 * scale + std::ldexp(std::fabs(static_cast<double>(x[i])), -22))) ++bad;
        zeros += back[i] == 0.0f;
        ++checked;
      }
    }
    CHECK(bad == 0);
    MESSAGE(fmt << ": " << checked << " elements, " << zeros << " came back as 0");
  }
}

TEST_CASE("fp8_code (quantize_fp8's branch-free encoder) == float_to_fp8: every 251st float32, and every float32 near the subnormal boundary and the largest finite value") {
  using ulysses::detail::bits_float;
  using ulysses::detail::fp8_code;
  std::uint64_t checked = 0, differ = 0;
  auto check = [&](std::uint32_t u) {
    const float x = bits_float(u);
    differ += fp8_code<3, 7, 0x7e, 0x7f>(x) != ulysses::float_to_fp8(x, ulysses::Fp8Format::e4m3);
    differ += fp8_code<2, 15, 0x7b, 0x7e>(x) != ulysses::float_to_fp8(x, ulysses::Fp8Format::e5m2);
    ++checked;
  };
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 251) check(static_cast<std::uint32_t>(u));
  for (std::uint32_t sign : {0u, 0x80000000u})
    for (std::uint32_t e : {112u, 113u, 114u, 115u, 116u, 117u, 118u, 119u, 120u, 121u, 122u, 123u, 141u, 142u, 143u})  // 2^-15 .. 2^-4, 2^14 .. 2^16
      for (std::uint32_t m = 0; m < (1u << 23); m += 3) check(sign | e << 23 | m);
  MESSAGE("floats checked: " << checked);
  CHECK(differ == 0);
}

TEST_CASE("quantize_fp8 and dequantize_fp8 (their AVX-512 kernels where the CPU has them) == fp8_code and the plain loop: every 251st float32, and every float32 near the subnormal boundary and the largest finite value, as rows of 4096 and a tail") {
  using ulysses::detail::bits_float;
  using ulysses::detail::fp8_code;
  std::vector<float> row, back, want;
  std::vector<std::uint8_t> q4, q5;
  std::uint64_t checked = 0, differ = 0, avx2_rows = 0;
  auto flush = [&] {  // scale 1: x / 1 is x, so the codes are fp8_code(x)'s
    const auto n = static_cast<std::int64_t>(row.size());
    q4.assign(row.size(), 0);
    q5.assign(row.size(), 0);
    ulysses::quantize_fp8(row.data(), n, 1.0f, ulysses::Fp8Format::e4m3, q4.data());
    ulysses::quantize_fp8(row.data(), n, 1.0f, ulysses::Fp8Format::e5m2, q5.data());
    for (std::size_t i = 0; i < row.size(); ++i) {
      differ += q4[i] != fp8_code<3, 7, 0x7e, 0x7f>(row[i]);
      differ += q5[i] != fp8_code<2, 15, 0x7b, 0x7e>(row[i]);
    }
#if ULYSSES_HOST_AVX2
    if (ulysses::detail::host_has_avx2()) {  // the AVX2 kernels too (what a CPU without AVX-512 runs)
      std::vector<std::uint8_t> a4(row.size()), a5(row.size());
      ulysses::detail::quantize_fp8_avx2(row.data(), n, 1.0f, ulysses::Fp8Format::e4m3, a4.data());
      ulysses::detail::quantize_fp8_avx2(row.data(), n, 1.0f, ulysses::Fp8Format::e5m2, a5.data());
      differ += static_cast<std::uint64_t>(a4 != q4) + static_cast<std::uint64_t>(a5 != q5);
      for (auto [q, f] : {std::pair{&q4, ulysses::Fp8Format::e4m3}, std::pair{&q5, ulysses::Fp8Format::e5m2}}) {
        std::vector<float> b(row.size()), w(row.size());
        ulysses::detail::dequantize_fp8_avx2(q->data(), n, 0.7f, f, b.data());
        ulysses::detail::dequantize_codes(q->data(), n, 0.7f, f, w.data());
        differ += static_cast<std::uint64_t>(std::memcmp(b.data(), w.data(), row.size() * sizeof(float)) != 0);
      }
      ++avx2_rows;
    }
#endif
    // and back: dequantize_fp8 (its AVX-512 kernel) == the plain loop, bit for bit, at a scale
    // that is not a power of two (the product rounds)
    for (auto [q, f] : {std::pair{&q4, ulysses::Fp8Format::e4m3}, std::pair{&q5, ulysses::Fp8Format::e5m2}}) {
      back.assign(row.size(), 0.0f);
      want.assign(row.size(), 0.0f);
      ulysses::dequantize_fp8(q->data(), n, 0.7f, f, back.data());
      ulysses::detail::dequantize_codes(q->data(), n, 0.7f, f, want.data());
      differ += static_cast<std::uint64_t>(std::memcmp(back.data(), want.data(), row.size() * sizeof(float)) != 0);
    }
    checked += row.size();
    row.clear();
  };
  auto add = [&](std::uint32_t u) {
    row.push_back(bits_float(u));
    if (row.size() == 4096) flush();
  };
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 251) add(static_cast<std::uint32_t>(u));
  for (std::uint32_t sign : {0u, 0x80000000u})
    for (std::uint32_t e : {112u, 113u, 114u, 115u, 116u, 117u, 118u, 119u, 120u, 121u, 122u, 123u, 141u, 142u, 143u})
      for (std::uint32_t m = 0; m < (1u << 23); m += 3) add(sign | e << 23 | m);
  for (int i = 0; i < 13; ++i) add(0x3f800000u + static_cast<std::uint32_t>(i) * 77777u);  // a row whose length is no multiple of 16
  flush();
  MESSAGE("floats checked: " << checked << ", rows also through the AVX2 kernels: " << avx2_rows);
  CHECK(differ == 0);
}

TEST_CASE("quantize_fp8 and its AVX2 kernel (where the CPU has it) == the plain loop of x / scale at 3000 scales that are no power of two, and at the edges of the normal range: the elements at and beside every tie of both formats, and random bits") {
  using ulysses::detail::bits_float;
  std::mt19937 rng(20261207);
  std::vector<float> scales = {1.0f / 3.0f, 0.7f, 3.0f, 1e-30f, 1e30f, bits_float(0x00800000u), bits_float(0x00800001u),
                               bits_float(0x7e800000u), bits_float(0x7e7fffffu), bits_float(0x7e800001u), bits_float(0x007fffffu), bits_float(0x7f7fffffu)};
  std::uniform_int_distribution<std::uint32_t> any_scale(0x00800000u, 0x7e800000u), amax_bits(0x00000001u, 0x7f7fffffu);
  for (int i = 0; i < 2000; ++i) scales.push_back(bits_float(any_scale(rng)));
  for (int i = 0; i < 1000; ++i) scales.push_back(ulysses::fp8_scale_of(bits_float(amax_bits(rng)), i % 2 ? Fp8Format::e5m2 : Fp8Format::e4m3));
  std::uint64_t checked = 0, differ = 0, at_ties = 0;
  for (Fp8Format f : kFormats) {
    // the fp8 magnitudes and the midpoints between neighbours (exact in float32), and one beyond max
    std::vector<float> grid;
    for (int c = 0; c < max_code(f); ++c) {
      const double a = ref_decode(static_cast<std::uint8_t>(c), f), b = ref_decode(static_cast<std::uint8_t>(c + 1), f);
      grid.push_back(static_cast<float>(a));
      grid.push_back(static_cast<float>((a + b) / 2));
    }
    grid.push_back(static_cast<float>(ref_decode(max_code(f), f) * 1.0625));
    std::vector<float> row;
    std::vector<std::uint8_t> got, want;
    for (float s : scales) {
      row.clear();
      for (float v : grid)
        for (int k = -6; k <= 6; ++k) {  // the floats around v * s (whose quotients fall at v or beside it)
          const std::uint32_t u = bits(v * s);
          if (u == 0 || u >= 0x7f800000u) continue;
          const float x = bits_float(static_cast<std::uint32_t>(static_cast<std::int64_t>(u) + k));
          row.push_back(x);
          row.push_back(-x);
          at_ties += ref_encode(x / s, f) != ref_encode(bits_float(bits(x / s) ^ 1u), f);  // the quotient's neighbour has another code
        }
      for (int i = 0; i < 61; ++i) row.push_back(bits_float(rng()));  // and anything, NaN and infinity included; a tail
      const auto n = static_cast<std::int64_t>(row.size());
      got.assign(row.size(), 0);
      want.assign(row.size(), 0);
      ulysses::detail::quantize_codes(row.data(), n, s, f, want.data());
      ulysses::quantize_fp8(row.data(), n, s, f, got.data());
      differ += static_cast<std::uint64_t>(got != want);
#if ULYSSES_HOST_AVX2
      if (ulysses::detail::host_has_avx2()) {
        ulysses::detail::quantize_fp8_avx2(row.data(), n, s, f, got.data());
        differ += static_cast<std::uint64_t>(got != want);
      }
#endif
      checked += row.size();
    }
  }
  MESSAGE("elements checked: " << checked << ", of them with a quotient whose float32 neighbour has another code: " << at_ties);
  CHECK(at_ties > 10000);
  CHECK(differ == 0);
}

TEST_CASE("a row below the scale's floor (amax < fp8_max * FLT_MIN): scale FLT_MIN, the round trip within 2^-(m+1) |x| + half a subnormal step of FLT_MIN, the tiny elements back as zeros of their sign (breaker's row)") {
  using ulysses::detail::bits_float;
  const float flt_min = bits_float(0x00800000u);
  const std::vector<float> row = {1e-36f, 3e-42f, 5e-42f, -1.1e-41f, 0.0f, -2e-37f};
  for (Fp8Format f : kFormats) {
    CAPTURE(ulysses::to_string(f));
    const float s = ulysses::fp8_scale_of(ulysses::row_amax(row.data(), 6), f);
    CHECK(bits(s) == bits(flt_min));
    std::vector<std::uint8_t> q(6);
    std::vector<float> back(6);
    ulysses::quantize_fp8(row.data(), 6, s, f, q.data());
    ulysses::dequantize_fp8(q.data(), 6, s, f, back.data());
    const int m = f == Fp8Format::e4m3 ? 3 : 2;
    const double half_sub = std::ldexp(static_cast<double>(flt_min), f == Fp8Format::e4m3 ? -10 : -17);
    for (std::size_t i = 0; i < row.size(); ++i) {
      CAPTURE(i);
      const double x = row[i], err = std::fabs(static_cast<double>(back[i]) - x);
      CHECK(err <= std::ldexp(std::fabs(x), -(m + 1)) * (1 + 1e-6) + half_sub);
      if (std::fabs(x) < half_sub) CHECK(bits(back[i]) == (std::signbit(row[i]) ? 0x80000000u : 0u));
    }
    if (f == Fp8Format::e4m3) CHECK(bits(back[3]) == 0x80000000u);  // -1.1e-41 < 2^-10 FLT_MIN = 1.15e-41: -0 (e5m2 keeps it)
  }
}
