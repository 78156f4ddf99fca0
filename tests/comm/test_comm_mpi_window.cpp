// SPDX-License-Identifier: Apache-2.0
// comm/mpi_window.hpp under real processes (ctest runs this under `mpiexec -n 2`, `-n 3`, `-n 4`
// and `-n 8`, there only the test suite "cases", the bit-exact case list, which adds P = 8): the peer copy between processes (MpiWindowComm, Path::direct) on the whole shared case
// list (C1–C8, zigzag, the models sweep, K stages, pipelined, strided views, uneven S and H,
// Replicas::owner) bit for bit against the reference, with the inputs in the window (read in
// place) and outside it (staged), the path chosen by default and forced, and the other paths
// forced over the same communicator; then the registration check, the timeout of a rank that
// never enters or never finishes reading (every rank's error names it), the destructors'
// rendezvous (~MpiWindow's and detail::SharedRendezvous, ~MpiDeviceWindow's), and the errors that
// break the group.
#include <ulysses/comm/mpi.hpp>

#include "mpi_groups.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <new>
#include <utility>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cases.hpp"
#include "expect_error.hpp"
#include "faults_mpi.hpp"
#include "window_protocol_cases.hpp"

using namespace ulysses;
using ut::on_groups_of;

namespace {

/// Bump allocation from one window registration (the test's arena; nothing is freed until the
/// next case resets it): run_case's tensors then live in the window.
struct Arena {
  std::byte* base = nullptr;
  std::size_t size = 0, used = 0;
};
Arena g_arena;

template <class T>
struct ArenaAlloc {
  using value_type = T;
  ArenaAlloc() = default;
  template <class U>
  ArenaAlloc(const ArenaAlloc<U>&) {}  // NOLINT: rebinding
  T* allocate(std::size_t n) {
    const std::size_t off = (g_arena.used + 63) / 64 * 64;
    if (off + n * sizeof(T) > g_arena.size) throw std::bad_alloc();
    g_arena.used = off + n * sizeof(T);
    return reinterpret_cast<T*>(g_arena.base + off);
  }
  void deallocate(T*, std::size_t) {}
  template <class U>
  bool operator==(const ArenaAlloc<U>&) const { return true; }
  template <class U>
  bool operator!=(const ArenaAlloc<U>&) const { return false; }
};

/// Bytes run_case's tensors of case c take on this rank (in, mid, back and the expected values),
/// with the arena's alignment: the largest over the group is registered on every rank.
template <class T>
std::size_t case_bytes(const ut::Case& c, int r) {
  const Plan plan = ut::plan_of<T>(c, r);
  std::size_t n = 0;
  for (int t = 0; t < plan.num_tensors(); ++t) n += 3 * plan.seq_bytes(t) + plan.head_bytes(t) + 4 * 64;
  return n;
}

/// One window of `bytes` per rank over `sub` (the largest any rank asks for); with `arena`, all
/// of it is one registration that the arena hands out (else it is left free for staging).
/// fn(MpiWindowComm&) runs on it.
template <class F>
void with_window(MPI_Comm sub, std::size_t bytes, bool arena, F&& fn) {
  unsigned long long mine = bytes, most = 0;
  MPI_Allreduce(&mine, &most, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, sub);
  MpiComm comm(sub);
  MpiWindow win(comm, static_cast<std::size_t>(most));
  const WindowSpan all = arena ? win.allocate(static_cast<std::size_t>(most)) : WindowSpan{};
  g_arena = {all.data(), all.size(), 0};
  MpiWindowComm wc(comm, win);
  wc.set_cross_memory_min_range(0);  // the cases' rows are short: read them in place anyway
  fn(wc);
}

/// Where the tensors lie: inputs and outputs allocated from the window (seq→head pushes); the
/// inputs in the window, the outputs outside it (seq→head pulls from the window, head→seq reads
/// its inputs outside it); every tensor outside it (read in place with Cross Memory Attach where
/// the window's probe allows it, else staged); outside it and staged (forced).
enum class Where { window, inputs_in_window, outside, staged };

int comm_rank(MPI_Comm c) {
  int r = 0;
  MPI_Comm_rank(c, &r);
  return r;
}

/// Every case on the window communicator: inputs in the window on every path it can take (the
/// default, which must be direct, and each forced), and inputs outside it by default (read in
/// place with Cross Memory Attach where permitted), and with `staged` also forced to be staged.
template <class T>
void check_window(const std::vector<ut::Case>& cases, bool staged = false) {
  const Path paths[] = {Path::automatic, Path::direct, Path::messages, Path::alltoallv};
  for (auto c : cases) {
    for (Where where : {Where::window, Where::inputs_in_window, Where::outside, Where::staged})
      for (Path path : paths) {
        if (where != Where::window && path != Path::automatic) continue;
        if (where == Where::staged && !staged) continue;
        c.path = path;
        const std::string via = std::string(to_string(path)) + (where == Where::window             ? ", inputs and outputs in the window"
                                                                : where == Where::inputs_in_window ? ", inputs in the window, outputs outside"
                                                                : where == Where::outside          ? ", inputs outside the window"
                                                                                                   : ", inputs staged");
        CAPTURE(c.name);
        CAPTURE(via);
        on_groups_of(c.P, [&](MPI_Comm sub) {
          const int r = comm_rank(sub);
          if (path == Path::automatic) CHECK(choose_path<MpiWindowComm, HostExecutor>(ut::plan_of<T>(c, r)) == Path::direct);
          with_window(sub, case_bytes<T>(c, r), where == Where::window || where == Where::inputs_in_window, [&](MpiWindowComm& wc) {
            if (where == Where::staged) wc.set_cross_memory_attach(false);
            if (where == Where::window)
              CHECK(ut::run_case<T, MpiWindowComm, HostExecutor, ArenaAlloc<T>>(wc, c) == "");
            else if (where == Where::inputs_in_window)
              CHECK(ut::run_case<T, MpiWindowComm, HostExecutor, ArenaAlloc<T>, std::allocator<T>>(wc, c) == "");
            else
              CHECK(ut::run_case<T>(wc, c) == "");
            if (where == Where::window) CHECK(wc.staged_bytes() + wc.remote_bytes() == 0);
            if (where == Where::staged) CHECK(wc.remote_bytes() == 0);
            if (where == Where::outside && wc.cross_memory_attach()) CHECK(wc.staged_bytes() == 0);
          });
        });
      }
  }
}

/// The cases the window path adds to the shared list at group size P: K = 2 stages (plain and
/// pipelined), strided views, uneven S and H with GQA, Replicas::owner on replicated kv heads.
std::vector<ut::Case> window_cases(int P) {
  auto q = HeadPartition::balanced(2 * P, P);
  auto kv = HeadPartition::gqa(q, 2);
  auto qb = HeadPartition::balanced(P + 3, P);
  std::vector<ut::Case> v = {
      {"K=2 P=" + std::to_string(P), P, 2, SeqPartition::even(2 * P, P), {{q, 4}, {kv, 4}}, Format::bshd, 2},
      {"K=2 pipelined P=" + std::to_string(P), P, 1, SeqPartition::even(2 * P, P), {{q, 4}, {kv, 4}}, Format::bshd, 2, true},
      {"uneven S and H P=" + std::to_string(P), P, 1, SeqPartition::balanced(3 * P + 1, P), {{qb, 3}, {HeadPartition::gqa(qb, 1), 3}},
       Format::sbhd},
      {"strided views P=" + std::to_string(P), P, 2, SeqPartition::balanced(2 * P + 1, P), {{q, 4}, {kv, 2}}, Format::bshd},
      {"owner P=" + std::to_string(P), P, 1, SeqPartition::even(2 * P, P), {{q, 4}, {kv, 4}}, Format::bshd},
  };
  v[3].padded = true;
  v[4].replicas = Replicas::owner;
  return v;
}

/// The ranks of the first "ranks {a, b} <tail>" in msg (tail: " did not arrive in call "), and the
/// call number after it; {} and -1 when there is none.
std::pair<std::vector<int>, int> named_set(const std::string& msg, const std::string& tail) {
  const std::size_t end = msg.find("}" + tail);
  const std::size_t begin = end == std::string::npos ? end : msg.rfind("ranks {", end);
  if (begin == std::string::npos) return {{}, -1};
  std::vector<int> ranks;
  std::size_t i = begin + 7;
  while (i < end) {
    std::size_t used = 0;
    ranks.push_back(std::stoi(msg.substr(i), &used));
    i += used;
    while (i < end && (msg[i] == ',' || msg[i] == ' ')) ++i;
  }
  return {ranks, std::stoi(msg.substr(end + 1 + tail.size()))};
}

/// Checks, on every rank of the world, the errors of a with_peers() that `missing` never entered
/// (`arrival`) or never finished reading: each other rank gets Error(timeout) (its own deadline
/// passed) or Error(aborted) (a peer's did first, and broke the group); at least one timed out;
/// every message names `missing` among the missing ("ranks {m} did not arrive in call e", the
/// same call on every rank; another rank late under heavy load may be named too); an aborted rank's message names the rank that broke the group, and
/// that rank timed out. `code` and `msg` are this rank's error (ignored on `missing`).
void check_missing_named(Errc code, const std::string& msg, int missing, bool arrival) {
  int P = 0, r = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  // The set named holds `missing` (under heavy load another rank may also have been late).
  const std::string tail = arrival ? " did not arrive in call " : " did not finish reading in call ";
  int mine[3] = {-1, -1, -1};  // code (0 timeout, 1 aborted, 2 other), the rank that broke the group, the call
  if (r != missing) {
    CAPTURE(msg);
    CHECK((code == Errc::timeout || code == Errc::aborted));
    mine[0] = code == Errc::timeout ? 0 : code == Errc::aborted ? 1 : 2;
    const auto [set, call] = named_set(msg, tail);
    CHECK(std::find(set.begin(), set.end(), missing) != set.end());
    CHECK(std::find(set.begin(), set.end(), r) == set.end());  // never itself
    mine[2] = call;
    if (code == Errc::timeout)
      CHECK(msg.find(std::string(arrival ? "for the peers to arrive; ranks {" : "for the peers to finish reading; ranks {")) != std::string::npos);
    if (code == Errc::aborted) {
      const std::string broke = "the window's group is broken (rank ";
      const std::size_t b = msg.find(broke);
      CHECK(b != std::string::npos);
      if (b != std::string::npos) {
        mine[1] = std::stoi(msg.substr(b + broke.size()));
        CHECK(msg.find("rank " + std::to_string(mine[1]) + " broke it: ranks {") != std::string::npos);
      }
    }
  }
  std::vector<int> all(3 * static_cast<std::size_t>(P));
  MPI_Allgather(mine, 3, MPI_INT, all.data(), 3, MPI_INT, MPI_COMM_WORLD);
  int timed_out = 0, call = -1;
  for (int p = 0; p < P; ++p) {
    if (p == missing) continue;
    const int* a = &all[3 * static_cast<std::size_t>(p)];
    timed_out += a[0] == 0;
    if (a[0] == 1 && a[1] >= 0) CHECK(all[3 * static_cast<std::size_t>(a[1])] == 0);  // the rank that broke the group timed out
    if (call < 0) call = a[2];
    CHECK(a[2] == call);  // the same call everywhere
  }
  CHECK(timed_out >= 1);
  CHECK(call >= 1);
}

/// A small fused plan (q and GQA kv over P ranks, B = 2) and its buffers on rank r.
struct Small {
  Plan plan;
  explicit Small(int P, int r)
      : plan({P, r}, 2, SeqPartition::even(2 * P, P),
             {TensorSpec::of<float>(HeadPartition::even(2 * P, P), 4), TensorSpec::of<float>(HeadPartition::gqa(HeadPartition::even(2 * P, P), 1), 4)}) {}
};

}  // namespace

