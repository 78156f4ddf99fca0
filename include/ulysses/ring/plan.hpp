// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief RingPlan: one rank's plan of a Ulysses × Ring attention, made like Plan (validated
///        inputs, then an immutable object) from the partition, the mesh and the q, k, v specs.
///        It gives the Ulysses group's plans, the schedule, the rotation's block sizes and the
///        merge shape; RingRotation and RingGradRotation (ring/rotation.hpp) take it. See
///        docs/ring.md ("Example").
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../partition/ring.hpp"
#include "../plan/attention.hpp"
#include "../topology/mesh.hpp"
#include "merge.hpp"
#include "schedule.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {
/// The rotations' last uses (RingPlan::last_uses()): none (every block carried) or one per ring rank.
/// @throws Error(invalid_shape) another count.
inline void check_ring_last_uses(const char* who, const std::vector<int>& last_use, int R) {
  if (!last_use.empty() && last_use.size() != static_cast<std::size_t>(R))
    fail(Errc::invalid_shape, std::string(who) + ": " + std::to_string(last_use.size()) + " last uses for R=" + std::to_string(R) + " ring ranks");
}
}  // namespace detail

/// One rank of a Ulysses × Ring attention (see the file comment). Immutable; every rank of the
/// block makes its own from the same partition, mesh, batch, specs and causal flag.
class RingPlan {
 public:
  /// @param part    the 2-D sequence partition (U Ulysses × R ring ranks over S tokens)
  /// @param mesh    the mesh of the world; its U and R must be the partition's
  /// @param rank    this rank's world rank in the mesh (node-first; 0 .. mesh.world() − 1)
  /// @param batch   B >= 1
  /// @param specs   attention_specs(U, shape, policy) of the Ulysses group (q, k, v, o)
  /// @param causal  causal attention (RingLayout::zigzag balances it) or not
  /// @param messages the wire split: messages a block goes in over a message transport
  ///        (RingConfig::messages; every rank the same, checked by check_ring_config())
  /// @throws Error(invalid_mesh) a mesh of other degrees than the partition; Error(invalid_group)
  ///         rank outside the mesh, or specs made for another U; Error(invalid_shape) B < 1, or
  ///         messages outside [1, kMaxRingMessages];
  ///         Error(tensor_mismatch) k and v of different element sizes (one block carries both).
  RingPlan(const RingPartition& part, const Mesh& mesh, int rank, std::int64_t batch, const AttentionSpecs& specs, bool causal,
           int messages = 1)
      : part_(part), mesh_(mesh), specs_(specs), B_(batch), causal_(causal), messages_(messages) {
    check();
    j_ = mesh.ring_rank(rank);
    u_ = mesh.ulysses_rank(rank);
    const std::int64_t Hk = specs.kv_heads.count(u_);
    for (int jj = 0; jj < part.ring_degree(); ++jj) {
      const std::int64_t L = part.ring_length(jj);
      kv_.push_back({B_, L, Hk, specs.k.head_dim, specs.v.head_dim, specs.k.elem_bytes});
      grad_.push_back({B_, L, Hk, specs.k.head_dim, specs.v.head_dim, sizeof(float)});
    }
    work_ = ring_schedule(part, j_, causal);
    last_use_ = ring_last_use(part, causal);
  }

  const RingPartition& partition() const { return part_; }  ///< the 2-D sequence partition
  const Mesh& mesh() const { return mesh_; }                ///< the mesh
  const AttentionSpecs& specs() const { return specs_; }    ///< q, k, v, o of the Ulysses group
  std::int64_t batch() const { return B_; }                 ///< B
  bool causal() const { return causal_; }                   ///< causal attention
  int messages() const { return messages_; }                 ///< messages a block goes in (RingConfig::messages)
  int steps() const { return part_.ring_degree(); }         ///< R, the ring steps
  int ring_rank() const { return j_; }                      ///< this rank's ring rank j
  int ulysses_rank() const { return u_; }                   ///< this rank's Ulysses rank u
  /// This rank's index in the partition's seq-sharded world (part.world_rank(j, u)): its shard is
  /// seq_partition().local_length(seq_rank()) tokens.
  int seq_rank() const { return part_.world_rank(j_, u_); }
  /// The whole world's seq-sharded partition (RingPartition::seq_partition()).
  SeqPartition seq_partition() const { return part_.seq_partition(); }
  /// L_j: this rank's ring-local tokens (its queries, and its own kv block).
  std::int64_t tokens() const { return part_.ring_length(j_); }
  std::int64_t query_heads() const { return specs_.query_heads.count(u_); }  ///< H_u, this rank's query heads
  std::int64_t kv_heads() const { return specs_.kv_heads.count(u_); }        ///< Hkv_u, the kv heads the ring carries
  /// The local kv head (0 .. kv_heads() − 1) of local query head h.
  std::int64_t local_kv_head(std::int64_t h) const { return specs_.local_kv_head(u_, h); }

  /// What every rank agrees on: RingConfig::of(partition, causal).
  RingConfig config() const { return RingConfig::of(part_, causal_, messages_); }
  /// `base` with its ring configuration set (PlanOptions::ring = config()).
  PlanOptions options(PlanOptions base = {}) const {
    base.ring = config();
    return base;
  }
  /// The sequence partition of this rank's Ulysses group: ulysses_partition(j).
  SeqPartition ulysses_partition() const { return part_.ulysses_partition(j_); }
  /// The Ulysses group's plan of q, k, v (seq→head before the ring; its backward after).
  Plan qkv_plan(Format f = Format::bshd, PlanOptions o = {}) const { return plan_of(specs_.qkv(), f, o); }
  /// The Ulysses group's plan of the output o (head→seq after the merge).
  Plan out_plan(Format f = Format::bshd, PlanOptions o = {}) const { return plan_of(specs_.out(), f, o); }

