// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief DistributedAttentionPlan: one rank's plan of a whole distributed attention layer
///        (plain Ulysses, or Ulysses × Ring from a RingPlan): the Ulysses group's q|k|v and o
///        plans, the step schedule, the heads and tokens a call sees, and the byte sizes of the
///        engine's buffers (saved_bytes(), forward_workspace_bytes(), backward_workspace_bytes()).
///        Pure host code, no communication. See docs/attention.md.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../merge/lse.hpp"
#include "../plan/attention.hpp"
#include "../layout/byte_span.hpp"
#include "../partition/documents.hpp"
#include "../plan/plan.hpp"
#include "../ring/plan.hpp"
#include "../transport/ring_step.hpp"
#include "detail/regions.hpp"
#include "step.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Options of a DistributedAttentionPlan (every rank the same).
struct DistributedAttentionOptions {
  float softmax_scale = 0.0f;                       ///< the scale of q·k; 0: 1/sqrt(D)
  RingProgress progress = RingProgress::automatic;  ///< how a ring step's transfer, or the band pipeline's exchanges (bands > 1), move during the attention (ring/rotation.hpp, bands.hpp)
  /// How a ring step reaches its block (RingAccess; every rank the same): zero_copy reads the peers'
  /// kv0 (and, backward, adds into their g0) in place, with the workspaces in the window (MpiWindowComm)
  RingAccess ring_access = RingAccess::copy;
  PlanOptions plan = {};                            ///< the Ulysses plans' options (path, stages); `ring` is set by the plan
  /// G in [1, kMaxStages] head bands (plain Ulysses, or a ring with RingAccess::copy: band g's k|v rotates as its own
  /// block): band g's attention runs while seq→head of band g + 1 and head→seq of band g − 1 move (bands.hpp; sets
  /// plan.stages, plan.head_bands). Same bits for every G.
  int bands = 1;
  /// The memory order of the engine's seq-sharded tensors (q, k, v, o in; dq, dk, dv, do): bshd,
  /// sbhd (Megatron-LM) or bhsd (PyTorch SDPA), each dense in it; the exchanges read and write it
  /// in place. The head side the kernel sees stays bshd. All-gather-KV plans take bshd only.
  Format seq_format = Format::bshd;
};


/// One rank's plan of a distributed attention layer (see the file comment). Immutable; every rank
/// makes its own from the same inputs. Head-sharded tensors are bshd contiguous: q [B, L, H_u, D],
/// k [B, L, Hkv_u, D], v [B, L, Hkv_u, Dv], o [B, L, H_u, Dv] (L: the ring group's tokens, S for
/// plain Ulysses); seq-sharded ones [B, S_w, H|Hkv, D|Dv], dense in options().seq_format (bshd
/// unless told: the engine's tensors are read and written in place in their own order).
/// Sources: DeepSpeed's DistributedAttention (seq→head, local attention, head→seq), yunchang's
/// LongContextAttention (Ulysses × Ring), zhuzilin's ring-flash-attention (the step loop, the LSE merge).
class DistributedAttentionPlan {
 public:
  /// Ulysses × Ring (R >= 1) of `ring`: its Ulysses plans, schedule and rotation sizes.
  /// @throws Error(tensor_mismatch) q, k, v, o not all of one mergeable type (float32, float16, bfloat16);
  ///         Error(invalid_shape) bands outside [1, kMaxStages], or > 1 with RingAccess::zero_copy; what Plan() throws.
  explicit DistributedAttentionPlan(const RingPlan& ring, const DistributedAttentionOptions& o = {})
      : ring_(ring), specs_(ring.specs()), B_(ring.batch()), causal_(ring.causal()), u_(ring.ulysses_rank()), opt_(o),
        qkv_(ulysses_plan(ring, ring.specs().qkv(), ring.options(banded(o)), o)),
        out_(ulysses_plan(ring, ring.specs().out(), ring.options(banded(o)), o)) {
    work_ = ring.schedule();
    const RingPartition& p = ring.partition();
    for (int j = 0; j < p.ring_degree(); ++j) chunks_.push_back(p.ring_chunks(j));
    kv_chunks_ = chunks_;
    if (p.has_documents()) docs_ = p.documents();
    init(ring.tokens());
  }
  /// Plain Ulysses over any sequence partition: one step, all S tokens, causal or not.
  /// @param group  the Ulysses group (P ranks, this rank)
  /// @param batch  B >= 1
  /// @param seq    the sequence partition of the seq-sharded tensors (even, balanced, zigzag, ...)
  /// @param specs  attention_specs(P, shape, type, policy)
  /// @param causal causal attention (token i attends keys <= i, global order)
  /// @param o      the softmax scale, the ring progress and the plans' options (DistributedAttentionOptions)
  /// @throws what Plan's constructor throws; Error(tensor_mismatch) as above.
  DistributedAttentionPlan(Group group, std::int64_t batch, const SeqPartition& seq, const AttentionSpecs& specs, bool causal,
                           const DistributedAttentionOptions& o = {})
      : DistributedAttentionPlan(group, batch, seq, specs, causal, nullptr, o) {}
  /// Plain Ulysses over packed documents: as above, the attention masked per document (document ∧
  /// causal, or document-only with causal false). The head side holds the whole packed sequence in
  /// global order, so the one step's blocks (RingMask::blocks) are one per non-empty document,
  /// [begin, end) × [begin, end) causal (or full): FlashAttention's varlen call with the global
  /// cu_seqlens. The documents' fingerprint is in the plans' agreement record (a rank with other
  /// documents: plan_mismatch on every rank). Placeholders change nothing.
  /// @param group  the Ulysses group (P ranks, this rank)
  /// @param batch  B >= 1
  /// @param seq    the sequence partition of the seq-sharded tensors (any: documents_partition(), even, zigzag, ...)
  /// @param specs  attention_specs(P, shape, type, policy)
  /// @param causal document ∧ causal (true) or document-only (false)
  /// @param docs   the packed documents; docs.seq_len() must be seq.seq_len()
  /// @param o      the softmax scale, the ring progress and the plans' options
  /// @throws Error(seq_lengths_mismatch) docs.seq_len() != S; as above.
  DistributedAttentionPlan(Group group, std::int64_t batch, const SeqPartition& seq, const AttentionSpecs& specs, bool causal,
                           const Documents& docs, const DistributedAttentionOptions& o = {})
      : DistributedAttentionPlan(group, batch, seq, specs, causal, &docs, o) {}

