// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief NcclComm: the communicator concept over the user's ncclComm_t and cudaStream_t
///        (non-owning). Its mesh split (split_by_node() over ncclCommSplit, NcclMesh) is
///        comm/nccl_mesh.cuh; comm/nccl.cuh includes both.
///
/// Needs <nccl.h> and the CUDA runtime (link ulysses::nccl). Buffers are device memory of the
/// communicator's device. Everything is enqueued on the given stream (no host synchronisation;
/// capturable in a CUDA graph like any NCCL call), which must be the stream the executor runs
/// on so that pack → exchange → unpack are ordered.
///
/// Algorithm (NCCL's own recipe for all-to-all-v, "Point-to-point communication" in its user
/// guide): inside one ncclGroupStart/ncclGroupEnd, a receive for every peer with a non-empty
/// incoming chunk and a send for every peer with a non-empty outgoing chunk. Zero-byte pairs are
/// skipped on BOTH sides: rank i posts a send to j iff send_bytes[j] > 0 and rank j posts the
/// receive from i iff recv_bytes[i] > 0, and the two numbers are the same chunk in every rank's
/// plan (the plan computes the global picture; check_agreement() verifies it), so every posted
/// operation has its partner. ncclAlltoAll (NCCL >= 2.28) is not used: it needs equal chunks at
/// p * c with the own one included, a property of this rank's arrays only, so ranks could choose
/// different collectives and hang; and plans never have that layout (their own chunk is empty).
///
/// Contracts the caller keeps:
/// - the executor runs on stream() (redistribute() checks it when the executor has stream());
/// - do not call inside your own open ncclGroupStart(): NCCL would defer the exchange to your
///   ncclGroupEnd(), after the unpack kernel was enqueued behind it on the stream (wrong data);
/// - non-blocking communicators (ncclConfig_t::blocking = 0) work: ncclInProgress is waited out
///   (ncclCommGetAsyncError) before a call returns, so the operations are enqueued when it does;
/// - allgather() (the plan check) synchronises the stream and cannot be captured: run
///   check_agreement(plan, comm) once before capturing a plan's first exchange in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <string>

#include "../layout/blocks.hpp"
#include "../cuda/detail/config.cuh"
#include "../error.hpp"
#include "exchange_state.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Communicator over an NCCL communicator and a CUDA stream (models the communicator
/// concept of comm/concepts.hpp). Not owning: the caller keeps both alive, and must not run other NCCL
/// operations on the communicator concurrently from another thread.
class NcclComm {
 public:
  /// Buffers of alltoallv() are device memory.
  static constexpr bool device_memory = true;

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

  /// What alltoallv() does for these arrays (`size` entries each, bytes): `none` when nothing
  /// moves (no operation is posted), else `send_recv` (grouped ncclSend / ncclRecv).
  enum class Path { none, send_recv };
  static Path path(int size, const std::size_t* send_bytes, const std::size_t* recv_bytes) {
    for (int p = 0; p < size; ++p)
      if (send_bytes[p] || recv_bytes[p]) return Path::send_recv;
    return Path::none;
  }

  /// All-to-all-v in bytes of device memory (see the communicator concept in comm/concepts.hpp),
  /// enqueued on stream(): grouped ncclSend / ncclRecv, zero-byte pairs skipped on both sides.
  /// Collective over the communicator; no host synchronisation (a non-blocking communicator's
  /// ncclInProgress is waited out before return).
  /// @throws Error(backend) with ncclGetErrorString and ncclGetLastError when an NCCL call fails
  ///         (the group is always closed with ncclGroupEnd first).
  void alltoallv(const std::byte* send, const std::size_t* send_bytes, const std::size_t* send_offsets, std::byte* recv,
                 const std::size_t* recv_bytes, const std::size_t* recv_offsets) {
    if (path(size_, send_bytes, recv_bytes) == Path::none) return;
    const auto P = static_cast<std::size_t>(size_);
    post_grouped(
        P, [&](std::size_t p) { return Message{static_cast<int>(p), recv + recv_offsets[p], recv_bytes[p]}; },
        P, [&](std::size_t p) { return SendOp{static_cast<int>(p), send + send_offsets[p], send_bytes[p]}; });
  }

  /// Message-level exchange of device memory (the optional member of the communicator concept,
  /// transport.hpp: Path::messages), enqueued on stream(): inside one ncclGroupStart/ncclGroupEnd,
  /// an ncclRecv per message of `recv` and an ncclSend per message of `send`, in list order
  /// (NCCL delivers the point-to-point operations between two ranks in the order they are
  /// posted, so the k-th message rank i sends rank j is the k-th j receives from i); zero-byte
  /// messages are skipped on both sides. Collective; no host synchronisation.
  /// @throws Error(backend) as alltoallv().
  void exchange_messages(const Message* send, std::size_t n_send, const Message* recv, std::size_t n_recv) {
    bool any = false;
    for (std::size_t i = 0; i < n_send && !any; ++i) any = send[i].bytes > 0;
    for (std::size_t i = 0; i < n_recv && !any; ++i) any = recv[i].bytes > 0;
    if (!any) return;
    post_grouped(
        n_recv, [recv](std::size_t i) -> const Message& { return recv[i]; },
        n_send, [send](std::size_t i) -> const Message& { return send[i]; });
  }

