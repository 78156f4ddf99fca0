// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The copy kernel (ulysses' own) and its device functions, the agent level in CUB's
///        terms: find a unit of work, tabulate its rows' offsets, move its vectors or add its sum.
///
/// Units of at most kTileBytes, found by binary search over a prefix sum (kernel_list.cuh), walked
/// grid-stride; the widest vector the addresses allow. __host__ __device__, so the tests run it on
/// the host too. The design: docs/headers.md, "cuda/detail/kernel.cuh"; docs/gpu.md. Internal
/// (arch-keyed, config.cuh); CudaExecutor launches it. Needs nvcc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "../../layout/blocks.hpp"
#include "../../layout/element.hpp"
#include "../policy.cuh"
#include "config.cuh"
#include "kernel_list.cuh"

ULYSSES_CUDA_DETAIL_BEGIN

/// Byte offsets (source, destination) of row `r` of a block that is not 1-D: row_offsets()
/// (layout/blocks.hpp) with 32-bit divisions for a narrow block, 64-bit ones for a wide one.
/// @pre shape == row_shape(c) != RowShape::one_d; 0 <= r < c.rows()
ULYSSES_HOST_DEVICE inline void shaped_row_offsets(const BlockCopy& c, RowShape shape, std::int64_t r, std::int64_t& so,
                                                   std::int64_t& dso) {
  if (shape == RowShape::wide) row_offsets<std::int64_t>(c, r, so, dso);
  else row_offsets<std::uint32_t>(c, r, so, dso);
}

/// Vector load and store (on the host, where the tests emulate the kernel, through memcpy;
/// with ULYSSES_CHECK_VECTOR_ALIGNMENT defined, a host access that the GPU could not make —
/// not aligned to the vector size — throws std::logic_error).
template <class V>
ULYSSES_HOST_DEVICE __forceinline__ void check_vector_alignment(const std::byte* p) {
#if !defined(__CUDA_ARCH__) && defined(ULYSSES_CHECK_VECTOR_ALIGNMENT)
  if (reinterpret_cast<std::uintptr_t>(p) % sizeof(V))
    throw std::logic_error("copy kernel: " + std::to_string(sizeof(V)) + "-byte access at a misaligned address");
#else
  (void)p;
#endif
}
template <class V>
ULYSSES_HOST_DEVICE __forceinline__ V load(const std::byte* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const V*>(p);
#else
  check_vector_alignment<V>(p);
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
#endif
}
template <class V>
ULYSSES_HOST_DEVICE __forceinline__ void store(std::byte* p, const V& v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<V*>(p) = v;
#else
  check_vector_alignment<V>(p);
  std::memcpy(p, &v, sizeof(V));
#endif
}

/// One unit of work as the whole CTA sees it (the same for all its threads).
struct Unit {
  const std::byte* src;     ///< source of row 0 of the block (base + offset)
  std::byte* dst;           ///< destination of row 0 of the block
  std::int64_t r0;          ///< first row of the unit
  std::int64_t c0;          ///< first byte of the unit's segment within each row
  std::int64_t src_stride;  ///< row stride (1-D blocks), bytes
  std::int64_t dst_stride;
  int nr;                   ///< rows of the unit
  int len;                  ///< bytes of each row's segment
  int width;                ///< vector bytes: 16, 8, 4, 2 or 1
  bool tabulated;           ///< rows' offsets are in the CTA's RowTable (copies of blocks that are not 1-D)
  bool sum;                 ///< the unit is part of a sum (BlockOp::sum): sum_unit() computes it
};

/// Offsets of a unit's rows (blocks that are not 1-D), computed once per row by the CTA's threads.
struct RowTable {
  std::int64_t src[kCopyThreads];
  std::int64_t dst[kCopyThreads];
};

