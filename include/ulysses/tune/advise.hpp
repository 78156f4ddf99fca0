// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Advice on the Ulysses degree of a world of ranks: advise_degree() prices every feasible
///        (Ulysses degree, outer degree) layout of a Mesh with the α-β model (tune/cost.hpp) on the
///        flat and the two-level exchanges, and checks each against a memory budget.
///
/// The volume follows DeepSpeed-Ulysses' analysis (Jacobs et al., arXiv:2309.14509, section 3.1):
/// per layer a rank sends (P-1)/P of its q, k, v shards seq→head and of o head→seq; a smaller P
/// moves fewer bytes but holds more tokens a rank (data parallel outer dimension), so the budget
/// decides. `ulysses_perf --advise` prints the advice.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../layout/element.hpp"
#include "../partition/seq.hpp"
#include "../plan/attention.hpp"
#include "../plan/plan.hpp"
#include "../topology/mesh.hpp"
#include "band_cost.hpp"
#include "cost.hpp"

ULYSSES_NAMESPACE_BEGIN

/// One feasible way to lay out a world for Ulysses (see advise_degree()).
struct DegreeChoice {
  int ulysses_degree = 0;         ///< P
  int outer_degree = 0;           ///< world / P (data parallel, or context parallel when asked)
  int nodes_per_group = 1;        ///< nodes a Ulysses group spans
  Path path = Path::alltoallv;    ///< the fastest of the flat (alltoallv or messages) and the two-level exchanges
  int lanes = 0;                  ///< PlanOptions::lanes of the two-level exchange taken (0 when flat)
  double seconds = 0;             ///< predicted exchange time of one layer's forward: q,k,v seq→head + o head→seq
  double flat_seconds = 0;        ///< the same on the flat exchange
  double two_level_seconds = 0;   ///< the same on the two-level exchange, one message per node pair (lanes 1)
  double rail_seconds = 0;        ///< the same on the rail-aligned two-level exchange (lanes 0)
                                  ///< (both = flat_seconds when the group fits in a node)
  double intra_bytes = 0;         ///< bytes per layer over the busiest rank's intra-node link (path taken)
  double inter_bytes = 0;         ///< bytes per layer over the busiest rank's inter-node link (path taken)
  double activation_bytes = 0;    ///< a rank's q,k,v,o in both shardings and the workspaces of the two forward exchanges on
                                  ///< the path taken (its busiest rank: a forwarder's on the two-level paths), one layer
  bool fits = true;               ///< activation_bytes within the budget given to advise_degree()
  BandExchange seq_to_head;       ///< q,k,v seq→head on the path taken, with the part a head band pays again (band_exchange(); 0 for P = 1)
  BandExchange head_to_seq;       ///< o head→seq on the path taken, likewise
  /// the forward in head bands (tune/band_cost.hpp): best_bands() of the exchanges above and the
  /// attention of the rank's query heads at advise_degree()'s BandAdvice rate, units its local
  /// query heads (HeadBands); without a rate (BandAdvice::flops_per_s = 0) not priced: bands 1, times 0
  BandCost bands;
};

/// What advise_degree() needs to price head bands (DegreeChoice::bands): the attention's rate and
/// mask, and each call's overhead. The default prices none.
struct BandAdvice {
  double flops_per_s = 0;  ///< a rank's achieved attention rate, FLOP/s (AttentionRate, tune/ring_cost.hpp), >= 0; 0: no bands priced
  /// > 0: the attention takes this times the row's exchanges (seq→head + head→seq seconds)
  /// instead of its FLOPs at flops_per_s (which must still be > 0 to price bands); >= 0
  double attention_ratio = 0;
  bool causal = true;      ///< causal attention (half the pairs)
  BandOverhead overhead;   ///< seconds each exchange and attention call adds (launch, call)
};

