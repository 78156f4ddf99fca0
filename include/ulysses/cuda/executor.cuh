// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief CudaExecutor: runs block lists on the GPU, one kernel launch per list (all peers, all
///        tensors), on the caller's stream.
///
/// The same block lists as the host executor, uploaded once at construction (the only
/// allocation); run() only launches, so a stream's pack → exchange → unpack is capturable. Takes
/// list views (BlockList), not a Plan. The pieces (policy.cuh, detail/kernel.cuh,
/// detail/kernel_list.cuh, element.cuh): docs/headers.md, "cuda/executor.cuh"; docs/gpu.md.
/// Needs nvcc; link ulysses::cuda. Arch-keyed namespace: cuda/detail/config.cuh.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../layout/blocks.hpp"
#include "detail/config.cuh"
#include "detail/kernel.cuh"
#include "detail/kernel_list.cuh"
#include "element.cuh"
#include "policy.cuh"

ULYSSES_CUDA_NAMESPACE_BEGIN

/// Executor (the executor concept: comm/concepts.hpp) that runs block lists on a CUDA stream.
///
/// Made from block lists (or from a plan, through its block_lists()): it serves exactly those
/// lists, which it uploads to device memory at construction, and the direct path's two lists
/// that prepare_direct() adds. Memory: the buffers of the BufferTable given to run() are device
/// memory (or memory the device can address: managed, mapped, peer) of the executor's device;
/// the workspace should start 16-byte aligned for the widest copies (any alignment is correct).
///
/// Thread-safety: run() is const and may be called from several threads (it only launches),
/// except with a table of peers (the direct path), which updates the resident peer tables
/// (kPeerTables): not concurrently with another such run(); prepare_direct() is const too but
/// uploads the first time: not concurrently with run().
/// Lifetime: the lists (the Plan) must outlive the executor (run() recognises them by address),
/// and the executor must outlive every CUDA graph that captured one of its launches (the kernels
/// read the block lists from the executor's device memory, freed by its destructor).
/// Grid: a launch uses at most SM count × resident CTAs per SM of the copy kernel, or fewer when
/// asked (run(..., max_ctas)): CudaPipeline leaves SMs free so that the NCCL kernel of the stage
/// being exchanged can run beside a pack or an unpack.
/// Source: the block semantics of layout/blocks.hpp (host/executor.hpp's HostExecutor is the
/// reference); the kernel of cuda/detail/kernel.cuh with the constants of policy().
class CudaExecutor {
 public:
  /// Its copies are stream-ordered device work on device memory (comm/concepts.hpp).
  static constexpr bool device_memory = true;

  /// Uploads `n` block lists and sizes the grid for the current device.
  ///
  /// Call it outside stream capture (it allocates: cudaMalloc, and cudaMallocHost for the pinned
  /// host image of the lists, so that the upload is a true asynchronous copy). The upload is
  /// enqueued on `stream` (every run() on that stream is ordered after it); nothing else is
  /// synchronised.
  /// @param lists  n views of the lists run() will be given (host memory; any may be empty); the
  ///               lists themselves (not this array) must outlive the executor and keep their
  ///               address and content: run() recognises a list by (data, size)
  /// @param n      entries of `lists` (0: an executor that runs only the direct lists, after
  ///               prepare_direct())
  /// @param stream the stream run() launches on (0 = the legacy default stream); it must belong
  ///               to the current device, which run() expects to be current too
  /// @throws Error(backend) with the CUDA error name and string when a CUDA call fails (what was
  ///         allocated is freed).
  CudaExecutor(const BlockList* lists, std::size_t n, cudaStream_t stream) : CudaExecutor(stream) { upload(lists, n, 0); }

