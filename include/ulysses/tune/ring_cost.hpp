// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The ring of Ulysses × Ring in the α-β model (tune/cost.hpp): a ring step's traffic per
///        link class (ring_step_traffic()), the attention a step hides it behind (ring_cost(): the
///        exposed communication max(0, comm − compute) per step), the all-gather-kv alternative
///        (allgather_kv_cost()); the advice over (U, R, outer), advise_hybrid(), is tune/hybrid.hpp
///        (included at the end).
///
/// The traffic, overlap, merge and all-gather terms and their sources: docs/cost-model.md;
/// docs/headers.md, "tune/ring_cost.hpp".
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../layout/element.hpp"
#include "../plan/attention.hpp"
#include "../partition/ring.hpp"
#include "../ring/schedule.hpp"
#include "../topology/mesh.hpp"
#include "advise.hpp"
#include "cost.hpp"
#include "fit.hpp"

ULYSSES_NAMESPACE_BEGIN

/// How a ring's bytes move (how the model prices them).
enum class RingTransport : int {
  network = 0,        ///< a message on the link class of the ring's slowest edge (MPI, NCCL)
  shared_memory = 1,  ///< one copy of the block per step (an in-process group: LocalGroup)
  /// no copy (RingAccess::zero_copy over MpiWindowComm or LocalGroup::Comm: each step reads the
  /// owner's block in place): a rotation's two synchronisations (start(0), finish(R − 1)), each
  /// one intra-node latency λ, none hidden; every ring edge on one node
  zero_copy = 2,
};

/// Attention FLOP rates, FLOP/s, for ring_cost()'s compute term (achieved, not peak).
struct AttentionRate {
  /// H100 / H200 class, bf16: FlashAttention-3 reaches 500-740 TFLOP/s in the forward on H100 SXM
  /// (Shah et al., arXiv:2407.08608, figure 6: causal and short heads at the lower end); 500e12.
  static constexpr double h100_bf16() { return 500e12; }
  /// A100 class, bf16: FlashAttention-2 reaches 190-230 TFLOP/s forward on A100 (Dao, arXiv:2307.08691); 200e12.
  static constexpr double a100_bf16() { return 200e12; }
};

/// The traffic of one ring of a mesh, per step.
struct RingTraffic {
  ExchangeTraffic step;       ///< one transfer step of the busiest rank: its block's messages on its slowest link class
  std::array<int, 2> edges{}; ///< the ring's R edges (r → r + 1 mod R) by link class [intra, inter]; R = 1: none
  double block_bytes = 0;     ///< bytes of the block a step moves (the largest block of the ring)
  int messages = 1;           ///< pieces the block goes in (RingConfig::messages), in flight together
  double piece_bytes = 0;     ///< bytes of the largest piece (ring_piece_begin(): pieces at 4 KiB multiples)
  RingTransport transport = RingTransport::network;  ///< how the bytes move
};

/// Bytes of ring rank j's k|v block on a Ulysses rank: B · L_j · kvh · (D + Dv) · element size,
/// kvh = the most kv heads a Ulysses rank of U holds (attention_specs(U, shape): Hkv / U, or 1
/// when U > Hkv).
/// @param part   the ring partition (its U and R)
/// @param j      ring rank, 0 .. R − 1
/// @param shape  the attention layer's head counts and dims
/// @param type   element type of k and v
/// @param batch  B >= 1
/// @param policy the query head split (as attention_specs())
/// @throws what attention_specs() throws for U; Error(invalid_group) j outside [0, R).
inline double ring_block_bytes(const RingPartition& part, int j, const AttentionShape& shape, ElementType type, std::int64_t batch = 1,
                               HeadPolicy policy = HeadPolicy::even) {
  if (j < 0 || j >= part.ring_degree())
    detail::fail(Errc::invalid_group, "ring_block_bytes: ring rank " + std::to_string(j) + " outside [0, " + std::to_string(part.ring_degree()) + ")");
  const int U = part.ulysses_degree();
  const AttentionSpecs a = attention_specs<float>(U, shape, ElementType::float32, policy);
  std::int64_t kvh = 0;
  for (int u = 0; u < U; ++u) kvh = std::max(kvh, a.kv_heads.count(u));
  const std::int64_t Dv = shape.v_head_dim ? shape.v_head_dim : shape.head_dim;
  return static_cast<double>(batch) * static_cast<double>(part.ring_length(j)) * static_cast<double>(kvh) *
         static_cast<double>(shape.head_dim + Dv) * static_cast<double>(size_of(type));
}

