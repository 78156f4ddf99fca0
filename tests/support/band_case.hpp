// SPDX-License-Identifier: Apache-2.0
// The head-band cases shared by the in-process and MPI tests (test_bands.cpp, test_bands_mpi.cpp):
// one attention layer's q, k, v, do on every rank of any communicator, the forward and the backward
// run unbanded (seq_to_head, the attention of every local head, head_to_seq; the backward's
// adjoints) and over G head bands (banded_attention(), banded_attention_backward()), and what each
// rank ends with: o, dq, dk, dv seq-sharded. The engine's stand-ins: a softmax attention over all
// tokens, and a backward that adds do into dk, dv query head by query head in ascending order, so
// that a kv head's gradient adds up alike in any band count. Banded results must equal the
// unbanded ones bit for bit.
#pragma once

#include <ulysses/host/executor.hpp>
#include <ulysses/ulysses.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <cstring>
#include <string>
#include <vector>

namespace bt {

using namespace ulysses;

/// A layer on P ranks: shapes, head policy (balanced: uneven H), batch.
struct BandCase {
  int P = 2;
  std::int64_t B = 1, S = 8, H = 4, Hkv = 2, D = 4;
  HeadPolicy policy = HeadPolicy::automatic;
  unsigned salt = 0;    ///< varies the inputs (a new round of the same shapes)
  bool poison = false;  ///< the outputs start as NaN (every element must be written)
  /// RoPE fused into the exchanges (q and k planned by rows): on pack of q, k's seq→head, its
  /// inverse on unpack of dq, dk's head→seq (Rope(D, S), the half pairing)
  bool rope = false;
  std::string name() const {
    return "P=" + std::to_string(P) + " B=" + std::to_string(B) + " S=" + std::to_string(S) + " H=" + std::to_string(H) +
           " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D);
  }
  AttentionSpecs specs() const {
    AttentionSpecs s = attention_specs<float>(P, AttentionShape{H, Hkv, D, D}, policy);
    if (rope) {
      s.q.with_row_transforms();
      s.k.with_row_transforms();
    }
    return s;
  }
};

/// The value of global element i of tensor t (0 q, 1 k, 2 v, 3 do): a small float, deterministic.
inline float value(int t, std::int64_t i, unsigned salt = 0) {
  const std::uint64_t x =
      (static_cast<std::uint64_t>(i) * 2654435761u + static_cast<std::uint64_t>(t) * 40503u + std::uint64_t{salt} * 7919u) % 1021u;
  return static_cast<float>(x) / 512.0f - 1.0f;
}

/// Rank r's seq-sharded [B, S_r, n, D] part of global tensor t of n heads (bshd).
inline std::vector<float> seq_part(const BandCase& c, const SeqPartition& seq, int r, int t, std::int64_t n) {
  const std::int64_t Sr = seq.local_length(r);
  std::vector<float> x(static_cast<std::size_t>(c.B * Sr * n * c.D));
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t i = 0; i < Sr; ++i)
      for (std::int64_t h = 0; h < n; ++h)
        for (std::int64_t d = 0; d < c.D; ++d)
          x[static_cast<std::size_t>(((b * Sr + i) * n + h) * c.D + d)] =
              value(t, ((b * c.S + seq.global_token(r, i)) * n + h) * c.D + d, c.salt);
  return x;
}

/// What one rank ends with: seq-sharded o, dq, dk, dv; and, banded, how many elements of q the
/// attention of band g found not yet arrived in its own heads (`late`) or already arrived in the
/// heads of band g + 2 or later (`early`, which no exchange in flight may carry).
struct BandResult {
  std::vector<float> o, dq, dk, dv;
  long late = 0, early = 0;
  bool operator==(const BandResult& x) const { return o == x.o && dq == x.dq && dk == x.dk && dv == x.dv; }
};

/// What q's head-sharded buffer holds before anything arrives (outside value()'s range).
constexpr float kNotArrived = 4096.0f;

