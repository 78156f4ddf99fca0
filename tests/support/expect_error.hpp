// SPDX-License-Identifier: Apache-2.0
// What a call throws: the ulysses::Error code (and message), or Errc{} (0) when it throws none.
#pragma once

#include <ulysses/error.hpp>

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

}  // namespace ut
