// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The host executor: runs a plan's block lists (block.hpp) with host loads and stores.
///
/// HostExecutor runs a list on the calling thread or on a small persistent pool
/// (HostExecutorOptions::threads), visits each block's loops in a page-friendly order, and writes
/// large lists with streaming (non-temporal) stores on x86-64; every setting writes the same
/// bytes. Sums (BlockOp::sum) add their terms by the rules of element.hpp.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "../detail/worker.hpp"
#include "../layout/blocks.hpp"
#include "../layout/element.hpp"
#include "../error.hpp"
#include "../layout/layout.hpp"

// Streaming (non-temporal) stores of the host executor: SSE2, part of every x86-64 CPU.
#if (defined(__x86_64__) || defined(_M_X64)) && !defined(__CUDA_ARCH__)
#define ULYSSES_HOST_STREAMING 1
#include <emmintrin.h>
#else
#define ULYSSES_HOST_STREAMING 0
#endif

// The bfloat16 sums' AVX2 loop (host/executor.hpp sum_run_bf16): compiled for AVX2 by a target
// attribute (GCC, Clang; not in CUDA translation units, whose front end is not asked to), taken
// when the CPU has it (checked once at run time); SSE2 otherwise. The same bits either way.
#if ULYSSES_HOST_STREAMING && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define ULYSSES_HOST_AVX2 1
#include <immintrin.h>
#else
#define ULYSSES_HOST_AVX2 0
#endif

ULYSSES_NAMESPACE_BEGIN

