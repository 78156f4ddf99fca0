// SPDX-License-Identifier: Apache-2.0
// Mesh (topology/mesh.hpp) of a Ulysses x Ring world and the configuration check (ring/agreement.hpp) in-process.
#include <doctest/doctest.h>
#include <ulysses/comm/local.hpp>
#include <ulysses/ring/agreement.hpp>
#include <ulysses/topology/mesh.hpp>
#include <ulysses/ulysses.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "expect_error.hpp"

using namespace ulysses;

TEST_CASE("Mesh: U inside a node first; ranks, groups, colours") {
  const Mesh m(16, 4, 2, 8);  // 2 nodes of 8: a U x R block per node, 2 outer
  CHECK(m.outer_degree() == 2);
  CHECK(m.ring_rank(5) == 1);
  CHECK(m.ulysses_rank(5) == 1);
  CHECK(m.outer_rank(9) == 1);
  CHECK(m.ulysses_ranks_of(5) == std::vector<int>{4, 5, 6, 7});
  CHECK(m.ring_ranks_of(5) == std::vector<int>{1, 5});
  CHECK(m.outer_ranks_of(5) == std::vector<int>{5, 13});
  CHECK(!m.ulysses_spans_nodes());
  CHECK(!m.ring_spans_nodes());
  CHECK(m.note() == "");
  for (int w = 0; w < 16; ++w) {
    CHECK(m.world_rank(m.outer_rank(w), m.ring_rank(w), m.ulysses_rank(w)) == w);
    for (int x : m.ulysses_ranks_of(w)) CHECK(m.ulysses_color(x) == m.ulysses_color(w));
    for (int x : m.ring_ranks_of(w)) CHECK(m.ring_color(x) == m.ring_color(w));
  }
  const Mesh r(16, 8, 2, 4);  // Ulysses crosses nodes; so does the ring
  CHECK(r.ulysses_spans_nodes());
  CHECK(r.ring_spans_nodes());
  CHECK(r.note().find("crosses nodes") != std::string::npos);
}

TEST_CASE("a ring inside a node while Ulysses crosses nodes: allowed, but said") {
  const Mesh m(8, 4, 2, 2, RingOrder::ring_inner);
  CHECK(m.ring_ranks_of(0) == std::vector<int>{0, 1});
  CHECK(m.ulysses_ranks_of(0) == std::vector<int>{0, 2, 4, 6});
  CHECK(!m.ring_spans_nodes());
  CHECK(m.ulysses_spans_nodes());
  CHECK(m.note().find("stays inside a node while the Ulysses all-to-all (U=4) crosses nodes") != std::string::npos);
}

TEST_CASE("coded errors naming what does not fit") {
  const auto tile = ut::error_of([] { Mesh(12, 4, 2, 4); });
  CHECK(tile.first == Errc::invalid_mesh);
  CHECK(tile.second.find("R x U = 8 ranks do not tile the world of 12") != std::string::npos);
  CHECK(ut::code_of([] { Mesh(12, 3, 2, 4); }) == Errc::invalid_mesh);  // a block of 6 straddles nodes of 4
  CHECK(ut::code_of([] { Mesh(8, 0, 2, 4); }) == Errc::invalid_mesh);
  CHECK(ut::code_of([] { Mesh(9, 1, 1, 2); }) == Errc::invalid_mesh);
  const Mesh m(16, 8, 2, 8);
  const auto heads = ut::error_of([&] { m.check_heads(4); });
  CHECK(heads.first == Errc::invalid_mesh);
  CHECK(heads.second.find("U=8 exceeds the 4 query heads") != std::string::npos);
  m.check_heads(8);
}

