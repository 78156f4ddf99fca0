// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief distributed_attention_backward(): the backward of distributed_attention()
///        (attention/distributed.hpp) around the engine's attention backward, called once per
///        ring step (AttentionGradStep): do seq→head, the ring of k|v with the fp32 dk|dv
///        accumulators (RingGradRotation), dq summed over the steps, and the summed inverse
///        seq_to_head_backward() of dq, dk, dv. See docs/attention.md ("The backward").
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "../attention_call.hpp"
#include "../host/executor.hpp"
#include "../redistribute.hpp"
#include "detail/band_ring.hpp"
#include "detail/steps.hpp"
#include "detail/transforms.hpp"
#include "plan.hpp"
#include "step.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {
/// Adds x [B, len, n] (fp32) into rows [begin, begin + len) of acc [B, rows, n], or writes them there (`assign`).
inline void attention_add_rows(float* acc, const float* x, std::int64_t B, std::int64_t rows, std::int64_t begin, std::int64_t len,
                               std::int64_t n, bool assign) {
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t e = 0; e < len * n; ++e) {
      float& a = acc[(b * rows + begin) * n + e];
      a = assign ? x[b * len * n + e] : a + x[b * len * n + e];
    }
}

/// Step s's backward views over query heads [ql, ql + qn) and a block of kn kv heads (the whole
/// step: 0, Hq, Hk; a band's ring: the band's heads): the forward's `fwd`, the merged o, do and lse
/// rows of the step, and the partials zeroed: dq's columns of those heads (rows of Hq·D floats),
/// dk|dv of the block's kn heads.
inline AttentionGradStep attention_grad_views(const DistributedAttentionPlan& p, int s, const AttentionStep& fwd, const std::byte* o_h,
                                              const std::byte* do_h, const float* lse, float* dq, float* dkv, std::int64_t ql, std::int64_t qn,
                                              std::int64_t kn) {
  const RingWork& w = p.work(s);
  const std::int64_t B = p.batch(), L = p.tokens(), Hq = p.query_heads(), D = p.specs().q.head_dim, Dv = p.specs().v.head_dim;
  const auto eb = static_cast<std::int64_t>(p.specs().q.elem_bytes);
  AttentionGradStep g;
  g.fwd = fwd;
  g.o = o_h + (w.q_begin * Hq + ql) * Dv * eb;
  g.dout = do_h + (w.q_begin * Hq + ql) * Dv * eb;
  g.o_stride = {L * Hq * Dv, Hq * Dv, Dv};
  g.lse = lse + ql * L + w.q_begin;
  g.lse_stride = {Hq * L, L};
  g.dq = dq + ql * D;
  g.dq_stride = {w.q_len * Hq * D, Hq * D, D};
  g.dk = dkv;
  g.dk_stride = {w.kv_len * kn * D, kn * D, D};
  g.dv = dkv + B * w.kv_len * kn * D;
  g.dv_stride = {w.kv_len * kn * Dv, kn * Dv, Dv};
  for (std::int64_t r = 0; r < B * w.q_len; ++r) std::fill(g.dq + r * Hq * D, g.dq + r * Hq * D + qn * D, 0.0f);
  std::fill(dkv, dkv + B * w.kv_len * kn * (D + Dv), 0.0f);
  return g;
}

/// Step s's backward views over every head (attention_grad_views()), its forward attention_step().
inline AttentionGradStep attention_grad_step(const DistributedAttentionPlan& p, int s, int j, const std::byte* q_h, const std::byte* block,
                                             const std::byte* o_h, const std::byte* do_h, const float* lse, float* dq, float* dkv) {
  return attention_grad_views(p, s, attention_step(p, s, j, q_h, block), o_h, do_h, lse, dq, dkv, 0, p.query_heads(), p.kv_heads());
}

/// Adds step s's dk|dv partial (kv rows of the step) into the block's accumulator g (k part then v
/// part of the block held at the step); at step 0 the accumulator starts as the partial (0 elsewhere).
/// Hk: the block's kv heads (p.kv_heads(); a band's block (band_ring_backward()): the band's).
inline void attention_add_kv(const DistributedAttentionPlan& p, int s, float* g, const float* dkv, std::int64_t Hk) {
  const RingWork& w = p.work(s);
  const std::int64_t B = p.batch(), D = p.specs().q.head_dim, Dv = p.specs().v.head_dim;
  if (s == 0) std::memset(g, 0, static_cast<std::size_t>(B * w.L_kv * Hk * (D + Dv)) * sizeof(float));
  if (w.empty()) return;
  attention_add_rows(g, dkv, B, w.L_kv, w.kv_begin, w.kv_len, Hk * D, s == 0);
  attention_add_rows(g + B * w.L_kv * Hk * D, dkv + B * w.kv_len * Hk * D, B, w.L_kv, w.kv_begin, w.kv_len, Hk * Dv, s == 0);
}

