// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief MpiComm: the communicator concept over the user's MPI_Comm (non-owning). Its mesh
///        split (split_by_node(), MpiMesh) is comm/mpi_mesh.hpp; comm/mpi.hpp includes both.
///
/// Host or (CUDA-aware MPI) device buffers; std::size_t counts end to end, chunks over the
/// per-message limit split into point-to-point messages. Every call is non-blocking and polled
/// against timeout(); a rank that gives up tells its peers (comm/mpi_notice.hpp), and the
/// communicator is then broken. Details, and the blocking waits under a simulator:
/// docs/headers.md, "comm/mpi_comm.hpp"; docs/design.md, "Failure model".
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../detail/checked.hpp"
#include "../detail/hash.hpp"
#include "../layout/blocks.hpp"
#include "../error.hpp"
#include "exchange_state.hpp"
#include "failure.hpp"
#include "mpi_notice.hpp"
#include "mpi_requests.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Communicator over an MPI communicator (models the communicator concept of comm/concepts.hpp).
/// Copies share the failure state (one MpiComm, or its copies, per MPI_Comm: the notices of a
/// failure are read by whichever object probes first). Tags kTag, kNoticeTag, kCallProbeTag and
/// [kCallTags, kCallTags + kCallTagCount) of the MPI_Comm are this class's: the messages of a
/// library call (ExchangeState::call(): its number and kind) carry a tag of that call, so that a
/// rank that skipped a call, or runs another, never pairs its messages with its peers'. Ranks in
/// different calls of the same number get Error(plan_mismatch) on every rank (the all-to-all-v's
/// agreement, or a long wait's call probe, detail::MpiCallProbe); a skipped call, a timeout.
class MpiComm {
 public:
  static constexpr std::size_t kIntMaxBytes = static_cast<std::size_t>(INT_MAX);  ///< largest message an `int` count of MPI_BYTE describes
  static constexpr int kTag = 0x75a;        ///< the tag of the exchanges' point-to-point messages ("ulysses")
  static constexpr int kNoticeTag = 0x75b;  ///< the tag of the notice a rank sends its peers when it gives up (times out or fails)
  static constexpr int kCallProbeTag = 0x75c;  ///< the tag of the call probe of a long wait (detail::MpiCallProbe)
  /// The first of the tags that name a library call (within MPI's guaranteed MPI_TAG_UB, 32767).
  static constexpr int kCallTags = 0x1000;
  /// How many: a call's tag is kCallTags + a hash of its ExchangeState::Call (number, what) modulo this.
  static constexpr int kCallTagCount = 0x6000;

