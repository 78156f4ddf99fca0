// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Deprecated header path (ulysses 0.1): include <ulysses/plan/plan.hpp> instead. This forwarding header
///        stays for one minor version (removed in 0.3); define ULYSSES_WARN_DEPRECATED_HEADERS to
///        be told where it is still included.
#pragma once
#if defined(ULYSSES_WARN_DEPRECATED_HEADERS)
#pragma message("<ulysses/plan.hpp> is deprecated: include <ulysses/plan/plan.hpp>")
#endif
#include "plan/plan.hpp"
#include "transport/dispatch.hpp"  // Plan::copies() counts through the transports
