// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief DeviceLocalGroup: P ranks as threads of one process over device memory (P virtual
///        ranks on one GPU), exchanging with cudaMemcpyAsync device-to-device on each rank's stream.
///
/// LocalGroup's protocol, barriers, timeouts and aborts (comm/local.hpp) with a stream-ordered
/// copy: events order each rank's pack before its peers' reads, and their reads before its next
/// pack. The direct path needs peer access between the ranks' devices. Not capturable across
/// ranks. The steps, the failure model and the events' lifetime: docs/headers.md,
/// "comm/local_device.cuh". Needs the CUDA runtime (link ulysses::cuda), no kernels.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "../cuda/detail/config.cuh"
#include "../error.hpp"
#include "exchange_state.hpp"
#include "failure.hpp"
#include "local.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {

/// The peer devices `mine` must enable access to for the direct path over ranks on `devices`
/// (rank p's device), or the reason it cannot: every other device of the list, once, in order;
/// `can_access(mine, peer)` answers cudaDeviceCanAccessPeer. Sets `error` ("" when all can).
/// @param can_access callable as bool(int device, int peer_device)
template <class CanAccess>
std::vector<int> peer_devices_to_enable(int mine, const std::vector<int>& devices, CanAccess&& can_access, std::string& error) {
  std::vector<int> out;
  error.clear();
  for (std::size_t p = 0; p < devices.size(); ++p) {
    const int d = devices[p];
    if (d == mine || std::find(out.begin(), out.end(), d) != out.end()) continue;
    if (!can_access(mine, d)) {
      error = "DeviceLocalGroup: the direct path reads rank " + std::to_string(p) + "'s memory on device " + std::to_string(d) +
              " from device " + std::to_string(mine) + ", which has no peer access to it (cudaDeviceCanAccessPeer = 0): force the "
              "message path (PlanOptions::path = Path::messages), whose cudaMemcpyAsync stages copies between devices";
      return {};
    }
    out.push_back(d);
  }
  return out;
}

}  // namespace detail

/// An in-process group of `size` ranks whose buffers are device memory; each rank is a thread
/// with its own stream (the caller's). A group serves one collective at a time.
class DeviceLocalGroup {
 public:
  /// @param size    P >= 1 ranks
  /// @param timeout host wait in a collective before Error(timeout) (LocalGroup's)
  /// @throws Error(invalid_group) size < 1; Error(backend) when cudaGetDevice fails.
  /// The device current on the constructing thread becomes current on spawn()'s threads.
  explicit DeviceLocalGroup(int size, std::chrono::milliseconds timeout = kDefaultCommTimeout)
      : host_(size, timeout), events_(static_cast<std::size_t>(size)), devices_(static_cast<std::size_t>(size > 0 ? size : 0), -1) {
    detail::cuda_check(cudaGetDevice(&device_), "cudaGetDevice");
  }
  DeviceLocalGroup(const DeviceLocalGroup&) = delete;
  DeviceLocalGroup& operator=(const DeviceLocalGroup&) = delete;
  /// Destroys the ranks' events (work already enqueued still completes; errors are ignored).
  /// @pre no rank is in a collective of the group.
  ~DeviceLocalGroup() {
    for (Events& e : events_) {
      if (e.sent) cudaEventDestroy(e.sent);
      if (e.read) cudaEventDestroy(e.read);
    }
  }

  int size() const { return host_.size(); }  ///< P
  int device() const { return device_; }     ///< device made current on spawn()'s threads

  /// The communicator of one rank: refers to the group (which must outlive it), to the rank's two
  /// CUDA events (owned by the group) and to the rank's stream. Models the communicator concept
  /// (comm/concepts.hpp) (device memory; allgather() of host memory for check_agreement()).
  class Comm {
   public:
    /// Buffers of alltoallv() are device memory.
    static constexpr bool device_memory = true;

    int size() const { return host_.size(); }  ///< P
    int rank() const { return host_.rank(); }   ///< this rank
    cudaStream_t stream() const { return stream_; }  ///< the stream the exchange is ordered on

