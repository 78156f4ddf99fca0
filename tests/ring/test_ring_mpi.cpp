// SPDX-License-Identifier: Apache-2.0
// Ulysses × Ring under real MPI processes (ring/mpi_mesh.hpp, ring/rotation.hpp, ring/agreement.hpp):
// every factorisation U × R of the world (-n 4: 1x4, 2x2, 4x1; -n 6: 2x3, 3x2, ...; -n 8: 2x4, 4x2, ...)
// split by split_ring() on simulated nodes of U ranks; the forward rotation bit-exact in the
// documented order, both progress modes; the backward's accumulators home in step order; the
// configuration check (a rank with another S; a ring of one rank for R = 2, bug case C14); and the
// whole attention, forward and backward (examples/common/ring_attention.hpp, the demo's --ring), on
// every factorisation: bit-identical to the same hybrid on threads in-process, and within the
// tolerance of the double-precision reference (causal zigzag and not, GQA, uneven S).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>
#include <ulysses/attention/distributed.hpp>
#include <ulysses/comm/mpi_comm.hpp>
#include <ulysses/comm/mpi_window.hpp>
#include <ulysses/ring/agreement.hpp>
#include <ulysses/ring/mpi_mesh.hpp>
#include <ulysses/ring/plan.hpp>
#include <ulysses/ring/rotation.hpp>
#include <ulysses/ulysses.hpp>

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

#include "expect_error.hpp"
#include "ring_attention.hpp"

using namespace ulysses;

namespace {
int thread_level = MPI_THREAD_SINGLE;
std::vector<std::byte> block_of(int j, int u, std::size_t n) {
  std::vector<std::byte> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>((j * 31 + u * 7 + static_cast<int>(i) * 13) & 0xff);
  return b;
}
}  // namespace

/// The forward over the ring: at every step the block of ring rank source(s), byte for byte, in
/// the documented order, where it is carried (up to its last use: RingPlan::last_use()); `b0`,
/// `b1` the rotation's buffers (this rank's block is written into b0).
template <class Comm>
static int forward_errors(Comm& ring, const RingPlan& rp, int j, int u, std::byte* b0, std::byte* b1, RingProgress pr,
                          RingAccess ac = RingAccess::copy) {
  const int R = rp.steps();
  const std::vector<std::size_t> bytes = rp.block_bytes();
  const std::size_t cap = rp.kv_buffer_bytes();
  const auto own = block_of(j, u, bytes[static_cast<std::size_t>(j)]);
  std::memcpy(b0, own.data(), own.size());
  RingRotation<Comm> rot(ring, rp, RingBuffers().kv(b0, cap, b1, cap), pr, ac);
  int bad = 0;
  for (int s = 0; s < R; ++s) {
    rot.start(s);
    const int src = rot.source(s);
    const auto want = block_of(src, u, bytes[static_cast<std::size_t>(src)]);
    if (src != ((j - s) % R + R) % R || rot.carried(s) != (s == 0 || ac == RingAccess::zero_copy || s <= rp.last_use(src))) ++bad;
    if (rot.carried(s) && std::memcmp(rot.block(s), want.data(), want.size()) != 0) ++bad;
    rot.finish(s);
  }
  return bad;
}

/// The backward over the ring: accumulators travel with their block and come home, summed in step
/// order; `k0`, `k1`, `g0`, `g1` the rotation's buffers (null: vectors of the plan's sizes).
template <class Comm>
static void check_backward_rotation(Comm& ring, const RingPlan& rp, int j, int u, std::byte* k0 = nullptr, std::byte* k1 = nullptr,
                                    std::byte* g0 = nullptr, std::byte* g1 = nullptr, RingAccess ac = RingAccess::copy) {
  const int R = rp.steps();
  const std::vector<std::size_t> bytes = rp.block_bytes();
  auto floats = [&](int src) { return rp.grad_bytes()[static_cast<std::size_t>(src)] / sizeof(float); };  // block src's accumulator
  std::vector<std::byte> kv0(rp.kv_buffer_bytes()), kv1(kv0.size()), gr0(rp.grad_buffer_bytes()), gr1(gr0.size());
  if (!k0) k0 = kv0.data(), k1 = kv1.data(), g0 = gr0.data(), g1 = gr1.data();
  const auto own = block_of(j, u, bytes[static_cast<std::size_t>(j)]);
  std::memcpy(k0, own.data(), own.size());
  auto contrib = [](int rank, int src, std::size_t e) { return static_cast<float>(1.0 / (1 + rank + 3 * src)) + static_cast<float>(e % 7) * 1e6f; };
  const std::size_t kb = rp.kv_buffer_bytes(), gb = rp.grad_buffer_bytes();
  RingGradRotation<Comm> rot(ring, rp, RingBuffers().kv(k0, kb, k1, kb).grad(g0, gb, g1, gb), RingProgress::automatic, ac);
  int bad = 0;
  for (int s = 0; s < R; ++s) {
    rot.start(s);
    const auto want = block_of(rot.source(s), u, bytes[static_cast<std::size_t>(rot.source(s))]);
    if (rot.carried(s) && std::memcmp(rot.block(s), want.data(), want.size()) != 0) ++bad;
    rot.finish(s);
    float* g = rot.template grad<float>(s);
    for (std::size_t e = 0; e < floats(rot.source(s)); ++e) g[e] = s == 0 ? contrib(j, rot.source(s), e) : g[e] + contrib(j, rot.source(s), e);
  }
  const float* home = rot.template home<float>();
  for (std::size_t e = 0; e < floats(j); ++e) {
    float want = contrib(j, j, e);
    for (int s = 1; s < R; ++s) want = want + contrib((j + s) % R, j, e);
    if (std::memcmp(&want, &home[e], sizeof(float)) != 0) ++bad;
  }
  CHECK(bad == 0);
}

