// SPDX-License-Identifier: Apache-2.0
// The fault-injection matrix of bug case C19 (one rank's error is every rank's error), shared by
// the in-process and MPI tests: one call of an operation (seq->head, its backward, a ring step, the
// decode exchange) on every rank of a group, where rank `bad` makes one local mistake (a short or
// overlapping buffer, a wrong communicator, an exception in its own code between two calls, a
// skipped call). Each rank returns its error, its code and how long it took.
#pragma once

#include <ulysses/ulysses.hpp>

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "decode_case.hpp"
#include "expect_error.hpp"

namespace ut {

/// Issue 30's target: where a message can carry a failure, every rank has its coded error within
/// 100 ms (the deadline of these tests is 30 s; quiet runs measure well under 2 ms).
inline constexpr double kToldWithinMs = 100;

enum class FaultOp { seq_to_head, backward, ring_step, decode };
enum class Fault { short_buffer, overlap, wrong_comm, engine_throw, skipped_call };

inline const char* name_of(FaultOp o) {
  return o == FaultOp::seq_to_head ? "seq_to_head" : o == FaultOp::backward ? "seq_to_head_backward" : o == FaultOp::ring_step ? "ring step" : "decode";
}
inline const char* name_of(Fault f) {
  return f == Fault::short_buffer ? "short buffer" : f == Fault::overlap ? "overlapping buffer" : f == Fault::wrong_comm ? "wrong communicator"
       : f == Fault::engine_throw ? "exception in the engine" : "skipped call";
}

/// The code the failing rank throws for fault f.
inline ulysses::Errc own_code(Fault f) {
  using ulysses::Errc;
  return f == Fault::short_buffer ? Errc::buffer_too_small : f == Fault::overlap ? Errc::buffer_overlap : f == Fault::wrong_comm ? Errc::comm_mismatch
       : f == Fault::engine_throw ? Errc::backend : Errc::plan_mismatch;
}

/// The fixture of the Ulysses cases: P ranks, B=2, S=2P, q with 2P heads and one kv head (MQA: a
/// replicated head, whose backward sums), D=4, fp32.
struct FaultPlan {
  ulysses::Plan plan;
  FaultPlan(int P, int r)
      : plan({P, r}, 2, ulysses::SeqPartition::even(2 * P, P),
             {ulysses::TensorSpec::of<float>(ulysses::HeadPartition::even(2 * P, P), 4),
              ulysses::TensorSpec::of<float>(ulysses::HeadPartition::gqa(ulysses::HeadPartition::even(2 * P, P), 1), 4)}) {}
};

/// One call of `op` on this rank of `comm`, rank `bad` making mistake `f` (`wrong`: the
/// communicator it passes for Fault::wrong_comm, of the same type). The calls go through the
/// communicator the way an engine makes them; returns this rank's error (Errc{} when none) and
/// its time. `warm`: every rank first makes one correct call (agreement checked, lists built), so
/// that the faulty call meets its peers in the transport rather than in the agreement check.
template <class Comm>
TimedError run_fault(Comm& comm, FaultOp op, Fault f, int bad, Comm& wrong, bool warm) {
  using namespace ulysses;
  const int P = comm.size(), r = comm.rank();
  const bool me = r == bad;
  HostExecutor ex;
  if (op == FaultOp::seq_to_head || op == FaultOp::backward) {
    const FaultPlan fp(P, r);
    const Plan& plan = fp.plan;
    const Direction d = op == FaultOp::seq_to_head ? Direction::seq_to_head : Direction::head_to_seq;
    std::vector<float> q(plan.input_bytes(d, 0) / 4, 1.0f), k(plan.input_bytes(d, 1) / 4, 2.0f);
    std::vector<float> q2(plan.output_bytes(d, 0) / 4 + 16), k2(plan.output_bytes(d, 1) / 4);
    std::vector<std::byte> ws(plan.workspace_bytes());
    auto call = [&](Comm& c, ByteSpan o0, ByteSpan o1) {
      if (d == Direction::seq_to_head)
        seq_to_head(plan, c, ex, {ConstByteSpan(q), ConstByteSpan(k)}, {o0, o1}, {ws.data(), ws.size()});
      else
        seq_to_head_backward(plan, c, ex, {ConstByteSpan(q), ConstByteSpan(k)}, {o0, o1}, {ws.data(), ws.size()});
    };
    const ByteSpan o0(reinterpret_cast<std::byte*>(q2.data()), plan.output_bytes(d, 0));
    const ByteSpan o1(k2);
    if (warm) {
      const TimedError w = timed_error_of([&] { call(comm, o0, o1); });
      if (w.code != Errc{}) return w;  // (see the ring's)
    }
    return timed_error_of([&] {
      if (!me) return call(comm, o0, o1);
      switch (f) {
        case Fault::short_buffer: return call(comm, ByteSpan(o0.data, o0.bytes - 2), o1);  // C19: 2 bytes short
        case Fault::overlap: return call(comm, o0, ByteSpan(reinterpret_cast<std::byte*>(q2.data()) + 16, o1.bytes));
        case Fault::wrong_comm: return call(wrong, o0, o1);
        case Fault::engine_throw:
          return break_group_on_failure(comm, "its attention", [] { throw Error(Errc::backend, "the engine's attention kernel failed"); });
        case Fault::skipped_call: {  // the other direction of the same plan: its peers' call must not pair with it
          const Direction o = backward_of(d);
          std::vector<float> a(plan.input_bytes(o, 0) / 4), b(plan.input_bytes(o, 1) / 4), c(plan.output_bytes(o, 0) / 4),
              e(plan.output_bytes(o, 1) / 4);
          redistribute(plan, o, comm, ex, {ConstByteSpan(a), ConstByteSpan(b)}, {ByteSpan(c), ByteSpan(e)}, {ws.data(), ws.size()});
          return;
        }
      }
    });
  }
  if (op == FaultOp::ring_step) {  // a ring of P ranks, blocks of 64 bytes; rank `bad`'s buffers short, or its step skipped
    const std::size_t block = 64;
    std::vector<std::byte> b0(block, std::byte{1}), b1(block);
    auto rotate = [&](Comm& c, std::size_t cap, int first) {  // (first: the first step this rank runs)
      RingRotation<Comm> rot(c, std::vector<std::size_t>(static_cast<std::size_t>(P), block), b0.data(), b1.data(), cap,
                             RingProgress::in_start);
      for (int s = first; s < P; ++s) {
        rot.start(s);
        rot.finish(s);
      }
    };
    if (warm) {  // a rank that finished its warm rotation may fail while a peer still waits for its last block
      const TimedError w = timed_error_of([&] { rotate(comm, block, 0); });  // from another: that peer is then aborted there
      if (w.code != Errc{}) return w;
    }
    return timed_error_of([&] {
      if (!me) return rotate(comm, block, 0);
      switch (f) {
        case Fault::short_buffer: return rotate(comm, block - 2, 0);
        case Fault::wrong_comm: return rotate(wrong, block, 0);
        case Fault::engine_throw:
          return break_group_on_failure(comm, "its attention", [] { throw Error(Errc::backend, "the engine's attention kernel failed"); });
        case Fault::skipped_call: {  // runs the backward's rotation where its peers run the forward's: never paired
          std::vector<std::byte> g0(block), g1(block);
          RingGradRotation<Comm> back(comm, std::vector<std::size_t>(static_cast<std::size_t>(P), block), b0.data(), b1.data(), block,
                                      std::vector<std::size_t>(static_cast<std::size_t>(P), block), g0.data(), g1.data(), block,
                                      RingProgress::in_start);
          back.start(0);
          back.finish(0);
          return;
        }
        case Fault::overlap: return rotate(comm, block, 0);
      }
    });
  }
  // The decode exchange of bug case C16's shape (P ranks; this rank's partials are zeros).
  ud::DecodeCase dc = ud::c16();
  dc.P = P;
  dc.empty.clear();
  const DecodePlan plan(ud::spec_of(dc, r), r);
  const ud::Layouts l = ud::layouts_of(dc, plan.spec().heads, r);
  std::vector<std::byte> in = ud::buffer(l.partial, 4, 0), lse = ud::buffer(l.lse, 4, 0), out = ud::buffer(l.out, 4, 0),
                         out_lse = ud::buffer(l.out_lse, 4, 0), ws(plan.workspace_bytes() + 16);
  const DecodeBuffers b = DecodeBuffers().partial(in).lse(lse).out(out).out_lse(out_lse).workspace(ws);
  const HostDecodeExecutor dx;
  if (warm) {
    const TimedError w = timed_error_of([&] { decode_exchange(plan, comm, dx, b); });
    if (w.code != Errc{}) return w;
  }
  return timed_error_of([&] {
    if (!me) return decode_exchange(plan, comm, dx, b);
    switch (f) {
      case Fault::short_buffer: return decode_exchange(plan, comm, dx, b.out({out.data(), 2}));
      case Fault::overlap: return decode_exchange(plan, comm, dx, b.out({in.data(), out.size()}));
      case Fault::wrong_comm: return decode_exchange(plan, wrong, dx, b);
      case Fault::engine_throw:
        return break_group_on_failure(comm, "its attention", [] { throw Error(Errc::backend, "the engine's attention kernel failed"); });
      case Fault::skipped_call: return;
    }
  });
}

/// Checks one rank's outcome of run_fault(): the failing rank its own code at once; its peers
/// Error(aborted) naming it and its code within `fast_ms` (a message reached them), but
/// Error(timeout) (their deadline) for a wrong communicator, which the library does not break
/// (it is another group: breaking it would break innocent ranks); a skipped
/// call: an error on every rank, plan_mismatch where the ranks compare their calls, a timeout
/// where the messages of different calls only cannot pair (MPI's tags), never a silent pairing.
/// Returns "" or what is wrong.
inline std::string judge_fault(const TimedError& e, Fault f, int r, int bad, double fast_ms) {
  using ulysses::Errc;
  const std::string why = "rank " + std::to_string(r) + ": " + e.message + " (" + std::to_string(e.ms) + " ms)";
  if (f == Fault::skipped_call) {
    if (e.code != Errc::plan_mismatch && e.code != Errc::aborted && e.code != Errc::timeout) return "a skipped call gave " + why;  // never paired
    return "";
  }
  if (r == bad) {
    if (e.code != own_code(f)) return "the failing rank threw " + why;
    if (e.ms > fast_ms) return "the failing rank was slow: " + why;
    return "";
  }
  if (f == Fault::wrong_comm) {  // the failing rank's communicator is not its peers' group: nothing reaches them
    if (e.code != Errc::timeout) return "a peer of a rank with the wrong communicator threw " + why;
    return "";
  }
  if (e.code != Errc::aborted) return "a peer threw " + why;
  if (e.message.find("rank " + std::to_string(bad) + " failed") == std::string::npos) return "a peer does not name the failing rank: " + why;
  if (e.message.find(ulysses::to_string(own_code(f))) == std::string::npos) return "a peer does not name the code: " + why;
  if (e.ms > fast_ms) return "a peer waited: " + why;
  return "";
}

/// One line of the note's table: "seq_to_head / short buffer: 0 aborted 0.1 ms, 1 aborted 0.1 ms, ..."
/// from every rank's outcome (code and time).
inline std::string fault_row(const std::string& cell, const std::vector<TimedError>& all) {
  std::string s = cell + ":";
  char buf[96];
  for (std::size_t r = 0; r < all.size(); ++r) {
    std::snprintf(buf, sizeof buf, "%s rank %zu %s %.2f ms", r ? "," : "", r, all[r].code == ulysses::Errc{} ? "ok" : ulysses::to_string(all[r].code),
                  all[r].ms);
    s += buf;
  }
  return s;
}

}  // namespace ut
