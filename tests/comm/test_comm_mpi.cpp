// SPDX-License-Identifier: Apache-2.0
// comm/mpi.hpp under real processes (ctest runs this under `mpiexec -n 4` and `-n 3`): every shared
// fault case (C1–C8) and the models sweep on MPI sub-communicators of each size P that fits in the
// world, and the split path for chunks larger than the per-message limit (lowered here).
#include <ulysses/comm/mpi.hpp>

#include "messages.hpp"
#include "mpi_groups.hpp"

#include <chrono>
#include <cstdio>
#include <thread>

#include "cases.hpp"
#include "expect_error.hpp"
#include "faults_mpi.hpp"

using namespace ulysses;
using ut::on_groups_of;
using ut::world_size;

namespace {

template <class T>
void check_mpi(const std::vector<ut::Case>& cases, std::size_t max_message = MpiComm::kIntMaxBytes) {
  for (auto c : cases)
    for (Path path : ut::host_paths<MpiComm>()) {  // MPI_Alltoallv, then one message per (peer, tensor) (MPI_Isend/Irecv)
      c.path = path;
      const std::string via = to_string(path);
      CAPTURE(c.name);
      CAPTURE(via);
      on_groups_of(c.P, [&](MPI_Comm sub) {
        MpiComm comm(sub, max_message);
        CHECK(ut::run_case<T>(comm, c) == "");
      });
    }
}

/// A plan of one float tensor on the message path: 2 heads and 4 tokens a rank of P, D = 8.
Plan messages_plan(int P, int r) {
  PlanOptions opt;
  opt.path = Path::messages;
  return Plan({P, r}, 1, SeqPartition::even(4 * P, P), {TensorSpec::of<float>(HeadPartition::even(2 * P, P), 8)}, Format::bshd, opt);
}

}  // namespace

TEST_CASE("MPI C1: batch > 1 in bshd, sbhd, bhsd") { check_mpi<float>(ut::c1_cases()); }

TEST_CASE("MPI C2: inverse and reference, P in {2,4}, q/k/v fused") {
  for (int P : {2, 4}) check_mpi<float>(ut::c2_cases(P));
  check_mpi<ut::bf16_t>(ut::c2_cases(2));
}

TEST_CASE("MPI zigzag partitions, P in {2,3,4}") {
  for (int P : {2, 3, 4}) check_mpi<float>(ut::zigzag_cases(P));
}

TEST_CASE("MPI C3: S=7 over P=2") { check_mpi<float>(ut::c3_cases()); }

TEST_CASE("MPI C4: H=7 over P=4") { check_mpi<float>(ut::c4_cases(4)); }

TEST_CASE("MPI C5: GQA, kv head r/2 on rank r") { check_mpi<float>({ut::c5_case()}); }

TEST_CASE("MPI C6: empty chunks, no hang") { check_mpi<float>(ut::c6_cases()); }

TEST_CASE("MPI C7: non-contiguous input view") {
  on_groups_of(2, [&](MPI_Comm sub) {
    MpiComm comm(sub);
    CHECK(ut::run_view_case<float>(comm, 2) == "");
  });
}

TEST_CASE("MPI C8: (B, P, S_local) order") { check_mpi<float>(ut::c8_cases()); }

TEST_CASE("MPI models: every model at every P that fits the world, q/k/v in one exchange") {
  for (const auto& m : ulysses_models::kModels)
    for (int P : {1, 2, 3, 4}) {
      const std::string name = m.name;
      CAPTURE(name);
      const bool even = ut::expected_even_error(m, P) == Errc{};
      check_mpi<ut::bf16_t>({ut::model_case(m, P, even)});
    }
}

TEST_CASE("MPI split path: chunks larger than the message limit go as several messages") {
  // A 7-byte limit splits every chunk (and rules out MPI_Alltoallv's int displacements).
  check_mpi<float>({ut::c5_case()}, 7);
  check_mpi<ut::fp8_t>(ut::c6_cases(), 3);
  check_mpi<double>(ut::c3_cases(), 1);
}

