// SPDX-License-Identifier: Apache-2.0
/// @file comm/nccl.cuh
/// @brief NcclComm: the communicator concept over the user's ncclComm_t and cudaStream_t
///        (non-owning).
///
/// Needs <nccl.h> and the CUDA runtime (link ulysses::nccl). Buffers are device memory of the
/// communicator's device. Everything is enqueued on the given stream (no host synchronisation;
/// capturable in a CUDA graph like any NCCL call), which must be the stream the executor runs
/// on so that pack → exchange → unpack are ordered.
///
/// Algorithm choice (follows NCCL's point-to-point guide, "all-to-all-v" with grouped calls):
/// - **Grouped ncclSend / ncclRecv** (the path ulysses plans take): inside one
///   ncclGroupStart/ncclGroupEnd, a receive for every peer with a non-empty incoming chunk and a
///   send for every peer with a non-empty outgoing chunk. Zero-byte pairs are skipped on BOTH
///   sides: rank i posts a send to j iff send_bytes[j] > 0 and rank j posts the receive from i
///   iff recv_bytes[i] > 0, and the two numbers are the same chunk in every rank's plan (the
///   plan computes the global picture), so every posted operation has its partner.
/// - **ncclAlltoAll** (NCCL >= 2.28, detected with NCCL_VERSION_CODE): used only when the call
///   has ncclAlltoAll's own layout: every one of the P chunks, the own one included, has the
///   same size c > 0 on both sides, at offset p * c. Plans never have that layout for P > 1:
///   their own chunk is always empty (it goes input → output inside unpack) and the peer chunks
///   lie back to back, so ncclAlltoAll would need a gap of c bytes in the workspace for the own
///   chunk and would move those c bytes for nothing (and equal peer chunks need S and every
///   head count divisible by P, which the balanced and zigzag partitions do not promise). Plans
///   therefore always take the grouped send/recv path — NCCL's own documented recipe for
///   all-to-all-v; the ncclAlltoAll path serves engines that call the communicator directly
///   with the canonical layout.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <string>

#include "../cuda/detail/config.cuh"
#include "../error.hpp"

#if defined(NCCL_VERSION_CODE) && defined(NCCL_VERSION)
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
/// 1 when <nccl.h> declares ncclAlltoAll (NCCL >= 2.28), else 0.
#define ULYSSES_NCCL_HAS_ALLTOALL 1
#endif
#endif
#ifndef ULYSSES_NCCL_HAS_ALLTOALL
#define ULYSSES_NCCL_HAS_ALLTOALL 0
#endif

ULYSSES_NAMESPACE_BEGIN

/// Communicator over an NCCL communicator and a CUDA stream (models the concept of
/// redistribute.hpp). Not owning: the caller keeps both alive, and must not run other NCCL
/// operations on the communicator concurrently from another thread.
class NcclComm {
 public:
  /// Wraps `comm` and `stream`.
  /// @param comm   an initialised NCCL communicator (blocking or non-blocking)
  /// @param stream the stream every exchange is enqueued on (device of `comm`)
  /// @throws Error(backend) when ncclCommCount / ncclCommUserRank fail.
  NcclComm(ncclComm_t comm, cudaStream_t stream) : comm_(comm), stream_(stream) {
    check(ncclCommCount(comm_, &size_), "ncclCommCount");
    check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
  }

  int size() const { return size_; }               ///< ncclCommCount
  int rank() const { return rank_; }               ///< ncclCommUserRank
  ncclComm_t get() const { return comm_; }         ///< the wrapped communicator
  cudaStream_t stream() const { return stream_; }  ///< the stream exchanges are enqueued on

  /// Which NCCL call alltoallv() makes for the given chunks (see the file comment).
  enum class Path { none, alltoall, send_recv };

  /// The path alltoallv() takes for these arrays (`size` entries each, bytes): `alltoall` when
  /// NCCL has ncclAlltoAll and every chunk, the own one included, is c > 0 bytes at offset p*c
  /// on both sides; `none` when nothing moves; else `send_recv`.
  static Path path(int size, const std::size_t* send_bytes, const std::size_t* send_offsets, const std::size_t* recv_bytes,
                   const std::size_t* recv_offsets) {
    bool any = false, canonical = true;
    const std::size_t c = send_bytes[0];
    for (int p = 0; p < size; ++p) {
      any = any || send_bytes[p] || recv_bytes[p];
      const std::size_t at = static_cast<std::size_t>(p) * c;
      canonical = canonical && send_bytes[p] == c && recv_bytes[p] == c && send_offsets[p] == at && recv_offsets[p] == at;
    }
    if (!any) return Path::none;
    return ULYSSES_NCCL_HAS_ALLTOALL && canonical ? Path::alltoall : Path::send_recv;
  }

