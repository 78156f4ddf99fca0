// SPDX-License-Identifier: Apache-2.0
// bands.hpp: HeadBands' bands (query heads cut per rank, GQA groups whole, replicated kv heads in
// the first band that uses them) and the band pipeline in-process: banded_attention() and
// banded_attention_backward() over every band count from 1 to the largest H_r give the bits of the
// unbanded layer (GQA, MQA with replicated kv heads, uneven H; P = 2, 3, 4), with the worker thread
// and without; a failing attention on one rank is every rank's error.
#include <doctest/doctest.h>
#include <ulysses/bands.hpp>
#include <ulysses/comm/local.hpp>
#include <ulysses/host/executor.hpp>

#include <atomic>
#include <stdexcept>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "band_case.hpp"
#include "expect_error.hpp"

using namespace ulysses;

namespace {
/// Every rank's result of case c with `bands` (0: unbanded) on a LocalGroup.
std::vector<bt::BandResult> run_all(const bt::BandCase& c, int bands, Progress progress = Progress::automatic) {
  LocalGroup g(c.P);
  std::vector<bt::BandResult> out(static_cast<std::size_t>(c.P));
  g.spawn([&](LocalGroup::Comm& comm) {
    HostExecutor exec;
    out[static_cast<std::size_t>(comm.rank())] = bt::run_layer(c, comm, exec, bands, progress);
  });
  return out;
}
}  // namespace

TEST_CASE("HeadBands: each rank's query heads cut into G parts, the kv heads they use, the uneven remainder first") {
  // H = 10, Hkv = 2, P = 2: rank 0 holds q 0..4 (kv 0), rank 1 q 5..9 (kv 1); G = 3: 2, 2, 1 heads.
  const AttentionSpecs s = attention_specs<float>(2, AttentionShape{10, 2, 4, 4});
  HeadBands b({2, 1}, 1, SeqPartition::even(8, 2), s, 3);
  CHECK(b.count() == 3);
  CHECK(b.band(0).query.lo == 0);
  CHECK(b.band(0).query.hi == 2);
  CHECK(b.band(1).query.lo == 2);
  CHECK(b.band(1).query.hi == 4);
  CHECK(b.band(2).query.lo == 4);
  CHECK(b.band(2).query.hi == 5);
  CHECK(b.band(2).kv.lo == 0);
  CHECK(b.band(2).kv.hi == 1);
  CHECK(b.qkv().options().head_bands);
  CHECK(b.qkv().num_stages() == 3);
  // H = 8, Hkv = 4, P = 2: rank 0 holds q 0..3 and kv 0, 1; G = 2: band 0 q 0, 1 (kv 0), band 1 q 2, 3 (kv 1).
  const AttentionSpecs g = attention_specs<float>(2, AttentionShape{8, 4, 4, 4});
  HeadBands c({2, 0}, 1, SeqPartition::even(8, 2), g, 2);
  CHECK(c.band(1).kv.lo == 1);
  CHECK(c.band(1).kv.hi == 2);
  // The kv tensor's seq→head wire of band 0 to rank 0 holds kv head 0 only, band 1 kv head 1.
  const StageCut cut{2, &g.query_heads};
  const auto w0 = wire_heads(g.kv_heads, 0, WireHeads::held, 0, cut), w1 = wire_heads(g.kv_heads, 0, WireHeads::held, 1, cut);
  REQUIRE(w0.size() == 1);
  REQUIRE(w1.size() == 1);
  CHECK(w0[0].lo == 0);
  CHECK(w0[0].hi == 1);
  CHECK(w1[0].lo == 1);
  CHECK(w1[0].hi == 2);
}

TEST_CASE("StageCut: a replicated kv head goes seq→head in each holder's first band, head→seq in the last band of any holder") {
  // MQA, H = 4, P = 2, G = 2: kv head 0 is held by both ranks; used by every band of both.
  const AttentionSpecs s = attention_specs<float>(2, AttentionShape{4, 1, 4, 4});
  const StageCut cut{2, &s.query_heads};
  for (int r = 0; r < 2; ++r) {
    CHECK(total_heads(wire_heads(s.kv_heads, r, WireHeads::held, 0, cut)) == 1);
    CHECK(total_heads(wire_heads(s.kv_heads, r, WireHeads::held, 1, cut)) == 0);
    CHECK(total_heads(wire_heads(s.kv_heads, r, WireHeads::held_for_sum, 0, cut)) == 0);
    CHECK(total_heads(wire_heads(s.kv_heads, r, WireHeads::held_for_sum, 1, cut)) == 1);
  }
  CHECK(total_heads(stage_heads(s.kv_heads, 1, cut)) == 1);
  CHECK(total_heads(stage_heads(s.kv_heads, 0, cut)) == 0);
}

