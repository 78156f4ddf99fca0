// SPDX-License-Identifier: Apache-2.0
// layout/byte_span.hpp: a caller's buffer as bytes, and span_from(): one tensor's view into a
// fused buffer, from its first element to the buffer's end.
#include <doctest/doctest.h>

#include <array>
#include <type_traits>
#include <vector>

#include <ulysses/layout/byte_span.hpp>

#include "expect_error.hpp"

using namespace ulysses;

TEST_CASE("ConstByteSpan / ByteSpan from a range: its data and size() * sizeof(T) bytes") {
  std::vector<float> v(10);
  const ConstByteSpan c = v;
  CHECK(c.data == v.data());
  CHECK(c.bytes == 40);
  ByteSpan b = v;
  CHECK(b.data == v.data());
  const ConstByteSpan back = b;
  CHECK(back.bytes == 40);
}

TEST_CASE("span_from: the bytes from element `first` to the end; ByteSpan for a mutable range, ConstByteSpan for a const one") {
  // A fused [B=1, S_r=3, H + 2 Hkv = 4 + 2 + 2, D=2] projection: k starts at head 4, v at head 6.
  std::vector<float> qkv(1 * 3 * 8 * 2);
  const ByteSpan k = span_from(qkv, 4 * 2), v = span_from(qkv, 6 * 2);
  static_assert(std::is_same_v<decltype(span_from(qkv, 0)), ByteSpan>);
  CHECK(k.data == qkv.data() + 8);
  CHECK(k.bytes == (48 - 8) * 4);
  CHECK(v.data == qkv.data() + 12);
  CHECK(v.bytes == (48 - 12) * 4);
  const std::vector<float>& ro = qkv;
  static_assert(std::is_same_v<decltype(span_from(ro, 0)), ConstByteSpan>);
  CHECK(span_from(ro, 0).bytes == 48 * 4);
  CHECK(span_from(ro, 48).bytes == 0);  // the end: an empty view
  std::array<double, 4> a{};
  CHECK(span_from(a, 1).bytes == 24);
  CHECK(ut::code_of([&] { (void)span_from(qkv, 49); }) == Errc::buffer_too_small);
  std::vector<float> none;  // a rank with no tokens: every view into its empty fused buffer is empty
  CHECK(span_from(none, 8).bytes == 0);
  CHECK(span_from(none, 8).data == none.data());
}

TEST_CASE("a span remembers its range's element size (what the calls check against the tensor's): sizeof(T) from a range, 0 from (pointer, bytes), kept by ByteSpan -> ConstByteSpan and span_from()") {
  std::vector<double> d(4);
  std::vector<std::byte> raw(8);
  const std::vector<float> f(4);
  CHECK(ConstByteSpan(d).elem_bytes == 8);
  CHECK(ConstByteSpan(f).elem_bytes == 4);
  CHECK(ConstByteSpan(raw).elem_bytes == 1);
  CHECK(ConstByteSpan(d.data(), 32).elem_bytes == 0);
  ByteSpan b = d;
  CHECK(b.elem_bytes == 8);
  const ConstByteSpan c = b;
  CHECK(c.elem_bytes == 8);
  CHECK(span_from(d, 1).elem_bytes == 8);
  CHECK(span_from(f, 1).elem_bytes == 4);
  // the check: another size refused (naming the buffer), the same size, bytes, unknown and an opaque divisor pass
  auto name = [] { return std::string("input 0 (tensor 0, seq-sharded)"); };
  const auto [code, msg] = ut::error_of([&] { detail::check_range_element(name, 8, 4, "float32", false); });
  CHECK(code == Errc::tensor_mismatch);
  CHECK(msg.find("input 0 (tensor 0, seq-sharded) was given as a range of 8-byte elements; the tensor's are 4-byte float32") != std::string::npos);
  CHECK(ut::code_of([&] { detail::check_range_element(name, 2, 4, "float32", false); }) == Errc::tensor_mismatch);
  CHECK(ut::code_of([&] { detail::check_range_element(name, 4, 4, "float32", false); }) == Errc{});
  CHECK(ut::code_of([&] { detail::check_range_element(name, 1, 4, "float32", false); }) == Errc{});
  CHECK(ut::code_of([&] { detail::check_range_element(name, 0, 2, "bfloat16", false); }) == Errc{});
  CHECK(ut::code_of([&] { detail::check_range_element(name, 4, 12, "opaque", true); }) == Errc{});
  CHECK(ut::code_of([&] { detail::check_range_element(name, 8, 12, "opaque", true); }) == Errc::tensor_mismatch);
  CHECK(ut::code_of([&] { detail::check_range_element(name, 4, 12, "float32", false); }) == Errc::tensor_mismatch);
}