namespace detail {

template <std::size_t N>
inline void copy_rows_fixed(std::byte* dst, const std::byte* src, std::int64_t n, std::int64_t ds, std::int64_t ss) {
  for (std::int64_t i = 0; i < n; ++i) std::memcpy(dst + i * ds, src + i * ss, N);
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

/// Runs one block copy on the host (op == BlockOp::copy; sums run through HostExecutor::run).
/// @param c         the block (its buffers are indices into `t`)
/// @param t         the base pointers of the call's buffers
/// @param streaming copy rows of 64 bytes or more with non-temporal (cache-bypassing) stores; the
///                  caller must then call detail::stream_fence() before the data is read by
///                  another thread. Same bytes either way.
/// @pre the table holds valid pointers for the block's buffers; source and destination do not overlap.
inline void run_block_host(const BlockCopy& c, const BufferTable& t, bool streaming = false) {
  const std::byte* src = detail::buffer_at(t, c.src_buffer) + c.src_offset;
  std::byte* dst = detail::buffer_at(t, c.dst_buffer) + c.dst_offset;
  for (std::int64_t i0 = 0; i0 < c.extent[0]; ++i0)
    for (std::int64_t i1 = 0; i1 < c.extent[1]; ++i1)
      for (std::int64_t i2 = 0; i2 < c.extent[2]; ++i2)
        detail::copy_rows_as(streaming, dst + i0 * c.dst_stride[0] + i1 * c.dst_stride[1] + i2 * c.dst_stride[2],
                             src + i0 * c.src_stride[0] + i1 * c.src_stride[1] + i2 * c.src_stride[2], c.extent[3],
                             c.row_bytes, c.dst_stride[3], c.src_stride[3]);
}

namespace detail {

/// Pages of 4 KiB one loop of n steps of `stride` bytes touches (about).
inline std::int64_t loop_pages(std::int64_t n, std::int64_t stride) {
  return stride >= 4096 ? n : (n * stride + 4095) / 4096;
}

/// The block with its outer loops reordered for the host: the innermost loop (extent[3]) becomes
/// the outer dimension whose loop touches the fewest pages on both sides together, so the rows
/// copied one after the other lie in few pages (TLB and hardware prefetch friendly), e.g. a
/// bhsd output written from a [tokens, heads, D] wire chunk walks heads inside tokens, reading the
/// chunk in order, instead of reading one row per page. The other loops keep their order. Any
/// loop order copies the same bytes (a block's rows never overlap).
inline BlockCopy host_order(const BlockCopy& c) {
  int best = 3;
  std::int64_t best_pages = loop_pages(c.extent[3], c.src_stride[3]) + loop_pages(c.extent[3], c.dst_stride[3]);
  for (int i = 0; i < 3; ++i) {
    if (c.extent[i] <= 1) continue;
    const std::int64_t p = loop_pages(c.extent[i], c.src_stride[i]) + loop_pages(c.extent[i], c.dst_stride[i]);
    if (p < best_pages) {
      best = i;
      best_pages = p;
    }
  }
  if (best == 3) return c;
  BlockCopy o = c;
  for (int i = best; i < 3; ++i) {  // shift the loops after `best` outwards by one
    o.extent[i] = c.extent[i + 1];
    o.src_stride[i] = c.src_stride[i + 1];
    o.dst_stride[i] = c.dst_stride[i + 1];
  }
  o.extent[3] = c.extent[best];
  o.src_stride[3] = c.src_stride[best];
  o.dst_stride[3] = c.dst_stride[best];
  return o;
}

/// Copies the bytes [lo, hi) of block `c` (bytes numbered row by row in loop order, row-major over
/// extent[0..3], then within the row): whole rows go through copy_rows_as, a row cut by lo or hi
/// is copied in part. The result is the same bytes as run_block_host restricted to that range.
/// @pre 0 <= lo <= hi <= c.bytes()
inline void run_block_range(const BlockCopy& c, const BufferTable& t, std::int64_t lo, std::int64_t hi, bool streaming) {
  if (lo == 0 && hi == c.bytes()) return run_block_host(c, t, streaming);
  const std::byte* src = detail::buffer_at(t, c.src_buffer) + c.src_offset;
  std::byte* dst = detail::buffer_at(t, c.dst_buffer) + c.dst_offset;
  const std::int64_t R = c.row_bytes, e3 = c.extent[3];
  std::int64_t pos = lo;
  while (pos < hi) {
    const std::int64_t row = pos / R, off = pos % R, i3 = row % e3;
    std::int64_t so, dso;
    row_offsets(c, row, so, dso);
    if (off != 0 || hi - pos < R) {  // a row cut by the range: copy its part
      const std::int64_t n = std::min(R - off, hi - pos);
      copy_rows_as(streaming, dst + dso + off, src + so + off, 1, n, n, n);
      pos += n;
      continue;
    }
    const std::int64_t n = std::min(e3 - i3, (hi - pos) / R);  // whole rows along the innermost loop
    copy_rows_as(streaming, dst + dso, src + so, n, R, c.dst_stride[3], c.src_stride[3]);
    pos += n * R;
  }
}

/// A position in a block's rows, numbered as row_offsets() numbers them (row-major over
/// extent[0..3], extent[3] fastest), that steps to the next row with no division: the host sums
/// visit every row of every term, and a 64-bit division per row and term cost more than adding
/// the row's elements (the summed inverse's rows are D elements).
struct RowCursor {
  std::int64_t idx[4];  ///< the row's index in each of the block's 4 loops (outermost first)
  /// The cursor at row `row` of block `c` (one decomposition). @pre 0 <= row < c.rows()
  RowCursor(const BlockCopy& c, std::int64_t row) {
    for (int i = 3; i >= 1; --i) {
      idx[i] = row % c.extent[i];
      row /= c.extent[i];
    }
    idx[0] = row;
  }
  /// Byte offset of the current row from the source (`src`) or the destination of block c:
  /// the same as row_offsets() gives.
  std::int64_t offset(const BlockCopy& c, bool src) const {
    const std::int64_t* st = src ? c.src_stride : c.dst_stride;
    return idx[0] * st[0] + idx[1] * st[1] + idx[2] * st[2] + idx[3] * st[3];
  }
  /// Steps to the next row of a block with extents `c.extent`.
  void next(const BlockCopy& c) {
    for (int i = 3; i >= 1; --i) {
      if (++idx[i] < c.extent[i]) return;
      idx[i] = 0;
    }
    ++idx[0];
  }
};

#if ULYSSES_HOST_STREAMING
/// float → bfloat16 of 8 floats in two registers, SSE2 (the rounding of element.hpp
/// float_to_bfloat16: add 0x7fff plus the kept lowest bit, keep the upper half; NaN to 0x7fc0),
/// packed with a signed pack of the sign-extended upper halves (exact: they fit in 16 bits).
inline __m128i narrow_bf16x8(__m128 lo, __m128 hi) {
  const __m128i one = _mm_set1_epi32(1), bias = _mm_set1_epi32(0x7fff), qnan = _mm_set1_epi32(0x7fc0);
  auto half = [&](__m128 f) {
    const __m128i x = _mm_castps_si128(f);
    const __m128i lsb = _mm_and_si128(_mm_srli_epi32(x, 16), one);
    const __m128i r = _mm_srai_epi32(_mm_add_epi32(x, _mm_add_epi32(bias, lsb)), 16);
    const __m128i nan = _mm_castps_si128(_mm_cmpunord_ps(f, f));
    return _mm_or_si128(_mm_andnot_si128(nan, r), _mm_and_si128(nan, qnan));
  };
  return _mm_packs_epi32(half(lo), half(hi));
}
#endif

/// raw[i] = A::narrow(acc[i]) for i < m: a plain loop the compiler vectorises, except bfloat16 on
/// x86-64, whose 32-to-16-bit narrowing SSE2 has no unsigned pack for: there narrow_bf16x8, eight
/// lanes at a time. Same bits either way.
template <class A>
inline void narrow_batch(const typename A::Acc* acc, typename A::Bits* raw, std::int64_t m) {
  std::int64_t i = 0;
#if ULYSSES_HOST_STREAMING
  if constexpr (std::is_same_v<A, SumArith<ElementType::bfloat16>>) {
    for (; i + 8 <= m; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(raw + i), narrow_bf16x8(_mm_loadu_ps(acc + i), _mm_loadu_ps(acc + i + 4)));
  }
#endif
  for (; i < m; ++i) raw[i] = A::narrow(acc[i]);
}

#if ULYSSES_HOST_AVX2
/// Whether this CPU runs AVX2 (asked once).
inline bool host_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

/// sum_run_bf16's loop, 16 lanes at a time with AVX2: the first m - m % 16 elements; returns how
/// many it did. The 256-bit unpacks and pack work within each 128-bit half, so the widened
/// elements are permuted (0-3 and 8-11 low, 4-7 and 12-15 high) and the pack puts them back in order.
__attribute__((target("avx2"))) inline std::int64_t sum_run_bf16_avx2(std::byte* d, const std::byte* const* src, int n, std::int64_t m,
                                                                       bool streaming) {
  const __m256i zero = _mm256_setzero_si256(), one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff),
                qnan = _mm256_set1_epi32(0x7fc0);
  const bool nt = streaming && (reinterpret_cast<std::uintptr_t>(d) & 31) == 0;
  std::int64_t i = 0;
  for (; i + 16 <= m; i += 16) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src[0] + 2 * i));
    __m256 lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, x)), hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, x));
    for (int j = 1; j < n; ++j) {
      const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src[j] + 2 * i));
      lo = _mm256_add_ps(lo, _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, y)));
      hi = _mm256_add_ps(hi, _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, y)));
    }
    __m256 f[2] = {lo, hi};
    __m256i h[2];
    for (int k = 0; k < 2; ++k) {  // narrow_bf16x8's rounding, 8 lanes (in the loop: a lambda would not be compiled for AVX2)
      const __m256i b = _mm256_castps_si256(f[k]);
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), one);
      const __m256i rounded = _mm256_srai_epi32(_mm256_add_epi32(b, _mm256_add_epi32(bias, lsb)), 16);
      h[k] = _mm256_blendv_epi8(rounded, qnan, _mm256_castps_si256(_mm256_cmp_ps(f[k], f[k], _CMP_UNORD_Q)));
    }
    const __m256i r = _mm256_packs_epi32(h[0], h[1]);
    if (nt) _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 2 * i), r);
    else _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + 2 * i), r);
  }
  return i;
}
#endif

