// SPDX-License-Identifier: Apache-2.0
// RingPartition (partition/ring.hpp): the 2-D zigzag / contiguous split of U Ulysses × R ring ranks.
#include <doctest/doctest.h>
#include <ulysses/partition/ring.hpp>

#include <vector>

#include "expect_error.hpp"

using namespace ulysses;

namespace {
// yunchang's zigzag_extract_local for S a multiple of 2RU: cat(chunk j, chunk 2R-1-j).chunk(U)[u].
std::vector<std::int64_t> yunchang(std::int64_t S, int U, int R, int j, int u) {
  const std::int64_t c = S / (2 * R);
  std::vector<std::int64_t> pair;
  for (std::int64_t t = 0; t < c; ++t) pair.push_back(j * c + t);
  for (std::int64_t t = 0; t < c; ++t) pair.push_back((2 * R - 1 - j) * c + t);
  const std::int64_t n = static_cast<std::int64_t>(pair.size()) / U;
  return std::vector<std::int64_t>(pair.begin() + u * n, pair.begin() + (u + 1) * n);
}
std::vector<std::int64_t> tokens_of(const SeqPartition& p, int w) {
  std::vector<std::int64_t> v;
  for (std::int64_t i = 0; i < p.local_length(w); ++i) v.push_back(p.global_token(w, i));
  return v;
}
}  // namespace

TEST_CASE("zigzag: ring rank j holds chunks j and 2R-1-j, cut into U pieces as yunchang's zigzag_extract_local") {
  for (int U : {1, 2, 3, 4})
    for (int R : {1, 2, 3, 4}) {
      const std::int64_t S = 2 * R * U * 3;
      const RingPartition p(S, U, R, RingLayout::zigzag);
      const SeqPartition w = p.seq_partition();
      CHECK(w.degree() == U * R);
      for (int j = 0; j < R; ++j) {
        REQUIRE(p.ring_chunks(j).size() == 2);
        CHECK(p.ring_chunks(j)[0].offset == j * S / (2 * R));
        CHECK(p.ring_chunks(j)[1].offset == (2 * R - 1 - j) * S / (2 * R));
        for (int u = 0; u < U; ++u) CHECK(tokens_of(w, p.world_rank(j, u)) == yunchang(S, U, R, j, u));
      }
    }
}

TEST_CASE("after seq->head a ring group holds its ring rank's tokens in ascending global order") {
  const RingPartition p(61, 2, 3, RingLayout::zigzag);  // bug case C15's S = 61, not a multiple of 2RU = 12
  const SeqPartition w = p.seq_partition();
  std::int64_t total = 0;
  for (int j = 0; j < 3; ++j) {
    const SeqPartition up = p.ulysses_partition(j);
    CHECK(up.degree() == 2);
    CHECK(up.seq_len() == p.ring_length(j));
    total += p.ring_length(j);
    std::vector<std::int64_t> cat;  // the group's shards, Ulysses rank order: ring-local order
    for (int u = 0; u < 2; ++u) {
      CHECK(w.local_length(p.world_rank(j, u)) == up.local_length(u));
      for (auto t : tokens_of(w, p.world_rank(j, u))) cat.push_back(t);
    }
    for (std::size_t i = 0; i < cat.size(); ++i) {
      CHECK(cat[i] == p.ring_token(j, static_cast<std::int64_t>(i)));
      if (i) CHECK(cat[i] > cat[i - 1]);
    }
  }
  CHECK(total == 61);
  // 2R = 6 chunks of 61: the first 61 % 6 = 1 is 11 tokens, the rest 10.
  CHECK(p.ring_chunks(0)[0].length == 11);
  CHECK(p.ring_chunks(0)[1].offset == 51);
  CHECK(p.ring_length(0) == 21);
  CHECK(p.ring_length(1) == 20);
  CHECK(p.max_ring_length() == 21);
}

TEST_CASE("contiguous: ring rank j holds range j; uneven lengths; pieces straddling nothing") {
  const RingPartition p(10, 2, 3, RingLayout::contiguous);
  CHECK(p.ring_length(0) == 4);
  CHECK(p.ring_length(1) == 3);
  CHECK(p.ring_length(2) == 3);
  CHECK(p.ring_chunks(2).size() == 1);
  CHECK(p.ring_chunks(2)[0].offset == 7);
  const SeqPartition w = p.seq_partition();
  CHECK(tokens_of(w, 0) == std::vector<std::int64_t>{0, 1});
  CHECK(tokens_of(w, 2) == std::vector<std::int64_t>{4, 5});
  CHECK(tokens_of(w, 3) == std::vector<std::int64_t>{6});
  CHECK(tokens_of(w, 5) == std::vector<std::int64_t>{9});
}

TEST_CASE("a piece that straddles the pair's two chunks is two SeqChunks; a Ulysses rank may hold no token") {
  const RingPartition p(8, 3, 2, RingLayout::zigzag);  // chunks of 2: ring 0 = {0,1,6,7} cut 2,1,1
  const SeqPartition w = p.seq_partition();
  CHECK(tokens_of(w, 0) == std::vector<std::int64_t>{0, 1});
  CHECK(tokens_of(w, 1) == std::vector<std::int64_t>{6});
  CHECK(tokens_of(w, 2) == std::vector<std::int64_t>{7});
  const RingPartition q(4, 3, 2, RingLayout::zigzag);  // L_j = 2 over 3 Ulysses ranks
  CHECK(q.seq_partition().local_length(2) == 0);
  const RingPartition s(9, 2, 2, RingLayout::zigzag);  // pair {0,1,2} ∪ {7,8}: u = 0 gets 0,1,2
  CHECK(tokens_of(s.seq_partition(), 1) == std::vector<std::int64_t>{7, 8});
}

TEST_CASE("errors: a ring rank or chunk without a token, degrees out of range") {
  CHECK(ut::code_of([] { RingPartition(3, 1, 2, RingLayout::zigzag); }) == Errc::invalid_shape);
  CHECK(ut::error_of([] { RingPartition(3, 1, 2, RingLayout::zigzag); }).second.find("needs S >= 4") != std::string::npos);
  CHECK(ut::code_of([] { RingPartition(1, 1, 2, RingLayout::contiguous); }) == Errc::invalid_shape);
  CHECK(ut::code_of([] { RingPartition(16, 0, 2, RingLayout::zigzag); }) == Errc::invalid_group);
  CHECK(ut::code_of([] { RingPartition(16, 2, 0, RingLayout::zigzag); }) == Errc::invalid_group);
  CHECK(ut::code_of([] { RingPartition(16, 1 << 11, 1 << 11, RingLayout::contiguous); }) == Errc::invalid_group);
  const RingPartition p(16, 2, 2, RingLayout::zigzag);
  CHECK(ut::code_of([&] { (void)p.ring_chunks(2); }) == Errc::invalid_group);
  CHECK(ut::code_of([&] { (void)p.ring_token(0, 8); }) == Errc::invalid_shape);
  CHECK(p.ring_rank(3) == 1);
  CHECK(p.ulysses_rank(3) == 1);
}
