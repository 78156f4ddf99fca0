// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Deprecated header path (ulysses 0.1): include <ulysses/cuda/executor.cuh> instead. This forwarding header
///        stays for one minor version (removed in 0.3); define ULYSSES_WARN_DEPRECATED_HEADERS to
///        be told where it is still included.
#pragma once
#if defined(ULYSSES_WARN_DEPRECATED_HEADERS)
#pragma message("<ulysses/cuda/copy.cuh> is deprecated: include <ulysses/cuda/executor.cuh>")
#endif
// What the 0.1 header declared (CudaExecutor, its kernel, its constants, the element traits of
// __half and __nv_bfloat16), and the planner it included: CudaExecutor(plan, stream) needs Plan's
// block_lists().
#include "../plan/plan.hpp"
#include "detail/kernel.cuh"
#include "detail/kernel_list.cuh"
#include "element.cuh"
#include "executor.cuh"
#include "policy.cuh"
