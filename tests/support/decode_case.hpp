// SPDX-License-Identifier: Apache-2.0
// The decode exchange's test harness, shared by the in-process and MPI tests: a small attention
// problem (random q, K, V; GQA; T new tokens, causal among them), its KV cache split over the P
// ranks (contiguous ranges, or blocks dealt round-robin; chosen ranks empty for chosen sequences,
// or a sequence with no keys at all), every rank's partial output and LSE computed in double and
// stored (an empty shard's output is NaN, as some attention kernels return, and its LSE -inf, or
// +inf / NaN as FlashAttention-2 and others give: C18), and two references:
// the merge of the same stored partials in ascending rank order (merge_rows(): the exchange must
// match it bit for bit) and single-rank attention in double (within a tolerance).
#pragma once

#include <ulysses/decode/exchange.hpp>
#include <ulysses/decode/host.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace ud {

using namespace ulysses;

/// One decode exchange case.
struct DecodeCase {
  std::string name;
  int P = 4;
  std::int64_t B = 2, T = 1, H = 8, Hkv = 2, D = 8, Dv = 8, S = 24;  ///< S: keys per sequence (new tokens included)
  bool round_robin = false;   ///< KV split: blocks of `block` tokens dealt to ranks 0, 1, ..; else contiguous ranges
  std::int64_t block = 3;
  bool balanced = true;       ///< head split: balanced (else even)
  ElementType partial_type = ElementType::float32, out_type = ElementType::float32;
  LseBase base = LseBase::natural;
  DecodeOutput output = DecodeOutput::heads;
  Path path = Path::automatic;
  int layouts = 0;  ///< 0 dense (O bshd, LSE [B,T,H]); 1 O bhsd, LSE [B,H,T] (FlashAttention's); 2 padded strided views
  std::vector<std::pair<int, std::int64_t>> empty;  ///< (rank, b): the rank holds no keys of sequence b
  std::int64_t no_keys = -1;  ///< a sequence with no keys at all (every rank empty for it), or -1
  /// The LSEs stored for rows where a rank sees no key, cycled over those rows in order (rank,
  /// b, t, h): -inf (the default), or +inf / NaN as FlashAttention-2 and other kernels give (C18).
  std::vector<float> empty_lse = {-std::numeric_limits<float>::infinity()};
  std::uint64_t seed = 1;
};

/// C18 (bug_cases.md): P=4, one KV shard per rank (contiguous), rank 2 holds no key of sequence 0
/// (rows +inf on one rank) and sequence 2 has no key anywhere (rows +inf on every rank); the
/// empty rows' LSE is `empty` (+inf, NaN, or a mix).
inline DecodeCase c18(std::vector<float> empty) {
  DecodeCase c;
  c.name = "C18";
  c.P = 4, c.T = 1, c.H = 8, c.Hkv = 2, c.B = 3, c.S = 16, c.D = 8, c.Dv = 8;
  c.empty = {{2, 0}};
  c.no_keys = 2;
  c.empty_lse = std::move(empty);
  return c;
}

/// C16 (bug_cases.md): P=4, decode T=1, H=8, Hkv=2, B=3, rank 3 holds no KV token of sequence 1.
inline DecodeCase c16() {
  DecodeCase c;
  c.name = "C16";
  c.P = 4, c.T = 1, c.H = 8, c.Hkv = 2, c.B = 3, c.S = 16, c.D = 8, c.Dv = 8;
  c.empty = {{3, 1}};
  return c;
}

/// Keys of sequence b (no_keys: 0).
inline std::int64_t keys_of(const DecodeCase& c, std::int64_t b) { return b == c.no_keys ? 0 : c.S; }

/// The rank holding key s of sequence b.
inline int key_owner(const DecodeCase& c, std::int64_t b, std::int64_t s) {
  int r = c.round_robin ? static_cast<int>((s / c.block) % c.P) : static_cast<int>(s * c.P / c.S);
  for (int k = 0; k < c.P; ++k) {  // an empty (rank, b) hands its keys to the next rank that is not empty
    bool is_empty = false;
    for (const auto& e : c.empty) is_empty = is_empty || (e.first == r && e.second == b);
    if (!is_empty) break;
    r = (r + 1) % c.P;
  }
  return r;
}

