// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief RingMesh: a world of ranks as U Ulysses ranks × R ring ranks × an outer dimension (data
///        parallelism), on nodes of equal size; the Ulysses group inside a node first.
///
/// World ranks are numbered node first (rank w on node w / ranks_per_node; split_ring() in
/// ring/mpi_mesh.hpp renumbers an MPI world so). A block of U·R consecutive ranks is one
/// Ulysses × Ring group (outer rank w / (U·R)); inside it, RingOrder::ulysses_inner (the default,
/// USP's advice: the all-to-all, whose volume per rank does not shrink with U, on the fastest
/// links) puts the U ranks of a Ulysses group next to each other: within-block index j·U + u (ring
/// rank j, Ulysses rank u; RingPartition's world numbering); RingOrder::ring_inner puts the ring
/// inside: u·R + j. Source: USP (Fang & Zhao, arXiv:2405.07719, section 4), LoongTrain's 2-D
/// attention (arXiv:2406.18485), TransformerEngine's a2a+p2p context parallelism.
#pragma once

#include <string>
#include <vector>

#include "../error.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Which dimension of a Ulysses × Ring group is inner (consecutive ranks, inside a node first).
enum class RingOrder : int {
  ulysses_inner = 0,  ///< within-block index j·U + u: the Ulysses all-to-all on the nearest ranks (default)
  ring_inner = 1,     ///< within-block index u·R + j: the ring on the nearest ranks
};

/// The communicators of a Ulysses × Ring mesh (RingMesh::split_key()).
enum class RingGroup : int {
  ulysses = 0,  ///< the U ranks of one Ulysses group (rank: the Ulysses rank)
  ring = 1,     ///< the R ranks of one ring (rank: the ring rank)
  block = 2,    ///< the U·R ranks of one Ulysses × Ring block, the context-parallel group (rank: the index in the block)
  outer = 3,    ///< the ranks of equal ring and Ulysses rank in every block, data parallel (rank: the outer rank)
};

/// The colour and key of a rank for a split of the world into one kind of group
/// (MPI_Comm_split(world, color, key), ncclCommSplit(world, color, key)).
struct RingSplitKey {
  int color = 0;  ///< equal for the members of one group, distinct between groups, >= 0
  int key = 0;    ///< the rank's rank in its group
};

/// World = U × R × outer ranks on nodes of ranks_per_node ranks (see the file comment). Integers only.
class RingMesh {
 public:
  /// @param world           W >= 1 ranks
  /// @param ulysses_degree  U >= 1
  /// @param ring_degree     R >= 1
  /// @param ranks_per_node  N >= 1, ranks (GPUs) of one node
  /// @param order           which dimension is inner
  /// @throws Error(invalid_mesh), naming what does not fit: a degree < 1; W not whole nodes; R·U
  ///         not tiling the world (W % (U·R) != 0); a Ulysses × Ring block or the inner group
  ///         straddling a node boundary (of size < N and not dividing N, or > N and not a multiple of N).
  RingMesh(int world, int ulysses_degree, int ring_degree, int ranks_per_node, RingOrder order = RingOrder::ulysses_inner)
      : W_(world), U_(ulysses_degree), R_(ring_degree), N_(ranks_per_node), order_(order) {
    const std::string what = "ring mesh of world=" + std::to_string(W_) + ", U=" + std::to_string(U_) + ", R=" + std::to_string(R_) +
                             ", ranks_per_node=" + std::to_string(N_) + ": ";
    if (W_ < 1 || U_ < 1 || R_ < 1 || N_ < 1) detail::fail(Errc::invalid_mesh, what + "each must be >= 1");
    if (W_ % N_ != 0) detail::fail(Errc::invalid_mesh, what + "the world is not a whole number of nodes");
    if (static_cast<long long>(U_) * R_ > W_ || W_ % (U_ * R_) != 0)
      detail::fail(Errc::invalid_mesh, what + "R x U = " + std::to_string(static_cast<long long>(U_) * R_) +
                                           " ranks do not tile the world of " + std::to_string(W_) + "; choose U and R with U*R dividing " +
                                           std::to_string(W_));
    const auto straddles = [&](int g) { return g <= N_ ? N_ % g != 0 : g % N_ != 0; };
    const int inner = order_ == RingOrder::ulysses_inner ? U_ : R_;
    if (straddles(U_ * R_))
      detail::fail(Errc::invalid_mesh, what + "a Ulysses x Ring group of " + std::to_string(U_ * R_) + " ranks would straddle nodes of " +
                                           std::to_string(N_));
    if (straddles(inner))
      detail::fail(Errc::invalid_mesh, what + (order_ == RingOrder::ulysses_inner ? "a Ulysses group of " : "a ring of ") +
                                           std::to_string(inner) + " ranks would straddle nodes of " + std::to_string(N_));
  }

