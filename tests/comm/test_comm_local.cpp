// SPDX-License-Identifier: Apache-2.0
// comm/local.hpp: the in-process group's all-to-all-v, zero-byte pairs, timeouts and aborts; C17
// (a rank with no tokens) in-process on every transport, the peer copy pushed and pulled.
#include <doctest/doctest.h>
#include <ulysses/comm/local.hpp>

#include "cases.hpp"
#include "expect_error.hpp"
#include "messages.hpp"

#include <atomic>
#include <chrono>
#include <numeric>
#include <thread>
#include <vector>

using namespace ulysses;

TEST_CASE("alltoallv moves chunk (i -> j) of i bytes+j to rank j, with zero-byte pairs") {
  // Rank i sends i+j bytes to rank j (0 for i = j = 0), each byte = 16*i + j.
  const int P = 4;
  LocalGroup g(P);
  std::vector<std::vector<unsigned char>> got(P);
  g.spawn([&](LocalGroup::Comm& c) {
    const int i = c.rank();
    std::vector<std::size_t> sb(P), so(P), rb(P), ro(P);
    std::size_t st = 0, rt = 0;
    for (int j = 0; j < P; ++j) sb[j] = i + j, so[j] = st, st += sb[j], rb[j] = j + i, ro[j] = rt, rt += rb[j];
    std::vector<std::byte> send(st), recv(rt);
    for (int j = 0; j < P; ++j)
      for (std::size_t k = 0; k < sb[j]; ++k) send[so[j] + k] = std::byte(16 * i + j);
    c.alltoallv(send.data(), sb.data(), so.data(), recv.data(), rb.data(), ro.data());
    for (auto b : recv) got[i].push_back(static_cast<unsigned char>(b));
  });
  // Rank 1 receives 1 byte from 0 (0x01), 2 from 1 (0x11), 3 from 2 (0x21), 4 from 3 (0x31).
  CHECK(got[1] == std::vector<unsigned char>{0x01, 0x11, 0x11, 0x21, 0x21, 0x21, 0x31, 0x31, 0x31, 0x31});
  CHECK(got[0] == std::vector<unsigned char>{0x10, 0x20, 0x20, 0x30, 0x30, 0x30});
}

TEST_CASE("a rank that never arrives makes the others time out instead of hanging") {
  LocalGroup g(3, std::chrono::milliseconds(200));
  try {
    g.spawn([&](LocalGroup::Comm& c) {
      if (c.rank() != 2) c.barrier();
    });
    FAIL("expected a timeout");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::timeout);
  }
}

TEST_CASE("a rank that throws aborts the others; spawn() rethrows the root cause") {
  LocalGroup g(3);
  try {
    g.spawn([&](LocalGroup::Comm& c) {
      if (c.rank() == 1) throw Error(Errc::invalid_shape, "root cause");
      c.barrier();
      c.barrier();
    });
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_shape);
  }
  // The group stays failed.
  auto c0 = g.comm(0);
  CHECK_THROWS_AS(c0.barrier(), Error);
}

TEST_CASE("mismatched byte counts between ranks are reported, not silently copied") {
  LocalGroup g(2);
  try {
    g.spawn([&](LocalGroup::Comm& c) {
      std::vector<std::size_t> sb{0, 8}, so{0, 0}, rb{0, 0}, ro{0, 0};
      if (c.rank() == 1) sb = {4, 0}, rb = {8, 0};  // rank 1 expects 8 from 0 but 0 sends 8... and 1 sends 4 to 0 which expects 0
      std::vector<std::byte> buf(16);
      c.alltoallv(buf.data(), sb.data(), so.data(), buf.data() + 8, rb.data(), ro.data());
    });
    FAIL("expected plan_mismatch");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::plan_mismatch);
  }
}

TEST_CASE("comm(rank) checks the rank; size 0 is rejected") {
  LocalGroup g(2);
  CHECK_THROWS_AS(g.comm(2), Error);
  try {
    LocalGroup bad(0);
    FAIL("expected invalid_group");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_group);
  }
}

