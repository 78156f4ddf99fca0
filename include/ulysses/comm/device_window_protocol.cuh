// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The synchronisation of the device window (MpiDeviceWindowComm,
///        comm/mpi_device_window.cuh): stream-ordered epochs and records in device memory,
///        written and waited on by one-thread kernels, every spin bounded by a device-side
///        deadline; and the host-side list logic (what a call publishes, where inputs outside the
///        window are staged, the peers' inputs in this process's mapping).
///
/// Every rank's window segment starts with a DeviceWindowControl. One with_peers() call of
/// epoch e (the owner's call count, kept in device memory so that a replayed CUDA graph counts
/// on) on rank r's stream:
///  1. the arrive kernel: e = ++epoch; writes the record (inputs' offsets in the slot, count,
///     layouts hash, registrations digest); system fence; arrive = e (release);
///     then waits until every rank's arrive >= e, and compares their records with rank 0's:
///     another count, other registrations or another offset of an input give record_mismatch,
///     a layouts hash other than this rank's lists expect layouts_mismatch (the same verdict on
///     every rank: they read the same records);
///  2. the copy kernel (the executor's) reads the peers' inputs;
///  3. the done kernel: done = e (release), then waits until every rank's done >= e, so that
///     nothing this rank enqueues later (the next write of its inputs) runs before its peers
///     have read them.
/// A wait that passes its deadline (%globaltimer on the device) sets this rank's status
/// (timeout, naming every late rank: a mask, the group has at most 64 ranks), ors the late ranks
/// into the group's masks and then sets the group's abort word (both in rank 0's control block);
/// every other rank's waits then end at once with `aborted`, naming the rank that broke the group
/// and the late ranks of its masks (the arrival wait looks at the
/// abort word only while a rank is missing, so a mismatch found by all is reported alike; a
/// mismatch breaks the group too, and a rank that failed publishes nothing more). The
/// status lives in mapped pinned host memory: the host reads it without synchronising and
/// throws the coded error at the next call, or in synchronize(). A status once set stays: the
/// communicator is broken. On an error the outputs of that call are unspecified (the copies
/// read what the peers' memory held); never memory outside the peers' slots (the offsets are
/// checked on the host to lie in the own slot, and every slot has the same size).
///
/// The protocol is written once, as __host__ __device__ functions over a clock and a pause: the
/// kernels call them with the GPU's timer, the host tests with std::chrono and threads as ranks.
/// Needs nvcc (cuda::atomic_ref of CCCL: system-scope atomics, which work across processes).
#pragma once

#include <cuda/atomic>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../cuda/detail/config.cuh"
#include "../detail/limits.hpp"
#include "../error.hpp"
#include "../layout/blocks.hpp"
#include "concepts.hpp"
#include "window.hpp"

