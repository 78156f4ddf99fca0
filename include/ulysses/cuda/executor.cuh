// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief CudaExecutor: runs a plan's pack or unpack block lists on the GPU, one kernel launch per
///        list (all peers, all tensors), on the caller's stream.
///
/// The executor runs the very block lists the host executor runs (copy.hpp), so the CPU tests
/// already check the index arithmetic the GPU uses. The lists live in device memory: they are
/// uploaded once, when the executor is made from a Plan (the only allocation); run() then only
/// launches one kernel, so pack → exchange → unpack on a stream has no host synchronisation and
/// can be captured in a CUDA graph.
///
/// Kernel (ulysses' own): the work of a list is cut into *units* of at most kTileBytes (16 KiB) —
/// a group of whole rows of one block when its rows are short, or a segment of one row when they
/// are long — and a prefix sum of the units over the blocks (made on the host at construction,
/// stored next to the blocks in device memory) lets a CTA find the block of a unit by binary
/// search. CTAs loop over units grid-stride; the grid is the device's SM count times the
/// kernel's occupancy (both queried at construction). Within a unit, consecutive threads move
/// consecutive vectors (coalesced), each thread keeping four loads in flight. A row's address is
/// one multiply for blocks with one outer dimension (the dense layouts' usual case); for others
/// the CTA first tabulates the unit's row offsets in shared memory (at most 256 rows a unit),
/// so a row index is decomposed once per row, not once per vector. The vector is 16 bytes when the segment length, both base
/// addresses (base + offset) and every stride allow it, else 8, 4, 2 or 1 bytes, decided per
/// unit: a misaligned tensor costs speed, never correctness. The kernel body is a set of
/// __host__ __device__ functions, so the tests also run it on the host, thread by thread
/// (tests/support/device_harness.cuh, emulate_kernel), where no GPU is available.
///
/// Needs nvcc (or another CUDA compiler); link ulysses::cuda. Everything here is in the inner
/// inline namespace named after the target architectures (see cuda/detail/config.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../layout/blocks.hpp"
#include "../layout/element.hpp"
#include "../error.hpp"
#include "../plan/plan.hpp"
#include "detail/config.cuh"

ULYSSES_CUDA_DETAIL_BEGIN

/// Threads per CTA of the copy kernel.
inline constexpr int kCopyThreads = 256;
/// Vectors each thread keeps in flight.
inline constexpr int kCopyUnroll = 4;
/// Bytes of one unit of work (a multiple of 16): kCopyThreads * kCopyUnroll 16-byte vectors.
inline constexpr std::int64_t kTileBytes = std::int64_t{16} * kCopyThreads * kCopyUnroll;

/// How row indices of a block map to offsets: one outer dimension (an offset is one multiply),
/// fewer than 2^31 rows (32-bit divisions), or more (64-bit divisions, out of line).
enum class RowShape : std::int32_t { one_d, narrow, wide };

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
  std::int64_t units;
};

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

/// Builds the kernel's view of a list (host side, at executor construction).
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

