// SPDX-License-Identifier: Apache-2.0
// copy.hpp: block construction (dimension merging) and the host executor.
#include <doctest/doctest.h>
#include <ulysses/copy.hpp>

#include <numeric>
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

TEST_CASE("host executor: strided d (transpose-like) copies element by element, exactly") {
  // src [1, 2, 3, 4] with d outermost (strides 24, 1, 2, 6... ) → dense bshd dst.
  const std::int64_t ext[4] = {1, 2, 3, 4}, src[4] = {24, 1, 2, 6}, dst[4] = {24, 12, 4, 1};
  std::vector<float> a(24), b(24, -1.f);
  std::iota(a.begin(), a.end(), 0.f);
  BlockCopy c;
  REQUIRE(detail::make_block(ext, src, dst, sizeof(float), 0, 0, 0, 1, c));
  CHECK(c.row_bytes == 4);
  BufferTable t;
  t.base[0] = reinterpret_cast<std::byte*>(a.data());
  t.base[1] = reinterpret_cast<std::byte*>(b.data());
  HostExecutor{}.run(&c, 1, t);
  for (int s = 0; s < 2; ++s)
    for (int h = 0; h < 3; ++h)
      for (int d = 0; d < 4; ++d) CHECK(b[s * 12 + h * 4 + d] == a[s * 1 + h * 2 + d * 6]);
}

TEST_CASE("host executor: block at byte offsets with odd element size (3 bytes)") {
  const std::int64_t ext[4] = {1, 2, 1, 2}, src[4] = {0, 4, 2, 1}, dst[4] = {0, 2, 2, 1};
  std::vector<unsigned char> a(30), b(30, 0);
  std::iota(a.begin(), a.end(), 1);
  BlockCopy c;
  REQUIRE(detail::make_block(ext, src, dst, 3, 3, 6, 0, 1, c));
  CHECK(c.row_bytes == 6);
  BufferTable t;
  t.base[0] = reinterpret_cast<std::byte*>(a.data());
  t.base[1] = reinterpret_cast<std::byte*>(b.data());
  HostExecutor{}.run(&c, 1, t);
  // rows: src bytes [3,9) and [15,21) → dst bytes [6,12) and [12,18)
  CHECK(std::vector<unsigned char>(b.begin() + 6, b.begin() + 18) ==
        std::vector<unsigned char>{4, 5, 6, 7, 8, 9, 16, 17, 18, 19, 20, 21});
  CHECK(b[5] == 0);
  CHECK(b[18] == 0);
}
