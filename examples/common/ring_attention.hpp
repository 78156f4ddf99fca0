// SPDX-License-Identifier: Apache-2.0
// The whole attention through Ulysses × Ring, shared by the demo (ulysses_attention --ring R) and
// the tests (test_ring_attention.cpp in-process, test_ring_mpi.cpp under mpiexec,
// test_distributed_attention.cpp): a double-precision single-rank attention (forward and
// backward, the reference), a small fp32 "engine" attention of one ring step and its backward
// (the kernels an engine would hand ulysses::distributed_attention(): step_attention(),
// step_backward()), and one rank of the hybrid over any pair of communicators
// (ring_rank_attention(): a DistributedAttentionPlan from the case's RingPlan, then
// distributed_attention() and distributed_attention_backward(), which do the configuration
// check, the exchanges, the ring and the merge); run_ring_attention() runs P = U·R of them on
// threads, a LocalGroup per Ulysses group and per ring.
#pragma once

#include <ulysses/attention/distributed.hpp>
#include <ulysses/ring/plan.hpp>
#include <ulysses/ulysses.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

namespace ulysses_ring_demo {

/// A hybrid attention case: U × R ranks, shapes, causal or not (zigzag when causal unless told).
/// With `cu_seqlens` (packed documents, last entry S) the attention is masked per document and the
/// ring cuts every document into 2R chunks (RingPartition(Documents, U, R)); with `allgather` the
/// U·R ranks form one all-gather-KV group (DistributedAttentionPlan::allgather()) over `allgather_split`.
struct RingCase {
  int U = 2, R = 2;
  std::int64_t B = 1, S = 16, H = 4, Hkv = 4, D = 8, Dv = 8;
  bool causal = true;
  ulysses::RingLayout layout = ulysses::RingLayout::zigzag;
  std::vector<std::int64_t> cu_seqlens;  ///< packed documents (empty: one sequence)
  bool allgather = false;                ///< all-gather KV over P = U·R ranks instead of U × R
  /// U × AG: Ulysses over U, then k|v all-gathered over the R ranks of the ring group instead of
  /// the rotation (DistributedAttentionPlan::allgather(const RingPlan&)); the partition is the ring's
  bool ulysses_allgather = false;
  ulysses::DocumentSplit allgather_split = ulysses::DocumentSplit::zigzag;  ///< the all-gather group's partition of the documents
  /// Head bands (DistributedAttentionOptions::bands): > 1 runs the layer over that many bands of
  /// each rank's query heads (R = 1: through the Ulysses-only overloads; R > 1: bands × ring steps).
  int bands = 1;
  /// q and k rotated by RoPE (half rotation, theta 10000, position = the global token) in the
  /// seq→head exchange (distributed_attention()'s RowTransforms), dq and dk by its inverse in the
  /// backward's head→seq: the results of the unrotated call on rope_globals(c, g).
  bool rope = false;
  double rope_theta = 10000.0;  ///< RoPE's base
  /// The memory order of every rank's seq-sharded tensors in the calls (DistributedAttentionOptions::
  /// seq_format); the results are converted back to bshd (RingRankResult stays bshd).
  ulysses::Format seq_format = ulysses::Format::bshd;
  /// Called with every forward step before the kernel (world rank w; tests look at the mask).
  std::function<void(int w, const ulysses::AttentionStep&)> on_step;
  /// The document of global token t (0 without documents).
  std::int64_t document(std::int64_t t) const {
    std::int64_t d = 0;
    for (std::size_t i = 1; i < cu_seqlens.size(); ++i)
      if (t >= cu_seqlens[i]) d = static_cast<std::int64_t>(i);
    return d;
  }
  /// Whether query token i attends key token j: same document, and j <= i when causal.
  bool attends(std::int64_t i, std::int64_t j) const { return document(i) == document(j) && (!causal || j <= i); }
};

/// The world's seq-sharded partition of case c (w = j·U + u; all-gather: the P = U·R ranks').
inline ulysses::SeqPartition world_partition(const RingCase& c) {
  using namespace ulysses;
  if (c.allgather)
    return c.cu_seqlens.empty() ? (c.causal ? SeqPartition::zigzag(c.S, c.U * c.R) : SeqPartition::balanced(c.S, c.U * c.R))
                                : documents_partition(Documents(c.cu_seqlens, c.S), c.U * c.R, c.allgather_split);
  if (!c.cu_seqlens.empty()) return RingPartition(Documents(c.cu_seqlens, c.S), c.U, c.R).seq_partition();
  return RingPartition(c.S, c.U, c.R, c.layout).seq_partition();
}

/// A deterministic value in [-1, 1) for element i of tensor t.
inline float rand_value(int t, std::int64_t i) {
  std::uint64_t x = static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(t + 1) * 0xD1B54A32D192ED03ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<float>(static_cast<double>(x >> 40) / static_cast<double>(1ull << 23) - 1.0);
}

/// Global tensors of a case (bshd, contiguous): q [B,S,H,D], k [B,S,Hkv,D], v [B,S,Hkv,Dv], dout [B,S,H,Dv].
struct RingGlobals {
  std::vector<float> q, k, v, dout;
  explicit RingGlobals(const RingCase& c) {
    auto fill = [](std::vector<float>& x, std::int64_t n, int t) {
      x.resize(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) x[static_cast<std::size_t>(i)] = rand_value(t, i);
    };
    fill(q, c.B * c.S * c.H * c.D, 0);
    fill(k, c.B * c.S * c.Hkv * c.D, 1);
    fill(v, c.B * c.S * c.Hkv * c.Dv, 2);
    fill(dout, c.B * c.S * c.H * c.Dv, 3);
  }
};

/// The RoPE of RingCase::rope: half rotation over all D, positions [0, S), base rope_theta.
inline ulysses::Rope case_rope(const RingCase& c) { return ulysses::Rope(c.D, c.S, c.rope_theta, 0, ulysses::RopeStyle::half); }

/// Every [b, s, h] row of the global tensor x [B, S, heads, D] rotated by case_rope(c) (by its
/// inverse: RoPE's backward of dq and dk) at its global token s, in double, rounded once to T
/// (float: a pass of its own, what RingCase::rope fuses into the exchanges; double: unrounded).
template <class T>
void rope_rows(const RingCase& c, std::vector<T>& x, std::int64_t heads, bool inverse) {
  const ulysses::Rope r = inverse ? case_rope(c).inverse() : case_rope(c);
  std::vector<double> row(static_cast<std::size_t>(c.D));
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t s = 0; s < c.S; ++s)
      for (std::int64_t h = 0; h < heads; ++h) {
        T* p = x.data() + ((b * c.S + s) * heads + h) * c.D;
        for (std::int64_t d = 0; d < c.D; ++d) row[static_cast<std::size_t>(d)] = p[d];
        r(ulysses::RowCoord{b, s, h}, row.data(), c.D);
        for (std::int64_t d = 0; d < c.D; ++d) p[d] = static_cast<T>(row[static_cast<std::size_t>(d)]);
      }
}
/// The global tensors of g with q and k rotated by rope_rows().
inline RingGlobals rope_globals(const RingCase& c, RingGlobals g) {
  rope_rows(c, g.q, c.H, false);
  rope_rows(c, g.k, c.Hkv, false);
  return g;
}