/// The engine's stand-ins on head-sharded bshd buffers [B, S, n, D] of this rank.
struct Engine {
  const BandCase& c;
  const AttentionSpecs& specs;
  int rank;
  std::int64_t Hr, Kr;  // local query and kv heads
  std::size_t at(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t n) const {
    return static_cast<std::size_t>(((b * c.S + s) * n + h) * c.D);
  }
  /// o of local query heads [lo, hi): softmax(q k^T / sqrt(D)) v over all S tokens.
  void forward(HeadRun heads, const float* q, const float* k, const float* v, float* o) const {
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
    std::vector<float> w(static_cast<std::size_t>(c.S));
    for (std::int64_t j = heads.lo; j < heads.hi; ++j) {
      const std::int64_t kv = specs.local_kv_head(rank, j);
      for (std::int64_t b = 0; b < c.B; ++b)
        for (std::int64_t s = 0; s < c.S; ++s) {
          float m = -1e30f, sum = 0;
          for (std::int64_t u = 0; u < c.S; ++u) {
            float dot = 0;
            for (std::int64_t d = 0; d < c.D; ++d) dot += q[at(b, s, j, Hr) + d] * k[at(b, u, kv, Kr) + d];
            w[static_cast<std::size_t>(u)] = dot * scale;
            m = std::max(m, dot * scale);
          }
          for (std::int64_t u = 0; u < c.S; ++u) sum += (w[static_cast<std::size_t>(u)] = std::exp(w[static_cast<std::size_t>(u)] - m));
          for (std::int64_t d = 0; d < c.D; ++d) {
            float acc = 0;
            for (std::int64_t u = 0; u < c.S; ++u) acc += w[static_cast<std::size_t>(u)] * v[at(b, u, kv, Kr) + d];
            o[at(b, s, j, Hr) + d] = acc / sum;
          }
        }
    }
  }
  /// dq = 2 do + q; dk += do / 2 and dv += do (added query head by query head, ascending).
  void backward(HeadRun heads, const float* q, const float* dout, float* dq, float* dk, float* dv) const {
    for (std::int64_t j = heads.lo; j < heads.hi; ++j) {
      const std::int64_t kv = specs.local_kv_head(rank, j);
      for (std::int64_t b = 0; b < c.B; ++b)
        for (std::int64_t s = 0; s < c.S; ++s)
          for (std::int64_t d = 0; d < c.D; ++d) {
            const float g = dout[at(b, s, j, Hr) + d];
            dq[at(b, s, j, Hr) + d] = 2 * g + q[at(b, s, j, Hr) + d];
            dk[at(b, s, kv, Kr) + d] += g / 2;
            dv[at(b, s, kv, Kr) + d] += g;
          }
    }
  }
};

/// One rank's plans of case c: unbanded (`bands` 0: the plain q, k, v and o plans) or the
/// HeadBands of that many bands.
struct LayerPlans {
  AttentionSpecs specs;
  SeqPartition seq;
  HeadBands bands;
  Plan qkv0, out0;
  bool banded;
  LayerPlans(const BandCase& c, int r, int G)
      : specs(c.specs()), seq(SeqPartition::balanced(c.S, c.P)), bands({c.P, r}, c.B, seq, specs, G ? G : 1),
        qkv0({c.P, r}, c.B, seq, specs.qkv()), out0({c.P, r}, c.B, seq, specs.out()), banded(G > 0) {}
  const Plan& qkv() const { return banded ? bands.qkv() : qkv0; }
  const Plan& out() const { return banded ? bands.out() : out0; }
};

