// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief CopyPolicy: the tuning constants of the copy kernel (threads per CTA, loads in flight,
///        vector and tile size), comparable and printable, and the policy this translation unit's
///        kernel is compiled with (one per TU; today kCopyPolicy serves every architecture).
///
/// As CUB's agent policies: one value type instead of loose literals, so that tools say what ran
/// (CudaExecutor::policy()). docs/headers.md, "cuda/policy.cuh". Needs nvcc.
#pragma once

#include <cstdint>
#include <string>

#include "../version.hpp"
#include "detail/config.cuh"

ULYSSES_NAMESPACE_BEGIN

/// The tuning constants of the copy kernel (cuda/detail/kernel.cuh). A plain value: compare it,
/// print it (to_string()), pass it between translation units built for different architectures.
struct CopyPolicy {
  /// Threads per CTA; also the most rows of a unit whose row offsets the CTA tabulates in shared
  /// memory (one row per thread, blocks that are not 1-D).
  int threads = 256;
  /// Vectors each thread loads before it stores them (loads in flight per thread).
  int unroll = 4;
  /// Bytes of the widest vector a thread moves (16: one 128-bit load or store).
  int vector_bytes = 16;

  /// Bytes of one unit of work: threads × unroll vectors of vector_bytes (16 KiB by default, a
  /// multiple of vector_bytes). A unit is a group of whole rows of one block when its rows are
  /// shorter, else a segment of one row.
  constexpr std::int64_t tile_bytes() const { return std::int64_t{vector_bytes} * threads * unroll; }
};

/// Same constants (every field).
constexpr bool operator==(const CopyPolicy& a, const CopyPolicy& b) {
  return a.threads == b.threads && a.unroll == b.unroll && a.vector_bytes == b.vector_bytes;
}
constexpr bool operator!=(const CopyPolicy& a, const CopyPolicy& b) { return !(a == b); }

/// "threads=256 unroll=4 vector_bytes=16 tile_bytes=16384": what tools print to say what ran.
inline std::string to_string(const CopyPolicy& p) {
  return "threads=" + std::to_string(p.threads) + " unroll=" + std::to_string(p.unroll) +
         " vector_bytes=" + std::to_string(p.vector_bytes) + " tile_bytes=" + std::to_string(p.tile_bytes());
}

ULYSSES_NAMESPACE_END

ULYSSES_CUDA_DETAIL_BEGIN

/// The policy the copy kernel of this translation unit is compiled with (every architecture of
/// its `__CUDA_ARCH_LIST__`; see docs/headers.md, "cuda/policy.cuh").
inline constexpr CopyPolicy kCopyPolicy{};

/// Threads per CTA of the copy kernel (kCopyPolicy.threads).
inline constexpr int kCopyThreads = kCopyPolicy.threads;
/// Vectors each thread keeps in flight (kCopyPolicy.unroll).
inline constexpr int kCopyUnroll = kCopyPolicy.unroll;
/// Bytes of one unit of work (a multiple of 16): kCopyThreads * kCopyUnroll 16-byte vectors
/// (kCopyPolicy.tile_bytes()).
inline constexpr std::int64_t kTileBytes = kCopyPolicy.tile_bytes();

static_assert(kCopyPolicy.vector_bytes == 16, "the kernel's widest vector is uint4 (16 bytes)");
static_assert(kTileBytes % 16 == 0, "a unit's segment starts at a multiple of the widest vector");
static_assert(kTileBytes <= (std::int64_t{1} << 16), "the kernel divides vector indices of a unit in 16 bits (reciprocal())");

ULYSSES_CUDA_DETAIL_END