#if ULYSSES_HOST_STREAMING
/// Most terms the fused bfloat16 sum takes (more go through run_sum_range_as' batches).
inline constexpr int kFusedSumTerms = 64;

/// m bfloat16 elements at d = the sum of the terms src[0..n) in order (((t0 + t1) + t2) + ...),
/// in float, rounded once: the rules of element.hpp, the bits of run_sum_range_as' batches. Eight
/// lanes at a time in registers (each term widened by a shift into the upper half, added, the
/// sum narrowed by narrow_bf16x8): no accumulator array, one load per term and element, one
/// store per element (non-temporal when `streaming` and d is 16-byte aligned; the caller fences).
inline void sum_run_bf16(std::byte* d, const std::byte* const* src, int n, std::int64_t m, bool streaming) {
  using A = SumArith<ElementType::bfloat16>;
  const __m128i zero = _mm_setzero_si128();
  const bool nt = streaming && (reinterpret_cast<std::uintptr_t>(d) & 15) == 0;
  std::int64_t i = 0;
#if ULYSSES_HOST_AVX2
  if (host_has_avx2()) i = sum_run_bf16_avx2(d, src, n, m, streaming);
#endif
  for (; i + 8 <= m; i += 8) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src[0] + 2 * i));
    __m128 lo = _mm_castsi128_ps(_mm_unpacklo_epi16(zero, x)), hi = _mm_castsi128_ps(_mm_unpackhi_epi16(zero, x));
    for (int j = 1; j < n; ++j) {
      const __m128i y = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src[j] + 2 * i));
      lo = _mm_add_ps(lo, _mm_castsi128_ps(_mm_unpacklo_epi16(zero, y)));
      hi = _mm_add_ps(hi, _mm_castsi128_ps(_mm_unpackhi_epi16(zero, y)));
    }
    const __m128i r = narrow_bf16x8(lo, hi);
    if (nt) _mm_stream_si128(reinterpret_cast<__m128i*>(d + 2 * i), r);
    else _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * i), r);
  }
  for (; i < m; ++i) {
    float acc = A::load(src[0] + 2 * i);
    for (int j = 1; j < n; ++j) acc = acc + A::load(src[j] + 2 * i);
    A::store(d + 2 * i, acc);
  }
}
#endif