/// The single-rank double-precision reference: out [B,S,H,Dv], lse [B,H,S], and (with
/// `backward`) the gradients dq [B,S,H,D], dk [B,S,Hkv,D], dv [B,S,Hkv,Dv] of sum(out · dout).
/// The B·Hkv (batch, kv head) jobs run on the machine's threads; each writes only its own kv
/// head's dk, dv and its query heads' rows, in a fixed order: the same bits on any thread count.
struct RingReference {
  std::vector<double> out, lse, dq, dk, dv;
  RingReference(const RingCase& c, const RingGlobals& g, bool backward = true) {
    const std::int64_t B = c.B, S = c.S, H = c.H, Hk = c.Hkv, D = c.D, Dv = c.Dv, G = H / Hk;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    auto at = [](std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d, std::int64_t S_, std::int64_t H_, std::int64_t D_) {
      return static_cast<std::size_t>(((b * S_ + s) * H_ + h) * D_ + d);
    };
    out.assign(static_cast<std::size_t>(B * S * H * Dv), 0.0);
    lse.assign(static_cast<std::size_t>(B * H * S), 0.0);
    if (backward) {
      dq.assign(static_cast<std::size_t>(B * S * H * D), 0.0);
      dk.assign(static_cast<std::size_t>(B * S * Hk * D), 0.0);
      dv.assign(static_cast<std::size_t>(B * S * Hk * Dv), 0.0);
    }
    auto job = [&](std::int64_t b, std::int64_t hk) {
      std::vector<double> p(static_cast<std::size_t>(S));
      for (std::int64_t h = hk * G; h < (hk + 1) * G; ++h)
        for (std::int64_t i = 0; i < S; ++i) {
          const std::int64_t n = c.causal ? i + 1 : S;
          double m = -INFINITY;
          for (std::int64_t j = 0; j < n; ++j) {
            if (!c.attends(i, j)) {
              p[static_cast<std::size_t>(j)] = -INFINITY;
              continue;
            }
            double s = 0;
            for (std::int64_t d = 0; d < D; ++d) s += double(g.q[at(b, i, h, d, S, H, D)]) * double(g.k[at(b, j, hk, d, S, Hk, D)]);
            p[static_cast<std::size_t>(j)] = s * scale;
            m = std::max(m, s * scale);
          }
          double z = 0;
          for (std::int64_t j = 0; j < n; ++j) z += std::exp(p[static_cast<std::size_t>(j)] - m);
          const double l = m + std::log(z);
          lse[static_cast<std::size_t>((b * H + h) * S + i)] = l;
          for (std::int64_t j = 0; j < n; ++j) p[static_cast<std::size_t>(j)] = std::exp(p[static_cast<std::size_t>(j)] - l);
          for (std::int64_t j = 0; j < n; ++j)
            for (std::int64_t d = 0; d < Dv; ++d)
              out[at(b, i, h, d, S, H, Dv)] += p[static_cast<std::size_t>(j)] * double(g.v[at(b, j, hk, d, S, Hk, Dv)]);
          if (!backward) continue;
          double Di = 0;  // rowsum(dout · out)
          for (std::int64_t d = 0; d < Dv; ++d) Di += double(g.dout[at(b, i, h, d, S, H, Dv)]) * out[at(b, i, h, d, S, H, Dv)];
          for (std::int64_t j = 0; j < n; ++j) {
            const double pj = p[static_cast<std::size_t>(j)];
            if (pj == 0) continue;  // masked (exp(-inf) = 0)
            double dp = 0;
            for (std::int64_t d = 0; d < Dv; ++d) {
              dp += double(g.dout[at(b, i, h, d, S, H, Dv)]) * double(g.v[at(b, j, hk, d, S, Hk, Dv)]);
              dv[at(b, j, hk, d, S, Hk, Dv)] += pj * double(g.dout[at(b, i, h, d, S, H, Dv)]);
            }
            const double ds = pj * (dp - Di) * scale;
            for (std::int64_t d = 0; d < D; ++d) {
              dq[at(b, i, h, d, S, H, D)] += ds * double(g.k[at(b, j, hk, d, S, Hk, D)]);
              dk[at(b, j, hk, d, S, Hk, D)] += ds * double(g.q[at(b, i, h, d, S, H, D)]);
            }
          }
        }
    };
    const std::int64_t jobs = B * Hk;
    const int nt = static_cast<int>(std::min<std::int64_t>(jobs, std::max(1u, std::thread::hardware_concurrency())));
    std::vector<std::thread> th;
    for (int t = 0; t < nt; ++t)
      th.emplace_back([&, t] {
        for (std::int64_t j = t; j < jobs; j += nt) job(j / Hk, j % Hk);
      });
    for (auto& t : th) t.join();
  }
};

