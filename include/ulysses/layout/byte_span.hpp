// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief ConstByteSpan and ByteSpan: a caller's buffer as a base pointer and its size in bytes,
///        made from (pointer, bytes) or any contiguous range (std::vector, std::array, std::span).
///        What every call of the library takes its buffers as (docs/guide.md, docs/decode.md).
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

#include "../error.hpp"
#include "../version.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {
template <class C, class P, class = void>
struct is_byte_range : std::false_type {};
template <class C, class P>
struct is_byte_range<C, P, std::void_t<decltype(std::declval<C&>().data()), decltype(std::declval<C&>().size())>>
    : std::is_convertible<decltype(std::declval<C&>().data()), P> {};
}  // namespace detail

/// A buffer the library reads: base pointer and size in bytes (at least what the plan needs:
/// Plan::input_bytes(); more is fine). Made from (pointer, bytes) or from any contiguous range
/// with data() and size() (std::vector<T>, std::array, std::span, ...: size() * sizeof(T) bytes).
/// A span made from a range remembers the size of the range's elements (elem_bytes): the calls
/// refuse a range of another element size than the plan's tensor (std::vector<double> for a
/// float32 tensor would move as bytes; Error(tensor_mismatch), detail::check_range_element()).
/// Ranges of bytes (char, std::byte, std::uint8_t) and spans made from (pointer, bytes) pass.
struct ConstByteSpan {
  const void* data = nullptr;  ///< base pointer (the layout's element (0,0,0,0))
  std::size_t bytes = 0;       ///< bytes available from data
  std::size_t elem_bytes = 0;  ///< sizeof the range's elements when made from a range; 0 from (pointer, bytes)
  ConstByteSpan() = default;
  ConstByteSpan(const void* d, std::size_t n, std::size_t e = 0) : data(d), bytes(n), elem_bytes(e) {}
  template <class C, class = std::enable_if_t<detail::is_byte_range<const C, const void*>::value>>
  ConstByteSpan(const C& c)  // NOLINT: implicit by design
      : data(c.data()), bytes(c.size() * sizeof(*c.data())), elem_bytes(sizeof(*c.data())) {}
};

/// A buffer the library writes (or uses as scratch): base pointer and size in bytes. Made like
/// ConstByteSpan, from (pointer, bytes) or a non-const contiguous range.
struct ByteSpan {
  void* data = nullptr;        ///< base pointer
  std::size_t bytes = 0;       ///< bytes available from data
  std::size_t elem_bytes = 0;  ///< sizeof the range's elements when made from a range; 0 from (pointer, bytes)
  ByteSpan() = default;
  ByteSpan(void* d, std::size_t n, std::size_t e = 0) : data(d), bytes(n), elem_bytes(e) {}
  template <class C, class = std::enable_if_t<detail::is_byte_range<C, void*>::value && !std::is_const_v<C>>>
  ByteSpan(C& c) : data(c.data()), bytes(c.size() * sizeof(*c.data())), elem_bytes(sizeof(*c.data())) {}  // NOLINT: implicit by design
  operator ConstByteSpan() const { return {data, bytes, elem_bytes}; }  ///< the same bytes, read-only
};

namespace detail {
/// Refuses a span made from a range whose elements are not the tensor's: elements of range_elem
/// bytes (ConstByteSpan::elem_bytes; 0 or 1: bytes, any tensor) for a tensor of elem-byte
/// elements, of type `type`. An opaque tensor also takes a range of a divisor of its element size
/// (a 12-byte element held in floats). Local to the rank, before any byte moves; `what()` (the
/// buffer's name, a std::string) is called only to fail, so a passing check allocates nothing.
/// @throws Error(tensor_mismatch) naming the buffer, both sizes and the way to pass bytes on purpose.
template <class Name>
void check_range_element(const Name& what, std::size_t range_elem, std::size_t elem, const char* type, bool opaque) {
  if (range_elem <= 1 || range_elem == elem || (opaque && elem % range_elem == 0)) return;
  fail(Errc::tensor_mismatch, std::string(what()) + " was given as a range of " + std::to_string(range_elem) +
                                  "-byte elements; the tensor's are " + std::to_string(elem) + "-byte " + type +
                                  " (its bytes would move as such). Give a range of the tensor's element type, or "
                                  "ConstByteSpan / ByteSpan(pointer, bytes)");
}
}  // namespace detail

/// The bytes of a contiguous range from its element `first` to its end: the buffer of one tensor
/// inside a fused one (q, k and v of one projection, [B, S_r, H + 2 Hkv, D]), whose strided layout
/// spans up to the end of the fused buffer. A ByteSpan for a non-const range, else a ConstByteSpan.
/// @param c     a contiguous range (data() and size(): std::vector<T>, std::array, ...)
/// @param first the element the tensor starts at (its element (0, 0, 0, 0)), in elements of c
/// An empty range gives an empty view at any `first` (a rank that holds no tokens: its fused buffer
/// is empty, and so is every view into it).
/// @throws Error(buffer_too_small) first > c.size() of a non-empty range.
template <class C, class = std::enable_if_t<detail::is_byte_range<C, const void*>::value>>
auto span_from(C& c, std::size_t first) {
  if (c.size() == 0) first = 0;
  if (first > c.size())
    detail::fail(Errc::buffer_too_small, "span_from: element " + std::to_string(first) + " is past the end of a range of " +
                                             std::to_string(c.size()) + " elements");
  const std::size_t bytes = (c.size() - first) * sizeof(*c.data()), e = sizeof(*c.data());
  if constexpr (std::is_const_v<std::remove_pointer_t<decltype(c.data())>>) return ConstByteSpan(c.data() + first, bytes, e);
  else return ByteSpan(c.data() + first, bytes, e);
}

ULYSSES_NAMESPACE_END
