// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The plan's data types: numbered buffers, block copies and sums, point-to-point messages.
///
/// Pack and unpack are one operation: a list of strided 4-D block copies that name their buffers
/// by index into a BufferTable, so one list serves every call and every executor. A sum is a run
/// of blocks with one destination (BlockOp::sum, then BlockOp::sum_term), added by the rules of
/// element.hpp. Types only: communicators include this header for Message. docs/design.md,
/// "Plan → pack → exchange → unpack"; docs/headers.md, "layout/blocks.hpp".
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "element.hpp"
#include "../version.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Most tensors one plan can move in one exchange (q, k, v and a few more).
inline constexpr int kMaxTensors = 16;

/// Indices into a BufferTable: inputs are 0..T-1, outputs kMaxTensors..kMaxTensors+T-1, then
/// the send and receive halves of the wire buffer; then the inputs of other ranks of the group
/// (the direct transport: ranks that share memory read each other's inputs), then their outputs
/// (the direct transport's push lists: ranks of one address space write their peers' outputs).
struct BufferIndex {
  static constexpr int input(int t) { return t; }
  static constexpr int output(int t) { return kMaxTensors + t; }
  static constexpr int send = 2 * kMaxTensors;
  static constexpr int recv = 2 * kMaxTensors + 1;
  static constexpr int count = 2 * kMaxTensors + 2;  ///< entries of BufferTable::base
  /// Input t of rank p (BufferTable::peers[p * kMaxTensors + t]).
  static constexpr int peer_input(int p, int t) { return count + p * kMaxTensors + t; }
  /// Output t of rank p in a group of `degree` ranks (BufferTable::peers[(degree + p) *
  /// kMaxTensors + t]): after every rank's inputs.
  static constexpr int peer_output(int p, int t, int degree) { return count + (degree + p) * kMaxTensors + t; }
  /// The direct transport's bounce buffer in a group of `degree` ranks (BufferTable::peers[2 *
  /// degree * kMaxTensors]): where the peer copy packs the terms of a sum it read from another
  /// process (Cross Memory Attach), after every rank's inputs and outputs.
  static constexpr int bounce(int degree) { return count + 2 * degree * kMaxTensors; }
};

class RowTransforms;  // layout/transform.hpp

/// The base pointers one execution of a plan works on (trivially copyable: passed by value to
/// CUDA kernels). Unused entries are null.
struct BufferTable {
  std::byte* base[BufferIndex::count] = {};
  /// The direct transport's view of the group: peers[p * kMaxTensors + t] is rank p's input t
  /// (this rank's own included), in memory the executor can read; for a push list (ranks of one
  /// address space) peers[(P + p) * kMaxTensors + t] is rank p's output t, in a group of P ranks.
  /// Null on the other transports.
  std::byte* const* peers = nullptr;
  /// The call's row transforms (layout/transform.hpp; host executors), or null: none.
  const RowTransforms* transforms = nullptr;
};

namespace detail {
/// The base pointer of buffer `index` of a table (an own buffer, or a peer's input).
ULYSSES_HOST_DEVICE inline std::byte* buffer_at(const BufferTable& t, int index) {
  return index < BufferIndex::count ? t.base[index] : t.peers[index - BufferIndex::count];
}
}  // namespace detail

/// One point-to-point message of a message-level exchange (the optional exchange_messages() of the
/// communicator concept, comm/concepts.hpp): `bytes` contiguous bytes at `data`, sent to or
/// received from rank `peer`. Read when sending, written when receiving.
struct Message {
  int peer = 0;
  std::byte* data = nullptr;
  std::size_t bytes = 0;
};

/// What a block does.
enum class BlockOp : std::int32_t {
  copy = 0,      ///< copy source → destination
  sum = 1,       ///< first block of a sum of `sources` terms (this block's source is the first term)
  sum_term = 2,  ///< a further term of the sum that starts at the nearest BlockOp::sum before it
};

