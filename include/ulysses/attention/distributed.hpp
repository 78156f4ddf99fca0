// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Drop-in distributed attention: distributed_attention() (forward) and
///        distributed_attention_backward() drive a whole attention layer through plain Ulysses
///        or Ulysses × Ring around the engine's own attention kernel, called once per ring step
///        (AttentionStep, attention/step.hpp): the configuration check, seq→head of q|k|v in one
///        exchange, the ring rotation, the LSE merge in step order, head→seq of o; the backward
///        with the fp32 dk|dv ring and the summed inverse. Host buffers (HostExecutor) today.
///        See docs/attention.md.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "../allgather.hpp"
#include "../attention_call.hpp"
#include "../host/executor.hpp"
#include "../redistribute.hpp"
#include "../ring/agreement.hpp"
#include "../ring/merge.hpp"
#include "detail/band_ring.hpp"
#include "detail/steps.hpp"
#include "detail/transforms.hpp"
#include "plan.hpp"
#include "step.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {
/// The forward over G = options().bands head bands: band g's attention (plain Ulysses: its one
/// step; Ulysses × Ring: its ring, band_ring_forward()) runs while seq→head of band g + 1 and
/// head→seq of band g − 1 move (run_band_pipeline(); the same bytes as the unbanded forward: each
/// band merged and rounded over its own heads).
template <class UC, class RC, class F>
void banded_forward(const DistributedAttentionPlan& p, UC& uc, RC* rc, const QkvIn& in, ByteSpan out, F& attention, std::byte* q_h,
                    std::byte* own, std::byte* const kv[2], std::byte* o_h, float* lse, float* acc, std::byte* pout, float* plse, ByteSpan xws,
                    const RowTransforms& tx) {
  const Plan &qkv = p.qkv_plan(), &o = p.out_plan();
  const AttentionRegions& r = p.regions();
  const RingMergeShape ms{p.batch(), p.tokens(), p.query_heads(), p.specs().v.head_dim};
  const RingWork& w = p.work(0);
  AttentionStep whole = attention_step(p, 0, 0, q_h, own);
  whole.out = pout;
  whole.lse = plse;
  std::memset(pout, 0, static_cast<std::size_t>(ms.out_elems()) * p.specs().q.elem_bytes);
  for (std::int64_t i = 0; i < ms.lse_elems(); ++i) plse[i] = -INFINITY;
  std::vector<std::int64_t> map(static_cast<std::size_t>(p.query_heads()) + 1);
  const std::size_t nk = qkv.head_bytes(1), qws = attention_round(qkv.workspace_bytes());
  const QkvOut heads = QkvOut().q({q_h, r.saved[0]}).k({own, nk}).v({own + nk, qkv.head_bytes(2)});
  HostExecutor exec;
  run_band_pipeline(
      qkv.num_stages(), [&](int g) { return head_band(p.specs(), qkv.rank(), g, qkv.num_stages()); }, uc, exec, p.options().progress,
      [&](int g) { return ExchangeCall{&qkv, Direction::seq_to_head, in.list(), heads.list(), Workspace(xws.data, qws), StageRange::one(g), &tx}; },
      [&](int g) {
        return ExchangeCall{&o, Direction::head_to_seq, TensorList<ConstByteSpan>{ConstByteSpan(o_h, r.saved[2])}, TensorList<ByteSpan>{out},
                            Workspace(static_cast<std::byte*>(xws.data) + qws, xws.bytes - qws), StageRange::one(g)};
      },
      [&](const Band& b) {
        if (b.query.size() == 0) return;
        if constexpr (!std::is_same_v<RC, NoRing>)
          if (p.steps() > 1) band_ring_forward(p, *rc, b, q_h, own, kv, acc, lse, pout, plse, map.data(), attention);
        if (p.steps() == 1 && !w.empty()) {
          attention(static_cast<const AttentionStep&>(band_step(b, whole, map.data())));
          ring_merge_block(ms, acc, lse, pout, p.element_type(), plse, w.q_begin, w.q_len, LseBase::natural, b.query);
        }
        ring_merge_finish(ms, acc, o_h, p.element_type(), b.query);
      },
      "the attention of a head band");
}

