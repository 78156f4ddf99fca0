// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The MPI backend (link ulysses::mpi): MpiComm, the communicator over an MPI_Comm
///        (comm/mpi_comm.hpp), and split_by_node() / MpiMesh, the cut of an MPI world into the
///        groups of a Mesh (comm/mpi_mesh.hpp); MpiWindow / MpiWindowComm, registered shared memory
///        and the peer copy between the processes of one node (comm/mpi_window.hpp). Needs <mpi.h>.
#pragma once

#include "mpi_comm.hpp"
#include "mpi_mesh.hpp"
#include "mpi_window.hpp"