/// The reference of case c: RingReference(c, g), or with RingCase::rope that of rope_globals(c, g)
/// with its dq and dk rotated back by the inverse (in double, unrounded): the gradients of the
/// inputs before RoPE.
inline RingReference case_reference(const RingCase& c, const RingGlobals& g, bool backward) {
  if (!c.rope) return RingReference(c, g, backward);
  RingReference r(c, rope_globals(c, g), backward);
  if (backward) {
    rope_rows(c, r.dq, c.H, true);
    rope_rows(c, r.dk, c.Hkv, true);
  }
  return r;
}

/// The engine's fp32 attention of one ring step (the callable of distributed_attention()): the
/// step's q [B, q_len, q_count, D], k [B, kv_len, kv_count, D], v [B, kv_len, kv_count, Dv] views
/// (attention/step.hpp) → its partial out [B, q_len, q_count, Dv] and lse [B, q_count, q_len]
/// (pre-filled with 0 and −inf by the library: a row that sees no key is left so).
inline void step_attention(const ulysses::AttentionStep& st) {
  const std::int64_t B = st.batch, D = st.head_dim, Dv = st.v_head_dim, Hq = st.heads.q_count;
  const float scale = st.softmax_scale;
  const auto* q = static_cast<const float*>(st.q);
  const auto* k = static_cast<const float*>(st.k);
  const auto* v = static_cast<const float*>(st.v);
  auto* ob = static_cast<float*>(st.out);
  const ulysses::AttentionStrides qs = st.q_stride, ks = st.k_stride, vs = st.v_stride, os = st.out_stride;
  std::vector<float> s(static_cast<std::size_t>(st.kv_len));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h)
      for (std::int64_t ii = 0; ii < st.q_len; ++ii) {
        const std::int64_t hk = st.heads.kv_of(h);
        float m = -INFINITY;
        for (std::int64_t kk = 0; kk < st.kv_len; ++kk) {
          if (!st.attends(ii, kk)) {  // causal, or a packed document's blocks
            s[static_cast<std::size_t>(kk)] = -INFINITY;
            continue;
          }
          float a = 0;
          for (std::int64_t d = 0; d < D; ++d) a += q[b * qs.batch + ii * qs.row + h * qs.head + d] * k[b * ks.batch + kk * ks.row + hk * ks.head + d];
          s[static_cast<std::size_t>(kk)] = a * scale;
          m = std::max(m, a * scale);
        }
        if (m == -INFINITY) continue;
        float z = 0;
        for (std::int64_t kk = 0; kk < st.kv_len; ++kk) z += std::exp(s[static_cast<std::size_t>(kk)] - m);
        const float l = m + std::log(z);
        st.lse[b * st.lse_stride.batch + h * st.lse_stride.head + ii] = l;
        for (std::int64_t kk = 0; kk < st.kv_len; ++kk) {
          const float p = std::exp(s[static_cast<std::size_t>(kk)] - l);
          for (std::int64_t d = 0; d < Dv; ++d) ob[b * os.batch + ii * os.row + h * os.head + d] += p * v[b * vs.batch + kk * vs.row + hk * vs.head + d];
        }
      }
}