TEST_CASE("MPI window: C1 batch > 1 in bshd, sbhd, bhsd" * doctest::test_suite("cases")) { check_window<float>(ut::c1_cases()); }

TEST_CASE("MPI window: C2 inverse and reference, P in {2,4,8}, q/k/v fused" * doctest::test_suite("cases")) {
  for (int P : {2, 4, 8}) check_window<float>(ut::c2_cases(P), true);  // (P = 8 under mpiexec -n 8 only)
  check_window<ut::bf16_t>(ut::c2_cases(2));
}

TEST_CASE("MPI window: zigzag partitions, P in {2,3,4,8}" * doctest::test_suite("cases")) {
  for (int P : {2, 3, 4, 8}) check_window<float>(ut::zigzag_cases(P));
}

TEST_CASE("MPI window: C3 S=7 over P=2, C4 H=7 over P=4, C5 GQA, C6 empty chunks, C8 (B, P, S_local) order" * doctest::test_suite("cases")) {
  check_window<float>(ut::c3_cases());
  check_window<float>(ut::c4_cases(4));
  check_window<float>({ut::c5_case()});
  check_window<float>(ut::c6_cases());
  check_window<ut::fp8_t>(ut::c6_cases());
  check_window<float>(ut::c8_cases());
}

TEST_CASE("MPI window: K stages, pipelined, strided views, uneven S and H, Replicas::owner, P in {2,3,4,8}" * doctest::test_suite("cases")) {
  for (int P : {2, 3, 4, 8}) check_window<float>(window_cases(P), true);
  check_window<double>(window_cases(3));
}

TEST_CASE("MPI window: C9 ranks that planned different head splits throw plan_mismatch on every rank, by default and forced" * doctest::test_suite("cases")) {
  for (Path path : {Path::automatic, Path::direct})
    for (const auto& split : ut::c9_splits())
      on_groups_of(2, [&](MPI_Comm sub) {
        with_window(sub, 1 << 12, false, [&](MpiWindowComm& wc) {
          CHECK(ut::run_c9_case(wc, split, path) == "");
          CHECK(!wc.broken());  // the agreement check's verdict is every rank's: the group stays usable
        });
      });
}

TEST_CASE("MPI window: C11 MQA, every rank's partial gradient of the kv head is summed (fp32), by default, forced and on the other paths" * doctest::test_suite("cases")) {
  for (Path path : {Path::automatic, Path::direct, Path::messages, Path::alltoallv}) {
    const std::string via = to_string(path);
    CAPTURE(via);
    on_groups_of(4, [&](MPI_Comm sub) {
      with_window(sub, 1 << 12, false, [&](MpiWindowComm& wc) { CHECK(ut::run_c11_case(wc, path) == ""); });
    });
  }
}

