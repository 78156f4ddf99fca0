// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief ConstByteSpan and ByteSpan: a caller's buffer as a base pointer and its size in bytes,
///        made from (pointer, bytes) or any contiguous range (std::vector, std::array, std::span).
///        What every call of the library takes its buffers as (docs/guide.md, docs/decode.md).
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

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

ULYSSES_NAMESPACE_END