/// The engine's fp32 backward of one ring step (the callable of distributed_attention_backward();
/// FlashAttention-2's, with the merged lse and Dsum = rowsum(do · o) of the merged o): adds the
/// step's dq [B, q_len, q_count, D], dk [B, kv_len, kv_count, D] and dv [B, kv_len, kv_count, Dv]
/// into the library's zeroed fp32 partials.
inline void step_backward(const ulysses::AttentionGradStep& g) {
  const ulysses::AttentionStep& st = g.fwd;
  const std::int64_t B = st.batch, D = st.head_dim, Dv = st.v_head_dim, Hq = st.heads.q_count;
  const float scale = st.softmax_scale;
  const auto* q = static_cast<const float*>(st.q);
  const auto* k = static_cast<const float*>(st.k);
  const auto* v = static_cast<const float*>(st.v);
  const auto* o = static_cast<const float*>(g.o);
  const auto* dout = static_cast<const float*>(g.dout);
  const ulysses::AttentionStrides qs = st.q_stride, ks = st.k_stride, vs = st.v_stride, os = g.o_stride, qg = g.dq_stride, kg = g.dk_stride,
                                  vg = g.dv_stride;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h)
      for (std::int64_t ii = 0; ii < st.q_len; ++ii) {
        const std::int64_t hk = st.heads.kv_of(h);
        const float l = g.lse[b * g.lse_stride.batch + h * g.lse_stride.head + ii];
        float Di = 0;  // rowsum(dout · out)
        for (std::int64_t d = 0; d < Dv; ++d) Di += dout[b * os.batch + ii * os.row + h * os.head + d] * o[b * os.batch + ii * os.row + h * os.head + d];
        for (std::int64_t kk = 0; kk < st.kv_len; ++kk) {
          if (!st.attends(ii, kk)) continue;
          float a = 0;
          for (std::int64_t d = 0; d < D; ++d) a += q[b * qs.batch + ii * qs.row + h * qs.head + d] * k[b * ks.batch + kk * ks.row + hk * ks.head + d];
          const float p = std::exp(a * scale - l);
          float dp = 0;
          for (std::int64_t d = 0; d < Dv; ++d) {
            const float go = dout[b * os.batch + ii * os.row + h * os.head + d];
            dp += go * v[b * vs.batch + kk * vs.row + hk * vs.head + d];
            g.dv[b * vg.batch + kk * vg.row + hk * vg.head + d] += p * go;
          }
          const float ds = p * (dp - Di) * scale;
          for (std::int64_t d = 0; d < D; ++d) {
            g.dq[b * qg.batch + ii * qg.row + h * qg.head + d] += ds * k[b * ks.batch + kk * ks.row + hk * ks.head + d];
            g.dk[b * kg.batch + kk * kg.row + hk * kg.head + d] += ds * q[b * qs.batch + ii * qs.row + h * qs.head + d];
          }
        }
      }
}

