// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The failure notices of MpiComm (comm/mpi_comm.hpp): the small message {call number,
///        code, missing ranks, text} a rank that gives up sends each peer, how it is received,
///        the call probe of a long wait, and the state the copies of one MpiComm share
///        (docs/design.md, "Failure model").
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../detail/checked.hpp"
#include "../error.hpp"
#include "../version.hpp"
#include "failure.hpp"

/// 1: MpiComm's waits (comm/mpi_comm.hpp) block in MPI_Wait, use the blocking collectives and probe no notices (docs/headers.md,
/// "comm/mpi_comm.hpp"); the default under SimGrid's SMPI. 0: polled against the deadline (the default).
#ifndef ULYSSES_MPI_BLOCKING_WAITS
#if defined(SMPI_SHARED_MALLOC)
#define ULYSSES_MPI_BLOCKING_WAITS 1
#else
#define ULYSSES_MPI_BLOCKING_WAITS 0
#endif
#endif

ULYSSES_NAMESPACE_BEGIN

namespace detail {

/// The notice's header (its text follows).
struct MpiNoticeHeader {
  std::uint64_t seq;
  int code;
  std::uint64_t missing = 0;     ///< a timeout's: the ranks (< 64) the sender waited for, as a mask
  std::uint64_t generation = 0;  ///< the sending MpiComm's number on its MPI communicator (MpiCommGenerations)
  std::uint64_t shared = 0;      ///< 1: the verdict is every rank's (a call probe's plan_mismatch), not the sender's own failure
};

/// A failure notice as received: its sender, header and text.
struct MpiNotice {
  int from = -1;
  MpiNoticeHeader head{0, 0};
  std::string text;
};

/// The ranks of a mask, ascending.
inline std::vector<int> ranks_in_mask(std::uint64_t mask) {
  std::vector<int> r;
  for (int p = 0; p < 64; ++p)
    if (mask >> p & 1u) r.push_back(p);
  return r;
}

/// The mask of a list of ranks (those < 64).
inline std::uint64_t mask_of_ranks(const std::vector<int>& ranks) {
  std::uint64_t m = 0;
  for (int p : ranks)
    if (p >= 0 && p < 64) m |= std::uint64_t{1} << p;
  return m;
}

/// MPI's text for an error code.
inline std::string mpi_error_string(int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return std::string(msg, static_cast<std::size_t>(len));
}

/// What a rank keeps on one MPI communicator for the MpiComm objects made over it, cached on it
/// as an MPI attribute (MPI_Comm_set_attr; not copied by MPI_Comm_dup, freed with the
/// communicator): how many were made on this rank, and the notices of a later one that arrived
/// while an earlier one was still in use. Every rank makes its MpiComm objects over a communicator
/// in the same order, so the k-th object of every rank is generation k, and a notice names its
/// sender's generation: a notice of an earlier object (left behind by a call that gave up on every
/// rank) is dropped, never breaking a later object, and one of a later object (a peer that has
/// moved on while this rank has not) waits here for it. The MPI attribute is MPI's own way for a
/// library to keep state on a communicator (MPI-4.0, section 7.7).
struct MpiCommGenerations {
  std::uint64_t made = 0;          ///< MpiComm objects made over the communicator on this rank
  std::vector<MpiNotice> ahead;    ///< received notices of a later generation than the one that received them
};

/// The MpiCommGenerations cached on `comm`, created at its first use (MPI_Comm_create_keyval
/// once per process). @throws Error(backend) when MPI refuses the attribute.
inline MpiCommGenerations& comm_generations(MPI_Comm comm) {
  static const int keyval = [] {
    int k = MPI_KEYVAL_INVALID;
    MPI_Comm_delete_attr_function* drop = [](MPI_Comm, int, void* value, void*) -> int {
      delete static_cast<MpiCommGenerations*>(value);
      return MPI_SUCCESS;
    };
    if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, drop, &k, nullptr) != MPI_SUCCESS)
      throw Error(Errc::backend, "MPI_Comm_create_keyval failed: MpiComm cannot keep its notices' generations");
    return k;
  }();
  void* value = nullptr;
  int found = 0;
  if (MPI_Comm_get_attr(comm, keyval, &value, &found) == MPI_SUCCESS && found) return *static_cast<MpiCommGenerations*>(value);
  auto fresh = std::make_unique<MpiCommGenerations>();
  if (MPI_Comm_set_attr(comm, keyval, fresh.get()) != MPI_SUCCESS)
    throw Error(Errc::backend, "MPI_Comm_set_attr failed: MpiComm cannot keep its notices' generations");
  return *fresh.release();
}

