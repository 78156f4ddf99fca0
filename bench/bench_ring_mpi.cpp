// SPDX-License-Identifier: Apache-2.0
// The ring rotation over MPI, one ring rank per process (MPI_COMM_WORLD is the ring; run with
// -n 2 and -n 4; bench/ring_bench.hpp has the cases and names): one RingRotation rotation over
// MpiComm against the bare MPI_Sendrecv of the same bytes on the same communicator (R − 1 times
// to ring rank r + 1 from r − 1), and the exposed communication of a rotation overlapped with a
// stand-in attention of known duration: RingProgress::thread (the exchange on the rotation's
// worker thread; MPI_THREAD_SERIALIZED asked for) and in_start (MpiComm's default: the exchange
// runs in start(), nothing overlaps). Timing: bench/mpi_bench.hpp (barrier, MPI_Wtime, max over ranks).
//
// Run: mpiexec -n 4 bench_ring_mpi [--benchmark_min_time=0.2] [--benchmark_out=ring_mpi_p4.json]
#include "common.hpp"
#include "mpi_bench.hpp"
#include "ring_bench.hpp"

#include <ulysses/comm/mpi.hpp>
#include <ulysses/ring/rotation.hpp>

#include <climits>
#include <functional>
#include <memory>

using namespace ub;

namespace {

int g_rank = 0, g_size = 1;

/// This rank's double buffers, communicator and rotation (progress p) for one case.
struct MpiRing {
  int R, r;
  std::vector<std::size_t> blocks;
  std::size_t largest = 0;
  Buf b0, b1;
  MpiComm comm{MPI_COMM_WORLD};
  std::unique_ptr<RingRotation<MpiComm>> rot;
  RingPlan plan;
  MpiRing(const RingCase& c, std::int64_t S, RingProgress p)
      : R(g_size), r(g_rank), blocks(ring_blocks(c, S, g_size)), plan(ring_plan(c, S, g_size, g_rank)) {
    largest = *std::max_element(blocks.begin(), blocks.end());
    b0 = Buf(largest, 0x11);
    b1 = Buf(largest, 0x22);
    rot = std::make_unique<RingRotation<MpiComm>>(comm, plan, RingBuffers().kv(b0, b1), p);
  }
  /// The bare exchanges: R − 1 MPI_Sendrecv of the rotation's bytes (the same buffers and peers).
  void bare() {
    for (int s = 0; s + 1 < R; ++s) {
      const std::size_t send_bytes = blocks[static_cast<std::size_t>(ring_source(r, s, R))];
      const std::size_t recv_bytes = blocks[static_cast<std::size_t>(ring_source(r, s + 1, R))];
      MPI_Sendrecv((s % 2 ? b1 : b0).data(), static_cast<int>(send_bytes), MPI_BYTE, (r + 1) % R, 0, (s % 2 ? b0 : b1).data(),
                   static_cast<int>(recv_bytes), MPI_BYTE, (r + R - 1) % R, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
  }
  /// The rotation with a stand-in attention of `compute` seconds at every step; with `measured`
  /// (R entries) it writes each step's measured stand-in duration there.
  void rotate(double compute, double* measured) {
    for (int s = 0; s < R; ++s) {
      rot->start(s);
      const double t0 = MPI_Wtime();
      stand_in_compute(compute);
      if (measured) measured[s] = MPI_Wtime() - t0;
      rot->finish(s);
    }
  }
};

/// Whether the MPI library allows the rotation's worker thread (MPI_THREAD_SERIALIZED or more).
bool threads_ok() {
  int provided = 0;
  MPI_Query_thread(&provided);
  return provided >= MPI_THREAD_SERIALIZED;
}

enum class What { sendrecv, rotation, rotation_thread };

void bm_step(benchmark::State& st, What what, const RingCase c, std::int64_t S) {
  if (what == What::rotation_thread && !threads_ok()) return st.SkipWithError("MPI_THREAD_SERIALIZED not provided");
  MpiRing ring(c, S, what == What::rotation_thread ? RingProgress::thread : RingProgress::automatic);
  std::vector<double> times;
  mpi_timed_loop(st, [&] { what == What::sendrecv ? ring.bare() : ring.rotate(0, nullptr); }, &times);
  set_ring_counters(st, g_size, ring.largest, median(times));
  if (what != What::sendrecv) st.SetLabel(label(ring_name("ring_step_mpi", S, g_size, c, "sendrecv")));
}

void bm_exposed(benchmark::State& st, double fraction, RingProgress progress, const RingCase c, std::int64_t S) {
  if (progress == RingProgress::thread && !threads_ok()) return st.SkipWithError("MPI_THREAD_SERIALIZED not provided");
  MpiRing ring(c, S, progress);
  const int R = g_size;
  std::vector<double> cal;
  for (int k = 0; k < 15; ++k) {  // the bare step, max over ranks, the same on every rank
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    ring.bare();
    double dt = MPI_Wtime() - t0, mx = 0;
    MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    cal.push_back(mx);
  }
  const double bare_step = median(cal) / (R - 1), compute = fraction * bare_step;
  std::vector<double> dur(static_cast<std::size_t>(R)), slowest(dur.size()), times, stand_in;
  for (auto _ : st) {  // (mpi_timed_loop's loop, and the stand-in's durations gathered outside the timed part)
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    ring.rotate(compute, dur.data());
    double dt = MPI_Wtime() - t0, mx = 0;
    MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    st.SetIterationTime(mx);
    times.push_back(mx);
    MPI_Allreduce(dur.data(), slowest.data(), R, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);  // per step, the slowest rank's stand-in
    double sum = 0;
    for (double d : slowest) sum += d;
    stand_in.push_back(sum / R);
  }
  set_ring_counters(st, R, ring.largest, median(times), bare_step, median(stand_in));
}

void register_all() {
  for (const RingCase& c : kRingCases)
    for (std::int64_t S : kRingSeqs) {
      for (auto [what, v] : {std::pair{What::sendrecv, "sendrecv"}, {What::rotation, "rotation"}, {What::rotation_thread, "rotation_thread"}})
        benchmark::RegisterBenchmark(ring_name("ring_step_mpi", S, g_size, c, v).c_str(), bm_step, what, c, S)
            ->UseManualTime()->Unit(benchmark::kMillisecond);
      for (double f : kComputeFractions)
        for (auto [p, v] : {std::pair{RingProgress::thread, "thread"}, {RingProgress::in_start, "in_start"}})
          benchmark::RegisterBenchmark(ring_name("ring_exposed_mpi", S, g_size, c, compute_name(f) + "/" + v).c_str(), bm_exposed, f, p, c, S)
              ->UseManualTime()->Unit(benchmark::kMillisecond);
    }
}

}  // namespace

int main(int argc, char** argv) {
  return mpi_benchmark_main(argc, argv, "ring_mpi", g_rank, g_size, register_all, nullptr, MPI_THREAD_SERIALIZED);
}
