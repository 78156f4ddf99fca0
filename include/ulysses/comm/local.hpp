// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief LocalGroup: P ranks as threads of one process (the embedded default communicator).
///
/// Each rank is a thread that calls the collectives of its own LocalGroup::Comm: a rank publishes
/// its buffers, a barrier, every rank copies from its peers' (host memory, std::memcpy), a barrier.
/// Every wait is bounded by the group's timeout; a timeout or a rank's failure breaks the group for
/// every rank (docs/design.md, "Failure model"; docs/headers.md, "comm/local.hpp").
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../layout/blocks.hpp"
#include "../detail/checked.hpp"
#include "../error.hpp"
#include "agreement.hpp"
#include "exception.hpp"
#include "exchange_state.hpp"
#include "failure.hpp"

ULYSSES_NAMESPACE_BEGIN

/// An in-process sequence-parallel group of `size` ranks, each driven by its own thread.
/// Thread-safe for one call per rank at a time; a group serves one collective at a time.
class LocalGroup {
 public:
  /// @param size    P >= 1 ranks
  /// @param timeout how long a rank waits in a collective for the others before it throws
  ///                Error(timeout) (and marks the group failed, so the others throw too)
  /// @throws Error(invalid_group) size < 1
  explicit LocalGroup(int size, std::chrono::milliseconds timeout = kDefaultCommTimeout)
      : size_(size), timeout_(timeout), slots_(size > 0 ? static_cast<std::size_t>(size) : 0), calls_(slots_.size(), 0),
        passes_(slots_.size(), 0) {
    if (size < 1) throw Error(Errc::invalid_group, "LocalGroup size " + std::to_string(size) + " must be >= 1");
  }
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  int size() const { return size_; }  ///< P
  /// How long a rank waits in one barrier of a collective before it throws Error(timeout).
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  struct Slot;  // what a rank publishes for one collective (below)

 public:
  /// The communicator of one rank (a cheap handle; the group must outlive it). Models the
  /// communicator concept of comm/concepts.hpp.
  class Comm {
   public:
    /// The ranks are threads of one process: with_peers() hands every rank its peers' PeerRecord
    /// as published, so the peer copy may write the peers' outputs (comm_traits::one_address_space).
    static constexpr bool one_address_space = true;
    /// exchange_messages() blocks its thread until every rank has copied: a worker may run it
    /// while the caller computes (comm_traits::progress_thread: the ring's RingProgress::automatic).
    static constexpr bool progress_thread = true;

    int size() const { return g_->size_; }
    int rank() const { return rank_; }

    /// All-to-all-v in bytes (see the communicator concept in comm/concepts.hpp).
    /// @throws Error(plan_mismatch) when a peer sends a different byte count than this rank
    ///         expects; Error(timeout) / Error(aborted) as the group's barrier.
    void alltoallv(const std::byte* send, const std::size_t* send_bytes, const std::size_t* send_offsets, std::byte* recv,
                   const std::size_t* recv_bytes, const std::size_t* recv_offsets) {
      alltoallv_with(send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets,
                     [](int, std::byte* dst, const std::byte* src, std::size_t n) { std::memcpy(dst, src, n); }, [] {});
    }

    /// All-to-all-v whose data movement the caller supplies (the hook DeviceLocalGroup uses to
    /// move device memory with cudaMemcpyAsync). Same protocol as alltoallv(): every rank
    /// publishes its send buffer, barrier, then this rank calls
    /// `copy(peer, recv + recv_offsets[peer], peer_send + peer_offsets[rank], bytes)` for each
    /// peer with a non-empty chunk for it (in peer order, its own chunk included when non-empty),
    /// then `done()`, then a closing barrier after which peers may reuse their send buffers.
    /// @throws what alltoallv() throws, and what copy / done throw (the group is then aborted).
    template <class Copy, class Done>
    void alltoallv_with(const std::byte* send, const std::size_t* send_bytes, const std::size_t* send_offsets,
                        std::byte* recv, const std::size_t* recv_bytes, const std::size_t* recv_offsets, Copy&& copy,
                        Done&& done) {
      Slot& mine = enter(kAlltoallv);
      mine.send = send;
      mine.bytes = send_bytes;
      mine.offsets = send_offsets;
      g_->barrier(rank_, true);
      g_->copy_phase(rank_, [&] {
        for (int p = 0; p < size(); ++p) {
          const Slot& s = g_->slots_[static_cast<std::size_t>(p)];
          if (s.bytes[rank_] != recv_bytes[p])
            throw Error(Errc::plan_mismatch, "rank " + std::to_string(p) + " sends " + std::to_string(s.bytes[rank_]) +
                                                 " bytes to rank " + std::to_string(rank_) + ", which expects " +
                                                 std::to_string(recv_bytes[p]) + "; the ranks' plans differ");
          if (recv_bytes[p]) copy(p, recv + recv_offsets[p], s.send + s.offsets[rank_], recv_bytes[p]);
        }
        done();
      });
      g_->barrier(rank_);  // peers may reuse their send buffers only after everyone has read them
    }