/// The end of the backward (attention_backward()): dq (fp32 `dq`) and dk|dv (fp32 `home`, the
/// kv rows of the plan's step) rounded once to the element type in `g_t`, then back to the
/// seq-sharded `grads`: the Ulysses adjoint (seq_to_head_backward()), after the reduce-scatter
/// over the ring group for U × AG; all-gather KV: dq in place and the reduce-scatter alone.
template <class UC, class RC>
void attention_grads_out(const DistributedAttentionPlan& p, UC& uc, RC* rc, const QkvGradOut& grads, const float* dq, const float* home,
                         std::byte* g_t, std::size_t q_bytes, ByteSpan xws, const RowTransforms& tx) {
  const char* call = "distributed_attention_backward";
  const Plan& qkv = p.qkv_plan();
  HostExecutor exec;
  const std::size_t eb = p.specs().q.elem_bytes;
  if (p.is_ulysses_allgather()) {  // U × AG: dk|dv of the S rows reduce-scattered over the ring group, then the Ulysses adjoint
    const Plan& gp = p.gather_plan();
    const std::size_t nq = qkv.head_bytes(0), nk = qkv.head_bytes(1), nv = qkv.head_bytes(2), gk = gp.head_bytes(0), gv = gp.head_bytes(1);
    std::byte* const dkv_all = g_t + nq;  // dk|dv of the S rows in the element type; after them this rank's L_j rows (own_rows)
    attention_store(dq, g_t, static_cast<std::int64_t>(nq / eb), p.element_type());
    attention_store(home, dkv_all, static_cast<std::int64_t>((gk + gv) / eb), p.element_type());
    std::byte* const own_rows = dkv_all + gk + gv;
    if constexpr (!std::is_same_v<RC, NoRing>)
      allgather_kv_backward(gp, *rc, exec, {ConstByteSpan(dkv_all, gk), ConstByteSpan(dkv_all + gk, gv)},
                            {ByteSpan(own_rows, nk), ByteSpan(own_rows + nk, nv)}, xws);
    seq_to_head_backward(qkv, uc, exec, QkvGradIn().dq({g_t, nq}).dk({own_rows, nk}).dv({own_rows + nk, nv}), grads, xws, tx);
    return;
  }
  if (p.is_allgather()) {  // dq on its tokens; dk|dv of the whole sequence reduce-scattered (fp32, ascending rank, one rounding)
    const std::size_t nq = q_bytes, nk = qkv.head_bytes(0), nv = qkv.head_bytes(1);
    const TensorList<ByteSpan> l = grads.list();
    check_attention_span(call, "dq", l.data[0].data, l.data[0].bytes, nq, Errc::buffer_too_small, "qkv_plan().seq_bytes() size of a dq");
    attention_store(dq, l.data[0].data, static_cast<std::int64_t>(nq / eb), p.element_type());
    attention_store(home, g_t, static_cast<std::int64_t>((nk + nv) / eb), p.element_type());
    allgather_kv_backward(qkv, uc, exec, {ConstByteSpan(g_t, nk), ConstByteSpan(g_t + nk, nv)}, {l.data[1], l.data[2]}, xws);
    return;
  }
  const std::size_t nq = qkv.head_bytes(0), nk = qkv.head_bytes(1), nv = qkv.head_bytes(2);
  attention_store(dq, g_t, static_cast<std::int64_t>(nq / eb), p.element_type());
  attention_store(home, g_t + nq, static_cast<std::int64_t>((nk + nv) / eb), p.element_type());
  seq_to_head_backward(qkv, uc, exec, QkvGradIn().dq({g_t, nq}).dk({g_t + nq, nk}).dv({g_t + nq + nk, nv}), grads, xws, tx);
}