namespace {
/// Checks a rank's result against another's, bit for bit: out, lse, dq, dk, dv.
void check_same_bits(const ulysses_ring_demo::RingRankResult& got, const ulysses_ring_demo::RingRankResult& want) {
  const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  CHECK(same(got.out, want.out));
  CHECK(same(got.lse, want.lse));
  CHECK(same(got.dq, want.dq));
  CHECK(same(got.dk, want.dk));
  CHECK(same(got.dv, want.dv));
}

/// f(U, R, m) for every factorisation U x R of the world (U ascending), m the world split into
/// nodes of U ranks (split_ring(): index == world rank), freed after f.
template <class F>
void for_each_mesh(F&& f) {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  for (int U = 1; U <= W; ++U) {
    if (W % U) continue;
    MpiRingMesh m = split_ring(MPI_COMM_WORLD, U, W / U, U);
    f(U, W / U, m);
    m.free();
  }
}
}  // namespace

TEST_CASE("MPI ring rotation: every factorisation U x R of the world, bit-exact, in order, both progress modes") {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  for (int U = 1; U <= W; ++U) {
    if (W % U) continue;
    const int R = W / U;
    MpiRingMesh m = split_ring(MPI_COMM_WORLD, U, R, U);
    const int j = m.mesh.ring_rank(m.index), u = m.mesh.ulysses_rank(m.index);
    MpiComm ring(m.ring), uly(m.ulysses);
    CHECK(ring.size() == R);
    CHECK(ring.rank() == j);
    CHECK(uly.size() == U);
    CHECK(uly.rank() == u);
    check_ring_config({U, R, RingLayout::zigzag, true, 1000}, uly, ring);
    // Uneven blocks around the ring (S = 1000 + 7W: the ring ranks hold different token counts).
    const AttentionSpecs specs = attention_specs<float>(U, AttentionShape{8, 4, 16, 8}, HeadPolicy::balanced);
    std::vector<RingProgress> modes{RingProgress::in_start};
    if (thread_level >= MPI_THREAD_SERIALIZED) modes.push_back(RingProgress::thread);
    for (int messages : {1, 2, 5}) {  // the wire split: a block as 1, 2 or 5 MPI messages (pieces cut at 4 KiB)
      CAPTURE(messages);
      // messages 2: contiguous causal, whose blocks stop after their last use (no message past it)
      const RingLayout layout = messages == 2 ? RingLayout::contiguous : RingLayout::zigzag;
      const RingPlan rp(RingPartition(1000 + 7 * W, U, R, layout), m.mesh, m.index, 1, specs, true, messages);
      const std::size_t cap = rp.kv_buffer_bytes();
      for (RingProgress pr : modes) {
        std::vector<std::byte> b0(cap), b1(cap);
        CHECK(forward_errors(ring, rp, j, u, b0.data(), b1.data(), pr) == 0);
      }
      check_backward_rotation(ring, rp, j, u);
    }
    m.free();
  }
}

TEST_CASE("MPI ring configuration: a rank with another S throws plan_mismatch on every rank; C14 comm_mismatch") {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  if (W % 2) return;
  MpiRingMesh m = split_ring(MPI_COMM_WORLD, 2, W / 2, 2);
  MpiComm ring(m.ring), uly(m.ulysses);
  int w = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &w);
  const auto e = ut::error_of([&] { check_ring_config({2, W / 2, RingLayout::zigzag, true, w == W - 1 ? 999 : 1000}, uly, ring); });
  CHECK(e.first == Errc::plan_mismatch);
  MpiComm self(MPI_COMM_SELF);  // the ring of a hybrid whose sizes were never applied
  const auto c = ut::error_of([&] { check_ring_config({2, 2, RingLayout::zigzag, true, 1000}, uly, self); });
  CHECK(c.first == Errc::comm_mismatch);
  CHECK(c.second.find("CP=1") != std::string::npos);
  CHECK(ut::code_of([&] { split_ring(MPI_COMM_WORLD, 3, 3, 1); }) == (W % 9 ? Errc::invalid_mesh : Errc{}));
  // The wire split is agreed too: a rank that cuts its blocks into 2 messages where the others send 1.
  const auto s = ut::error_of([&] { check_ring_config({2, W / 2, RingLayout::zigzag, true, 1000, w == 0 ? 2 : 1}, uly, ring); });
  CHECK(s.first == Errc::plan_mismatch);
  CHECK(ut::code_of([&] { check_ring_config({2, W / 2, RingLayout::zigzag, true, 1000, 0}, uly, ring); }) == Errc::invalid_shape);
  m.free();
}