/// Finds unit u of a list: its block (binary search of the prefix sum), its rows and row
/// segment, and the widest vector the addresses, strides and segment length allow.
/// @param blocks      the list (n >= 1 entries)
/// @param unit_begin  prefix sum of units over blocks (n + 1 entries, unit_begin[0] = 0)
/// @param n           blocks in the list
/// @param u           the unit, 0 <= u < unit_begin[n]
/// @param t           the base pointers of the call's buffers
/// @param block       set to the unit's block
ULYSSES_HOST_DEVICE __forceinline__ Unit find_unit(const KernelBlock* blocks, const std::int64_t* unit_begin, int n,
                                                   std::int64_t u, const BufferTable& t, const KernelBlock*& block) {
  int lo = 0, hi = n - 1;  // the last block whose first unit is <= u
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (unit_begin[mid] <= u) lo = mid;
    else hi = mid - 1;
  }
  const KernelBlock& b = blocks[lo];
  block = &b;
  Unit w;
  const std::int64_t lu = u - unit_begin[lo];
  std::int64_t row_group = lu, seg = 0;
  if (b.segs > 1) row_group = lu / b.segs, seg = lu - row_group * b.segs;
  w.r0 = row_group * b.rows_per_unit;
  w.nr = static_cast<int>(b.rows - w.r0 < b.rows_per_unit ? b.rows - w.r0 : b.rows_per_unit);
  w.c0 = seg * kTileBytes;
  w.len = static_cast<int>(b.c.row_bytes - w.c0 < kTileBytes ? b.c.row_bytes - w.c0 : kTileBytes);
  w.src = buffer_at(t, b.c.src_buffer) + b.c.src_offset;
  w.dst = buffer_at(t, b.c.dst_buffer) + b.c.dst_offset;
  w.src_stride = b.c.src_stride[3];
  w.dst_stride = b.c.dst_stride[3];
  w.sum = b.c.op == BlockOp::sum;
  w.tabulated = !w.sum && b.shape != RowShape::one_d;
  // c0 is a multiple of 16, so the addresses, strides and length decide.
  const std::uint64_t a = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(w.src)) |
                          static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(w.dst)) |
                          static_cast<std::uint64_t>(w.len) | b.stride_bits;
  w.width = static_cast<int>(a & (~a + 1));  // lowest set bit: 1, 2, 4, 8 or 16
  return w;
}

/// Thread `tid`'s part of tabulating the unit's row offsets (tid < nr computes row r0 + tid).
ULYSSES_HOST_DEVICE __forceinline__ void tabulate_rows(const KernelBlock& b, const Unit& w, int tid, RowTable& rt) {
  if (tid < w.nr) shaped_row_offsets(b.c, b.shape, w.r0 + tid, rt.src[tid], rt.dst[tid]);
}

/// ceil(2^32 / d) for d >= 1: with it, quotient(k, reciprocal(d)) == k / d for every
/// 0 <= k < 2^16 and d <= 2^16 (the error term k * (ceil(2^32/d)*d - 2^32) / 2^32 < k * d / 2^32
/// stays below 1): a multiply-high instead of a division per vector.
ULYSSES_HOST_DEVICE __forceinline__ std::uint64_t reciprocal(int d) {
  return ((std::uint64_t{1} << 32) + static_cast<std::uint64_t>(d) - 1) / static_cast<std::uint64_t>(d);
}
ULYSSES_HOST_DEVICE __forceinline__ int quotient(int k, std::uint64_t rcp) {
  return static_cast<int>((static_cast<std::uint64_t>(k) * rcp) >> 32);
}

/// Thread `tid` (of kCopyThreads) copies its share of the unit in vectors of V: consecutive
/// threads take consecutive vectors (coalesced); each issues kCopyUnroll loads before its stores.
/// @pre w.len % sizeof(V) == 0 and every address and stride is a multiple of sizeof(V).
template <class V>
ULYSSES_HOST_DEVICE __forceinline__ void copy_vectors(const Unit& w, int tid, const RowTable& rt) {
  const int nvec = w.len / static_cast<int>(sizeof(V));
  const int total = w.nr * nvec;  // <= kTileBytes
  const std::uint64_t rcp = reciprocal(nvec);  // k / nvec without a division (total <= 2^14)
  for (int k0 = tid; k0 < total; k0 += kCopyThreads * kCopyUnroll) {
    V v[kCopyUnroll] = {};
    std::int64_t dst_off[kCopyUnroll] = {};
    ULYSSES_UNROLL
    for (int j = 0; j < kCopyUnroll; ++j) {
      const int k = k0 + j * kCopyThreads;
      if (k < total) {
        int row = 0, col = k;
        if (w.nr > 1) {
          row = quotient(k, rcp);
          col = k - row * nvec;
        }
        std::int64_t so, dso;
        if (w.tabulated) {
          so = rt.src[row];
          dso = rt.dst[row];
        } else {
          so = (w.r0 + row) * w.src_stride;
          dso = (w.r0 + row) * w.dst_stride;
        }
        const std::int64_t byte = w.c0 + static_cast<std::int64_t>(col) * static_cast<std::int64_t>(sizeof(V));
        v[j] = load<V>(w.src + so + byte);
        dst_off[j] = dso + byte;
      }
    }
    ULYSSES_UNROLL
    for (int j = 0; j < kCopyUnroll; ++j)
      if (k0 + j * kCopyThreads < total) store<V>(w.dst + dst_off[j], v[j]);
  }
}

