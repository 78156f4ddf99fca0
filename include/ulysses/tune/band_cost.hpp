// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Head bands in the cost model: when overlapping the exchanges with the attention pays.
///        A plan's head side cut into G bands; seq→head of band g + 1 and head→seq of band g − 1
///        run on the link while band g's attention runs (band_cost()); best_bands() picks G.
///
/// The pipeline, its formulas and sources (FlashInfer PRs #5027 / #5317, maxdiffusion #428,
/// TeleFuser attention_chunks): docs/cost-model.md, "Head bands: when overlap pays".
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../plan/plan.hpp"
#include "cost.hpp"

ULYSSES_NAMESPACE_BEGIN

/// FLOPs of the attention backward over those of its forward: 2.5 (five matrix products against
/// two; Dao, FlashAttention-2, arXiv:2307.08691, section 4.1, counts the backward at 2.5× the forward).
inline constexpr double kAttentionBackwardFlopsRatio = 2.5;

/// One exchange as the bands see it: its whole time (G = 1) and the part of it that every band
/// pays again whatever its heads. A band of a fraction f of the heads takes
/// fixed_s + f · (seconds − fixed_s): the latency and per-message terms stay per message.
struct BandExchange {
  double seconds = 0;  ///< the whole exchange (G = 1), seconds, >= 0 (measured, or predicted: band_exchange())
  /// of which each band pays again, seconds, in [0, seconds]: α · messages + λ · steps + ε · rounds
  /// of the model (band_exchange()); 0 when unknown (a measured time: then a band takes f · seconds)
  double fixed_s = 0;
};

/// What each band's calls add, beyond the work they do (launches, a collective's entry, an
/// attention kernel's prologue): paid once a call, so G bands pay it G times, G = 1 once.
struct BandOverhead {
  double exchange_call_s = 0;   ///< seconds a call of an exchange adds (seq→head or head→seq), >= 0
  double attention_call_s = 0;  ///< seconds a call of the attention adds, >= 0
};

/// The inputs of band_cost(): one pass (forward or backward) of one layer on one rank.
struct BandWork {
  BandExchange seq_to_head;  ///< forward: q, k, v seq→head; backward: dO seq→head
  BandExchange head_to_seq;  ///< forward: o head→seq; backward: dq, dk, dv head→seq (sums)
  double attention_s = 0;    ///< the pass's whole attention on this rank (G = 1, no call overhead), seconds, >= 0
  /// the units the bands are made of: a rank's local query heads (HeadBands, bands.hpp: a band is a
  /// run of each rank's query heads; the kv heads they use travel with the first band that uses
  /// them, which the model spreads with the query heads); >= 1. G runs over [1, units].
  int units = 1;
  BandOverhead overhead;       ///< each call's fixed cost
  /// the transport needs the compute the attention runs on (an in-process group's or shared
  /// memory's copies run on the same CPU cores), or moves posted bytes only while the host is
  /// inside its calls (Open MPI's ob1 over TCP with no progress thread): nothing overlaps, every
  /// task runs in turn
  bool shares_compute = false;
};

/// What band_cost() predicts for G bands (seconds throughout).
struct BandCost {
  int bands = 1;                   ///< G
  std::vector<int> band_units;     ///< units of each band (band_units()): the first units % G one more
  double serial_exchange_s = 0;    ///< G = 1: seq→head + head→seq, one call each
  double attention_s = 0;          ///< G = 1: the attention, one call
  double serial_s = 0;             ///< G = 1: serial_exchange_s + attention_s
  double pipelined_s = 0;          ///< G bands through the pipeline (= serial_s for G = 1)
  double exposed_s = 0;            ///< pipelined_s − attention_s: what the layout adds to the attention
  double exposed_fraction = 0;     ///< exposed_s / serial_exchange_s (1 at G = 1; 0 when there is no exchange)
};

