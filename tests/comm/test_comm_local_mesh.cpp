// SPDX-License-Identifier: Apache-2.0
// comm/local_mesh.hpp: U x R ranks on threads, a LocalGroup per Ulysses group and per ring.
#include <doctest/doctest.h>

#include <array>
#include <chrono>
#include <stdexcept>
#include <vector>

#include <ulysses/comm/local_mesh.hpp>

#include "expect_error.hpp"

using namespace ulysses;

TEST_CASE("LocalMesh: world rank w is Ulysses rank w % U of group w / U and ring rank w / U of ring w % U") {
  for (const auto& [U, R] : std::vector<std::array<int, 2>>{{2, 3}, {4, 1}, {1, 4}, {3, 2}}) {
    CAPTURE(U);
    CAPTURE(R);
    LocalMesh mesh(U, R);
    CHECK(mesh.size() == U * R);
    std::vector<std::vector<int>> ulysses_members(static_cast<std::size_t>(U * R)), ring_members(static_cast<std::size_t>(U * R));
    std::vector<std::array<int, 4>> seen(static_cast<std::size_t>(U * R));
    mesh.spawn([&](int w, LocalGroup::Comm& uc, LocalGroup::Comm& rc) {
      seen[static_cast<std::size_t>(w)] = {uc.rank(), uc.size(), rc.rank(), rc.size()};
      std::vector<int> u(static_cast<std::size_t>(uc.size())), r(static_cast<std::size_t>(rc.size()));
      uc.allgather(&w, sizeof w, u.data());  // the world ranks of w's Ulysses group, in its rank order
      rc.allgather(&w, sizeof w, r.data());
      ulysses_members[static_cast<std::size_t>(w)] = u;
      ring_members[static_cast<std::size_t>(w)] = r;
    });
    for (int w = 0; w < U * R; ++w) {
      CHECK(seen[static_cast<std::size_t>(w)] == std::array<int, 4>{w % U, U, w / U, R});
      for (int i = 0; i < U; ++i) CHECK(ulysses_members[static_cast<std::size_t>(w)][static_cast<std::size_t>(i)] == w / U * U + i);
      for (int j = 0; j < R; ++j) CHECK(ring_members[static_cast<std::size_t>(w)][static_cast<std::size_t>(j)] == j * U + w % U);
    }
  }
}

TEST_CASE("LocalMesh: a rank that throws breaks its groups at once; spawn() rethrows its error, not the peers' aborted") {
  LocalMesh mesh(2, 2, std::chrono::minutes(5));
  std::vector<Errc> peers(4, Errc{});
  try {
    mesh.spawn([&](int w, LocalGroup::Comm& uc, LocalGroup::Comm& rc) {
      if (w == 3) throw std::runtime_error("rank 3's kernel failed");
      int x = 0, all[2];
      try {
        uc.allgather(&x, sizeof x, all);  // rank 2 waits for rank 3 here, rank 1 in its ring below
        rc.allgather(&x, sizeof x, all);
      } catch (const Error& e) {
        peers[static_cast<std::size_t>(w)] = e.code();
        throw;
      }
    });
    FAIL("spawn() returned");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()) == "rank 3's kernel failed");
  }
  CHECK(peers[2] == Errc::aborted);  // rank 3's Ulysses group: told, not timed out (Errc::timeout)
  CHECK(peers[1] == Errc::aborted);  // rank 3's ring
}

TEST_CASE("LocalMesh: U and R >= 1") {
  CHECK(ut::code_of([] { LocalMesh(0, 2); }) == Errc::invalid_group);
  CHECK(ut::code_of([] { LocalMesh(2, 0); }) == Errc::invalid_group);
}