TEST_CASE("ranks entering different collectives fail with plan_mismatch instead of crashing") {
  LocalGroup g(2);
  std::vector<Errc> code(2, Errc{});
  g.spawn([&](LocalGroup::Comm& c) {
    try {
      if (c.rank() == 0) {
        std::uint64_t x = 1, all[2];
        c.allgather(&x, sizeof x, all);
      } else {
        std::vector<std::size_t> z(2, 0);
        std::byte b[1];
        c.alltoallv(b, z.data(), z.data(), b, z.data(), z.data());
      }
    } catch (const Error& e) {
      code[c.rank()] = e.code();
    }
  });
  CHECK(code[0] == Errc::plan_mismatch);
  CHECK(code[1] == Errc::plan_mismatch);
}

TEST_CASE("a rank in barrier() while the others exchange: every rank gets plan_mismatch at once, none waits out the timeout") {
  // The barrier() caller used to pass (it meets the others' first barrier), while they found the
  // mismatch and then waited the whole timeout for it to finish a copy phase it never entered. A
  // timeout of 10 minutes: Errc::timeout here would mean a rank waited it out (ctest's limit ends
  // the test first).
  for (int skipper : {0, 3}) {
    LocalGroup g(4, std::chrono::minutes(10));
    std::vector<Errc> code(4, Errc{});
    std::vector<std::string> what(4);
    g.spawn([&](LocalGroup::Comm& c) {
      try {
        if (c.rank() == skipper) {
          c.barrier();
        } else {
          std::uint64_t x = 1, all[4];
          c.allgather(&x, sizeof x, all);
        }
      } catch (const Error& e) {
        code[static_cast<std::size_t>(c.rank())] = e.code();
        what[static_cast<std::size_t>(c.rank())] = e.what();
      }
    });
    CAPTURE(skipper);
    for (int r = 0; r < 4; ++r) {
      CAPTURE(r);
      CHECK(code[static_cast<std::size_t>(r)] == Errc::plan_mismatch);
      CHECK(what[static_cast<std::size_t>(r)].find("rank " + std::to_string(skipper) + " barrier") != std::string::npos);
    }
  }
}

TEST_CASE("allgather puts rank p's block at p * bytes") {
  LocalGroup g(3);
  std::vector<std::vector<std::uint32_t>> got(3, std::vector<std::uint32_t>(6));
  g.spawn([&](LocalGroup::Comm& c) {
    const std::uint32_t mine[2] = {10u * c.rank(), 10u * c.rank() + 1};
    c.allgather(mine, sizeof mine, got[c.rank()].data());
  });
  for (int r = 0; r < 3; ++r) CHECK(got[r] == std::vector<std::uint32_t>{0, 1, 10, 11, 20, 21});
}

TEST_CASE("exchange_messages: the k-th message from rank i to rank j lands in j's k-th receive from i") {
  // Rank i sends rank j two messages: (i + j + 1) bytes of 16*i + j, then 1 byte of 0xF0 + i.
  const int P = 3;
  LocalGroup g(P);
  std::vector<std::vector<unsigned char>> got(P);
  g.spawn([&](LocalGroup::Comm& c) {
    const int i = c.rank();
    ut::MessagePattern m(P, i);
    c.exchange_messages(m.send.data(), m.send.size(), m.recv.data(), m.recv.size());
    for (auto& b : m.rbuf)
      for (auto x : b) got[static_cast<std::size_t>(i)].push_back(static_cast<unsigned char>(x));
  });
  // Rank 1 receives from 0: 2 bytes 0x01 then 0xF0; from 2: 4 bytes 0x21 then 0xF2.
  CHECK(got[1] == std::vector<unsigned char>{0x01, 0x01, 0xF0, 0x21, 0x21, 0x21, 0x21, 0xF2});
  CHECK(got[0] == std::vector<unsigned char>{0x10, 0x10, 0xF1, 0x20, 0x20, 0x20, 0xF2});
}

