// SPDX-License-Identifier: Apache-2.0
// Ulysses attention on P ranks (DeepSpeed-Ulysses, arXiv:2309.14509), forward and (--backward)
// backward, through the library's drop-in distributed_attention() (docs/attention.md) around this
// demo's fp32 kernels (ring_attention.hpp's step_attention(), step_backward()); no driver of its own:
//   forward:  q, k, v seq-sharded [B, S_r, H, D] (in --layout) → seq→head (ONE exchange for q, k
//             and v, GQA included) → exact softmax attention over the whole sequence for the
//             rank's heads → head→seq of the output o;
//   backward: do seq-sharded → seq→head → attention backward for the rank's heads (dq, and this
//             rank's partial dk, dv of the kv heads it holds) → head→seq that SUMS the partial
//             gradients of a kv head held by several ranks → dq, dk, dv seq-sharded;
// then times each exchange apart (the library's seq_to_head() etc. on the layer's plans) against
// the bare all-to-all of the same bytes, and compares o (and dq, dk, dv) with single-rank attention over the whole sequence computed in
// double precision. Runs on the in-process group (P threads, default) or under
// `mpiexec -n P ... --backend mpi`.
// --ring R: the same attention through Ulysses × Ring (P = U × R ranks, U = P / R; docs/ring.md):
//   seq→head inside each group of U ranks, R ring steps passing the k|v blocks (and in the
//   backward their fp32 dk|dv accumulators) around, the LSE merge in step order, head→seq; causal
//   (--causal) with the zigzag layout, else contiguous (examples/common/ring_attention.hpp, the
//   code test_ring_attention.cpp and test_ring_mpi.cpp run).
// --rope: q and k rotated by RoPE (layout/rope.hpp, half rotation) fused into the pack of
//   seq→head (RowTransforms::on_pack; q and k planned with_row_transforms()); with --backward dq
//   and dk get the inverse rotation on the unpack of seq_to_head_backward (Rope::inverse()). The
//   reference rotates in double on its own (rotate_rows()). With --ring R the hybrid through
//   distributed_attention() with the same RowTransforms (positions: the global token on every
//   ring rank); the reference is then case_reference() (ring_attention.hpp).
// --wire fp8_e4m3|fp8_e5m2|bfloat16: q and k (not v) travel seq→head on that wire
//   (TensorSpec::with_wire: an fp8 row as D bytes and its float32 amax scale); the attention runs
//   on the dequantized q and k. Checked against a double reference computed from q and k through
//   the same wire round trip (layout/fp8.hpp), within the tolerance; and against the unquantized
//   reference within a bound derived from the wire's rounding (wire_bound(): each element within
//   2^-4 (e4m3), 2^-3 (e5m2), 2^-8 (bf16) relative plus a subnormal step, propagated through the
//   logits and the softmax).
// --bands G: the same layer again over G head bands (DistributedAttentionOptions::bands):
//   seq→head of band g + 1 and head→seq of band g − 1 move while the attention of band g runs;
//   o (and dq, dk, dv) must be the unbanded call's bits, element for element. With --ring R: the
//   hybrid again over G bands × R ring steps, compared bit for bit with the unbanded hybrid.
// --device cuda: the exchanges on the GPU, one by one (distributed_attention() takes host
//   buffers only): the one path with a driver of its own (exchange_layer()).
#include <ulysses/layout/fp8.hpp>
#include <ulysses/ulysses.hpp>
#if ULYSSES_DEMO_MPI
#include <ulysses/comm/mpi.hpp>
#include <ulysses/ring/mpi_mesh.hpp>
#endif
#if ULYSSES_DEMO_CUDA
#include "cuda_backend.hpp"
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli.hpp"
#include "decode_demo.hpp"  // --decode: one decode step of decode context parallelism
#include "group.hpp"
#include "models.hpp"
#include "ring_attention.hpp"  // --ring: the whole attention through Ulysses x Ring