/// The units of each of G bands of `units` (balanced: the first units % G bands one unit more).
/// @param units the units to cut, >= 1
/// @param G     bands, in [1, units]
/// @throws Error(invalid_shape) units < 1 or G outside [1, units].
inline std::vector<int> band_units(int units, int G) {
  if (units < 1 || G < 1 || G > units)
    detail::fail(Errc::invalid_shape, "band_units: G=" + std::to_string(G) + " bands of units=" + std::to_string(units) +
                                          " (need units >= 1 and 1 <= G <= units: a band holds at least one query head)");
  std::vector<int> u(static_cast<std::size_t>(G), units / G);
  for (int g = 0; g < units % G; ++g) ++u[static_cast<std::size_t>(g)];
  return u;
}

/// An exchange's time and its per-band part by the model: seconds = predict_seconds(t, m);
/// fixed_s = its terms that do not scale with the bytes (α · messages, λ · steps, ε · rounds: the
/// model with β, γ, δ and the cached rates zeroed). A band of a fraction f of the heads moves f
/// of the bytes in as many messages (every peer still holds some of each band's heads). The cache
/// regime is priced at the whole exchange's working set (a band's smaller one may run faster).
/// @param t the whole exchange's traffic (exchange_traffic())
/// @param m the model's parameters
inline BandExchange band_exchange(const ExchangeTraffic& t, const CostModel& m) {
  CostModel fixed = m;
  for (LinkCost* l : {&fixed.intra, &fixed.inter}) l->seconds_per_byte = 0;
  fixed.intra_cached_seconds_per_byte = fixed.copy_seconds_per_byte = fixed.copy_cached_seconds_per_byte = 0;
  fixed.copy_seconds_per_row = 0;
  const double s = predict_seconds(t, m);
  return {s, std::min(s, predict_seconds(t, fixed))};
}

/// Forward attention FLOPs of `q_heads` query heads over `seq_len` tokens: 2 · B · h · pairs ·
/// (D + Dv), pairs = S² (S · (S + 1) / 2 causal), as ring_step_flops() (tune/ring_cost.hpp) counts
/// a step; the backward is kAttentionBackwardFlopsRatio times it. Seconds = FLOPs / a FLOP rate
/// (AttentionRate, achieved).
/// @param q_heads    query heads of the rank, >= 0
/// @param seq_len    S, tokens each query attends over (the whole sequence after seq→head), >= 0
/// @param head_dim   D, >= 0
/// @param v_head_dim Dv (0: D)
/// @param batch      B, >= 0
/// @param causal     causal mask (half the pairs and the diagonal)
inline double attention_flops(std::int64_t q_heads, std::int64_t seq_len, std::int64_t head_dim, std::int64_t v_head_dim = 0,
                              std::int64_t batch = 1, bool causal = true) {
  const double s = static_cast<double>(seq_len);
  const double pairs = causal ? s * (s + 1) / 2 : s * s;
  return 2.0 * static_cast<double>(batch) * static_cast<double>(q_heads) * pairs *
         static_cast<double>(head_dim + (v_head_dim ? v_head_dim : head_dim));
}

