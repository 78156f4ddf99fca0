// SPDX-License-Identifier: Apache-2.0
// cost.hpp: the traffic the model counts (exact bytes and messages of small plans, flat and
// two-level), the prediction, the fit (recovers known parameters), and the degree advice.
#include <doctest/doctest.h>

#include <ulysses/tune/advise.hpp>
#include <ulysses/tune/cost.hpp>
#include <ulysses/tune/fit.hpp>

#include "expect_error.hpp"

#include <cmath>

using namespace ulysses;

namespace {
Plan mha(int P, int r, std::int64_t S, std::int64_t H = 4, PlanOptions o = {}) {
  auto h = HeadPartition::even(H, P);
  return Plan({P, r}, 1, SeqPartition::even(S, P),
              {TensorSpec::of<float>(h, 2), TensorSpec::of<float>(h, 2), TensorSpec::of<float>(h, 2)}, Format::bshd, o);
}
}  // namespace

TEST_CASE("exchange_traffic: flat all-to-all-v, messages and direct of P=4 (exact bytes and counts)") {
  // S=8, P=4, H=4, D=2, fp32, q/k/v: a chunk is 2 tokens x 1 head x 2 x 4 bytes x 3 tensors = 48 bytes.
  const Plan p = mha(4, 0, 8);
  const ExchangeTraffic a = exchange_traffic(p, Direction::seq_to_head, Path::alltoallv);
  CHECK(a.rounds == 1);
  CHECK(a.messages[0] == 3);
  CHECK(a.bytes[0] == 3 * 48);
  CHECK(a.messages[1] == 0);
  CHECK(a.bytes[1] == 0);
  CHECK(a.copy_bytes == 3 * 48 + 3 * 48 + 48);  // pack, unpack, own chunk
  // Rows: a packed piece is 2 tokens of one head (2 rows of 8 bytes: the input's tokens are 8
  // elements apart) for 3 peers x 3 tensors; an unpacked piece is one row of 16 bytes (the
  // output's tokens of one head are adjacent); the own chunk 2 rows per tensor.
  CHECK(a.copy_rows == 3 * 3 * 2 + 3 * 3 * 1 + 3 * 2);
  CHECK(a.working_set_bytes == static_cast<double>(4 * 48 + 4 * 48 + p.workspace_bytes()));
  const ExchangeTraffic m = exchange_traffic(p, Direction::seq_to_head, Path::messages);
  CHECK(m.messages[0] == 3 * 3);  // one per (peer, tensor)
  CHECK(m.bytes[0] == 3 * 48);
  CHECK(m.copy_bytes < a.copy_bytes);  // bshd, B=1: received in place
  const ExchangeTraffic d = exchange_traffic(p, Direction::seq_to_head, Path::direct);
  CHECK(d.bytes[0] == 0);
  CHECK(d.copy_bytes == 4 * 48);  // every output byte once
  CHECK(ut::code_of([&] { exchange_traffic(p, Direction::seq_to_head, Path::automatic); }) == Errc::path_unsupported);
}

TEST_CASE("exchange_traffic: the two-level rounds of 8 = 2 x 4 and the flat exchange across the same nodes") {
  PlanOptions o;
  o.nodes = NodeLayout::uniform(8, 4);
  o.path = Path::two_level;
  // S=16, P=8, H=8: a chunk is 2 tokens x 1 head x 2 x 4 x 3 = 48 bytes.
  auto h = HeadPartition::even(8, 8);
  const Plan p({8, 0}, 1, SeqPartition::even(16, 8), {TensorSpec::of<float>(h, 2), TensorSpec::of<float>(h, 2), TensorSpec::of<float>(h, 2)},
               Format::bshd, o);
  const ExchangeTraffic t = exchange_traffic(p, Direction::seq_to_head, Path::two_level);
  CHECK(t.rounds == 3);
  CHECK(t.messages[1] == 1);       // one message per node pair
  CHECK(t.bytes[1] == 16 * 48);    // all of node 0's chunks for node 1, through one forwarder
  // Round 0, busiest: the forwarder receiving 3 node-mates' 4 chunks each and its 3 same-node chunks
  // (48 x 15 bytes in 6 messages); round 2: the receiver delivering 4 chunks to each of 3 node-mates.
  CHECK(t.bytes[0] == 15 * 48 + 12 * 48);
  CHECK(t.messages[0] == 6 + 12);
  PlanOptions f = o;
  f.path = Path::alltoallv;
  const Plan pf({8, 0}, 1, SeqPartition::even(16, 8), {TensorSpec::of<float>(h, 2), TensorSpec::of<float>(h, 2), TensorSpec::of<float>(h, 2)},
                Format::bshd, f);
  const ExchangeTraffic ft = exchange_traffic(pf, Direction::seq_to_head, Path::alltoallv);
  CHECK(ft.messages[0] == 3);
  CHECK(ft.messages[1] == 4);
  CHECK(ft.bytes[1] == 4 * 48);
  // The forwarder gathers 16 chunks for the other node and receives 16 from it: its workspace, the
  // busiest rank's, is larger than rank 0's flat one (7 chunks out, 7 in; 256-byte aligned halves).
  CHECK(ft.workspace_bytes == 7 * 48 / 256 * 256 + 256 + 7 * 48);
  CHECK(t.workspace_bytes > ft.workspace_bytes);
}

