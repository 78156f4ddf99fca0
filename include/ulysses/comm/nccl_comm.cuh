// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief NcclComm: the communicator concept over the user's ncclComm_t and cudaStream_t
///        (non-owning). Its mesh split (split_by_node() over ncclCommSplit, NcclMesh) is
///        comm/nccl_mesh.cuh; comm/nccl.cuh includes both.
///
/// Device buffers; everything is enqueued on the given stream, the executor's (capturable). An
/// all-to-all-v is grouped point-to-point (zero-byte pairs skipped on both sides). Waits are
/// bounded by timeout(); on a timeout or an error the communicator is stopped (ncclCommRevoke
/// where the loaded libnccl has it, else ncclCommAbort) and broken. The algorithm, the caller's
/// contracts and what NCCL cannot do: docs/headers.md, "comm/nccl_comm.cuh"; docs/gpu.md.
#pragma once

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "../layout/blocks.hpp"
#include "../cuda/detail/config.cuh"
#include "../error.hpp"
#include "exchange_state.hpp"
#include "failure.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {

/// The address of the NCCL function `name` in the libnccl this process loaded, or nullptr:
/// dlsym(RTLD_DEFAULT), then the library that holds ncclGetVersion (dladdr + dlopen(RTLD_NOLOAD),
/// for a libnccl loaded RTLD_LOCAL, as PyTorch's). What lets a binary built against newer NCCL
/// headers call an optional function only where the loaded NCCL has it, with no link-time
/// reference that would keep it from loading.
inline void* nccl_symbol(const char* name) noexcept {
  if (void* p = dlsym(RTLD_DEFAULT, name)) return p;
  Dl_info info{};
  void* p = nullptr;
  if (dladdr(reinterpret_cast<void*>(&ncclGetVersion), &info) && info.dli_fname)
    if (void* h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD)) {
      p = dlsym(h, name);
      dlclose(h);
    }
  return p;
}