namespace {

using namespace ulysses;
using Clock = std::chrono::steady_clock;

struct Config {
  int ranks = 4;
  std::int64_t batch = 1, seq = 1024, heads = 32, kv_heads = 8, head_dim = 128, v_head_dim = 128;
  Format layout = Format::bshd;
  std::string model = "Llama-3.1-8B";
  std::string backend = "local";
  std::string device = "cpu";  // --device cuda: redistributions on the GPU (P virtual ranks on one device)
  bool balanced = false;       // head split
  bool backward = false;       // --backward: the attention backward through the adjoints too
  bool ranks_given = false;    // --ranks on the command line (checked against the MPI world size)
  bool seq_given = false;
  bool layout_given = false;
  int ring = 0;                // --ring R: Ulysses x Ring with ring degree R (0: Ulysses alone)
  bool allgather = false;      // --allgather-kv: all-gather-KV context parallelism over the P ranks
  std::vector<std::int64_t> docs;  // --docs L1,L2,...: packed documents (cu_seqlens from the lengths; S = their sum)
  bool causal = false;         // --causal (with --ring): causal attention, zigzag layout
  double tolerance = 1e-4;
  bool rope = false;           // --rope: q and k rotated (RoPE) in the pack of seq->head
  double rope_theta = 10000.0; // --rope-theta: its base
  Wire wire = Wire::element;   // --wire: q and k on that wire in seq->head (v on its elements)
  int warmup = 2, repeat = 5;  // timing: untimed runs, then timed runs of each exchange (median)
  int bands = 0;               // --bands G: the layer again through the head-band pipeline (0: not run)
};

/// The timed exchanges of a layer: forward seq->head (q, k, v), head->seq (o); backward
/// seq->head (do) and head->seq (dq, dk, dv, summed).
constexpr int kExchanges = 4;
constexpr const char* kExchangeNames[kExchanges] = {"fwd seq->head q,k,v", "fwd head->seq o", "bwd seq->head do",
                                                    "bwd head->seq dq,dk,dv (summed)"};

/// One rank's measurements (max abs errors against the double-precision reference, phase times
/// of the checked run, and the timed exchanges). Every field is reduced by max over ranks.
struct Result {
  double err_o = 0, err_dq = 0, err_dk = 0, err_dv = 0, err_unsummed = 0;
  // --wire: o against the unquantized reference; the largest |dequantized - original| of a received
  // q or k element over its element bound (<= 1: the bound holds); the largest logit change
  // |q^.k^ - q.k| / sqrt(D) of the reference (the a posteriori bound's input)
  double err_unquantized = 0, element_ratio = 0, logit_delta = 0;
  double pack_ms = 0, exchange_ms = 0, unpack_ms = 0, attention_ms = 0;
  double bytes_s2h = 0, bytes_h2s = 0, bytes_replica = 0;
  // --bands: elements of o (and dq, dk, dv) where the banded layer differs from the unbanded one
  // (bitwise), and the banded layer's time (the checked run: exchanges and attention)
  double bands_diff = 0, bands_ms = 0;
  // Timed between barriers after a warm-up, median of the runs: the exchange, the bare
  // all-to-all of the same bytes, and the bytes (this rank's input tensors, its own chunk included).
  double ms[kExchanges] = {}, bare_ms[kExchanges] = {}, bytes[kExchanges] = {};
  Path path = Path::alltoallv;  // the transport the exchanges took
  static constexpr int kHead = 17;
  static constexpr int kFields = kHead + 3 * kExchanges;
  void to(double* v) const {
    const double head[kHead] = {err_o, err_dq, err_dk, err_dv, err_unsummed, pack_ms, exchange_ms, unpack_ms, attention_ms,
                                bytes_s2h, bytes_h2s, bytes_replica, err_unquantized, element_ratio, logit_delta, bands_diff, bands_ms};
    std::copy(head, head + kHead, v);
    std::copy(ms, ms + kExchanges, v + kHead);
    std::copy(bare_ms, bare_ms + kExchanges, v + kHead + kExchanges);
    std::copy(bytes, bytes + kExchanges, v + kHead + 2 * kExchanges);
  }
  void from(const double* v) {
    double* head[kHead] = {&err_o, &err_dq, &err_dk, &err_dv, &err_unsummed, &pack_ms, &exchange_ms, &unpack_ms, &attention_ms,
                           &bytes_s2h, &bytes_h2s, &bytes_replica, &err_unquantized, &element_ratio, &logit_delta, &bands_diff,
                           &bands_ms};
    for (int i = 0; i < kHead; ++i) *head[i] = v[i];
    std::copy(v + kHead, v + kHead + kExchanges, ms);
    std::copy(v + kHead + kExchanges, v + kHead + 2 * kExchanges, bare_ms);
    std::copy(v + kHead + 2 * kExchanges, v + kHead + 3 * kExchanges, bytes);
  }
  /// Field-wise max with another rank's result (the path is every rank's same one).
  void max_with(const Result& o) {
    double a[kFields], b[kFields];
    to(a), o.to(b);
    for (int i = 0; i < kFields; ++i) a[i] = std::max(a[i], b[i]);
    from(a);
  }
};

// Deterministic input in [-1, 1): a hash of (tensor, b, s, h, d); tensors 0..3 are q, k, v, do.
float input_value(int t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
  std::uint64_t x = (((static_cast<std::uint64_t>(t) * 131 + b) * 1000003 + s) * 4099 + h) * 1031 + d;
  x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull, x ^= x >> 33;
  return static_cast<float>((x >> 40) * (1.0 / (1ull << 24)) * 2.0 - 1.0);
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

/// The median time of `repeat` runs of fn() after `warmup` untimed ones, each run between two
/// barriers of the group: the time from all ranks starting to all ranks done, so no rank's number
/// includes waiting for another's earlier work (attention, a previous exchange).
template <class Comm, class F>
double group_median_ms(Comm& comm, int warmup, int repeat, F&& fn) {
  for (int i = 0; i < warmup; ++i) {
    ulysses_group::barrier(comm);
    fn();
  }
  std::vector<double> t;
  for (int i = 0; i < repeat; ++i) {
    ulysses_group::barrier(comm);
    const auto t0 = Clock::now();
    fn();
    ulysses_group::barrier(comm);
    t.push_back(ms_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t.empty() ? 0 : t[t.size() / 2];
}

/// A rank's bytes of one exchange as the demo and ulysses_perf count them: its input tensors of
/// `plan` in direction `dir`, its own chunk included (as nccl-tests counts an all-to-all).
std::size_t input_bytes(const Plan& plan, Direction dir) {
  std::size_t bytes = 0;
  for (int t = 0; t < plan.num_tensors(); ++t) bytes += plan.input_bytes(dir, t);
  return bytes;
}

/// Times exchange i (`exchange()`, one call of the library) and the bare all-to-all-v of the same
/// bytes between contiguous buffers (P equal chunks of the input bytes of the rank with the most,
/// its own chunk included, as MPI_Alltoall and nccl-tests count them) into res.ms[i],
/// res.bare_ms[i], res.bytes[i] (`bytes`: this rank's input_bytes()). Collective.
template <class Comm, class F>
void time_exchange(int i, const Config& c, Comm& comm, std::size_t bytes, F&& exchange, Result& res) {
  res.bytes[i] = static_cast<double>(bytes);
  res.ms[i] = group_median_ms(comm, c.warmup, c.repeat, exchange);
  // The same counts on every rank (a rank's bytes differ under uneven splits): the largest.
  ulysses_group::BareAlltoall<> bare(comm.size(), ulysses_group::max_over_ranks(comm, bytes));
  res.bare_ms[i] = group_median_ms(comm, c.warmup, c.repeat, [&] { bare.run(comm); });
}

/// The exchanges of one layer on a host communicator: the library's calls (q, k, v and their
/// gradients by name, <ulysses/attention_call.hpp>) with a host executor; `inverse` is head->seq
/// of a plan of any tensors (the owner's-copy comparison of --backward). phase_ms stays 0: the
/// host runs are timed whole (time_exchange()).
template <class Comm>
struct Exchanges {
  Comm& comm;
  HostExecutor exec{};
  double phase_ms[3] = {0, 0, 0};
  Path path(const Plan& p) const { return choose_path<Comm, HostExecutor>(p); }
  void seq_to_head(const Plan& p, const QkvIn& in, const QkvOut& out, Workspace ws, const RowTransforms& tx = {}) {
    ulysses::seq_to_head(p, comm, exec, in.list(), out.list(), ws, tx);
  }
  void head_to_seq(const Plan& p, ConstByteSpan in, ByteSpan out, Workspace ws) { ulysses::head_to_seq(p, comm, exec, in, out, ws); }
  void head_to_seq_backward(const Plan& p, ConstByteSpan in, ByteSpan out, Workspace ws) {
    ulysses::head_to_seq_backward(p, comm, exec, in, out, ws);
  }
  void seq_to_head_backward(const Plan& p, const QkvGradIn& in, const QkvGradOut& out, Workspace ws, const RowTransforms& tx = {}) {
    ulysses::seq_to_head_backward(p, comm, exec, in.list(), out.list(), ws, tx);
  }
  void inverse(const Plan& p, const TensorList<ConstByteSpan>& in, const TensorList<ByteSpan>& out, Workspace ws,
               const RowTransforms& tx = {}) {
    ulysses::head_to_seq(p, comm, exec, in, out, ws, tx);
  }
};

/// Whether run_rank() runs on a host communicator (--bands: the head-band pipeline runs there).
template <class Comm>
inline constexpr bool kHostComm = true;

/// Elements of x and y whose bits differ (their common length; a length mismatch counts whole).
double bits_differ(const std::vector<float>& x, const std::vector<float>& y) {
  double n = static_cast<double>(x.size() > y.size() ? x.size() - y.size() : y.size() - x.size());
  for (std::size_t i = 0; i < std::min(x.size(), y.size()); ++i) n += std::memcmp(&x[i], &y[i], sizeof(float)) != 0;
  return n;
}

#if ULYSSES_DEMO_CUDA
template <>
inline constexpr bool kHostComm<demo_cuda::Rank> = false;

/// --device cuda: every exchange is demo_cuda::Rank::redistribute() (the host tensors to the GPU,
/// pack, exchange, unpack there, back; the named buffers in the plan's order, Qkv::list()), its
/// phases timed with CUDA events into phase_ms (pack, exchange, unpack).
template <>
struct Exchanges<demo_cuda::Rank> {
  demo_cuda::Rank& comm;
  double phase_ms[3] = {0, 0, 0};
  Path path(const Plan& p) const { return comm.path(p); }
  void seq_to_head(const Plan& p, const QkvIn& in, const QkvOut& out, Workspace, const RowTransforms& = {}) {  // (--rope: refused with --device cuda)
    run(p, Direction::seq_to_head, in.list(), out.list());
  }
  void head_to_seq(const Plan& p, ConstByteSpan in, ByteSpan out, Workspace) { run(p, Direction::head_to_seq, {in}, {out}); }
  void head_to_seq_backward(const Plan& p, ConstByteSpan in, ByteSpan out, Workspace) { run(p, Direction::seq_to_head, {in}, {out}); }
  void seq_to_head_backward(const Plan& p, const QkvGradIn& in, const QkvGradOut& out, Workspace, const RowTransforms& = {}) {
    run(p, Direction::head_to_seq, in.list(), out.list());
  }
  void inverse(const Plan& p, const TensorList<ConstByteSpan>& in, const TensorList<ByteSpan>& out, Workspace, const RowTransforms& = {}) {
    run(p, Direction::head_to_seq, in, out);
  }
  void run(const Plan& p, Direction d, const TensorList<ConstByteSpan>& in, const TensorList<ByteSpan>& out) {
    comm.redistribute(p, d, in, out, phase_ms);
  }
};
#endif

/// Softmax attention of one head, forward and (optionally) backward, for the query rows
/// [row_begin, row_end) against all S keys. Rows are contiguous: Q [S, D], K [S, D], V [S, Dv],
/// dO [S, Dv]. Writes O and dQ of the rows processed; ADDS to dK and dV (every row contributes to
/// every key). Acc is the accumulation type: float for the ranks, double for the reference.
///   p_ij = softmax_j(q_i . k_j / sqrt(D)),  o_i = sum_j p_ij v_j;
///   dv_j += p_ij do_i,  ds_ij = p_ij (do_i . v_j - do_i . o_i),
///   dq_i = sum_j ds_ij k_j / sqrt(D),  dk_j += ds_ij q_i / sqrt(D).
template <class Acc, class In>
void attention_head(const In* Q, const In* K, const In* V, const In* dO, std::int64_t S, std::int64_t D, std::int64_t Dv,
                    std::int64_t row_begin, std::int64_t row_end, Acc* O, Acc* dQ, Acc* dK, Acc* dV) {
  const Acc scale = Acc(1) / std::sqrt(static_cast<Acc>(D));
  std::vector<Acc> p(static_cast<std::size_t>(S)), o(static_cast<std::size_t>(Dv));
  for (std::int64_t i = row_begin; i < row_end; ++i) {
    const In* q = Q + i * D;
    Acc mx = -INFINITY;
    for (std::int64_t j = 0; j < S; ++j) {
      Acc dot = 0;
      for (std::int64_t d = 0; d < D; ++d) dot += static_cast<Acc>(q[d]) * static_cast<Acc>(K[j * D + d]);
      p[j] = dot * scale;
      mx = std::max(mx, p[j]);
    }
    Acc sum = 0;
    for (std::int64_t j = 0; j < S; ++j) sum += p[j] = std::exp(p[j] - mx);
    std::fill(o.begin(), o.end(), Acc(0));
    for (std::int64_t j = 0; j < S; ++j) {
      p[j] /= sum;
      for (std::int64_t d = 0; d < Dv; ++d) o[d] += p[j] * static_cast<Acc>(V[j * Dv + d]);
    }
    if (O) std::copy(o.begin(), o.end(), O + i * Dv);
    if (!dO) continue;
    const In* g = dO + i * Dv;
    Acc delta = 0;  // do_i . o_i
    for (std::int64_t d = 0; d < Dv; ++d) delta += static_cast<Acc>(g[d]) * o[d];
    for (std::int64_t d = 0; d < D; ++d) dQ[i * D + d] = 0;
    for (std::int64_t j = 0; j < S; ++j) {
      Acc dp = 0;
      for (std::int64_t d = 0; d < Dv; ++d) {
        dp += static_cast<Acc>(g[d]) * static_cast<Acc>(V[j * Dv + d]);
        dV[j * Dv + d] += p[j] * static_cast<Acc>(g[d]);
      }
      const Acc ds = p[j] * (dp - delta) * scale;
      for (std::int64_t d = 0; d < D; ++d) {
        dQ[i * D + d] += ds * static_cast<Acc>(K[j * D + d]);
        dK[j * D + d] += ds * static_cast<Acc>(q[d]);
      }
    }
  }
}

/// --rope's rotation of the reference, in double, written here apart from the library's Rope: each
/// of the S rows of x ([S, D], row s at global token s) has its pairs (i, i + D/2), i < D/2,
/// rotated by the angle sign * s * theta^(-2i/D): x' = x cos - y sin, y' = y cos + x sin (sign -1:
/// the transpose R^T, what the gradient of a rotated row needs).
void rotate_rows(std::vector<double>& x, std::int64_t S, std::int64_t D, double theta, double sign) {
  const std::int64_t half = D / 2;
  for (std::int64_t s = 0; s < S; ++s)
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle = sign * static_cast<double>(s) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
      const double cs = std::cos(angle), sn = std::sin(angle);
      double& a = x[static_cast<std::size_t>(s * D + i)];
      double& b = x[static_cast<std::size_t>(s * D + i + half)];
      const double xa = a, yb = b;
      a = xa * cs - yb * sn;
      b = yb * cs + xa * sn;
    }
}

/// --wire's round trip of one row of n float32 elements, as the library carries a float32 head
/// row on the wire: fp8, row_amax(), fp8_scale_of(), quantize_fp8(), dequantize_fp8()
/// (layout/fp8.hpp, the codec the executor runs); bfloat16, each element rounded to nearest even
/// and widened back (exact). Written from the codec's public functions, not the executor's code.
void wire_round_trip(Wire w, float* x, std::int64_t n) {
  if (w == Wire::fp8_e4m3 || w == Wire::fp8_e5m2) {
    const Fp8Format f = w == Wire::fp8_e4m3 ? Fp8Format::e4m3 : Fp8Format::e5m2;
    std::vector<std::uint8_t> q(static_cast<std::size_t>(n));
    const float scale = fp8_scale_of(row_amax(x, n), f);
    quantize_fp8(x, n, scale, f, q.data());
    dequantize_fp8(q.data(), n, scale, f, x);
  } else if (w == Wire::bfloat16) {
    for (std::int64_t i = 0; i < n; ++i) x[i] = detail::bfloat16_to_float(detail::float_to_bfloat16(x[i]));
  }
}

/// What one wire round trip may do to an element x of a row whose largest magnitude is amax:
/// |x^ - x| <= eps |x| + unit * amax + abs. fp8 with m mantissa bits: the scaled value x / scale
/// (scale = max(amax / fp8_max, FLT_MIN): fp8_scale_of()) rounds to nearest, half an ulp, 2^-(m+1)
/// relative (e4m3 2^-4, e5m2 2^-3) in the normal range, and half a subnormal step below it
/// (2^(emin-m-1) * scale: e4m3 2^-10 / 448, e5m2 2^-17 / 57344 of amax, and at the FLT_MIN floor,
/// rows with amax < fp8_max * FLT_MIN, 2^-136 and 2^-143 absolute); the float32 division, the
/// product and the scale's own rounding add 2^-24 relative each (2^-22 and 2^-20 cover them).
/// bfloat16: 2^-8 relative (8 significant bits), subnormals far below these inputs (2^-133 absolute).
struct WireElementBound {
  double eps = 0, unit = 0, abs = 0;
};
WireElementBound wire_element_bound(Wire w) {
  const double slack = std::ldexp(1.0, -22), scale_slack = 1 + std::ldexp(1.0, -20);
  switch (w) {
    case Wire::fp8_e4m3: return {std::ldexp(1.0, -4) + slack, std::ldexp(1.0, -10) / 448.0 * scale_slack, std::ldexp(1.0, -136)};
    case Wire::fp8_e5m2: return {std::ldexp(1.0, -3) + slack, std::ldexp(1.0, -17) / 57344.0 * scale_slack, std::ldexp(1.0, -143)};
    case Wire::bfloat16: return {std::ldexp(1.0, -8), 0, std::ldexp(1.0, -133)};
    default: return {};
  }
}

/// The a priori bound on a logit change |q^.k^ - q.k| / sqrt(D) from the element bound alone
/// (|dq_d| <= eps |q_d| + dq, dq = unit * amax_q + abs; the same for k):
///   |dq.k + q.dk + dq.dk| <= (2 eps + eps^2) |q|_2 |k|_2 + (1 + eps)(dq |k|_1 + dk |q|_1) + D dq dk
/// (Cauchy-Schwarz on sum |q_d||k_d|), with the largest norms and amax over all rows of q and k of
/// the inputs; and max |v|. Worst case: every element's error aligned with the dot product.
struct WireBound {
  double logit = 0, vmax = 0;
};
WireBound wire_bound(const Config& c) {
  const WireElementBound e = wire_element_bound(c.wire);
  double n2[2] = {0, 0}, n1[2] = {0, 0}, amax[2] = {0, 0}, vmax = 0;
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t s = 0; s < c.seq; ++s) {
      for (int t = 0; t < 2; ++t)
        for (std::int64_t h = 0; h < (t == 0 ? c.heads : c.kv_heads); ++h) {
          double l2 = 0, l1 = 0, m = 0;
          for (std::int64_t d = 0; d < c.head_dim; ++d) {
            const double x = std::abs(static_cast<double>(input_value(t, b, s, h, d)));
            l2 += x * x, l1 += x, m = std::max(m, x);
          }
          n2[t] = std::max(n2[t], std::sqrt(l2)), n1[t] = std::max(n1[t], l1), amax[t] = std::max(amax[t], m);
        }
      for (std::int64_t h = 0; h < c.kv_heads; ++h)
        for (std::int64_t d = 0; d < c.v_head_dim; ++d) vmax = std::max(vmax, std::abs(static_cast<double>(input_value(2, b, s, h, d))));
    }
  const double dq = e.unit * amax[0] + e.abs, dk = e.unit * amax[1] + e.abs, D = static_cast<double>(c.head_dim);
  const double dot = (2 * e.eps + e.eps * e.eps) * n2[0] * n2[1] * 1.000001 + (1 + e.eps) * (dq * n1[1] + dk * n1[0]) + D * dq * dk;
  return {dot / std::sqrt(D), vmax};
}

/// Softmax attention's output moves by at most (e^(2 delta) - 1) max|v| when every logit of its
/// row moves by at most delta: p'_j / p_j = e^(ds_j) / sum_l p_l e^(ds_l) lies in [e^-2delta, e^2delta],
/// so |o' - o| = |sum_j (p'_j - p_j) v_j| <= sum_j |p'_j - p_j| max|v| <= (e^(2 delta) - 1) max|v|.
double output_bound(double delta, double vmax) { return std::expm1(2 * delta) * vmax; }

/// Single-rank attention over the whole sequence in double precision, from the global inputs:
/// o (and with `backward` dq, dk, dv) dense [B][S][heads][D]. o and dq are computed for the query
/// rows `rows` only (all rows when backward: every row contributes to dk and dv). kv heads are
/// spread over the machine's threads.
/// --wire: o from q and k through the wire's round trip (wire_round_trip(), what the ranks'
/// attention sees), o_unquantized from the original q and k, and logit_delta the largest
/// |q^.k^ - q.k| / sqrt(D) over the rows computed and all keys.
struct Reference {
  std::vector<double> o, dq, dk, dv;
  std::vector<double> o_unquantized;
  double logit_delta = 0;
};
Reference reference(const Config& c, const std::vector<std::int64_t>& rows, bool backward) {
  const std::int64_t B = c.batch, S = c.seq, H = c.heads, Hkv = c.kv_heads, D = c.head_dim, Dv = c.v_head_dim, g = H / Hkv;
  Reference ref;
  ref.o.assign(static_cast<std::size_t>(B * S * H * Dv), 0.0);
  if (backward) {
    ref.dq.assign(static_cast<std::size_t>(B * S * H * D), 0.0);
    ref.dk.assign(static_cast<std::size_t>(B * S * Hkv * D), 0.0);
    ref.dv.assign(static_cast<std::size_t>(B * S * Hkv * Dv), 0.0);
  }
  const bool wired = c.wire != Wire::element;
  if (wired) ref.o_unquantized.assign(ref.o.size(), 0.0);
  std::vector<double> deltas(static_cast<std::size_t>(B * Hkv), 0.0);
  auto work = [&](std::int64_t b, std::int64_t kv) {
    auto global = [&](int t, std::int64_t h, std::int64_t dim) {
      std::vector<double> x(static_cast<std::size_t>(S * dim));
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t d = 0; d < dim; ++d) x[static_cast<std::size_t>(s * dim + d)] = input_value(t, b, s, h, d);
      return x;
    };
    auto round_trip = [&](const std::vector<double>& x, std::int64_t dim) {  // --wire: each row through the wire
      std::vector<double> y(x.size());
      std::vector<float> row(static_cast<std::size_t>(dim));
      for (std::int64_t s = 0; s < S; ++s) {
        for (std::int64_t d = 0; d < dim; ++d) row[static_cast<std::size_t>(d)] = static_cast<float>(x[static_cast<std::size_t>(s * dim + d)]);
        wire_round_trip(c.wire, row.data(), dim);
        for (std::int64_t d = 0; d < dim; ++d) y[static_cast<std::size_t>(s * dim + d)] = row[static_cast<std::size_t>(d)];
      }
      return y;
    };
    auto K = global(1, kv, D);
    std::vector<double> K_raw;
    if (wired) K_raw = K, K = round_trip(K_raw, D);  // attention sees the dequantized k
    const auto V = global(2, kv, Dv);
    if (c.rope) rotate_rows(K, S, D, c.rope_theta, 1.0);  // attention sees the rotated k
    std::vector<double> O(static_cast<std::size_t>(S * Dv)), dQ(static_cast<std::size_t>(S * D)), dK(static_cast<std::size_t>(S * D), 0.0),
        dV(static_cast<std::size_t>(S * Dv), 0.0);
    for (std::int64_t h = kv * g; h < (kv + 1) * g; ++h) {
      auto Q = global(0, h, D);
      if (c.rope) rotate_rows(Q, S, D, c.rope_theta, 1.0);  // ... and the rotated q
      std::vector<double> Q_raw;
      if (wired) Q_raw = Q, Q = round_trip(Q_raw, D);  // ... and the dequantized q
      if (wired)  // the unquantized reference, and the logit changes (not with --backward)
        for (std::int64_t i : rows) {
          std::vector<double> O2(static_cast<std::size_t>(S * Dv));
          attention_head<double, double>(Q_raw.data(), K_raw.data(), V.data(), nullptr, S, D, Dv, i, i + 1, O2.data(), nullptr, nullptr, nullptr);
          for (std::int64_t d = 0; d < Dv; ++d)
            ref.o_unquantized[static_cast<std::size_t>(((b * S + i) * H + h) * Dv + d)] = O2[static_cast<std::size_t>(i * Dv + d)];
          double& m = deltas[static_cast<std::size_t>(b * Hkv + kv)];
          for (std::int64_t j = 0; j < S; ++j) {
            double a = 0, e = 0;
            for (std::int64_t d = 0; d < D; ++d) {
              a += Q_raw[static_cast<std::size_t>(i * D + d)] * K_raw[static_cast<std::size_t>(j * D + d)];
              e += Q[static_cast<std::size_t>(i * D + d)] * K[static_cast<std::size_t>(j * D + d)];
            }
            m = std::max(m, std::abs(e - a) / std::sqrt(static_cast<double>(D)));
          }
        }
      if (backward) {
        const auto dO = global(3, h, Dv);
        attention_head<double>(Q.data(), K.data(), V.data(), dO.data(), S, D, Dv, 0, S, O.data(), dQ.data(), dK.data(), dV.data());
        if (c.rope) rotate_rows(dQ, S, D, c.rope_theta, -1.0);  // dq = R^T (the gradient w.r.t. the rotated q)
      }
      for (std::int64_t i : rows) {
        if (!backward) attention_head<double, double>(Q.data(), K.data(), V.data(), nullptr, S, D, Dv, i, i + 1, O.data(), nullptr, nullptr, nullptr);
        for (std::int64_t d = 0; d < Dv; ++d) ref.o[static_cast<std::size_t>(((b * S + i) * H + h) * Dv + d)] = O[static_cast<std::size_t>(i * Dv + d)];
        if (backward)
          for (std::int64_t d = 0; d < D; ++d) ref.dq[static_cast<std::size_t>(((b * S + i) * H + h) * D + d)] = dQ[static_cast<std::size_t>(i * D + d)];
      }
    }
    if (backward && c.rope) rotate_rows(dK, S, D, c.rope_theta, -1.0);  // dk = R^T (the summed gradient w.r.t. the rotated k)
    if (backward)
      for (std::int64_t s = 0; s < S; ++s) {
        for (std::int64_t d = 0; d < D; ++d) ref.dk[static_cast<std::size_t>(((b * S + s) * Hkv + kv) * D + d)] = dK[static_cast<std::size_t>(s * D + d)];
        for (std::int64_t d = 0; d < Dv; ++d) ref.dv[static_cast<std::size_t>(((b * S + s) * Hkv + kv) * Dv + d)] = dV[static_cast<std::size_t>(s * Dv + d)];
      }
  };
  const std::int64_t jobs = B * Hkv;
  const int nt = static_cast<int>(std::min<std::int64_t>(jobs, std::max(1u, std::thread::hardware_concurrency())));
  std::vector<std::thread> th;
  for (int w = 0; w < nt; ++w)
    th.emplace_back([&, w] {
      for (std::int64_t j = w; j < jobs; j += nt) work(j / Hkv, j % Hkv);
    });
  for (auto& t : th) t.join();
  for (double d : deltas) ref.logit_delta = std::max(ref.logit_delta, d);
  return ref;
}

/// Rows of head h of batch b of a local tensor in layout l (d possibly strided), as contiguous
/// float rows: rows[s*D + d].
std::vector<float> rows_of(const std::vector<float>& x, const Layout& l, std::int64_t b, std::int64_t h) {
  std::vector<float> r(static_cast<std::size_t>(l.extent[1] * l.extent[3]));
  for (std::int64_t s = 0; s < l.extent[1]; ++s)
    for (std::int64_t d = 0; d < l.extent[3]; ++d) r[static_cast<std::size_t>(s * l.extent[3] + d)] = x[static_cast<std::size_t>(l.offset(b, s, h, d))];
  return r;
}

/// Max abs difference between a seq-sharded local tensor (layout l, this rank's chunks) and the
/// dense global reference [B][S][heads][dim].
double max_error(const std::vector<float>& x, const Layout& l, const std::vector<SeqChunk>& mine, const std::vector<double>& ref,
                 std::int64_t S) {
  double m = 0;
  const std::int64_t heads = l.extent[2], dim = l.extent[3];
  for (const SeqChunk& ch : mine)
    for (std::int64_t b = 0; b < l.extent[0]; ++b)
      for (std::int64_t s = 0; s < ch.length; ++s)
        for (std::int64_t h = 0; h < heads; ++h)
          for (std::int64_t d = 0; d < dim; ++d) {
            const double e = std::abs(ref[static_cast<std::size_t>(((b * S + ch.offset + s) * heads + h) * dim + d)] -
                                      x[static_cast<std::size_t>(l.offset(b, ch.local_offset + s, h, d))]);
            m = std::isnan(e) ? INFINITY : std::max(m, e);
          }
  return m;
}

/// A float buffer of `bytes` bytes.
std::vector<float> buffer(std::size_t bytes, float fill = 0.f) { return std::vector<float>(bytes / sizeof(float), fill); }

/// This rank's seq-sharded tensor t (0..3: q, k, v, do) of the global inputs, in layout l.
std::vector<float> seq_input(int t, const Layout& l, std::size_t bytes, const std::vector<SeqChunk>& mine) {
  std::vector<float> x = buffer(bytes);
  for (const SeqChunk& ch : mine)
    for (std::int64_t b = 0; b < l.extent[0]; ++b)
      for (std::int64_t s = 0; s < ch.length; ++s)
        for (std::int64_t h = 0; h < l.extent[2]; ++h)
          for (std::int64_t d = 0; d < l.extent[3]; ++d)
            x[static_cast<std::size_t>(l.offset(b, ch.local_offset + s, h, d))] = input_value(t, b, ch.offset + s, h, d);
  return x;
}

/// The layer's seq-sharded results on this rank (in the plans' seq layouts).
struct LayerOut {
  std::vector<float> out, dq, dk, dv;
};

/// This rank's head-side gradients of the layer's checked run (its query heads over all S
/// tokens, the plan's head layouts): dq, and dk, dv before the sum over a kv head's replicas.
struct HeadGrads {
  std::vector<float> dq, dk, dv;
};

/// --wire: every q and k element the kernel is given (dequantized from the wire) against its
/// element bound (wire_element_bound(): relative to the element and to the row's amax of the
/// original); the largest error / bound into res.element_ratio (<= 1: the bound holds).
void check_wire_elements(const AttentionStep& st, const Config& c, Result& res) {
  const WireElementBound eb = wire_element_bound(c.wire);
  for (int t = 0; t < 2; ++t) {
    const auto* x = static_cast<const float*>(t == 0 ? st.q : st.k);
    const AttentionStrides& sd = t == 0 ? st.q_stride : st.k_stride;
    const TokenRanges& tokens = t == 0 ? st.q_tokens : st.kv_tokens;
    const std::int64_t rows = t == 0 ? st.q_len : st.kv_len, heads = t == 0 ? st.heads.q_count : st.heads.kv_count,
                       h0 = t == 0 ? st.heads.q_global : st.heads.kv_global;
    for (std::int64_t b = 0; b < st.batch; ++b)
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t h = 0; h < heads; ++h) {
          const std::int64_t s = tokens.global(i);
          double amax = 0;
          for (std::int64_t d = 0; d < c.head_dim; ++d) amax = std::max(amax, std::abs(static_cast<double>(input_value(t, b, s, h0 + h, d))));
          for (std::int64_t d = 0; d < c.head_dim; ++d) {
            const double want = input_value(t, b, s, h0 + h, d), got = x[b * sd.batch + i * sd.row + h * sd.head + d];
            const double ratio = std::abs(got - want) / (eb.eps * std::abs(want) + eb.unit * amax + eb.abs);
            res.element_ratio = std::isnan(ratio) ? INFINITY : std::max(res.element_ratio, ratio);
          }
        }
  }
}