TEST_CASE("MPI window: C7 non-contiguous input view (staged)" * doctest::test_suite("cases")) {
  on_groups_of(2, [&](MPI_Comm sub) {
    with_window(sub, 1 << 16, false, [&](MpiWindowComm& wc) {
      CHECK(ut::run_view_case<float>(wc, 2) == "");
      CHECK(wc.staged_bytes() + wc.remote_bytes() > 0);
      wc.set_cross_memory_attach(false);
      CHECK(ut::run_view_case<float>(wc, 2) == "");
      CHECK(wc.staged_bytes() > 0);
    });
  });
}

TEST_CASE("MPI window: models, every model at every P that fits the world, q/k/v in one exchange" * doctest::test_suite("cases")) {
  for (const auto& m : ulysses_models::kModels)
    for (int P : {1, 2, 3, 4, 8}) {
      const std::string name = m.name;
      CAPTURE(name);
      const bool even = ut::expected_even_error(m, P) == Errc{};
      check_window<ut::bf16_t>({ut::model_case(m, P, even)});
    }
}

TEST_CASE("MPI window: adjointness (the summed inverse in ascending rank order), partitions, layouts, K") {
  for (const auto& m : ulysses_models::kModels)
    for (int P : {2, 3, 4}) {
      int i = 0;
      for (const auto& [pname, seq] : ut::sweep_partitions(P))
        for (int layout = 0; layout < 4; ++layout) {
          if ((i++ + P) % 5) continue;  // a rotation: every partition and layout for some model/P
          auto q = HeadPartition::balanced(m.num_heads, P);
          auto kv = HeadPartition::gqa(q, m.num_kv_heads);
          ut::Case c{std::string(m.name) + " P=" + std::to_string(P) + " " + pname + " layout " + std::to_string(layout), P, 1, seq,
                     {{q, m.head_dim}, {kv, m.head_dim}, {kv, m.v_head_dim}}, layout == 3 ? Format::bshd : ut::kFormats[layout],
                     1 + 2 * (i % 2)};
          c.padded = layout == 3;
          CAPTURE(c.name);
          on_groups_of(P, [&](MPI_Comm sub) {
            with_window(sub, case_bytes<float>(c, comm_rank(sub)), false, [&](MpiWindowComm& wc) {  // inputs outside the window
              wc.set_cross_memory_attach(i % 2 == 0);  // the sums' remote terms through the bounce buffer, or staged
              const ut::AdjointShare s = ut::run_adjoint_case<float>(wc, c);
              CHECK(s.error == "");
              long long mine[2] = {s.forward, s.backward}, sum[2];
              MPI_Allreduce(mine, sum, 2, MPI_LONG_LONG, MPI_SUM, sub);
              CHECK(sum[0] == sum[1]);
            });
          });
        }
    }
}

TEST_CASE("MPI window: the direct path is the default, copies once, and needs no workspace") {
  MpiComm world(MPI_COMM_WORLD);
  const int P = world.size(), r = world.rank();
  Small s(P, r);
  CHECK(choose_path<MpiWindowComm, HostExecutor>(s.plan) == Path::direct);
  CHECK(PathSupport<MpiWindowComm, HostExecutor>::direct);
  CHECK(s.plan.copies(Direction::seq_to_head, Path::direct).executor == 1);
  CHECK(s.plan.copies(Direction::seq_to_head, Path::direct).transport == 0);
  MpiWindow win(world, 2 * (s.plan.seq_bytes(0) + s.plan.seq_bytes(1) + s.plan.head_bytes(0) + s.plan.head_bytes(1)) + 4096);
  WindowSpan q = win.allocate(s.plan.seq_bytes(0)), k = win.allocate(s.plan.seq_bytes(1));
  WindowSpan q2 = win.allocate(s.plan.head_bytes(0)), k2 = win.allocate(s.plan.head_bytes(1));
  std::vector<float> q3(s.plan.seq_bytes(0) / 4), k3(s.plan.seq_bytes(1) / 4);
  for (std::size_t i = 0; i < q.size() / 4; ++i) q.as<float>()[i] = static_cast<float>(1000 * r + static_cast<int>(i));
  for (std::size_t i = 0; i < k.size() / 4; ++i) k.as<float>()[i] = static_cast<float>(-1000 * r - static_cast<int>(i));
  MpiWindowComm wc(world, win);
  HostExecutor ex;
  win.check_registrations();
  for (int round = 0; round < 3; ++round) {  // the epochs advance; the lists are kept
    seq_to_head(s.plan, wc, ex, {q, k}, {q2, k2}, {});
    CHECK(wc.staged_bytes() == 0);
    head_to_seq(s.plan, wc, ex, {q2, k2}, {ByteSpan(q3), ByteSpan(k3)}, {});
    CHECK(std::memcmp(q3.data(), q.data(), q.size()) == 0);
  }
  CHECK(!wc.broken());
  CHECK(ut::code_of([&] { MpiWindowComm bad(world, win, std::chrono::milliseconds(1)); }) == Errc{});
}

TEST_CASE("MPI window: outputs in the window: seq->head pushes into the peers' outputs; one rank's outside: every rank pulls; the same bits") {
  MpiComm world(MPI_COMM_WORLD);
  const int P = world.size(), r = world.rank();
  Small s(P, r);
  const std::size_t in_bytes = s.plan.seq_bytes(0) + s.plan.seq_bytes(1);
  MpiWindow win(world, 2 * (in_bytes + s.plan.head_bytes(0) + s.plan.head_bytes(1)) + 4096);
  WindowSpan q = win.allocate(s.plan.seq_bytes(0)), k = win.allocate(s.plan.seq_bytes(1));
  WindowSpan q2 = win.allocate(s.plan.head_bytes(0)), k2 = win.allocate(s.plan.head_bytes(1));
  for (std::size_t i = 0; i < q.size() / 4; ++i) q.as<float>()[i] = static_cast<float>(1000 * r + static_cast<int>(i));
  for (std::size_t i = 0; i < k.size() / 4; ++i) k.as<float>()[i] = static_cast<float>(-1000 * r - static_cast<int>(i));
  // The reference: the message path over the MpiComm, into private memory.
  PlanOptions messages;
  messages.path = Path::messages;
  const auto heads = HeadPartition::even(2 * P, P);
  const Plan pm({P, r}, 2, SeqPartition::even(2 * P, P), {TensorSpec::of<float>(heads, 4), TensorSpec::of<float>(HeadPartition::gqa(heads, 1), 4)},
                Format::bshd, messages);
  std::vector<float> q_ref(q2.size() / 4), k_ref(k2.size() / 4), ws(pm.workspace_bytes() / 4 + 1);
  HostExecutor ex;
  seq_to_head(pm, world, ex, {q, k}, {ByteSpan(q_ref), ByteSpan(k_ref)}, ByteSpan(ws));
  MpiWindowComm wc(world, win);
  std::memset(q2.data(), 0x7f, q2.size());
  std::memset(k2.data(), 0x7f, k2.size());
  seq_to_head(s.plan, wc, ex, {q, k}, {q2, k2}, {});  // every rank's outputs in the window: pushed
  CHECK(wc.outputs_in_window());
  CHECK(std::memcmp(q2.data(), q_ref.data(), q2.size()) == 0);
  CHECK(std::memcmp(k2.data(), k_ref.data(), k2.size()) == 0);
  std::vector<float> q_own(q_ref.size(), -1.f), k_own(k_ref.size(), -1.f);  // the last rank's outputs outside the window
  std::memset(q2.data(), 0x7f, q2.size());
  std::memset(k2.data(), 0x7f, k2.size());
  const bool outside = r == P - 1;
  seq_to_head(s.plan, wc, ex, {q, k}, {outside ? ByteSpan(q_own) : ByteSpan(q2), outside ? ByteSpan(k_own) : ByteSpan(k2)}, {});
  CHECK(!wc.outputs_in_window());  // one verdict for all: pulled
  CHECK(std::memcmp(outside ? static_cast<const void*>(q_own.data()) : q2.data(), q_ref.data(), q2.size()) == 0);
  CHECK(std::memcmp(outside ? static_cast<const void*>(k_own.data()) : k2.data(), k_ref.data(), k2.size()) == 0);
  if (outside) std::memcpy(q2.data(), q_own.data(), q2.size()), std::memcpy(k2.data(), k_own.data(), k2.size());
  std::vector<float> q3(q.size() / 4), k3(k.size() / 4);
  head_to_seq(s.plan, wc, ex, {q2, k2}, {ByteSpan(q3), ByteSpan(k3)}, {});
  CHECK(!wc.outputs_in_window());  // (q3, k3 are private)
  CHECK(std::memcmp(q3.data(), q.data(), q.size()) == 0);
}

