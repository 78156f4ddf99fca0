// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The device window's run of the one epoch barrier (comm/window_protocol.hpp) in
///        one-thread kernels (MpiDeviceWindowComm, comm/mpi_device_window.cuh): its words as
///        system-scope atomics (cuda::atomic_ref of CCCL: they work across processes), the
///        records compared once every rank arrived (comm/device_window_records.hpp), each wait
///        bounded on the GPU's timer, its verdict written to the rank's status. The host tests
///        run the same functions with std::chrono and threads as ranks. The protocol: docs/gpu.md.
///        Needs nvcc.
///        Notes: docs/headers.md (comm/device_window_protocol.cuh).
#pragma once

#include <cuda/atomic>

#include <cstdint>

#include "../cuda/detail/config.cuh"
#include "device_window_records.hpp"
#include "window_protocol.hpp"

ULYSSES_CUDA_DETAIL_BEGIN

/// Acquire load of a process-shared word (system scope).
ULYSSES_HOST_DEVICE inline std::uint64_t dw_load(std::uint64_t& w) {
  return cuda::atomic_ref<std::uint64_t, cuda::thread_scope_system>(w).load(cuda::memory_order_acquire);
}
/// Release store of a process-shared word (system scope).
ULYSSES_HOST_DEVICE inline void dw_store(std::uint64_t& w, std::uint64_t v) {
  cuda::atomic_ref<std::uint64_t, cuda::thread_scope_system>(w).store(v, cuda::memory_order_release);
}
/// Sets w from 0 to v; false when it was not 0.
ULYSSES_HOST_DEVICE inline bool dw_claim(std::uint64_t& w, std::uint64_t v) {
  std::uint64_t zero = 0;
  return cuda::atomic_ref<std::uint64_t, cuda::thread_scope_system>(w).compare_exchange_strong(zero, v, cuda::memory_order_acq_rel);
}

/// The protocol's words on the device (and on the host for its tests): system-scope atomics.
struct DeviceWords {
  ULYSSES_HOST_DEVICE static std::uint64_t load(std::uint64_t& w) { return dw_load(w); }
  ULYSSES_HOST_DEVICE static void store(std::uint64_t& w, std::uint64_t v) { dw_store(w, v); }
  ULYSSES_HOST_DEVICE static bool claim(std::uint64_t& w, std::uint64_t v) { return dw_claim(w, v); }
  ULYSSES_HOST_DEVICE static void fence() { cuda::atomic_thread_fence(cuda::memory_order_seq_cst, cuda::thread_scope_system); }
};

/// The protocol's view of a device group: rank p's control block.
struct DeviceCtrlAt {
  const DeviceWindowGroup* g;
  ULYSSES_HOST_DEVICE DeviceWindowControl& operator()(int p) const { return *g->ctrl[p]; }
};
/// The device window's record check, once every rank arrived (dw_check_records).
struct DeviceRecordCheck {
  const DeviceWindowGroup* g;
  ULYSSES_HOST_DEVICE EpochPoll operator()() const { return dw_check_records(*g); }
};
/// A late-rank callback that does nothing (the device names them by the poll's mask).
struct IgnoreLate {
  ULYSSES_HOST_DEVICE void operator()(int) const {}
};

/// Step 1's first half: the owner publishes `rec` as its record of the next epoch, which it
/// returns. Single writer (the owner's stream).
ULYSSES_HOST_DEVICE inline std::uint64_t dw_arrive(DeviceWindowControl& mine, const DeviceWindowRecord& rec) {
  const std::uint64_t e = mine.epoch + 1;
  mine.epoch = e;
  mine.record = rec;
  epoch_publish<DeviceWords>(mine, e, true);  // the inputs and the record before the epoch
  return e;
}

/// One look at the group in the wait for epoch e (epoch_poll, with the records compared once
/// every rank arrived).
ULYSSES_HOST_DEVICE inline EpochPoll dw_poll(const DeviceWindowGroup& g, std::uint64_t e, bool arrival) {
  return epoch_poll<DeviceWords>(DeviceCtrlAt{&g}, g.size, e, arrival, DeviceRecordCheck{&g});
}

/// A bounded wait (epoch_wait over dw_poll's looks).
template <class Clock, class Pause>
ULYSSES_HOST_DEVICE EpochPoll dw_wait(const DeviceWindowGroup& g, std::uint64_t e, bool arrival, std::uint64_t timeout_ns, Clock now,
                                      Pause pause) {
  return epoch_wait<DeviceWords>(DeviceCtrlAt{&g}, g.size, e, arrival, timeout_ns, DeviceRecordCheck{&g}, now, pause);
}