  /// Uploads every block list of `plan` — both directions, every stage, pack and unpack and
  /// their staged parts (the message path): what the free function `block_lists(plan)`, found by
  /// argument-dependent lookup, returns (Plan's is in plan/plan.hpp) — as
  /// CudaExecutor(lists, n, stream). The direct path's lists come later (prepare_direct()).
  /// @tparam P     a plan type with `std::vector<BlockList> block_lists(const P&)`
  /// @param plan   the plan whose lists run() will be given; must outlive the executor
  /// @param stream as CudaExecutor(lists, n, stream)
  /// @throws as CudaExecutor(lists, n, stream).
  template <class P, class = decltype(block_lists(std::declval<const P&>()))>
  CudaExecutor(const P& plan, cudaStream_t stream) : CudaExecutor(stream) {
    const std::vector<BlockList> lists = block_lists(plan);
    upload(lists.data(), lists.size(), 0);
  }

  /// Peer tables (BufferTable::peers of the direct path) an executor keeps resident in device
  /// memory: run() uploads a table it has not seen (from pinned memory, stream-ordered) and reuses
  /// the resident copy of one it has (no copy at all: what makes the direct path capturable in a
  /// CUDA graph). The 17th distinct table waits for the device (cudaDeviceSynchronize) and starts
  /// over: a captured graph stays valid while its table is among the resident ones.
  static constexpr int kPeerTables = 16;

  /// Uploads the direct path's two lists (PeerCopyLists::list[0] and list[1] of
  /// peer_copy_lists(plan, all), which the first direct exchange builds) and makes room in device
  /// memory for kPeerTables tables of the peers' pointers (degree × kMaxTensors each): what
  /// exchange_direct() calls before running them. Nothing on later calls with the same seq_to_head list. Allocates (cudaMalloc,
  /// cudaMallocHost) the first time: outside stream capture; the upload is enqueued on stream().
  /// @param seq_to_head, head_to_seq the direct lists of the two directions (host memory; they
  ///               must outlive the executor, as the constructor's)
  /// @param degree the group size P (>= 1): BufferTable::peers of the direct path has
  ///               P × kMaxTensors entries
  /// @throws Error(invalid_group) for degree < 1; Error(backend) when a CUDA call fails.
  void prepare_direct(BlockList seq_to_head, BlockList head_to_seq, int degree) const {
    if (peers_dev_ && units(seq_to_head.data, seq_to_head.size) >= 0) return;
    if (degree < 1)
      throw Error(Errc::invalid_group, "CudaExecutor::prepare_direct: degree=" + std::to_string(degree) + " must be >= 1");
    const BlockList lists[2] = {seq_to_head, head_to_seq};
    peers_count_ = static_cast<std::size_t>(degree) * kMaxTensors;
    const std::size_t table_bytes = kPeerTables * peers_count_ * sizeof(std::byte*);
    Region images;
    detail::cuda_check(cudaMallocHost(reinterpret_cast<void**>(&images.host), table_bytes), "cudaMallocHost (CudaExecutor peers)");
    regions_.push_back(images);  // freed by the destructor from now on
    upload(lists, 2, table_bytes);
    peers_host_ = reinterpret_cast<std::byte**>(images.host);
    peers_mirror_.assign(kPeerTables * peers_count_, nullptr);
    peers_resident_ = 0;
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
  /// when n == 0); returns without waiting. No allocation, no synchronisation; capturable (with a
  /// table of peers: once that table is resident, i.e. after one run with it, see kPeerTables;
  /// a new table adds one host-to-device copy from pinned memory, the 17th synchronises).
  ///
  /// @param blocks one of the uploaded lists, by its host address: a BlockList::data given to the
  ///               constructor or to prepare_direct() — for a plan, `plan.stage_lists(d, k).pack.data()`,
  ///               `.unpack.data()`, `.pack_staged.data()`, `.unpack_staged.data()` or
  ///               the peer copy's `lists.list[d].data()` (what the stage functions of redistribute.hpp pass)
  /// @param n      that list's size (its BlockList::size)
  /// @param t      device base pointers (by value: the kernel takes a copy at launch)
  /// @pre the executor's device is current; the buffers' copies do not overlap (as for the host
  ///      executor); when `t.peers` is set (the direct path) it has degree × kMaxTensors entries,
  ///      the degree given to prepare_direct().
  /// @throws Error(plan_mismatch) when `blocks`/`n` is not one of the lists the executor uploaded
  ///         (e.g. a list of a copy of its plan, or of another plan), or when `t.peers` is set and
  ///         prepare_direct() was not called;
  ///         Error(backend) when the launch fails, or when a CUDA error of an earlier call is
  ///         pending on the thread (named as such, left pending; nothing is launched).
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
    const List* l = nullptr;  // first: a foreign list must not consume a resident peer-table slot (or synchronise)
    for (const List& x : lists_)
      if (x.host == blocks && x.n == n) l = &x;
    if (!l)
      throw Error(Errc::plan_mismatch, "CudaExecutor::run: the list of " + std::to_string(n) +
                                           " blocks given is not one of the block lists this executor uploaded (from "
                                           "the plan it was made from, or prepare_direct()); make the executor from the "
                                           "Plan whose schedule you run");
    if (t.peers && !peers_dev_)
      throw Error(Errc::plan_mismatch, "CudaExecutor::run: a table with peers' buffers, but prepare_direct() was not called");
    detail::check_pending(cudaPeekAtLastError(), "block_copy_kernel");
    BufferTable table = t;
    if (t.peers) table.peers = resident_peers(t.peers, stream);  // the direct path: the peers' pointers as a resident device table
    std::int64_t grid = l->units < max_grid_ ? l->units : max_grid_;
    if (max_ctas > 0 && grid > max_ctas) grid = max_ctas;
    detail::block_copy_kernel<detail::kCopyThreads><<<static_cast<unsigned>(grid), detail::kCopyThreads, 0, stream>>>(
        l->dev_blocks, l->dev_units, static_cast<int>(l->n), l->units, table);
    detail::check_launch("block_copy_kernel");
  }