TEST_CASE("MPI ring: ranks that cut blocks differently without the agreement check get a coded error on every rank, never wrong blocks") {
  int W = 0, w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MPI_Comm_rank(MPI_COMM_WORLD, &w);
  MPI_Comm dup = MPI_COMM_NULL;  // a communicator of its own: the one that times out cannot be used again (its messages linger)
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  MpiComm ring(dup, MpiComm::kIntMaxBytes, std::chrono::milliseconds(1500));
  const std::size_t n = 65536;
  std::vector<std::byte> b0(n), b1(n);
  const auto own = block_of(w, 0, n);
  std::memcpy(b0.data(), own.data(), n);
  RingRotation<MpiComm> rot(ring, std::vector<std::size_t>(static_cast<std::size_t>(W), n), RingBuffers().kv(b0, b1), RingProgress::in_start,
                            w == 0 ? 2 : 1);
  int wrong = 0;
  const Errc e = ut::code_of([&] {
    for (int s = 0; s < W; ++s) {
      rot.start(s);
      const auto want = block_of(rot.source(s), 0, n);
      wrong += std::memcmp(rot.block(s), want.data(), n) != 0;
      rot.finish(s);
    }
  });
  CHECK((e == Errc::timeout || e == Errc::aborted || e == Errc::plan_mismatch));
  CHECK(wrong == 0);  // no step ended with a block that is not its owner's
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("MPI ring: a rotation left between start() and finish() (the engine threw) completes its step; the communicator stays usable") {
  int W = 0, w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MPI_Comm_rank(MPI_COMM_WORLD, &w);
  MpiComm ring(MPI_COMM_WORLD);
  const std::size_t n = 1 << 20;
  const std::vector<std::size_t> sizes(static_cast<std::size_t>(W), n);
  CHECK_THROWS_AS(([&] {
                    std::vector<std::byte> b0(n), b1(n);  // freed after the rotation
                    RingRotation<MpiComm> rot(ring, sizes, RingBuffers().kv(b0, b1), RingProgress::in_start);
                    rot.start(0);
                    throw std::runtime_error("the engine's attention failed");
                  }()),
                  std::runtime_error);
  std::vector<std::byte> b0(n), b1(n);
  const auto own = block_of(w, 0, n);
  std::memcpy(b0.data(), own.data(), n);
  RingRotation<MpiComm> again(ring, sizes, RingBuffers().kv(b0, b1), RingProgress::in_start);
  int wrong = 0;
  for (int s = 0; s < W; ++s) {
    again.start(s);
    const auto want = block_of(again.source(s), 0, n);
    wrong += std::memcmp(again.block(s), want.data(), n) != 0;
    again.finish(s);
  }
  CHECK(wrong == 0);
  CHECK(!ring.broken());
}

TEST_CASE("MPI ring on the window: blocks read in place from the sender's slot, outside it by Cross Memory Attach or staged; bit-exact, both directions") {
  int W = 0, w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MPI_Comm_rank(MPI_COMM_WORLD, &w);
  const Mesh mesh(W, 1, W, W);  // one node: the ring is the whole world (U = 1)
  const AttentionSpecs specs = attention_specs<float>(1, AttentionShape{8, 4, 16, 8}, HeadPolicy::balanced);
  const RingPlan rp(RingPartition(1000 + 7 * W, 1, W, RingLayout::zigzag), mesh, w, 1, specs, true, 3);  // (messages: ignored in place)
  const std::size_t kb = rp.kv_buffer_bytes(), gb = rp.grad_buffer_bytes();
  MpiComm mpi(MPI_COMM_WORLD);
  MpiWindow win(mpi, 2 * (kb + gb) + 4 * (kb + gb) + 4 * 4096);  // the four buffers, and room to stage blocks outside the window
  const WindowSpan k0 = win.allocate(kb), k1 = win.allocate(kb), g0 = win.allocate(gb), g1 = win.allocate(gb);
  MpiWindowComm ring(mpi, win);
  static_assert(detail::ring_reads_in_place_v<MpiWindowComm>, "the window ring reads in place");
  std::vector<RingProgress> modes{RingProgress::in_start};
  if (thread_level >= MPI_THREAD_SERIALIZED) modes.push_back(RingProgress::thread);
  for (RingProgress pr : modes) {
    CHECK(forward_errors(ring, rp, w, 0, k0.data(), k1.data(), pr) == 0);
    CHECK(ring.staged_bytes() == 0);  // in the window: read in place
  }
  check_backward_rotation(ring, rp, w, 0, k0.data(), k1.data(), g0.data(), g1.data());
  CHECK(ring.staged_bytes() == 0);
  {  // contiguous causal: block j read in place up to step W − 1 − j, then no more (nothing published for it)
    const RingPlan cp(RingPartition(1000 + 7 * W, 1, W, RingLayout::contiguous), mesh, w, 1, specs, true);
    CHECK(forward_errors(ring, cp, w, 0, k0.data(), k1.data(), RingProgress::in_start) == 0);
    check_backward_rotation(ring, cp, w, 0, k0.data(), k1.data(), g0.data(), g1.data());
  }
  for (bool cma : {true, false}) {  // blocks outside the window: read by Cross Memory Attach where permitted, else staged
    CAPTURE(cma);
    ring.set_cross_memory_attach(cma);
    std::vector<std::byte> b0(kb), b1(kb);
    CHECK(forward_errors(ring, rp, w, 0, b0.data(), b1.data(), RingProgress::in_start) == 0);
    if (!cma || !win.cross_memory_attach()) CHECK(ring.staged_bytes() > 0);
    check_backward_rotation(ring, rp, w, 0);
  }
  ring.set_cross_memory_attach(true);
  // Ranks whose blocks differ in size: plan_mismatch where it is seen, aborted on the others; never a hang.
  std::vector<std::size_t> sizes(static_cast<std::size_t>(W), 4096);
  sizes[0] = w == 1 ? 8192 : 4096;
  RingRotation<MpiWindowComm> bad(ring, sizes, RingBuffers().kv(k0.data(), kb, k1.data(), kb), RingProgress::in_start);
  const Errc e = ut::code_of([&] {
    for (int s = 0; s < W; ++s) bad.start(s), bad.finish(s);
  });
  CHECK((e == Errc::plan_mismatch || e == Errc::aborted));
}

TEST_CASE("MPI zero-copy ring on the window: every block read where its owner keeps it, no copy; bit-exact, both directions; misuse coded on every rank") {
  int W = 0, w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MPI_Comm_rank(MPI_COMM_WORLD, &w);
  const Mesh mesh(W, 1, W, W);
  const AttentionSpecs specs = attention_specs<float>(1, AttentionShape{8, 4, 16, 8}, HeadPolicy::balanced);
  const RingPlan rp(RingPartition(1000 + 7 * W, 1, W, RingLayout::zigzag), mesh, w, 1, specs, true);
  const std::size_t kb = rp.kv_buffer_bytes(), gb = rp.grad_buffer_bytes();
  MPI_Comm second = MPI_COMM_NULL, third = MPI_COMM_NULL;  // each case that fails leaves its MpiComm broken: the next takes another
  MPI_Comm_dup(MPI_COMM_WORLD, &second);
  MPI_Comm_dup(MPI_COMM_WORLD, &third);
  {  // over MpiComm: refused, alike on every rank, before any message
    MpiComm mpi(third);
    std::vector<std::byte> b0(kb), b1(kb);
    CHECK(ut::code_of([&] { RingRotation<MpiComm> rot(mpi, rp, RingBuffers().kv(b0, b1), RingProgress::in_start, RingAccess::zero_copy); }) ==
          Errc::invalid_shape);
  }
  {
    MpiComm mpi(MPI_COMM_WORLD);
    MpiWindow win(mpi, 2 * (kb + gb) + 4 * 4096);
    const WindowSpan k0 = win.allocate(kb), k1 = win.allocate(kb), g0 = win.allocate(gb), g1 = win.allocate(gb);
    MpiWindowComm ring(mpi, win);
    static_assert(detail::ring_zero_copy_v<MpiWindowComm> && !detail::ring_zero_copy_v<MpiComm>, "zero-copy needs mapped peers");
    std::vector<RingProgress> modes{RingProgress::in_start};
    if (thread_level >= MPI_THREAD_SERIALIZED) modes.push_back(RingProgress::thread);
    for (RingProgress pr : modes)
      for (int layer = 0; layer < 2; ++layer) CHECK(forward_errors(ring, rp, w, 0, k0.data(), k1.data(), pr, RingAccess::zero_copy) == 0);
    CHECK(ring.staged_bytes() == 0);
    std::memset(k1.data(), 0x5a, kb);
    check_backward_rotation(ring, rp, w, 0, k0.data(), k1.data(), g0.data(), g1.data(), RingAccess::zero_copy);
    CHECK(k1.data()[kb - 1] == std::byte{0x5a});  // the second buffer never received a block
    const RingPlan cp(RingPartition(1000 + 7 * W, 1, W, RingLayout::contiguous), mesh, w, 1, specs, true);
    CHECK(forward_errors(ring, cp, w, 0, k0.data(), k1.data(), RingProgress::in_start, RingAccess::zero_copy) == 0);
    check_backward_rotation(ring, cp, w, 0, k0.data(), k1.data(), g0.data(), g1.data(), RingAccess::zero_copy);
    // One rank on the copy access: a coded error on every rank (plan_mismatch where it is seen, aborted elsewhere).
    const Errc mixed = ut::code_of([&] {
      forward_errors(ring, rp, w, 0, k0.data(), k1.data(), RingProgress::in_start, w == W - 1 ? RingAccess::copy : RingAccess::zero_copy);
    });
    CHECK((mixed == Errc::plan_mismatch || mixed == Errc::aborted));
  }
  {  // rank 0's block outside the window: invalid_shape there, and its peers hear of it (aborted), within the deadline
    MpiComm fresh(second);
    MpiWindow win(fresh, 2 * kb + 4096);
    const WindowSpan k0 = win.allocate(kb), k1 = win.allocate(kb);
    MpiWindowComm ring(fresh, win, std::chrono::seconds(20));
    std::vector<std::byte> own(kb);
    const ut::TimedError e = ut::timed_error_of([&] {
      forward_errors(ring, rp, w, 0, w == 0 ? own.data() : k0.data(), k1.data(), RingProgress::in_start, RingAccess::zero_copy);
    });
    CHECK(e.code == (w == 0 ? Errc::invalid_shape : Errc::aborted));
    CHECK(e.ms < 4000.0);  // the notice, not the 20 s deadline
  }
  if (W > 1) {  // rank 0 leaves after start(0) (an engine's exception): its rotation waits until every peer has read its
                // block (RingSharedBlocks::abandon()) before rank 0 rewrites it; the peers then get a coded error
    MPI_Comm fourth = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &fourth);
    {
      MpiComm fresh(fourth);
      MpiWindow win(fresh, 2 * kb + 4096);
      const WindowSpan k0 = win.allocate(kb), k1 = win.allocate(kb);
      MpiWindowComm ring(fresh, win, std::chrono::seconds(20));
      const std::vector<std::size_t> bytes = rp.block_bytes();
      const auto own = block_of(w, 0, bytes[static_cast<std::size_t>(w)]), first = block_of(0, 0, bytes[0]);
      std::memcpy(k0.data(), own.data(), own.size());
      int bad = 0;
      struct EngineFailure {};  // (not an Error, which is a std::runtime_error)
      const ut::TimedError e = ut::timed_error_of([&] {
        try {
          RingRotation<MpiWindowComm> rot(ring, rp, RingBuffers().kv(k0.data(), kb, k1.data(), kb), RingProgress::in_start, RingAccess::zero_copy);
          for (int s = 0; s < W; ++s) {
            rot.start(s);
            if (w == 0) throw EngineFailure{};
            if (rot.source(s) == 0) {  // rank 0's block, after it has thrown
              std::this_thread::sleep_for(std::chrono::milliseconds(100));
              bad += std::memcmp(rot.block(s), first.data(), first.size()) != 0;
            }
            rot.finish(s);
          }
        } catch (const EngineFailure&) {
          std::memset(k0.data(), 0xee, kb);  // what its next layer would do with the buffer
          throw Error(Errc::backend, "the engine failed");
        }
      });
      CHECK(bad == 0);
      if (w == 0) CHECK(e.code == Errc::backend);
      else CHECK_MESSAGE((e.code == Errc::aborted || e.code == Errc::plan_mismatch), e.message);
      CHECK(e.ms < 10000.0);  // the peers' steps, not the 20 s deadline
    }
    MPI_Comm_free(&fourth);
  }
  MPI_Comm_free(&second);
  MPI_Comm_free(&third);
}