/// The traffic of one transfer step of the rings of `mesh` moving a block of `block_bytes` as
/// `messages` pieces (see docs/headers.md, "tune/ring_cost.hpp"): the edges of outer group 0's
/// ring of Ulysses rank 0 by link class (every ring of the mesh has the same pattern), and the
/// step's busiest rank: `messages` messages, block_bytes in all, on the inter-node link when an
/// edge crosses nodes, else the intra-node one (shared_memory: a copy of block_bytes in `messages`
/// rows, no link bytes; zero_copy: one intra-node latency step, no bytes, no copy). One round;
/// working set: the two buffers of the rotation. R = 1: nothing moves (an empty traffic). The
/// pieces are the rotation's (ring_piece_begin()).
/// @param mesh        the U × R × outer mesh
/// @param block_bytes bytes of the block, >= 0 (ring_block_bytes(), the largest of the ring)
/// @param transport   how the bytes move
/// @param messages    pieces a block goes in (RingConfig::messages), 1 .. kMaxRingMessages
/// @throws Error(invalid_shape) messages outside [1, kMaxRingMessages], or block_bytes < 0 or not
///         finite; zero_copy on a ring with an edge between nodes.
inline RingTraffic ring_step_traffic(const Mesh& mesh, double block_bytes, RingTransport transport = RingTransport::network,
                                     int messages = 1) {
  if (messages < 1 || messages > kMaxRingMessages || !(block_bytes >= 0) || !std::isfinite(block_bytes))
    detail::fail(Errc::invalid_shape, "ring_step_traffic: messages=" + std::to_string(messages) + " (need 1 .. " +
                                          std::to_string(kMaxRingMessages) + "), block_bytes=" + std::to_string(block_bytes) + " (need >= 0)");
  RingTraffic t;
  t.block_bytes = block_bytes;
  t.messages = messages;
  t.transport = transport;
  const auto bytes = static_cast<std::size_t>(std::ceil(block_bytes));
  for (int i = 0; i < messages; ++i)
    t.piece_bytes = std::max(t.piece_bytes, static_cast<double>(ring_piece_begin(bytes, messages, i + 1) - ring_piece_begin(bytes, messages, i)));
  if (messages == 1) t.piece_bytes = block_bytes;
  const int R = mesh.ring_degree();
  if (R == 1) return t;
  const std::vector<int> ring = mesh.ring_ranks_of(0);
  const int N = mesh.ranks_per_node();
  for (int j = 0; j < R; ++j) ++t.edges[ring[static_cast<std::size_t>(j)] / N == ring[static_cast<std::size_t>((j + 1) % R)] / N ? 0 : 1];
  const int c = t.edges[1] > 0 ? 1 : 0;
  t.step.rounds = 1;
  if (transport == RingTransport::zero_copy) {  // a synchronisation, no bytes
    if (c == 1) detail::fail(Errc::invalid_shape, "ring_step_traffic: RingTransport::zero_copy reads the peers' blocks in place, but the ring "
                                                  "has edges between nodes (every ring rank must be on one node)");
    t.step.latency_steps[0] = 1;
    return t;
  }
  t.step.messages[static_cast<std::size_t>(c)] = messages;
  if (transport == RingTransport::shared_memory) {
    t.step.copy_bytes = block_bytes;
    t.step.copy_rows = messages;
  } else {
    t.step.bytes[static_cast<std::size_t>(c)] = block_bytes;
  }
  t.step.working_set_bytes = 2 * block_bytes;
  return t;
}

/// The model's time of one ring transfer step, seconds: over the network the block's k messages in
/// flight together, k·α + λ + max(b · β, p · β_f) on the step's link class (b the block's bytes,
/// p its largest piece, β_f the link's per-flow cost: LinkCost::flow_seconds_per_byte;
/// predict_flow_seconds()); shared memory: predict_seconds() of the copy (no per-flow cap); zero
/// copy: predict_seconds() of the synchronisation (λ_intra + the round). 0 for R = 1. See
/// docs/cost-model.md, "The ring's wire split".
/// @param t the step (ring_step_traffic())
/// @param m the model's parameters
inline double ring_step_seconds(const RingTraffic& t, const CostModel& m) {
  if (t.transport != RingTransport::network) return predict_seconds(t.step, m);
  const std::size_t c = t.edges[1] > 0 ? 1 : 0;
  std::array<double, 2> largest{0, 0};
  largest[c] = t.step.rounds > 0 ? t.piece_bytes : 0;
  return predict_flow_seconds(t.step, largest, m);
}