/// The sum whose terms are g[0..g[0].sources), for the destination bytes [lo, hi) (multiples of
/// the element size, numbered as in run_block_range): every element is the sum of its terms in
/// order (((t0 + t1) + t2) + ...), added and rounded by the rules of element.hpp, written once.
/// One contiguous run (a row, or its part in the range) at a time, in batches of kSumBatch
/// elements: the first term widened into accumulators on the stack, each further term added to
/// them straight from its source, the results narrowed into a stack buffer (narrow_batch()) and
/// written with one copy (streaming stores when `streaming`; the caller fences). Each loop is a plain
/// loop over contiguous elements of one type (the compiler vectorises them); no allocation, no
/// division per row. bfloat16 on x86-64 (up to kFusedSumTerms terms) adds its terms in registers
/// instead (sum_run_bf16: a third of the instructions, no stack traffic), with the same bits.
/// @pre g[0].op == BlockOp::sum; 0 <= lo <= hi <= g[0].bytes()
template <class A>
void run_sum_range_as(const BlockCopy* g, const BufferTable& t, std::int64_t lo, std::int64_t hi, bool streaming) {
  constexpr std::int64_t kSumBatch = 512;
  using Acc = typename A::Acc;
  using Bits = typename A::Bits;
  constexpr std::int64_t E = sizeof(Bits);  // == c.elem_bytes (make_blocks): a constant, so that the loops vectorise
  const BlockCopy& c = g[0];
  const int n = c.sources;
  const std::int64_t R = c.row_bytes;
  std::byte* const dst_base = buffer_at(t, c.dst_buffer) + c.dst_offset;
  Acc acc[kSumBatch];
  Bits raw[kSumBatch];  // the narrowed batch, as stored
  if (lo >= hi) return;
  RowCursor at(c, lo / R);
  std::int64_t off = lo % R;  // where the range starts in its first row (every later row: at 0)
#if ULYSSES_HOST_STREAMING
  if constexpr (std::is_same_v<A, SumArith<ElementType::bfloat16>>) {
    if (n <= kFusedSumTerms) {  // bfloat16: the terms added in registers (sum_run_bf16), same bits
      const std::byte* src[kFusedSumTerms];
      for (std::int64_t pos = lo; pos < hi; off = 0) {
        const std::int64_t run = std::min(R - off, hi - pos);
        for (int j = 0; j < n; ++j) src[j] = buffer_at(t, g[j].src_buffer) + g[j].src_offset + at.offset(g[j], true) + off;
        sum_run_bf16(dst_base + at.offset(c, false) + off, src, n, run / E, streaming);
        pos += run;
        at.next(c);
      }
      return;
    }
  }
#endif
  for (std::int64_t pos = lo; pos < hi; off = 0) {
    const std::int64_t run = std::min(R - off, hi - pos);  // this row's bytes in the range
    std::byte* const d = dst_base + at.offset(c, false) + off;
    for (std::int64_t b = 0; b < run; b += kSumBatch * E) {  // batches of this run
      const std::int64_t m = std::min(kSumBatch, (run - b) / E);
      for (int j = 0; j < n; ++j) {
        const std::byte* s = buffer_at(t, g[j].src_buffer) + g[j].src_offset + at.offset(g[j], true) + off + b;
        if (j == 0)
          for (std::int64_t i = 0; i < m; ++i) acc[i] = A::load(s + i * E);
        else
          for (std::int64_t i = 0; i < m; ++i) acc[i] = acc[i] + A::load(s + i * E);
      }
      narrow_batch<A>(acc, raw, m);
#if ULYSSES_HOST_STREAMING
      if (streaming && m * E >= kStreamMinRow) {
        const auto pf = reinterpret_cast<std::uintptr_t>(raw);  // (the sources are read in order: no prefetch needed)
        stream_row(d + b, reinterpret_cast<const std::byte*>(raw), static_cast<std::size_t>(m * E), pf);
        continue;
      }
#endif
      std::memcpy(d + b, raw, static_cast<std::size_t>(m * E));
    }
    pos += run;
    at.next(c);
  }
  (void)streaming;
}

