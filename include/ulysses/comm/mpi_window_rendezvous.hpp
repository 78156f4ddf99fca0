// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The MPI window's use of the one epoch barrier (comm/window_protocol.hpp) on the host:
///        its control blocks as the protocol's words (HostWords), the host's clock and pause,
///        the bounded waits of a with_peers() call, and the wait of a failed rank for its peers'
///        reads. The failure model: docs/design.md; the device window runs the same steps in its
///        kernels (comm/mpi_device_window.cuh).
#pragma once

#include <chrono>
#include <cstdint>
#include <thread>

#include "failure.hpp"
#include "mpi_window_arena.hpp"
#include "window_protocol.hpp"

ULYSSES_NAMESPACE_BEGIN
namespace detail {

/// The protocol's view of an MpiWindow: rank p's control block.
struct WindowCtrlAt {
  const MpiWindow* w;
  WindowControl& operator()(int p) const noexcept { return w->control(p); }
};

/// The host's clock for the protocol: steady nanoseconds.
struct HostEpochClock {
  std::uint64_t operator()() const noexcept {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
  }
};

/// The host's pause between polls (PollPace::relaxed: the peers are other processes, they
/// progress on their own): yields for the first millisecond, then sleeps 20 µs a poll.
struct HostEpochPause {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  void operator()() const {
    if (std::chrono::steady_clock::now() - start > std::chrono::milliseconds(1))
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    else
      std::this_thread::yield();
  }
};

/// The bounded wait of `w`'s group for epoch e (arrivals, or finished reads): epoch_wait over
/// the control blocks; the window compares its records after the arrival (MpiWindowComm).
inline EpochPoll window_wait(const MpiWindow& w, std::uint64_t e, bool arrival, std::chrono::milliseconds timeout) {
  return epoch_wait<HostWords>(WindowCtrlAt{&w}, w.size(), e, arrival, wait_ns(timeout), NoRecordCheck{}, HostEpochClock{}, HostEpochPause{});
}

/// After this rank failed in the call of epoch e: waits (bounded by `timeout`) until every peer
/// that arrived at e has finished reading (epoch_readers_done). Never throws.
inline void window_wait_for_readers(const MpiWindow& w, std::uint64_t e, std::chrono::milliseconds timeout) noexcept {
  poll_until(deadline_after(timeout), [&] { return epoch_readers_done<HostWords>(WindowCtrlAt{&w}, w.size(), e); }, PollPace::relaxed);
}

}  // namespace detail
ULYSSES_NAMESPACE_END
