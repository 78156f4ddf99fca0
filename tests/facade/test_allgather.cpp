// SPDX-License-Identifier: Apache-2.0
// allgather.hpp: all-gather KV on the in-process group. The gather gives every rank the whole
// sequence in global order (zigzag, uneven and empty ranks) on every path, bit for bit; the
// backward reduce-scatters in float32 in ascending rank order, rounded once (case C25: 1.03125
// at every position of a bf16 dk, 1.00000012f for the float32 order probe, the same bits over 20
// runs and every transport); the coded errors.
#include <doctest/doctest.h>
#include <ulysses/ulysses.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

#include "expect_error.hpp"
#include "harness.hpp"
#include "row_tensors.hpp"

using namespace ulysses;
using ut::bf16;

namespace {

/// k's value at (b, global token s, head h, d): distinct per element.
float value(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
  return static_cast<float>(((b * 1000 + s) * 16 + h) * 64 + d) * 0.25f;
}

/// Gathers k (Hkv heads of D) and v (Dv) over P ranks with `seq` on `path` (pull: the direct
/// path pulled, as across processes); every rank's full k and v against the values. Failures.
std::string run_gather(int P, const SeqPartition& seq, std::int64_t B, std::int64_t Hkv, std::int64_t D, std::int64_t Dv, Path path,
                       bool pull) {
  const std::int64_t S = seq.seq_len();
  LocalGroup group(P);
  std::vector<std::string> err(static_cast<std::size_t>(P));
  group.spawn([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    PlanOptions opt;
    opt.path = path;
    const AllGatherSpecs a = allgather_kv_specs<float>(P, Hkv, D, Dv);
    Plan plan({P, r}, B, seq, a.kv(), Format::bshd, opt);
    const std::int64_t dims[2] = {D, Dv};
    std::vector<std::vector<float>> in(2), out(2);
    for (int t = 0; t < 2; ++t) {
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t i = 0; i < seq.local_length(r); ++i)
          for (std::int64_t h = 0; h < Hkv; ++h)
            for (std::int64_t d = 0; d < dims[t]; ++d) in[t].push_back(value(b, seq.global_token(r, i), h, d) + static_cast<float>(t));
      out[t].assign(static_cast<std::size_t>(B * S * Hkv * dims[t]), -1.0f);
    }
    std::vector<std::byte> ws(plan.workspace_bytes());
    HostExecutor ex;
    try {
      ut::with_direct_form(comm, pull, [&](auto& cm) {
        allgather_kv(plan, cm, ex, {in[0], in[1]}, {out[0], out[1]}, ws);
        return 0;
      });
    } catch (const std::exception& e) {
      err[static_cast<std::size_t>(r)] = e.what();
      return;
    }
    for (int t = 0; t < 2; ++t)
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t s = 0; s < S; ++s)
          for (std::int64_t h = 0; h < Hkv; ++h)
            for (std::int64_t d = 0; d < dims[t]; ++d)
              if (out[t][static_cast<std::size_t>(((b * S + s) * Hkv + h) * dims[t] + d)] != value(b, s, h, d) + static_cast<float>(t)) {
                err[static_cast<std::size_t>(r)] = "tensor " + std::to_string(t) + " token " + std::to_string(s);
                return;
              }
  });
  std::string all;
  for (int r = 0; r < P; ++r)
    if (!err[static_cast<std::size_t>(r)].empty()) all += "rank " + std::to_string(r) + ": " + err[static_cast<std::size_t>(r)] + "\n";
  return all;
}

/// The C25 backward: dk, dv [B=1, S, Hkv, D] of element type T on every rank, rank r's copy
/// filled with grad(r); the reduce-scatter on `path`; every rank's own tokens' values. Returns
/// the bits seen, one per rank (they must all be one value), or -1 when they differ.
template <class T, class G>
std::int64_t run_reduce_scatter(int P, std::int64_t S, Path path, bool pull, G grad) {
  const std::int64_t Hkv = 2, D = 4;
  const SeqPartition seq = SeqPartition::zigzag(S, P);
  LocalGroup group(P);
  std::vector<std::int64_t> seen(static_cast<std::size_t>(P), -2);
  group.spawn([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    PlanOptions opt;
    opt.path = path;
    Plan plan({P, r}, 1, seq, allgather_kv_specs<T>(P, Hkv, D).kv(), Format::bshd, opt);
    std::vector<T> full(static_cast<std::size_t>(S * Hkv * D), grad(r));
    std::vector<T> dk(static_cast<std::size_t>(seq.local_length(r) * Hkv * D)), dv = dk;
    std::vector<std::byte> ws(plan.workspace_bytes());
    HostExecutor ex;
    ut::with_direct_form(comm, pull, [&](auto& cm) {
      allgather_kv_backward(plan, cm, ex, {full, full}, {dk, dv}, ws);
      return 0;
    });
    std::int64_t bits = -2;
    for (const std::vector<T>* x : {&dk, &dv})
      for (const T& e : *x) {
        std::int64_t b = 0;
        std::memcpy(&b, &e, sizeof(T));
        bits = bits == -2 || bits == b ? b : -1;
      }
    seen[static_cast<std::size_t>(r)] = bits;
  });
  for (std::int64_t b : seen)
    if (b != seen[0]) return -1;
  return seen[0];
}

}  // namespace

