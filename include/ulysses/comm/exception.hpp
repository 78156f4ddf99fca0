// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What a caught exception holds, for the messages a failed rank leaves its peers:
///        whether it is Error(aborted) (a failure passed on, not a new one) and its text.
#pragma once

#include <exception>
#include <string>

#include "../error.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {

/// Whether `e` holds an Error with code Errc::aborted.
inline bool is_aborted_error(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& x) {
    return x.code() == Errc::aborted;
  } catch (...) {
  }
  return false;
}

/// The message of the exception `e` holds, for the peers' Error(aborted).
inline std::string exception_message(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
  }
  return "an exception that is not a std::exception";
}

}  // namespace detail

ULYSSES_NAMESPACE_END
