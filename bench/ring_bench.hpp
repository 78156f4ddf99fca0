// SPDX-License-Identifier: Apache-2.0
// What the ring benchmarks share (bench_ring.cpp in process, bench_ring_mpi.cpp over MPI): the
// cases (Llama-3.1-8B at U = 4 and Llama-3.1-70B at U = 8: one ring rank's k|v block after the
// Ulysses seq->head, bf16, causal zigzag), the block sizes (tune/ring_cost.hpp's ring_block_bytes,
// so the model and the benchmark count the same bytes), the stand-in attention and the names.
//
// Names (bench/common.hpp's convention): "<family>/bf16/S:<S>/P:<R>/<model>_U<U>/<variant>", P the
// ring degree R (the ring communicator's size). One iteration is a whole rotation: R steps, R − 1
// of them with a transfer; the counter `steps` is R − 1, so a step's time is the iteration's / steps
// (step_median_s: the median iteration's, what bench/report's ring tables use).
//   ring_step_*:    variant `rotation` (RingRotation, default progress), `rotation_in_start`
//                   (RingProgress::in_start) against `sendrecv` (the bare one-message-each-way
//                   exchange of the same bytes on the same communicator, R − 1 times);
//   ring_exposed_*: variant `compute:<f>x/<progress>`: the rotation with a stand-in attention of
//                   f × the bare step's time (measured first, in the same benchmark) at every step;
//                   counters bare_step_s, compute_s (the stand-in's measured duration a step, the slowest
//                   rank's at each step; median over iterations), exposed_step_s = (median rotation time − R · compute) / (R − 1)
//                   and exposed_frac = exposed_step_s / bare_step_s (model: max(0, 1 − f)).
#pragma once

#include <ulysses/partition/ring.hpp>
#include <ulysses/ring/plan.hpp>
#include <ulysses/tune/ring_cost.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"

namespace ub {

/// One benchmarked shape: a model's attention and its Ulysses degree (kv heads a rank: Hkv / U).
struct RingCase {
  const char* model;
  ulysses::AttentionShape shape;
  int U;
};
inline const RingCase kRingCases[] = {{"llama8b", {32, 8, 128, 0}, 4}, {"llama70b", {64, 8, 128, 0}, 8}};
inline const std::int64_t kRingSeqs[] = {8192, 32768};
inline const double kComputeFractions[] = {0.5, 1.0, 2.0};

/// Ring rank j's RingPlan of a case (Ulysses rank 0; bf16, causal zigzag over S tokens, R ring
/// ranks): what the benchmarks' rotations are made from.
inline ulysses::RingPlan ring_plan(const RingCase& c, std::int64_t S, int R, int j) {
  const ulysses::RingPartition part(S, c.U, R, ulysses::RingLayout::zigzag);
  const ulysses::AttentionSpecs specs = ulysses::attention_specs<std::uint16_t>(c.U, c.shape, ulysses::ElementType::bfloat16);
  return ulysses::RingPlan(part, ulysses::Mesh(c.U * R, c.U, R, c.U * R), part.world_rank(j, 0), 1, specs, true);
}

/// Bytes of every ring rank's k|v block: the RingPlan's, checked against the cost model's count
/// (tune/ring_cost.hpp's ring_block_bytes). @throws std::logic_error when they differ.
inline std::vector<std::size_t> ring_blocks(const RingCase& c, std::int64_t S, int R) {
  const ulysses::RingPartition part(S, c.U, R, ulysses::RingLayout::zigzag);
  const std::vector<std::size_t> v = ring_plan(c, S, R, 0).block_bytes();
  for (int j = 0; j < R; ++j)
    if (v[static_cast<std::size_t>(j)] != static_cast<std::size_t>(ulysses::ring_block_bytes(part, j, c.shape, ulysses::ElementType::bfloat16)))
      throw std::logic_error("ring_blocks: the RingPlan and the cost model count different block bytes");
  return v;
}

/// "<family>/bf16/S:<S>/P:<R>/<model>_U<U>/<variant>".
inline std::string ring_name(const std::string& family, std::int64_t S, int R, const RingCase& c, const std::string& variant) {
  return case_name(family, 2, S, R) + "/" + c.model + "_U" + std::to_string(c.U) + "/" + variant;
}

/// "compute:<f>x".
inline std::string compute_name(double f) {
  char b[32];
  std::snprintf(b, sizeof b, "compute:%.1fx", f);
  return b;
}

/// The stand-in attention of a ring step: the calling thread sleeps for `seconds` (a GPU's
/// attention kernel leaves the host thread idle while it runs; a spin would take a core from the
/// transfer on a small machine).
inline void stand_in_compute(double seconds) {
  if (seconds > 0) std::this_thread::sleep_until(std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds));
}

/// The median of `v` (v not empty; reorders it).
inline double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

/// Σ over the R steps of the slowest rank's stand-in duration: `dur` holds R entries per rank
/// (rank r's step s at r · R + s). The lockstep ring waits for it at every step.
inline double slowest_steps(const std::vector<double>& dur, int R) {
  double sum = 0;
  for (int s = 0; s < R; ++s) {
    double m = 0;
    for (int r = 0; r < R; ++r) m = std::max(m, dur[static_cast<std::size_t>(r * R + s)]);
    sum += m;
  }
  return sum;
}

/// Sets the ring counters: steps, block_bytes, step_median_s (the median rotation time over the
/// iterations / (R − 1): a loaded machine's outliers stay out of it, unlike the mean Google
/// Benchmark reports), bytes_per_second (a rank's bytes sent a rotation) and, for the exposed
/// benchmarks (bare_step_s > 0), the exposed communication per step from the median rotation time
/// and the median stand-in duration a step (compute_s: at each step the slowest rank's).
inline void set_ring_counters(benchmark::State& st, int R, std::size_t block_bytes, double median_seconds_per_iteration,
                              double bare_step_s = 0, double compute_s = 0) {
  const double seconds_per_iteration = median_seconds_per_iteration;
  st.counters["steps"] = R - 1;
  st.counters["step_median_s"] = seconds_per_iteration / (R - 1);
  st.counters["block_bytes"] = static_cast<double>(block_bytes);
  st.SetBytesProcessed(static_cast<std::int64_t>(block_bytes) * (R - 1) * static_cast<std::int64_t>(st.iterations()));
  if (bare_step_s > 0) {
    const double exposed = (seconds_per_iteration - R * compute_s) / (R - 1);  // (noise can make it slightly negative)
    st.counters["bare_step_s"] = bare_step_s;
    st.counters["compute_s"] = compute_s;
    st.counters["exposed_step_s"] = exposed;
    st.counters["exposed_frac"] = exposed / bare_step_s;
  }
}

}  // namespace ub
