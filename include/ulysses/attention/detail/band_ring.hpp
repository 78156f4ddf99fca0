// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Ulysses × Ring over head bands (bands × ring steps, as maxdiffusion chunks
///        Ulysses+Ring by head groups, #428): band g's kv heads packed into one contiguous block
///        [B, L_j, kn, D] | [B, L_j, kn, Dv], rotated over the ring (RingRotation, and the fp32
///        dk|dv with it in the backward: RingGradRotation) while the band pipeline moves the
///        next band's seq→head and the last band's head→seq. Per head the same arithmetic in the
///        same step order as the unbanded ring, so the same bits. Host buffers.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "steps.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {
/// Whether some rank's bands share a kv head (a band boundary inside a GQA group, or kv heads
/// replicated over more bands than they have): the same on every rank (every rank's bands).
inline bool bands_share_kv_heads(const AttentionSpecs& specs, int G) {
  for (int r = 0; r < specs.query_heads.degree(); ++r)
    for (int g = 1; g < G; ++g) {
      const Band a = head_band(specs, r, g - 1, G), b = head_band(specs, r, g, G);
      if (a.query.size() > 0 && b.query.size() > 0 && b.kv.lo < a.kv.hi) return true;
    }
  return false;
}

/// Ring × bands (bands > 1, R > 1) with Progress::thread runs the band pipeline's exchanges on a
/// worker thread while the ring moves on the caller's: two communicators at once. Local, before
/// any data moves. @throws Error(invalid_shape) where either says it cannot be called from several
/// threads at once (MPI below MPI_THREAD_MULTIPLE).
template <class UC, class RC>
void check_band_ring_threads(const DistributedAttentionPlan& p, const UC& uc, const RC& rc, const char* call) {
  if constexpr (comm_traits<UC>::stream) return;
  if (p.options().bands == 1 || p.steps() == 1 || resolve_progress<UC>(p.options().progress) != Progress::thread) return;
  bool ok = true;
  if constexpr (has_allows_concurrent_threads<UC>::value) ok = ok && uc.allows_concurrent_threads();
  if constexpr (has_allows_concurrent_threads<RC>::value) ok = ok && rc.allows_concurrent_threads();
  if (!ok)
    fail(Errc::invalid_shape, std::string(call) + ": head bands over a ring with Progress::thread call the Ulysses group from a worker "
                                                  "thread while the ring moves on this one; MPI needs MPI_THREAD_MULTIPLE for that "
                                                  "(or give Progress::in_start)");
}

/// Band b's share of each ring rank's block (kv heads [b.kv.lo, b.kv.hi) of Hk): `whole`/Hk·kn bytes.
inline std::vector<std::size_t> band_ring_bytes(std::vector<std::size_t> whole, std::int64_t Hk, const Band& b) {
  for (std::size_t& n : whole) {
    if (n % static_cast<std::size_t>(Hk) != 0)
      fail(Errc::invalid_shape, "ring x bands: a kv block of " + std::to_string(n) + " bytes over " + std::to_string(Hk) + " kv heads");
    n = n / static_cast<std::size_t>(Hk) * static_cast<std::size_t>(b.kv.size());
  }
  return whole;
}

/// Copies band b's kv heads of this rank's k|v block `own` ([B, L, Hk, D] then [B, L, Hk, Dv])
/// into `dst` as [B, L, kn, D] then [B, L, kn, Dv] (b.kv nonempty).
inline void pack_band_kv(const DistributedAttentionPlan& p, const Band& b, const std::byte* own, std::byte* dst) {
  const auto eb = static_cast<std::size_t>(p.specs().q.elem_bytes);
  const std::size_t rows = static_cast<std::size_t>(p.batch() * p.tokens()), Hk = static_cast<std::size_t>(p.kv_heads());
  const std::size_t kn = static_cast<std::size_t>(b.kv.size()), lo = static_cast<std::size_t>(b.kv.lo);
  std::size_t from = 0, to = 0;  // elements: where the k (then v) part starts in `own` and in `dst`
  for (std::size_t d : {static_cast<std::size_t>(p.specs().q.head_dim), static_cast<std::size_t>(p.specs().v.head_dim)}) {
    for (std::size_t r = 0; r < rows; ++r) std::memcpy(dst + (to + r * kn * d) * eb, own + (from + (r * Hk + lo) * d) * eb, kn * d * eb);
    from += rows * Hk * d;
    to += rows * kn * d;
  }
}

