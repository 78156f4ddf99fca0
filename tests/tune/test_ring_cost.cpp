// SPDX-License-Identifier: Apache-2.0
// tune/ring_cost.hpp: the ring's traffic per step and link class (exact bytes and messages of small
// meshes), the attention FLOPs of a step, the exposed communication, the all-gather-kv
// alternative (computed by hand below); the hybrid advice is test_hybrid.cpp.
#include <doctest/doctest.h>

#include <ulysses/tune/ring_cost.hpp>

#include "cost_links.hpp"
#include "expect_error.hpp"

using namespace ulysses;

using ut::links;  // 1 us + 1 GB/s inside a node, 2 us + 0.5 GB/s between nodes

TEST_CASE("ring_block_bytes: L_j x kv heads of a Ulysses rank x (D + Dv) x element size, GQA replication") {
  const RingPartition zig(8, 2, 2, RingLayout::zigzag);  // 4 chunks of 2 tokens: L_0 = L_1 = 4
  // H=4, Hkv=2, D=Dv=2, U=2: one kv head a rank; bf16: 4 x 1 x 4 x 2 = 32 bytes.
  CHECK(ring_block_bytes(zig, 0, {4, 2, 2, 0}, ElementType::bfloat16) == 32);
  CHECK(ring_block_bytes(zig, 1, {4, 2, 2, 0}, ElementType::bfloat16, 3) == 96);  // B = 3
  // U=4 > Hkv=2: the kv heads replicate, still one a rank; U=1: both kv heads.
  CHECK(ring_block_bytes(RingPartition(8, 4, 2, RingLayout::zigzag), 0, {8, 2, 2, 0}, ElementType::float32) == 4 * 1 * 4 * 4);
  CHECK(ring_block_bytes(RingPartition(8, 1, 2, RingLayout::zigzag), 0, {8, 2, 2, 0}, ElementType::float32) == 4 * 2 * 4 * 4);
  // MLA-like Dv != D: (D + Dv) per token and head. Contiguous S=7 over R=3: L = 3, 2, 2.
  const RingPartition con(7, 1, 3, RingLayout::contiguous);
  CHECK(ring_block_bytes(con, 0, {2, 1, 4, 8}, ElementType::float32) == 3 * 1 * 12 * 4);
  CHECK(ring_block_bytes(con, 2, {2, 1, 4, 8}, ElementType::float32) == 2 * 1 * 12 * 4);
  CHECK(ut::code_of([&] { (void)ring_block_bytes(con, 3, {2, 1, 4, 8}, ElementType::float32); }) == Errc::invalid_group);
}

TEST_CASE("ring_step_traffic: one message a step on the ring's slowest link class; shared memory is a copy") {
  // World 4 = U 2 x R 2, nodes of 2: the ring of Ulysses rank 0 is world ranks 0 and 2, on nodes 0 and 1.
  const RingTraffic a = ring_step_traffic(Mesh(4, 2, 2, 2), 32);
  CHECK(a.edges[0] == 0);
  CHECK(a.edges[1] == 2);
  CHECK(a.step.messages[0] == 0);
  CHECK(a.step.messages[1] == 1);
  CHECK(a.step.bytes[0] == 0);
  CHECK(a.step.bytes[1] == 32);
  CHECK(a.step.rounds == 1);
  CHECK(a.step.copy_bytes == 0);
  CHECK(a.step.working_set_bytes == 64);
  // The same on one node of 4: intra-node.
  const RingTraffic b = ring_step_traffic(Mesh(4, 2, 2, 4), 32);
  CHECK(b.edges[0] == 2);
  CHECK(b.edges[1] == 0);
  CHECK(b.step.messages[0] == 1);
  CHECK(b.step.bytes[0] == 32);
  CHECK(b.step.bytes[1] == 0);
  // U 4 x R 4 on nodes of 8: ring 0, 4, 8, 12 on nodes 0, 0, 1, 1: edges 0-4 and 8-12 inside, 4-8 and 12-0 across.
  const RingTraffic c = ring_step_traffic(Mesh(16, 4, 4, 8), 100);
  CHECK(c.edges[0] == 2);
  CHECK(c.edges[1] == 2);
  CHECK(c.step.messages[1] == 1);
  CHECK(c.step.bytes[1] == 100);
  // In process: one synchronisation and one copy of the block (one contiguous row).
  const RingTraffic d = ring_step_traffic(Mesh(4, 2, 2, 4), 32, RingTransport::shared_memory);
  CHECK(d.step.messages[0] == 1);
  CHECK(d.step.bytes[0] == 0);
  CHECK(d.step.copy_bytes == 32);
  CHECK(d.step.copy_rows == 1);
  // R = 1: nothing moves.
  const RingTraffic e = ring_step_traffic(Mesh(4, 4, 1, 4), 32);
  CHECK(e.step.rounds == 0);
  CHECK(e.step.messages[0] + e.step.messages[1] == 0);
  CHECK(e.edges[0] + e.edges[1] == 0);
}

