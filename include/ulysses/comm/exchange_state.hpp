// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief ExchangeState: what the transports learn on one communicator about the plans run on it
///        (whether the cross-rank agreement check passed, the peer-copy lists built from the
///        peers' layouts), the call numbers, and the message and peer lists they reuse from call
///        to call. Why it lives in the communicator and not the plan or thread_local storage:
///        docs/extending.md (state a transport learns) and docs/simulation.md (SMPI). A transport's
///        own mechanism keeps its own scratch (Cross Memory Attach: comm/cross_memory.hpp).
///        Notes: docs/headers.md (comm/exchange_state.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../layout/blocks.hpp"

ULYSSES_NAMESPACE_BEGIN

/// The peer-copy transport's block lists of one plan on one group (Path::direct): per direction,
/// for every rank p (this rank included) and tensor, the blocks copying p's input
/// (BufferIndex::peer_input(p, t)) into this rank's outputs, then the sums of replicated heads
/// (head→seq, Replicas::sum) over their holders' inputs in ascending rank order; and seq→head
/// as a push (for ranks of one address space): this rank's input into every rank's outputs
/// (BufferIndex::peer_output(p, t, P)), token tile by token tile.
struct PeerCopyLists {
  std::vector<BlockCopy> list[2];  ///< [Direction]: 0 seq→head, 1 head→seq
  /// seq→head pushed: the blocks copying this rank's input into rank p's output t, for every
  /// rank p (this rank included), in tiles of tokens (each tile's source read once from memory,
  /// then from cache for the other peers). The same element mapping as list[0].
  std::vector<BlockCopy> push_seq_to_head;
  /// [Direction][stage]: the pulled list of one stage alone (a plan of several stages: its head
  /// bands, HeadBands), the heads of that stage of list[d]; empty for a plan of one stage.
  std::vector<std::vector<BlockCopy>> stage_list[2];
  /// A hash of every rank's layouts (its LayoutRecord) the lists were built from, in rank order
  /// (empty when not known): every exchange checks that the peers still hold these layouts.
  std::vector<std::uint64_t> layouts;
  /// Per direction and tensor t: the bytes of this rank's input t its peers' lists read (rank q's
  /// list for every q but this rank, built from the same records), and the mean contiguous bytes
  /// of their ranges (as CrossMemoryRecord::range_bytes; 0 when they read none). Filled only where
  /// `peer_reads` (for communicators across processes: what they stage or publish).
  std::uint64_t peer_read_bytes[2][kMaxTensors] = {};
  std::uint64_t peer_range_bytes[2][kMaxTensors] = {};  ///< see peer_read_bytes
  bool peer_reads = false;                              ///< whether peer_read_bytes and peer_range_bytes are filled
};

/// What the transports learn per communicator (see the file comment). Not thread-safe: a
/// communicator object serves one thread at a time, as every communicator does. A copy of a
/// communicator shares the lists its original built (they are immutable). It remembers at
/// most kMaxPlans plans (the oldest is forgotten first; a forgotten plan is checked and its lists
/// built again at its next exchange, which is correct, just not free).
class ExchangeState {
 public:
  /// Plans remembered at most.
  static constexpr std::size_t kMaxPlans = 256;

  /// Which library call a rank is in: its number on this communicator (1, 2, ...: every rank
  /// numbers its calls alike) and what it is (a hash of the call's name and plan; its name for the
  /// messages). What the shipped communicators compare across ranks in what they already exchange
  /// (LocalGroup's rendezvous, MpiWindowComm's epoch records), so that a rank that skipped a call,
  /// or runs another, gets Error(plan_mismatch) on every rank instead of pairing the wrong calls.
  struct Call {
    std::uint64_t number = 0;  ///< 0: no library call yet
    std::uint64_t what = 0;    ///< the call's kind and plan
    const char* name = "";     ///< e.g. "seq_to_head" (a string literal)
  };
  /// Starts the next library call on this communicator (comm/tell_peers.hpp does, once per call).
  void begin_call(const char* name, std::uint64_t what) noexcept { call_ = {++(counter_ ? *counter_ : calls_), what, name}; }
  /// Numbers the calls from `counter` (not owned; it must outlive this state and its copies)
  /// instead of a count of this object's own: what a communicator whose handles are copies (or
  /// made anew per call) of one rank's passes, so that every handle of the rank counts alike
  /// (LocalGroup: a word of the group per rank; MpiComm: its shared state; MpiWindowComm: its window).
  void count_calls_in(std::uint64_t* counter) noexcept { counter_ = counter; }
  /// The library call in progress (or the last one).
  const Call& call() const noexcept { return call_; }
  /// Takes `c` as the call in progress: what a communicator that makes its calls through another
  /// (MpiWindowComm through its MpiComm) hands that one, so that its messages carry the call too.
  void set_call(const Call& c) noexcept { call_ = c; }

