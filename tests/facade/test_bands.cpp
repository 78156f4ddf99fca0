// SPDX-License-Identifier: Apache-2.0
// bands.hpp: HeadBands' bands (query heads cut per rank, GQA groups whole, replicated kv heads in
// the first band that uses them) and the band pipeline in-process: banded_attention() and
// banded_attention_backward() over every band count from 1 to the largest H_r give the bits of the
// unbanded layer (GQA, MQA with replicated kv heads, uneven H; P = 2, 3, 4), with the worker thread
// and without; RoPE fused (row transforms) band by band, and a transform for a tensor not planned
// by rows refused before a byte moves; a failing attention on one rank is every rank's error; C24 (bands [7,7] and
// [5,5,4] of 14 heads a rank, MHA and GQA, new inputs every round, outputs poisoned with NaN).
#include <doctest/doctest.h>
#include <ulysses/bands.hpp>
#include <ulysses/comm/local.hpp>
#include <ulysses/host/executor.hpp>

#include <atomic>
#include <stdexcept>
#include <chrono>
#include <mutex>
#include <string>
#include <tuple>
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

TEST_CASE("banded_attention and its backward with RoPE fused (row transforms): the bits of the unbanded calls with the same transforms") {
  for (int P : {2, 3})
    for (bt::BandCase c : bt::band_cases(P)) {
      CAPTURE(c.name());
      const std::vector<bt::BandResult> plain = run_all(c, 0);
      c.rope = true;
      const std::vector<bt::BandResult> ref = run_all(c, 0);
      for (int r = 0; r < P; ++r) {  // the rotation changes o, and dq, dk through the inverse (dv is RoPE's identity)
        CHECK(ref[static_cast<std::size_t>(r)].o != plain[static_cast<std::size_t>(r)].o);
        CHECK(ref[static_cast<std::size_t>(r)].dq != plain[static_cast<std::size_t>(r)].dq);
        CHECK(ref[static_cast<std::size_t>(r)].dv == plain[static_cast<std::size_t>(r)].dv);
      }
      for (int G = 1; G <= bt::max_bands(c); ++G) {
        CAPTURE(G);
        for (Progress pr : {Progress::automatic, Progress::in_start}) {
          const std::vector<bt::BandResult> got = run_all(c, G, pr);
          for (int r = 0; r < P; ++r) CHECK(got[static_cast<std::size_t>(r)] == ref[static_cast<std::size_t>(r)]);
        }
      }
    }
}

TEST_CASE("banded_attention: a transform for a tensor not planned by rows is refused on every rank before a byte moves") {
  const bt::BandCase c{2, 1, 8, 4, 2, 4};  // q, k not planned by rows
  LocalGroup g(2);
  std::vector<Errc> codes(2, Errc{});
  std::vector<std::string> whats(2);
  g.spawn([&](LocalGroup::Comm& comm) {
    HostExecutor exec;
    const bt::LayerPlans lp(c, comm.rank(), 2);
    const Rope rope(c.D, c.S);
    RowTransforms tx;
    tx.on_pack(0, rope);
    const std::int64_t Hr = lp.specs.query_heads.count(comm.rank()), Kr = lp.specs.kv_heads.count(comm.rank());
    std::vector<float> q(static_cast<std::size_t>(c.S / 2 * c.H * c.D)), k(static_cast<std::size_t>(c.S / 2 * c.Hkv * c.D)), v = k, o = q;
    std::vector<float> q2(static_cast<std::size_t>(c.S * Hr * c.D)), k2(static_cast<std::size_t>(c.S * Kr * c.D)), v2 = k2, o2 = q2;
    std::vector<std::byte> w1(lp.qkv().workspace_bytes()), w2(lp.out().workspace_bytes());
    bool attended = false;
    std::tie(codes[static_cast<std::size_t>(comm.rank())], whats[static_cast<std::size_t>(comm.rank())]) = ut::error_of([&] {
      banded_attention(lp.bands, comm, exec, TensorList<ConstByteSpan>{q, k, v}, TensorList<ByteSpan>{q2, k2, v2}, w1, ConstByteSpan(o2),
                       ByteSpan(o), w2, [&](const Band&) { attended = true; }, Progress::automatic, tx);
    });
    CHECK_FALSE(attended);
  });
  CHECK(codes[0] == Errc::invalid_shape);
  CHECK(codes[1] == Errc::invalid_shape);
  for (const std::string& w : whats) {  // the user's call named, then its exchange, the tensor and the cure
    CAPTURE(w);
    CHECK(w.find("banded_attention (its seq_to_head): a row transform was given for tensor 0") != std::string::npos);
    CHECK(w.find("with_row_transforms()") != std::string::npos);
  }
}