TEST_CASE("ring_step_flops: 2 B h pairs (D + Dv), the causal diagonal half plus the diagonal") {
  const RingPartition zig(8, 2, 2, RingLayout::zigzag);
  const RingWork diag = ring_work(zig, 0, 0, true);  // 4 x 4 causal: 10 pairs
  CHECK(ring_step_flops(diag, 2, 2) == 2 * 2 * 10 * 4);
  const RingWork upper = ring_work(zig, 0, 1, true);  // source 1 > 0: q [2, 4) against kv [0, 4): 8 pairs
  CHECK(ring_step_flops(upper, 2, 2, 0, 3) == 2 * 3 * 2 * 8 * 4);
  const RingWork lower = ring_work(zig, 1, 1, true);  // source 0 < 1: q [0, 4) against kv [0, 2): 8 pairs
  CHECK(ring_step_flops(lower, 2, 2, 6) == 2 * 2 * 8 * 8);
  const RingWork none = ring_work(RingPartition(8, 1, 2, RingLayout::contiguous), 0, 1, true);  // source above: nothing
  CHECK(ring_step_flops(none, 2, 2) == 0);
}

TEST_CASE("ring_merge_bytes: 12 B h q_len (Dv + 1) from step 1 on") {
  const RingPartition zig(8, 2, 2, RingLayout::zigzag);
  CHECK(ring_merge_bytes(ring_work(zig, 0, 0, true), 2, 2) == 0);                  // step 0 starts the running pair
  CHECK(ring_merge_bytes(ring_work(zig, 0, 1, true), 2, 2) == 12 * 2 * 2 * 3);     // q [2, 4): 2 rows
  CHECK(ring_merge_bytes(ring_work(zig, 1, 1, true), 2, 2, 3) == 12 * 3 * 2 * 4 * 3);  // all 4 rows, B = 3
  CHECK(ring_merge_bytes(ring_work(RingPartition(8, 1, 2, RingLayout::contiguous), 0, 1, true), 2, 2) == 0);  // empty work
}