/// Step s of band b over its packed block `block`: attention_step() narrowed to b (band_step()),
/// out and lse set first, k and v the block's ([B, L_kv, kn, D|Dv]).
inline AttentionStep band_ring_step(const DistributedAttentionPlan& p, const Band& b, int s, const std::byte* q_h, const std::byte* block,
                                    void* out, float* lse, std::int64_t* map) {
  const RingWork& w = p.work(s);
  AttentionStep a = attention_step(p, s, p.ring_plan().ring_rank(), q_h, block);
  a.out = out;
  a.lse = lse;
  a = band_step(b, a, map);
  const std::int64_t kn = b.kv.size(), D = a.head_dim, Dv = a.v_head_dim, eb = static_cast<std::int64_t>(a.elem_bytes);
  a.k = block + w.kv_begin * kn * D * eb;
  a.k_stride = {w.L_kv * kn * D, kn * D, D};
  a.v = block + (p.batch() * w.L_kv * kn * D + w.kv_begin * kn * Dv) * eb;
  a.v_stride = {w.L_kv * kn * Dv, kn * Dv, Dv};
  return a;
}

/// The ring of band b in the forward (band b's query heads nonempty): its k|v packed into kv[0],
/// rotated; per step with work the engine's attention into the zeroed partial (band heads), merged
/// into acc/lse over the band's heads in step order (as the unbanded ring merges every head).
template <class RC, class F>
void band_ring_forward(const DistributedAttentionPlan& p, RC& rc, const Band& b, const std::byte* q_h, const std::byte* own,
                       std::byte* const kv[2], float* acc, float* lse, std::byte* pout, float* plse, std::int64_t* map, F& attention) {
  const RingPlan& rp = p.ring_plan();
  const std::vector<std::size_t> bytes = band_ring_bytes(rp.block_bytes(), p.kv_heads(), b);
  const std::size_t kb = band_ring_bytes({rp.kv_buffer_bytes()}, p.kv_heads(), b)[0];
  pack_band_kv(p, b, own, kv[0]);
  RingRotation<RC> rot(rc, bytes, RingBuffers().kv(kv[0], kb, kv[1], kb), p.options().progress, rp.messages(), RingAccess::copy, rp.last_uses());
  const RingMergeShape ms{p.batch(), p.tokens(), p.query_heads(), p.specs().v.head_dim};
  const std::int64_t Hq = p.query_heads(), Dv = ms.Dv, ql = b.query.lo, qn = b.query.size();
  const std::size_t eb = p.specs().q.elem_bytes;
  for (int s = 0; s < p.steps(); ++s) {
    rot.start(s);
    run_then(
        [&] {
          const RingWork& w = p.work(s);
          if (w.empty()) return;
          for (std::int64_t r = 0; r < p.batch() * w.q_len; ++r)  // (the band's heads of the partial [B, q_len, Hq, Dv])
            std::memset(pout + static_cast<std::size_t>((r * Hq + ql) * Dv) * eb, 0, static_cast<std::size_t>(qn * Dv) * eb);
          for (std::int64_t bb = 0; bb < p.batch(); ++bb)
            for (std::int64_t h = ql; h < b.query.hi; ++h)
              for (std::int64_t i = 0; i < w.q_len; ++i) plse[(bb * Hq + h) * w.q_len + i] = -INFINITY;
          attention(static_cast<const AttentionStep&>(band_ring_step(p, b, s, q_h, rot.block(s), pout, plse, map)));
          ring_merge_block(ms, acc, lse, pout, p.element_type(), plse, w.q_begin, w.q_len, LseBase::natural, b.query);
        },
        [&] { rot.finish(s); });
  }
}

}  // namespace detail

ULYSSES_NAMESPACE_END
