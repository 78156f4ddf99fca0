// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief One verdict on every rank for a decode plan: its agreement record (what determines the
///        wire), the field names, and check_agreement(const DecodePlan&, Comm&), which compares
///        the ranks' records through the shared comm/agreement.hpp. docs/design.md, "agreement".
///
/// Included by decode/plan.hpp (it defines DecodePlan's record members).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../comm/agreement.hpp"
#include "../comm/concepts.hpp"
#include "../detail/hash.hpp"
#include "../error.hpp"
#include "../plan/agreement.hpp"
#include "plan.hpp"

ULYSSES_NAMESPACE_BEGIN

inline DecodeRecord DecodePlan::agreement_record() const {
  DecodeRecord w{};
  w[0] = 1;
  w[1] = static_cast<std::uint64_t>(degree());
  w[2] = static_cast<std::uint64_t>(spec_.batch);
  w[3] = static_cast<std::uint64_t>(spec_.tokens);
  w[4] = static_cast<std::uint64_t>(num_heads());
  w[5] = static_cast<std::uint64_t>(spec_.head_dim_v);
  w[6] = static_cast<std::uint64_t>(spec_.partial_type);
  w[7] = static_cast<std::uint64_t>(spec_.out_type);
  w[8] = static_cast<std::uint64_t>(spec_.base);
  w[9] = static_cast<std::uint64_t>(spec_.output);
  w[10] = static_cast<std::uint64_t>(spec_.path);
  w[11] = spec_.path == Path::direct ? direct_layouts_hash() : 0;  // the direct path reads every rank's layouts alike
  std::uint64_t h = detail::kFnvBasis;
  for (const DecodePeer& p : wire_.peers) h = detail::fnv1a(detail::fnv1a(h, p.head_begin), p.head_count);
  w[12] = h;
  return w;
}

inline std::string DecodePlan::agreement_field(int i) {
  static const char* const names[kDecodeAgreementWords] = {
      "the record version", "the group size P", "the batch B", "the new tokens T", "the head count H", "the head dim Dv",
      "the partial's element type", "the output's element type", "the LSE base", "the output (heads, all_heads)",
      "the path", "the partial and LSE layouts (Path::direct reads them alike on every rank)", "the head split"};
  return i >= 0 && i < kDecodeAgreementWords ? names[i] : "word " + std::to_string(i);
}

inline std::string DecodePlan::agreement_value(int i, std::uint64_t v) {
  if (i >= 1 && i <= 5) return std::to_string(v);
  if (i == 6 || i == 7) return to_string(static_cast<ElementType>(v));
  if (i == 8) return to_string(static_cast<LseBase>(v));
  if (i == 9) return to_string(static_cast<DecodeOutput>(v));
  if (i == 10) return to_string(static_cast<Path>(v));
  return "";
}

/// Cross-rank agreement of a decode plan: all-gathers every rank's DecodePlan::agreement_record()
/// (detail::allgather_record(): allgather() of host memory, or alltoallv() on host buffers) and
/// throws the same Error(plan_mismatch) on EVERY rank when any differs from rank 0's, naming the
/// ranks and fields (detail::words_differ()). Skipped for a device-memory communicator without
/// allgather(). Collective; decode_exchange() calls it before a plan's first exchange on a
/// communicator (DecodePlan::agreement_check_enabled()). Records a passed check in the
/// communicator's ExchangeState (when it has one) and in the plan's AgreementCheck. Allocates.
/// @throws Error(comm_mismatch) the communicator's size or rank is not the plan's;
///         Error(plan_mismatch) the records differ; the communicator's errors.
template <class Comm>
void check_agreement(const DecodePlan& plan, Comm& comm) {
  static_assert(check_communicator<Comm>());
  detail::check_comm_size(comm, plan.degree(), plan.rank(), "the decode plan");
  if constexpr (detail::can_check_agreement_v<Comm>) {
    const std::vector<DecodeRecord> all = detail::allgather_record(comm, plan.degree(), plan.rank(), plan.agreement_record());
    const std::string why = detail::words_differ(all, [](int w) { return DecodePlan::agreement_field(w); }, DecodePlan::agreement_value);
    if (!why.empty())
      detail::fail(Errc::plan_mismatch, "the ranks planned different decode exchanges (every rank reports this; this is rank " +
                                            std::to_string(plan.rank()) + "): " + why +
                                            ". Every rank must plan with the same B, T, heads, Dv, types, LSE base, output and path");
  }
  detail::mark_agreed(comm, plan.id(), plan.agreement_check());
}

namespace detail {
/// What every decode exchange does first, as every Ulysses exchange (plan/agreement.hpp): the
/// communicator's size and rank against the plan, then the cross-rank check when it is due.
template <class Comm>
void before_exchange(const DecodePlan& plan, Comm& comm) {
  check_comm_size(comm, plan.degree(), plan.rank(), "the decode plan");
  if (check_due(comm, plan.id(), plan.agreement_check())) check_agreement(plan, comm);
}
}  // namespace detail

ULYSSES_NAMESPACE_END
