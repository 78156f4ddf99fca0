// SPDX-License-Identifier: Apache-2.0
// The node-local rank of an MPI process, for the programs that run one process per GPU
// (nccl_mpi, ulysses_perf --backend nccl): process `rank` of a node takes GPU `rank`.
#pragma once

#include <mpi.h>

namespace ulysses_mpi {

/// This process's rank among the processes of its node, and how many there are.
struct NodeRank {
  int rank = 0;  ///< 0 .. size - 1
  int size = 1;  ///< processes on this node
};

/// The NodeRank of this process in `comm` (MPI_Comm_split_type MPI_COMM_TYPE_SHARED, keyed by
/// the rank in `comm`). Collective over `comm`.
inline NodeRank node_rank(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm node;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  NodeRank n;
  MPI_Comm_rank(node, &n.rank);
  MPI_Comm_size(node, &n.size);
  MPI_Comm_free(&node);
  return n;
}

}  // namespace ulysses_mpi
