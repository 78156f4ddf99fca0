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
struct ConstByteSpan {
  const void* data = nullptr;  ///< base pointer (the layout's element (0,0,0,0))
  std::size_t bytes = 0;       ///< bytes available from data
  ConstByteSpan() = default;
  ConstByteSpan(const void* d, std::size_t n) : data(d), bytes(n) {}
  template <class C, class = std::enable_if_t<detail::is_byte_range<const C, const void*>::value>>
  ConstByteSpan(const C& c) : data(c.data()), bytes(c.size() * sizeof(*c.data())) {}  // NOLINT: implicit by design
};

/// A buffer the library writes (or uses as scratch): base pointer and size in bytes. Made like
/// ConstByteSpan, from (pointer, bytes) or a non-const contiguous range.
struct ByteSpan {
  void* data = nullptr;   ///< base pointer
  std::size_t bytes = 0;  ///< bytes available from data
  ByteSpan() = default;
  ByteSpan(void* d, std::size_t n) : data(d), bytes(n) {}
  template <class C, class = std::enable_if_t<detail::is_byte_range<C, void*>::value && !std::is_const_v<C>>>
  ByteSpan(C& c) : data(c.data()), bytes(c.size() * sizeof(*c.data())) {}  // NOLINT: implicit by design
  operator ConstByteSpan() const { return {data, bytes}; }  ///< the same bytes, read-only
};

/// The bytes of a contiguous range from its element `first` to its end: the buffer of one tensor
/// inside a fused one (q, k and v of one projection, [B, S_r, H + 2 Hkv, D]), whose strided layout
/// spans up to the end of the fused buffer. A ByteSpan for a non-const range, else a ConstByteSpan.
/// @param c     a contiguous range (data() and size(): std::vector<T>, std::array, ...)
/// @param first the element the tensor starts at (its element (0, 0, 0, 0)), in elements of c
/// @throws Error(buffer_too_small) first > c.size().
template <class C, class = std::enable_if_t<detail::is_byte_range<C, const void*>::value>>
auto span_from(C& c, std::size_t first) {
  if (first > c.size())
    detail::fail(Errc::buffer_too_small, "span_from: element " + std::to_string(first) + " is past the end of a range of " +
                                             std::to_string(c.size()) + " elements");
  const std::size_t bytes = (c.size() - first) * sizeof(*c.data());
  if constexpr (std::is_const_v<std::remove_pointer_t<decltype(c.data())>>) return ConstByteSpan(c.data() + first, bytes);
  else return ByteSpan(c.data() + first, bytes);
}

ULYSSES_NAMESPACE_END