/// The layer on a host communicator through the library's drop-in attention: distributed_attention()
/// (with --backward distributed_attention_backward()) over `plan`, around the fp32 step kernels of
/// ring_attention.hpp (step_attention(), step_backward()), with --rope's transforms and the plan's
/// --wire and bands. The kernels' time adds to res.attention_ms; with --wire the forward kernel
/// checks the q and k it is given (check_wire_elements()); `grads`, when given, gets the one step's
/// head-side gradients (an unbanded plan of R = 1: all S rows of this rank's heads).
template <class Comm>
LayerOut library_layer(Comm& comm, const Config& c, const DistributedAttentionPlan& plan, const QkvIn& in, const std::vector<float>& dout,
                       const RowTransforms& tx, const RowTransforms& tx_back, Result& res, HeadGrads* grads) {
  const Plan &qkv = plan.qkv_plan(), &po = plan.out_plan();
  LayerOut r{buffer(po.seq_bytes(0)), {}, {}, {}};
  std::vector<std::byte> saved(plan.saved_bytes()), ws(std::max(plan.forward_workspace_bytes(), plan.backward_workspace_bytes()));
  auto forward = [&](const AttentionStep& st) {
    if (c.wire != Wire::element) check_wire_elements(st, c, res);
    const auto t0 = Clock::now();
    ulysses_ring_demo::step_attention(st);
    res.attention_ms += ms_since(t0);
  };
  distributed_attention(plan, comm, in, ByteSpan(r.out), forward, saved, ws, tx);
  if (!c.backward) return r;
  r.dq = buffer(qkv.seq_bytes(0)), r.dk = buffer(qkv.seq_bytes(1)), r.dv = buffer(qkv.seq_bytes(2));
  auto backward = [&](const AttentionGradStep& g) {
    const auto t0 = Clock::now();
    ulysses_ring_demo::step_backward(g);
    res.attention_ms += ms_since(t0);
    if (!grads) return;
    auto copy = [&](const float* p, std::int64_t rows, std::int64_t heads, std::int64_t dim) { return std::vector<float>(p, p + c.batch * rows * heads * dim); };
    grads->dq = copy(g.dq, g.fwd.q_len, g.fwd.heads.q_count, c.head_dim);
    grads->dk = copy(g.dk, g.fwd.kv_len, g.fwd.heads.kv_count, c.head_dim);
    grads->dv = copy(g.dv, g.fwd.kv_len, g.fwd.heads.kv_count, c.v_head_dim);
  };
  distributed_attention_backward(plan, comm, ConstByteSpan(dout), QkvGradOut().dq(r.dq).dk(r.dk).dv(r.dv), backward, saved, ws, tx_back);
  return r;
}