/// Receives the next message on `tag` from any rank, if one has arrived (MPI_Iprobe, then
/// MPI_Recv of its size): its bytes into buf, its sender into from. False when none has.
inline bool receive_next_mpi(MPI_Comm comm, int tag, std::vector<char>& buf, int& from) {
  int flag = 0;
  MPI_Status st;
  if (MPI_Iprobe(MPI_ANY_SOURCE, tag, comm, &flag, &st) != MPI_SUCCESS || !flag) return false;
  int count = 0;
  MPI_Get_count(&st, MPI_BYTE, &count);
  buf.assign(static_cast<std::size_t>(std::max(count, 0)) + 1, 0);
  MPI_Recv(buf.data(), count, MPI_BYTE, st.MPI_SOURCE, tag, comm, MPI_STATUS_IGNORE);
  buf.pop_back();
  from = st.MPI_SOURCE;
  return true;
}

/// Receives the next failure notice of generation `generation` a peer sent on `comm` with `tag`,
/// if there is one: true and `n` filled, or false. Reads the notices kept for it first, then
/// MPI's (MPI_Iprobe, then MPI_Recv): one of an earlier generation is dropped, one of a later
/// generation kept for it (MpiCommGenerations). A notice shorter than its header keeps a zero
/// header (generation 0: dropped by every MpiComm, whose generations start at 1).
inline bool receive_mpi_notice(MPI_Comm comm, int tag, std::uint64_t generation, MpiNotice& n) {
  MpiCommGenerations& g = comm_generations(comm);
  for (auto it = g.ahead.begin(); it != g.ahead.end(); ++it)
    if (it->head.generation == generation) {
      n = std::move(*it);
      g.ahead.erase(it);
      return true;
    }
  for (std::vector<char> buf; receive_next_mpi(comm, tag, buf, n.from);) {
    n.head = MpiNoticeHeader{0, 0};
    n.text.clear();
    if (buf.size() >= sizeof n.head) {
      std::memcpy(&n.head, buf.data(), sizeof n.head);
      n.text.assign(buf.data() + sizeof n.head, buf.size() - sizeof n.head);
    }
    if (n.head.generation == generation) return true;
    if (n.head.generation > generation) g.ahead.push_back(std::move(n));  // (else: an earlier object's, dropped)
  }
  return false;
}

/// One story on every rank after a timeout (a ring whose rank left: each rank waits on its own
/// neighbour): for a short while (`window`, at most 1 s) reads the notices (`tag`)
/// of the peers that timed out too; a rank that sent one is alive, so the ranks named missing by
/// someone (`missing` and the notices' masks) that sent none are the ones that did not arrive.
/// Returns "; the ranks' reports together: ranks {1} did not arrive" or "" (nothing to add).
/// `senders` and `missing` start with what `rank` already knows; `generation`: the MpiComm's.
inline std::string joint_verdict(MPI_Comm comm, int tag, std::uint64_t generation, int rank, std::chrono::milliseconds window,
                                 std::uint64_t senders, std::uint64_t missing) {
  const auto until = deadline_after(std::min<std::chrono::milliseconds>(window, std::chrono::milliseconds(1000)));
  poll_until(until, [&] {
    for (MpiNotice n; receive_mpi_notice(comm, tag, generation, n);) {
      if (n.from < 64) senders |= std::uint64_t{1} << n.from;
      missing |= n.head.missing;
    }
    return false;
  }, PollPace::relaxed);
  if (rank < 64) senders |= std::uint64_t{1} << rank;
  const std::uint64_t root = missing & ~senders;
  if (!root) return "";
  return "; the ranks' reports together (ranks " + join(ranks_in_mask(senders)) + " gave up): ranks " + join(ranks_in_mask(root)) +
         " did not arrive";
}

