// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What the registered windows share, host (MpiWindow, comm/mpi_window_arena.hpp) and
///        device (MpiDeviceWindow, comm/mpi_device_window_arena.cuh): the registered range
///        (WindowSpan), the registration of a rank's slot (detail::WindowRegistry: aligned ranges
///        taken in order, and the digest of their sizes) and the cross-rank comparison of the
///        digests (every rank the same sizes in the same order, else Error(plan_mismatch) on
///        every rank). No MPI, no CUDA. Notes: docs/headers.md (comm/window.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../error.hpp"
#include "agreement.hpp"

ULYSSES_NAMESPACE_BEGIN

/// A registered range of a window: `size()` bytes at `data()` in this process's mapping of the
/// window (host memory for MpiWindow, device memory for MpiDeviceWindow). Converts to
/// ConstByteSpan and ByteSpan (it has data() and size() in bytes), so it is passed to
/// seq_to_head() and the others as is.
struct WindowSpan {
  std::byte* ptr = nullptr;  ///< first byte (in this process's mapping)
  std::size_t n = 0;         ///< bytes
  std::byte* data() const noexcept { return ptr; }  ///< first byte
  std::size_t size() const noexcept { return n; }   ///< bytes
  /// The range as elements of T (`size() / sizeof(T)` of them). @pre data() aligned for T.
  template <class T>
  T* as() const noexcept {
    return reinterpret_cast<T*>(ptr);
  }
};

namespace detail {

/// What a rank registered in its window slot: count, total bytes, a hash of the sizes in order,
/// and the first kShown sizes (for the error message). Equal on every rank, or a plan_mismatch.
/// Plain data: it travels as bytes (an all-gather, a control block).
struct WindowDigest {
  static constexpr int kShown = 8;
  std::uint64_t count = 0, total = 0, hash = 14695981039346656037ull;  // FNV-1a offset basis
  std::uint64_t sizes[kShown] = {};
  void add(std::uint64_t bytes) noexcept {
    for (int i = 0; i < 8; ++i) hash = (hash ^ ((bytes >> (8 * i)) & 0xff)) * 1099511628211ull;  // FNV-1a prime
    if (count < static_cast<std::uint64_t>(kShown)) sizes[count] = bytes;
    ++count;
    total += bytes;
  }
  bool operator==(const WindowDigest& o) const noexcept { return count == o.count && total == o.total && hash == o.hash; }
  std::string str() const {
    std::string s = std::to_string(count) + (count == 1 ? " buffer (" : " buffers (");
    for (std::uint64_t i = 0; i < count && i < static_cast<std::uint64_t>(kShown); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
    if (count > static_cast<std::uint64_t>(kShown)) s += ", ...";
    return s + " bytes)";
  }
};

/// The message naming the ranks whose registrations differ from rank 0's, or "" when all agree.
/// @param all    every rank's digest, P of them
/// @param P      ranks
/// @param window the window's type, for the message ("MpiWindow")
inline std::string registration_mismatch(const WindowDigest* all, int P, const char* window = "MpiWindow") {
  const std::string m = records_differ(
      P, 1, [&](int p, int) { return (all[p].hash * 0x9e3779b97f4a7c15ull ^ all[p].count) + all[p].total; },
      [&](int) { return std::string("the ") + window + " buffers registered"; }, [&](int p, int) { return all[p].str(); });
  if (m.empty()) return m;
  return m + ". Every rank must allocate() the same sizes in the same order (with uneven splits: the largest any rank needs)";
}

/// The clause of a failed wait's message naming the ranks it found missing: "ranks {0, 2} did
/// not arrive in call 5" (`arrival`), or "... did not finish reading in call 5"; the timeout's and
/// the aborted peers' messages of the windows use it alike.
/// @param ranks   the ranks missing (ascending)
/// @param arrival true: they had not arrived; false: they had not finished reading
/// @param call    the call (epoch) of the wait, 1 = the first
inline std::string missing_ranks(const std::vector<int>& ranks, bool arrival, std::uint64_t call) {
  return "ranks " + rank_set(ranks) + (arrival ? " did not arrive" : " did not finish reading") + " in call " + std::to_string(call);
}

/// x rounded up to a multiple of a (a > 0).
template <class U>
U round_up(U x, U a) {
  return (x + a - 1) / a * a;
}

/// The registrations of one rank's slot of `bytes` bytes: aligned ranges taken in order from the
/// slot's start, and their digest. Knows offsets only (the window adds its base address).
class WindowRegistry {
 public:
  /// @param bytes     the slot's size
  /// @param alignment of every registration (a power of two)
  WindowRegistry(std::size_t bytes, std::size_t alignment) noexcept : bytes_(bytes), align_(alignment) {}

  /// Takes the next `bytes` of the slot and returns their offset.
  /// @param bytes  the range's size
  /// @param rank   this rank (for the message)
  /// @param window the window's type (for the message)
  /// @throws Error(buffer_too_small) the slot has fewer bytes left (nothing registered then).
  std::size_t allocate(std::size_t bytes, int rank, const char* window) {
    const std::size_t off = round_up(used_, align_);
    if (off > bytes_ || bytes > bytes_ - off)
      fail(Errc::buffer_too_small, std::string(window) + "::allocate(" + std::to_string(bytes) + "): rank " + std::to_string(rank) + " has " +
                                       std::to_string(off > bytes_ ? 0 : bytes_ - off) + " of its " + std::to_string(bytes_) +
                                       " window bytes left; make the window larger");
    used_ = off + bytes;
    digest_.add(bytes);
    return off;
  }
  /// Forgets every registration.
  void reset() noexcept {
    used_ = 0;
    digest_ = {};
  }
  std::size_t bytes() const noexcept { return bytes_; }   ///< the slot's size
  std::size_t used() const noexcept { return used_; }     ///< the end of the last registration
  const WindowDigest& digest() const noexcept { return digest_; }  ///< what was registered
  /// Whether [p, p + n) lies in the slot that starts at `base`.
  bool contains(const void* base, const void* p, std::size_t n) const noexcept {
    const auto b = reinterpret_cast<std::uintptr_t>(p), lo = reinterpret_cast<std::uintptr_t>(base);
    return b >= lo && b - lo <= bytes_ && n <= bytes_ - (b - lo);
  }
  /// Whether p points into the slot that starts at `base` (its first byte does).
  bool starts_in(const void* base, const void* p) const noexcept {
    const auto b = reinterpret_cast<std::uintptr_t>(p), lo = reinterpret_cast<std::uintptr_t>(base);
    return b >= lo && b - lo < bytes_;
  }

 private:
  std::size_t bytes_, align_, used_ = 0;
  WindowDigest digest_;
};

}  // namespace detail

ULYSSES_NAMESPACE_END