/// The forward on this rank (see distributed_attention()).
template <class UC, class RC, class F>
void attention_forward(const DistributedAttentionPlan& p, UC& uc, RC* rc, const QkvIn& in, ByteSpan out, F& attention, ByteSpan saved,
                       Workspace ws, const RowTransforms& tx) {
  const char* call = "distributed_attention";
  check_forward_spans(call, p, in, out, saved, ws);
  if constexpr (!std::is_same_v<RC, NoRing>)  // every rank of the block, before any data moves, at the plan's first call on uc and rc
    if (ring_config_due(p.qkv_plan(), uc, *rc)) check_ring_config(p.qkv_plan(), uc, *rc);
  const AttentionRegions& r = p.regions();
  AttentionCarve sv(saved.data), wk(ws.data);
  std::byte *q_h = sv.take(r.saved[0]), *own = sv.take(r.saved[1]), *o_h = sv.take(r.saved[2]);
  auto* lse = static_cast<float*>(static_cast<void*>(sv.take(r.saved[3])));
  std::byte* const kv[2] = {wk.take(r.fwd[0]), wk.take(r.fwd[1])};
  auto* acc = static_cast<float*>(static_cast<void*>(wk.take(r.fwd[2])));
  std::byte* pout = wk.take(r.fwd[3]);
  auto* plse = static_cast<float*>(static_cast<void*>(wk.take(r.fwd[4])));
  const ByteSpan xws(wk.take(r.fwd[5]), r.fwd[5]);
  const Plan& qkv = p.qkv_plan();
  HostExecutor exec;
  if (p.is_ulysses_allgather()) {  // U × AG: seq→head over the Ulysses group (k|v rows into kv[0]), then k|v gathered over the ring group
    const std::size_t nk = qkv.head_bytes(1), nv = qkv.head_bytes(2);
    seq_to_head(qkv, uc, exec, in, QkvOut().q({q_h, r.saved[0]}).k({kv[0], nk}).v({kv[0] + nk, nv}), xws, tx);
    const Plan& g = p.gather_plan();
    if constexpr (!std::is_same_v<RC, NoRing>)
      allgather_kv(g, *rc, exec, {ConstByteSpan(kv[0], nk), ConstByteSpan(kv[0] + nk, nv)},
                   {ByteSpan(own, g.head_bytes(0)), ByteSpan(own + g.head_bytes(0), g.head_bytes(1))}, xws);
  } else if (p.is_allgather()) {  // q stays: a copy kept for the backward; k|v of the whole sequence gathered
    const TensorList<ConstByteSpan> l = in.list();
    check_attention_span(call, "q", l.data[0].data, l.data[0].bytes, r.saved[0], Errc::buffer_too_small, "qkv_plan().seq_bytes(0) of a q");
    if (r.saved[0]) std::memcpy(q_h, l.data[0].data, r.saved[0]);
    allgather_kv(qkv, uc, exec, {l.data[1], l.data[2]}, {ByteSpan(own, qkv.head_bytes(0)), ByteSpan(own + qkv.head_bytes(0), qkv.head_bytes(1))}, xws);
  } else if (p.options().bands == 1) {
    const std::size_t nk = qkv.head_bytes(1);
    seq_to_head(qkv, uc, exec, in, QkvOut().q({q_h, r.saved[0]}).k({own, nk}).v({own + nk, qkv.head_bytes(2)}), xws, tx);
  }
  const RingMergeShape ms{p.batch(), p.tokens(), p.query_heads(), p.specs().v.head_dim};
  ring_merge_init(ms, acc, lse);
  if (p.options().bands > 1) return banded_forward(p, uc, rc, in, out, attention, q_h, own, kv, o_h, lse, acc, pout, plse, xws, tx);
  const int j = p.has_ring_plan() ? p.ring_plan().ring_rank() : 0;
  const ElementType type = p.element_type();
  auto body = [&](int s, const std::byte* block) {
    const RingWork& w = p.work(s);
    if (w.empty()) return;
    AttentionStep a = attention_step(p, s, j, q_h, block);
    a.out = pout;
    a.lse = plse;
    const RingMergeShape part{p.batch(), w.q_len, p.query_heads(), p.specs().v.head_dim};
    std::memset(pout, 0, static_cast<std::size_t>(part.out_elems()) * p.specs().q.elem_bytes);
    for (std::int64_t i = 0; i < part.lse_elems(); ++i) plse[i] = -INFINITY;
    attention(static_cast<const AttentionStep&>(a));
    ring_merge_block(ms, acc, lse, pout, type, plse, w.q_begin, w.q_len);
  };
  attention_steps<false>(p, rc, own, kv, kv, body, [](int, float*) {});
  ring_merge_finish(ms, acc, o_h, type);
  if (p.is_allgather() && !p.is_ulysses_allgather()) {  // o is on its tokens already
    check_attention_span(call, "output o", out.data, out.bytes, r.saved[2], Errc::buffer_too_small, "saved_out() size of an o");
    if (r.saved[2]) std::memcpy(out.data, o_h, r.saved[2]);
  } else {
    head_to_seq(p.out_plan(), uc, exec, ConstByteSpan(o_h, r.saved[2]), out, xws);
  }
}

}  // namespace detail