  /// All-gather-KV context parallelism (Llama 3's: q stays on its tokens, k|v of the whole sequence
  /// gathered on every rank, allgather_kv()), over any partition of the sequence (even, zigzag, a
  /// documents_partition()), with every head on every rank: one step per call, this rank's S_r
  /// query rows (global tokens of `seq`, in local order) against all S kv rows (global order),
  /// masked causal, per document (`docs`), or neither; the step's mask is RingMask::blocks
  /// (document_blocks()). The output is seq-sharded at once (no head→seq). The backward
  /// reduce-scatters dk|dv (allgather_kv_backward(): fp32, ascending rank order, rounded once).
  /// Seq-sharded tensors bshd: q [B, S_r, H, D], k [B, S_r, Hkv, D], v [B, S_r, Hkv, Dv], o [B,
  /// S_r, H, Dv]. qkv_plan() is the k|v all-gather plan (2 tensors); there is no out_plan().
  /// @param group  the context-parallel group (P ranks, this rank)
  /// @param batch  B >= 1
  /// @param seq    the sequence partition (P ranks over S tokens)
  /// @param specs  attention_specs(1, shape, type): every head on one rank (q, k, v, o whole)
  /// @param causal causal attention (global token order)
  /// @param docs   packed documents (null: one sequence); docs->seq_len() must be S
  /// @param o      options (softmax scale; the all-gather plan's options)
  /// @throws Error(invalid_group) specs made for more than one rank; Error(seq_lengths_mismatch)
  ///         documents of another S; Error(invalid_shape) o.seq_format other than bshd; what Plan's
  ///         constructor throws; Error(tensor_mismatch) as above.
  static DistributedAttentionPlan allgather(Group group, std::int64_t batch, const SeqPartition& seq, const AttentionSpecs& specs, bool causal,
                                            const Documents* docs = nullptr, const DistributedAttentionOptions& o = {}) {
    return DistributedAttentionPlan(AllGatherTag{}, group, batch, seq, specs, causal, docs, o);
  }