/// One world rank's results: seq-sharded out [B, S_w, H, Dv], and with the backward dq, dk, dv
/// seq-sharded ([B, S_w, H|Hkv, D|Dv]).
struct RingRankResult {
  std::vector<float> out, dq, dk, dv;
  std::vector<float> lse;             ///< the merged LSE, [B, Hq, L] (head-sharded, ring-local tokens)
  std::vector<std::int64_t> tokens;   ///< the global token of each ring-local token
  std::int64_t h0 = 0, Hq = 0, L = 0;  ///< first query head, query heads, ring-local tokens
};

/// World rank w's seq shard [B, S_w, Hx, Dx] of the global x [B, S, Hx, Dx].
inline std::vector<float> ring_shard(const RingCase& c, const ulysses::SeqPartition& world, int w, const std::vector<float>& x, std::int64_t Hx,
                                     std::int64_t Dx) {
  const std::int64_t Sw = world.local_length(w);
  std::vector<float> s(static_cast<std::size_t>(c.B * Sw * Hx * Dx));
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t i = 0; i < Sw; ++i) {
      const std::int64_t t = world.global_token(w, i);
      std::memcpy(&s[static_cast<std::size_t>((b * Sw + i) * Hx * Dx)], &x[static_cast<std::size_t>((b * c.S + t) * Hx * Dx)],
                  static_cast<std::size_t>(Hx * Dx) * sizeof(float));
    }
  return s;
}

/// A seq shard [B, Sw, Hx, Dx] bshd in case c's seq_format (`to_bshd`: back from it).
inline std::vector<float> reorder(const RingCase& c, const std::vector<float>& x, std::int64_t Sw, std::int64_t Hx, std::int64_t Dx, bool to_bshd) {
  if (c.seq_format == ulysses::Format::bshd) return x;
  const ulysses::Layout f = ulysses::Layout::dense(c.seq_format, c.B, Sw, Hx, Dx), b = ulysses::Layout::dense(ulysses::Format::bshd, c.B, Sw, Hx, Dx);
  std::vector<float> y(x.size());
  for (std::int64_t bi = 0; bi < c.B; ++bi)
    for (std::int64_t s = 0; s < Sw; ++s)
      for (std::int64_t h = 0; h < Hx; ++h)
        for (std::int64_t d = 0; d < Dx; ++d) {
          const auto i = static_cast<std::size_t>(b.offset(bi, s, h, d)), j = static_cast<std::size_t>(f.offset(bi, s, h, d));
          if (to_bshd) y[i] = x[j];
          else y[j] = x[i];
        }
  return y;
}

