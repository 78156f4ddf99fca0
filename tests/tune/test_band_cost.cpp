// SPDX-License-Identifier: Apache-2.0
// tune/band_cost.hpp: head bands overlapping the exchanges with the attention. Every expected time
// below is computed by hand from the pipeline's schedule (the link runs in_0; while attention g
// runs, in_{g+1} then out_{g-1}; then out_{G-1}); times are binary fractions, so exact.
#include <doctest/doctest.h>

#include <ulysses/tune/advise.hpp>
#include <ulysses/tune/band_cost.hpp>

#include "expect_error.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

using namespace ulysses;

namespace {
/// seq->head `in` and head->seq `out` seconds (no fixed part), attention `a`, `units` band units.
BandWork work(double in, double out, double a, int units) {
  BandWork w;
  w.seq_to_head = {in, 0};
  w.head_to_seq = {out, 0};
  w.attention_s = a;
  w.units = units;
  return w;
}
}  // namespace

TEST_CASE("band_units: balanced, the first units % G bands one unit more; G within [1, units]") {
  CHECK(band_units(5, 2) == std::vector<int>{3, 2});
  CHECK(band_units(7, 3) == std::vector<int>{3, 2, 2});
  CHECK(band_units(4, 4) == std::vector<int>{1, 1, 1, 1});
  CHECK(band_units(1, 1) == std::vector<int>{1});
  CHECK(ut::code_of([] { (void)band_units(0, 1); }) == Errc::invalid_shape);
  CHECK(ut::code_of([] { (void)band_units(3, 0); }) == Errc::invalid_shape);
  CHECK(ut::code_of([] { (void)band_units(3, 4); }) == Errc::invalid_shape);  // a GQA group is never cut
}

TEST_CASE("band_cost: G = 1 is the serial time, exposed = the exchanges, fraction 1") {
  BandWork w = work(3, 2, 5, 4);
  w.seq_to_head.fixed_s = 1;
  w.head_to_seq.fixed_s = 0.5;
  w.overhead = {0.25, 0.5};
  const BandCost c = band_cost(w, 1);
  CHECK(c.bands == 1);
  CHECK(c.band_units == std::vector<int>{4});
  CHECK(c.serial_exchange_s == 5.5);  // 3 + 2 + 2 x 0.25
  CHECK(c.attention_s == 5.5);        // 5 + 0.5
  CHECK(c.serial_s == 11);
  CHECK(c.pipelined_s == 11);
  CHECK(c.exposed_s == 5.5);
  CHECK(c.exposed_fraction == 1);
  w.shares_compute = true;  // one task after another: the same
  CHECK(band_cost(w, 1).pipelined_s == 11);
}

TEST_CASE("band_cost: f = attention / exchange = 1, G = 4, no latency or overhead: the closed form") {
  // in = out = 2, A = 4 = in + out: i = o = 0.5, a = 1 a band. Closed form (compute-bound):
  // in/G + (G-1) max(A/G, in/G + out/G) + A/G + out/G = 0.5 + 3 x 1 + 1 + 0.5 = 5.
  const BandWork w = work(2, 2, 4, 4);
  const BandCost c = band_cost(w, 4);
  const double G = 4, closed = 2 / G + (G - 1) * std::max(4 / G, 2 / G + 2 / G) + 4 / G + 2 / G;
  CHECK(closed == 5);
  CHECK(c.pipelined_s == closed);
  CHECK(c.serial_s == 8);
  CHECK(c.exposed_s == 1);  // one band's seq->head before, one band's head->seq after
  CHECK(c.exposed_fraction == 0.25);
  // Compute-bound in general: in/G + A + out/G (A = 8: 0.5 + 8 + 0.5).
  CHECK(band_cost(work(2, 2, 8, 4), 4).pipelined_s == 9);
  // G = 2 of the first: 1 + 4 + 1.
  CHECK(band_cost(w, 2).pipelined_s == 6);
  CHECK(best_bands(w).bands == 4);
  CHECK(best_bands(w, 2).bands == 2);  // max_bands caps G
}

TEST_CASE("band_cost: a link-bound pipeline: the link's tasks add up, the attention waits") {
  // in = out = 4, A = 2, G = 2: i = o = 2, a = 1. in_0 [0, 2]; attention 0 [2, 3]; in_1 [2, 4];
  // attention 1 [4, 5]; out_0 [4, 6]; out_1 [6, 8].
  const BandCost c = band_cost(work(4, 4, 2, 2), 2);
  CHECK(c.pipelined_s == 8);
  CHECK(c.exposed_s == 6);
  CHECK(c.exposed_fraction == 0.75);
  // in = out = A = 3, G = 3: every task 1. in_0 [0, 1]; a_0 [1, 2]; in_1 [1, 2]; a_1 [2, 3]; in_2
  // [2, 3]; out_0 [3, 4]; a_2 [3, 4]; out_1 [4, 5]; out_2 [5, 6].
  CHECK(band_cost(work(3, 3, 3, 3), 3).pipelined_s == 6);
}