TEST_CASE("exchange_traffic: latency steps and overlapped rounds of each path's schedule") {
  // One node, P=4: every path's round is one step of intra-node latency, nothing overlapped; the
  // all-to-all-v also has the ranks' agreement on its path first (recursive doubling: 2 steps).
  const Plan p = mha(4, 0, 8);
  for (Path path : {Path::alltoallv, Path::messages, Path::direct}) {
    const ExchangeTraffic t = exchange_traffic(p, Direction::seq_to_head, path);
    CHECK(t.latency_steps[0] == (path == Path::alltoallv ? 1 + 2 : 1));
    CHECK(t.latency_steps[1] == 0);
    CHECK(t.overlapped.empty());
  }
  // P=3 on one node: Open MPI runs the all-to-all-v pairwise, 2 steps (+ 2 of the agreement); the messages at once.
  const ExchangeTraffic a3 = exchange_traffic(mha(3, 0, 6, 3), Direction::seq_to_head, Path::alltoallv);
  CHECK(a3.latency_steps[0] == 2 + 2);
  CHECK(a3.rounds == 1);
  CHECK(exchange_traffic(mha(3, 0, 6, 3), Direction::seq_to_head, Path::messages).latency_steps[0] == 1);
  // P=8 on nodes of 4 (linear all-to-all-v): one step of inter-node latency (and the agreement's
  // partners at distance 1 and 2 inside a node, 4 across); the busiest rank's intra and inter
  // bytes (3 and 4 chunks of 48) in flight at once.
  PlanOptions o;
  o.nodes = NodeLayout::uniform(8, 4);
  const ExchangeTraffic a8 = exchange_traffic(mha(8, 0, 16, 8, o), Direction::seq_to_head, Path::alltoallv);
  CHECK(a8.latency_steps[0] == 2);
  CHECK(a8.latency_steps[1] == 1 + 1);
  REQUIRE(a8.overlapped.size() == 1);
  CHECK(a8.overlapped[0][0] == 3 * 48);
  CHECK(a8.overlapped[0][1] == 4 * 48);
  // Two-level: three rounds, intra (1 step), inter (1), intra (1); no round mixes the classes.
  o.path = Path::two_level;
  const ExchangeTraffic t8 = exchange_traffic(mha(8, 0, 16, 8, o), Direction::seq_to_head, Path::two_level);
  CHECK(t8.latency_steps[0] == 2);
  CHECK(t8.latency_steps[1] == 1);
  CHECK(t8.overlapped.empty());
  // P=64 on nodes of 8: pairwise, 63 steps, each with some pair across nodes (the agreement: 3
  // steps inside a node, 3 across); no overlap.
  PlanOptions o64;
  o64.nodes = NodeLayout::uniform(64, 8);
  const ExchangeTraffic a64 = exchange_traffic(mha(64, 0, 128, 64, o64), Direction::seq_to_head, Path::alltoallv);
  CHECK(a64.latency_steps[0] == 3);
  CHECK(a64.latency_steps[1] == 63 + 3);
  CHECK(a64.overlapped.empty());
  CHECK(a64.messages[1] == 56);
  CHECK(a64.bytes[1] == 56 * 48);
  CHECK(a64.bytes[0] == 7 * 48);
}

TEST_CASE("predict_seconds: λ per step of each class; the faster class of an overlapped round hidden") {
  ExchangeTraffic t;
  t.messages = {3, 4};
  t.bytes = {3000, 4000};
  t.latency_steps = {0, 1};
  t.overlapped = {{3000, 4000}};
  CostModel m{LinkCost::of(0, 100, 1), LinkCost::of(0, 10, 5)};
  // intra 3000 B at 100 GB/s = 30 ns hides under inter 4000 B at 10 GB/s = 400 ns; one inter latency.
  CHECK(predict_seconds(t, m) == doctest::Approx(5e-6 + 4000 / 10e9));
  // A slow intra link: the inter bytes hide instead.
  m.intra = LinkCost::of(0, 1, 1);
  CHECK(predict_seconds(t, m) == doctest::Approx(5e-6 + 3000 / 1e9));
  // Not overlapped (sequential steps): both add up, and every step's latency.
  t.overlapped.clear();
  t.latency_steps = {2, 5};
  CHECK(predict_seconds(t, m) == doctest::Approx(2e-6 + 5 * 5e-6 + 3000 / 1e9 + 4000 / 10e9));
  CHECK(LinkCost::of(1, 50, 5).latency_s == doctest::Approx(5e-6));
  CHECK(m.str().find("us/step") != std::string::npos);
}

