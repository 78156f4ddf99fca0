// SPDX-License-Identifier: Apache-2.0
// layout.hpp: offsets of the dense formats and of strided views, span, aliasing.
#include <doctest/doctest.h>
#include <ulysses/layout/layout.hpp>

using namespace ulysses;

TEST_CASE("dense formats put element (b,s,h,d) where the format says") {
  // [B=2, S=3, H=4, D=5]
  const Layout a = Layout::bshd(2, 3, 4, 5), b = Layout::sbhd(2, 3, 4, 5), c = Layout::bhsd(2, 3, 4, 5);
  CHECK(a.offset(1, 2, 3, 4) == ((1 * 3 + 2) * 4 + 3) * 5 + 4);
  CHECK(b.offset(1, 2, 3, 4) == ((2 * 2 + 1) * 4 + 3) * 5 + 4);
  CHECK(c.offset(1, 2, 3, 4) == ((1 * 4 + 3) * 3 + 2) * 5 + 4);
  for (const Layout& l : {a, b, c}) {
    CHECK(l.numel() == 120);
    CHECK(l.span_elems() == 120);
    CHECK(l.is_injective());
    CHECK(l.rows_contiguous());
  }
  CHECK(Layout::dense(Format::sbhd, 2, 3, 4, 5) == b);
  static_assert(Layout::bshd(1, 2, 3, 4).offset(0, 1, 2, 3) == 4 * 3 + 2 * 4 + 3, "constexpr offsets");
}

TEST_CASE("strided views: q inside a fused [B,S,3,H,D] projection and x[:, 4:12]") {
  const std::int64_t B = 2, S = 16, H = 2, D = 4;
  const Layout q = Layout::strided({B, S, H, D}, {S * 3 * H * D, 3 * H * D, D, 1});
  // k is the same layout at base + H*D: element (1, 5, 1, 2) of k sits at fused index [1][5][1][1][2].
  CHECK(H * D + q.offset(1, 5, 1, 2) == (((1 * S + 5) * 3 + 1) * H + 1) * D + 2);
  CHECK(q.is_injective());
  CHECK(q.span_elems() == (B - 1) * S * 3 * H * D + (S - 1) * 3 * H * D + (H - 1) * D + D);
  const Layout v = Layout::strided({B, 8, H, D}, {S * H * D, H * D, D, 1});  // x[:, 4:12] at base + 4*H*D
  CHECK(4 * H * D + v.offset(1, 7, 1, 3) == ((1 * S + 11) * H + 1) * D + 3);
  CHECK(v.span_elems() == S * H * D + 8 * H * D);
}

TEST_CASE("aliasing and negative strides are detected; broadcast dims of extent 1 are fine") {
  CHECK_FALSE(Layout::strided({2, 3, 4, 5}, {0, 20, 5, 1}).is_injective());   // batch stride 0
  CHECK_FALSE(Layout::strided({2, 3, 4, 5}, {60, 20, 4, 1}).is_injective());  // heads overlap rows
  CHECK_FALSE(Layout::strided({2, 3, 4, 5}, {60, -20, 5, 1}).is_injective());
  CHECK(Layout::strided({1, 3, 4, 5}, {0, 20, 5, 1}).is_injective());  // extent 1: stride unused
  CHECK(Layout::strided({2, 3, 4, 5}, {1, 2, 6, 24}).is_injective());  // d outermost, b innermost
  CHECK_FALSE(Layout::strided({2, 3, 4, 5}, {1, 2, 6, 24}).rows_contiguous());
}

TEST_CASE("empty layouts span nothing") {
  const Layout e = Layout::bshd(2, 0, 4, 5);
  CHECK(e.numel() == 0);
  CHECK(e.span_elems() == 0);
  CHECK(e.str() == "[2,0,4,5]:(0,20,5,1)");
}
