// SPDX-License-Identifier: Apache-2.0
// layout/transform.hpp and layout/rope.hpp under mpiexec (-n 2, 3, 4): row transforms fused into
// the block copy across real processes, over MpiComm (Path::messages, Path::alltoallv) and over
// MpiWindowComm (Path::direct, the peer copy: inputs and outputs in the window (seq→head pushes),
// inputs in the window and outputs outside (pulled from shared memory), inputs outside and
// outputs in it, every tensor outside (the peers read the inputs with Cross Memory Attach, the
// transformed rows bounced: transport/peer_copy.hpp, run_remote / push), or outside and staged;
// mixed: rank 0's inputs in the window and its peers' outside, or rank 0 staging and its peers
// read in place), float32 and bfloat16, GQA and MQA (replicated kv heads), zigzag, even, uneven
// splits and a rank without tokens, every format, one stage and two (PlanOptions::stages):
//  1. seq→head of q, k, v with Rope (half, partial rotary) on q and k and a Scale on q, on pack,
//     on unpack, or rope on pack and the scale on unpack (the wire's rounding between them):
//     every rank's head-side outputs (every format; v planned row by row with no transform
//     of its own, or not) bit for bit against a reference computed on every rank from
//     the same seeded global tensors;
//  2. seq_to_head_backward of dq, dk with rope.inverse() on unpack or on pack: replicated kv
//     heads summed in float32 in ascending rank order, then (on unpack) rotated in double and
//     rounded once; (on pack) each term rotated and rounded first — bit for bit;
//  3. with_row_transforms() on one rank only: Errc::plan_mismatch on every rank.
#include "mpi_groups.hpp"

#include <ulysses/comm/mpi.hpp>
#include <ulysses/layout/rope.hpp>
#include <ulysses/ulysses.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "expect_error.hpp"
#include "row_tensors.hpp"
#include "mpi_vias.hpp"

using namespace ulysses;
using ut::bf16;
using ut::bf16_of;
using ut::bf16_value;
using ut::bits_of;
using ut::E;
using ut::Global;
using ut::random_tensor;
using ut::same_bits;
using ut::transformed;