/// One world rank w (0 .. U·R−1, RingPartition's numbering: ring rank w / U, Ulysses rank w % U)
/// of the whole hybrid attention of case c through ulysses::distributed_attention() (and with
/// `backward` distributed_attention_backward()), step_attention() / step_backward() the engine's
/// kernels. `uc` is the rank's Ulysses group (U ranks, rank = its Ulysses rank), `rc` its ring (R
/// ranks, rank = its ring rank): LocalGroup::Comm, MpiComm, or any communicator with allgather()
/// and exchange_messages(). `progress` and `access` are DistributedAttentionOptions' (access
/// zero_copy: a ring whose ranks map each other's memory, as LocalGroup::Comm). Collective over
/// both. @throws ulysses::Error from the plans, the check, the exchanges, the ring.
template <class UlyssesComm, class RingComm>
RingRankResult ring_rank_attention(const RingCase& c, const RingGlobals& g, int w, UlyssesComm& uc, RingComm& rc, bool backward,
                                   ulysses::RingProgress progress = ulysses::RingProgress::automatic,
                                   ulysses::RingAccess access = ulysses::RingAccess::copy) {
  using namespace ulysses;
  const std::optional<Documents> docs = c.cu_seqlens.empty() ? std::nullopt : std::optional<Documents>(Documents(c.cu_seqlens, c.S));
  const SeqPartition world = world_partition(c);
  const AttentionShape shape{c.H, c.Hkv, c.D, c.Dv};
  const int U = c.allgather ? 1 : c.U;  // all-gather KV: every head on every rank
  const HeadPolicy policy = c.H % U == 0 && (c.Hkv % U == 0 || U % c.Hkv == 0) ? HeadPolicy::even : HeadPolicy::balanced;
  AttentionSpecs specs = attention_specs<float>(U, shape, policy);
  specs.q.with_row_transforms(c.rope);  // (rows of q and k through the transform)
  specs.k.with_row_transforms(c.rope);
  const Rope rope = case_rope(c), inverse = rope.inverse();
  RowTransforms tx, tx_back;
  if (c.rope) {
    tx.on_pack(0, rope).on_pack(1, rope);
    tx_back.on_unpack(0, inverse).on_unpack(1, inverse);
  }
  DistributedAttentionOptions opt;
  opt.progress = progress;
  opt.ring_access = access;
  opt.bands = c.bands;
  opt.seq_format = c.seq_format;
  const bool plain = c.allgather || (c.bands > 1 && c.R == 1);  // the Ulysses-only overloads
  std::optional<DistributedAttentionPlan> made;
  std::optional<RingPartition> part;
  int u = 0, j = 0;
  if (c.allgather) {
    made.emplace(DistributedAttentionPlan::allgather({c.U * c.R, w}, c.B, world, specs, c.causal, docs ? &*docs : nullptr, opt));
  } else if (c.bands > 1 && c.R == 1) {  // plain Ulysses: w is the Ulysses rank
    if (docs) made.emplace(Group{c.U, w}, c.B, world, specs, c.causal, *docs, opt);
    else made.emplace(Group{c.U, w}, c.B, world, specs, c.causal, opt);
    u = w;
  } else {
    part.emplace(docs ? RingPartition(*docs, c.U, c.R) : RingPartition(c.S, c.U, c.R, c.layout));
    const RingPlan rp(*part, Mesh(c.U * c.R, c.U, c.R, c.U * c.R), w, c.B, specs, c.causal);  // one block, ulysses_inner: w = j·U + u
    if (c.ulysses_allgather) made.emplace(DistributedAttentionPlan::allgather(rp, opt));
    else made.emplace(rp, opt);
    u = rp.ulysses_rank(), j = rp.ring_rank();
  }
  const DistributedAttentionPlan& plan = *made;
  const std::int64_t Sw = world.local_length(w);
  auto in = [&](const std::vector<float>& x, std::int64_t Hx, std::int64_t Dx) { return reorder(c, ring_shard(c, world, w, x, Hx, Dx), Sw, Hx, Dx, false); };
  auto back = [&](std::vector<float>& x, std::int64_t Hx, std::int64_t Dx) { x = reorder(c, x, Sw, Hx, Dx, true); };
  const std::vector<float> q = in(g.q, c.H, c.D), k = in(g.k, c.Hkv, c.D), v = in(g.v, c.Hkv, c.Dv);
  std::vector<std::byte> saved(plan.saved_bytes()), ws(std::max(plan.forward_workspace_bytes(), plan.backward_workspace_bytes()));
  RingRankResult rr;
  rr.out.resize(static_cast<std::size_t>(c.B * world.local_length(w) * c.H * c.Dv));
  const auto kernel = [&](const AttentionStep& st) {
    if (c.on_step) c.on_step(w, st);
    step_attention(st);
  };
  if (plain)
    distributed_attention(plan, uc, QkvIn().q(q).k(k).v(v), ByteSpan(rr.out), kernel, saved, ws, tx);
  else
    distributed_attention(plan, uc, rc, QkvIn().q(q).k(k).v(v), ByteSpan(rr.out), kernel, saved, ws, tx);
  back(rr.out, c.H, c.Dv);
  const float* lse = plan.saved_lse(saved);
  rr.lse.assign(lse, lse + c.B * plan.query_heads() * plan.tokens());
  rr.h0 = specs.query_heads.begin(u);
  rr.Hq = plan.query_heads();
  rr.L = plan.tokens();
  for (std::int64_t i = 0; i < rr.L; ++i) rr.tokens.push_back(c.allgather ? world.global_token(w, i) : part ? part->ring_token(j, i) : i);
  if (!backward) return rr;
  const std::vector<float> dos = in(g.dout, c.H, c.Dv);
  rr.dq.assign(q.size(), 0.0f);
  rr.dk.assign(k.size(), 0.0f);
  rr.dv.assign(v.size(), 0.0f);
  if (plain)
    distributed_attention_backward(plan, uc, ConstByteSpan(dos), QkvGradOut().dq(rr.dq).dk(rr.dk).dv(rr.dv), step_backward, saved, ws, tx_back);
  else
    distributed_attention_backward(plan, uc, rc, ConstByteSpan(dos), QkvGradOut().dq(rr.dq).dk(rr.dk).dv(rr.dv), step_backward, saved, ws,
                                   tx_back);
  back(rr.dq, c.H, c.D);
  back(rr.dk, c.Hkv, c.D);
  back(rr.dv, c.Hkv, c.Dv);
  return rr;
}