/// --device cuda: the layer exchange by exchange (distributed_attention() runs on host buffers
/// only): seq->head of q, k, v on the GPU, this rank's attention on the host (attention_head(),
/// fp32), head->seq of o; with --backward head->seq's adjoint of do, the gradients, and
/// seq->head's adjoint of dq, dk, dv (summed). `grads` gets the head-side gradients.
template <class Comm>
LayerOut exchange_layer(Exchanges<Comm>& ex, const Config& c, const AttentionSpecs& a, const Plan& qkv, const Plan& po, const QkvIn& in,
                        const std::vector<float>& dout, Result& res, HeadGrads& grads) {
  const int r = qkv.rank();
  const std::int64_t S = c.seq, Hr = a.query_heads.count(r);
  const Layout &lq = qkv.head_layout(0), &lk = qkv.head_layout(1), &lv = qkv.head_layout(2), &lo = po.head_layout(0);
  std::vector<std::byte> ws(std::max(qkv.workspace_bytes(), po.workspace_bytes()));
  std::vector<float> q2 = buffer(qkv.head_bytes(0)), k2 = buffer(qkv.head_bytes(1)), v2 = buffer(qkv.head_bytes(2)), o = buffer(po.head_bytes(0)), do2;
  ex.seq_to_head(qkv, in, QkvOut().q(q2).k(k2).v(v2), ws);
  if (c.backward) {
    do2 = buffer(po.head_bytes(0));
    ex.head_to_seq_backward(po, dout, do2, ws);
    grads.dq = buffer(qkv.head_bytes(0)), grads.dk = buffer(qkv.head_bytes(1)), grads.dv = buffer(qkv.head_bytes(2));
  }
  std::vector<float> O(static_cast<std::size_t>(S * c.v_head_dim)), dQ(static_cast<std::size_t>(S * c.head_dim)),
      dK(static_cast<std::size_t>(S * c.head_dim)), dV(static_cast<std::size_t>(S * c.v_head_dim));
  const auto t0 = Clock::now();
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t h = 0; h < Hr; ++h) {  // (ascending query heads: dk, dv add in that order)
      const std::int64_t kv = a.local_kv_head(r, h);
      const auto Q = rows_of(q2, lq, b, h), K = rows_of(k2, lk, b, kv), V = rows_of(v2, lv, b, kv);
      std::vector<float> G;
      if (c.backward) G = rows_of(do2, lo, b, h);
      std::fill(dK.begin(), dK.end(), 0.f), std::fill(dV.begin(), dV.end(), 0.f);
      attention_head<float>(Q.data(), K.data(), V.data(), c.backward ? G.data() : nullptr, S, c.head_dim, c.v_head_dim, 0, S, O.data(),
                            dQ.data(), dK.data(), dV.data());
      for (std::int64_t s = 0; s < S; ++s) {
        for (std::int64_t d = 0; d < c.v_head_dim; ++d) o[static_cast<std::size_t>(lo.offset(b, s, h, d))] = O[static_cast<std::size_t>(s * c.v_head_dim + d)];
        if (!c.backward) continue;
        for (std::int64_t d = 0; d < c.head_dim; ++d) {
          grads.dq[static_cast<std::size_t>(lq.offset(b, s, h, d))] = dQ[static_cast<std::size_t>(s * c.head_dim + d)];
          grads.dk[static_cast<std::size_t>(lk.offset(b, s, kv, d))] += dK[static_cast<std::size_t>(s * c.head_dim + d)];
        }
        for (std::int64_t d = 0; d < c.v_head_dim; ++d) grads.dv[static_cast<std::size_t>(lv.offset(b, s, kv, d))] += dV[static_cast<std::size_t>(s * c.v_head_dim + d)];
      }
    }
  res.attention_ms = ms_since(t0);
  LayerOut out{buffer(po.seq_bytes(0)), {}, {}, {}};
  ex.head_to_seq(po, o, out.out, ws);
  if (!c.backward) return out;
  out.dq = buffer(qkv.seq_bytes(0)), out.dk = buffer(qkv.seq_bytes(1)), out.dv = buffer(qkv.seq_bytes(2));
  ex.seq_to_head_backward(qkv, QkvGradIn().dq(grads.dq).dk(grads.dk).dv(grads.dv), QkvGradOut().dq(out.dq).dk(out.dk).dv(out.dv), ws);
  return out;
}

