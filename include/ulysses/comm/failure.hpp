// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The failure model the shipped communicators share (docs/design.md, "Failure model"):
///        the default deadline of a wait, a communicator's broken state, and the bounded polling
///        loop their waits run.
///
/// Every wait has a deadline: a call that waits for its peers longer than the communicator's
/// timeout throws Error(timeout), naming the ranks that did not arrive where the backend can tell.
/// A communicator that timed out or failed is broken: every later call throws Error(aborted) at
/// once, with the first failure's message. A broken communicator is never repaired: make a new
/// group (in-process groups), or end the job (MPI, NCCL).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "../error.hpp"

ULYSSES_NAMESPACE_BEGIN

/// How long a shipped communicator waits in one call for its peers, unless its constructor or
/// set_timeout() says otherwise: 5 minutes (LocalGroup, DeviceLocalGroup, MpiComm, NcclComm).
inline constexpr std::chrono::milliseconds kDefaultCommTimeout = std::chrono::minutes(5);

namespace detail {

/// The health of one communicator: healthy until its first failure, broken from then on. Keeps
/// the first failure's code and message. Not thread-safe (a communicator serves one thread).
class CommFailure {
 public:
  /// True once a failure was recorded.
  bool broken() const noexcept { return broken_; }
  /// The first failure's code (meaningful once broken()).
  Errc code() const noexcept { return code_; }
  /// The first failure's message, as its Error::what() (empty while healthy).
  const std::string& message() const noexcept { return message_; }

  /// Records a failure (only the first one is kept; later ones leave it as it is).
  void record(Errc code, const std::string& what) {
    if (broken_) return;
    broken_ = true;
    code_ = code;
    message_ = what;
  }
  /// Records Error(code, message) as the failure (if it is the first) and throws it.
  [[noreturn]] void fail(Errc code, const std::string& message) {
    Error e(code, message);
    record(code, e.what());
    throw e;
  }
  /// Throws Error(aborted) naming `who` and the first failure when broken; returns otherwise.
  void check(const char* who) const {
    if (broken_)
      throw Error(Errc::aborted, std::string(who) + ": the communicator is broken by an earlier failure (" + message_ +
                                     "); it cannot be used again: make a new group, or end the job");
  }

 private:
  bool broken_ = false;
  Errc code_ = Errc::aborted;
  std::string message_;
};

/// The longest wait a deadline stands for: 100 years. A longer timeout, such as
/// std::chrono::milliseconds::max() ("no bound"), is clamped to it, so that adding it to a time
/// point or converting it to nanoseconds cannot overflow (signed overflow: a deadline in the past).
inline constexpr std::chrono::milliseconds kLongestWait = std::chrono::hours(24 * 365 * 100);

/// `timeout` clamped to [0, kLongestWait] (negative: 0), in milliseconds.
constexpr std::chrono::milliseconds clamp_wait(std::chrono::milliseconds timeout) noexcept {
  return timeout < std::chrono::milliseconds::zero() ? std::chrono::milliseconds::zero() : timeout > kLongestWait ? kLongestWait : timeout;
}

/// The steady_clock time point `timeout` after `now` (default: the current time), `timeout`
/// clamped by clamp_wait() and the sum saturated at time_point::max(): never overflows.
/// @param timeout how long from now; any value, milliseconds::max() included
/// @param now     the start (std::chrono::steady_clock)
inline std::chrono::steady_clock::time_point deadline_after(
    std::chrono::milliseconds timeout, std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now()) noexcept {
  using clock = std::chrono::steady_clock;
  const auto wait = std::chrono::duration_cast<clock::duration>(clamp_wait(timeout));  // <= 100 years: fits int64 ns
  return now > clock::time_point::max() - wait ? clock::time_point::max() : now + wait;
}

/// `timeout` in nanoseconds, clamped by clamp_wait() (what a device-side wait compares its
/// %globaltimer delta with): never overflows.
constexpr std::uint64_t wait_ns(std::chrono::milliseconds timeout) noexcept {
  return static_cast<std::uint64_t>(clamp_wait(timeout).count()) * 1000000ull;
}

/// `factor` × `timeout`, clamped by clamp_wait() first and after (a deadline that allows for
/// several waits in a row): never overflows. @param factor 0 .. 1000
constexpr std::chrono::milliseconds scaled_wait(std::chrono::milliseconds timeout, int factor) noexcept {
  return clamp_wait(clamp_wait(timeout) * factor);
}

/// How a bounded wait spends the time between two polls.
enum class PollPace {
  yield,    ///< poll back to back for the first 10 ms, then yield the thread between polls: for a
            ///< progress-driven library such as MPI, which moves a large message only inside the poll;
            ///< yielding after every poll would hand the core away for a time slice per protocol step
            ///< (docs/design.md, "How a wait polls"); a longer wait is for a late peer
  relaxed,  ///< yield for the first millisecond, then sleep 20 µs between polls (work that progresses on its own: a GPU stream)
};

/// Calls `ready()` until it returns true (then returns true) or `deadline` has passed (then
/// returns false). `ready` is called at least once, and may throw (the exception propagates).
/// @param deadline when to stop waiting (std::chrono::steady_clock)
/// @param ready    callable as bool(), the poll
/// @param pace     what to do between polls
template <class Ready>
bool poll_until(std::chrono::steady_clock::time_point deadline, Ready&& ready, PollPace pace = PollPace::yield) {
  using clock = std::chrono::steady_clock;
  const clock::time_point start = clock::now();
  for (std::uint64_t n = 0;; ++n) {
    if (ready()) return true;
    const clock::time_point now = clock::now();
    if (now >= deadline) return false;
    if (n < 64) continue;  // a few tight polls first: most waits end here
    if (pace == PollPace::yield && now - start < std::chrono::milliseconds(10)) continue;  // then spin for 10 ms
    if (pace == PollPace::relaxed && now - start > std::chrono::milliseconds(1))
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    else
      std::this_thread::yield();
  }
}

}  // namespace detail

ULYSSES_NAMESPACE_END