/// Records a wait's verdict: the first failure goes to `st` (single writer: this rank's
/// stream); a failure of this rank's own (a timeout, a mismatch) also breaks the group (the
/// abort word), so that the peers stop waiting; a timeout first claims the late ranks' missed
/// words (epoch_mark_missed), so that the peers' `aborted` names them too.
ULYSSES_HOST_DEVICE inline void dw_report(const DeviceWindowGroup& g, DeviceWindowStatus& st, const EpochPoll& s, std::uint64_t e) {
  if (s.code == EpochCode::ok) return;
  const bool timed_out = s.code == EpochCode::timeout_arrive || s.code == EpochCode::timeout_done;
  if (timed_out) epoch_mark_missed<DeviceWords>(DeviceCtrlAt{&g}, g.size, e, s.code == EpochCode::timeout_arrive, IgnoreLate{});
  if (s.code != EpochCode::aborted) epoch_break<DeviceWords>(DeviceCtrlAt{&g}, g.rank);
  if (dw_load(st.code) != 0) return;
  st.peer = static_cast<std::uint64_t>(s.peer);
  st.epoch = e;
  st.field = s.field;
  st.not_arrived = timed_out ? (s.code == EpochCode::timeout_arrive ? s.late : 0) : s.not_arrived;
  st.not_done = timed_out ? (s.code == EpochCode::timeout_done ? s.late : 0) : s.not_done;
  st.missed_call = timed_out ? e : s.missed_call;
  dw_store(st.code, static_cast<std::uint64_t>(s.code));
}

/// Step 1 on one rank: arrive with `rec`, then wait for the others and report. A rank that
/// already failed publishes nothing (it makes sure the group is broken). Returns the epoch.
template <class Clock, class Pause>
ULYSSES_HOST_DEVICE std::uint64_t dw_arrive_and_wait(const DeviceWindowGroup& g, const DeviceWindowRecord& rec, std::uint64_t timeout_ns,
                                                     DeviceWindowStatus& st, Clock now, Pause pause) {
  if (dw_load(st.code) != 0) {
    epoch_break<DeviceWords>(DeviceCtrlAt{&g}, g.rank);
    return g.ctrl[g.rank]->epoch;
  }
  const std::uint64_t e = dw_arrive(*g.ctrl[g.rank], rec);
  dw_report(g, st, dw_wait(g, e, true, timeout_ns, now, pause), e);
  return e;
}

/// Step 3 on one rank: done with the current epoch, then wait until every rank is (bounded) and
/// report. Returns the epoch.
template <class Clock, class Pause>
ULYSSES_HOST_DEVICE std::uint64_t dw_done_and_wait(const DeviceWindowGroup& g, std::uint64_t timeout_ns, DeviceWindowStatus& st, Clock now,
                                                   Pause pause) {
  DeviceWindowControl& mine = *g.ctrl[g.rank];
  const std::uint64_t e = mine.epoch;
  epoch_publish<DeviceWords>(mine, e, false);  // the copies' reads before the epoch
  dw_report(g, st, dw_wait(g, e, false, timeout_ns, now, pause), e);
  return e;
}

#if defined(__CUDACC__)
/// The GPU's nanosecond timer.
__device__ inline std::uint64_t dw_globaltimer() {
  std::uint64_t t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
/// The kernels' clock and pause (a short sleep between polls).
struct DwDeviceClock {
  __device__ std::uint64_t operator()() const { return dw_globaltimer(); }
};
struct DwDevicePause {
  __device__ void operator()() const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    __nanosleep(256);
#endif
  }
};
/// Step 1 (one thread).
ULYSSES_KERNEL_ATTRIBUTES void dw_arrive_kernel(DeviceWindowGroup g, DeviceWindowRecord rec, std::uint64_t timeout_ns, DeviceWindowStatus* st) {
  dw_arrive_and_wait(g, rec, timeout_ns, *st, DwDeviceClock{}, DwDevicePause{});
}
/// Step 3 (one thread).
ULYSSES_KERNEL_ATTRIBUTES void dw_done_kernel(DeviceWindowGroup g, std::uint64_t timeout_ns, DeviceWindowStatus* st) {
  dw_done_and_wait(g, timeout_ns, *st, DwDeviceClock{}, DwDevicePause{});
}
/// Breaks the group (a rank that failed on the host before arriving): the peers stop waiting.
ULYSSES_KERNEL_ATTRIBUTES void dw_break_kernel(DeviceWindowControl* root, std::uint64_t who) { dw_claim(root->abort, who); }
#endif

ULYSSES_CUDA_DETAIL_END
