// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Mesh: the 2-D layout of a world of ranks as Ulysses groups (inner, contiguous ranks)
///        times an outer dimension (data or context parallelism), on nodes of equal size.
///
/// World ranks are numbered node first: rank w runs on node w / ranks_per_node (split_by_node()
/// in comm/mpi_mesh.hpp renumbers an MPI world so, whatever the launcher's order). A Ulysses
/// group is `ulysses_degree` consecutive ranks, so it stays inside one node when it fits there
/// and spans whole nodes otherwise; the outer group of a rank is the ranks holding the same shard
/// in the other Ulysses groups (same rank in group). This is the layout DeepSpeed-Ulysses (Jacobs et
/// al., arXiv:2309.14509, section 3) and USP (Fang & Zhao, arXiv:2405.07719) recommend: the
/// all-to-all, whose volume per rank does not shrink with P, on the fastest links.
///
/// A Mesh holds integers only. Whether an attention layer's heads split over its Ulysses groups
/// is check_heads(mesh, shape, policy), with the attention specs in plan/attention.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../detail/checked.hpp"
#include "../error.hpp"
#include "nodes.hpp"

ULYSSES_NAMESPACE_BEGIN

struct AttentionShape;         // plan/attention.hpp
enum class HeadPolicy : int;   // plan/attention.hpp

/// World = ulysses_degree x outer_degree ranks, on nodes of ranks_per_node ranks (see the file
/// comment for the numbering).
class Mesh {
 public:
  /// @param world          total ranks W >= 1
  /// @param ulysses_degree P >= 1, the size of each Ulysses (sequence-parallel) group
  /// @param ranks_per_node R >= 1, ranks (GPUs) of one node
  /// @throws Error(invalid_mesh) a degree < 1; W not a multiple of P or of R; P < R and R not a
  ///         multiple of P, or P > R and P not a multiple of R (a group would straddle a node
  ///         boundary with a different share on each side). The message lists the P that work.
  Mesh(int world, int ulysses_degree, int ranks_per_node) : W_(world), P_(ulysses_degree), R_(ranks_per_node) {
    if (W_ < 1 || P_ < 1 || R_ < 1)
      detail::fail(Errc::invalid_mesh, "mesh of world=" + std::to_string(W_) + ", ulysses_degree=" + std::to_string(P_) +
                                           ", ranks_per_node=" + std::to_string(R_) + ": each must be >= 1");
    const std::string what = "mesh of world=" + std::to_string(W_) + ", ulysses_degree=" + std::to_string(P_) +
                             ", ranks_per_node=" + std::to_string(R_) + ": ";
    if (W_ % R_ != 0)
      detail::fail(Errc::invalid_mesh, what + "the world is not a whole number of nodes of " + std::to_string(R_) +
                                           " ranks, so no Ulysses degree fits; give the ranks per node the world really has");
    std::string why;
    if (W_ % P_ != 0) why = "the world is not a whole number of Ulysses groups";
    else if (P_ <= R_ && R_ % P_ != 0) why = "groups of " + std::to_string(P_) + " would straddle nodes of " + std::to_string(R_);
    else if (P_ > R_ && P_ % R_ != 0) why = "a group of " + std::to_string(P_) + " would hold part of a node of " + std::to_string(R_);
    if (!why.empty()) {
      std::string ok;
      for (int p : degrees(W_, R_)) ok += (ok.empty() ? "" : ",") + std::to_string(p);
      detail::fail(Errc::invalid_mesh, what + why + "; ulysses_degree in {" + ok + "} fits");
    }
  }

  /// The Ulysses degrees a world of `world` ranks on nodes of `ranks_per_node` admits, ascending:
  /// the divisors of R, and R times the divisors of world / R (empty when the world is not whole
  /// nodes or an argument is < 1). O(sqrt(world)).
  static std::vector<int> degrees(int world, int ranks_per_node) {
    std::vector<int> v;
    if (world < 1 || ranks_per_node < 1 || world % ranks_per_node != 0) return v;
    for (std::int64_t d : detail::divisors(ranks_per_node)) v.push_back(static_cast<int>(d));
    for (std::int64_t m : detail::divisors(world / ranks_per_node))
      if (m > 1) v.push_back(ranks_per_node * static_cast<int>(m));
    return v;
  }

  int world() const { return W_; }                                   ///< W
  int ulysses_degree() const { return P_; }                          ///< P
  int outer_degree() const { return W_ / P_; }                       ///< W / P (data or context parallel)
  int ranks_per_node() const { return R_; }                          ///< R
  int num_nodes() const { return W_ / R_; }                          ///< W / R
  int nodes_per_group() const { return P_ > R_ ? P_ / R_ : 1; }      ///< nodes one Ulysses group spans
  bool group_spans_nodes() const { return P_ > R_; }                 ///< whether the all-to-all crosses nodes
  int ulysses_group(int world_rank) const { return world_rank / P_; }  ///< index of w's Ulysses group
  int ulysses_rank(int world_rank) const { return world_rank % P_; }   ///< w's rank in its Ulysses group
  int outer_group(int world_rank) const { return world_rank % P_; }    ///< index of w's outer group (= ulysses_rank)
  int outer_rank(int world_rank) const { return world_rank / P_; }     ///< w's rank in its outer group
  int node(int world_rank) const { return world_rank / R_; }           ///< w's node

  /// The world ranks of Ulysses group g (0 .. outer_degree()-1), ascending.
  std::vector<int> ulysses_ranks(int g) const {
    std::vector<int> v;
    for (int i = 0; i < P_; ++i) v.push_back(g * P_ + i);
    return v;
  }
  /// The world ranks of outer group c (0 .. P-1): rank c of every Ulysses group, ascending.
  std::vector<int> outer_ranks(int c) const {
    std::vector<int> v;
    for (int g = 0; g < outer_degree(); ++g) v.push_back(g * P_ + c);
    return v;
  }
  /// The node layout of a Ulysses group (the same for every group): P / R nodes of R ranks, or
  /// one node. Give it to PlanOptions::nodes.
  NodeLayout nodes() const { return NodeLayout::uniform(P_, P_ > R_ ? R_ : P_); }

  /// Deprecated (removed in 0.3): use the free function check_heads(mesh, shape), which this
  /// calls. Defined in plan/attention.hpp, which a caller has included to build `shape`.
  /// @throws what check_heads(const Mesh&, const AttentionShape&, HeadPolicy) throws.
  [[deprecated("use check_heads(mesh, shape)")]] void check_heads(const AttentionShape& shape) const;
  /// Deprecated (removed in 0.3): use the free function check_heads(mesh, shape, policy), which
  /// this calls. Defined in plan/attention.hpp.
  /// @throws what check_heads(const Mesh&, const AttentionShape&, HeadPolicy) throws.
  [[deprecated("use check_heads(mesh, shape, policy)")]] void check_heads(const AttentionShape& shape, HeadPolicy policy) const;

 private:
  int W_, P_, R_;
};

ULYSSES_NAMESPACE_END
