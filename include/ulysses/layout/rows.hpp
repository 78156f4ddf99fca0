// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The walk over a block's rows: for_each_row_run() and for_each_row() visit the rows of
///        a BlockCopy in the order of row_offsets() (layout/blocks.hpp); RowCursor steps through
///        them with no division. The host executor and Cross Memory Attach's range lists
///        (comm/cross_memory.hpp) walk blocks with these (docs/design.md, "Plan → pack → exchange → unpack").
#pragma once

#include <algorithm>
#include <cstdint>

#include "blocks.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {

/// Prefetches the source of the next run of rows while this one is copied: a run starts a new
/// stride (a token's heads in a seq-sharded tensor lie H·D elements apart), which the hardware
/// prefetcher does not follow (the host executor's copy_runs() skips it where the next run
/// follows on from this one: a block of whole tokens, which the hardware streams, and the
/// prefetches only took fill buffers from the loads; Rope prefetches RowRun::next_src a row at a
/// time). `rows` contiguous rows of `row_bytes` from p (a hint: never faults).
/// Always inlined: GCC takes __builtin_prefetch for free of side effects, so at -O2, where this
/// function stayed out of line, its pure-const pass found the call dead and deleted it.
ULYSSES_ALWAYS_INLINE inline void prefetch_run(const std::byte* p, std::int64_t rows, std::int64_t row_bytes) {
#if defined(__GNUC__) || defined(__clang__)
  const std::int64_t bytes = std::min<std::int64_t>(rows * row_bytes, 4096);
  for (std::int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i);
#else
  (void)p;
  (void)rows;
  (void)row_bytes;
#endif
}

/// Calls fn(so, dso) for every run of block `c`'s rows along its innermost loop, in row order:
/// so and dso are the byte offsets of the run's first row from the source and destination
/// buffers' bases (c.src_offset and c.dst_offset included); the run is c.extent[3] rows, apart
/// by c.src_stride[3] and c.dst_stride[3] bytes.
template <class F>
inline void for_each_row_run(const BlockCopy& c, F&& fn) {
  for (std::int64_t i0 = 0; i0 < c.extent[0]; ++i0)
    for (std::int64_t i1 = 0; i1 < c.extent[1]; ++i1)
      for (std::int64_t i2 = 0; i2 < c.extent[2]; ++i2)
        fn(c.src_offset + i0 * c.src_stride[0] + i1 * c.src_stride[1] + i2 * c.src_stride[2],
           c.dst_offset + i0 * c.dst_stride[0] + i1 * c.dst_stride[1] + i2 * c.dst_stride[2]);
}

/// Calls fn(so, dso) for every row of block `c`, in the order of row_offsets(): the byte offsets
/// of the row from the source and destination buffers' bases (the block's offsets included).
template <class F>
inline void for_each_row(const BlockCopy& c, F&& fn) {
  for_each_row_run(c, [&](std::int64_t so, std::int64_t dso) {
    for (std::int64_t i3 = 0; i3 < c.extent[3]; ++i3) fn(so + i3 * c.src_stride[3], dso + i3 * c.dst_stride[3]);
  });
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

}  // namespace detail

ULYSSES_NAMESPACE_END
