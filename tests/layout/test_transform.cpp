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
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "expect_error.hpp"
#include "row_tensors.hpp"
#include "harness.hpp"

using namespace ulysses;
using ut::bf16;
using ut::bf16_of;
using ut::bf16_value;
using ut::E;
using ut::Global;
using ut::random_tensor;
using ut::same_bits;
using ut::transformed;

namespace {





/// One configuration of the fused seq→head test.
struct Config {
  int P;
  std::int64_t B, S, H, Hkv, D;
  SeqPartition seq;
  Format format;
  Path path;
  bool pull;  // direct path: pulled (as across processes) rather than pushed
  bool on_unpack;
  bool rope_runs = false;  // q and k both through a full-rotary Rope itself (its run form: the bf16 kernel), ranks 0, 1 streaming every store
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

/// seq→head of q, k, v with `rope` (and a scale on q) on pack or unpack of q and k, or with
/// c.rope_runs a full-rotary Rope on both; every rank's outputs against the reference. Returns
/// the failures.
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
  const Rope full(c.D, c.S, 10000.0, 0, RopeStyle::half);
  const Global<T> want[3] = {c.rope_runs ? transformed(q, full) : transformed(q, q_ref), transformed(k, c.rope_runs ? full : rope_gptj), v};
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
    if (c.rope_runs && c.on_unpack) tx.on_unpack(0, full).on_unpack(1, full);
    else if (c.rope_runs) tx.on_pack(0, full).on_pack(1, full);
    else if (c.on_unpack) tx.on_unpack(0, q_tx).on_unpack(1, rope_gptj);
    else tx.on_pack(0, q_tx).on_pack(1, rope_gptj);
    HostExecutorOptions xo{r % 2 ? 2 : 1};              // one rank on two threads: the rows cut across threads
    if (c.rope_runs && r < 2) xo.streaming_min_bytes = 0;  // non-temporal stores in the kernel
    HostExecutor ex(xo);
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

namespace {

/// head→seq (the backward of seq→head: seq_to_head_backward) of dq and dk, each rank's head-side
/// gradients its own random values, with `inv` (the inverse rotation) on unpack or on pack. The
/// reference: per element, the holders' copies in ascending rank order (on pack: each rotated
/// and rounded first) added in float32, then (on unpack) rotated in double, rounded once.
template <class T>
std::string run_backward(int P, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t Hkv, std::int64_t D, Path path,
                         bool on_unpack) {
  const Rope inv = Rope(D, S, 10000.0, 0, RopeStyle::half).inverse();
  const HeadPartition qh = HeadPartition::even(H, P), kvh = HeadPartition::gqa(qh, Hkv);
  const HeadPartition* parts[2] = {&qh, &kvh};
  // grads[t][r]: rank r's head-side gradient of tensor t, as a global-shaped tensor (its held heads filled).
  std::vector<std::vector<Global<T>>> grads(2);
  for (int t = 0; t < 2; ++t)
    for (int r = 0; r < P; ++r) grads[t].push_back(random_tensor<T>(B, S, t ? Hkv : H, D, static_cast<unsigned>(10 + 7 * r + t)));
  std::vector<Global<T>> want;
  for (int t = 0; t < 2; ++t) {
    Global<T> w = grads[t][0];
    std::vector<double> row(static_cast<std::size_t>(D)), sum(static_cast<std::size_t>(D));
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t h = 0; h < w.H; ++h) {
          const auto [first, last] = parts[t]->holders(h);
          for (int j = first; j < last; ++j) {
            for (std::int64_t d = 0; d < D; ++d) row[static_cast<std::size_t>(d)] = E<T>::value(grads[t][static_cast<std::size_t>(j)].at(b, s, h, d));
            if (!on_unpack) {
              inv(RowCoord{b, s, h}, row.data(), D);
              for (double& x : row) x = E<T>::value(E<T>::of(x));
            }
            for (std::size_t d = 0; d < row.size(); ++d)
              sum[d] = j == first ? row[d] : static_cast<double>(static_cast<float>(sum[d]) + static_cast<float>(row[d]));
          }
          if (on_unpack) inv(RowCoord{b, s, h}, sum.data(), D);
          for (std::int64_t d = 0; d < D; ++d) w.at(b, s, h, d) = E<T>::of(sum[static_cast<std::size_t>(d)]);
        }
    want.push_back(w);
  }
  const SeqPartition seq = SeqPartition::zigzag(S, P);
  LocalGroup group(P);
  std::vector<std::string> err(static_cast<std::size_t>(P));
  group.spawn([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    PlanOptions opt;
    opt.path = path;
    Plan plan({P, r}, B, seq, {TensorSpec::of<T>(qh, D).with_row_transforms(), TensorSpec::of<T>(kvh, D).with_row_transforms()},
              Format::bshd, opt);
    std::vector<std::vector<T>> ins, outs;
    for (int t = 0; t < 2; ++t) {
      const Layout& hl = plan.head_layout(t);
      std::vector<T> v(static_cast<std::size_t>(hl.span_elems()));
      const Global<T>& g = grads[t][static_cast<std::size_t>(r)];
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t s = 0; s < S; ++s)
          for (std::int64_t h = parts[t]->begin(r); h < parts[t]->end(r); ++h)
            for (std::int64_t d = 0; d < D; ++d) v[static_cast<std::size_t>(hl.offset(b, s, h - parts[t]->begin(r), d))] = g.at(b, s, h, d);
      ins.push_back(v);
      outs.emplace_back(static_cast<std::size_t>(plan.seq_layout(t).span_elems()), E<T>::of(-99.0));
    }
    std::vector<std::byte> ws(plan.workspace_bytes());
    RowTransforms tx;
    if (on_unpack) tx.on_unpack(0, inv).on_unpack(1, inv);
    else tx.on_pack(0, inv).on_pack(1, inv);
    HostExecutor ex(r % 2 ? 2 : 1);
    try {
      seq_to_head_backward(plan, comm, ex, {ins[0], ins[1]}, {outs[0], outs[1]}, ws, tx);
    } catch (const std::exception& e) {
      err[static_cast<std::size_t>(r)] = e.what();
      return;
    }
    for (int t = 0; t < 2; ++t) {
      const Layout& sl = plan.seq_layout(t);
      for (const SeqChunk& c : seq.chunks_of(r))
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t i = 0; i < c.length; ++i)
            for (std::int64_t h = 0; h < want[static_cast<std::size_t>(t)].H; ++h)
              for (std::int64_t d = 0; d < D; ++d)
                if (!same_bits(outs[static_cast<std::size_t>(t)][static_cast<std::size_t>(sl.offset(b, c.local_offset + i, h, d))],
                               want[static_cast<std::size_t>(t)].at(b, c.offset + i, h, d))) {
                  err[static_cast<std::size_t>(r)] = "tensor " + std::to_string(t) + " token " + std::to_string(c.offset + i) + " head " + std::to_string(h);
                  return;
                }
    }
  });
  std::string all;
  for (int r = 0; r < P; ++r)
    if (!err[static_cast<std::size_t>(r)].empty()) all += "rank " + std::to_string(r) + ": " + err[static_cast<std::size_t>(r)] + "\n";
  return all;
}

}  // namespace

