// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Advice over Ulysses × Ring × outer layouts (advise_hybrid()): every feasible (U, R) with
///        the ring rotation and the all-gather-kv alternative, priced with tune/ring_cost.hpp's
///        costs (packed documents included) and advise_degree()'s Ulysses exchanges, best first,
///        each with a reason. docs/cost-model.md, "Ulysses × Ring".
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../partition/documents.hpp"
#include "../partition/ring.hpp"
#include "../topology/mesh.hpp"
#include "advise.hpp"
#include "ring_cost.hpp"

ULYSSES_NAMESPACE_BEGIN

/// How a hybrid layout moves its kv between ring ranks.
enum class RingKv : int {
  none = 0,       ///< R = 1: no ring (Ulysses alone)
  rotation = 1,   ///< the ring rotation (RingRotation), overlapped with each step's attention
  allgather = 2,  ///< all-gather the ring group's kv once, then attend (Llama 3 / Megatron CP)
};

/// Name of a RingKv ("none", "ring", "allgather").
inline const char* to_string(RingKv k) noexcept { return k == RingKv::rotation ? "ring" : k == RingKv::allgather ? "allgather" : "none"; }

/// One feasible (U, R, outer) layout with its predicted cost (see advise_hybrid()).
struct HybridChoice {
  int ulysses_degree = 0;        ///< U
  int ring_degree = 0;           ///< R
  int outer_degree = 0;          ///< world / (U · R): data parallel
  RingKv kv = RingKv::none;      ///< how the ring moves kv
  int messages = 0;              ///< pieces a kv block goes in (RingConfig::messages): rotation best_ring_messages(), all-gather 1, no ring 0
  DegreeChoice ulysses;          ///< the Ulysses exchanges of a ring rank's L_0 tokens over U ranks (advise_degree()'s row)
  RingCost ring;                 ///< the ring's (or the all-gather's) cost; empty when R = 1
  double seconds = 0;            ///< predicted per layer (forward): ulysses.seconds + ring.exposed_seconds + ring.merge_seconds
                                 ///< + ring.imbalance_seconds
  double intra_bytes = 0;        ///< bytes per layer over the busiest rank's intra-node link (Ulysses + ring)
  double inter_bytes = 0;        ///< bytes per layer over the busiest rank's inter-node link (Ulysses + ring)
  double activation_bytes = 0;   ///< a rank's attention tensors (ulysses.activation_bytes) + the ring's kv buffers
  bool fits = true;              ///< activation_bytes within the budget
  /// the forward in head bands (tune/band_cost.hpp; bands × ring steps, attention/detail/band_ring.hpp)
  /// where advise_hybrid() is given band overheads: best_bands() of the Ulysses exchanges around
  /// each band's attention, which with a ring is the band's ring (its steps, the rotation they
  /// leave exposed, its merges). Not priced (bands 1, times 0) without overheads and for the
  /// all-gather, whose plan refuses bands.
  BandCost bands;
  /// what the layout adds to the attention in bands.bands bands, seconds: bands.exposed_s (the
  /// exchanges the bands leave exposed, their calls' overheads included) + the ring's exposed
  /// rotation, merges and imbalance; at G = 1 (and for the all-gather) seconds + the two exchange
  /// calls' overheads; 0 without band overheads
  double banded_seconds = 0;
  std::string reason;            ///< why it ranks where it does: where each part runs, what the ring hides
};