TEST_CASE("ring_cost: per step comm, compute and exposed = max(0, comm - compute); the all-gather exposes it all") {
  // Causal zigzag, S=8, U=2, R=2 on nodes of 2 (the ring crosses nodes), H=4, Hkv=2, D=2, bf16:
  // block 32 bytes; a step's message 2 us + 32 B / 0.5 GB/s = 2.064 us. Query heads a rank: 2.
  // FLOPs at 1e8 FLOP/s: step 0 the diagonal, 160 FLOP = 1.6 us; step 1 both ranks 8 pairs: 128 FLOP = 1.28 us.
  const Mesh mesh(4, 2, 2, 2);
  const AttentionShape shape{4, 2, 2, 0};
  CostModel m = links();
  m.copy_seconds_per_byte = 1e-9;  // merges at 1 GB/s: step 1's largest is rank 1's 4 rows, 12 x 2 x 4 x 3 = 288 bytes
  const RingCost c = ring_cost(mesh, shape, 8, true, m, 1e8, ElementType::bfloat16);
  REQUIRE(c.merge_s.size() == 2);
  CHECK(c.merge_s[0] == 0);
  CHECK(c.merge_s[1] == doctest::Approx(288e-9).epsilon(1e-12));
  CHECK(c.merge_seconds == doctest::Approx(288e-9).epsilon(1e-12));
  REQUIRE(c.comm_s.size() == 2);
  CHECK(c.comm_s[0] == doctest::Approx(2.064e-6).epsilon(1e-12));
  CHECK(c.comm_s[1] == 0);  // the last step moves nothing
  CHECK(c.compute_s[0] == doctest::Approx(1.6e-6).epsilon(1e-12));
  CHECK(c.compute_s[1] == doctest::Approx(1.28e-6).epsilon(1e-12));
  CHECK(c.exposed_s[0] == doctest::Approx(0.464e-6).epsilon(1e-9));
  CHECK(c.exposed_s[1] == 0);
  CHECK(c.exposed_seconds == doctest::Approx(0.464e-6).epsilon(1e-9));
  CHECK(c.comm_seconds == doctest::Approx(2.064e-6).epsilon(1e-12));
  CHECK(c.compute_seconds == doctest::Approx(2.88e-6).epsilon(1e-12));
  CHECK(c.bytes[0] == 0);
  CHECK(c.bytes[1] == 32);   // R - 1 = 1 message of 32 bytes a rank
  CHECK(c.buffer_bytes == 64);  // two blocks
  const RingCost g = allgather_kv_cost(mesh, shape, 8, true, m, 1e8, ElementType::bfloat16);
  CHECK(g.merge_seconds == 0);  // one attention over the gathered kv
  CHECK(g.exposed_seconds == doctest::Approx(2.064e-6).epsilon(1e-12));
  CHECK(g.comm_seconds == c.comm_seconds);
  CHECK(g.bytes[1] == 32);
  CHECK(g.buffer_bytes == 64);  // R = 2 blocks
  // A fast enough attention hides the whole step: at 1e7 FLOP/s step 0 computes 16 us.
  CHECK(ring_cost(mesh, shape, 8, true, links(), 1e7, ElementType::bfloat16).exposed_seconds == 0);

  // Non-causal contiguous, S=7, U=1, R=3, one rank a node (every edge across nodes), H=2, Hkv=1,
  // D=Dv=4, fp32: L = 3, 2, 2, blocks 96, 64, 64 bytes; a step 2 us + 96 B / 0.5 GB/s = 2.192 us.
  // Pairs (max over ranks): step 0: 3 x 3 = 9; steps 1 and 2: 3 x 2 = 6; FLOP = 2 x 2 heads x 8 x pairs.
  const RingCost n = ring_cost(Mesh(3, 1, 3, 1), {2, 1, 4, 0}, 7, false, links(), 1e8, ElementType::float32);
  REQUIRE(n.comm_s.size() == 3);
  CHECK(n.comm_s[0] == doctest::Approx(2.192e-6).epsilon(1e-12));
  CHECK(n.comm_s[1] == doctest::Approx(2.192e-6).epsilon(1e-12));
  CHECK(n.comm_s[2] == 0);
  CHECK(n.compute_s[0] == doctest::Approx(2.88e-6).epsilon(1e-12));
  CHECK(n.compute_s[1] == doctest::Approx(1.92e-6).epsilon(1e-12));
  CHECK(n.compute_s[2] == doctest::Approx(1.92e-6).epsilon(1e-12));
  CHECK(n.exposed_s[0] == 0);
  CHECK(n.exposed_s[1] == doctest::Approx(0.272e-6).epsilon(1e-9));
  CHECK(n.exposed_seconds == doctest::Approx(0.272e-6).epsilon(1e-9));
  CHECK(n.bytes[1] == 2 * 96);
  CHECK(allgather_kv_cost(Mesh(3, 1, 3, 1), {2, 1, 4, 0}, 7, false, links(), 1e8, ElementType::float32).buffer_bytes == 3 * 96);

  CHECK(ut::code_of([&] { (void)ring_cost(mesh, shape, 8, true, links(), 0); }) == Errc::invalid_shape);
  CHECK(ut::code_of([&] { (void)ring_cost(mesh, shape, 3, true, links(), 1e8); }) == Errc::invalid_shape);  // S < 2R
}