TEST_CASE("seq->head with Rope's runs (half rotation, D = 128 and 64: the bf16 kernel) on pack and on unpack, stored plainly and streamed: the bits of rows rotated first") {
  // Rope itself on q and k (its run form: a run along a token's heads; the bf16 kernel), one rank
  // on two threads (runs cut across threads), executors that stream every store (ranks 0 and 1:
  // non-temporal stores in the kernel) beside ones that never do; direct pushed and pulled, messages.
  for (std::int64_t D : {std::int64_t{128}, std::int64_t{64}})
    for (bool unpack : {false, true})
      for (Path path : {Path::direct, Path::messages})
        for (bool pull : {false, true}) {
          if (pull && path != Path::direct) continue;
          const Config c{4, 2, 24, 8, 4, D, SeqPartition::zigzag(24, 4), Format::bshd, path, pull, unpack, true};
          CAPTURE(D);
          CAPTURE(unpack);
          CAPTURE(to_string(path));
          CAPTURE(pull);
          CHECK(run_forward<bf16>(c) == "");
          CHECK(run_forward<float>(c) == "");
        }
}

namespace {
/// A row transform whose copy_run records each run's src and next_src (RowRun::next_src) and
/// copies the rows; it declares prefetches_next_src = Prefetches.
template <bool Prefetches>
struct RunRecorder {
  static constexpr bool prefetches_next_src = Prefetches;
  std::vector<std::pair<const std::byte*, const std::byte*>>* seen;
  void operator()(const RowCoord&, double*, std::int64_t) const {}
  bool copy_run(const RowRun& run, ElementType) const {
    seen->emplace_back(run.src, run.next_src);
    for (std::int64_t i = 0; i < run.count; ++i)
      std::memcpy(run.dst + i * run.dst_stride, run.src + i * run.src_stride, static_cast<std::size_t>(run.n) * 4);
    return true;
  }
};
}  // namespace

TEST_CASE("RowRun::next_src: the next run's first row where it starts a new stride, for a transform that prefetches it; null otherwise, and no change to the bytes") {
  // A block of 3 tokens x 2 heads (the innermost loop: a run) of rows of 4 floats, read from a
  // token of 4 heads (the runs 4 rows apart: a new stride each) or of 2 (whole tokens: the next
  // run follows on, which the hardware streams), written densely.
  for (std::int64_t heads_in : {std::int64_t{4}, std::int64_t{2}}) {
    BlockCopy c{};
    const std::int64_t row = 16;
    const std::int64_t ext[4] = {1, 1, 3, 2};
    for (int i = 0; i < 4; ++i) c.extent[i] = ext[i];
    c.src_stride[3] = row, c.src_stride[2] = heads_in * row, c.src_stride[1] = 3 * heads_in * row, c.src_stride[0] = c.src_stride[1];
    c.dst_stride[3] = row, c.dst_stride[2] = 2 * row, c.dst_stride[1] = 6 * row, c.dst_stride[0] = c.dst_stride[1];
    c.row_bytes = row, c.elem_bytes = 4, c.type = ElementType::float32, c.row_tensor = 0, c.row_sides = 1;
    c.axis[0] = 0, c.axis[1] = 0, c.axis[2] = 1, c.axis[3] = 2;
    std::vector<float> in(static_cast<std::size_t>(3 * heads_in * 4)), out(24, -1.0f);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i);
    const auto* src = reinterpret_cast<const std::byte*>(in.data());
    std::vector<std::pair<const std::byte*, const std::byte*>> with, without;
    RunRecorder<true> a{&with};
    RunRecorder<false> b{&without};
    RowTransforms tx;
    tx.on_pack(0, a).on_pack(1, b);
    CHECK(tx.pack(0).prefetches_next_src);
    CHECK_FALSE(tx.pack(1).prefetches_next_src);
    for (int t = 0; t < 2; ++t) {
      detail::RowCursor at(c, 0);
      CHECK(detail::copy_runs(c, tx.pack(t), ElementType::float32, 4, src, reinterpret_cast<std::byte*>(out.data()), at, 0, 6, false) == 6);
      for (std::int64_t k = 0; k < 3; ++k)
        for (std::int64_t h = 0; h < 2; ++h)
          for (std::int64_t d = 0; d < 4; ++d)
            CHECK(out[static_cast<std::size_t>((k * 2 + h) * 4 + d)] == in[static_cast<std::size_t>((k * heads_in + h) * 4 + d)]);
    }
    const std::byte* first[3] = {src, src + heads_in * row, src + 2 * heads_in * row};
    REQUIRE(with.size() == 3);
    REQUIRE(without.size() == 3);
    for (std::size_t k = 0; k < 3; ++k) {
      CAPTURE(heads_in);
      CAPTURE(k);
      CHECK(with[k].first == first[k]);
      CHECK(with[k].second == (heads_in == 4 && k < 2 ? first[k + 1] : nullptr));  // (the last run: nothing after it)
      CHECK(without[k].second == nullptr);  // (the executor prefetches for it)
    }
  }
}