/// run_sum_range_as for the sum's element type (one dispatch per range, none per element).
inline void run_sum_range(const BlockCopy* g, const BufferTable& t, std::int64_t lo, std::int64_t hi, bool streaming = false) {
  with_sum_arith(g[0].type, [&](auto a) { run_sum_range_as<decltype(a)>(g, t, lo, hi, streaming); });
}

/// Runs the bytes [lo, hi) of the concatenation of the n blocks' written bytes (block 0 first;
/// BlockCopy::written_bytes(): the further terms of a sum count nothing, its first block the
/// destination). A sum's part is cut at element boundaries (both neighbouring ranges round the
/// same way, so they meet exactly).
inline void run_blocks_range(const BlockCopy* blocks, std::size_t n, const BufferTable& t, std::int64_t lo,
                             std::int64_t hi, bool streaming) {
  std::int64_t start = 0;
  for (std::size_t i = 0; i < n && start < hi; ++i) {
    const BlockCopy& c = blocks[i];
    const std::int64_t b = c.written_bytes(), end = start + b;
    if (end > lo && b > 0) {
      const std::int64_t a = std::max(lo, start) - start, z = std::min(hi, end) - start;
      if (c.op == BlockOp::sum) {
        const std::int64_t E = c.elem_bytes;
        run_sum_range(&c, t, a / E * E, z / E * E, streaming);
      } else {
        run_block_range(host_order(c), t, a, z, streaming);
      }
    }
    start = end;
  }
}

/// A fixed set of worker threads (detail::Worker, detail/worker.hpp) that run the parts of one
/// call at a time (the calling thread runs part 0). Created once (HostExecutor's constructor); a
/// call allocates nothing and creates no thread: it starts the workers' jobs and waits for them.
class HostPool {
 public:
  /// Starts `workers` threads. @throws std::system_error when a thread cannot be created.
  explicit HostPool(int workers) : workers_(static_cast<std::size_t>(workers)), parts_(static_cast<std::size_t>(workers)) {}
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  /// Runs fn(ctx, k) for k in [0, parts): k = 0 on the calling thread, the others on workers 1..parts-1;
  /// returns when all are done. Calls from several threads are serialised. fn must not throw.
  /// @pre 1 <= parts <= workers + 1
  void run(int parts, void (*fn)(const void*, int), const void* ctx) {
    std::lock_guard<std::mutex> one_call(call_);
    for (int k = 1; k < parts; ++k) {
      Part& p = parts_[static_cast<std::size_t>(k - 1)];
      p = {fn, ctx, k};
      workers_[static_cast<std::size_t>(k - 1)].start(p);
    }
    fn(ctx, 0);
    for (int k = 1; k < parts; ++k) (void)workers_[static_cast<std::size_t>(k - 1)].wait();
  }