TEST_CASE("exchange_messages: other counts or sizes than the receiver expects are plan_mismatch") {
  for (int variant = 0; variant < 4; ++variant) {
    CAPTURE(variant);
    LocalGroup g(2, std::chrono::seconds(20));
    try {
      g.spawn([&](LocalGroup::Comm& c) {
        std::byte a[8] = {}, b[8] = {};  // this rank's own buffers (a peer reads a until the closing barrier)
        std::vector<Message> send{{1 - c.rank(), a, 4}}, recv{{1 - c.rank(), b, 4}};
        if (c.rank() == 1) {
          if (variant == 0) recv[0].bytes = 8;                      // expects more bytes
          if (variant == 1) send.push_back({0, a + 4, 4});          // sends an extra message
          if (variant == 2) recv.push_back({0, b + 4, 4});          // expects an extra message
          if (variant == 3) send[0].peer = 5;                       // to a rank outside the group
        }
        c.exchange_messages(send.data(), send.size(), recv.data(), recv.size());
      });
      FAIL("expected plan_mismatch");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::plan_mismatch);
    }
  }
}

TEST_CASE("failure model: a rank that never enters the exchange; the others time out within the deadline naming it, then abort at once") {
  // Rank 2 enters only after ranks 0 and 1 gave up: it gets the same verdict (timeout) at once;
  // every later call of every rank throws aborted at once, saying why.
  const std::chrono::milliseconds deadline(200);
  const double margin_ms = 1000;  // a loaded machine: scheduling delays, not a speed target
  LocalGroup g(3, deadline);
  CHECK(g.timeout() == deadline);
  std::vector<ut::TimedError> first(3), next(3);
  std::atomic<int> gave_up{0};
  g.spawn([&](LocalGroup::Comm& c) {
    const int r = c.rank();
    ut::MessagePattern m(3, r);
    auto exchange = [&] { c.exchange_messages(m.send.data(), m.send.size(), m.recv.data(), m.recv.size()); };
    if (r == 2)  // bounded: the others give up after the deadline
      while (gave_up.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    first[static_cast<std::size_t>(r)] = ut::timed_error_of(exchange);
    if (r != 2) ++gave_up;
    next[static_cast<std::size_t>(r)] = ut::timed_error_of(exchange);
  });
  double slowest = 0;
  for (int r = 0; r < 3; ++r) {
    const ut::TimedError& f = first[static_cast<std::size_t>(r)];
    const ut::TimedError& n = next[static_cast<std::size_t>(r)];
    CAPTURE(r);
    CAPTURE(f.message);
    CAPTURE(n.message);
    CHECK(f.code == Errc::timeout);
    CHECK(f.message.find("ranks {2} did not arrive") != std::string::npos);
    CHECK(f.ms < deadline.count() + margin_ms);
    if (r != 2) slowest = std::max(slowest, f.ms);
    if (r == 2) CHECK(f.ms < 100);  // it arrived after the timeout: told at once
    CHECK(n.code == Errc::aborted);
    CHECK(n.ms < 100);
    CHECK(n.message.find("broken by an earlier failure") != std::string::npos);
    CHECK(n.message.find("ranks {2} did not arrive") != std::string::npos);  // why: the first failure's message
  }
  CHECK(slowest >= deadline.count() * 0.95);  // the first to give up waited its whole deadline
  MESSAGE("timeout after " << first[0].ms << " / " << first[1].ms << " ms (deadline " << deadline.count() << " ms), late rank "
                           << first[2].ms << " ms; then aborted after " << next[0].ms << " ms");
}

TEST_CASE("failure model: a rank that throws aborts the others, whose errors say why; the group stays broken") {
  LocalGroup g(2);
  std::string why;
  try {
    g.spawn([&](LocalGroup::Comm& c) {
      if (c.rank() == 1) throw Error(Errc::invalid_shape, "root cause");
      auto [code, msg] = ut::error_of([&] { c.barrier(); });
      if (code == Errc::aborted) why = msg;
    });
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_shape);
  }
  CHECK(why.find("rank 1 threw: ulysses: invalid_shape: root cause") != std::string::npos);
  auto c0 = g.comm(0);
  auto [code, msg] = ut::error_of([&] { c0.barrier(); });
  CHECK(code == Errc::aborted);
  CHECK(msg.find("root cause") != std::string::npos);
}