TEST_CASE("backward: head->seq of dq and dk with the inverse rotation; replicated kv heads (GQA, MQA) summed in float32, rotated, rounded once") {
  struct Shape {
    int P;
    std::int64_t B, S, H, Hkv, D;
  };
  const Shape shapes[] = {{4, 2, 8, 8, 2, 8}, {4, 1, 9, 4, 1, 6}, {2, 1, 8, 4, 4, 8}};
  for (const Shape& s : shapes)
    for (Path path : {Path::direct, Path::messages, Path::alltoallv})
      for (bool unpack : {true, false}) {
        CAPTURE(s.P);
        CAPTURE(s.Hkv);
        CAPTURE(to_string(path));
        CAPTURE(unpack);
        CHECK(run_backward<float>(s.P, s.B, s.S, s.H, s.Hkv, s.D, path, unpack) == "");
        CHECK(run_backward<bf16>(s.P, s.B, s.S, s.H, s.Hkv, s.D, path, unpack) == "");
      }
}

namespace {
struct NoTransformExec {  // a host executor that applies no transforms
  static constexpr bool runs_on_host = true;
  void run(const BlockCopy* b, std::size_t n, const BufferTable& t) const { HostExecutor{}.run(b, n, t); }
};
}  // namespace

TEST_CASE("a row transform's errors, on every rank before any byte moves: a tensor not planned for them, out of range, an executor without them, a Rope that does not cover S, an opaque type") {
  const int P = 2;
  LocalGroup g(P);
  std::vector<std::vector<std::pair<Errc, std::string>>> got(P);
  g.spawn([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    const HeadPartition h = HeadPartition::even(2, P);
    Plan plan({P, r}, 1, SeqPartition::even(4, P), {TensorSpec::of<float>(h, 4).with_row_transforms(), TensorSpec::of<float>(h, 4)});
    std::vector<float> a(16, 1.0f), b(16, 1.0f), oa(16), ob(16);
    std::vector<std::byte> ws(plan.workspace_bytes());
    HostExecutor ex;
    const Rope rope(4, 4), short_rope(4, 2);
    auto call = [&](const RowTransforms& tx, auto& exec) {
      return ut::error_of([&] { seq_to_head(plan, comm, exec, {a, b}, {oa, ob}, ws, tx); });
    };
    RowTransforms not_planned, out_of_range, too_short, fine;
    not_planned.on_pack(1, rope);
    out_of_range.on_pack(5, rope);
    too_short.on_unpack(0, short_rope);
    fine.on_pack(0, rope);
    NoTransformExec plain;
    auto& mine = got[static_cast<std::size_t>(r)];
    mine.push_back(call(fine, ex));  // first: a refused call breaks the group (its peers hear of it at once)
    mine.push_back(call(not_planned, ex));
    mine.push_back(call(out_of_range, ex));
    mine.push_back(call(too_short, ex));
    mine.push_back(call(fine, plain));
  });
  for (int r = 0; r < P; ++r) {
    const auto& e = got[static_cast<std::size_t>(r)];
    REQUIRE(e.size() == 5);
    CHECK(e[0].first == Errc{});
    for (int i = 1; i < 5; ++i) CHECK(e[static_cast<std::size_t>(i)].first == Errc::invalid_shape);
    CHECK(e[1].second.find("with_row_transforms") != std::string::npos);
    CHECK(e[2].second.find("tensor 5") != std::string::npos);
    CHECK(e[3].second.find("max_position") != std::string::npos);
    CHECK(e[3].second.find("the unpack transform of tensor 0 refuses its rows") != std::string::npos);  // (which tensor, which side)
    CHECK(e[4].second.find("executor") != std::string::npos);
  }
  CHECK(ut::code_of([] {
          struct Opaque {
            char c[4];
          };
          Plan({1, 0}, 1, SeqPartition::even(4, 1), {TensorSpec::of<Opaque>(HeadPartition::even(2, 1), 4).with_row_transforms()});
        }) == Errc::invalid_shape);
  CHECK(ut::code_of([] {
          Plan({1, 0}, 1, SeqPartition::even(4, 1), {TensorSpec::of<float>(HeadPartition::even(2, 1), 2048).with_row_transforms()});
        }) == Errc::invalid_shape);
  // A wire alone plans by rows: the refusal names the wire, not with_row_transforms().
  const auto [code, what] = ut::error_of([] {
    Plan({1, 0}, 1, SeqPartition::even(4, 1), {TensorSpec::of<float>(HeadPartition::even(2, 1), 2048).with_wire(Wire::fp8_e4m3)});
  });
  CHECK(code == Errc::invalid_shape);
  CHECK(what.find("tensor 0 (with_wire(fp8_e4m3): planned by rows): head_dim D=2048") != std::string::npos);
}

TEST_CASE("with_row_transforms() is in the agreement record: ranks that differ get plan_mismatch on every rank") {
  const int P = 2;
  LocalGroup g(P);
  std::vector<Errc> codes(P);
  g.spawn([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    TensorSpec s = TensorSpec::of<float>(HeadPartition::even(2, P), 4);
    if (r == 1) s.with_row_transforms();
    Plan plan({P, r}, 1, SeqPartition::even(4, P), {s});
    std::vector<float> a(16, 1.0f), o(16);
    std::vector<std::byte> ws(plan.workspace_bytes());
    HostExecutor ex;
    codes[static_cast<std::size_t>(r)] = ut::code_of([&] { seq_to_head(plan, comm, ex, a, o, ws); });
  });
  CHECK(codes[0] == Errc::plan_mismatch);
  CHECK(codes[1] == Errc::plan_mismatch);
}

namespace {
/// One seq->head of a float tensor [B=1, S, 3 heads, D] planned by rows on P = 3 ranks in-process,
/// blocking or split-phase, each rank's transforms set by `set(tx, rank)`: every rank's code and
/// message, and how many elements of its output it wrote (the output starts at -7).
struct MismatchRun {
  std::vector<Errc> codes;
  std::vector<std::string> messages;
  std::vector<int> written;
};
MismatchRun run_with_transforms(std::int64_t S, std::int64_t D, bool split, const std::function<void(RowTransforms&, int)>& set) {
  const int P = 3;
  LocalGroup g(P);
  MismatchRun m{std::vector<Errc>(P), std::vector<std::string>(P), std::vector<int>(P)};
  g.spawn([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    const Plan plan({P, r}, 1, SeqPartition::even(S, P), {TensorSpec::of<float>(HeadPartition::even(3, P), D).with_row_transforms()});
    std::vector<float> a(plan.seq_bytes(0) / 4), o(plan.head_bytes(0) / 4, -7.0f);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 5) + 0.25f;
    std::vector<std::byte> ws(plan.workspace_bytes());
    HostExecutor ex;
    RowTransforms tx;
    set(tx, r);
    std::tie(m.codes[static_cast<std::size_t>(r)], m.messages[static_cast<std::size_t>(r)]) = ut::error_of([&] {
      const TensorList<ConstByteSpan> in{ConstByteSpan(a)};
      const TensorList<ByteSpan> out{ByteSpan(o)};
      if (split) {
        Exchange<LocalGroup::Comm, HostExecutor> h(comm, ex, ExchangeCall{&plan, Direction::seq_to_head, in, out, ws, StageRange::all(), &tx});
        h.finish();
      } else {
        seq_to_head(plan, comm, ex, in, out, ws, tx);
      }
    });
    for (float x : o) m.written[static_cast<std::size_t>(r)] += x != -7.0f;
  });
  return m;
}
}  // namespace

