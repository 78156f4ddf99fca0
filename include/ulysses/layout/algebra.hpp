// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Algebra on layouts that the argument checks need: whether two strided views share a
///        byte (exact for views with the same strides, such as q, k, v of one fused buffer).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "layout.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {

/// One dimension of the search below: the range of the index difference i - j (i an index of the
/// first view, j of the second) and the stride both views share there.
struct DiffDim {
  std::int64_t lo, hi, s;
};

/// Depth-first search over the index difference of dimension k (dims sorted by stride, largest
/// first; the remaining dims k..n-1 reach offsets in [rest_lo[k], rest_hi[k]]). `budget` bounds
/// the work.
inline bool diff_search(const DiffDim* d, const std::int64_t* rest_lo, const std::int64_t* rest_hi, int n, int k,
                        std::int64_t rem, int& budget) {
  if (--budget < 0) return true;  // give up: answer "reachable" (conservative)
  if (k >= n || k >= 4) return rem == 0;
  auto floor_div = [](std::int64_t a, std::int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); };
  const std::int64_t s = d[k].s;
  // rem - j*s must stay within what dims k+1.. can reach.
  const std::int64_t lo = std::max(d[k].lo, -floor_div(rest_hi[k + 1] - rem, s));
  const std::int64_t hi = std::min(d[k].hi, floor_div(rem - rest_lo[k + 1], s));
  for (std::int64_t j = lo; j <= hi; ++j)
    if (diff_search(d, rest_lo, rest_hi, n, k + 1, rem - j * s, budget)) return true;
  return false;
}

/// Whether two layouts have the same stride in every dimension where either has more than one
/// index (the condition of the exact test below; e.g. q, k, v views of one fused buffer).
inline bool same_strides(const Layout& a, const Layout& b) {
  for (int i = 0; i < 4; ++i)
    if (a.extent[i] > 1 && b.extent[i] > 1 && a.stride[i] != b.stride[i]) return false;
  return true;
}

/// True when some element offset difference x - y (x an offset of `a`, y of `b`) equals `delta`,
/// for injective layouts with the same strides: the strides, sorted, are nested, so each dimension
/// leaves at most a few candidates for its index difference. Answers true (conservatively) if the
/// search would branch more than a small budget.
inline bool offset_difference_reachable(const Layout& a, const Layout& b, std::int64_t delta) {
  DiffDim d[4] = {};
  int n = 0;
  for (int i = 0; i < 4; ++i) {
    if (a.extent[i] < 1 || b.extent[i] < 1) return false;  // an empty view shares nothing
    if (a.extent[i] == 1 && b.extent[i] == 1) continue;
    const DiffDim x{-(b.extent[i] - 1), a.extent[i] - 1, a.extent[i] > 1 ? a.stride[i] : b.stride[i]};
    int k = n++;  // insertion by stride, largest first
    for (; k > 0 && d[k - 1].s < x.s; --k) d[k] = d[k - 1];
    d[k] = x;
  }
  std::int64_t rest_lo[5] = {0, 0, 0, 0, 0}, rest_hi[5] = {0, 0, 0, 0, 0};
  for (int k = n - 1; k >= 0; --k) {
    rest_lo[k] = rest_lo[k + 1] + d[k].lo * d[k].s;
    rest_hi[k] = rest_hi[k + 1] + d[k].hi * d[k].s;
  }
  int budget = 64;
  return diff_search(d, rest_lo, rest_hi, n, 0, delta, budget);
}

/// Whether views with layouts `la` at `a` and `lb` at `b` (elements of e bytes) share a byte.
/// Exact for layouts with the same strides (same_strides()); otherwise true whenever their byte
/// spans meet (the caller's test).
inline bool views_overlap(const Layout& la, const std::byte* a, const Layout& lb, const std::byte* b, std::size_t e) {
  if (!same_strides(la, lb)) return true;
  const std::int64_t delta = static_cast<std::int64_t>(b - a), E = static_cast<std::int64_t>(e);
  const std::int64_t q = delta / E - (delta % E < 0);  // floor
  // Elements at a + E*x and b + E*y overlap iff |delta + E*(y - x)| < E.
  if (delta % E == 0) return offset_difference_reachable(la, lb, q);
  return offset_difference_reachable(la, lb, q) || offset_difference_reachable(la, lb, q + 1);
}

}  // namespace detail

ULYSSES_NAMESPACE_END