TEST_CASE("MPI window: inputs outside the window are read in place (Cross Memory Attach) where every rank may, one verdict for all") {
  MpiComm world(MPI_COMM_WORLD);
  const int P = world.size(), r = world.rank();
  Small s(P, r);
  MpiWindow win(world, 2 * (s.plan.seq_bytes(0) + s.plan.seq_bytes(1)) + 4096);
  int mine = win.cross_memory_attach() ? 1 : 0, lo = 0, hi = 0;
  MPI_Allreduce(&mine, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&mine, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  CHECK(lo == hi);  // every rank takes the same way
  const std::string how = mine ? "Cross Memory Attach between the ranks: permitted" : "Cross Memory Attach between the ranks: not permitted (staging)";
  if (P > 1 && r == 0) MESSAGE(how);
  std::vector<float> q(s.plan.seq_bytes(0) / 4), k(s.plan.seq_bytes(1) / 4), q2(s.plan.head_bytes(0) / 4), k2(s.plan.head_bytes(1) / 4);
  std::vector<float> q3(q.size()), k3(k.size());
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(1000 * r + static_cast<int>(i));
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>(-1000 * r - static_cast<int>(i));
  MpiWindowComm wc(world, win);
  CHECK(wc.cross_memory_attach() == win.cross_memory_attach());
  HostExecutor ex;
  const std::size_t in_bytes = s.plan.seq_bytes(0) + s.plan.seq_bytes(1);
  CHECK(wc.cross_memory_min_range() == MpiWindowComm::kCrossMemoryMinRange);
  seq_to_head(s.plan, wc, ex, {ConstByteSpan(q), ConstByteSpan(k)}, {ByteSpan(q2), ByteSpan(k2)}, {});
  CHECK(wc.staged_bytes() == in_bytes);  // the peers read rows of 16 and 32 bytes: staged
  wc.set_cross_memory_min_range(16);
  seq_to_head(s.plan, wc, ex, {ConstByteSpan(q), ConstByteSpan(k)}, {ByteSpan(q2), ByteSpan(k2)}, {});
  // The rows the peers read: each reads its 2 q heads of this rank's 2P (q: (P-1)/P of it) and all of k (one kv head on every rank).
  const std::size_t read = static_cast<std::size_t>(P - 1) * (s.plan.seq_bytes(0) / static_cast<std::size_t>(P) + s.plan.seq_bytes(1));
  CHECK(wc.remote_bytes() == (win.cross_memory_attach() ? read : 0));
  CHECK(wc.staged_bytes() == (win.cross_memory_attach() ? 0 : in_bytes));
  head_to_seq(s.plan, wc, ex, {ConstByteSpan(q2), ConstByteSpan(k2)}, {ByteSpan(q3), ByteSpan(k3)}, {});
  CHECK(q3 == q);  // (k's one kv head is on every rank: its inverse is their sum)
  wc.set_cross_memory_attach(r != 0);  // local: rank 0 stages, its peers read either way
  CHECK(wc.cross_memory_attach() == (r != 0 && win.cross_memory_attach()));
  seq_to_head(s.plan, wc, ex, {ConstByteSpan(q), ConstByteSpan(k)}, {ByteSpan(q2), ByteSpan(k2)}, {});
  CHECK(wc.staged_bytes() == (r == 0 || !win.cross_memory_attach() ? in_bytes : 0));
  head_to_seq(s.plan, wc, ex, {ConstByteSpan(q2), ConstByteSpan(k2)}, {ByteSpan(q3), ByteSpan(k3)}, {});
  CHECK(q3 == q);
}

TEST_CASE("MPI window: C17 a rank with no tokens, window of 0 bytes and 1 MiB, tensors in host memory: seq->head then head->seq exact on every rank, the empty rank stages nothing" *
          doctest::test_suite("cases")) {
  for (int P : {2, 4})
    for (std::size_t bytes : {std::size_t{0}, std::size_t{1} << 20})
      for (bool cma : {true, false}) {
        const ut::Case c = ut::c17_case(P);
        CAPTURE(c.name);
        CAPTURE(bytes);
        CAPTURE(cma);
        on_groups_of(P, [&](MPI_Comm sub) {
          MpiComm comm(sub);
          const int r = comm.rank();
          MpiWindow win(comm, bytes);
          MpiWindowComm wc(comm, win, std::chrono::seconds(20));
          wc.set_cross_memory_attach(cma);
          const bool in_place = wc.cross_memory_attach();  // the peers read inputs outside the window where they are
          if (!in_place && bytes == 0) return;  // nothing can be staged, and inputs the peers read must be: not this case's point
          const Plan plan = ut::plan_of<float>(c, r);
          CHECK(choose_path<MpiWindowComm, HostExecutor>(plan) == Path::direct);
          CHECK(ut::run_case<float>(wc, c) == "");  // seq->head then head->seq, bit for bit against the reference
          // Again, call by call, for what each stages: the empty rank nothing in either direction.
          TensorList<ConstByteSpan> in, mid_c;
          TensorList<ByteSpan> mid, back;
          std::vector<std::vector<float>> x(3), y(3), z(3);
          for (int t = 0; t < 3; ++t) {
            x[static_cast<std::size_t>(t)].assign(plan.seq_bytes(t) / 4, 1.0f + static_cast<float>(r));
            y[static_cast<std::size_t>(t)].assign(plan.head_bytes(t) / 4, 0.0f);
            z[static_cast<std::size_t>(t)].assign(plan.seq_bytes(t) / 4, 0.0f);
            in.push_back(x[static_cast<std::size_t>(t)]);
            mid.push_back(y[static_cast<std::size_t>(t)]);
            mid_c.push_back(y[static_cast<std::size_t>(t)]);
            back.push_back(z[static_cast<std::size_t>(t)]);
          }
          HostExecutor ex;
          const bool empty = r == P - 1;
          redistribute(plan, Direction::seq_to_head, wc, ex, in, mid, {});
          if (empty) CHECK(wc.staged_bytes() == 0);
          if (in_place) CHECK(wc.staged_bytes() == 0);  // every input the peers read is read in place
          const std::size_t s2h_remote = wc.remote_bytes();
          if (empty) CHECK(s2h_remote == 0);  // (its input has no byte)
          redistribute(plan, Direction::head_to_seq, wc, ex, mid_c, back, {});
          if (empty) CHECK(wc.staged_bytes() == (in_place ? 0u : plan.head_bytes(0) + plan.head_bytes(1) + plan.head_bytes(2)));
          if (in_place) CHECK(wc.staged_bytes() == 0);
          // P=2: no peer reads rank 0's head-sharded input (rank 1 has no tokens): not staged even without Cross Memory Attach.
          if (P == 2 && r == 0) CHECK(wc.staged_bytes() == 0);
          for (int t = 0; t < 3; ++t)  // kv heads are replicated at P=4 (Hkv=2): the sum of their copies
            for (float v : z[static_cast<std::size_t>(t)])
              REQUIRE(v == (t > 0 && P == 4 ? 2.0f : 1.0f) * (1.0f + static_cast<float>(r)));
          CHECK(!wc.broken());
        });
      }
}

TEST_CASE("MPI window: C17's kind, a rank with no heads (H=3 over P=4, D=1024): a 0-byte window serves it, nothing staged where Cross Memory Attach is permitted" *
          doctest::test_suite("cases")) {
  const ut::Case c{"C17 zero heads P=4", 4, 2, SeqPartition::even(8, 4), {{HeadPartition::balanced(3, 4), 1024}}, Format::bshd};
  for (std::size_t bytes : {std::size_t{0}, std::size_t{1} << 20})
    for (bool cma : {true, false}) {
      CAPTURE(bytes);
      CAPTURE(cma);
      on_groups_of(4, [&](MPI_Comm sub) {
        MpiComm comm(sub);
        MpiWindow win(comm, bytes);
        MpiWindowComm wc(comm, win, std::chrono::seconds(20));
        wc.set_cross_memory_attach(cma);
        if (!wc.cross_memory_attach() && bytes == 0) return;  // inputs the peers read must be staged then
        CHECK(ut::run_case<float>(wc, c) == "");
        if (wc.cross_memory_attach()) CHECK(wc.staged_bytes() == 0);  // (head->seq, the last call; rank 3's input has no byte)
        CHECK(!wc.broken());
      });
    }
}

TEST_CASE("MPI window: remote_bytes() counts the rows the peers read of fused q, k, v views (not each view's span of the fused buffer)") {
  MpiComm world(MPI_COMM_WORLD);
  const int P = world.size(), r = world.rank();
  // q: 2P heads, k and v: P heads (one a rank, no replica), D=8, fp32, views into one fused [B, S_r, 4P, D] buffer.
  const std::int64_t B = 2, Sr = 3, H = 2 * P, Hkv = P, D = 8, W = H + 2 * Hkv;
  auto view = [&](std::int64_t h) { return Layout::strided({B, Sr, h, D}, {Sr * W * D, W * D, D, 1}); };
  const auto qh = HeadPartition::even(H, P), kvh = HeadPartition::even(Hkv, P);
  const Plan plan({P, r}, B, SeqPartition::even(Sr * P, P),
                  {TensorSpec::of<float>(qh, D).with_seq_layout(view(H)), TensorSpec::of<float>(kvh, D).with_seq_layout(view(Hkv)),
                   TensorSpec::of<float>(kvh, D).with_seq_layout(view(Hkv))});
  std::vector<float> fused(static_cast<std::size_t>(B * Sr * W * D)), back(fused.size(), -1.0f);
  for (std::size_t i = 0; i < fused.size(); ++i) fused[i] = static_cast<float>(100000 * r + static_cast<int>(i));
  const std::int64_t off[3] = {0, H * D, (H + Hkv) * D};  // elements
  TensorList<ConstByteSpan> in, mid_c;
  TensorList<ByteSpan> mid, out;
  std::vector<std::vector<float>> y(3);
  std::size_t spans = 0;
  for (int t = 0; t < 3; ++t) {
    in.push_back(ConstByteSpan(reinterpret_cast<const std::byte*>(fused.data() + off[t]), plan.seq_bytes(t)));
    out.push_back(ByteSpan(reinterpret_cast<std::byte*>(back.data() + off[t]), plan.seq_bytes(t)));
    y[static_cast<std::size_t>(t)].assign(plan.head_bytes(t) / 4, 0.0f);
    mid.push_back(y[static_cast<std::size_t>(t)]);
    mid_c.push_back(y[static_cast<std::size_t>(t)]);
    spans += plan.seq_bytes(t);
  }
  MpiWindow win(world, 4096);
  MpiWindowComm wc(world, win);
  wc.set_cross_memory_min_range(0);  // rows of 32 bytes: read in place all the same
  HostExecutor ex;
  redistribute(plan, Direction::seq_to_head, wc, ex, in, mid, {});
  const std::size_t fused_bytes = fused.size() * 4, read = fused_bytes / static_cast<std::size_t>(P) * static_cast<std::size_t>(P - 1);
  CHECK(spans > 2 * fused_bytes);  // what the old count summed: every view spans nearly the whole buffer
  CHECK(wc.remote_bytes() == (wc.cross_memory_attach() ? read : 0));  // each peer reads its heads of every tensor: (P-1)/P of the buffer
  CHECK(wc.staged_bytes() == (wc.cross_memory_attach() ? 0 : spans));
  redistribute(plan, Direction::head_to_seq, wc, ex, mid_c, out, {});
  CHECK(back == fused);  // q, k and v back into their places of the fused buffer
}

TEST_CASE("MPI window: registrations in another order or size on one rank throw plan_mismatch on every rank") {
  MpiComm world(MPI_COMM_WORLD);
  const int P = world.size(), r = world.rank();
  if (P < 2) return;
  const int odd = P - 1;
  Small s(P, r);
  const std::size_t a = s.plan.seq_bytes(0), b = s.plan.seq_bytes(1);
  struct Variant {
    const char* name;
    std::vector<std::size_t> sizes;
  };
  const Variant variants[] = {{"order", {b, a}}, {"size", {a, b + 64}}, {"count", {a, b, 64}}};
  MpiWindow win(world, 4 * (a + b) + 4096);
  MpiWindowComm wc(world, win, std::chrono::seconds(20));
  HostExecutor ex;
  std::vector<float> q2(s.plan.head_bytes(0) / 4), k2(s.plan.head_bytes(1) / 4);
  for (const Variant& v : variants) {
    CAPTURE(v.name);
    win.reset();
    std::vector<WindowSpan> reg;
    for (std::size_t n : r == odd ? v.sizes : std::vector<std::size_t>{a, b}) reg.push_back(win.allocate(n));
    const WindowSpan& q = reg[r == odd && std::string(v.name) == "order" ? 1 : 0];
    const WindowSpan& k = reg[r == odd && std::string(v.name) == "order" ? 0 : 1];
    auto [code, msg] = ut::error_of([&] { win.check_registrations(); });
    CHECK(code == Errc::plan_mismatch);
    CHECK(msg.find("rank " + std::to_string(odd) + ": ") != std::string::npos);
    std::tie(code, msg) = ut::error_of([&] { seq_to_head(s.plan, wc, ex, {q, k}, {ByteSpan(q2), ByteSpan(k2)}, {}); });
    CAPTURE(msg);
    CHECK(code == Errc::plan_mismatch);
    CHECK(msg.find("rank " + std::to_string(odd) + ": ") != std::string::npos);
    CHECK(!wc.broken());  // the same verdict on every rank: the group stays usable
  }
  win.reset();  // registered alike again: the exchange runs
  WindowSpan q = win.allocate(a), k = win.allocate(b);
  CHECK(ut::code_of([&] { seq_to_head(s.plan, wc, ex, {q, k}, {ByteSpan(q2), ByteSpan(k2)}, {}); }) == Errc{});
}

TEST_CASE("MPI window: ranks asking for windows of different sizes throw plan_mismatch on every rank, naming each offender's size") {
  MpiComm world(MPI_COMM_WORLD);
  if (world.size() < 2) return;
  auto [code, msg] = ut::error_of([&] { MpiWindow win(world, world.rank() == 1 ? 8192 : 4096); });
  CAPTURE(msg);
  CHECK(code == Errc::plan_mismatch);
  // The same message on every rank: the offender's size, never the innocent rank's own.
  CHECK(msg == "ulysses: plan_mismatch: MpiWindow: rank 1 differs from rank 0 in bytes_per_rank (rank 1: 8192; rank 0: 4096); every rank must pass the same size");
  if (world.size() < 3) return;
  const int last = world.size() - 1;  // two offenders, two sizes
  std::tie(code, msg) = ut::error_of([&] { MpiWindow win(world, world.rank() == 1 ? 8192 : world.rank() == last ? 0 : 4096); });
  CAPTURE(msg);
  CHECK(code == Errc::plan_mismatch);
  CHECK(msg == "ulysses: plan_mismatch: MpiWindow: ranks {1, " + std::to_string(last) + "} differ from rank 0 in bytes_per_rank (rank 1: 8192, rank " +
                   std::to_string(last) + ": 0; rank 0: 4096); every rank must pass the same size");
}

TEST_CASE("MPI window: a rank that never enters makes its peers time out within the deadline; the group is broken after") {
  MpiComm world(MPI_COMM_WORLD);
  const int P = world.size(), r = world.rank();
  if (P < 2) return;
  Small s(P, r);
  MpiWindow win(world, 2 * (s.plan.seq_bytes(0) + s.plan.seq_bytes(1)) + 4096);
  WindowSpan q = win.allocate(s.plan.seq_bytes(0)), k = win.allocate(s.plan.seq_bytes(1));
  std::vector<float> q2(s.plan.head_bytes(0) / 4), k2(s.plan.head_bytes(1) / 4);
  MpiWindowComm wc(world, win, std::chrono::seconds(60));
  HostExecutor ex;
  auto run = [&] { seq_to_head(s.plan, wc, ex, {q, k}, {ByteSpan(q2), ByteSpan(k2)}, {}); };
  run();  // all ranks: the agreement check and the peer lists (MPI collectives) are done once
  wc.set_timeout(std::chrono::milliseconds(300));
  Errc code{};
  std::string msg;
  if (r != 0) {
    const auto t0 = std::chrono::steady_clock::now();
    std::tie(code, msg) = ut::error_of(run);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    CHECK(ms < 300 + 5000);  // the deadline, and slack for a loaded machine
  }
  check_missing_named(code, msg, 0, true);  // every rank's error names rank 0 as the one that did not arrive
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(wc.broken());
  const auto t0 = std::chrono::steady_clock::now();
  std::tie(code, msg) = ut::error_of(run);
  CAPTURE(msg);
  CHECK(code == Errc::aborted);  // at once, on every rank (rank 0 included)
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(300));
  if (r == 0) {  // the late rank learns it was missing
    CHECK(msg.find(" broke it: ranks {") != std::string::npos);
    const std::vector<int> set = named_set(msg, " did not arrive in call ").first;
    CHECK(std::find(set.begin(), set.end(), 0) != set.end());
  }
  CHECK(ut::code_of([&] { wc.allgather(&r, sizeof r, q2.data()); }) == Errc::aborted);
}