    /// Message-level exchange (the optional member of the communicator concept in
    /// redistribute.hpp): every rank publishes its send list, a barrier, every rank copies each
    /// message it receives straight from the sender's memory (the k-th message rank p sends to
    /// this rank into this rank's k-th receive from p), a barrier.
    /// @throws Error(plan_mismatch) when a peer sends other messages (count or bytes) than this
    ///         rank receives, or a message goes to or comes from a rank outside the group; Error(timeout) /
    ///         Error(aborted) as the group's barrier.
    void exchange_messages(const Message* send, std::size_t n_send, const Message* recv, std::size_t n_recv) {
      exchange_messages_with(send, n_send, recv, n_recv, [](int, std::byte* dst, const std::byte* src, std::size_t n) { std::memcpy(dst, src, n); },
                             [] {});
    }

    /// exchange_messages() whose data movement the caller supplies (what DeviceLocalGroup uses):
    /// after the opening barrier, for each message this rank receives, in order,
    /// `copy(peer, recv_data, peer_send_data, bytes)`, then `done()`, then the closing barrier.
    /// @throws what exchange_messages() throws, and what copy / done throw (the group is then aborted).
    template <class Copy, class Done>
    void exchange_messages_with(const Message* send, std::size_t n_send, const Message* recv, std::size_t n_recv, Copy&& copy,
                                Done&& done) {
      Slot& mine = enter(kMessages);
      mine.messages = send;
      mine.n_messages = n_send;
      g_->barrier(rank_, true);
      g_->copy_phase(rank_, [&] {
        for (std::size_t i = 0; i < n_send; ++i)
          if (send[i].peer < 0 || send[i].peer >= size())
            throw Error(Errc::plan_mismatch, "rank " + std::to_string(rank_) + " sends to rank " + std::to_string(send[i].peer) +
                                                 ", outside the group of " + std::to_string(size()));
        std::vector<std::size_t>& next = mine.next;  // scan position in each peer's list (kept: no allocation after the first call)
        next.assign(static_cast<std::size_t>(size()), 0);
        auto next_to_me = [&](int p) -> const Message* {
          const Slot& s = g_->slots_[static_cast<std::size_t>(p)];
          for (std::size_t& i = next[static_cast<std::size_t>(p)]; i < s.n_messages; ++i)
            if (s.messages[i].peer == rank_) return &s.messages[i++];
          return nullptr;
        };
        for (std::size_t i = 0; i < n_recv; ++i) {
          const Message& m = recv[i];
          if (m.peer < 0 || m.peer >= size())
            throw Error(Errc::plan_mismatch, "rank " + std::to_string(rank_) + " receives from rank " + std::to_string(m.peer) +
                                                 ", outside the group of " + std::to_string(size()));
          const Message* s = next_to_me(m.peer);
          if (!s || s->bytes != m.bytes)
            throw Error(Errc::plan_mismatch, "rank " + std::to_string(m.peer) + " sends " +
                                                 (s ? std::to_string(s->bytes) + " bytes" : std::string("no message")) +
                                                 " where rank " + std::to_string(rank_) + " receives " +
                                                 std::to_string(m.bytes) + "; the ranks' plans differ");
          if (m.bytes) copy(m.peer, m.data, s->data, m.bytes);
        }
        for (int p = 0; p < size(); ++p)
          if (next_to_me(p))
            throw Error(Errc::plan_mismatch, "rank " + std::to_string(p) + " sends rank " + std::to_string(rank_) +
                                                 " more messages than it receives; the ranks' plans differ");
        done();
      });
      g_->barrier(rank_);  // senders may reuse their buffers only after everyone has read them
    }

