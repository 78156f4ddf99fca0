// SPDX-License-Identifier: Apache-2.0
// What the MPI tests share: groups of P ranks cut from MPI_COMM_WORLD, dropping the messages a
// broken communicator left, and a doctest main that runs under mpiexec (one full report, from rank 0; the job fails when any rank failed).
#pragma once

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <chrono>
#include <thread>
#include <vector>

namespace ut {

inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

/// Runs fn(MPI_Comm) on sub-communicators of P ranks (world ranks [k*P, k*P+P)); world ranks left
/// over sit out. Returns false (skipped) when P exceeds the world.
template <class F>
bool on_groups_of(int P, F&& fn) {
  int wr = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  const int n = world_size();
  if (P > n) return false;
  const int color = wr < (n / P) * P ? wr / P : MPI_UNDEFINED;
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, color, wr, &sub);
  if (sub != MPI_COMM_NULL) {
    fn(sub);
    MPI_Comm_free(&sub);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return true;
}

/// Receives and drops every message left on `sub` once every rank is done with it (collective
/// over `sub`). A broken MpiComm leaves failure notices, call probes and messages of abandoned
/// exchanges unreceived; Open MPI hands them to the next communicator that reuses the context id
/// (an Error(aborted) there, or a crash in MPI_Comm_split when that one is smaller: the break31
/// report). Five rounds 20 ms apart catch messages still in flight.
inline void drop_leftovers(MPI_Comm sub) {
  MPI_Barrier(sub);
  for (int round = 0; round < 5; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (;;) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, sub, &flag, &st);
      if (!flag) break;
      int count = 0;
      MPI_Get_count(&st, MPI_BYTE, &count);
      std::vector<char> buf(static_cast<std::size_t>(count) + 1);
      MPI_Recv(buf.data(), count, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, sub, MPI_STATUS_IGNORE);
    }
  }
  MPI_Barrier(sub);
}

/// main() of an MPI doctest program: MPI_Init, the tests (rank 0 reports in full, the others
/// minimally), MPI_Finalize; 1 when any rank failed.
inline int mpi_doctest_main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context ctx(argc, argv);
  if (rank != 0) ctx.setOption("minimal", true);  // one full report, from rank 0
  const int failed = ctx.run();
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any ? 1 : 0;
}

}  // namespace ut
