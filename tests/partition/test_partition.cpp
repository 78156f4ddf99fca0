// SPDX-License-Identifier: Apache-2.0
// partition.hpp: sequence and head splits, GQA kv ranges, and every planning error's code.
#include <doctest/doctest.h>
#include <ulysses/partition/heads.hpp>

#include <limits>
#include <string>

#include "expect_error.hpp"

using namespace ulysses;

namespace {
using ut::error_of;
std::vector<std::int64_t> counts(const HeadPartition& p) {
  std::vector<std::int64_t> v;
  for (int r = 0; r < p.degree(); ++r) v.push_back(p.count(r));
  return v;
}
std::vector<std::int64_t> lengths(const SeqPartition& p) {
  std::vector<std::int64_t> v;
  for (int r = 0; r < p.degree(); ++r) v.push_back(p.local_length(r));
  return v;
}
}  // namespace

TEST_CASE("sequence splits: even, balanced, explicit, zigzag") {
  CHECK(lengths(SeqPartition::even(12, 4)) == std::vector<std::int64_t>{3, 3, 3, 3});
  CHECK(lengths(SeqPartition::balanced(7, 2)) == std::vector<std::int64_t>{4, 3});
  CHECK(lengths(SeqPartition::balanced(2, 4)) == std::vector<std::int64_t>{1, 1, 0, 0});
  auto ex = SeqPartition::lengths(12, 4, {5, 0, 3, 4});
  CHECK(lengths(ex) == std::vector<std::int64_t>{5, 0, 3, 4});
  CHECK(ex.chunks()[2].offset == 5);
  auto z = SeqPartition::zigzag(16, 4);  // 8 chunks of 2: rank 1 holds chunks 1 and 6
  auto c1 = z.chunks_of(1);
  REQUIRE(c1.size() == 2);
  CHECK(c1[0].offset == 2);
  CHECK(c1[0].local_offset == 0);
  CHECK(c1[1].offset == 12);
  CHECK(c1[1].local_offset == 2);
  CHECK(lengths(SeqPartition::zigzag(17, 4)) == std::vector<std::int64_t>{5, 4, 4, 4});
}

TEST_CASE("where a rank's tokens are: first_token, global_token, locate (contiguous and zigzag)") {
  auto ex = SeqPartition::lengths(12, 4, {5, 0, 3, 4});
  CHECK(ex.first_token(0) == 0);
  CHECK(ex.first_token(1) == 5);  // an empty range starts where it would be
  CHECK(ex.first_token(2) == 5);
  CHECK(ex.first_token(3) == 8);
  CHECK(ex.global_token(3, 2) == 10);
  CHECK(ex.locate(10) == std::pair<int, std::int64_t>{3, 2});
  // zigzag S=17, P=4: 8 chunks [3,2,2,2,2,2,2,2] at offsets 0,3,5,7,9,11,13,15; rank 1 holds
  // chunks 1 (tokens 3,4) and 6 (tokens 13,14) in that order.
  auto z = SeqPartition::zigzag(17, 4);
  CHECK(z.first_token(1) == 3);
  std::vector<std::int64_t> rank1;
  for (std::int64_t i = 0; i < z.local_length(1); ++i) rank1.push_back(z.global_token(1, i));
  CHECK(rank1 == std::vector<std::int64_t>{3, 4, 13, 14});
  CHECK(z.locate(14) == std::pair<int, std::int64_t>{1, 3});
  // Every token is found where global_token puts it, on every split.
  for (const SeqPartition& p : {ex, z, SeqPartition::balanced(2, 4), SeqPartition::even(12, 3)})
    for (int r = 0; r < p.degree(); ++r)
      for (std::int64_t i = 0; i < p.local_length(r); ++i) CHECK(p.locate(p.global_token(r, i)) == std::pair<int, std::int64_t>{r, i});
  CHECK(error_of([&] { z.global_token(1, 4); }).first == Errc::invalid_shape);
  CHECK(error_of([&] { z.global_token(4, 0); }).first == Errc::invalid_group);
  CHECK(error_of([&] { z.first_token(-1); }).first == Errc::invalid_group);
  CHECK(error_of([&] { z.locate(17); }).first == Errc::invalid_shape);
  // An empty chunk listed first does not hide the rank's tokens; an empty rank starts at its chunk.
  auto e = SeqPartition::chunks(6, 3, {{0, 5, 0}, {0, 0, 3}, {1, 3, 3}, {2, 6, 0}});
  CHECK(e.first_token(0) == 0);
  CHECK(e.global_token(0, 0) == 0);
  CHECK(e.first_token(2) == 6);
}