TEST_CASE("banded_attention: one rank's refused transform reaches its peer within milliseconds, not at the deadline") {
  const bt::BandCase c{2, 1, 8, 4, 2, 4};  // q, k not planned by rows
  LocalGroup g(2, std::chrono::seconds(20));
  std::vector<ut::TimedError> errs(2);
  std::vector<int> attended(2, 0);
  g.spawn([&](LocalGroup::Comm& comm) {
    HostExecutor exec;
    const int r = comm.rank();
    const bt::LayerPlans lp(c, r, 2);
    const Rope rope(c.D, c.S);
    RowTransforms tx;
    if (r == 1) tx.on_pack(0, rope);  // rank 1 alone refuses
    const std::int64_t Hr = lp.specs.query_heads.count(r), Kr = lp.specs.kv_heads.count(r);
    std::vector<float> q(static_cast<std::size_t>(c.S / 2 * c.H * c.D)), k(static_cast<std::size_t>(c.S / 2 * c.Hkv * c.D)), v = k, o = q;
    std::vector<float> q2(static_cast<std::size_t>(c.S * Hr * c.D)), k2(static_cast<std::size_t>(c.S * Kr * c.D)), v2 = k2, o2 = q2;
    std::vector<std::byte> w1(lp.qkv().workspace_bytes()), w2(lp.out().workspace_bytes());
    errs[static_cast<std::size_t>(r)] = ut::timed_error_of([&] {
      banded_attention(lp.bands, comm, exec, TensorList<ConstByteSpan>{q, k, v}, TensorList<ByteSpan>{q2, k2, v2}, w1, ConstByteSpan(o2),
                       ByteSpan(o), w2, [&](const Band&) { ++attended[static_cast<std::size_t>(r)]; }, Progress::automatic, tx);
    });
  });
  CAPTURE(errs[0].message);
  CAPTURE(errs[1].message);
  CHECK(errs[1].code == Errc::invalid_shape);
  CHECK(errs[1].message.find("banded_attention (its seq_to_head): a row transform was given for tensor 0") != std::string::npos);
  CHECK(errs[0].code == Errc::aborted);
  CHECK(errs[0].message.find("rank 1") != std::string::npos);
  CHECK(errs[0].ms < 2000);  // told, not the 20 s deadline
  CHECK(attended == std::vector<int>{0, 0});
}

