// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief One rank's error is every rank's error: a library call that fails on one rank breaks
///        the group (the communicator's optional abort(), comm/concepts.hpp) before it throws, so
///        that its peers throw Error(aborted) naming the rank and its error code at once instead
///        of waiting out their deadline (docs/guide.md, "Errors"). Source of the pattern: NCCL's
///        ncclCommAbort / revoke and MPI ULFM's MPIX_Comm_revoke.
#pragma once

#include <exception>
#include <string>
#include <utility>

#include <atomic>
#include <cstdint>

#include "../detail/hash.hpp"
#include "../error.hpp"
#include "concepts.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Whether library calls are numbered (begin_call()): on by default. Off, no call is numbered and
/// the ranks compare nothing (a skipped call may then pair with its peers' next): only for
/// measuring what numbering costs (ulysses_perf --call-numbers 0, bench/run_call_numbers.sh).
/// Process-wide; every rank must choose alike, between calls.
/// @param on number the calls that follow
inline void set_call_numbering(bool on) noexcept;
/// Whether library calls are numbered (set_call_numbering()).
inline bool call_numbering() noexcept;

namespace detail {
inline std::atomic<bool>& call_numbering_flag() noexcept {
  static std::atomic<bool> on{true};
  return on;
}

/// Whether a failure of one rank in a library call must be told to its peers: everything but
/// Error(aborted) (the group told this rank), Error(plan_mismatch) (a verdict every rank reaches
/// alike: the agreement check, the window's records) and Error(comm_mismatch) (the communicator
/// is not the plan's group: breaking it would break an innocent group, and the plan's peers
/// cannot be reached through it; they end at their deadline).
inline bool peers_must_hear(const Error& e) noexcept {
  return e.code() != Errc::aborted && e.code() != Errc::plan_mismatch && e.code() != Errc::comm_mismatch;
}

/// The text a failing rank hands its peers: "rank r failed in <call> with <code>: <message>".
inline std::string failure_notice(int rank, const char* call, const std::string& what) {
  return "rank " + std::to_string(rank) + " failed in " + call + " with " + what;
}

/// Breaks the group of `comm` with `why` when the communicator can carry it (comm_traits::abort)
/// and the group has peers; never throws (the caller is already throwing).
template <class Comm>
void break_group_for(Comm& comm, const std::string& why) noexcept {
  if constexpr (comm_traits<Comm>::abort) {
    try {
      if (comm.size() > 1) comm.abort(why);
    } catch (...) {  // (a failing abort leaves the peers to their deadline)
    }
  } else {
    (void)comm;
    (void)why;
  }
}

/// Numbers the next library call on `comm` (ExchangeState::begin_call(), where the communicator
/// has one): `name` and `what` (e.g. a plan's fingerprint and direction), which the shipped
/// communicators compare across ranks in what they already exchange. Call it on the calling
/// thread before the call's first collective.
/// @param name a string literal, e.g. "seq_to_head" @param what tells calls of one name apart
template <class Comm>
void begin_call(Comm& comm, const char* name, std::uint64_t what = 0) noexcept {
  if constexpr (comm_traits<Comm>::exchange_state) {
    if (!call_numbering_flag().load(std::memory_order_relaxed)) return;
    std::uint64_t h = kFnvBasis;
    for (const char* c = name; *c; ++c) h = fnv1a(h, static_cast<std::int64_t>(*c));
    comm.exchange_state().begin_call(name, fnv1a(h, what));
  } else {
    (void)comm;
    (void)name;
    (void)what;
  }
}

/// Runs `f()`, one library call on `comm` from `rank`, and returns what it returns. When it throws
/// an error its peers cannot see (peers_must_hear(); any other exception too), the group is broken
/// first (break_group_for(): "rank 3 failed in seq_to_head with ulysses: buffer_too_small: ..."),
/// so that the peers' current and later calls throw Error(aborted) with that text; then the error
/// propagates unchanged. On a communicator without abort() the peers end at their deadline.
/// @param comm the call's communicator @param rank this rank (for the peers' messages)
/// @param call the call's name, e.g. "seq_to_head" @param f callable as R()
/// @param every_error tell the peers of every error, peers_must_hear() or not (the engine's own
///        code: an Error(aborted) of another communicator is news to this one's peers)
template <class Comm, class F>
decltype(auto) tell_peers_on_failure(Comm& comm, int rank, const char* call, F&& f, bool every_error = false) {
  try {
    return std::forward<F>(f)();
  } catch (const Error& e) {
    if (every_error || peers_must_hear(e)) break_group_for(comm, failure_notice(rank, call, e.what()));
    throw;
  } catch (const std::exception& e) {
    break_group_for(comm, failure_notice(rank, call, std::string("an exception: ") + e.what()));
    throw;
  } catch (...) {
    break_group_for(comm, failure_notice(rank, call, "an exception that is not a std::exception"));
    throw;
  }
}

}  // namespace detail

inline void set_call_numbering(bool on) noexcept { detail::call_numbering_flag().store(on, std::memory_order_relaxed); }
inline bool call_numbering() noexcept { return detail::call_numbering_flag().load(std::memory_order_relaxed); }

/// Runs `f()`, a step of the engine's own code between library calls on `comm` (the attention
/// kernel, a projection, a call on another communicator), and returns what it returns; if it
/// throws anything (an Error(aborted) of another group included), breaks the group first, as a
/// failing library call does (its abort(): "rank 3 failed in <what> with <its what()>"), so that
/// the peers, which are in or about to enter the next collective, throw Error(aborted) naming
/// this rank at once instead of waiting out their deadline; then the exception propagates
/// unchanged. On a communicator without abort() it only runs f.
/// @pre no ring step of RingProgress::thread is in flight on `comm` when f may throw, for a
///      communicator whose calls must come from one thread at a time (MpiComm: MPI would be entered
///      from two threads); finish the step first.
/// @param comm the step's communicator (its rank() names this rank)
/// @param what the step's name for the peers' messages, e.g. "the attention of layer 7"
/// @param f callable as R()
/// Source: NCCL's ncclCommAbort from the application's error path.
template <class Comm, class F>
decltype(auto) break_group_on_failure(Comm& comm, const char* what, F&& f) {
  return detail::tell_peers_on_failure(comm, comm.rank(), what, std::forward<F>(f), true);
}

ULYSSES_NAMESPACE_END