/// The loaded libnccl's version (ncclGetVersion: major * 10000 + minor * 100 + patch, e.g. 22809
/// for 2.28.9), or 0 when the call fails. May differ from NCCL_VERSION_CODE, the headers' at build time.
inline int nccl_loaded_version() noexcept {
  int v = 0;
  return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

/// ncclCommRevoke(comm, flags), resolved at run time: non-null only when the loaded libnccl is
/// >= 2.28 (nccl_loaded_version() >= 22800) and exports the symbol (nccl.h 2.28.9).
using NcclRevokeFn = ncclResult_t (*)(ncclComm_t, int);
inline NcclRevokeFn nccl_revoke() noexcept {
  static const NcclRevokeFn f =
      nccl_loaded_version() >= 22800 ? reinterpret_cast<NcclRevokeFn>(nccl_symbol("ncclCommRevoke")) : nullptr;
  return f;
}

/// The NCCL and CUDA runtime calls NcclComm makes, as a table of functions: NCCL's own
/// (nccl_calls()), or fakes: the seam through which the host tests drive the deadline and abort
/// logic without a GPU.
struct NcclCalls {
  ncclResult_t (*comm_count)(ncclComm_t, int*);   ///< ncclCommCount
  ncclResult_t (*user_rank)(ncclComm_t, int*);    ///< ncclCommUserRank
  ncclResult_t (*group_start)();                  ///< ncclGroupStart
  ncclResult_t (*group_end)();                    ///< ncclGroupEnd
  ncclResult_t (*send)(const void*, std::size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);  ///< ncclSend
  ncclResult_t (*recv)(void*, std::size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);        ///< ncclRecv
  ncclResult_t (*all_gather)(const void*, void*, std::size_t, ncclDataType_t, ncclComm_t, cudaStream_t);  ///< ncclAllGather
  ncclResult_t (*async_error)(ncclComm_t, ncclResult_t*);  ///< ncclCommGetAsyncError
  const char* (*last_error)(ncclComm_t);                   ///< ncclGetLastError
  ncclResult_t (*stop)(ncclComm_t);  ///< stops a failed communicator: ncclCommRevoke (loaded NCCL >= 2.28), else ncclCommAbort
  bool stop_frees;                   ///< whether stop frees the handle (ncclCommAbort)
  cudaError_t (*stream_query)(cudaStream_t);  ///< cudaStreamQuery
  ncclResult_t (*abort)(ncclComm_t);          ///< ncclCommAbort (a child communicator a split could not finish)
  ncclResult_t (*split)(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*);  ///< ncclCommSplit
  cudaError_t (*is_capturing)(cudaStream_t, cudaStreamCaptureStatus*);    ///< cudaStreamIsCapturing
  cudaError_t (*malloc_async)(void**, std::size_t, cudaStream_t);         ///< cudaMallocAsync
  cudaError_t (*free_async)(void*, cudaStream_t);                         ///< cudaFreeAsync
  cudaError_t (*memcpy_async)(void*, const void*, std::size_t, cudaMemcpyKind, cudaStream_t);  ///< cudaMemcpyAsync
};

/// NCCL's and the CUDA runtime's own functions; `stop` is ncclCommRevoke where the loaded
/// libnccl has it (nccl_revoke()), else ncclCommAbort.
inline const NcclCalls& nccl_calls() noexcept {
  static const NcclCalls calls = [] {
    NcclCalls c{};
    c.comm_count = &ncclCommCount;
    c.user_rank = &ncclCommUserRank;
    c.group_start = &ncclGroupStart;
    c.group_end = &ncclGroupEnd;
    c.send = &ncclSend;
    c.recv = &ncclRecv;
    c.all_gather = &ncclAllGather;
    c.async_error = &ncclCommGetAsyncError;
    c.last_error = &ncclGetLastError;
    if (nccl_revoke()) {
      c.stop = [](ncclComm_t comm) { return nccl_revoke()(comm, 0); };  // NCCL_REVOKE_DEFAULT (0), nccl.h 2.28.9
      c.stop_frees = false;
    } else {
      c.stop = &ncclCommAbort;
      c.stop_frees = true;
    }
    c.stream_query = &cudaStreamQuery;
    c.abort = &ncclCommAbort;
    c.split = &ncclCommSplit;
    c.is_capturing = &cudaStreamIsCapturing;
    c.malloc_async = [](void** p, std::size_t n, cudaStream_t s) { return cudaMallocAsync(p, n, s); };
    c.free_async = &cudaFreeAsync;
    c.memcpy_async = [](void* d, const void* src, std::size_t n, cudaMemcpyKind k, cudaStream_t s) { return cudaMemcpyAsync(d, src, n, k, s); };
    return c;
  }();
  return calls;
}

/// Waits out a non-blocking NCCL call's ncclInProgress: while `r` is ncclInProgress, polls
/// calls.async_error(comm) (ncclCommGetAsyncError of the communicator the call works on: the
/// new one for a split) until it reports something else or `deadline` passes. Returns the final
/// state: ncclSuccess, an error, or ncclInProgress when the deadline passed (or the poll's own
/// error). Never throws.
inline ncclResult_t nccl_wait_in_progress(const NcclCalls& calls, ncclComm_t comm, ncclResult_t r,
                                          std::chrono::steady_clock::time_point deadline) noexcept {
  if (r != ncclInProgress) return r;
  poll_until(deadline, [&] {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t q = calls.async_error(comm, &state);
    r = q != ncclSuccess ? q : state;
    return r != ncclInProgress;
  }, PollPace::relaxed);
  return r;
}

}  // namespace detail

/// Communicator over an NCCL communicator and a CUDA stream (models the communicator
/// concept of comm/concepts.hpp). Not owning: the caller keeps both alive, and must not run other NCCL
/// operations on the communicator concurrently from another thread. Copies share the failure
/// state (a failure stops the one NCCL communicator they wrap). Failure model: docs/headers.md, "comm/nccl_comm.cuh".
class NcclComm {
 public:
  /// Buffers of alltoallv() are device memory.
  static constexpr bool device_memory = true;
  /// How a failed communicator is stopped: true, ncclCommRevoke (the handle stays valid: destroy
  /// it); false, ncclCommAbort (the handle is freed). Decided at run time by the loaded libnccl
  /// (>= 2.28 with the symbol: revoke), not by the headers of the build.
  static bool revokes() noexcept { return !detail::nccl_calls().stop_frees; }