namespace {



/// Tokens of rank r.
std::int64_t tokens_of(const SeqPartition& seq, int r) {
  std::int64_t n = 0;
  for (const SeqChunk& c : seq.chunks_of(r)) n += c.length;
  return n;
}
/// The split of the sequence: even (S = 4P), zigzag (S = 4P: 2P chunks), balanced and uneven
/// (S = 4P + 1), or 5 tokens on every rank but rank 1, which has none (S = 5 (P - 1)).
enum class Split { even, zigzag, uneven, one_empty };
constexpr Split kSplits[] = {Split::even, Split::zigzag, Split::uneven, Split::one_empty};
const char* name_of(Split s) {
  return s == Split::even ? "even" : s == Split::zigzag ? "zigzag" : s == Split::uneven ? "balanced, uneven" : "rank 1 without tokens";
}
std::int64_t length_of(Split s, int P) { return s == Split::one_empty ? 5 * (P - 1) : 4 * P + (s == Split::uneven ? 1 : 0); }
SeqPartition seq_of(Split s, std::int64_t S, int P) {
  if (s == Split::one_empty) {
    std::vector<std::int64_t> len(static_cast<std::size_t>(P), 5);
    len[1] = 0;
    return SeqPartition::lengths(len);
  }
  return s == Split::even ? SeqPartition::even(S, P) : s == Split::zigzag ? SeqPartition::zigzag(S, P) : SeqPartition::balanced(S, P);
}


// The communicators and where the tensors lie: tests/support/mpi_vias.hpp.
using ut::Comms;
using ut::kVias;
using ut::name_of;
using ut::on_window;
using ut::inputs_in;
using ut::outputs_in;
using ut::run_via;
using ut::Store;
using ut::Via;

// ---- 1. seq→head ------------------------------------------------------------------------------

/// Where the transforms of the forward go: every one on pack, every one on unpack, or q's rope
/// on pack and its scale on unpack with k's rope on unpack (the wire's rounding between them).
enum class Side { pack, unpack, split };
const char* name_of(Side s) { return s == Side::pack ? "on pack" : s == Side::unpack ? "on unpack" : "rope on pack, scale on unpack"; }

struct Shape {
  std::int64_t B, S, H, Hkv, D;
  bool balanced_heads;  // the query heads split balanced (any Hkv), else even
};

/// The shapes at group size P (S set per split): MQA on an even query split (one kv head on every rank), and GQA
/// with 2 kv heads on a balanced query split (P = 3: neighbours share a kv head; P = 4: pairs).
std::vector<Shape> shapes_of(int P) {
  return {{2, 4 * static_cast<std::int64_t>(P), 2 * P, 1, 8, false}, {1, 4 * static_cast<std::int64_t>(P), 2 * P, 2, 6, true}};
}

HeadPartition query_heads(const Shape& s, int P) { return s.balanced_heads ? HeadPartition::balanced(s.H, P) : HeadPartition::even(s.H, P); }

/// seq→head of q, k, v on this rank of group g (rope and a scale on q, rope on k, v untouched;
/// v with_row_transforms() or not, as `v_rows` says), against the reference; "" when every
/// element of this rank's outputs has the reference's bits.
/// A row as a wire carries it (the values on the element grid of T): fp8 quantized with the
/// scale of the row's amax and dequantized in float32 (layout/fp8.hpp), or cast to bf16 / fp16.
void wire_trip(double* row, std::int64_t n, Wire wire) {
  if (wire == Wire::element) return;
  std::vector<float> x(static_cast<std::size_t>(n)), y(x.size());
  std::vector<std::uint8_t> q(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(row[i]);
  if (wire == Wire::bfloat16 || wire == Wire::float16) {
    for (std::size_t i = 0; i < x.size(); ++i)
      row[i] = wire == Wire::bfloat16 ? bf16_value(bf16_of(row[i])) : detail::half_to_float(detail::float_to_half(x[i]));
    return;
  }
  const auto f = static_cast<Fp8Format>(wire);
  const float scale = fp8_scale_of(row_amax(x.data(), n), f);
  quantize_fp8(x.data(), n, scale, f, q.data());
  dequantize_fp8(q.data(), n, scale, f, y.data());
  for (std::size_t i = 0; i < x.size(); ++i) row[i] = y[i];
}

template <class T>
std::string run_forward(Comms& g, const Shape& sh, const SeqPartition& seq, Format format, int stages, Side side, bool v_rows, Via via,
                        Wire wire = Wire::element) {
  const int P = g.size(), r = g.rank();
  const Rope rope(sh.D, sh.S, 10000.0, sh.D - 2, RopeStyle::half);  // partial rotary: the last 2 elements pass
  const Scale scale{1.0 / std::sqrt(static_cast<double>(sh.D))};    // not a power of two: its rounding shows
  struct QTransform {  // rope then the scale, in double, one rounding
    const Rope* r;
    const Scale* s;
    void operator()(const RowCoord& at, double* row, std::int64_t n) const {
      (*r)(at, row, n);
      (*s)(at, row, n);
    }
  } q_tx{&rope, &scale};
  const Global<T> q = random_tensor<T>(sh.B, sh.S, sh.H, sh.D, 1), k = random_tensor<T>(sh.B, sh.S, sh.Hkv, sh.D, 2),
                  v = random_tensor<T>(sh.B, sh.S, sh.Hkv, sh.D, 3);
  // The reference: on pack the transform, the rounding to T, the wire; on unpack the wire, then
  // the transform (the store rounds once).
  auto through = [&](const Global<T>& x, auto&& tx_row) {
    if (wire == Wire::element)
      return transformed(x, tx_row);
    return transformed(x, [&](const RowCoord& at, double* row, std::int64_t n) {
      if (side == Side::unpack) {
        wire_trip(row, n, wire);
        tx_row(at, row, n);
        return;
      }
      tx_row(at, row, n);
      for (std::int64_t i = 0; i < n; ++i) row[i] = E<T>::value(E<T>::of(row[i]));
      wire_trip(row, n, wire);
    });
  };
  const Global<T> want[3] = {side == Side::split ? transformed(transformed(q, rope), scale) : through(q, q_tx), through(k, rope), v};
  const Global<T>* in[3] = {&q, &k, &v};
  const HeadPartition qh = query_heads(sh, P), kvh = HeadPartition::gqa(qh, sh.Hkv);
  const HeadPartition* parts[3] = {&qh, &kvh, &kvh};
  RowTransforms tx;
  if (side == Side::pack) tx.on_pack(0, q_tx).on_pack(1, rope);
  if (side == Side::unpack) tx.on_unpack(0, q_tx).on_unpack(1, rope);
  if (side == Side::split) tx.on_pack(0, rope).on_unpack(0, scale).on_unpack(1, rope);
  HostExecutor ex(r % 2 ? 2 : 1);  // one rank on two threads: the rows cut across threads
  Store store(g);
  std::vector<T*> outs(3);
  std::string err = run_via(g, via, [&](auto& comm, Path path) {
    PlanOptions opt;
    opt.path = path;
    opt.stages = stages;
    TensorSpec vs = TensorSpec::of<T>(kvh, sh.D);
    if (v_rows) vs.with_row_transforms();
    const Plan plan({P, r}, sh.B, seq,
                    {TensorSpec::of<T>(qh, sh.D).with_row_transforms().with_wire(wire),
                     TensorSpec::of<T>(kvh, sh.D).with_row_transforms().with_wire(wire), vs},
                    format, opt);
    TensorList<ConstByteSpan> ins;
    TensorList<ByteSpan> os;
    for (int t = 0; t < 3; ++t) {
      const Layout& sl = plan.seq_layout(t);
      const auto n = static_cast<std::size_t>(sl.span_elems());
      T* x = store.take<T>(n, inputs_in(via, r));
      for (std::size_t i = 0; i < n; ++i) x[i] = E<T>::of(-77.0);
      for (const SeqChunk& c : seq.chunks_of(r))
        for (std::int64_t b = 0; b < sh.B; ++b)
          for (std::int64_t i = 0; i < c.length; ++i)
            for (std::int64_t h = 0; h < in[t]->H; ++h)
              for (std::int64_t d = 0; d < sh.D; ++d)
                x[static_cast<std::size_t>(sl.offset(b, c.local_offset + i, h, d))] = in[t]->at(b, c.offset + i, h, d);
      ins.push_back(ConstByteSpan(reinterpret_cast<const std::byte*>(x), n * sizeof(T)));
      const auto m = static_cast<std::size_t>(plan.head_layout(t).span_elems());
      T* o = store.take<T>(m, outputs_in(via));
      for (std::size_t i = 0; i < m; ++i) o[i] = E<T>::of(-99.0);
      outs[static_cast<std::size_t>(t)] = o;
      os.push_back(ByteSpan(reinterpret_cast<std::byte*>(o), m * sizeof(T)));
    }
    std::vector<std::byte> ws(plan.workspace_bytes());
    seq_to_head(plan, comm, ex, ins, os, ws, tx);
    // Compare while the plan lives (its layouts); a difference throws, after the collective call.
    for (int t = 0; t < 3; ++t) {
      const Layout& l = plan.head_layout(t);
      const T* o = outs[static_cast<std::size_t>(t)];
      const Global<T>& w = want[t];
      for (std::int64_t b = 0; b < sh.B; ++b)
        for (std::int64_t s = 0; s < sh.S; ++s)
          for (std::int64_t h = parts[t]->begin(r); h < parts[t]->end(r); ++h)
            for (std::int64_t d = 0; d < sh.D; ++d)
              if (!same_bits(o[static_cast<std::size_t>(l.offset(b, s, h - parts[t]->begin(r), d))], w.at(b, s, h, d)))
                throw std::runtime_error("rank " + std::to_string(r) + ": tensor " + std::to_string(t) + " differs from the reference at b=" +
                                        std::to_string(b) + " s=" + std::to_string(s) + " h=" + std::to_string(h) + " d=" + std::to_string(d) +
                                        ": got " + bits_of(o[static_cast<std::size_t>(l.offset(b, s, h - parts[t]->begin(r), d))]) + ", want " +
                                        bits_of(w.at(b, s, h, d)));
    }
  });
  if (!err.empty()) return err;
  if (on_window(via)) {  // what the window communicator says it did
    const MpiWindowComm& wc = g.wc;
    if (wc.outputs_in_window() != outputs_in(via)) return "outputs_in_window() is " + std::to_string(wc.outputs_in_window());
    if (inputs_in(via) && wc.staged_bytes() + wc.remote_bytes() != 0) return "inputs in the window were staged or read remotely";
    if (via == Via::staged && wc.remote_bytes() != 0) return "staged inputs were read with Cross Memory Attach";
    if (via == Via::outside && wc.cross_memory_attach() && wc.staged_bytes() != 0) return "inputs outside the window were staged with Cross Memory Attach on";
    // (The peers read this rank's seq-sharded inputs where it has tokens.)
    if (via == Via::outside && wc.cross_memory_attach() && tokens_of(seq, r) > 0 && wc.remote_bytes() == 0)
      return "rank " + std::to_string(r) + ": no input was read with Cross Memory Attach (staged " + std::to_string(wc.staged_bytes()) + ", remote " + std::to_string(wc.remote_bytes()) + ")";
  }
  return "";
}

}  // namespace

TEST_CASE("seq->head with Rope (half) on q, k and a Scale on q, on pack / on unpack / split, GQA and MQA, zigzag and even: every rank bit-exact, every communicator") {
  int told = 0;
  for (int P = 2; P <= 4; ++P)
    ut::on_groups_of(P, [&](MPI_Comm sub) {
      Comms g(sub);
      int wr = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &wr);
      if (wr == 0 && !told++) {
        const std::string how = g.win.cross_memory_attach() ? "Cross Memory Attach between the ranks: permitted"
                                                            : "Cross Memory Attach between the ranks: not permitted (staging)";
        MESSAGE(how);
      }
      for (Shape sh : shapes_of(P))
        for (Split split : kSplits)
          for (Side side : {Side::pack, Side::unpack, Side::split})
            for (Format format : {Format::bshd, Format::sbhd, Format::bhsd})
              for (int stages : {1, 2})
            for (Via via : kVias) {
              sh.S = length_of(split, P);
              const SeqPartition seq = seq_of(split, sh.S, P);
              const bool v_rows = split != Split::even;  // v planned row by row (no transform of its own) or not
              CAPTURE(P);
              CAPTURE(sh.S);
              CAPTURE(sh.H);
              CAPTURE(sh.Hkv);
              CAPTURE(std::string(name_of(split)));
              CAPTURE(std::string(to_string(format)));
              CAPTURE(stages);
              CAPTURE(std::string(name_of(side)));
              CAPTURE(std::string(name_of(via)));
              CHECK(run_forward<float>(g, sh, seq, format, stages, side, v_rows, via) == "");
              CHECK(run_forward<bf16>(g, sh, seq, format, stages, side, v_rows, via) == "");
            }
    });
}

