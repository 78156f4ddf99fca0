// SPDX-License-Identifier: Apache-2.0
// mesh.hpp: the 2-D layout of Ulysses groups and outer groups on nodes; its coded errors and the
// head checks a Ulysses degree must pass.
#include <doctest/doctest.h>

#include <ulysses/ulysses.hpp>

#include "expect_error.hpp"

using namespace ulysses;

TEST_CASE("Mesh: groups of consecutive node-first ranks, outer groups across them") {
  const Mesh m(64, 16, 8);  // 8 nodes of 8; a Ulysses group spans 2 nodes; 4 groups
  CHECK(m.outer_degree() == 4);
  CHECK(m.num_nodes() == 8);
  CHECK(m.ulysses_group_nodes() == 2);
  CHECK(m.ulysses_spans_nodes());
  CHECK(m.ring_degree() == 1);
  CHECK(m.ulysses_group(37) == 2);
  CHECK(m.ulysses_rank(37) == 5);
  CHECK(m.outer_group(37) == 5);
  CHECK(m.outer_rank(37) == 2);
  CHECK(m.node(37) == 4);
  CHECK(m.ulysses_group_ranks(1).front() == 16);
  CHECK(m.ulysses_group_ranks(1).back() == 31);
  CHECK(m.outer_group_ranks(5) == std::vector<int>{5, 21, 37, 53});
  CHECK(m.nodes() == NodeLayout::uniform(16, 8));
  CHECK(m.ulysses_ranks_of(37) == m.ulysses_group_ranks(2));  // by world rank, and by group index
  CHECK(m.outer_ranks_of(37) == m.outer_group_ranks(5));
  const Mesh in_node(64, 4, 8);  // two groups per node
  CHECK(!in_node.ulysses_spans_nodes());
  CHECK(!in_node.nodes().spans_nodes());
  CHECK(in_node.ulysses_group_nodes() == 1);
}

TEST_CASE("Mesh: degrees that do not tile the world or the nodes are invalid_mesh, naming the degrees that fit") {
  CHECK(ut::code_of([] { Mesh(64, 0, 8); }) == Errc::invalid_mesh);
  CHECK(ut::code_of([] { Mesh(60, 4, 8); }) == Errc::invalid_mesh);   // not whole nodes
  CHECK(ut::code_of([] { Mesh(64, 24, 8); }) == Errc::invalid_mesh);  // not whole groups
  CHECK(ut::code_of([] { Mesh(48, 6, 8); }) == Errc::invalid_mesh);   // groups of 6 straddle nodes of 8
  CHECK(ut::code_of([] { Mesh(48, 12, 8); }) == Errc::invalid_mesh);  // 1.5 nodes a group
  const auto e = ut::error_of([] { Mesh(48, 6, 8); });
  CHECK(e.second.find("{1,2,4,8,16,24,48}") != std::string::npos);
  CHECK(Mesh::degrees(48, 8) == std::vector<int>{1, 2, 4, 8, 16, 24, 48});
  CHECK(Mesh::degrees(12, 8).empty());  // not whole nodes: nothing fits, and the message says so
  const auto none = ut::error_of([] { Mesh(12, 1, 8); });
  CHECK(none.first == Errc::invalid_mesh);
  CHECK(none.second.find("no Ulysses degree fits") != std::string::npos);
  CHECK(ut::code_of([] { Mesh(2147483647, 2, 1); }) == Errc::invalid_mesh);  // no int overflow on the largest world
  CHECK(Mesh::degrees(2147483647, 1) == std::vector<int>{1, 2147483647});
}

TEST_CASE("check_heads(mesh, shape): P <= H, and attention_specs' rules") {
  const AttentionShape llama70b{64, 8, 128, 128};
  CHECK(ut::code_of([&] { check_heads(Mesh(256, 128, 8), llama70b); }) == Errc::invalid_mesh);
  CHECK(ut::code_of([&] { check_heads(Mesh(256, 16, 8), llama70b); }) == Errc{});  // kv heads on 2 ranks each
  CHECK(ut::code_of([&] { check_heads(Mesh(240, 3, 1), llama70b); }) == Errc::heads_not_divisible);
  CHECK(ut::code_of([&] { check_heads(Mesh(240, 3, 1), llama70b, HeadPolicy::balanced); }) == Errc{});
  CHECK(ut::code_of([&] { check_heads(Mesh(8, 8, 8), AttentionShape{0, 0, 64, 64}); }) == Errc::invalid_shape);
  const AttentionShape falcon{71, 1, 64, 64};
  CHECK(ut::code_of([&] { check_heads(Mesh(8, 8, 8), falcon); }) == Errc::heads_not_divisible);
}