  /// Wraps `comm` and `stream`.
  /// @param comm    an initialised NCCL communicator (blocking or non-blocking; non-blocking for
  ///                every wait to be bounded, docs/headers.md, "comm/nccl_comm.cuh")
  /// @param stream  the stream every exchange is enqueued on (device of `comm`)
  /// @param timeout how long one call waits before it throws Error(timeout) (set_timeout() changes it)
  /// @throws Error(backend) when ncclCommCount / ncclCommUserRank fail.
  NcclComm(ncclComm_t comm, cudaStream_t stream, std::chrono::milliseconds timeout = kDefaultCommTimeout)
      : NcclComm(comm, stream, timeout, detail::nccl_calls()) {}

  /// Wraps `comm` and `stream`, calling `calls` instead of NCCL's functions (the seam the host
  /// tests fill with fakes; `calls` must outlive the communicator and its copies).
  /// @param comm    passed to `calls` as the NCCL communicator
  /// @param stream  passed to `calls` as the stream
  /// @param timeout as the other constructor's
  /// @param calls   the table of functions to call
  /// @throws Error(backend) when calls.comm_count / calls.user_rank fail.
  NcclComm(ncclComm_t comm, cudaStream_t stream, std::chrono::milliseconds timeout, const detail::NcclCalls& calls)
      : comm_(comm), stream_(stream), timeout_(timeout), calls_(&calls), sh_(std::make_shared<Shared>()) {
    auto ok = [](ncclResult_t r, const char* what) {
      if (r != ncclSuccess) throw Error(Errc::backend, std::string(what) + " failed: " + ncclGetErrorString(r));
    };
    ok(calls_->comm_count(comm_, &size_), "ncclCommCount");
    ok(calls_->user_rank(comm_, &rank_), "ncclCommUserRank");
  }

