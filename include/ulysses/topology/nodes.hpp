// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief NodeLayout: which node each rank of a sequence-parallel group runs on. The two-level
///        exchange (topology/route.hpp) is laid out from it, Mesh::nodes() and split_by_node()
///        (comm/mpi_mesh.hpp) make one, and PlanOptions::nodes takes it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../detail/hash.hpp"
#include "../error.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Which node each rank of a sequence-parallel group runs on. Ranks of one node need not be
/// contiguous, but the exchange takes fewest messages when they are (Mesh and split_by_node()
/// number them so). Nodes are numbered by their lowest rank (node 0 holds rank 0).
class NodeLayout {
 public:
  /// One node (the default: no two-level route).
  NodeLayout() = default;

  /// `node_of[r]`: any id of rank r's node (equal ids: same node); P = node_of.size().
  /// @throws Error(invalid_mesh) an empty list.
  static NodeLayout of(const std::vector<int>& node_of) {
    if (node_of.empty()) detail::fail(Errc::invalid_mesh, "NodeLayout::of: the list of node ids is empty");
    NodeLayout n;
    std::vector<int> ids;  // ids in order of first appearance
    n.node_.resize(node_of.size());
    for (std::size_t r = 0; r < node_of.size(); ++r) {
      const auto it = std::find(ids.begin(), ids.end(), node_of[r]);
      n.node_[r] = static_cast<int>(it - ids.begin());
      if (it == ids.end()) ids.push_back(node_of[r]);
    }
    n.index();
    return n;
  }
  /// P ranks, `ranks_per_node` consecutive ranks a node (the last node may hold fewer).
  /// @throws Error(invalid_mesh) P < 1 or ranks_per_node < 1.
  static NodeLayout uniform(int P, int ranks_per_node) {
    if (P < 1 || ranks_per_node < 1)
      detail::fail(Errc::invalid_mesh, "NodeLayout::uniform(P=" + std::to_string(P) + ", ranks_per_node=" +
                                           std::to_string(ranks_per_node) + "): both must be >= 1");
    std::vector<int> ids(static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r) ids[static_cast<std::size_t>(r)] = r / ranks_per_node;
    return of(ids);
  }
  /// Consecutive nodes of the given rank counts ({4, 3}: ranks 0-3 on node 0, 4-6 on node 1).
  /// @throws Error(invalid_mesh) an empty list or a count < 1.
  static NodeLayout sizes(const std::vector<int>& ranks_per_node) {
    if (ranks_per_node.empty()) detail::fail(Errc::invalid_mesh, "NodeLayout::sizes: the list of node sizes is empty");
    std::vector<int> ids;
    for (std::size_t n = 0; n < ranks_per_node.size(); ++n) {
      if (ranks_per_node[n] < 1)
        detail::fail(Errc::invalid_mesh, "NodeLayout::sizes: node " + std::to_string(n) + " has " +
                                             std::to_string(ranks_per_node[n]) + " ranks; every node needs >= 1");
      ids.insert(ids.end(), static_cast<std::size_t>(ranks_per_node[n]), static_cast<int>(n));
    }
    return of(ids);
  }

  /// Ranks described (0 for the default single node, which fits any P).
  int degree() const { return static_cast<int>(node_.size()); }
  /// Number of nodes (1 for the default).
  int num_nodes() const { return node_.empty() ? 1 : static_cast<int>(members_.size()); }
  /// True when the ranks sit on more than one node.
  bool spans_nodes() const { return num_nodes() > 1; }
  /// The node of rank r (0 .. num_nodes()-1). @pre r in [0, degree()) unless the default.
  int node(int r) const { return node_.empty() ? 0 : node_[static_cast<std::size_t>(r)]; }
  /// The ranks of node n, ascending. @pre not the default layout.
  const std::vector<int>& members(int n) const { return members_[static_cast<std::size_t>(n)]; }
  /// Position of rank r among the ranks of its node.
  int local_index(int r) const { return local_[static_cast<std::size_t>(r)]; }
  /// Rank counts of the nodes, as "[4,3]".
  std::string str() const {
    std::string s = "[";
    for (int n = 0; n < num_nodes(); ++n)
      s += (n ? "," : "") + std::to_string(node_.empty() ? 0 : static_cast<int>(members_[static_cast<std::size_t>(n)].size()));
    return s + "]";
  }
  /// A hash of the layout, for the cross-rank plan check (the agreement record): 64-bit FNV-1a
  /// (detail/hash.hpp) over each rank's node ordinal, rank 0 first, as 8 bytes little end first;
  /// equal on every rank and build for equal layouts. 0 for the default (one node).
  std::uint64_t hash() const {
    if (node_.empty()) return 0;
    std::uint64_t h = detail::kFnvBasis;
    for (int v : node_) h = detail::fnv1a(h, v);
    return h;
  }
  bool operator==(const NodeLayout& o) const { return node_ == o.node_; }
  bool operator!=(const NodeLayout& o) const { return !(*this == o); }

 private:
  void index() {
    int n_nodes = 0;
    for (int v : node_) n_nodes = std::max(n_nodes, v + 1);
    members_.assign(static_cast<std::size_t>(n_nodes), {});
    local_.resize(node_.size());
    for (std::size_t r = 0; r < node_.size(); ++r) {
      auto& m = members_[static_cast<std::size_t>(node_[r])];
      local_[r] = static_cast<int>(m.size());
      m.push_back(static_cast<int>(r));
    }
  }
  std::vector<int> node_;                  // node ordinal of each rank
  std::vector<std::vector<int>> members_;  // ranks of each node
  std::vector<int> local_;                 // index of each rank within its node
};

ULYSSES_NAMESPACE_END