ULYSSES_NAMESPACE_BEGIN
namespace detail {

/// Most ranks of a device window's group (the kernels take the peers' control blocks as a
/// parameter).
inline constexpr int kMaxDeviceWindowRanks = kMaxTableRanks;  // the one limit (detail/limits.hpp)
static_assert(kMaxDeviceWindowRanks <= 64, "the late ranks are a 64-bit mask (DeviceWindowControl::not_arrived)");

/// What a rank publishes for one call; its peers compare it with their own before reading.
struct DeviceWindowRecord {
  static constexpr std::uint64_t kNone = ~std::uint64_t{0};  ///< offset of an empty input
  std::uint64_t count = 0;    ///< inputs (PeerInputs::count)
  std::uint64_t layouts = 0;  ///< the publishing rank's layouts hash (PeerInputs::layouts)
  std::uint64_t reg_count = 0, reg_total = 0, reg_hash = 0;  ///< its registrations (WindowDigest)
  std::uint64_t offset[kMaxTensors] = {};  ///< input t at this offset of every rank's slot, or kNone
};

/// One rank's control block at the start of its device window segment (device memory, zeroed
/// at allocation). The words are system-scope atomics; the record is plain memory written before
/// `arrive` and read after it.
struct DeviceWindowControl {
  alignas(64) std::uint64_t epoch;   ///< the owner's calls so far (only its stream writes it)
  alignas(64) std::uint64_t arrive;  ///< epoch of the last record it published
  alignas(64) std::uint64_t done;    ///< epoch of the last call whose reads it finished
  alignas(64) std::uint64_t abort;   ///< rank 0's only: 0, or 1 + the rank that broke the group
  alignas(64) std::uint64_t missed_call;  ///< rank 0's only: 0, or the call of the first wait that timed out (claimed before the masks)
  std::uint64_t not_arrived;  ///< rank 0's only: bit p: a rank whose deadline passed found rank p not arrived (or'd in before `abort`)
  std::uint64_t not_done;     ///< rank 0's only: bit p: ... found rank p not done reading
  alignas(64) DeviceWindowRecord record;  ///< the last call's record
};

/// What a wait found.
enum class DeviceWaitCode : std::uint64_t {
  ok = 0,           ///< every rank reached the epoch (and, on arrival, the records agree)
  timeout_arrive,   ///< the deadline passed while `peer` had not arrived
  timeout_done,     ///< the deadline passed while `peer` had not finished reading
  aborted,          ///< rank `peer` broke the group
  record_mismatch,  ///< rank `peer`'s record differs from this rank's (`field`: 0 count, 1 registrations, 2 + t offset of input t)
  layouts_mismatch  ///< rank `peer` published other layouts than this rank's lists were built from
};

/// This rank's first failure, written by its kernels into mapped pinned host memory (the host
/// reads `code` first).
struct DeviceWindowStatus {
  std::uint64_t code;   ///< a DeviceWaitCode; 0 while healthy
  std::uint64_t peer;   ///< the rank it names (timeouts: the first late one; aborted: the one that broke the group)
  std::uint64_t epoch;  ///< the call (1 = the first)
  std::uint64_t field;  ///< for record_mismatch: which field
  std::uint64_t not_arrived;  ///< timeouts and aborted: bit p, rank p had not arrived (as this rank, or the group's masks, saw it)
  std::uint64_t not_done;     ///< the same for the ranks that had not finished reading
  std::uint64_t missed_call;  ///< aborted: the call in which those ranks were missing (0: no rank's deadline passed)
};

/// The group as the kernels see it: every rank's control block in this process's mapping, and
/// the layouts hash this rank's lists expect of each rank.
struct DeviceWindowGroup {
  DeviceWindowControl* ctrl[kMaxDeviceWindowRanks];  ///< rank p's control block
  std::uint64_t expect_layouts[kMaxDeviceWindowRanks];  ///< what rank p must publish as layouts (when check_layouts)
  int size;            ///< P
  int rank;            ///< this rank
  int check_layouts;   ///< 1: compare the peers' layouts hashes with expect_layouts
};

/// One look of a wait: its code and, unless finished, who is still missing.
struct DevicePoll {
  DeviceWaitCode code = DeviceWaitCode::ok;  ///< the verdict (ok while waiting)
  int peer = -1;                             ///< the rank it names (the first late one while waiting)
  std::uint64_t field = 0;                   ///< record_mismatch's field
  std::uint64_t late = 0;                    ///< while waiting: bit p, rank p has not reached the epoch
  std::uint64_t not_arrived = 0, not_done = 0, missed_call = 0;  ///< aborted: the group's masks and their call (rank 0's control block)
  bool finished = false;                     ///< the wait is over
};

}  // namespace detail
ULYSSES_NAMESPACE_END

ULYSSES_CUDA_DETAIL_BEGIN

