// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The engine's row transforms (RoPE, scales, casts: layout/transform.hpp) in a
///        distributed attention layer, by GLOBAL token on every plan: a ring group's Ulysses
///        exchange moves ring-local tokens (RingPartition::ulysses_partition()), so each of its
///        transforms is wrapped to see the global token RingPartition::ring_token() gives.
///        docs/attention.md ("Row transforms").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../../layout/blocks.hpp"
#include "../../layout/transform.hpp"
#include "../plan.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {
/// The engine's row transform seen through a ring group's Ulysses exchange: its rows carry
/// ring-local tokens i, the transform sees global[i] (and checks its rows against the whole
/// sequence's S). The fused form forwards when the engine's transform has one.
struct GlobalTokenRows {
  RowTransformRef inner;                 // the engine's transform
  const std::int64_t* global = nullptr;  // ring-local token -> global token (L_j entries)
  std::int64_t seq_len = 0;              // S of the whole sequence
  RowCoord at(const RowCoord& rc) const { return {rc.batch, global[rc.token], rc.head}; }
  void operator()(const RowCoord& rc, double* row, std::int64_t n) const { inner(at(rc), row, n); }
  void check_rows(std::int64_t B, std::int64_t, std::int64_t D) const {
    if (inner.check) inner.check(inner.object, B, seq_len, D);
  }
  /// The engine's transform's agreement_word() (0 when it has none: every rank wraps alike).
  std::uint64_t agreement_word() const { return inner.word ? inner.word(inner.object) : 0; }
  bool copy_row(const RowCoord& rc, ElementType type, const std::byte* src, std::byte* dst, std::int64_t n) const {
    return inner.copy && inner.copy(inner.object, at(rc), type, src, dst, n);
  }
  /// A run along the heads of one token forwards whole (its first row's token mapped); a run
  /// along the tokens, whose global tokens need not be consecutive, is declined (false: the
  /// executor copies its rows one by one through copy_row()), as is any run when the engine's
  /// transform has no run form.
  bool copy_run(const RowRun& run, ElementType type) const {
    if (!inner.copy_run || (run.step.token != 0 && run.count > 1)) return false;
    RowRun mapped = run;
    mapped.first = at(run.first);
    return inner.copy_run(inner.object, mapped, type);
  }
};

/// The row transforms one distributed attention call hands its Ulysses exchange: the engine's
/// own for a plain Ulysses plan (its tokens are global already), each wrapped by
/// GlobalTokenRows for a plan made from a RingPlan (Ulysses × Ring, U × AG). Lives in the call's
/// frame (the wrappers and their token map must outlive the exchanges; not copyable).
class AttentionRowTransforms {
 public:
  /// @throws Error(invalid_shape) transforms given for an all-gather-KV plan, which has no
  ///         seq→head exchange to run them in (q stays on its tokens, k|v are gathered)
  AttentionRowTransforms(const DistributedAttentionPlan& p, const RowTransforms& user, const char* call) : user_(&user) {
    bool any = user.has_bad_index();
    for (int t = 0; t < kMaxTensors; ++t) any = any || user.any(t);
    if (!any) return;
    if (p.is_allgather() && !p.is_ulysses_allgather())
      fail(Errc::invalid_shape, std::string(call) +
                                    ": row transforms run in the seq->head exchange of q|k|v (and the head->seq of dq|dk|dv); an "
                                    "all-gather-KV plan has none (q stays on its tokens, k|v are gathered): transform them before the call");
    check_planned(p, user, call);
    if (!p.has_ring_plan()) return;
    const RingPlan& rp = p.ring_plan();
    const std::int64_t L = rp.ulysses_partition().seq_len();
    global_.resize(static_cast<std::size_t>(L));
    for (std::int64_t i = 0; i < L; ++i) global_[static_cast<std::size_t>(i)] = rp.partition().ring_token(rp.ring_rank(), i);
    const std::int64_t S = rp.seq_partition().seq_len();
    for (int t = 0; t < kMaxTensors; ++t) {
      if (user.pack(t)) own_.on_pack(t, wrap_[0][t] = GlobalTokenRows{user.pack(t), global_.data(), S});
      if (user.unpack(t)) own_.on_unpack(t, wrap_[1][t] = GlobalTokenRows{user.unpack(t), global_.data(), S});
    }
    user_ = &own_;
  }
  /// The engine's names for the call's tensors: a transform for a tensor outside q, k, v, or for
  /// one whose spec was not planned by rows, refused in the attention's terms (the exchange
  /// would name seq_to_head and a tensor index).
  static void check_planned(const DistributedAttentionPlan& p, const RowTransforms& user, const char* call) {
    static const char* const names[3] = {"q", "k", "v"};
    const bool fwd = std::string(call) == "distributed_attention";
    if (user.has_bad_index())
      fail(Errc::invalid_shape, std::string(call) + ": a row transform was given for tensor " + std::to_string(user.bad_index()) +
                                    "; the tensors are 0, 1, 2 (" + (fwd ? "q, k, v" : "dq, dk, dv") + ")");
    for (int t = 0; t < kMaxTensors; ++t) {
      if (!user.any(t)) continue;
      if (t >= 3)
        fail(Errc::invalid_shape, std::string(call) + ": a row transform was given for tensor " + std::to_string(t) + "; the tensors are 0, 1, 2 (" +
                                      (fwd ? "q, k, v" : "dq, dk, dv") + ")");
      if (!p.qkv_plan().tensor(t).by_rows())
        fail(Errc::invalid_shape, std::string(call) + ": a row transform was given for " + (fwd ? "" : "d") + names[t] +
                                      " (tensor " + std::to_string(t) + "), but the plan's " + names[t] + " was not planned by rows: call specs." +
                                      names[t] + ".with_row_transforms() on the AttentionSpecs before making the plan");
    }
  }
  AttentionRowTransforms(const AttentionRowTransforms&) = delete;
  AttentionRowTransforms& operator=(const AttentionRowTransforms&) = delete;
  /// What the exchanges take.
  const RowTransforms& get() const { return *user_; }

 private:
  const RowTransforms* user_;
  std::vector<std::int64_t> global_;
  GlobalTokenRows wrap_[2][kMaxTensors];
  RowTransforms own_;
};
}  // namespace detail

ULYSSES_NAMESPACE_END
