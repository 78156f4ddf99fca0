// SPDX-License-Identifier: Apache-2.0
// The ring rotation (ring/rotation.hpp) in-process: bit-exact, every rank sees every block once in
// the documented order (step s: ring rank (r − s) mod R), P = U × R up to 16, both progress modes,
// uneven block sizes; the backward's accumulators come home with every ring rank's contribution in
// step order; a misconfigured hybrid (bug case C14) is a coded error.
#include <doctest/doctest.h>
#include <ulysses/comm/local.hpp>
#include <ulysses/ring/plan.hpp>
#include <ulysses/ring/rotation.hpp>

#include <algorithm>
#include <chrono>
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

TEST_CASE("forward rotation: every block once, in order, bit-exact; P = U x R up to 16; both progress modes, copied and zero-copy") {
  for (RingAccess ac : {RingAccess::copy, RingAccess::zero_copy})
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
          RingRotation<LocalGroup::Comm> rot(c, bytes, RingBuffers().kv(b0, b1), pr, 1, ac);
          if (rot.access() != ac) ++bad[static_cast<std::size_t>(j * U + u)];
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
              if (ac == RingAccess::zero_copy && s > 0 && rot.block(s) == b0.data()) ++bad[static_cast<std::size_t>(j * U + u)];
              ++seen[static_cast<std::size_t>(src)];
              rot.finish(s);
            }
          }
          for (int x : seen)
            if (x != 2) ++bad[static_cast<std::size_t>(j * U + u)];
          if (ac == RingAccess::zero_copy && std::memcmp(b1.data(), std::vector<std::byte>(cap).data(), cap) != 0)
            ++bad[static_cast<std::size_t>(j * U + u)];  // zero-copy: nothing was copied into buffer 1
        });
        for (int x : bad) CHECK(x == 0);
      }
}

TEST_CASE("backward rotation: dk|dv accumulators travel with their block and come home summed in step order; copied and zero-copy") {
  for (RingAccess ac : {RingAccess::copy, RingAccess::zero_copy})
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
        RingGradRotation<LocalGroup::Comm> rot(c, kvb, gb, RingBuffers().kv(k0, k1).grad(g0, g1), pr, 1, ac);
        for (int s = 0; s < R; ++s) {
          rot.start(s);
          const int src = rot.source(s);
          const auto want = block_of(src, u, 16);
          if (std::memcmp(rot.block(s), want.data(), 16) != 0) ++bad[static_cast<std::size_t>(j * U + u)];
          rot.finish(s);
          float* g = rot.grad<float>(s);
          for (std::size_t e = 0; e < n; ++e) g[e] = s == 0 ? contrib(j, src, e) : g[e] + contrib(j, src, e);
        }
        const float* home = rot.home<float>();
        if (ac == RingAccess::zero_copy && home != g0.data()) ++bad[static_cast<std::size_t>(j * U + u)];  // added in place, in its owner's g0
        for (std::size_t e = 0; e < n; ++e) {
          float want = contrib(j, j, e);  // ((c_j + c_{j+1}) + c_{j+2}) + ...
          for (int s = 1; s < R; ++s) want = want + contrib((j + s) % R, j, e);
          if (std::memcmp(&want, &home[e], sizeof(float)) != 0) ++bad[static_cast<std::size_t>(j * U + u)];
        }
      });
      for (int x : bad) CHECK(x == 0);
    }
}