  cudaStream_t stream() const { return stream_; }  ///< the stream run() launches on
  int device() const { return device_; }           ///< the device current at construction
  /// Most CTAs one launch uses: SM count × resident CTAs per SM of the copy kernel.
  std::int64_t max_grid() const { return max_grid_; }
  /// SM count of the executor's device.
  int sm_count() const { return sms_; }
  /// Resident CTAs per SM of the copy kernel (occupancy).
  int ctas_per_sm() const { return per_sm_; }
  /// The tuning constants of the copy kernel this executor launches (cuda/policy.cuh): what ran,
  /// for tools to print (to_string(policy())).
  static constexpr CopyPolicy policy() { return detail::kCopyPolicy; }
  /// Units of work (≤ policy().tile_bytes() bytes each) of an uploaded list, by its host address
  /// and size (as run()), or -1 for a foreign list.
  std::int64_t units(const BlockCopy* blocks, std::size_t n) const {
    for (const List& x : lists_)
      if (x.host == blocks && x.n == n) return x.units;
    return -1;
  }

 private:
  struct List {
    const BlockCopy* host = nullptr;  // the caller's list (identity for run())
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
  /// Queries the device and the kernel's occupancy (what every constructor does first; the
  /// constructors that delegate to it then upload: when that throws, the destructor frees what
  /// was allocated).
  explicit CudaExecutor(cudaStream_t stream) : stream_(stream) {
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
  }

