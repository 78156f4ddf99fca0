// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief One verdict on every rank: the agreement record of a plan (what determines the wire),
///        its field names and fingerprint, and the collective check_agreement() that compares
///        the ranks' records before a plan's first exchange.
///
/// Included by plan/plan.hpp at its end (it defines Plan's record members).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../comm/agreement.hpp"
#include "../comm/concepts.hpp"
#include "../detail/checked.hpp"
#include "../detail/hash.hpp"
#include "../error.hpp"
#include "plan.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {
/// Where the agreement record's fields lie: words 0..7 the scalars, then per tensor the head
/// partition, the head dim and element size, the replica handling; then the node layout and the
/// Ulysses × Ring configuration (PlanOptions::ring; 0 without one).
inline constexpr int kHeadsWord = 8, kElementWord = kHeadsWord + kMaxTensors, kReplicasWord = kElementWord + kMaxTensors;
inline constexpr int kNodesWord = kReplicasWord + kMaxTensors, kRingWord = kNodesWord + 1;
static_assert(kRingWord < kAgreementWords, "the agreement record holds every field");

/// A tensor's head dim and element size as one word of the record: D · 2^16 + bytes, printed as
/// "D=128, 4-byte elements"; a hash (top bit set, not printed) for elements of 2^16 bytes or more.
/// Bit 62: the tensor is planned with row transforms (TensorSpec::row_transforms: its pieces are
/// staged, so the ranks' message pairing depends on it), printed ", row transforms"; bits 56-59
/// its Wire (printed ", wire fp8_e4m3").
inline std::uint64_t element_word(std::int64_t head_dim, std::size_t elem_bytes, bool row_transforms = false, Wire wire = Wire::element) {
  const std::uint64_t rows = (row_transforms ? std::uint64_t{1} << 62 : 0) | static_cast<std::uint64_t>(wire) << 56;
  if (elem_bytes < 65536 && head_dim >= 0 && head_dim < (std::int64_t{1} << 40))
    return (static_cast<std::uint64_t>(head_dim) << 16 | elem_bytes) | rows;
  return fnv1a(fnv1a(fnv1a(kFnvBasis, head_dim), static_cast<std::int64_t>(elem_bytes)), static_cast<std::int64_t>(rows)) | std::uint64_t{1} << 63;
}

/// Word i of a plan's record as the mismatch message prints it: P, B, S, the tensor count and the
/// stages as numbers, a tensor's head dim and element size; "" for the hashes.
inline std::string agreement_value(int i, std::uint64_t v) {
  if (i >= 1 && i <= 6 && i != 4) return std::to_string(v);
  if (i >= kElementWord && i < kReplicasWord && !(v >> 63))
    return "D=" + std::to_string((v & ((std::uint64_t{1} << 56) - 1)) >> 16) + ", " + std::to_string(v & 0xffff) + "-byte elements" +
           ((v >> 62 & 1) ? ", row transforms" : "") +
           ((v >> 56 & 15) ? std::string(", wire ") + to_string(static_cast<Wire>(v >> 56 & 15)) : std::string());
  return "";
}
}  // namespace detail