TEST_CASE("predict_seconds: ranks sharing an inter-node NIC divide its bandwidth (ranks_per_nic)") {
  // P=8 on nodes of 4, flat message path, S=16, H=8: a chunk is 48 bytes; each rank sends 4 chunks
  // across nodes (192 bytes) and 3 inside its node (144 bytes), all at once; node 0's ranks send
  // 4 x 192 = 768 bytes across.
  PlanOptions o;
  o.nodes = NodeLayout::uniform(8, 4);
  const ExchangeTraffic t = exchange_traffic(mha(8, 0, 16, 8, o), Direction::seq_to_head, Path::messages);
  CHECK(t.node_ranks == 4);
  REQUIRE(t.inter_rounds.size() == 1);
  CHECK(t.inter_rounds[0][0] == 192);
  CHECK(t.inter_rounds[0][1] == 768);
  REQUIRE(t.overlapped.size() == 1);
  CHECK(t.overlapped[0][2] == 768);
  // NVLink-class 10 GB/s inside (144 B: 14.4 ns, hidden under the NIC), 1 GB/s NIC, no α, no λ:
  // a NIC per rank: 192 B = 192 ns; 2 ranks a NIC: max(192, 768 x 2 / 4) = 384 B; one NIC a node
  // (4 or more ranks a NIC): all 768 B through it.
  CostModel m{LinkCost::of(0, 10), LinkCost::of(0, 1)};
  CHECK(predict_seconds(t, m) == 192 * 1e-9);
  m.ranks_per_nic = 2;
  CHECK(predict_seconds(t, m) == 384 * 1e-9);
  m.ranks_per_nic = 4;
  CHECK(predict_seconds(t, m) == 768 * 1e-9);
  m.ranks_per_nic = 8;
  CHECK(predict_seconds(t, m) == 768 * 1e-9);
  CHECK(m.str().find("8 ranks a NIC") != std::string::npos);
  // The two-level exchange already sends a node's bytes through one forwarder: its NIC carries
  // the node's 16 chunks (768 B) whatever the sharing.
  o.path = Path::two_level;
  const ExchangeTraffic t2 = exchange_traffic(mha(8, 0, 16, 8, o), Direction::seq_to_head, Path::two_level);
  CostModel only_nic{LinkCost::of(0, 0), LinkCost::of(0, 1)};
  CHECK(predict_seconds(t2, only_nic) == 768 * 1e-9);
  only_nic.ranks_per_nic = 4;
  CHECK(predict_seconds(t2, only_nic) == 768 * 1e-9);
  // The fit keeps the sharing it is given and recovers the NIC's bandwidth from shared flows.
  std::vector<CostSample> samples;
  for (std::int64_t S : {16, 64, 256}) {
    const ExchangeTraffic ts = exchange_traffic(mha(8, 0, S, 8, o), Direction::seq_to_head, Path::messages);
    samples.push_back({ts, predict_seconds(ts, m)});
  }
  CostModel base;
  base.ranks_per_nic = 8;
  const CostModel fit = fit_cost_model(samples, base);
  CHECK(fit.ranks_per_nic == 8);
  CHECK(fit.inter.seconds_per_byte == doctest::Approx(1e-9).epsilon(1e-6));
}

TEST_CASE("predict_seconds: α per message, β per byte per link class, γ per copied byte") {
  ExchangeTraffic t;
  t.messages = {3, 1};
  t.bytes = {1000, 500};
  t.copy_bytes = 2000;
  t.copy_rows = 100;
  CostModel m{LinkCost::of(2, 100), LinkCost::of(10, 10), 1e-12};
  m.copy_seconds_per_row = 1e-9;
  CHECK(predict_seconds(t, m) == doctest::Approx(3 * 2e-6 + 1000 / 100e9 + 10e-6 + 500 / 10e9 + 2000e-12 + 100e-9));
  // The cache regime: with the working set twice the cache, half the intra and copy bytes take the cached rates.
  t.working_set_bytes = 2e6;
  m.cache_bytes = 1e6;
  m.intra_cached_seconds_per_byte = 0;
  m.copy_cached_seconds_per_byte = 0;
  CHECK(predict_seconds(t, m) == doctest::Approx(3 * 2e-6 + 500 / 100e9 + 10e-6 + 500 / 10e9 + 1000e-12 + 100e-9));
  CHECK(LinkCost::of(1, 50).GBps() == doctest::Approx(50));
  CHECK(CostModel::nvlink_infiniband().str().find("GB/s") != std::string::npos);
}