TEST_CASE("check_ring_config in-process: agreement passes; one rank with another R throws on every rank; C14") {
  const int U = 2, R = 2;
  std::vector<std::unique_ptr<LocalGroup>> ug, rg;
  for (int k = 0; k < 2; ++k) {
    ug.push_back(std::make_unique<LocalGroup>(U));
    rg.push_back(std::make_unique<LocalGroup>(R));
  }
  for (int bad_rank : {-1, 3}) {
    std::vector<Errc> got(4, Errc{});
    std::vector<std::thread> th;
    for (int w = 0; w < 4; ++w)
      th.emplace_back([&, w] {
        const int j = w / U, u = w % U;
        LocalGroup::Comm uc = ug[static_cast<std::size_t>(j)]->comm(u), rc = rg[static_cast<std::size_t>(u)]->comm(j);
        got[static_cast<std::size_t>(w)] = ut::code_of([&] { check_ring_config({U, R, RingLayout::zigzag, true, w == bad_rank ? 63 : 64}, uc, rc); });
      });
    for (auto& t : th) t.join();
    for (Errc e : got) CHECK(e == (bad_rank < 0 ? Errc{} : Errc::plan_mismatch));  // rank 0 too, though neither of its groups holds rank 3
  }
  LocalGroup one(1);
  LocalGroup::Comm a = one.comm(0), b = one.comm(0);
  const auto e = ut::error_of([&] { check_ring_config({1, 2, RingLayout::zigzag, true, 64}, a, b); });
  CHECK(e.first == Errc::comm_mismatch);
  CHECK(e.second.find("U=1 x R=2") != std::string::npos);
}

TEST_CASE("PlanOptions::ring: the plan's agreement record carries the ring configuration; check_ring_config(plan) in its one all-gather") {
  const int U = 2, R = 2;
  const RingPartition part(64, U, R, RingLayout::zigzag);
  const AttentionSpecs specs = attention_specs<float>(U, {4, 2, 8, 8});
  auto plan = [&](int j, int u, RingConfig c) {
    PlanOptions o;
    o.ring = c;
    return Plan({U, u}, 1, part.ulysses_partition(j), specs.qkv(), Format::bshd, o);
  };
  const RingConfig cfg = RingConfig::of(part, true);
  const Plan plain({U, 0}, 1, part.ulysses_partition(0), specs.qkv());
  const Plan a = plan(0, 0, cfg);
  CHECK(plain.agreement_record()[57] == 0);  // the ring word (plan/agreement.hpp, kRingWord)
  CHECK(a.agreement_record()[57] != 0);
  for (const RingConfig& other : {RingConfig{U, R, RingLayout::zigzag, false, 64}, RingConfig{U, R, RingLayout::contiguous, true, 64}}) {
    const Plan b = plan(0, 0, other);
    CHECK(Plan::agreement_field(57).find("Ulysses x Ring") != std::string::npos);
    CHECK(b.agreement_record()[57] != a.agreement_record()[57]);
    for (int i = 0; i < kAgreementWords; ++i)
      if (i != 57) CHECK(b.agreement_record()[static_cast<std::size_t>(i)] == a.agreement_record()[static_cast<std::size_t>(i)]);
  }
  // A ring configuration that is not this group's: U != P, or no ring rank holds the plan's tokens.
  CHECK(ut::code_of([&] { plan(0, 0, RingConfig{4, 1, RingLayout::zigzag, true, 64}); }) == Errc::invalid_mesh);
  CHECK(ut::code_of([&] { plan(0, 0, RingConfig{U, R, RingLayout::zigzag, true, 90}); }) == Errc::invalid_mesh);
  LocalGroup one(1);
  LocalGroup::Comm c0 = one.comm(0), c1 = one.comm(0);
  CHECK(ut::code_of([&] { check_ring_config(plain, c0, c1); }) == Errc::invalid_mesh);  // a plan without PlanOptions::ring

  // The U x R block on threads: all agree (the plan then counts as agreed), or rank 3's plan says
  // causal=false: every rank of the block throws plan_mismatch, naming the ring field on rank 3's group.
  std::vector<std::unique_ptr<LocalGroup>> ug, rg;
  for (int k = 0; k < 2; ++k) {
    ug.push_back(std::make_unique<LocalGroup>(U));
    rg.push_back(std::make_unique<LocalGroup>(R));
  }
  for (int bad_rank : {-1, 3}) {
    std::vector<std::pair<Errc, std::string>> got(4);
    std::vector<int> agreed(4, 0), due(4, -1);  // not vector<bool>: its bits share words, and every rank thread writes its own
    std::vector<std::thread> th;
    for (int w = 0; w < 4; ++w)
      th.emplace_back([&, w] {
        const int j = part.ring_rank(w), u = part.ulysses_rank(w);
        LocalGroup::Comm uc = ug[static_cast<std::size_t>(j)]->comm(u), rc = rg[static_cast<std::size_t>(u)]->comm(j);
        const Plan p = plan(j, u, w == bad_rank ? RingConfig{U, R, RingLayout::zigzag, false, 64} : cfg);
        const bool before = detail::ring_config_due(p, uc, rc);
        got[static_cast<std::size_t>(w)] = ut::error_of([&] { check_ring_config(p, uc, rc); });
        agreed[static_cast<std::size_t>(w)] = p.agreement_checked();
        due[static_cast<std::size_t>(w)] = before && detail::ring_config_due(p, uc, rc);  // after a pass, no longer due
      });
    for (auto& t : th) t.join();
    for (int w = 0; w < 4; ++w) {
      CHECK(got[static_cast<std::size_t>(w)].first == (bad_rank < 0 ? Errc{} : Errc::plan_mismatch));
      CHECK(agreed[static_cast<std::size_t>(w)] == (bad_rank < 0));
      CHECK(due[static_cast<std::size_t>(w)] == (bad_rank >= 0));  // distributed_attention() checks again only after a failure
    }
    if (bad_rank >= 0) {
      // Rank 2 (rank 3's Ulysses group) sees it in the plan's record; rank 1 (rank 3's ring) in the
      // ring record; rank 0 (in neither) from the verdicts.
      CHECK(got[2].second.find("the Ulysses x Ring configuration (PlanOptions::ring") != std::string::npos);
      CHECK(got[1].second.find("over the ring: rank 1 differs from rank 0 in causal (rank 1: 0; rank 0: 1)") != std::string::npos);
      CHECK(got[0].second.find("on another rank of this U x R block") != std::string::npos);
    }
  }
}

