// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Deprecated header path (ulysses 0.1): include <ulysses/tune/cost.hpp> (the model),
///        <ulysses/tune/fit.hpp> (its calibration) and <ulysses/tune/advise.hpp> (the degree
///        advice) instead; this one includes all three. This forwarding header
///        stays for one minor version (removed in 0.3); define ULYSSES_WARN_DEPRECATED_HEADERS to
///        be told where it is still included.
#pragma once
#if defined(ULYSSES_WARN_DEPRECATED_HEADERS)
#pragma message("<ulysses/cost.hpp> is deprecated: include <ulysses/tune/cost.hpp>, tune/fit.hpp, tune/advise.hpp")
#endif
#include "tune/cost.hpp"
#include "tune/fit.hpp"
#include "tune/advise.hpp"