TEST_CASE("wires: q and k as fp8 E4M3 / E5M2 or cast to bf16 beside v as itself in one exchange, RoPE before (pack) or after (unpack) the wire: every rank bit-exact, every communicator") {
  for (int P = 2; P <= 4; ++P)
    ut::on_groups_of(P, [&](MPI_Comm sub) {
      Comms g(sub);
      const Shape sh0 = shapes_of(P).front();
      for (Wire wire : {Wire::fp8_e4m3, Wire::fp8_e5m2, Wire::bfloat16})
        for (Side side : {Side::pack, Side::unpack})
          for (Via via : {Via::messages, Via::alltoallv, Via::window, Via::outside, Via::staged}) {
              Shape sh = sh0;
              sh.S = length_of(Split::zigzag, P);
              const SeqPartition seq = seq_of(Split::zigzag, sh.S, P);
              CAPTURE(P);
              CAPTURE(sh.H);
              CAPTURE(std::string(to_string(wire)));
              CAPTURE(std::string(name_of(side)));
              CAPTURE(std::string(name_of(via)));
              CHECK(run_forward<float>(g, sh, seq, Format::bshd, 1, side, false, via, wire) == "");
              if (wire != Wire::bfloat16) CHECK(run_forward<bf16>(g, sh, seq, Format::bshd, 1, side, false, via, wire) == "");
            }
    });
}