/// One strided block copy (or one term of a sum), byte-addressed and type-erased.
///
/// Copies the rows at `src_base + src_offset + sum_i idx_i * src_stride[i]` to
/// `dst_base + dst_offset + sum_i idx_i * dst_stride[i]` for idx in [0, extent) (4 outer
/// dimensions, outermost first), each row being `row_bytes` contiguous bytes. Built from a
/// (b, s, h, d) block by make_block(), which merges dimensions that are contiguous on both sides,
/// so a row is at least one element and usually D elements or more. For a sum (op != copy) every
/// block of the run has the same extents, row_bytes and destination; only the sources differ.
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
  BlockOp op = BlockOp::copy;  ///< copy, or a term of a sum
  std::int32_t sources = 1;    ///< BlockOp::sum: the number of terms (this block and the sources-1 after it); else 1
  ElementType type = ElementType::opaque;  ///< the element type a sum adds (op != copy), or a transformed block's
  /// >= 0: the block's rows are single head rows of D elements of this tensor (its index in the
  /// plan), planned with TensorSpec::with_row_transforms(); origin and axis give each row's
  /// RowCoord (layout/transform.hpp), and `type` is the element type. -1: plain bytes.
  std::int32_t row_tensor = -1;
  /// row_tensor >= 0: bit 0 set when the source is an input (own or a peer's: the pack transform
  /// applies), bit 1 when the destination is an output (own or a peer's: the unpack transform).
  std::int32_t row_sides = 0;
  /// row_tensor >= 0: the (batch, global token, global head) of the block's first row.
  std::int64_t origin[3] = {0, 0, 0};
  /// row_tensor >= 0: which coordinate each of the 4 outer loops advances by one per step (0
  /// batch, 1 token, 2 head; -1 none).
  std::int32_t axis[4] = {-1, -1, -1, -1};
  /// row_tensor >= 0: bytes of a source row (row_bytes is the destination's): they differ where
  /// one side is an fp8 wire row (D bytes and a float32 scale).
  std::int64_t src_row_bytes = 0;
  /// row_tensor >= 0: the tensor's wire (TensorSpec::wire: 1 fp8 E4M3FN, 2 fp8 E5M2 (Fp8Format's
  /// values), 3 bfloat16, 4 float16), 0 its own elements. The side that is not an input or
  /// output (row_sides) is then a row of that wire.
  std::int32_t wire = 0;

  /// Rows this block copies.
  ULYSSES_HOST_DEVICE constexpr std::int64_t rows() const { return extent[0] * extent[1] * extent[2] * extent[3]; }
  /// Bytes this block copies (for a sum: bytes of the destination, counted on each term).
  ULYSSES_HOST_DEVICE constexpr std::int64_t bytes() const { return rows() * row_bytes; }
  /// Bytes of destination this block writes: bytes() for a copy or the first block of a sum, 0
  /// for the further terms of a sum (the first block writes the sum).
  ULYSSES_HOST_DEVICE constexpr std::int64_t written_bytes() const { return op == BlockOp::sum_term ? 0 : bytes(); }
};

/// A view of one block list (what executors are given and what they may upload): `size` blocks
/// at `data`, in execution order. The address identifies the list: stream-ordered executors
/// (CudaExecutor) that mirror lists in device memory recognise them by it.
struct BlockList {
  const BlockCopy* data = nullptr;
  std::size_t size = 0;
};

namespace detail {

/// Byte offsets (source `so`, destination `dso`) of row `row` of block `c`, from the bases plus
/// the offsets: the rows are numbered row-major over extent[0..3] (extent[3] fastest), the order
/// in which the host executor's loops visit them, and `row` is decomposed over extent[3..1] with
/// the remainder as the index of dimension 0. The one row decomposition of the library: the host
/// executor (host/executor.hpp) and the copy kernel (cuda/detail/kernel.cuh) both call it.
/// @tparam Index the type the divisions are made in: std::int64_t (any block), or std::uint32_t
///               for the copy kernel's blocks of fewer than 2^31 rows (32-bit divisions are faster
///               on the GPU); both give the same offsets where the rows fit
/// @pre 0 <= row < c.rows(), every extent >= 1 (make_blocks() builds no empty block)
template <class Index = std::int64_t>
ULYSSES_HOST_DEVICE inline void row_offsets(const BlockCopy& c, std::int64_t row, std::int64_t& so, std::int64_t& dso) {
  auto q = static_cast<Index>(row);
  std::int64_t s = 0, d = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 3; i >= 1; --i) {
    const auto e = static_cast<Index>(c.extent[i]);
    const Index next = q / e;
    const auto idx = static_cast<std::int64_t>(q - next * e);
    s += idx * c.src_stride[i];
    d += idx * c.dst_stride[i];
    q = next;
  }
  const auto i0 = static_cast<std::int64_t>(q);
  so = s + i0 * c.src_stride[0];
  dso = d + i0 * c.dst_stride[0];
}

