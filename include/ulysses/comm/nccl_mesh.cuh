// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief split_by_node() over ncclCommSplit: a world NCCL communicator cut into this rank's
///        Ulysses group and outer group of a Mesh, and what it returns (NcclMesh).
///
/// Needs <nccl.h> (NCCL >= 2.18 for ncclCommSplit; link ulysses::nccl). Wrap NcclMesh::ulysses
/// in an NcclComm (comm/nccl_comm.cuh) for the exchanges of the group; Mesh::nodes() is its node
/// layout for PlanOptions::nodes.
#pragma once

#include <nccl.h>

#include <string>

#include "../error.hpp"
#include "../topology/mesh.hpp"
#include "nccl_comm.cuh"

ULYSSES_NAMESPACE_BEGIN

/// The two communicators of a rank in a Mesh, split from a world NCCL communicator (owned by the
/// caller: ncclCommDestroy() them).
struct NcclMesh {
  ncclComm_t ulysses = nullptr;  ///< this rank's Ulysses group (rank = mesh.ulysses_rank(index))
  ncclComm_t outer = nullptr;    ///< this rank's outer group (rank = mesh.outer_rank(index))
};

/// Splits `world` (W ranks, one per GPU) into this rank's Ulysses group and outer group of `mesh`
/// with ncclCommSplit (NCCL >= 2.18; collective over `world`, called by every rank in the same
/// order). NCCL does not know the nodes: `index` is this rank's node-first position, node * R +
/// local rank (MpiMesh::index from split_by_node(), or the launcher's NODE_RANK * LOCAL_WORLD_SIZE
/// + LOCAL_RANK). The groups then match the Mesh, and mesh.nodes() is the node layout of the
/// Ulysses group for PlanOptions::nodes.
/// @throws Error(invalid_mesh) the world is not mesh.world() ranks or index is outside it;
///         Error(backend) NCCL's error.
inline NcclMesh split_by_node(ncclComm_t world, const Mesh& mesh, int index) {
  auto check = [](ncclResult_t r, const char* what) {
    if (r != ncclSuccess) throw Error(Errc::backend, std::string(what) + " failed: " + ncclGetErrorString(r));
  };
  int W = 0;
  check(ncclCommCount(world, &W), "ncclCommCount");
  if (W != mesh.world() || index < 0 || index >= W)
    detail::fail(Errc::invalid_mesh, "split_by_node: the NCCL world has " + std::to_string(W) + " ranks and index " +
                                         std::to_string(index) + "; the mesh is of " + std::to_string(mesh.world()));
  NcclMesh m;
  check(ncclCommSplit(world, mesh.ulysses_group(index), mesh.ulysses_rank(index), &m.ulysses, nullptr), "ncclCommSplit");
  check(ncclCommSplit(world, mesh.outer_group(index), mesh.outer_rank(index), &m.outer, nullptr), "ncclCommSplit");
  return m;
}

ULYSSES_NAMESPACE_END
