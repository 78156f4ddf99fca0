// SPDX-License-Identifier: Apache-2.0
// The whole attention through Ulysses × Ring, shared by the demo (ulysses_attention --ring R) and
// the tests (test_ring_attention.cpp in-process, test_ring_mpi.cpp under mpiexec): a
// double-precision single-rank attention (forward and backward, the reference), a small fp32
// "engine" attention of one ring step (the kernel an engine would run on RingWork), and one rank of
// the hybrid over any pair of communicators (ring_rank_attention(): the configuration check,
// seq→head inside the ring group, R ring steps through RingRotation / RingGradRotation, the LSE
// merge in step order, head→seq, and the summed inverse in the backward); run_ring_attention()
// runs P = U·R of them on threads, a LocalGroup per Ulysses group and per ring.
#pragma once

#include <ulysses/ring/agreement.hpp>
#include <ulysses/ring/merge.hpp>
#include <ulysses/ring/plan.hpp>
#include <ulysses/ring/rotation.hpp>
#include <ulysses/ulysses.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <thread>
#include <vector>

namespace ulysses_ring_demo {

/// A hybrid attention case: U × R ranks, shapes, causal or not (zigzag when causal unless told).
struct RingCase {
  int U = 2, R = 2;
  std::int64_t B = 1, S = 16, H = 4, Hkv = 4, D = 8, Dv = 8;
  bool causal = true;
  ulysses::RingLayout layout = ulysses::RingLayout::zigzag;
};

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

/// The shapes of one rank's head-sharded tensors: Lq query tokens, Hq query heads, Hk kv heads,
/// and the local kv head of each local query head.
struct RankHeads {
  std::int64_t Hq = 0, Hk = 0;
  std::vector<std::int64_t> kv_of;  ///< local kv head of local query head h
};

/// The engine's fp32 attention of one ring step: q [B, Lq, Hq, D] rows of `w`, kv block
/// (k [B, Lkv, Hk, D] then v [B, Lkv, Hk, Dv]) rows of `w` with its mask → out_block [B, q_len, Hq, Dv]
/// and lse_block [B, Hq, q_len] (−inf where a row sees no key).
inline void step_attention(const RingCase& c, const RankHeads& rh, const ulysses::RingWork& w, const float* q, const float* k, const float* v,
                           std::vector<float>& ob, std::vector<float>& lb) {
  const std::int64_t B = c.B, D = c.D, Dv = c.Dv, Hq = rh.Hq, Hk = rh.Hk;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  ob.assign(static_cast<std::size_t>(B * w.q_len * Hq * Dv), 0.0f);
  lb.assign(static_cast<std::size_t>(B * Hq * w.q_len), -INFINITY);
  std::vector<float> s(static_cast<std::size_t>(w.kv_len));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h)
      for (std::int64_t ii = 0; ii < w.q_len; ++ii) {
        const std::int64_t i = w.q_begin + ii, hk = rh.kv_of[static_cast<std::size_t>(h)];
        float m = -INFINITY;
        for (std::int64_t kk = 0; kk < w.kv_len; ++kk) {
          const std::int64_t j = w.kv_begin + kk;
          if (!w.attends(i, j)) {
            s[static_cast<std::size_t>(kk)] = -INFINITY;
            continue;
          }
          float a = 0;
          for (std::int64_t d = 0; d < D; ++d) a += q[((b * w.L_q + i) * Hq + h) * D + d] * k[((b * w.L_kv + j) * Hk + hk) * D + d];
          s[static_cast<std::size_t>(kk)] = a * scale;
          m = std::max(m, a * scale);
        }
        if (m == -INFINITY) continue;
        float z = 0;
        for (std::int64_t kk = 0; kk < w.kv_len; ++kk) z += std::exp(s[static_cast<std::size_t>(kk)] - m);
        const float l = m + std::log(z);
        lb[static_cast<std::size_t>((b * Hq + h) * w.q_len + ii)] = l;
        for (std::int64_t kk = 0; kk < w.kv_len; ++kk) {
          const float p = std::exp(s[static_cast<std::size_t>(kk)] - l);
          const std::int64_t j = w.kv_begin + kk;
          for (std::int64_t d = 0; d < Dv; ++d)
            ob[static_cast<std::size_t>(((b * w.q_len + ii) * Hq + h) * Dv + d)] += p * v[((b * w.L_kv + j) * Hk + hk) * Dv + d];
        }
      }
}

