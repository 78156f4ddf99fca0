// SPDX-License-Identifier: Apache-2.0
// comm/tell_peers.hpp in-process (LocalGroup, P = 2, 3, 4): bug case C19's matrix. One rank
// makes one local mistake in a call (a short or overlapping buffer, a wrong communicator, an
// exception in its own code, a skipped call); it throws its own code at once and its peers throw
// Error(aborted) naming it and its code at once, not at their deadline (30 s here); a skipped call
// is plan_mismatch on every rank, never a silent pairing. Forward, backward, a ring step, decode;
// cold (the faulty call meets the agreement check) and warm (the transport).
#include <ulysses/ulysses.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "faults.hpp"

using namespace ulysses;

namespace {

/// Runs the (op, fault) cell on a LocalGroup of P ranks with rank `bad` failing; returns the
/// slowest rank's time, and CHECKs every rank's outcome.
double run_cell(int P, ut::FaultOp op, ut::Fault f, bool warm) {
  const int bad = P - 1;
  LocalGroup g(P, f == ut::Fault::wrong_comm ? std::chrono::milliseconds(300) : std::chrono::milliseconds(30000));
  std::vector<ut::TimedError> got(static_cast<std::size_t>(P));
  LocalGroup other(P);
  auto wrong_for_bad = other.comm(0);  // Fault::wrong_comm: a handle of another group (rank 0 of it, not rank P-1)
  g.spawn([&](LocalGroup::Comm& c) {
    got[static_cast<std::size_t>(c.rank())] = ut::run_fault(c, op, f, bad, c.rank() == bad ? wrong_for_bad : c, warm);
  });
  double slowest = 0;
  for (int r = 0; r < P; ++r) {
    const ut::TimedError& e = got[static_cast<std::size_t>(r)];
    CAPTURE(P);
    const std::string cell = std::string(ut::name_of(op)) + " / " + ut::name_of(f);
    CAPTURE(cell);
    CAPTURE(warm);
    CHECK(ut::judge_fault(e, f, r, bad, ut::kToldWithinMs) == "");  // a message reached them: not the 30 s deadline
    if (f == ut::Fault::wrong_comm && r != bad) CHECK(e.ms < 300 + 5000);  // at their deadline, not later
    if (f == ut::Fault::skipped_call) CHECK(e.code == Errc::plan_mismatch);  // every rank compares the calls
    slowest = std::max(slowest, e.ms);
  }
  // The group is broken after a failure of one rank (not after a plan_mismatch, a verdict of all).
  if (f != ut::Fault::skipped_call) CHECK(ut::code_of([&] { auto c = g.comm(0); c.barrier(); }) == Errc::aborted);
  return slowest;
}

}  // namespace

TEST_CASE("C19 in-process: one rank's mistake is every rank's coded error at once (seq_to_head, backward: every fault)") {
  for (int P : {2, 3, 4})
    for (ut::FaultOp op : {ut::FaultOp::seq_to_head, ut::FaultOp::backward})
      for (ut::Fault f : {ut::Fault::short_buffer, ut::Fault::overlap, ut::Fault::wrong_comm, ut::Fault::engine_throw, ut::Fault::skipped_call})
        for (bool warm : {false, true}) {
          const double ms = run_cell(P, op, f, warm);
          if (P == 4 && op == ut::FaultOp::seq_to_head && !warm) MESSAGE(std::string(ut::name_of(f)) << ": slowest rank " << ms << " ms (deadline " << (f == ut::Fault::wrong_comm ? 300 : 30000) << " ms)");
        }
}

TEST_CASE("C19 in-process: a ring step and the decode exchange break the group the same way") {
  for (int P : {2, 3, 4}) {
    for (ut::Fault f : {ut::Fault::short_buffer, ut::Fault::engine_throw, ut::Fault::skipped_call})
      for (bool warm : {false, true}) run_cell(P, ut::FaultOp::ring_step, f, warm);
    for (ut::Fault f : {ut::Fault::short_buffer, ut::Fault::wrong_comm, ut::Fault::engine_throw})
      for (bool warm : {false, true}) run_cell(P, ut::FaultOp::decode, f, warm);
  }
}