/// Runs the layer forward and backward on this rank: unbanded with `bands` 0, else over that many
/// head bands with `progress`. Every rank of `comm` calls it alike.
template <class Comm, class Exec>
BandResult run_layer(const BandCase& c, Comm& comm, Exec& exec, int bands, Progress progress = Progress::automatic) {
  const int r = comm.rank();
  const LayerPlans lp(c, r, bands);
  const AttentionSpecs& specs = lp.specs;
  const SeqPartition& seq = lp.seq;
  const HeadBands& hb = lp.bands;
  const Plan& qkv = lp.qkv();
  const Plan& out = lp.out();
  const std::int64_t Hr = specs.query_heads.count(r), Kr = specs.kv_heads.count(r);
  const Engine eng{c, specs, r, Hr, Kr};
  std::vector<float> q = seq_part(c, seq, r, 0, c.H), k = seq_part(c, seq, r, 1, c.Hkv), v = seq_part(c, seq, r, 2, c.Hkv),
                     dout = seq_part(c, seq, r, 3, c.H);
  auto head = [&](std::int64_t n) { return std::vector<float>(static_cast<std::size_t>(c.B * c.S * n * c.D)); };
  std::vector<float> q2 = head(Hr), k2 = head(Kr), v2 = head(Kr), o2 = head(Hr), do2 = head(Hr), dq2 = head(Hr), dk2 = head(Kr),
                     dv2 = head(Kr);
  BandResult res;
  const float start = c.poison ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
  res.o.assign(q.size(), start);
  res.dq.assign(q.size(), start);
  res.dk.assign(k.size(), start);
  res.dv.assign(v.size(), start);
  std::vector<std::byte> ws_qkv(qkv.workspace_bytes()), ws_o(out.workspace_bytes());
  const Rope rope(c.D, c.S);
  const Rope inverse = rope.inverse();
  RowTransforms fwd, bwd;  // (empty without c.rope)
  if (c.rope) {
    fwd.on_pack(0, rope).on_pack(1, rope);
    bwd.on_unpack(0, inverse).on_unpack(1, inverse);
  }
  const TensorList<ConstByteSpan> qkv_in{q, k, v};
  const TensorList<ByteSpan> qkv_head{q2, k2, v2};
  if (!bands) {
    seq_to_head(qkv, comm, exec, qkv_in, qkv_head, ws_qkv, fwd);
    eng.forward({0, Hr}, q2.data(), k2.data(), v2.data(), o2.data());
    head_to_seq(out, comm, exec, ConstByteSpan(o2), ByteSpan(res.o), ws_o);
    head_to_seq_backward(out, comm, exec, ConstByteSpan(dout), ByteSpan(do2), ws_o);
    eng.backward({0, Hr}, q2.data(), do2.data(), dq2.data(), dk2.data(), dv2.data());
    seq_to_head_backward(qkv, comm, exec, TensorList<ConstByteSpan>{dq2, dk2, dv2}, TensorList<ByteSpan>{res.dq, res.dk, res.dv}, ws_qkv,
                         bwd);
    return res;
  }
  std::fill(q2.begin(), q2.end(), kNotArrived);
  auto arrived = [&](std::int64_t j) {  // elements of local query head j that arrived
    long n = 0;
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t s = 0; s < c.S; ++s)
        for (std::int64_t d = 0; d < c.D; ++d) n += q2[eng.at(b, s, j, Hr) + static_cast<std::size_t>(d)] != kNotArrived;
    return n;
  };
  banded_attention(
      hb, comm, exec, qkv_in, qkv_head, ws_qkv, ConstByteSpan(o2), ByteSpan(res.o), ws_o,
      [&](const Band& b) {
        for (std::int64_t j = b.query.lo; j < b.query.hi; ++j) res.late += c.B * c.S * c.D - arrived(j);
        for (int g = b.index + 2; g < hb.count(); ++g)
          for (std::int64_t j = hb.band(g).query.lo; j < hb.band(g).query.hi; ++j) res.early += arrived(j);
        eng.forward(b.query, q2.data(), k2.data(), v2.data(), o2.data());
      },
      progress, fwd);
  banded_attention_backward(
      hb, comm, exec, ConstByteSpan(dout), ByteSpan(do2), ws_o, TensorList<ConstByteSpan>{dq2, dk2, dv2},
      TensorList<ByteSpan>{res.dq, res.dk, res.dv}, ws_qkv,
      [&](const Band& b) { eng.backward(b.query, q2.data(), do2.data(), dq2.data(), dk2.data(), dv2.data()); }, progress, bwd);
  return res;
}

/// The cases every backend runs: GQA, MQA (replicated kv heads), uneven H (balanced), B = 2.
inline std::vector<BandCase> band_cases(int P) {
  std::vector<BandCase> v;
  v.push_back({P, 1, 8, 4 * P, 2 * P, 4});                     // GQA, kv heads split
  v.push_back({P, 2, 6, 2 * P, 1, 4});                         // MQA: one kv head, replicated on every rank
  v.push_back({P, 1, 8, 2 * P + 1, 1, 4, HeadPolicy::balanced});  // uneven query heads, MQA
  if (P % 2 == 0) v.push_back({P, 1, 8, 3 * P, P / 2, 4});     // GQA, kv heads replicated on pairs of ranks
  return v;
}

/// The largest band count worth running for case c: the most local query heads of any rank.
inline int max_bands(const BandCase& c) {
  const AttentionSpecs s = c.specs();
  std::int64_t m = 1;
  for (int r = 0; r < c.P; ++r) m = std::max(m, s.query_heads.count(r));
  return static_cast<int>(m);
}


// ---- break31: a layout-agnostic layer (any Format, integer data: sums exact in any order) ----