/// The engine's fp32 backward of one ring step (FlashAttention-2's, with the final lse and
/// Dsum = rowsum(dout · out)): adds into dq [B, Lq, Hq, D]; writes the block's contributions dk
/// [B, Lkv, Hk, D] and dv [B, Lkv, Hk, Dv] (zeroed first) to dkv (dk then dv).
inline void step_backward(const RingCase& c, const RankHeads& rh, const ulysses::RingWork& w, const float* q, const float* k, const float* v,
                          const float* dout, const float* lse, const float* Dsum, float* dq, std::vector<float>& dkv) {
  const std::int64_t B = c.B, D = c.D, Dv = c.Dv, Hq = rh.Hq, Hk = rh.Hk;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const std::int64_t nk = B * w.L_kv * Hk * D;
  dkv.assign(static_cast<std::size_t>(nk + B * w.L_kv * Hk * Dv), 0.0f);
  float* dk = dkv.data();
  float* dv = dkv.data() + nk;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h)
      for (std::int64_t i = w.q_begin; i < w.q_begin + w.q_len; ++i) {
        const std::int64_t hk = rh.kv_of[static_cast<std::size_t>(h)];
        const float l = lse[(b * Hq + h) * w.L_q + i], Di = Dsum[(b * Hq + h) * w.L_q + i];
        for (std::int64_t j = w.kv_begin; j < w.kv_begin + w.kv_len; ++j) {
          if (!w.attends(i, j)) continue;
          float a = 0;
          for (std::int64_t d = 0; d < D; ++d) a += q[((b * w.L_q + i) * Hq + h) * D + d] * k[((b * w.L_kv + j) * Hk + hk) * D + d];
          const float p = std::exp(a * scale - l);
          float dp = 0;
          for (std::int64_t d = 0; d < Dv; ++d) {
            const float go = dout[((b * w.L_q + i) * Hq + h) * Dv + d];
            dp += go * v[((b * w.L_kv + j) * Hk + hk) * Dv + d];
            dv[((b * w.L_kv + j) * Hk + hk) * Dv + d] += p * go;
          }
          const float ds = p * (dp - Di) * scale;
          for (std::int64_t d = 0; d < D; ++d) {
            dq[((b * w.L_q + i) * Hq + h) * D + d] += ds * k[((b * w.L_kv + j) * Hk + hk) * D + d];
            dk[((b * w.L_kv + j) * Hk + hk) * D + d] += ds * q[((b * w.L_q + i) * Hq + h) * D + d];
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

/// One rank's state between the phases of ring_rank_attention(): its plan, ring, heads, the
/// head-sharded q, k, v and the ring's double buffer.
template <class RingComm>
struct RingRankState {
  const RingCase& c;
  const ulysses::RingPlan& rp;
  RingComm& rc;
  ulysses::RingProgress progress;
  RankHeads rh;
  std::vector<float> qh, kh, vh, kv0, kv1;
  /// This rank's own block (k then v) into buffer 0 before a rotation.
  void pack_own() {
    std::memcpy(kv0.data(), kh.data(), kh.size() * sizeof(float));
    std::memcpy(kv0.data() + kh.size(), vh.data(), vh.size() * sizeof(float));
  }
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

/// The forward ring: R steps of RingRotation, each step's attention merged into (acc, lse) in step order.
template <class RingComm>
void ring_forward(RingRankState<RingComm>& st, std::vector<float>& acc, std::vector<float>& lse) {
  using namespace ulysses;
  const RingMergeShape ms = st.rp.merge_shape();
  acc.assign(static_cast<std::size_t>(ms.out_elems()), 0.0f);
  lse.assign(static_cast<std::size_t>(ms.lse_elems()), 0.0f);
  ring_merge_init(ms, acc.data(), lse.data());
  std::vector<float> ob, lb;
  st.pack_own();
  RingRotation<RingComm> rot(st.rc, st.rp, RingBuffers().kv(st.kv0, st.kv1), st.progress);
  for (int s = 0; s < st.rp.steps(); ++s) {
    rot.start(s);
    const RingWork& wk = st.rp.work(s);
    const RingKvView<float> kv = rot.template kv<float>(s);
    if (!wk.empty()) {
      step_attention(st.c, st.rh, wk, st.qh.data(), kv.k, kv.v, ob, lb);
      ring_merge_block(ms, acc.data(), lse.data(), ob.data(), ElementType::float32, lb.data(), wk.q_begin, wk.q_len);
    }
    rot.finish(s);
  }
}

/// Dsum = rowsum(dout · out) of the head-sharded do and o, [B, Hq, L].
inline std::vector<float> ring_dsum(const RingCase& c, const RankHeads& rh, std::int64_t L, const std::vector<float>& doh,
                                    const std::vector<float>& oh) {
  std::vector<float> Dsum(static_cast<std::size_t>(c.B * rh.Hq * L), 0.0f);
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t i = 0; i < L; ++i)
      for (std::int64_t h = 0; h < rh.Hq; ++h) {
        float sum = 0;
        for (std::int64_t d = 0; d < c.Dv; ++d) {
          const auto e = static_cast<std::size_t>(((b * L + i) * rh.Hq + h) * c.Dv + d);
          sum += doh[e] * oh[e];
        }
        Dsum[static_cast<std::size_t>((b * rh.Hq + h) * L + i)] = sum;
      }
  return Dsum;
}

/// The backward ring: R steps of RingGradRotation (dq into dq; dk|dv home summed in step order into dkh, dvh).
template <class RingComm>
void ring_backward(RingRankState<RingComm>& st, const std::vector<float>& doh, const std::vector<float>& lse, const std::vector<float>& Dsum,
                   std::vector<float>& dq, std::vector<float>& dkh, std::vector<float>& dvh) {
  using namespace ulysses;
  st.pack_own();
  std::vector<float> g0(st.rp.grad_buffer_bytes() / sizeof(float)), g1(g0.size()), dkv;
  RingGradRotation<RingComm> rot(st.rc, st.rp, RingBuffers().kv(st.kv0, st.kv1).grad(g0, g1), st.progress);
  for (int s = 0; s < st.rp.steps(); ++s) {
    rot.start(s);
    const RingWork& wk = st.rp.work(s);
    const RingKvView<float> kv = rot.template kv<float>(s);
    step_backward(st.c, st.rh, wk, st.qh.data(), kv.k, kv.v, doh.data(), lse.data(), Dsum.data(), dq.data(), dkv);
    rot.finish(s);
    float* gacc = rot.template grad<float>(s);
    for (std::size_t e = 0; e < dkv.size(); ++e) gacc[e] = s == 0 ? dkv[e] : gacc[e] + dkv[e];
  }
  const float* home = rot.template home<float>();
  std::memcpy(dkh.data(), home, dkh.size() * sizeof(float));
  std::memcpy(dvh.data(), home + dkh.size(), dvh.size() * sizeof(float));
}

/// One world rank w (0 .. U·R−1, RingPartition's numbering: ring rank w / U, Ulysses rank w % U)
/// of the whole hybrid attention of case c: check_ring_config() of its plan over both communicators, the
/// forward (and with `backward` the backward) as the file comment says. `uc` is the rank's
/// Ulysses group (U ranks, rank = its Ulysses rank), `rc` its ring (R ranks, rank = its ring
/// rank): LocalGroup::Comm, MpiComm, or any communicator with allgather() and exchange_messages().
/// Collective over both. @throws ulysses::Error from the check, the plans, the exchanges, the ring.
template <class UlyssesComm, class RingComm>
RingRankResult ring_rank_attention(const RingCase& c, const RingGlobals& g, int w, UlyssesComm& uc, RingComm& rc, bool backward,
                                   ulysses::RingProgress progress = ulysses::RingProgress::automatic) {
  using namespace ulysses;
  const RingPartition part(c.S, c.U, c.R, c.layout);
  const SeqPartition world = part.seq_partition();
  const AttentionShape shape{c.H, c.Hkv, c.D, c.Dv};
  const HeadPolicy policy = c.H % c.U == 0 && (c.Hkv % c.U == 0 || c.U % c.Hkv == 0) ? HeadPolicy::even : HeadPolicy::balanced;
  const AttentionSpecs specs = attention_specs<float>(c.U, shape, policy);
  const RingPlan rp(part, Mesh(c.U * c.R, c.U, c.R, c.U * c.R), w, c.B, specs, c.causal);  // one block, ulysses_inner: w = j·U + u
  const Plan qkv = rp.qkv_plan(), op = rp.out_plan();  // the plans' agreement records carry the ring configuration
  check_ring_config(qkv, uc, rc);  // U, R, layout, causal, S on every rank of the block, in qkv's own all-gather
  const std::int64_t L = rp.tokens();
  RingRankState<RingComm> st{c, rp, rc, progress, {rp.query_heads(), rp.kv_heads(), {}}, {}, {}, {}, {}, {}};
  for (std::int64_t h = 0; h < st.rh.Hq; ++h) st.rh.kv_of.push_back(rp.local_kv_head(h));
  const std::vector<float> q = ring_shard(c, world, w, g.q, c.H, c.D), k = ring_shard(c, world, w, g.k, c.Hkv, c.D),
                           v = ring_shard(c, world, w, g.v, c.Hkv, c.Dv);
  st.qh.resize(static_cast<std::size_t>(c.B * L * st.rh.Hq * c.D));
  st.kh.resize(static_cast<std::size_t>(c.B * L * st.rh.Hk * c.D));
  st.vh.resize(static_cast<std::size_t>(c.B * L * st.rh.Hk * c.Dv));
  st.kv0.resize(rp.kv_buffer_bytes() / sizeof(float)), st.kv1.resize(st.kv0.size());  // the ring's blocks: k|v
  HostExecutor exec;
  std::vector<std::byte> ws(std::max(qkv.workspace_bytes(), op.workspace_bytes()) + 16);
  seq_to_head(qkv, uc, exec, {q, k, v}, {st.qh, st.kh, st.vh}, ws);
  RingRankResult rr;
  std::vector<float> acc;
  ring_forward(st, acc, rr.lse);
  std::vector<float> oh(acc.size());
  rr.out.resize(static_cast<std::size_t>(c.B * world.local_length(w) * c.H * c.Dv));
  ring_merge_finish(rp.merge_shape(), acc.data(), oh.data(), ElementType::float32);
  head_to_seq(op, uc, exec, TensorList<ConstByteSpan>{ConstByteSpan(oh)}, TensorList<ByteSpan>{ByteSpan(rr.out)}, ws);
  rr.h0 = specs.query_heads.begin(rp.ulysses_rank());
  rr.Hq = st.rh.Hq;
  rr.L = L;
  for (std::int64_t i = 0; i < L; ++i) rr.tokens.push_back(part.ring_token(rp.ring_rank(), i));
  if (!backward) return rr;
  // Backward: dout seq→head (head_to_seq's adjoint), Dsum, the ring of kv and fp32 dk|dv.
  const std::vector<float> dos = ring_shard(c, world, w, g.dout, c.H, c.Dv);
  std::vector<float> doh(oh.size()), dq(st.qh.size(), 0.0f), dkh(st.kh.size()), dvh(st.vh.size());
  head_to_seq_backward(op, uc, exec, TensorList<ConstByteSpan>{ConstByteSpan(dos)}, TensorList<ByteSpan>{ByteSpan(doh)}, ws);
  ring_backward(st, doh, rr.lse, ring_dsum(c, st.rh, L, doh, oh), dq, dkh, dvh);
  rr.dq.assign(q.size(), 0.0f);
  rr.dk.assign(k.size(), 0.0f);
  rr.dv.assign(v.size(), 0.0f);
  seq_to_head_backward(qkv, uc, exec, {dq, dkh, dvh}, {rr.dq, rr.dk, rr.dv}, ws);
  return rr;
}

/// Runs the whole hybrid attention of case c on P = U·R threads; returns every world rank's result.
/// @throws what a rank threw (the first).
inline std::vector<RingRankResult> run_ring_attention(const RingCase& c, const RingGlobals& g, bool backward,
                                                      ulysses::RingProgress progress = ulysses::RingProgress::automatic) {
  using namespace ulysses;
  const RingPartition part(c.S, c.U, c.R, c.layout);
  const int P = c.U * c.R;
  std::vector<std::unique_ptr<LocalGroup>> ug, rg;
  for (int j = 0; j < c.R; ++j) ug.push_back(std::make_unique<LocalGroup>(c.U, std::chrono::seconds(60)));
  for (int u = 0; u < c.U; ++u) rg.push_back(std::make_unique<LocalGroup>(c.R, std::chrono::seconds(60)));
  std::vector<RingRankResult> res(static_cast<std::size_t>(P));
  std::vector<std::exception_ptr> err(static_cast<std::size_t>(P));
  auto rank_main = [&](int w) {
    LocalGroup::Comm uc = ug[static_cast<std::size_t>(part.ring_rank(w))]->comm(part.ulysses_rank(w));
    LocalGroup::Comm rc = rg[static_cast<std::size_t>(part.ulysses_rank(w))]->comm(part.ring_rank(w));
    res[static_cast<std::size_t>(w)] = ring_rank_attention(c, g, w, uc, rc, backward, progress);
  };
  std::vector<std::thread> th;
  for (int w = 0; w < P; ++w)
    th.emplace_back([&, w] {
      try {
        rank_main(w);
      } catch (...) {
        err[static_cast<std::size_t>(w)] = std::current_exception();
        ug[static_cast<std::size_t>(part.ring_rank(w))]->abort();
        rg[static_cast<std::size_t>(part.ulysses_rank(w))]->abort();
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
  const ulysses::SeqPartition world = ulysses::RingPartition(c.S, c.U, c.R, c.layout).seq_partition();
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