TEST_CASE("Mesh::split_key (the colours and keys of split_ring over MPI and NCCL): each colour's members are the mesh's group, ranked by key") {
  for (const Mesh& m : {Mesh(16, 4, 2, 8), Mesh(16, 2, 4, 4, RingOrder::ring_inner), Mesh(12, 3, 2, 6), Mesh(8, 1, 8, 8),
                            Mesh(6, 6, 1, 6)}) {
    const int W = m.world(), UR = m.ulysses_degree() * m.ring_degree();
    for (RingGroup g : {RingGroup::ulysses, RingGroup::ring, RingGroup::block, RingGroup::outer})
      for (int w = 0; w < W; ++w) {
        std::vector<std::pair<int, int>> members;  // (key, world rank) of w's colour
        const RingSplitKey mine = m.split_key(g, w);
        for (int x = 0; x < W; ++x)
          if (m.split_key(g, x).color == mine.color) members.push_back({m.split_key(g, x).key, x});
        std::sort(members.begin(), members.end());
        std::vector<int> got, want;
        for (std::size_t i = 0; i < members.size(); ++i) {
          CHECK(members[i].first == static_cast<int>(i));  // keys 0 .. n-1: the rank in the group
          got.push_back(members[i].second);
        }
        if (g == RingGroup::ulysses) want = m.ulysses_ranks_of(w);
        if (g == RingGroup::ring) want = m.ring_ranks_of(w);
        if (g == RingGroup::outer) want = m.outer_ranks_of(w);
        if (g == RingGroup::block)
          for (int i = 0; i < UR; ++i) want.push_back(m.outer_rank(w) * UR + i);
        CHECK(got == want);
        CHECK(mine.color >= 0);
      }
  }
  CHECK(ut::code_of([] { Mesh(4, 2, 2, 4).split_key(RingGroup::ring, 4); }) == Errc::invalid_group);
}
