// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief RingPartition, RingLayout and RingConfig of Ulysses × Ring: they live in the partition
///        layer (partition/ring.hpp, so that a Plan's options can carry a RingConfig); this path
///        includes it for the ring's users. See docs/ring.md.
#pragma once

#include "../partition/ring.hpp"