    /// All-to-all-v of device memory in bytes (see the communicator concept in
    /// comm/concepts.hpp and the protocol in docs/headers.md, "comm/local_device.cuh"). Returns once the copies are
    /// enqueued on stream(); they are complete in stream order.
    /// @throws Error(plan_mismatch) a peer sends a different byte count than this rank expects;
    ///         Error(timeout) / Error(aborted) as LocalGroup; Error(backend) a CUDA call failed
    ///         (the group is then aborted, so peers do not wait forever).
    void alltoallv(const std::byte* send, const std::size_t* send_bytes, const std::size_t* send_offsets, std::byte* recv,
                   const std::size_t* recv_bytes, const std::size_t* recv_offsets) {
      ordered([&](auto&& copy, auto&& done) {
        host_.alltoallv_with(send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets, copy, done);
      });
    }

    /// Message-level exchange of device memory (the optional member of the communicator
    /// concept, transport.hpp: Path::messages): the protocol of alltoallv() with a
    /// cudaMemcpyAsync per message received, from the sender's memory into this rank's (the k-th
    /// message rank i sends rank j is the k-th one j receives from i). Returns once the copies are
    /// enqueued on stream(). @throws as alltoallv() (plan_mismatch for messages that do not pair).
    void exchange_messages(const Message* send, std::size_t n_send, const Message* recv, std::size_t n_recv) {
      ordered([&](auto&& copy, auto&& done) { host_.exchange_messages_with(send, n_send, recv, n_recv, copy, done); });
    }

    /// The direct path's step (the optional with_peers() of the communicator concept,
    /// transport.hpp) in stream order: records `sent` on stream(), publishes `mine`, and once every
    /// rank has (host barrier) makes stream() wait for every peer's `sent`, calls work(ctx, all)
    /// (which enqueues the copies reading the peers' inputs), records `read`; after the closing
    /// barrier, stream() waits for every peer's `read`, so that nothing this rank enqueues later
    /// (the next write of its input) can run before its peers have read it. Returns once
    /// everything is enqueued. @throws as alltoallv().
    void with_peers(const void* mine, void (*work)(void* ctx, const void* const* all), void* ctx) {
      ordered([&](auto&& copy, auto&& done) {
        struct Step {
          decltype(copy)& wait_for;  // (only its stream wait: copy(p, nullptr, nullptr, 0))
          decltype(done)& finish;
          int rank, size;
          void (*work)(void*, const void* const*);
          void* ctx;
          Comm* comm;
          static void run(void* self, const void* const* all) {
            auto& s = *static_cast<Step*>(self);
            s.comm->enable_peers();  // after the barrier: every rank's device is published
            for (int p = 0; p < s.size; ++p)
              if (p != s.rank) s.wait_for(p, nullptr, nullptr, 0);
            s.work(s.ctx, all);
            s.finish();
          }
        } step{copy, done, rank(), size(), work, ctx, this};
        host_.with_peers(mine, &Step::run, &step);
      });
    }

    /// All-gather of `bytes` bytes of HOST memory from every rank (rank p's block lands at
    /// recv + p*bytes), on the host, with no device ordering: what check_agreement() uses to
    /// compare the ranks' plan fingerprints. @throws Error(timeout), Error(aborted).
    void allgather(const void* send, std::size_t bytes, void* recv) { host_.allgather(send, bytes, recv); }

    /// Host barrier of the group (no device ordering). @throws Error(timeout), Error(aborted).
    void barrier() { host_.barrier(); }

    /// What the transports learn on this communicator about the plans run on it, and their
    /// scratch lists (comm/exchange_state.hpp): the host group's handle's, so that the library
    /// call in progress (ExchangeState::call()) is what the host rendezvous compares across ranks.
    ExchangeState& exchange_state() noexcept { return host_.exchange_state(); }

