// SPDX-License-Identifier: Apache-2.0
// C19's matrix under MPI (faults.hpp's cells), shared by test_comm_mpi (MpiComm) and
// test_comm_mpi_window (MpiWindowComm): the cells each runs, every rank's outcome gathered on
// rank 0 and printed as one row of the note's table.
#pragma once

#include <mpi.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "faults.hpp"

namespace ut {

/// Runs cell(op, f, warm) -> TimedError on every rank for each cell of the matrix (with
/// `wrong_comm`: also the wrong communicator, cold, not for the ring, whose check is its size),
/// each on a fresh communicator of the caller's; prints each cell's row on rank 0 (fault_row()).
/// Returns the slowest time of this rank over the cells that a message can carry (not the
/// skipped calls, not the wrong communicator: those end at the deadline).
template <class Cell>
double run_mpi_fault_matrix(bool wrong_comm, Cell&& cell) {
  int W = 0, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  double slowest = 0;
  for (FaultOp op : {FaultOp::seq_to_head, FaultOp::backward, FaultOp::ring_step, FaultOp::decode})
    for (Fault f : {Fault::short_buffer, Fault::overlap, Fault::wrong_comm, Fault::engine_throw, Fault::skipped_call})
      for (bool warm : {false, true}) {
        if (f == Fault::skipped_call && op == FaultOp::decode) continue;  // (a rank that never calls: the deadline)
        if (f == Fault::overlap && op == FaultOp::ring_step) continue;    // (the rotation owns its buffers)
        if (f == Fault::wrong_comm && (!wrong_comm || op == FaultOp::ring_step || warm)) continue;
        const TimedError e = cell(op, f, warm);
        if (f != Fault::skipped_call && f != Fault::wrong_comm) slowest = std::max(slowest, e.ms);
        double mine[2] = {static_cast<double>(e.code), e.ms};
        std::vector<double> all(2 * static_cast<std::size_t>(W));
        MPI_Gather(mine, 2, MPI_DOUBLE, all.data(), 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        std::vector<TimedError> rows(static_cast<std::size_t>(W));
        for (std::size_t q = 0; q < rows.size(); ++q) rows[q] = {static_cast<ulysses::Errc>(static_cast<int>(all[2 * q])), "", all[2 * q + 1]};
        if (me == 0) MESSAGE(fault_row(std::string(name_of(op)) + " / " + name_of(f) + (warm ? " (warm)" : ""), rows));
        MPI_Barrier(MPI_COMM_WORLD);  // (a broken communicator is left to MPI: its pending operations cannot be cancelled)
      }
  return slowest;
}

}  // namespace ut
