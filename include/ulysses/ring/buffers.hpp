// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The caller's buffers of a ring rotation, by name (RingBuffers), and a typed view of a
///        kv block (RingKvView). See docs/ring.md ("Example", "The backward").
#pragma once

#include <cstddef>

#include "../version.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Two buffers of one kind: the first and the second of a double buffer, with their sizes.
struct RingBufferPair {
  std::byte* first = nullptr;    ///< buffer 0 (step 0's)
  std::size_t first_bytes = 0;   ///< its bytes
  std::byte* second = nullptr;   ///< buffer 1 (null allowed when R = 1)
  std::size_t second_bytes = 0;  ///< its bytes
};

/// The buffers of a RingRotation / RingGradRotation, named: `RingBuffers().kv(kv0, kv1)` (kv0
/// holds this rank's own block before start(0)) and, for the backward, `.grad(g0, g1)` (g0: step
/// 0's accumulator). Each a contiguous container (data(), size(): a std::vector, your device
/// buffer type) or a pointer and a byte count, in the ring communicator's memory. Sizes:
/// RingPlan::kv_buffer_bytes() and grad_buffer_bytes() (checked by the rotation).
class RingBuffers {
 public:
  /// The two kv buffers (containers).
  template <class C0, class C1>
  RingBuffers& kv(C0& first, C1& second) {
    return kv(first.data(), bytes_of(first), second.data(), bytes_of(second));
  }
  /// The two kv buffers (pointers and bytes).
  RingBuffers& kv(void* first, std::size_t first_bytes, void* second, std::size_t second_bytes) {
    kv_ = pair(first, first_bytes, second, second_bytes);
    return *this;
  }
  /// The two fp32 dk|dv accumulators of the backward (containers).
  template <class C0, class C1>
  RingBuffers& grad(C0& first, C1& second) {
    return grad(first.data(), bytes_of(first), second.data(), bytes_of(second));
  }
  /// The two accumulators (pointers and bytes).
  RingBuffers& grad(void* first, std::size_t first_bytes, void* second, std::size_t second_bytes) {
    grad_ = pair(first, first_bytes, second, second_bytes);
    return *this;
  }
  const RingBufferPair& kv_buffers() const { return kv_; }      ///< what kv() named
  const RingBufferPair& grad_buffers() const { return grad_; }  ///< what grad() named

 private:
  template <class C>
  static std::size_t bytes_of(const C& c) {
    return c.size() * sizeof(*c.data());
  }
  static RingBufferPair pair(void* a, std::size_t na, void* b, std::size_t nb) {
    return {static_cast<std::byte*>(a), na, static_cast<std::byte*>(b), nb};
  }
  RingBufferPair kv_, grad_;
};

/// A kv block in a rotation's buffer, typed: k [B, L, Hkv, D] at `k`, v [B, L, Hkv, Dv] at `v`
/// (RingRotation::kv<T>(s)).
template <class T>
struct RingKvView {
  T* k = nullptr;  ///< the block's k
  T* v = nullptr;  ///< the block's v
};

ULYSSES_NAMESPACE_END