    /// All-gather of `bytes` bytes from every rank: rank p's block lands at recv + p*bytes.
    /// Used for the cross-rank plan check. @throws Error(timeout), Error(aborted).
    void allgather(const void* send, std::size_t bytes, void* recv) {
      Slot& mine = enter(kAllgather);
      mine.gather_bytes = bytes;
      mine.send = static_cast<const std::byte*>(send);
      g_->barrier(rank_, true);
      g_->copy_phase(rank_, [&] {
        for (int p = 0; p < size(); ++p)
          std::memcpy(static_cast<std::byte*>(recv) + static_cast<std::size_t>(p) * bytes,
                      g_->slots_[static_cast<std::size_t>(p)].send, bytes);
      });
      g_->barrier(rank_);
    }

    /// Shared-memory step (the direct transport; the optional with_peers() of the communicator
    /// concept, transport.hpp): publishes `mine`, waits for every rank, calls work(ctx, all) with
    /// all[p] = rank p's `mine` (an array of size() pointers, valid during the call), then waits
    /// until every rank's work has returned, so no rank leaves while a peer may still read its
    /// memory. If work throws on any rank, the group is aborted (peers get Error(aborted)).
    /// @throws Error(timeout), Error(aborted), what work throws.
    void with_peers(const void* mine, void (*work)(void* ctx, const void* const* all), void* ctx) {
      Slot& me = enter(kPeers);
      me.send = static_cast<const std::byte*>(mine);
      g_->barrier(rank_, true);
      g_->copy_phase(rank_, [&] {
        std::vector<const void*>& all = me.peers;  // this rank's scratch (kept: no allocation after the first call)
        all.resize(static_cast<std::size_t>(size()));
        for (int p = 0; p < size(); ++p) all[static_cast<std::size_t>(p)] = g_->slots_[static_cast<std::size_t>(p)].send;
        work(ctx, all.data());
      });
      g_->barrier(rank_);  // every rank's reads of its peers' memory are done
    }

    /// Breaks the group (LocalGroup::abort()): every rank's current and later calls throw
    /// Error(aborted) with `why`. @param why what failed, for the peers' messages
    void abort(const std::string& why) { g_->abort(why); }

    /// Blocks until every rank has arrived. @throws Error(timeout), Error(aborted).
    void barrier() {
      enter(kBarrier);
      g_->barrier(rank_);
    }

    /// What the transports learn on this communicator about the plans run on it, and their
    /// scratch lists (comm/exchange_state.hpp).
    ExchangeState& exchange_state() noexcept { return state_; }

   private:
    friend class LocalGroup;
    /// This rank's slot, marked as in collective `kind` of the current library call (what the
    /// barrier compares across ranks).
    Slot& enter(int kind) {
      Slot& mine = g_->slots_[static_cast<std::size_t>(rank_)];
      mine.kind = kind;
      mine.call = state_.call();
      return mine;
    }
    ExchangeState state_;  // see exchange_state()
    Comm(LocalGroup* g, int r) : g_(g), rank_(r) { state_.count_calls_in(&g->calls_[static_cast<std::size_t>(r)]); }
    LocalGroup* g_;
    int rank_;
  };

  /// The communicator of `rank`. @throws Error(invalid_group) rank outside [0, size).
  Comm comm(int rank) {
    if (rank < 0 || rank >= size_)
      throw Error(Errc::invalid_group, "rank " + std::to_string(rank) + " outside LocalGroup [0, " + std::to_string(size_) + ")");
    return Comm(this, rank);
  }

  /// Spawns the ranks: runs fn(Comm&) on `size` threads, one per rank (rank r's thread gets
  /// comm(r)), and joins them. If a rank throws, the group is marked failed (peers blocked in a
  /// collective throw Error(aborted)) and the first exception (the root cause, not the peers'
  /// aborts) is rethrown here.
  /// @param fn callable as fn(Comm&), run once per rank on the rank's thread
  /// @throws what fn throws (the first root cause), or Error(aborted) / Error(timeout) when no
  ///         rank failed otherwise.
  template <class F>
  void spawn(F&& fn) {
    std::vector<std::exception_ptr> errs(static_cast<std::size_t>(size_));
    std::vector<std::thread> th;
    for (int r = 0; r < size_; ++r)
      th.emplace_back([&, r] {
        try {
          Comm c = comm(r);
          fn(c);
        } catch (...) {
          errs[static_cast<std::size_t>(r)] = std::current_exception();
          abort("rank " + std::to_string(r) + " threw: " + detail::exception_message(errs[static_cast<std::size_t>(r)]));
        }
      });
    for (auto& t : th) t.join();
    std::exception_ptr first, any;  // first root cause; first error of any kind
    for (auto& e : errs) {
      if (!e) continue;
      if (!any) any = e;
      if (!first && !detail::is_aborted_error(e)) first = e;
    }
    if (!first) first = any;
    if (first) std::rethrow_exception(first);
  }