/// Elements [lo, hi) of each of `rows` rows of `width` fp32 elements at src, rounded once to
/// `type` at the same places of dst (attention_store()).
inline void attention_store_columns(const float* src, std::byte* dst, std::int64_t rows, std::int64_t width, std::int64_t lo, std::int64_t hi,
                                    ElementType type, std::size_t eb) {
  for (std::int64_t r = 0; r < rows; ++r) attention_store(src + r * width + lo, dst + static_cast<std::size_t>(r * width + lo) * eb, hi - lo, type);
}

/// The ring of band b in the backward (band_ring_forward()'s; b's query heads nonempty, no kv head
/// shared with another band: bands_share_kv_heads() false): its k|v packed and rotated with its
/// fp32 dk|dv accumulator (RingGradRotation); per step with work the engine's backward of the
/// band's heads into zeroed partials, dq added into f[0]'s band columns and dk|dv into the
/// travelling accumulator, in step order as the unbanded ring adds them; then dq and the
/// accumulator that came home rounded once into g_t's band columns (dq, dk, dv of the element type).
template <class RC, class G>
void band_ring_backward(const DistributedAttentionPlan& p, RC& rc, const Band& b, const std::byte* q_h, const std::byte* own, const std::byte* o_h,
                        const std::byte* do_h, const float* lse, std::byte* const kv[2], std::byte* const gr[2], float* const f[3],
                        std::int64_t* map, std::byte* g_t, G& backward) {
  const RingPlan& rp = p.ring_plan();
  const std::int64_t B = p.batch(), L = p.tokens(), Hq = p.query_heads(), Hk = p.kv_heads(), D = p.specs().q.head_dim, Dv = p.specs().v.head_dim;
  const std::int64_t ql = b.query.lo, qn = b.query.size(), kn = b.kv.size();
  const std::size_t eb = p.specs().q.elem_bytes, kb = band_ring_bytes({rp.kv_buffer_bytes()}, Hk, b)[0];
  const std::size_t gb = band_ring_bytes({rp.grad_buffer_bytes()}, Hk, b)[0];
  pack_band_kv(p, b, own, kv[0]);
  RingGradRotation<RC> rot(rc, band_ring_bytes(rp.block_bytes(), Hk, b), band_ring_bytes(rp.grad_bytes(), Hk, b),
                           RingBuffers().kv(kv[0], kb, kv[1], kb).grad(gr[0], gb, gr[1], gb), p.options().progress, rp.messages(),
                           RingAccess::copy, rp.last_uses());
  for (std::int64_t r = 0; r < B * L; ++r) std::fill(f[0] + (r * Hq + ql) * D, f[0] + (r * Hq + ql + qn) * D, 0.0f);
  for (int s = 0; s < p.steps(); ++s) {
    const RingWork& w = p.work(s);
    rot.start(s);
    run_then(
        [&] {
          if (w.empty()) return;
          const AttentionGradStep g = attention_grad_views(p, s, band_ring_step(p, b, s, q_h, rot.block(s), nullptr, nullptr, map), o_h, do_h,
                                                           lse, f[1], f[2], ql, qn, kn);
          backward(g);
          for (std::int64_t r = 0; r < B * w.q_len; ++r) {  // (row r of the step: batch r / q_len, query row q_begin + r % q_len)
            float* a = f[0] + (((r / w.q_len) * L + w.q_begin + r % w.q_len) * Hq + ql) * D;
            const float* x = f[1] + (r * Hq + ql) * D;
            for (std::int64_t e = 0; e < qn * D; ++e) a[e] = a[e] + x[e];
          }
        },
        [&] { rot.finish(s); });
    attention_add_kv(p, s, rot.template grad<float>(s), f[2], kn);
  }
  const float* home = rot.template home<float>();
  const std::size_t nq = p.qkv_plan().head_bytes(0), nk = p.qkv_plan().head_bytes(1);
  attention_store_columns(f[0], g_t, B * L, Hq * D, ql * D, (ql + qn) * D, p.element_type(), eb);
  for (std::int64_t r = 0; r < B * L; ++r) {
    attention_store(home + r * kn * D, g_t + nq + static_cast<std::size_t>((r * Hk + b.kv.lo) * D) * eb, kn * D, p.element_type());
    attention_store(home + B * L * kn * D + r * kn * Dv, g_t + nq + nk + static_cast<std::size_t>((r * Hk + b.kv.lo) * Dv) * eb, kn * Dv,
                    p.element_type());
  }
}

