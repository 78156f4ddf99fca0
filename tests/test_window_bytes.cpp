// SPDX-License-Identifier: Apache-2.0
// plan/window_bytes.hpp: the one bytes_per_rank every rank passes to a window.
#include <doctest/doctest.h>

#include <ulysses/comm/window.hpp>
#include <ulysses/plan/attention.hpp>
#include <ulysses/plan/window_bytes.hpp>

#include "expect_error.hpp"

using namespace ulysses;

namespace {
// P = 3, S = 100 (34, 33, 33 tokens), GQA H = 8, Hkv = 2, D = 16, fp32, balanced heads (3, 3, 2
// query heads; 1, 2, 1 kv heads): the ranks' buffers differ in size.
Plan plan_of(int r) {
  const int P = 3;
  const AttentionSpecs a = attention_specs<float>(P, {8, 2, 16}, HeadPolicy::balanced);
  return Plan({P, r}, 2, SeqPartition::balanced(100, P), {a.q, a.k, a.v});
}
std::size_t up(std::size_t n) { return (n + 255) / 256 * 256; }
}  // namespace

TEST_CASE("window_bytes: each buffer the slot holds rounded up to 256 bytes, in allocate() order, plus staging room") {
  const Plan p = plan_of(1);  // 33 tokens; 3 query heads, kv heads 0..1 (replicated over ranks)
  std::size_t in = 0, out = 0;
  for (int t = 0; t < 3; ++t) in += up(p.seq_bytes(t)), out += up(p.head_bytes(t));
  CHECK(p.seq_bytes(0) == 2u * 33 * 8 * 16 * 4);
  CHECK(window_bytes(p) == in + out);
  CHECK(window_bytes(p, {Direction::seq_to_head, WindowHolds::inputs}) == in);
  CHECK(window_bytes(p, {Direction::seq_to_head, WindowHolds::outputs, false}) == out);
  CHECK(window_bytes(p, {Direction::seq_to_head, WindowHolds::outputs, true}) == out + in);  // the inputs staged after the outputs
  CHECK(window_bytes(p, {Direction::head_to_seq, WindowHolds::inputs}) == out);              // head→seq reads the head-sharded side
  CHECK(window_bytes(p, {}, 1) == [&] {
    std::size_t n = 0;
    for (int t = 0; t < 3; ++t) n += p.seq_bytes(t) + p.head_bytes(t);
    return n;
  }());
  CHECK(ut::code_of([&] { (void)window_bytes(p, {}, 96); }) == Errc::misaligned);
}

TEST_CASE("window_bytes_per_rank: the largest rank's size, and every rank's registrations fit in a slot of it") {
  std::size_t most = 0;
  for (int r = 0; r < 3; ++r) most = std::max(most, window_bytes(plan_of(r)));
  const std::size_t n = window_bytes_per_rank(3, plan_of);
  CHECK(n == most);
  // Not the rank with the most tokens (rank 0: 34): rank 1's query heads 3..5 use both kv heads.
  CHECK(window_bytes(plan_of(0)) == 116224);
  CHECK(window_bytes(plan_of(1)) == 140288);
  CHECK(window_bytes(plan_of(2)) == 101888);
  CHECK(n == 140288);
  for (int r = 0; r < 3; ++r) {  // what an engine allocate()s: inputs, then outputs, then staging
    const Plan p = plan_of(r);
    detail::WindowRegistry reg(n, kWindowAlignment);
    for (int t = 0; t < 3; ++t) CHECK(reg.allocate(p.seq_bytes(t), r, "MpiWindow") % kWindowAlignment == 0);
    for (int t = 0; t < 3; ++t) CHECK(ut::code_of([&] { reg.allocate(p.head_bytes(t), r, "MpiWindow"); }) == Errc{});
    CHECK(reg.used() <= n);
    CHECK(ut::code_of([&] { reg.allocate(n - detail::round_up(reg.used(), kWindowAlignment) + 1, r, "MpiWindow"); }) == Errc::buffer_too_small);
  }
  CHECK(ut::code_of([] { (void)window_bytes_per_rank(0, plan_of); }) == Errc::invalid_group);
}