   private:
    friend class DeviceLocalGroup;
    struct Events {
      cudaEvent_t sent = nullptr, read = nullptr;
    };
    /// The stream ordering of an exchange (see docs/headers.md, "comm/local_device.cuh"): record `sent`, run the host
    /// protocol `exchange(copy, done)` of LocalGroup with a copy that waits for the sender's `sent`
    /// and enqueues cudaMemcpyAsync, and a `done` that records `read`; after the closing barrier,
    /// wait for every peer's `read`.
    template <class Exchange>
    void ordered(Exchange&& exchange) {
      try {
        detail::cuda_check(cudaEventRecord(ev_.sent, stream_), "cudaEventRecord");
      } catch (const Error& e) {
        g_->host_.abort("rank " + std::to_string(rank()) + ": " + e.what());
        throw;
      }
      const std::vector<Events>& ev = g_->events_;
      exchange(
          [&](int p, std::byte* dst, const std::byte* src, std::size_t n) {
            if (p != rank()) detail::cuda_check(cudaStreamWaitEvent(stream_, ev[static_cast<std::size_t>(p)].sent, 0), "cudaStreamWaitEvent");
            if (n) detail::cuda_check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
          },
          [&] { detail::cuda_check(cudaEventRecord(ev_.read, stream_), "cudaEventRecord"); });
      // After the closing barrier every peer has recorded `read`; events are only re-recorded
      // after the next call's first barrier, which this rank has not reached yet.
      for (int p = 0; p < size(); ++p)
        if (p != rank()) detail::cuda_check(cudaStreamWaitEvent(stream_, ev[static_cast<std::size_t>(p)].read, 0), "cudaStreamWaitEvent");
    }
    /// The direct path's peer access (docs/headers.md, "comm/local_device.cuh"), once per communicator: enables access to
    /// every other device of the group's ranks. @throws Error(path_unsupported) a device pair
    /// without peer access; Error(backend) cudaDeviceEnablePeerAccess failed.
    void enable_peers() {
      if (peers_enabled_) return;
      const int mine = g_->devices_[static_cast<std::size_t>(rank())];
      std::string err;
      const std::vector<int> peers = detail::peer_devices_to_enable(mine, g_->devices_, [](int d, int peer) {
        int can = 0;
        return cudaDeviceCanAccessPeer(&can, d, peer) == cudaSuccess && can != 0;
      }, err);
      if (!err.empty()) throw Error(Errc::path_unsupported, err);
      for (int d : peers) {
        const cudaError_t e = cudaDeviceEnablePeerAccess(d, 0);  // for the current device (this rank's)
        if (e == cudaErrorPeerAccessAlreadyEnabled) {
          cudaGetLastError();  // not an error: another rank of this device enabled it; clear it
          continue;
        }
        detail::cuda_check(e, "cudaDeviceEnablePeerAccess (DeviceLocalGroup, direct path)");
      }
      peers_enabled_ = true;
    }
    Comm(DeviceLocalGroup* g, LocalGroup::Comm host, cudaStream_t s) : g_(g), host_(host), stream_(s) {
      detail::cuda_check(cudaGetDevice(&g_->devices_[static_cast<std::size_t>(rank())]), "cudaGetDevice");
      Events& mine = g_->events_[static_cast<std::size_t>(rank())];
      if (!mine.sent) detail::cuda_check(cudaEventCreateWithFlags(&mine.sent, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      if (!mine.read) detail::cuda_check(cudaEventCreateWithFlags(&mine.read, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      ev_ = mine;
    }
    DeviceLocalGroup* g_;
    LocalGroup::Comm host_;
    cudaStream_t stream_;
    Events ev_;
    bool peers_enabled_ = false;
  };

  /// Makes the communicator of `rank` on `stream` (the rank's first call creates its two events on
  /// the current device; later calls reuse them). Call it on the rank's thread before the rank's
  /// first collective.
  /// @throws Error(invalid_group) rank outside [0, size); Error(backend) event creation failed.
  Comm comm(int rank, cudaStream_t stream) { return Comm(this, host_.comm(rank), stream); }

  /// Spawns the ranks: runs fn(Comm&) on size() threads, one per rank, with the group's device
  /// current and rank r's communicator on `streams[r]`, and joins them. Errors: as
  /// LocalGroup::spawn (a rank that throws aborts the others; the root cause is rethrown here).
  /// @param streams size() streams of the group's device (not owned)
  /// @param fn      callable as fn(Comm&), run once per rank on the rank's thread
  /// @throws what fn throws; Error(backend) when cudaSetDevice or the events' creation fails.
  template <class F>
  void spawn(const cudaStream_t* streams, F&& fn) {
    host_.spawn([&](LocalGroup::Comm& c) {
      detail::cuda_check(cudaSetDevice(device_), "cudaSetDevice");
      Comm dc(this, c, streams[c.rank()]);  // registers its events before its first collective
      fn(dc);
    });
  }

  /// Marks the group failed (LocalGroup::abort).
  /// @param why what failed, for the peers' messages
  void abort(const std::string& why = "DeviceLocalGroup::abort() was called") { host_.abort(why); }

 private:
  using Events = Comm::Events;
  LocalGroup host_;
  std::vector<Events> events_;  // per rank, created by its first comm(); read by peers after a barrier; freed by ~DeviceLocalGroup
  std::vector<int> devices_;    // per rank, its device (current at its comm()); read by peers after a barrier
  int device_ = 0;
};

ULYSSES_NAMESPACE_END
