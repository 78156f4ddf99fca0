// SPDX-License-Identifier: Apache-2.0
// plan.hpp: wire chunk sizes and offsets, workspace, GQA replication folded into the exchange,
// and every planning error with its code — the same verdict on every rank.
#include <doctest/doctest.h>
#include <ulysses/plan.hpp>

#include "expect_error.hpp"

using namespace ulysses;

namespace {
using ut::code_of;
using Sizes = std::vector<std::size_t>;
}  // namespace

TEST_CASE("chunk sizes and offsets: P=4, B=1, S=8, H=4, D=2, float, rank 2") {
  // Every peer chunk: 2 tokens * 1 head * 2 * 4 bytes = 16; the own chunk is 0 (copied directly).
  Plan plan({4, 2}, 1, SeqPartition::even(8, 4), {TensorSpec::of<float>(HeadPartition::even(4, 4), 2)});
  for (Direction d : {Direction::seq_to_head, Direction::head_to_seq}) {
    const Schedule& s = plan.schedule(d);
    CHECK(s.send_bytes == Sizes{16, 16, 0, 16});
    CHECK(s.send_offsets == Sizes{0, 16, 32, 32});
    CHECK(s.recv_bytes == Sizes{16, 16, 0, 16});
    CHECK(s.recv_offsets == Sizes{0, 16, 32, 32});
    CHECK(s.send_total == 48);
    CHECK(plan.exchanged_bytes(d) == 48);
  }
  CHECK(plan.recv_region_offset() == 256);
  CHECK(plan.workspace_bytes() == 256 + 48);
  CHECK(plan.schedule(Direction::seq_to_head).pack.size() == 3);
  CHECK(plan.schedule(Direction::seq_to_head).unpack.size() == 4);  // 3 peers + own chunk
}

TEST_CASE("uneven split: S=7 over P=2, B=2, H=4, D=8 float") {
  Plan r0({2, 0}, 2, SeqPartition::balanced(7, 2), {TensorSpec::of<float>(HeadPartition::even(4, 2), 8)});
  Plan r1({2, 1}, 2, SeqPartition::balanced(7, 2), {TensorSpec::of<float>(HeadPartition::even(4, 2), 8)});
  // rank 0 (4 tokens) sends B*4*2*8*4 = 512 bytes; rank 1 (3 tokens) sends 384.
  CHECK(r0.schedule(Direction::seq_to_head).send_bytes == Sizes{0, 512});
  CHECK(r1.schedule(Direction::seq_to_head).recv_bytes == Sizes{512, 0});
  CHECK(r1.schedule(Direction::seq_to_head).send_bytes == Sizes{384, 0});
  CHECK(r0.schedule(Direction::head_to_seq).recv_bytes == Sizes{0, 512});
  CHECK(r0.head_layout(0).extent[1] == 7);
}

TEST_CASE("C5: q, k, v in one exchange; the kv head is sent to each rank that needs it, never materialised") {
  // H=16, Hkv=2, P=4, S=16, D=8 float. Per peer in seq→head: q 4 tok*4 heads*8*4 = 512,
  // k and v 4*1*8*4 = 128 each: 768. The workspace holds exactly the wire, nothing more.
  auto q = HeadPartition::even(16, 4);
  auto kv = HeadPartition::gqa(q, 2);
  for (int r = 0; r < 4; ++r) {
    Plan p({4, r}, 1, SeqPartition::even(16, 4),
           {TensorSpec::of<float>(q, 8), TensorSpec::of<float>(kv, 8), TensorSpec::of<float>(kv, 8)});
    Sizes want(4, 768);
    want[r] = 0;
    CHECK(p.schedule(Direction::seq_to_head).send_bytes == want);
    // head→seq: a replicated kv head is returned by its lowest holder only (ranks 0 and 2).
    Sizes back(4, r % 2 == 0 ? 768 : 512);
    back[r] = 0;
    CHECK(p.schedule(Direction::head_to_seq).send_bytes == back);
    CHECK(p.workspace_bytes() == 2304 + 2304);  // send region 2304 (a multiple of 256) + receive region
  }
}