/// Runs the whole hybrid attention of case c on P = U·R threads; returns every world rank's result.
/// @throws what a rank threw (the first).
inline std::vector<RingRankResult> run_ring_attention(const RingCase& c, const RingGlobals& g, bool backward,
                                                      ulysses::RingProgress progress = ulysses::RingProgress::automatic,
                                                      ulysses::RingAccess access = ulysses::RingAccess::copy) {
  using namespace ulysses;
  const int P = c.U * c.R;
  // All-gather KV: one group of P ranks (and a ring of one each, unused); else a Ulysses group per
  // ring rank and a ring per Ulysses rank (w = j·U + u).
  const int U = c.allgather ? P : c.U, R = c.allgather ? 1 : c.R;
  std::vector<std::unique_ptr<LocalGroup>> ug, rg;
  for (int j = 0; j < R; ++j) ug.push_back(std::make_unique<LocalGroup>(U, std::chrono::seconds(60)));
  for (int u = 0; u < U; ++u) rg.push_back(std::make_unique<LocalGroup>(R, std::chrono::seconds(60)));
  std::vector<RingRankResult> res(static_cast<std::size_t>(P));
  std::vector<std::exception_ptr> err(static_cast<std::size_t>(P));
  auto rank_main = [&](int w) {
    LocalGroup::Comm uc = ug[static_cast<std::size_t>(w / U)]->comm(w % U);
    LocalGroup::Comm rc = rg[static_cast<std::size_t>(w % U)]->comm(w / U);
    res[static_cast<std::size_t>(w)] = ring_rank_attention(c, g, w, uc, rc, backward, progress, access);
  };
  std::vector<std::thread> th;
  for (int w = 0; w < P; ++w)
    th.emplace_back([&, w] {
      try {
        rank_main(w);
      } catch (...) {
        err[static_cast<std::size_t>(w)] = std::current_exception();
        ug[static_cast<std::size_t>(w / U)]->abort();
        rg[static_cast<std::size_t>(w % U)]->abort();
      }
    });
  for (auto& t : th) t.join();
  for (auto& e : err)
    if (e) std::rethrow_exception(e);
  return res;
}