/// What a call learns from its peers' notices (MpiComm::take_notices()): reads every notice of
/// `generation` on `tag`; where there is one, returns true with the code and story this rank
/// gives up with: Error(timeout) when the first peer timed out in this very call `seq` (the same
/// verdict, with the joint verdict of the timed-out ranks, `window` long), the notice's own code
/// where it is every rank's verdict (MpiNoticeHeader::shared: a call probe found the ranks in
/// different calls, Error(plan_mismatch)), else Error(aborted) (that rank's own failure). `late()` gives the ranks whose messages this rank still waits for.
template <class Late>
bool notice_verdict(MPI_Comm comm, int tag, std::uint64_t generation, int rank, const char* who, std::uint64_t seq,
                    std::chrono::milliseconds window, Late&& late, Errc& code, std::string& story) {
  std::string first;
  int from = -1;
  MpiNoticeHeader head{0, 0};
  std::uint64_t senders = 0, missing = 0;  // the timed-out ranks that sent notices, and whom they named
  for (MpiNotice n; receive_mpi_notice(comm, tag, generation, n);) {
    if (n.head.missing && n.from < 64) senders |= std::uint64_t{1} << n.from;
    missing |= n.head.missing;
    if (from >= 0) continue;
    from = n.from;
    head = n.head;
    first = n.text;
  }
  if (from < 0) return false;
  if (missing) first += joint_verdict(comm, tag, generation, rank, window, senders, missing);  // the timed-out ranks' story
  const bool same = head.seq == seq && head.code == static_cast<int>(Errc::timeout);
  const bool broke = head.code == static_cast<int>(Errc::aborted);  // abort(): a failure of that rank alone
  code = same ? Errc::timeout : head.shared ? static_cast<Errc>(head.code) : Errc::aborted;
  const std::vector<int> waits = late();
  story = "rank " + std::to_string(rank) + " in " + who + " (call " + std::to_string(seq) + "): rank " + std::to_string(from) +
          (broke ? " broke the group" : " gave up") + " in call " + std::to_string(head.seq) + " of this communicator" +
          (waits.empty() ? "" : " (this rank still waited for the messages of ranks " + join(waits) + ")") + ": " + first;
  return true;
}

/// A failure another object can see and an MpiComm cannot (MpiWindowComm: its window's abort
/// word), polled with the peers' notices while a call waits (MpiComm::watch_for_abort()):
/// `why(ctx)` returns "" while there is none, else the reason, and the call then gives up with
/// Error(aborted) and that reason.
struct MpiAbortWatch {
  const void* ctx = nullptr;                     ///< handed to why
  std::string (*why)(const void* ctx) = nullptr;  ///< null: nothing to watch
};

/// What MPI may still read or write after a collective times out (it can be neither cancelled
/// nor freed): kept alive for MPI, on the heap, and leaked once its collective timed out.
struct MpiCollective {
  std::vector<int> sc, sd, rc, rd;  // int counts for MPI_Ialltoallv, sized once
  int fits[3] = {1, 0, 0};          // the MPI_Iallreduce's operand: {path fits, call, -call}
  std::vector<std::byte> gather_send, gather_recv;  // allgather's copies
  MPI_Request req = MPI_REQUEST_NULL;               // the collective in flight
};

/// At the destruction of what owns the buffers of the sends `reqs`: whether MPI may still read
/// them. No after MPI_Finalize or once every send completed (the buffers can go); else the
/// requests are freed (MPI completes the sends on its own) and the caller must leak the buffers.
inline bool sends_left_to_mpi(std::vector<MPI_Request>& reqs) {
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (finalized || reqs.empty()) return false;
  int done = 0;
  MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
  if (done) return false;
  for (MPI_Request& r : reqs)
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  return true;
}

