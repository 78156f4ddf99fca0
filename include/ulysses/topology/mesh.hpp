// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Mesh: a world of ranks as U Ulysses ranks × R ring ranks (R = 1: plain Ulysses) × an
///        outer dimension (data parallelism), on nodes of ranks_per_node ranks; the Ulysses group
///        inside a node first (RingOrder::ulysses_inner), or the ring (ring_inner).
///
/// World ranks are numbered node first (split_by_node(), split_ring() renumber an MPI world so).
/// A block of U·R consecutive ranks is one Ulysses × Ring group; inside it rank j·U + u is ring
/// rank j, Ulysses rank u (u·R + j under ring_inner). Integers only. Names: U = ulysses_degree(),
/// R = ring_degree(), N = ranks_per_node(). See docs/design.md and docs/ring.md ("When to use it").
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

/// Which dimension of a Ulysses × Ring block is inner (consecutive ranks, inside a node first).
enum class RingOrder : int {
  ulysses_inner = 0,  ///< within-block index j·U + u: the Ulysses all-to-all on the nearest ranks (default)
  ring_inner = 1,     ///< within-block index u·R + j: the ring on the nearest ranks
};

/// The communicators of a mesh (Mesh::split_key()).
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

/// World = U × R × outer ranks on nodes of N ranks (see the file comment).
class Mesh {
 public:
  /// A plain Ulysses mesh (R = 1): groups of U consecutive ranks.
  /// @param world          total ranks W >= 1
  /// @param ulysses_degree U >= 1, the size of each Ulysses (sequence-parallel) group
  /// @param ranks_per_node N >= 1, ranks (GPUs) of one node
  /// @throws Error(invalid_mesh) a degree < 1; W not a multiple of U or of N; a group straddling a
  ///         node boundary. The message lists the U that work.
  Mesh(int world, int ulysses_degree, int ranks_per_node) : W_(world), U_(ulysses_degree), R_(1), N_(ranks_per_node) { check_plain(); }
  /// A Ulysses × Ring mesh.
  /// @param world, ulysses_degree, ranks_per_node  as above
  /// @param ring_degree    R >= 1, ranks of one ring
  /// @param order          which dimension is inner
  /// @throws Error(invalid_mesh), naming what does not fit: a degree < 1; W not whole nodes; U·R
  ///         not tiling the world; a block or the inner group straddling a node boundary.
  Mesh(int world, int ulysses_degree, int ring_degree, int ranks_per_node, RingOrder order = RingOrder::ulysses_inner)
      : W_(world), U_(ulysses_degree), R_(ring_degree), N_(ranks_per_node), order_(order) {
    check_ring();
  }

  /// The Ulysses degrees a world of `world` ranks on nodes of `ranks_per_node` admits, ascending:
  /// the divisors of N, and N times the divisors of world / N (empty when the world is not whole
  /// nodes or an argument is < 1). O(sqrt(world)).
  static std::vector<int> degrees(int world, int ranks_per_node) {
    std::vector<int> v;
    if (world < 1 || ranks_per_node < 1 || world % ranks_per_node != 0) return v;
    for (std::int64_t d : detail::divisors(ranks_per_node)) v.push_back(static_cast<int>(d));
    for (std::int64_t m : detail::divisors(world / ranks_per_node))
      if (m > 1) v.push_back(ranks_per_node * static_cast<int>(m));
    return v;
  }

  int world() const { return W_; }                       ///< W
  int ulysses_degree() const { return U_; }              ///< U
  int ring_degree() const { return R_; }                 ///< R (1: plain Ulysses)
  int block_degree() const { return U_ * R_; }           ///< U·R: the context-parallel group
  int outer_degree() const { return W_ / (U_ * R_); }    ///< W / (U·R): the data-parallel degree
  int ranks_per_node() const { return N_; }              ///< N
  int num_nodes() const { return W_ / N_; }              ///< W / N
  RingOrder order() const { return order_; }             ///< which dimension is inner
  int node(int world_rank) const { return world_rank / N_; }  ///< w's node
  /// Nodes one Ulysses group spans (ulysses_inner: U / N when U > N, else 1).
  int ulysses_group_nodes() const { return U_ > N_ ? U_ / N_ : 1; }
  [[deprecated("use ulysses_group_nodes()")]] int nodes_per_group() const { return ulysses_group_nodes(); }
  [[deprecated("use ulysses_spans_nodes()")]] bool group_spans_nodes() const { return ulysses_spans_nodes(); }

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
  /// w's index within its Ulysses × Ring block (0 .. U·R−1). @throws Error(invalid_group) w outside [0, W).
  int block_index(int w) const { return within(w); }
  /// The world rank of (outer rank o, ring rank j, Ulysses rank u).
  int world_rank(int o, int j, int u) const { return o * U_ * R_ + (order_ == RingOrder::ulysses_inner ? j * U_ + u : u * R_ + j); }
  /// Index of w's Ulysses group (0 .. W/U−1; equal for its members, distinct between groups).
  int ulysses_group(int w) const { return outer_rank(w) * R_ + ring_rank(w); }
  /// Index of w's ring (0 .. W/R−1).
  int ring_group(int w) const { return outer_rank(w) * U_ + ulysses_rank(w); }
  /// Index of w's outer group (0 .. U·R−1): its ring rank · U + its Ulysses rank.
  int outer_group(int w) const { return ring_rank(w) * U_ + ulysses_rank(w); }
  int ulysses_color(int w) const { return ulysses_group(w); }  ///< ulysses_group(w), as a split colour
  int ring_color(int w) const { return ring_group(w); }        ///< ring_group(w), as a split colour
  int outer_color(int w) const { return outer_group(w); }      ///< outer_group(w), as a split colour