/// The backward over G = options().bands head bands: seq→head of do band by band, the engine's
/// backward of band g (Ulysses × Ring: band_ring_backward()), head→seq of its dq and of the dk|dv
/// of the kv heads whose last band on this rank is g (the summed inverse), while the next band computes. The partials are
/// zeroed once: the bands that share a kv head add into its dk|dv in turn, as one unbanded call
/// adds its query heads in order (the same bits, for a kernel that accumulates so). dq as the
/// unbanded R = 1 path: 0 + the partial, rounded once.
template <class UC, class RC, class G>
void banded_backward(const DistributedAttentionPlan& p, UC& uc, RC* rc, ConstByteSpan dout, const QkvGradOut& grads, G& backward,
                     const std::byte* q_h, const std::byte* own, const std::byte* o_h, const float* lse, std::byte* do_h, std::byte* const kv[2],
                     std::byte* const gr[2], float* const f[3], std::byte* g_t, ByteSpan xws, const RowTransforms& tx) {
  const Plan &qkv = p.qkv_plan(), &o = p.out_plan();
  require_adjoint(qkv, "distributed_attention_backward");
  const std::int64_t B = p.batch(), L = p.tokens(), Hq = p.query_heads(), Hk = p.kv_heads(), D = p.specs().q.head_dim, Dv = p.specs().v.head_dim;
  const std::size_t eb = p.specs().q.elem_bytes, nq = qkv.head_bytes(0), nk = qkv.head_bytes(1), nv = qkv.head_bytes(2);
  const std::size_t ows = attention_round(o.workspace_bytes());
  const ElementType t = p.element_type();
  const bool work = !p.work(0).empty();
  const AttentionGradStep whole = attention_grad_step(p, 0, 0, q_h, own, o_h, do_h, lse, f[1], f[2]);  // (zeroes the partials of a step with work)
  if (!work) std::memset(f[1], 0, static_cast<std::size_t>(B * L * Hq * D) * sizeof(float));
  if (!work) std::memset(f[2], 0, static_cast<std::size_t>(B * L * Hk * (D + Dv)) * sizeof(float));
  std::vector<std::int64_t> map(static_cast<std::size_t>(Hq) + 1);
  const int nb = qkv.num_stages();
  auto band_of = [&](int g) { return head_band(p.specs(), qkv.rank(), g, nb); };
  std::int64_t kv_done = 0;  // kv heads [0, kv_done) rounded already
  const QkvGradIn g_in = QkvGradIn().dq({g_t, nq}).dk({g_t + nq, nk}).dv({g_t + nq + nk, nv});
  HostExecutor exec;
  run_band_pipeline(
      nb, band_of, uc, exec, p.options().progress,
      [&](int g) {
        return ExchangeCall{&o, Direction::seq_to_head, TensorList<ConstByteSpan>{dout}, TensorList<ByteSpan>{ByteSpan(do_h, o.head_bytes(0))},
                            Workspace(xws.data, ows), StageRange::one(g)};
      },
      [&](int g) { return ExchangeCall{&qkv, Direction::head_to_seq, g_in.list(), grads.list(), Workspace(static_cast<std::byte*>(xws.data) + ows, xws.bytes - ows), StageRange::one(g), &tx}; },
      [&](const Band& b) {
        if constexpr (!std::is_same_v<RC, NoRing>)
          if (p.steps() > 1) {
            if (b.query.size() > 0) band_ring_backward(p, *rc, b, q_h, own, o_h, do_h, lse, kv, gr, f, map.data(), g_t, backward);
            return;
          }
        const std::int64_t ql = b.query.lo, qh = b.query.hi, eq = static_cast<std::int64_t>(eb);
        if (work && b.query.size() > 0) {
          AttentionGradStep g = whole;
          g.fwd = band_step(b, whole.fwd, map.data());
          g.o = o_h + ql * Dv * eq;
          g.dout = do_h + ql * Dv * eq;
          g.lse += ql * g.lse_stride.head;
          g.dq += ql * D;
          g.dk += b.kv.lo * D;
          g.dv += b.kv.lo * Dv;
          backward(static_cast<const AttentionGradStep&>(g));
        }
        for (std::int64_t r = 0; r < B * L; ++r)
          for (std::int64_t e = ql * D; e < qh * D; ++e) f[0][r * Hq * D + e] = 0.0f + f[1][r * Hq * D + e];
        attention_store_columns(f[0], g_t, B * L, Hq * D, ql * D, qh * D, t, eb);
        const Band next = b.index + 1 < nb ? band_of(b.index + 1) : Band{};
        const std::int64_t kv_hi = next.query.size() > 0 ? next.kv.lo : Hk;  // the kv heads no later band uses
        attention_store_columns(f[2], g_t + nq, B * L, Hk * D, kv_done * D, kv_hi * D, t, eb);
        attention_store_columns(f[2] + B * L * Hk * D, g_t + nq + nk, B * L, Hk * Dv, kv_done * Dv, kv_hi * Dv, t, eb);
        kv_done = kv_hi > kv_done ? kv_hi : kv_done;
      },
      "the attention backward of a head band");
}

