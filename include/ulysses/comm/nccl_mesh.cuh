// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief split_by_node() over ncclCommSplit: a world NCCL communicator cut into this rank's
///        Ulysses group and outer group of a Mesh, and what it returns (NcclMesh); split_ring():
///        the same for a Ulysses × Ring mesh (Mesh: Ulysses group, ring, block, outer group;
///        NcclRingMesh).
///
/// Needs <nccl.h> (NCCL >= 2.18 for ncclCommSplit; link ulysses::nccl). Wrap NcclMesh::ulysses
/// in an NcclComm (comm/nccl_comm.cuh) for the exchanges of the group; Mesh::nodes() is its node
/// layout for PlanOptions::nodes.
#pragma once

#include <nccl.h>

#include <chrono>
#include <string>
#include <utility>

#include "../error.hpp"
#include "../topology/mesh.hpp"
#include "../topology/mesh.hpp"
#include "nccl_comm.cuh"

ULYSSES_NAMESPACE_BEGIN

namespace detail {

/// ncclCommSplit(world, color, key, &out, nullptr) through `calls`, completed: the child inherits
/// the parent's configuration (nccl.h), so a non-blocking world makes the split return
/// ncclInProgress, waited out here on the child (ncclCommGetAsyncError; on the parent while NCCL
/// has not set the child) until `deadline`. A split that fails or does not finish aborts the
/// child (ncclCommAbort) and throws.
/// @returns the child (nullptr for NCCL_SPLIT_NOCOLOR)
/// @throws Error(timeout) still in progress at the deadline; Error(backend) NCCL's error.
inline ncclComm_t nccl_split(const NcclCalls& calls, ncclComm_t world, int color, int key, std::chrono::steady_clock::time_point deadline,
                             std::chrono::milliseconds timeout, const char* who) {
  ncclComm_t out = nullptr;
  ncclResult_t r = calls.split(world, color, key, &out, nullptr);
  if (r == ncclInProgress) r = nccl_wait_in_progress(calls, out ? out : world, r, deadline);
  if (r == ncclSuccess) return out;
  if (out) calls.abort(out);
  if (r == ncclInProgress)
    throw Error(Errc::timeout, std::string(who) + ": ncclCommSplit (non-blocking) still in progress after " + std::to_string(timeout.count()) +
                                   " ms (a rank of the world did not enter the split, or died); the child was aborted");
  throw Error(Errc::backend, std::string(who) + ": ncclCommSplit failed: " + ncclGetErrorString(r));
}

}  // namespace detail

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
/// A non-blocking world (ncclConfig_t::blocking = 0, which the children inherit) works: each
/// split's ncclInProgress is waited out, both splits together at most `timeout`.
/// @param world   the world communicator, mesh.world() ranks
/// @param mesh    the layout
/// @param index   this rank's node-first index, 0 .. W−1
/// @param timeout how long the splits may take (milliseconds::max(): no bound)
/// @param calls   the NCCL functions to call (detail::nccl_calls(); a test's fakes)
/// @throws Error(invalid_mesh) the world is not mesh.world() ranks or index is outside it;
///         Error(timeout) a non-blocking split still in progress after `timeout`; Error(backend)
///         NCCL's error (a child made until then is aborted).
inline NcclMesh split_by_node(ncclComm_t world, const Mesh& mesh, int index, std::chrono::milliseconds timeout = kDefaultCommTimeout,
                              const detail::NcclCalls& calls = detail::nccl_calls()) {
  int W = 0;
  if (const ncclResult_t r = calls.comm_count(world, &W); r != ncclSuccess)
    throw Error(Errc::backend, std::string("ncclCommCount failed: ") + ncclGetErrorString(r));
  if (W != mesh.world() || index < 0 || index >= W)
    detail::fail(Errc::invalid_mesh, "split_by_node: the NCCL world has " + std::to_string(W) + " ranks and index " +
                                         std::to_string(index) + "; the mesh is of " + std::to_string(mesh.world()));
  const auto deadline = detail::deadline_after(timeout);
  NcclMesh m;
  m.ulysses = detail::nccl_split(calls, world, mesh.ulysses_group(index), mesh.ulysses_rank(index), deadline, timeout, "split_by_node");
  try {
    m.outer = detail::nccl_split(calls, world, mesh.outer_group(index), mesh.outer_rank(index), deadline, timeout, "split_by_node");
  } catch (...) {
    if (m.ulysses) calls.abort(m.ulysses);
    throw;
  }
  return m;
}

