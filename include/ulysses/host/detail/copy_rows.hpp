// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The host executor's innermost loop: copy_rows() copies n strided rows, and with
///        streaming stores (copy_rows_streaming(), SSE2 non-temporal stores on x86-64) skips the
///        read-for-ownership of destination lines in copies larger than the caches. Same bytes
///        either way (host/executor.hpp; docs/performance.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "../../version.hpp"

// Streaming (non-temporal) stores of the host executor: SSE2, part of every x86-64 CPU.
#if (defined(__x86_64__) || defined(_M_X64)) && !defined(__CUDA_ARCH__)
#define ULYSSES_HOST_STREAMING 1
#include <emmintrin.h>
#else
#define ULYSSES_HOST_STREAMING 0
#endif

ULYSSES_NAMESPACE_BEGIN

namespace detail {

/// Copies n rows of N bytes. A row of more than 256 bytes goes in 64-byte pieces: GCC inlines a
/// fixed memcpy of 512 bytes (two D=128 bf16 heads of a head band, one fp32 head) as `rep movsq`,
/// whose start-up cost per row is high on some x86 cores (CHANGELOG.md, "Changed"). Same bytes
/// either way.
template <std::size_t N>
inline void copy_rows_fixed(std::byte* dst, const std::byte* src, std::int64_t n, std::int64_t ds, std::int64_t ss) {
  for (std::int64_t i = 0; i < n; ++i) {
    if constexpr (N > 256 && N % 64 == 0) {
      for (std::size_t k = 0; k < N; k += 64) std::memcpy(dst + i * ds + k, src + i * ss + k, 64);
    } else {
      std::memcpy(dst + i * ds, src + i * ss, N);
    }
  }
}

/// Copies n rows of `row` bytes with the given strides (the innermost loop of the host executor).
inline void copy_rows(std::byte* dst, const std::byte* src, std::int64_t n, std::int64_t row, std::int64_t ds,
                      std::int64_t ss) {
  if (ds == row && ss == row) {  // the rows themselves are contiguous: one copy
    std::memcpy(dst, src, static_cast<std::size_t>(n * row));
    return;
  }
  switch (row) {  // fixed sizes let the compiler emit plain loads and stores
    case 1: return copy_rows_fixed<1>(dst, src, n, ds, ss);
    case 2: return copy_rows_fixed<2>(dst, src, n, ds, ss);
    case 4: return copy_rows_fixed<4>(dst, src, n, ds, ss);
    case 8: return copy_rows_fixed<8>(dst, src, n, ds, ss);
    case 16: return copy_rows_fixed<16>(dst, src, n, ds, ss);
    case 256: return copy_rows_fixed<256>(dst, src, n, ds, ss);  // D=128 of 2-byte elements
    case 512: return copy_rows_fixed<512>(dst, src, n, ds, ss);  // D=128 of 4-byte elements
    default:
      for (std::int64_t i = 0; i < n; ++i) std::memcpy(dst + i * ds, src + i * ss, static_cast<std::size_t>(row));
  }
}

// ---- streaming (non-temporal) copies ----------------------------------------------------------
// A copy much larger than the caches gains from stores that bypass them: an ordinary store first
// reads the destination line (read-for-ownership), so memory moves 3 bytes per byte copied instead
// of 2. Rows of at least kStreamMinRow bytes are copied with SSE2 non-temporal stores (16-byte
// aligned body; unaligned head and tail with memcpy), and the next row's source is prefetched
// (strided sources, e.g. a head slice of bshd, start a new page every row, which the hardware
// prefetcher does not follow). Other targets fall back to copy_rows. The bytes are the same.
/// Rows shorter than this are never streamed (too short to fill write-combining buffers).
inline constexpr std::int64_t kStreamMinRow = 64;
/// Rows up to this size prefetch the next row's source while being copied; longer rows prefetch
/// kStreamPrefetchAhead bytes ahead in the row itself.
inline constexpr std::int64_t kStreamPrefetchMaxRow = 16 << 10;
inline constexpr std::int64_t kStreamPrefetchAhead = 1024;

/// Orders this thread's streaming stores before its later stores (call after streaming copies,
/// before another thread or a communicator may read the destination).
inline void stream_fence() {
#if ULYSSES_HOST_STREAMING
  _mm_sfence();
#endif
}

#if ULYSSES_HOST_STREAMING
/// One row of n bytes with non-temporal stores; prefetches from address `pf` at the offsets it
/// copies (the next row, or a point ahead in this one). A prefetch never faults, so `pf` may run
/// past the data (it is an integer address for that reason, never dereferenced).
inline void stream_row(std::byte* d, const std::byte* s, std::size_t n, std::uintptr_t pf) {
  const std::size_t head = (16 - (reinterpret_cast<std::uintptr_t>(d) & 15)) & 15;
  if (n < head + 64) {
    std::memcpy(d, s, n);
    return;
  }
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  pf += head;
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(pf + i), _MM_HINT_T0);
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  for (; i + 16 <= n; i += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
  if (i < n) std::memcpy(d + i, s + i, n - i);
}
#endif

/// copy_rows with non-temporal stores for rows of kStreamMinRow bytes or more (contiguous rows as
/// one long row); the caller runs stream_fence() afterwards.
inline void copy_rows_streaming(std::byte* dst, const std::byte* src, std::int64_t n, std::int64_t row, std::int64_t ds,
                                std::int64_t ss) {
#if ULYSSES_HOST_STREAMING
  if (ds == row && ss == row) {  // contiguous rows: one long row
    row *= n;
    n = 1;
  }
  if (row >= kStreamMinRow) {
    const bool next_row = row <= kStreamPrefetchMaxRow;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::byte* s = src + i * ss;
      const auto a = reinterpret_cast<std::uintptr_t>(s);
      stream_row(dst + i * ds, s, static_cast<std::size_t>(row),
                 next_row && i + 1 < n ? a + static_cast<std::uintptr_t>(ss) : a + kStreamPrefetchAhead);
    }
    return;
  }
#endif
  copy_rows(dst, src, n, row, ds, ss);
}

/// Innermost loop of the host executor: copy_rows, or copy_rows_streaming when `streaming`.
inline void copy_rows_as(bool streaming, std::byte* dst, const std::byte* src, std::int64_t n, std::int64_t row,
                         std::int64_t ds, std::int64_t ss) {
  if (streaming)
    copy_rows_streaming(dst, src, n, row, ds, ss);
  else
    copy_rows(dst, src, n, row, ds, ss);
}

}  // namespace detail

ULYSSES_NAMESPACE_END