TEST_CASE("ring_step_traffic with messages: k messages of the block, the largest piece at 4 KiB multiples") {
  const RingTraffic a = ring_step_traffic(Mesh(4, 2, 2, 4), 10000, RingTransport::network, 2);
  CHECK(a.messages == 2);
  CHECK(a.step.messages[0] == 2);
  CHECK(a.step.bytes[0] == 10000);  // the block's bytes in all
  CHECK(a.piece_bytes == 8192);     // pieces [0, 8192) and [8192, 10000): ceil(5000) rounded up to 4096 x 2
  // k = 4: begins 0, 4096, 8192, 8192, 10000: pieces 4096, 4096, 0, 1808.
  CHECK(ring_step_traffic(Mesh(4, 2, 2, 4), 10000, RingTransport::network, 4).piece_bytes == 4096);
  CHECK(ring_step_traffic(Mesh(4, 2, 2, 4), 10000).piece_bytes == 10000);
  const RingTraffic d = ring_step_traffic(Mesh(4, 2, 2, 4), 10000, RingTransport::shared_memory, 4);
  CHECK(d.step.copy_rows == 4);
  CHECK(d.step.copy_bytes == 10000);
  CHECK(ut::code_of([] { (void)ring_step_traffic(Mesh(4, 2, 2, 4), 32, RingTransport::network, 0); }) == Errc::invalid_shape);
  CHECK(ut::code_of([] { (void)ring_step_traffic(Mesh(4, 2, 2, 4), 32, RingTransport::network, kMaxRingMessages + 1); }) ==
        Errc::invalid_shape);
  CHECK(ut::code_of([] { (void)ring_step_traffic(Mesh(4, 2, 2, 4), -1); }) == Errc::invalid_shape);
}

TEST_CASE("ring_step_seconds and best_ring_messages: k alpha + lambda + max(b beta, p beta_f)") {
  const Mesh mesh(4, 2, 2, 4);  // the ring inside a node
  const double b = 1048576;     // 1 MiB: even pieces for every k <= 64 (16 KiB at 64)
  // No per-flow cap (links(): 1 us + 1 GB/s inside): each piece adds 1 us, nothing pays: 1.
  CostModel m = links();
  CHECK(ring_step_seconds(ring_step_traffic(mesh, b), m) == doctest::Approx(1e-6 + b * 1e-9).epsilon(1e-12));
  CHECK(ring_step_seconds(ring_step_traffic(mesh, b, RingTransport::network, 2), m) == doctest::Approx(2e-6 + b * 1e-9).epsilon(1e-12));
  CHECK(best_ring_messages(m, mesh, b) == 1);
  CHECK(m.intra.flow_GBps() == 0);
  // One message at most 0.5 GB/s, half the link's 1 GB/s:
  // k = 1: 1 us + 1048576 B x 2 ns = 2098.152 us; k = 2: 2 us + max(1048.576, 524288 x 2 ns = 1048.576) = 1050.576 us;
  // k = 4: 4 us + max(1048.576, 262144 x 2 ns = 524.288) = 1052.576 us: 2 is the best.
  m.intra = LinkCost::of(1, 1, 0, 0.5);
  CHECK(m.intra.flow_GBps() == doctest::Approx(0.5));
  CHECK(ring_step_seconds(ring_step_traffic(mesh, b), m) == doctest::Approx(2098.152e-6).epsilon(1e-12));
  CHECK(ring_step_seconds(ring_step_traffic(mesh, b, RingTransport::network, 2), m) == doctest::Approx(1050.576e-6).epsilon(1e-12));
  CHECK(ring_step_seconds(ring_step_traffic(mesh, b, RingTransport::network, 4), m) == doctest::Approx(1052.576e-6).epsilon(1e-12));
  CHECK(best_ring_messages(m, mesh, b) == 2);
  CHECK(best_ring_messages(m, mesh, b, RingTransport::network, 1) == 1);  // only 1 considered
  // A quarter of the link a flow (0.25 GB/s): k = 4 reaches the link: 4 us + 1048.576 us; k = 8 adds 4 us more.
  m.intra = LinkCost::of(1, 1, 0, 0.25);
  CHECK(best_ring_messages(m, mesh, b) == 4);
  // A large alpha outweighs the bytes saved: at 2 ms a message and the 0.5 GB/s flow, k = 2 saves
  // 1048.576 us of bytes and costs 2000 us more: 1.
  m.intra = LinkCost::of(2000, 1, 0, 0.5);
  CHECK(best_ring_messages(m, mesh, b) == 1);
  // The cap is the step's link class's: a ring across nodes sees the inter-node one.
  CostModel x = links();
  x.intra = LinkCost::of(1, 1, 0, 0.5);
  CHECK(best_ring_messages(x, Mesh(4, 2, 2, 2), b) == 1);
  x.inter = LinkCost::of(2, 0.5, 0, 0.25);
  CHECK(best_ring_messages(x, Mesh(4, 2, 2, 2), b) == 2);
  // Shared memory is a copy: no per-flow cap, each piece one more row.
  CHECK(best_ring_messages(m, mesh, b, RingTransport::shared_memory) == 1);
  CHECK(best_ring_messages(m, Mesh(4, 4, 1, 4), b) == 1);  // R = 1: nothing moves
  CHECK(ut::code_of([&] { (void)best_ring_messages(m, mesh, b, RingTransport::network, 0); }) == Errc::invalid_shape);
  // predict_flow_seconds() without a cap is predict_seconds().
  const RingTraffic t = ring_step_traffic(mesh, b, RingTransport::network, 2);
  CHECK(predict_flow_seconds(t.step, {t.piece_bytes, 0}, links()) == predict_seconds(t.step, links()));
}