// ---- 2. the backward ----------------------------------------------------------------------------

namespace {

/// seq_to_head_backward of dq and dk on this rank of g, each rank's head-side gradients its own
/// seeded values (every rank makes all of them, for the reference), `inv` on unpack or on pack.
/// The reference, per element: the holders' copies in ascending rank order (on pack: each
/// rotated and rounded first) added in float32, then (on unpack) rotated in double, rounded once.
template <class T>
std::string run_backward(Comms& g, const Shape& sh, const SeqPartition& seq, Format format, int stages, bool on_unpack, Via via) {
  const int P = g.size(), r = g.rank();
  const Rope rope(sh.D, sh.S, 10000.0, 0, RopeStyle::half);
  const Rope inv = rope.inverse();
  const HeadPartition qh = query_heads(sh, P), kvh = HeadPartition::gqa(qh, sh.Hkv);
  const HeadPartition* parts[2] = {&qh, &kvh};
  std::vector<std::vector<Global<T>>> grads(2);  // grads[t][p]: rank p's head-side gradient of tensor t (its held heads used)
  for (int t = 0; t < 2; ++t)
    for (int p = 0; p < P; ++p) grads[t].push_back(random_tensor<T>(sh.B, sh.S, t ? sh.Hkv : sh.H, sh.D, static_cast<unsigned>(10 + 7 * p + t)));
  std::vector<Global<T>> want;
  for (int t = 0; t < 2; ++t) {
    Global<T> w = grads[t][0];
    std::vector<double> row(static_cast<std::size_t>(sh.D)), sum(static_cast<std::size_t>(sh.D));
    for (std::int64_t b = 0; b < sh.B; ++b)
      for (std::int64_t s = 0; s < sh.S; ++s)
        for (std::int64_t h = 0; h < w.H; ++h) {
          const auto [first, last] = parts[t]->holders(h);
          for (int j = first; j < last; ++j) {
            for (std::int64_t d = 0; d < sh.D; ++d) row[static_cast<std::size_t>(d)] = E<T>::value(grads[t][static_cast<std::size_t>(j)].at(b, s, h, d));
            if (!on_unpack) {
              inv(RowCoord{b, s, h}, row.data(), sh.D);
              for (double& x : row) x = E<T>::value(E<T>::of(x));
            }
            for (std::size_t d = 0; d < row.size(); ++d)
              sum[d] = j == first ? row[d] : static_cast<double>(static_cast<float>(sum[d]) + static_cast<float>(row[d]));
          }
          if (on_unpack) inv(RowCoord{b, s, h}, sum.data(), sh.D);
          for (std::int64_t d = 0; d < sh.D; ++d) w.at(b, s, h, d) = E<T>::of(sum[static_cast<std::size_t>(d)]);
        }
    want.push_back(w);
  }
  RowTransforms tx;
  if (on_unpack) tx.on_unpack(0, inv).on_unpack(1, inv);
  else tx.on_pack(0, inv).on_pack(1, inv);
  HostExecutor ex(r % 2 ? 2 : 1);
  Store store(g);
  std::string err = run_via(g, via, [&](auto& comm, Path path) {
    PlanOptions opt;
    opt.path = path;
    opt.stages = stages;
    const Plan plan({P, r}, sh.B, seq, {TensorSpec::of<T>(qh, sh.D).with_row_transforms(), TensorSpec::of<T>(kvh, sh.D).with_row_transforms()},
                    format, opt);
    TensorList<ConstByteSpan> ins;
    TensorList<ByteSpan> os;
    std::vector<T*> outs;
    for (int t = 0; t < 2; ++t) {
      const Layout& hl = plan.head_layout(t);
      const auto n = static_cast<std::size_t>(hl.span_elems());
      T* x = store.take<T>(n, inputs_in(via, r));
      for (std::size_t i = 0; i < n; ++i) x[i] = E<T>::of(-77.0);
      const Global<T>& gr = grads[t][static_cast<std::size_t>(r)];
      for (std::int64_t b = 0; b < sh.B; ++b)
        for (std::int64_t s = 0; s < sh.S; ++s)
          for (std::int64_t h = parts[t]->begin(r); h < parts[t]->end(r); ++h)
            for (std::int64_t d = 0; d < sh.D; ++d) x[static_cast<std::size_t>(hl.offset(b, s, h - parts[t]->begin(r), d))] = gr.at(b, s, h, d);
      ins.push_back(ConstByteSpan(reinterpret_cast<const std::byte*>(x), n * sizeof(T)));
      const auto m = static_cast<std::size_t>(plan.seq_layout(t).span_elems());
      T* o = store.take<T>(m, outputs_in(via));
      for (std::size_t i = 0; i < m; ++i) o[i] = E<T>::of(-99.0);
      outs.push_back(o);
      os.push_back(ByteSpan(reinterpret_cast<std::byte*>(o), m * sizeof(T)));
    }
    std::vector<std::byte> ws(plan.workspace_bytes());
    seq_to_head_backward(plan, comm, ex, ins, os, ws, tx);
    for (int t = 0; t < 2; ++t) {
      const Layout& sl = plan.seq_layout(t);
      const T* o = outs[static_cast<std::size_t>(t)];
      const Global<T>& w = want[static_cast<std::size_t>(t)];
      for (const SeqChunk& c : seq.chunks_of(r))
        for (std::int64_t b = 0; b < sh.B; ++b)
          for (std::int64_t i = 0; i < c.length; ++i)
            for (std::int64_t h = 0; h < w.H; ++h)
              for (std::int64_t d = 0; d < sh.D; ++d) {
                const T got = o[static_cast<std::size_t>(sl.offset(b, c.local_offset + i, h, d))];
                if (!same_bits(got, w.at(b, c.offset + i, h, d)))
                  throw std::runtime_error("rank " + std::to_string(r) + ": d" + (t ? "k" : "q") + " differs from the reference at b=" + std::to_string(b) +
                                          " token=" + std::to_string(c.offset + i) + " h=" + std::to_string(h) + " d=" + std::to_string(d) +
                                          ": got " + bits_of(got) + ", want " + bits_of(w.at(b, c.offset + i, h, d)));
              }
    }
  });
  if (!err.empty()) return err;
  if (on_window(via)) {
    const MpiWindowComm& wc = g.wc;
    if (inputs_in(via) && wc.staged_bytes() + wc.remote_bytes() != 0) return "inputs in the window were staged or read remotely";
    if (via == Via::staged && wc.remote_bytes() != 0) return "staged inputs were read with Cross Memory Attach";
    if (via == Via::outside && wc.cross_memory_attach() && wc.staged_bytes() != 0) return "inputs outside the window were staged with Cross Memory Attach on";
    bool read = false;  // (the peers with tokens read this rank's head-sharded inputs)
    for (int p = 0; p < P; ++p) read = read || (p != r && tokens_of(seq, p) > 0);
    if (via == Via::outside && wc.cross_memory_attach() && read && wc.remote_bytes() == 0)
      return "rank " + std::to_string(r) + ": no input was read with Cross Memory Attach (staged " + std::to_string(wc.staged_bytes()) + ")";
  }
  return "";
}

}  // namespace