/// The call probe of MpiComm's polled waits: a rank that has waited past a grace tells the peers
/// whose messages it still waits for, once per call, which library call it is in, {generation,
/// number, word} on a tag of its own, and reads the probes its peers sent. A peer in the call of the same number with another
/// word runs another call there (another kind, plan, direction or set of row transforms): over
/// the message path the two would never pair their messages, so both give up at once with
/// Error(plan_mismatch) instead of waiting out their deadlines. Probes of another generation or
/// call number are dropped (a peer behind or ahead). Best effort: a probe whose earlier sends are
/// still in flight is not sent again.
struct MpiCallProbe {
  std::unique_ptr<std::uint64_t[]> out{new std::uint64_t[3]{}};  // the probe last sent (MPI may read it while its sends run)
  std::vector<MPI_Request> reqs;                                  // its sends
  std::uint64_t sent_for = ~std::uint64_t{0};                     // the call (MpiComm's own numbering) it was sent in
  std::mutex busy;  // one sender at a time (copies of one MpiComm may wait on several threads: MPI_THREAD_MULTIPLE)
  MpiCallProbe() = default;
  MpiCallProbe(const MpiCallProbe&) = delete;
  MpiCallProbe& operator=(const MpiCallProbe&) = delete;
  /// Leaves a probe still being sent to MPI (the buffer leaked, the requests freed).
  ~MpiCallProbe() {
    if (sends_left_to_mpi(reqs)) (void)out.release();
  }
  /// Whether the last probe's sends are still running.
  bool in_flight() {
    int done = 1;
    if (!reqs.empty()) MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
    if (done) reqs.clear();
    return !done;
  }
  /// Sends {generation, number, word} to `peers` with `tag`, once for call `seq`.
  void send(MPI_Comm comm, const std::vector<int>& peers, int tag, std::uint64_t seq, std::uint64_t generation, std::uint64_t number,
            std::uint64_t word) {
    const std::unique_lock<std::mutex> one(busy, std::try_to_lock);  // (another thread sends one: this one need not)
    if (!one || sent_for == seq || in_flight()) return;
    sent_for = seq;
    out[0] = generation;
    out[1] = number;
    out[2] = word;
    for (int p : peers) {
      MPI_Request r = MPI_REQUEST_NULL;
      if (MPI_Isend(out.get(), 3 * 8, MPI_BYTE, p, tag, comm, &r) == MPI_SUCCESS) reqs.push_back(r);
    }
  }
  /// Reads every probe sent on `tag`: the first peer whose probe names call `number` of
  /// `generation` with a word other than `word`, or -1.
  static int find_other(MPI_Comm comm, int tag, std::uint64_t generation, std::uint64_t number, std::uint64_t word) {
    int other = -1, from = -1;
    for (std::vector<char> buf; receive_next_mpi(comm, tag, buf, from);) {
      std::uint64_t in[3] = {0, 0, 0};
      if (buf.size() == sizeof in) std::memcpy(in, buf.data(), sizeof in);
      if (other < 0 && in[0] == generation && in[1] == number && in[2] != word) other = from;
    }
    return other;
  }
};

/// The state the copies of one MpiComm share.
struct MpiShared {
  CommFailure failure;
  std::uint64_t calls = 0;  // calls entered: every rank numbers its calls alike
  std::uint64_t library_calls = 0;  // the library calls begun on this MpiComm or its copies (ExchangeState::count_calls_in)
  std::uint64_t generation = 0;     // this MpiComm's number on its MPI communicator (MpiCommGenerations; 0 under blocking waits)
  std::unique_ptr<MpiCollective> coll = std::make_unique<MpiCollective>();
  std::vector<std::unique_ptr<char[]>> notices;  // the notices sent to the peers (each kept while MPI may read it), and their sends
  std::vector<MPI_Request> notice_reqs;
  MpiCallProbe probe;  // the call probe of the polled waits
  MpiShared() = default;
  MpiShared(const MpiShared&) = delete;
  MpiShared& operator=(const MpiShared&) = delete;
  /// Frees the notices once MPI has sent them; leaves them to MPI (leaked) while it has not.
  ~MpiShared() {
    if (sends_left_to_mpi(notice_reqs))
      for (auto& n : notices) (void)n.release();  // MPI may still read them
  }
  /// Sends every peer but `rank` of the `size` ranks of `comm` the notice {head, what} with `tag`
  /// (best effort: errors ignored; the text is cut at 4 KiB).
  void send_notice(MPI_Comm comm, int rank, int size, int tag, const MpiNoticeHeader& head, const std::string& what) {
    const std::size_t text = std::min<std::size_t>(what.size(), 4096);
    notices.emplace_back(new char[sizeof head + text]);  // (an earlier notice's sends may still read it: never freed here)
    char* const notice = notices.back().get();
    std::memcpy(notice, &head, sizeof head);
    std::memcpy(notice + sizeof head, what.data(), text);
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      MPI_Request r = MPI_REQUEST_NULL;
      if (MPI_Isend(notice, static_cast<int>(sizeof head + text), MPI_BYTE, p, tag, comm, &r) == MPI_SUCCESS)
        notice_reqs.push_back(r);
    }
  }
};

}  // namespace detail

ULYSSES_NAMESPACE_END