TEST_CASE("the wire split: blocks of any size cut into 1 .. 7 messages arrive whole, forward and backward; with and without work between start and finish") {
  CHECK(ring_piece_begin(10000, 3, 0) == 0);
  CHECK(ring_piece_begin(10000, 3, 1) == 4096);  // ⌈10000/3⌉ = 3334, rounded up to 4 KiB
  CHECK(ring_piece_begin(10000, 3, 2) == 8192);  // ⌈20000/3⌉ = 6667
  CHECK(ring_piece_begin(10000, 3, 3) == 10000);
  CHECK(ring_piece_begin(100, 4, 1) == 100);      // a small block: one piece, the others empty
  CHECK(ring_piece_begin(8192, 2, 1) == 4096);    // k and v of a block whose halves are pages
  const int U = 1, R = 3;
  for (int messages : {1, 2, 3, 7})
    for (RingProgress pr : {RingProgress::thread, RingProgress::in_start})
      for (bool work : {false, true}) {
        CAPTURE(messages);
        std::vector<std::size_t> bytes{5 * 4096 + 17, 3 * 4096, 100};
        std::vector<std::size_t> grads{4096 * 2, 4096 * 2 + 8, 64};
        std::vector<int> bad(static_cast<std::size_t>(R), 0);
        on_rings(U, R, [&](LocalGroup::Comm& c, int j, int u) {
          std::vector<std::byte> b0(bytes[0]), b1(bytes[0]), g0(grads[1]), g1(grads[1]);
          const auto own = block_of(j, u, bytes[static_cast<std::size_t>(j)]);
          std::memcpy(b0.data(), own.data(), own.size());
          RingRotation<LocalGroup::Comm> rot(c, bytes, RingBuffers().kv(b0, b1), pr, messages);
          for (int s = 0; s < R; ++s) {
            rot.start(s);
            if (work) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the step's attention
            const auto want = block_of(rot.source(s), u, rot.block_bytes(s));
            if (std::memcmp(rot.block(s), want.data(), want.size()) != 0) ++bad[static_cast<std::size_t>(j)];
            rot.finish(s);
          }
          std::memcpy(b0.data(), own.data(), own.size());
          RingGradRotation<LocalGroup::Comm> back(c, bytes, grads, RingBuffers().kv(b0, b1).grad(g0, g1), pr, messages);
          for (int s = 0; s < R; ++s) {
            back.start(s);
            back.finish(s);
            const int src = back.source(s);
            const auto want = block_of(src, u, bytes[static_cast<std::size_t>(src)]);
            if (std::memcmp(back.block(s), want.data(), want.size()) != 0) ++bad[static_cast<std::size_t>(j)];
            std::byte* g = back.grad(s);
            for (std::size_t e = 0; e < grads[static_cast<std::size_t>(src)]; ++e)  // each ring rank adds its code: a byte sum
              g[e] = static_cast<std::byte>((s == 0 ? 0 : static_cast<int>(g[e])) + j + 1);
          }
          const std::byte* home = back.home();
          const int total = R * (R + 1) / 2;  // 1 + 2 + 3: every ring rank's contribution to this rank's block
          for (std::size_t e = 0; e < grads[static_cast<std::size_t>(j)]; ++e)
            if (home[e] != static_cast<std::byte>(total)) ++bad[static_cast<std::size_t>(j)];
        });
        for (int x : bad) CHECK(x == 0);
      }
  std::vector<std::size_t> one{64};
  std::vector<std::byte> b0(64), b1(64);
  LocalGroup g(1);
  LocalGroup::Comm c = g.comm(0);
  CHECK(ut::code_of([&] { RingRotation<LocalGroup::Comm> r(c, one, RingBuffers().kv(b0, b1), RingProgress::in_start, 0); }) == Errc::invalid_shape);
  CHECK(ut::code_of([&] { RingRotation<LocalGroup::Comm> r(c, one, RingBuffers().kv(b0, b1), RingProgress::in_start, kMaxRingMessages + 1); }) ==
        Errc::invalid_shape);
}

TEST_CASE("misuse of a rotation is a coded error on every rank: finish() of no started step, overlapping buffers, a bad split on one rank") {
  std::vector<std::size_t> one{64}, two{64, 64};
  std::vector<std::byte> b(256);
  LocalGroup g(1);
  LocalGroup::Comm c = g.comm(0);
  {
    RingRotation<LocalGroup::Comm> r(c, one, RingBuffers().kv(b.data(), 64, b.data() + 64, 64), RingProgress::in_start);
    CHECK(ut::code_of([&] { r.finish(0); }) == Errc::invalid_group);  // nothing started
    r.start(0);
    r.finish(0);
    CHECK(ut::code_of([&] { r.finish(0); }) == Errc::invalid_group);  // finished already
  }
  for (int R : {2, 3}) {  // one rank's mistake: that rank's own error, the others aborted at once (not at a deadline)
    std::vector<Errc> code(static_cast<std::size_t>(R));
    LocalGroup ring(R, std::chrono::seconds(60));
    const auto t0 = std::chrono::steady_clock::now();
    ring.spawn([&](LocalGroup::Comm& rc) {
      const int r = rc.rank();
      std::vector<std::byte> mine(256);
      std::vector<std::size_t> sizes(static_cast<std::size_t>(R), 64);
      code[static_cast<std::size_t>(r)] = ut::code_of([&] {
        const RingBuffers buffers = r == 1 ? RingBuffers().kv(mine.data(), 64, mine.data() + 32, 64)  // overlapping
                                           : RingBuffers().kv(mine.data(), 64, mine.data() + 128, 64);
        RingRotation<LocalGroup::Comm> rot(rc, sizes, buffers, RingProgress::in_start, r == R - 1 && R == 3 ? 0 : 1);
        for (int s = 0; s < R; ++s) rot.start(s), rot.finish(s);
      });
    });
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));  // told at once: the group's deadline is 60 s
    CHECK(code[1] == Errc::invalid_shape);                       // the overlap
    if (R == 3) CHECK(code[2] == Errc::invalid_shape);           // messages = 0
    CHECK(code[0] == Errc::aborted);
  }
}

