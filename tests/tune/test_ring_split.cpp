// SPDX-License-Identifier: Apache-2.0
// tune/ring_split.hpp: the wire split measured on the communicator: every ring rank gets the same
// k, one of the candidates (no timing assertions: the speeds belong to the benchmarks).
#include <doctest/doctest.h>

#include <ulysses/comm/local.hpp>
#include <ulysses/tune/ring_split.hpp>

#include <mutex>
#include <vector>

#include "expect_error.hpp"

using namespace ulysses;

TEST_CASE("measure_ring_split: one k for every ring rank, a candidate, the slowest rank's times") {
  for (int P : {2, 3, 4}) {
    LocalGroup g(P);
    std::vector<int> got(static_cast<std::size_t>(P), -1);
    std::vector<RingSplitMeasurement> ms(static_cast<std::size_t>(P));
    const std::size_t bytes = 64 * 1024 + 100;  // pieces at 4 KiB multiples, the last one short
    g.spawn([&](LocalGroup::Comm& c) {
      std::vector<std::byte> b0(bytes, std::byte{1}), b1(bytes);
      got[static_cast<std::size_t>(c.rank())] = measure_ring_split(c, bytes, b0.data(), b1.data());
      ms[static_cast<std::size_t>(c.rank())] = measure_ring_split_times(c, bytes, b0.data(), b1.data(), {4, 2, 0, 0.05});
    });
    for (int r = 0; r < P; ++r) {
      CHECK(got[static_cast<std::size_t>(r)] == got[0]);
      CHECK(ms[static_cast<std::size_t>(r)].best == ms[0].best);
      CHECK(ms[static_cast<std::size_t>(r)].seconds == ms[0].seconds);  // the max over ranks, the same everywhere
    }
    CHECK((got[0] == 1 || got[0] == 2 || got[0] == 4 || got[0] == 8));
    CHECK(ms[0].messages == std::vector<int>{1, 2, 4});
    REQUIRE(ms[0].seconds.size() == 3);
    for (double s : ms[0].seconds) CHECK(s > 0);
    CHECK((ms[0].best == 1 || ms[0].best == 2 || ms[0].best == 4));
  }
}

TEST_CASE("measure_ring_split: a ring of one rank moves nothing; options out of range are refused") {
  LocalGroup one(1);
  one.spawn([&](LocalGroup::Comm& c) {
    std::vector<std::byte> b0(64), b1(64);
    const RingSplitMeasurement m = measure_ring_split_times(c, 64, b0.data(), b1.data());
    CHECK(m.best == 1);
    CHECK(m.messages == std::vector<int>{1});
    CHECK(measure_ring_split(c, 64, b0.data(), b1.data()) == 1);
  });
  LocalGroup g(2);
  std::mutex mu;
  std::vector<Errc> codes;
  g.spawn([&](LocalGroup::Comm& c) {
    std::vector<std::byte> b0(64), b1(64);
    for (const RingSplitOptions& o : {RingSplitOptions{0, 3, 1, 0.03}, RingSplitOptions{kMaxRingMessages + 1, 3, 1, 0.03},
                                      RingSplitOptions{8, 0, 1, 0.03}, RingSplitOptions{8, 3, -1, 0.03}, RingSplitOptions{8, 3, 1, -1}}) {
      const Errc e = ut::code_of([&] { (void)measure_ring_split(c, 64, b0.data(), b1.data(), o); });
      std::lock_guard<std::mutex> lock(mu);
      codes.push_back(e);
    }
  });
  CHECK(codes.size() == 10);
  for (Errc e : codes) CHECK(e == Errc::invalid_shape);
}