/// Times the layer's exchanges on its plans (the library's calls alone; seq->head from the
/// layer's inputs `in`, the others on zero-filled buffers of their own) against the bare
/// all-to-all-v of the same bytes. Collective; a host communicator with allgather() (the barriers).
template <class Comm>
void time_layer_exchanges(Exchanges<Comm>& ex, const Config& c, const Plan& qkv, const Plan& po, const QkvIn& in, const RowTransforms& tx,
                          const RowTransforms& tx_back, Result& res) {
  std::vector<std::byte> ws(std::max(qkv.workspace_bytes(), po.workspace_bytes()));
  std::vector<float> q = buffer(qkv.seq_bytes(0)), k = buffer(qkv.seq_bytes(1)), v = buffer(qkv.seq_bytes(2)), q2 = buffer(qkv.head_bytes(0)),
                     k2 = buffer(qkv.head_bytes(1)), v2 = buffer(qkv.head_bytes(2)), o2 = buffer(po.head_bytes(0)), o = buffer(po.seq_bytes(0));
  const QkvOut heads = QkvOut().q(q2).k(k2).v(v2);
  time_exchange(0, c, ex.comm, input_bytes(qkv, Direction::seq_to_head), [&] { ex.seq_to_head(qkv, in, heads, ws, tx); }, res);
  time_exchange(1, c, ex.comm, input_bytes(po, Direction::head_to_seq), [&] { ex.head_to_seq(po, o2, o, ws); }, res);
  if (!c.backward) return;
  const QkvGradIn grad_in = QkvGradIn().dq(q2).dk(k2).dv(v2);
  const QkvGradOut grad_out = QkvGradOut().dq(q).dk(k).dv(v);
  time_exchange(2, c, ex.comm, input_bytes(po, Direction::seq_to_head), [&] { ex.head_to_seq_backward(po, o, o2, ws); }, res);
  time_exchange(3, c, ex.comm, input_bytes(qkv, Direction::head_to_seq), [&] { ex.seq_to_head_backward(qkv, grad_in, grad_out, ws, tx_back); }, res);
}

template <class Comm>
Result run_rank(Comm& comm, const Config& c, const Reference* shared_ref) {
  Result res;
  const int P = comm.size(), r = comm.rank();
  const auto seq = SeqPartition::balanced(c.seq, P);
  const std::vector<SeqChunk> mine = seq.chunks_of(r);
  // q, k, v in one plan (one exchange), the output o in another, both made by the layer's
  // DistributedAttentionPlan: the engine's tensors in --layout, the head side bshd; k and v serve
  // q and sum their replicas in head→seq (the backward of seq→head).
  AttentionSpecs a = attention_specs<float>(P, {c.heads, c.kv_heads, c.head_dim, c.v_head_dim}, c.balanced ? HeadPolicy::balanced : HeadPolicy::even);
  // --rope: q and k planned row by row, so that the call's RowTransforms rotate them in the copy.
  a.q.with_row_transforms(c.rope);
  a.k.with_row_transforms(c.rope);
  // --wire: q and k travel on that wire (each head row quantized on pack, dequantized on unpack).
  if (c.wire != Wire::element) {
    a.q.with_wire(c.wire);
    a.k.with_wire(c.wire);
  }
  DistributedAttentionOptions opt;
  opt.seq_format = c.layout;
  const DistributedAttentionPlan layer({P, r}, c.batch, seq, a, false, opt);
  const Plan &qkv = layer.qkv_plan(), &po = layer.out_plan();
  // RoPE of q and k fused into the pack of seq->head (positions: the global token), and its
  // inverse on the unpack of the backward's head->seq of dq and dk (empty without --rope).
  std::optional<Rope> rope, rope_inv;
  RowTransforms tx, tx_back;
  if (c.rope) {
    rope.emplace(c.head_dim, c.seq, c.rope_theta, 0, RopeStyle::half);
    rope_inv.emplace(rope->inverse());
    tx.on_pack(0, *rope).on_pack(1, *rope);
    tx_back.on_unpack(0, *rope_inv).on_unpack(1, *rope_inv);
  }
  Exchanges<Comm> ex{comm};
  res.path = ex.path(qkv);
  const std::vector<float> q = seq_input(0, qkv.seq_layout(0), qkv.seq_bytes(0), mine), k = seq_input(1, qkv.seq_layout(1), qkv.seq_bytes(1), mine),
                           v = seq_input(2, qkv.seq_layout(2), qkv.seq_bytes(2), mine);
  const std::vector<float> dout = c.backward ? seq_input(3, po.seq_layout(0), po.seq_bytes(0), mine) : std::vector<float>{};
  const QkvIn qkv_in = QkvIn().q(q).k(k).v(v);

  // ---- the layer: host communicators through distributed_attention(), --device cuda exchange by exchange ----
  HeadGrads grads;
  LayerOut got;
  if constexpr (kHostComm<Comm>) {
    got = library_layer(comm, c, layer, qkv_in, dout, tx, tx_back, res, &grads);
  } else {
    got = exchange_layer(ex, c, a, qkv, po, qkv_in, dout, res, grads);
  }
  constexpr bool timed = PathSupport<Comm, HostExecutor>::same_memory && detail::has_allgather<Comm>::value;
  if constexpr (timed) time_layer_exchanges(ex, c, qkv, po, qkv_in, tx, tx_back, res);  // after the checked run, on buffers of their own
  res.bytes_s2h = static_cast<double>(input_bytes(qkv, Direction::seq_to_head));
  res.bytes_h2s = static_cast<double>(input_bytes(po, Direction::head_to_seq));
  std::vector<float> dk_unsummed, dv_unsummed;
  if (c.backward) {
    res.bytes_replica = static_cast<double>(qkv.replica_bytes(Direction::head_to_seq));
    // What an engine that takes one rank's copy instead of the sum gets (the fault this prevents):
    // the same head-side gradients through a plan whose k and v take their owner's copy.
    Plan owner({P, r}, c.batch, seq,
               {qkv.tensor(0), TensorSpec(qkv.tensor(1)).with_replicas(Replicas::owner), TensorSpec(qkv.tensor(2)).with_replicas(Replicas::owner)},
               Format::bshd);
    std::vector<float> dq_u = buffer(owner.seq_bytes(0));
    dk_unsummed = buffer(owner.seq_bytes(1)), dv_unsummed = buffer(owner.seq_bytes(2));
    std::vector<std::byte> ws_u(owner.workspace_bytes());
    ex.inverse(owner, {grads.dq, grads.dk, grads.dv}, {dq_u, dk_unsummed, dv_unsummed}, ws_u, tx_back);
  }

  // ---- --bands G: the layer again through distributed_attention() over G head bands, compared bit for bit ----
  if constexpr (kHostComm<Comm>) {
    if (c.bands > 0) {
      const auto tb = Clock::now();
      DistributedAttentionOptions ob = opt;
      ob.bands = c.bands;
      Result scratch;
      const LayerOut banded = library_layer(comm, c, DistributedAttentionPlan({P, r}, c.batch, seq, a, false, ob), qkv_in, dout, tx, tx_back, scratch, nullptr);
      res.bands_diff = bits_differ(got.out, banded.out);
      if (c.backward) res.bands_diff += bits_differ(got.dq, banded.dq) + bits_differ(got.dk, banded.dk) + bits_differ(got.dv, banded.dv);
      res.bands_ms = ms_since(tb);
    }
  }

  // ---- compare with single-rank attention in double precision ----
  Reference own;
  if (!shared_ref) {
    std::vector<std::int64_t> rows;
    for (const SeqChunk& ch : mine)
      for (std::int64_t s = 0; s < ch.length; ++s) rows.push_back(ch.offset + s);
    own = reference(c, rows, c.backward);
    shared_ref = &own;
  }
  const std::int64_t S = c.seq;
  res.err_o = max_error(got.out, po.seq_layout(0), mine, shared_ref->o, S);
  if (c.wire != Wire::element) {
    res.err_unquantized = max_error(got.out, po.seq_layout(0), mine, shared_ref->o_unquantized, S);
    res.logit_delta = shared_ref->logit_delta;
  }
  if (c.backward) {
    res.err_dq = max_error(got.dq, qkv.seq_layout(0), mine, shared_ref->dq, S);
    res.err_dk = max_error(got.dk, qkv.seq_layout(1), mine, shared_ref->dk, S);
    res.err_dv = max_error(got.dv, qkv.seq_layout(2), mine, shared_ref->dv, S);
    res.err_unsummed = std::max(max_error(dk_unsummed, qkv.seq_layout(1), mine, shared_ref->dk, S),
                                max_error(dv_unsummed, qkv.seq_layout(2), mine, shared_ref->dv, S));
  }
  res.pack_ms = ex.phase_ms[0], res.exchange_ms = ex.phase_ms[1], res.unpack_ms = ex.phase_ms[2];
  return res;
}