/// A measured ring step as a sample of fit_flow_cost() (tune/fit.hpp): its traffic and largest piece
/// on the step's link class (network transport), and the measured seconds.
/// @param t       the step (ring_step_traffic() of the measured block and messages)
/// @param seconds the step's measured time, > 0 (fit_flow_cost() checks it)
inline FlowSample ring_flow_sample(const RingTraffic& t, double seconds) {
  FlowSample x{t.step, {0, 0}, seconds};
  if (t.transport == RingTransport::network && t.step.rounds > 0) x.largest_message[t.edges[1] > 0 ? 1 : 0] = t.piece_bytes;
  return x;
}

/// The pieces a ring block of `block_bytes` should go in on `mesh`'s rings by the model: the k of
/// 1, 2, 4, 8, ... <= max_messages whose step (ring_step_seconds()) is shortest, the fewest
/// messages of equal times. Without a per-flow cap (β_f = 0, the default) every piece adds α and
/// nothing else: 1. With one, k pieces lift the rate from 1 / β_f towards the link's 1 / β, worth
/// it while the bytes' time saved exceeds the (k − 1)·α added. The measured alternative, per
/// communicator: measure_ring_split() (tune/ring_split.hpp).
/// @param model        the model's parameters
/// @param mesh         the U × R × outer mesh (R = 1: 1)
/// @param block_bytes  bytes of the block, >= 0 (ring_block_bytes(), the ring's largest)
/// @param transport    how the bytes move
/// @param max_messages the most pieces to consider, 1 .. kMaxRingMessages
/// @throws Error(invalid_shape) max_messages outside [1, kMaxRingMessages], block_bytes < 0.
inline int best_ring_messages(const CostModel& model, const Mesh& mesh, double block_bytes, RingTransport transport = RingTransport::network,
                              int max_messages = kMaxRingMessages) {
  if (max_messages < 1 || max_messages > kMaxRingMessages)
    detail::fail(Errc::invalid_shape, "best_ring_messages: max_messages=" + std::to_string(max_messages) + " (need 1 .. " +
                                          std::to_string(kMaxRingMessages) + ")");
  int best = 1;
  double best_s = ring_step_seconds(ring_step_traffic(mesh, block_bytes, transport, 1), model);
  for (int k = 2; k <= max_messages; k *= 2) {
    const double s = ring_step_seconds(ring_step_traffic(mesh, block_bytes, transport, k), model);
    if (s < best_s) {
      best = k;
      best_s = s;
    }
  }
  return best;
}

/// Bytes one ring step's merge moves (ring/merge.hpp: the running (out, lse) in fp32 read, the
/// step's partial (out_s, lse_s) in fp32 read, the running pair written): 3 · 4 · B · h · q_len ·
/// (Dv + 1); 0 for step 0 (its partial is the running pair's start) and for an empty work.
/// @param w          the step's work (ring_work())
/// @param q_heads    query heads of the rank (H / U)
/// @param v_head_dim Dv
/// @param batch      B
inline double ring_merge_bytes(const RingWork& w, std::int64_t q_heads, std::int64_t v_head_dim, std::int64_t batch = 1) {
  if (w.step == 0 || w.empty()) return 0;
  return 12.0 * static_cast<double>(batch) * static_cast<double>(q_heads) * static_cast<double>(w.q_len) * static_cast<double>(v_head_dim + 1);
}