  /// The world ranks of Ulysses group g (ulysses_group()'s index), by Ulysses rank.
  std::vector<int> ulysses_group_ranks(int g) const {
    std::vector<int> v;
    for (int u = 0; u < U_; ++u) v.push_back(world_rank(g / R_, g % R_, u));
    return v;
  }
  /// The world ranks of outer group c (outer_group()'s index), by outer rank.
  std::vector<int> outer_group_ranks(int c) const {
    std::vector<int> v;
    for (int o = 0; o < outer_degree(); ++o) v.push_back(world_rank(o, c / U_, c % U_));
    return v;
  }
  /// The world ranks of w's Ulysses group (U ranks, by Ulysses rank).
  std::vector<int> ulysses_ranks_of(int w) const { return ulysses_group_ranks(ulysses_group(w)); }
  /// The world ranks of w's ring (R ranks, by ring rank).
  std::vector<int> ring_ranks_of(int w) const {
    std::vector<int> v;
    for (int j = 0; j < R_; ++j) v.push_back(world_rank(outer_rank(w), j, ulysses_rank(w)));
    return v;
  }
  /// The world ranks of w's outer group (the ranks of equal ring and Ulysses rank, by outer rank).
  std::vector<int> outer_ranks_of(int w) const { return outer_group_ranks(outer_group(w)); }
  /// World rank w's colour and key for a split of the world into groups `g`: the members of a
  /// colour are exactly ulysses_ranks_of(w), ring_ranks_of(w), the U·R ranks of w's block, or
  /// outer_ranks_of(w), ranked in that order by the key (what split_ring() hands to the backend).
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
  /// The node layout of a Ulysses group (the same for every group): give it to PlanOptions::nodes.
  NodeLayout nodes() const {
    const int stride = order_ == RingOrder::ulysses_inner ? 1 : R_;
    return NodeLayout::uniform(U_, stride >= N_ ? 1 : (U_ < N_ / stride ? U_ : N_ / stride));
  }
  /// What the layout implies that is allowed but likely slow, or "": a ring inside a node while
  /// the Ulysses all-to-all crosses nodes (its volume per rank does not shrink with U); a Ulysses
  /// group spanning nodes.
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

  /// Deprecated (removed in 0.3): use the free function check_heads(mesh, shape), which this
  /// calls. Defined in plan/attention.hpp, which a caller has included to build `shape`.
  [[deprecated("use check_heads(mesh, shape)")]] void check_heads(const AttentionShape& shape) const;
  /// Deprecated (removed in 0.3): use the free function check_heads(mesh, shape, policy).
  [[deprecated("use check_heads(mesh, shape, policy)")]] void check_heads(const AttentionShape& shape, HeadPolicy policy) const;

 private:
  void check_plain() const {
    const std::string what = "mesh of world=" + std::to_string(W_) + ", ulysses_degree=" + std::to_string(U_) +
                             ", ranks_per_node=" + std::to_string(N_) + ": ";
    if (W_ < 1 || U_ < 1 || N_ < 1) detail::fail(Errc::invalid_mesh, what + "each must be >= 1");
    if (W_ % N_ != 0)
      detail::fail(Errc::invalid_mesh, what + "the world is not a whole number of nodes of " + std::to_string(N_) +
                                           " ranks, so no Ulysses degree fits; give the ranks per node the world really has");
    std::string why;
    if (W_ % U_ != 0) why = "the world is not a whole number of Ulysses groups";
    else if (U_ <= N_ && N_ % U_ != 0) why = "groups of " + std::to_string(U_) + " would straddle nodes of " + std::to_string(N_);
    else if (U_ > N_ && U_ % N_ != 0) why = "a group of " + std::to_string(U_) + " would hold part of a node of " + std::to_string(N_);
    if (why.empty()) return;
    std::string ok;
    for (int p : degrees(W_, N_)) ok += (ok.empty() ? "" : ",") + std::to_string(p);
    detail::fail(Errc::invalid_mesh, what + why + "; ulysses_degree in {" + ok + "} fits");
  }
  void check_ring() const {
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
  int within(int w) const {
    if (w < 0 || w >= W_) detail::fail(Errc::invalid_group, "world rank " + std::to_string(w) + " is outside [0, " + std::to_string(W_) + ")");
    return w % (U_ * R_);
  }
  // Whether a group of g ranks at stride `stride` leaves a node.
  bool span(int g, int stride) const { return static_cast<long long>(g - 1) * stride >= N_ || (g > 1 && N_ == 1); }
  int W_, U_, R_, N_;                          // world, Ulysses degree, ring degree, ranks per node
  RingOrder order_ = RingOrder::ulysses_inner;
};

ULYSSES_NAMESPACE_END