TEST_CASE("fit_cost_model: recovers the parameters that made the times; unseen link classes keep the base") {
  const CostModel truth{LinkCost::of(4, 20), LinkCost::of(0, 0), 1.0 / 8e9};
  std::vector<CostSample> s;
  for (int P : {2, 4, 8})
    for (std::int64_t S : {64, 1024, 16384})
      for (Path path : {Path::alltoallv, Path::messages, Path::direct}) {
        const ExchangeTraffic t = exchange_traffic(mha(P, 0, S, 8), Direction::seq_to_head, path);
        s.push_back({t, predict_seconds(t, truth)});
      }
  const CostModel base = CostModel::nvlink_infiniband();
  const CostModel fit = fit_cost_model(s, base);
  CHECK(fit.intra.alpha_s == doctest::Approx(truth.intra.alpha_s).epsilon(1e-6));
  CHECK(fit.intra.seconds_per_byte == doctest::Approx(truth.intra.seconds_per_byte).epsilon(1e-6));
  CHECK(fit.copy_seconds_per_byte == doctest::Approx(truth.copy_seconds_per_byte).epsilon(1e-6));
  CHECK(fit.inter.alpha_s == base.inter.alpha_s);  // no inter-node traffic in the samples
  CHECK(fit.inter.seconds_per_byte == base.inter.seconds_per_byte);
  CHECK(ut::code_of([] { fit_cost_model({}); }) == Errc::invalid_shape);
  CHECK(ut::code_of([&] { fit_cost_model({{s[0].traffic, 0.0}}); }) == Errc::invalid_shape);
  CHECK(ut::code_of([&] { fit_cost_model({{s[0].traffic, INFINITY}}); }) == Errc::invalid_shape);
  ExchangeTraffic bad = s[0].traffic;
  bad.bytes[0] = NAN;
  CHECK(ut::code_of([&] { fit_cost_model({{bad, 1e-3}}); }) == Errc::invalid_shape);
  bad.bytes[0] = -1;
  CHECK(ut::code_of([&] { fit_cost_model({{bad, 1e-3}}); }) == Errc::invalid_shape);
}

TEST_CASE("advise_degree: feasible meshes only, fastest within the budget first, two-level where it pays") {
  const AttentionShape llama70b{64, 8, 128, 128};
  const CostModel m = CostModel::nvlink_infiniband();
  const auto all = advise_degree(llama70b, 131072, 64, 8, m);
  REQUIRE(!all.empty());
  for (const DegreeChoice& d : all) {
    CHECK(64 % d.ulysses_degree == 0);
    CHECK(d.ulysses_degree * d.outer_degree == 64);
    CHECK(d.ulysses_degree <= 64);
    CHECK(d.seconds == doctest::Approx(std::min({d.flat_seconds, d.two_level_seconds, d.rail_seconds})));
    CHECK((d.path == Path::two_level) == (d.lanes == 0 ? d.seconds == d.rail_seconds && d.seconds < d.flat_seconds : d.path == Path::two_level));
    CHECK((d.inter_bytes > 0) == (d.ulysses_degree > 8));
  }
  for (std::size_t i = 1; i < all.size(); ++i) CHECK(all[i - 1].seconds <= all[i].seconds);
  // A budget of one layer's attention tensors: the smallest degrees do not fit and go last.
  const auto budget = advise_degree(llama70b, 131072, 64, 8, m, ElementType::bfloat16, 1, HeadPolicy::even, 2e9);
  CHECK(budget.front().fits);
  CHECK(!budget.back().fits);
  CHECK(budget.front().activation_bytes <= 2e9);
  CHECK(ut::code_of([&] { advise_degree(llama70b, 1024, 6, 4, m); }) == Errc::invalid_mesh);  // 6 ranks are not whole nodes of 4
  const auto huge = advise_degree(llama70b, 1024, 2147483647, 1, m);  // no overflow: only P = 1 has heads enough
  REQUIRE(huge.size() == 1);
  CHECK(huge[0].ulysses_degree == 1);
  // Memory: the tensors and the workspaces of the path taken, on its busiest rank.
  for (const DegreeChoice& d : all) CHECK(d.activation_bytes > 0);
}
