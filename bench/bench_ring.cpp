// SPDX-License-Identifier: Apache-2.0
// The ring rotation in process (LocalGroup, one persistent thread per ring rank; bench/ring_bench.hpp
// has the cases and names): one RingRotation rotation against the bare exchange_messages() of the
// same bytes on the same communicator, and the exposed communication of a rotation overlapped with
// a stand-in attention of known duration. R in {2, 4}. Wall time (the lockstep of the R ranks).
//
// Run: bench_ring [--benchmark_min_time=0.2] [--benchmark_out=ring_local.json]   (bench/run_ring.sh)
#include "common.hpp"
#include "lockstep.hpp"
#include "ring_bench.hpp"

#include <ulysses/ring/plan.hpp>
#include <ulysses/ring/rotation.hpp>

#include <chrono>
#include <functional>
#include <memory>

using namespace ub;

namespace {

using Clock = std::chrono::steady_clock;

/// R ranks' double buffers, communicators and rotations (progress p) for one case.
struct LocalRing {
  int R;
  std::vector<std::size_t> blocks;
  std::size_t largest = 0;
  std::vector<Buf> b0, b1;
  std::vector<LocalGroup::Comm> comms;
  std::vector<RingPlan> plans;  // ring rank r's
  std::vector<std::unique_ptr<RingRotation<LocalGroup::Comm>>> rot;
  LocalRing(Lockstep& ls, const RingCase& c, std::int64_t S, int R_, RingProgress p) : R(R_), blocks(ring_blocks(c, S, R_)) {
    largest = *std::max_element(blocks.begin(), blocks.end());
    comms.reserve(static_cast<std::size_t>(R));
    for (int r = 0; r < R; ++r) {
      plans.push_back(ring_plan(c, S, R, r));
      b0.emplace_back(plans.back().kv_buffer_bytes(), 0x11), b1.emplace_back(plans.back().kv_buffer_bytes(), 0x22);
      comms.push_back(ls.group().comm(r));
    }
    for (int r = 0; r < R; ++r) {
      const auto i = static_cast<std::size_t>(r);
      rot.push_back(std::make_unique<RingRotation<LocalGroup::Comm>>(comms[i], plans[i], RingBuffers().kv(b0[i], b1[i]), p));
    }
  }
  /// Rank r's bare exchanges: R − 1 times one message of the same bytes each way, as the rotation's.
  void bare(int r) {
    const auto i = static_cast<std::size_t>(r);
    for (int s = 0; s + 1 < R; ++s) {
      const std::size_t send_bytes = blocks[static_cast<std::size_t>(ring_source(r, s, R))];
      const std::size_t recv_bytes = blocks[static_cast<std::size_t>(ring_source(r, s + 1, R))];
      const Message send{(r + 1) % R, (s % 2 ? b1 : b0)[i].data(), send_bytes};
      const Message recv{(r + R - 1) % R, (s % 2 ? b0 : b1)[i].data(), recv_bytes};
      comms[i].exchange_messages(&send, 1, &recv, 1);
    }
  }
  /// Rank r's rotation, with a stand-in attention of `compute` seconds at every step; with
  /// `measured` (R entries a rank) it writes each step's measured stand-in duration there.
  void rotate(int r, double compute, double* measured) {
    RingRotation<LocalGroup::Comm>& x = *rot[static_cast<std::size_t>(r)];
    for (int s = 0; s < R; ++s) {
      x.start(s);
      const auto t0 = Clock::now();
      stand_in_compute(compute);
      if (measured) measured[r * R + s] = std::chrono::duration<double>(Clock::now() - t0).count();
      x.finish(s);
    }
  }
};

/// Wall time of one lockstep job.
double timed(Lockstep& ls, const std::function<void(int)>& job) {
  const auto t0 = Clock::now();
  ls.step(job);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

enum class What { sendrecv, rotation, rotation_in_start };

void bm_step(benchmark::State& st, What what, const RingCase c, std::int64_t S, int R) {
  Lockstep& ls = lockstep(R);
  LocalRing ring(ls, c, S, R, what == What::rotation_in_start ? RingProgress::in_start : RingProgress::automatic);
  const std::function<void(int)> job = [&](int r) { what == What::sendrecv ? ring.bare(r) : ring.rotate(r, 0, nullptr); };
  std::vector<double> times;
  for (auto _ : st) {
    times.push_back(timed(ls, job));
    st.SetIterationTime(times.back());
  }
  set_ring_counters(st, R, ring.largest, median(times));
  if (what != What::sendrecv) st.SetLabel(label(ring_name("ring_step_local", S, R, c, "sendrecv")));
}

void bm_exposed(benchmark::State& st, double fraction, RingProgress progress, const RingCase c, std::int64_t S, int R) {
  Lockstep& ls = lockstep(R);
  LocalRing ring(ls, c, S, R, progress);
  const std::function<void(int)> bare = [&](int r) { ring.bare(r); };
  std::vector<double> cal;
  for (int k = 0; k < 15; ++k) cal.push_back(timed(ls, bare));
  const double bare_step = median(cal) / (R - 1), compute = fraction * bare_step;
  std::vector<double> dur(static_cast<std::size_t>(R * R)), times, stand_in;
  const std::function<void(int)> job = [&](int r) { ring.rotate(r, compute, dur.data()); };
  for (auto _ : st) {
    const double t = timed(ls, job);
    st.SetIterationTime(t);
    times.push_back(t);
    stand_in.push_back(slowest_steps(dur, R) / R);
  }
  set_ring_counters(st, R, ring.largest, median(times), bare_step, median(stand_in));
}

void register_all() {
  for (const RingCase& c : kRingCases)
    for (std::int64_t S : kRingSeqs)
      for (int R : {2, 4}) {
        for (auto [what, v] : {std::pair{What::sendrecv, "sendrecv"}, {What::rotation, "rotation"}, {What::rotation_in_start, "rotation_in_start"}})
          benchmark::RegisterBenchmark(ring_name("ring_step_local", S, R, c, v).c_str(), bm_step, what, c, S, R)
              ->UseManualTime()->Unit(benchmark::kMillisecond);
        for (double f : kComputeFractions)
          benchmark::RegisterBenchmark(ring_name("ring_exposed_local", S, R, c, compute_name(f) + "/thread").c_str(), bm_exposed, f,
                                       RingProgress::thread, c, S, R)
              ->UseManualTime()->Unit(benchmark::kMillisecond);
      }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_all();
  benchmark::AddCustomContext("ulysses_benchmark", "ring_local");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