TEST_CASE("backward: dq, dk with rope.inverse() on unpack and on pack; replicated kv heads summed in float32 in rank order, rotated, rounded once: every rank bit-exact, every communicator") {
  for (int P = 2; P <= 4; ++P)
    ut::on_groups_of(P, [&](MPI_Comm sub) {
      Comms g(sub);
      for (Shape sh : shapes_of(P))
        for (Split split : kSplits)
          for (bool unpack : {true, false})
            for (Format format : {Format::bshd, Format::sbhd, Format::bhsd})
              for (int stages : {1, 2})
            for (Via via : kVias) {
              sh.S = length_of(split, P);
              const SeqPartition seq = seq_of(split, sh.S, P);
              CAPTURE(P);
              CAPTURE(sh.S);
              CAPTURE(sh.H);
              CAPTURE(sh.Hkv);
              CAPTURE(std::string(name_of(split)));
              CAPTURE(std::string(to_string(format)));
              CAPTURE(stages);
              CAPTURE(std::string(unpack ? "on unpack" : "on pack"));
              CAPTURE(std::string(name_of(via)));
              CHECK(run_backward<float>(g, sh, seq, format, stages, unpack, via) == "");
              CHECK(run_backward<bf16>(g, sh, seq, format, stages, unpack, via) == "");
            }
    });
}