  /// Ulysses × all-gather KV (U × AG, the 2-D sequence parallelism of vllm-omni RFC #7589: Ulysses
  /// across, all-gather inside) on the mesh of `ring`: seq→head of q|k|v over the Ulysses group
  /// (each rank then holds its ring rank j's L_j tokens for H_u query heads and Hkv_u kv heads),
  /// k|v of those heads gathered whole over the R ranks of the ring group in one exchange
  /// (gather_plan(): allgather_kv()), one step per call, the L_j query rows against all S kv rows in
  /// global order (RingMask::blocks: causal, per document, or neither), head→seq of o. The
  /// backward reduce-scatters dk|dv over the ring group (fp32, ascending ring rank, rounded
  /// once), then runs the Ulysses adjoint. Call distributed_attention() with both communicators
  /// (the Ulysses group and the ring group, as for the rotation). The configuration check
  /// (check_ring_config()) and the plans' agreement records carry RingConfig::allgather_kv, so a
  /// rank that rotates where the others gather gets plan_mismatch on every rank. The rotation's
  /// RingPlan::messages does not apply.
  /// @param ring the mesh, 2-D partition (zigzag, contiguous or packed documents), this rank,
  ///             batch, specs and causality (as for the rotation)
  /// @param o    options (softmax scale; the plans' options)
  /// @throws what Plan's constructor throws; Error(tensor_mismatch) as above.
  static DistributedAttentionPlan allgather(const RingPlan& ring, const DistributedAttentionOptions& o = {}) {
    return DistributedAttentionPlan(AllGatherTag{}, ring, o);
  }

  int steps() const { return static_cast<int>(work_.size()); }   ///< R (1: plain Ulysses, all-gather KV)
  bool is_allgather() const { return allgather_; }                ///< made by allgather() (either form)
  /// Made by allgather(const RingPlan&): U × AG (an o plan, a gather plan over the ring group).
  bool is_ulysses_allgather() const { return allgather_ && ring_.has_value(); }
  /// The k|v all-gather over the ring group of a U × AG plan (2 tensors, [B, L_j, Hkv_u, D|Dv] →
  /// [B, S, Hkv_u, D|Dv]). @throws Error(invalid_mesh) another plan.
  const Plan& gather_plan() const {
    if (!gather_) detail::fail(Errc::invalid_mesh, "DistributedAttentionPlan: only a U x AG plan (allgather(const RingPlan&)) has a gather plan");
    return *gather_;
  }
  bool has_documents() const { return docs_.has_value(); }        ///< masked per packed document
  /// The packed documents. @throws Error(invalid_partition) a plan without documents.
  const Documents& documents() const {
    if (!docs_) detail::fail(Errc::invalid_partition, "DistributedAttentionPlan: made without packed documents");
    return *docs_;
  }
  bool has_ring_plan() const { return ring_.has_value(); }        ///< made from a RingPlan
  /// The RingPlan it was made from. @throws Error(invalid_mesh) a plain Ulysses plan.
  const RingPlan& ring_plan() const {
    if (!ring_) detail::fail(Errc::invalid_mesh, "DistributedAttentionPlan: a plain Ulysses plan has no RingPlan");
    return *ring_;
  }
  const Plan& qkv_plan() const { return qkv_; }                   ///< the Ulysses group's q|k|v plan (one exchange); all-gather: the k|v plan
  /// The Ulysses group's o plan. @throws Error(invalid_mesh) an all-gather plan (its o is seq-sharded at once).
  const Plan& out_plan() const {
    if (!out_) detail::fail(Errc::invalid_mesh, "DistributedAttentionPlan: an all-gather-KV plan has no o plan (o stays on its tokens)");
    return *out_;
  }
  const AttentionSpecs& specs() const { return specs_; }          ///< q, k, v, o
  const DistributedAttentionOptions& options() const { return opt_; }  ///< the options
  std::int64_t batch() const { return B_; }                       ///< B
  bool causal() const { return causal_; }                         ///< causal attention
  std::int64_t tokens() const { return L_; }                      ///< L: query rows (head-sharded tensors; all-gather: S_r)
  std::int64_t query_heads() const { return Hq_; }                ///< H_u
  std::int64_t kv_heads() const { return Hk_; }                   ///< Hkv_u
  ElementType element_type() const { return specs_.q.type; }     ///< q's element type
  float softmax_scale() const { return scale_; }                  ///< the scale a step gets
  const RingWork& work(int s) const { return work_.at(static_cast<std::size_t>(s)); }  ///< step s's ranges
  /// The call's heads (the whole local range; views start at head 0).
  AttentionHeads heads() const {
    return {0, Hq_, 0, Hk_, specs_.query_heads.begin(u_), specs_.kv_heads.begin(u_), grouped_, kv_map_.data()};
  }
  /// The global tokens of query rows [begin, begin + len) of ring rank j (j = 0 for plain Ulysses
  /// and all-gather KV).
  TokenRanges token_ranges(int j, std::int64_t begin, std::int64_t len) const { return ranges_of(chunks_.at(static_cast<std::size_t>(j)), begin, len); }
  /// The global tokens of kv rows [begin, begin + len) of the block of ring rank j.
  TokenRanges kv_token_ranges(int j, std::int64_t begin, std::int64_t len) const {
    return ranges_of(kv_chunks_.at(static_cast<std::size_t>(j)), begin, len);
  }