/// The backward on this rank (see distributed_attention_backward()).
template <class UC, class RC, class G>
void attention_backward(const DistributedAttentionPlan& p, UC& uc, RC* rc, ConstByteSpan dout, const QkvGradOut& grads, G& backward,
                        ConstByteSpan saved, Workspace ws, const RowTransforms& tx) {
  const char* call = "distributed_attention_backward";
  check_backward_spans(call, p, dout, grads, saved, ws);
  const AttentionRegions& r = p.regions();
  AttentionCarve sv(saved.data), wk(ws.data);
  const std::byte *q_h = sv.take(r.saved[0]), *own = sv.take(r.saved[1]), *o_h = sv.take(r.saved[2]);
  const auto* lse = static_cast<const float*>(static_cast<const void*>(sv.take(r.saved[3])));
  std::byte* const do_ws = wk.take(r.bwd[0]);
  const std::byte* do_h = do_ws;
  std::byte* const kv[2] = {wk.take(r.bwd[1]), wk.take(r.bwd[2])};
  std::byte* const gr[2] = {wk.take(r.bwd[3]), wk.take(r.bwd[4])};
  float* f[3];  // dq accumulator, dq partial, dk|dv partial
  for (int i = 0; i < 3; ++i) f[i] = static_cast<float*>(static_cast<void*>(wk.take(r.bwd[5 + i])));
  std::byte* g_t = wk.take(r.bwd[8]);  // dq, dk, dv in the element type
  const ByteSpan xws(wk.take(r.bwd[9]), r.bwd[9]);
  // Ulysses × Ring over bands that share a kv head: the unbanded ring (its dk|dv sums over the
  // steps of all the kv head's query heads at once; per band they would add in another order).
  if (p.options().bands > 1 && (p.steps() == 1 || !bands_share_kv_heads(p.specs(), p.options().bands)))
    return banded_backward(p, uc, rc, dout, grads, backward, q_h, own, o_h, lse, do_ws, kv, gr, f, g_t, xws, tx);
  HostExecutor exec;
  if (p.is_allgather() && !p.is_ulysses_allgather()) {  // do is on the query rows already: the step reads it in place
    check_attention_span(call, "do", dout.data, dout.bytes, r.saved[2], Errc::buffer_too_small, "saved_out() size of a do");
    do_h = static_cast<const std::byte*>(dout.data);
  } else {
    head_to_seq_backward(p.out_plan(), uc, exec, dout, ByteSpan(do_ws, r.bwd[0]), xws);
  }
  const std::int64_t B = p.batch(), L = p.tokens(), Hq = p.query_heads(), D = p.specs().q.head_dim;
  std::memset(f[0], 0, r.bwd[5]);
  const int j = p.has_ring_plan() ? p.ring_plan().ring_rank() : 0;
  auto body = [&](int s, const std::byte* block) {
    const RingWork& w = p.work(s);
    if (w.empty()) return;
    const AttentionGradStep g = attention_grad_step(p, s, j, q_h, block, o_h, do_h, lse, f[1], f[2]);
    backward(g);
    attention_add_rows(f[0], f[1], B, L, w.q_begin, w.q_len, Hq * D, false);
  };
  auto after = [&](int s, float* g) { attention_add_kv(p, s, g, f[2], p.kv_heads()); };
  const float* home = attention_steps<true>(p, rc, own, kv, gr, body, after);
  attention_grads_out(p, uc, rc, grads, f[0], home, g_t, r.saved[0], xws, tx);
}
}  // namespace detail