TEST_CASE("HeadBands: the band count is checked, and is part of the plans' agreement record") {
  const AttentionSpecs s = attention_specs<float>(2, AttentionShape{4, 2, 4, 4});
  CHECK(ut::code_of([&] { HeadBands({2, 0}, 1, SeqPartition::even(8, 2), s, 0); }) == Errc::invalid_shape);
  CHECK(ut::code_of([&] { HeadBands({2, 0}, 1, SeqPartition::even(8, 2), s, kMaxStages + 1); }) == Errc::invalid_shape);
  CHECK(ut::code_of([&] { (void)HeadBands({2, 0}, 1, SeqPartition::even(8, 2), s, 1).band(1); }) == Errc::invalid_shape);
  const HeadBands a({2, 0}, 1, SeqPartition::even(8, 2), s, 2);
  PlanOptions staged;
  staged.stages = 2;
  const Plan plain({2, 0}, 1, SeqPartition::even(8, 2), s.qkv(), Format::bshd, staged);
  CHECK(a.qkv().fingerprint() != plain.fingerprint());  // head bands change the wire of the kv tensors
}

TEST_CASE("banded_attention and its backward: the bits of the unbanded layer for every band count, in-process") {
  for (int P : {2, 3, 4})
    for (const bt::BandCase& c : bt::band_cases(P)) {
      CAPTURE(c.name());
      const std::vector<bt::BandResult> ref = run_all(c, 0);
      for (int G = 1; G <= bt::max_bands(c); ++G) {
        CAPTURE(G);
        for (Progress pr : {Progress::automatic, Progress::in_start}) {
          const std::vector<bt::BandResult> got = run_all(c, G, pr);
          for (int r = 0; r < P; ++r) {
            CHECK(got[static_cast<std::size_t>(r)] == ref[static_cast<std::size_t>(r)]);
            CHECK(got[static_cast<std::size_t>(r)].late == 0);   // band g's heads are there when its attention runs
            CHECK(got[static_cast<std::size_t>(r)].early == 0);  // and band g + 2's not yet: bands move one by one
          }
        }
      }
    }
}

TEST_CASE("banded_attention: an attention that throws on one rank is every rank's error, within the deadline") {
  const bt::BandCase c{3, 1, 6, 6, 3, 4};
  LocalGroup g(c.P, std::chrono::seconds(20));
  std::vector<Errc> codes(3, Errc{});
  std::vector<std::string> whats(3);
  const auto t0 = std::chrono::steady_clock::now();
  g.spawn([&](LocalGroup::Comm& comm) {
    HostExecutor exec;
    const int r = comm.rank();
    const AttentionSpecs specs = c.specs();
    const SeqPartition seq = SeqPartition::balanced(c.S, c.P);
    HeadBands hb({c.P, r}, c.B, seq, specs, 2);
    std::vector<float> q(hb.qkv().seq_bytes(0) / 4), k(hb.qkv().seq_bytes(1) / 4), v(hb.qkv().seq_bytes(2) / 4);
    std::vector<float> q2(hb.qkv().head_bytes(0) / 4), k2(hb.qkv().head_bytes(1) / 4), v2(hb.qkv().head_bytes(2) / 4);
    std::vector<float> o2(hb.out().head_bytes(0) / 4), o(hb.out().seq_bytes(0) / 4);
    std::vector<std::byte> w1(hb.qkv().workspace_bytes()), w2(hb.out().workspace_bytes());
    bool engine_error = false;
    const auto [code, what] = ut::error_of([&] {
      try {
      banded_attention(hb, comm, exec, TensorList<ConstByteSpan>{q, k, v}, TensorList<ByteSpan>{q2, k2, v2}, w1, ConstByteSpan(o2),
                       ByteSpan(o), w2, [&](const Band& b) {
                         if (r == 1 && b.index == 1) throw std::runtime_error("the engine's kernel failed");
                       });
      } catch (const Error&) {
        throw;
      } catch (const std::runtime_error&) {
        engine_error = true;
      }
    });
    CHECK(engine_error == (r == 1));
    codes[static_cast<std::size_t>(r)] = code;
    whats[static_cast<std::size_t>(r)] = what;
  });
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  CHECK(codes[0] == Errc::aborted);
  CHECK(codes[2] == Errc::aborted);
  CHECK(whats[0].find("rank 1 failed in the attention of a head band") != std::string::npos);
  CHECK(codes[1] == Errc{});  // rank 1 threw the engine's own exception, unchanged
}
