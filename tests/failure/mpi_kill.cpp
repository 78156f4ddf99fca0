// SPDX-License-Identifier: Apache-2.0
// A process killed mid-run under MPI (ctest: `mpiexec -n 3` through mpi_kill.cmake). Rank 2
// raises SIGKILL before the exchange; ranks 0 and 1 enter MpiComm::exchange_messages with every
// rank (2 included) under a 500 ms deadline and must leave it with a coded error within the
// deadline plus a margin: Error(timeout) naming rank 2 (Open MPI's shared-memory transport does
// not notice a dead peer, so the deadline does), or Error(backend) if MPI noticed the death and
// returned an error (the communicator returns errors: MPI_ERRORS_RETURN). Each survivor prints
// one line, "mpi_kill: rank R: OK ..." or "mpi_kill: rank R: WRONG ...", for mpi_kill.cmake to
// judge; Open MPI's runtime may end the job before the survivors get that far (see there).
#include <ulysses/comm/mpi.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>

#include "messages.hpp"

int main(int argc, char** argv) {
  using namespace ulysses;
  MPI_Init(&argc, &argv);
  int r = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  const std::chrono::milliseconds deadline(500);
  const double margin_ms = 1500;
  MpiComm mc(comm, MpiComm::kIntMaxBytes, deadline);
  MPI_Barrier(MPI_COMM_WORLD);  // every rank is up; from here on, no collective on the world
  if (r == n - 1) std::raise(SIGKILL);

  ut::MessagePattern m(n, r);  // messages to and from every rank, the dead one included
  const auto t0 = std::chrono::steady_clock::now();
  Errc code{};
  std::string what = "no error";
  try {
    mc.exchange_messages(m.send.data(), m.send.size(), m.recv.data(), m.recv.size());
  } catch (const Error& e) {
    code = e.code();
    what = e.what();
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const std::string dead = "ranks {" + std::to_string(n - 1) + "}";
  const bool ok = ((code == Errc::timeout && what.find(dead) != std::string::npos) || code == Errc::backend) &&
                  ms < static_cast<double>(deadline.count()) + margin_ms;
  std::printf("mpi_kill: rank %d: %s %s after %.1f ms (deadline %lld ms): %s\n", r, ok ? "OK" : "WRONG", to_string(code), ms,
              static_cast<long long>(deadline.count()), what.c_str());
  std::fflush(stdout);
  MPI_Finalize();
  return ok ? 0 : 1;
}