 private:
  struct Part {  // one worker's job: fn(ctx, k)
    void (*fn)(const void*, int) = nullptr;
    const void* ctx = nullptr;
    int k = 0;
    void operator()() const { fn(ctx, k); }
  };
  std::mutex call_;
  std::vector<Worker> workers_;
  std::vector<Part> parts_;
};

}  // namespace detail

/// Settings of a HostExecutor. `HostExecutorOptions{n}` sets the thread count alone.
struct HostExecutorOptions {
  /// Threads one call runs on, the caller's included; >= 1. 1 (the default): the calling thread only.
  int threads = 1;
  /// A call copying b bytes uses min(threads, max(1, b / min_bytes_per_thread)) threads; >= 1.
  /// Waking a worker costs microseconds, so small lists run on fewer threads.
  std::size_t min_bytes_per_thread = std::size_t{256} << 10;  // 256 KiB
  /// A call copying at least this many bytes writes rows of 64 bytes or more with non-temporal
  /// (cache-bypassing) stores on x86-64: for copies larger than the caches this saves the
  /// read-for-ownership of every destination line (up to 1.5x faster). 0: always; SIZE_MAX: never.
  /// Other CPUs ignore it. The bytes written are the same either way.
  std::size_t streaming_min_bytes = std::size_t{4} << 20;  // 4 MiB, about the L3 share of one core
};

/// The host executor: runs block lists with std::memcpy-like copies, rows whole, on the calling
/// thread or split across a small pool of threads.
///
/// Executor concept (what `seq_to_head` / `head_to_seq` need from an executor type E):
/// - `void E::run(const BlockCopy* blocks, std::size_t n, const BufferTable& buffers)`: performs
///   the n copies and sums (block.hpp; a sum adds its terms by the rules of element.hpp), complete
///   (or ordered, for a stream-based executor) before the communicator's next call; the blocks of
///   one list never overlap in their destinations, so any order is valid (a sum's terms stay
///   together, in order).
/// - optionally `static constexpr bool E::runs_on_host = true`: its copies are host loads and
///   stores on host memory, done when run() returns. Only then may redistribute() take the
///   message-level path (PlanOptions::in_place_messages), which hands the caller's own pointers to the
///   communicator. Without it, an executor gets the one all-to-all-v of the packed wire.
///
/// Host executor: memory is host memory. `HostExecutor{}` (the default) is single-threaded: it runs
/// on the calling thread and owns no threads. `HostExecutor(n)` runs each call on n threads (the
/// calling thread plus n-1 persistent workers created by the constructor): the bytes of the list
/// are cut into n equal ranges (at 64-byte granularity, across block and row boundaries), one per
/// thread, so the result is bit for bit that of one thread. A call allocates nothing and creates no
/// thread. Large lists are written with streaming stores (HostExecutorOptions::streaming_min_bytes).
///
/// Threads and oversubscription: every executor object has its own workers, and the in-process
/// group (LocalGroup) already runs one thread per rank, each usually with its own executor (a copy),
/// so the process runs ranks × threads copying threads in all. Keep ranks × threads <= cores: with
/// a LocalGroup of P ranks on C cores use threads = max(1, C / P) (the default, 1, never
/// oversubscribes by itself); with one rank per process (MPI, NCCL) use up to the cores each
/// process may use. Memory bandwidth, not cores, bounds a copy: on a machine whose one core
/// already nearly saturates it, more threads gain little.
class HostExecutor {
 public:
  /// Runs its copies with host loads and stores, and returns when they are done (redistribute()
  /// may then hand the caller's pointers straight to a host communicator).
  static constexpr bool runs_on_host = true;

  /// Single-threaded executor with the default options: runs on the calling thread, owns no threads.
  HostExecutor() = default;

  /// Executor running each call on `threads` threads (the caller's included), other options default.
  /// @throws as HostExecutor(const HostExecutorOptions&).
  explicit HostExecutor(int threads) : HostExecutor(HostExecutorOptions{threads}) {}

