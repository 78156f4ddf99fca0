// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The ring schedule: at each ring step, which query range of a rank attends which range of
///        the kv block it holds, with which mask (RingWork, ring_schedule()). Pure integers, no
///        communicator: an engine can run it with its own transport.
///
/// At step s ring rank r holds the block of ring rank (r − s) mod R; indices are ring-local. The
/// causal zigzag rule is zhuzilin's ring-flash-attention's and yunchang's; causal contiguous skips
/// the later sources; non-causal attends everything. Merge the steps in step order (ring/merge.hpp)
/// for the same bits on every run. See docs/ring.md ("The schedule").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../partition/ring.hpp"

ULYSSES_NAMESPACE_BEGIN

/// The mask of one ring step's attention.
enum class RingMask : std::int32_t {
  none = 0,    ///< every query row of the range attends every kv row of the range
  causal = 1,  ///< q row i attends kv row k iff k <= i (indices relative to the ranges' starts; the
               ///< ranges have equal length and start at 0: the diagonal block, top-left = bottom-right)
};

/// Name of a ring mask ("none", "causal").
inline const char* to_string(RingMask m) noexcept { return m == RingMask::causal ? "causal" : "none"; }

/// One ring step's attention on one rank: queries [q_begin, q_begin + q_len) of the rank's L_q
/// ring-local tokens against kv rows [kv_begin, kv_begin + kv_len) of the block it holds at the
/// step (the block of ring rank `source`, L_kv tokens), with `mask`. Token counts.
struct RingWork {
  int step = 0;                ///< s, 0 .. R−1
  int source = 0;              ///< ring rank whose kv block is held at the step: (r − s) mod R
  std::int64_t q_begin = 0;    ///< first query row (ring-local)
  std::int64_t q_len = 0;      ///< query rows (0: nothing to do)
  std::int64_t kv_begin = 0;   ///< first kv row of the block
  std::int64_t kv_len = 0;     ///< kv rows (0: nothing to do)
  RingMask mask = RingMask::none;  ///< the mask inside the ranges
  std::int64_t L_q = 0;        ///< the rank's query tokens, L_r
  std::int64_t L_kv = 0;       ///< the block's tokens, L_source
  /// True when the step contributes nothing (no query row or no kv row): skip the attention, merge nothing.
  bool empty() const { return q_len == 0 || kv_len == 0; }
  /// Whether query row i (ring-local, 0 .. L_q − 1) attends kv row k (0 .. L_kv − 1) at this step:
  /// the brute-force form of the ranges and the mask.
  bool attends(std::int64_t i, std::int64_t k) const {
    if (i < q_begin || i >= q_begin + q_len || k < kv_begin || k >= kv_begin + kv_len) return false;
    return mask == RingMask::none || (k - kv_begin) <= (i - q_begin);
  }
};

/// The ring rank whose kv block ring rank r holds at step s: (r − s) mod R.
/// @throws Error(invalid_group) r outside [0, R) or s outside [0, R).
inline int ring_source(int r, int s, int R) {
  detail::check_group_size(R);
  detail::check_rank(r, R);
  if (s < 0 || s >= R)
    detail::fail(Errc::invalid_group, "ring step " + std::to_string(s) + " is outside [0, R=" + std::to_string(R) + ")");
  return ((r - s) % R + R) % R;
}

/// Ring rank r's work at step s (see the file comment), for a causal or a non-causal attention.
/// @throws Error(invalid_group) r or s outside [0, R).
inline RingWork ring_work(const RingPartition& part, int r, int s, bool causal) {
  const int R = part.ring_degree();
  RingWork w;
  w.step = s;
  w.source = ring_source(r, s, R);
  w.L_q = part.ring_length(r);
  w.L_kv = part.ring_length(w.source);
  w.q_len = w.L_q;
  w.kv_len = w.L_kv;
  if (!causal) return w;
  if (w.source == r) {
    w.mask = RingMask::causal;
  } else if (part.layout() == RingLayout::zigzag) {
    if (w.source < r) {
      w.kv_len = part.ring_chunks(w.source).front().length;
    } else {
      w.q_begin = part.ring_chunks(r).front().length;
      w.q_len = w.L_q - w.q_begin;
    }
  } else if (w.source > r) {
    w.q_len = 0;
    w.kv_len = 0;
  }
  return w;
}

/// Ring rank r's whole schedule: ring_work(part, r, s, causal) for s = 0 .. R−1, in step order.
/// @throws Error(invalid_group) r outside [0, R).
inline std::vector<RingWork> ring_schedule(const RingPartition& part, int r, bool causal) {
  std::vector<RingWork> v;
  for (int s = 0; s < part.ring_degree(); ++s) v.push_back(ring_work(part, r, s, causal));
  return v;
}

ULYSSES_NAMESPACE_END
