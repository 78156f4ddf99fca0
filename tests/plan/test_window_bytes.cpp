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

TEST_CASE("window_sizes: per buffer the largest any rank needs, in allocate() order; the slot is their aligned sum plus staging room") {
  // The largest buffers come from different ranks: rank 0 holds the most tokens (34), rank 1's
  // query heads 3..5 use both kv heads. Every rank allocates the same sizes: these.
  const WindowSizes w = window_sizes(3, plan_of);
  CHECK(w.buffers == std::vector<std::size_t>{2u * 34 * 8 * 16 * 4, 2u * 34 * 2 * 16 * 4, 2u * 34 * 2 * 16 * 4,  // q, k, v of rank 0
                                              2u * 100 * 3 * 16 * 4, 2u * 100 * 2 * 16 * 4, 2u * 100 * 2 * 16 * 4});  // rank 1's heads
  CHECK(w.bytes_per_rank == 141824);  // 34816 + 2 * 8704 + 38400 + 2 * 25600: every size a multiple of 256 already
  CHECK(window_bytes_per_rank(3, plan_of) == 141824);
  std::size_t own1 = 0;  // the largest rank's own total is not enough: 140288
  for (int t = 0; t < 3; ++t) own1 += up(plan_of(1).seq_bytes(t)) + up(plan_of(1).head_bytes(t));
  CHECK(own1 == 140288);
  CHECK(w.bytes_per_rank > own1);
  // Outputs in the window, inputs outside: the outputs, then room to stage the largest rank's inputs.
  const WindowSizes o = window_sizes(3, plan_of, {Direction::seq_to_head, WindowHolds::outputs, true});
  CHECK(o.buffers == std::vector<std::size_t>{38400, 25600, 25600});
  CHECK(o.bytes_per_rank == 38400 + 2 * 25600 + (34816 + 2 * 8704));
  CHECK(window_sizes(3, plan_of, {Direction::seq_to_head, WindowHolds::outputs, false}).bytes_per_rank == 38400 + 2 * 25600);
  // head→seq holding its inputs: the head-sharded side.
  CHECK(window_sizes(3, plan_of, {Direction::head_to_seq, WindowHolds::inputs}).buffers == std::vector<std::size_t>{38400, 25600, 25600});
  // Alignment 4096: each buffer rounded up on its own.
  std::size_t up4k = 0;
  for (std::size_t n : w.buffers) up4k += (n + 4095) / 4096 * 4096;
  CHECK(window_sizes(3, plan_of, {}, 4096).bytes_per_rank == up4k);
  for (int r = 0; r < 3; ++r) {  // what every rank registers fits exactly, in a slot of that size
    detail::WindowRegistry reg(w.bytes_per_rank, kWindowAlignment);
    for (std::size_t n : w.buffers) CHECK(ut::code_of([&] { reg.allocate(n, r, "MpiWindow"); }) == Errc{});
    CHECK(reg.used() == w.bytes_per_rank);
    CHECK(ut::code_of([&] { reg.allocate(1, r, "MpiWindow"); }) == Errc::buffer_too_small);
  }
}

TEST_CASE("window_sizes: refused inputs") {
  CHECK(ut::code_of([] { (void)window_bytes_per_rank(0, plan_of); }) == Errc::invalid_group);
  CHECK(ut::code_of([] { (void)window_sizes(3, plan_of, {}, 96); }) == Errc::misaligned);
  // A callback that does not make rank r's plan of this group.
  CHECK(ut::code_of([] { (void)window_sizes(3, [](int) { return plan_of(0); }); }) == Errc::invalid_group);
  CHECK(ut::code_of([] { (void)window_sizes(2, plan_of); }) == Errc::invalid_group);  // plans of P=3
}