/// Acquire load of a process-shared word (system scope).
ULYSSES_HOST_DEVICE inline std::uint64_t dw_load(std::uint64_t& w) {
  return cuda::atomic_ref<std::uint64_t, cuda::thread_scope_system>(w).load(cuda::memory_order_acquire);
}
/// Release store of a process-shared word (system scope).
ULYSSES_HOST_DEVICE inline void dw_store(std::uint64_t& w, std::uint64_t v) {
  cuda::atomic_ref<std::uint64_t, cuda::thread_scope_system>(w).store(v, cuda::memory_order_release);
}
/// Ors v into w.
ULYSSES_HOST_DEVICE inline void dw_or(std::uint64_t& w, std::uint64_t v) {
  cuda::atomic_ref<std::uint64_t, cuda::thread_scope_system>(w).fetch_or(v, cuda::memory_order_acq_rel);
}
/// Sets w from 0 to v; false when it was not 0.
ULYSSES_HOST_DEVICE inline bool dw_claim(std::uint64_t& w, std::uint64_t v) {
  std::uint64_t zero = 0;
  return cuda::atomic_ref<std::uint64_t, cuda::thread_scope_system>(w).compare_exchange_strong(zero, v, cuda::memory_order_acq_rel);
}

/// Step 1's first half: the owner publishes `rec` as its record of the next epoch, which it
/// returns. Single writer (the owner's stream).
ULYSSES_HOST_DEVICE inline std::uint64_t dw_arrive(DeviceWindowControl& mine, const DeviceWindowRecord& rec) {
  const std::uint64_t e = mine.epoch + 1;
  mine.epoch = e;
  mine.record = rec;
  cuda::atomic_thread_fence(cuda::memory_order_seq_cst, cuda::thread_scope_system);  // the inputs and the record before the epoch
  dw_store(mine.arrive, e);
  return e;
}

/// Compares every rank's record (all arrived at this epoch) with rank 0's (so that every rank
/// names the same one), and each rank's layouts hash with what this rank's lists expect; ok or
/// the first mismatch.
ULYSSES_HOST_DEVICE inline DevicePoll dw_check_records(const DeviceWindowGroup& g) {
  DevicePoll s;
  s.finished = true;
  const DeviceWindowRecord& ref = g.ctrl[0]->record;
  for (int p = 0; p < g.size; ++p) {
    const DeviceWindowRecord& r = g.ctrl[p]->record;
    std::uint64_t field = ~std::uint64_t{0};
    if (r.count != ref.count) {
      field = 0;
    } else if (r.reg_count != ref.reg_count || r.reg_total != ref.reg_total || r.reg_hash != ref.reg_hash) {
      field = 1;
    } else {
      for (std::uint64_t t = 0; t < ref.count && t < static_cast<std::uint64_t>(kMaxTensors); ++t)
        if (r.offset[t] != ref.offset[t] && r.offset[t] != DeviceWindowRecord::kNone && ref.offset[t] != DeviceWindowRecord::kNone) {
          field = 2 + t;
          break;
        }
    }
    if (field != ~std::uint64_t{0}) {
      s.code = DeviceWaitCode::record_mismatch, s.peer = p, s.field = field;
      return s;
    }
    if (g.check_layouts && r.layouts != g.expect_layouts[p]) {
      s.code = DeviceWaitCode::layouts_mismatch, s.peer = p;
      return s;
    }
  }
  return s;
}

/// One look at the group in the wait for epoch e: arrivals (`arrival`: once all arrived, the
/// records are compared, then the abort word is looked at: a rank arriving after its peers gave
/// up gets `aborted`) or finished reads (once all finished, the exchange is complete, even if a
/// peer breaks the group in its next call).
ULYSSES_HOST_DEVICE inline DevicePoll dw_poll(const DeviceWindowGroup& g, std::uint64_t e, bool arrival) {
  DevicePoll s;
  for (int p = 0; p < g.size; ++p)
    if (dw_load(arrival ? g.ctrl[p]->arrive : g.ctrl[p]->done) < e) {
      if (s.peer < 0) s.peer = p;
      s.late |= std::uint64_t{1} << p;
    }
  if (s.peer < 0) {
    cuda::atomic_thread_fence(cuda::memory_order_seq_cst, cuda::thread_scope_system);  // the peers' records and inputs after their epochs
    if (arrival) {
      s = dw_check_records(g);
      if (s.code != DeviceWaitCode::ok) return s;
    } else {
      s.finished = true;
      return s;
    }
  }
  if (const std::uint64_t who = dw_load(g.ctrl[0]->abort)) {  // (acquire: the breaker's masks, or'd in before it, are seen)
    s.code = DeviceWaitCode::aborted, s.peer = static_cast<int>(who - 1), s.finished = true;
    s.not_arrived = dw_load(g.ctrl[0]->not_arrived), s.not_done = dw_load(g.ctrl[0]->not_done);
    s.missed_call = dw_load(g.ctrl[0]->missed_call);
  }
  return s;
}