/// Forward attention FLOPs of one ring step's work: 2 · B · q_heads · pairs · (D + Dv) (see docs/headers.md,
/// "tune/ring_cost.hpp"), pairs = RingWork::pairs() (packed documents: the pairs of the step's
/// blocks, so skipped blocks cost nothing); 0 for an empty work.
/// @param w        the step's work (ring_work())
/// @param q_heads  query heads of the rank (H / U)
/// @param head_dim D
/// @param v_head_dim Dv (0: D)
/// @param batch    B
inline double ring_step_flops(const RingWork& w, std::int64_t q_heads, std::int64_t head_dim, std::int64_t v_head_dim = 0,
                              std::int64_t batch = 1) {
  if (w.empty()) return 0;
  const double pairs = static_cast<double>(w.pairs());
  return 2.0 * static_cast<double>(batch) * static_cast<double>(q_heads) * pairs * static_cast<double>(head_dim + (v_head_dim ? v_head_dim : head_dim));
}

/// What the model predicts for one ring (forward, one layer) or for its all-gather alternative.
struct RingCost {
  RingTraffic traffic;               ///< one transfer step's traffic
  int messages = 1;                  ///< pieces a block goes in (RingConfig::messages) as priced; the all-gather: 1
  std::vector<double> comm_s;        ///< per step: the transfer's time (0 at the last step), seconds
  std::vector<double> compute_s;     ///< per step: the slowest rank's attention, seconds (all-gather: of that step's block, as the ring's)
  std::vector<double> exposed_s;     ///< per step: the communication the attention does not hide, seconds
  std::vector<double> merge_s;       ///< per step: the slowest rank's merge of the step's partial output, seconds (γ of the model)
  double comm_seconds = 0;           ///< Σ comm_s (all-gather: the collective's time)
  double compute_seconds = 0;        ///< the attention's critical path: Σ compute_s (the lockstep ring waits for each step's
                                     ///< slowest rank); all-gather: the slowest rank's whole attention
  /// compute_seconds − the balanced attention (every rank's mean share): what the slowest rank
  /// makes the others wait; 0 for a balanced split (zigzag, contiguous non-causal), > 0 where
  /// packed documents leave the ranks' (or a step's) pairs unequal
  double imbalance_seconds = 0;
  double attended_fraction = 1;      ///< pairs attended / pairs of the whole sequence's mask without documents (causal or full)
  double exposed_seconds = 0;        ///< Σ exposed_s (all-gather: comm_seconds, nothing hidden)
  double merge_seconds = 0;          ///< Σ merge_s (all-gather: 0, one attention over the gathered kv)
  double bytes[2] = {0, 0};          ///< bytes a rank sends per layer over [intra, inter] links (network transport): each transfer step's largest carried block
  double buffer_bytes = 0;           ///< kv bytes a rank holds for the ring: 2 blocks (rotation) or R (all-gather)
};