  /// Executor with the given options. Starts options.threads - 1 worker threads, kept until
  /// destruction.
  /// @throws Error(invalid_shape) threads < 1 or min_bytes_per_thread == 0;
  ///         std::system_error when the system cannot start a thread.
  explicit HostExecutor(const HostExecutorOptions& options) : opt_(options) {
    if (opt_.threads < 1)
      detail::fail(Errc::invalid_shape, "HostExecutor threads=" + std::to_string(opt_.threads) + " must be >= 1 (1 = single-threaded)");
    if (opt_.min_bytes_per_thread == 0) detail::fail(Errc::invalid_shape, "HostExecutor min_bytes_per_thread must be >= 1");
    if (opt_.threads > 1) pool_ = std::make_unique<detail::HostPool>(opt_.threads - 1);
  }

  /// A copy has the same options and its own worker threads (it starts threads-1 of them), so that
  /// copies handed to different ranks' threads never wait for each other.
  /// @throws std::system_error when the system cannot start a thread.
  HostExecutor(const HostExecutor& o) : opt_(o.opt_) {
    if (opt_.threads > 1) pool_ = std::make_unique<detail::HostPool>(opt_.threads - 1);
  }
  /// Copy assignment: as the copy constructor (this executor's old workers are stopped).
  HostExecutor& operator=(const HostExecutor& o) {
    if (this != &o) *this = HostExecutor(o);
    return *this;
  }
  HostExecutor(HostExecutor&&) noexcept = default;             ///< takes the workers over
  HostExecutor& operator=(HostExecutor&&) noexcept = default;  ///< takes the workers over

  /// Threads one call may use (the caller's included), >= 1.
  int threads() const { return opt_.threads; }
  /// The options this executor was made with.
  const HostExecutorOptions& options() const { return opt_; }

  /// Runs `n` block copies over the buffers of `t`; returns when all are done (and, after
  /// streaming stores, fenced: visible to whichever thread synchronises with the caller next).
  /// Concurrent calls on one multi-threaded executor object are serialised (give each calling
  /// thread its own copy).
  /// @pre the table's pointers are valid host memory for every block; destinations do not overlap
  ///      each other or any source.
  void run(const BlockCopy* blocks, std::size_t n, const BufferTable& t) const {
    std::int64_t total = 0;
    for (std::size_t i = 0; i < n; ++i) total += blocks[i].written_bytes();
    const bool streaming = static_cast<std::uint64_t>(total) >= opt_.streaming_min_bytes;
    int parts = 1;
    if (pool_) {
      const auto want = static_cast<std::uint64_t>(total) / opt_.min_bytes_per_thread;
      parts = static_cast<int>(std::min<std::uint64_t>(static_cast<std::uint64_t>(opt_.threads), std::max<std::uint64_t>(1, want)));
    }
    if (parts <= 1) {
      for (std::size_t i = 0; i < n; ++i) {
        if (blocks[i].op == BlockOp::copy) run_block_host(detail::host_order(blocks[i]), t, streaming);
        else if (blocks[i].op == BlockOp::sum) detail::run_sum_range(&blocks[i], t, 0, blocks[i].bytes(), streaming);
      }
      if (streaming) detail::stream_fence();
      return;
    }
    struct Ctx {
      const BlockCopy* blocks;
      std::size_t n;
      const BufferTable* t;
      std::int64_t total;
      int parts;
      bool streaming;
    } ctx{blocks, n, &t, total, parts, streaming};
    pool_->run(
        parts,
        [](const void* p, int k) {
          const Ctx& c = *static_cast<const Ctx*>(p);
          auto cut = [&](int i) {  // start of part i, rounded down to 64 bytes; part `parts` ends at total
            if (i >= c.parts) return c.total;
            const std::int64_t x = c.total / c.parts * i + c.total % c.parts * i / c.parts;
            return x / 64 * 64;
          };
          detail::run_blocks_range(c.blocks, c.n, *c.t, cut(k), cut(k + 1), c.streaming);
          if (c.streaming) detail::stream_fence();
        },
        &ctx);
  }

 private:
  HostExecutorOptions opt_;
  std::unique_ptr<detail::HostPool> pool_;  // null when single-threaded
};

ULYSSES_NAMESPACE_END
