// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Library version and the versioned inline namespace.
///
/// Everything public lives in `ulysses::` (through the inline namespace `ulysses::v0`), so that
/// two builds of different major versions linked into one program do not clash (the same reason
/// CCCL versions its namespaces). CUDA headers add an inner inline namespace named after the
/// target architectures (see cuda/detail/config.cuh).
#pragma once

#define ULYSSES_VERSION_MAJOR 0
#define ULYSSES_VERSION_MINOR 2
#define ULYSSES_VERSION_PATCH 0
/// Single integer for comparisons: MAJOR * 10000 + MINOR * 100 + PATCH.
#define ULYSSES_VERSION (ULYSSES_VERSION_MAJOR * 10000 + ULYSSES_VERSION_MINOR * 100 + ULYSSES_VERSION_PATCH)

#define ULYSSES_NAMESPACE_BEGIN \
  namespace ulysses {           \
  inline namespace v0 {
#define ULYSSES_NAMESPACE_END \
  }                           \
  }

/// Marks functions usable from host and device code (layout arithmetic, block descriptors).
#if defined(__CUDACC__) || defined(__HIPCC__)
#define ULYSSES_HOST_DEVICE __host__ __device__
#else
#define ULYSSES_HOST_DEVICE
#endif
