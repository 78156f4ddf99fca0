// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief CudaDecodeExecutor: the decode exchange's passes (decode/exchange.hpp) on the GPU, one
///        kernel launch each, on the caller's stream: the pack of the partials' chunks, the unpack
///        + merge of the received partials (one launch), and the unpack of the merged head groups.
///
/// The kernels run decode/kernels.hpp's host-and-device bodies with merge/lse.hpp's arithmetic:
/// the GPU's bits are the host's. No allocation or host synchronisation in a call (capturable).
/// Details: docs/headers.md, "cuda/merge.cuh"; docs/decode.md. Needs nvcc; link ulysses::cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "../decode/kernels.hpp"
#include "../decode/plan.hpp"
#include "../error.hpp"
#include "../merge/lse.hpp"
#include "detail/config.cuh"

ULYSSES_CUDA_DETAIL_BEGIN

/// Threads per CTA of the decode kernels.
inline constexpr int kDecodeThreads = 256;
/// Lanes per row in the pack and gather kernels (a warp).
inline constexpr int kDecodeLanes = 32;
/// Elements per thread in the merge kernel.
inline constexpr int kDecodeMergeChunk = 8;

/// Pack: row r of the other ranks' heads by warp, rows grid-stride.
ULYSSES_KERNEL_ATTRIBUTES void __launch_bounds__(kDecodeThreads) decode_pack_kernel(DecodeArgs a, std::int64_t rows) {
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (kDecodeThreads / kDecodeLanes);
  const int lane = static_cast<int>(threadIdx.x) % kDecodeLanes;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * (kDecodeThreads / kDecodeLanes) + threadIdx.x / kDecodeLanes; r < rows; r += warps)
    decode_pack_unit(a, r, lane, kDecodeLanes);
}

/// Gather unpack (all_heads): as the pack, from the gather-receive region into the output.
ULYSSES_KERNEL_ATTRIBUTES void __launch_bounds__(kDecodeThreads) decode_gather_kernel(DecodeArgs a, std::int64_t rows) {
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (kDecodeThreads / kDecodeLanes);
  const int lane = static_cast<int>(threadIdx.x) % kDecodeLanes;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * (kDecodeThreads / kDecodeLanes) + threadIdx.x / kDecodeLanes; r < rows; r += warps)
    decode_gather_unit(a, r, lane, kDecodeLanes);
}

/// Unpack + merge: unit u = (row u / chunks, elements [8·(u % chunks), +8)), units grid-stride;
/// (row, chunk) advanced by the stride's quotient and remainder (two divisions per thread, not one
/// 64-bit division per unit).
template <class In, class Out>
ULYSSES_KERNEL_ATTRIBUTES void __launch_bounds__(kDecodeThreads) decode_merge_kernel(DecodeArgs a, std::int64_t units, std::int64_t chunks) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kDecodeThreads;
  const std::int64_t u0 = static_cast<std::int64_t>(blockIdx.x) * kDecodeThreads + threadIdx.x;
  if (u0 >= units) return;
  const std::int64_t dr = stride / chunks, dc = stride - dr * chunks;
  std::int64_t r = u0 / chunks, c = u0 - r * chunks;
  for (std::int64_t u = u0; u < units; u += stride) {
    decode_merge_unit_typed<kDecodeMergeChunk, In, Out>(a, r, c * kDecodeMergeChunk);
    r += dr, c += dc;
    if (c >= chunks) c -= chunks, ++r;
  }
}

ULYSSES_CUDA_DETAIL_END

ULYSSES_CUDA_NAMESPACE_BEGIN

/// The decode executor of device memory (see the decode executor concept in decode/exchange.hpp):
/// made from a DecodePlan, it serves plans with that plan's peer table (the plan itself and its
/// copies), launching on its stream.
///
/// Memory: DecodeBuffers of device memory (or memory the device can address) of the executor's
/// device; 16-byte aligned buffers and rows of a multiple of 16 bytes take the vector copies (any
/// alignment is correct). Lifetime: the executor must outlive every launch it enqueued and every
/// CUDA graph that captured one (the kernels read its device copy of the peer table).
/// Thread-safety: the passes are const and only launch.
/// Source: the bodies of decode/kernels.hpp (decode/host.hpp's HostDecodeExecutor is the reference).
class CudaDecodeExecutor {
 public:
  /// Stream-ordered device work on device memory (decode/exchange.hpp's path choice).
  static constexpr bool device_memory = true;

