// SPDX-License-Identifier: Apache-2.0
/// @file copy.hpp
/// @brief Block-copy descriptors (what pack and unpack are made of) and the host executor.
///
/// Pack and unpack are the same operation: a list of strided 4-D block copies between a local
/// tensor and a region of a wire buffer (or, for a rank's own chunk, between its input and output
/// tensors). A block names its source and destination by index into a BufferTable, so one list
/// serves every call of a plan whatever pointers the caller passes, and the host and CUDA
/// executors run the very same lists.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "error.hpp"
#include "layout.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Most tensors one plan can move in one exchange (q, k, v and a few more).
inline constexpr int kMaxTensors = 16;

/// Indices into a BufferTable: inputs are 0..T-1, outputs kMaxTensors..kMaxTensors+T-1, then
/// the send and receive halves of the wire buffer.
struct Buffer {
  static constexpr int input(int t) { return t; }
  static constexpr int output(int t) { return kMaxTensors + t; }
  static constexpr int send = 2 * kMaxTensors;
  static constexpr int recv = 2 * kMaxTensors + 1;
  static constexpr int count = 2 * kMaxTensors + 2;
};

/// The base pointers one execution of a plan works on (trivially copyable: passed by value to
/// CUDA kernels). Unused entries are null.
struct BufferTable {
  std::byte* base[Buffer::count] = {};
};

/// One strided block copy, byte-addressed and type-erased.
///
/// Copies the rows at `src_base + src_offset + sum_i idx_i * src_stride[i]` to
/// `dst_base + dst_offset + sum_i idx_i * dst_stride[i]` for idx in [0, extent) (4 outer
/// dimensions, outermost first), each row being `row_bytes` contiguous bytes. Built from a
/// (b, s, h, d) block by make_block(), which merges dimensions that are contiguous on both sides,
/// so a row is at least one element and usually D elements or more.
struct BlockCopy {
  std::int64_t extent[4];      ///< outer loop extents, outermost first (padded with 1)
  std::int64_t src_stride[4];  ///< bytes
  std::int64_t dst_stride[4];  ///< bytes
  std::int64_t src_offset;     ///< bytes from the source buffer's base
  std::int64_t dst_offset;     ///< bytes from the destination buffer's base
  std::int64_t row_bytes;      ///< contiguous bytes per innermost copy (a multiple of elem_bytes)
  std::int32_t src_buffer;     ///< index into BufferTable
  std::int32_t dst_buffer;     ///< index into BufferTable
  std::int32_t elem_bytes;     ///< element size (the alignment every pointer keeps)

  /// Rows this block copies.
  ULYSSES_HOST_DEVICE constexpr std::int64_t rows() const { return extent[0] * extent[1] * extent[2] * extent[3]; }
  /// Bytes this block copies.
  ULYSSES_HOST_DEVICE constexpr std::int64_t bytes() const { return rows() * row_bytes; }
};

namespace detail {

/// Builds the BlockCopy of a (b, s, h, d) block of extents `ext`, whose source and destination
/// strides are in elements of `elem_bytes` bytes. Dimensions are ordered by destination stride
/// (any loop order is a valid copy), extent-1 dimensions dropped, and neighbours merged where both
/// sides are contiguous. Returns false (and builds nothing) for an empty block.
inline bool make_block(const std::int64_t ext[4], const std::int64_t src_stride_elems[4],
                       const std::int64_t dst_stride_elems[4], std::int64_t elem_bytes, std::int64_t src_offset_bytes,
                       std::int64_t dst_offset_bytes, int src_buffer, int dst_buffer, BlockCopy& out) {
  struct Dim {
    std::int64_t n, ss, ds;
  };
  Dim dims[5];
  int nd = 0;
  for (int i = 0; i < 4; ++i) {
    if (ext[i] == 0) return false;
    if (ext[i] > 1) dims[nd++] = {ext[i], src_stride_elems[i] * elem_bytes, dst_stride_elems[i] * elem_bytes};
  }
  // Outermost first by destination stride (stable: ties keep the logical order).
  std::stable_sort(dims, dims + nd, [](const Dim& a, const Dim& b) { return a.ds > b.ds; });
  dims[nd++] = {elem_bytes, 1, 1};  // the bytes of one element, always contiguous
  // Merge from the inside out.
  int w = nd - 1;
  for (int k = nd - 2; k >= 0; --k) {
    Dim& in = dims[w];
    const Dim& o = dims[k];
    if (o.ss == in.n * in.ss && o.ds == in.n * in.ds) {
      in.n *= o.n;
    } else {
      dims[--w] = o;
    }
  }
  // dims[w..nd) now: outer dims then the innermost; the innermost has unit strides.
  out = BlockCopy{};
  out.row_bytes = dims[nd - 1].n;
  const int outer = nd - 1 - w;
  for (int i = 0; i < 4; ++i) {
    const int k = i - (4 - outer);  // right-align the outer dims
    out.extent[i] = k >= 0 ? dims[w + k].n : 1;
    out.src_stride[i] = k >= 0 ? dims[w + k].ss : 0;
    out.dst_stride[i] = k >= 0 ? dims[w + k].ds : 0;
  }
  out.src_offset = src_offset_bytes;
  out.dst_offset = dst_offset_bytes;
  out.src_buffer = src_buffer;
  out.dst_buffer = dst_buffer;
  out.elem_bytes = static_cast<std::int32_t>(elem_bytes);
  return true;
}

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
    default:
      for (std::int64_t i = 0; i < n; ++i) std::memcpy(dst + i * ds, src + i * ss, static_cast<std::size_t>(row));
  }
}

}  // namespace detail

/// Runs one block copy on the host.
/// @pre the table holds valid pointers for the block's buffers; source and destination do not overlap.
inline void run_block_host(const BlockCopy& c, const BufferTable& t) {
  const std::byte* src = t.base[c.src_buffer] + c.src_offset;
  std::byte* dst = t.base[c.dst_buffer] + c.dst_offset;
  for (std::int64_t i0 = 0; i0 < c.extent[0]; ++i0)
    for (std::int64_t i1 = 0; i1 < c.extent[1]; ++i1)
      for (std::int64_t i2 = 0; i2 < c.extent[2]; ++i2)
        detail::copy_rows(dst + i0 * c.dst_stride[0] + i1 * c.dst_stride[1] + i2 * c.dst_stride[2],
                          src + i0 * c.src_stride[0] + i1 * c.src_stride[1] + i2 * c.src_stride[2], c.extent[3],
                          c.row_bytes, c.dst_stride[3], c.src_stride[3]);
}

/// The reference executor: runs block lists on the calling thread with std::memcpy, rows whole.
///
/// Executor concept (what `seq_to_head` / `head_to_seq` need from an executor type E):
/// - `void E::run(const BlockCopy* blocks, std::size_t n, const BufferTable& buffers)`: performs
///   the n copies, complete (or ordered, for a stream-based executor) before the communicator's next
///   call; the blocks of one list never overlap in their destinations, so any order is valid.
/// Host executor: memory is host memory; no allocation, no threads.
class HostExecutor {
 public:
  /// Runs `n` block copies over the buffers of `t`.
  void run(const BlockCopy* blocks, std::size_t n, const BufferTable& t) const {
    for (std::size_t i = 0; i < n; ++i) run_block_host(blocks[i], t);
  }
};

ULYSSES_NAMESPACE_END