TEST_CASE("band_cost: the uneven remainder band when G does not divide the units") {
  // units 3, G = 2: bands of 2 and 1 units, f = 2/3 and 1/3 of in = out = 3, A = 6: in {2, 1},
  // attention {4, 2}, out {2, 1}. in_0 [0, 2]; a_0 [2, 6]; in_1 [2, 3]; a_1 [6, 8]; out_0 [6, 8];
  // out_1 [8, 9].
  const BandWork w = work(3, 3, 6, 3);
  const BandCost c = band_cost(w, 2);
  CHECK(c.band_units == std::vector<int>{2, 1});
  CHECK(c.pipelined_s == 9);
  CHECK(c.exposed_s == 3);
  // The remainder last (maxdiffusion #428's split): {1, 2}: in {1, 2}, attention {2, 4}, out {1, 2}.
  // in_0 [0, 1]; a_0 [1, 3]; in_1 [1, 3]; a_1 [3, 7]; out_0 [3, 4]; out_1 [7, 9].
  CHECK(band_cost(w, std::vector<int>{1, 2}).pipelined_s == 9);
  CHECK(band_cost(w, std::vector<int>{1, 2}).bands == 2);
  CHECK(ut::code_of([&] { (void)band_cost(w, std::vector<int>{1, 1}); }) == Errc::invalid_shape);  // 2 of 3 units
  CHECK(ut::code_of([&] { (void)band_cost(w, std::vector<int>{3, 0}); }) == Errc::invalid_shape);  // an empty band
  CHECK(ut::code_of([&] { (void)band_cost(w, std::vector<int>{}); }) == Errc::invalid_shape);
  // G = 3: even and compute-bound: 1 + 6 + 1 = 8; the best.
  CHECK(band_cost(w, 3).pipelined_s == 8);
  CHECK(best_bands(w).bands == 3);
}

TEST_CASE("band_cost: the fixed part (latency, per message) stays whole in every band") {
  // in = out = 4 of which 1 fixed, A = 8, G = 2: a band's exchange 1 + 3/2 = 2.5 (not 4/2 = 2),
  // attention 4. in_0 [0, 2.5]; a_0 [2.5, 6.5]; in_1 [2.5, 5]; a_1 [6.5, 10.5]; out_0 [6.5, 9];
  // out_1 [10.5, 13].
  BandWork w = work(4, 4, 8, 2);
  w.seq_to_head.fixed_s = w.head_to_seq.fixed_s = 1;
  CHECK(band_cost(w, 2).pipelined_s == 13);
  CHECK(band_cost(work(4, 4, 8, 2), 2).pipelined_s == 12);  // without it: 2 + 8 + 2
}

TEST_CASE("best_bands: G = 1 when the transport shares the attention's compute") {
  BandWork w = work(2, 2, 4, 4);
  CHECK(best_bands(w).bands == 4);  // on its own link: 5 against 8
  w.shares_compute = true;
  CHECK(band_cost(w, 4).pipelined_s == 8);  // nothing overlaps: the same sum, a tie
  CHECK(best_bands(w).bands == 1);          // ties to the smaller G
  w.overhead.exchange_call_s = 0.25;
  CHECK(band_cost(w, 1).pipelined_s == 8.5);
  CHECK(band_cost(w, 4).pipelined_s == 10);  // 8 + 8 calls x 0.25
  const BandCost b = best_bands(w);
  CHECK(b.bands == 1);
  CHECK(b.pipelined_s == b.serial_s);
}