TEST_CASE("banded_attention_backward: a refused transform is every rank's error before do moves or the attention backward runs") {
  const bt::BandCase c{2, 1, 8, 4, 2, 4};  // v not planned by rows
  for (int G : {1, 2})
    for (bool one_rank : {false, true}) {
      CAPTURE(G);
      CAPTURE(one_rank);
      LocalGroup g(2);
      std::vector<Errc> codes(2, Errc{});
      std::vector<int> attended(2, 0);
      std::string refused;  // rank 1's error
      g.spawn([&](LocalGroup::Comm& comm) {
        HostExecutor exec;
        const int r = comm.rank();
        const bt::LayerPlans lp(c, r, G);
        const Rope rope(c.D, c.S);
        RowTransforms tx;
        if (!one_rank || r == 1) tx.on_unpack(2, rope);
        const std::int64_t Hr = lp.specs.query_heads.count(r), Kr = lp.specs.kv_heads.count(r);
        std::vector<float> dout(static_cast<std::size_t>(c.S / 2 * c.H * c.D), 1.0f), do2(static_cast<std::size_t>(c.S * Hr * c.D), -1.0f);
        std::vector<float> dq2(static_cast<std::size_t>(c.S * Hr * c.D)), dk2(static_cast<std::size_t>(c.S * Kr * c.D)), dv2 = dk2;
        std::vector<float> dq(dout.size()), dk(static_cast<std::size_t>(c.S / 2 * c.Hkv * c.D)), dv = dk;
        std::vector<std::byte> w1(lp.qkv().workspace_bytes()), w2(lp.out().workspace_bytes());
        std::string what;
        std::tie(codes[static_cast<std::size_t>(r)], what) = ut::error_of([&] {
          banded_attention_backward(lp.bands, comm, exec, ConstByteSpan(dout), ByteSpan(do2), w2, TensorList<ConstByteSpan>{dq2, dk2, dv2},
                                    TensorList<ByteSpan>{dq, dk, dv}, w1, [&](const Band&) { ++attended[static_cast<std::size_t>(r)]; },
                                    Progress::automatic, tx);
        });
        if (!one_rank || r == 1) CHECK(do2 == std::vector<float>(do2.size(), -1.0f));  // do never moved on a refusing rank
        if (r == 1) refused = what;
      });
      CAPTURE(refused);
      CHECK(refused.find("banded_attention_backward (its head_to_seq): a row transform was given for tensor 2") != std::string::npos);
      CHECK(attended == std::vector<int>{0, 0});
      CHECK(codes[1] == Errc::invalid_shape);
      CHECK(codes[0] == (one_rank ? Errc::aborted : Errc::invalid_shape));
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

// ---- break31: the bands against the unbanded layer on formats, shared kv heads, G past H_r ------

namespace {
using bt::FmtCase;
using bt::FmtResult;
using bt::fmt_layer;
void check_fmt_case(const FmtCase& c, const std::vector<int>& Gs) {
  std::vector<FmtResult> ref(static_cast<std::size_t>(c.P));
  std::vector<std::vector<float>> rq(static_cast<std::size_t>(c.P)), rdo(static_cast<std::size_t>(c.P));
  {
    LocalGroup g(c.P);
    g.spawn([&](LocalGroup::Comm& comm) {
      const auto i = static_cast<std::size_t>(comm.rank());
      ref[i] = fmt_layer(c, comm, 0, Progress::automatic, nullptr, nullptr, &rq[i], &rdo[i]);
    });
  }
  for (int G : Gs)
    for (Progress pr : {Progress::thread, Progress::in_start}) {
      CAPTURE(G);
      CAPTURE(static_cast<int>(pr));
      std::vector<FmtResult> got(static_cast<std::size_t>(c.P));
      LocalGroup g(c.P);
      g.spawn([&](LocalGroup::Comm& comm) {
        const auto i = static_cast<std::size_t>(comm.rank());
        got[i] = fmt_layer(c, comm, G, pr, &rq[i], &rdo[i]);
      });
      for (int r = 0; r < c.P; ++r) {
        CAPTURE(r);
        CHECK(got[static_cast<std::size_t>(r)] == ref[static_cast<std::size_t>(r)]);
        CHECK(got[static_cast<std::size_t>(r)].wrong_in == 0);
      }
    }
}
}  // namespace

TEST_CASE("break31: banded = unbanded on sbhd, bhsd, uneven sequences, B > 1, balanced GQA with shared kv heads, G up to kMaxStages") {
  const std::vector<int> Gs{1, 2, 3, 5, 7, kMaxStages};
  const FmtCase cases[] = {
      {2, 2, 7, 4, 2, 3, HeadPolicy::automatic, Format::sbhd, false},   // GQA split, uneven S
      {3, 2, 8, 6, 3, 2, HeadPolicy::automatic, Format::bhsd, false},   // Hkv = P
      {4, 1, 9, 6, 2, 2, HeadPolicy::balanced, Format::sbhd, false},    // balanced: kv heads shared unevenly
      {3, 2, 5, 4, 2, 2, HeadPolicy::balanced, Format::bhsd, false},    // balanced GQA, H_r 2, 1, 1
      {4, 3, 8, 8, 1, 2, HeadPolicy::automatic, Format::bhsd, true},    // MQA, B = 3
      {2, 1, 6, 8, 8, 2, HeadPolicy::automatic, Format::bshd, true},    // MHA (Hkv = H)
      {4, 2, 6, 5, 5, 2, HeadPolicy::balanced, Format::sbhd, false},    // MHA balanced, a rank with 1 head
      {3, 1, 6, 3, 1, 2, HeadPolicy::balanced, Format::bshd, false},    // one query head per rank, G >> H_r
      {4, 2, 5, 3, 1, 2, HeadPolicy::balanced, Format::sbhd, false},    // H < P: rank 3 holds no query head
      {4, 1, 6, 2, 2, 2, HeadPolicy::balanced, Format::bhsd, false},    // two ranks without heads, MHA
      {3, 1, 6, 4, 4, 2, HeadPolicy::balanced, Format::bshd, true},     // MHA balanced 2, 1, 1
      {4, 2, 5, 9, 3, 2, HeadPolicy::balanced, Format::sbhd, false},    // kv 1 on ranks 1, 2; kv 2 on ranks 2, 3
      {3, 1, 7, 8, 4, 2, HeadPolicy::balanced, Format::bhsd, false},    // kv 1 on ranks 0, 1 mid-band
  };
  for (const FmtCase& c : cases) {
    CAPTURE(c.P);
    CAPTURE(c.H);
    CAPTURE(c.Hkv);
    CAPTURE(to_string(c.format));
    check_fmt_case(c, Gs);
  }
}

namespace {
template <class F>
std::pair<std::vector<Errc>, std::vector<std::string>> every_rank_bands(int P, F&& body) {
  LocalGroup g(P, std::chrono::seconds(20));
  std::vector<Errc> codes(static_cast<std::size_t>(P), Errc{});
  std::vector<std::string> whats(static_cast<std::size_t>(P));
  const auto t0 = std::chrono::steady_clock::now();
  g.spawn([&](LocalGroup::Comm& comm) {
    const auto [code, what] = ut::error_of([&] { body(comm, comm.rank()); });
    codes[static_cast<std::size_t>(comm.rank())] = code;
    whats[static_cast<std::size_t>(comm.rank())] = what;
  });
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  return {codes, whats};
}
}  // namespace

TEST_CASE("break31: band counts that differ between ranks are plan_mismatch on every rank, forward and backward") {
  const bt::BandCase c{3, 1, 6, 12, 3, 4};
  for (int back = 0; back < 2; ++back)
    for (Progress pr : {Progress::thread, Progress::in_start})
      for (int odd : {0, 2}) {
        CAPTURE(back);
        CAPTURE(odd);
        CAPTURE(static_cast<int>(pr));
        const auto [codes, whats] = every_rank_bands(c.P, [&](LocalGroup::Comm& comm, int r) {
          HostExecutor exec;
          const AttentionSpecs specs = c.specs();
          const SeqPartition seq = SeqPartition::balanced(c.S, c.P);
          HeadBands hb({c.P, r}, c.B, seq, specs, r == odd ? 3 : 2);
          std::vector<float> q(hb.qkv().seq_bytes(0) / 4), k(hb.qkv().seq_bytes(1) / 4), v(hb.qkv().seq_bytes(2) / 4);
          std::vector<float> q2(hb.qkv().head_bytes(0) / 4), k2(hb.qkv().head_bytes(1) / 4), v2(hb.qkv().head_bytes(2) / 4);
          std::vector<float> o2(hb.out().head_bytes(0) / 4), o(hb.out().seq_bytes(0) / 4);
          std::vector<std::byte> w1(hb.qkv().workspace_bytes()), w2(hb.out().workspace_bytes());
          int ran = 0;
          if (!back)
            banded_attention(hb, comm, exec, TensorList<ConstByteSpan>{q, k, v}, TensorList<ByteSpan>{q2, k2, v2}, w1, ConstByteSpan(o2),
                             ByteSpan(o), w2, [&](const Band&) { ++ran; }, pr);
          else
            banded_attention_backward(hb, comm, exec, ConstByteSpan(o), ByteSpan(o2), w2, TensorList<ConstByteSpan>{q2, k2, v2},
                                      TensorList<ByteSpan>{q, k, v}, w1, [&](const Band&) { ++ran; }, pr);
          CHECK(ran == 0);  // nothing ran: the first band's exchange failed
        });
        for (int r = 0; r < c.P; ++r) {
          CAPTURE(r);
          CAPTURE(whats[static_cast<std::size_t>(r)]);
          CHECK(codes[static_cast<std::size_t>(r)] == Errc::plan_mismatch);
        }
      }
}

TEST_CASE("break31: an attention backward that throws on one rank, in any band, is every rank's error") {
  const bt::BandCase c{3, 1, 6, 9, 3, 4};
  for (int band = 0; band < 3; ++band)
    for (Progress pr : {Progress::thread, Progress::in_start}) {
      CAPTURE(band);
      CAPTURE(static_cast<int>(pr));
      bool engine_error = false;
      const auto [codes, whats] = every_rank_bands(c.P, [&](LocalGroup::Comm& comm, int r) {
        HostExecutor exec;
        HeadBands hb({c.P, r}, c.B, SeqPartition::balanced(c.S, c.P), c.specs(), 3);
        std::vector<float> q(hb.qkv().seq_bytes(0) / 4), k(hb.qkv().seq_bytes(1) / 4), v(hb.qkv().seq_bytes(2) / 4);
        std::vector<float> q2(hb.qkv().head_bytes(0) / 4), k2(hb.qkv().head_bytes(1) / 4), v2(hb.qkv().head_bytes(2) / 4);
        std::vector<float> o2(hb.out().head_bytes(0) / 4), o(hb.out().seq_bytes(0) / 4);
        std::vector<std::byte> w1(hb.qkv().workspace_bytes()), w2(hb.out().workspace_bytes());
        try {
          banded_attention_backward(hb, comm, exec, ConstByteSpan(o), ByteSpan(o2), w2, TensorList<ConstByteSpan>{q2, k2, v2},
                                    TensorList<ByteSpan>{q, k, v}, w1,
                                    [&](const Band& b) {
                                      if (r == 2 && b.index == band) throw std::logic_error("backward kernel failed");
                                    },
                                    pr);
        } catch (const std::logic_error&) {
          engine_error = true;
          throw Error(Errc::backend, "engine");
        }
        // a second layer after the failure must not hang either
        seq_to_head(hb.qkv(), comm, exec, TensorList<ConstByteSpan>{q, k, v}, TensorList<ByteSpan>{q2, k2, v2}, w1);
      });
      CHECK(engine_error);
      for (int r = 0; r < 2; ++r) {
        CAPTURE(whats[static_cast<std::size_t>(r)]);
        CHECK(codes[static_cast<std::size_t>(r)] == Errc::aborted);
        CHECK(whats[static_cast<std::size_t>(r)].find("rank 2 failed in the attention backward of a head band") != std::string::npos);
      }
    }
}

namespace {
/// Layer on strided views: seq side padded per token (a fused buffer's view), head side padded per
/// head; the engine addresses both through Layout::offset. Integer data: exact in any order.
struct StridedOut {
  std::vector<float> o, dq, dk, dv;
  long wrong_in = 0;
  bool operator==(const StridedOut& x) const { return o == x.o && dq == x.dq && dk == x.dk && dv == x.dv; }
};
StridedOut strided_layer(int P, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t Hkv, std::int64_t D, LocalGroup::Comm& comm,
                         int G, Progress pr, const std::vector<float>* ref_q2, std::vector<float>* q2_out) {
  HostExecutor exec;
  const int r = comm.rank();
  AttentionSpecs specs = attention_specs<float>(P, AttentionShape{H, Hkv, D, D}, HeadPolicy::balanced);
  const SeqPartition seq = SeqPartition::balanced(S, P);
  const std::int64_t Sr = seq.local_length(r), Hr = specs.query_heads.count(r), Kr = specs.kv_heads.count(r);
  auto seq_l = [&](std::int64_t n) { return Layout::strided({B, Sr, n, D}, {Sr * (n * D + 3), n * D + 3, D, 1}); };
  auto head_l = [&](std::int64_t n) { return Layout::strided({B, S, n, D}, {S * n * (D + 1) + 2, n * (D + 1), D + 1, 1}); };
  specs.q.with_seq_layout(seq_l(H)).with_head_layout(head_l(Hr));
  specs.k.with_seq_layout(seq_l(Hkv)).with_head_layout(head_l(Kr));
  specs.v.with_seq_layout(seq_l(Hkv)).with_head_layout(head_l(Kr));
  specs.o.with_seq_layout(seq_l(H)).with_head_layout(head_l(Hr));
  const HeadBands hb({P, r}, B, seq, specs, G ? G : 1);
  const Plan qkv0({P, r}, B, seq, specs.qkv()), out0({P, r}, B, seq, specs.out());
  const Plan& qkv = G ? hb.qkv() : qkv0;
  const Plan& out = G ? hb.out() : out0;
  auto span = [](const Layout& l) { return static_cast<std::size_t>(l.span_elems()); };
  std::vector<float> q = bt::ints(span(seq_l(H)), r * 4), k = bt::ints(span(seq_l(Hkv)), r * 4 + 1), v = bt::ints(span(seq_l(Hkv)), r * 4 + 2),
                     dout = bt::ints(span(seq_l(H)), r * 4 + 3);
  std::vector<float> q2(span(head_l(Hr)), 9999.0f), k2(span(head_l(Kr)), -7.0f), v2(span(head_l(Kr)), -7.0f), o2(span(head_l(Hr)), -5.0f),
      do2(span(head_l(Hr)), -5.0f), dq2(span(head_l(Hr)), -3.0f), dk2(span(head_l(Kr)), 0.0f), dv2(span(head_l(Kr)), 0.0f);
  StridedOut res;
  res.o.assign(q.size(), -1.0f), res.dq.assign(q.size(), -1.0f), res.dk.assign(k.size(), -1.0f), res.dv.assign(v.size(), -1.0f);
  std::vector<std::byte> wq(qkv.workspace_bytes()), wo(out.workspace_bytes());
  const Layout lq = head_l(Hr), lk = head_l(Kr);
  auto fwd = [&](HeadRun heads) {
    for (std::int64_t j = heads.lo; j < heads.hi; ++j)
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t s = 0; s < S; ++s)
          for (std::int64_t d = 0; d < D; ++d) {
            const auto i = static_cast<std::size_t>(lq.offset(b, s, j, d));
            if (ref_q2 && q2[i] != (*ref_q2)[i]) ++res.wrong_in;
            o2[i] = 2 * q2[i] + 1;
          }
  };
  auto bwd = [&](HeadRun heads) {
    for (std::int64_t j = heads.lo; j < heads.hi; ++j) {
      const std::int64_t kv = specs.local_kv_head(r, j);
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t s = 0; s < S; ++s)
          for (std::int64_t d = 0; d < D; ++d) {
            const auto i = static_cast<std::size_t>(lq.offset(b, s, j, d)), x = static_cast<std::size_t>(lk.offset(b, s, kv, d));
            dq2[i] = do2[i] - 1;
            dk2[x] += do2[i];
            dv2[x] += 3 * do2[i];
          }
    }
  };
  const TensorList<ConstByteSpan> in{q, k, v};
  const TensorList<ByteSpan> hd{q2, k2, v2};
  if (!G) {
    seq_to_head(qkv, comm, exec, in, hd, wq);
    fwd({0, Hr});
    head_to_seq(out, comm, exec, ConstByteSpan(o2), ByteSpan(res.o), wo);
    head_to_seq_backward(out, comm, exec, ConstByteSpan(dout), ByteSpan(do2), wo);
    bwd({0, Hr});
    seq_to_head_backward(qkv, comm, exec, TensorList<ConstByteSpan>{dq2, dk2, dv2}, TensorList<ByteSpan>{res.dq, res.dk, res.dv}, wq);
  } else {
    banded_attention(hb, comm, exec, in, hd, wq, ConstByteSpan(o2), ByteSpan(res.o), wo, [&](const Band& b) { fwd(b.query); }, pr);
    banded_attention_backward(hb, comm, exec, ConstByteSpan(dout), ByteSpan(do2), wo, TensorList<ConstByteSpan>{dq2, dk2, dv2},
                              TensorList<ByteSpan>{res.dq, res.dk, res.dv}, wq, [&](const Band& b) { bwd(b.query); }, pr);
  }
  if (q2_out) *q2_out = q2;
  return res;
}
}  // namespace

