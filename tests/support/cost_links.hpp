// SPDX-License-Identifier: Apache-2.0
// The link figures the cost-model tests compute by hand (test_ring_cost, test_hybrid).
#pragma once

#include <ulysses/tune/cost.hpp>

namespace ut {

/// 1 us + 1 GB/s inside a node, 2 us + 0.5 GB/s between nodes, nothing else.
inline ulysses::CostModel links() {
  ulysses::CostModel m;
  m.intra = ulysses::LinkCost::of(1, 1);
  m.inter = ulysses::LinkCost::of(2, 0.5);
  return m;
}

}  // namespace ut
