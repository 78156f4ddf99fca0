// SPDX-License-Identifier: Apache-2.0
// layout/transform.hpp: row transforms fused into the block copy. seq→head with RoPE (and a
// scale) on pack or on unpack of q and k, v untouched, over every in-process path (direct pushed
// and pulled, messages, all-to-all-v), every format, zigzag and uneven splits, GQA and MQA, float32
// and bfloat16: bit for bit against an independent reference (the rows rotated at their global
// (batch, token, head) and rounded once, then moved). The backward: head→seq of dq, dk with the
// inverse rotation, replicated kv heads summed in float32 then rotated and rounded once. The
// coded errors before any byte moves.
#include <doctest/doctest.h>
#include <ulysses/layout/rope.hpp>
#include <ulysses/ulysses.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "harness.hpp"

using namespace ulysses;

namespace {

struct bf16 {
  std::uint16_t bits;
};
}  // namespace
template <>
struct ulysses::element_type_of<bf16> : std::integral_constant<ElementType, ElementType::bfloat16> {};

namespace {

/// double → bfloat16 bits, one rounding to nearest even, from the double's own bits (independent
/// of the library's round-to-odd); normal range only (the tests' values are).
std::uint16_t bf16_of(double x) {
  std::uint64_t u;
  std::memcpy(&u, &x, 8);
  const std::uint64_t sign = u >> 63;
  const int e = static_cast<int>((u >> 52) & 0x7ff) - 1023;
  if (x == 0) return static_cast<std::uint16_t>(sign << 15);
  REQUIRE(e > -126);
  std::uint64_t m = u & ((std::uint64_t{1} << 52) - 1);
  std::uint64_t keep = m >> 45, rem = m & ((std::uint64_t{1} << 45) - 1);
  const std::uint64_t half = std::uint64_t{1} << 44;
  int ee = e;
  if (rem > half || (rem == half && (keep & 1))) {
    if (++keep == 128) keep = 0, ++ee;
  }
  REQUIRE(ee < 128);
  return static_cast<std::uint16_t>(sign << 15 | static_cast<std::uint64_t>(ee + 127) << 7 | keep);
}
double bf16_value(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// Element-type glue of the test: float or bf16, stored / read as double, rounded once.
template <class T>
struct E;
template <>
struct E<float> {
  static float of(double x) { return static_cast<float>(x); }
  static double value(float x) { return x; }
};
template <>
struct E<bf16> {
  static bf16 of(double x) { return {bf16_of(x)}; }
  static double value(bf16 x) { return bf16_value(x.bits); }
};

/// A whole tensor [B, S, H, D] (global), dense bshd, values on the element grid.
template <class T>
struct Global {
  std::int64_t B, S, H, D;
  std::vector<T> x;
  T& at(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) { return x[static_cast<std::size_t>(((b * S + s) * H + h) * D + d)]; }
  const T& at(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const {
    return x[static_cast<std::size_t>(((b * S + s) * H + h) * D + d)];
  }
};
template <class T>
Global<T> random_tensor(std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D, unsigned seed) {
  Global<T> g{B, S, H, D, {}};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-4.0, 4.0);
  for (std::int64_t i = 0; i < B * S * H * D; ++i) {
    double v = u(rng);
    if (std::abs(v) < 1e-3) v = 0.5;  // normal range for the bf16 reference
    g.x.push_back(E<T>::of(v));
  }
  return g;
}

/// The reference: every row of g through `f` at its global (b, s, h), rounded once.
template <class T, class F>
Global<T> transformed(const Global<T>& g, const F& f) {
  Global<T> o = g;
  std::vector<double> row(static_cast<std::size_t>(g.D));
  for (std::int64_t b = 0; b < g.B; ++b)
    for (std::int64_t s = 0; s < g.S; ++s)
      for (std::int64_t h = 0; h < g.H; ++h) {
        for (std::int64_t d = 0; d < g.D; ++d) row[static_cast<std::size_t>(d)] = E<T>::value(g.at(b, s, h, d));
        f(RowCoord{b, s, h}, row.data(), g.D);
        for (std::int64_t d = 0; d < g.D; ++d) o.at(b, s, h, d) = E<T>::of(row[static_cast<std::size_t>(d)]);
      }
  return o;
}

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

/// One configuration of the fused seq→head test.
struct Config {
  int P;
  std::int64_t B, S, H, Hkv, D;
  SeqPartition seq;
  Format format;
  Path path;
  bool pull;  // direct path: pulled (as across processes) rather than pushed
  bool on_unpack;
};

/// This rank's seq-sharded local tensor of g (layout: the plan's).
template <class T>
std::vector<T> seq_local(const Global<T>& g, const SeqPartition& seq, int r, const Layout& l) {
  std::vector<T> v(static_cast<std::size_t>(l.span_elems()));
  for (const SeqChunk& c : seq.chunks_of(r))
    for (std::int64_t b = 0; b < g.B; ++b)
      for (std::int64_t i = 0; i < c.length; ++i)
        for (std::int64_t h = 0; h < g.H; ++h)
          for (std::int64_t d = 0; d < g.D; ++d) v[static_cast<std::size_t>(l.offset(b, c.local_offset + i, h, d))] = g.at(b, c.offset + i, h, d);
  return v;
}

/// Whether rank r's head-sharded tensor (layout l, heads [h0, h1)) equals g there, bit for bit.
template <class T>
std::string head_mismatch(const Global<T>& g, const std::vector<T>& v, const Layout& l, std::int64_t h0, std::int64_t h1) {
  for (std::int64_t b = 0; b < g.B; ++b)
    for (std::int64_t s = 0; s < g.S; ++s)
      for (std::int64_t h = h0; h < h1; ++h)
        for (std::int64_t d = 0; d < g.D; ++d)
          if (!same_bits(v[static_cast<std::size_t>(l.offset(b, s, h - h0, d))], g.at(b, s, h, d)))
            return "b=" + std::to_string(b) + " s=" + std::to_string(s) + " h=" + std::to_string(h) + " d=" + std::to_string(d);
  return "";
}

/// seq→head of q, k, v with `rope` (and a scale on q) on pack or unpack of q and k; every rank's
/// outputs against the reference. Returns the failures.
template <class T>
std::string run_forward(const Config& c) {
  const Rope rope(c.D, c.S, 10000.0, c.D - (c.D % 4 == 0 ? 2 : 0), RopeStyle::half);
  const Rope rope_gptj(c.D, c.S, 500000.0, 0, RopeStyle::interleaved);
  const Scale scale{0.125};
  auto q_ref = [&](const RowCoord& at, double* row, std::int64_t n) {
    rope(at, row, n);
    scale(at, row, n);
  };
  struct QTransform {  // rope then the scale: the engine's own transform type
    const Rope* r;
    const Scale* s;
    void operator()(const RowCoord& at, double* row, std::int64_t n) const {
      (*r)(at, row, n);
      (*s)(at, row, n);
    }
  } q_tx{&rope, &scale};
  const Global<T> q = random_tensor<T>(c.B, c.S, c.H, c.D, 1), k = random_tensor<T>(c.B, c.S, c.Hkv, c.D, 2),
                  v = random_tensor<T>(c.B, c.S, c.Hkv, c.D, 3);
  const Global<T> want[3] = {transformed(q, q_ref), transformed(k, rope_gptj), v};
  const Global<T>* in[3] = {&q, &k, &v};
  LocalGroup group(c.P);
  std::vector<std::string> err(static_cast<std::size_t>(c.P));
  group.spawn([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    const HeadPartition qh = HeadPartition::even(c.H, c.P), kvh = HeadPartition::gqa(qh, c.Hkv);
    PlanOptions opt;
    opt.path = c.path;
    Plan plan({c.P, r}, c.B, c.seq,
              {TensorSpec::of<T>(qh, c.D).with_row_transforms(), TensorSpec::of<T>(kvh, c.D).with_row_transforms(),
               TensorSpec::of<T>(kvh, c.D).with_row_transforms()},
              c.format, opt);
    std::vector<std::vector<T>> ins, outs;
    for (int t = 0; t < 3; ++t) {
      ins.push_back(seq_local(*in[t], c.seq, r, plan.seq_layout(t)));
      outs.emplace_back(static_cast<std::size_t>(plan.head_layout(t).span_elems()), E<T>::of(-99.0));
    }
    std::vector<std::byte> ws(plan.workspace_bytes());
    RowTransforms tx;
    if (c.on_unpack) tx.on_unpack(0, q_tx).on_unpack(1, rope_gptj);
    else tx.on_pack(0, q_tx).on_pack(1, rope_gptj);
    HostExecutor ex(r % 2 ? 2 : 1);  // one rank on two threads: the rows cut across threads
    auto go = [&](auto& cm) {
      seq_to_head(plan, cm, ex, {ins[0], ins[1], ins[2]}, {outs[0], outs[1], outs[2]}, ws, tx);
    };
    try {
      if (c.pull) {
        ut::PullingComm pc(comm);
        go(pc);
      } else {
        go(comm);
      }
    } catch (const std::exception& e) {
      err[static_cast<std::size_t>(r)] = e.what();
      return;
    }
    const HeadPartition* parts[3] = {&qh, &kvh, &kvh};
    for (int t = 0; t < 3; ++t) {
      const std::string m = head_mismatch(want[t], outs[static_cast<std::size_t>(t)], plan.head_layout(t), parts[t]->begin(r), parts[t]->end(r));
      if (!m.empty()) err[static_cast<std::size_t>(r)] += "tensor " + std::to_string(t) + " at " + m + "; ";
    }
  });
  std::string all;
  for (int r = 0; r < c.P; ++r)
    if (!err[static_cast<std::size_t>(r)].empty()) all += "rank " + std::to_string(r) + ": " + err[static_cast<std::size_t>(r)] + "\n";
  return all;
}

}  // namespace

TEST_CASE("seq->head with RoPE (half and interleaved) and a scale fused on pack or on unpack: bit-exact on every path, format, split and GQA") {
  struct Shape {
    int P;
    std::int64_t B, S, H, Hkv, D;
  };
  const Shape shapes[] = {{2, 2, 8, 4, 2, 8}, {4, 1, 12, 8, 2, 16}, {4, 2, 10, 4, 1, 8}, {3, 1, 9, 6, 3, 6}};
  for (const Shape& s : shapes)
    for (int split = 0; split < 2; ++split)
      for (Format f : {Format::bshd, Format::bhsd, Format::sbhd})
        for (Path path : {Path::direct, Path::messages, Path::alltoallv})
          for (bool pull : {false, true})
            for (bool unpack : {false, true}) {
              if (pull && path != Path::direct) continue;
              const SeqPartition seq = split ? SeqPartition::zigzag(s.S, s.P) : SeqPartition::balanced(s.S, s.P);
              const Config c{s.P, s.B, s.S, s.H, s.Hkv, s.D, seq, f, path, pull, unpack};
              CAPTURE(s.P);
              CAPTURE(s.H);
              CAPTURE(s.Hkv);
              CAPTURE(split);
              CAPTURE(static_cast<int>(f));
              CAPTURE(to_string(path));
              CAPTURE(pull);
              CAPTURE(unpack);
              CHECK(run_forward<float>(c) == "");
              CHECK(run_forward<bf16>(c) == "");
            }
}
