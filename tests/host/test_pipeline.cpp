// SPDX-License-Identifier: Apache-2.0
// pipeline.hpp and PlanOptions::stages: K-stage plans (split along heads) give bit-identical
// results, sequentially and overlapped by HostPipeline, on the shared fault cases.
#include <doctest/doctest.h>

#include "cases.hpp"

using namespace ulysses;

namespace {
std::string run_local(ut::Case c, int stages, bool pipelined) {
  c.stages = stages;
  c.pipelined = pipelined;
  LocalGroup g(c.P);
  std::vector<std::string> err(static_cast<std::size_t>(c.P));
  g.spawn([&](LocalGroup::Comm& comm) { err[comm.rank()] = ut::run_case<float>(comm, c); });
  std::string all;
  for (auto& e : err) all += e;
  return all;
}

std::vector<ut::Case> sample_cases() {
  std::vector<ut::Case> v = ut::c2_cases(4);
  for (auto& c : ut::c6_cases()) v.push_back(c);
  for (auto& c : ut::c4_cases(8)) v.push_back(c);
  v.push_back(ut::c5_case());
  for (auto& c : ut::zigzag_cases(3)) v.push_back(c);
  v.push_back(ut::model_case(ulysses_models::kModels[11], 4, true));  // DeepSeek-V3 MLA: v head dim 128
  return v;
}
}  // namespace

TEST_CASE("K-stage plans round-trip exactly, run stage by stage and overlapped") {
  for (const auto& c : sample_cases())
    for (int K : {1, 2, 3, 4})
      for (bool pipelined : {false, true}) {
        CAPTURE(c.name);
        CAPTURE(K);
        CAPTURE(pipelined);
        CHECK(run_local(c, K, pipelined) == "");
      }
}

TEST_CASE("stages split the same bytes: totals and workspace equal the one-stage plan's") {
  auto q = HeadPartition::even(32, 4);
  auto kv = HeadPartition::gqa(q, 8);
  const std::vector<TensorSpec> t = {TensorSpec::of<float>(q, 128), TensorSpec::of<float>(kv, 128), TensorSpec::of<float>(kv, 128)};
  Plan one({4, 1}, 1, SeqPartition::even(64, 4), t);
  Plan four({4, 1}, 1, SeqPartition::even(64, 4), t, Format::bshd, PlanOptions{4});
  CHECK(four.num_stages() == 4);
  CHECK(four.workspace_bytes() == one.workspace_bytes());
  for (Direction d : {Direction::seq_to_head, Direction::head_to_seq}) {
    CHECK(four.exchanged_bytes(d) == one.exchanged_bytes(d));
    // Stage k to peer 0: 16 tokens * (8/4 = 2 q heads + 2/4 → [1,1,0,0] kv heads...) — checked by sum:
    std::size_t sum = 0;
    for (int k = 0; k < 4; ++k) sum += four.stage_lists(d, k).send_bytes[0];
    CHECK(sum == one.stage_lists(d).send_bytes[0]);
    // Stages follow each other in the regions.
    CHECK(four.stage_lists(d, 1).send_offsets[0] == four.stage_lists(d, 0).send_total);
  }
  // q: 8 heads a rank split in 4 stages of 2 heads: 16 tokens * 2 * 128 * 4 B = 16 KiB per peer.
  CHECK(four.stage_lists(Direction::seq_to_head, 0).send_bytes[0] == 16 * 2 * 128 * 4 + 2 * 16 * 1 * 128 * 4);
  CHECK(four.stage_lists(Direction::seq_to_head, 3).send_bytes[0] == 16 * 2 * 128 * 4);  // kv [1,1,0,0]
  CHECK_THROWS_AS(Plan({4, 1}, 1, SeqPartition::even(64, 4), t, Format::bshd, PlanOptions{0}), Error);
}

TEST_CASE("a HostPipeline is reusable and reports errors from the exchange") {
  HostPipeline pipe;
  LocalGroup g(1);
  auto comm = g.comm(0);
  Plan plan({1, 0}, 1, SeqPartition::even(4, 1), {TensorSpec::of<float>(HeadPartition::even(4, 1), 2)}, Format::bshd,
            PlanOptions{2});
  std::vector<float> in(32), out(32), back(32);
  for (int i = 0; i < 32; ++i) in[i] = static_cast<float>(i);
  std::vector<std::byte> ws(plan.workspace_bytes());
  HostExecutor a, b;
  for (int rep = 0; rep < 3; ++rep) {
    pipe.redistribute(plan, Direction::seq_to_head, comm, a, b, {in}, {out}, ws);
    pipe.redistribute(plan, Direction::head_to_seq, comm, a, b, {out}, {back}, ws);
    CHECK(back == in);
  }
  LocalGroup g2(2);
  auto wrong = g2.comm(0);
  CHECK_THROWS_AS(pipe.redistribute(plan, Direction::seq_to_head, wrong, a, b, {in}, {out}, ws), Error);
}
