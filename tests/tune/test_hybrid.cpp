// SPDX-License-Identifier: Apache-2.0
// tune/hybrid.hpp: advise_hybrid(), every feasible (U, R) with the ring rotation and the
// all-gather alternative, each priced as its parts (tune/ring_cost.hpp's costs, advise_degree()'s
// exchanges), best first; packed documents.
#include <doctest/doctest.h>

#include <ulysses/tune/hybrid.hpp>

#include "cost_links.hpp"
#include "expect_error.hpp"

using namespace ulysses;

using ut::links;  // 1 us + 1 GB/s inside a node, 2 us + 0.5 GB/s between nodes

TEST_CASE("advise_hybrid: every (U, R) with both kv strategies, each priced as its parts, best first") {
  // World 4 on nodes of 2, H=4, Hkv=2, D=2, S=64: U in {1, 2, 4}; (U, R) = (1,1) (1,2) (1,4) (2,1) (2,2) (4,1).
  const AttentionShape shape{4, 2, 2, 0};
  const std::vector<HybridChoice> v = advise_hybrid(shape, 64, 4, 2, links(), 1e8);
  CHECK(v.size() == 3 + 3 * 2);
  int rings = 0, gathers = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const HybridChoice& h = v[i];
    CHECK(h.outer_degree * h.ulysses_degree * h.ring_degree == 4);
    CHECK(h.seconds == h.ulysses.seconds + h.ring.exposed_seconds + h.ring.merge_seconds + h.ring.imbalance_seconds);
    CHECK(h.ring.imbalance_seconds == doctest::Approx(0).epsilon(1e-12));  // one sequence, zigzag: balanced
    CHECK(h.inter_bytes == h.ulysses.inter_bytes + h.ring.bytes[1]);
    CHECK(h.fits);
    CHECK(!h.reason.empty());
    if (i > 0) CHECK(v[i - 1].seconds <= h.seconds);
    if (h.kv == RingKv::none) CHECK(h.ring_degree == 1);
    if (h.kv != RingKv::none) {
      const Mesh m(4, h.ulysses_degree, h.ring_degree, 2);
      const RingCost want = h.kv == RingKv::rotation ? ring_cost(m, shape, 64, true, links(), 1e8)
                                                     : allgather_kv_cost(m, shape, 64, true, links(), 1e8);
      CHECK(h.ring.exposed_seconds == want.exposed_seconds);
      CHECK(h.ring.comm_seconds == want.comm_seconds);
      CHECK(h.ring.merge_seconds == want.merge_seconds);
      (h.kv == RingKv::rotation ? rings : gathers)++;
    }
  }
  CHECK(rings == 3);
  CHECK(gathers == 3);
  // U = R = 1 moves nothing (0 s), and so does a ring that its attention hides (no copy term: free
  // merges): equal times rank by memory.
  CHECK(v.front().seconds == 0);
  bool plain_zero = false;
  for (const HybridChoice& h : v) {
    if (h.seconds == 0) CHECK(v.front().activation_bytes <= h.activation_bytes);
    plain_zero = plain_zero || (h.ulysses_degree == 1 && h.ring_degree == 1 && h.seconds == 0);
  }
  CHECK(plain_zero);
  // A budget below every layout: all by memory, none fits.
  const std::vector<HybridChoice> tight = advise_hybrid(shape, 64, 4, 2, links(), 1e8, true, ElementType::bfloat16, 1, HeadPolicy::even, 1);
  CHECK(!tight.front().fits);
  for (std::size_t i = 1; i < tight.size(); ++i) CHECK(tight[i - 1].activation_bytes <= tight[i].activation_bytes);
  CHECK(ut::code_of([&] { (void)advise_hybrid(shape, 64, 4, 2, links(), 0); }) == Errc::invalid_shape);
  CHECK(ut::code_of([&] { (void)advise_hybrid(shape, 64, 6, 4, links(), 1e8); }) == Errc::invalid_mesh);  // not whole nodes
}

TEST_CASE("advise_hybrid with packed documents: each ring and all-gather priced over the documents' blocks, the imbalance in the time") {
  // World 4 on nodes of 2, H = 4, Hkv = 2, D = 2, S = 64 of documents 40, 0, 3, 20, 1 (a placeholder,
  // documents shorter than 2R).
  const AttentionShape shape{4, 2, 2, 0};
  const Documents docs({0, 40, 40, 43, 63, 64});
  const std::vector<HybridChoice> v =
      advise_hybrid(shape, 64, 4, 2, links(), 1e8, true, ElementType::bfloat16, 1, HeadPolicy::even, 0, &docs);
  const std::vector<HybridChoice> plain = advise_hybrid(shape, 64, 4, 2, links(), 1e8);
  CHECK(v.size() == plain.size());
  int priced = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const HybridChoice& h = v[i];
    CHECK(h.seconds == h.ulysses.seconds + h.ring.exposed_seconds + h.ring.merge_seconds + h.ring.imbalance_seconds);
    if (i > 0) CHECK(v[i - 1].seconds <= h.seconds);
    if (h.kv == RingKv::none) continue;
    const Mesh m(4, h.ulysses_degree, h.ring_degree, 2);
    const RingCost want = h.kv == RingKv::rotation
                              ? ring_cost(m, shape, 64, true, links(), 1e8, ElementType::bfloat16, 1, RingTransport::network, HeadPolicy::even,
                                          h.messages, &docs)
                              : allgather_kv_cost(m, shape, 64, true, links(), 1e8, ElementType::bfloat16, 1, RingTransport::network,
                                                  HeadPolicy::even, &docs);
    CHECK(h.ring.exposed_seconds == want.exposed_seconds);
    CHECK(h.ring.compute_seconds == want.compute_seconds);
    CHECK(h.ring.imbalance_seconds == want.imbalance_seconds);
    // The documents attend (40·41 + 3·4 + 20·21 + 1·2) / 2 = 1037 of the 64·65/2 = 2080 causal pairs.
    CHECK(h.ring.attended_fraction == doctest::Approx(1037.0 / 2080).epsilon(1e-12));
    CHECK(h.reason.find("documents leave 50% of the pairs") != std::string::npos);
    ++priced;
  }
  CHECK(priced == 6);
  CHECK(ut::code_of([&] {
          (void)advise_hybrid(shape, 32, 4, 2, links(), 1e8, true, ElementType::bfloat16, 1, HeadPolicy::even, 0, &docs);
        }) == Errc::seq_lengths_mismatch);
}

