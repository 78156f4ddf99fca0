// SPDX-License-Identifier: Apache-2.0
// Consumer check that ulysses::mpi links: compiles against comm/mpi.hpp (run under mpiexec by hand).
#include <ulysses/comm/mpi.hpp>
#include <ulysses/ulysses.hpp>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ulysses::MpiComm comm(MPI_COMM_WORLD);
  const int ok = comm.size() >= 1;
  MPI_Finalize();
  return ok ? 0 : 1;
}