/// The dimensions of a block being built by make_blocks(), in bytes: dims[k] = {extent,
/// destination stride, where its n source strides start in ss}, k < 5; its three steps are
/// gather(), merge() and shape().
class BlockDims {
 public:
  /// Room for the strides of n sources (allocates for n > 4).
  explicit BlockDims(int n) : n_(n) {
    if (n > 4) {
      big_.resize(static_cast<std::size_t>(5 * n));
      ss_ = big_.data();
    }
  }
  BlockDims(const BlockDims&) = delete;  // ss_ may point into small_
  BlockDims& operator=(const BlockDims&) = delete;

  /// Takes the dimensions of extent > 1 (strides in elements of elem_bytes); false for an empty block.
  bool gather(const std::int64_t ext[4], const std::int64_t* const* src_stride_elems, const std::int64_t dst_stride_elems[4],
              std::int64_t elem_bytes) {
    for (int i = 0; i < 4; ++i) {
      if (ext[i] == 0) return false;
      if (ext[i] > 1 || (rows_ && i == 3)) {  // (a transformed block keeps its D dim, even of extent 1)
        dims_[nd_] = {ext[i], dst_stride_elems[i] * elem_bytes, nd_ * n_, i};
        for (int j = 0; j < n_; ++j) ss_[nd_ * n_ + j] = src_stride_elems[j][i] * elem_bytes;
        ++nd_;
      }
    }
    return true;
  }
  /// Orders the dimensions outermost first by destination stride (stable: ties keep the logical
  /// order), appends the bytes of one element, and merges neighbours from the inside out where
  /// the destination and every source are contiguous.
  void merge(std::int64_t elem_bytes) {
    std::stable_sort(dims_, dims_ + nd_, [](const Dim& a, const Dim& b) { return a.ds > b.ds; });
    dims_[nd_] = {elem_bytes, 1, nd_ * n_, 4};  // the bytes of one element, always contiguous
    for (int j = 0; j < n_; ++j) ss_[nd_ * n_ + j] = 1;
    ++nd_;
    w_ = nd_ - 1;
    for (int k = nd_ - 2; k >= 0; --k) {
      Dim& in = dims_[w_];
      const Dim& o = dims_[k];
      bool joins = o.ds == in.n * in.ds && (!rows_ || (o.axis == 3 && in.axis == 4));  // a transformed row: D elements, no more
      for (int j = 0; j < n_ && joins; ++j) joins = ss_[o.at + j] == in.n * ss_[in.at + j];
      if (joins) {
        in.n *= o.n;
      } else {
        dims_[--w_] = o;
      }
    }
  }
  /// Writes the merged geometry of source j into b: the row, then the outer dimensions
  /// right-aligned in extent[0..3] (dims_[w_..nd_): outer dims, then the innermost, of unit strides).
  void shape(int j, BlockCopy& b) const {
    const int outer = nd_ - 1 - w_;
    b.row_bytes = dims_[nd_ - 1].n;
    for (int i = 0; i < 4; ++i) {
      const int k = i - (4 - outer);  // right-align the outer dims
      b.extent[i] = k >= 0 ? dims_[w_ + k].n : 1;
      b.src_stride[i] = k >= 0 ? ss_[dims_[w_ + k].at + j] : 0;
      b.dst_stride[i] = k >= 0 ? dims_[w_ + k].ds : 0;
      b.axis[i] = k >= 0 && rows_ ? dims_[w_ + k].axis : -1;
    }
  }
  /// Keeps every dimension apart but D's (rows of one head row each, their loops labelled with
  /// their coordinate): the geometry of a transformed block. Before gather().
  void keep_rows() { rows_ = true; }

 private:
  struct Dim {
    std::int64_t n, ds;
    int at;    // index of this dim's first source stride in ss_
    int axis;  // 0 batch, 1 token, 2 head, 3 D, 4 the element's bytes (3 or 4 once merged into the row)
  };
  int n_;
  bool rows_ = false;
  Dim dims_[5];
  std::int64_t small_[5 * 4];
  std::vector<std::int64_t> big_;
  std::int64_t* ss_ = small_;
  int nd_ = 0, w_ = 0;
};