TEST_CASE("MPI exchange_messages: the k-th message from rank i to j is j's k-th receive from i, split or not") {
  MpiComm world(MPI_COMM_WORLD);
  const int P = world.size(), i = world.rank();
  for (std::size_t limit : {MpiComm::kIntMaxBytes, std::size_t{3}}) {
    CAPTURE(limit);
    MpiComm comm(MPI_COMM_WORLD, limit);
    ut::MessagePattern m(P, i);  // rank i sends rank j (i + j + 1) bytes of 16*i + j, then 1 byte of 0xF0 + i
    comm.exchange_messages(m.send.data(), m.send.size(), m.recv.data(), m.recv.size());
    for (std::size_t k = 0; k < m.rbuf.size(); k += 2) {
      const int j = m.peer[k];
      CHECK(m.rbuf[k] == std::vector<std::byte>(static_cast<std::size_t>(i + j + 1), std::byte(16 * j + i)));
      CHECK(m.rbuf[k + 1] == std::vector<std::byte>(1, std::byte(0xF0 + j)));
    }
  }
}

TEST_CASE("MPI start_messages / finish_messages: the two halves of exchange_messages, the same bytes; nothing may come between") {
  MpiComm world(MPI_COMM_WORLD);
  static_assert(comm_traits<MpiComm>::split_messages, "MpiComm posts and completes in two calls");
  const int P = world.size(), i = world.rank();
  for (std::size_t limit : {MpiComm::kIntMaxBytes, std::size_t{3}}) {
    CAPTURE(limit);
    MpiComm comm(MPI_COMM_WORLD, limit);
    comm.finish_messages();  // nothing started: nothing to do
    ut::MessagePattern m(P, i);
    comm.start_messages(m.send.data(), m.send.size(), m.recv.data(), m.recv.size());
    const std::uint64_t word = 1;
    std::vector<std::uint64_t> all(static_cast<std::size_t>(P));
    CHECK(ut::code_of([&] { comm.allgather(&word, sizeof word, all.data()); }) == Errc::invalid_shape);  // refused locally, nothing sent
    comm.finish_messages();
    for (std::size_t k = 0; k < m.rbuf.size(); k += 2) {
      const int j = m.peer[k];
      CHECK(m.rbuf[k] == std::vector<std::byte>(static_cast<std::size_t>(i + j + 1), std::byte(16 * j + i)));
      CHECK(m.rbuf[k + 1] == std::vector<std::byte>(1, std::byte(0xF0 + j)));
    }
    comm.allgather(&word, sizeof word, all.data());  // usable again
    CHECK(all == std::vector<std::uint64_t>(static_cast<std::size_t>(P), 1));
  }
}

