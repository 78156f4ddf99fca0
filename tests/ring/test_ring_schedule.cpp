// SPDX-License-Identifier: Apache-2.0
// The ring schedule (ring/schedule.hpp) against a brute-force mask: over the R steps, every
// (query token, key token) pair the attention needs is attended exactly once, and no other.
#include <algorithm>
#include <optional>
#include <vector>

#include <doctest/doctest.h>
#include <ulysses/partition/documents.hpp>
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

TEST_CASE("ring_last_use: the last step that attends each block, against every rank's schedule") {
  // Brute force: block j is held at step s by ring rank (j + s) mod R; its last use is the last
  // step whose holder's work is not empty.
  auto brute = [](const RingPartition& p, bool causal) {
    const int R = p.ring_degree();
    std::vector<int> last(static_cast<std::size_t>(R), -1);
    for (int r = 0; r < R; ++r)
      for (const RingWork& w : ring_schedule(p, r, causal))
        if (!w.empty()) last[static_cast<std::size_t>(w.source)] = std::max(last[static_cast<std::size_t>(w.source)], w.step);
    return last;
  };
  int checked = 0;
  for (int R : {1, 2, 3, 4, 5}) {
    CAPTURE(R);
    const RingPartition zig(8 * R + 3, 1, R, RingLayout::zigzag), con(8 * R + 3, 1, R, RingLayout::contiguous);
    std::vector<int> all(static_cast<std::size_t>(R), R - 1), down(static_cast<std::size_t>(R));
    for (int j = 0; j < R; ++j) down[static_cast<std::size_t>(j)] = R - 1 - j;
    CHECK(ring_last_use(zig, true) == all);  // zigzag causal: every block to the end
    CHECK(ring_last_use(con, false) == all);
    CHECK(ring_last_use(con, true) == down);  // contiguous causal: only the ranks after j read block j
    CHECK(ring_last_use(con, true) == brute(con, true));
    // Packed documents (every document in 2R chunks, ring rank j holding chunks j and 2R − 1 − j of
    // each): a document of 2R tokens or more reaches every rank; shorter ones leave the later
    // chunks empty, and their blocks stop early. Lists that leave a ring rank without a token
    // are refused by the partition (and skipped here).
    const std::vector<std::vector<std::int64_t>> lists = {{0, 2, 4, 6, 8},         {0, 3, 6, 9, 12, 15}, {0, 1, 3, 6, 10, 15, 21, 28},
                                                           {0, 5, 5, 9, 12, 24},    {0, 3, 40, 41, 44},   {0, 4, 8, 12, 16, 20}};
    for (const auto& cu : lists)
      for (bool causal : {true, false}) {
        CAPTURE(cu.back());
        CAPTURE(causal);
        std::optional<RingPartition> docs;
        try {
          docs.emplace(Documents(cu), 1, R);
        } catch (const Error&) {
          continue;
        }
        CHECK(ring_last_use(*docs, causal) == brute(*docs, causal));
        ++checked;
      }
  }
  CHECK(checked >= 40);
  // By hand. R = 2, documents of 2 tokens: ring rank 0 holds each one's first token, rank 1 its
  // second; causal, rank 1 reads block 0 at step 1 and rank 0 never reads block 1: block 1 stays.
  CHECK(ring_last_use(RingPartition(Documents({0, 2, 4, 6}), 1, 2), true) == std::vector<int>{1, 0});
  CHECK(ring_last_use(RingPartition(Documents({0, 2, 4, 6}), 1, 2), false) == std::vector<int>{1, 1});
  // R = 3, documents of 3 tokens: ring rank k holds token k of each, as a contiguous causal ring.
  CHECK(ring_last_use(RingPartition(Documents({0, 3, 6, 9}), 1, 3), true) == std::vector<int>{2, 1, 0});
}

TEST_CASE("schedule errors") {
  const RingPartition p(16, 1, 2, RingLayout::zigzag);
  CHECK(ut::code_of([&] { ring_work(p, 2, 0, true); }) == Errc::invalid_group);
  CHECK(ut::code_of([&] { ring_work(p, 0, 2, true); }) == Errc::invalid_group);
  CHECK(ring_source(0, 1, 3) == 2);
}