TEST_CASE("a row transform on one rank only (every rank planned by rows): plan_mismatch on every rank, blocking and split-phase, nothing written") {
  const Rope rope(4, 6);
  for (int odd : {0, 2})
    for (bool split : {false, true}) {
      CAPTURE(odd);
      CAPTURE(split);
      const MismatchRun m = run_with_transforms(6, 4, split, [&](RowTransforms& tx, int r) {
        if (r == odd) tx.on_pack(0, rope);
      });
      for (int r = 0; r < 3; ++r) {
        CAPTURE(r);
        CHECK(m.codes[static_cast<std::size_t>(r)] == Errc::plan_mismatch);
        CHECK(m.messages[static_cast<std::size_t>(r)].find("row transforms") != std::string::npos);
        CHECK(m.written[static_cast<std::size_t>(r)] == 0);
      }
    }
}

TEST_CASE("a Rope that differs on one rank (theta, style, rotary_dim, position ids, direction): plan_mismatch on every rank, blocking and split-phase, nothing written; another max_position passes (breaker: rows rotated two ways, no error)") {
  const std::int64_t S = 6, D = 8;
  const std::vector<std::int64_t> ids = {5, 4, 3, 2, 1, 0};
  const Rope base(D, S);
  const std::vector<Rope> variants = {Rope(D, S, 500000.0), Rope(D, S, 10000.0, 0, RopeStyle::interleaved), Rope(D, S, 10000.0, 4),
                                      Rope(D, S).with_position_ids(ids.data(), S), Rope(D, S).inverse(),
                                      Rope(D, 4 * S)};  // the last: the same rotation, a longer table
  for (std::size_t v = 0; v < variants.size(); ++v)
    for (bool split : {false, true}) {
      CAPTURE(v);
      CAPTURE(split);
      const bool same = v + 1 == variants.size();
      const MismatchRun m = run_with_transforms(S, D, split, [&](RowTransforms& tx, int r) { tx.on_pack(0, r == 1 ? variants[v] : base); });
      for (int r = 0; r < 3; ++r) {
        CAPTURE(r);
        CAPTURE(m.messages[static_cast<std::size_t>(r)]);
        CHECK(m.codes[static_cast<std::size_t>(r)] == (same ? Errc{} : Errc::plan_mismatch));
        if (!same) CHECK(m.messages[static_cast<std::size_t>(r)].find("row transforms") != std::string::npos);
        CHECK(m.written[static_cast<std::size_t>(r)] == (same ? 6 * 8 : 0));  // (its one head of all 6 tokens, or nothing)
      }
    }
}

// ---- the fp8 wire (TensorSpec::with_wire) --------------------------------------------------------