TEST_CASE("ranks outside the group and chunks outside the sequence are coded errors, not std:: exceptions") {
  auto s = SeqPartition::balanced(10, 4);
  auto h = HeadPartition::balanced(7, 4);
  for (int r : {-1, 4}) {
    CHECK(error_of([&] { s.local_length(r); }).first == Errc::invalid_group);
    CHECK(error_of([&] { s.chunks_of(r); }).first == Errc::invalid_group);
    CHECK(error_of([&] { h.begin(r); }).first == Errc::invalid_group);
    CHECK(error_of([&] { h.end(r); }).first == Errc::invalid_group);
    CHECK(error_of([&] { h.count(r); }).first == Errc::invalid_group);
  }
  CHECK(error_of([] { SeqPartition::chunks(4, 2, {{0, 0, 4}, {1, 100, 0}}); }).first == Errc::invalid_partition);
  CHECK(error_of([] { SeqPartition::zigzag(5, std::numeric_limits<int>::max()); }).first == Errc::invalid_group);
  CHECK(error_of([] { HeadPartition::balanced(5, detail::kMaxDegree + 1); }).first == Errc::invalid_group);
  CHECK(SeqPartition::balanced(3, detail::kMaxDegree).local_length(detail::kMaxDegree - 1) == 0);
}

TEST_CASE("sequence split errors carry their codes and the numbers") {
  auto [code, msg] = error_of([] { SeqPartition::even(7, 2); });
  CHECK(code == Errc::seq_not_divisible);
  CHECK(msg.find("S=7") != std::string::npos);
  CHECK(msg.find("P=2") != std::string::npos);
  CHECK(msg.find("{1,7}") != std::string::npos);
  CHECK(error_of([] { SeqPartition::even(8, 0); }).first == Errc::invalid_group);
  CHECK(error_of([] { SeqPartition::balanced(0, 2); }).first == Errc::invalid_shape);
  CHECK(error_of([] { SeqPartition::lengths(12, 4, {5, 0, 3}); }).first == Errc::seq_lengths_mismatch);
  CHECK(error_of([] { SeqPartition::lengths(12, 4, {5, 0, 3, 5}); }).first == Errc::seq_lengths_mismatch);
  CHECK(error_of([] { SeqPartition::lengths({4, -1, 3}); }).first == Errc::seq_lengths_mismatch);
  CHECK(error_of([] { SeqPartition::chunks(8, 2, {{0, 0, 4, 0}, {1, 3, 5, 0}}); }).first == Errc::invalid_partition);
  CHECK(error_of([] { SeqPartition::chunks(8, 2, {{0, 0, 4, 0}, {1, 5, 3, 0}}); }).first == Errc::invalid_partition);
  CHECK(error_of([] { SeqPartition::chunks(8, 2, {{0, 0, 4, 0}, {2, 4, 4, 0}}); }).first == Errc::invalid_group);
  CHECK(error_of([] { SeqPartition::chunks(8, 2, {{0, 0, 4, 0}, {1, 4, 2, 0}}); }).first == Errc::seq_lengths_mismatch);
}

TEST_CASE("C4 head splits: H=7 over 4 is [2,2,2,1]; H=20 over 8 is [3,3,3,3,2,2,2,2]; even policy refuses") {
  CHECK(counts(HeadPartition::balanced(7, 4)) == std::vector<std::int64_t>{2, 2, 2, 1});
  CHECK(counts(HeadPartition::balanced(20, 8)) == std::vector<std::int64_t>{3, 3, 3, 3, 2, 2, 2, 2});
  CHECK(counts(HeadPartition::balanced(3, 4)) == std::vector<std::int64_t>{1, 1, 1, 0});
  auto [code, msg] = error_of([] { HeadPartition::even(30, 4); });
  CHECK(code == Errc::heads_not_divisible);
  CHECK(msg.find("num_heads=30 is not divisible by group size 4") != std::string::npos);
  CHECK(msg.find("{1,2,3,5,6,10,15,30}") != std::string::npos);
  CHECK(error_of([] { HeadPartition::even(0, 4); }).first == Errc::invalid_shape);
}

TEST_CASE("C5 GQA: H=16, Hkv=2, P=4 gives rank r the one kv head r/2") {
  auto q = HeadPartition::even(16, 4);
  auto kv = HeadPartition::gqa(q, 2);
  for (int r = 0; r < 4; ++r) {
    CHECK(q.begin(r) == 4 * r);
    CHECK(kv.begin(r) == r / 2);
    CHECK(kv.count(r) == 1);
  }
  CHECK(kv.query_per_kv() == 8);
  CHECK_FALSE(kv.disjoint());
  CHECK(kv.owned_begin(1) == 1);  // rank 1's kv head 0 is owned by rank 0: nothing left to own
  CHECK(kv.owned_begin(2) == 1);
  CHECK(kv.owned_begin(3) == 2);
}