TEST_CASE("MPI split_ring: a mesh that does not tile the world names ranks_per_node as passed (0: the nodes MPI finds), not 1") {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  const int U = W + 1;  // U*R = W + 1 ranks never tile the world
  auto [code, msg] = ut::error_of([&] { split_ring(MPI_COMM_WORLD, U, 1); });
  CHECK(code == Errc::invalid_mesh);
  CHECK(msg == "ulysses: invalid_mesh: split_ring: world=" + std::to_string(W) + ", U=" + std::to_string(U) +
                   ", R=1, ranks_per_node=0 (the nodes MPI finds): R x U = " + std::to_string(U) + " ranks do not tile the world of " +
                   std::to_string(W) + "; choose U and R with U*R dividing " + std::to_string(W));
  std::tie(code, msg) = ut::error_of([&] { split_ring(MPI_COMM_WORLD, U, 1, 2); });
  CHECK(code == Errc::invalid_mesh);
  CHECK(msg.find(", ranks_per_node=2: R x U") != std::string::npos);
  std::tie(code, msg) = ut::error_of([&] { split_ring(MPI_COMM_WORLD, 0, 1); });
  CHECK(code == Errc::invalid_mesh);
  CHECK(msg == "ulysses: invalid_mesh: split_ring: world=" + std::to_string(W) +
                   ", U=0, R=1, ranks_per_node=0 (the nodes MPI finds): U and R must be >= 1, ranks_per_node >= 0");
  CHECK(ut::code_of([&] { split_ring(MPI_COMM_WORLD, 1, 1, -1); }) == Errc::invalid_mesh);
  MpiRingMesh ok = split_ring(MPI_COMM_WORLD, 1, W);  // (the nodes MPI finds: one here)
  CHECK(ok.mesh.ranks_per_node() == W);
  ok.free();
}