TEST_CASE("C14: a hybrid asked for as R = 2 whose ring communicator has one rank throws comm_mismatch") {
  LocalGroup one(1);
  LocalGroup::Comm c = one.comm(0);
  std::vector<std::byte> b0(16), b1(16);
  const auto e = ut::error_of([&] { RingRotation<LocalGroup::Comm> rot(c, {16, 16}, RingBuffers().kv(b0.data(), 16, b1.data(), 16)); });
  CHECK(e.first == Errc::comm_mismatch);
  CHECK(e.second.find("rank 0 of 1; RingRotation (the ring degree R) was made for P=2") != std::string::npos);
  CHECK(e.second.find("CP=1") != std::string::npos);
  CHECK(ut::code_of([&] {
          RingGradRotation<LocalGroup::Comm> rot(c, {16, 16}, {16, 16}, RingBuffers().kv(b0.data(), 16, b1.data(), 16).grad(b0.data(), 16, b1.data(), 16));
        }) == Errc::comm_mismatch);
  CHECK(ut::code_of([&] { RingRotation<LocalGroup::Comm> rot(c, {32}, RingBuffers().kv(b0.data(), 16, b1.data(), 16)); }) == Errc::buffer_too_small);
  RingRotation<LocalGroup::Comm> rot(c, {16}, RingBuffers().kv(b0.data(), 16, nullptr, 16));  // R = 1: one buffer suffices
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
        RingRotation<LocalGroup::Comm> rot(c, {8, 8, 8}, RingBuffers().kv(b0.data(), 8, b1.data(), 8));
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
    RingRotation<ThreadedComm> rot(c, {8, 8, 8}, RingBuffers().kv(b0.data(), 8, b1.data(), 8));
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

TEST_CASE("RingPlan: the schedule, the block sizes, the merge shape and the Ulysses plans of one rank; the rotation over it, typed") {
  const AttentionShape shape{4, 2, 3, 5};  // H, Hkv, D, Dv
  // (causal, layout): zigzag causal, contiguous non-causal, and contiguous causal, whose block j
  // stops after step R − 1 − j (RingPlan::last_use(): no message past it).
  for (auto [causal, layout] : {std::pair{true, RingLayout::zigzag}, std::pair{false, RingLayout::contiguous}, std::pair{true, RingLayout::contiguous}})
    for (int U : {1, 2})
      for (int R : {1, 2, 3}) {
        CAPTURE(causal);
        CAPTURE(to_string(layout));
        CAPTURE(U);
        CAPTURE(R);
        const RingPartition part(13, U, R, layout);
        const Mesh mesh(U * R, U, R, U * R);
        const AttentionSpecs specs = attention_specs<float>(U, shape, HeadPolicy::balanced);
        std::vector<int> bad(static_cast<std::size_t>(U * R), 0);
        on_rings(U, R, [&](LocalGroup::Comm& c, int j, int u) {
          const int w = part.world_rank(j, u);
          int& b = bad[static_cast<std::size_t>(w)];
          const RingPlan rp(part, mesh, w, 2, specs, causal);
          b += rp.ring_rank() != j || rp.ulysses_rank() != u || rp.seq_rank() != w || rp.steps() != R || rp.tokens() != part.ring_length(j);
          b += !rp.qkv_plan().options().ring || rp.qkv_plan().options().ring->seq_len != 13 || rp.out_plan().num_tensors() != 1;
          b += !(rp.qkv_plan().seq() == part.ulysses_partition(j));
          const RingMergeShape ms = rp.merge_shape();
          b += ms.B != 2 || ms.S_q != part.ring_length(j) || ms.H != specs.query_heads.count(u) || ms.Dv != 5;
          const std::vector<RingWork> want = ring_schedule(part, j, causal);
          for (int s = 0; s < R; ++s) {
            const RingWork& x = rp.work(s);
            const auto sz = static_cast<std::size_t>(s);
            b += x.source != want[sz].source || x.q_begin != want[sz].q_begin || x.q_len != want[sz].q_len || x.kv_len != want[sz].kv_len ||
                 x.mask != want[sz].mask;
          }
          std::size_t largest = 0;
          for (int jj = 0; jj < R; ++jj) {
            const std::size_t n = RingKvBlock{2, part.ring_length(jj), specs.kv_heads.count(u), 3, 5, sizeof(float)}.bytes();
            b += rp.block_bytes()[static_cast<std::size_t>(jj)] != n || rp.grad_bytes()[static_cast<std::size_t>(jj)] != n;
            largest = std::max(largest, n);
          }
          b += rp.kv_buffer_bytes() != largest || rp.grad_buffer_bytes() != largest;
          // The rotation over the plan: every block in order, bit-exact, k and v where the plan
          // says, up to its last use; past it no message: the receive buffer keeps what it held.
          std::vector<float> kv0(rp.kv_buffer_bytes() / sizeof(float)), kv1(kv0.size());
          RingRotation<LocalGroup::Comm> rot(c, rp, RingBuffers().kv(kv0, kv1));
          const RingKvBlock& mine = rp.kv_block_of(j);
          for (std::int64_t e = 0; e < mine.k_elems() + mine.v_elems(); ++e) kv0[static_cast<std::size_t>(e)] = static_cast<float>(1000 * j + e);
          for (int s = 0; s < R; ++s) {
            const bool attended_later = s <= rp.last_use(rot.source(s));
            b += rot.carried(s) != (s == 0 || attended_later);
            b += !rp.work(s).empty() && !rot.carried(s);  // a step with work always has its block
            std::vector<float>& next = s % 2 ? kv0 : kv1;  // step s + 1's buffer: marked before the step
            std::fill(next.begin(), next.end(), -1.0f);
            rot.start(s);
            const RingKvView<float> kv = rot.kv<float>(s);
            const RingKvBlock& blk = rp.kv_block(s);
            b += kv.v - kv.k != blk.k_elems() || blk.L != part.ring_length(rot.source(s));
            if (rot.carried(s))
              for (std::int64_t e = 0; e < blk.k_elems() + blk.v_elems(); ++e) b += kv.k[e] != static_cast<float>(1000 * rot.source(s) + e);
            rot.finish(s);
            if (s + 1 < R && !rot.carried(s + 1)) b += std::count(next.begin(), next.end(), -1.0f) != static_cast<std::ptrdiff_t>(next.size());
          }
          if (causal && layout == RingLayout::contiguous)  // block j travels R − 1 − j hops
            for (int jj = 0; jj < R; ++jj) b += rp.last_use(jj) != R - 1 - jj;
          // A rotation of sizes given with the plan's last uses (a head band's, attention/detail/band_ring.hpp) carries the same steps.
          const RingRotation<LocalGroup::Comm> sized(c, rp.block_bytes(), RingBuffers().kv(kv0, kv1), RingProgress::automatic, 1, RingAccess::copy,
                                                     rp.last_uses());
          for (int s = 0; s < R; ++s) b += sized.carried(s) != rot.carried(s);
          b += ut::code_of([&] { (void)rot.kv<double>(0); }) != Errc::tensor_mismatch;
        });
        for (int x : bad) CHECK(x == 0);
      }
}

TEST_CASE("RingPlan and the rotation over it: coded errors") {
  const RingPartition part(12, 2, 2, RingLayout::zigzag);
  const AttentionSpecs specs = attention_specs<float>(2, AttentionShape{4, 2, 8, 8});
  CHECK(ut::code_of([&] { RingPlan(part, Mesh(4, 4, 1, 4), 0, 1, specs, true); }) == Errc::invalid_mesh);  // U, R not the partition's
  CHECK(ut::code_of([&] { RingPlan(part, Mesh(4, 2, 2, 4), 0, 1, attention_specs<float>(4, AttentionShape{4, 2, 8, 8}), true); }) ==
        Errc::invalid_group);  // specs made for another U
  CHECK(ut::code_of([&] { RingPlan(part, Mesh(4, 2, 2, 4), 4, 1, specs, true); }) == Errc::invalid_group);  // rank outside the mesh
  CHECK(ut::code_of([&] { RingPlan(part, Mesh(4, 2, 2, 4), 0, 0, specs, true); }) == Errc::invalid_shape);  // B = 0
  CHECK(ut::code_of([&] { (void)RingPlan(part, Mesh(4, 2, 2, 4), 0, 1, specs, true).work(2); }) == Errc::invalid_group);
  // Mesh order: under ring_inner, world rank 1 is ring rank 1 of Ulysses rank 0.
  const RingPlan inner(part, Mesh(4, 2, 2, 4, RingOrder::ring_inner), 1, 1, specs, true);
  CHECK(inner.ring_rank() == 1);
  CHECK(inner.ulysses_rank() == 0);
  CHECK(inner.seq_rank() == 2);
  // A ring communicator of the wrong size (C14) and short or missing buffers.
  const RingPlan rp(part, Mesh(4, 2, 2, 4), 0, 1, specs, true);
  LocalGroup one(1);
  LocalGroup::Comm c = one.comm(0);
  std::vector<float> a(rp.kv_buffer_bytes() / sizeof(float)), g(rp.grad_buffer_bytes() / sizeof(float));
  CHECK(ut::code_of([&] { RingRotation<LocalGroup::Comm> rot(c, rp, RingBuffers().kv(a, a)); }) == Errc::comm_mismatch);
  std::vector<Errc> got(4, Errc{});
  for (int grad = 0; grad < 2; ++grad) {
    LocalGroup two(2);  // a ring of the two ring ranks of Ulysses rank 0 (world ranks 0 and 2)
    two.spawn([&](LocalGroup::Comm& cc) {
      const RingPlan mine(part, Mesh(4, 2, 2, 4), 2 * cc.rank(), 1, specs, true);
      std::vector<float> x(a.size()), y(a.size()), gx(g.size()), z(2);
      got[static_cast<std::size_t>(2 * grad + cc.rank())] = ut::code_of([&] {
        if (grad) RingGradRotation<LocalGroup::Comm> rot(cc, mine, RingBuffers().kv(x, y).grad(gx, z));  // a short accumulator
        else RingRotation<LocalGroup::Comm> rot(cc, mine, RingBuffers().kv(x, z));                       // a short kv buffer
      });
    });
  }
  for (Errc e : got) CHECK(e == Errc::buffer_too_small);
  for (int grad = 0; grad < 2; ++grad) {  // last uses neither empty nor one per ring rank
    LocalGroup two(2);
    two.spawn([&](LocalGroup::Comm& cc) {
      std::vector<float> x(a.size()), y(a.size()), gx(g.size()), gy(g.size());
      const std::vector<int> three(3, 1);
      got[static_cast<std::size_t>(2 * grad + cc.rank())] = ut::code_of([&] {
        if (grad) RingGradRotation<LocalGroup::Comm> rot(cc, rp.block_bytes(), rp.grad_bytes(), RingBuffers().kv(x, y).grad(gx, gy),
                                                         RingProgress::automatic, 1, RingAccess::copy, three);
        else RingRotation<LocalGroup::Comm> rot(cc, rp.block_bytes(), RingBuffers().kv(x, y), RingProgress::automatic, 1, RingAccess::copy, three);
      });
    });
  }
  for (Errc e : got) CHECK(e == Errc::invalid_shape);
  CHECK(ut::code_of([&] { RingRotation<LocalGroup::Comm> rot(c, rp, RingBuffers().kv(a.data(), a.size() * 4, nullptr, 0)); }) ==
        Errc::comm_mismatch);  // the size check comes first
}

TEST_CASE("zero-copy: ranks that mix RingAccess::copy and zero_copy get a coded error on every rank, never a hang or a wrong block") {
  for (int R : {2, 3, 4})
    for (int odd : {0, R - 1}) {  // the rank that runs the other access
      LocalGroup g(R, std::chrono::seconds(5));
      std::vector<std::string> errs(static_cast<std::size_t>(R));
      std::vector<std::thread> th;
      for (int j = 0; j < R; ++j)
        th.emplace_back([&, j] {
          std::vector<std::byte> b0(16), b1(16);
          try {
            LocalGroup::Comm c = g.comm(j);
            RingRotation<LocalGroup::Comm> rot(c, std::vector<std::size_t>(static_cast<std::size_t>(R), 16), RingBuffers().kv(b0, b1),
                                               RingProgress::in_start, 1, j == odd ? RingAccess::zero_copy : RingAccess::copy);
            for (int s = 0; s < R; ++s) rot.start(s), rot.finish(s);
          } catch (const Error& e) {
            errs[static_cast<std::size_t>(j)] = std::string(to_string(e.code())) + ": " + e.what();
          }
        });
      for (auto& t : th) t.join();
      for (int j = 0; j < R; ++j) {
        INFO("R=" << R << " odd=" << odd << " rank " << j << ": " << errs[static_cast<std::size_t>(j)]);
        CHECK(errs[static_cast<std::size_t>(j)] != "");
        CHECK(errs[static_cast<std::size_t>(j)].find("timeout") == std::string::npos);
      }
    }
}