TEST_CASE("C17 in-process: a rank with no tokens ({2,0} at P=2, {2,2,2,0} at P=4, D=1024): seq->head then head->seq exact on every transport, the peer copy pushed and pulled") {
  for (int P : {2, 4}) {
    ut::Case c = ut::c17_case(P);
    for (Path path : ut::host_paths<LocalGroup::Comm>())
      for (bool pull : {false, true}) {
        c.path = path;
        CAPTURE(c.name);
        CAPTURE(to_string(path));
        CAPTURE(pull);
        LocalGroup g(P, std::chrono::seconds(60));
        std::vector<std::string> res(static_cast<std::size_t>(P));
        g.spawn([&](LocalGroup::Comm& comm) {
          res[static_cast<std::size_t>(comm.rank())] = ut::with_direct_form(comm, pull, [&](auto& cm) { return ut::run_case<float>(cm, c); });
        });
        for (const std::string& r : res) CHECK(r == "");
      }
  }
}

namespace {

/// Runs seq->head then head->seq of case c (forced Path::direct) on `comm` with its own plan and
/// buffers, and returns the peer copy's lists kept in the communicator's ExchangeState (or none).
template <class Comm>
std::pair<bool, PeerCopyLists> c17_lists(Comm& comm, ut::Case c) {
  c.path = Path::direct;
  const Plan plan = ut::plan_of<float>(c, comm.rank());
  std::vector<std::vector<float>> x(3), y(3), z(3);
  TensorList<ConstByteSpan> in, mid_c;
  TensorList<ByteSpan> mid, back;
  for (std::size_t t = 0; t < 3; ++t) {
    x[t].assign(plan.seq_bytes(static_cast<int>(t)) / 4, 1.0f);
    y[t].assign(plan.head_bytes(static_cast<int>(t)) / 4, 0.0f);
    z[t].assign(plan.seq_bytes(static_cast<int>(t)) / 4, 0.0f);
    in.push_back(x[t]), mid.push_back(y[t]), mid_c.push_back(y[t]), back.push_back(z[t]);
  }
  HostExecutor ex;
  redistribute(plan, Direction::seq_to_head, comm, ex, in, mid, {});
  redistribute(plan, Direction::head_to_seq, comm, ex, mid_c, back, {});
  for (std::size_t t = 0; t < 3; ++t) CHECK(z[t] == x[t]);  // (no replicated head at P=2)
  const PeerCopyLists* l = comm.exchange_state().peer_copy(plan.id());
  std::pair<bool, PeerCopyLists> found;
  found.first = l != nullptr;
  if (l) found.second = *l;
  return found;
}

}  // namespace