TEST_CASE("break31: banded = unbanded on strided views (padded seq and head layouts), padding untouched") {
  struct C {
    int P;
    std::int64_t B, S, H, Hkv, D;
  };
  for (const C c : {C{3, 2, 7, 6, 3, 2}, C{4, 1, 9, 6, 2, 3}, C{2, 2, 5, 5, 1, 2}}) {
    CAPTURE(c.P);
    CAPTURE(c.H);
    std::vector<StridedOut> ref(static_cast<std::size_t>(c.P));
    std::vector<std::vector<float>> rq(static_cast<std::size_t>(c.P));
    {
      LocalGroup g(c.P);
      g.spawn([&](LocalGroup::Comm& comm) {
        const auto i = static_cast<std::size_t>(comm.rank());
        ref[i] = strided_layer(c.P, c.B, c.S, c.H, c.Hkv, c.D, comm, 0, Progress::automatic, nullptr, &rq[i]);
      });
    }
    for (int G : {1, 2, 3, 4, kMaxStages})
      for (Progress pr : {Progress::thread, Progress::in_start}) {
        CAPTURE(G);
        std::vector<StridedOut> got(static_cast<std::size_t>(c.P));
        LocalGroup g(c.P);
        g.spawn([&](LocalGroup::Comm& comm) {
          const auto i = static_cast<std::size_t>(comm.rank());
          got[i] = strided_layer(c.P, c.B, c.S, c.H, c.Hkv, c.D, comm, G, pr, &rq[i], nullptr);
        });
        for (int r = 0; r < c.P; ++r) {
          CHECK(got[static_cast<std::size_t>(r)] == ref[static_cast<std::size_t>(r)]);
          CHECK(got[static_cast<std::size_t>(r)].wrong_in == 0);
        }
      }
    // the padding of the seq-side outputs is untouched (-1) in the unbanded reference too
    const StridedOut& x = ref[0];
    long pad = 0;
    for (float f : x.o) pad += f == -1.0f;
    CHECK(pad > 0);
  }
}