  /// Marks the group failed: ranks waiting in a collective, and all later collectives, throw
  /// Error(aborted), whose message includes `why` (unless the group had failed before: the first
  /// failure's message is kept). A group cannot be revived; make a new one.
  /// @param why what failed, for the peers' messages
  void abort(const std::string& why = "LocalGroup::abort() was called") {
    std::lock_guard<std::mutex> l(m_);
    fail_locked(why);
    cv_.notify_all();
  }

 private:
  /// Which collective a rank entered: ranks that entered different ones fail instead of reading
  /// each other's slots.
  enum Kind : int { kNone = 0, kAlltoallv, kAllgather, kBarrier, kMessages, kPeers };
  static const char* kind_name(int k) {
    return k == kAlltoallv ? "alltoallv" : k == kAllgather ? "allgather" : k == kBarrier ? "barrier"
         : k == kMessages  ? "exchange_messages" : k == kPeers ? "with_peers" : "nothing";
  }

  struct Slot {
    int kind = kNone;
    ExchangeState::Call call;      // the library call the rank is in (compared: a skipped call is plan_mismatch)
    std::size_t gather_bytes = 0;  // allgather's block size
    const std::byte* send = nullptr;
    const std::size_t* bytes = nullptr;
    const std::size_t* offsets = nullptr;
    const Message* messages = nullptr;  // exchange_messages' send list
    std::size_t n_messages = 0;
    std::vector<std::size_t> next;      // exchange_messages' scratch, touched by its own rank only
    std::vector<const void*> peers;     // with_peers' scratch, touched by its own rank only
  };