TEST_CASE("GQA with Hkv divisible by P splits kv heads; MQA replicates the one kv head") {
  auto q = HeadPartition::even(32, 4);
  CHECK(counts(HeadPartition::gqa(q, 8)) == std::vector<std::int64_t>{2, 2, 2, 2});
  CHECK(HeadPartition::gqa(q, 8).disjoint());
  auto mqa = HeadPartition::gqa(HeadPartition::balanced(71, 8), 1);  // Falcon-7B
  for (int r = 0; r < 8; ++r) CHECK(mqa.begin(r) == 0);
  // Balanced query split with shared kv heads: Qwen2.5-7B (H=28, Hkv=4) over 8 ranks.
  auto qw = HeadPartition::gqa(HeadPartition::balanced(28, 8), 4);
  CHECK(qw.begin(1) == 0);
  CHECK(qw.end(1) == 2);  // query heads 4..7 use kv heads 0 and 1
}

TEST_CASE("GQA errors: Hkv must divide H; with even splits Hkv and P must divide one another") {
  auto [code, msg] = error_of([] { HeadPartition::gqa(HeadPartition::even(24, 4), 6); });
  CHECK(code == Errc::gqa_group_mismatch);
  CHECK(msg.find("num_kv_heads=6") != std::string::npos);
  CHECK(msg.find("{1,2,3,6,12,24}") != std::string::npos);
  CHECK(error_of([] { HeadPartition::gqa(HeadPartition::even(32, 4), 3); }).first == Errc::gqa_invalid);
  CHECK(error_of([] { HeadPartition::gqa(HeadPartition::even(32, 4), 0); }).first == Errc::invalid_shape);
  CHECK(error_of([] { HeadPartition::gqa(HeadPartition::balanced(24, 4), 6); }).first == Errc{});
}

TEST_CASE("explicit head ranges must be monotone and cover [0, H)") {
  CHECK(error_of([] { HeadPartition::ranges(4, {{0, 2}, {2, 4}}); }).first == Errc{});
  CHECK(error_of([] { HeadPartition::ranges(4, {{0, 2}, {3, 4}}); }).first == Errc::invalid_partition);
  CHECK(error_of([] { HeadPartition::ranges(4, {{2, 4}, {0, 2}}); }).first == Errc::invalid_partition);
  CHECK(error_of([] { HeadPartition::ranges(4, {{0, 2}, {2, 3}}); }).first == Errc::invalid_partition);
  CHECK(error_of([] { HeadPartition::ranges(4, {}); }).first == Errc::invalid_group);
}

TEST_CASE("explicit head ranges: empty ranges must keep the order too (no dropped heads)") {
  CHECK(error_of([] { HeadPartition::ranges(6, {{0, 2}, {5, 5}, {2, 6}}); }).first == Errc::invalid_partition);
  CHECK(error_of([] { HeadPartition::ranges(6, {{0, 0}, {0, 3}, {3, 6}, {6, 6}}); }).first == Errc{});
  CHECK(error_of([] { HeadPartition::ranges(6, {{0, 2}, {2, 2}, {2, 6}}); }).first == Errc{});
}

TEST_CASE("sequence chunks whose ends overflow int64 are a size_overflow, not a wrap-around") {
  const std::int64_t big = std::numeric_limits<std::int64_t>::max();
  CHECK(error_of([&] { SeqPartition::chunks(5, 2, {{0, 0, 1, 0}, {1, 1, big, 0}}); }).first == Errc::size_overflow);
}

TEST_CASE("the even policy is visible and part of equality; holders and owners of replicated heads") {
  const auto e = HeadPartition::even(8, 4), b = HeadPartition::balanced(8, 4);
  CHECK(e.even_split());
  CHECK_FALSE(b.even_split());
  CHECK(e != b);  // same ranges, another policy
  CHECK(HeadPartition::gqa(e, 2).even_split());
  CHECK(HeadPartition::gqa(e, 2) != HeadPartition::gqa(b, 2));
  CHECK(HeadPartition::gqa(e, 2).query_per_kv() == 4);
  const auto kv = HeadPartition::gqa(HeadPartition::even(32, 16), 8);  // Llama at P=16: kv head h on ranks 2h, 2h+1
  CHECK(kv.holders(0) == std::pair<int, int>{0, 2});
  CHECK(kv.holders(5) == std::pair<int, int>{10, 12});
  CHECK(kv.owner(5) == 10);
  const auto mqa = HeadPartition::gqa(HeadPartition::balanced(71, 4), 1);  // Falcon: every rank
  CHECK(mqa.holders(0) == std::pair<int, int>{0, 4});
  const auto shared = HeadPartition::gqa(HeadPartition::balanced(28, 2), 7);  // H=28, Hkv=7, P=2: kv head 3 on both
  CHECK(shared.holders(3) == std::pair<int, int>{0, 2});
  CHECK(shared.holders(2) == std::pair<int, int>{0, 1});
  CHECK(shared.holders(4) == std::pair<int, int>{1, 2});
  CHECK(shared.str() == "[0,4) [3,7)");
}