namespace detail {
/// Per transfer step s (0 .. R − 2): the largest block that moves at it, bytes (`block`: by ring
/// rank). The rotation carries block j only while s < ring_last_use()[j]; 0 where none moves. The
/// all-gather (`allgather`) moves every block at every round.
inline std::vector<double> ring_carried_bytes(const RingPartition& part, bool causal, const std::vector<double>& block, bool allgather) {
  const int R = part.ring_degree();
  const std::vector<int> last = ring_last_use(part, causal);
  std::vector<double> carried(static_cast<std::size_t>(std::max(R - 1, 0)), 0.0);
  for (int s = 0; s + 1 < R; ++s)
    for (int j = 0; j < R; ++j)
      if (allgather || s < last[static_cast<std::size_t>(j)])
        carried[static_cast<std::size_t>(s)] = std::max(carried[static_cast<std::size_t>(s)], block[static_cast<std::size_t>(j)]);
  return carried;
}

/// Step s's transfer in ring_cost_impl(), seconds: `moved` bytes in `messages` pieces (0 when none
/// moves); zero copy: the rotation's synchronisations, at step 0 (start(0) publishes the blocks)
/// and at step R − 1 (finish() waits for every reader).
inline double ring_transfer_seconds(const Mesh& mesh, RingTransport transport, double moved, int s, int R, int messages, const CostModel& model) {
  if (transport == RingTransport::zero_copy) return s == 0 || s + 1 == R ? ring_step_seconds(ring_step_traffic(mesh, 0, transport), model) : 0;
  return moved > 0 ? ring_step_seconds(ring_step_traffic(mesh, moved, transport, messages), model) : 0;
}

/// The step times of a ring (ring_cost()) or the all-gather's (allgather_kv_cost()); `docs`
/// (or null): packed documents, S their seq_len().
inline RingCost ring_cost_impl(const Mesh& mesh, const AttentionShape& shape, std::int64_t S, bool causal, const CostModel& model,
                               double flops_per_s, ElementType type, std::int64_t batch, RingTransport transport, HeadPolicy policy,
                               bool allgather, int messages, const Documents* docs = nullptr) {
  if (!(flops_per_s > 0)) fail(Errc::invalid_shape, "ring cost: the attention FLOP rate must be > 0");
  if (batch < 1) fail(Errc::invalid_shape, "ring cost: batch=" + std::to_string(batch) + " must be >= 1");
  if (messages < 0 || messages > kMaxRingMessages)
    fail(Errc::invalid_shape, "ring cost: messages=" + std::to_string(messages) + " (need 0 .. " + std::to_string(kMaxRingMessages) + ")");
  if (docs && docs->seq_len() != S)
    fail(Errc::seq_lengths_mismatch, "ring cost: S=" + std::to_string(S) + " but the documents cover " + std::to_string(docs->seq_len()) + " tokens");
  const int U = mesh.ulysses_degree(), R = mesh.ring_degree();
  const RingPartition part = docs ? RingPartition(*docs, U, R) : RingPartition(S, U, R, causal ? RingLayout::zigzag : RingLayout::contiguous);
  std::vector<double> block(static_cast<std::size_t>(R));
  for (int j = 0; j < R; ++j) block[static_cast<std::size_t>(j)] = ring_block_bytes(part, j, shape, type, batch, policy);
  const double largest = *std::max_element(block.begin(), block.end());
  RingCost c;
  c.messages = allgather ? 1 : messages > 0 ? messages : best_ring_messages(model, mesh, largest, transport);
  c.traffic = ring_step_traffic(mesh, largest, transport, c.messages);
  const int cls = c.traffic.edges[1] > 0 ? 1 : 0;
  const AttentionSpecs a = attention_specs<float>(U, shape, ElementType::float32, policy);
  std::int64_t h = 0;
  for (int u = 0; u < U; ++u) h = std::max(h, a.query_heads.count(u));
  const std::int64_t Dv = shape.v_head_dim ? shape.v_head_dim : shape.head_dim;
  // A transfer step costs its largest carried block's message: the lockstep ring waits for it.
  const std::vector<double> carried = ring_carried_bytes(part, causal, block, allgather);
  std::vector<double> rank_compute(static_cast<std::size_t>(R), 0.0);  // each ring rank's whole attention
  double pairs = 0;
  for (int s = 0; s < R; ++s) {
    double comp = 0, merge = 0;
    for (int r = 0; r < R; ++r) {
      const RingWork w = ring_work(part, r, s, causal);
      const double t = ring_step_flops(w, h, shape.head_dim, shape.v_head_dim, batch) / flops_per_s;
      comp = std::max(comp, t);
      rank_compute[static_cast<std::size_t>(r)] += t;
      pairs += static_cast<double>(w.pairs());
      if (!allgather) merge = std::max(merge, ring_merge_bytes(w, h, Dv, batch) * model.copy_seconds_per_byte);
    }
    const double moved = s + 1 < R ? carried[static_cast<std::size_t>(s)] : 0;
    const double comm = ring_transfer_seconds(mesh, transport, moved, s, R, c.messages, model);
    if (transport == RingTransport::network) c.bytes[cls] += moved;
    c.merge_s.push_back(merge);
    c.merge_seconds += merge;
    c.compute_s.push_back(comp);
    c.comm_s.push_back(comm);
    c.exposed_s.push_back(allgather || transport == RingTransport::zero_copy ? comm : std::max(0.0, comm - comp));  // (a barrier hides nothing)
    c.compute_seconds += comp;
    c.comm_seconds += comm;
    c.exposed_seconds += c.exposed_s.back();
  }
  double mean = 0, slowest = 0;
  for (double t : rank_compute) {
    mean += t / static_cast<double>(R);
    slowest = std::max(slowest, t);
  }
  if (allgather) c.compute_seconds = slowest;  // no lockstep: each rank attends all its pairs at once
  c.imbalance_seconds = std::max(0.0, c.compute_seconds - mean);
  const double Sd = static_cast<double>(S), plain = causal ? Sd * (Sd + 1) / 2 : Sd * Sd;
  c.attended_fraction = pairs / plain;
  c.buffer_bytes = (allgather ? static_cast<double>(R) : std::min(2.0, static_cast<double>(R))) * largest;
  return c;
}
}  // namespace detail