TEST_CASE("MPI whole attention through Ulysses x Ring: every U x R, causal zigzag, contiguous and not, GQA, uneven S; bit-identical to in-process") {
  namespace rd = ulysses_ring_demo;
  int W = 0, w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MPI_Comm_rank(MPI_COMM_WORLD, &w);
  for (int U = 1; U <= W; ++U) {
    if (W % U) continue;
    const int R = W / U;
    MpiRingMesh m = split_ring(MPI_COMM_WORLD, U, R, U);  // nodes of U ranks: index == world rank
    for (int mode : {0, 1, 2})  // causal zigzag, non-causal, causal contiguous (blocks stop after their last use)
      for (bool gqa : {false, true}) {
        const bool causal = mode != 1;
        rd::RingCase c;
        c.U = U, c.R = R, c.B = 2, c.D = 8, c.Dv = 6;
        c.H = 2 * U;
        c.Hkv = gqa ? std::max(1, U / 2) : c.H;  // GQA: Hkv < U (replicated kv heads) where U > 1
        c.S = 4 * R * U + 3;                      // not a multiple of 2RU
        c.causal = causal;
        c.layout = mode == 0 ? RingLayout::zigzag : RingLayout::contiguous;
        INFO("U=" << U << " R=" << R << " H=" << c.H << " Hkv=" << c.Hkv << " S=" << c.S << " mode " << mode);
        const rd::RingGlobals g(c);
        rd::RingRankResult got;
        {
          MpiComm uly(m.ulysses), ring(m.ring);
          got = rd::ring_rank_attention(c, g, m.index, uly, ring, true, RingProgress::in_start);
        }
        const auto local = rd::run_ring_attention(c, g, true);  // the same hybrid on threads
        const rd::RingRankResult& want = local[static_cast<std::size_t>(m.index)];
        check_same_bits(got, want);
        const rd::RingReference ref(c, g, true);
        CHECK(rd::rank_errors(c, ref, m.index, got).max() < 2e-5);
      }
    m.free();
  }
}