/// The global problem: q [B, T, H, D], K [B, S, Hkv, D], V [B, S, Hkv, Dv] (double).
struct Problem {
  std::vector<double> q, k, v;
  explicit Problem(const DecodeCase& c) {
    std::mt19937_64 g(c.seed);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    q.resize(static_cast<std::size_t>(c.B * c.T * c.H * c.D));
    k.resize(static_cast<std::size_t>(c.B * c.S * c.Hkv * c.D));
    v.resize(static_cast<std::size_t>(c.B * c.S * c.Hkv * c.Dv));
    for (double& x : q) x = 2.0 * u(g);
    for (double& x : k) x = u(g);
    for (double& x : v) x = u(g);
  }
};

/// Attention of (b, t, h) over the keys `rank` holds (rank < 0: all keys), in double: the output
/// row (Dv) and the natural-log LSE (-inf when no key). Query t sits at position S_b - T + t and
/// sees the keys up to it (causal among the new tokens).
inline double attend(const DecodeCase& c, const Problem& pb, std::int64_t b, std::int64_t t, std::int64_t h, int rank, double* out) {
  const std::int64_t Sb = keys_of(c, b), pos = Sb - c.T + t, kvh = h / (c.H / c.Hkv);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  std::vector<double> z;
  std::vector<std::int64_t> idx;
  for (std::int64_t s = 0; s < Sb && s <= pos; ++s) {
    if (rank >= 0 && key_owner(c, b, s) != rank) continue;
    double dot = 0;
    for (std::int64_t d = 0; d < c.D; ++d)
      dot += pb.q[static_cast<std::size_t>(((b * c.T + t) * c.H + h) * c.D + d)] * pb.k[static_cast<std::size_t>(((b * c.S + s) * c.Hkv + kvh) * c.D + d)];
    z.push_back(dot * scale);
    idx.push_back(s);
  }
  for (std::int64_t d = 0; d < c.Dv; ++d) out[d] = 0;
  if (z.empty()) return -INFINITY;
  double m = -INFINITY, sum = 0;
  for (double x : z) m = std::max(m, x);
  for (double x : z) sum += std::exp(x - m);
  for (std::size_t i = 0; i < z.size(); ++i) {
    const double w = std::exp(z[i] - m) / sum;
    for (std::int64_t d = 0; d < c.Dv; ++d) out[d] += w * pb.v[static_cast<std::size_t>(((b * c.S + idx[i]) * c.Hkv + kvh) * c.Dv + d)];
  }
  return m + std::log(sum);
}

/// Stores x as element type t at p.
inline void store(std::byte* p, ElementType t, float x) {
  detail::with_merge_arith(t, [&](auto a) { decltype(a)::store(p, x); });
}
inline float load(const std::byte* p, ElementType t) {
  float x = 0;
  detail::with_merge_arith(t, [&](auto a) { x = decltype(a)::load(p); });
  return x;
}

/// The layouts of rank r's tensors in the case's arrangement.
struct Layouts {
  Layout partial, lse, out, out_lse;
};
inline Layouts layouts_of(const DecodeCase& c, const HeadPartition& heads, int r) {
  const std::int64_t Ho = c.output == DecodeOutput::all_heads ? c.H : heads.count(r);
  Layouts l;
  if (c.layouts == 1) {
    l.partial = Layout::bhsd(c.B, c.T, c.H, c.Dv);
    l.lse = lse_layout_bht(c.B, c.T, c.H);
    l.out = Layout::bhsd(c.B, c.T, Ho, c.Dv);
    l.out_lse = lse_layout_bht(c.B, c.T, Ho);
  } else if (c.layouts == 2) {  // padded rows and tokens, rank-dependent (views into larger tensors)
    const std::int64_t row = c.Dv + 2 + r % 3, tok = (c.H + 1) * row;
    l.partial = Layout::strided({c.B, c.T, c.H, c.Dv}, {c.T * tok + 5, tok, row, 1});
    l.lse = Layout::strided({c.B, c.T, c.H, 1}, {c.T * (c.H + 2) + 1, c.H + 2, 1, 1});
    const std::int64_t orow = c.Dv + 1 + (r + 1) % 2, otok = (Ho + 2) * orow;
    l.out = Layout::strided({c.B, c.T, Ho, c.Dv}, {c.T * otok + 3, otok, orow, 1});
    l.out_lse = Layout::strided({c.B, c.T, Ho, 1}, {(c.H + 3) * c.T, 1, c.T, 1});
  } else {
    l.partial = Layout::bshd(c.B, c.T, c.H, c.Dv);
    l.lse = lse_layout_bth(c.B, c.T, c.H);
    l.out = Layout::bshd(c.B, c.T, Ho, c.Dv);
    l.out_lse = lse_layout_bth(c.B, c.T, Ho);
  }
  return l;
}