TEST_CASE("MPI exchange_messages: a message shorter than its receive is plan_mismatch on the receiver, and its peers hear at once") {
  // late: the bystanders (ranks 2..) make their MpiComm only once rank 1's notice is there (it gave
  // up first); that notice is this MpiComm's, not an earlier one's (a bystander that dropped it as
  // stale waited out its deadline: CI's hang of test_comm_mpi -n 3).
  for (bool late : {false, true}) {
    CAPTURE(late);
    MPI_Comm dup = MPI_COMM_NULL;  // broken by the test: a communicator of its own
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    const int P = world_size(), i = ut::world_rank();
    if (P < 2) return;
    for (int there = 0, polls = 0; late && i >= 2 && !there && polls < 50000; ++polls) {  // (bounded: 5 s)
      MPI_Iprobe(1, MpiComm::kNoticeTag, dup, &there, MPI_STATUS_IGNORE);
      if (!there) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    MpiComm comm(dup, MpiComm::kIntMaxBytes, std::chrono::seconds(20));  // (a lost notice fails at 20 s, not at 5 min)
    std::vector<std::byte> buf(200, std::byte{7});
    const Message to1{1, buf.data(), 100}, from0{0, buf.data(), 200};  // rank 0 sends 100 bytes, rank 1 expects 200
    const auto t0 = std::chrono::steady_clock::now();
    const Errc first = ut::code_of([&] { comm.exchange_messages(&to1, i == 0 ? 1 : 0, &from0, i == 1 ? 1 : 0); });
    if (i == 1) CHECK(first == Errc::plan_mismatch);
    else CHECK((first == Errc{} || first == Errc::aborted));  // aborted: rank 1's notice was there already
    std::uint64_t word = 1;
    std::vector<std::uint64_t> all(static_cast<std::size_t>(P));
    CHECK(ut::code_of([&] { comm.allgather(&word, sizeof word, all.data()); }) == Errc::aborted);  // every rank, not at a deadline
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  }
}

TEST_CASE("MPI notices: an earlier MpiComm's notices never break a later one over the same MPI communicator, whichever rank is ahead") {
  const int P = world_size(), i = ut::world_rank();
  if (P < 2) return;
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  const std::chrono::seconds deadline(20);
  {
    MpiComm first(dup, MpiComm::kIntMaxBytes, deadline);
    if (i == 0) first.abort("the test breaks the first MpiComm");  // its notices reach the peers, whose first reads none
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MpiComm second(dup, MpiComm::kIntMaxBytes, deadline);
  std::uint64_t word = static_cast<std::uint64_t>(i);
  std::vector<std::uint64_t> all(static_cast<std::size_t>(P));
  CHECK(ut::code_of([&] { second.allgather(&word, sizeof word, all.data()); }) == Errc{});  // the first's notice: dropped
  for (int p = 0; p < P; ++p) CHECK(all[static_cast<std::size_t>(p)] == static_cast<std::uint64_t>(p));
  // Rank 0 moves on to a third MpiComm and breaks it while its peers still use their second: they
  // read its notice and keep it for their third, which is broken by it; the second is not.
  if (i == 0) MpiComm(dup, MpiComm::kIntMaxBytes, deadline).abort("rank 0 broke its third MpiComm");
  MPI_Barrier(MPI_COMM_WORLD);
  if (i != 0) {
    bool second_broken = false;
    for (const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300); std::chrono::steady_clock::now() < until;)
      second_broken = second_broken || second.poll_notices();
    CHECK_FALSE(second_broken);
    MpiComm third(dup, MpiComm::kIntMaxBytes, deadline);
    bool heard = false;
    for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10); !heard && std::chrono::steady_clock::now() < until;)
      heard = third.poll_notices();
    CHECK(heard);
    CHECK(ut::code_of([&] { third.allgather(&word, sizeof word, all.data()); }) == Errc::aborted);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("MPI: ranks whose offsets straddle the message limit still agree on one path (no hang)") {
  // P ranks, 4-byte chunks, limit 4: rank 0's largest offset is 4*(P-2), the last rank's 4*(P-1).
  for (int P : {2, 3, 4}) {
    ut::Case c{"straddle P=" + std::to_string(P), P, 1, SeqPartition::even(P, P), {{HeadPartition::even(P, P), 1}}, Format::bshd};
    check_mpi<float>({c}, 4);
    check_mpi<float>({c}, 8);
  }
}

TEST_CASE("MPI: a plan for another group size is rejected before the exchange") {
  MPI_Comm dup;  // (a communicator of its own)
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  MpiComm comm(dup);
  Plan plan({comm.size() + 1, 0}, 1, SeqPartition::balanced(8, comm.size() + 1),
            {TensorSpec::of<float>(HeadPartition::balanced(4, comm.size() + 1), 2)});
  std::vector<float> in(64), out(64);
  std::vector<std::byte> ws(plan.workspace_bytes());
  HostExecutor ex;
  try {
    seq_to_head(plan, comm, ex, in, out, ws);
    FAIL("expected comm_mismatch");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::comm_mismatch);
  }
  CHECK(!comm.broken());  // comm_mismatch breaks no group: the communicator is not the plan's
}

TEST_CASE("MPI cross-rank agreement: a rank with another S makes every rank throw plan_mismatch") {
  MpiComm comm(MPI_COMM_WORLD);
  const int P = comm.size(), r = comm.rank();
  if (P < 2) return;
  const int odd = P - 1;  // the last rank plans with a longer sequence
  Plan plan({P, r}, 1, SeqPartition::balanced(r == odd ? 4 * P : 2 * P, P),
            {TensorSpec::of<float>(HeadPartition::balanced(4, P), 2)});
  plan.set_agreement_check(true);
  std::vector<std::byte> in(plan.seq_bytes(0)), out(plan.head_bytes(0)), ws(plan.workspace_bytes());
  HostExecutor ex;
  try {
    seq_to_head(plan, comm, ex, in, out, ws);
    FAIL("expected plan_mismatch");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::plan_mismatch);
    CHECK(std::string(e.what()).find("ranks {" + std::to_string(odd) + "}") != std::string::npos);
  }
}