namespace detail {
inline std::string pct(double x) { return std::to_string(static_cast<int>(x * 100 + 0.5)) + "%"; }
/// The ring's part of a hybrid choice's reason line (kv rotation or all-gather).
inline std::string ring_reason(const HybridChoice& h, const Mesh& mesh) {
  std::string s = std::string("; ") + (h.kv == RingKv::rotation ? "ring" : "kv all-gather") + (mesh.ring_spans_nodes() ? " across nodes" : " inside a node");
  if (h.kv == RingKv::rotation)
    s += (h.messages > 1 ? ", " + std::to_string(h.messages) + " messages a block" : std::string()) +
         (h.ring.comm_seconds > 0 ? ", attention hides " + pct(1 - h.ring.exposed_seconds / h.ring.comm_seconds) + " of it" : "");
  else
    s += ", exposed";
  if (h.ring.attended_fraction < 0.999)
    s += "; documents leave " + pct(h.ring.attended_fraction) + " of the pairs" +
         (h.ring.imbalance_seconds > 0.005 * h.ring.compute_seconds ? ", the slowest rank " + pct(h.ring.imbalance_seconds / (h.ring.compute_seconds - h.ring.imbalance_seconds)) + " over the mean" : "");
  if (mesh.ulysses_spans_nodes() && !mesh.ring_spans_nodes()) s += "; ring inside a node while the all-to-all crosses nodes";
  return s;
}

/// The reason line of a hybrid choice.
inline std::string hybrid_reason(const HybridChoice& h, const Mesh& mesh) {
  std::string s = h.ulysses_degree == 1 ? "no all-to-all"
                  : h.ulysses.nodes_per_group > 1 ? "all-to-all across " + std::to_string(h.ulysses.nodes_per_group) + " nodes"
                                                  : "all-to-all inside a node";
  s += h.kv == RingKv::none ? "; no ring" : ring_reason(h, mesh);
  if (h.bands.bands > 1) s += "; " + std::to_string(h.bands.bands) + " head bands hide " + pct(1 - h.bands.exposed_fraction) + " of the all-to-alls";
  if (!h.fits) s += "; over the memory budget";
  return s;
}

/// advise_hybrid()'s argument checks (its @throws).
inline void check_hybrid_args(std::int64_t seq_len, std::int64_t batch, double flops_per_s, const Documents* documents,
                              const BandOverhead* band_overhead) {
  if (band_overhead && !(band_time_ok(band_overhead->exchange_call_s) && band_time_ok(band_overhead->attention_call_s)))
    fail(Errc::invalid_shape, "advise_hybrid: band overheads must be finite and >= 0 (exchange call " +
                                  std::to_string(band_overhead->exchange_call_s) + " s, attention call " +
                                  std::to_string(band_overhead->attention_call_s) + " s)");
  if (documents && documents->seq_len() != seq_len)
    fail(Errc::seq_lengths_mismatch, "advise_hybrid: seq_len=" + std::to_string(seq_len) + " but the documents cover " +
                                         std::to_string(documents->seq_len()) + " tokens");
  if (seq_len < 1 || batch < 1 || !(flops_per_s > 0))
    fail(Errc::invalid_shape, "advise_hybrid: seq_len=" + std::to_string(seq_len) + ", batch=" + std::to_string(batch) +
                                  " must be >= 1 and the FLOP rate > 0");
}

/// HybridChoice::bands and banded_seconds of `h` (its Ulysses exchanges and ring priced; `rmesh`
/// its U × R mesh). A band of a fraction f of a rank's query heads runs its own ring of R steps
/// (band_ring.hpp): its time is f of the whole ring's (the attention, the exposed rotation and the
/// merges all scale with the heads) plus what each band pays again: R kernel calls and each
/// transfer's latency (the step's time for one byte; conservatively counted exposed). Without a
/// ring the band's attention is f of the rank's (ring_cost_impl() at R = 1: documents included).
inline void hybrid_bands(HybridChoice& h, const Mesh& rmesh, const AttentionShape& shape, std::int64_t S, bool causal,
                         const CostModel& model, double flops_per_s, ElementType type, std::int64_t batch, HeadPolicy policy,
                         const Documents* docs, const BandOverhead& o) {
  const int U = h.ulysses_degree, R = h.ring_degree;
  if (h.kv == RingKv::allgather) {  // (one band: the exchanges' calls add their overhead)
    h.banded_seconds = h.seconds + (U > 1 ? 2 * o.exchange_call_s : 0);
    return;
  }
  const RingCost ring = R > 1 ? h.ring
                              : ring_cost_impl(rmesh, shape, S, causal, model, flops_per_s, type, batch, RingTransport::network, policy, false, 0, docs);
  double latency = 0;
  for (int s = 0; s + 1 < R; ++s) latency += ring_transfer_seconds(rmesh, RingTransport::network, 1, s, R, ring.messages, model);
  BandWork w;
  w.seq_to_head = h.ulysses.seq_to_head;
  w.head_to_seq = h.ulysses.head_to_seq;
  w.attention_s = ring.compute_seconds + (R > 1 ? ring.exposed_seconds + ring.merge_seconds : 0);
  w.units = band_units_of(attention_specs<float>(U, shape, ElementType::float32, policy), U);
  w.overhead = {U > 1 ? o.exchange_call_s : 0, R * o.attention_call_s + latency};
  h.bands = best_bands(w);
  h.banded_seconds = h.bands.exposed_s + (R > 1 ? ring.exposed_seconds + ring.merge_seconds + ring.imbalance_seconds : 0);
}
}  // namespace detail