namespace {

/// The reference of an fp8 wire row: the values (already rounded to the type) quantized with the
/// scale of their amax and dequantized in float32 (layout/fp8.hpp's codec, tested on its own in
/// test_fp8), as doubles.
void fp8_round_trip(double* row, std::int64_t n, Fp8Format f) {
  std::vector<float> x(static_cast<std::size_t>(n)), y(x.size());
  std::vector<std::uint8_t> q(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(row[i]);
  const float scale = fp8_scale_of(row_amax(x.data(), n), f);
  quantize_fp8(x.data(), n, scale, f, q.data());
  dequantize_fp8(q.data(), n, scale, f, y.data());
  for (std::size_t i = 0; i < x.size(); ++i) row[i] = y[i];
}

/// seq→head of q and k on an fp8 wire (`wire`) and v as its elements, RoPE on pack of q and k
/// when `rope`; every rank's outputs against the reference (rotate, round to T, fp8 round trip,
/// round to T). Returns the failures.
template <class T>
std::string run_fp8_forward(const Config& c, Wire wire, bool rope_on, const std::vector<Global<T>>* given = nullptr,
                            std::vector<std::vector<T>>* heads_out = nullptr) {
  const Rope rope(c.D, c.S);
  const auto f = static_cast<Fp8Format>(wire);
  auto ref = [&](const RowCoord& at, double* row, std::int64_t n) {
    if (rope_on) rope(at, row, n);
    for (std::int64_t i = 0; i < n; ++i) row[i] = E<T>::value(E<T>::of(row[i]));
    if (wire == Wire::bfloat16)
      for (std::int64_t i = 0; i < n; ++i) row[i] = bf16_value(bf16_of(row[i]));
    else if (wire == Wire::float16)
      for (std::int64_t i = 0; i < n; ++i) row[i] = detail::half_to_float(detail::float_to_half(static_cast<float>(row[i])));
    else
      fp8_round_trip(row, n, f);
  };
  std::vector<Global<T>> in = given ? *given
                                    : std::vector<Global<T>>{random_tensor<T>(c.B, c.S, c.H, c.D, 21), random_tensor<T>(c.B, c.S, c.Hkv, c.D, 22),
                                                             random_tensor<T>(c.B, c.S, c.Hkv, c.D, 23)};
  const Global<T> want[3] = {transformed(in[0], ref), transformed(in[1], ref), in[2]};
  LocalGroup group(c.P);
  std::vector<std::string> err(static_cast<std::size_t>(c.P));
  if (heads_out) heads_out->assign(static_cast<std::size_t>(c.P), {});
  group.spawn([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    const HeadPartition qh = HeadPartition::even(c.H, c.P), kvh = HeadPartition::gqa(qh, c.Hkv);
    PlanOptions opt;
    opt.path = c.path;
    Plan plan({c.P, r}, c.B, c.seq,
              {TensorSpec::of<T>(qh, c.D).with_wire(wire), TensorSpec::of<T>(kvh, c.D).with_wire(wire), TensorSpec::of<T>(kvh, c.D)}, c.format,
              opt);
    std::vector<std::vector<T>> ins, outs;
    for (int t = 0; t < 3; ++t) {
      ins.push_back(seq_local(in[static_cast<std::size_t>(t)], c.seq, r, plan.seq_layout(t)));
      outs.emplace_back(static_cast<std::size_t>(plan.head_layout(t).span_elems()), E<T>::of(-99.0));
    }
    std::vector<std::byte> ws(plan.workspace_bytes());
    RowTransforms tx;
    if (rope_on) tx.on_pack(0, rope).on_pack(1, rope);
    HostExecutor ex(r % 2 ? 2 : 1);
    try {
      if (c.pull) {
        ut::PullingComm pc(comm);
        seq_to_head(plan, pc, ex, {ins[0], ins[1], ins[2]}, {outs[0], outs[1], outs[2]}, ws, tx);
      } else {
        seq_to_head(plan, comm, ex, {ins[0], ins[1], ins[2]}, {outs[0], outs[1], outs[2]}, ws, tx);
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
    if (heads_out) (*heads_out)[static_cast<std::size_t>(r)] = outs[0];
  });
  std::string all;
  for (int r = 0; r < c.P; ++r)
    if (!err[static_cast<std::size_t>(r)].empty()) all += "rank " + std::to_string(r) + ": " + err[static_cast<std::size_t>(r)] + "\n";
  return all;
}

}  // namespace

TEST_CASE("fp8 wire: q and k as fp8 (E4M3, E5M2) with v as bf16 in ONE exchange, RoPE before the quantization: bit-exact on every path, format and split") {
  struct Shape {
    int P;
    std::int64_t B, S, H, Hkv, D;
  };
  const Shape shapes[] = {{2, 2, 8, 4, 2, 8}, {4, 1, 12, 8, 2, 16}, {3, 1, 9, 6, 3, 6}};
  for (const Shape& s : shapes)
    for (Wire wire : {Wire::fp8_e4m3, Wire::fp8_e5m2})
      for (Format f : {Format::bshd, Format::bhsd})
        for (Path path : {Path::direct, Path::messages, Path::alltoallv})
          for (bool pull : {false, true})
            for (bool rope : {false, true}) {
              if (pull && path != Path::direct) continue;
              const Config c{s.P, s.B, s.S, s.H, s.Hkv, s.D, SeqPartition::zigzag(s.S, s.P), f, path, pull, false};
              CAPTURE(s.P);
              CAPTURE(to_string(wire));
              CAPTURE(static_cast<int>(f));
              CAPTURE(to_string(path));
              CAPTURE(pull);
              CAPTURE(rope);
              CHECK(run_fp8_forward<bf16>(c, wire, rope) == "");
              CHECK(run_fp8_forward<float>(c, wire, rope) == "");
            }
}

TEST_CASE("cast wires: a float32 tensor on a bfloat16 wire, a bfloat16 tensor on a float16 wire, each element rounded once to the wire's type, beside v as itself") {
  for (Path path : {Path::direct, Path::messages, Path::alltoallv})
    for (bool rope : {false, true}) {
      const Config c{4, 2, 12, 8, 2, 16, SeqPartition::zigzag(12, 4), Format::bshd, path, false, false};
      CAPTURE(to_string(path));
      CAPTURE(rope);
      CHECK(run_fp8_forward<float>(c, Wire::bfloat16, rope) == "");
      CHECK(run_fp8_forward<bf16>(c, Wire::float16, rope) == "");
    }
  const HeadPartition h = HeadPartition::even(4, 2);
  const Plan f32({2, 0}, 1, SeqPartition::even(8, 2), {TensorSpec::of<float>(h, 64)});
  const Plan on_bf16({2, 0}, 1, SeqPartition::even(8, 2), {TensorSpec::of<float>(h, 64).with_wire(Wire::bfloat16)});
  CHECK(on_bf16.stage_lists(Direction::seq_to_head).send_total * 2 == f32.stage_lists(Direction::seq_to_head).send_total);
}

TEST_CASE("fp8 wire bytes: (D + 4) / (2 D) of the bf16 wire for the fp8 tensors, exactly; the agreement record carries the wire") {
  const int P = 4;
  const std::int64_t D = 128;
  const HeadPartition qh = HeadPartition::even(32, P), kvh = HeadPartition::gqa(qh, 8);
  const SeqPartition seq = SeqPartition::even(64, P);
  const Plan bf({P, 1}, 1, seq, {TensorSpec::of<bf16>(qh, D), TensorSpec::of<bf16>(kvh, D)});
  const Plan f8({P, 1}, 1, seq, {TensorSpec::of<bf16>(qh, D).with_wire(Wire::fp8_e4m3), TensorSpec::of<bf16>(kvh, D).with_wire(Wire::fp8_e4m3)});
  const std::size_t a = bf.stage_lists(Direction::seq_to_head).send_total, b = f8.stage_lists(Direction::seq_to_head).send_total;
  CHECK(b * 2 * D == a * (D + 4));  // 0.515625 at D = 128
  CHECK(f8.agreement_record() != bf.agreement_record());
  CHECK(Plan::agreement_field(detail::kElementWord) == "the rows of tensor 0: head dim, element size, row transforms and wire");
  CHECK(detail::agreement_value(detail::kElementWord, f8.agreement_record()[detail::kElementWord]) ==
        "D=128, 2-byte elements, row transforms, wire fp8_e4m3");
}

TEST_CASE("fp8 wire: a rank whose wire differs gets plan_mismatch, as does every other rank") {
  const int P = 3;
  LocalGroup g(P);
  std::vector<Errc> codes(P);
  g.spawn([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    TensorSpec s = TensorSpec::of<float>(HeadPartition::even(3, P), 4);
    s.with_wire(r == 2 ? Wire::fp8_e5m2 : Wire::fp8_e4m3);
    Plan plan({P, r}, 1, SeqPartition::even(6, P), {s});
    std::vector<float> a(24, 1.0f), o(24);
    std::vector<std::byte> ws(plan.workspace_bytes());
    HostExecutor ex;
    codes[static_cast<std::size_t>(r)] = ut::code_of([&] { seq_to_head(plan, comm, ex, a, o, ws); });
  });
  for (Errc e : codes) CHECK(e == Errc::plan_mismatch);
}

TEST_CASE("C23: fp8 rows of zeros, -0, tiny and huge values through the exchange: no NaN or inf, zeros keep their sign, tiny rows 0 or within a step") {
  // P = 2 and 4, B = 2, S = 8, H = 4, D = 16, per-(token, head) scales; the rows of q by token:
  // 0 all +0, 1 all -0, 2 one 1e-43, 3 amax 1e-40, 4 amax FLT_MIN, 5 amax 3e38, 6 padding zeros, 7 ordinary.
  for (int P : {2, 4})
    for (Wire wire : {Wire::fp8_e4m3, Wire::fp8_e5m2}) {
      const std::int64_t B = 2, S = 8, H = 4, D = 16;
      Global<float> q{B, S, H, D, std::vector<float>(static_cast<std::size_t>(B * S * H * D), 0.0f)};
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t d = 0; d < D; ++d) {
            q.at(b, 1, h, d) = -0.0f;
            q.at(b, 2, h, d) = d == 3 ? 1e-43f : 0.0f;
            q.at(b, 3, h, d) = d == 0 ? 1e-40f : (d % 3 == 0 ? -5e-41f : 0.0f);
            q.at(b, 4, h, d) = d == 1 ? 1.17549435e-38f : 1e-39f;
            q.at(b, 5, h, d) = d == 2 ? 3e38f : static_cast<float>(d) * 1e37f;
            q.at(b, 7, h, d) = static_cast<float>(d) * 0.37f - 2.0f;
          }
      const std::vector<Global<float>> in = {q, random_tensor<float>(B, S, 2, D, 3), random_tensor<float>(B, S, 2, D, 4)};
      const Config c{P, B, S, H, 2, D, SeqPartition::even(S, P), Format::bshd, Path::automatic, false, false};
      std::vector<std::vector<float>> outs;
      CAPTURE(P);
      CAPTURE(to_string(wire));
      CHECK(run_fp8_forward<float>(c, wire, false, &in, &outs) == "");  // the codec's bits, as the reference gives them
      const HeadPartition qh = HeadPartition::even(H, P);
      for (int r = 0; r < P; ++r)
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t s = 0; s < S; ++s)
            for (std::int64_t h = 0; h < qh.count(r); ++h)
              for (std::int64_t d = 0; d < D; ++d) {
                const float y = outs[static_cast<std::size_t>(r)][static_cast<std::size_t>(((b * S + s) * qh.count(r) + h) * D + d)];
                const float x = q.at(b, s, qh.begin(r) + h, d);
                CHECK(std::isfinite(y));
                if (x == 0.0f) CHECK(std::memcmp(&x, &y, 4) == 0);  // +0 -> +0, -0 -> -0
                if (s == 2 || s == 3) CHECK((y == 0.0f || std::abs(y - x) <= 2.0f * std::abs(x)));  // tiny: 0 or within a step
                if (s == 7) {  // ordinary: within half an fp8 ulp of the scaled value x / scale (and float32 rounding)
                  float amax = 0;
                  for (std::int64_t e = 0; e < D; ++e) amax = std::max(amax, std::abs(q.at(b, s, qh.begin(r) + h, e)));
                  const float scale = amax / (wire == Wire::fp8_e4m3 ? 448.0f : 57344.0f);
                  const int mant = wire == Wire::fp8_e4m3 ? 3 : 2, emin = wire == Wire::fp8_e4m3 ? -6 : -14;
                  const double v = std::abs(static_cast<double>(x) / scale);
                  const double ulp = std::ldexp(1.0, std::max(v > 0 ? static_cast<int>(std::floor(std::log2(v))) : emin, emin) - mant);
                  CHECK(std::abs(static_cast<double>(y) - x) <= 0.5 * ulp * scale * (1 + 1e-6) + 1e-7 * std::abs(x));
                }
              }
    }
}

namespace {

/// head→seq of dk (replicated kv heads summed) with an fp8 wire: each holder's copy quantized
/// and dequantized as the wire carries it (this rank's own too), the copies added in float32 in
/// ascending rank order, rounded once.
template <class T>
std::string run_fp8_backward(int P, std::int64_t S, std::int64_t H, std::int64_t Hkv, std::int64_t D, Path path, Wire wire) {
  const std::int64_t B = 1;
  const HeadPartition qh = HeadPartition::even(H, P), kvh = HeadPartition::gqa(qh, Hkv);
  std::vector<Global<T>> grads;
  for (int r = 0; r < P; ++r) grads.push_back(random_tensor<T>(B, S, Hkv, D, static_cast<unsigned>(40 + r)));
  Global<T> want = grads[0];
  std::vector<double> row(static_cast<std::size_t>(D)), sum(row.size());
  for (std::int64_t s = 0; s < S; ++s)
    for (std::int64_t h = 0; h < Hkv; ++h) {
      const auto [first, last] = kvh.holders(h);
      for (int j = first; j < last; ++j) {
        for (std::int64_t d = 0; d < D; ++d) row[static_cast<std::size_t>(d)] = E<T>::value(grads[static_cast<std::size_t>(j)].at(0, s, h, d));
        fp8_round_trip(row.data(), D, static_cast<Fp8Format>(wire));
        for (std::size_t d = 0; d < row.size(); ++d)
          sum[d] = j == first ? row[d] : static_cast<double>(static_cast<float>(sum[d]) + static_cast<float>(row[d]));
      }
      for (std::int64_t d = 0; d < D; ++d) want.at(0, s, h, d) = E<T>::of(sum[static_cast<std::size_t>(d)]);
    }
  const SeqPartition seq = SeqPartition::zigzag(S, P);
  LocalGroup group(P);
  std::vector<std::string> err(static_cast<std::size_t>(P));
  group.spawn([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    PlanOptions opt;
    opt.path = path;
    Plan plan({P, r}, B, seq, {TensorSpec::of<T>(kvh, D).with_wire(wire)}, Format::bshd, opt);
    const Layout& hl = plan.head_layout(0);
    std::vector<T> in(static_cast<std::size_t>(hl.span_elems())), out(static_cast<std::size_t>(plan.seq_layout(0).span_elems()));
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t h = kvh.begin(r); h < kvh.end(r); ++h)
        for (std::int64_t d = 0; d < D; ++d) in[static_cast<std::size_t>(hl.offset(0, s, h - kvh.begin(r), d))] = grads[static_cast<std::size_t>(r)].at(0, s, h, d);
    std::vector<std::byte> ws(plan.workspace_bytes());
    HostExecutor ex;
    try {
      seq_to_head_backward(plan, comm, ex, in, out, ws);
    } catch (const std::exception& e) {
      err[static_cast<std::size_t>(r)] = e.what();
      return;
    }
    const Layout& sl = plan.seq_layout(0);
    for (const SeqChunk& c : seq.chunks_of(r))
      for (std::int64_t i = 0; i < c.length; ++i)
        for (std::int64_t h = 0; h < Hkv; ++h)
          for (std::int64_t d = 0; d < D; ++d)
            if (!same_bits(out[static_cast<std::size_t>(sl.offset(0, c.local_offset + i, h, d))], want.at(0, c.offset + i, h, d))) {
              err[static_cast<std::size_t>(r)] = "token " + std::to_string(c.offset + i) + " head " + std::to_string(h);
              return;
            }
  });
  std::string all;
  for (int r = 0; r < P; ++r)
    if (!err[static_cast<std::size_t>(r)].empty()) all += "rank " + std::to_string(r) + ": " + err[static_cast<std::size_t>(r)] + "\n";
  return all;
}

}  // namespace