  /// Uploads the plan's peer table (cudaMalloc, then cudaMemcpyAsync on `stream`: every launch on
  /// `stream` is ordered after it) and sizes the grid for the current device. Call it outside
  /// stream capture (it allocates).
  /// @param plan   the plan (or one with the same peer table) whose calls it will run
  /// @param stream the stream the passes launch on (0 = the legacy default stream), of the current device
  /// @throws Error(backend) with the CUDA error name and string when a CUDA call fails.
  CudaDecodeExecutor(const DecodePlan& plan, cudaStream_t stream) : stream_(stream), host_(plan.peers()) {
    int device = 0, sms = 0;
    detail::cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    detail::cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)");
    max_grid_ = static_cast<std::int64_t>(sms > 0 ? sms : 1) * 8;
    const std::size_t bytes = host_.size() * sizeof(DecodePeer);
    detail::cuda_check(cudaMalloc(&dev_, bytes), "cudaMalloc (CudaDecodeExecutor peer table)");
    const cudaError_t e = cudaMemcpyAsync(dev_, host_.data(), bytes, cudaMemcpyHostToDevice, stream_);
    if (e != cudaSuccess) {
      cudaFree(dev_);
      detail::cuda_check(e, "cudaMemcpyAsync (CudaDecodeExecutor peer table)");
    }
  }
  CudaDecodeExecutor(const CudaDecodeExecutor&) = delete;
  CudaDecodeExecutor& operator=(const CudaDecodeExecutor&) = delete;
  /// Moves the device table; the moved-from executor can only be destroyed.
  CudaDecodeExecutor(CudaDecodeExecutor&& o) noexcept
      : stream_(o.stream_), host_(std::move(o.host_)), dev_(std::exchange(o.dev_, nullptr)), max_grid_(o.max_grid_) {}
  /// Frees the device table (cudaFree, which waits for the device; errors are ignored).
  ~CudaDecodeExecutor() {
    if (dev_) cudaFree(dev_);
  }

  /// The device copy of the plan's peer table.
  /// @throws Error(plan_mismatch) when `plan`'s peer table is not the one the executor was made from.
  const DecodePeer* peer_table(const DecodePlan& plan) const {
    const auto& p = plan.peers();
    if (p.size() != host_.size() || std::memcmp(p.data(), host_.data(), p.size() * sizeof(DecodePeer)) != 0)
      detail::fail(Errc::plan_mismatch, "CudaDecodeExecutor: the decode plan given is not the one (or a copy of the one) the executor was made from");
    return dev_;
  }

  /// Pack (one launch; none when there is nothing to pack). @throws Error(backend) the launch failed.
  void pack(const DecodeArgs& a) const {
    const std::int64_t rows = detail::decode_other_rows(a);
    if (rows == 0) return;
    detail::check_pending(cudaPeekAtLastError(), "decode_pack_kernel");
    detail::decode_pack_kernel<<<grid(rows * detail::kDecodeLanes), detail::kDecodeThreads, 0, stream_>>>(a, rows);
    detail::check_launch("decode_pack_kernel");
  }

  /// Unpack + merge (one launch for every row and contribution). @throws Error(backend) the launch failed.
  void merge(const DecodeArgs& a) const {
    const std::int64_t chunks = (a.Dv + detail::kDecodeMergeChunk - 1) / detail::kDecodeMergeChunk, units = detail::decode_own_rows(a) * chunks;
    if (units == 0) return;
    detail::check_pending(cudaPeekAtLastError(), "decode_merge_kernel");
    bool launched = false;
    detail::with_merge_arith(a.partial_type, [&](auto in) {
      detail::with_merge_arith(a.out_type, [&](auto o) {
        detail::decode_merge_kernel<decltype(in), decltype(o)><<<grid(units), detail::kDecodeThreads, 0, stream_>>>(a, units, chunks);
        launched = true;
      });
    });
    if (!launched) detail::fail(Errc::not_summable, "CudaDecodeExecutor::merge: element types that cannot be merged");
    detail::check_launch("decode_merge_kernel");
  }

  /// Gather unpack (all_heads; one launch). @throws Error(backend) the launch failed.
  void unpack_gathered(const DecodeArgs& a) const {
    const std::int64_t rows = detail::decode_other_rows(a);
    if (rows == 0) return;
    detail::check_pending(cudaPeekAtLastError(), "decode_gather_kernel");
    detail::decode_gather_kernel<<<grid(rows * detail::kDecodeLanes), detail::kDecodeThreads, 0, stream_>>>(a, rows);
    detail::check_launch("decode_gather_kernel");
  }

  cudaStream_t stream() const { return stream_; }  ///< the stream the passes launch on
  /// Most CTAs one launch uses (8 per SM).
  std::int64_t max_grid() const { return max_grid_; }

 private:
  unsigned grid(std::int64_t threads) const {
    const std::int64_t ctas = (threads + detail::kDecodeThreads - 1) / detail::kDecodeThreads;
    return static_cast<unsigned>(ctas < max_grid_ ? ctas : max_grid_);
  }
  cudaStream_t stream_ = nullptr;
  std::vector<DecodePeer> host_;
  DecodePeer* dev_ = nullptr;
  std::int64_t max_grid_ = 1;
};

ULYSSES_CUDA_NAMESPACE_END
