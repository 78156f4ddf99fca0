// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The cross-rank agreement on a Ulysses × Ring configuration (RingConfig,
///        check_ring_config()): every rank of the hybrid must agree on U, R, the layout, causal
///        and S, and its communicators must have the sizes the configuration says.
///
/// The check all-gathers a small record over the Ulysses group and over the ring (both together
/// cover every rank of the U × R block: the Ulysses groups join the ranks of one ring rank, the
/// rings those of one Ulysses rank), like check_agreement() does for a Plan (plan/agreement.hpp),
/// and throws on every rank alike before any ring step moves data. Source of the fault: a hybrid
/// whose sizes were never applied and ran as CP=1 (Megatron-Bridge #2667, bug case C14).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../plan/agreement.hpp"
#include "partition.hpp"

ULYSSES_NAMESPACE_BEGIN

/// What every rank of a Ulysses × Ring hybrid must agree on.
struct RingConfig {
  int ulysses_degree = 1;                    ///< U
  int ring_degree = 1;                       ///< R
  RingLayout layout = RingLayout::zigzag;    ///< zigzag or contiguous
  bool causal = true;                        ///< causal attention
  std::int64_t seq_len = 0;                  ///< S, global tokens
  /// The configuration of a partition and a causal flag.
  static RingConfig of(const RingPartition& p, bool causal) {
    return {p.ulysses_degree(), p.ring_degree(), p.layout(), causal, p.seq_len()};
  }
};

namespace detail {
/// The record of a RingConfig all-gathered by check_ring_config(): fixed-width fields.
struct RingRecord {
  std::int64_t field[5];
};
inline const char* ring_field_name(int i) {
  static const char* const n[5] = {"U", "R", "layout", "causal", "S"};
  return n[i];
}
/// What differs between every rank's record and rank 0's ("" when nothing), naming ranks and fields.
inline std::string compare_ring_records(const std::vector<RingRecord>& all, const char* group) {
  std::string out;
  for (std::size_t p = 1; p < all.size(); ++p)
    for (int i = 0; i < 5; ++i)
      if (all[p].field[i] != all[0].field[i] && out.size() < 400)
        out += std::string(out.empty() ? "" : "; ") + "rank " + std::to_string(p) + " of the " + group + " has " + ring_field_name(i) + "=" +
               std::to_string(all[p].field[i]) + ", rank 0 " + std::to_string(all[0].field[i]);
  return out;
}
}  // namespace detail

/// Checks a Ulysses × Ring configuration across ranks: the communicators' sizes (`ulysses` must
/// have U ranks, `ring` R), then one all-gather of the record over each, compared with rank 0's,
/// and one all-gather of the verdicts over each, so that every rank of the block throws alike.
/// Collective over both communicators, every rank in the same order (Ulysses group first).
/// @throws Error(comm_mismatch) a communicator of another size than the configuration says (e.g.
///         a ring of one rank for R = 2: the hybrid that would silently run as CP=1), checked
///         locally before any collective; Error(plan_mismatch) ranks that differ (naming them and
///         the fields); Error(invalid_group) U or R < 1; the communicators' errors.
template <class UlyssesComm, class RingComm>
void check_ring_config(const RingConfig& c, UlyssesComm& ulysses, RingComm& ring) {
  if (c.ulysses_degree < 1 || c.ring_degree < 1)
    detail::fail(Errc::invalid_group, "RingConfig: U=" + std::to_string(c.ulysses_degree) + " and R=" + std::to_string(c.ring_degree) +
                                          " must be >= 1");
  if (ulysses.size() != c.ulysses_degree || ring.size() != c.ring_degree)
    detail::fail(Errc::comm_mismatch, "Ulysses x Ring asked for as U=" + std::to_string(c.ulysses_degree) + " x R=" +
                                          std::to_string(c.ring_degree) + ", but the Ulysses communicator has " + std::to_string(ulysses.size()) +
                                          " ranks and the ring communicator " + std::to_string(ring.size()) +
                                          (ring.size() == 1 && c.ring_degree > 1 ? " (the hybrid would run as CP=1)" : "") +
                                          "; hand in the mesh's groups (RingMesh, split_ring())");
  const detail::RingRecord mine{{c.ulysses_degree, c.ring_degree, static_cast<std::int64_t>(c.layout), c.causal ? 1 : 0, c.seq_len}};
  const auto a = detail::allgather_record(ulysses, ulysses.size(), ulysses.rank(), mine);
  const auto b = detail::allgather_record(ring, ring.size(), ring.rank(), mine);
  std::string why = detail::compare_ring_records(a, "Ulysses group");
  const std::string why_ring = detail::compare_ring_records(b, "ring");
  why += (why.empty() || why_ring.empty() ? "" : "; ") + why_ring;
  // Round 2: a mismatch one group saw reaches every rank of the U x R block (a ring member's
  // verdict over the Ulysses group, a Ulysses member's over the ring: two hops join any two ranks).
  const detail::RingRecord flag_r{{why_ring.empty() ? 0 : 1, 0, 0, 0, 0}}, flag_u{{why.empty() ? 0 : 1, 0, 0, 0, 0}};
  bool elsewhere = false;
  for (const auto& f : detail::allgather_record(ulysses, ulysses.size(), ulysses.rank(), flag_r)) elsewhere = elsewhere || f.field[0] != 0;
  for (const auto& f : detail::allgather_record(ring, ring.size(), ring.rank(), flag_u)) elsewhere = elsewhere || f.field[0] != 0;
  if (!why.empty()) detail::fail(Errc::plan_mismatch, "Ulysses x Ring configurations differ: " + why + "; every rank must use the same U, R, layout, causal and S");
  if (elsewhere)
    detail::fail(Errc::plan_mismatch, "Ulysses x Ring configurations differ on another rank of this U x R block (a member of this rank's "
                                      "Ulysses group or ring saw it, and names it); every rank must use the same U, R, layout, causal and S");
}

ULYSSES_NAMESPACE_END