TEST_CASE("MPI chunk over 2 GiB (P=2, run by `mpiexec -n 2`; needs ~9 GiB of free memory)") {
  // Each rank sends 2 GiB + 4 KiB to the other: more than MPI's int count can describe.
  MpiComm comm(MPI_COMM_WORLD);
  if (comm.size() != 2) return;
  long long avail_kib = 0;
  if (FILE* f = std::fopen("/proc/meminfo", "r")) {
    char key[64];
    long long v;
    while (std::fscanf(f, "%63s %lld kB", key, &v) == 2)
      if (std::string(key) == "MemAvailable:") avail_kib = v;
    std::fclose(f);
  }
  int enough = avail_kib > (9ll << 20), all = 0;
  MPI_Allreduce(&enough, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) {
    MESSAGE("skipped: less than 9 GiB of memory available");
    return;
  }
  const std::size_t n = (std::size_t(1) << 31) + 4096;
  const int r = comm.rank(), peer = 1 - r;
  std::vector<std::size_t> sb(2, 0), so(2, 0), rb(2, 0), ro(2, 0);
  sb[peer] = rb[peer] = n;
  std::vector<std::byte> send(n), recv(n);
  for (std::size_t i = 0; i < n; i += 4096) send[i] = std::byte(static_cast<unsigned char>((i >> 12) * 31 + r));
  send[n - 1] = std::byte(0xA0 + r);
  comm.alltoallv(send.data(), sb.data(), so.data(), recv.data(), rb.data(), ro.data());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; i += 4096) bad += recv[i] != std::byte(static_cast<unsigned char>((i >> 12) * 31 + peer));
  CHECK(bad == 0);
  CHECK(recv[n - 1] == std::byte(0xA0 + peer));
}

// ---- training safety under MPI (this suite is built as the default preset: Release, NDEBUG) ------

TEST_CASE("MPI C9: ranks that planned different head splits throw plan_mismatch on every rank, default options") {
  for (const auto& split : ut::c9_splits())
    on_groups_of(2, [&](MPI_Comm sub) {
      MpiComm comm(sub);
      CHECK(ut::run_c9_case(comm, split, Path::automatic) == "");
    });
}

TEST_CASE("MPI C10: a kv split that does not follow the query split is refused on every rank before any exchange") {
  MpiComm comm(MPI_COMM_WORLD);
  const int P = comm.size(), r = comm.rank();
  if (P < 3) return;
  auto q = HeadPartition::even(P, P);  // one query head a rank; kv heads: 2, split balanced [1,1,0,..]
  auto [code, msg] = ut::error_of([&] {
    Plan({P, r}, 1, SeqPartition::even(2 * P, P), {TensorSpec::of<float>(q, 4), TensorSpec::of<float>(HeadPartition::balanced(2, P), 4)});
  });
  CHECK(code == (P % 2 == 0 ? Errc::gqa_invalid : Errc{}));  // H % Hkv: P even pairs it with tensor 0
  if (P % 2 == 0) CHECK(msg.find("rank " + std::to_string(P - 1) + " holds query heads") != std::string::npos);
}

TEST_CASE("MPI C11: MQA, every rank's partial gradient of the kv head is summed (fp32)") {
  for (Path path : ut::host_paths<MpiComm>())
    on_groups_of(4, [&](MPI_Comm sub) {
      MpiComm comm(sub);
      CHECK(ut::run_c11_case(comm, path) == "");
    });
}

TEST_CASE("MPI adjointness: every model at every P that fits the world, partitions, layouts, K, both exchange paths") {
  for (const auto& m : ulysses_models::kModels)
    for (int P : {1, 2, 3, 4}) {
      int i = 0;
      for (const auto& [pname, seq] : ut::sweep_partitions(P))
        for (int layout = 0; layout < 4; ++layout) {
          if ((i++ + P) % 3) continue;  // a rotation: every partition and layout for some model/P
          const bool even = ut::expected_even_error(m, P) == Errc{} && pname != "balanced";
          auto q = even ? HeadPartition::even(m.num_heads, P) : HeadPartition::balanced(m.num_heads, P);
          auto kv = HeadPartition::gqa(q, m.num_kv_heads);
          ut::Case c{std::string(m.name) + " P=" + std::to_string(P) + " " + pname + " layout " + std::to_string(layout), P, 1, seq,
                     {{q, m.head_dim}, {kv, m.head_dim}, {kv, m.v_head_dim}}, layout == 3 ? Format::bshd : ut::kFormats[layout],
                     1 + 2 * (i % 2)};
          c.padded = layout == 3;
          c.path = i % 3 != 0 ? Path::messages : Path::alltoallv;
          CAPTURE(c.name);
          on_groups_of(P, [&](MPI_Comm sub) {
            MpiComm comm(sub);
            const ut::AdjointShare s = ut::run_adjoint_case<float>(comm, c);
            CHECK(s.error == "");
            long long mine[2] = {s.forward, s.backward}, sum[2];
            MPI_Allreduce(mine, sum, 2, MPI_LONG_LONG, MPI_SUM, sub);
            CHECK(sum[0] == sum[1]);
          });
        }
    }
}

