// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief CudaExecutor: runs block lists on the GPU, one kernel launch per list (all peers, all
///        tensors), on the caller's stream.
///
/// The executor runs the very block lists the host executor runs (host/executor.hpp), so the CPU
/// tests already check the index arithmetic the GPU uses. The lists live in device memory: they
/// are uploaded once, when the executor is made from a Plan (the only allocation, with prepare_direct()'s);
/// run() then only launches one kernel, so pack → exchange → unpack on a stream has no host
/// synchronisation and can be captured in a CUDA graph.
///
/// The pieces (CUB's split): the tuning constants in cuda/policy.cuh (CopyPolicy), the kernel
/// and its device functions in cuda/detail/kernel.cuh, the host-side list preparation in
/// cuda/detail/kernel_list.cuh, the element traits of __half and __nv_bfloat16 in
/// cuda/element.cuh; this header is the facade and its memory management. The grid is the
/// device's SM count times the kernel's occupancy (both queried at construction).
///
/// Needs nvcc (or another CUDA compiler); link ulysses::cuda. Everything here is in the inner
/// inline namespace named after the target architectures (see cuda/detail/config.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../layout/blocks.hpp"
#include "../plan/plan.hpp"
#include "detail/config.cuh"
#include "detail/kernel.cuh"
#include "detail/kernel_list.cuh"
#include "element.cuh"
#include "policy.cuh"

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
  /// The tuning constants of the copy kernel this executor launches (cuda/policy.cuh): what ran,
  /// for tools to print (to_string(policy())).
  static constexpr CopyPolicy policy() { return detail::kCopyPolicy; }
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
