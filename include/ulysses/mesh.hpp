// SPDX-License-Identifier: Apache-2.0
/// @file mesh.hpp
/// @brief Mesh: the 2-D layout of a world of ranks as Ulysses groups (inner, contiguous ranks)
///        times an outer dimension (data or context parallelism), on nodes of equal size.
///
/// World ranks are numbered node first: rank w runs on node w / ranks_per_node (split_by_node()
/// in comm/mpi.hpp renumbers an MPI world so, whatever the launcher's order). A Ulysses group is
/// `ulysses_degree` consecutive ranks, so it stays inside one node when it fits there and spans
/// whole nodes otherwise; the outer group of a rank is the ranks holding the same shard in the
/// other Ulysses groups (same rank in group). This is the layout DeepSpeed-Ulysses (Jacobs et
/// al., arXiv:2309.14509, section 3) and USP (Fang & Zhao, arXiv:2405.07719) recommend: the
/// all-to-all, whose volume per rank does not shrink with P, on the fastest links.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention.hpp"
#include "error.hpp"
#include "topology.hpp"

ULYSSES_NAMESPACE_BEGIN

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
    std::string why;
    if (W_ % R_ != 0) why = "the world is not a whole number of nodes of " + std::to_string(R_) + " ranks";
    else if (W_ % P_ != 0) why = "the world is not a whole number of Ulysses groups";
    else if (P_ <= R_ && R_ % P_ != 0) why = "groups of " + std::to_string(P_) + " would straddle nodes of " + std::to_string(R_);
    else if (P_ > R_ && P_ % R_ != 0) why = "a group of " + std::to_string(P_) + " would hold part of a node of " + std::to_string(R_);
    if (!why.empty()) {
      std::string ok;
      for (int p = 1; p <= W_; ++p)
        if (W_ % p == 0 && (p <= R_ ? R_ % p == 0 : p % R_ == 0)) ok += (ok.empty() ? "" : ",") + std::to_string(p);
      detail::fail(Errc::invalid_mesh, "mesh of world=" + std::to_string(W_) + ", ulysses_degree=" + std::to_string(P_) +
                                           ", ranks_per_node=" + std::to_string(R_) + ": " + why + "; ulysses_degree in {" + ok +
                                           "} fits");
    }
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

  /// Checks that an attention layer of `shape` splits over the Ulysses groups: P <= H (every rank
  /// gets a query head), and attention_specs()'s rules for `policy`.
  /// @throws Error(invalid_mesh) P > H; what attention_specs() throws (heads_not_divisible,
  ///         gqa_group_mismatch, gqa_invalid, invalid_shape), with its message.
  void check_heads(const AttentionShape& shape, HeadPolicy policy = HeadPolicy::even) const {
    if (P_ > shape.num_heads)
      detail::fail(Errc::invalid_mesh, "ulysses_degree=" + std::to_string(P_) + " exceeds the " + std::to_string(shape.num_heads) +
                                           " query heads: some ranks would hold no head; use a smaller Ulysses degree and a "
                                           "larger outer degree");
    (void)attention_specs<float>(P_, shape, ElementType::float32, policy);
  }

 private:
  int W_, P_, R_;
};

ULYSSES_NAMESPACE_END
