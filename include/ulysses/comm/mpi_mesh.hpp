// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief split_by_node(): an MPI world cut into Ulysses groups and outer groups laid out on its
///        nodes (a Mesh), and what it returns (MpiMesh: the two MPI communicators, the mesh, this
///        rank's node-first index and its group's NodeLayout).
///
/// Needs <mpi.h> (link ulysses::mpi). Wrap MpiMesh::ulysses in an MpiComm (comm/mpi_comm.hpp) for
/// the exchanges of the group; give MpiMesh::nodes to PlanOptions::nodes for the two-level one.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../topology/mesh.hpp"
#include "../topology/nodes.hpp"
#include "mpi_comm.hpp"

ULYSSES_NAMESPACE_BEGIN

/// What split_by_node() returns: this rank's Ulysses group and outer group as MPI communicators
/// (owned by the caller: free() them), the mesh, this rank's node-first world index, and the node
/// layout of its Ulysses group (for PlanOptions::nodes).
struct MpiMesh {
  MPI_Comm ulysses = MPI_COMM_NULL;  ///< the Ulysses group: P ranks, rank = mesh.ulysses_rank(index)
  MPI_Comm outer = MPI_COMM_NULL;    ///< the ranks holding the same shard in the other groups (W / P ranks)
  Mesh mesh{1, 1, 1};                ///< the layout (world, P, ranks per node)
  int index = 0;                     ///< this rank's position in the node-first numbering (node * R + local rank)
  NodeLayout nodes;                  ///< mesh.nodes(): give it to PlanOptions::nodes
  /// MPI_Comm_free of both communicators (collective over each).
  void free() {
    if (ulysses != MPI_COMM_NULL) MPI_Comm_free(&ulysses);
    if (outer != MPI_COMM_NULL) MPI_Comm_free(&outer);
  }
};

/// Cuts `world` into Ulysses groups of `ulysses_degree` ranks laid out on the nodes: each group is
/// consecutive ranks of the node-first numbering (whole nodes, or a part of one), whatever order
/// the launcher gave the ranks; the outer group joins the ranks of equal rank in group. Nodes are
/// found with MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) and ordered by their lowest world rank;
/// `ranks_per_node` > 0 instead simulates nodes of that many consecutive world ranks (tests, or
/// launchers whose shared-memory domains are not the nodes you mean). Collective over `world`.
/// @throws Error(invalid_mesh) ranks_per_node < 0, nodes of different sizes, or a Mesh that does not
///         fit (see Mesh: e.g. a world that is not whole nodes of ranks_per_node);
///         Error(backend) an MPI call failed. Every rank throws the same (the checks use
///         all-gathered values only).
inline MpiMesh split_by_node(MPI_Comm world, int ulysses_degree, int ranks_per_node = 0) {
  auto check = [](int rc, const char* what) {
    if (rc != MPI_SUCCESS) throw Error(Errc::backend, std::string(what) + " failed");
  };
  int W = 0, w = 0;
  check(MPI_Comm_size(world, &W), "MPI_Comm_size");
  check(MPI_Comm_rank(world, &w), "MPI_Comm_rank");
  if (ranks_per_node < 0)
    detail::fail(Errc::invalid_mesh, "split_by_node: ranks_per_node=" + std::to_string(ranks_per_node) +
                                         " must be >= 0 (0: the shared-memory nodes MPI reports)");
  int mine[3] = {0, 0, 0};  // node id (its lowest world rank), local rank, node size
  if (ranks_per_node > 0) {  // simulated: Mesh checks that they tile the world
    mine[0] = w / ranks_per_node * ranks_per_node;
    mine[1] = w % ranks_per_node;
    mine[2] = ranks_per_node;
  } else {
    MPI_Comm node;
    check(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, w, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    check(MPI_Comm_rank(node, &mine[1]), "MPI_Comm_rank");
    check(MPI_Comm_size(node, &mine[2]), "MPI_Comm_size");
    check(MPI_Allreduce(&w, &mine[0], 1, MPI_INT, MPI_MIN, node), "MPI_Allreduce");
    MPI_Comm_free(&node);
  }
  std::vector<int> all(static_cast<std::size_t>(3 * W));
  check(MPI_Allgather(mine, 3, MPI_INT, all.data(), 3, MPI_INT, world), "MPI_Allgather");
  const int R = all[2];
  std::vector<int> ids;  // node ids, ascending
  for (int p = 0; p < W; ++p) {
    const int* a = &all[static_cast<std::size_t>(3 * p)];
    if (a[2] != R)
      detail::fail(Errc::invalid_mesh, "split_by_node: world rank " + std::to_string(p) + " is on a node of " + std::to_string(a[2]) +
                                           " ranks, rank 0 on one of " + std::to_string(R) + "; a mesh needs nodes of equal size");
    if (std::find(ids.begin(), ids.end(), a[0]) == ids.end()) ids.push_back(a[0]);
  }
  std::sort(ids.begin(), ids.end());
  MpiMesh m;
  m.mesh = Mesh(W, ulysses_degree, R);
  m.index = static_cast<int>(std::lower_bound(ids.begin(), ids.end(), mine[0]) - ids.begin()) * R + mine[1];
  m.nodes = m.mesh.nodes();
  check(MPI_Comm_split(world, m.mesh.ulysses_group(m.index), m.mesh.ulysses_rank(m.index), &m.ulysses), "MPI_Comm_split");
  check(MPI_Comm_split(world, m.mesh.outer_group(m.index), m.mesh.outer_rank(m.index), &m.outer), "MPI_Comm_split");
  return m;
}

ULYSSES_NAMESPACE_END