TEST_CASE("RingTransport::zero_copy: no bytes, a synchronisation at steps 0 and R - 1, none hidden; one node only") {
  CostModel m = links();
  m.intra = LinkCost::of(1, 1, 3);  // λ = 3 us a synchronisation
  m.round_seconds = 0.5e-6;
  const RingTraffic t = ring_step_traffic(Mesh(4, 1, 4, 4), 1 << 20, RingTransport::zero_copy, 4);
  CHECK(t.step.messages[0] + t.step.messages[1] == 0);
  CHECK(t.step.bytes[0] + t.step.bytes[1] + t.step.copy_bytes == 0);
  CHECK(t.step.latency_steps[0] == 1);
  CHECK(t.step.rounds == 1);
  CHECK(t.step.working_set_bytes == 0);
  CHECK(ring_step_seconds(t, m) == doctest::Approx(3.5e-6).epsilon(1e-12));  // λ_intra + the round, whatever the block
  CHECK(best_ring_messages(m, Mesh(4, 1, 4, 4), 1 << 20, RingTransport::zero_copy) == 1);
  // A ring across nodes cannot map its peers' blocks.
  CHECK(ut::code_of([] { (void)ring_step_traffic(Mesh(4, 2, 2, 2), 32, RingTransport::zero_copy); }) == Errc::invalid_shape);
  // R = 4 on one node, non-causal S = 8 (contiguous, 2 tokens a rank), H = Hkv = 4, D = 2 at 1e8
  // FLOP/s: each step 2 x 4 heads x 4 pairs x 4 = 128 FLOPs = 1.28 us; the copy ring moves a block
  // of 2 x 4 x 4 x 2 = 64 bytes at steps 0 .. 2; zero copy: 3.5 us at
  // steps 0 and 3, exposed whole, no bytes counted.
  const AttentionShape shape{4, 4, 2, 0};
  const RingCost z = ring_cost(Mesh(4, 1, 4, 4), shape, 8, false, m, 1e8, ElementType::bfloat16, 1, RingTransport::zero_copy);
  REQUIRE(z.comm_s.size() == 4);
  for (int s = 0; s < 4; ++s) {
    const double want = s == 0 || s == 3 ? 3.5e-6 : 0.0;
    CHECK(z.comm_s[static_cast<std::size_t>(s)] == doctest::Approx(want).epsilon(1e-12));
    CHECK(z.exposed_s[static_cast<std::size_t>(s)] == doctest::Approx(want).epsilon(1e-12));
    CHECK(z.compute_s[static_cast<std::size_t>(s)] == doctest::Approx(1.28e-6).epsilon(1e-12));
  }
  CHECK(z.exposed_seconds == doctest::Approx(7e-6).epsilon(1e-12));
  CHECK(z.bytes[0] + z.bytes[1] == 0);
  const RingCost n = ring_cost(Mesh(4, 1, 4, 4), shape, 8, false, m, 1e8, ElementType::bfloat16, 1, RingTransport::network);
  CHECK(n.comm_s[0] == doctest::Approx(ring_step_seconds(ring_step_traffic(Mesh(4, 1, 4, 4), 64), m)).epsilon(1e-12));
  CHECK(n.comm_s[3] == 0);
  CHECK(n.bytes[0] == 3 * 64);
  // R = 1: nothing to synchronise; the all-gather has no zero-copy price.
  CHECK(ring_cost(Mesh(4, 4, 1, 4), shape, 8, false, m, 1e8, ElementType::bfloat16, 1, RingTransport::zero_copy).comm_seconds == 0);
  CHECK(ut::code_of([&] {
          (void)allgather_kv_cost(Mesh(4, 1, 4, 4), shape, 8, false, m, 1e8, ElementType::bfloat16, 1, RingTransport::zero_copy);
        }) == Errc::invalid_shape);
}