TEST_CASE("fp8 wire backward: replicated kv heads (GQA, MQA) summed from their fp8 copies in float32, rounded once, on every path") {
  for (Wire wire : {Wire::fp8_e4m3, Wire::fp8_e5m2})
    for (Path path : {Path::direct, Path::messages, Path::alltoallv}) {
      CAPTURE(to_string(wire));
      CAPTURE(to_string(path));
      CHECK(run_fp8_backward<bf16>(4, 8, 8, 2, 8, path, wire) == "");
      CHECK(run_fp8_backward<float>(4, 9, 4, 1, 6, path, wire) == "");
    }
}

namespace {
/// Every rank's error code of seq→head of one transformed tensor (P = 2) with the set `set` makes.
std::vector<Errc> call_errors(const std::function<void(RowTransforms&)>& set) {
  const int P = 2;
  LocalGroup g(P);
  std::vector<Errc> got(P);
  g.spawn([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    Plan plan({P, r}, 1, SeqPartition::even(8, P), {TensorSpec::of<float>(HeadPartition::even(2, P), 4).with_row_transforms()});
    std::vector<float> a(32, 1.0f), o(32, -5.0f);
    std::vector<std::byte> ws(plan.workspace_bytes());
    RowTransforms tx;
    set(tx);
    HostExecutor ex;
    got[static_cast<std::size_t>(r)] = ut::code_of([&] { seq_to_head(plan, comm, ex, {a}, {o}, ws, tx); });
  });
  return got;
}
}  // namespace