/// The forward ring of one layer on `mesh` over S tokens (see docs/headers.md, "tune/ring_cost.hpp"): per step the
/// transfer's time (one message of the ring's largest block: every transfer step moves it between
/// some pair of ring ranks, and the lockstep ring waits for it; 0 at the last step), the slowest rank's attention at `flops_per_s` and the exposed part
/// max(0, comm − compute), and each step's merge at the model's copy rate; zigzag partition when
/// causal, contiguous otherwise. The block goes in `messages` pieces (ring_step_seconds()).
/// RingTransport::zero_copy: no block moves; steps 0 and R − 1 each cost a synchronisation
/// (ring_step_seconds() of the zero-copy traffic), exposed whole.
/// @param mesh        the U × R × outer mesh (its ring: R ranks)
/// @param shape       the attention layer's head counts and dims
/// @param S           tokens of one sequence (>= 2R causal, >= R otherwise)
/// @param causal      causal attention (zigzag), else non-causal (contiguous)
/// @param model       link parameters (CostModel::nvlink_infiniband(), fit_cost_model())
/// @param flops_per_s achieved attention FLOP rate of a rank, > 0 (AttentionRate)
/// @param type        element type of k and v
/// @param batch       B >= 1
/// @param transport   how the ring's bytes move
/// @param policy      the query head split
/// @param messages    pieces a block goes in, 1 .. kMaxRingMessages; 0: the model's best (best_ring_messages())
/// @param documents   packed documents over the S tokens (cu_seqlens; null: one sequence): the
///                    per-document zigzag (RingPartition(Documents, U, R)) and each step's
///                    document blocks, so a step the mask empties computes nothing and hides
///                    nothing (its block still moves while a later rank attends it:
///                    ring_last_use()), and the ranks' unequal pairs show as RingCost::imbalance_seconds
/// @throws Error(invalid_shape) flops_per_s <= 0, batch < 1, S too short (RingPartition), messages
///         outside [0, kMaxRingMessages]; Error(seq_lengths_mismatch) documents over another S;
///         what attention_specs() throws for U, and RingPartition(Documents, U, R) for the documents.
inline RingCost ring_cost(const Mesh& mesh, const AttentionShape& shape, std::int64_t S, bool causal, const CostModel& model,
                          double flops_per_s = AttentionRate::h100_bf16(), ElementType type = ElementType::bfloat16, std::int64_t batch = 1,
                          RingTransport transport = RingTransport::network, HeadPolicy policy = HeadPolicy::even, int messages = 1,
                          const Documents* documents = nullptr) {
  return detail::ring_cost_impl(mesh, shape, S, causal, model, flops_per_s, type, batch, transport, policy, false, messages, documents);
}

/// The all-gather-kv alternative on the same mesh (see docs/headers.md, "tune/ring_cost.hpp"): the ring all-gather's
/// R − 1 rounds priced as the ring's transfer steps, none hidden (exposed = comm), the same
/// attention work (compute_seconds: the slowest rank's whole attention, no lockstep), R blocks
/// held. Parameters and errors as ring_cost(); RingTransport::zero_copy prices the rotation only:
/// Error(invalid_shape) here.
/// @param mesh, shape, S, causal, model, flops_per_s, type, batch, transport, policy, documents as ring_cost()
inline RingCost allgather_kv_cost(const Mesh& mesh, const AttentionShape& shape, std::int64_t S, bool causal, const CostModel& model,
                                  double flops_per_s = AttentionRate::h100_bf16(), ElementType type = ElementType::bfloat16,
                                  std::int64_t batch = 1, RingTransport transport = RingTransport::network,
                                  HeadPolicy policy = HeadPolicy::even, const Documents* documents = nullptr) {
  if (transport == RingTransport::zero_copy)
    detail::fail(Errc::invalid_shape, "allgather_kv_cost: RingTransport::zero_copy prices the zero-copy rotation (ring_cost()), not the all-gather");
  return detail::ring_cost_impl(mesh, shape, S, causal, model, flops_per_s, type, batch, transport, policy, true, 1, documents);
}

ULYSSES_NAMESPACE_END

#include "hybrid.hpp"  // advise_hybrid(): the layouts priced with the costs above