  /// All-gather of `bytes` bytes of HOST memory from every rank (rank p's block lands at
  /// recv + p*bytes): what check_agreement() uses to compare the ranks' plan fingerprints, once
  /// per plan. Collective. Goes through a temporary device buffer (cudaMallocAsync on stream())
  /// and ncclAllGather, and waits for the stream: not for the hot path and not capturable — with
  /// a plan whose check is on (Plan::agreement_check_enabled()), call check_agreement(plan, comm) before
  /// capturing its first exchange.
  /// @throws Error(backend) CUDA or NCCL failures.
  void allgather(const void* send, std::size_t bytes, void* recv) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    detail::cuda_check(cudaStreamIsCapturing(stream_, &capturing), "cudaStreamIsCapturing");
    if (capturing != cudaStreamCaptureStatusNone)
      throw Error(Errc::backend, "NcclComm::allgather (the cross-rank plan check) cannot run while the stream is captured: "
                                 "call check_agreement(plan, comm) before capturing a plan's first exchange");
    const std::size_t total = bytes * static_cast<std::size_t>(size_);
    void* dev = nullptr;
    detail::cuda_check(cudaMallocAsync(&dev, total ? total : 1, stream_), "cudaMallocAsync");
    auto* d = static_cast<std::byte*>(dev);
    cudaError_t e = cudaMemcpyAsync(d + bytes * static_cast<std::size_t>(rank_), send, bytes, cudaMemcpyHostToDevice, stream_);
    ncclResult_t r = ncclSuccess;
    if (e == cudaSuccess) r = wait(ncclAllGather(d + bytes * static_cast<std::size_t>(rank_), d, bytes, ncclUint8, comm_, stream_));
    if (e == cudaSuccess && r == ncclSuccess) e = cudaMemcpyAsync(recv, d, total, cudaMemcpyDeviceToHost, stream_);
    cudaFreeAsync(dev, stream_);
    if (e == cudaSuccess && r == ncclSuccess) e = cudaStreamSynchronize(stream_);
    check(r, "ncclAllGather");
    detail::cuda_check(e, "NcclComm::allgather");
  }

  /// What the transports learn on this communicator about the plans run on it, and their
  /// scratch lists (comm/exchange_state.hpp).
  ExchangeState& exchange_state() noexcept { return state_; }

 private:
  ExchangeState state_;  // see exchange_state()
  /// A send of `bytes` bytes at `data` to `peer` (Message, for a read-only buffer).
  struct SendOp {
    int peer;
    const std::byte* data;
    std::size_t bytes;
  };
  /// The posting both exchanges share: inside one ncclGroupStart / ncclGroupEnd, an ncclRecv for
  /// every recv_at(i), i < n_recv, then an ncclSend for every send_at(i), i < n_send, in index
  /// order (each a {peer, data, bytes}; zero bytes: skipped). The group is always closed before
  /// the first failure (ncclInProgress is not one) is thrown. @throws Error(backend).
  template <class RecvAt, class SendAt>
  void post_grouped(std::size_t n_recv, RecvAt&& recv_at, std::size_t n_send, SendAt&& send_at) {
    check(ncclGroupStart(), "ncclGroupStart");
    ncclResult_t first = ncclSuccess;
    const char* what = "";
    auto keep = [&](ncclResult_t r, const char* w) {
      if (first == ncclSuccess && r != ncclSuccess && r != ncclInProgress) first = r, what = w;
    };
    for (std::size_t i = 0; i < n_recv; ++i) {
      const auto& m = recv_at(i);
      if (m.bytes) keep(ncclRecv(m.data, m.bytes, ncclUint8, m.peer, comm_, stream_), "ncclRecv");
    }
    for (std::size_t i = 0; i < n_send; ++i) {
      const auto& m = send_at(i);
      if (m.bytes) keep(ncclSend(m.data, m.bytes, ncclUint8, m.peer, comm_, stream_), "ncclSend");
    }
    const ncclResult_t end = ncclGroupEnd();
    if (first != ncclSuccess) check(first, what);
    check(end, "ncclGroupEnd");
  }
  /// r, or for ncclInProgress (a non-blocking communicator still enqueueing) the state
  /// ncclCommGetAsyncError reports once it is no longer in progress.
  ncclResult_t wait(ncclResult_t r) const {
    while (r == ncclInProgress) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
      if (q != ncclSuccess) return q;
      r = state;
    }
    return r;
  }
  /// Success (after waiting out ncclInProgress); anything else throws with NCCL's messages.
  void check(ncclResult_t r, const char* what) const {
    r = wait(r);
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
