// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The epoch barrier of the windows, written once: arrive, done, the abort word, the ranks
///        a timed-out rank found missing, as __host__ __device__ functions over the words of the
///        ranks' control blocks (a `Words` policy: HostWords here, the device window's system-scope
///        atomics in comm/mpi_device_window.cuh), a clock and a pause. MpiWindowComm (host shared
///        memory) and MpiDeviceWindowComm (CUDA IPC, one-thread kernels) run the same steps; the
///        protocol and its failure model: docs/design.md (failure model) and docs/gpu.md.
///        Plain C++17: host code includes it without nvcc.
#pragma once

#include <cstdint>

#include "../version.hpp"

/// Before each protocol template: its words, clock, pause and callbacks may be host-only (HostWords,
/// the host tests' clocks); nvcc then compiles that instantiation for the host only, without warning.
#if defined(__CUDACC__)
#define ULYSSES_PROTOCOL_TEMPLATE _Pragma("nv_exec_check_disable")
#else
#define ULYSSES_PROTOCOL_TEMPLATE
#endif

ULYSSES_NAMESPACE_BEGIN
namespace detail {

/// Process-shared word access of host memory (the MPI window's control blocks): sequentially
/// consistent, so that a rank that stores its arrival and then loads the abort word, and a rank
/// that stores the abort word and then loads the arrivals, cannot both miss the other's store.
inline std::uint64_t shared_load(const std::uint64_t& w) noexcept { return __atomic_load_n(&w, __ATOMIC_SEQ_CST); }
inline void shared_store(std::uint64_t& w, std::uint64_t v) noexcept { __atomic_store_n(&w, v, __ATOMIC_SEQ_CST); }
/// Sets `w` from 0 to `v`; false (and `w` unchanged) when it was not 0.
inline bool shared_claim(std::uint64_t& w, std::uint64_t v) noexcept {
  std::uint64_t zero = 0;
  return __atomic_compare_exchange_n(&w, &zero, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

/// The protocol's words on the host (shared_load, ...; lock-free 8-byte atomics are address-free,
/// so they work across processes).
struct HostWords {
  static std::uint64_t load(std::uint64_t& w) noexcept { return shared_load(w); }
  static void store(std::uint64_t& w, std::uint64_t v) noexcept { shared_store(w, v); }
  static bool claim(std::uint64_t& w, std::uint64_t v) noexcept { return shared_claim(w, v); }
  static void fence() noexcept { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
};

/// What a wait found.
enum class EpochCode : std::uint64_t {
  ok = 0,           ///< every rank reached the epoch (and, on arrival, the records agree)
  timeout_arrive,   ///< the deadline passed while `peer` had not arrived
  timeout_done,     ///< the deadline passed while `peer` had not finished reading
  aborted,          ///< rank `peer` broke the group
  record_mismatch,  ///< rank `peer`'s record differs from this rank's (`field`: which)
  layouts_mismatch  ///< rank `peer` published other layouts than this rank's lists were built from
};

/// One look of a wait: its code and, unless finished, who is still missing.
struct EpochPoll {
  EpochCode code = EpochCode::ok;  ///< the verdict (ok while waiting)
  int peer = -1;                   ///< the rank it names (the first late one while waiting)
  std::uint64_t field = 0;         ///< record_mismatch's field
  std::uint64_t late = 0;          ///< while waiting: bit p, rank p (< 64) has not reached the epoch
  std::uint64_t not_arrived = 0, not_done = 0, missed_call = 0;  ///< aborted: the ranks found missing (their missed words) and the call
  bool finished = false;           ///< the wait is over
};

/// The missed word a timed-out rank claims in a late rank's control block: 2e (not arrived in
/// call e) or 2e + 1 (not finished reading).
ULYSSES_HOST_DEVICE constexpr std::uint64_t missed_word(std::uint64_t e, bool arrival) { return 2 * e + (arrival ? 0u : 1u); }

/// A record check that always agrees (a window that compares its records after the wait).
struct NoRecordCheck {
  ULYSSES_HOST_DEVICE EpochPoll operator()() const {
    EpochPoll s;
    s.finished = true;
    return s;
  }
};

/// The ranks found missing, as masks of the first 64 ranks, from every rank's missed word.
/// @param at callable as Ctrl&(int p): rank p's control block (words arrive, done, abort, missed)
ULYSSES_PROTOCOL_TEMPLATE
template <class Words, class At>
ULYSSES_HOST_DEVICE void epoch_missed(At at, int size, EpochPoll& s) {
  for (int p = 0; p < size && p < 64; ++p) {
    const std::uint64_t m = Words::load(at(p).missed);
    if (!m) continue;
    (m & 1 ? s.not_done : s.not_arrived) |= std::uint64_t{1} << p;
    if (!s.missed_call || (m >> 1) < s.missed_call) s.missed_call = m >> 1;
  }
}

/// One look at the group in the wait for epoch e: the epochs first (arrivals, or finished reads),
/// then, once all arrived, `check()` of the records (a mismatch is every rank's verdict alike:
/// they read the same records), then the abort word (rank 0's `abort`: a rank arriving after its
/// peers gave up gets `aborted`; once all finished reading, the exchange is complete even if a
/// peer breaks the group in its next call). A rank reads its peers only after it saw the abort
/// word clear following its own arrival.
ULYSSES_PROTOCOL_TEMPLATE
template <class Words, class At, class Check>
ULYSSES_HOST_DEVICE EpochPoll epoch_poll(At at, int size, std::uint64_t e, bool arrival, Check check) {
  EpochPoll s;
  for (int p = 0; p < size; ++p)
    if (Words::load(arrival ? at(p).arrive : at(p).done) < e) {
      if (s.peer < 0) s.peer = p;
      if (p < 64) s.late |= std::uint64_t{1} << p;
    }
  if (s.peer < 0) {
    Words::fence();  // the peers' records and inputs after their epochs
    if (!arrival) {
      s.finished = true;
      return s;
    }
    s = check();
    if (s.code != EpochCode::ok) return s;
  }
  if (const std::uint64_t who = Words::load(at(0).abort)) {  // (the breaker's missed words, claimed before it, are seen)
    s.code = EpochCode::aborted;
    s.peer = static_cast<int>(who - 1);
    s.finished = true;
    epoch_missed<Words>(at, size, s);
  }
  return s;
}

/// A bounded wait (epoch_poll): polls until finished or until `now() - start >= timeout_ns`
/// (then the phase's timeout code, naming the first late rank). `pause()` runs between polls.
ULYSSES_PROTOCOL_TEMPLATE
template <class Words, class At, class Check, class Clock, class Pause>
ULYSSES_HOST_DEVICE EpochPoll epoch_wait(At at, int size, std::uint64_t e, bool arrival, std::uint64_t timeout_ns, Check check, Clock now,
                                         Pause pause) {
  const std::uint64_t start = now();
  for (;;) {
    EpochPoll s = epoch_poll<Words>(at, size, e, arrival, check);
    if (s.finished) return s;
    if (now() - start >= timeout_ns) {
      s.code = arrival ? EpochCode::timeout_arrive : EpochCode::timeout_done;
      s.finished = true;
      return s;
    }
    pause();
  }
}

/// Publishes this rank's epoch e of the phase (`arrive` after its record and inputs, `done` after
/// its reads): a fence, then the word. Single writer.
ULYSSES_PROTOCOL_TEMPLATE
template <class Words, class Ctrl>
ULYSSES_HOST_DEVICE void epoch_publish(Ctrl& mine, std::uint64_t e, bool arrival) {
  Words::fence();
  Words::store(arrival ? mine.arrive : mine.done, e);
}

/// After a wait for epoch e timed out: claims the missed word of every rank still short of e
/// (missed_word(): set once, the first timed-out rank's view), before the abort word, so that the
/// peers' `aborted` names the same ranks; `late(q)` is called for each.
ULYSSES_PROTOCOL_TEMPLATE
template <class Words, class At, class Late>
ULYSSES_HOST_DEVICE void epoch_mark_missed(At at, int size, std::uint64_t e, bool arrival, Late late) {
  for (int q = 0; q < size; ++q)
    if (Words::load(arrival ? at(q).arrive : at(q).done) < e) {
      Words::claim(at(q).missed, missed_word(e, arrival));
      late(q);
    }
}

/// Breaks the group: rank 0's abort word from 0 to 1 + `rank` (a no-op once broken).
ULYSSES_PROTOCOL_TEMPLATE
template <class Words, class At>
ULYSSES_HOST_DEVICE void epoch_break(At at, int rank) {
  Words::claim(at(0).abort, static_cast<std::uint64_t>(rank) + 1);
}

/// Whether every rank that arrived at epoch e has finished reading (what a rank that failed
/// waits for before its inputs may change: a peer that did not arrive sees the abort word and
/// reads nothing).
ULYSSES_PROTOCOL_TEMPLATE
template <class Words, class At>
ULYSSES_HOST_DEVICE bool epoch_readers_done(At at, int size, std::uint64_t e) {
  for (int p = 0; p < size; ++p)
    if (Words::load(at(p).arrive) >= e && Words::load(at(p).done) < e) return false;
  return true;
}

}  // namespace detail
ULYSSES_NAMESPACE_END