TEST_CASE("ring_cost and advise_hybrid price the wire split") {
  // The ring_cost case above (S=8, U=2, R=2 across nodes, block 32 bytes) in 2 messages: 2 x 2 us + 32 B / 0.5 GB/s = 4.064 us.
  const Mesh mesh(4, 2, 2, 2);
  const AttentionShape shape{4, 2, 2, 0};
  const RingCost c = ring_cost(mesh, shape, 8, true, links(), 1e8, ElementType::bfloat16, 1, RingTransport::network, HeadPolicy::even, 2);
  CHECK(c.messages == 2);
  CHECK(c.comm_s[0] == doctest::Approx(4.064e-6).epsilon(1e-12));
  CHECK(ring_cost(mesh, shape, 8, true, links(), 1e8).messages == 1);
  CHECK(ring_cost(mesh, shape, 8, true, links(), 1e8, ElementType::bfloat16, 1, RingTransport::network, HeadPolicy::even, 0).messages == 1);
  CHECK(ut::code_of([&] {
          (void)ring_cost(mesh, shape, 8, true, links(), 1e8, ElementType::bfloat16, 1, RingTransport::network, HeadPolicy::even, -1);
        }) == Errc::invalid_shape);
  // Llama-3.1-70B-like heads (H=64, Hkv=8, D=128), S=65536, 8 ranks on nodes of 4, a 0.5 GB/s flow
  // on a 1 GB/s inter-node link: every rotation row goes in best_ring_messages() of its largest block
  // (MiB-sized, so 2), says so, and its ring is priced with it; no ring: 0; the all-gather: 1.
  CostModel m = links();
  m.inter = LinkCost::of(2, 1, 0, 0.5);
  const AttentionShape big{64, 8, 128, 0};
  int split = 0;
  for (const HybridChoice& h : advise_hybrid(big, 65536, 8, 4, m, 1e15)) {
    if (h.kv == RingKv::none) CHECK(h.messages == 0);
    if (h.kv == RingKv::allgather) CHECK(h.messages == 1);
    if (h.kv != RingKv::rotation) continue;
    const Mesh rm(8, h.ulysses_degree, h.ring_degree, 4);
    CHECK(h.messages == best_ring_messages(m, rm, h.ring.traffic.block_bytes));
    CHECK(h.ring.messages == h.messages);
    if (h.messages > 1) CHECK(h.reason.find(std::to_string(h.messages) + " messages a block") != std::string::npos);
    split += h.messages == 2 && rm.ring_spans_nodes();
  }
  CHECK(split > 0);
}