/// Milliseconds `f` takes.
template <class F>
double ms_of(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

namespace {
/// The world of a fault test: its size and this rank; false (the test is skipped) below 2 ranks.
struct FaultWorld {
  int W = 0, r = 0;
  FaultWorld() {
    MPI_Comm_size(MPI_COMM_WORLD, &W);
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
  }
  explicit operator bool() const { return W >= 2; }
};
/// A fresh duplicate of MPI_COMM_WORLD for a test that breaks its communicator (never freed: a
/// broken MpiComm may leave a collective pending on it).
MPI_Comm fault_dup() {
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  return dup;
}
}  // namespace

TEST_CASE("MPI window: its timeout bounds the calls it makes through the MpiComm too (a rank skips an all-gather)") {
  const FaultWorld fw;
  if (!fw) return;
  const int W = fw.W, r = fw.r;
  MPI_Comm dup = fault_dup();  // (the others' MPI_Iallgather stays on it until the skipping rank completes it)
  {
    MpiComm comm(dup);  // its own timeout: the 5-minute default
    const std::chrono::milliseconds deadline(300);
    auto win = std::make_unique<MpiWindow>(comm, 4096);
    auto wcp = std::make_unique<MpiWindowComm>(comm, *win, deadline);
    MpiWindowComm& wc = *wcp;
    const int skip = W - 1;
    std::uint64_t mine = static_cast<std::uint64_t>(r);
    std::vector<std::uint64_t> all(static_cast<std::size_t>(W));
    if (r != skip) {
      const ut::TimedError e = ut::timed_error_of([&] { wc.allgather(&mine, sizeof mine, all.data()); });
      CAPTURE(e.message);
      // timeout, or aborted with the first rank's timeout (it broke the window's group first, which
      // the others' MpiComm calls watch)
      CHECK((e.code == Errc::timeout || (e.code == Errc::aborted && e.message.find("timeout: rank") != std::string::npos)));
      CHECK(e.ms < 300 + 5000);  // the window's deadline (not the MpiComm's 5 minutes), and slack for a loaded machine
      CHECK(comm.timeout() == kDefaultCommTimeout);  // the MpiComm's own timeout is back
      CHECK(wc.broken());
    }
    MPI_Barrier(MPI_COMM_WORLD);  // the skipping rank comes after the others gave up
    if (r == skip) {
      CHECK(ut::code_of([&] { wc.allgather(&mine, sizeof mine, all.data()); }) == Errc::aborted);  // the group is broken: at once
      MPI_Request q;  // complete the others' MPI_Iallgather
      MPI_Iallgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, dup, &q);
      MPI_Wait(&q, MPI_STATUS_IGNORE);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    wcp.reset();
    CHECK(ms_of([&] { win.reset(); }) < 5000);  // broken: leaked at once
    if (r != skip) {  // a new window over the broken MpiComm is refused at once, not a hang
      const ut::TimedError e = ut::timed_error_of([&] { MpiWindow again(comm, 4096); });
      CHECK(e.code == Errc::aborted);
      CHECK(e.message.find("another MPI communicator") != std::string::npos);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Comm_free(&dup);
}


TEST_CASE("MPI window: a rank that stops participating: the others time out, then destroy their windows at once (no collective free)") {
  MpiComm world(MPI_COMM_WORLD);
  const int P = world.size(), r = world.rank();
  if (P < 2) return;
  const int stopped = P - 1;
  Small s(P, r);
  auto win = std::make_unique<MpiWindow>(world, 2 * (s.plan.seq_bytes(0) + s.plan.seq_bytes(1)) + 4096);
  WindowSpan q = win->allocate(s.plan.seq_bytes(0)), k = win->allocate(s.plan.seq_bytes(1));
  std::vector<float> q2(s.plan.head_bytes(0) / 4), k2(s.plan.head_bytes(1) / 4);
  auto wc = std::make_unique<MpiWindowComm>(world, *win, std::chrono::seconds(60));
  HostExecutor ex;
  auto run = [&] { seq_to_head(s.plan, *wc, ex, {q, k}, {ByteSpan(q2), ByteSpan(k2)}, {}); };
  run();  // all ranks: the agreement check and the peer lists (MPI collectives) are done once
  CHECK(!win->broken());
  wc->set_timeout(std::chrono::milliseconds(300));
  Errc code{};
  std::string msg;
  if (r != stopped) std::tie(code, msg) = ut::error_of(run);  // the stopped rank never enters
  check_missing_named(code, msg, stopped, true);
  if (r != stopped) {
    CHECK(win->broken());
    wc.reset();
    // MPI_Win_free here would wait for the stopped rank, which is in the MPI_Barrier below: a hang
    // (the ctest TIMEOUT), not a return.
    CHECK(ms_of([&] { win.reset(); }) < 5000);
    CHECK(win == nullptr);
  }
  MPI_Barrier(MPI_COMM_WORLD);  // the stopped rank comes back only after its peers destroyed their windows
  if (r == stopped) {
    CHECK(win->broken());  // its peers broke the group: it leaks too, without waiting
    CHECK(ut::code_of(run) == Errc::aborted);
    wc.reset();
    CHECK(ms_of([&] { win.reset(); }) < 5000);
  }
}

TEST_CASE("MPI window: a rank that skips the destructor: the others' destructors leak the window after its timeout") {
  MpiComm world(MPI_COMM_WORLD);
  const int P = world.size(), r = world.rank();
  if (P < 2) return;
  const int stopped = 0;
  auto win = std::make_unique<MpiWindow>(world, 4096);
  win->set_timeout(std::chrono::milliseconds(300));
  CHECK(win->timeout() == std::chrono::milliseconds(300));
  if (r != stopped) CHECK(ms_of([&] { win.reset(); }) < 300 + 5000);  // waits its timeout for rank 0, then leaks
  MPI_Barrier(MPI_COMM_WORLD);
  if (r == stopped) {
    CHECK(!win->broken());                                  // nobody broke the group: the verdict alone says leak
    CHECK(ms_of([&] { win.reset(); }) < 5000);  // the verdict is already taken: no wait, no MPI_Win_free
  }
  // And with every rank present, the window is freed collectively (the rendezvous meets).
  MpiWindow again(world, 4096);
  again.set_timeout(std::chrono::seconds(60));
  CHECK(!again.broken());
}

TEST_CASE("MPI window: a rank whose work does not finish in time: the others time out (or abort) naming it as not done reading; its own call completes") {
  MpiComm world(MPI_COMM_WORLD);
  const int P = world.size(), r = world.rank();
  if (P < 2) return;
  const int slow = P / 2;
  MpiWindow win(world, 4096);
  MpiWindowComm wc(world, win, std::chrono::milliseconds(300));
  PeerRecord none;  // no inputs: only the two synchronisations
  int stall_ms = r == slow ? 900 : 0;
  auto work = [](void* ctx, const void* const*) { std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ctx))); };
  MPI_Barrier(MPI_COMM_WORLD);  // every rank arrives well within the deadline; only the slow rank's reads are late
  auto [code, msg] = ut::error_of([&] { wc.with_peers(&none, work, &stall_ms); });
  check_missing_named(code, msg, slow, false);
  if (r == slow) CHECK(code == Errc{});  // every peer had finished reading: its call is complete
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(wc.broken());
  std::tie(code, msg) = ut::error_of([&] { wc.with_peers(&none, work, &stall_ms); });
  CAPTURE(msg);
  CHECK(code == Errc::aborted);  // the next call, on every rank (with the rank's own first failure, or why the group broke)
  const auto [set, call] = named_set(msg, " did not finish reading in call ");
  CHECK(std::find(set.begin(), set.end(), slow) != set.end());
  CHECK(call == 1);
  if (r == slow) CHECK(msg.find(" broke it: ranks {") != std::string::npos);
}