TEST_CASE("break32: a negative tensor index is refused on every rank, and the first bad index is the one reported") {
  const Scale s{2.0};
  for (Errc e : call_errors([&](RowTransforms& tx) { tx.on_pack(-1, s); })) CHECK(e == Errc::invalid_shape);
  RowTransforms tx;
  tx.on_pack(20, s).on_unpack(-1, s);
  CHECK(tx.has_bad_index());
  CHECK(tx.bad_index() == 20);
}

TEST_CASE("break32: a Rope whose documents or position ids cover no token refuses a sequence, on every rank") {
  Rope empty_docs(4, 16);
  empty_docs.with_documents({0, 0, 0});
  CHECK(ut::code_of([&] { empty_docs.check_rows(1, 8, 4); }) == Errc::invalid_shape);
  const std::int64_t ids[1] = {0};
  Rope no_ids(4, 16);
  no_ids.with_position_ids(ids, 0);
  CHECK(ut::code_of([&] { no_ids.check_rows(1, 8, 4); }) == Errc::invalid_shape);
  Rope r(4, 16);
  r.with_documents({0, 0});
  for (Errc e : call_errors([&](RowTransforms& t) { t.on_pack(0, r); })) CHECK(e == Errc::invalid_shape);
}

TEST_CASE("float_round_odd_normal: float_round_odd's bits wherever outside_float_normals() is 0, which is exactly off (0, 2^-126) and [2^128, inf)") {
  auto same = [](float a, float b) { return (a != a && b != b) || detail::float_bits(a) == detail::float_bits(b); };
  std::vector<double> edges = {0.0, -0.0, 0x1p-126, -0x1p-126, std::nextafter(0x1p-126, 0.0), 0x1p128, std::nextafter(0x1p128, 0.0),
                               -std::nextafter(0x1p128, 0.0), 3.4028234663852886e38, 3.4028235677973366e38, HUGE_VAL, -HUGE_VAL,
                               std::nan(""), 0x1p-1074, 0x1p-1022, 0x1.fffffffffffffp1023, 1.0, 1.0 + 0x1p-24, 1.0 + 0x1p-52, 0x1.000001p0};
  std::mt19937_64 rng(11);
  for (int i = 0; i < 200000; ++i) {
    std::uint64_t b = rng();
    if (i % 2) b = (b & 0x800fffffffffffffull) | ((897ull + rng() % 256u) << 52);  // near the float normal range
    double d;
    std::memcpy(&d, &b, 8);
    edges.push_back(d);
  }
  long long wrong = 0, misflagged = 0;
  for (double d : edges) {
    const double a = std::fabs(d);
    const bool outside = (a > 0 && a < 0x1p-126) || (a >= 0x1p128 && a != HUGE_VAL);
    misflagged += (detail::outside_float_normals(d) != 0) != outside;
    if (!outside) wrong += !same(detail::float_round_odd_normal(d), detail::float_round_odd(d));
  }
  CHECK(misflagged == 0);
  CHECK(wrong == 0);
}