  int world() const { return W_; }                 ///< W
  int ulysses_degree() const { return U_; }        ///< U
  int ring_degree() const { return R_; }           ///< R
  int outer_degree() const { return W_ / (U_ * R_); }  ///< W / (U·R): the data-parallel degree
  int ranks_per_node() const { return N_; }        ///< N
  RingOrder order() const { return order_; }       ///< which dimension is inner
  /// w's ring rank (0 .. R−1). @throws Error(invalid_group) w outside [0, W).
  int ring_rank(int w) const {
    const int i = within(w);
    return order_ == RingOrder::ulysses_inner ? i / U_ : i % R_;
  }
  /// w's Ulysses rank (0 .. U−1). @throws Error(invalid_group) w outside [0, W).
  int ulysses_rank(int w) const {
    const int i = within(w);
    return order_ == RingOrder::ulysses_inner ? i % U_ : i / R_;
  }
  /// w's outer (data-parallel) rank: w / (U·R). @throws Error(invalid_group) w outside [0, W).
  int outer_rank(int w) const {
    (void)within(w);
    return w / (U_ * R_);
  }
  /// The world rank of (outer rank o, ring rank j, Ulysses rank u).
  int world_rank(int o, int j, int u) const {
    return o * U_ * R_ + (order_ == RingOrder::ulysses_inner ? j * U_ + u : u * R_ + j);
  }
  /// The world ranks of w's Ulysses group (U ranks, by Ulysses rank).
  std::vector<int> ulysses_ranks(int w) const {
    std::vector<int> v;
    for (int u = 0; u < U_; ++u) v.push_back(world_rank(outer_rank(w), ring_rank(w), u));
    return v;
  }
  /// The world ranks of w's ring (R ranks, by ring rank).
  std::vector<int> ring_ranks(int w) const {
    std::vector<int> v;
    for (int j = 0; j < R_; ++j) v.push_back(world_rank(outer_rank(w), j, ulysses_rank(w)));
    return v;
  }
  /// The world ranks of w's outer group (the ranks of equal ring and Ulysses rank, by outer rank).
  std::vector<int> outer_ranks(int w) const {
    std::vector<int> v;
    for (int o = 0; o < outer_degree(); ++o) v.push_back(world_rank(o, ring_rank(w), ulysses_rank(w)));
    return v;
  }
  /// A colour naming w's Ulysses group (equal for its members, distinct between groups): for MPI_Comm_split.
  int ulysses_color(int w) const { return outer_rank(w) * R_ + ring_rank(w); }
  /// A colour naming w's ring.
  int ring_color(int w) const { return outer_rank(w) * U_ + ulysses_rank(w); }
  /// A colour naming w's outer group.
  int outer_color(int w) const { return ring_rank(w) * U_ + ulysses_rank(w); }
  /// World rank w's colour and key for a split of the world into groups `g`: the members of a
  /// colour are exactly ulysses_ranks(w), ring_ranks(w), the U·R ranks of w's block, or
  /// outer_ranks(w), ranked in that order by the key. What split_ring() (ring/mpi_mesh.hpp,
  /// comm/nccl_mesh.cuh) hands to the backend's split.
  /// @param g  which group
  /// @param w  world rank (node-first), 0 .. W−1
  /// @throws Error(invalid_group) w outside [0, W).
  RingSplitKey split_key(RingGroup g, int w) const {
    switch (g) {
      case RingGroup::ulysses: return {ulysses_color(w), ulysses_rank(w)};
      case RingGroup::ring: return {ring_color(w), ring_rank(w)};
      case RingGroup::block: return {outer_rank(w), within(w)};
      case RingGroup::outer: break;
    }
    return {outer_color(w), outer_rank(w)};
  }
  /// Whether a Ulysses group spans nodes (its all-to-all leaves the node).
  bool ulysses_spans_nodes() const { return span(U_, order_ == RingOrder::ulysses_inner ? 1 : R_); }
  /// Whether a ring spans nodes.
  bool ring_spans_nodes() const { return span(R_, order_ == RingOrder::ulysses_inner ? U_ : 1); }
  /// What the layout implies that is allowed but likely slow, or "": a ring inside a node while
  /// the Ulysses all-to-all crosses nodes (the all-to-all's volume per rank does not shrink with U:
  /// the slow links carry the heavier traffic); a Ulysses group spanning nodes.
  std::string note() const {
    if (ulysses_spans_nodes() && !ring_spans_nodes())
      return "the ring (R=" + std::to_string(R_) + ") stays inside a node while the Ulysses all-to-all (U=" + std::to_string(U_) +
             ") crosses nodes: allowed, but the all-to-all's traffic does not shrink with U; RingOrder::ulysses_inner, or U <= " +
             std::to_string(N_) + ", puts it on the node's links";
    if (ulysses_spans_nodes())
      return "the Ulysses all-to-all (U=" + std::to_string(U_) + ") crosses nodes of " + std::to_string(N_) +
             " ranks: allowed; a smaller U and a larger R keep it inside a node";
    return "";
  }
  /// Checks that every rank of a Ulysses group gets a query head: U <= H.
  /// @throws Error(invalid_mesh) U > num_heads (naming both and the fix: a larger ring degree);
  ///         Error(invalid_shape) num_heads < 1.
  void check_heads(long long num_heads) const {
    if (num_heads < 1) detail::fail(Errc::invalid_shape, "num_heads=" + std::to_string(num_heads) + " must be >= 1");
    if (U_ > num_heads)
      detail::fail(Errc::invalid_mesh, "ulysses_degree U=" + std::to_string(U_) + " exceeds the " + std::to_string(num_heads) +
                                           " query heads; the Ulysses group cannot be larger than the head count: use U <= " +
                                           std::to_string(num_heads) + " and a ring degree R = " + std::to_string(U_ * R_) + " / U");
  }

 private:
  int within(int w) const {
    if (w < 0 || w >= W_) detail::fail(Errc::invalid_group, "world rank " + std::to_string(w) + " is outside [0, " + std::to_string(W_) + ")");
    return w % (U_ * R_);
  }
  // Whether a group of g ranks at stride `stride` leaves a node.
  bool span(int g, int stride) const { return static_cast<long long>(g - 1) * stride >= N_ || (g > 1 && N_ == 1); }
  int W_, U_, R_, N_;
  RingOrder order_;
};

ULYSSES_NAMESPACE_END