[[noreturn]] void usage(int code) {
  std::printf(
      "usage: ulysses_attention [--ranks P] [--batch B] [--seq S] [--heads H] [--kv-heads Hkv]\n"
      "                         [--head-dim D] [--v-head-dim Dv] [--layout bshd|sbhd|bhsd]\n"
      "                         [--model NAME] [--balanced] [--backward] [--tolerance T]\n"
      "                         [--warmup W] [--repeat N]\n"
      "                         [--backend local|mpi] [--device cpu|cuda] [--list-models]\n"
      "                         [--ring R [--causal]] [--rope [--rope-theta X]] [--wire fp8_e4m3|fp8_e5m2|bfloat16]\n"
      "                         [--bands G]\n"
      "                         [--docs L1,L2,... [--causal] [--allgather-kv] [--ring R]]\n"
      "Ulysses attention (fp32) on P ranks; compares with single-rank attention in double precision.\n"
      "Default: Llama-3.1-8B attention (H=32, Hkv=8, D=128), B=1, S=1024, P=4, bshd, in-process group.\n"
      "--backward: also the backward pass (dq, dk, dv through seq_to_head_backward, which sums the\n"
      "            partial gradients of kv heads held by several ranks); default then P=16, S=256\n"
      "            (each of Llama's 8 kv heads on 2 ranks).\n"
      "--warmup W, --repeat N: each exchange is then timed between barriers, W untimed runs and the\n"
      "            median of N (default 2 and 5), next to the bare all-to-all-v of the same bytes.\n"
      "--balanced: split heads with HeadPolicy::balanced (H not divisible by P; uneven S needs nothing).\n"
      "--model: a public model's head shapes (S stays as it is unless --seq); a unique prefix is enough.\n"
      "--backend mpi: run under `mpiexec -n P`; P is the number of MPI processes.\n"
      "--ring R: Ulysses x Ring (docs/ring.md): P = U x R ranks, U = P / R Ulysses ranks per ring group,\n"
      "          R ring steps of k|v blocks, LSE merge; with --backward the fp32 dk|dv accumulators travel\n"
      "          the ring. Errors of o, the merged LSE (and dq, dk, dv). Default then P=4, S=256. bshd only.\n"
      "--causal: (with --ring) causal attention, the zigzag layout (ring rank j holds chunks j and 2R-1-j);\n"
      "          without it non-causal, contiguous ranges. --ring 1 is Ulysses alone through the ring code.\n"
      "--allgather-kv: all-gather-KV context parallelism (docs/allgather.md): q stays on its tokens, k|v of the\n"
      "          whole sequence gathered on every rank, dk|dv reduce-scattered; every head on every rank. With\n"
      "          --ring R > 1: U x AG, Ulysses over U = P / R ranks, then k|v of their heads gathered over the R\n"
      "          ranks of the ring group instead of the rotation (DistributedAttentionPlan::allgather(RingPlan)).\n"
      "--docs L1,L2,...: packed documents of these token counts (S = their sum; 0 is a placeholder), attention\n"
      "          masked per document (document and causal with --causal, else document-only), through --ring R\n"
      "          (per-document zigzag: every document cut into 2R chunks), --allgather-kv (documents_partition,\n"
      "          balanced by causal work) or plain Ulysses (--ring 1). Checked against the double reference.\n"
      "--rope: q and k rotated by RoPE (half rotation, positions = global token, theta 10000 or --rope-theta X)\n"
      "        fused into the pack of seq->head (RowTransforms on q and k, planned with_row_transforms()); with\n"
      "        --backward dq and dk get the inverse rotation on the unpack of seq_to_head_backward. The reference\n"
      "        rotates in double. With --ring R (or --docs, or --allgather-kv --ring R > 1) through distributed_attention()'s\n"
      "        RowTransforms, positions the global token on every ring rank. Host executor only (not with --device cuda).\n"
      "--wire W: q and k (not v) travel seq->head on wire W (fp8_e4m3, fp8_e5m2: each head row as D fp8 bytes and its\n"
      "        float32 amax scale; bfloat16: each element rounded to bf16), dequantized to fp32 for the attention.\n"
      "        Checked: o against a double reference from q, k through the same round trip (within --tolerance); every\n"
      "        received q, k element within the wire's element bound (2^-4 relative for e4m3, 2^-3 e5m2, 2^-8 bf16,\n"
      "        plus half a subnormal step of the row's scale); o against the unquantized reference within the bound\n"
      "        (e^(2 delta) - 1) max|v| + tolerance, delta the largest logit change (measured in the reference; and\n"
      "        the a priori delta from the element bound, printed). Host executor only; not with --rope, --backward, --ring.\n"
      "--bands G: the layer once more through distributed_attention() over G head bands (DistributedAttentionOptions::bands;\n"
      "        docs/overlap.md): G bands of each rank's query heads, GQA groups whole;\n"
      "        o (and dq, dk, dv) must equal the unbanded layer's bit for bit. With --ring R: the hybrid through\n"
      "        distributed_attention() over G bands x R ring steps (each band's k|v rotating as its own block),\n"
      "        against the unbanded hybrid bit for bit. Host only; not with --docs, --allgather-kv, --wire. 1 <= G <= 64.\n"
      "--device cuda: q, k, v and o are redistributed on the GPU (P virtual ranks on one device,\n"
      "               CUDA executor + in-process device group); attention stays on the host.\n");
  std::exit(code);
}

Config parse(int argc, char** argv) {
  Config c;
  auto need = [&](int& i) { return ulysses_cli::value(argc, argv, i); };
  auto number = [&](int& i) { return ulysses_cli::whole(argc, argv, i, 1, INT_MAX); };
  auto apply_model = [&](const std::string& name) {
    const auto* m = ulysses_models::find_model(name);
    if (!m) {
      std::fprintf(stderr, "unknown or ambiguous model '%s'; --list-models lists them\n", name.c_str());
      std::exit(2);
    }
    c.model = m->name, c.heads = m->num_heads, c.kv_heads = m->num_kv_heads, c.head_dim = m->head_dim, c.v_head_dim = m->v_head_dim;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ranks") c.ranks = static_cast<int>(number(i)), c.ranks_given = true;
    else if (a == "--batch") c.batch = number(i);
    else if (a == "--seq") c.seq = number(i), c.seq_given = true;
    else if (a == "--heads") c.heads = number(i), c.model = "custom";
    else if (a == "--kv-heads") c.kv_heads = number(i), c.model = "custom";
    else if (a == "--head-dim") c.head_dim = c.v_head_dim = number(i), c.model = "custom";
    else if (a == "--v-head-dim") c.v_head_dim = number(i), c.model = "custom";
    else if (a == "--model") apply_model(need(i));
    else if (a == "--balanced") c.balanced = true;
    else if (a == "--backward") c.backward = true;
    else if (a == "--tolerance") c.tolerance = ulysses_cli::real(argc, argv, i, 0);
    else if (a == "--warmup") c.warmup = static_cast<int>(ulysses_cli::whole(argc, argv, i, 0, INT_MAX));
    else if (a == "--repeat") c.repeat = static_cast<int>(number(i));
    else if (a == "--backend") c.backend = need(i);
    else if (a == "--device") c.device = need(i);
    else if (a == "--ring") c.ring = static_cast<int>(number(i));
    else if (a == "--allgather-kv") c.allgather = true;
    else if (a == "--docs") {
      c.docs.clear();
      const std::string list = need(i);
      std::size_t at = 0;
      while (at <= list.size()) {
        const std::size_t comma = std::min(list.find(',', at), list.size());
        const std::string item = list.substr(at, comma - at);
        char* end = nullptr;
        const long long n = std::strtoll(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || n < 0) {
          std::fprintf(stderr, "--docs takes document lengths >= 0 separated by commas (e.g. 4000,300,12000), not '%s'\n", list.c_str());
          std::exit(2);
        }
        c.docs.push_back(n);
        at = comma + 1;
      }
    }
    else if (a == "--causal") c.causal = true;
    else if (a == "--rope") c.rope = true;
    else if (a == "--bands") c.bands = static_cast<int>(ulysses_cli::whole(argc, argv, i, 1, kMaxStages));
    else if (a == "--rope-theta") c.rope_theta = ulysses_cli::real(argc, argv, i, 1e-300), c.rope = true;
    else if (a == "--wire") {
      const Wire wires[] = {Wire::fp8_e4m3, Wire::fp8_e5m2, Wire::bfloat16};
      c.wire = wires[ulysses_cli::one_of(argc, argv, i, {"fp8_e4m3", "fp8_e5m2", "bfloat16"})];
    }
    else if (a == "--layout") {
      c.layout_given = true;
      const Format formats[] = {Format::bshd, Format::sbhd, Format::bhsd};
      c.layout = formats[ulysses_cli::one_of(argc, argv, i, {"bshd", "sbhd", "bhsd"})];
    } else if (a == "--list-models") {
      for (const auto& m : ulysses_models::kModels)
        std::printf("%-18s H=%-3lld Hkv=%-3lld D=%-3lld Dv=%-3lld S=%lld\n", m.name, (long long)m.num_heads, (long long)m.num_kv_heads,
                    (long long)m.head_dim, (long long)m.v_head_dim, (long long)m.typical_seq_len);
      std::exit(0);
    } else if (a == "--help" || a == "-h") usage(0);
    else {
      std::fprintf(stderr, "unknown argument '%s'\n", a.c_str());
      usage(2);
    }
  }
  if (c.backend != "local" && c.backend != "mpi") {
    std::fprintf(stderr, "--backend must be local or mpi, not '%s'\n", c.backend.c_str());
    std::exit(2);
  }
  if (c.device != "cpu" && c.device != "cuda") usage(2);
  if (c.device == "cuda" && c.backend != "local") {
    std::fprintf(stderr, "--device cuda runs the in-process group (--backend local); use examples/nccl_mpi for MPI + GPUs\n");
    std::exit(2);
  }
  if (c.rope && c.device != "cpu") {
    std::fprintf(stderr, "--rope runs on the host executor (--device cpu): only HostExecutor applies row transforms\n");
    std::exit(2);
  }
  if (c.rope && c.allgather && c.ring <= 1) {
    std::fprintf(stderr, "--rope with --allgather-kv needs --ring R > 1 (U x AG): all-gather KV alone has no seq->head to fuse it into\n");
    std::exit(2);
  }
  if (c.wire != Wire::element && (c.device != "cpu" || c.ring > 0 || c.rope || c.backward)) {
    std::fprintf(stderr, "--wire runs on the host executor (--device cpu: only HostExecutor runs wires), without --ring, --rope, --backward\n");
    std::exit(2);
  }
  if (c.bands > 0 && (c.device != "cpu" || !c.docs.empty() || c.allgather || c.wire != Wire::element)) {
    std::fprintf(stderr, "--bands runs on the host (--device cpu), without --docs, --allgather-kv, --wire\n");
    std::exit(2);
  }
  if (!c.docs.empty()) {
    std::int64_t S = 0;
    for (std::int64_t n : c.docs) S += n;
    if (S < 1 || (c.seq_given && c.seq != S)) {
      std::fprintf(stderr, "--docs: the documents hold %lld tokens; S is their sum (>= 1)%s\n", (long long)S, c.seq_given ? ", not --seq" : "");
      std::exit(2);
    }
    c.seq = S, c.seq_given = true;
    if (c.ring == 0 && !c.allgather) c.ring = 1;  // plain Ulysses through the drop-in attention
  }
  if (c.allgather && c.ring == 0) c.ring = 1;  // (the ring code's path: one step)
  if (c.causal && c.ring == 0) {
    std::fprintf(stderr, "--causal runs through the ring code: add --ring R (--ring 1: Ulysses alone), --allgather-kv or --docs\n");
    std::exit(2);
  }
  if (c.ring > 0) {
    if (c.device != "cpu" || (c.layout_given && c.layout != Format::bshd)) {
      std::fprintf(stderr, "--ring runs on the host (--device cpu) with the bshd layout\n");
      std::exit(2);
    }
    if (!c.seq_given) c.seq = 256;
    return c;  // P stays 4 unless --ranks (or mpiexec) says otherwise
  }
  if (c.backward) {  // defaults that exercise replicated kv heads (Hkv < P) and finish quickly
    if (!c.ranks_given && c.backend == "local") c.ranks = 16;
    if (!c.seq_given) c.seq = 256;
  }
  return c;
}

Result reduce_max(const std::vector<Result>& rs) {
  Result m = rs.at(0);
  for (const Result& r : rs) m.max_with(r);
  return m;
}