/// A layer case for the layout-agnostic check: integer-valued data (sums exact in any order).
struct FmtCase {
  int P;
  std::int64_t B, S, H, Hkv, D;
  HeadPolicy policy;
  Format format;
  bool even_seq;
};
/// Index of element (b, s, h, d) of a head-sharded [.., S, n heads, D] tensor in format f.
inline std::size_t head_at(const FmtCase& c, std::int64_t n, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
  switch (c.format) {
    case Format::sbhd: return static_cast<std::size_t>(((s * c.B + b) * n + h) * c.D + d);
    case Format::bhsd: return static_cast<std::size_t>(((b * n + h) * c.S + s) * c.D + d);
    default: return static_cast<std::size_t>(((b * c.S + s) * n + h) * c.D + d);
  }
}
inline std::vector<float> ints(std::size_t n, int salt) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(static_cast<long>((i * 7 + static_cast<std::size_t>(salt) * 131) % 61) - 30);
  return x;
}
struct FmtResult {
  std::vector<float> o, dq, dk, dv;
  long wrong_in = 0;  // head-side elements of a band's heads that differ from the unbanded ones when the band runs
  bool operator==(const FmtResult& x) const { return o == x.o && dq == x.dq && dk == x.dk && dv == x.dv; }
};
/// One rank: unbanded (G 0) or banded; the engine: o = 2 q + 1 per query head; dq = do - 1; dk, dv
/// of kv head of query head j += do of j (and 3 do), query head by query head (integers: exact).
template <class Comm>
FmtResult fmt_layer(const FmtCase& c, Comm& comm, int G, Progress pr, const std::vector<float>* ref_q2 = nullptr,
                    const std::vector<float>* ref_do2 = nullptr, std::vector<float>* q2_out = nullptr, std::vector<float>* do2_out = nullptr) {
  HostExecutor exec;
  const int r = comm.rank();
  const AttentionSpecs specs = attention_specs<float>(c.P, AttentionShape{c.H, c.Hkv, c.D, c.D}, c.policy);
  const SeqPartition seq = c.even_seq ? SeqPartition::even(c.S, c.P) : SeqPartition::balanced(c.S, c.P);
  const HeadBands hb({c.P, r}, c.B, seq, specs, G ? G : 1, c.format);
  const Plan qkv0({c.P, r}, c.B, seq, specs.qkv(), c.format), out0({c.P, r}, c.B, seq, specs.out(), c.format);
  const Plan& qkv = G ? hb.qkv() : qkv0;
  const Plan& out = G ? hb.out() : out0;
  const std::int64_t Hr = specs.query_heads.count(r), Kr = specs.kv_heads.count(r);
  std::vector<float> q = ints(qkv.seq_bytes(0) / 4, r * 4 + 0), k = ints(qkv.seq_bytes(1) / 4, r * 4 + 1),
                     v = ints(qkv.seq_bytes(2) / 4, r * 4 + 2), dout = ints(out.seq_bytes(0) / 4, r * 4 + 3);
  std::vector<float> q2(qkv.head_bytes(0) / 4, 9999.0f), k2(qkv.head_bytes(1) / 4), v2(qkv.head_bytes(2) / 4), o2(out.head_bytes(0) / 4),
      do2(out.head_bytes(0) / 4, 9999.0f), dq2(q2.size()), dk2(k2.size()), dv2(v2.size());
  FmtResult res;
  res.o.assign(q.size(), 0), res.dq.assign(q.size(), 0), res.dk.assign(k.size(), 0), res.dv.assign(v.size(), 0);
  std::vector<std::byte> wq(qkv.workspace_bytes()), wo(out.workspace_bytes());
  auto fwd = [&](HeadRun heads) {
    for (std::int64_t j = heads.lo; j < heads.hi; ++j)
      for (std::int64_t b = 0; b < c.B; ++b)
        for (std::int64_t s = 0; s < c.S; ++s)
          for (std::int64_t d = 0; d < c.D; ++d) {
            const std::size_t i = head_at(c, Hr, b, s, j, d);
            if (ref_q2 && q2[i] != (*ref_q2)[i]) ++res.wrong_in;
            o2[i] = 2 * q2[i] + 1;
          }
  };
  auto bwd = [&](HeadRun heads) {
    for (std::int64_t j = heads.lo; j < heads.hi; ++j) {
      const std::int64_t kv = specs.local_kv_head(r, j);
      for (std::int64_t b = 0; b < c.B; ++b)
        for (std::int64_t s = 0; s < c.S; ++s)
          for (std::int64_t d = 0; d < c.D; ++d) {
            const std::size_t i = head_at(c, Hr, b, s, j, d), x = head_at(c, Kr, b, s, kv, d);
            if (ref_do2 && do2[i] != (*ref_do2)[i]) ++res.wrong_in;
            dq2[i] = do2[i] - 1;
            dk2[x] += do2[i];
            dv2[x] += 3 * do2[i];
          }
    }
  };
  const TensorList<ConstByteSpan> qkv_in{q, k, v};
  const TensorList<ByteSpan> qkv_head{q2, k2, v2};
  if (!G) {
    seq_to_head(qkv, comm, exec, qkv_in, qkv_head, wq);
    fwd({0, Hr});
    head_to_seq(out, comm, exec, ConstByteSpan(o2), ByteSpan(res.o), wo);
    head_to_seq_backward(out, comm, exec, ConstByteSpan(dout), ByteSpan(do2), wo);
    bwd({0, Hr});
    seq_to_head_backward(qkv, comm, exec, TensorList<ConstByteSpan>{dq2, dk2, dv2}, TensorList<ByteSpan>{res.dq, res.dk, res.dv}, wq);
  } else {
    banded_attention(hb, comm, exec, qkv_in, qkv_head, wq, ConstByteSpan(o2), ByteSpan(res.o), wo, [&](const Band& b) { fwd(b.query); }, pr);
    banded_attention_backward(hb, comm, exec, ConstByteSpan(dout), ByteSpan(do2), wo, TensorList<ConstByteSpan>{dq2, dk2, dv2},
                              TensorList<ByteSpan>{res.dq, res.dk, res.dv}, wq, [&](const Band& b) { bwd(b.query); }, pr);
  }
  if (q2_out) *q2_out = q2;
  if (do2_out) *do2_out = do2;
  return res;
}