namespace detail {
inline bool band_time_ok(double s) { return s >= 0 && std::isfinite(s); }

inline void check_band_work(const BandWork& w) {
  const BandExchange* x[2] = {&w.seq_to_head, &w.head_to_seq};
  bool ok = band_time_ok(w.attention_s) && band_time_ok(w.overhead.exchange_call_s) && band_time_ok(w.overhead.attention_call_s);
  for (const BandExchange* e : x) ok = ok && band_time_ok(e->seconds) && band_time_ok(e->fixed_s) && e->fixed_s <= e->seconds;
  if (!ok)
    fail(Errc::invalid_shape, "band_cost: times must be finite and >= 0, and each exchange's fixed_s within its seconds (seq->head " +
                                  std::to_string(w.seq_to_head.seconds) + " s, fixed " + std::to_string(w.seq_to_head.fixed_s) +
                                  " s; head->seq " + std::to_string(w.head_to_seq.seconds) + " s, fixed " +
                                  std::to_string(w.head_to_seq.fixed_s) + " s; attention " + std::to_string(w.attention_s) + " s)");
}

/// A band's exchange of `f` of the heads, one call.
inline double band_exchange_seconds(const BandExchange& e, double f, const BandOverhead& o) {
  return o.exchange_call_s + e.fixed_s + f * (e.seconds - e.fixed_s);
}

/// The banded pipeline's end, list-scheduled on two resources, the link and the compute. The link
/// runs its tasks in this order: in_0, then while attention g runs in_{g+1} and out_{g−1}, then
/// out_{G−1}; attention g starts when in_g and attention g − 1 have finished; out_g when
/// attention g has and the link is free; in_g as soon as the link is free.
inline double band_pipeline_end(const std::vector<double>& in, const std::vector<double>& attn, const std::vector<double>& out) {
  const std::size_t G = in.size();
  std::vector<double> in_end(G, 0), attn_end(G, 0);
  double link = in[0], compute = 0;
  in_end[0] = in[0];
  for (std::size_t g = 0; g < G; ++g) {
    compute = attn_end[g] = std::max(in_end[g], compute) + attn[g];
    if (g + 1 < G) in_end[g + 1] = link += in[g + 1];
    if (g >= 1) link = std::max(link, attn_end[g - 1]) + out[g - 1];
  }
  return std::max(link, attn_end[G - 1]) + out[G - 1];
}
}  // namespace detail

/// The time of one pass (seq→head + attention + head→seq) of `w` in G head bands, and its exposed
/// communication (see BandCost; docs/cost-model.md, "Head bands: when overlap pays"). Band g holds
/// n_g of the n units (band_units()), a fraction f_g = n_g / n: its exchanges take
/// o_x + fixed + f_g · (T − fixed) each, its attention o_a + f_g · A. The link carries one
/// exchange at a time (seq→head of g + 1 and head→seq of g − 1, both while attention g runs, add
/// up); band g's attention needs its seq→head done, its head→seq starts after its attention
/// (detail::band_pipeline_end()). With `shares_compute` nothing overlaps: the pipeline is the sum
/// of its 3G tasks, the serial time plus (G − 1) · (2 o_x + o_a + fixed_in + fixed_out).
/// G = 1 is the serial time exactly. For equal bands, zero fixed costs and a compute-bound pipeline
/// (A ≥ T_in + T_out) the time is T_in / G + A + T_out / G.
/// @param w     the pass's times (seconds), units and overheads
/// @param units the units of each band, in pipeline order: each >= 1, summing to w.units (band_units()
///              balanced; maxdiffusion #428 gives the last band the remainder instead)
/// @throws Error(invalid_shape) a time negative or not finite, an exchange's fixed_s above its
///         seconds, w.units < 1, or `units` empty, with a band < 1 or not summing to w.units.
inline BandCost band_cost(const BandWork& w, const std::vector<int>& units) {
  detail::check_band_work(w);
  long long total = 0;
  bool ok = !units.empty() && w.units >= 1;
  for (int n : units) {
    ok = ok && n >= 1;
    total += n;
  }
  if (!ok || total != w.units)
    detail::fail(Errc::invalid_shape, "band_cost: " + std::to_string(units.size()) + " bands of " + std::to_string(total) +
                                          " units in all, each >= 1 (need w.units=" + std::to_string(w.units) + " in all)");
  BandCost c;
  c.bands = static_cast<int>(units.size());
  c.band_units = units;
  const int G = c.bands;
  const BandOverhead& o = w.overhead;
  c.serial_exchange_s = w.seq_to_head.seconds + w.head_to_seq.seconds + 2 * o.exchange_call_s;
  c.attention_s = w.attention_s + o.attention_call_s;
  c.serial_s = c.serial_exchange_s + c.attention_s;
  std::vector<double> in, attn, out;
  double sum = 0;
  for (int n : c.band_units) {
    const double f = static_cast<double>(n) / static_cast<double>(w.units);
    in.push_back(detail::band_exchange_seconds(w.seq_to_head, f, o));
    attn.push_back(o.attention_call_s + f * w.attention_s);
    out.push_back(detail::band_exchange_seconds(w.head_to_seq, f, o));
    sum += in.back() + attn.back() + out.back();
  }
  c.pipelined_s = G == 1 ? c.serial_s : w.shares_compute ? sum : detail::band_pipeline_end(in, attn, out);
  c.exposed_s = c.pipelined_s - c.attention_s;
  c.exposed_fraction = c.serial_exchange_s > 0 ? c.exposed_s / c.serial_exchange_s : 0;
  return c;
}