  /// Wraps `comm` (not owned, not duplicated: the caller keeps it alive and must not run other
  /// collectives on it concurrently). Every rank of `comm` makes its MpiComm objects over it in
  /// the same order (copies are the same object): the k-th object of each rank is the k-th of its
  /// peers, and the failure notices carry that number, so that an earlier object's notices never
  /// break a later one, whichever rank is ahead (detail::MpiCommGenerations, kept on `comm` as an
  /// MPI attribute). Local: no message.
  /// @param comm the MPI communicator of the sequence-parallel group (its size is P)
  /// @param max_message_bytes largest single MPI message and displacement, in bytes; 1 ..
  ///        INT_MAX. Tests lower it to exercise the splitting path with small buffers. Every rank
  ///        of the group must pass the same value (both sides of a pair cut messages by it).
  /// @param timeout how long one call waits for its peers before it throws Error(timeout)
  ///        (set_timeout() changes it)
  /// @throws Error(backend) when MPI_Comm_size / MPI_Comm_rank fail;
  ///         Error(invalid_shape) max_message_bytes out of range.
  explicit MpiComm(MPI_Comm comm, std::size_t max_message_bytes = kIntMaxBytes,
                   std::chrono::milliseconds timeout = kDefaultCommTimeout)
      : comm_(comm), max_msg_(max_message_bytes), timeout_(timeout), sh_(std::make_shared<Shared>()) {
    if (max_message_bytes < 1 || max_message_bytes > kIntMaxBytes)
      throw Error(Errc::invalid_shape, "max_message_bytes=" + std::to_string(max_message_bytes) + " must be in [1, INT_MAX]");
    ok(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    ok(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    const auto n = static_cast<std::size_t>(size_);
    for (std::vector<int>* v : {&sh_->coll->sc, &sh_->coll->sd, &sh_->coll->rc, &sh_->coll->rd}) v->resize(n);
    state_.count_calls_in(&sh_->library_calls);
    if (!ULYSSES_MPI_BLOCKING_WAITS) sh_->generation = ++detail::comm_generations(comm_).made;
  }

  int size() const { return size_; }    ///< MPI_Comm_size
  int rank() const { return rank_; }    ///< MPI_Comm_rank
  MPI_Comm get() const { return comm_; }  ///< the wrapped communicator
  /// Whether calls may come from another thread, one at a time (MPI_THREAD_SERIALIZED or above; RingProgress::thread).
  bool allows_worker_thread() const noexcept { return thread_level() >= MPI_THREAD_SERIALIZED; }
  /// Whether calls may come from several threads at once (MPI_THREAD_MULTIPLE; ring × head bands with Progress::thread).
  bool allows_concurrent_threads() const noexcept { return thread_level() >= MPI_THREAD_MULTIPLE; }
  /// The MPI thread level (MPI_Query_thread(); MPI_THREAD_SINGLE where the query fails).
  static int thread_level() noexcept { int l = MPI_THREAD_SINGLE; return MPI_Query_thread(&l) == MPI_SUCCESS ? l : MPI_THREAD_SINGLE; }
  std::size_t max_message_bytes() const { return max_msg_; }  ///< the per-message limit, bytes
  /// How long one call waits for its peers before it throws Error(timeout).
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// Sets timeout() for the calls that follow (every rank should use the same).
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }
  /// True once a call timed out or failed (or a peer said it did): every call then throws Error(aborted).
  bool broken() const { return sh_->failure.broken(); }
  /// Reads the failure notices the peers sent (their calls gave up, or they broke the group)
  /// without making a call; returns broken(). What a caller checks before it makes collectives of
  /// its own on the MPI communicator (MpiWindow's constructor does): a peer may have left one of
  /// this communicator's collectives pending there. Local, never blocks, never throws.
  bool poll_notices() const noexcept {
    if (ULYSSES_MPI_BLOCKING_WAITS || sh_->failure.broken()) return sh_->failure.broken();
    try {
      Notice n;
      while (receive_notice(n))
        if (!sh_->failure.broken())
          sh_->failure.record(Errc::aborted, Error(Errc::aborted, "rank " + std::to_string(rank_) + ": rank " + std::to_string(n.from) +
                                                                    " gave up or broke the group: " + n.text)
                                                 .what());
    } catch (...) {  // (an allocation: broken() stays what it was)
    }
    return sh_->failure.broken();
  }

  /// All-to-all-v in bytes (see the communicator concept in comm/concepts.hpp). Collective.
  /// @throws Error(timeout) a peer did not arrive within timeout() (the split path names it);
  ///         Error(aborted) the communicator is broken, or a peer gave up in an earlier call;
  ///         Error(backend) with MPI's error string when a call fails (only if the communicator's
  ///         error handler returns errors; MPI's default aborts the job).
  void alltoallv(const std::byte* send, const std::size_t* send_bytes, const std::size_t* send_offsets, std::byte* recv,
                 const std::size_t* recv_bytes, const std::size_t* recv_offsets) {
    const Call call = enter("MpiComm::alltoallv");
    // MPI_Alltoallv takes int counts and displacements. Whether they fit differs between ranks
    // (offsets grow with the rank), so the ranks agree on the path first: one tiny allreduce.
    Collective& c = *sh_->coll;
    int fits = 1;
    for (int p = 0; p < size_; ++p)
      fits = fits && send_bytes[p] <= max_msg_ && send_offsets[p] <= max_msg_ && recv_bytes[p] <= max_msg_ && recv_offsets[p] <= max_msg_;
    // {fits, call, -call} under MPI_MIN: the path (every rank's fits), and whether every rank is in the same library call.
    const int w = static_cast<int>(call_word() & 0x3fffffffu);
    c.fits[0] = fits;
    c.fits[1] = w;
    c.fits[2] = -w;
    if (size_ > 1 && ULYSSES_MPI_BLOCKING_WAITS) {
      check(call, MPI_Allreduce(MPI_IN_PLACE, c.fits, 3, MPI_INT, MPI_MIN, comm_), "MPI_Allreduce");
    } else if (size_ > 1) {
      check(call, MPI_Iallreduce(MPI_IN_PLACE, c.fits, 3, MPI_INT, MPI_MIN, comm_, &c.req), "MPI_Iallreduce");
      wait_collective(call, "the MPI_Iallreduce that picks the all-to-all-v's path");
    }
    if (c.fits[1] != -c.fits[2])  // the same verdict on every rank: the group stays usable
      throw Error(Errc::plan_mismatch, "rank " + std::to_string(rank_) + " in " + call.who + " (" + state_.call().name + ", call " +
                                           std::to_string(state_.call().number) +
                                           "): the ranks are in different library calls of this communicator (a rank skipped a call, or "
                                           "runs another: another plan, direction, or row transforms on other tensors or with other "
                                           "settings, such as a Rope's; every rank reports this)");
    if (c.fits[0]) {
      for (std::size_t p = 0; p < c.sc.size(); ++p) {
        c.sc[p] = static_cast<int>(send_bytes[p]);
        c.sd[p] = static_cast<int>(send_offsets[p]);
        c.rc[p] = static_cast<int>(recv_bytes[p]);
        c.rd[p] = static_cast<int>(recv_offsets[p]);
      }
      if (ULYSSES_MPI_BLOCKING_WAITS) {
        check(call, MPI_Alltoallv(send, c.sc.data(), c.sd.data(), MPI_BYTE, recv, c.rc.data(), c.rd.data(), MPI_BYTE, comm_),
              "MPI_Alltoallv");
        return;
      }
      check(call,
            MPI_Ialltoallv(send, c.sc.data(), c.sd.data(), MPI_BYTE, recv, c.rc.data(), c.rd.data(), MPI_BYTE, comm_, &c.req),
            "MPI_Ialltoallv");
      wait_collective(call, "MPI_Ialltoallv");
      return;
    }
    // Split path: every chunk as messages of at most max_msg_ bytes. Receives first.
    for (int p = 0; p < size_; ++p) post(call, false, recv + recv_offsets[p], recv_bytes[p], p);
    for (int p = 0; p < size_; ++p) post(call, true, const_cast<std::byte*>(send) + send_offsets[p], send_bytes[p], p);
    wait_messages(call);
  }

  /// Message-level exchange (optional in the communicator concept): MPI_Irecv for every message
  /// of `recv`, MPI_Isend for every one of `send`, polled (MPI_Testall) to the deadline. A message over
  /// max_message_bytes() goes as several MPI messages of at most that size (both sides cut it the
  /// same way; MPI's non-overtaking order between a pair of ranks keeps the k-th message of each
  /// side matched). Collective over the group in effect: every rank with messages for this one
  /// must call it too.
  /// @throws Error(timeout) naming the ranks whose messages did not arrive within timeout();
  ///         Error(plan_mismatch) a message shorter than its receive (on every rank: the peers are
  ///         told); Error(aborted), Error(backend) as alltoallv().
  void exchange_messages(const Message* send, std::size_t n_send, const Message* recv, std::size_t n_recv) {
    start_messages(send, n_send, recv, n_recv);
    finish_messages();
  }

  /// exchange_messages()'s first half (optional in the concept: comm_traits::split_messages):
  /// posts the receives, then the sends, and returns; the buffers stay untouched until
  /// finish_messages(), whose deadline counts from here, and no other call may come between (the
  /// ring's start() and finish()). @throws Error(invalid_shape) messages already started;
  /// Error(aborted), Error(backend) as exchange_messages().
  void start_messages(const Message* send, std::size_t n_send, const Message* recv, std::size_t n_recv) {
    started_call_ = enter("MpiComm::exchange_messages", false);
    for (std::size_t i = 0; i < n_recv; ++i) post(started_call_, false, recv[i].data, recv[i].bytes, recv[i].peer);
    for (std::size_t i = 0; i < n_send; ++i) post(started_call_, true, send[i].data, send[i].bytes, send[i].peer);
    if (!ULYSSES_MPI_BLOCKING_WAITS) take_notices(started_call_);  // (enter()'s, after the posts: a probe before them let MPI take
                                                                    // the peers' first messages in as unexpected, matched late)
    started_ = true;  // (a failed post gave up: the messages posted so far are cancelled, the communicator broken)
  }

  /// exchange_messages()'s second half: polls what start_messages() posted to completion or to its
  /// deadline (cancels it when the communicator broke meanwhile). Nothing when nothing was
  /// started. @throws as exchange_messages().
  void finish_messages() {
    if (!started_) return;
    started_ = false;
    if (sh_->failure.broken()) msgs_.cancel(timeout_);  // broken meanwhile (abort()): nothing more arrives; MPI writes no more
    sh_->failure.check(started_call_.who);
    wait_messages(started_call_);
  }

  /// All-gather of `bytes` bytes (at most INT_MAX) from every rank into recv (rank order), through
  /// scratch this communicator owns (so that a timed-out all-gather never touches the caller's
  /// buffers later). Used for the cross-rank plan check.
  /// @throws Error(size_overflow) bytes > INT_MAX; Error(timeout) (MPI cannot say which ranks are
  ///         missing), Error(aborted), Error(backend) as alltoallv().
  void allgather(const void* send, std::size_t bytes, void* recv) {
    if (bytes > kIntMaxBytes) throw Error(Errc::size_overflow, "allgather of " + std::to_string(bytes) + " bytes");
    const Call call = enter("MpiComm::allgather");
    Collective& c = *sh_->coll;
    c.gather_send.assign(static_cast<const std::byte*>(send), static_cast<const std::byte*>(send) + bytes);
    c.gather_recv.resize(bytes * static_cast<std::size_t>(size_));
    if (ULYSSES_MPI_BLOCKING_WAITS) {
      check(call,
            MPI_Allgather(c.gather_send.data(), static_cast<int>(bytes), MPI_BYTE, c.gather_recv.data(), static_cast<int>(bytes),
                          MPI_BYTE, comm_),
            "MPI_Allgather");
    } else {
      check(call,
            MPI_Iallgather(c.gather_send.data(), static_cast<int>(bytes), MPI_BYTE, c.gather_recv.data(), static_cast<int>(bytes),
                           MPI_BYTE, comm_, &c.req),
            "MPI_Iallgather");
      wait_collective(call, "MPI_Iallgather");
    }
    if (!c.gather_recv.empty()) std::memcpy(recv, c.gather_recv.data(), c.gather_recv.size());
  }

  /// What the transports learn on this communicator about the plans run on it, and their
  /// scratch lists (comm/exchange_state.hpp).
  ExchangeState& exchange_state() noexcept { return state_; }

  using AbortWatch = detail::MpiAbortWatch;  ///< a failure another object can see (comm/mpi_notice.hpp)
  /// Sets (or, with a default AbortWatch, clears) the watch of the calls that follow. Local.
  void watch_for_abort(AbortWatch w) noexcept { watch_ = w; }

  /// Breaks the group at once (the optional abort() of the communicator concept): this
  /// communicator is broken (its later calls throw Error(aborted) with `why`), and every peer gets
  /// the failure notice, so that its current call (polled) and its later calls throw
  /// Error(aborted) with `why` within milliseconds instead of waiting out their deadline. What a
  /// call that fails on this rank alone does before it throws (comm/tell_peers.hpp). Local, never
  /// blocks (the notices are sent non-blocking); a no-op once broken (the first failure is kept).
  /// @param why what failed, for the peers' messages ("rank 3 failed in seq_to_head with ...")
  void abort(const std::string& why) {
    if (sh_->failure.broken()) return;
    const std::string what = Error(Errc::aborted, "rank " + std::to_string(rank_) + " broke the group: " + why).what();
    sh_->failure.record(Errc::aborted, what);
    if (!ULYSSES_MPI_BLOCKING_WAITS) notify(Call{"abort", sh_->calls, std::chrono::steady_clock::now()}, Errc::aborted, why);
  }

 private:
  using Collective = detail::MpiCollective;  // comm/mpi_notice.hpp
  using Shared = detail::MpiShared;
  /// One call: its sequence number and when it gives up.
  struct Call {
    const char* who;                                 // its name
    std::uint64_t seq;                               // its number
    std::chrono::steady_clock::time_point deadline;  // when it gives up
  };
  using NoticeHeader = detail::MpiNoticeHeader;

  /// Starts a call: throws Error(aborted) when broken, and (`notices`) what a peer's notice says
  /// (exchange_messages() reads them once its messages are posted: see start_messages()).
  Call enter(const char* who, bool notices = true) {
    sh_->failure.check(who);
    if (started_)
      throw Error(Errc::invalid_shape, std::string(who) + ": called between start_messages() and finish_messages() (finish them first)");
    const Call call{who, sh_->calls++, detail::deadline_after(timeout_)};
    if (notices && !ULYSSES_MPI_BLOCKING_WAITS) take_notices(call);
    return call;
  }

  using Notice = detail::MpiNotice;
  /// Receives the next failure notice a peer's MpiComm of this one's generation sent, if there is
  /// one: true and `n` filled, or false.
  bool receive_notice(Notice& n) const { return detail::receive_mpi_notice(comm_, kNoticeTag, sh_->generation, n); }
  /// The word of the library call in progress (ExchangeState::call(): its number and kind), as
  /// the messages' tags and the all-to-all-v's path agreement carry it: 0 outside library calls.
  std::uint64_t call_word() const noexcept {
    const ExchangeState::Call& c = state_.call();
    return c.number ? detail::fnv1a(c.what, c.number) : 0;
  }

  /// Posts `bytes` at `base` to / from `peer` as MPI messages of at most max_msg_ bytes.
  void post(const Call& call, bool is_send, std::byte* base, std::size_t bytes, int peer) {
    for (std::size_t done = 0; done < bytes;) {
      const int n = static_cast<int>(std::min(max_msg_, bytes - done));
      MPI_Request r = MPI_REQUEST_NULL;
      const std::uint64_t w = call_word();
      const int tag = w ? kCallTags + static_cast<int>(w % kCallTagCount) : kTag;
      const int rc = is_send ? MPI_Isend(base + done, n, MPI_BYTE, peer, tag, comm_, &r)
                             : MPI_Irecv(base + done, n, MPI_BYTE, peer, tag, comm_, &r);
      msgs_.add(r, peer, is_send, n);
      check(call, rc, is_send ? "MPI_Isend" : "MPI_Irecv");
      done += static_cast<std::size_t>(n);
    }
  }

  /// Polls the posted messages (receives first, then sends) to completion or to the deadline;
  /// a timeout names the peers of the incomplete ones (ULYSSES_MPI_BLOCKING_WAITS: MPI_Wait on each).
  void wait_messages(const Call& call) {
    msgs_.statuses.resize(msgs_.reqs.size());
    if (ULYSSES_MPI_BLOCKING_WAITS) {  // one MPI_Wait each: SMPI's MPI_Waitall is one MPI_Waitany per request, O(n^2)
      for (std::size_t i = 0; i < msgs_.reqs.size(); ++i) check(call, MPI_Wait(&msgs_.reqs[i], &msgs_.statuses[i]), "MPI_Wait");
    } else if (!poll(call, [&] {
          int done = 0;
          check(call, MPI_Testall(static_cast<int>(msgs_.reqs.size()), msgs_.reqs.data(), &done, msgs_.statuses.data()), "MPI_Testall");
          return done != 0;
        })) {
      const std::vector<int> late_recv = msgs_.incomplete(0, msgs_.n_recv), late_send = msgs_.incomplete(msgs_.n_recv, msgs_.reqs.size());
      give_up(call, Errc::timeout,
              waited(call) + (late_recv.empty() ? "" : "; the messages of ranks " + detail::join(late_recv) + " did not arrive") +
                  (late_send.empty() ? "" : "; ranks " + detail::join(late_send) + " did not take this rank's messages") +
                  " (a rank skipped the call, runs another (its messages carry another call's tag), failed outside it, or died)",
              true, detail::mask_of_ranks(late_recv) | detail::mask_of_ranks(late_send));
    }
    if (!ULYSSES_MPI_BLOCKING_WAITS) take_notices(call, true);  // a peer that timed out in this call before this rank came
    const std::string short_receive = msgs_.short_receive(rank_);
    msgs_.clear();
    if (!short_receive.empty())  // a shorter message than posted matched: the ranks' lists differ (never silent data)
      give_up(call, Errc::plan_mismatch, "rank " + std::to_string(rank_) + " in " + call.who + ": " + short_receive + "; the ranks' plans differ");
  }

  /// Polls the collective in flight (sh_->coll->req) to completion or to the deadline
  /// (not used with ULYSSES_MPI_BLOCKING_WAITS: the blocking collectives instead).
  void wait_collective(const Call& call, const char* what) {
    MPI_Request& req = sh_->coll->req;
    if (!poll(call, [&] {
          int done = 0;
          check(call, MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
          return done != 0;
        }))
      give_up(call, Errc::timeout,
              waited(call) + " in " + what +
                  ": some rank did not arrive (MPI's collectives do not say which: a rank skipped the call, failed outside it, "
                  "or died); MPI may still write this call's receive buffer if it arrives later");
    if (!ULYSSES_MPI_BLOCKING_WAITS) take_notices(call, true);  // (as wait_messages())
  }

  /// Polls `ready` until it returns true (→ true) or the call's deadline passes (→ false),
  /// reading the peers' notices every 32 polls.
  template <class Ready>
  bool poll(const Call& call, Ready&& ready) {
    unsigned n = 0;
    return detail::poll_until(call.deadline, [&] {
      if (ready()) return true;
      if (++n % 32 == 0) {
        take_notices(call);
        probe_call(call);
        if (watch_.why) {
          const std::string why = watch_.why(watch_.ctx);
          if (!why.empty())  // it leaves this call pending: its peers must not use the MPI communicator as if it were healthy
            give_up(call, Errc::aborted, "rank " + std::to_string(rank_) + " in " + call.who + ": " + why);
        }
      }
      return false;
    });
  }

  /// The call probe (detail::MpiCallProbe) of a call past its grace (a tenth of the timeout, at most 2 s:
  /// few probes stay unread), to the peers it waits for: plan_mismatch where one runs another call.
  void probe_call(const Call& call) {
    const ExchangeState::Call& c = state_.call();
    if (ULYSSES_MPI_BLOCKING_WAITS || !c.number ||
        std::chrono::steady_clock::now() < call.deadline - timeout_ + std::min<std::chrono::milliseconds>(timeout_ / 10, std::chrono::seconds(2)))
      return;
    sh_->probe.send(comm_, msgs_.incomplete(0, msgs_.n_recv), kCallProbeTag, call.seq, sh_->generation, c.number, call_word());
    const int other = detail::MpiCallProbe::find_other(comm_, kCallProbeTag, sh_->generation, c.number, call_word());
    if (other < 0) return;
    const std::string why = "rank " + std::to_string(rank_) + " in " + call.who + " (" + c.name + ", library call " + std::to_string(c.number) +
                            "): rank " + std::to_string(other) + " runs another call as its call " + std::to_string(c.number) +
                            " (another kind, plan, direction or set of row transforms, or a transform's settings): their messages would never pair";
    notify(call, Errc::plan_mismatch, why, 0, true);  // every rank's verdict (MpiNoticeHeader::shared)
    give_up(call, Errc::plan_mismatch, why, false);
  }

  /// "rank r waited T ms in <call>", the start of a timeout's message.
  std::string waited(const Call& call) const {
    return "rank " + std::to_string(rank_) + " waited " + std::to_string(timeout_.count()) + " ms in " + call.who;
  }

  /// Reads the peers' notices; if there is one, gives up too (detail::notice_verdict()) and tells
  /// the peers (a joint verdict counts it alive), every rank's verdict (plan_mismatch) as such.
  /// `ended`: the call's waits completed (a peer that timed out in it sent its small messages before
  /// its notice): only a peer's timeout in this very call fails it (the same verdict; best effort),
  /// another notice breaks the communicator for the next call.
  void take_notices(const Call& call, bool ended = false) {
    Errc code = Errc::aborted;
    std::string story;
    auto late = [&] { return msgs_.incomplete(0, msgs_.n_recv); };  // this rank's own view: whose messages it still waits for
    if (!detail::notice_verdict(comm_, kNoticeTag, sh_->generation, rank_, call.who, call.seq, timeout_ / 10, late, code, story)) return;
    if (ended && code != Errc::timeout) return sh_->failure.record(code, Error(code, story).what());
    if (code == Errc::plan_mismatch) notify(call, code, story, 0, true);
    give_up(call, code, story, code != Errc::plan_mismatch);
  }

  /// An MPI return code other than MPI_SUCCESS gives up with Error(backend).
  void check(const Call& call, int rc, const char* what) {
    if (rc != MPI_SUCCESS) give_up(call, Errc::backend, std::string(what) + " failed in " + call.who + ": " + detail::mpi_error_string(rc));
  }

  /// Abandons the call: cancels its pending receives (waiting for the cancellations at most
  /// timeout()), frees its pending sends, leaves a pending collective's scratch to MPI, breaks the
  /// communicator, tells the peers (unless `tell` is false), and throws Error(code).
  [[noreturn]] void give_up(const Call& call, Errc code, const std::string& message, bool tell = true, std::uint64_t missing = 0) {
    msgs_.cancel(timeout_);
    if (sh_->coll->req != MPI_REQUEST_NULL) (void)sh_->coll.release();  // MPI keeps using it: leaked on purpose
    const std::string end = "; an MPI communicator that timed out or failed cannot be repaired: end the job (MPI_Abort)";
    sh_->failure.record(code, Error(code, message + end).what());
    if (tell) notify(call, code, Error(code, message + end).what(), missing);
    if (tell && missing) {  // a timeout naming ranks: add what the peers that timed out too found
      // detail::joint_verdict(): half the timeout after its own (deadlines spread as arrivals; a tenth after a peer's notice)
      const Error e(code, message + detail::joint_verdict(comm_, kNoticeTag, sh_->generation, rank_, timeout_ / 2, 0, missing) + end);
      throw e;
    }
    throw Error(code, message + end);
  }

  /// Sends every peer the notice {call's number, code, missing ranks, message, `shared`: every
  /// rank's verdict} (best effort: errors ignored).
  void notify(const Call& call, Errc code, const std::string& what, std::uint64_t missing = 0, bool shared = false) {
    sh_->send_notice(comm_, rank_, size_, kNoticeTag, NoticeHeader{call.seq, static_cast<int>(code), missing, sh_->generation, shared ? 1u : 0u},
                     what);
  }

  /// Throws Error(backend) when rc is not MPI_SUCCESS (before any call: nothing to give up).
  static void ok(int rc, const char* what) {
    if (rc != MPI_SUCCESS) throw Error(Errc::backend, std::string(what) + " failed: " + detail::mpi_error_string(rc));
  }

  ExchangeState state_;  // see exchange_state()
  AbortWatch watch_;     // see watch_for_abort()
  MPI_Comm comm_;
  std::size_t max_msg_;
  bool started_ = false;  // start_messages() posted messages that finish_messages() has not completed
  Call started_call_{};   // their call (its deadline)
  std::chrono::milliseconds timeout_;
  int size_ = 0, rank_ = 0;
  std::shared_ptr<Shared> sh_;     // failure state, call numbers, collective scratch
  detail::MpiRequests msgs_;       // the point-to-point messages in flight (comm/mpi_requests.hpp)
};

ULYSSES_NAMESPACE_END
