// SPDX-License-Identifier: Apache-2.0
// The ring rotation (ring/rotation.hpp) in-process: bit-exact, every rank sees every block once in
// the documented order (step s: ring rank (r − s) mod R), P = U × R up to 16, both progress modes,
// uneven block sizes; the backward's accumulators come home with every ring rank's contribution in
// step order; a misconfigured hybrid (bug case C14) is a coded error.
#include <doctest/doctest.h>
#include <ulysses/comm/local.hpp>
#include <ulysses/ring/rotation.hpp>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "expect_error.hpp"

using namespace ulysses;

namespace {
// Block of (ring rank j, Ulysses rank u): 8 + 3·j bytes of a code (uneven sizes around the ring).
std::vector<std::byte> block_of(int j, int u, std::size_t n) {
  std::vector<std::byte> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>((j * 31 + u * 7 + static_cast<int>(i) * 13) & 0xff);
  return b;
}

// P = U × R threads; a LocalGroup per ring (the ranks of one Ulysses rank); runs f(ring comm, j, u).
template <class F>
void on_rings(int U, int R, F f) {
  std::vector<std::unique_ptr<LocalGroup>> rings;
  for (int u = 0; u < U; ++u) rings.push_back(std::make_unique<LocalGroup>(R, std::chrono::seconds(30)));
  std::vector<std::thread> th;
  std::vector<std::string> errs(static_cast<std::size_t>(U * R));
  for (int w = 0; w < U * R; ++w)
    th.emplace_back([&, w] {
      const int j = w / U, u = w % U;
      try {
        LocalGroup::Comm c = rings[static_cast<std::size_t>(u)]->comm(j);
        f(c, j, u);
      } catch (const std::exception& e) {
        errs[static_cast<std::size_t>(w)] = e.what();
        rings[static_cast<std::size_t>(u)]->abort();
      }
    });
  for (auto& t : th) t.join();
  for (auto& e : errs) CHECK(e == "");
}
}  // namespace

TEST_CASE("forward rotation: every block once, in order, bit-exact; P = U x R up to 16; both progress modes") {
  for (RingProgress pr : {RingProgress::thread, RingProgress::in_start})
    for (int U = 1; U <= 4; ++U)
      for (int R = 1; U * R <= 16; ++R) {
        std::vector<std::size_t> bytes;
        for (int j = 0; j < R; ++j) bytes.push_back(8 + 3 * static_cast<std::size_t>(j));
        const std::size_t cap = bytes.back();
        std::vector<int> bad(static_cast<std::size_t>(U * R), 0);
        on_rings(U, R, [&](LocalGroup::Comm& c, int j, int u) {
          std::vector<std::byte> b0(cap), b1(cap);
          const auto own = block_of(j, u, bytes[static_cast<std::size_t>(j)]);
          std::memcpy(b0.data(), own.data(), own.size());
          RingRotation<LocalGroup::Comm> rot(c, bytes, b0.data(), b1.data(), cap, pr);
          std::vector<int> seen(static_cast<std::size_t>(R), 0);
          for (int layer = 0; layer < 2; ++layer) {  // the same object runs a second ring (own block back in buffer 0)
            std::memcpy(b0.data(), own.data(), own.size());
            for (int s = 0; s < R; ++s) {
              rot.start(s);
              const int src = rot.source(s);
              if (src != ((j - s) % R + R) % R) ++bad[static_cast<std::size_t>(j * U + u)];
              const auto want = block_of(src, u, bytes[static_cast<std::size_t>(src)]);
              if (rot.block_bytes(s) != want.size() || std::memcmp(rot.block(s), want.data(), want.size()) != 0)
                ++bad[static_cast<std::size_t>(j * U + u)];
              ++seen[static_cast<std::size_t>(src)];
              rot.finish(s);
            }
          }
          for (int x : seen)
            if (x != 2) ++bad[static_cast<std::size_t>(j * U + u)];
        });
        for (int x : bad) CHECK(x == 0);
      }
}

TEST_CASE("backward rotation: dk|dv accumulators travel with their block and come home summed in step order") {
  for (RingProgress pr : {RingProgress::thread, RingProgress::in_start})
    for (int R : {1, 2, 3, 5, 8}) {
      const int U = 2;
      const std::size_t n = 6;  // floats an accumulator
      std::vector<std::size_t> kvb(static_cast<std::size_t>(R), 16), gb(static_cast<std::size_t>(R), n * sizeof(float));
      auto contrib = [](int rank, int src, std::size_t e) {  // ring rank `rank`'s contribution to block src
        return static_cast<float>(1.0 / (1 + rank + 3 * src)) * (e % 2 ? 1e7f : 1.0f) + static_cast<float>(e);
      };
      std::vector<int> bad(static_cast<std::size_t>(U * R), 0);
      on_rings(U, R, [&](LocalGroup::Comm& c, int j, int u) {
        std::vector<std::byte> k0(16), k1(16);
        std::vector<float> g0(n), g1(n);
        const auto own = block_of(j, u, 16);
        std::memcpy(k0.data(), own.data(), 16);
        RingGradRotation<LocalGroup::Comm> rot(c, kvb, k0.data(), k1.data(), 16, gb, reinterpret_cast<std::byte*>(g0.data()),
                                               reinterpret_cast<std::byte*>(g1.data()), n * sizeof(float), pr);
        for (int s = 0; s < R; ++s) {
          rot.start(s);
          const int src = rot.source(s);
          const auto want = block_of(src, u, 16);
          if (std::memcmp(rot.block(s), want.data(), 16) != 0) ++bad[static_cast<std::size_t>(j * U + u)];
          rot.finish(s);
          auto* g = reinterpret_cast<float*>(rot.grad(s));
          for (std::size_t e = 0; e < n; ++e) g[e] = s == 0 ? contrib(j, src, e) : g[e] + contrib(j, src, e);
        }
        const auto* home = reinterpret_cast<const float*>(rot.home());
        for (std::size_t e = 0; e < n; ++e) {
          float want = contrib(j, j, e);  // ((c_j + c_{j+1}) + c_{j+2}) + ...
          for (int s = 1; s < R; ++s) want = want + contrib((j + s) % R, j, e);
          if (std::memcmp(&want, &home[e], sizeof(float)) != 0) ++bad[static_cast<std::size_t>(j * U + u)];
        }
      });
      for (int x : bad) CHECK(x == 0);
    }
}