inline HeadPartition heads_of(const DecodeCase& c) { return c.balanced ? HeadPartition::balanced(c.H, c.P) : HeadPartition::even(c.H, c.P); }

/// The spec of rank r.
inline DecodeSpec spec_of(const DecodeCase& c, int r) {
  const HeadPartition heads = heads_of(c);
  const Layouts l = layouts_of(c, heads, r);
  DecodeSpec s(c.B, c.T, heads, c.Dv);
  s.with_types(c.partial_type, c.out_type).with_base(c.base).with_output(c.output).with_path(c.path);
  s.with_partial_layouts(l.partial, l.lse).with_out_layouts(l.out, l.out_lse);
  return s;
}

/// Every rank's stored partials: O_r in the case's partial type, densely [B, T, H, Dv], and LSE_r
/// [B, T, H] in the case's base (what the engine's attention kernel would have produced).
struct Partials {
  std::vector<std::vector<std::byte>> o;
  std::vector<std::vector<float>> lse;
};
inline Partials partials_of(const DecodeCase& c, const Problem& pb) {
  Partials x;
  std::size_t k_empty = 0;  // the empty rows so far (cycling c.empty_lse)
  const auto e = static_cast<std::int64_t>(size_of(c.partial_type));
  std::vector<double> row(static_cast<std::size_t>(c.Dv));
  for (int r = 0; r < c.P; ++r) {
    x.o.emplace_back(static_cast<std::size_t>(c.B * c.T * c.H * c.Dv * e));
    x.lse.emplace_back(static_cast<std::size_t>(c.B * c.T * c.H));
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t t = 0; t < c.T; ++t)
        for (std::int64_t h = 0; h < c.H; ++h) {
          const double l = attend(c, pb, b, t, h, r, row.data());
          const std::int64_t i = (b * c.T + t) * c.H + h;
          x.lse.back()[static_cast<std::size_t>(i)] =
              std::isinf(l) ? c.empty_lse[k_empty++ % c.empty_lse.size()] : static_cast<float>(c.base == LseBase::two ? l / std::log(2.0) : l);
          for (std::int64_t d = 0; d < c.Dv; ++d)
            store(x.o.back().data() + (i * c.Dv + d) * e, c.partial_type, std::isinf(l) ? std::nanf("") : static_cast<float>(row[static_cast<std::size_t>(d)]));
        }
  }
  return x;
}

/// Bytes of a tensor of layout l with elements of e bytes, filled with `fill`.
inline std::vector<std::byte> buffer(const Layout& l, std::size_t e, unsigned char fill) {
  return std::vector<std::byte>(static_cast<std::size_t>(l.span_elems()) * e + 16, std::byte{fill});
}

/// What a rank's call wrote: its output and output LSE buffers, bytes as they are.
struct DecodeResult {
  std::vector<std::byte> out, out_lse;
};

