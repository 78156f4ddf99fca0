// SPDX-License-Identifier: Apache-2.0
// The ring schedule (ring/schedule.hpp) against a brute-force mask: over the R steps, every
// (query token, key token) pair the attention needs is attended exactly once, and no other.
#include <doctest/doctest.h>
#include <ulysses/ring/schedule.hpp>

#include "expect_error.hpp"

using namespace ulysses;

namespace {
void brute_force(std::int64_t S, int R, RingLayout layout, bool causal) {
  const RingPartition p(S, 1, R, layout);
  for (int r = 0; r < R; ++r) {
    const auto sched = ring_schedule(p, r, causal);
    REQUIRE(sched.size() == static_cast<std::size_t>(R));
    std::vector<int> seen(static_cast<std::size_t>(p.ring_length(r) * S), 0);
    for (const RingWork& w : sched) {
      CHECK(w.source == ring_source(r, w.step, R));
      CHECK(w.L_q == p.ring_length(r));
      CHECK(w.L_kv == p.ring_length(w.source));
      for (std::int64_t i = 0; i < w.L_q; ++i)
        for (std::int64_t k = 0; k < w.L_kv; ++k)
          if (w.attends(i, k)) ++seen[static_cast<std::size_t>(i * S + p.ring_token(w.source, k))];
    }
    for (std::int64_t i = 0; i < p.ring_length(r); ++i)
      for (std::int64_t t = 0; t < S; ++t) {
        const int want = !causal || t <= p.ring_token(r, i) ? 1 : 0;
        if (seen[static_cast<std::size_t>(i * S + t)] != want)
          FAIL("S=" << S << " R=" << R << " " << to_string(layout) << (causal ? " causal" : "") << ": ring rank " << r << " query "
                    << p.ring_token(r, i) << " key " << t << " attended " << seen[static_cast<std::size_t>(i * S + t)] << " times");
      }
  }
}
}  // namespace

TEST_CASE("schedule: every needed pair exactly once (zigzag causal, contiguous causal, non-causal), uneven S") {
  for (int R : {1, 2, 3, 4, 5})
    for (std::int64_t S : {2 * R, 2 * R + 1, 4 * R + 3, 37}) {
      brute_force(S, R, RingLayout::zigzag, true);
      brute_force(S, R, RingLayout::zigzag, false);
      brute_force(S, R, RingLayout::contiguous, true);
      brute_force(S, R, RingLayout::contiguous, false);
    }
}

TEST_CASE("zigzag causal: the documented ranges, and equal work on every step but the first") {
  const RingPartition p(16, 1, 2, RingLayout::zigzag);  // ring 0: {0..3, 12..15}, ring 1: {4..11}
  const RingWork a = ring_work(p, 0, 0, true);
  CHECK(a.mask == RingMask::causal);
  CHECK(a.q_len == 8);
  const RingWork b = ring_work(p, 1, 1, true);  // source 0 < 1: all q against source's first chunk
  CHECK(b.source == 0);
  CHECK(b.q_begin == 0);
  CHECK(b.q_len == 8);
  CHECK(b.kv_begin == 0);
  CHECK(b.kv_len == 4);
  const RingWork c = ring_work(p, 0, 1, true);  // source 1 > 0: the second half of q against all kv
  CHECK(c.source == 1);
  CHECK(c.q_begin == 4);
  CHECK(c.q_len == 4);
  CHECK(c.kv_len == 8);
  CHECK(b.q_len * b.kv_len == c.q_len * c.kv_len);  // the balance zigzag is for
  const RingPartition q(16, 1, 2, RingLayout::contiguous);
  CHECK(ring_work(q, 0, 1, true).empty());  // contiguous causal: a later source gives nothing
  CHECK(!ring_work(q, 0, 1, false).empty());
}

TEST_CASE("schedule errors") {
  const RingPartition p(16, 1, 2, RingLayout::zigzag);
  CHECK(ut::code_of([&] { ring_work(p, 2, 0, true); }) == Errc::invalid_group);
  CHECK(ut::code_of([&] { ring_work(p, 0, 2, true); }) == Errc::invalid_group);
  CHECK(ring_source(0, 1, 3) == 2);
}