namespace detail {
/// What advise_degree() reports for one feasible degree P = mesh.ulysses_degree() over S tokens a
/// group: the flat exchange, and across nodes the two-level one with one lane and rail-aligned,
/// priced by the model; the cheapest of them with its bytes and memory.
inline DegreeChoice degree_choice(const Mesh& mesh, const AttentionShape& shape, std::int64_t S, const CostModel& model,
                                  ElementType type, std::int64_t batch, HeadPolicy policy, double budget_bytes) {
  const int P = mesh.ulysses_degree();
  const AttentionSpecs a = attention_specs<float>(P, shape, ElementType::float32, policy);  // retyped below
  auto retype = [type](std::vector<TensorSpec> v) {
    for (TensorSpec& x : v) {
      x.elem_bytes = size_of(type);
      x.type = type;
    }
    return v;
  };
  DegreeChoice d;
  d.ulysses_degree = P;
  d.outer_degree = mesh.outer_degree();
  d.nodes_per_group = mesh.ulysses_group_nodes();
  const SeqPartition seq = SeqPartition::balanced(S, P);
  // Candidates: flat, then (across nodes) two-level with one lane and with rail-aligned lanes.
  struct Candidate {
    Path path;
    int lanes;
    double seconds;
    ExchangeTraffic qkv, o;
  };
  std::vector<Candidate> cands;
  double tensors = 0;
  for (int c = 0; c < (mesh.ulysses_spans_nodes() ? 3 : 1); ++c) {
    PlanOptions po;
    po.path = c == 0 ? Path::alltoallv : Path::two_level;
    po.nodes = mesh.nodes();
    po.lanes = c == 2 ? 0 : 1;
    const Plan q({P, 0}, batch, seq, retype(a.qkv()), Format::bshd, po), o({P, 0}, batch, seq, retype(a.out()), Format::bshd, po);
    Candidate k{po.path, c == 0 ? 0 : po.lanes, 0, exchange_traffic(q, Direction::seq_to_head, po.path),
                exchange_traffic(o, Direction::head_to_seq, po.path)};
    k.seconds = predict_seconds(k.qkv, model) + predict_seconds(k.o, model);
    if (c == 0) {  // flat: the faster of one all-to-all-v and the message path (all messages at once)
      Candidate m{Path::messages, 0, 0, exchange_traffic(q, Direction::seq_to_head, Path::messages),
                  exchange_traffic(o, Direction::head_to_seq, Path::messages)};
      m.seconds = predict_seconds(m.qkv, model) + predict_seconds(m.o, model);
      if (m.seconds < k.seconds) k = m;
    }
    cands.push_back(k);
    if (c == 0)
      for (const Plan* p : {&q, &o})
        for (int t = 0; t < p->num_tensors(); ++t) tensors += static_cast<double>(p->seq_bytes(t) + p->head_bytes(t));
  }
  if (P == 1) cands[0].seconds = 0;  // no exchange at all (the plan's local copy is skipped by engines)
  d.flat_seconds = cands[0].seconds;
  d.two_level_seconds = cands.size() > 1 ? cands[1].seconds : d.flat_seconds;
  d.rail_seconds = cands.size() > 2 ? cands[2].seconds : d.flat_seconds;
  const Candidate& best = *std::min_element(cands.begin(), cands.end(), [](const Candidate& x, const Candidate& y) { return x.seconds < y.seconds; });
  d.path = best.path;
  d.lanes = best.lanes;
  d.seconds = best.seconds;
  d.activation_bytes = tensors + best.qkv.workspace_bytes + best.o.workspace_bytes;
  d.intra_bytes = best.qkv.bytes[0] + best.o.bytes[0];
  d.inter_bytes = best.qkv.bytes[1] + best.o.bytes[1];
  d.fits = budget_bytes <= 0 || d.activation_bytes <= budget_bytes;
  if (P > 1) std::tie(d.seq_to_head, d.head_to_seq) = std::make_pair(band_exchange(best.qkv, model), band_exchange(best.o, model));
  return d;
}

/// The units a rank's head bands are made of (BandWork::units): the fewest local query heads of a
/// rank of the P-rank split `a` (HeadBands, bands.hpp: a band is a run of each rank's query
/// heads), at least 1.
inline int band_units_of(const AttentionSpecs& a, int P) {
  std::int64_t fewest = a.query_heads.count(0);
  for (int r = 1; r < P; ++r) fewest = std::min(fewest, a.query_heads.count(r));
  return static_cast<int>(std::max<std::int64_t>(1, fewest));
}

/// DegreeChoice::bands of `d` (its exchanges priced) for `shape` over S tokens a group: the
/// attention of the busiest rank's query heads at `b`'s rate, the units the fewest local query
/// heads of a rank (HeadBands, bands.hpp: a band is a run of each rank's query heads; the kv
/// heads they use travel with the first band that uses them).
inline void degree_bands(DegreeChoice& d, const AttentionShape& shape, std::int64_t S, std::int64_t batch, HeadPolicy policy,
                         const BandAdvice& b) {
  const int P = d.ulysses_degree;
  const AttentionSpecs a = attention_specs<float>(P, shape, ElementType::float32, policy);
  std::int64_t h = 0;
  for (int r = 0; r < P; ++r) h = std::max(h, a.query_heads.count(r));
  BandWork w;
  w.seq_to_head = d.seq_to_head;
  w.head_to_seq = d.head_to_seq;
  w.attention_s = b.attention_ratio > 0 ? b.attention_ratio * (d.seq_to_head.seconds + d.head_to_seq.seconds)
                                        : attention_flops(h, S, shape.head_dim, shape.v_head_dim, batch, b.causal) / b.flops_per_s;
  w.units = band_units_of(a, P);
  w.overhead = b.overhead;
  if (P == 1) w.overhead.exchange_call_s = 0;  // no exchange is called
  d.bands = best_bands(w);
}
}  // namespace detail