TEST_CASE("advise_hybrid with band overheads: each ring and plain Ulysses in head bands (bands x ring steps), ranked by the banded time") {
  // Llama-3.1-8B (H = 32, Hkv = 8, D = 128) at S = 32k on 16 ranks, nodes of 8, NVLink + InfiniBand, 500 TFLOP/s.
  const AttentionShape shape{32, 8, 128, 0};
  const std::int64_t S = 32768;
  const CostModel model = CostModel::nvlink_infiniband();
  const double rate = 500e12;
  const BandOverhead o{10e-6, 5e-6};
  const std::vector<HybridChoice> v =
      advise_hybrid(shape, S, 16, 8, model, rate, true, ElementType::bfloat16, 1, HeadPolicy::even, 0, nullptr, &o);
  const std::vector<HybridChoice> unpriced = advise_hybrid(shape, S, 16, 8, model, rate);
  REQUIRE(v.size() == unpriced.size());
  for (const HybridChoice& h : unpriced) {
    CHECK(h.bands.bands == 1);
    CHECK(h.banded_seconds == 0);
  }
  int banded = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const HybridChoice& h = v[i];
    const int U = h.ulysses_degree, R = h.ring_degree;
    INFO("U=" << U << " R=" << R << " kv " << std::string(to_string(h.kv)));
    const double calls = U > 1 ? 2 * o.exchange_call_s : 0;  // the two exchanges' calls at G = 1
    if (i > 0) CHECK(v[i - 1].banded_seconds <= h.banded_seconds);
    CHECK(h.banded_seconds <= h.seconds + calls + 1e-15);  // (G = 1 is among the choices)
    if (h.kv == RingKv::allgather) {  // the plan refuses bands there
      CHECK(h.bands.bands == 1);
      CHECK(h.banded_seconds == doctest::Approx(h.seconds + calls).epsilon(1e-12));
      continue;
    }
    // The pass as band_cost() sees it, priced again from the parts: each band's ring (or, R = 1, its
    // attention) is f of the whole plus R kernel calls and each transfer's latency (one byte's step).
    const Mesh m(16, U, R, 8);
    double ring_s = attention_flops(32 / U, S, 128, 0, 1, true) / rate, latency = 0, ring_extra = 0;
    if (R > 1) {
      const RingCost rc = ring_cost(m, shape, S, true, model, rate);
      ring_s = rc.compute_seconds + rc.exposed_seconds + rc.merge_seconds;
      ring_extra = rc.exposed_seconds + rc.merge_seconds + rc.imbalance_seconds;
      for (int s = 0; s + 1 < R; ++s) latency += detail::ring_transfer_seconds(m, RingTransport::network, 1, s, R, rc.messages, model);
    }
    BandWork w;
    w.seq_to_head = h.ulysses.seq_to_head;
    w.head_to_seq = h.ulysses.head_to_seq;
    w.attention_s = ring_s;
    w.units = 32 / U;
    w.overhead = {U > 1 ? o.exchange_call_s : 0, R * o.attention_call_s + latency};
    const BandCost want = best_bands(w);
    CHECK(h.bands.bands == want.bands);
    CHECK(h.bands.pipelined_s == doctest::Approx(want.pipelined_s).epsilon(1e-12));
    CHECK(h.banded_seconds == doctest::Approx(want.exposed_s + ring_extra).epsilon(1e-12));
    if (h.bands.bands == 1) CHECK(h.banded_seconds == doctest::Approx(h.seconds + calls).epsilon(1e-9));
    if (h.bands.bands > 1) {
      CHECK(h.banded_seconds < h.seconds + calls);
      CHECK(h.reason.find(std::to_string(h.bands.bands) + " head bands hide") != std::string::npos);
      banded += R > 1 ? 1 : 0;
    }
  }
  CHECK(banded > 0);  // some Ulysses x Ring layout hides its all-to-alls behind its bands' rings
  // A second a call: no layout bands.
  const BandOverhead slow{1, 1};
  for (const HybridChoice& h : advise_hybrid(shape, S, 16, 8, model, rate, true, ElementType::bfloat16, 1, HeadPolicy::even, 0, nullptr, &slow))
    CHECK(h.bands.bands == 1);
  const BandOverhead negative{-1e-6, 0};
  CHECK(ut::code_of([&] {
          (void)advise_hybrid(shape, S, 16, 8, model, rate, true, ElementType::bfloat16, 1, HeadPolicy::even, 0, nullptr, &negative);
        }) == Errc::invalid_shape);
}
