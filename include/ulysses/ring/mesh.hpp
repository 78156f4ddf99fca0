// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The Ulysses × Ring mesh is Mesh (topology/mesh.hpp: U × R × outer ranks on nodes);
///        RingMesh is its deprecated name (removed in 0.3). See docs/ring.md.
#pragma once

#include "../topology/mesh.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Deprecated (removed in 0.3): the one mesh type is Mesh (the same constructor arguments).
using RingMesh [[deprecated("use Mesh (topology/mesh.hpp): Mesh(world, U, R, ranks_per_node, order)")]] = Mesh;

ULYSSES_NAMESPACE_END