/// The four communicators of a rank in a Mesh, split from a world NCCL communicator (owned
/// by the caller: destroy() them), with the mesh and the rank's node-first index.
struct NcclRingMesh {
  ncclComm_t ulysses = nullptr;  ///< the Ulysses group: U ranks, rank = mesh.ulysses_rank(index)
  ncclComm_t ring = nullptr;     ///< the ring: R ranks, rank = mesh.ring_rank(index)
  ncclComm_t block = nullptr;    ///< the U·R ranks of this rank's Ulysses × Ring block
  ncclComm_t outer = nullptr;    ///< the ranks of equal ring and Ulysses rank in the other blocks (data parallel)
  Mesh mesh{1, 1, 1, 1};     ///< the layout
  int index = 0;                 ///< this rank's node-first world index
  /// ncclCommDestroy of the communicators made (each once; the handles are then null).
  void destroy() {
    for (ncclComm_t* c : {&ulysses, &ring, &block, &outer})
      if (*c) ncclCommDestroy(*c), *c = nullptr;
  }
};

/// Splits `world` (W ranks, one per GPU) into this rank's Ulysses group, ring, block and outer
/// group of `mesh` with ncclCommSplit (NCCL >= 2.18; collective over `world`, called by every rank
/// in the same order), the colours and keys of Mesh::split_key(), as split_ring() of
/// ring/mpi_mesh.hpp does over MPI. NCCL does not know the nodes: `index` is this rank's node-first
/// position (MpiRingMesh::index, MpiMesh::index, or NODE_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK).
/// Wrap NcclRingMesh::ulysses and NcclRingMesh::ring in NcclComm: the Ulysses exchange runs over the first,
/// RingRotation over the second.
/// @param world  the world communicator, mesh.world() ranks
/// @param mesh   the layout (its checks have run: Mesh's constructor)
/// @param index  this rank's node-first index, 0 .. W−1
/// @param timeout how long the four splits may take together (a non-blocking world: see split_by_node())
/// @param calls   the NCCL functions to call (detail::nccl_calls(); a test's fakes)
/// @throws Error(invalid_mesh) the world is not mesh.world() ranks or index is outside it;
///         Error(timeout) a non-blocking split still in progress after `timeout`; Error(backend)
///         NCCL's error (the communicators made until then are destroyed).
inline NcclRingMesh split_ring(ncclComm_t world, const Mesh& mesh, int index, std::chrono::milliseconds timeout = kDefaultCommTimeout,
                               const detail::NcclCalls& calls = detail::nccl_calls()) {
  int W = 0;
  if (const ncclResult_t r = calls.comm_count(world, &W); r != ncclSuccess)
    throw Error(Errc::backend, std::string("ncclCommCount failed: ") + ncclGetErrorString(r));
  if (W != mesh.world() || index < 0 || index >= W)
    detail::fail(Errc::invalid_mesh, "split_ring: the NCCL world has " + std::to_string(W) + " ranks and index " + std::to_string(index) +
                                         "; the ring mesh is of " + std::to_string(mesh.world()));
  NcclRingMesh m;
  m.mesh = mesh;
  m.index = index;
  const std::pair<RingGroup, ncclComm_t*> groups[4] = {
      {RingGroup::ulysses, &m.ulysses}, {RingGroup::ring, &m.ring}, {RingGroup::block, &m.block}, {RingGroup::outer, &m.outer}};
  const auto deadline = detail::deadline_after(timeout);
  for (const auto& [g, out] : groups) {
    const RingSplitKey k = mesh.split_key(g, index);
    try {
      *out = detail::nccl_split(calls, world, k.color, k.key, deadline, timeout, "split_ring");
    } catch (...) {
      m.destroy();
      throw;
    }
  }
  return m;
}

ULYSSES_NAMESPACE_END