TEST_CASE("MPI window: the destructors' rendezvous in host shared memory (detail::SharedRendezvous, ~MpiDeviceWindow's): met, deserted, broken") {
  MpiComm world(MPI_COMM_WORLD);
  const int P = world.size(), r = world.rank();
  {  // every rank leaves: all free (the collective MPI_Win_free of the words follows, in the destructor)
    detail::SharedRendezvous rv(world.get());
    CHECK(!rv.broken());
    CHECK(rv.leave(std::chrono::seconds(60)));
  }
  if (P < 2) return;
  {  // rank 0 does not come: the others leak after their timeout, rank 0 (later) at once: nobody makes a collective call
    auto rv = std::make_unique<detail::SharedRendezvous>(world.get());
    if (r != 0) {
      bool free = true;
      CHECK(ms_of([&] { free = rv->leave(std::chrono::milliseconds(300)); }) < 300 + 5000);
      CHECK(!free);
      rv.reset();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (r == 0) {
      CHECK(!rv->broken());  // nobody broke the group: the verdict alone says leak
      bool free = true;
      CHECK(ms_of([&] { free = rv->leave(std::chrono::seconds(60)); }) < 5000);
      CHECK(!free);
      rv.reset();
    }
  }
  {  // mark_broken() on the last rank: every rank's leave() leaks at once
    detail::SharedRendezvous rv(world.get());
    if (r == P - 1) rv.mark_broken();
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(rv.broken());
    bool free = true;
    CHECK(ms_of([&] { free = rv.leave(std::chrono::seconds(60)); }) < 5000);
    CHECK(!free);
  }
}

TEST_CASE("MPI window: mark_broken() on one rank breaks the group on every rank") {
  MpiComm world(MPI_COMM_WORLD);
  if (world.size() < 2) return;
  MpiWindow win(world, 4096);
  CHECK(!win.broken());
  MPI_Barrier(MPI_COMM_WORLD);
  if (world.rank() == 0) win.mark_broken();
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(win.broken());  // every rank: the destructors below leak at once
  MpiWindowComm wc(world, win);
  CHECK(wc.broken());
  CHECK(ut::code_of([&] { int x = 0, all[64]; wc.allgather(&x, sizeof x, all); }) == Errc::aborted);
}

TEST_CASE("MPI window: an input outside the window with no room to stage it: buffer_too_small there, aborted on the peers") {
  MpiComm world(MPI_COMM_WORLD);
  const int P = world.size(), r = world.rank();
  if (P < 2) return;
  Small s(P, r);
  MpiWindow win(world, detail::round_up<std::size_t>(s.plan.seq_bytes(0), MpiWindow::kAlignment) + s.plan.seq_bytes(1));  // no byte free
  WindowSpan q = win.allocate(s.plan.seq_bytes(0)), k = win.allocate(s.plan.seq_bytes(1));
  std::vector<float> qo(s.plan.seq_bytes(0) / 4), q2(s.plan.head_bytes(0) / 4), k2(s.plan.head_bytes(1) / 4);
  MpiWindowComm wc(world, win, std::chrono::seconds(20));
  wc.set_cross_memory_attach(false);  // staged (else rank 0's q is read in place: no room needed)
  HostExecutor ex;
  seq_to_head(s.plan, wc, ex, {q, k}, {ByteSpan(q2), ByteSpan(k2)}, {});  // warm: agreement check and lists
  const ConstByteSpan qin = r == 0 ? ConstByteSpan(qo) : ConstByteSpan(q);  // rank 0's q outside the window, too big to stage
  auto [code, msg] = ut::error_of([&] { seq_to_head(s.plan, wc, ex, {qin, k}, {ByteSpan(q2), ByteSpan(k2)}, {}); });
  CAPTURE(msg);
  CHECK(code == (r == 0 ? Errc::buffer_too_small : Errc::aborted));
  if (r == 0) CHECK(msg.find("allocate the inputs from the window") != std::string::npos);
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(wc.broken());
}

TEST_CASE("MPI window: a window over another group than the MpiComm's is refused") {
  MpiComm world(MPI_COMM_WORLD);
  if (world.size() < 2) return;
  on_groups_of(world.size() - 1, [&](MPI_Comm sub) {
    MpiComm part(sub);
    MpiWindow win(part, 4096);
    CHECK(ut::code_of([&] { MpiWindowComm wc(world, win); }) == Errc::comm_mismatch);
  });
}

TEST_CASE("MPI window: C19 rank P-1's output span 2 bytes short: it throws buffer_too_small at once, every peer aborted naming it") {
  // bug case C19 as reported: MpiWindowComm wc(comm, win, 30s), inputs and outputs from the
  // window, the exception caught outside the window's scope.
  const FaultWorld fw;
  if (!fw) return;
  const int W = fw.W, r = fw.r;
  MpiComm world(fault_dup());
  ut::TimedError e{};
  const auto t0 = std::chrono::steady_clock::now();
  {
    const ut::FaultPlan fp(W, r);
    const Plan& plan = fp.plan;
    MpiWindow win(world, 4 * 4096);
    WindowSpan q = win.allocate(plan.seq_bytes(0)), k = win.allocate(plan.seq_bytes(1)), q2 = win.allocate(plan.head_bytes(0)),
               k2 = win.allocate(plan.head_bytes(1));
    MpiWindowComm wc(world, win, std::chrono::seconds(30));
    HostExecutor ex;
    const ByteSpan out0(q2.data(), r == W - 1 ? plan.head_bytes(0) - 2 : plan.head_bytes(0));
    e = ut::timed_error_of([&] { seq_to_head(plan, wc, ex, {q, k}, {out0, k2}, {}); });
  }  // ~MpiWindow: the group is broken, no rank waits for its peers
  const double with_destructor = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  CAPTURE(e.message);
  CHECK(ut::judge_fault(e, ut::Fault::short_buffer, r, W - 1, ut::kToldWithinMs) == "");
  CHECK(with_destructor < 5000);
  MESSAGE("C19 on the window, rank " << r << ": " << std::string(ulysses::to_string(e.code)) << " after " << e.ms << " ms, " << with_destructor
                                     << " ms with ~MpiWindow (deadline 30000 ms)");
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("MPI window: C19's matrix on the window path (every local failure, forward, backward, ring step, decode; skipped calls)") {
  const FaultWorld fw;
  if (!fw) return;
  const int W = fw.W, me = fw.r;
  const double slowest = ut::run_mpi_fault_matrix(false, [&](ut::FaultOp op, ut::Fault f, bool warm) {
    MpiComm comm(fault_dup());
    ut::TimedError e{};
    {
      MpiWindow win(comm, 1 << 20);  // inputs outside it: staged (or read in place)
      MpiWindowComm wc(comm, win, f == ut::Fault::skipped_call ? std::chrono::seconds(2) : std::chrono::seconds(30));
      e = ut::run_fault(wc, op, f, W - 1, wc, warm);
    }
    const std::string cell = std::string(ut::name_of(op)) + " / " + ut::name_of(f) + (warm ? " (warm)" : "");
    CAPTURE(cell);
    CHECK(ut::judge_fault(e, f, me, W - 1, ut::kToldWithinMs) == "");
    return e;
  });
  MESSAGE("MpiWindowComm, -n " << W << ": slowest rank of every local failure " << slowest << " ms (deadline 30000 ms)");
}

TEST_CASE("MPI window: a write past the end of a slot is a coded error, and the control words stay intact") {
  const FaultWorld fw;
  if (!fw) return;
  const int W = fw.W, r = fw.r;
  MpiComm world(fault_dup());
  const ut::FaultPlan fp(W, r);
  const Plan& plan = fp.plan;
  ut::TimedError e{};
  {
    MpiWindow win(world, plan.seq_bytes(0) + plan.seq_bytes(1) + 2 * MpiWindow::kAlignment);
    WindowSpan q = win.allocate(plan.seq_bytes(0)), k = win.allocate(plan.seq_bytes(1));
    std::vector<float> q2(plan.head_bytes(0) / 4), k2(plan.head_bytes(1) / 4);
    MpiWindowComm wc(world, win, std::chrono::seconds(30));
    HostExecutor ex;
    seq_to_head(plan, wc, ex, {q, k}, {ByteSpan(q2), ByteSpan(k2)}, {});
    CHECK(win.guard_intact());
    MPI_Barrier(MPI_COMM_WORLD);
    if (r == 1) std::memset(win.local().data() + win.bytes_per_rank(), 0x3f, 64);  // the user's overrun of its slot
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(win.guard_intact() == (r != 1));
    e = ut::timed_error_of([&] { seq_to_head(plan, wc, ex, {q, k}, {ByteSpan(q2), ByteSpan(k2)}, {}); });
    CHECK(!wc.broken() == false);
  }
  CAPTURE(e.message);
  CHECK(e.code == (r == 1 ? Errc::buffer_too_small : Errc::aborted));
  CHECK(e.message.find(r == 1 ? "wrote past the end of its window slot" : "rank 1 broke it") != std::string::npos);
  CHECK(e.message.find("did not arrive in call 2513369232471835648") == std::string::npos);  // (the garbled message of the report)
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("MPI window: the epoch barrier on threads as ranks (comm/window_protocol.hpp: the device window's test runs the same cases)") {
  ut::window_protocol_cases<detail::HostWords, detail::WindowControl>();
}

int main(int argc, char** argv) { return ut::mpi_doctest_main(argc, argv); }
