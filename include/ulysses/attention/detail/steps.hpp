// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The pieces of distributed_attention() (attention/distributed.hpp): the carving of the
///        engine's spans, the span checks, the error guard that breaks both groups, a step's
///        views, and the step loop over the ring rotations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <type_traits>

#include "../../attention_call.hpp"
#include "../../bands.hpp"
#include "../../comm/tell_peers.hpp"
#include "../../ring/merge.hpp"
#include "../../ring/rotation.hpp"
#include "../plan.hpp"
#include "../step.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {
/// The ring of the Ulysses-only overloads: none (a plan of R = 1).
struct NoRing {};

/// @throws Error(code) when `have` < `need` bytes, naming the span and the size query.
inline void check_attention_span(const char* call, const char* span, const void* data, std::size_t have, std::size_t need, Errc code,
                                 const char* query) {
  if (have >= need && (data || need == 0)) return;
  fail(code, std::string(call) + ": the " + span + " has " + std::to_string(have) + " bytes" + (data ? "" : " (null)") + ", it needs " +
                 std::to_string(need) + " (DistributedAttentionPlan::" + query + "())");
}

/// The engine's q, k, v (or dq, dk, dv) and o (or do) against the plan's element sizes, before
/// any byte moves (check_range_element(): a span made from a range of another element size is
/// Error(tensor_mismatch)). The exchanges check the spans they take too, but an all-gather-KV
/// plan copies q and o without one.
template <class S>
void check_attention_elements(const char* call, const DistributedAttentionPlan& p, const TensorList<S>& qkv, std::size_t o_elem, bool grads) {
  static const char* const names[2][4] = {{"q", "k", "v", "o"}, {"dq", "dk", "dv", "do"}};
  auto check = [&](int i, std::size_t range_elem, const TensorSpec& s) {
    check_range_element([&] { return std::string(call) + ": " + names[grads ? 1 : 0][i]; }, range_elem, s.elem_bytes, to_string(s.type),
                        s.type == ElementType::opaque);
  };
  const TensorSpec* spec[4] = {&p.specs().q, &p.specs().k, &p.specs().v, &p.specs().o};  // (an all-gather plan's qkv_plan() lacks q)
  for (int t = 0; t < 3 && t < static_cast<int>(qkv.size); ++t) check(t, qkv.data[t].elem_bytes, *spec[t]);
  check(3, o_elem, *spec[3]);
}
/// The forward's spans before anything moves: q, k, v and out's element sizes, `saved` and the
/// workspace's sizes. @throws Error(tensor_mismatch, buffer_too_small, workspace_too_small)
inline void check_forward_spans(const char* call, const DistributedAttentionPlan& p, const QkvIn& in, ByteSpan out, ByteSpan saved, ByteSpan ws) {
  check_attention_elements(call, p, in.list(), out.elem_bytes, false);
  check_attention_span(call, "saved span", saved.data, saved.bytes, p.saved_bytes(), Errc::buffer_too_small, "saved_bytes");
  check_attention_span(call, "workspace", ws.data, ws.bytes, p.forward_workspace_bytes(), Errc::workspace_too_small, "forward_workspace_bytes");
}
/// The backward's spans before anything moves, as check_forward_spans(): do, dq, dk, dv, `saved`, the workspace.
inline void check_backward_spans(const char* call, const DistributedAttentionPlan& p, ConstByteSpan dout, const QkvGradOut& grads,
                                 ConstByteSpan saved, ByteSpan ws) {
  check_attention_elements(call, p, grads.list(), dout.elem_bytes, true);
  check_attention_span(call, "saved span", saved.data, saved.bytes, p.saved_bytes(), Errc::buffer_too_small, "saved_bytes");
  check_attention_span(call, "workspace", ws.data, ws.bytes, p.backward_workspace_bytes(), Errc::workspace_too_small, "backward_workspace_bytes");
}