TEST_CASE("fit_flow_cost: the per-flow cap from steps of 1 and 2 messages") {
  // Truth: 1 us + 1 GB/s inside a node, one message at most 0.5 GB/s. Base: the link without the cap.
  const Mesh mesh(4, 2, 2, 4);
  CostModel truth = links();
  truth.intra = LinkCost::of(1, 1, 0, 0.5);
  std::vector<FlowSample> s;
  for (double b : {262144.0, 1048576.0, 4194304.0})
    for (int k : {1, 2, 4}) {
      const RingTraffic t = ring_step_traffic(mesh, b, RingTransport::network, k);
      s.push_back(ring_flow_sample(t, ring_step_seconds(t, truth)));
    }
  const CostModel f = fit_flow_cost(s, links());
  CHECK(f.intra.flow_seconds_per_byte == doctest::Approx(2e-9).epsilon(1e-9));
  CHECK(f.inter.flow_seconds_per_byte == 0);  // no sample crosses nodes: base's
  CHECK(f.intra.seconds_per_byte == links().intra.seconds_per_byte);  // the others: base's
  CHECK(best_ring_messages(f, mesh, 1048576) == 2);
  // Steps as fast as the link predicts: no cap.
  std::vector<FlowSample> flat;
  for (int k : {1, 2}) {
    const RingTraffic t = ring_step_traffic(mesh, 1048576, RingTransport::network, k);
    flat.push_back(ring_flow_sample(t, ring_step_seconds(t, links())));
  }
  CHECK(fit_flow_cost(flat, links()).intra.flow_seconds_per_byte == 0);
  // One message measured at 0.5 GB/s, two at the link: b = 1 MiB, t1 = 1 us + 2097.152 us, t2 = 2 us + 1048.576 us: beta_f = 2 ns/B.
  std::vector<FlowSample> two{ring_flow_sample(ring_step_traffic(mesh, 1048576), 2098.152e-6),
                              ring_flow_sample(ring_step_traffic(mesh, 1048576, RingTransport::network, 2), 1050.576e-6)};
  CHECK(fit_flow_cost(two, links()).intra.flow_seconds_per_byte == doctest::Approx(2e-9).epsilon(1e-9));
  CHECK(ut::code_of([] { (void)fit_flow_cost({}, CostModel{}); }) == Errc::invalid_shape);
  CHECK(ut::code_of([&] { (void)fit_flow_cost({{s[0].traffic, {-1, 0}, 1e-3}}, links()); }) == Errc::invalid_shape);
  CHECK(ut::code_of([&] { (void)fit_flow_cost({{s[0].traffic, {1, 0}, 0}}, links()); }) == Errc::invalid_shape);
}