  /// True once the cross-rank agreement check of plan `plan_id` (Plan::id()) passed on this communicator.
  bool agreed(std::uint64_t plan_id) const noexcept {
    for (std::uint64_t id : agreed_)
      if (id == plan_id) return true;
    return false;
  }
  /// Records that the agreement check of plan `plan_id` passed (what check_agreement() does).
  void mark_agreed(std::uint64_t plan_id) {
    if (agreed(plan_id)) return;
    if (agreed_.size() >= kMaxPlans) agreed_.erase(agreed_.begin());
    agreed_.push_back(plan_id);
  }
  /// The peer-copy lists of plan `plan_id` on this communicator's group, or null when not built yet.
  const PeerCopyLists* peer_copy(std::uint64_t plan_id) const noexcept {
    for (const auto& e : peer_copy_)
      if (e.first == plan_id) return e.second.get();
    return nullptr;
  }
  /// Keeps the peer-copy lists of plan `plan_id` (their addresses stay fixed while they are
  /// remembered: a device executor keys its uploaded copies on them) and returns them.
  const PeerCopyLists& set_peer_copy(std::uint64_t plan_id, PeerCopyLists lists) {
    for (auto& e : peer_copy_)
      if (e.first == plan_id) {
        e.second = std::make_shared<const PeerCopyLists>(std::move(lists));
        return *e.second;
      }
    if (peer_copy_.size() >= kMaxPlans) peer_copy_.erase(peer_copy_.begin());
    peer_copy_.emplace_back(plan_id, std::make_shared<const PeerCopyLists>(std::move(lists)));
    return *peer_copy_.back().second;
  }
  /// Forgets everything about plan `plan_id` (optional: for engines that make many short-lived plans).
  void forget(std::uint64_t plan_id) {
    for (std::size_t i = 0; i < agreed_.size(); ++i)
      if (agreed_[i] == plan_id) agreed_.erase(agreed_.begin() + static_cast<std::ptrdiff_t>(i--));
    for (std::size_t i = 0; i < peer_copy_.size(); ++i)
      if (peer_copy_[i].first == plan_id) peer_copy_.erase(peer_copy_.begin() + static_cast<std::ptrdiff_t>(i--));
  }

  /// Scratch: the messages one exchange_messages() call sends and receives (capacity kept).
  std::vector<Message>& send_messages() noexcept { return send_; }
  std::vector<Message>& recv_messages() noexcept { return recv_; }  ///< see send_messages()
  /// Scratch: the peer copy's view of the group, peers[p * kMaxTensors + t] = rank p's input t.
  std::vector<std::byte*>& peer_inputs() noexcept { return peers_; }
  /// Split-phase handles (split_phase.hpp) whose exchange runs on a worker thread now: while one
  /// does, the worker is in the communicator, and no other call may enter it from this rank.
  /// Only the handles' owning thread reads and writes it.
  int workers_in_flight() const noexcept { return workers_.n; }
  void add_worker_in_flight(int d) noexcept { workers_.n += d; }  ///< see workers_in_flight()

 private:
  Call call_;
  std::uint64_t calls_ = 0;               // the calls begun, unless counter_ says where they are counted
  std::uint64_t* counter_ = nullptr;
  std::vector<std::uint64_t> agreed_;
  std::vector<std::pair<std::uint64_t, std::shared_ptr<const PeerCopyLists>>> peer_copy_;
  std::vector<Message> send_, recv_;
  std::vector<std::byte*> peers_;
  struct WorkerCount {  // a copy of the state (of a communicator) has no handle of its own in flight
    int n = 0;
    WorkerCount() = default;
    WorkerCount(const WorkerCount&) noexcept {}
    WorkerCount& operator=(const WorkerCount&) noexcept { return *this; }
  } workers_;
};


ULYSSES_NAMESPACE_END