TEST_CASE("C14: a hybrid asked for as R = 2 whose ring communicator has one rank throws comm_mismatch") {
  LocalGroup one(1);
  LocalGroup::Comm c = one.comm(0);
  std::vector<std::byte> b0(16), b1(16);
  const auto e = ut::error_of([&] { RingRotation<LocalGroup::Comm> rot(c, {16, 16}, b0.data(), b1.data(), 16); });
  CHECK(e.first == Errc::comm_mismatch);
  CHECK(e.second.find("rank 0 of 1; RingRotation (the ring degree R) was made for P=2") != std::string::npos);
  CHECK(e.second.find("CP=1") != std::string::npos);
  CHECK(ut::code_of([&] {
          RingGradRotation<LocalGroup::Comm> rot(c, {16, 16}, b0.data(), b1.data(), 16, {16, 16}, b0.data(), b1.data(), 16);
        }) == Errc::comm_mismatch);
  CHECK(ut::code_of([&] { RingRotation<LocalGroup::Comm> rot(c, {32}, b0.data(), b1.data(), 16); }) == Errc::buffer_too_small);
  RingRotation<LocalGroup::Comm> rot(c, {16}, b0.data(), nullptr, 16);  // R = 1: one buffer suffices
  CHECK(ut::code_of([&] { rot.start(1); }) == Errc::invalid_group);
  rot.start(0);
  rot.finish(0);
}

TEST_CASE("a ring rank that never arrives: the others throw the communicator's timeout, not a hang") {
  LocalGroup g(3, std::chrono::milliseconds(200));
  std::vector<Errc> got(3, Errc{});
  std::vector<std::thread> th;
  for (int j = 0; j < 2; ++j)  // ring rank 2 never starts
    th.emplace_back([&, j] {
      LocalGroup::Comm c = g.comm(j);
      std::vector<std::byte> b0(8), b1(8);
      got[static_cast<std::size_t>(j)] = ut::code_of([&] {
        RingRotation<LocalGroup::Comm> rot(c, {8, 8, 8}, b0.data(), b1.data(), 8);
        rot.start(0);
        rot.finish(0);
      });
    });
  for (auto& t : th) t.join();
  for (int j = 0; j < 2; ++j) CHECK((got[static_cast<std::size_t>(j)] == Errc::timeout || got[static_cast<std::size_t>(j)] == Errc::aborted));
}

namespace {
/// A user's threaded communicator (ThreadedComm: a wrapper of LocalGroup::Comm of its own type)
/// declares the trait: the ring overlaps on a worker for it too, not only for LocalGroup::Comm by name.
struct PlainComm {  // a communicator of its own type, without the trait
  LocalGroup::Comm* c;
  int size() const { return c->size(); }
  int rank() const { return c->rank(); }
  void alltoallv(const std::byte* s, const std::size_t* sb, const std::size_t* so, std::byte* r, const std::size_t* rb, const std::size_t* ro) {
    c->alltoallv(s, sb, so, r, rb, ro);
  }
  void exchange_messages(const Message* s, std::size_t ns, const Message* r, std::size_t nr) { c->exchange_messages(s, ns, r, nr); }
};
struct ThreadedComm : PlainComm {
  static constexpr bool progress_thread = true;
};
}  // namespace

TEST_CASE("RingProgress::automatic follows comm_traits::progress_thread, not the communicator's type") {
  CHECK(detail::resolve_progress<LocalGroup::Comm>(RingProgress::automatic) == RingProgress::thread);
  CHECK(detail::resolve_progress<ThreadedComm>(RingProgress::automatic) == RingProgress::thread);
  CHECK(detail::resolve_progress<PlainComm>(RingProgress::automatic) == RingProgress::in_start);
  CHECK(detail::resolve_progress<ThreadedComm>(RingProgress::in_start) == RingProgress::in_start);
  LocalGroup g(3);
  std::vector<std::vector<std::byte>> got(3);
  g.spawn([&](LocalGroup::Comm& lc) {  // the user's threaded communicator runs the rotation on a worker, bit-exact
    ThreadedComm c{{&lc}};
    const int r = c.rank();
    std::vector<std::byte> b0(8, std::byte(static_cast<unsigned char>(r + 1))), b1(8);
    RingRotation<ThreadedComm> rot(c, {8, 8, 8}, b0.data(), b1.data(), 8);
    for (int s = 0; s < 3; ++s) {
      rot.start(s);
      if (s + 1 < 3) got[static_cast<std::size_t>(r)].push_back(rot.block(s)[0]);
      rot.finish(s);
    }
    got[static_cast<std::size_t>(r)].push_back(rot.block(2)[0]);
  });
  for (int r = 0; r < 3; ++r)
    for (int s = 0; s < 3; ++s) CHECK(got[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)] == std::byte(static_cast<unsigned char>((r - s + 3) % 3 + 1)));
}