/// The largest |got − want| of world rank w's seq-sharded tensor x [B, S_w, Hx, Dx] against the
/// global reference ref [B, S, Hx, Dx] (NaN counts as infinite).
inline double rank_error(const RingCase& c, const std::vector<double>& ref, std::int64_t Hx, std::int64_t Dx, int w,
                         const std::vector<float>& x) {
  const ulysses::SeqPartition world = world_partition(c);
  const std::int64_t Sw = world.local_length(w);
  double e = 0;
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t i = 0; i < Sw; ++i)
      for (std::int64_t r = 0; r < Hx * Dx; ++r) {
        const double want = ref[static_cast<std::size_t>((b * c.S + world.global_token(w, i)) * Hx * Dx + r)];
        const double d = std::abs(double(x[static_cast<std::size_t>((b * Sw + i) * Hx * Dx + r)]) - want);
        e = std::isnan(d) ? INFINITY : std::max(e, d);
      }
  return e;
}

/// Max abs errors of one rank's results against the reference (0 for what was not computed).
struct RingErrors {
  double out = 0, lse = 0, dq = 0, dk = 0, dv = 0;
  /// The field-wise max with another rank's.
  void max_with(const RingErrors& o) {
    out = std::max(out, o.out), lse = std::max(lse, o.lse), dq = std::max(dq, o.dq), dk = std::max(dk, o.dk), dv = std::max(dv, o.dv);
  }
  /// The largest of the fields.
  double max() const { return std::max({out, lse, dq, dk, dv}); }
};

/// World rank w's errors: out, the merged LSE (head-sharded, ring-local tokens), and, when rr has
/// them (the backward), dq, dk, dv.
inline RingErrors rank_errors(const RingCase& c, const RingReference& ref, int w, const RingRankResult& rr) {
  RingErrors e;
  e.out = rank_error(c, ref.out, c.H, c.Dv, w, rr.out);
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t h = 0; h < rr.Hq; ++h)
      for (std::int64_t i = 0; i < rr.L; ++i) {
        const double want = ref.lse[static_cast<std::size_t>((b * c.H + rr.h0 + h) * c.S + rr.tokens[static_cast<std::size_t>(i)])];
        const double d = std::abs(double(rr.lse[static_cast<std::size_t>((b * rr.Hq + h) * rr.L + i)]) - want);
        e.lse = std::isnan(d) ? INFINITY : std::max(e.lse, d);
      }
  if (rr.dq.empty() || ref.dq.empty()) return e;
  e.dq = rank_error(c, ref.dq, c.H, c.D, w, rr.dq);
  e.dk = rank_error(c, ref.dk, c.Hkv, c.D, w, rr.dk);
  e.dv = rank_error(c, ref.dv, c.Hkv, c.Dv, w, rr.dv);
  return e;
}

/// The field-wise max of every world rank's errors (res: run_ring_attention()'s results).
inline RingErrors max_errors(const RingCase& c, const RingReference& ref, const std::vector<RingRankResult>& res) {
  RingErrors e;
  for (std::size_t w = 0; w < res.size(); ++w) e.max_with(rank_errors(c, ref, static_cast<int>(w), res[w]));
  return e;
}

}  // namespace ulysses_ring_demo
