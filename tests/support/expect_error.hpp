// SPDX-License-Identifier: Apache-2.0
// What a call throws: the ulysses::Error code (and message), or Errc{} (0) when it throws none.
#pragma once

#include <ulysses/error.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <utility>

namespace ut {

/// The code and message of the ulysses::Error f throws; {Errc{}, ""} when it throws none.
inline std::pair<ulysses::Errc, std::string> error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ulysses::Error& e) {
    return {e.code(), e.what()};
  }
  return {ulysses::Errc{}, ""};
}

/// The code of the ulysses::Error f throws; Errc{} when it throws none.
inline ulysses::Errc code_of(const std::function<void()>& f) { return error_of(f).first; }

/// What a call throws and how long it took (steady_clock): the failure-model tests assert that a
/// call returns within its deadline plus a margin.
struct TimedError {
  ulysses::Errc code;   ///< Errc{} when it threw none
  std::string message;  ///< its what()
  double ms;            ///< milliseconds from the call to its return
};

/// Runs f, timing it; the code and message of the ulysses::Error it throws.
inline TimedError timed_error_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  auto [code, message] = error_of(f);
  const std::chrono::duration<double, std::milli> d = std::chrono::steady_clock::now() - t0;
  return {code, message, d.count()};
}

}  // namespace ut