/// Breaks the groups of both communicators with `what` (the peers throw Error(aborted) naming this rank).
template <class UC, class RC>
void break_attention_groups(UC& uc, RC* rc, const char* call, const std::string& what) noexcept {
  break_group_for(uc, failure_notice(uc.rank(), call, what));
  if constexpr (!std::is_same_v<RC, NoRing>)
    if (rc) break_group_for(*rc, failure_notice(rc->rank(), call, what));
}

/// The Ulysses-only overloads (no ring communicator) take plain Ulysses plans only: a plan of R > 1
/// ring steps, or U × AG (one step, but its k|v gathered over the ring group), needs its ring.
/// @throws Error(comm_mismatch) such a plan (locally, before any collective).
inline void require_no_ring(const DistributedAttentionPlan& plan, const char* call) {
  if (plan.steps() != 1 || plan.is_ulysses_allgather())
    fail(Errc::comm_mismatch, std::string(call) + ": the plan has R=" + std::to_string(plan.has_ring_plan() ? plan.ring_plan().steps() : 1) +
                                  (plan.is_ulysses_allgather() ? " ring ranks that gather k|v" : " ring steps") +
                                  "; pass its ring communicator too (the overload with `ring`)");
}

/// Runs f(); on an error breaks both groups first (every error but the verdicts every rank reaches
/// alike, plan_mismatch, and the local comm_mismatch), so that no peer of either group waits out its deadline.
template <class UC, class RC, class F>
void attention_guard(UC& uc, RC* rc, const char* call, F&& f) {
  try {
    f();
  } catch (const Error& e) {
    if (e.code() != Errc::plan_mismatch && e.code() != Errc::comm_mismatch) break_attention_groups(uc, rc, call, e.what());
    throw;
  } catch (const std::exception& e) {
    break_attention_groups(uc, rc, call, std::string("an exception: ") + e.what());
    throw;
  } catch (...) {
    break_attention_groups(uc, rc, call, "an exception that is not a std::exception");
    throw;
  }
}

/// Runs f(), then done() (a ring step's finish()), also when f throws (then done()'s own error is dropped).
template <class F, class Done>
void run_then(F&& f, Done&& done) {
  try {
    f();
  } catch (...) {
    try {
      done();
    } catch (...) {  // (f's error is the one to report)
    }
    throw;
  }
  done();
}

/// Step s's views: q from the head-sharded q_h, k and v from the block held at the step.
inline AttentionStep attention_step(const DistributedAttentionPlan& p, int s, int j, const std::byte* q_h, const std::byte* block) {
  const RingWork& w = p.work(s);
  const std::int64_t L = p.tokens(), Hq = p.query_heads(), Hk = p.kv_heads(), D = p.specs().q.head_dim, Dv = p.specs().v.head_dim;
  const auto eb = static_cast<std::int64_t>(p.specs().q.elem_bytes);
  AttentionStep a;
  a.step = s;
  a.steps = p.steps();
  a.source = w.source;
  a.work = w;
  a.mask = w.mask;
  a.type = p.element_type();
  a.elem_bytes = p.specs().q.elem_bytes;
  a.batch = p.batch();
  a.q_len = w.q_len;
  a.kv_len = w.kv_len;
  a.head_dim = D;
  a.v_head_dim = Dv;
  a.softmax_scale = p.softmax_scale();
  a.heads = p.heads();
  a.q_tokens = p.token_ranges(j, w.q_begin, w.q_len);
  a.kv_tokens = p.kv_token_ranges(w.source, w.kv_begin, w.kv_len);
  if (w.mask == RingMask::blocks) {
    a.blocks = w.blocks.data();
    a.block_count = static_cast<std::int64_t>(w.blocks.size());
  }
  a.q = q_h + w.q_begin * Hq * D * eb;
  a.q_stride = {L * Hq * D, Hq * D, D};
  a.k = block + w.kv_begin * Hk * D * eb;
  a.k_stride = {w.L_kv * Hk * D, Hk * D, D};
  a.v = block + (p.batch() * w.L_kv * Hk * D + w.kv_begin * Hk * Dv) * eb;
  a.v_stride = {w.L_kv * Hk * Dv, Hk * Dv, Dv};
  a.out_stride = {w.q_len * Hq * Dv, Hq * Dv, Dv};
  a.lse_stride = {Hq * w.q_len, w.q_len};
  return a;
}