  /// Waits for all ranks. With `enter_copy`, the ranks then read each other's buffers: in_copy_
  /// counts them until each has finished (see copy_phase()). Bounded by the timeout: the rank
  /// whose deadline passes first marks the group failed and the barrier timed out (docs/design.md,
  /// "Failure model", says what every rank then throws).
  void barrier(int rank, bool enter_copy = false) {
    std::unique_lock<std::mutex> l(m_);
    const std::uint64_t index = passes_[static_cast<std::size_t>(rank)]++;  // the barrier this rank enters (0, 1, ...)
    if (failed_) {
      wait_for_readers(l);  // no peer still reads or writes this rank's buffers when it throws
      throw_failed(rank, index, " arrived after");
    }
    const std::uint64_t gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      // Every rank has written its slot before arriving: the last to arrive compares what they
      // entered, so that a rank in another collective (barrier() while the others exchange) fails
      // with them at once rather than passing while they wait for it.
      const std::string mismatch = kinds_mismatch();
      if (!mismatch.empty()) {
        mismatched_ = gen;
        mismatch_what_ = mismatch;
        fail_locked(mismatch);
        cv_.notify_all();
        throw Error(Errc::plan_mismatch, "rank " + std::to_string(rank) + ": " + mismatch);
      }
      if (enter_copy) in_copy_ = size_;
      cv_.notify_all();
      return;
    }
    const bool ok = cv_.wait_until(l, detail::deadline_after(timeout_), [&] { return generation_ != gen || failed_; });
    if (generation_ != gen) {  // completed, even if a rank failed since
      if (mismatched_ == gen) throw Error(Errc::plan_mismatch, "rank " + std::to_string(rank) + ": " + mismatch_what_);
      return;
    }
    if (!ok && !failed_) {  // this rank's deadline passed first: the barrier timed out
      std::vector<int> missing;
      for (int p = 0; p < size_; ++p)
        if (passes_[static_cast<std::size_t>(p)] <= gen) missing.push_back(p);
      timed_out_ = gen;
      timeout_what_ = "ranks " + detail::join(missing) + " did not arrive within " + std::to_string(timeout_.count()) +
                      " ms (" + std::to_string(arrived_) + " of " + std::to_string(size_) +
                      " ranks arrived: a rank skipped the call or failed outside it)";
      const Error e(Errc::timeout, "rank " + std::to_string(rank) + " waited in a collective of the LocalGroup: " + timeout_what_);
      fail_locked(e.what());
      cv_.notify_all();
      throw e;
    }
    wait_for_readers(l);
    throw_failed(rank, index, " was in");
  }

  /// Under m_, once every rank has arrived at a barrier: "" when they all entered the same
  /// collective (and an allgather of the same block size), else which ranks entered which. The
  /// library's own collectives (the plan's agreement all-gather, the peer copy's with_peers) are
  /// named as such: a rank that skipped an exchange meets its peers' first one.
  std::string kinds_mismatch() const {
    const Slot& first = slots_[0];
    for (int p = 1; p < size_; ++p) {
      const Slot& s = slots_[static_cast<std::size_t>(p)];
      if (s.kind == first.kind && (first.kind != kAllgather || s.gather_bytes == first.gather_bytes)) continue;
      std::string who;
      for (int q = 0; q < size_; ++q)
        who += (q ? ", rank " : "rank ") + std::to_string(q) + " " + kind_name(slots_[static_cast<std::size_t>(q)].kind);
      return "the ranks entered different collectives of the LocalGroup (" + who +
             "; an exchange's collectives are its agreement check's allgather, then its transport's): ranks must call the same "
             "collectives in the same order (did a rank skip an exchange, or run another plan or direction?)";
    }
    return detail::call_mismatch(
        size_, [&](int p) { return slots_[static_cast<std::size_t>(p)].call.number; },
        [&](int p) { return slots_[static_cast<std::size_t>(p)].call.what; }, [&](int p) { return slots_[static_cast<std::size_t>(p)].call.name; });
  }

  /// Under m_ (held by `l`), in a failed group: waits, bounded by the timeout, until no rank is
  /// still in a copy phase (reading or writing its peers' buffers), so that a rank that throws
  /// (and whose caller frees its buffers) is no longer read or written by a slower peer.
  void wait_for_readers(std::unique_lock<std::mutex>& l) {
    cv_.wait_until(l, detail::deadline_after(timeout_), [&] { return in_copy_ == 0; });
  }

  /// Records the group's first failure (under m_).
  void fail_locked(const std::string& why) {
    if (!failed_) why_ = why;
    failed_ = true;
  }

  /// What a rank entering (`how` " arrived after") or waiting in (" was in") barrier `index` of a
  /// failed group throws (under m_): Error(timeout) when that barrier is the one that timed out,
  /// else Error(aborted) with the first failure's message.
  [[noreturn]] void throw_failed(int rank, std::uint64_t index, const char* how) const {
    if (index == timed_out_)
      throw Error(Errc::timeout, "rank " + std::to_string(rank) + how + " a collective of the LocalGroup that timed out: " +
                                     timeout_what_);
    throw Error(Errc::aborted, "rank " + std::to_string(rank) + ": the LocalGroup is broken by an earlier failure (" + why_ +
                                   "); make a new group");
  }

  /// Runs this rank's reads of its peers' buffers. If they throw, the group is aborted and this
  /// rank waits (up to the timeout) until no rank is still reading, so that no peer reads the
  /// buffers of a rank that has returned; then the error propagates.
  template <class F>
  void copy_phase(int rank, F&& f) {
    try {
      f();
    } catch (...) {
      std::unique_lock<std::mutex> l(m_);
      --in_copy_;
      fail_locked("rank " + std::to_string(rank) + " failed in a collective: " + detail::exception_message(std::current_exception()));
      cv_.notify_all();
      cv_.wait_until(l, detail::deadline_after(timeout_), [&] { return in_copy_ == 0; });
      throw;
    }
    std::lock_guard<std::mutex> l(m_);
    --in_copy_;
    cv_.notify_all();
  }

  int size_;
  std::chrono::milliseconds timeout_;
  std::vector<Slot> slots_;
  std::vector<std::uint64_t> calls_;  // per rank: the library calls begun (every handle of the rank counts here)
  std::mutex m_;
  std::condition_variable cv_;
  int arrived_ = 0;
  std::uint64_t generation_ = 0;
  int in_copy_ = 0;  // ranks still reading peers' buffers in the current collective
  std::vector<std::uint64_t> passes_;  // per rank: barriers entered (rank p has entered barrier g iff passes_[p] > g)
  bool failed_ = false;
  std::string why_;  // the first failure's message
  std::uint64_t timed_out_ = ~std::uint64_t{0};  // the barrier that timed out (none: all ones)
  std::uint64_t mismatched_ = ~std::uint64_t{0};  // the barrier whose ranks entered different collectives (none: all ones)
  std::string mismatch_what_;  // which ranks entered which
  std::string timeout_what_;  // which ranks did not arrive in it
};

ULYSSES_NAMESPACE_END