TEST_CASE("ring_cost with packed documents: each step's document blocks, computed by hand; the imbalance; one document = no documents") {
  // S = 8, U = 1, R = 2 on one node of 2, H = 2, Hkv = 1, D = Dv = 2, bf16; FLOP = 2 x 2 heads x 4 x pairs = 16 x pairs.
  const Mesh mesh(2, 1, 2, 2);
  const AttentionShape shape{2, 1, 2, 0};
  // Two documents of 4 (cu [0, 4, 8]): each cut into 2R = 4 one-token chunks, rank 0 holds chunks 0
  // and 3 of each ({0, 3, 4, 7}), rank 1 chunks 1 and 2 ({1, 2, 5, 6}). Step 0 (own kv), document ∧
  // causal: rank 0 0→0, 3→0,3, 4→4, 7→4,7 = 6 pairs; rank 1 likewise 6. Step 1: rank 0's queries 3
  // and 7 see rank 1's 1, 2 and 5, 6 = 4 pairs; rank 1's 1, 2 see 0 and 5, 6 see 4 = 4. All 20 = 2 x 4 x 5 / 2.
  const Documents two({0, 4, 8});
  const RingCost c = ring_cost(mesh, shape, 8, true, links(), 1e8, ElementType::bfloat16, 1, RingTransport::network, HeadPolicy::even, 1, &two);
  REQUIRE(c.compute_s.size() == 2);
  CHECK(c.compute_s[0] == doctest::Approx(96e-8).epsilon(1e-12));
  CHECK(c.compute_s[1] == doctest::Approx(64e-8).epsilon(1e-12));
  CHECK(c.imbalance_seconds == doctest::Approx(0).epsilon(1e-12));
  CHECK(c.attended_fraction == doctest::Approx(20.0 / 36).epsilon(1e-12));  // of the 8 x 9 / 2 causal pairs
  // The ring's bytes do not change: every step's block still moves.
  const RingCost plain = ring_cost(mesh, shape, 8, true, links(), 1e8, ElementType::bfloat16);
  CHECK(c.comm_seconds == plain.comm_seconds);
  CHECK(c.bytes[0] == plain.bytes[0]);

  // cu [0, 2, 8]: document 0 (2 tokens) gives rank 0 token 0 and rank 1 token 1; document 1 (6
  // tokens, chunks 2, 2, 1, 1) gives rank 0 {2, 3, 7} and rank 1 {4, 5, 6}. Step 0: rank 0 1 + (1 +
  // 2 + 3) = 7, rank 1 1 + (1 + 2 + 3) = 7; step 1: rank 0's 7 sees 4, 5, 6 = 3, rank 1's 1 sees 0 and
  // 4, 5, 6 see 2, 3 = 7. Totals 10 and 14 (mean 12): the lockstep ring waits 7 + 7 = 14, 2 pairs
  // over the mean; the all-gather's slowest rank attends 14, 2 over the mean too.
  const Documents uneven({0, 2, 8});
  const RingCost u = ring_cost(mesh, shape, 8, true, links(), 1e8, ElementType::bfloat16, 1, RingTransport::network, HeadPolicy::even, 1, &uneven);
  CHECK(u.compute_s[0] == doctest::Approx(7 * 16e-8).epsilon(1e-12));
  CHECK(u.compute_s[1] == doctest::Approx(7 * 16e-8).epsilon(1e-12));
  CHECK(u.compute_seconds == doctest::Approx(14 * 16e-8).epsilon(1e-12));
  CHECK(u.imbalance_seconds == doctest::Approx(2 * 16e-8).epsilon(1e-12));
  const RingCost g = allgather_kv_cost(mesh, shape, 8, true, links(), 1e8, ElementType::bfloat16, 1, RingTransport::network, HeadPolicy::even, &uneven);
  CHECK(g.compute_seconds == doctest::Approx(14 * 16e-8).epsilon(1e-12));
  CHECK(g.imbalance_seconds == doctest::Approx(2 * 16e-8).epsilon(1e-12));
  CHECK(g.exposed_seconds == g.comm_seconds);

  // One document over the whole sequence is the plain causal zigzag, step for step.
  const Mesh big(8, 2, 4, 4);
  const AttentionShape llama{8, 2, 4, 0};
  const Documents one({0, 96});
  const RingCost a = ring_cost(big, llama, 96, true, links(), 1e9, ElementType::bfloat16, 1, RingTransport::network, HeadPolicy::even, 1, &one);
  const RingCost b = ring_cost(big, llama, 96, true, links(), 1e9, ElementType::bfloat16, 1, RingTransport::network, HeadPolicy::even, 1);
  REQUIRE(a.compute_s.size() == b.compute_s.size());
  for (std::size_t s = 0; s < a.compute_s.size(); ++s) {
    CHECK(a.compute_s[s] == b.compute_s[s]);
    CHECK(a.exposed_s[s] == b.exposed_s[s]);
    CHECK(a.merge_s[s] == b.merge_s[s]);
  }
  CHECK(a.attended_fraction == doctest::Approx(1).epsilon(1e-12));

  // Documents over another S: refused before anything is priced.
  CHECK(ut::code_of([&] {
          (void)ring_cost(mesh, shape, 16, true, links(), 1e8, ElementType::bfloat16, 1, RingTransport::network, HeadPolicy::even, 1, &two);
        }) == Errc::seq_lengths_mismatch);
}

TEST_CASE("ring cost: a transfer step moves the largest block still carried (ring_last_use()); the all-gather moves every block") {
  // R = 3, documents of 3 tokens: ring rank k holds token k of each, causal: block j is last
  // read at step 2 - j, so step 0 moves blocks 0 and 1, step 1 block 0 alone.
  const RingPartition docs(Documents({0, 3, 6, 9}), 1, 3);
  const std::vector<double> block{10, 20, 30};
  CHECK(detail::ring_carried_bytes(docs, true, block, false) == std::vector<double>{20, 10});
  CHECK(detail::ring_carried_bytes(docs, false, block, false) == std::vector<double>{30, 30});  // full: every block to the end
  CHECK(detail::ring_carried_bytes(docs, true, block, true) == std::vector<double>{30, 30});
  const RingPartition zig(24, 1, 3, RingLayout::zigzag);
  CHECK(detail::ring_carried_bytes(zig, true, block, false) == std::vector<double>{30, 30});
  CHECK(detail::ring_carried_bytes(RingPartition(24, 1, 1, RingLayout::zigzag), true, {10}, false).empty());
}