/// Runs case c on this rank of `comm` (host memory, HostDecodeExecutor) `calls` times and checks
/// the merged output and LSE: bit for bit against merge_rows() of the stored partials in
/// ascending rank order with -inf where a rank saw no key (so a case whose empty rows store +inf
/// or NaN must give the bits of -inf there: C18), and against single-rank attention in double
/// (tolerance: 2e-6 for fp32 partials and output, 1.6e-2 when either is 16-bit; LSE 1e-5).
/// Returns "" or what differs; `result`, when given, receives the output buffers.
template <class Comm>
std::string run_decode_case(Comm& comm, const DecodeCase& c, int calls = 2, DecodeResult* result = nullptr) {
  const int r = comm.rank();
  const Problem pb(c);
  const Partials parts = partials_of(c, pb);
  const DecodePlan plan(spec_of(c, r), r);
  const Layouts l = layouts_of(c, plan.spec().heads, r);
  const auto ein = size_of(c.partial_type), eout = size_of(c.out_type);
  // This rank's inputs in its layouts.
  std::vector<std::byte> in = buffer(l.partial, ein, 0x7f), lse_in = buffer(l.lse, 4, 0x7f);
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t t = 0; t < c.T; ++t)
      for (std::int64_t h = 0; h < c.H; ++h) {
        const std::int64_t i = (b * c.T + t) * c.H + h;
        std::memcpy(in.data() + l.partial.offset(b, t, h, 0) * static_cast<std::int64_t>(ein),
                    parts.o[static_cast<std::size_t>(r)].data() + i * c.Dv * static_cast<std::int64_t>(ein), static_cast<std::size_t>(c.Dv) * ein);
        std::memcpy(lse_in.data() + l.lse.offset(b, t, h, 0) * 4, &parts.lse[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)], 4);
      }
  std::vector<std::byte> out = buffer(l.out, eout, 0x5a), out_lse = buffer(l.out_lse, 4, 0x5a), ws(plan.workspace_bytes() + 16);
  const DecodeBuffers bufs = DecodeBuffers().partial(in).lse(lse_in).out(out).out_lse(out_lse).workspace(ws);
  const HostDecodeExecutor exec;
  for (int k = 0; k < calls; ++k) decode_exchange(plan, comm, exec, bufs);
  if (result) *result = DecodeResult{out, out_lse};

  std::ostringstream err;
  int bad = 0;
  const std::int64_t h0 = c.output == DecodeOutput::all_heads ? 0 : plan.head_begin();
  const std::int64_t Ho = plan.out_heads();
  const bool sixteen = ein == 2 || eout == 2;
  const double tol = sixteen ? 1.6e-2 : 2e-6;
  std::vector<double> ref(static_cast<std::size_t>(c.Dv));
  std::vector<std::byte> want(static_cast<std::size_t>(c.Dv) * eout);
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t t = 0; t < c.T; ++t)
      for (std::int64_t j = 0; j < Ho; ++j) {
        const std::int64_t h = h0 + j, i = (b * c.T + t) * c.H + h;
        std::vector<const void*> rows;
        std::vector<float> lses;
        for (int p = 0; p < c.P; ++p) {
          rows.push_back(parts.o[static_cast<std::size_t>(p)].data() + i * c.Dv * static_cast<std::int64_t>(ein));
          const float l = parts.lse[static_cast<std::size_t>(p)][static_cast<std::size_t>(i)];
          lses.push_back(std::isfinite(l) ? l : -std::numeric_limits<float>::infinity());  // the reference: -inf where empty
        }
        const float want_lse = merge_rows(rows.data(), c.partial_type, lses.data(), c.P, c.Dv, want.data(), c.out_type, c.base);
        const std::byte* got = out.data() + l.out.offset(b, t, j, 0) * static_cast<std::int64_t>(eout);
        float got_lse;
        std::memcpy(&got_lse, out_lse.data() + l.out_lse.offset(b, t, j, 0) * 4, 4);
        const double lse_ref = attend(c, pb, b, t, h, -1, ref.data());
        auto report = [&](const std::string& what) {
          if (bad++ < 8) err << "rank " << r << " (b=" << b << ",t=" << t << ",h=" << h << "): " << what << "\n";
        };
        if (std::memcmp(got, want.data(), want.size()) != 0) report("output differs from the ascending-rank merge of the same partials");
        if (keys_of(c, b) == 0) {  // no key anywhere: exactly 0 and -inf, as documented
          for (std::size_t k = 0; k < want.size(); ++k)
            if (got[k] != std::byte{0}) {
              report("a row with no key anywhere is not exactly 0");
              break;
            }
          if (!(std::isinf(got_lse) && got_lse < 0)) report("a row with no key anywhere has LSE " + std::to_string(got_lse) + ", not -inf");
        }
        if (std::memcmp(&got_lse, &want_lse, 4) != 0) report("LSE " + std::to_string(got_lse) + " != merge's " + std::to_string(want_lse));
        const double lse_got = c.base == LseBase::two ? got_lse * std::log(2.0) : got_lse;
        if (std::isinf(lse_ref)) {
          if (!(std::isinf(got_lse) && got_lse < 0)) report("LSE of a row with no key is " + std::to_string(got_lse) + ", not -inf");
        } else if (std::fabs(lse_got - lse_ref) > 1e-5 * std::max(1.0, std::fabs(lse_ref))) {
          report("LSE " + std::to_string(lse_got) + " vs attention in double " + std::to_string(lse_ref));
        }
        for (std::int64_t d = 0; d < c.Dv; ++d) {
          const float x = load(got + d * static_cast<std::int64_t>(eout), c.out_type);
          if (!(std::fabs(x - ref[static_cast<std::size_t>(d)]) <= tol)) {  // NaN fails too
            report("element " + std::to_string(d) + " = " + std::to_string(x) + " vs attention in double " + std::to_string(ref[static_cast<std::size_t>(d)]));
            break;
          }
        }
      }
  return err.str();
}

}  // namespace ud
