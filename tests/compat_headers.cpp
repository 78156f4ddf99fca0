// SPDX-License-Identifier: Apache-2.0
// The header paths of ulysses 0.1 (before the folders of 0.2) still compile: each is a forwarding
// header kept for one minor version. This file includes every one of them and uses a name from each.
#include <ulysses/attention.hpp>
#include <ulysses/block.hpp>
#include <ulysses/copy.hpp>
#include <ulysses/cost.hpp>
#include <ulysses/element.hpp>
#include <ulysses/layout.hpp>
#include <ulysses/mesh.hpp>
#include <ulysses/partition.hpp>
#include <ulysses/pipeline.hpp>
#include <ulysses/plan.hpp>
#include <ulysses/topology.hpp>
#include <ulysses/transport.hpp>
#include <ulysses/comm/local.hpp>  // (not an old path: LocalGroup for choose_path)

#include <cstdio>

int main() {
  using namespace ulysses;
  const AttentionSpecs a = attention_specs<float>(2, {4, 2, 8});       // attention.hpp
  const Plan plan({2, 0}, 1, SeqPartition::even(8, 2), a.qkv());        // plan.hpp, partition.hpp
  const Layout l = Layout::dense(Format::bshd, 1, 4, 4, 8);              // layout.hpp
  const BufferTable table{};                                             // block.hpp
  HostExecutor exec;                                                     // copy.hpp
  const Mesh mesh(4, 2, 2);                                              // mesh.hpp
  const NodeLayout nodes = NodeLayout::uniform(4, 2);                    // topology.hpp
  const Path path = choose_path<LocalGroup::Comm, HostExecutor>(plan);   // transport.hpp
  const bool ok = plan.degree() == 2 && l.extent[1] == 4 && table.base[0] == nullptr && mesh.outer_degree() == 2 &&
                  nodes.num_nodes() == 2 && path == Path::direct && element_type_of_v<float> == ElementType::float32 &&
                  sizeof(HostPipeline) > 0 && sizeof(CostModel) > 0 && sizeof(exec) > 0;
  std::printf("compat headers: %s\n", ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