/// The forward of one attention layer on this rank of a Ulysses × Ring block (R >= 1), around
/// the engine's attention. Collective over `ulysses` and `ring`, every rank of the block the same
/// call. Follows yunchang's LongContextAttention (seq→head, ring attention, head→seq) and
/// zhuzilin's ring-flash-attention (the step loop: transfer of step s + 1 posted before step s's
/// attention, completed after it; out and lse merged by LSE in step order).
///
/// 1. checks the spans (locally), then, at the plan's first call on these communicators,
///    check_ring_config(plan.qkv_plan(), ulysses, ring): U, R, layout, causal, S, and every plan
///    field on every rank of the block, before any data moves (detail::ring_config_due());
/// 2. seq→head of q, k, v in ONE exchange (attention_specs().qkv()) into `saved`;
/// 3. per ring step s with work (RingWork::empty() steps are skipped): `attention(step)` with
///    step's out pre-filled with 0 and lse with −inf, then merged (ring_merge_block(), fp32);
/// 4. the merged o rounded once to the element type, head→seq into `out`.
/// With options().bands = G > 1, 2–4 run per head band, band g's attention while seq→head of
/// band g + 1 and head→seq of band g − 1 move; over a ring each band's kv heads are copied into
/// one contiguous block that rotates alone (detail/band_ring.hpp). The same bits for every G.
/// @param plan      this rank's DistributedAttentionPlan (made from a RingPlan, by allgather(const RingPlan&)
///                  for U × AG: the ring group gathers k|v once instead of rotating it, or a plain one for R = 1)
/// @param ulysses   this rank's Ulysses group (U ranks, rank = its Ulysses rank); any communicator
/// @param ring      this rank's ring (R ranks, rank = its ring rank); with exchange_messages()
/// @param qkv       seq-sharded q [B, S_w, H, D], k [B, S_w, Hkv, D], v [B, S_w, Hkv, Dv] (bshd,
///                  by name: QkvIn().q(q).k(k).v(v); sizes Plan::seq_bytes(t) of plan.qkv_plan())
/// @param out       seq-sharded o [B, S_w, H, Dv] (plan.out_plan().seq_bytes(0))
/// @param attention the engine's kernel, callable as attention(const AttentionStep&): writes the
///                  step's partial out [B, q_len, q_count, Dv] and fp32 lse [B, q_count, q_len]
///                  (natural log) from the step's q, k, v views (attention/step.hpp)
/// @param saved     plan.saved_bytes(): head-sharded q, k|v, the merged o and LSE, for the backward
/// @param workspace plan.forward_workspace_bytes() of scratch
/// @param transforms row transforms of the seq→head of q|k|v (tensor 0 q, 1 k, 2 v, on pack or
///                  unpack; RoPE: `RowTransforms().on_pack(0, rope).on_pack(1, rope)`), each row
///                  seen at its GLOBAL token on every plan (a ring's Ulysses exchange moves
///                  ring-local tokens: detail::GlobalTokenRows maps them); the plan's q, k, v
///                  specs must have been made with TensorSpec::with_row_transforms() for the
///                  tensors given. The same bits as the transform applied to the global tensors
///                  before the call (each row rounded once). None by default. Must outlive the call.
/// Host memory (HostExecutor). No tensor-sized allocation beyond the spans: a call makes its ring
/// rotation (lists of R entries; with thread progress its worker thread) and the check's small records.
/// @throws Error(buffer_too_small) `saved` too small, Error(workspace_too_small) the workspace
///         (both before any collective); Error(tensor_mismatch) q, k, v or `out` given as a range
///         of elements of another size than the plan's (std::vector<double> for float32; before
///         any byte moves); Error(invalid_shape) transforms for an all-gather-KV
///         plan (no seq→head to run them in), or for a tensor not planned by rows (seq_to_head(),
///         before any byte moves), or bands over a ring with
///         Progress::thread on a communicator that cannot be called from two threads at once
///         (MPI below MPI_THREAD_MULTIPLE; before any collective); what check_ring_config() throws (comm_mismatch: a
///         communicator of another size, locally; plan_mismatch on every rank of the block);
///         what seq_to_head(), head_to_seq() and the rotation throw; what `attention` throws. Any
///         error after the check breaks both groups first (their abort()), so that the peers
///         throw Error(aborted) naming this rank at once instead of waiting out their deadline
///         (in this call where what is left of it waits on a broken group, else at their next
///         call on these communicators).
template <class UlyssesComm, class RingComm, class Attention>
void distributed_attention(const DistributedAttentionPlan& plan, UlyssesComm& ulysses, RingComm& ring, const QkvIn& qkv, ByteSpan out,
                           Attention&& attention, ByteSpan saved, Workspace workspace, const RowTransforms& transforms = {}) {
  detail::attention_guard(ulysses, &ring, "distributed_attention", [&] {
    detail::check_band_ring_threads(plan, ulysses, ring, "distributed_attention");
    const detail::AttentionRowTransforms rows(plan, transforms, "distributed_attention");
    detail::attention_forward(plan, ulysses, &ring, qkv, out, attention, saved, workspace, rows.get());
  });
}

/// Plain Ulysses (DeepSpeed's DistributedAttention: seq→head, the local attention over all S
/// tokens, head→seq): distributed_attention() with no ring, for a plan of R = 1. The causal flag
/// and the partition are agreed in the plans' own agreement check (their first exchange).
/// @throws Error(comm_mismatch) a plan with R > 1, or U × AG (it needs its ring); as above.
template <class UlyssesComm, class Attention>
void distributed_attention(const DistributedAttentionPlan& plan, UlyssesComm& ulysses, const QkvIn& qkv, ByteSpan out, Attention&& attention,
                           ByteSpan saved, Workspace workspace, const RowTransforms& transforms = {}) {
  detail::require_no_ring(plan, "distributed_attention");
  detail::NoRing* none = nullptr;
  detail::attention_guard(ulysses, none, "distributed_attention",
                          [&] {
                            const detail::AttentionRowTransforms rows(plan, transforms, "distributed_attention");
                            detail::attention_forward(plan, ulysses, none, qkv, out, attention, saved, workspace, rows.get());
                          });
}

ULYSSES_NAMESPACE_END

#include "backward.hpp"  // distributed_attention_backward()