/// The feasible (Ulysses degree, outer degree) layouts of `world` ranks on nodes of
/// `ranks_per_node`, with the model's exchange time per layer (forward: q,k,v seq→head and o
/// head→seq, on the fastest of the flat exchange and the two-level one with one lane or with
/// rail-aligned lanes), bytes per link class and per-rank
/// activation memory; best first: those whose activation memory fits `budget_bytes` (0: no
/// limit) by predicted time, then the others by memory. Feasible: Mesh(world, P, ranks_per_node)
/// is valid and check_heads(mesh, shape, policy) passes. The outer dimension is data parallel (each
/// group runs its own sequences of `seq_len` tokens; a smaller P then moves fewer bytes but holds
/// more tokens a rank, so the budget decides) or, with `outer_splits_sequence`, context parallel
/// (ring attention over S / outer tokens a group; the ring's own traffic is not modelled). P = 1
/// needs no exchange: its time is 0.
/// @param shape the attention layer's head counts and dims
/// @param seq_len S, tokens of one sequence (>= 1)
/// @param world ranks in all (GPUs)
/// @param ranks_per_node ranks of one node (R)
/// @param model link and copy parameters (CostModel::nvlink_infiniband(), or fit_cost_model())
/// @param type element type of q, k, v, o (bf16 in training)
/// @param batch B (>= 1)
/// @param policy the query head split (HeadPolicy::balanced admits any H)
/// @param budget_bytes per-rank bytes one layer's attention tensors may take (activation_bytes); 0: no limit
/// @param outer_splits_sequence the outer dimension is context parallel (S / outer tokens a group)
/// @param bands the attention rate and call overheads to price head bands with (DegreeChoice::bands,
///        best_bands()); the default prices none. The order of the choices does not depend on it.
/// @throws Error(invalid_mesh) no feasible degree (the message says why for P = 1);
///         Error(invalid_shape) seq_len or batch < 1, a band rate or overhead negative or not finite.
inline std::vector<DegreeChoice> advise_degree(const AttentionShape& shape, std::int64_t seq_len, int world, int ranks_per_node,
                                               const CostModel& model, ElementType type = ElementType::bfloat16,
                                               std::int64_t batch = 1, HeadPolicy policy = HeadPolicy::even,
                                               double budget_bytes = 0, bool outer_splits_sequence = false,
                                               const BandAdvice& bands = {}) {
  for (double v : {bands.flops_per_s, bands.attention_ratio, bands.overhead.exchange_call_s, bands.overhead.attention_call_s})
    if (!(v >= 0) || !std::isfinite(v))
      detail::fail(Errc::invalid_shape, "advise_degree: the band attention rate (" + std::to_string(bands.flops_per_s) +
                                            " FLOP/s), attention ratio and call overheads must be finite and >= 0");
  if (seq_len < 1 || batch < 1)
    detail::fail(Errc::invalid_shape, "advise_degree: seq_len=" + std::to_string(seq_len) + " and batch=" + std::to_string(batch) +
                                          " must be >= 1");
  std::vector<DegreeChoice> out;
  std::string why;
  const std::vector<int> candidates = Mesh::degrees(world, ranks_per_node);
  if (candidates.empty()) Mesh(world, 1, ranks_per_node);  // throws invalid_mesh, saying why
  for (int P : candidates) {
    if (P > shape.num_heads) break;  // check_heads refuses the rest
    try {
      const Mesh mesh(world, P, ranks_per_node);
      check_heads(mesh, shape, policy);
      const std::int64_t S = outer_splits_sequence ? seq_len / mesh.outer_degree() : seq_len;
      if (S < P) continue;  // fewer tokens than ranks
      out.push_back(detail::degree_choice(mesh, shape, S, model, type, batch, policy, budget_bytes));
      if (bands.flops_per_s > 0) detail::degree_bands(out.back(), shape, S, batch, policy, bands);
    } catch (const Error& e) {
      if (why.empty()) why = e.what();
    }
  }
  if (out.empty())
    detail::fail(Errc::invalid_mesh, "advise_degree: no feasible Ulysses degree for world=" + std::to_string(world) + ", ranks_per_node=" +
                                         std::to_string(ranks_per_node) + (why.empty() ? "" : " (P = " + std::to_string(candidates.front()) + ": " + why + ")"));
  std::stable_sort(out.begin(), out.end(), [](const DegreeChoice& a, const DegreeChoice& b) {
    if (a.fits != b.fits) return a.fits;
    return a.fits ? a.seconds < b.seconds : a.activation_bytes < b.activation_bytes;
  });
  return out;
}

ULYSSES_NAMESPACE_END
