// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The host executor: runs a plan's block lists (layout/blocks.hpp) with host loads and stores.
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

#include "../error.hpp"
#include "../detail/worker.hpp"
#include "../layout/blocks.hpp"
#include "../layout/element.hpp"
#include "../layout/layout.hpp"
#include "../layout/rows.hpp"
#include "detail/copy_rows.hpp"  // copy_rows(), the streaming stores
#include "detail/sum.hpp"        // run_sum_range()
#include "detail/transform_rows.hpp"  // run_transformed_rows(), run_transformed_sum()

ULYSSES_NAMESPACE_BEGIN

/// Runs one block copy on the host (op == BlockOp::copy; sums run through HostExecutor::run).
/// @param c         the block (its buffers are indices into `t`)
/// @param t         the base pointers of the call's buffers
/// @param streaming copy rows of 64 bytes or more with non-temporal (cache-bypassing) stores; the
///                  caller must then call detail::stream_fence() before the data is read by
///                  another thread. Same bytes either way.
/// @pre the table holds valid pointers for the block's buffers; source and destination do not overlap.
inline void run_block_host(const BlockCopy& c, const BufferTable& t, bool streaming = false) {
  if (detail::transforms_rows(c, t)) return detail::run_transformed_rows(c, t, 0, c.rows(), streaming);
  const std::byte* src = detail::buffer_at(t, c.src_buffer);
  std::byte* dst = detail::buffer_at(t, c.dst_buffer);
  detail::for_each_row_run(c, [&](std::int64_t so, std::int64_t dso) {
    detail::copy_rows_as(streaming, dst + dso, src + so, c.extent[3], c.row_bytes, c.dst_stride[3], c.src_stride[3]);
  });
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
    o.axis[i] = c.axis[i + 1];
  }
  o.extent[3] = c.extent[best];
  o.src_stride[3] = c.src_stride[best];
  o.dst_stride[3] = c.dst_stride[best];
  o.axis[3] = c.axis[best];
  return o;
}

/// Copies the bytes [lo, hi) of block `c` (bytes numbered row by row in loop order, row-major over
/// extent[0..3], then within the row): whole rows go through copy_rows_as, a row cut by lo or hi
/// is copied in part. The result is the same bytes as run_block_host restricted to that range.
/// @pre 0 <= lo <= hi <= c.bytes()
inline void run_block_range(const BlockCopy& c, const BufferTable& t, std::int64_t lo, std::int64_t hi, bool streaming) {
  if (lo == 0 && hi == c.bytes()) return run_block_host(c, t, streaming);
  if (transforms_rows(c, t))  // whole rows: those that start in [lo, hi) (neighbouring ranges meet exactly)
    return run_transformed_rows(c, t, (lo + c.row_bytes - 1) / c.row_bytes, (hi + c.row_bytes - 1) / c.row_bytes, streaming);
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
      if (c.op == BlockOp::sum && transforms_rows(c, t)) {  // whole rows, as run_block_range
        run_transformed_sum(&c, t, (a + c.row_bytes - 1) / c.row_bytes, (z + c.row_bytes - 1) / c.row_bytes);
      } else if (c.op == BlockOp::sum) {
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
  /// read-for-ownership of every destination line. 0: always; SIZE_MAX: never.
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
  /// Applies a call's row transforms (BufferTable::transforms, layout/transform.hpp) to the
  /// blocks of tensors planned with TensorSpec::with_row_transforms().
  static constexpr bool row_transforms = true;

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
        else if (blocks[i].op == BlockOp::sum && detail::transforms_rows(blocks[i], t))
          detail::run_transformed_sum(&blocks[i], t, 0, blocks[i].rows());
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