inline AgreementRecord Plan::agreement_record() const {
  AgreementRecord w{};
  auto hash = [](std::uint64_t h, std::int64_t v) { return detail::fnv1a(h, v); };
  const std::uint64_t h0 = detail::kFnvBasis;
  w[0] = 0x756c797373657301ull;  // "ulysses" + record version 1
  w[1] = static_cast<std::uint64_t>(group_.size);
  w[2] = static_cast<std::uint64_t>(batch_);
  w[3] = static_cast<std::uint64_t>(seq_.seq_len());
  std::uint64_t h = h0;
  for (const SeqChunk& c : seq_.chunks()) h = hash(hash(hash(h, c.rank), c.offset), c.length);
  w[4] = h;
  w[5] = tensors_.size();
  w[6] = static_cast<std::uint64_t>(options_.stages);
  w[7] = (options_.messages_enabled() ? 1 : 0) | static_cast<std::uint64_t>(options_.path) << 1 |
         static_cast<std::uint64_t>(options_.head_bands ? 1 : 0) << 8;
  int max_node = 1;  // lanes >= the largest node are all "one lane per rank": the same wire
  for (int n = 0; n < nodes_.num_nodes(); ++n) max_node = std::max(max_node, static_cast<int>(nodes_.members(n).size()));
  const std::uint64_t lanes = options_.lanes >= max_node ? 0u : static_cast<unsigned>(options_.lanes), golden = 0x9e3779b97f4a7c15u;
  w[detail::kNodesWord] = two_level_ ? (nodes_.hash() ^ (lanes * golden)) | 1u : 0u;
  if (const auto& ring = options_.ring)  // U, R, layout, causal, S, messages: nonzero, distinct from no ring
    w[detail::kRingWord] =
        hash(hash(hash(hash(hash(hash(h0, ring->ulysses_degree), ring->ring_degree), static_cast<std::int64_t>(ring->layout)), ring->causal ? 1 : 0),
                  ring->seq_len),
             ring->messages) | 1u;
  if (const auto& ring = options_.ring; ring && ring->documents)  // packed documents: the mask depends on them
    w[detail::kRingWord] = hash(w[detail::kRingWord], static_cast<std::int64_t>(ring->documents)) | 1u;
  if (const auto& ring = options_.ring; ring && ring->allgather_kv)  // U × AG: the ring ranks gather k|v instead of rotating it
    w[detail::kRingWord] = hash(w[detail::kRingWord], std::int64_t{0x4147}) | 1u;
  for (std::size_t t = 0; t < tensors_.size(); ++t) {
    const TensorSpec& x = tensors_[t];
    h = hash(h0, x.heads.num_heads());
    for (int r = 0; r < group_.size; ++r) h = hash(hash(h, x.heads.begin(r)), x.heads.end(r));
    w[detail::kHeadsWord + t] = h;
    w[detail::kElementWord + t] = detail::element_word(x.head_dim, x.elem_bytes, x.by_rows(), x.wire);
    const bool sums = sums_replicas(static_cast<int>(t));
    w[detail::kReplicasWord + t] = hash(hash(h0, sums ? 1 : 0), sums ? static_cast<std::int64_t>(x.type) : 0);
  }
  return w;
}

inline std::string Plan::agreement_field(int i) {
  static const char* const first[8] = {"the record version", "the group size P", "the batch B", "the sequence length S",
                                       "the sequence partition", "the number of tensors", "the number of stages K",
                                       "the path and stage options (PlanOptions::path, in_place_messages, head_bands)"};
  if (i < 8) return first[i];
  if (i < detail::kElementWord) return "the head partition of tensor " + std::to_string(i - detail::kHeadsWord);
  if (i < detail::kReplicasWord)
    return "the rows of tensor " + std::to_string(i - detail::kElementWord) + ": head dim, element size, row transforms and wire";
  if (i < detail::kReplicasWord + kMaxTensors) return "the replica handling (Replicas, element type) of tensor " + std::to_string(i - detail::kReplicasWord);
  if (i == detail::kNodesWord) return "the node layout of the two-level exchange (PlanOptions::nodes, lanes)";
  if (i == detail::kRingWord) return "the Ulysses x Ring configuration (PlanOptions::ring: U, R, ring layout, causal, S, messages a block, packed documents, kv by all-gather)";
  return "word " + std::to_string(i);
}

inline std::uint64_t Plan::fingerprint() const {
  std::uint64_t h = detail::kFnvBasis;
  for (std::uint64_t v : agreement_record()) h = detail::fnv1a(h, v);
  return h;
}

namespace detail {
/// Throws Error(comm_mismatch) when the communicator's size or rank is not the plan's.
template <class Comm>
void check_comm(const Plan& plan, const Comm& comm) {
  check_comm_size(comm, plan.degree(), plan.rank(), "the plan");
}

/// Records a passed check of the plan with id `id` and AgreementCheck `check` on the communicator
/// (when it has an ExchangeState) and in the plan's shared object.
template <class Comm>
void mark_agreed(Comm& comm, std::uint64_t id, AgreementCheck& check) {
  if constexpr (comm_traits<Comm>::exchange_state) comm.exchange_state().mark_agreed(id);
  check.pass();
}

/// Whether a cross-rank check is due before this exchange: enabled, and not yet passed on this
/// communicator (or, for a communicator without ExchangeState, for the plan).
template <class Comm>
bool check_due(Comm& comm, std::uint64_t id, const AgreementCheck& check) {
  if (!check.enabled()) return false;
  if constexpr (comm_traits<Comm>::exchange_state) return !comm.exchange_state().agreed(id);
  return !check.passed();
}
}  // namespace detail