 private:
  static TokenRanges ranges_of(const std::vector<SeqChunk>& chunks, std::int64_t begin, std::int64_t len) {
    TokenRanges t;
    std::int64_t total = 0;
    for (const SeqChunk& c : chunks) total += c.length;
    if (chunks.size() > 2 && begin == 0 && len == total) {  // all rows of many runs: the plan's list
      t.count = static_cast<int>(chunks.size());
      t.runs = chunks.data();
      for (int i = 0; i < 2; ++i) {
        t.begin[i] = chunks[static_cast<std::size_t>(i)].offset;
        t.length[i] = chunks[static_cast<std::size_t>(i)].length;
      }
      return t;
    }
    std::int64_t at = 0;  // ring-local row of the chunk's first token
    for (const SeqChunk& c : chunks) {
      const std::int64_t lo = std::max(begin, at), hi = std::min(begin + len, at + c.length);
      if (hi > lo && t.count < 2) {
        t.begin[t.count] = c.offset + (lo - at);
        t.length[t.count++] = hi - lo;
      }
      at += c.length;
    }
    return t;
  }

 public:
  /// Bytes of the engine's `saved` span: what the forward keeps for the backward (head-sharded q,
  /// this rank's k|v block, the merged o, the merged LSE). The forward needs it too (inference: scratch).
  std::size_t saved_bytes() const { return detail::attention_total(regions_.saved); }
  /// Bytes of distributed_attention()'s workspace.
  std::size_t forward_workspace_bytes() const { return detail::attention_total(regions_.fwd); }
  /// Bytes of distributed_attention_backward()'s workspace.
  std::size_t backward_workspace_bytes() const { return detail::attention_total(regions_.bwd); }
  /// The merged o in a `saved` span after the forward: head-sharded [B, L, H_u, Dv] of the element type.
  const void* saved_out(ConstByteSpan saved) const { return saved_region(saved, 2); }
  /// The merged LSE in a `saved` span after the forward: fp32 [B, H_u, L] (FlashAttention's softmax_lse), natural log.
  const float* saved_lse(ConstByteSpan saved) const { return static_cast<const float*>(saved_region(saved, 3)); }
  /// The regions of the spans (internal).
  const detail::AttentionRegions& regions() const { return regions_; }

