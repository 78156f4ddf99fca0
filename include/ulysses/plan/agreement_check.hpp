// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What a plan shares about its cross-rank agreement check (AgreementCheck) and the plan
///        ids communicators key what they learn on: for Plan (plan/plan.hpp) and DecodePlan
///        (decode/plan.hpp) alike.
#pragma once

#include <atomic>
#include <cstdint>

#include "../version.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Whether the cross-rank agreement check of a plan is wanted and whether it has passed: an object
/// of its own, shared by a plan and its copies (they plan the same wire), with atomic flags, so
/// that a const Plan is never changed. The communicators record the passed check themselves too
/// (ExchangeState, per plan and communicator); this object serves communicators without one and
/// answers Plan::agreement_checked() (and DecodePlan's).
class AgreementCheck {
 public:
  /// Whether exchanges check (default: on; the macro ULYSSES_CHECK_AGREEMENT=0 turns it off).
  bool enabled() const noexcept { return enabled_.load(std::memory_order_relaxed); }
  /// Turns the check on or off (before the first exchange, the same on every rank).
  void enable(bool on) noexcept { enabled_.store(on, std::memory_order_relaxed); }
  /// True once a check has passed for the plan (on any communicator).
  bool passed() const noexcept { return passed_.load(std::memory_order_acquire); }
  /// Records a passed check (check_agreement() does).
  void pass() noexcept { passed_.store(true, std::memory_order_release); }

 private:
#if defined(ULYSSES_CHECK_AGREEMENT)
  std::atomic<bool> enabled_{ULYSSES_CHECK_AGREEMENT};
#else
  std::atomic<bool> enabled_{true};
#endif
  std::atomic<bool> passed_{false};
};

namespace detail {
/// A number no other plan of this process has (copies of a plan keep it): what communicators key
/// what they learn about a plan on (ExchangeState).
inline std::uint64_t next_plan_id() {
  static std::atomic<std::uint64_t> n{0};
  return n.fetch_add(1, std::memory_order_relaxed) + 1;
}
}  // namespace detail

ULYSSES_NAMESPACE_END