namespace detail {
/// The all-gather and comparison of check_agreement() without the throw: "" when every rank's
/// record is rank 0's, else the message of the plan_mismatch (the same on every rank). Collective.
/// @pre the communicator's size and rank are the plan's (check_comm()); can_check_agreement_v<Comm>.
template <class Comm>
std::string agreement_mismatch(const Plan& plan, Comm& comm) {
  const int P = plan.degree(), me = plan.rank();
  const std::vector<AgreementRecord> all = allgather_record(comm, P, me, plan.agreement_record());
  const std::string diff = words_differ(all, [](int i) { return Plan::agreement_field(i); }, detail::agreement_value);
  if (diff.empty()) return "";
  const std::vector<int> differ = ranks_where(P, [&](int p) { return all[static_cast<std::size_t>(p)] != all[0]; });
  return "ranks " + rank_set(differ) + " planned another exchange than rank 0 (every rank reports this; this is rank " + std::to_string(me) + "): " + diff +
         ". Every rank must plan with the same P, B, sequence partition, head partitions, head dims, element "
         "sizes, stages, path options, replica handling and ring configuration (local layouts may differ)";
}
}  // namespace detail

/// Cross-rank agreement: all-gathers every rank's Plan::agreement_record() (512 bytes: what
/// determines the wire — P, B, the sequence partition, head partitions, head dims, element sizes,
/// stages, path options, replica handling, the Ulysses × Ring configuration (PlanOptions::ring) — and nothing a rank may choose alone, such as its
/// layouts or format) and throws on EVERY rank when they differ, naming the ranks whose records
/// differ from rank 0's and the fields, instead of a hang, a truncation or silently wrong data in
/// the exchange. Collective; redistribute() and the stage functions call it by themselves before
/// a plan's first exchange (Plan::agreement_check_enabled(), on by default in every build). It records a passed check
/// in the communicator's ExchangeState (when it has one) and in the plan's AgreementCheck.
///
/// Uses the communicator's optional `void allgather(const void* send, std::size_t bytes, void*
/// recv)` (host memory; LocalGroup::Comm, MpiComm, NcclComm, DeviceLocalGroup::Comm have it), or
/// else its alltoallv() on host buffers. A communicator of device memory without allgather()
/// declares `static constexpr bool device_memory = true`, and the check is skipped for it.
/// @throws Error(plan_mismatch) the records differ; Error(comm_mismatch) as exchange(); the
///         communicator's errors.
template <class Comm>
void check_agreement(const Plan& plan, Comm& comm) {
  detail::check_comm(plan, comm);
  static_assert(check_communicator<Comm>());
  if constexpr (detail::can_check_agreement_v<Comm>) {
    const std::string why = detail::agreement_mismatch(plan, comm);
    if (!why.empty()) detail::fail(Errc::plan_mismatch, why);
  }
  detail::mark_agreed(comm, plan.id(), plan.agreement_check());
}

namespace detail {
/// Whether the cross-rank check is still due before this exchange of `plan` on `comm`: enabled,
/// and not yet passed on this communicator (or, for a communicator without ExchangeState, for
/// this plan).
template <class Comm>
bool agreement_due(const Plan& plan, Comm& comm) {
  return check_due(comm, plan.id(), plan.agreement_check());
}

/// What every exchange does first: the communicator's size and rank against the plan, then the
/// cross-rank check when it is due.
template <class Comm>
void before_exchange(const Plan& plan, Comm& comm) {
  check_comm(plan, comm);
  if (agreement_due(plan, comm)) check_agreement(plan, comm);
}
}  // namespace detail

ULYSSES_NAMESPACE_END