  /// The work of step s (ring_work(partition, j, s, causal)). @throws Error(invalid_group) s outside [0, R).
  const RingWork& work(int s) const {
    check_step(s);
    return work_[static_cast<std::size_t>(s)];
  }
  const std::vector<RingWork>& schedule() const { return work_; }  ///< work(0) .. work(R − 1)
  /// The kv block of ring rank jj (k then v, RingKvBlock). @throws Error(invalid_group) jj outside [0, R).
  const RingKvBlock& kv_block_of(int jj) const {
    detail::check_rank(jj, steps());
    return kv_[static_cast<std::size_t>(jj)];
  }
  /// The kv block held at step s: kv_block_of(work(s).source).
  const RingKvBlock& kv_block(int s) const { return kv_block_of(work(s).source); }
  /// The last step at which some ring rank attends ring rank jj's kv block (ring_last_use(); −1:
  /// none does). The rotations over this plan carry block jj from step s to s + 1 only while
  /// s < last_use(jj): no message past its last use. @throws Error(invalid_group) jj outside [0, R).
  int last_use(int jj) const {
    detail::check_rank(jj, steps());
    return last_use_[static_cast<std::size_t>(jj)];
  }
  const std::vector<int>& last_uses() const { return last_use_; }  ///< last_use(0) .. last_use(R − 1)
  /// Bytes of every ring rank's kv block, by ring rank (what the rotation sends).
  std::vector<std::size_t> block_bytes() const { return bytes_of(kv_); }
  /// Bytes each of the rotation's two kv buffers needs: the largest block.
  std::size_t kv_buffer_bytes() const { return largest(kv_); }
  /// Bytes of every ring rank's fp32 dk|dv accumulator, by ring rank (RingGradRotation).
  std::vector<std::size_t> grad_bytes() const { return bytes_of(grad_); }
  /// Bytes each of RingGradRotation's two accumulator buffers needs.
  std::size_t grad_buffer_bytes() const { return largest(grad_); }
  /// The merge state's shape: B, L_j, H_u, Dv (ring/merge.hpp).
  RingMergeShape merge_shape() const { return {B_, tokens(), query_heads(), specs_.v.head_dim}; }

 private:
  void check() const {
    if (mesh_.ulysses_degree() != part_.ulysses_degree() || mesh_.ring_degree() != part_.ring_degree())
      detail::fail(Errc::invalid_mesh, "RingPlan: the mesh is U=" + std::to_string(mesh_.ulysses_degree()) + " x R=" +
                                           std::to_string(mesh_.ring_degree()) + ", the partition U=" + std::to_string(part_.ulysses_degree()) +
                                           " x R=" + std::to_string(part_.ring_degree()) + "; make both of the same degrees");
    if (specs_.query_heads.degree() != part_.ulysses_degree() || specs_.kv_heads.degree() != part_.ulysses_degree())
      detail::fail(Errc::invalid_group, "RingPlan: the attention specs were made for P=" + std::to_string(specs_.query_heads.degree()) +
                                            " ranks; the Ulysses group has U=" + std::to_string(part_.ulysses_degree()) +
                                            " (attention_specs(U, shape, policy))");
    if (B_ < 1) detail::fail(Errc::invalid_shape, "RingPlan: batch B=" + std::to_string(B_) + " must be >= 1");
    if (messages_ < 1 || messages_ > kMaxRingMessages)
      detail::fail(Errc::invalid_shape, "RingPlan: messages=" + std::to_string(messages_) + " a block must be in [1, " +
                                            std::to_string(kMaxRingMessages) + "]");
    if (specs_.k.elem_bytes != specs_.v.elem_bytes)
      detail::fail(Errc::tensor_mismatch, "RingPlan: k has " + std::to_string(specs_.k.elem_bytes) + "-byte elements, v " +
                                              std::to_string(specs_.v.elem_bytes) + "; the ring's block carries both in one type");
  }
  void check_step(int s) const {
    if (s < 0 || s >= steps())
      detail::fail(Errc::invalid_group, "ring step " + std::to_string(s) + " is outside [0, R=" + std::to_string(steps()) + ")");
  }
  Plan plan_of(std::vector<TensorSpec> t, Format f, PlanOptions o) const {
    return Plan({part_.ulysses_degree(), u_}, B_, ulysses_partition(), std::move(t), f, options(o));
  }
  static std::vector<std::size_t> bytes_of(const std::vector<RingKvBlock>& v) {
    std::vector<std::size_t> b;
    for (const RingKvBlock& k : v) b.push_back(k.bytes());
    return b;
  }
  static std::size_t largest(const std::vector<RingKvBlock>& v) {
    std::size_t m = 0;
    for (const RingKvBlock& k : v) m = std::max(m, k.bytes());
    return m;
  }

  RingPartition part_;
  Mesh mesh_;
  AttentionSpecs specs_;
  std::int64_t B_;
  bool causal_;
  int messages_;
  int j_ = 0, u_ = 0;
  std::vector<RingKvBlock> kv_, grad_;  // by ring rank
  std::vector<RingWork> work_;          // by step
  std::vector<int> last_use_;           // by ring rank (ring_last_use())
};

ULYSSES_NAMESPACE_END
