// SPDX-License-Identifier: Apache-2.0
// Whole tensors and their rows for the row-transform and all-gather tests (test_transform,
// test_transform_mpi, test_allgather): a bf16 type, an independent double → bf16 rounding, the
// element glue E<T>, a global tensor [B, S, H, D] with seeded values, and the reference that
// runs every row through a function at its global (batch, token, head).
#pragma once

#include <doctest/doctest.h>
#include <ulysses/layout/element.hpp>
#include <ulysses/layout/transform.hpp>

#include "harness.hpp"  // same_bits()

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace ut {
/// A bfloat16 element as its bits (ElementType::bfloat16).
struct bf16 {
  std::uint16_t bits;
};
}  // namespace ut
template <>
struct ulysses::element_type_of<ut::bf16> : std::integral_constant<ulysses::ElementType, ulysses::ElementType::bfloat16> {};

namespace ut {
using ulysses::RowCoord;

/// double → bfloat16 bits, one rounding to nearest even, from the double's own bits (independent
/// of the library's round-to-odd); normal range only (the tests' values are).
inline std::uint16_t bf16_of(double x) {
  std::uint64_t u;
  std::memcpy(&u, &x, 8);
  const std::uint64_t sign = u >> 63;
  const int e = static_cast<int>((u >> 52) & 0x7ff) - 1023;
  if (x == 0) return static_cast<std::uint16_t>(sign << 15);
  REQUIRE(e > -126);
  std::uint64_t m = u & ((std::uint64_t{1} << 52) - 1);
  std::uint64_t keep = m >> 45, rem = m & ((std::uint64_t{1} << 45) - 1);
  const std::uint64_t half = std::uint64_t{1} << 44;
  int ee = e;
  if (rem > half || (rem == half && (keep & 1))) {
    if (++keep == 128) keep = 0, ++ee;
  }
  REQUIRE(ee < 128);
  return static_cast<std::uint16_t>(sign << 15 | static_cast<std::uint64_t>(ee + 127) << 7 | keep);
}
inline double bf16_value(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// Element-type glue of the test: float or bf16, stored / read as double, rounded once.
template <class T>
struct E;
template <>
struct E<float> {
  static float of(double x) { return static_cast<float>(x); }
  static double value(float x) { return x; }
  static const char* name() { return "float32"; }
};
template <>
struct E<bf16> {
  static bf16 of(double x) { return {bf16_of(x)}; }
  static double value(bf16 x) { return bf16_value(x.bits); }
  static const char* name() { return "bfloat16"; }
};

/// An element as its bits and value: "0x3f9ed000 (1.24071)".
template <class T>
std::string bits_of(const T& x) {
  std::uint32_t u = 0;
  std::memcpy(&u, &x, sizeof(T));
  char buf[64];
  std::snprintf(buf, sizeof buf, "0x%0*x (%.9g)", static_cast<int>(2 * sizeof(T)), static_cast<unsigned>(u), E<T>::value(x));
  return buf;
}

/// A whole tensor [B, S, H, D] (global), dense bshd, values on the element grid.
template <class T>
struct Global {
  std::int64_t B, S, H, D;
  std::vector<T> x;
  T& at(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) { return x[static_cast<std::size_t>(((b * S + s) * H + h) * D + d)]; }
  const T& at(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const {
    return x[static_cast<std::size_t>(((b * S + s) * H + h) * D + d)];
  }
};
template <class T>
Global<T> random_tensor(std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D, unsigned seed) {
  Global<T> g{B, S, H, D, {}};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-4.0, 4.0);
  for (std::int64_t i = 0; i < B * S * H * D; ++i) {
    double v = u(rng);
    if (std::abs(v) < 1e-3) v = 0.5;  // normal range for the bf16 reference
    g.x.push_back(E<T>::of(v));
  }
  return g;
}

/// The reference: every row of g through `f` at its global (b, s, h), rounded once.
template <class T, class F>
Global<T> transformed(const Global<T>& g, const F& f) {
  Global<T> o = g;
  std::vector<double> row(static_cast<std::size_t>(g.D));
  for (std::int64_t b = 0; b < g.B; ++b)
    for (std::int64_t s = 0; s < g.S; ++s)
      for (std::int64_t h = 0; h < g.H; ++h) {
        for (std::int64_t d = 0; d < g.D; ++d) row[static_cast<std::size_t>(d)] = E<T>::value(g.at(b, s, h, d));
        f(RowCoord{b, s, h}, row.data(), g.D);
        for (std::int64_t d = 0; d < g.D; ++d) o.at(b, s, h, d) = E<T>::of(row[static_cast<std::size_t>(d)]);
      }
  return o;
}

}  // namespace ut