  /// Uploads the `count` lists at `src` (appended to lists_) and, after them, `extra` bytes of
  /// device memory for the peers' pointers (peers_dev_ when extra > 0), enqueued on stream_.
  void upload(const BlockList* src, std::size_t count, std::size_t extra) const {
    if (count == 0 && extra == 0) return;  // nothing to upload (an executor made from no list)
    // Image of the device memory: per list, the kernel's blocks then the unit prefix sum.
    std::size_t bytes = 0;
    std::vector<std::size_t> blocks_at(count), units_at(count);
    std::vector<detail::KernelList> kl(count);
    for (std::size_t i = 0; i < count; ++i) {
      kl[i] = detail::kernel_list(src[i].data, src[i].size);
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
    for (std::size_t i = 0; i < count; ++i) {
      if (!kl[i].blocks.empty())
        std::memcpy(r.host + blocks_at[i], kl[i].blocks.data(), kl[i].blocks.size() * sizeof(detail::KernelBlock));
      std::memcpy(r.host + units_at[i], kl[i].unit_begin.data(), kl[i].unit_begin.size() * sizeof(std::int64_t));
      lists_.push_back(List{src[i].data, src[i].size, reinterpret_cast<const detail::KernelBlock*>(dev + blocks_at[i]),
                            reinterpret_cast<const std::int64_t*>(dev + units_at[i]), kl[i].unit_begin.back()});
    }
    if (extra) peers_dev_ = reinterpret_cast<std::byte**>(dev + extra_at);
    // The pinned image stays alive with the executor, so the asynchronous upload may read it at leisure.
    detail::cuda_check(cudaMemcpyAsync(r.dev, r.host, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (CudaExecutor block lists)");
  }

  /// The device copy of the peer table `want` (peers_count_ entries): a resident one with the same
  /// content, else the next slot, uploaded on `stream` from its pinned image (see kPeerTables).
  std::byte* const* resident_peers(std::byte* const* want, cudaStream_t stream) const {
    const std::size_t n = peers_count_;
    for (int k = 0; k < peers_resident_; ++k)
      if (std::equal(want, want + n, peers_mirror_.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(k) * n)))
        return peers_dev_ + static_cast<std::size_t>(k) * n;
    if (peers_resident_ == kPeerTables) {  // every slot taken: their uploads must have run before an image is rewritten
      detail::cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (CudaExecutor: a 17th distinct peer table)");
      peers_resident_ = 0;
    }
    const std::size_t at = static_cast<std::size_t>(peers_resident_++) * n;
    std::copy(want, want + n, peers_host_ + at);
    std::copy(want, want + n, peers_mirror_.begin() + static_cast<std::ptrdiff_t>(at));
    detail::cuda_check(cudaMemcpyAsync(peers_dev_ + at, peers_host_ + at, n * sizeof(std::byte*), cudaMemcpyHostToDevice, stream),
                       "cudaMemcpyAsync (CudaExecutor peers)");
    return peers_dev_ + at;
  }

  void release() noexcept {
    for (Region& r : regions_) {
      if (r.dev) cudaFree(r.dev);
      if (r.host) cudaFreeHost(r.host);
    }
    regions_.clear();
  }

  /// Every member's reference, in declaration order (swap() exchanges them all).
  auto members() noexcept {
    return std::tie(lists_, regions_, peers_dev_, peers_count_, peers_host_, peers_mirror_, peers_resident_, stream_, device_,
                    max_grid_, sms_, per_sm_);
  }
  void swap(CudaExecutor& o) noexcept {
    auto mine = members(), theirs = o.members();
    mine.swap(theirs);
  }

  mutable std::vector<List> lists_;       // the uploaded lists (prepare_direct() adds the direct ones)
  mutable std::vector<Region> regions_;   // their device memory and pinned images
  mutable std::byte** peers_dev_ = nullptr;  // the direct path's peers' pointers, in device memory
  mutable std::size_t peers_count_ = 0;      // entries of one table (P × kMaxTensors); peers_dev_ holds kPeerTables of them
  mutable std::byte** peers_host_ = nullptr;  // the tables' pinned images (the uploads' sources)
  mutable std::vector<std::byte*> peers_mirror_;  // what each resident table holds (host copy, for the lookup)
  mutable int peers_resident_ = 0;                // tables in use
  cudaStream_t stream_ = nullptr;
  int device_ = 0, sms_ = 1, per_sm_ = 1;
  std::int64_t max_grid_ = 1;
};

ULYSSES_CUDA_NAMESPACE_END
