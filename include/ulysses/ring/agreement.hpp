// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The cross-rank agreement on a Ulysses × Ring configuration (check_ring_config()): every
///        rank of the hybrid agrees on U, R, the layout, causal and S, and its communicators have
///        the sizes the configuration says.
///
/// One all-gather of a small record over the Ulysses group and one over the ring (together they
/// join every rank of the U × R block), compared through comm/agreement.hpp's records_differ(),
/// then the verdicts over both, so that every rank throws alike before any ring step (bug case
/// C14: a hybrid that ran as CP=1). See docs/ring.md ("Agreement").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../plan/agreement.hpp"
#include "../partition/ring.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {
/// The key under which a ring communicator's ExchangeState records that check_ring_config(plan)
/// passed for the plan with id `plan_id` (apart from the plans' own ids, which mark their own checks).
inline std::uint64_t ring_agreement_key(std::uint64_t plan_id) noexcept { return ~plan_id; }

/// The record of a RingConfig all-gathered by check_ring_config(): fixed-width fields.
struct RingRecord {
  std::int64_t field[8];
};
/// The record of c.
inline RingRecord ring_record(const RingConfig& c) {
  return {{c.ulysses_degree, c.ring_degree, static_cast<std::int64_t>(c.layout), c.causal ? 1 : 0, c.seq_len, c.messages,
           static_cast<std::int64_t>(c.documents), c.allgather_kv ? 1 : 0}};
}
inline const char* ring_field_name(int i) {
  static const char* const n[8] = {"U", "R", "layout", "causal", "S", "messages a block", "packed documents (fingerprint of cu_seqlens)",
                                   "kv by all-gather (1) or by the ring rotation (0)"};
  return n[i];
}
/// What differs between every rank's record and rank 0's ("" when nothing), naming ranks and fields.
inline std::string compare_ring_records(const std::vector<RingRecord>& all, const char* group) {
  const std::string d = records_differ(
      static_cast<int>(all.size()), 8, [&](int p, int i) { return static_cast<std::uint64_t>(all[static_cast<std::size_t>(p)].field[i]); },
      [](int i) { return std::string(ring_field_name(i)); }, [&](int p, int i) { return std::to_string(all[static_cast<std::size_t>(p)].field[i]); });
  return d.empty() ? d : std::string("over the ") + group + ": " + d;
}
}  // namespace detail

namespace detail {
/// The local part of check_ring_config(): U, R >= 1 and the communicators' sizes.
template <class UlyssesComm, class RingComm>
void check_ring_sizes(const RingConfig& c, const UlyssesComm& ulysses, const RingComm& ring) {
  if (c.ulysses_degree < 1 || c.ring_degree < 1)
    fail(Errc::invalid_group, "RingConfig: U=" + std::to_string(c.ulysses_degree) + " and R=" + std::to_string(c.ring_degree) + " must be >= 1");
  if (c.messages < 1 || c.messages > kMaxRingMessages)
    fail(Errc::invalid_shape, "RingConfig: messages=" + std::to_string(c.messages) + " a block must be in [1, " + std::to_string(kMaxRingMessages) + "]");
  const std::string hybrid = "Ulysses x Ring asked for as U=" + std::to_string(c.ulysses_degree) + " x R=" + std::to_string(c.ring_degree);
  check_comm_size(ulysses, c.ulysses_degree, -1, hybrid + ": its Ulysses group", "; hand in the mesh's groups (Mesh, split_ring())");
  check_comm_size(ring, c.ring_degree, -1, hybrid + ": its ring group",
                  std::string(ring.size() == 1 && c.ring_degree > 1 ? " (the hybrid would run as CP=1)" : "") + "; hand in the mesh's groups (Mesh, split_ring())");
}

/// The record of c all-gathered over the ring and compared with ring rank 0's ("" when equal). Collective over `ring`.
template <class RingComm>
std::string ring_mismatch(const RingConfig& c, RingComm& ring) {
  const RingRecord mine = ring_record(c);
  return compare_ring_records(allgather_record(ring, ring.size(), ring.rank(), mine), "ring");
}

/// Round 2 of check_ring_config(): the verdicts of both groups exchanged, so that a mismatch one
/// group saw reaches every rank of the U × R block (a ring member's verdict over the Ulysses
/// group, a Ulysses member's over the ring: two hops join any two ranks); then the throw.
/// Collective over both. @throws Error(plan_mismatch) a mismatch here (naming it) or elsewhere.
template <class UlyssesComm, class RingComm>
void ring_verdicts(const std::string& why_ulysses, const std::string& why_ring, UlyssesComm& ulysses, RingComm& ring) {
  const RingRecord flag_r{{why_ring.empty() ? 0 : 1, 0, 0, 0, 0, 0, 0}}, flag_u{{why_ulysses.empty() && why_ring.empty() ? 0 : 1, 0, 0, 0, 0, 0, 0}};
  bool elsewhere = false;
  for (const auto& f : allgather_record(ulysses, ulysses.size(), ulysses.rank(), flag_r)) elsewhere = elsewhere || f.field[0] != 0;
  for (const auto& f : allgather_record(ring, ring.size(), ring.rank(), flag_u)) elsewhere = elsewhere || f.field[0] != 0;
  const std::string why = why_ulysses + (why_ulysses.empty() || why_ring.empty() ? "" : "; ") + why_ring;
  if (!why.empty())
    fail(Errc::plan_mismatch, "Ulysses x Ring configurations differ: " + why + "; every rank must use the same U, R, layout, causal, S, messages a block and documents");
  if (elsewhere)
    fail(Errc::plan_mismatch, "Ulysses x Ring configurations differ on another rank of this U x R block (a member of this rank's "
                              "Ulysses group or ring saw it, and names it); every rank must use the same U, R, layout, causal, S, messages a block and documents");
}
}  // namespace detail

