// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The one hash of the library: 64-bit FNV-1a (Fowler, Noll, Vo), over the 8 bytes of a
///        value, little end first. Used by the agreement record, the plan fingerprint and the
///        node layout's hash (they must be equal on every rank and build, so no std::hash).
#pragma once

#include <cstdint>

#include "../version.hpp"

ULYSSES_NAMESPACE_BEGIN
namespace detail {

/// FNV-1a offset basis.
inline constexpr std::uint64_t kFnvBasis = 0xcbf29ce484222325ull;

/// Folds the 8 bytes of v (least significant first) into the FNV-1a hash h.
constexpr std::uint64_t fnv1a(std::uint64_t h, std::uint64_t v) noexcept {
  for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xffu)) * 0x100000001b3ull;
  return h;
}
/// As fnv1a(h, v) for a signed value (its two's complement bytes).
constexpr std::uint64_t fnv1a(std::uint64_t h, std::int64_t v) noexcept { return fnv1a(h, static_cast<std::uint64_t>(v)); }
/// As fnv1a(h, v) for an int (sign-extended to 64 bits).
constexpr std::uint64_t fnv1a(std::uint64_t h, int v) noexcept { return fnv1a(h, static_cast<std::int64_t>(v)); }

}  // namespace detail
ULYSSES_NAMESPACE_END
