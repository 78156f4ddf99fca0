// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The ring's wire split chosen by measurement on the communicator at hand:
///        measure_ring_split() times whole rotations of a block sent as 1, 2, 4, 8 messages
///        (RingConfig::messages) and returns, on every ring rank alike, the k of the shortest.
///
/// The cost model's choice, best_ring_messages() (tune/ring_cost.hpp), needs a per-flow cap fitted
/// or given; this one needs a few rotations of the ring itself. Whether two half-size messages
/// move faster than one depends on the MPI stack and the link (docs/cost-model.md, "The ring's
/// wire split"), so the answer is per communicator: measure once, then give the k to RingPlan
/// (its `messages`) or to the rotations.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../partition/ring.hpp"
#include "../ring/buffers.hpp"
#include "../ring/rotation.hpp"

ULYSSES_NAMESPACE_BEGIN

/// What measure_ring_split() tries and how it decides.
struct RingSplitOptions {
  int max_messages = 8;    ///< candidates 1, 2, 4, ... <= max_messages (1 .. kMaxRingMessages)
  int rotations = 3;       ///< timed rotations a candidate (>= 1): a rank's time is their median
  int warmup = 1;          ///< untimed rotations a candidate first (>= 0)
  double tolerance = 0.03; ///< a candidate within this fraction of the fastest counts as a tie: the fewest messages of those
};

/// What measure_ring_split() measured: every candidate's slowest-rank time, and the choice.
struct RingSplitMeasurement {
  std::vector<int> messages;    ///< the candidates, 1, 2, 4, ...
  std::vector<double> seconds;  ///< per candidate: the max over ring ranks of a rank's median rotation, seconds
  int best = 1;                 ///< the chosen k (the same on every ring rank)
};

namespace detail {
/// No wait after a rotation (host communicators: done on return of finish()).
struct RingSplitNoWait {
  void operator()() const noexcept {}
};
}  // namespace detail

/// Times `opt.rotations` rotations (after `opt.warmup` untimed ones) of one block of `block_bytes`
/// per ring rank, sent as k messages for each candidate k of 1, 2, 4, ... <= opt.max_messages
/// (RingRotation(ring, sizes, RingBuffers().kv(buf0, buf1), RingProgress::in_start, k)); a rank's
/// time of a candidate is the median of its rotations, the candidate's the slowest rank's (the
/// max over ranks, by one allgather() of every rank's times). The choice: the fewest messages
/// within opt.tolerance of the fastest. Every ring rank computes it from the same gathered
/// times, so every rank returns the same k. Collective over `ring`: every ring rank calls it
/// with the same block_bytes and options, and nothing else runs on the communicator meanwhile.
/// On a ring of one rank nothing moves: {1}, 0 s, best 1, no collective. A stream-ordered
/// (device) communicator enqueues the exchanges: pass `wait` (e.g. a stream synchronisation),
/// called after each rotation, so that the clock sees the transfers.
/// @param ring        the ring communicator (R ranks; exchange_messages() and allgather())
/// @param block_bytes bytes of each rank's block (e.g. the RingPlan's block_bytes())
/// @param buf0, buf1  two buffers of at least block_bytes each, in the communicator's memory; their
///                    contents are overwritten
/// @param opt         the candidates, repetitions and tie tolerance
/// @param wait        called after each rotation (default: nothing)
/// Returns {1} at once, without communication, where nothing would be split: R = 1, an empty
/// block, or a communicator whose rotation reads in place (MpiWindowComm: no messages).
/// @throws Error(invalid_shape) options out of range; what RingRotation and the communicator throw
///         (Error(buffer_too_small) a buffer null for block_bytes > 0, Error(timeout), ...).
template <class Comm, class Wait = detail::RingSplitNoWait>
RingSplitMeasurement measure_ring_split_times(Comm& ring, std::size_t block_bytes, std::byte* buf0, std::byte* buf1,
                                              const RingSplitOptions& opt = {}, Wait wait = {}) {
  static_assert(comm_traits<Comm>::allgather, "measure_ring_split needs a communicator with allgather() (comm/concepts.hpp)");
  if (opt.max_messages < 1 || opt.max_messages > kMaxRingMessages || opt.rotations < 1 || opt.warmup < 0 || !(opt.tolerance >= 0))
    detail::fail(Errc::invalid_shape, "measure_ring_split: max_messages=" + std::to_string(opt.max_messages) + " (1 .. " +
                                          std::to_string(kMaxRingMessages) + "), rotations=" + std::to_string(opt.rotations) +
                                          " (>= 1), warmup=" + std::to_string(opt.warmup) + " (>= 0), tolerance >= 0");
  RingSplitMeasurement m;
  for (int k = 1; k <= opt.max_messages; k *= 2) m.messages.push_back(k);
  const int R = ring.size();
  if (R == 1 || block_bytes == 0 || detail::ring_reads_in_place_v<Comm>) {  // nothing moves, or no message: nothing to split
    m.messages.assign(1, 1);
    m.seconds.assign(1, 0.0);
    return m;
  }
  std::vector<double> mine;
  for (int k : m.messages) {
    RingRotation<Comm> rot(ring, std::vector<std::size_t>(static_cast<std::size_t>(R), block_bytes),
                           RingBuffers().kv(buf0, block_bytes, buf1, block_bytes), RingProgress::in_start, k);
    std::vector<double> times;
    for (int i = 0; i < opt.warmup + opt.rotations; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < R; ++s) {
        rot.start(s);
        rot.finish(s);
      }
      wait();
      const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
      if (i >= opt.warmup) times.push_back(dt.count());
    }
    std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2), times.end());
    mine.push_back(times[times.size() / 2]);
  }
  std::vector<double> all(mine.size() * static_cast<std::size_t>(R));
  ring.allgather(mine.data(), mine.size() * sizeof(double), all.data());
  m.seconds.assign(mine.size(), 0.0);
  for (std::size_t p = 0; p < static_cast<std::size_t>(R); ++p)
    for (std::size_t c = 0; c < mine.size(); ++c) m.seconds[c] = std::max(m.seconds[c], all[p * mine.size() + c]);
  const double fastest = *std::min_element(m.seconds.begin(), m.seconds.end());
  for (std::size_t c = 0; c < m.seconds.size(); ++c)
    if (m.seconds[c] <= fastest * (1 + opt.tolerance)) {
      m.best = m.messages[c];
      break;
    }
  return m;
}

/// The wire split for `ring`, measured: measure_ring_split_times(...).best, the same k on every
/// ring rank. Collective over `ring` (see measure_ring_split_times(): parameters, errors).
template <class Comm, class Wait = detail::RingSplitNoWait>
int measure_ring_split(Comm& ring, std::size_t block_bytes, std::byte* buf0, std::byte* buf1, const RingSplitOptions& opt = {},
                       Wait wait = {}) {
  return measure_ring_split_times(ring, block_bytes, buf0, buf1, opt, wait).best;
}

ULYSSES_NAMESPACE_END