/// A bounded wait (arrivals or finished reads, as dw_poll): polls until finished or until `now() - start >= timeout_ns` (then the
/// timeout code of the phase, naming the first late rank). `pause()` runs between polls.
template <class Clock, class Pause>
ULYSSES_HOST_DEVICE DevicePoll dw_wait(const DeviceWindowGroup& g, std::uint64_t e, bool arrival, std::uint64_t timeout_ns, Clock now,
                                       Pause pause) {
  const std::uint64_t start = now();
  for (;;) {
    DevicePoll s = dw_poll(g, e, arrival);
    if (s.finished) return s;
    if (now() - start >= timeout_ns) {
      s.code = arrival ? DeviceWaitCode::timeout_arrive : DeviceWaitCode::timeout_done;
      s.finished = true;
      return s;
    }
    pause();
  }
}

/// Records a wait's verdict: the first failure goes to `st` (single writer: this rank's
/// stream); a failure of this rank's own (a timeout, a mismatch) also breaks the group (the
/// abort word), so that the peers stop waiting; a timeout first ors the late ranks into the
/// group's masks (and claims their call), so that the peers' `aborted` names them too.
ULYSSES_HOST_DEVICE inline void dw_report(const DeviceWindowGroup& g, DeviceWindowStatus& st, const DevicePoll& s, std::uint64_t e) {
  if (s.code == DeviceWaitCode::ok) return;
  const bool timed_out = s.code == DeviceWaitCode::timeout_arrive || s.code == DeviceWaitCode::timeout_done;
  if (timed_out) {
    dw_claim(g.ctrl[0]->missed_call, e);
    dw_or(s.code == DeviceWaitCode::timeout_arrive ? g.ctrl[0]->not_arrived : g.ctrl[0]->not_done, s.late);
  }
  if (s.code != DeviceWaitCode::aborted) dw_claim(g.ctrl[0]->abort, static_cast<std::uint64_t>(g.rank) + 1);
  if (dw_load(st.code) != 0) return;
  st.peer = static_cast<std::uint64_t>(s.peer);
  st.epoch = e;
  st.field = s.field;
  st.not_arrived = timed_out ? (s.code == DeviceWaitCode::timeout_arrive ? s.late : 0) : s.not_arrived;
  st.not_done = timed_out ? (s.code == DeviceWaitCode::timeout_done ? s.late : 0) : s.not_done;
  st.missed_call = timed_out ? e : s.missed_call;
  dw_store(st.code, static_cast<std::uint64_t>(s.code));
}