/// One handle carrying the three bands of a HeadBands q, k, v plan out of order (one workspace),
/// then head→seq of the three and the plain plan's as four parts: how many results differ from
/// the blocking unbanded calls' (0 expected).
template <class Comm>
int multi_part_mismatches(const BandCase& c, Comm& comm, Progress pr) {
  HostExecutor exec;
  const int r = comm.rank();
  const AttentionSpecs specs = c.specs();
  const SeqPartition seq = SeqPartition::balanced(c.S, c.P);
  const HeadBands hb({c.P, r}, c.B, seq, specs, 3);
  const Plan plain({c.P, r}, c.B, seq, specs.qkv());
  std::vector<float> q = ints(plain.seq_bytes(0) / 4, r), k = ints(plain.seq_bytes(1) / 4, r + 7), v = ints(plain.seq_bytes(2) / 4, r + 9);
  auto head = [&] {
    return std::vector<std::vector<float>>{std::vector<float>(plain.head_bytes(0) / 4), std::vector<float>(plain.head_bytes(1) / 4),
                                           std::vector<float>(plain.head_bytes(2) / 4)};
  };
  auto ref = head(), got = head();
  std::vector<std::byte> w0(plain.workspace_bytes()), w1(hb.qkv().workspace_bytes()), w2(plain.workspace_bytes());
  const TensorList<ConstByteSpan> in{q, k, v};
  seq_to_head(plain, comm, exec, in, TensorList<ByteSpan>{ref[0], ref[1], ref[2]}, w0);
  Exchange<Comm, HostExecutor> h(comm, exec, pr);
  const TensorList<ByteSpan> out{got[0], got[1], got[2]};
  const ExchangeCall calls[3] = {{&hb.qkv(), Direction::seq_to_head, in, out, w1, StageRange::one(2)},
                                 {&hb.qkv(), Direction::seq_to_head, in, out, w1, StageRange::one(0)},
                                 {&hb.qkv(), Direction::seq_to_head, in, out, w1, StageRange::one(1)}};
  h.start(calls, 3);
  h.finish();
  int bad = got == ref ? 0 : 1;
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size()), dq0(q.size()), dk0(k.size()), dv0(v.size()), x(q.size()), y(k.size()),
      z(v.size());
  seq_to_head_backward(plain, comm, exec, TensorList<ConstByteSpan>{ref[0], ref[1], ref[2]}, TensorList<ByteSpan>{dq0, dk0, dv0}, w0);
  const TensorList<ConstByteSpan> hin{got[0], got[1], got[2]};
  const ExchangeCall back[4] = {{&hb.qkv(), Direction::head_to_seq, hin, TensorList<ByteSpan>{dq, dk, dv}, w1, StageRange::one(1)},
                                {&plain, Direction::head_to_seq, hin, TensorList<ByteSpan>{x, y, z}, w2},
                                {&hb.qkv(), Direction::head_to_seq, hin, TensorList<ByteSpan>{dq, dk, dv}, w1, StageRange::one(0)},
                                {&hb.qkv(), Direction::head_to_seq, hin, TensorList<ByteSpan>{dq, dk, dv}, w1, StageRange::one(2)}};
  h.start(back, 4);
  h.finish();
  bad += (dq != dq0) + (dk != dk0) + (dv != dv0) + (x != dq0) + (y != dk0) + (z != dv0);
  return bad;
}

}  // namespace bt
