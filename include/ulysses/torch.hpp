// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Deprecated header path (ulysses 0.1): include <ulysses/torch/torch.hpp> instead. This forwarding header
///        stays for one minor version (removed in 0.3); define ULYSSES_WARN_DEPRECATED_HEADERS to
///        be told where it is still included.
#pragma once
#if defined(ULYSSES_WARN_DEPRECATED_HEADERS)
#pragma message("<ulysses/torch.hpp> is deprecated: include <ulysses/torch/torch.hpp>")
#endif
#include "torch/torch.hpp"