int report(const Config& c, int P, const Result& m) {
  std::printf("ulysses attention demo: %s (H=%lld, Hkv=%lld, D=%lld, Dv=%lld), B=%lld, S=%lld, P=%d, fp32, %s, %s backend%s\n",
              c.model.c_str(), (long long)c.heads, (long long)c.kv_heads, (long long)c.head_dim, (long long)c.v_head_dim,
              (long long)c.batch, (long long)c.seq, P, to_string(c.layout), c.backend == "mpi" ? "MPI" : "in-process",
              c.backward ? ", forward + backward" : "");
  if (c.rope)
    std::printf("  RoPE (half rotation, theta %g, positions = global token) fused into the pack of seq->head for q and k%s;\n"
                "  the reference rotates q and k in double (and takes R^T of the gradients of the rotated q and k)\n",
                c.rope_theta, c.backward ? ", its inverse into the unpack of seq_to_head_backward for dq and dk" : "");
  if (c.wire != Wire::element)
    std::printf("  q and k travel seq->head on the %s wire (TensorSpec::with_wire; v on its elements); the attention runs on the\n"
                "  dequantized q, k\n", to_string(c.wire));
  if (c.device == "cuda")
    std::printf("  device: CUDA, %d virtual ranks on one GPU (CudaExecutor + DeviceLocalGroup), exchange by exchange; attention on the host\n", P);
  else
    std::printf("  the layer: distributed_attention()%s around this demo's fp32 kernel (docs/attention.md)\n",
                c.backward ? " and distributed_attention_backward()" : "");
  std::printf("  bytes a rank (its input tensors, own chunk included, as nccl-tests counts an all-to-all; the largest rank's):\n"
              "  seq->head (q,k,v in one exchange) %.3f MiB, head->seq (o) %.3f MiB; path: %s%s\n",
              m.bytes_s2h / (1 << 20), m.bytes_h2s / (1 << 20), to_string(m.path),
              m.path == Path::direct ? " (each rank copies from its peers' inputs, one copy per element)" : "");
  if (c.backward) {
    // The most ranks any kv head is on (replicated when Hkv < P, and at the shared boundary heads
    // of balanced splits).
    const AttentionSpecs a = attention_specs<float>(P, {c.heads, c.kv_heads, c.head_dim, c.v_head_dim},
                                                    c.balanced ? HeadPolicy::balanced : HeadPolicy::even);
    long long holders = 1;
    for (std::int64_t h = 0; h < c.kv_heads; ++h) {
      const auto hr = a.kv_heads.holders(h);
      holders = std::max<long long>(holders, hr.second - hr.first);
    }
    std::printf("  backward: dq, dk, dv in one exchange; kv heads on up to %lld ranks each, their partial gradients\n"
                "            summed (a rank sends at most %.3f MiB of replica copies)\n",
                holders, m.bytes_replica / (1 << 20));
  }
  if (m.bytes[0] > 0) {
    std::printf("  exchanges, each between barriers, median of %d runs after %d warm-up (max over ranks); bare = the\n"
                "  all-to-all-v of the same bytes between contiguous buffers (P equal chunks, own chunk included):\n",
                c.repeat, c.warmup);
    std::printf("    %-34s %10s %10s %9s %10s %9s %7s\n", "exchange", "MiB/rank", "time ms", "GB/s", "bare ms", "GB/s", "ratio");
    for (int i = 0; i < kExchanges; ++i) {
      if (m.bytes[i] <= 0) continue;
      std::printf("    %-34s %10.3f %10.3f %9.2f %10.3f %9.2f %7.2f\n", kExchangeNames[i], m.bytes[i] / (1 << 20), m.ms[i],
                  m.bytes[i] / m.ms[i] * 1e-6, m.bare_ms[i], m.bytes[i] / m.bare_ms[i] * 1e-6, m.ms[i] / m.bare_ms[i]);
    }
  } else {
    std::printf("  phase times (max over ranks, all exchanges): pack %.3f ms, exchange %.3f ms, unpack %.3f ms\n", m.pack_ms,
                m.exchange_ms, m.unpack_ms);
  }
  std::printf("  attention (this demo's plain loops, not the point): %.1f ms\n", m.attention_ms);
  bool ok = m.err_o <= c.tolerance;
  std::printf("  max abs error vs single-rank attention (double): o %.3g", m.err_o);
  if (c.backward) {
    ok = ok && m.err_dq <= c.tolerance && m.err_dk <= c.tolerance && m.err_dv <= c.tolerance;
    std::printf(", dq %.3g, dk %.3g, dv %.3g", m.err_dq, m.err_dk, m.err_dv);
  }
  std::printf(" (tolerance %.1g%s): %s\n", c.tolerance, c.wire != Wire::element ? "; the reference from the dequantized q, k" : "",
              ok ? "OK" : "FAILED");
  if (c.wire != Wire::element) {
    const WireBound wb = wire_bound(c);
    const WireElementBound eb = wire_element_bound(c.wire);
    const double post = output_bound(m.logit_delta, wb.vmax) + c.tolerance, prior = output_bound(wb.logit, wb.vmax) + c.tolerance;
    const bool elems = m.element_ratio <= 1, unq = m.err_unquantized <= post && m.err_unquantized <= prior;
    std::printf("  wire %s for q and k (v on its elements): every received q, k element within %.3g |x| + %.3g amax(row)%s: "
                "largest error / bound %.3f: %s\n",
                to_string(c.wire), eb.eps, eb.unit, eb.abs > 0 ? " + 2^-133" : "", m.element_ratio, elems ? "OK" : "FAILED");
    std::printf("  max abs error vs the unquantized reference (double): o %.3g; bound (e^(2 delta) - 1) max|v| + tolerance with the\n"
                "  measured largest logit change delta = %.3g: %.3g; with the a priori delta = %.3g (every element error aligned): %.3g: %s\n",
                m.err_unquantized, m.logit_delta, post, wb.logit, prior, unq ? "OK" : "FAILED");
    ok = ok && elems && unq;
  }
  if (c.backward)
    std::printf("  (dk, dv taking one rank's copy of a replicated kv head instead of the sum: max abs error %.3g)\n",
                m.err_unsummed);
  if (c.bands > 0) {
    const bool same = m.bands_diff == 0;
    std::printf("  head bands: the layer again in %d band%s (distributed_attention()%s with options.bands: seq->head of band g+1 and\n"
                "  head->seq of band g-1 around the attention of band g), %.1f ms; elements differing from the unbanded layer (o%s): %.0f: %s\n",
                c.bands, c.bands == 1 ? "" : "s", c.backward ? " and its backward" : "", m.bands_ms, c.backward ? ", dq, dk, dv" : "", m.bands_diff,
                same ? "OK" : "FAILED");
    ok = ok && same;
  }
  return ok ? 0 : 1;
}

/// --ring: the case of the command line on P ranks (U = P / R).
/// @throws Error(invalid_mesh) R not dividing P, U above the head count.
ulysses_ring_demo::RingCase ring_case(const Config& c, int P) {
  if (P % c.ring != 0)
    throw Error(Errc::invalid_mesh, "--ring " + std::to_string(c.ring) + " does not divide P=" + std::to_string(P) + " ranks (P = U x R)");
  ulysses_ring_demo::RingCase rc;
  rc.U = P / c.ring, rc.R = c.ring;
  const bool uag = c.allgather && c.ring > 1;  // --allgather-kv --ring R: U x AG (Ulysses over U = P / R, k|v gathered over R)
  if (!c.allgather || uag) Mesh(P, rc.U, rc.R, P).check_heads(c.heads);
  rc.B = c.batch, rc.S = c.seq, rc.H = c.heads, rc.Hkv = c.kv_heads, rc.D = c.head_dim, rc.Dv = c.v_head_dim;
  rc.causal = c.causal;
  rc.layout = c.causal ? RingLayout::zigzag : RingLayout::contiguous;
  rc.allgather = c.allgather && !uag;
  rc.ulysses_allgather = uag;
  rc.allgather_split = DocumentSplit::balanced;
  rc.bands = std::max(1, c.bands);
  rc.rope = c.rope;
  rc.rope_theta = c.rope_theta;
  if (!c.docs.empty()) {
    rc.cu_seqlens = {0};
    for (std::int64_t n : c.docs) rc.cu_seqlens.push_back(rc.cu_seqlens.back() + n);
  }
  return rc;
}

/// --rope with the ring code: says where the rotation runs.
void rope_line(const Config& c, const ulysses_ring_demo::RingCase& rc) {
  if (rc.rope)
    std::printf("  RoPE (half rotation, theta %g) of q and k fused into seq->head at each row's global token%s\n", rc.rope_theta,
                c.backward ? ", its inverse on dq and dk in the backward's head->seq" : "");
}