TEST_CASE("best_bands: G = 1 when a band's overhead exceeds what the overlap hides") {
  // in = out = 1, A = 2, 2 units: G = 2 hides in/2 + out/2 = 1, and adds one attention call.
  BandWork w = work(1, 1, 2, 2);
  w.overhead.attention_call_s = 0.5;  // adds 0.5 < 1: G = 2, 0.5 + 3 + 0.5 = 4 against 4.5
  CHECK(band_cost(w, 2).pipelined_s == 4);
  CHECK(best_bands(w).bands == 2);
  w.overhead.attention_call_s = 1.5;  // adds 1.5 > 1: G = 2 takes 0.5 + 5 + 0.5 = 6 against 5.5
  CHECK(band_cost(w, 1).pipelined_s == 5.5);
  CHECK(band_cost(w, 2).pipelined_s == 6);
  CHECK(best_bands(w).bands == 1);
  // A fast link with little attention a band: in = out = 1 of which 0.5 fixed, A = 0.5. G = 2:
  // in 0.75, attention 0.25, out 0.75: in_0 [0, 0.75]; a_0 [0.75, 1]; in_1 [0.75, 1.5]; a_1 [1.5, 1.75];
  // out_0 [1.5, 2.25]; out_1 [2.25, 3]: 3 against 2.5.
  BandWork f = work(1, 1, 0.5, 4);
  f.seq_to_head.fixed_s = f.head_to_seq.fixed_s = 0.5;
  CHECK(band_cost(f, 2).pipelined_s == 3);
  CHECK(best_bands(f).bands == 1);
}

TEST_CASE("attention_flops: 2 B h pairs (D + Dv); the causal half plus the diagonal") {
  CHECK(attention_flops(2, 4, 2) == 2 * 2 * 10 * 4);                // causal: 10 pairs
  CHECK(attention_flops(2, 4, 2, 0, 1, false) == 2 * 2 * 16 * 4);   // 16 pairs
  CHECK(attention_flops(2, 4, 2, 6, 3, false) == 2 * 3 * 2 * 16 * 8);
  CHECK(kAttentionBackwardFlopsRatio == 2.5);
}

TEST_CASE("band_exchange / layer_band_work: the model's time and its fixed part; the backward's pair") {
  CostModel m;
  m.intra = LinkCost::of(1, 1, 2);  // 1 us a message, 1 GB/s, 2 us a step
  m.copy_seconds_per_byte = 1e-9;
  m.round_seconds = 3e-6;
  auto h = HeadPartition::even(4, 2);
  const Plan qkv({2, 0}, 1, SeqPartition::even(8, 2), {TensorSpec::of<float>(h, 2), TensorSpec::of<float>(h, 2), TensorSpec::of<float>(h, 2)},
                 Format::bshd);
  const Plan o({2, 0}, 1, SeqPartition::even(8, 2), {TensorSpec::of<float>(h, 2)}, Format::bshd);
  const ExchangeTraffic t = exchange_traffic(qkv, Direction::seq_to_head, Path::alltoallv);
  const BandExchange e = band_exchange(t, m);
  CHECK(e.seconds == doctest::Approx(predict_seconds(t, m)).epsilon(1e-12));
  const double fixed = 1e-6 * t.messages[0] + 2e-6 * t.latency_steps[0] + 3e-6 * t.rounds;
  CHECK(e.fixed_s == doctest::Approx(fixed).epsilon(1e-12));
  CHECK(e.fixed_s < e.seconds);
  const BandWork f = layer_band_work(qkv, o, Path::alltoallv, m, 1e-3, 2);
  CHECK(f.seq_to_head.seconds == e.seconds);
  CHECK(f.head_to_seq.seconds == predict_seconds(o, Direction::head_to_seq, Path::alltoallv, m));
  CHECK(f.attention_s == 1e-3);
  const BandWork b = layer_band_work(qkv, o, Path::alltoallv, m, 1e-3, 2, {}, true);
  CHECK(b.seq_to_head.seconds == predict_seconds(o, Direction::seq_to_head, Path::alltoallv, m));  // dO
  CHECK(b.head_to_seq.seconds == predict_seconds(qkv, Direction::head_to_seq, Path::alltoallv, m));  // dq, dk, dv
  CHECK(b.attention_s == 2.5e-3);
  CHECK(ut::code_of([&] { (void)layer_band_work(qkv, o, Path::automatic, m, 1e-3, 2); }) == Errc::path_unsupported);
}

TEST_CASE("band_cost / best_bands: argument errors are Error(invalid_shape)") {
  const BandWork ok = work(1, 1, 1, 2);
  auto with = [&](auto change) {
    BandWork w = ok;
    change(w);
    return ut::code_of([&] { (void)band_cost(w, 1); });
  };
  CHECK(with([](BandWork&) {}) == Errc{});
  CHECK(with([](BandWork& w) { w.attention_s = -1; }) == Errc::invalid_shape);
  CHECK(with([](BandWork& w) { w.seq_to_head.seconds = std::numeric_limits<double>::quiet_NaN(); }) == Errc::invalid_shape);
  CHECK(with([](BandWork& w) { w.head_to_seq.fixed_s = 2; }) == Errc::invalid_shape);  // above its seconds
  CHECK(with([](BandWork& w) { w.overhead.exchange_call_s = -0.5; }) == Errc::invalid_shape);
  CHECK(with([](BandWork& w) { w.overhead.attention_call_s = std::numeric_limits<double>::infinity(); }) == Errc::invalid_shape);
  CHECK(with([](BandWork& w) { w.units = 0; }) == Errc::invalid_shape);
  CHECK(ut::code_of([&] { (void)band_cost(ok, 0); }) == Errc::invalid_shape);
  CHECK(ut::code_of([&] { (void)band_cost(ok, 3); }) == Errc::invalid_shape);
  CHECK(ut::code_of([&] { (void)best_bands(ok, -1); }) == Errc::invalid_shape);
}