TEST_CASE("round_odd_n's AVX-512 and AVX2 kernels (where the CPU has them) == the plain loop bit for bit (a NaN's payload too), and == float_round_odd: rows of every length 0..40, with and without a lane outside the float normals at every position") {
  using fn = void (*)(const double*, float*, std::int64_t);
  std::vector<fn> kernels;
#if ULYSSES_HOST_AVX2
  if (detail::host_has_avx512()) kernels.push_back(&detail::round_odd_n_avx512);
  if (detail::host_has_avx2()) kernels.push_back(&detail::round_odd_n_avx2);
#endif
  if (kernels.empty()) MESSAGE("no AVX2 on this CPU: round_odd_to is the plain loop");
  auto nan_with_low_bits = [] {  // a NaN whose payload has bits below float precision
    double d;
    const std::uint64_t b = 0x7ff0000018bcf769ull;
    std::memcpy(&d, &b, 8);
    return d;
  };
  std::mt19937_64 rng(5);
  const double specials[] = {0x1p-130, -0x1p-149, 0x1.8p128, std::nan(""), nan_with_low_bits(), HUGE_VAL, -0.0, 0x1p-1074};
  long long rows = 0, wrong = 0;
  for (std::int64_t n = 0; n <= 40; ++n)
    for (std::int64_t at = -1; at < n; ++at)
      for (double sp : specials)
        for (int second = 0; second < 2; ++second) {  // second: the low-payload NaN also at the row's other end
          std::vector<double> r(static_cast<std::size_t>(n));
          for (auto& d : r) {
            const std::uint64_t b = (rng() & 0x800fffffffffffffull) | ((897ull + rng() % 254u) << 52);  // float normals
            std::memcpy(&d, &b, 8);
          }
          if (second && n > 0) r[static_cast<std::size_t>(at <= 0 ? n - 1 : 0)] = nan_with_low_bits();
          if (at >= 0) r[static_cast<std::size_t>(at)] = sp;
          std::vector<float> plain(static_cast<std::size_t>(n) + 1, 7.0f);
          detail::round_odd_n(r.data(), plain.data(), n);
          for (std::int64_t i = 0; i < n; ++i) {  // the plain loop against float_round_odd (a NaN: any NaN)
            const float want = detail::float_round_odd(r[static_cast<std::size_t>(i)]), got = plain[static_cast<std::size_t>(i)];
            wrong += !((want != want && got != got) || detail::float_bits(want) == detail::float_bits(got));
          }
          for (fn k : kernels) {
            std::vector<float> o(static_cast<std::size_t>(n) + 1, 7.0f);  // one more: must stay 7
            k(r.data(), o.data(), n);
            wrong += std::memcmp(o.data(), plain.data(), o.size() * sizeof(float)) != 0;
          }
          ++rows;
        }
  MESSAGE("rows: " << rows << ", kernels: " << kernels.size());
  CHECK(rows == 13776);  // 2 x 8 specials x (n + 1) positions, n = 0..40
  CHECK(wrong == 0);
}

TEST_CASE("load_row, store_row and round_row (their AVX2 lanes for bfloat16 and float32 where the CPU has them) == SumArith and round_to element by element, bit for bit: every bfloat16, random float32 and double bit patterns, rows of every length 0..40, 255..257 and 300") {
  std::mt19937_64 rng(23);
  auto dbits = [](double d) {
    std::uint64_t b;
    std::memcpy(&b, &d, 8);
    return b;
  };
  auto random_double = [&] {  // float normals, specials, float subnormals and beyond float
    const std::uint64_t r = rng(), pick = r % 8;
    std::uint64_t b = rng();
    if (pick < 5) b = (b & 0x800fffffffffffffull) | ((897ull + rng() % 254u) << 52);
    if (pick == 5) b = (b & 0x800fffffffffffffull) | ((860ull + rng() % 37u) << 52);  // float subnormals and below
    if (pick == 6) b = rng() % 2 ? 0x7ff8000000000000ull | (b & 0xffffull) : (b & 0x8000000000000000ull) | 0x7ff0000000000000ull;
    double d;
    std::memcpy(&d, &b, 8);
    return d;
  };
  std::vector<std::int64_t> lengths;
  for (std::int64_t n = 0; n <= 40; ++n) lengths.push_back(n);
  for (std::int64_t n : {255, 256, 257, 300}) lengths.push_back(n);
  long long checked = 0, wrong = 0;
  std::uint32_t next_bf16 = 0;  // every bfloat16 pattern, across the rows
  for (int rep = 0; rep < 300; ++rep)
    for (std::int64_t n : lengths) {
      const ElementType ty = rep % 3 == 0 ? ElementType::bfloat16 : rep % 3 == 1 ? ElementType::float32 : ElementType::float16;
      detail::with_sum_arith(ty, [&](auto a) {
        using A = decltype(a);
        using Bits = typename A::Bits;
        const auto un = static_cast<std::size_t>(n);
        std::vector<Bits> in(un + 1), out(un + 1, Bits{0x55}), want(un);
        for (auto& b : in) b = sizeof(Bits) == 2 && std::is_same_v<A, detail::SumArith<ElementType::bfloat16>> ? static_cast<Bits>(next_bf16++ & 0xffffu)
                                                                                                            : static_cast<Bits>(rng());
        std::vector<double> row(un + 1, 9.0), x(un), r(un);
        detail::load_row(ty, reinterpret_cast<const std::byte*>(in.data()), row.data(), n);  // load
        for (std::size_t i = 0; i < un; ++i) wrong += dbits(row[i]) != dbits(static_cast<double>(A::widen(in[i])));
        wrong += row[un] != 9.0;
        for (std::size_t i = 0; i < un; ++i) x[i] = random_double();
        detail::store_row(ty, reinterpret_cast<std::byte*>(out.data()), x.data(), n);  // store
        for (std::size_t i = 0; i < un; ++i) {
          const double xi = x[i];
          Bits w;
          if constexpr (sizeof(Bits) == 4) w = A::narrow(static_cast<float>(xi));
          else w = A::narrow(detail::float_round_odd(xi));
          wrong += out[i] != w;
        }
        wrong += out[un] != Bits{0x55};
        r = x;
        detail::round_row(ty, r.data(), n);  // round
        for (std::size_t i = 0; i < un; ++i) {
          const double w = sizeof(Bits) == 4 ? static_cast<double>(static_cast<float>(x[i])) : detail::round_to(ty, x[i]);
          wrong += dbits(r[i]) != dbits(w);
        }
        checked += n;
      });
    }
  MESSAGE("elements: " << checked << ", bfloat16 patterns: " << next_bf16);
  CHECK(next_bf16 >= 65536);
  CHECK(wrong == 0);
}