/// band_cost() of G balanced bands (band_units(w.units, G)).
/// @param w the pass (as above)
/// @param G bands, in [1, w.units]
/// @throws Error(invalid_shape) as above, or G outside [1, w.units].
inline BandCost band_cost(const BandWork& w, int G) {
  detail::check_band_work(w);
  return band_cost(w, band_units(w.units, G));
}

/// The G in [1, min(w.units, max_bands)] whose band_cost() is shortest; equal times (within a
/// relative 1e-9) go to the smaller G, so G = 1 where overlap loses: a transport that shares
/// the attention's compute, fast links with little attention a band to hide behind, or more
/// overhead a band (calls, per-message latency) than the overlap hides.
/// @param w         the pass (as band_cost())
/// @param max_bands the most bands to consider, >= 1; 0: w.units
/// @throws Error(invalid_shape) max_bands < 0; what band_cost() throws.
inline BandCost best_bands(const BandWork& w, int max_bands = 0) {
  if (max_bands < 0) detail::fail(Errc::invalid_shape, "best_bands: max_bands=" + std::to_string(max_bands) + " (need >= 0; 0: every G)");
  BandCost best = band_cost(w, 1);
  const int top = max_bands == 0 ? w.units : std::min(w.units, max_bands);
  for (int G = 2; G <= top; ++G) {
    BandCost c = band_cost(w, G);
    if (c.pipelined_s < best.pipelined_s * (1 - 1e-9)) best = std::move(c);
  }
  return best;
}

/// One layer's pass of `qkv` and `o` (plans of one rank: q, k, v and the attention output) as
/// band_cost() inputs, priced by the model on `path` (band_exchange()). Forward: q, k, v
/// seq→head, then o head→seq, attention `attention_s`; backward (`backward`): dO seq→head (o's
/// plan), then dq, dk, dv head→seq (qkv's plan, replicated heads summed), attention
/// kAttentionBackwardFlopsRatio × `attention_s`.
/// @param qkv         the plan of q, k, v (AttentionSpecs::qkv())
/// @param o           the plan of the output (AttentionSpecs::out())
/// @param path        the path the exchanges take (not Path::automatic)
/// @param m           the model's parameters
/// @param attention_s the forward attention of this rank, seconds, >= 0 (attention_flops() / a rate)
/// @param units       the band units of a rank (BandWork::units), >= 1
/// @param overhead    each call's fixed cost
/// @param backward    the backward pass instead of the forward
/// @throws what exchange_traffic() throws (Error(path_unsupported) for Path::automatic).
inline BandWork layer_band_work(const Plan& qkv, const Plan& o, Path path, const CostModel& m, double attention_s, int units,
                                BandOverhead overhead = {}, bool backward = false) {
  BandWork w;
  w.seq_to_head = band_exchange(exchange_traffic(backward ? o : qkv, Direction::seq_to_head, path), m);
  w.head_to_seq = band_exchange(exchange_traffic(backward ? qkv : o, Direction::head_to_seq, path), m);
  w.attention_s = backward ? kAttentionBackwardFlopsRatio * attention_s : attention_s;
  w.units = units;
  w.overhead = overhead;
  return w;
}

ULYSSES_NAMESPACE_END