  int size() const { return size_; }               ///< ncclCommCount
  int rank() const { return rank_; }               ///< ncclCommUserRank
  ncclComm_t get() const { return comm_; }         ///< the wrapped communicator
  /// The table of functions this communicator calls (NCCL's, or a test's fakes): what the window
  /// and the split over it call too.
  const detail::NcclCalls& calls() const noexcept { return *calls_; }
  cudaStream_t stream() const { return stream_; }  ///< the stream exchanges are enqueued on
  /// How long one call waits before it throws Error(timeout).
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// Sets timeout() for the calls that follow.
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }
  /// True once a call timed out or failed: every call then throws Error(aborted).
  bool broken() const { return sh_->failure.broken(); }
  /// True once a failure stopped the communicator with ncclCommAbort (revokes is false): the
  /// handle get() is then freed and must not be destroyed again.
  bool handle_freed() const { return sh_->freed; }

  /// What alltoallv() does for these arrays (`size` entries each, bytes): `none` when nothing
  /// moves (no operation is posted), else `send_recv` (grouped ncclSend / ncclRecv).
  enum class Path { none, send_recv };
  /// The Path alltoallv() takes for these arrays.
  static Path path(int size, const std::size_t* send_bytes, const std::size_t* recv_bytes) {
    for (int p = 0; p < size; ++p)
      if (send_bytes[p] || recv_bytes[p]) return Path::send_recv;
    return Path::none;
  }

  /// All-to-all-v in bytes of device memory (see the communicator concept in comm/concepts.hpp),
  /// enqueued on stream(): grouped ncclSend / ncclRecv, zero-byte pairs skipped on both sides.
  /// Collective over the communicator; no host synchronisation (a non-blocking communicator's
  /// ncclInProgress is waited out before return, at most timeout()).
  /// @throws Error(backend) with ncclGetErrorString and ncclGetLastError when an NCCL call fails
  ///         or an earlier operation failed asynchronously (the group is always closed with
  ///         ncclGroupEnd first); Error(timeout) still in progress after timeout(); Error(aborted)
  ///         the communicator is broken. Backend and timeout errors stop the communicator.
  void alltoallv(const std::byte* send, const std::size_t* send_bytes, const std::size_t* send_offsets, std::byte* recv,
                 const std::size_t* recv_bytes, const std::size_t* recv_offsets) {
    const Call call = enter("NcclComm::alltoallv");
    if (path(size_, send_bytes, recv_bytes) == Path::none) return;
    const auto P = static_cast<std::size_t>(size_);
    post_grouped(
        call, P, [&](std::size_t p) { return Message{static_cast<int>(p), recv + recv_offsets[p], recv_bytes[p]}; },
        P, [&](std::size_t p) { return SendOp{static_cast<int>(p), send + send_offsets[p], send_bytes[p]}; });
  }

  /// Message-level exchange of device memory (the optional member of the communicator concept,
  /// transport.hpp: Path::messages), enqueued on stream(): inside one ncclGroupStart/ncclGroupEnd,
  /// an ncclRecv per message of `recv` and an ncclSend per message of `send`, in list order
  /// (NCCL delivers the point-to-point operations between two ranks in the order they are
  /// posted, so the k-th message rank i sends rank j is the k-th j receives from i); zero-byte
  /// messages are skipped on both sides. Collective; no host synchronisation.
  /// @throws Error(backend), Error(timeout), Error(aborted) as alltoallv().
  void exchange_messages(const Message* send, std::size_t n_send, const Message* recv, std::size_t n_recv) {
    const Call call = enter("NcclComm::exchange_messages");
    bool any = false;
    for (std::size_t i = 0; i < n_send && !any; ++i) any = send[i].bytes > 0;
    for (std::size_t i = 0; i < n_recv && !any; ++i) any = recv[i].bytes > 0;
    if (!any) return;
    post_grouped(
        call, n_recv, [recv](std::size_t i) -> const Message& { return recv[i]; },
        n_send, [send](std::size_t i) -> const Message& { return send[i]; });
  }

  /// All-gather of `bytes` bytes of HOST memory from every rank (rank p's block lands at
  /// recv + p*bytes): what check_agreement() uses to compare the ranks' plan fingerprints, once
  /// per plan. Collective. Goes through a temporary device buffer (cudaMallocAsync on stream())
  /// and ncclAllGather, and waits for the stream (at most timeout(): a peer that never enters
  /// the all-gather is a timeout, not a hang): not for the hot path and not capturable — with
  /// a plan whose check is on (Plan::agreement_check_enabled()), call check_agreement(plan, comm) before
  /// capturing its first exchange.
  /// @throws Error(backend) CUDA or NCCL failures, or called while the stream is captured (that
  ///         one before anything is enqueued: it leaves the communicator usable);
  ///         Error(timeout), Error(aborted) as alltoallv().
  void allgather(const void* send, std::size_t bytes, void* recv) {
    const Call call = enter("NcclComm::allgather");
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    detail::cuda_check(calls_->is_capturing(stream_, &capturing), "cudaStreamIsCapturing");
    if (capturing != cudaStreamCaptureStatusNone)
      throw Error(Errc::backend, "NcclComm::allgather (the cross-rank plan check) cannot run while the stream is captured: "
                                 "call check_agreement(plan, comm) before capturing a plan's first exchange");
    const std::size_t total = bytes * static_cast<std::size_t>(size_);
    void* dev = nullptr;
    cuda(call, calls_->malloc_async(&dev, total ? total : 1, stream_), "cudaMallocAsync");
    const DeviceScratch scratch{dev, stream_, calls_->free_async};  // freed in stream order however the call ends
    auto* d = static_cast<std::byte*>(dev);
    std::byte* mine = d + bytes * static_cast<std::size_t>(rank_);
    cuda(call, calls_->memcpy_async(mine, send, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
    finish(call, calls_->all_gather(mine, d, bytes, ncclUint8, comm_, stream_), "ncclAllGather");
    drain(call);  // bounded: the copy out below to pageable memory would wait for the stream unbounded
    cuda(call, calls_->memcpy_async(recv, d, total, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    drain(call);
  }

  /// Waits until everything enqueued on stream() so far has finished, at most timeout(): the
  /// bounded alternative to cudaStreamSynchronize(stream()) for the engine's own waits (an
  /// exchange whose peer never entered it stalls the stream; NCCL cannot say which peer).
  /// @throws Error(timeout) the stream had not finished after timeout() (the communicator is
  ///         then stopped, which ends its stalled kernels); Error(backend) a CUDA error on the
  ///         stream or an asynchronous NCCL error; Error(aborted) the communicator is broken.
  void synchronize() { drain(enter("NcclComm::synchronize")); }

  /// Treats `r` as the result of an NCCL call `what` that the caller made on get() (a window
  /// registration): ncclInProgress is waited out (ncclCommGetAsyncError, at most timeout()), as
  /// for the communicator's own calls; a failure or timeout stops the communicator as theirs do.
  /// @throws Error(backend) `r` or the asynchronous state is an error; Error(timeout) still in
  ///         progress after timeout(); Error(aborted) the communicator is broken.
  void complete(ncclResult_t r, const char* what) {
    sh_->failure.check(what);
    finish(Call{what, detail::deadline_after(timeout_)}, r, what);
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
  /// The state the copies of one NcclComm share.
  struct Shared {
    detail::CommFailure failure;
    bool freed = false;  // stop() freed the handle
  };
  /// One call: its name and when it gives up.
  struct Call {
    const char* who;
    std::chrono::steady_clock::time_point deadline;
  };
  /// allgather()'s device buffer, freed (in stream order) when the call ends.
  struct DeviceScratch {
    void* p;
    cudaStream_t s;
    cudaError_t (*free_async)(void*, cudaStream_t);
    DeviceScratch(void* ptr, cudaStream_t stream, cudaError_t (*f)(void*, cudaStream_t)) : p(ptr), s(stream), free_async(f) {}
    DeviceScratch(const DeviceScratch&) = delete;
    DeviceScratch& operator=(const DeviceScratch&) = delete;
    ~DeviceScratch() { free_async(p, s); }
  };

  /// Starts a call: Error(aborted) when broken; an asynchronous error of an earlier operation
  /// gives up (Error(backend)); one still in progress is waited out (bounded).
  Call enter(const char* who) {
    sh_->failure.check(who);
    const Call call{who, detail::deadline_after(timeout_)};
    finish(call, async_state(call), "an earlier operation (ncclCommGetAsyncError)");
    return call;
  }
  /// ncclCommGetAsyncError's state (its own failure gives up).
  ncclResult_t async_state(const Call& call) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = calls_->async_error(comm_, &state);
    if (q != ncclSuccess) give_up(Errc::backend, std::string("ncclCommGetAsyncError failed in ") + call.who + ": " + ncclGetErrorString(q));
    return state;
  }
  /// Returns when r is ncclSuccess, or is ncclInProgress (a non-blocking communicator still
  /// enqueueing) and ncclCommGetAsyncError reports success before the deadline; gives up
  /// otherwise: Error(timeout) still in progress, Error(backend) an error.
  void finish(const Call& call, ncclResult_t r, const char* what) {
    r = detail::nccl_wait_in_progress(*calls_, comm_, r, call.deadline);
    if (r == ncclInProgress)
      give_up(Errc::timeout,
              std::string(call.who) + ": " + what + " still in progress after " + std::to_string(timeout_.count()) +
                  " ms (a peer did not enter the call, or died; NCCL does not say which)");
    if (r != ncclSuccess)
      give_up(Errc::backend, std::string(what) + " failed in " + call.who + ": " + ncclGetErrorString(r));
  }
  /// Waits (bounded) until stream() has finished its work, reading the asynchronous error every 16 polls.
  void drain(const Call& call) {
    unsigned n = 0;
    cudaError_t e = cudaSuccess;
    if (!detail::poll_until(call.deadline, [&] {
          e = calls_->stream_query(stream_);
          if (e != cudaErrorNotReady) return true;
          if (++n % 16 == 0) finish(call, async_state(call), "an NCCL operation on the stream (ncclCommGetAsyncError)");
          return false;
        }, detail::PollPace::relaxed))
      give_up(Errc::timeout,
              std::string(call.who) + ": the stream had not finished after " + std::to_string(timeout_.count()) +
                  " ms (an exchange whose peer did not enter it, or died; NCCL does not say which)");
    cuda(call, e, "the stream (cudaStreamQuery)");
  }
  /// A CUDA error gives up with Error(backend).
  void cuda(const Call& call, cudaError_t e, const char* what) {
    if (e != cudaSuccess)
      give_up(Errc::backend, std::string(what) + " failed in " + call.who + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
  }
  /// The posting both exchanges share: inside one ncclGroupStart / ncclGroupEnd, an ncclRecv for
  /// every recv_at(i), i < n_recv, then an ncclSend for every send_at(i), i < n_send, in index
  /// order (each a {peer, data, bytes}; zero bytes: skipped). The group is always closed before
  /// the first failure (ncclInProgress is not one) gives up.
  template <class RecvAt, class SendAt>
  void post_grouped(const Call& call, std::size_t n_recv, RecvAt&& recv_at, std::size_t n_send, SendAt&& send_at) {
    finish(call, calls_->group_start(), "ncclGroupStart");
    ncclResult_t first = ncclSuccess;
    const char* what = "";
    auto keep = [&](ncclResult_t r, const char* w) {
      if (first == ncclSuccess && r != ncclSuccess && r != ncclInProgress) first = r, what = w;
    };
    for (std::size_t i = 0; i < n_recv; ++i) {
      const auto& m = recv_at(i);
      if (m.bytes) keep(calls_->recv(m.data, m.bytes, ncclUint8, m.peer, comm_, stream_), "ncclRecv");
    }
    for (std::size_t i = 0; i < n_send; ++i) {
      const auto& m = send_at(i);
      if (m.bytes) keep(calls_->send(m.data, m.bytes, ncclUint8, m.peer, comm_, stream_), "ncclSend");
    }
    const ncclResult_t end = calls_->group_end();
    if (first != ncclSuccess) finish(call, first, what);
    finish(call, end, "ncclGroupEnd");
  }
 public:
  /// Breaks the group at once (the optional abort() of the communicator concept, what a call that
  /// fails on this rank alone does before it throws: comm/tell_peers.hpp): stops the communicator
  /// as a failed call does (ncclCommRevoke where the loaded NCCL has it, else ncclCommAbort), so
  /// that nothing of this rank stays enqueued, and breaks this NcclComm (its later calls throw
  /// Error(aborted) with `why`). NCCL carries no message to the peers: their pending operations end
  /// at their own deadline (a non-blocking communicator's ncclInProgress, a bounded stream wait) as
  /// Error(timeout), naming nobody (NCCL does not say who). Local; a no-op once broken.
  /// @param why what failed on this rank
  void abort(const std::string& why) {
    if (sh_->failure.broken()) return;
    calls_->stop(comm_);
    sh_->freed = calls_->stop_frees;
    sh_->failure.record(Errc::aborted, Error(Errc::aborted, "rank " + std::to_string(rank_) + " broke the group: " + why).what());
  }

 private:
  /// Abandons the call: reads ncclGetLastError, stops the communicator (ncclCommRevoke or
  /// ncclCommAbort), breaks this NcclComm and throws Error(code) saying what to do next.
  [[noreturn]] void give_up(Errc code, const std::string& message) {
    const char* last = calls_->last_error(comm_);
    const std::string detail = last && *last ? std::string(" (ncclGetLastError: ") + last + ")" : std::string();
    calls_->stop(comm_);  // its result is ignored: the communicator is given up either way
    sh_->freed = calls_->stop_frees;
    sh_->failure.fail(code, message + detail +
                                (calls_->stop_frees
                                     ? "; the NCCL communicator was aborted (ncclCommAbort): its handle is freed, do not destroy it"
                                     : "; the NCCL communicator was revoked (ncclCommRevoke): once ncclCommGetAsyncError no "
                                       "longer reports ncclInProgress, destroy it (ncclCommDestroy)") +
                                "; end the job, or rebuild the group without the failed ranks");
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  std::chrono::milliseconds timeout_;
  const detail::NcclCalls* calls_;
  std::shared_ptr<Shared> sh_;  // failure state, shared by copies
  int size_ = 0, rank_ = 0;
};

ULYSSES_NAMESPACE_END