/// The step of band b: attention_step() of the one step narrowed to b's query heads and the kv
/// heads they use (views, out and lse start at them; strides of the whole tensors). `map` gets the
/// band's kv_of() (b.query.size() entries).
inline AttentionStep band_step(const Band& b, AttentionStep a, std::int64_t* map) {
  const auto eb = static_cast<std::int64_t>(a.elem_bytes);
  AttentionHeads& h = a.heads;
  const std::int64_t qn = b.query.size(), kn = b.kv.size();
  bool grouped = kn > 0 && qn % kn == 0;
  for (std::int64_t i = 0; i < qn; ++i) {
    map[i] = h.kv_of(b.query.lo + i) - b.kv.lo;
    grouped = grouped && map[i] == i / (qn / kn);
  }
  h = {b.query.lo, qn, b.kv.lo, kn, h.q_global + b.query.lo, h.kv_global + b.kv.lo, grouped, map};
  a.q = static_cast<const std::byte*>(a.q) + b.query.lo * a.head_dim * eb;
  a.k = static_cast<const std::byte*>(a.k) + b.kv.lo * a.head_dim * eb;
  a.v = static_cast<const std::byte*>(a.v) + b.kv.lo * a.v_head_dim * eb;
  if (a.out) a.out = static_cast<std::byte*>(a.out) + b.query.lo * a.v_head_dim * eb;  // (null in a backward step's forward views)
  if (a.lse) a.lse += b.query.lo * a.lse_stride.head;
  return a;
}

/// The ring steps in order: body(s, block of step s) between the rotation's start(s) and finish(s),
/// then (the backward) after(s, grad(s)); returns the backward's own accumulator (home(); null in
/// the forward). With no ring (R = 1): body(0, own), after(0, g0), g0. `own` is this rank's k|v
/// block, copied into kv0 first.
template <bool Backward, class RC, class Body, class After>
float* attention_steps(const DistributedAttentionPlan& p, RC* rc, const std::byte* own, std::byte* const kv[2], std::byte* const g[2],
                     Body&& body, After&& after) {
  if constexpr (!std::is_same_v<RC, NoRing>) {
    if (p.steps() > 1) {
      const RingPlan& rp = p.ring_plan();
      std::memcpy(kv[0], own, rp.block_bytes()[static_cast<std::size_t>(rp.ring_rank())]);
      const std::size_t kb = rp.kv_buffer_bytes(), gb = rp.grad_buffer_bytes();
      using Rot = std::conditional_t<Backward, RingGradRotation<RC>, RingRotation<RC>>;
      RingBuffers bufs = RingBuffers().kv(kv[0], kb, kv[1], kb);
      if constexpr (Backward) bufs.grad(g[0], gb, g[1], gb);
      Rot rot(*rc, rp, bufs, p.options().progress, p.options().ring_access);
      for (int s = 0; s < p.steps(); ++s) {
        rot.start(s);
        run_then([&] { body(s, rot.block(s)); }, [&] { rot.finish(s); });
        if constexpr (Backward) after(s, rot.template grad<float>(s));
      }
      if constexpr (Backward) return rot.template home<float>();
      return nullptr;
    }
  }
  body(0, own);
  if constexpr (!Backward) return nullptr;
  after(0, static_cast<float*>(static_cast<void*>(g[0])));
  return static_cast<float*>(static_cast<void*>(g[0]));
}

/// fp32 → the element type (ring_merge_finish()'s rounding), n elements.
inline void attention_store(const float* src, void* dst, std::int64_t n, ElementType type) {
  ring_merge_finish(RingMergeShape{1, n, 1, 1}, src, dst, type);
}
}  // namespace detail

ULYSSES_NAMESPACE_END