TEST_CASE("advise_degree: DegreeChoice::bands, the forward in head bands at the BandAdvice rate") {
  // H = Hkv = 8, D = 2, S = 64 on 2 ranks of one node, 1 GB/s and nothing else: at P = 2 a rank
  // holds 4 query heads (4 units); at 1e6 FLOP/s the attention dwarfs the exchanges (compute-bound):
  // G = 4, in/4 + A + out/4.
  CostModel m;
  m.intra = LinkCost::of(0, 1);
  const AttentionShape shape{8, 8, 2, 0};
  BandAdvice b;
  b.flops_per_s = 1e6;
  const std::vector<DegreeChoice> c = advise_degree(shape, 64, 2, 2, m, ElementType::float32, 1, HeadPolicy::even, 0, false, b);
  const auto p2 = std::find_if(c.begin(), c.end(), [](const DegreeChoice& d) { return d.ulysses_degree == 2; });
  REQUIRE(p2 != c.end());
  CHECK(p2->seq_to_head.seconds == doctest::Approx(p2->seconds - p2->head_to_seq.seconds).epsilon(1e-12));
  CHECK(p2->seq_to_head.fixed_s == 0);
  const double A = attention_flops(4, 64, 2) / 1e6;
  CHECK(p2->bands.bands == 4);
  CHECK(p2->bands.attention_s == doctest::Approx(A).epsilon(1e-12));
  CHECK(p2->bands.pipelined_s == doctest::Approx(p2->seq_to_head.seconds / 4 + A + p2->head_to_seq.seconds / 4).epsilon(1e-12));
  const auto p1 = std::find_if(c.begin(), c.end(), [](const DegreeChoice& d) { return d.ulysses_degree == 1; });
  REQUIRE(p1 != c.end());
  CHECK(p1->bands.bands == 1);  // no exchange to hide
  CHECK(p1->bands.exposed_s == 0);
  // A call overhead above what a band hides: G = 1.
  b.overhead.attention_call_s = 1;
  const std::vector<DegreeChoice> o = advise_degree(shape, 64, 2, 2, m, ElementType::float32, 1, HeadPolicy::even, 0, false, b);
  const auto q2 = std::find_if(o.begin(), o.end(), [](const DegreeChoice& d) { return d.ulysses_degree == 2; });
  REQUIRE(q2 != o.end());
  CHECK(q2->bands.bands == 1);
  CHECK(q2->bands.pipelined_s == q2->bands.serial_s);
  // Without a rate: not priced.
  const std::vector<DegreeChoice> n = advise_degree(shape, 64, 2, 2, m, ElementType::float32);
  CHECK(n.back().bands.bands == 1);
  CHECK(n.back().bands.pipelined_s == 0);
  b.flops_per_s = -1;
  CHECK(ut::code_of([&] { (void)advise_degree(shape, 64, 2, 2, m, ElementType::float32, 1, HeadPolicy::even, 0, false, b); }) ==
        Errc::invalid_shape);
  b.flops_per_s = 1e6;
  b.overhead.exchange_call_s = -1;
  CHECK(ut::code_of([&] { (void)advise_degree(shape, 64, 2, 2, m, ElementType::float32, 1, HeadPolicy::even, 0, false, b); }) ==
        Errc::invalid_shape);
}

TEST_CASE("band_cost: the backward, dO seq->head, the attention backward at 2.5x, dq/dk/dv head->seq") {
  // dO 1, dq|dk|dv 3 (three tensors and their sums), forward attention 2: backward 5. G = 2 of 2
  // units: i = 0.5, a = 2.5, o = 1.5, compute-bound (2.5 >= 0.5 + 1.5): 0.5 + 5 + 1.5 = 7 against 9.
  const BandWork w = work(1, 3, kAttentionBackwardFlopsRatio * 2, 2);
  const BandCost c = band_cost(w, 2);
  CHECK(c.serial_s == 9);
  CHECK(c.pipelined_s == 7);
  CHECK(c.exposed_s == 2);
  CHECK(c.exposed_fraction == 0.5);
}
