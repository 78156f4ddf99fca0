// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief MpiDeviceWindowComm: the peer copy between the MPI processes of one node on the GPU
///        (Path::direct across processes: one copy per element, no workspace, no wire, no host
///        synchronisation in the call, graph-capturable) over an MpiDeviceWindow
///        (comm/mpi_device_window_arena.cuh, CUDA IPC). with_peers() enqueues the staging
///        copies, the arrive kernel, the executor's copy and the done kernel: the one epoch
///        barrier (comm/window_protocol.hpp) run by comm/device_window_protocol.cuh. Usage and
///        failures: docs/gpu.md (One copy between processes: the device window), docs/design.md
///        (failure model). Needs nvcc, <mpi.h> (link ulysses::mpi and ulysses::cuda).
///        Notes: docs/headers.md (comm/mpi_device_window.cuh).
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../cuda/detail/config.cuh"
#include "../error.hpp"
#include "../layout/blocks.hpp"
#include "concepts.hpp"
#include "device_window_protocol.cuh"
#include "device_window_records.hpp"
#include "exchange_state.hpp"
#include "failure.hpp"
#include "mpi_comm.hpp"
#include "mpi_device_window_arena.cuh"
#include "peer_record.hpp"
#include "window.hpp"

ULYSSES_CUDA_NAMESPACE_BEGIN

/// The communicator concept (comm/concepts.hpp) over an MpiComm and an MpiDeviceWindow of the
/// same group, on a stream: with_peers() is the peer copy across processes on the GPU
/// (docs/gpu.md). Non-owning (the MpiComm, the window and the stream must outlive it); not
/// copyable. Holds 56 bytes of mapped pinned host memory (its status).
class MpiDeviceWindowComm {
 public:
  /// Buffers are device memory.
  static constexpr bool device_memory = true;

  /// Wraps `comm`, `window` and `stream`. Local (no communication); allocates the status
  /// (cudaHostAlloc, mapped).
  /// @param comm    the MpiComm of the group (allgather and the forced message paths go through it)
  /// @param window  an MpiDeviceWindow allocated over the same group
  /// @param stream  the stream every call is enqueued on (the executor's), of the window's device
  /// @param timeout bound of each device wait (and of the host waits of synchronize() and alltoallv())
  /// @throws Error(comm_mismatch) the window is not over comm's group; Error(backend) loading the protocol
  ///         kernels (cudaFuncGetAttributes, against lazy loading) or cudaHostAlloc failed.
  MpiDeviceWindowComm(MpiComm& comm, MpiDeviceWindow& window, cudaStream_t stream, std::chrono::milliseconds timeout = kDefaultCommTimeout)
      : comm_(&comm), win_(&window), stream_(stream), timeout_(timeout) {
    int cmp = MPI_UNEQUAL;
    MPI_Comm_compare(comm.get(), window.node_comm(), &cmp);
    if (comm.size() != window.size() || comm.rank() != window.rank() || (cmp != MPI_IDENT && cmp != MPI_CONGRUENT))
      detail::fail(Errc::comm_mismatch, "MpiDeviceWindowComm: the window was allocated over another group than the MpiComm's");
    // Lazy loading (the default since CUDA 12.2) loads a kernel at its first launch, which may
    // synchronise the context: behind a spinning dw_arrive_kernel (or, for dw_break_kernel, on the
    // error path, while a peer never comes) that would wait out the device timeout. Load them now.
    cudaFuncAttributes a{};
    detail::cuda_check(cudaFuncGetAttributes(&a, detail::dw_arrive_kernel), "cudaFuncGetAttributes (dw_arrive_kernel)");
    detail::cuda_check(cudaFuncGetAttributes(&a, detail::dw_done_kernel), "cudaFuncGetAttributes (dw_done_kernel)");
    detail::cuda_check(cudaFuncGetAttributes(&a, detail::dw_break_kernel), "cudaFuncGetAttributes (dw_break_kernel)");
    detail::cuda_check(cudaHostAlloc(reinterpret_cast<void**>(&status_), sizeof(detail::DeviceWindowStatus), cudaHostAllocMapped | cudaHostAllocPortable),
                       "cudaHostAlloc (MpiDeviceWindowComm status)");
    *status_ = detail::DeviceWindowStatus{};
    const cudaError_t e = cudaHostGetDevicePointer(reinterpret_cast<void**>(&status_dev_), status_, 0);
    if (e != cudaSuccess) {
      cudaFreeHost(status_);
      detail::cuda_check(e, "cudaHostGetDevicePointer (MpiDeviceWindowComm status)");
    }
    group_.size = size();
    group_.rank = rank();
    for (int p = 0; p < size(); ++p) {
      group_.ctrl[p] = detail::DeviceWindowAccess<>::control(window, p);
      slots_.push_back(window.at(p));
    }
  }
  MpiDeviceWindowComm(const MpiDeviceWindowComm&) = delete;
  MpiDeviceWindowComm& operator=(const MpiDeviceWindowComm&) = delete;
  /// Waits for the stream (errors ignored) and frees the status. When broken() (this rank or a
  /// peer failed, or the MpiComm broke), marks the window broken (MpiDeviceWindow::mark_broken()),
  /// so that its destructor makes no collective call.
  ~MpiDeviceWindowComm() {
    cudaStreamSynchronize(stream_);
    if (broken()) win_->mark_broken();
    cudaFreeHost(status_);
  }

