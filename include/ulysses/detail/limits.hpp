// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief kMaxTableRanks: the one limit of the library's fixed-size per-rank tables and 64-bit
///        rank masks. See docs/design.md ("Layers").
#pragma once

#include "../version.hpp"

ULYSSES_NAMESPACE_BEGIN

/// The most ranks (or a row's contributions, one a rank) that a fixed-size per-rank table or a
/// 64-bit rank mask holds: the host merge's step tables (beyond it the fold runs in chunks), a
/// decode group's tables and Path::direct's decode peer pointers, a device window's control blocks
/// and its late-rank mask (0.1 had four names for it).
inline constexpr int kMaxTableRanks = 64;

ULYSSES_NAMESPACE_END
