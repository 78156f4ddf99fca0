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