TEST_CASE("MPI RoPE in distributed_attention: every U x R, causal zigzag, GQA; q, k rotated in seq->head at global tokens, dq, dk by the inverse, on MpiComm and MpiWindowComm; bit-identical to in-process") {
  namespace rd = ulysses_ring_demo;
  for_each_mesh([](int U, int R, MpiRingMesh& m) {
    rd::RingCase c;
    c.U = U, c.R = R, c.B = 2, c.D = 8, c.Dv = 6, c.H = 2 * U, c.Hkv = std::max(1, U / 2), c.S = 4 * R * U + 3, c.rope = true;
    c.bands = U > 1 ? 2 : 1;
    INFO("U=" << U << " R=" << R << " S=" << c.S << " bands=" << c.bands);
    const rd::RingGlobals g(c);
    const rd::RingRankResult want = rd::run_ring_attention(c, g, true)[static_cast<std::size_t>(m.index)];  // on threads
    {
      MpiComm uly(m.ulysses), ring(m.ring);
      MpiWindow win(uly, std::size_t{1} << 22);
      MpiWindowComm wuly(uly, win);
      check_same_bits(rd::ring_rank_attention(c, g, m.index, uly, ring, true), want);
      check_same_bits(rd::ring_rank_attention(c, g, m.index, wuly, ring, true), want);
    }
    CHECK(rd::rank_errors(c, rd::case_reference(c, g, true), m.index, want).max() < 2e-5);
  });
}

TEST_CASE("MPI head bands: distributed_attention over G = 2 .. 4 bands on MpiComm and MpiWindowComm (MHA, GQA groups split across bands, MQA replicated); the in-process unbanded bits") {
  namespace rd = ulysses_ring_demo;
  int W = 0, w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MPI_Comm_rank(MPI_COMM_WORLD, &w);
  for (const std::int64_t Hkv : {std::int64_t{3} * W, std::int64_t{W}, std::int64_t{1}}) {
    rd::RingCase c;
    c.U = W, c.R = 1, c.B = 2, c.D = 8, c.Dv = 6, c.H = 3 * W, c.Hkv = Hkv, c.S = 5 * W + 2, c.causal = true;
    c.layout = RingLayout::contiguous;
    const rd::RingGlobals g(c);
    const rd::RingRankResult want = rd::run_ring_attention(c, g, true)[static_cast<std::size_t>(w)];  // unbanded, on threads
    MpiComm mpi(MPI_COMM_WORLD);
    MpiWindow win(mpi, std::size_t{1} << 22);
    MpiWindowComm wc(mpi, win);
    for (int G = 2; G <= 4; ++G) {
      c.bands = G;
      INFO("H=" << c.H << " Hkv=" << Hkv << " S=" << c.S << " G=" << G);
      const rd::RingRankResult got[2] = {rd::ring_rank_attention(c, g, w, mpi, mpi, true), rd::ring_rank_attention(c, g, w, wc, wc, true)};
      for (const rd::RingRankResult& r : got) {
        check_same_bits(r, want);
      }
    }
  }
}