TEST_CASE("allgather_kv: every rank gets the whole sequence in global order, on every path (zigzag, uneven, a rank without tokens, B = 2, Dv != D)") {
  for (Path path : {Path::direct, Path::messages, Path::alltoallv})
    for (bool pull : {false, true}) {
      if (pull && path != Path::direct) continue;
      CAPTURE(to_string(path));
      CAPTURE(pull);
      CHECK(run_gather(4, SeqPartition::zigzag(22, 4), 2, 2, 8, 4, path, pull) == "");
      CHECK(run_gather(3, SeqPartition::lengths({5, 0, 4}), 1, 1, 6, 6, path, pull) == "");
      CHECK(run_gather(8, SeqPartition::even(16, 8), 1, 8, 4, 4, path, pull) == "");
      CHECK(run_gather(1, SeqPartition::even(4, 1), 1, 2, 4, 4, path, pull) == "");
    }
}

TEST_CASE("C25: the dk|dv reduce-scatter is float32 in ascending rank order, rounded once: bf16 1.03125 (0x3F84) at every position, every run and transport") {
  // P = 8: rank 0 contributes 1.0, ranks 1-7 2^-8 each; the exact sum 1.02734375 rounds to bf16 1.03125.
  auto grad = [](int r) { return bf16{static_cast<std::uint16_t>(r == 0 ? 0x3F80 : 0x3B80)}; };  // 1.0, 2^-8
  for (Path path : {Path::direct, Path::messages, Path::alltoallv})
    for (bool pull : {false, true}) {
      if (pull && path != Path::direct) continue;
      CAPTURE(to_string(path));
      for (int run = 0; run < 20; ++run) CHECK(run_reduce_scatter<bf16>(8, 32, path, pull, grad) == 0x3F84);
    }
}

TEST_CASE("C25: the order probe in float32: rank 2 gives 1.0f, ranks 0 and 1 2^-24: (2^-24 + 2^-24) + 1 = 1.00000012f, never 1.0f") {
  auto grad = [](int r) { return r == 2 ? 1.0f : r < 2 ? 0x1p-24f : 0.0f; };
  const float want = 1.00000012f;
  std::int64_t want_bits = 0;
  std::memcpy(&want_bits, &want, 4);
  for (Path path : {Path::direct, Path::messages, Path::alltoallv})
    for (int P : {3, 8}) {
      CAPTURE(to_string(path));
      CAPTURE(P);
      for (int run = 0; run < 20; ++run) CHECK(run_reduce_scatter<float>(P, 2 * P, path, false, grad) == want_bits);
    }
}

TEST_CASE("allgather_kv refuses a plan that is not an all-gather, on every rank before any byte moves") {
  const int P = 2;
  LocalGroup g(P);
  std::vector<Errc> codes(P);
  g.spawn([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    Plan plan({P, r}, 1, SeqPartition::even(4, P), {TensorSpec::of<float>(HeadPartition::even(2, P), 4)});
    std::vector<float> a(8), o(16);
    std::vector<std::byte> ws(plan.workspace_bytes());
    HostExecutor ex;
    codes[static_cast<std::size_t>(r)] = ut::code_of([&] { allgather_kv(plan, comm, ex, {ConstByteSpan(a)}, {ByteSpan(o)}, ws); });
  });
  CHECK(codes[0] == Errc::invalid_shape);
  CHECK(codes[1] == Errc::invalid_shape);
  CHECK(ut::code_of([] { allgather_kv_specs<float>(2, 0, 4); }) == Errc::invalid_shape);
  CHECK(ut::code_of([] { allgather_kv_specs<float>(2, 2, 0); }) == Errc::invalid_shape);
}

TEST_CASE("packed documents through all-gather KV: every rank gathers the packed sequence in global order; ranks with other document lists get plan_mismatch on every rank") {
  const int P = 4;
  const Documents docs({0, 5, 5, 21, 24, 40});  // a zero-length document, a short one, uneven totals
  for (DocumentSplit split : {DocumentSplit::zigzag, DocumentSplit::balanced}) {
    CAPTURE(to_string(split));
    const SeqPartition seq = documents_partition(docs, P, split);
    for (Path path : {Path::direct, Path::messages, Path::alltoallv}) CHECK(run_gather(P, seq, 1, 2, 8, 8, path, false) == "");
  }
  LocalGroup g(P);
  std::vector<Errc> codes(P);
  g.spawn([&](LocalGroup::Comm& comm) {
    const int r = comm.rank();
    const Documents mine = r == 3 ? Documents({0, 8, 21, 24, 40}) : docs;  // rank 3 packed other documents
    const SeqPartition seq = documents_partition(mine, P, DocumentSplit::zigzag);
    Plan plan({P, r}, 1, seq, allgather_kv_specs<float>(P, 2, 8).kv());
    std::vector<float> k(static_cast<std::size_t>(seq.local_length(r) * 16)), v = k, ka(40 * 16), va = ka;
    std::vector<std::byte> ws(plan.workspace_bytes());
    HostExecutor ex;
    codes[static_cast<std::size_t>(r)] = ut::code_of([&] { allgather_kv(plan, comm, ex, {k, v}, {ka, va}, ws); });
  });
  for (Errc e : codes) CHECK(e == Errc::plan_mismatch);
}
