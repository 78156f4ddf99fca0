// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The deprecated names of ulysses 0.1 that are free functions or aliases, in one header
///        (CHANGELOG.md lists each with its replacement). Not included by <ulysses/ulysses.hpp>:
///        code that still uses them includes this header; it goes in 0.3.
#pragma once

#include "../comm/peer_record.hpp"
#include "../redistribute.hpp"
#include "../topology/mesh.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Old name of bind_buffers() (0.1; removed in 0.3). @throws as bind_buffers().
[[deprecated("use bind_buffers()")]] inline BufferTable make_buffers(const Plan& plan, Direction dir, const TensorList<ConstByteSpan>& in,
                                                                   const TensorList<ByteSpan>& out, Workspace ws) {
  return bind_buffers(plan, dir, in, out, ws);
}

/// Old name of Mesh for Ulysses x Ring (0.1's ring/mesh.hpp; removed in 0.3): the same constructor.
using RingMesh [[deprecated("use Mesh (topology/mesh.hpp): Mesh(world, U, R, ranks_per_node, order)")]] = Mesh;

/// Old name of PeerRecord (0.1; removed in 0.3): what with_peers() publishes for the peer copy.
using PeerInputs [[deprecated("PeerInputs is PeerRecord (comm/peer_record.hpp)")]] = PeerRecord;

ULYSSES_NAMESPACE_END