// ---- 3. the agreement ---------------------------------------------------------------------------


// all_rows: every rank plans q by rows and only rank `odd` passes RoPE: the call numbering tells
// the calls apart (over MpiComm's message path their messages carry different tags and never
// pair; the call probe of the wait finds the peer in another call of the same number).
namespace {
/// body(comm, wc, options) on every group of P ranks (20 s deadlines), with the path `via`: 0
/// messages, 1 alltoallv (over MpiComm), 2 the window's direct path (over wc, an MpiWindowComm).
template <class Body>
void on_path(int P, int via, Body&& body) {
  ut::on_groups_of(P, [&](MPI_Comm sub) {
    {
      MpiComm comm(sub, MpiComm::kIntMaxBytes, std::chrono::seconds(20));
      MpiWindow win(comm, 1u << 16);
      MpiWindowComm wc(comm, win, std::chrono::seconds(20));
      PlanOptions opt;
      opt.path = via == 0 ? Path::messages : via == 1 ? Path::alltoallv : Path::direct;
      body(comm, wc, opt);
    }
    ut::drop_leftovers(sub);
  });
}
}  // namespace

TEST_CASE("with_row_transforms() or a row transform on one rank only: plan_mismatch on every rank, over MpiComm (messages, alltoallv) and MpiWindowComm (direct)") {
  const int P = ut::world_size();
  for (int all_rows : {0, 1})
    for (int odd : {0, P - 1})          // the rank whose tensor is planned row by row (all_rows: that passes a transform)
      for (int with_tx : {0, 1})        // whether that rank passes a transform for it
        for (int via = 0; via < 3; ++via) {  // messages, alltoallv, the window's direct path
          if (all_rows && !with_tx) continue;
          CAPTURE(all_rows);
          CAPTURE(odd);
          CAPTURE(with_tx);
          CAPTURE(via);
          on_path(P, via, [&](MpiComm& comm, MpiWindowComm& wc, const PlanOptions& opt) {
            const int r = comm.rank();
            const HeadPartition qh = HeadPartition::even(2 * P, P), kvh = HeadPartition::gqa(qh, 1);
            TensorSpec q = TensorSpec::of<float>(qh, 4);
            if (r == odd || all_rows) q.with_row_transforms();
            const Plan plan({P, r}, 1, SeqPartition::even(2 * P, P), {q, TensorSpec::of<float>(kvh, 4)}, Format::bshd, opt);
            std::vector<float> a(plan.seq_bytes(0) / 4, 1.0f), b(plan.seq_bytes(1) / 4, 2.0f), oa(plan.head_bytes(0) / 4), ob(plan.head_bytes(1) / 4);
            std::vector<std::byte> ws(plan.workspace_bytes());
            HostExecutor ex;
            const Rope rope(4, 2 * P);
            RowTransforms tx;
            if (r == odd && with_tx) tx.on_pack(0, rope);
            const TensorList<ConstByteSpan> in{ConstByteSpan(a), ConstByteSpan(b)};
            const TensorList<ByteSpan> out{ByteSpan(oa), ByteSpan(ob)};
            const ut::TimedError t = ut::timed_error_of([&] {
              if (via < 2) seq_to_head(plan, comm, ex, in, out, ws, tx);
              else seq_to_head(plan, wc, ex, in, out, ws, tx);
            });
            CAPTURE(r);
            CAPTURE(t.message);
            CHECK(t.code == Errc::plan_mismatch);
            CHECK(t.ms < 15000);
          });
        }
}

