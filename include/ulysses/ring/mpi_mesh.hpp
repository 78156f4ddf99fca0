// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief split_ring(): an MPI world cut into Ulysses groups, rings and outer groups laid out on its
///        nodes (a Mesh), and what it returns (MpiRingMesh).
///
/// Needs <mpi.h> (link ulysses::mpi). Wrap MpiRingMesh::ulysses and MpiRingMesh::ring in MpiComm
/// (comm/mpi_comm.hpp): the Ulysses exchange runs over the first, RingRotation over the second.
/// Nodes are found as split_by_node() (comm/mpi_mesh.hpp) finds them, which this calls for the
/// U·R blocks.
#pragma once

#include <mpi.h>

#include <string>

#include "../comm/mpi_mesh.hpp"
#include "../error.hpp"
#include "../topology/mesh.hpp"

ULYSSES_NAMESPACE_BEGIN

/// What split_ring() returns: this rank's communicators (owned by the caller: free() them), the
/// mesh, and this rank's node-first world index.
struct MpiRingMesh {
  MPI_Comm ulysses = MPI_COMM_NULL;  ///< the Ulysses group: U ranks, rank = mesh.ulysses_rank(index)
  MPI_Comm ring = MPI_COMM_NULL;     ///< the ring: R ranks, rank = mesh.ring_rank(index)
  MPI_Comm block = MPI_COMM_NULL;    ///< the U·R ranks of this rank's Ulysses × Ring group (context-parallel group)
  MPI_Comm outer = MPI_COMM_NULL;    ///< the ranks of equal ring and Ulysses rank in the other blocks (data parallel)
  Mesh mesh{1, 1, 1, 1};             ///< the layout
  int index = 0;                     ///< this rank's node-first world index
  /// MPI_Comm_free of the four communicators (collective over each).
  void free() {
    for (MPI_Comm* c : {&ulysses, &ring, &block, &outer})
      if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
};

/// Cuts `world` into U × R × outer laid out on the nodes (Mesh, ulysses_inner by default).
/// `ranks_per_node` > 0 simulates nodes of that many consecutive world ranks (tests); 0 asks MPI
/// for the shared-memory nodes. Collective over `world`.
/// @throws Error(invalid_mesh) U or R < 1, ranks_per_node < 0, or U·R not dividing the world
///         (before any communication: the message gives ranks_per_node as passed, "0 (the nodes
///         MPI finds)" for 0), and what Mesh or split_by_node() throw for the nodes found
///         (every rank alike: the checks use all-gathered values only); Error(backend) an MPI call failed.
inline MpiRingMesh split_ring(MPI_Comm world, int ulysses_degree, int ring_degree, int ranks_per_node = 0,
                              RingOrder order = RingOrder::ulysses_inner) {
  int W = 0;
  if (MPI_Comm_size(world, &W) != MPI_SUCCESS) throw Error(Errc::backend, "MPI_Comm_size failed");
  const std::string what = "split_ring: world=" + std::to_string(W) + ", U=" + std::to_string(ulysses_degree) + ", R=" +
                           std::to_string(ring_degree) + ", ranks_per_node=" + std::to_string(ranks_per_node) +
                           (ranks_per_node == 0 ? " (the nodes MPI finds)" : "") + ": ";
  if (ulysses_degree < 1 || ring_degree < 1 || ranks_per_node < 0)
    detail::fail(Errc::invalid_mesh, what + "U and R must be >= 1, ranks_per_node >= 0");
  const long long block = static_cast<long long>(ulysses_degree) * ring_degree;
  if (block > W || W % block != 0)
    detail::fail(Errc::invalid_mesh, what + "R x U = " + std::to_string(block) + " ranks do not tile the world of " + std::to_string(W) +
                                         "; choose U and R with U*R dividing " + std::to_string(W));
  MpiMesh m = split_by_node(world, ulysses_degree * ring_degree, ranks_per_node);
  MpiRingMesh r;
  r.mesh = Mesh(W, ulysses_degree, ring_degree, m.mesh.ranks_per_node(), order);
  r.index = m.index;
  r.block = m.ulysses;
  r.outer = m.outer;
  const int within = m.mesh.ulysses_rank(m.index);  // index in the block
  auto check = [](int rc) {
    if (rc != MPI_SUCCESS) throw Error(Errc::backend, "MPI_Comm_split failed");
  };
  check(MPI_Comm_split(r.block, r.mesh.ring_rank(within), r.mesh.ulysses_rank(within), &r.ulysses));
  check(MPI_Comm_split(r.block, r.mesh.ulysses_rank(within), r.mesh.ring_rank(within), &r.ring));
  return r;
}

ULYSSES_NAMESPACE_END