TEST_CASE("MPI check_ring_config(plan): the ring configuration in the plan's record; a rank whose plan says another causal throws on every rank") {
  int W = 0, w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MPI_Comm_rank(MPI_COMM_WORLD, &w);
  if (W % 2) return;
  const int U = 2, R = W / 2;
  MpiRingMesh m = split_ring(MPI_COMM_WORLD, U, R, U);
  const RingPartition part(8 * R + 1, U, R, RingLayout::zigzag);
  const int j = m.mesh.ring_rank(m.index), u = m.mesh.ulysses_rank(m.index);
  const AttentionSpecs specs = attention_specs<float>(U, {4, 2, 8, 8});
  for (int bad : {-1, W - 1}) {
    PlanOptions o;
    o.ring = RingConfig::of(part, w != bad);
    const Plan plan({U, u}, 1, part.ulysses_partition(j), specs.qkv(), Format::bshd, o);
    MpiComm uly(m.ulysses), ring(m.ring);
    CHECK(ut::code_of([&] { check_ring_config(plan, uly, ring); }) == (bad < 0 ? Errc{} : Errc::plan_mismatch));
    CHECK(plan.agreement_checked() == (bad < 0));
  }
  m.free();
}

TEST_CASE("MPI ring: a peer that leaves mid-rotation (mlx #4060): every survivor's error names it, not whichever rank it waited on") {
  // Ring rank 1 of W (W >= 3) runs step 0 of the first layer, then leaves. The others run two
  // layers: the rank after it times out waiting for its block (naming it), the others hear that
  // rank's notice before their own deadline, and its text names the rank that left.
  int W = 0, r = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  if (W < 3) return;
  const int gone = 1;
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  {
    MpiComm ring(dup, MpiComm::kIntMaxBytes, std::chrono::milliseconds(500));
    const RingPlan rp(RingPartition(4 * W, 1, W, RingLayout::zigzag), Mesh(W, 1, W, W), r, 1,
                      attention_specs<float>(1, AttentionShape{1, 1, 2, 2}), true);  // blocks of 64 bytes
    std::vector<std::byte> b0(rp.kv_buffer_bytes(), std::byte{1}), b1(b0.size());
    RingRotation<MpiComm> rot(ring, rp, RingBuffers().kv(b0, b1), RingProgress::in_start);
    const ut::TimedError e = ut::timed_error_of([&] {
      for (int layer = 0; layer < 2; ++layer)
        for (int s = 0; s < W; ++s) {
          if (r == gone && (layer > 0 || s > 0)) return;  // it leaves
          rot.start(s);
          rot.finish(s);
        }
    });
    if (r != gone) {
      CAPTURE(e.message);
      CHECK((e.code == Errc::timeout || e.code == Errc::aborted));
      CHECK(e.message.find("ranks {" + std::to_string(gone) + "}") != std::string::npos);
      CHECK(e.ms < 500 + 5000);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("MPI distributed_attention: a kernel that throws on one rank mid-ring is a coded error on every rank, at once") {
  // U = 2 x R = W / 2 (W even, R >= 2): world rank W - 1's kernel throws at ring step 1, between
  // the rotation's start() and finish() of the first of two layers (posted in start(): MpiComm's
  // messages in flight). It completes the step, breaks both its groups and throws its error; every
  // other rank throws aborted (its own group's notice, or the one its Ulysses / ring peers pass
  // on), in that layer where what is left of it waits on a broken group, else in the next one,
  // well before the groups' 20 s deadline.
  namespace rd = ulysses_ring_demo;
  int W = 0, w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MPI_Comm_rank(MPI_COMM_WORLD, &w);
  if (W % 2 || W < 4) return;
  rd::RingCase c;
  c.U = 2, c.R = W / 2, c.S = 8 * W + 3, c.H = 4, c.Hkv = 1;
  const rd::RingGlobals g(c);
  MpiRingMesh m = split_ring(MPI_COMM_WORLD, c.U, c.R, c.U);
  {
    MpiComm uly(m.ulysses, MpiComm::kIntMaxBytes, std::chrono::seconds(20)), ring(m.ring, MpiComm::kIntMaxBytes, std::chrono::seconds(20));
    const RingPartition part(c.S, c.U, c.R, c.layout);
    DistributedAttentionOptions opt;
    opt.progress = RingProgress::in_start;
    const DistributedAttentionPlan plan(RingPlan(part, m.mesh, m.index, 1, attention_specs<float>(c.U, {c.H, c.Hkv, c.D}), true), opt);
    const SeqPartition world = part.seq_partition();
    const auto q = rd::ring_shard(c, world, m.index, g.q, c.H, c.D), k = rd::ring_shard(c, world, m.index, g.k, c.Hkv, c.D),
               v = rd::ring_shard(c, world, m.index, g.v, c.Hkv, c.Dv);
    std::vector<float> o(static_cast<std::size_t>(world.local_length(m.index) * c.H * c.Dv));
    std::vector<std::byte> saved(plan.saved_bytes()), ws(plan.forward_workspace_bytes());
    auto kernel = [&](const AttentionStep& st) {
      if (m.index == W - 1 && st.step == 1) throw Error(Errc::invalid_shape, "the engine's kernel failed");
      rd::step_attention(st);
    };
    const ut::TimedError e = ut::timed_error_of([&] {
      for (int layer = 0; layer < 2; ++layer) distributed_attention(plan, uly, ring, QkvIn().q(q).k(k).v(v), ByteSpan(o), kernel, saved, ws);
    });
    CAPTURE(e.message);
    CHECK(e.code == (m.index == W - 1 ? Errc::invalid_shape : Errc::aborted));
    CHECK(e.ms < 10000);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  m.free();
}

int main(int argc, char** argv) {
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &thread_level);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context ctx(argc, argv);
  if (rank != 0) ctx.setOption("minimal", true);
  const int failed = ctx.run();
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any ? 1 : 0;
}

TEST_CASE("MPI packed documents (C20, C21): U x R with per-document zigzag, U x AG and all-gather KV over the world, document-masked; bit-identical to in-process") {
  namespace rd = ulysses_ring_demo;
  int W = 0, w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MPI_Comm_rank(MPI_COMM_WORLD, &w);
  for (int U = 1; U <= W + 1; ++U) {  // U = W + 1: the all-gather-KV group of all W ranks
    const bool ag = U == W + 1;
    if (!ag && W % U) continue;
    const int R = ag ? 1 : W / U;
    for (int mode = 0; mode < 4; ++mode) {  // causal and document-only; the rotation and (R > 1) U x AG
      const bool causal = mode % 2 == 0, uag = mode >= 2;
      if (uag && (ag || R == 1)) continue;
      rd::RingCase c;
      c.U = ag ? W : U, c.R = R, c.B = 1, c.D = 8, c.Dv = 8, c.H = 2 * c.U, c.Hkv = std::max(1, c.U / 2), c.causal = causal;
      c.allgather = ag;
      c.ulysses_allgather = uag;
      c.S = 6 * W + 5;  // a document of 1 token, a placeholder, one of 2W tokens, the rest (uneven)
      c.cu_seqlens = {0, 1, 1, 1 + 2 * W, c.S};
      c.allgather_split = causal ? DocumentSplit::balanced : DocumentSplit::zigzag;
      INFO((ag ? "all-gather KV P=" : "U=") << c.U << (uag ? " x AG" : "") << " R=" << R << " S=" << c.S << (causal ? " causal" : " document-only"));
      const rd::RingGlobals g(c);
      rd::RingRankResult got;
      if (ag) {
        MpiComm world(MPI_COMM_WORLD);
        got = rd::ring_rank_attention(c, g, w, world, world, true);
      } else {
        MpiRingMesh m = split_ring(MPI_COMM_WORLD, U, R, U);
        {
          MpiComm uly(m.ulysses), ring(m.ring);
          got = rd::ring_rank_attention(c, g, m.index, uly, ring, true, RingProgress::in_start);
        }
        CHECK(m.index == w);
        m.free();
      }
      const auto local = rd::run_ring_attention(c, g, true);
      const rd::RingRankResult& want = local[static_cast<std::size_t>(w)];
      check_same_bits(got, want);
      CHECK(rd::rank_errors(c, rd::RingReference(c, g, true), w, got).max() < 2e-5);
    }
  }
}

TEST_CASE("MPI head bands over a ring: G = 2, 3 bands x ring steps on MpiComm and MpiWindowComm (every U x R with R > 1; MHA, GQA split across bands, MQA); the in-process unbanded bits") {
  namespace rd = ulysses_ring_demo;
  int W = 0, w = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MPI_Comm_rank(MPI_COMM_WORLD, &w);
  for (int U = 1; U < W; ++U) {
    if (W % U) continue;
    const int R = W / U;
    MpiRingMesh m = split_ring(MPI_COMM_WORLD, U, R, U);
    for (const int Hkv_u : {3, 1}) {  // (H_u = 3 query heads: the bands of G = 2 split a GQA group of 3 where Hkv_u = 1)
      rd::RingCase c;
      c.U = U, c.R = R, c.B = 2, c.D = 8, c.Dv = 6, c.H = 3 * U, c.Hkv = Hkv_u * U, c.S = 4 * R * U + 3, c.causal = true;
      c.layout = RingLayout::zigzag;
      const rd::RingGlobals g(c);
      const rd::RingRankResult want = rd::run_ring_attention(c, g, true)[static_cast<std::size_t>(m.index)];  // unbanded, on threads
      for (int G = 2; G <= 3; ++G) {
        c.bands = G;
        INFO("U=" << U << " R=" << R << " H=" << c.H << " Hkv=" << c.Hkv << " G=" << G);
        std::vector<rd::RingRankResult> got;
        {
          MpiComm uly(m.ulysses), ring(m.ring);
          got.push_back(rd::ring_rank_attention(c, g, m.index, uly, ring, true, RingProgress::in_start));
          MpiWindow uw(uly, std::size_t{1} << 20), rw(ring, std::size_t{1} << 20);
          MpiWindowComm uwc(uly, uw), rwc(ring, rw);
          got.push_back(rd::ring_rank_attention(c, g, m.index, uwc, rwc, true));
        }
        for (const rd::RingRankResult& r : got) {
          check_same_bits(r, want);
        }
      }
    }
    m.free();
  }
}
