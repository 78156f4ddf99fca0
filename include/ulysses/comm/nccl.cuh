// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The NCCL backend (link ulysses::nccl): NcclComm, the communicator over an ncclComm_t
///        and a stream (comm/nccl_comm.cuh), and split_by_node() / NcclMesh, the cut of a world
///        NCCL communicator into the groups of a Mesh (comm/nccl_mesh.cuh). Needs <nccl.h> and
///        the CUDA runtime. NcclWindow (comm/nccl_window.cuh): NCCL's symmetric windows where the
///        installed NCCL has them (ULYSSES_NCCL_HAS_WINDOWS).
#pragma once

#include "nccl_comm.cuh"
#include "nccl_mesh.cuh"
#include "nccl_window.cuh"