/// Checks a Ulysses × Ring configuration across ranks: the communicators' sizes (`ulysses` must
/// have U ranks, `ring` R), then one all-gather of the record over each, compared with rank 0's,
/// and one all-gather of the verdicts over each, so that every rank of the block throws alike.
/// Collective over both communicators, every rank in the same order (Ulysses group first). With
/// a Plan of the Ulysses group, prefer the overload below: the plan's own record carries the
/// configuration, and its all-gather replaces the one over the Ulysses group.
/// @param c        this rank's configuration
/// @param ulysses  this rank's Ulysses group (U ranks)
/// @param ring     this rank's ring (R ranks)
/// @throws Error(comm_mismatch) a communicator of another size than the configuration says (e.g.
///         a ring of one rank for R = 2: the hybrid that would silently run as CP=1), checked
///         locally before any collective; Error(plan_mismatch) ranks that differ (naming them and
///         the fields); Error(invalid_group) U or R < 1; Error(invalid_shape) messages outside
///         [1, kMaxRingMessages]; the communicators' errors.
template <class UlyssesComm, class RingComm>
void check_ring_config(const RingConfig& c, UlyssesComm& ulysses, RingComm& ring) {
  detail::check_ring_sizes(c, ulysses, ring);
  const detail::RingRecord mine = detail::ring_record(c);
  const std::string why = detail::compare_ring_records(detail::allgather_record(ulysses, ulysses.size(), ulysses.rank(), mine), "Ulysses group");
  detail::ring_verdicts(why, detail::ring_mismatch(c, ring), ulysses, ring);
}

/// The same check for a Ulysses group's Plan made with PlanOptions::ring, in the plan's own
/// agreement: one all-gather of the plan's agreement record over the Ulysses group (which holds U,
/// R, the ring layout, causal and S next to everything else that determines the wire: the
/// check_agreement() its first exchange would make), one of the ring record over the ring, and the
/// verdicts over both. On success the plan counts as agreed on `ulysses` (its first exchange does
/// not gather again), and the configuration on both (detail::ring_config_due()). The Ulysses groups and the rings together join every rank of the U × R
/// block, so every rank agrees with every other on the configuration.
/// @param plan     this rank's plan of its Ulysses group, with PlanOptions::ring
/// @param ulysses  this rank's Ulysses group (U ranks, rank = plan.rank())
/// @param ring     this rank's ring (R ranks)
/// @throws Error(invalid_mesh) a plan without PlanOptions::ring; what the overload above throws;
///         Error(plan_mismatch) also for a plan that differs anywhere else in its record (every
///         rank of the block alike).
template <class UlyssesComm, class RingComm>
void check_ring_config(const Plan& plan, UlyssesComm& ulysses, RingComm& ring) {
  if (!plan.options().ring)
    detail::fail(Errc::invalid_mesh, "check_ring_config(plan, ...): the plan was made without PlanOptions::ring (RingConfig::of(partition, causal))");
  const RingConfig& c = *plan.options().ring;
  detail::check_ring_sizes(c, ulysses, ring);
  detail::check_comm(plan, ulysses);
  const std::string why = detail::agreement_mismatch(plan, ulysses);
  detail::ring_verdicts(why, detail::ring_mismatch(c, ring), ulysses, ring);
  detail::mark_agreed(ulysses, plan.id(), plan.agreement_check());
  if constexpr (comm_traits<RingComm>::exchange_state) ring.exchange_state().mark_agreed(detail::ring_agreement_key(plan.id()));
}

namespace detail {
/// Whether check_ring_config(plan, ulysses, ring) is still due: it has not passed for this plan on
/// both communicators (each records it in its ExchangeState; a communicator without one: always
/// due). What distributed_attention() asks before each call: the configuration is agreed at a
/// plan's first call on its communicators, as a Plan's own record is at its first exchange, and a
/// later call with the same plan gathers nothing (four small collectives a layer saved; what that
/// is worth: docs/cost-model.md, "Packed documents").
template <class UlyssesComm, class RingComm>
bool ring_config_due(const Plan& plan, UlyssesComm& ulysses, RingComm& ring) {
  if constexpr (comm_traits<UlyssesComm>::exchange_state && comm_traits<RingComm>::exchange_state)
    return !ulysses.exchange_state().agreed(plan.id()) || !ring.exchange_state().agreed(ring_agreement_key(plan.id()));
  else
    return true;
}
}  // namespace detail

ULYSSES_NAMESPACE_END