/// Prints the errors (max over ranks) against the tolerance; returns 0 within it, else 1.
int errors_report(const Config& c, const ulysses_ring_demo::RingErrors& e) {
  std::printf("  max abs error vs single-rank attention (double): o %.3g, lse %.3g", e.out, e.lse);
  if (c.backward) std::printf(", dq %.3g, dk %.3g, dv %.3g", e.dq, e.dk, e.dv);
  const bool ok = e.max() <= c.tolerance;
  std::printf(" (tolerance %.1g): %s\n", c.tolerance, ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}

/// --docs / --allgather-kv: the case (documents, partition, per-rank causal work) and the errors.
int documents_report(const Config& c, const ulysses_ring_demo::RingCase& rc, const ulysses_ring_demo::RingErrors& e, double ms) {
  const int P = rc.U * rc.R;
  std::printf("%s attention demo: %s (H=%lld, Hkv=%lld, D=%lld, Dv=%lld), B=%lld, S=%lld, P=%d%s, fp32, %s, %s%s\n",
              rc.allgather ? "all-gather-KV" : rc.ulysses_allgather ? "ulysses x all-gather-KV" : "ulysses x ring", c.model.c_str(), (long long)rc.H, (long long)rc.Hkv, (long long)rc.D,
              (long long)rc.Dv, (long long)rc.B, (long long)rc.S, P,
              rc.allgather ? "" : (" = U=" + std::to_string(rc.U) + " x R=" + std::to_string(rc.R)).c_str(), rc.causal ? "causal" : "non-causal",
              c.backend == "mpi" ? "MPI processes" : "in-process", c.backward ? ", forward + backward" : "");
  rope_line(c, rc);
  if (!rc.cu_seqlens.empty()) {
    const Documents docs(rc.cu_seqlens, rc.S);
    // Whose queries' work: the all-gather ranks' own tokens; under U x R a ring rank's (its U
    // Ulysses ranks share its tokens' work by heads).
    std::vector<SeqChunk> rings;
    if (!rc.allgather) {
      const RingPartition part(docs, rc.U, rc.R);
      for (int j = 0; j < rc.R; ++j)
        for (const SeqChunk& k : part.ring_chunks(j)) rings.push_back({j, k.offset, k.length, 0});
    }
    const SeqPartition world = rc.allgather ? ulysses_ring_demo::world_partition(rc) : SeqPartition::chunks(rc.S, rc.R, rings);
    const int n = rc.allgather ? P : rc.R;
    std::printf("  %lld packed documents (%lld non-empty), masked %s; %s\n", (long long)docs.count(), (long long)docs.non_empty(),
                rc.causal ? "document and causal" : "per document",
                rc.allgather ? "split balanced by causal work (documents_partition)" : "every document cut into 2R chunks (per-document zigzag)");
    std::int64_t most = 0, all = 0;
    for (int w = 0; w < n; ++w) {
      const std::int64_t x = causal_work(docs, world, w);
      most = std::max(most, x), all += x;
    }
    if (rc.causal && all > 0)
      std::printf("  causal work (query, key pairs) of the most-loaded %s over the mean: %.4f\n", rc.allgather ? "rank" : "ring rank",
                  double(most) * n / double(all));
  }
  std::printf("  attention (this demo's plain loops, max over ranks): %.1f ms\n", ms);
  return errors_report(c, e);
}

/// --ring: prints the case and the errors (max over ranks) and returns 0 within the tolerance, else 1.
int ring_report(const Config& c, const ulysses_ring_demo::RingCase& rc, const ulysses_ring_demo::RingErrors& e, double ms) {
  if (rc.allgather || rc.ulysses_allgather || !rc.cu_seqlens.empty()) return documents_report(c, rc, e, ms);
  const RingPartition part(rc.S, rc.U, rc.R, rc.layout);
  const AttentionSpecs a = attention_specs<float>(rc.U, {rc.H, rc.Hkv, rc.D, rc.Dv}, rc.H % rc.U == 0 && (rc.Hkv % rc.U == 0 || rc.U % rc.Hkv == 0)
                                                                                        ? HeadPolicy::even : HeadPolicy::balanced);
  long long holders = 1;
  for (std::int64_t h = 0; h < rc.Hkv; ++h) holders = std::max<long long>(holders, a.kv_heads.holders(h).second - a.kv_heads.holders(h).first);
  std::printf("ulysses x ring attention demo: %s (H=%lld, Hkv=%lld, D=%lld, Dv=%lld), B=%lld, S=%lld, P=%d = U=%d x R=%d, fp32, %s (%s), %s%s\n",
              c.model.c_str(), (long long)rc.H, (long long)rc.Hkv, (long long)rc.D, (long long)rc.Dv, (long long)rc.B, (long long)rc.S,
              rc.U * rc.R, rc.U, rc.R, rc.causal ? "causal" : "non-causal", to_string(rc.layout),
              c.backend == "mpi" ? "MPI processes" : "in-process", c.backward ? ", forward + backward" : "");
  const RingPlan rank0(part, Mesh(rc.U * rc.R, rc.U, rc.R, rc.U * rc.R), 0, rc.B, a, rc.causal);
  const std::size_t step = rank0.kv_buffer_bytes();  // the rotation's largest message (Ulysses rank 0's kv heads)
  std::printf("  ring: %d steps, one k|v message a step of up to %.3f MiB (%lld tokens)%s\n", rc.R, step / double(1 << 20),
              (long long)part.max_ring_length(), c.backward ? ", the backward adds its fp32 dk|dv" : "");
  if (holders > 1)
    std::printf("  GQA: each kv head on up to %lld Ulysses ranks (replicated; the backward sums their partial gradients)\n", holders);
  rope_line(c, rc);
  std::printf("  attention through Ulysses x Ring (this demo's plain loops, max over ranks): %.1f ms\n", ms);
  const double worst = e.max();
  std::printf("  max abs error vs single-rank attention (double): o %.3g, lse %.3g", e.out, e.lse);
  if (c.backward) std::printf(", dq %.3g, dk %.3g, dv %.3g", e.dq, e.dk, e.dv);
  const bool ok = worst <= c.tolerance;
  std::printf(" (tolerance %.1g): %s\n", c.tolerance, ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}

/// --ring --bands: the elements of one rank's o, lse (and dq, dk, dv) that differ in bits.
double bands_differ(const ulysses_ring_demo::RingRankResult& a, const ulysses_ring_demo::RingRankResult& b) {
  return bits_differ(a.out, b.out) + bits_differ(a.lse, b.lse) + bits_differ(a.dq, b.dq) + bits_differ(a.dk, b.dk) + bits_differ(a.dv, b.dv);
}

/// --ring --bands: prints the banded hybrid against the unbanded one; returns 0 when no bit differs, else 1.
int bands_report(const ulysses_ring_demo::RingCase& rc, double differ) {
  std::printf("  head bands: %d bands x %d ring steps (each band's k|v rotating as its own block): %.0f elements differ in bits from "
              "the unbanded hybrid: %s\n", rc.bands, rc.R, differ, differ == 0 ? "OK" : "FAILED");
  return differ == 0 ? 0 : 1;
}

/// --ring in-process: P threads, a LocalGroup per Ulysses group and per ring.
int ring_local(const Config& c) {
  const ulysses_ring_demo::RingCase rc = ring_case(c, c.ranks);
  const ulysses_ring_demo::RingGlobals g(rc);
  const ulysses_ring_demo::RingReference ref = ulysses_ring_demo::case_reference(rc, g, c.backward);
  const auto t0 = Clock::now();
  const auto res = ulysses_ring_demo::run_ring_attention(rc, g, c.backward);
  const double ms = ms_since(t0);
  const int exit = ring_report(c, rc, ulysses_ring_demo::max_errors(rc, ref, res), ms);
  if (rc.bands == 1) return exit;
  ulysses_ring_demo::RingCase unbanded = rc;
  unbanded.bands = 1;
  const auto want = ulysses_ring_demo::run_ring_attention(unbanded, g, c.backward);
  double differ = 0;
  for (std::size_t w = 0; w < res.size(); ++w) differ += bands_differ(res[w], want[w]);
  return bands_report(rc, differ) | exit;
}

#if ULYSSES_DEMO_MPI
/// --ring under MPI: the world split by split_ring() (U x R on the shared-memory nodes), one rank
/// of the hybrid per process; every process computes the (small) reference itself. Collective.
int ring_mpi(const Config& c, MPI_Comm world) {
  int P = 0;
  MPI_Comm_size(world, &P);
  const ulysses_ring_demo::RingCase rc = ring_case(c, P);
  MpiRingMesh m = split_ring(world, rc.allgather ? P : rc.U, rc.allgather ? 1 : rc.R, 0);
  const int w = m.index % (rc.U * rc.R);
  const ulysses_ring_demo::RingGlobals g(rc);
  const ulysses_ring_demo::RingReference ref = ulysses_ring_demo::case_reference(rc, g, c.backward);
  double mine[6] = {}, all[6] = {}, differ = 0, differ_all = 0;
  {
    MpiComm uc(m.ulysses), ring(m.ring);  // (all-gather KV: the Ulysses group is the whole group, the ring one rank)
    MPI_Barrier(world);
    const auto t0 = Clock::now();
    const ulysses_ring_demo::RingRankResult rr = ulysses_ring_demo::ring_rank_attention(rc, g, w, uc, ring, c.backward);
    mine[5] = ms_since(t0);
    const ulysses_ring_demo::RingErrors e = ulysses_ring_demo::rank_errors(rc, ref, w, rr);
    mine[0] = e.out, mine[1] = e.lse, mine[2] = e.dq, mine[3] = e.dk, mine[4] = e.dv;
    if (rc.bands > 1) {  // --bands G: the unbanded hybrid too, compared bit for bit
      ulysses_ring_demo::RingCase unbanded = rc;
      unbanded.bands = 1;
      differ = bands_differ(rr, ulysses_ring_demo::ring_rank_attention(unbanded, g, w, uc, ring, c.backward));
    }
  }
  m.free();
  MPI_Allreduce(mine, all, 6, MPI_DOUBLE, MPI_MAX, world);
  MPI_Allreduce(&differ, &differ_all, 1, MPI_DOUBLE, MPI_SUM, world);
  int rc_exit = 0;
  int me = 0;
  MPI_Comm_rank(world, &me);
  if (me == 0) rc_exit = ring_report(c, rc, {all[0], all[1], all[2], all[3], all[4]}, all[5]);
  if (me == 0 && rc.bands > 1) rc_exit |= bands_report(rc, differ_all);
  MPI_Bcast(&rc_exit, 1, MPI_INT, 0, world);
  return rc_exit;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (decode_demo::wanted(argc, argv)) return decode_demo::run(argc, argv);  // --decode (decode_demo.hpp)
  const Config c = parse(argc, argv);
  try {
    if (c.backend == "mpi") {
#if ULYSSES_DEMO_MPI
      MPI_Init(&argc, &argv);
      MpiComm comm(MPI_COMM_WORLD);
      if (c.ranks_given && c.ranks != comm.size()) {
        if (comm.rank() == 0)
          std::fprintf(stderr, "--ranks %d but mpiexec started %d processes; with --backend mpi, P is the number of processes\n",
                       c.ranks, comm.size());
        MPI_Finalize();
        return 2;
      }
      if (c.ring > 0) {
        const int rc = ring_mpi(c, MPI_COMM_WORLD);
        MPI_Finalize();
        return rc;
      }
      Result r = run_rank(comm, c, nullptr);
      double mine[Result::kFields], all[Result::kFields];
      r.to(mine);
      MPI_Allreduce(mine, all, Result::kFields, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      Result m = r;
      m.from(all);
      int rc = 0;
      if (comm.rank() == 0) rc = report(c, comm.size(), m);
      MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
      MPI_Finalize();
      return rc;
#else
      std::fprintf(stderr, "this build has no MPI (install libopenmpi-dev and reconfigure)\n");
      return 2;
#endif
    }
    if (c.ring > 0) return ring_local(c);
    // In-process: one reference for all ranks, computed once on all the machine's threads.
    std::vector<std::int64_t> all_rows(static_cast<std::size_t>(c.seq));
    for (std::int64_t s = 0; s < c.seq; ++s) all_rows[static_cast<std::size_t>(s)] = s;
    if (c.device == "cuda") {
#if ULYSSES_DEMO_CUDA
      const std::string why = demo_cuda::unavailable();
      if (!why.empty()) {
        std::printf("no CUDA device: skipping --device cuda (%s)\n", why.c_str());
        return 77;  // ctest: skipped
      }
      std::printf("device: %s\n", demo_cuda::device_name().c_str());
      const Reference ref = reference(c, all_rows, c.backward);
      std::vector<Result> rs(static_cast<std::size_t>(c.ranks));
      demo_cuda::run_group(c.ranks, [&](demo_cuda::Rank& comm) { rs[static_cast<std::size_t>(comm.rank())] = run_rank(comm, c, &ref); });
      return report(c, c.ranks, reduce_max(rs));
#else
      std::fprintf(stderr, "this build has no CUDA (install the CUDA toolkit and reconfigure)\n");
      return 2;
#endif
    }
    LocalGroup group(c.ranks);
    const Reference ref = reference(c, all_rows, c.backward);
    std::vector<Result> rs(static_cast<std::size_t>(c.ranks));
    group.spawn([&](LocalGroup::Comm& comm) { rs[static_cast<std::size_t>(comm.rank())] = run_rank(comm, c, &ref); });
    return report(c, c.ranks, reduce_max(rs));
  } catch (const std::exception& e) {  // ulysses::Error, and std::bad_alloc for shapes this machine cannot hold
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