/// Thread `tid`'s copies of the unit, at the unit's vector width.
ULYSSES_HOST_DEVICE __forceinline__ void copy_unit(const Unit& w, int tid, const RowTable& rt) {
  switch (w.width) {
    case 16: return copy_vectors<uint4>(w, tid, rt);
    case 8: return copy_vectors<uint2>(w, tid, rt);
    case 4: return copy_vectors<unsigned int>(w, tid, rt);
    case 2: return copy_vectors<unsigned short>(w, tid, rt);
    default: return copy_vectors<unsigned char>(w, tid, rt);
  }
}

/// Thread `tid`'s elements of a unit of a sum: the unit's block `b` is the sum's first term and
/// b[1..sources) the others (consecutive in the list). Each element is the sum of its terms in
/// order, by the rules of element.hpp (sum_element), written once; consecutive threads take
/// consecutive elements (coalesced stores). Row offsets are computed per element and term (a sum
/// is the small part of a list: the replicated heads).
ULYSSES_HOST_DEVICE __forceinline__ void sum_unit(const KernelBlock* b, const Unit& w, int tid, const BufferTable& t) {
  const BlockCopy& c = b->c;
  const int n = c.sources, E = c.elem_bytes;
  const int nel = w.len / E, total = w.nr * nel;
  const std::uint64_t rcp = reciprocal(nel);
  for (int k = tid; k < total; k += kCopyThreads) {
    const int row = quotient(k, rcp);  // k / nel
    const std::int64_t r = w.r0 + row, byte = w.c0 + static_cast<std::int64_t>(k - row * nel) * E;
    std::int64_t so, dso;
    if (b->shape == RowShape::one_d) dso = r * c.dst_stride[3];
    else shaped_row_offsets(c, b->shape, r, so, dso);
    std::byte* dst = w.dst + dso + byte;
    with_sum_arith(c.type, [&](auto a) {
      using A = decltype(a);
      typename A::Acc acc{};
      for (int j = 0; j < n; ++j) {
        const BlockCopy& cj = b[j].c;
        if (b->shape == RowShape::one_d) so = r * cj.src_stride[3];
        else shaped_row_offsets(cj, b->shape, r, so, dso);
        const typename A::Acc x = A::load(buffer_at(t, cj.src_buffer) + cj.src_offset + so + byte);
        acc = j == 0 ? x : acc + x;
      }
      A::store(dst, acc);
    });
  }
}

/// Thread `tid`'s work of unit `w` of block `b`: its share of a copy (after the CTA tabulated the
/// rows when w.tabulated) or of a sum.
ULYSSES_HOST_DEVICE __forceinline__ void run_unit(const KernelBlock* b, const Unit& w, int tid, const RowTable& rt,
                                                  const BufferTable& t) {
  if (w.sum) sum_unit(b, w, tid, t);
  else copy_unit(w, tid, rt);
}

/// The copy kernel: CTAs loop over the units of a block list (grid-stride). For a unit of a
/// block that is not 1-D, the CTA first tabulates its rows' offsets in shared memory.
/// @param blocks      the list, in device memory (n >= 1 entries)
/// @param unit_begin  device prefix sum of units over blocks (n + 1 entries)
/// @param n           blocks in the list
/// @param units       unit_begin[n]
/// @param t           the base pointers, by value
template <int Threads>
ULYSSES_KERNEL_ATTRIBUTES void __launch_bounds__(Threads)
    block_copy_kernel(const KernelBlock* __restrict__ blocks, const std::int64_t* __restrict__ unit_begin, int n,
                      std::int64_t units, BufferTable t) {
  static_assert(Threads == kCopyThreads, "the unit size assumes kCopyThreads threads");
  __shared__ RowTable rt;
  const int tid = static_cast<int>(threadIdx.x);
  for (std::int64_t u = blockIdx.x; u < units; u += gridDim.x) {
    const KernelBlock* b;
    const Unit w = find_unit(blocks, unit_begin, n, u, t, b);
    if (w.tabulated) {  // uniform over the CTA
      __syncthreads();  // the previous unit's readers are done with the table
      tabulate_rows(*b, w, tid, rt);
      __syncthreads();
    }
    run_unit(b, w, tid, rt, t);
  }
}

ULYSSES_CUDA_DETAIL_END