/// The backward of distributed_attention() on this rank, around the engine's attention backward
/// (ring-flash-attention's ring_flash_attn_backward: per step FlashAttention-2's backward with
/// the merged out and lse; dk|dv travel the ring with their block and come home; yunchang's
/// LongContextAttention backward: the Ulysses exchanges' adjoints). Call it after the forward
/// with the same plan, communicators and `saved`. Collective over both communicators.
///
/// 1. head_to_seq_backward() of do (seq→head); 2. per ring step with work, `backward(step)` into
/// the zeroed fp32 partials; dq added into an fp32 accumulator in step order, dk|dv into the
/// accumulator of the block held at the step (RingGradRotation: the sum of every ring rank's
/// contribution in step order from the block's owner); 3. dq, dk, dv rounded once to the element
/// type; seq_to_head_backward() (the kv heads replicated on several Ulysses ranks summed in
/// ascending rank order). U × AG (DistributedAttentionPlan::allgather(const RingPlan&)): the one
/// step's dk|dv over all S rows rounded to the element type, reduce-scattered over the ring group
/// (allgather_kv_backward() of gather_plan(): fp32, ascending ring rank, rounded once), then
/// seq_to_head_backward() as above.
/// @param plan, ulysses, ring  the forward's
/// @param dout      seq-sharded do [B, S_w, H, Dv] (plan.out_plan().seq_bytes(0))
/// @param grads     seq-sharded dq [B, S_w, H, D], dk [B, S_w, Hkv, D], dv [B, S_w, Hkv, Dv] by
///                  name: QkvGradOut().dq(dq).dk(dk).dv(dv) (plan.qkv_plan().seq_bytes(t))
/// @param backward  the engine's kernel, callable as backward(const AttentionGradStep&): writes
///                  (or adds into) the step's fp32 dq [B, q_len, q_count, D], dk and dv [B,
///                  kv_len, kv_count, D|Dv], from q, k, v, o, do, lse (FlashAttention-2's rule:
///                  P = exp(scale·q·k − lse), Dsum = rowsum(do · o))
/// @param saved     what the forward wrote there (plan.saved_bytes())
/// @param workspace plan.backward_workspace_bytes() of scratch
/// @param transforms row transforms of the head→seq of dq|dk|dv (tensor 0 dq, 1 dk, 2 dv; RoPE's
///                  backward: `RowTransforms().on_unpack(0, inv).on_unpack(1, inv)` with inv =
///                  rope.inverse(): applied to the float32 sum of replicated kv heads, rounded
///                  once), by global token as the forward's. None by default.
/// @throws Error(buffer_too_small) / Error(workspace_too_small) the spans (before any
///         collective); Error(tensor_mismatch) do, dq, dk or dv given as a range of elements of
///         another size than the plan's (before any byte moves); Error(invalid_shape) as the forward's transforms; what the exchanges, the rotation and `backward` throw. Any error breaks
///         both groups first, as the forward's.
template <class UlyssesComm, class RingComm, class AttentionBackward>
void distributed_attention_backward(const DistributedAttentionPlan& plan, UlyssesComm& ulysses, RingComm& ring, ConstByteSpan dout,
                                    const QkvGradOut& grads, AttentionBackward&& backward, ConstByteSpan saved, Workspace workspace,
                                    const RowTransforms& transforms = {}) {
  detail::attention_guard(ulysses, &ring, "distributed_attention_backward", [&] {
    detail::check_band_ring_threads(plan, ulysses, ring, "distributed_attention_backward");
    const detail::AttentionRowTransforms rows(plan, transforms, "distributed_attention_backward");
    detail::attention_backward(plan, ulysses, &ring, dout, grads, backward, saved, workspace, rows.get());
  });
}

/// Plain Ulysses' backward (no ring, a plan of R = 1), as above.
/// @throws Error(comm_mismatch) a plan with R > 1, or U × AG (whose dk|dv must be reduce-scattered
///         over its ring group); as above.
template <class UlyssesComm, class AttentionBackward>
void distributed_attention_backward(const DistributedAttentionPlan& plan, UlyssesComm& ulysses, ConstByteSpan dout, const QkvGradOut& grads,
                                    AttentionBackward&& backward, ConstByteSpan saved, Workspace workspace,
                                    const RowTransforms& transforms = {}) {
  detail::require_no_ring(plan, "distributed_attention_backward");
  detail::NoRing* none = nullptr;
  detail::attention_guard(ulysses, none, "distributed_attention_backward",
                          [&] {
                            const detail::AttentionRowTransforms rows(plan, transforms, "distributed_attention_backward");
                            detail::attention_backward(plan, ulysses, none, dout, grads, backward, saved, workspace, rows.get());
                          });
}

ULYSSES_NAMESPACE_END