TEST_CASE("call numbers: a rank at another call is named with its call on every rank") {
  LocalGroup g(3, std::chrono::seconds(30));
  std::vector<std::string> msg(3);
  g.spawn([&](LocalGroup::Comm& c) {
    const ut::FaultPlan fp(3, c.rank());
    std::vector<float> q(fp.plan.seq_bytes(0) / 4), k(fp.plan.seq_bytes(1) / 4), q2(fp.plan.head_bytes(0) / 4), k2(fp.plan.head_bytes(1) / 4);
    HostExecutor ex;
    auto s2h = [&] { seq_to_head(fp.plan, c, ex, {ConstByteSpan(q), ConstByteSpan(k)}, {ByteSpan(q2), ByteSpan(k2)}, {}); };
    s2h();
    if (c.rank() == 2) detail::begin_call(c, "seq_to_head", 0);  // as if it had made (and not paired) one call more
    msg[static_cast<std::size_t>(c.rank())] = ut::error_of(s2h).second;
  });
  for (const std::string& m : msg) {
    CAPTURE(m);
    CHECK(m.find("plan_mismatch") != std::string::npos);
    CHECK(m.find("rank 2 differs from rank 0 in the library call (rank 2: call 3 (seq_to_head); rank 0: call 2 (seq_to_head))") != std::string::npos);
  }
}

TEST_CASE("call numbers: ranks in the same call under one name with other row transforms are told apart by the call's record") {
  const std::int64_t S = 8, H = 4, D = 8;
  const Rope rope(D, S);
  for (bool warm : {false, true}) {
    LocalGroup g(2, std::chrono::seconds(30));
    std::vector<std::string> msg(2);
    g.spawn([&](LocalGroup::Comm& c) {
      const Plan plan({2, c.rank()}, 1, SeqPartition::even(S, 2), {TensorSpec::of<float>(HeadPartition::even(H, 2), D).with_row_transforms()});
      std::vector<float> x(plan.seq_bytes(0) / 4, 1.0f), y(plan.head_bytes(0) / 4);
      std::vector<std::byte> ws(plan.workspace_bytes());
      HostExecutor ex;
      RowTransforms plain, rotated;
      rotated.on_pack(0, rope);
      if (warm) seq_to_head(plan, c, ex, {ConstByteSpan(x)}, {ByteSpan(y)}, ws, plain);
      msg[static_cast<std::size_t>(c.rank())] =
          ut::error_of([&] { seq_to_head(plan, c, ex, {ConstByteSpan(x)}, {ByteSpan(y)}, ws, c.rank() == 1 ? rotated : plain); }).second;
    });
    for (const std::string& m : msg) {
      CAPTURE(warm);
      CAPTURE(m);
      CHECK(m.find("plan_mismatch") != std::string::npos);
      const std::string call = warm ? "call 2 (seq_to_head, record 0x" : "call 1 (seq_to_head, record 0x";
      auto record_of = [&](const std::string& who) {  // the 16 hex digits after "<who>: <call>", "" when absent
        const std::size_t at = m.find(who + ": " + call);
        if (at == std::string::npos) return std::string();
        const std::string digits = m.substr(at + who.size() + 2 + call.size(), 17);
        return digits.size() == 17 && digits[16] == ')' && digits.find_first_not_of("0123456789abcdef") == 16 ? digits.substr(0, 16) : std::string();
      };
      const std::string mine = record_of("(rank 1"), theirs = record_of("; rank 0");
      CHECK(mine.size() == 16);
      CHECK(theirs.size() == 16);
      CHECK(mine != theirs);  // the two calls never read alike
    }
  }
}

TEST_CASE("break_group_on_failure: returns f's value, breaks nothing when f succeeds") {
  LocalGroup g(2);
  g.spawn([&](LocalGroup::Comm& c) {
    CHECK(break_group_on_failure(c, "a step", [] { return 7; }) == 7);
    c.barrier();  // still usable
  });
}

TEST_CASE("a ring peer that leaves mid-rotation (mlx #4060): every survivor's error names it") {
  const int W = 4, gone = 1;
  LocalGroup g(W, std::chrono::milliseconds(300));
  std::vector<ut::TimedError> got(W);
  g.spawn([&](LocalGroup::Comm& c) {
    const int r = c.rank();
    const std::size_t block = 64;
    std::vector<std::byte> b0(block, std::byte{1}), b1(block);
    RingRotation<LocalGroup::Comm> rot(c, std::vector<std::size_t>(W, block), RingBuffers().kv(b0.data(), block, b1.data(), block), RingProgress::in_start);
    got[static_cast<std::size_t>(r)] = ut::timed_error_of([&] {
      for (int layer = 0; layer < 2; ++layer)
        for (int s = 0; s < W; ++s) {
          if (r == gone && (layer > 0 || s > 0)) return;  // it leaves
          rot.start(s);
          rot.finish(s);
        }
    });
  });
  for (int r = 0; r < W; ++r) {
    if (r == gone) continue;
    const ut::TimedError& e = got[static_cast<std::size_t>(r)];
    CAPTURE(e.message);
    CHECK((e.code == Errc::timeout || e.code == Errc::aborted));
    CHECK(e.message.find("ranks {1} did not arrive") != std::string::npos);
  }
}