/// The feasible Ulysses × Ring × outer layouts of `world` ranks for one layer's forward, best
/// first: within `budget_bytes` by predicted time (the Ulysses exchanges of advise_degree() over
/// a ring rank's tokens + the ring's exposed communication + its merges: what the layout adds to
/// the attention itself; equal times by memory; with packed documents also the attention the
/// slowest rank makes the others wait, RingCost::imbalance_seconds), then the
/// others by memory. For
/// every U of Mesh::degrees() (U inside a node first, U <= H, the head rules of check_heads())
/// and every R with U · R dividing world that Mesh admits (ulysses_inner) and S tokens cover
/// (S >= 2R causal): R = 1 (Ulysses alone), and for R > 1 the ring rotation and the all-gather-kv
/// alternative; a rotation's block goes in best_ring_messages() pieces (HybridChoice::messages).
/// The outer dimension is data parallel (each group runs its own sequences of S).
/// @param shape          the attention layer's head counts and dims
/// @param seq_len        S, tokens of one sequence
/// @param world          ranks in all
/// @param ranks_per_node ranks of one node
/// @param model          link and copy parameters
/// @param flops_per_s    achieved attention FLOP rate of a rank (AttentionRate), > 0
/// @param causal         causal attention (zigzag ring), else contiguous
/// @param type           element type of q, k, v, o
/// @param batch          B >= 1
/// @param policy         the query head split
/// @param budget_bytes   per-rank bytes one layer's attention tensors and ring buffers may take; 0: no limit
/// @param documents      packed documents over the seq_len tokens (null: one sequence): every ring
///                       and all-gather priced over the per-document zigzag with its document
///                       blocks (ring_cost()'s `documents`); a (U, R) the documents cannot take
///                       (RingPartition(Documents, U, R) refuses it) is left out
/// @param band_overhead  each exchange and attention call's overhead (null: no bands priced):
///                       every layout but the all-gather's gets HybridChoice::bands (best_bands()
///                       over its Ulysses exchanges and its ring) and the fitting layouts rank by
///                       banded_seconds instead of seconds
/// @throws Error(invalid_mesh) no feasible layout; Error(invalid_shape) seq_len or batch < 1, flops_per_s <= 0,
///         a band overhead negative or not finite; Error(seq_lengths_mismatch) documents over another seq_len.
inline std::vector<HybridChoice> advise_hybrid(const AttentionShape& shape, std::int64_t seq_len, int world, int ranks_per_node,
                                               const CostModel& model, double flops_per_s = AttentionRate::h100_bf16(), bool causal = true,
                                               ElementType type = ElementType::bfloat16, std::int64_t batch = 1,
                                               HeadPolicy policy = HeadPolicy::even, double budget_bytes = 0,
                                               const Documents* documents = nullptr, const BandOverhead* band_overhead = nullptr) {
  detail::check_hybrid_args(seq_len, batch, flops_per_s, documents, band_overhead);
  std::vector<HybridChoice> out;
  std::string why;
  for (int U : Mesh::degrees(world, ranks_per_node)) {
    if (U > shape.num_heads) break;
    for (int R = 1; static_cast<long long>(U) * R <= world; ++R) {
      if (world % (U * R) != 0 || seq_len < (causal ? 2 * R : R)) continue;
      try {
        const Mesh rmesh(world, U, R, ranks_per_node);
        const Mesh umesh(world, U, ranks_per_node);
        check_heads(umesh, shape, policy);
        const RingPartition part = documents ? RingPartition(*documents, U, R)
                                             : RingPartition(seq_len, U, R, causal ? RingLayout::zigzag : RingLayout::contiguous);
        const std::int64_t L = part.max_ring_length();
        if (L < U) continue;
        const DegreeChoice d = detail::degree_choice(umesh, shape, L, model, type, batch, policy, 0);
        for (RingKv kv : {RingKv::none, RingKv::rotation, RingKv::allgather}) {
          if ((R == 1) != (kv == RingKv::none)) continue;
          HybridChoice h;
          h.ulysses_degree = U;  // U x R x outer
          h.ring_degree = R;
          h.outer_degree = world / (U * R);
          h.kv = kv;
          h.ulysses = d;
          if (R > 1)
            h.ring = detail::ring_cost_impl(rmesh, shape, seq_len, causal, model, flops_per_s, type, batch, RingTransport::network, policy,
                                            kv == RingKv::allgather, 0, documents);
          h.messages = R > 1 ? h.ring.messages : 0;
          h.seconds = d.seconds + h.ring.exposed_seconds + h.ring.merge_seconds + h.ring.imbalance_seconds;
          h.intra_bytes = d.intra_bytes + h.ring.bytes[0];
          h.inter_bytes = d.inter_bytes + h.ring.bytes[1];
          h.activation_bytes = d.activation_bytes + h.ring.buffer_bytes;
          h.fits = budget_bytes <= 0 || h.activation_bytes <= budget_bytes;
          if (band_overhead)
            detail::hybrid_bands(h, rmesh, shape, seq_len, causal, model, flops_per_s, type, batch, policy, documents, *band_overhead);
          h.reason = detail::hybrid_reason(h, rmesh);
          out.push_back(h);
        }
      } catch (const Error& e) {
        if (why.empty()) why = e.what();
      }
    }
  }
  const std::string where = "world=" + std::to_string(world) + ", ranks_per_node=" + std::to_string(ranks_per_node);
  if (out.empty()) detail::fail(Errc::invalid_mesh, "advise_hybrid: no feasible (U, R) for " + where + (why.empty() ? "" : " (" + why + ")"));
  const bool banded = band_overhead != nullptr;
  std::stable_sort(out.begin(), out.end(), [banded](const HybridChoice& a, const HybridChoice& b) {
    if (a.fits != b.fits) return a.fits;
    const double ta = banded ? a.banded_seconds : a.seconds, tb = banded ? b.banded_seconds : b.seconds;
    if (a.fits && ta != tb) return ta < tb;
    return a.activation_bytes < b.activation_bytes;  // (equal times: the smaller memory first)
  });
  return out;
}

ULYSSES_NAMESPACE_END