/// What makes a block transformed (make_blocks()): the RowCoord of its first row, its tensor,
/// and the group's degree (to tell inputs and outputs, own or a peer's, from the wire by buffer index).
struct RowOrigin {
  std::int64_t at[3] = {0, 0, 0};  ///< (batch, global token, global head) of the first row
  int tensor = 0;                  ///< the tensor's index in the plan
  int degree = 1;                  ///< the group's size P
  int wire = 0;                    ///< the tensor's fp8 wire (BlockCopy::wire), 0 none
  /// Bit 0 when buffer `src` is an input, bit 1 when `dst` is an output (BlockCopy::row_sides).
  int sides(int src, int dst) const {
    auto input = [&](int i) { return i < kMaxTensors || (i >= BufferIndex::count && i < BufferIndex::peer_output(0, 0, degree)); };
    auto output = [&](int i) {
      return (i >= kMaxTensors && i < 2 * kMaxTensors) || (i >= BufferIndex::peer_output(0, 0, degree) && i < BufferIndex::bounce(degree));
    };
    return (input(src) ? 1 : 0) | (output(dst) ? 2 : 0);
  }
};

/// Builds the blocks of a (b, s, h, d) block of extents `ext` from `n` sources to one
/// destination (n = 1: a copy; n >= 2: a sum of n terms in the given order). Strides are in
/// elements of `elem_bytes` bytes. Dimensions are ordered by destination stride (any loop order
/// is valid), extent-1 dimensions dropped, and neighbours merged where every source and the
/// destination are contiguous, so that all n blocks share one geometry. Writes out[0..n) and
/// returns true; returns false (and builds nothing) for an empty block. Allocates for n > 4
/// (planning only). With `origin` the blocks are transformed (BlockCopy::row_tensor): no dimension is merged but D, whose
/// stride must then be one element on every side, so each row is one head row.
/// @pre n >= 1; for n >= 2 or an origin, summable(type) and elem_bytes == size_of(type)
inline bool make_blocks(const std::int64_t ext[4], int n, const std::int64_t* const* src_stride_elems,
                        const std::int64_t dst_stride_elems[4], std::int64_t elem_bytes, const std::int64_t* src_offset_bytes,
                        std::int64_t dst_offset_bytes, const int* src_buffer, int dst_buffer, ElementType type, BlockCopy* out,
                        const RowOrigin* origin = nullptr) {
  BlockDims dims(n);
  if (origin) dims.keep_rows();
  if (!dims.gather(ext, src_stride_elems, dst_stride_elems, elem_bytes)) return false;
  dims.merge(elem_bytes);
  for (int j = 0; j < n; ++j) {
    BlockCopy& b = out[j];
    b = BlockCopy{};
    dims.shape(j, b);
    b.src_offset = src_offset_bytes[j];
    b.dst_offset = dst_offset_bytes;
    b.src_buffer = src_buffer[j];
    b.dst_buffer = dst_buffer;
    b.elem_bytes = static_cast<std::int32_t>(elem_bytes);
    if (n > 1) {
      b.op = j == 0 ? BlockOp::sum : BlockOp::sum_term;
      b.sources = j == 0 ? n : 1;
      b.type = type;
    }
    if (origin) {
      b.row_tensor = origin->tensor;
      b.row_sides = origin->sides(src_buffer[j], dst_buffer);
      b.src_row_bytes = b.row_bytes;
      b.wire = origin->wire;
      b.type = type;
      for (int a = 0; a < 3; ++a) b.origin[a] = origin->at[a];
    }
  }
  return true;
}

/// Builds the BlockCopy of a (b, s, h, d) block of extents `ext`, whose source and destination
/// strides are in elements of `elem_bytes` bytes (make_blocks() with one source). Returns false
/// (and builds nothing) for an empty block.
/// With `origin`, a transformed block of elements of `type` (see make_blocks()).
inline bool make_block(const std::int64_t ext[4], const std::int64_t src_stride_elems[4],
                       const std::int64_t dst_stride_elems[4], std::int64_t elem_bytes, std::int64_t src_offset_bytes,
                       std::int64_t dst_offset_bytes, int src_buffer, int dst_buffer, BlockCopy& out,
                       const RowOrigin* origin = nullptr, ElementType type = ElementType::opaque) {
  const std::int64_t* ss[1] = {src_stride_elems};
  return make_blocks(ext, 1, ss, dst_stride_elems, elem_bytes, &src_offset_bytes, dst_offset_bytes, &src_buffer, dst_buffer,
                     type, &out, origin);
}

}  // namespace detail

ULYSSES_NAMESPACE_END
