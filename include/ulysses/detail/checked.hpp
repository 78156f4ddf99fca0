// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Overflow-checked int64 arithmetic and small string helpers for error messages.
#pragma once

#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "../error.hpp"

ULYSSES_NAMESPACE_BEGIN
namespace detail {

/// Throws Error(size_overflow) naming `what` and the operation `a op b` that overflowed.
[[noreturn]] inline void fail_overflow(const char* what, std::int64_t a, const char* op, std::int64_t b) {
  std::ostringstream m;
  m << what << ": " << a << " " << op << " " << b << " overflows int64";
  fail(Errc::size_overflow, m.str());
}

/// a * b, or Error(size_overflow) naming `what`.
inline std::int64_t mul(std::int64_t a, std::int64_t b, const char* what) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) fail_overflow(what, a, "*", b);
  return r;
}

/// a + b, or Error(size_overflow) naming `what`.
inline std::int64_t add(std::int64_t a, std::int64_t b, const char* what) {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) fail_overflow(what, a, "+", b);
  return r;
}

/// "{1,2,4}" from a list of numbers (at most `max` shown, then "...").
template <class T>
std::string join(const std::vector<T>& v, std::size_t max = 24) {
  std::ostringstream s;
  s << '{';
  for (std::size_t i = 0; i < v.size() && i < max; ++i) s << (i ? "," : "") << v[i];
  if (v.size() > max) s << ",...";
  s << '}';
  return s.str();
}

/// The divisors of n (n >= 1), ascending.
inline std::vector<std::int64_t> divisors(std::int64_t n) {
  std::vector<std::int64_t> lo, hi;
  for (std::int64_t d = 1; d * d <= n; ++d) {
    if (n % d) continue;
    lo.push_back(d);
    if (d != n / d) hi.push_back(n / d);
  }
  lo.insert(lo.end(), hi.rbegin(), hi.rend());
  return lo;
}

}  // namespace detail
ULYSSES_NAMESPACE_END