TEST_CASE("planning errors have their codes, and every rank reaches the same verdict") {
  auto hp = HeadPartition::even(4, 2);
  auto spec = TensorSpec::of<float>(hp, 8);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(code_of([&] { Plan({2, r}, 0, SeqPartition::even(4, 2), {spec}); }) == Errc::invalid_shape);
    CHECK(code_of([&] { Plan({2, r}, 1, SeqPartition::even(4, 2), {}); }) == Errc::invalid_shape);
    CHECK(code_of([&] { Plan({2, r}, 1, SeqPartition::even(4, 2), std::vector<TensorSpec>(17, spec)); }) == Errc::invalid_shape);
    CHECK(code_of([&] { Plan({2, r}, 1, SeqPartition::even(6, 3), {spec}); }) == Errc::invalid_group);
    CHECK(code_of([&] { Plan({2, r}, 1, SeqPartition::even(4, 2), {TensorSpec::of<float>(HeadPartition::even(3, 3), 8)}); }) ==
          Errc::invalid_group);
    CHECK(code_of([&] { Plan({2, r}, 1, SeqPartition::even(4, 2), {TensorSpec::of<float>(hp, 0)}); }) == Errc::invalid_shape);
    CHECK(code_of([&] {
            Plan({2, r}, std::int64_t(1) << 40, SeqPartition::even(std::int64_t(1) << 30, 2), {spec});
          }) == Errc::size_overflow);
  }
  CHECK(code_of([&] { Plan({2, 2}, 1, SeqPartition::even(4, 2), {spec}); }) == Errc::invalid_group);
  CHECK(code_of([&] { Plan({0, 0}, 1, SeqPartition::even(4, 2), {spec}); }) == Errc::invalid_group);
}

TEST_CASE("layout errors: wrong extents, aliasing strides") {
  auto hp = HeadPartition::even(4, 2);
  // rank 0 holds [B=1, S_r=2, H=4, D=8]
  auto bad_extent = TensorSpec::of<float>(hp, 8).with_seq_layout(Layout::bshd(1, 4, 4, 8));
  CHECK(code_of([&] { Plan({2, 0}, 1, SeqPartition::even(4, 2), {bad_extent}); }) == Errc::layout_mismatch);
  auto alias = TensorSpec::of<float>(hp, 8).with_seq_layout(Layout::strided({1, 2, 4, 8}, {64, 8, 4, 1}));
  CHECK(code_of([&] { Plan({2, 0}, 1, SeqPartition::even(4, 2), {alias}); }) == Errc::layout_aliasing);
  auto bad_head = TensorSpec::of<float>(hp, 8).with_head_layout(Layout::bshd(1, 4, 4, 8));
  CHECK(code_of([&] { Plan({2, 0}, 1, SeqPartition::even(4, 2), {bad_head}); }) == Errc::layout_mismatch);
  auto ok = TensorSpec::of<float>(hp, 8).with_seq_layout(Layout::strided({1, 2, 4, 8}, {1000, 100, 10, 1}));
  Plan p({2, 0}, 1, SeqPartition::even(4, 2), {ok});
  CHECK(p.seq_bytes(0) == (100 + 30 + 8) * sizeof(float));
}

TEST_CASE("default layouts follow the plan's format") {
  Plan p({2, 1}, 3, SeqPartition::even(10, 2), {TensorSpec::of<double>(HeadPartition::even(4, 2), 8)}, Format::sbhd);
  CHECK(p.seq_layout(0) == Layout::sbhd(3, 5, 4, 8));
  CHECK(p.head_layout(0) == Layout::sbhd(3, 10, 2, 8));
  CHECK(p.seq_bytes(0) == 3 * 5 * 4 * 8 * sizeof(double));
}