 private:
  const void* saved_region(ConstByteSpan saved, int i) const {
    detail::AttentionCarve c(saved.data);
    for (int k = 0; k < i; ++k) c.take(regions_.saved[k]);
    return c.take(regions_.saved[i]);
  }
  static PlanOptions with_ring(PlanOptions o, int U, std::int64_t S, bool causal, const Documents* docs = nullptr) {
    o.ring = RingConfig{U, 1, RingLayout::contiguous, causal, S, 1, docs ? docs->fingerprint() : 0, false};
    return o;
  }
  /// The plans' options with the bands (DistributedAttentionOptions::bands) as head-band stages.
  static PlanOptions banded(const DistributedAttentionOptions& o) {
    if (o.bands < 1 || o.bands > kMaxStages)
      detail::fail(Errc::invalid_shape, "DistributedAttentionPlan: " + std::to_string(o.bands) + " bands; give 1 to " + std::to_string(kMaxStages));
    PlanOptions p = o.plan;
    p.stages = o.bands > 1 ? o.bands : p.stages;
    p.head_bands = o.bands > 1 || p.head_bands;
    return p;
  }
  static const Documents* checked(const Documents* docs, std::int64_t S) {
    if (docs && docs->seq_len() != S)
      detail::fail(Errc::seq_lengths_mismatch, "DistributedAttentionPlan: the documents span S=" + std::to_string(docs->seq_len()) +
                                                   " tokens, the sequence partition " + std::to_string(S));
    return docs;
  }
  /// Plain Ulysses, with or without documents.
  DistributedAttentionPlan(Group group, std::int64_t batch, const SeqPartition& seq, const AttentionSpecs& specs, bool causal,
                           const Documents* docs, const DistributedAttentionOptions& o)
      : specs_(specs), B_(batch), causal_(causal), u_(group.rank), opt_(o),
        qkv_(group, batch, seq, seq_side(specs.qkv(), o, batch, seq, group.rank), Format::bshd,
             with_ring(banded(o), group.size, seq.seq_len(), causal, checked(docs, seq.seq_len()))),
        out_(Plan(group, batch, seq, seq_side(specs.out(), o, batch, seq, group.rank), Format::bshd,
                  with_ring(banded(o), group.size, seq.seq_len(), causal, docs))) {
    if (docs) {
      docs_ = *docs;
      work_.push_back(ring_work(RingPartition(*docs, group.size, 1), 0, 0, causal));
    } else {
      work_.push_back(ring_work(RingPartition(seq.seq_len(), group.size, 1, RingLayout::contiguous), 0, 0, causal));
    }
    chunks_.push_back({SeqChunk{0, 0, seq.seq_len(), 0}});
    kv_chunks_ = chunks_;
    init(seq.seq_len());
  }
  struct AllGatherTag {};
  static std::vector<TensorSpec> gather_specs(const AttentionSpecs& specs, int P) {
    if (specs.query_heads.degree() != 1)
      detail::fail(Errc::invalid_group, "DistributedAttentionPlan::allgather: the attention specs were made for P=" +
                                            std::to_string(specs.query_heads.degree()) +
                                            " ranks; all-gather KV keeps every head on every rank: attention_specs(1, shape, type)");
    return gathered({specs.k, specs.v}, specs.k.heads.num_heads(), P);
  }
  /// k and v with `heads` kv heads whole on each of P ranks (the all-gather's specs; its backward sums).
  static std::vector<TensorSpec> gathered(std::vector<TensorSpec> kv, std::int64_t heads, int P) {
    for (TensorSpec& t : kv) {
      t.heads = HeadPartition::all(heads, P);
      t.serving(TensorSpec::kNone).with_replicas(Replicas::sum);
    }
    return kv;
  }
  /// The one step of an all-gather plan: the query rows of chunks_[j] (L of them) against all S kv
  /// rows (kv_chunks_[0]) with the causal and document blocks (none: one unmasked block).
  void push_gather_step(int j, std::int64_t L, std::int64_t S) {
    RingWork w;
    w.L_q = w.q_len = L;
    w.L_kv = w.kv_len = S;
    w.mask = RingMask::blocks;
    if (!causal_ && !docs_) {
      if (w.q_len > 0) w.blocks.push_back({0, w.q_len, 0, S, RingMask::none, 0});
    } else {
      w.blocks = document_blocks(docs_ ? *docs_ : Documents({0, S}), chunks_[static_cast<std::size_t>(j)], kv_chunks_[0], causal_);
    }
    if (w.blocks.empty()) w.q_len = w.kv_len = 0;
    work_.push_back(std::move(w));
  }
  /// All-gather KV (allgather()).
  DistributedAttentionPlan(AllGatherTag, Group group, std::int64_t batch, const SeqPartition& seq, const AttentionSpecs& specs, bool causal,
                           const Documents* docs, const DistributedAttentionOptions& o)
      : specs_(specs), B_(batch), causal_(causal), u_(0), opt_(o), allgather_(true),
        qkv_(group, batch, seq, gather_specs(specs, group.size), Format::bshd,
             with_ring(o.plan, group.size, seq.seq_len(), causal, checked(docs, seq.seq_len()))) {
    const std::int64_t S = seq.seq_len();
    if (docs) docs_ = *docs;
    std::vector<SeqChunk> mine;
    for (const SeqChunk& c : seq.chunks_of(group.rank))
      if (c.length > 0) mine.push_back(c);
    std::sort(mine.begin(), mine.end(), [](const SeqChunk& a, const SeqChunk& b) { return a.local_offset < b.local_offset; });
    chunks_.push_back(mine);
    kv_chunks_.push_back({SeqChunk{0, 0, S, 0}});
    push_gather_step(0, seq.local_length(group.rank), S);
    init(seq.local_length(group.rank));
  }
  /// U × AG (allgather(const RingPlan&)).
  DistributedAttentionPlan(AllGatherTag, const RingPlan& ring, const DistributedAttentionOptions& o)
      : ring_(ring), specs_(ring.specs()), B_(ring.batch()), causal_(ring.causal()), u_(ring.ulysses_rank()), opt_(o), allgather_(true),
        qkv_(ulysses_plan(ring, ring.specs().qkv(), ag_options(ring, o.plan), o)),
        out_(ulysses_plan(ring, ring.specs().out(), ag_options(ring, o.plan), o)) {
    const RingPartition& p = ring.partition();
    const std::int64_t S = p.seq_len();
    const int R = p.ring_degree(), j = ring.ring_rank();
    std::vector<SeqChunk> by_ring;  // ring rank jj holds ring_chunks(jj) in ring-local order
    for (int jj = 0; jj < R; ++jj) {
      std::vector<SeqChunk> mine = p.ring_chunks(jj);
      std::sort(mine.begin(), mine.end(), [](const SeqChunk& a, const SeqChunk& b) { return a.local_offset < b.local_offset; });
      chunks_.push_back(mine);
      for (const SeqChunk& c : mine) by_ring.push_back({jj, c.offset, c.length, 0});
    }
    kv_chunks_.push_back({SeqChunk{0, 0, S, 0}});
    if (p.has_documents()) docs_ = p.documents();
    // The gather: over the R ranks of the ring group, this Ulysses rank's kv heads whole on each.
    PlanOptions go = o.plan;
    go.ring.reset();  // (a plan of the R ranks: its own record has P = R, the ring's chunks, the kv heads; the configuration is the Ulysses plans')
    gather_.emplace(Group{R, j}, B_, SeqPartition::chunks(S, R, by_ring), gathered({specs_.k, specs_.v}, specs_.kv_heads.count(u_), R),
                    Format::bshd, go);
    push_gather_step(j, ring.tokens(), S);
    init(ring.tokens());
  }
  static RingConfig ag_config(const RingPlan& ring) {
    RingConfig c = ring.config();
    c.messages = 1;  // (the rotation's wire split: not used)
    c.allgather_kv = true;
    return c;
  }
  static PlanOptions ag_options(const RingPlan& ring, PlanOptions o) {
    o.ring = ag_config(ring);
    return o;
  }
  /// A ring group's Ulysses plan of tensors t (seq side in o.seq_format) with options po.
  static Plan ulysses_plan(const RingPlan& ring, std::vector<TensorSpec> t, const PlanOptions& po, const DistributedAttentionOptions& o) {
    const SeqPartition seq = ring.ulysses_partition();
    const int u = ring.ulysses_rank();
    return Plan({ring.partition().ulysses_degree(), u}, ring.batch(), seq, seq_side(std::move(t), o, ring.batch(), seq, u), Format::bshd, po);
  }
  /// Tensors t with this rank's seq-sharded layouts dense in o.seq_format (the head side: the plans' bshd).
  static std::vector<TensorSpec> seq_side(std::vector<TensorSpec> t, const DistributedAttentionOptions& o, std::int64_t B, const SeqPartition& seq,
                                          int rank) {
    if (o.seq_format != Format::bshd)
      for (TensorSpec& x : t)
        if (!x.seq_layout) x.with_seq_layout(Layout::dense(o.seq_format, B, seq.local_length(rank), x.heads.num_heads(), x.head_dim));
    return t;
  }
  void init(std::int64_t L) {
    if (opt_.bands != 1 && (allgather_ || (ring_ && opt_.ring_access == RingAccess::zero_copy)))
      detail::fail(Errc::invalid_shape, "DistributedAttentionPlan: head bands (options.bands = " + std::to_string(opt_.bands) + ") run on plain "
                                            "Ulysses and on a ring with RingAccess::copy, not on an all-gather-KV plan or a zero-copy ring");
    if (allgather_ && !ring_ && opt_.seq_format != Format::bshd)
      detail::fail(Errc::invalid_shape, std::string("DistributedAttentionPlan: an all-gather-KV plan keeps q and o on their tokens, bshd; "
                                                    "options.seq_format = ") + to_string(opt_.seq_format) + " needs a Ulysses exchange");
    L_ = L;
    Hq_ = specs_.query_heads.count(u_);
    Hk_ = specs_.kv_heads.count(u_);  // (all-gather: u_ = 0 of a P = 1 split, every head)
    const ElementType t = specs_.q.type;
    for (const TensorSpec* s : {&specs_.k, &specs_.v, &specs_.o})
      if (s->type != t || !mergeable(t))
        detail::fail(Errc::tensor_mismatch, std::string("DistributedAttentionPlan: q, k, v, o must be of one type of float32, float16, "
                                                        "bfloat16 (attention_specs<T>(P, shape, type)); q is ") + to_string(t) +
                                                ", and " + to_string(s->type) + " is among them");
    for (std::int64_t h = 0; h < Hq_; ++h) kv_map_.push_back(specs_.local_kv_head(u_, h));
    for (std::int64_t h = 0; h < Hq_; ++h) grouped_ = grouped_ && Hq_ % Hk_ == 0 && kv_map_[static_cast<std::size_t>(h)] == h / (Hq_ / Hk_);
    scale_ = opt_.softmax_scale != 0.0f ? opt_.softmax_scale : 1.0f / std::sqrt(static_cast<float>(specs_.q.head_dim));
    sizes();
  }
  void sizes() {
    const std::size_t eb = specs_.q.elem_bytes, f = sizeof(float);
    const auto n = [](std::int64_t x) { return static_cast<std::size_t>(x); };
    const std::size_t D = n(specs_.q.head_dim), Dv = n(specs_.v.head_dim), rows = n(B_ * L_), Hq = n(Hq_), Hk = n(Hk_);
    const std::size_t kv_rows = allgather_ ? n(B_ * work_[0].L_kv) : rows;  // all-gather: the whole sequence
    std::size_t kvmax = kv_rows * Hk * (D + Dv) * eb, gmax = kv_rows * Hk * (D + Dv) * f;
    if (ring_ && !allgather_) {
      kvmax = ring_->kv_buffer_bytes();
      gmax = ring_->grad_buffer_bytes();
    }
    const bool R = steps() > 1;
    std::size_t ws = std::max({qkv_.workspace_bytes(), out_ ? out_->workspace_bytes() : 0, gather_ ? gather_->workspace_bytes() : 0});
    if (opt_.bands > 1) ws = detail::attention_round(qkv_.workspace_bytes()) + detail::attention_round(out_->workspace_bytes());  // (two in flight)
    const std::size_t own = gather_ ? rows * Hk * (D + Dv) * eb : 0;  // U × AG: this rank's L_j rows of k|v before the gather
    regions_.saved[0] = rows * Hq * D * eb;
    regions_.saved[1] = kv_rows * Hk * (D + Dv) * eb;
    regions_.saved[2] = rows * Hq * Dv * eb;
    regions_.saved[3] = rows * Hq * f;
    const std::size_t fwd[6] = {R ? kvmax : own, R ? kvmax : 0, rows * Hq * Dv * f, rows * Hq * Dv * eb, rows * Hq * f, ws};
    std::copy(fwd, fwd + 6, regions_.fwd);
    const std::size_t bwd[10] = {allgather_ && !gather_ ? 0 : rows * Hq * Dv * eb, R ? kvmax : 0, R ? kvmax : 0, gmax, R ? gmax : 0, rows * Hq * D * f,
                                 rows * Hq * D * f, gmax, (rows * Hq * D + kv_rows * Hk * (D + Dv)) * eb + own, ws};
    std::copy(bwd, bwd + 10, regions_.bwd);
  }

  std::optional<RingPlan> ring_;
  AttentionSpecs specs_;
  std::int64_t B_ = 1;
  bool causal_ = false;
  int u_ = 0;
  DistributedAttentionOptions opt_;
  bool allgather_ = false;
  Plan qkv_;
  std::optional<Plan> out_;
  std::optional<Plan> gather_;                 // U × AG: the k|v all-gather over the ring group
  std::optional<Documents> docs_;
  std::vector<RingWork> work_;                 // by step
  std::vector<std::vector<SeqChunk>> chunks_;  // global chunks of ring rank j's query tokens, in row order
  std::vector<std::vector<SeqChunk>> kv_chunks_;  // global chunks of ring rank j's kv block, in row order
  std::int64_t L_ = 0, Hq_ = 0, Hk_ = 0;
  std::vector<std::int64_t> kv_map_;
  bool grouped_ = true;
  float scale_ = 1.0f;
  detail::AttentionRegions regions_;
};

ULYSSES_NAMESPACE_END