// ---- the failure model (comm/mpi_comm.hpp): bounded waits, coded errors, broken communicators ---------

namespace {

constexpr std::chrono::milliseconds kDeadline{300};  // the fault tests' timeout: short, the suite stays fast
constexpr double kMarginMs = 1500;                    // a loaded 2-core machine runs 3-8 ranks: scheduling delays

/// The failure-model tests on a duplicate of the world (its leftovers, a notice or a message
/// nobody took, stay on it) where the last rank skips call `call` (a callable as call(MpiComm&)):
/// the others must throw Error(timeout) within the deadline naming it when `names` (else naming
/// nobody), then Error(aborted) at once; after they have, the skipping rank enters the call and
/// throws Error(timeout) at once (their notices), then Error(aborted); drain(dup) runs on the
/// skipping rank to complete what the others left in flight.
template <class Call, class Drain>
void skip_case(Call&& call, bool names, Drain&& drain) {
  const int W = world_size();
  if (W < 2) return;
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  {
    MpiComm comm(dup, MpiComm::kIntMaxBytes, kDeadline);
    const int skip = W - 1;
    const std::string named = "ranks {" + std::to_string(skip) + "}";
    if (r != skip) {
      const ut::TimedError first = ut::timed_error_of([&] { call(comm); });
      const ut::TimedError next = ut::timed_error_of([&] { call(comm); });
      {
        CAPTURE(first.message);
        CAPTURE(next.message);
        CHECK(first.code == Errc::timeout);
        CHECK(first.ms < kDeadline.count() + kMarginMs);
        CHECK((first.message.find(named) != std::string::npos) == names);
        CHECK(first.message.find("MPI_Abort") != std::string::npos);
        CHECK(next.code == Errc::aborted);
        CHECK(next.ms < 100);
        CHECK(next.message.find("did not arrive") != std::string::npos);  // why: the first failure's message
        CHECK(comm.broken());
      }
      if (r == 0) MESSAGE("rank 0: timeout after " << first.ms << " ms (deadline " << kDeadline.count() << " ms), then aborted after "
                                                   << next.ms << " ms");
    }
    MPI_Barrier(MPI_COMM_WORLD);  // the skipping rank enters after the others gave up
    if (r == skip) {
      const ut::TimedError late = ut::timed_error_of([&] { call(comm); });
      CAPTURE(late.message);
      CHECK(late.code == Errc::timeout);
      CHECK(late.ms < 100);
      CHECK(late.message.find("gave up in call 0") != std::string::npos);
      CHECK(ut::code_of([&] { call(comm); }) == Errc::aborted);
      drain(dup);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  MPI_Comm_free(&dup);
}

}  // namespace

TEST_CASE("MPI failure model: a rank that skips exchange_messages: the others time out within the deadline naming it, then abort at once") {
  skip_case(
      [](MpiComm& comm) {
        ut::MessagePattern m(comm.size(), comm.rank());
        comm.exchange_messages(m.send.data(), m.send.size(), m.recv.data(), m.recv.size());
      },
      true, [](MPI_Comm) {});
}

TEST_CASE("MPI failure model: a timed-out all-to-all-v (MPI_Iallreduce, then MPI_Ialltoallv) cannot name the missing rank") {
  skip_case(
      [](MpiComm& comm) {
        const auto P = static_cast<std::size_t>(comm.size());
        std::vector<std::size_t> b(P, 4), o(P);
        for (std::size_t p = 0; p < P; ++p) o[p] = 4 * p;
        std::vector<std::byte> s(4 * P), rv(4 * P);
        comm.alltoallv(s.data(), b.data(), o.data(), rv.data(), b.data(), o.data());
      },
      false, [](MPI_Comm dup) {  // the others' MPI_Iallreduce (which path, which call) is still in flight: complete it
        int fits[3] = {1, 0, 0};
        MPI_Request q;
        MPI_Iallreduce(MPI_IN_PLACE, fits, 3, MPI_INT, MPI_MIN, dup, &q);
        MPI_Wait(&q, MPI_STATUS_IGNORE);
      });
}

TEST_CASE("MPI failure model: a timed-out allgather cannot name the missing rank either") {
  skip_case(
      [](MpiComm& comm) {
        std::uint64_t mine = 1;
        std::vector<std::uint64_t> all(static_cast<std::size_t>(comm.size()));
        comm.allgather(&mine, sizeof mine, all.data());
      },
      false, [](MPI_Comm dup) {  // complete the others' MPI_Iallgather (non-blocking: a blocking one would not match it)
        std::uint64_t mine = 1;
        std::vector<std::uint64_t> all(static_cast<std::size_t>(world_size()));
        MPI_Request q;
        MPI_Iallgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, dup, &q);
        MPI_Wait(&q, MPI_STATUS_IGNORE);
      });
}

TEST_CASE("C19 under MPI (MpiComm): one rank's mistake is every rank's coded error at once, not at the deadline") {
  // Every cell on a fresh duplicate of the world (a broken MpiComm is not used again); the
  // deadline is 30 s, a notice reaches the peers in milliseconds. A skipped call cannot pair: its
  // messages carry another call's tag, so every rank ends at the (here 2 s) deadline instead; so
  // do the peers of a rank that passed another MPI communicator, which its notice cannot reach.
  int W = 0, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  if (W < 2) return;
  const double slowest = ut::run_mpi_fault_matrix(true, [&](ut::FaultOp op, ut::Fault f, bool warm) {
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    const bool deadline = f == ut::Fault::skipped_call || f == ut::Fault::wrong_comm;  // no message can reach the peers
    MpiComm comm(dup, MpiComm::kIntMaxBytes, deadline ? std::chrono::seconds(2) : std::chrono::seconds(30));
    MPI_Comm other;  // Fault::wrong_comm: the world in reverse order (another MPI communicator: rank W-1 is its rank 0)
    MPI_Comm_split(MPI_COMM_WORLD, 0, W - 1 - me, &other);
    MpiComm wrong(other, MpiComm::kIntMaxBytes, std::chrono::seconds(2));
    const ut::TimedError e = ut::run_fault(comm, op, f, W - 1, wrong, warm);
    const std::string cell = std::string(ut::name_of(op)) + " / " + ut::name_of(f) + (warm ? " (warm)" : "");
    CAPTURE(cell);
    CAPTURE(e.message);
    CHECK(ut::judge_fault(e, f, me, W - 1, ut::kToldWithinMs) == "");
    if (f == ut::Fault::wrong_comm && me != W - 1) CHECK(e.ms < 2000 + 5000);  // at their deadline, not later
    return e;
  });
  MESSAGE("MpiComm, -n " << W << ": slowest rank of every local failure " << slowest << " ms (deadline 30000 ms)");
}

TEST_CASE("MPI call probe: ranks in different calls of the same number on the message path get plan_mismatch on every rank within seconds, not at the deadline") {
  // Rank `odd` runs head->seq where its peers run seq->head of the same plan (its call number is
  // theirs, its word another): their messages carry other tags and never pair. The waits' call
  // probe (after a tenth of the deadline, at most 2 s) finds it: every rank plan_mismatch, far
  // before the 30 s deadline; the peers that saw it themselves or through a shared notice alike.
  const int P = world_size();
  if (P < 2) return;
  for (int odd : {0, P - 1}) {
    CAPTURE(odd);
    MPI_Comm dup = MPI_COMM_NULL;  // broken by the test: a communicator of its own
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    {
      MpiComm comm(dup, MpiComm::kIntMaxBytes, std::chrono::seconds(30));
      const int r = comm.rank();
      const Plan plan = messages_plan(P, r);
      const Direction d = r == odd ? Direction::head_to_seq : Direction::seq_to_head;
      std::vector<float> in(plan.input_bytes(d, 0) / 4, 1.0f), out(plan.output_bytes(d, 0) / 4);
      std::vector<std::byte> ws(plan.workspace_bytes());
      HostExecutor ex;
      const ut::TimedError t = ut::timed_error_of([&] {
        redistribute(plan, d, comm, ex, {ConstByteSpan(in.data(), in.size() * 4)}, {ByteSpan(out.data(), out.size() * 4)}, {ws.data(), ws.size()});
      });
      CAPTURE(r);
      CAPTURE(t.message);
      CHECK(t.code == Errc::plan_mismatch);
      CHECK(t.ms < 10000);
    }
    ut::drop_leftovers(dup);  // the probes and notices nobody read
    MPI_Comm_free(&dup);
  }
}

TEST_CASE("MPI slow peer: a call that outlasts the call probe's grace, some messages in and some not, is the right bytes, not plan_mismatch") {
  // The last rank enters seq->head 800 ms late with a 3 s deadline (the call probe asks from 300 ms
  // on which messages are still missing): the other ranks' receives from each other complete
  // before the probe asks, those from the late rank after. The probe once took the completed
  // receives' statuses (MPI_Test), and the wait read 0 bytes for them: a false plan_mismatch
  // (seen on a 200 Mbit/s link, bench/netns). Every rank gets the bytes of the same call made in step.
  const int P = world_size();
  if (P < 3) return;
  MpiComm comm(MPI_COMM_WORLD, MpiComm::kIntMaxBytes, std::chrono::seconds(3));
  const int r = comm.rank();
  const Plan plan = messages_plan(P, r);
  const Direction d = Direction::seq_to_head;
  std::vector<float> in(plan.input_bytes(d, 0) / 4), out(plan.output_bytes(d, 0) / 4, -1.0f), want(out.size());
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(r * 100000 + static_cast<int>(i));
  std::vector<std::byte> ws(plan.workspace_bytes());
  HostExecutor ex;
  redistribute(plan, d, comm, ex, {ConstByteSpan(in.data(), in.size() * 4)}, {ByteSpan(want.data(), want.size() * 4)}, {ws.data(), ws.size()});
  if (r == P - 1) std::this_thread::sleep_for(std::chrono::milliseconds(800));
  const ut::TimedError t = ut::timed_error_of([&] {
    redistribute(plan, d, comm, ex, {ConstByteSpan(in.data(), in.size() * 4)}, {ByteSpan(out.data(), out.size() * 4)}, {ws.data(), ws.size()});
  });
  CAPTURE(r);
  CAPTURE(t.message);
  CHECK(t.message.empty());
  CHECK(out == want);
}

TEST_CASE("MPI late rank: a rank that enters a call after its peers gave up on it fails that call too, never returns as if it had paired") {
  // The last rank enters seq->head 1.5 s late under a 400 ms deadline: its peers time out and
  // tell it. Their messages (a few hundred bytes: eager, delivered and complete on its side)
  // reached it before their notices, so its waits could complete and the call return with the
  // right bytes while every peer threw; it heard of their timeout only in its next call. Every
  // rank gets an Error of this call, the late one Error(timeout) naming the peer that gave up.
  const int P = world_size();
  if (P < 2) return;
  MPI_Comm dup = MPI_COMM_NULL;  // broken by the test: a communicator of its own
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  {
    MpiComm comm(dup, MpiComm::kIntMaxBytes, std::chrono::milliseconds(400));
    const int r = comm.rank();
    const Plan plan = messages_plan(P, r);
    const Direction d = Direction::seq_to_head;
    std::vector<float> in(plan.input_bytes(d, 0) / 4, 1.0f), out(plan.output_bytes(d, 0) / 4);
    std::vector<std::byte> ws(plan.workspace_bytes());
    HostExecutor ex;
    auto call = [&] {
      redistribute(plan, d, comm, ex, {ConstByteSpan(in.data(), in.size() * 4)}, {ByteSpan(out.data(), out.size() * 4)}, {ws.data(), ws.size()});
    };
    call();  // agreement checked: the next call meets its peers in the messages
    if (r == P - 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    const ut::TimedError t = ut::timed_error_of(call);
    CAPTURE(r);
    CAPTURE(t.message);
    CHECK(t.code == Errc::timeout);
    if (r == P - 1) CHECK(t.message.find("gave up in call") != std::string::npos);
    CHECK(ut::code_of(call) == Errc::aborted);  // and the communicator stays broken
  }
  ut::drop_leftovers(dup);
  MPI_Comm_free(&dup);
}

int main(int argc, char** argv) { return ut::mpi_doctest_main(argc, argv); }

TEST_CASE("MPI two-level exchange: simulated node layouts of the whole world (8 = 2x4, 6 = 3x2, uneven), same bits") {
  // ctest runs this under -n 8 and -n 6 too; every world size checks its node layouts.
  const int P = world_size();
  for (const ut::Case& c : ut::two_level_cases(P, Path::automatic)) {  // the node layout selects the path
    CAPTURE(c.name);
    CHECK(choose_path<MpiComm, HostExecutor>(ut::plan_of<float>(c, 0)) == Path::two_level);
    on_groups_of(P, [&](MPI_Comm sub) {
      MpiComm comm(sub);
      CHECK(ut::run_case<float>(comm, c) == "");
    });
  }
  if (P >= 4) {  // split messages (a limit below the chunk sizes) on the two-level rounds too
    ut::Case c = ut::two_level_cases(P, Path::two_level).front();
    on_groups_of(P, [&](MPI_Comm sub) {
      MpiComm comm(sub, 24);
      CHECK(ut::run_case<float>(comm, c) == "");
    });
  }
}

TEST_CASE("MPI split_by_node: Ulysses groups of consecutive node-first ranks, outer groups across them") {
  const int W = world_size();
  int w = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &w);
  for (int R : {1, 2, W}) {
    if (W % R) continue;
    for (int P = 1; P <= W; ++P) {
      CAPTURE(R);
      CAPTURE(P);
      const bool fits = W % P == 0 && (P <= R ? R % P == 0 : P % R == 0);
      if (!fits) {
        CHECK(ut::code_of([&] { split_by_node(MPI_COMM_WORLD, P, R); }) == Errc::invalid_mesh);
        continue;
      }
      MpiMesh m = split_by_node(MPI_COMM_WORLD, P, R);
      CHECK(m.index == w);  // simulated nodes of consecutive world ranks: the numbering is the world's
      int ur = -1, us = 0, orank = -1, os = 0;
      MPI_Comm_rank(m.ulysses, &ur);
      MPI_Comm_size(m.ulysses, &us);
      MPI_Comm_rank(m.outer, &orank);
      MPI_Comm_size(m.outer, &os);
      CHECK(us == P);
      CHECK(os == W / P);
      CHECK(ur == w % P);
      CHECK(orank == w / P);
      CHECK(m.nodes.num_nodes() == (P > R ? P / R : 1));
      // Every member of my Ulysses group is in it: the world ranks gathered over it are consecutive.
      std::vector<int> members(static_cast<std::size_t>(P));
      MPI_Allgather(&w, 1, MPI_INT, members.data(), 1, MPI_INT, m.ulysses);
      for (int i = 0; i < P; ++i) CHECK(members[static_cast<std::size_t>(i)] == w / P * P + i);
      if (m.nodes.spans_nodes()) {  // the mesh selects the two-level exchange on its Ulysses group, bit for bit
        auto q = HeadPartition::balanced(2 * P, P);
        ut::Case c{"mesh-selected two-level", P, 2, SeqPartition::balanced(3 * P + 1, P), {{q, 4}, {HeadPartition::gqa(q, 2), 4}}, Format::bshd};
        c.nodes = m.nodes;
        CHECK(choose_path<MpiComm, HostExecutor>(ut::plan_of<float>(c, 0)) == Path::two_level);
        MpiComm comm(m.ulysses);
        CHECK(ut::run_case<float>(comm, c) == "");
      }
      m.free();
    }
  }
  CHECK(ut::code_of([&] { split_by_node(MPI_COMM_WORLD, 1, -1); }) == Errc::invalid_mesh);
  if (W % 3 != 0) CHECK(ut::code_of([&] { split_by_node(MPI_COMM_WORLD, 1, 3); }) == Errc::invalid_mesh);  // not whole nodes of 3
  CHECK(ut::code_of([&] { split_by_node(MPI_COMM_WORLD, 1, 2 * W); }) == Errc::invalid_mesh);
  // The real topology (one shared-memory node here): every rank on node 0, groups of consecutive ranks.
  MpiMesh m = split_by_node(MPI_COMM_WORLD, W);
  CHECK(m.mesh.num_nodes() == 1);
  CHECK(m.index == w);
  CHECK(!m.nodes.spans_nodes());
  m.free();
}