TEST_CASE("C17: the pulled peer copy knows what its peers read of each rank's input (PeerCopyLists::peer_read_bytes, peer_range_bytes): none of rank 0's head-sharded input at {2,0}, all of the empty rank's") {
  const ut::Case c = ut::c17_case(2);
  LocalGroup g(2, std::chrono::seconds(60));
  std::vector<std::pair<bool, PeerCopyLists>> lists(2);
  g.spawn([&](LocalGroup::Comm& comm) {
    ut::PullingComm pc(comm);
    lists[static_cast<std::size_t>(comm.rank())] = c17_lists(pc, c);
  });
  REQUIRE(lists[0].first);
  REQUIRE(lists[1].first);
  const PeerCopyLists &l0 = lists[0].second, &l1 = lists[1].second;
  CHECK(l0.peer_reads);
  CHECK(l1.peer_reads);
  // B=2, D=1024 fp32; q: 2 heads a rank, k and v: 1. Rank 0 holds both tokens, rank 1 none.
  const std::uint64_t q = 2 * 2 * 2 * 1024 * 4, kv = 2 * 2 * 1 * 1024 * 4;  // [B, S=2, H_r, D] of rank 1's heads
  // seq->head: rank 1 reads its heads of rank 0's tokens; nobody reads rank 1's empty input.
  CHECK(l0.peer_read_bytes[0][0] == q);
  CHECK(l0.peer_read_bytes[0][1] == kv);
  CHECK(l0.peer_read_bytes[0][2] == kv);
  for (int t = 0; t < 3; ++t) CHECK(l1.peer_read_bytes[0][t] == 0);
  // head->seq: rank 0 reads all of rank 1's input (its heads of both tokens); nobody reads rank 0's (rank 1 has no token).
  CHECK(l1.peer_read_bytes[1][0] == q);
  CHECK(l1.peer_read_bytes[1][1] == kv);
  CHECK(l1.peer_read_bytes[1][2] == kv);
  for (int t = 0; t < 3; ++t) CHECK(l0.peer_read_bytes[1][t] == 0);
  for (int t = 0; t < 3; ++t) CHECK(l0.peer_range_bytes[1][t] == 0);
  // The ranges: seq->head reads rows of rank 1's heads from rank 0's [B, 2, 4, D] (q: 2 heads, 8 KiB; k, v: 1 head, 4 KiB)
  // into rank 1's [B, S=2, H_1, D], contiguous and longer (q 32 KiB, k, v 16 KiB): the owner pushes them at that length.
  // head->seq reads rank 1's whole [B, 2, H_1, D] input, contiguous.
  CHECK(l0.peer_range_bytes[0][0] == q);
  CHECK(l0.peer_range_bytes[0][1] == kv);
  CHECK(l0.peer_range_bytes[0][2] == kv);
  CHECK(l1.peer_range_bytes[1][0] == q);
  CHECK(l1.peer_range_bytes[1][1] == kv);
  CHECK(l1.peer_range_bytes[1][2] == kv);
  // The pushing (one address space) group does not compute them: nothing is staged there.
  LocalGroup g2(2, std::chrono::seconds(60));
  std::vector<int> computed(2, -1);
  g2.spawn([&](LocalGroup::Comm& comm) {
    const auto l = c17_lists(comm, c);
    computed[static_cast<std::size_t>(comm.rank())] = l.first ? (l.second.peer_reads ? 1 : 0) : -1;
  });
  CHECK(computed == std::vector<int>{0, 0});
}

TEST_CASE("failure model: milliseconds::max() means no bound: a late rank is waited for, no overflow into an instant timeout") {
  // The deadline arithmetic clamps (detail::deadline_after): max() + now() would overflow
  // steady_clock's int64 nanoseconds into a deadline in the past.
  using std::chrono::milliseconds;
  const auto now = std::chrono::steady_clock::now();
  CHECK(detail::clamp_wait(milliseconds::max()) == detail::kLongestWait);
  CHECK(detail::clamp_wait(milliseconds(-5)) == milliseconds(0));
  CHECK(detail::clamp_wait(milliseconds(250)) == milliseconds(250));
  CHECK(detail::deadline_after(milliseconds::max(), now) == now + detail::kLongestWait);
  CHECK(detail::deadline_after(milliseconds(250), now) == now + milliseconds(250));
  CHECK(detail::deadline_after(milliseconds(1), std::chrono::steady_clock::time_point::max()) == std::chrono::steady_clock::time_point::max());
  CHECK(detail::wait_ns(milliseconds::max()) == 3153600000000000000ull);  // 100 years of 365 days
  CHECK(detail::wait_ns(milliseconds(7)) == 7000000ull);
  CHECK(detail::scaled_wait(milliseconds::max(), 2) == detail::kLongestWait);
  CHECK(detail::scaled_wait(milliseconds(300), 2) == milliseconds(600));

  LocalGroup g(2, milliseconds::max());
  std::vector<ut::TimedError> got(2);
  g.spawn([&](LocalGroup::Comm& c) {
    const int r = c.rank();
    if (r == 1) std::this_thread::sleep_for(milliseconds(200));  // late, but it comes
    ut::MessagePattern m(2, r);
    got[static_cast<std::size_t>(r)] = ut::timed_error_of([&] { c.exchange_messages(m.send.data(), m.send.size(), m.recv.data(), m.recv.size()); });
    got[static_cast<std::size_t>(r)].message += ut::timed_error_of([&] { c.barrier(); }).message;
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(got[static_cast<std::size_t>(r)].message == "");
    CHECK(got[static_cast<std::size_t>(r)].code == Errc{});
  }
  CHECK(got[0].ms >= 150);  // rank 0 waited for the late rank
}
