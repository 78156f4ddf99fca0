// SPDX-License-Identifier: Apache-2.0
// block.hpp: block construction (dimension merging), for copies and for the terms of a sum.
#include <doctest/doctest.h>
#include <ulysses/layout/blocks.hpp>

#include <cstdint>
#include <vector>

using namespace ulysses;

TEST_CASE("a block between two dense tensors of the same layout is one contiguous row") {
  const std::int64_t ext[4] = {2, 3, 4, 5}, st[4] = {60, 20, 5, 1};
  BlockCopy c;
  REQUIRE(detail::make_block(ext, st, st, 4, 0, 0, 0, 1, c));
  CHECK(c.row_bytes == 120 * 4);
  CHECK(c.rows() == 1);
  CHECK(c.bytes() == 480);
}

TEST_CASE("head slice of bshd to a row-major wire block: rows of H_j*D elements") {
  // Source [B=2, S=3, H=4, D=5] bshd, heads 2..3 → wire [2, 3, 2, 5].
  const std::int64_t ext[4] = {2, 3, 2, 5}, src[4] = {60, 20, 5, 1}, dst[4] = {30, 10, 5, 1};
  BlockCopy c;
  REQUIRE(detail::make_block(ext, src, dst, 2, 2 * 5 * 2, 0, 0, 1, c));
  CHECK(c.row_bytes == 10 * 2);
  CHECK(c.extent[3] == 6);  // b and s merge on both sides: 60 = 3*20 and 30 = 3*10
  CHECK(c.src_stride[3] == 40);
  CHECK(c.dst_stride[3] == 20);
  CHECK(c.extent[0] * c.extent[1] * c.extent[2] == 1);
}

TEST_CASE("empty blocks build nothing; extent-1 dims are dropped") {
  const std::int64_t ext0[4] = {2, 0, 4, 5}, st[4] = {60, 20, 5, 1};
  BlockCopy c;
  CHECK_FALSE(detail::make_block(ext0, st, st, 4, 0, 0, 0, 1, c));
}

TEST_CASE("a sum's terms share one geometry: dimensions merge only where every term and the destination allow") {
  // Destination [S=4, D=8] dense (one 128-byte row if alone); term 0 dense too; term 1 with a row
  // stride of 10 elements: the rows cannot merge, so all three blocks keep rows of 8 elements.
  const std::int64_t ext[4] = {1, 4, 1, 8}, dense[4] = {0, 8, 0, 1}, padded[4] = {0, 10, 0, 1};
  const std::int64_t* src[2] = {dense, padded};
  const std::int64_t off[2] = {0, 40};
  const int buf[2] = {BufferIndex::input(0), BufferIndex::recv};
  BlockCopy g[2];
  REQUIRE(detail::make_blocks(ext, 2, src, dense, 4, off, 8, buf, BufferIndex::output(0), ElementType::float32, g));
  for (const BlockCopy& c : g) {
    CHECK(c.row_bytes == 32);
    CHECK(c.extent[3] == 4);
    CHECK(c.dst_stride[3] == 32);
    CHECK(c.dst_offset == 8);
    CHECK(c.type == ElementType::float32);
  }
  CHECK(g[0].op == BlockOp::sum);
  CHECK(g[0].sources == 2);
  CHECK(g[0].src_stride[3] == 32);
  CHECK(g[1].op == BlockOp::sum_term);
  CHECK(g[1].src_stride[3] == 40);
  CHECK(g[1].src_offset == 40);
  CHECK(g[1].src_buffer == BufferIndex::recv);
  CHECK(g[0].written_bytes() == 128);
  CHECK(g[1].written_bytes() == 0);
  // Both terms dense: one row of 128 bytes each.
  const std::int64_t* both[2] = {dense, dense};
  REQUIRE(detail::make_blocks(ext, 2, both, dense, 4, off, 0, buf, BufferIndex::output(0), ElementType::float32, g));
  CHECK(g[0].row_bytes == 128);
  CHECK(g[1].row_bytes == 128);
  CHECK(g[0].rows() == 1);
}

TEST_CASE("a sum of many terms (more than the stack holds) builds every term") {
  const std::int64_t ext[4] = {2, 3, 1, 4}, st[4] = {12, 4, 4, 1};
  std::vector<const std::int64_t*> src(40, st);
  std::vector<std::int64_t> off(40);
  std::vector<int> buf(40);
  for (int j = 0; j < 40; ++j) off[j] = 96 * j, buf[j] = BufferIndex::recv;
  std::vector<BlockCopy> g(40);
  REQUIRE(detail::make_blocks(ext, 40, src.data(), st, 2, off.data(), 0, buf.data(), BufferIndex::output(0), ElementType::bfloat16, g.data()));
  CHECK(g[0].sources == 40);
  for (int j = 1; j < 40; ++j) {
    CHECK(g[j].op == BlockOp::sum_term);
    CHECK(g[j].src_offset == 96 * j);
    CHECK(g[j].row_bytes == g[0].row_bytes);
  }
  CHECK(g[0].bytes() == 2 * 3 * 4 * 2);
}