TEST_CASE("break31: one handle carrying several stages of one plan (one workspace) and four parts at once: the unbanded bytes") {
  const bt::BandCase c{3, 2, 7, 9, 3, 4};
  LocalGroup g(c.P);
  g.spawn([&](LocalGroup::Comm& comm) {
    for (Progress pr : {Progress::thread, Progress::in_start}) CHECK(bt::multi_part_mismatches(c, comm, pr) == 0);
  });
}

TEST_CASE("C24: P=4, H=56 (14 heads a rank), bands [7,7] and [5,5,4], MHA and GQA Hkv=8; new inputs every round, outputs NaN before the call: the 1-band bits, no head read before it arrived") {
  const int P = 4;
  bt::BandCase mha{P, 1, 64, 56, 56, 16};
  bt::BandCase gqa{P, 1, 64, 56, 8, 16};  // 2 kv heads a rank, 7 query heads each
  mha.poison = gqa.poison = true;
  // Every band count from 1 to 14 on one round; an uneven count keeps its short last band.
  {
    const std::vector<bt::BandResult> ref = run_all(mha, 0);
    for (int G = 1; G <= 14; ++G) {
      CAPTURE(G);
      const std::vector<bt::BandResult> got = run_all(mha, G);
      for (int r = 0; r < P; ++r) {
        CHECK(got[static_cast<std::size_t>(r)] == ref[static_cast<std::size_t>(r)]);  // (NaN != NaN: an unwritten element fails)
        CHECK(got[static_cast<std::size_t>(r)].late == 0);
      }
    }
  }
  // [5,5,4] of 14 query heads: the bands.
  const AttentionSpecs s = mha.specs();
  const HeadBands hb({P, 1}, 1, SeqPartition::even(64, P), s, 3);
  CHECK(hb.band(0).query.size() == 5);
  CHECK(hb.band(1).query.size() == 5);
  CHECK(hb.band(2).query.size() == 4);
  // 20 rounds of new inputs: [7,7] and [5,5,4] for MHA; [7,7] for GQA (whole kv groups), and [5,5,4]
  // for GQA too, where a kv group is split: its kv head travels with the first band that uses it
  // (documented in bands.hpp), so the bits are still the 1-band run's.
  for (unsigned round = 0; round < 20; ++round)
    for (bt::BandCase* c : {&mha, &gqa}) {
      c->salt = round + 1;
      CAPTURE(round);
      CAPTURE(c->Hkv);
      const std::vector<bt::BandResult> ref = run_all(*c, 1);
      for (int G : {2, 3}) {
        CAPTURE(G);
        const std::vector<bt::BandResult> got = run_all(*c, G);
        for (int r = 0; r < P; ++r) {
          CHECK(got[static_cast<std::size_t>(r)] == ref[static_cast<std::size_t>(r)]);
          CHECK(got[static_cast<std::size_t>(r)].late == 0);
        }
      }
    }
}