  int size() const noexcept { return comm_->size(); }  ///< P
  int rank() const noexcept { return comm_->rank(); }  ///< this rank
  cudaStream_t stream() const noexcept { return stream_; }  ///< the stream calls are enqueued on
  MpiComm& mpi() const noexcept { return *comm_; }          ///< the wrapped MpiComm
  MpiDeviceWindow& window() const noexcept { return *win_; }  ///< the window
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }  ///< the wait bound
  /// Sets the wait bound of the calls enqueued from now on. Local.
  void set_timeout(std::chrono::milliseconds timeout) noexcept { timeout_ = timeout; }
  /// Bytes of inputs the last with_peers() staged into the window (0 when all were in it).
  std::size_t staged_bytes() const noexcept { return staged_; }
  /// True once a call failed or a device wait reported a failure (what check() throws).
  bool broken() const noexcept { return failure_.broken() || detail::dw_load(status_->code) != 0 || comm_->broken(); }

  /// Throws the error a device wait reported (without waiting for the stream): Error(timeout),
  /// Error(aborted) or Error(plan_mismatch) (docs/gpu.md: Failures); returns when none did.
  /// @throws as said; Error(aborted) after an earlier failure.
  void check() { require_alive("check"); }

  /// Waits for the stream, at most timeout() plus the device waits' own bound (polling
  /// cudaStreamQuery), then check(). @throws Error(timeout) the stream did not drain; as check();
  /// Error(backend) a CUDA error.
  void synchronize() {
    require_alive("synchronize");
    drain("synchronize");
    require_alive("synchronize");
  }

  /// All-to-all-v of device memory through host memory and the MpiComm: a bounded stream wait,
  /// device-to-host copy, MPI's all-to-all-v, host-to-device copy (any MPI, CUDA-aware or not).
  /// Collective. @throws Error(aborted) when broken; Error(timeout) the stream did not drain;
  /// Error(backend); the MpiComm's errors.
  void alltoallv(const std::byte* send, const std::size_t* send_bytes, const std::size_t* send_offsets, std::byte* recv,
                 const std::size_t* recv_bytes, const std::size_t* recv_offsets) {
    require_alive("alltoallv");
    std::size_t ns = 0, nr = 0;
    for (int p = 0; p < size(); ++p) {
      ns = std::max(ns, send_offsets[p] + send_bytes[p]);
      nr = std::max(nr, recv_offsets[p] + recv_bytes[p]);
    }
    host_send_.resize(ns);
    host_recv_.resize(nr);
    drain("alltoallv");  // the pack is complete
    guarded([&] {
      if (ns) detail::cuda_check(cudaMemcpy(host_send_.data(), send, ns, cudaMemcpyDeviceToHost), "cudaMemcpy (MpiDeviceWindowComm::alltoallv)");
      comm_->alltoallv(host_send_.data(), send_bytes, send_offsets, host_recv_.data(), recv_bytes, recv_offsets);
      for (int p = 0; p < size(); ++p)
        if (recv_bytes[p])
          detail::cuda_check(cudaMemcpy(recv + recv_offsets[p], host_recv_.data() + recv_offsets[p], recv_bytes[p], cudaMemcpyHostToDevice),
                             "cudaMemcpy (MpiDeviceWindowComm::alltoallv)");
    });
  }
  /// MpiComm::allgather() (host memory). @throws Error(aborted) when broken; as MpiComm::allgather().
  void allgather(const void* send, std::size_t bytes, void* recv) {
    require_alive("allgather");
    comm_->allgather(send, bytes, recv);
  }

  /// The peer copy's step across processes on the GPU (the optional with_peers() of the
  /// communicator concept), enqueued on stream(): staging copies, the arrive kernel, work(ctx,
  /// all) (all[p]: rank p's inputs in this process's mapping, at this rank's offsets), the done
  /// kernel. Returns once everything is enqueued; no host synchronisation.
  /// @pre `mine` points to a PeerRecord of device memory.
  /// @throws Error(buffer_too_small) on this rank: an input outside the window does not fit its
  ///         share of the free bytes, or starts in the slot outside its registrations (the peers
  ///         get Error(aborted) from their next call or synchronize()); what an earlier call's
  ///         device waits reported (check()); Error(backend) a launch failed; what `work`
  ///         throws. After any error the communicator is broken.
  void with_peers(const void* mine, void (*work)(void* ctx, const void* const* all), void* ctx) {
    require_alive("with_peers");
    const auto& in = *static_cast<const PeerRecord*>(mine);
    const int P = size();
    guarded([&] {
      const std::string err = detail::device_window_record(detail::DeviceWindowAccess<>::registry(*win_), win_->at(rank()), in,
                                                           MpiDeviceWindow::kAlignment, rank(), record_, stage_);
      if (!err.empty()) detail::fail(Errc::buffer_too_small, err);
      staged_ = 0;
      for (const detail::DeviceStageCopy& c : stage_) {
        detail::cuda_check(cudaMemcpyAsync(win_->at(rank()) + c.offset, c.src, c.bytes, cudaMemcpyDeviceToDevice, stream_),
                           "cudaMemcpyAsync (MpiDeviceWindowComm staging)");
        staged_ += c.bytes;
      }
      group_.check_layouts = in.peer_layouts ? 1 : 0;
      for (int p = 0; p < P; ++p) group_.expect_layouts[p] = in.peer_layouts ? in.peer_layouts[p] : 0;
      detail::check_pending(cudaPeekAtLastError(), "MpiDeviceWindowComm arrive kernel");
      detail::dw_arrive_kernel<<<1, 1, 0, stream_>>>(group_, record_, timeout_ns(), status_dev_);
      detail::check_launch("MpiDeviceWindowComm arrive kernel");
      views_.resize(static_cast<std::size_t>(P));
      all_.resize(static_cast<std::size_t>(P));
      detail::device_window_views(record_, in, slots_.data(), P, views_.data());
      for (int p = 0; p < P; ++p) all_[static_cast<std::size_t>(p)] = &views_[static_cast<std::size_t>(p)];
      work(ctx, all_.data());
      detail::check_pending(cudaPeekAtLastError(), "MpiDeviceWindowComm done kernel");
      detail::dw_done_kernel<<<1, 1, 0, stream_>>>(group_, timeout_ns(), status_dev_);
      detail::check_launch("MpiDeviceWindowComm done kernel");
    });
  }

  /// What the transports learn on this communicator about the plans run on it, and their scratch
  /// lists (comm/exchange_state.hpp).
  ExchangeState& exchange_state() noexcept { return state_; }

  /// Breaks the group at once (the optional abort() of the communicator concept, what a call that
  /// fails on this rank alone does before it throws: comm/tell_peers.hpp): the abort word in
  /// rank 0's segment, set in stream order (the peers' device waits end with Error(aborted) naming
  /// this rank; the reason text stays on this rank: device memory carries no message), and the
  /// host-shared broken word, so that no rank's ~MpiDeviceWindow waits for its peers. Local.
  /// @param why what failed on this rank (this rank's later calls throw Error(aborted) with it)
  void abort(const std::string& why) {
    if (failure_.broken()) return;
    break_group(Errc::aborted, why);
  }

 private:
  std::uint64_t timeout_ns() const noexcept { return detail::wait_ns(timeout_); }

  /// Throws Error(aborted) after an earlier failure of this rank, or the error a device wait
  /// reported (recorded as this rank's failure first).
  void require_alive(const char* what) {
    const std::string where = "rank " + std::to_string(rank()) + ": MpiDeviceWindowComm::" + what;
    failure_.check(where.c_str());
    if (detail::dw_load(status_->code) == 0) return;
    detail::DeviceWindowStatus st{};
    st.peer = status_->peer, st.epoch = status_->epoch, st.field = status_->field, st.code = status_->code;
    st.not_arrived = status_->not_arrived, st.not_done = status_->not_done, st.missed_call = status_->missed_call;
    Errc code = Errc::aborted;
    const std::string m = detail::device_window_failure(st, rank(), static_cast<long long>(timeout_.count()), code);
    failure_.fail(code, m);
  }
  /// Runs f; on an error breaks the group (the abort word, in stream order: the peers' waits end)
  /// and records it as this rank's failure before rethrowing.
  template <class F>
  void guarded(F&& f) {
    try {
      f();
    } catch (const Error& x) {
      break_group(x.code(), x.what());
      throw;
    } catch (const std::exception& x) {
      break_group(Errc::aborted, x.what());
      throw;
    }
  }
  void break_group(Errc code, const std::string& what) noexcept {
    detail::dw_break_kernel<<<1, 1, 0, stream_>>>(group_.ctrl[0], static_cast<std::uint64_t>(rank()) + 1);
    win_->mark_broken();
    try {
      failure_.record(code, what);
    } catch (...) {
    }
  }
  /// Waits (bounded) for the stream.
  void drain(const char* what) {
    const auto deadline = detail::deadline_after(detail::scaled_wait(timeout_, 2));
    cudaError_t e = cudaSuccess;
    const bool ok = detail::poll_until(deadline, [&] {
      e = cudaStreamQuery(stream_);
      return e != cudaErrorNotReady;
    }, detail::PollPace::relaxed);
    if (!ok) {
      const std::string m = "rank " + std::to_string(rank()) + ": MpiDeviceWindowComm::" + what + ": the stream did not drain within " +
                            std::to_string(detail::scaled_wait(timeout_, 2).count()) + " ms (a kernel before the exchange is stuck)";
      break_group(Errc::timeout, m);
      throw Error(Errc::timeout, m);
    }
    if (e != cudaSuccess) {
      const std::string m = detail::cuda_error(e, "cudaStreamQuery (MpiDeviceWindowComm)");
      break_group(Errc::backend, m);
      throw Error(Errc::backend, m);
    }
  }

  MpiComm* comm_;
  MpiDeviceWindow* win_;
  cudaStream_t stream_;
  std::chrono::milliseconds timeout_;
  detail::DeviceWindowStatus* status_ = nullptr;      // mapped pinned host memory, written by this rank's kernels
  detail::DeviceWindowStatus* status_dev_ = nullptr;  // its device address
  detail::DeviceWindowGroup group_{};
  detail::DeviceWindowRecord record_;
  std::vector<detail::DeviceStageCopy> stage_;
  std::vector<std::byte*> slots_;  // every rank's slot in this process
  detail::CommFailure failure_;
  std::size_t staged_ = 0;
  std::vector<PeerRecord> views_;
  std::vector<const void*> all_;
  std::vector<std::byte> host_send_, host_recv_;  // alltoallv's staging
  ExchangeState state_;
};

ULYSSES_CUDA_NAMESPACE_END