TEST_CASE("a Rope with another theta or style on one rank: plan_mismatch on every rank, over MpiComm (messages, alltoallv) and MpiWindowComm (direct); nothing written") {
  const int P = ut::world_size();
  for (int odd : {0, P - 1})
    for (int variant : {1, 2})
      for (int via = 0; via < 3; ++via) {
        CAPTURE(odd);
        CAPTURE(variant);
        CAPTURE(via);
        on_path(P, via, [&](MpiComm& comm, MpiWindowComm& wc, const PlanOptions& opt) {
          const int r = comm.rank();
          const Plan plan({P, r}, 1, SeqPartition::even(2 * P, P), {TensorSpec::of<float>(HeadPartition::even(2 * P, P), 4).with_row_transforms()},
                          Format::bshd, opt);
          std::vector<float> a(plan.seq_bytes(0) / 4, 1.0f), o(plan.head_bytes(0) / 4, -7.0f);
          std::vector<std::byte> ws(plan.workspace_bytes());
          HostExecutor ex;
          const Rope rope = r != odd ? Rope(4, 2 * P) : variant == 1 ? Rope(4, 2 * P, 500000.0) : Rope(4, 2 * P, 10000.0, 0, RopeStyle::interleaved);
          RowTransforms tx;
          tx.on_pack(0, rope);
          const ut::TimedError t = ut::timed_error_of([&] {
            if (via < 2) seq_to_head(plan, comm, ex, TensorList<ConstByteSpan>{a}, TensorList<ByteSpan>{o}, ws, tx);
            else seq_to_head(plan, wc, ex, TensorList<ConstByteSpan>{a}, TensorList<ByteSpan>{o}, ws, tx);
          });
          CAPTURE(r);
          CAPTURE(t.message);
          CHECK(t.code == Errc::plan_mismatch);
          CHECK(t.ms < 15000);
          CHECK(std::count(o.begin(), o.end(), -7.0f) == static_cast<std::ptrdiff_t>(o.size()));
        });
      }
}

int main(int argc, char** argv) { return ut::mpi_doctest_main(argc, argv); }
