// SPDX-License-Identifier: Apache-2.0
// What the MPI benchmarks share (bench_mpi.cpp, bench_mpi_window.cpp): the timed loop (per
// iteration a barrier, MPI_Wtime around the operation, the maximum over ranks as the manual time,
// so every rank sees the same times and Google Benchmark picks the same iteration counts on every
// rank) and main() (only rank 0 reports and writes --benchmark_out).
#pragma once

#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "common.hpp"

namespace ub {

/// Runs op once per iteration with the max-over-ranks manual time (appended to *times when
/// given). Collective over MPI_COMM_WORLD.
inline void mpi_timed_loop(benchmark::State& st, const std::function<void()>& op, std::vector<double>* times = nullptr) {
  for (auto _ : st) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    op();
    double dt = MPI_Wtime() - t0, mx = 0;
    MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    st.SetIterationTime(mx);
    if (times) times->push_back(mx);
  }
}

/// Reports nothing (ranks other than 0).
class SilentReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

/// main() of an MPI benchmark of the Llama-3.1-8B shapes: MPI_Init, `rank` and `size` set from
/// MPI_COMM_WORLD (exit 2 unless the size divides H and fits Hkv), Google Benchmark's flags (the
/// ranks other than 0 drop --benchmark_out*, which would truncate the file), register_all(),
/// every rank runs every benchmark (rank 0 reports), done() (e.g. free collective resources),
/// MPI_Finalize. `name` goes to the context as ulysses_benchmark. thread_level >= 0: MPI_Init_thread
/// asking for that level (MPI_Query_thread() says what was provided).
inline int mpi_benchmark_main(int argc, char** argv, const char* name, int& rank, int& size, void (*register_all)(),
                              void (*done)() = nullptr, int thread_level = -1) {
  int provided = 0;
  if (thread_level >= 0) MPI_Init_thread(&argc, &argv, thread_level, &provided);
  else MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (kH % size != 0 || (kHkv % size != 0 && size % kHkv != 0)) {
    if (rank == 0) std::cerr << argv[0] << ": run with a group size that divides H=32 and fits Hkv=8 (2, 4 or 8 ranks)\n";
    MPI_Finalize();
    return 2;
  }
  std::vector<char*> args(argv, argv + argc);
  if (rank != 0)
    args.erase(std::remove_if(args.begin() + 1, args.end(), [](char* a) { return std::string(a).rfind("--benchmark_out", 0) == 0; }),
               args.end());
  int n = static_cast<int>(args.size());
  args.push_back(nullptr);
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) MPI_Abort(MPI_COMM_WORLD, 1);
  register_all();
  benchmark::AddCustomContext("ulysses_benchmark", name);
  benchmark::AddCustomContext("mpi_ranks", std::to_string(size));
  if (rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    SilentReporter silent;
    benchmark::RunSpecifiedBenchmarks(&silent);
  }
  benchmark::Shutdown();
  if (done) done();
  MPI_Finalize();
  return 0;
}

}  // namespace ub
