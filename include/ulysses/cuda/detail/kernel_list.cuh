// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The copy kernel's view of a block list, prepared on the host (the dispatch side, in
///        CUB's terms): how each block is cut into units of work, and the prefix sum of the units
///        over the blocks that lets a CTA find the block of a unit by binary search.
///
/// CudaExecutor builds a KernelList per list when it uploads the lists (construction,
/// prepare_direct()) and copies it to device memory; the kernel (kernel.cuh) only reads it. The
/// geometry functions are __host__ __device__ so that the tests check them on the host.
///
/// Internal (namespace ulysses::detail, arch-keyed: see config.cuh). Needs nvcc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../../layout/blocks.hpp"
#include "../policy.cuh"
#include "config.cuh"

ULYSSES_CUDA_DETAIL_BEGIN

/// How row indices of a block map to offsets: one outer dimension (an offset is one multiply),
/// fewer than 2^31 rows (32-bit divisions), or more (64-bit divisions, out of line).
enum class RowShape : std::int32_t { one_d, narrow, wide };

/// The RowShape of block c.
ULYSSES_HOST_DEVICE inline RowShape row_shape(const BlockCopy& c) {
  if (c.extent[0] == 1 && c.extent[1] == 1 && c.extent[2] == 1) return RowShape::one_d;
  return c.rows() < (std::int64_t{1} << 31) ? RowShape::narrow : RowShape::wide;
}

/// How a block is cut into units: `segs` segments per row (rows longer than a tile) and
/// `rows_per_unit` whole rows per unit (rows shorter than a tile; at most kCopyThreads unless
/// the block is 1-D, since the CTA tabulates the offsets of a unit's rows in shared memory).
struct UnitGeometry {
  std::int64_t segs;
  std::int64_t rows_per_unit;
  std::int64_t units;  ///< units of the block: segs × ceil(rows / rows_per_unit); 0 for a further term of a sum
};

/// The UnitGeometry of block c under kCopyPolicy (units of at most kTileBytes bytes).
/// @pre c.row_bytes >= 1 (make_blocks() builds no empty block)
ULYSSES_HOST_DEVICE inline UnitGeometry unit_geometry(const BlockCopy& c) {
  if (c.op == BlockOp::sum_term) return {1, 1, 0};  // the sum's first block does its work
  const std::int64_t rows = c.rows();
  if (c.row_bytes >= kTileBytes) {
    const std::int64_t segs = (c.row_bytes + kTileBytes - 1) / kTileBytes;
    return {segs, 1, segs * rows};
  }
  std::int64_t rpu = kTileBytes / c.row_bytes;
  if (row_shape(c) != RowShape::one_d && rpu > kCopyThreads) rpu = kCopyThreads;
  return {1, rpu, (rows + rpu - 1) / rpu};
}

/// A block as the kernel reads it: the copy and what the host precomputed about it.
struct KernelBlock {
  BlockCopy c;
  std::int64_t rows;           ///< c.rows()
  std::int64_t segs;           ///< UnitGeometry::segs
  std::int64_t rows_per_unit;  ///< UnitGeometry::rows_per_unit
  std::uint64_t stride_bits;   ///< OR of the strides of the dimensions of extent > 1, and 16
  RowShape shape;              ///< row_shape(c)
};

/// A block list as the kernel reads it: the blocks and the prefix sum of their units.
struct KernelList {
  std::vector<KernelBlock> blocks;
  std::vector<std::int64_t> unit_begin;  ///< n + 1 entries; unit_begin[n] = units of the list
};

/// Builds the kernel's view of the n blocks at `blocks` (host side, when CudaExecutor uploads a
/// list). Allocates (the two vectors).
inline KernelList kernel_list(const BlockCopy* blocks, std::size_t n) {
  KernelList l;
  l.unit_begin.assign(n + 1, 0);
  for (std::size_t b = 0; b < n; ++b) {
    const BlockCopy& c = blocks[b];
    const UnitGeometry g = unit_geometry(c);
    std::uint64_t bits = 16;
    for (int i = 0; i < 4; ++i)
      if (c.extent[i] > 1) bits |= static_cast<std::uint64_t>(c.src_stride[i]) | static_cast<std::uint64_t>(c.dst_stride[i]);
    l.blocks.push_back(KernelBlock{c, c.rows(), g.segs, g.rows_per_unit, bits, row_shape(c)});
    l.unit_begin[b + 1] = l.unit_begin[b] + g.units;
  }
  return l;
}

ULYSSES_CUDA_DETAIL_END