/// Byte offsets (source, destination) of row `r` of a block that is not 1-D: r decomposed over
/// the 4 outer extents (innermost last), as the host executor's loops visit them.
ULYSSES_HOST_DEVICE inline void row_offsets(const BlockCopy& c, RowShape shape, std::int64_t r, std::int64_t& so,
                                            std::int64_t& dso) {
  std::int64_t s = 0, d = 0;
  if (shape == RowShape::wide) {
    for (int i = 3; i >= 1; --i) {
      const std::int64_t q = r / c.extent[i], idx = r - q * c.extent[i];
      s += idx * c.src_stride[i];
      d += idx * c.dst_stride[i];
      r = q;
    }
  } else {
    auto q = static_cast<std::uint32_t>(r);
    ULYSSES_UNROLL
    for (int i = 3; i >= 1; --i) {
      const auto e = static_cast<std::uint32_t>(c.extent[i]);
      const std::uint32_t next = q / e;
      const auto idx = static_cast<std::int64_t>(q - next * e);
      s += idx * c.src_stride[i];
      d += idx * c.dst_stride[i];
      q = next;
    }
    r = q;
  }
  so = s + r * c.src_stride[0];
  dso = d + r * c.dst_stride[0];
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
  if (tid < w.nr) row_offsets(b.c, b.shape, w.r0 + tid, rt.src[tid], rt.dst[tid]);
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
    else row_offsets(c, b->shape, r, so, dso);
    std::byte* dst = w.dst + dso + byte;
    with_sum_arith(c.type, [&](auto a) {
      using A = decltype(a);
      typename A::Acc acc{};
      for (int j = 0; j < n; ++j) {
        const BlockCopy& cj = b[j].c;
        if (b->shape == RowShape::one_d) so = r * cj.src_stride[3];
        else row_offsets(cj, b->shape, r, so, dso);
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

ULYSSES_NAMESPACE_BEGIN
/// CUDA's 16-bit floating-point types are known element types (TensorSpec::of<__half>, ...).
template <>
struct element_type_of<__half> {
  static constexpr ElementType value = ElementType::float16;
};
template <>
struct element_type_of<__nv_bfloat16> {
  static constexpr ElementType value = ElementType::bfloat16;
};
ULYSSES_NAMESPACE_END

ULYSSES_CUDA_NAMESPACE_BEGIN

/// Executor (see the executor concept in copy.hpp) that runs block lists on a CUDA stream.
///
/// Made from a Plan: it serves exactly that plan's block lists (pack and unpack of seq_to_head
/// and head_to_seq, every stage), which it uploads to device memory at construction. Memory:
/// the buffers of the BufferTable given to run() are device memory (or memory the device can
/// address: managed, mapped, peer) of the executor's device; the workspace should start 16-byte
/// aligned for the widest copies (any alignment is correct).
///
/// Thread-safety: run() is const and may be called from several threads (it only launches).
/// Lifetime: the Plan must outlive the executor (run() recognises the plan's lists by address),
/// and the executor must outlive every CUDA graph that captured one of its launches (the kernels
/// read the block lists from the executor's device memory, freed by its destructor).
/// Grid: a launch uses at most SM count × resident CTAs per SM of the copy kernel, or fewer when
/// asked (run(..., max_ctas)): CudaPipeline leaves SMs free so that the NCCL kernel of the stage
/// being exchanged can run beside a pack or an unpack.
/// Source: the block semantics of block.hpp (copy.hpp's host executor is the reference).
class CudaExecutor {
 public:
  /// Its copies are stream-ordered device work on device memory (transport.hpp).
  static constexpr bool device_memory = true;

  /// Uploads the plan's block lists and sizes the grid for the current device.
  ///
  /// Call it outside stream capture (it allocates: cudaMalloc, and cudaMallocHost for the pinned
  /// host image of the lists, so that the upload is a true asynchronous copy). The upload is
  /// enqueued on `stream` (every run() on that stream is ordered after it); nothing else is
  /// synchronised.
  /// @param plan   the plan whose lists run() will be given; must outlive the executor
  /// @param stream the stream run() launches on (0 = the legacy default stream); it must belong
  ///               to the current device, which run() expects to be current too
  /// @throws Error(backend) with the CUDA error name and string when a CUDA call fails.
  CudaExecutor(const Plan& plan, cudaStream_t stream) : stream_(stream) {
    detail::cuda_check(cudaGetDevice(&device_), "cudaGetDevice");
    int sms = 0, per_sm = 0;
    detail::cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_),
                       "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)");
    detail::cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                           &per_sm, detail::block_copy_kernel<detail::kCopyThreads>, detail::kCopyThreads, 0),
                       "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    sms_ = sms > 0 ? sms : 1;
    per_sm_ = per_sm > 0 ? per_sm : 1;
    max_grid_ = static_cast<std::int64_t>(sms_) * per_sm_;

    // Every list of the plan: both directions, every stage, pack and unpack, and their staged
    // parts (the message path). The direct path's lists come later (prepare_direct()).
    std::vector<const std::vector<BlockCopy>*> src;
    for (Direction d : {Direction::seq_to_head, Direction::head_to_seq})
      for (int k = 0; k < plan.num_stages(); ++k) {
        const Schedule& sc = plan.schedule(d, k);
        for (const std::vector<BlockCopy>* l : {&sc.pack, &sc.unpack, &sc.pack_staged, &sc.unpack_staged}) src.push_back(l);
      }
    try {
      upload(src, 0);
    } catch (...) {
      release();
      throw;
    }
  }

  /// Uploads the direct path's lists of `plan` (Plan::direct_list(), built by the first direct
  /// exchange) and makes room for the peers' pointers (P × kMaxTensors): what exchange_direct()
  /// calls before running them; nothing on later calls. Allocates (cudaMalloc, cudaMallocHost) the
  /// first time: outside stream capture. @pre plan.has_direct_lists(); the plan is the executor's.
  /// @throws Error(backend) when a CUDA call fails.
  void prepare_direct(const Plan& plan) const {
    const std::vector<BlockCopy>& s2h = plan.direct_list(Direction::seq_to_head);
    if (peers_dev_ && units(s2h.data(), s2h.size()) >= 0) return;
    peers_count_ = static_cast<std::size_t>(plan.degree()) * kMaxTensors;
    upload({&s2h, &plan.direct_list(Direction::head_to_seq)}, peers_count_ * sizeof(std::byte*));
  }

  CudaExecutor(const CudaExecutor&) = delete;
  CudaExecutor& operator=(const CudaExecutor&) = delete;
  /// Moves the device lists; the moved-from executor can only be destroyed.
  CudaExecutor(CudaExecutor&& o) noexcept { swap(o); }
  CudaExecutor& operator=(CudaExecutor&& o) noexcept {
    swap(o);
    return *this;
  }
  /// Frees the device lists and their pinned host image (cudaFree / cudaFreeHost, which wait for
  /// the device; errors are ignored).
  ~CudaExecutor() { release(); }

  /// Enqueues the n block copies of `blocks` on the executor's stream: ONE kernel launch (none
  /// when n == 0); returns without waiting. No allocation, no synchronisation; capturable.
  ///
  /// @param blocks one of the plan's lists, by its host address: `plan.schedule(d, k).pack.data()`,
  ///               `.unpack.data()`, `.pack_staged.data()` or `.unpack_staged.data()` (what the
  ///               stage functions of redistribute.hpp pass)
  /// @param n      that list's size
  /// @param t      device base pointers (by value: the kernel takes a copy at launch)
  /// @pre the executor's device is current; the buffers' copies do not overlap (as for the host
  ///      executor).
  /// @throws Error(plan_mismatch) when `blocks`/`n` is not one of the lists of the plan the
  ///         executor was made from (e.g. a copy of that plan, or another plan);
  ///         Error(backend) when the launch fails (cudaGetLastError; this may also report an
  ///         earlier asynchronous error of the context).
  void run(const BlockCopy* blocks, std::size_t n, const BufferTable& t) const { run(blocks, n, t, stream_); }

  /// As run(blocks, n, t), but launches on `stream` instead of the executor's stream (what
  /// CudaPipeline does to pack and unpack on its copy stream while the exchange runs on the
  /// caller's). Same guarantees: one launch, no allocation, no synchronisation; capturable.
  /// @param blocks, n, t as run(blocks, n, t)
  /// @param stream a stream of the executor's device, ordered after the upload of the lists that
  ///               the constructor enqueued on stream() (e.g. it waits for an event recorded on
  ///               stream() after construction, or stream() has been synchronised once)
  /// @throws as run(blocks, n, t).
  void run(const BlockCopy* blocks, std::size_t n, const BufferTable& t, cudaStream_t stream) const { run(blocks, n, t, stream, 0); }

  /// As run(blocks, n, t, stream), with at most `max_ctas` CTAs (0: no cap beyond max_grid()):
  /// what CudaPipeline passes so that a pack or unpack leaves SMs to the exchange's NCCL kernel.
  /// Same bytes whatever the grid. @throws as run(blocks, n, t).
  void run(const BlockCopy* blocks, std::size_t n, const BufferTable& t, cudaStream_t stream, std::int64_t max_ctas) const {
    if (n == 0) return;
    BufferTable table = t;
    if (t.peers) {  // the direct path: the peers' pointers (host memory) go to the executor's device copy, in stream order
      if (!peers_dev_)
        throw Error(Errc::plan_mismatch, "CudaExecutor::run: a table with peers' buffers, but prepare_direct() was not called");
      detail::cuda_check(cudaMemcpyAsync(peers_dev_, t.peers, peers_count_ * sizeof(std::byte*), cudaMemcpyHostToDevice, stream),
                         "cudaMemcpyAsync (CudaExecutor peers)");
      table.peers = peers_dev_;
    }
    const List* l = nullptr;
    for (const List& x : lists_)
      if (x.host == blocks && x.n == n) l = &x;
    if (!l)
      throw Error(Errc::plan_mismatch, "CudaExecutor::run: the list of " + std::to_string(n) +
                                           " blocks given is not one of the block lists of the plan this executor "
                                           "was made from; make the executor from the Plan whose schedule you run");
    std::int64_t grid = l->units < max_grid_ ? l->units : max_grid_;
    if (max_ctas > 0 && grid > max_ctas) grid = max_ctas;
    detail::block_copy_kernel<detail::kCopyThreads><<<static_cast<unsigned>(grid), detail::kCopyThreads, 0, stream>>>(
        l->dev_blocks, l->dev_units, static_cast<int>(l->n), l->units, table);
    detail::cuda_check(cudaGetLastError(), "block_copy_kernel launch");
  }

  cudaStream_t stream() const { return stream_; }  ///< the stream run() launches on
  int device() const { return device_; }           ///< the device current at construction
  /// Most CTAs one launch uses: SM count × resident CTAs per SM of the copy kernel.
  std::int64_t max_grid() const { return max_grid_; }
  /// SM count of the executor's device.
  int sm_count() const { return sms_; }
  /// Resident CTAs per SM of the copy kernel (occupancy).
  int ctas_per_sm() const { return per_sm_; }
  /// Units of work (≤ kTileBytes bytes each) of a list of the plan, or -1 for a foreign list.
  std::int64_t units(const BlockCopy* blocks, std::size_t n) const {
    for (const List& x : lists_)
      if (x.host == blocks && x.n == n) return x.units;
    return -1;
  }

 private:
  struct List {
    const BlockCopy* host = nullptr;  // the plan's list (identity for run())
    std::size_t n = 0;
    const detail::KernelBlock* dev_blocks = nullptr;
    const std::int64_t* dev_units = nullptr;
    std::int64_t units = 0;
  };
  /// Device memory and its pinned host image (the source of the asynchronous upload, kept alive).
  struct Region {
    void* dev = nullptr;
    std::byte* host = nullptr;
  };
  /// Uploads lists (appended to lists_) and, after them, `extra` bytes of device memory for the
  /// peers' pointers (peers_dev_ when extra > 0), enqueued on stream_.
  void upload(const std::vector<const std::vector<BlockCopy>*>& src, std::size_t extra) const {
    // Image of the device memory: per list, the kernel's blocks then the unit prefix sum.
    std::size_t bytes = 0;
    std::vector<std::size_t> blocks_at(src.size()), units_at(src.size());
    std::vector<detail::KernelList> kl(src.size());
    for (std::size_t i = 0; i < src.size(); ++i) {
      kl[i] = detail::kernel_list(src[i]->data(), src[i]->size());
      blocks_at[i] = bytes;
      bytes += kl[i].blocks.size() * sizeof(detail::KernelBlock);
      units_at[i] = bytes;
      bytes += kl[i].unit_begin.size() * sizeof(std::int64_t);
    }
    const std::size_t extra_at = (bytes + 15) / 16 * 16;
    Region r;
    detail::cuda_check(cudaMallocHost(reinterpret_cast<void**>(&r.host), bytes), "cudaMallocHost (CudaExecutor block lists)");
    const cudaError_t m = cudaMalloc(&r.dev, extra_at + extra);
    if (m != cudaSuccess) {
      cudaFreeHost(r.host);
      detail::cuda_check(m, "cudaMalloc (CudaExecutor block lists)");
    }
    regions_.push_back(r);  // freed by the destructor from now on
    auto* dev = static_cast<std::byte*>(r.dev);
    for (std::size_t i = 0; i < src.size(); ++i) {
      if (!kl[i].blocks.empty())
        std::memcpy(r.host + blocks_at[i], kl[i].blocks.data(), kl[i].blocks.size() * sizeof(detail::KernelBlock));
      std::memcpy(r.host + units_at[i], kl[i].unit_begin.data(), kl[i].unit_begin.size() * sizeof(std::int64_t));
      lists_.push_back(List{src[i]->data(), src[i]->size(), reinterpret_cast<const detail::KernelBlock*>(dev + blocks_at[i]),
                            reinterpret_cast<const std::int64_t*>(dev + units_at[i]), kl[i].unit_begin.back()});
    }
    if (extra) peers_dev_ = reinterpret_cast<std::byte**>(dev + extra_at);
    // The pinned image stays alive with the executor, so the asynchronous upload may read it at leisure.
    detail::cuda_check(cudaMemcpyAsync(r.dev, r.host, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (CudaExecutor block lists)");
  }

  void release() noexcept {
    for (Region& r : regions_) {
      if (r.dev) cudaFree(r.dev);
      if (r.host) cudaFreeHost(r.host);
    }
    regions_.clear();
  }

  void swap(CudaExecutor& o) noexcept {
    std::swap(lists_, o.lists_);
    std::swap(regions_, o.regions_);
    std::swap(peers_dev_, o.peers_dev_);
    std::swap(peers_count_, o.peers_count_);
    std::swap(stream_, o.stream_);
    std::swap(device_, o.device_);
    std::swap(max_grid_, o.max_grid_);
    std::swap(sms_, o.sms_);
    std::swap(per_sm_, o.per_sm_);
  }

  mutable std::vector<List> lists_;       // the plan's lists (prepare_direct() adds the direct ones)
  mutable std::vector<Region> regions_;   // their device memory and pinned images
  mutable std::byte** peers_dev_ = nullptr;  // the direct path's peers' pointers, in device memory
  mutable std::size_t peers_count_ = 0;      // entries of peers_dev_ (P × kMaxTensors)
  cudaStream_t stream_ = nullptr;
  int device_ = 0, sms_ = 1, per_sm_ = 1;
  std::int64_t max_grid_ = 1;
};

ULYSSES_CUDA_NAMESPACE_END