/// Step 1 on one rank: arrive with `rec`, then wait for the others and report. A rank that
/// already failed publishes nothing (it makes sure the group is broken). Returns the epoch.
template <class Clock, class Pause>
ULYSSES_HOST_DEVICE std::uint64_t dw_arrive_and_wait(const DeviceWindowGroup& g, const DeviceWindowRecord& rec, std::uint64_t timeout_ns,
                                                     DeviceWindowStatus& st, Clock now, Pause pause) {
  if (dw_load(st.code) != 0) {
    dw_claim(g.ctrl[0]->abort, static_cast<std::uint64_t>(g.rank) + 1);
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
  cuda::atomic_thread_fence(cuda::memory_order_seq_cst, cuda::thread_scope_system);  // the copies' reads before the epoch
  dw_store(mine.done, e);
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

ULYSSES_NAMESPACE_BEGIN
namespace detail {

/// A staging copy of with_peers(): `bytes` bytes from `src` (outside the window) to `offset` of
/// this rank's slot.
struct DeviceStageCopy {
  const std::byte* src;  ///< the input
  std::size_t offset;    ///< where it goes in the slot
  std::size_t bytes;     ///< its size
};

/// What this rank publishes for the inputs `in` (the list logic of with_peers, on the host): each
/// input inside the slot's registrations by its offset; each input outside the window staged
/// into share t of the slot's free bytes (from the end of the registrations, aligned to
/// `alignment`, split in in.count equal aligned shares: the same offsets on every rank, which
/// registered alike). Returns "" or why it cannot (an input that starts in the slot outside its
/// registrations, or does not fit its share).
/// @param reg       this rank's registrations
/// @param slot      the start of this rank's slot (in this process)
/// @param in        the inputs
/// @param alignment of the shares
/// @param rank      this rank (for the messages)
/// @param rec       the record (count, offsets, digest; layouts from `in`)
/// @param stage     the staging copies to enqueue
inline std::string device_window_record(const WindowRegistry& reg, const std::byte* slot, const PeerInputs& in, std::size_t alignment,
                                        int rank, DeviceWindowRecord& rec, std::vector<DeviceStageCopy>& stage) {
  rec = DeviceWindowRecord{};
  stage.clear();
  const int n = in.count < 0 ? 0 : (in.count > kMaxTensors ? kMaxTensors : in.count);
  rec.count = static_cast<std::uint64_t>(in.count);
  rec.layouts = in.layouts;
  rec.reg_count = reg.digest().count, rec.reg_total = reg.digest().total, rec.reg_hash = reg.digest().hash;
  for (int t = 0; t < kMaxTensors; ++t) rec.offset[t] = DeviceWindowRecord::kNone;
  const std::size_t start = round_up(reg.used(), alignment);
  const std::size_t share = n == 0 || start >= reg.bytes() ? 0 : (reg.bytes() - start) / static_cast<std::size_t>(n) / alignment * alignment;
  const std::string who = "MpiDeviceWindowComm: input ";
  for (int t = 0; t < n; ++t) {
    const std::byte* p = in.data[t];
    const std::size_t b = in.bytes[t];
    if (!p || !b) continue;
    if (reg.starts_in(slot, p)) {
      const auto off = static_cast<std::size_t>(p - slot);
      if (off + b > reg.used() || off + b < off)
        return who + std::to_string(t) + " of rank " + std::to_string(rank) + " (" + std::to_string(b) + " bytes at offset " +
               std::to_string(off) + ") starts in the device window but runs past its registrations (" + std::to_string(reg.used()) +
               " bytes): pass a registered range (MpiDeviceWindow::allocate)";
      rec.offset[t] = off;
      continue;
    }
    if (b > share)
      return who + std::to_string(t) + " of rank " + std::to_string(rank) + " (" + std::to_string(b) +
             " bytes) is outside the device window, and its share of the window's free bytes to stage it in holds " + std::to_string(share) +
             "; allocate the inputs from the window (MpiDeviceWindow::allocate) or make it larger";
    rec.offset[t] = start + static_cast<std::size_t>(t) * share;
    stage.push_back({p, static_cast<std::size_t>(rec.offset[t]), b});
  }
  return {};
}

/// Every rank's inputs in this process's mapping, as work() gets them: rank p's input t at
/// slots[p] + rec.offset[t] (the same offset on every rank: the records are compared on the
/// device), sized as this rank's; layouts as this rank's lists expect of p (in.peer_layouts).
/// @param rec   this rank's record
/// @param in    this rank's inputs
/// @param slots every rank's slot in this process (P of them)
/// @param P     ranks
/// @param views the views (P of them)
inline void device_window_views(const DeviceWindowRecord& rec, const PeerInputs& in, std::byte* const* slots, int P, PeerInputs* views) {
  for (int p = 0; p < P; ++p) {
    PeerInputs& v = views[p];
    v = PeerInputs{};
    v.count = in.count;
    v.layouts = in.peer_layouts ? in.peer_layouts[p] : 0;
    for (int t = 0; t < kMaxTensors && t < in.count; ++t) {
      if (rec.offset[t] == DeviceWindowRecord::kNone) continue;
      v.data[t] = slots[p] + rec.offset[t];
      v.bytes[t] = in.bytes[t];
    }
  }
}

/// The ranks of a mask of at most 64 (bit p: rank p), ascending.
/// @param mask the mask
inline std::vector<int> ranks_of_mask(std::uint64_t mask) {
  std::vector<int> r;
  for (int p = 0; p < 64; ++p)
    if (mask >> p & 1) r.push_back(p);
  return r;
}

/// The late ranks a status names ("ranks {2} did not arrive in call 5"; both phases, "; "
/// between), or "" when it names none.
/// @param st the status
inline std::string device_window_missing(const DeviceWindowStatus& st) {
  std::string s;
  if (st.not_arrived) s = missing_ranks(ranks_of_mask(st.not_arrived), true, st.missed_call);
  if (st.not_done) s += (s.empty() ? "" : "; ") + missing_ranks(ranks_of_mask(st.not_done), false, st.missed_call);
  return s;
}

/// The message of a device wait's verdict (DeviceWindowStatus), and its code.
/// @param st      the status (code != 0)
/// @param rank    this rank
/// @param timeout the wait bound in milliseconds
/// @param code    set to the Errc the host throws
inline std::string device_window_failure(const DeviceWindowStatus& st, int rank, long long timeout, Errc& code) {
  const std::string me = "rank " + std::to_string(rank) + ": MpiDeviceWindowComm::with_peers (call " + std::to_string(st.epoch) + ")";
  const std::string peer = std::to_string(st.peer);
  switch (static_cast<DeviceWaitCode>(st.code)) {
    case DeviceWaitCode::timeout_arrive:
    case DeviceWaitCode::timeout_done: {
      code = Errc::timeout;
      const bool arrival = st.code == static_cast<std::uint64_t>(DeviceWaitCode::timeout_arrive);
      const std::uint64_t late = arrival ? st.not_arrived : st.not_done;
      return me + " waited " + std::to_string(timeout) + " ms on the device for the peers to " + (arrival ? "arrive" : "finish reading") +
             "; " + missing_ranks(late ? ranks_of_mask(late) : std::vector<int>{static_cast<int>(st.peer)}, arrival, st.epoch) +
             " (a rank skipped the call, failed outside it, or is stuck); the group is broken";
    }
    case DeviceWaitCode::aborted: {
      code = Errc::aborted;
      const std::string missing = device_window_missing(st);
      return me + ": the device window's group is broken (rank " + peer +
             (missing.empty() ? " timed out or failed in with_peers" : " broke it: " + missing) + "); make a new MpiDeviceWindow";
    }
    case DeviceWaitCode::record_mismatch:
      code = Errc::plan_mismatch;
      return me + ": rank " + peer + " published " +
             (st.field == 0   ? std::string("another number of inputs (the ranks' plans differ)")
              : st.field == 1 ? std::string("other registrations (every rank must allocate() the same sizes in the same order)")
                              : "input " + std::to_string(st.field - 2) +
                                    " at another offset of its slot (pass the same registrations, or inputs outside the window, on every rank)") +
             " than this rank; the outputs of that call are unspecified";
    case DeviceWaitCode::layouts_mismatch:
      code = Errc::plan_mismatch;
      return me + ": rank " + peer +
             " runs a plan with other layouts or another wire than the one this rank's peer-copy lists were built from; the outputs of "
             "that call are unspecified";
    default:
      code = Errc::backend;
      return me + ": unknown device status " + std::to_string(st.code);
  }
}

}  // namespace detail
ULYSSES_NAMESPACE_END