  /// All-to-all-v in bytes of device memory (see the communicator concept in redistribute.hpp),
  /// enqueued on stream(). Collective over the communicator; no host synchronisation.
  /// @throws Error(backend) with ncclGetErrorString and ncclGetLastError when an NCCL call fails
  ///         (the group is always closed with ncclGroupEnd first).
  void alltoallv(const std::byte* send, const std::size_t* send_bytes, const std::size_t* send_offsets, std::byte* recv,
                 const std::size_t* recv_bytes, const std::size_t* recv_offsets) {
    const Path how = path(size_, send_bytes, send_offsets, recv_bytes, recv_offsets);
    if (how == Path::none) return;
#if ULYSSES_NCCL_HAS_ALLTOALL
    if (how == Path::alltoall) {
      check(ncclAlltoAll(send, recv, send_bytes[0], ncclUint8, comm_, stream_), "ncclAlltoAll");
      return;
    }
#endif
    check(ncclGroupStart(), "ncclGroupStart");
    ncclResult_t first = ncclSuccess;
    const char* what = "";
    auto keep = [&](ncclResult_t r, const char* w) {
      if (first == ncclSuccess && r != ncclSuccess && r != ncclInProgress) first = r, what = w;
    };
    for (int p = 0; p < size_; ++p)
      if (recv_bytes[p]) keep(ncclRecv(recv + recv_offsets[p], recv_bytes[p], ncclUint8, p, comm_, stream_), "ncclRecv");
    for (int p = 0; p < size_; ++p)
      if (send_bytes[p]) keep(ncclSend(send + send_offsets[p], send_bytes[p], ncclUint8, p, comm_, stream_), "ncclSend");
    const ncclResult_t end = ncclGroupEnd();
    if (first != ncclSuccess) check(first, what);
    check(end, "ncclGroupEnd");
  }

  /// All-gather of `bytes` bytes of HOST memory from every rank (rank p's block lands at
  /// recv + p*bytes): what check_agreement() uses to compare the ranks' plan fingerprints, once
  /// per plan. Collective. Goes through a temporary device buffer (cudaMallocAsync on stream())
  /// and ncclAllGather, and waits for the stream: not for the hot path and not capturable — with
  /// a plan whose check is on (Plan::check_agreement()), call check_agreement(plan, comm) before
  /// capturing its first exchange.
  /// @throws Error(backend) CUDA or NCCL failures.
  void allgather(const void* send, std::size_t bytes, void* recv) {
    const std::size_t total = bytes * static_cast<std::size_t>(size_);
    void* dev = nullptr;
    detail::cuda_check(cudaMallocAsync(&dev, total ? total : 1, stream_), "cudaMallocAsync");
    auto* d = static_cast<std::byte*>(dev);
    cudaError_t e = cudaMemcpyAsync(d + bytes * static_cast<std::size_t>(rank_), send, bytes, cudaMemcpyHostToDevice, stream_);
    ncclResult_t r = ncclSuccess;
    if (e == cudaSuccess) r = ncclAllGather(d + bytes * static_cast<std::size_t>(rank_), d, bytes, ncclUint8, comm_, stream_);
    if (e == cudaSuccess && r == ncclSuccess) e = cudaMemcpyAsync(recv, d, total, cudaMemcpyDeviceToHost, stream_);
    cudaFreeAsync(dev, stream_);
    if (e == cudaSuccess && r == ncclSuccess) e = cudaStreamSynchronize(stream_);
    check(r, "ncclAllGather");
    detail::cuda_check(e, "NcclComm::allgather");
  }

 private:
  /// Success, or (non-blocking communicators) in progress until ncclCommGetAsyncError says
  /// otherwise; anything else throws with NCCL's messages.
  void check(ncclResult_t r, const char* what) const {
    while (r == ncclInProgress) {
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
      r = state;
    }
    if (r == ncclSuccess) return;
    const char* last = comm_ ? ncclGetLastError(comm_) : nullptr;
    throw Error(Errc::backend, std::string(what) + " failed: " + ncclGetErrorString(r) +
                                   (last && *last ? std::string(" (") + last + ")" : std::string()));
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  int size_ = 0, rank_ = 0;
};

ULYSSES_NAMESPACE_END
