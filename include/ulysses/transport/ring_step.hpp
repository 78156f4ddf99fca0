// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief How a ring rotation's exchanges move and progress (RingProgress, detail::RingPoster):
///        read in place from the sender's window slot across the processes of a node
///        (MpiWindowComm's with_peers(): one copy, no wire), else messages (RingConfig::messages
///        pieces a block; posted in start() and completed in finish() over a split-phase
///        communicator, MpiComm), now or on a worker thread: the transport of the ring's steps.
///        ring/rotation.hpp's rotations post through it; the table: docs/ring.md ("Transports").
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../comm/concepts.hpp"
#include "../comm/cross_memory.hpp"
#include "../comm/peer_record.hpp"
#include "../detail/hash.hpp"
#include "../detail/worker.hpp"
#include "../error.hpp"
#include "../layout/blocks.hpp"
#include "../partition/ring.hpp"

ULYSSES_NAMESPACE_BEGIN

/// How an exchange progresses between its start and its finish while the engine computes: a
/// ring rotation's step (see the file comment) and a split-phase exchange (split_phase.hpp).
enum class Progress : std::int32_t {
  automatic = 0,  ///< thread for a communicator that declares progress_thread (LocalGroup::Comm), in_start otherwise
  in_start = 1,   ///< no thread: start() posts the exchange and finish() completes it (comm_traits::split_messages, MpiComm),
                  ///< or start() runs it (stream-ordered communicators: enqueues it) and finish() waits for nothing
  thread = 2,     ///< start() hands it to a worker thread, finish() waits for it (host communicators)
};

/// The ring's name of Progress (RingConfig, the rotations): the same type.
using RingProgress = Progress;

/// How a ring rotation reaches the block of step s (docs/ring.md, "Zero-copy").
enum class RingAccess : std::int32_t {
  copy = 0,       ///< each step copies the next block into the rank's double buffer (messages, or one copy
                  ///< from the sender's window slot); the rank's block may live anywhere
  zero_copy = 1,  ///< no step copies: block(s) points at ring rank source(s)'s own buffer, read in place
                  ///< (MpiWindowComm with the buffers in the window, LocalGroup::Comm); the rotation costs
                  ///< two synchronisations (the backward: R + 1), and every rank's block stays in its
                  ///< buffer until the rotation ends
};

namespace detail {

/// How a rotation's blocks move on Comm (docs/ring.md, "Transports"): read in place from the
/// sender's memory through with_peers() (a communicator across the processes of a node whose
/// with_peers() maps the peers' memory: MpiWindowComm, one copy, no wire), else messages
/// (exchange_messages(); LocalGroup::Comm's copy straight from the sender's memory, MpiComm's MPI
/// messages, cut into RingConfig::messages pieces).
template <class Comm>
inline constexpr bool ring_reads_in_place_v =
    comm_traits<Comm>::with_peers && !comm_traits<Comm>::one_address_space && !comm_traits<Comm>::device_memory;

/// Whether Comm says if its calls may come from another thread (`bool allows_worker_thread() const`).
template <class C, class = void>
struct has_allows_worker_thread : std::false_type {};
template <class C>
struct has_allows_worker_thread<C, std::void_t<decltype(bool{std::declval<const C&>().allows_worker_thread()})>> : std::true_type {};
/// Whether Comm says if it may be called from several threads at once (`bool allows_concurrent_threads() const`).
template <class C, class = void>
struct has_allows_concurrent_threads : std::false_type {};
template <class C>
struct has_allows_concurrent_threads<C, std::void_t<decltype(bool{std::declval<const C&>().allows_concurrent_threads()})>> : std::true_type {};

/// The `layouts` marks of a zero-copy rotation's records (RingSharedBlocks: its open(), its sync()
/// and its abandon()); the copy path publishes the fnv hash of its block sizes, and each side
/// refuses the other's.
inline constexpr std::uint64_t kRingZeroCopyOpen = 0x7a65726f636f7079ull, kRingZeroCopySync = 0x7a65726f73796e63ull,
                               kRingZeroCopyAbandon = 0x7a65726f61626e64ull;

/// The exchanges of a rotation: one step's lists (every send to ring rank r + 1, every receive
/// from r − 1), run now, posted now and completed at wait() (a split-phase communicator:
/// comm_traits::split_messages), or on one persistent worker thread (RingProgress::thread;
/// detail::Worker, started at the first threaded post; a job the worker has not taken by wait()
/// runs on the caller's thread). Over messages each block goes as `messages` pieces
/// (ring_piece_begin()); in place (ring_reads_in_place_v) each send is published whole and the
/// receiver copies the matching block of ring rank r − 1 (by Cross Memory Attach where it lies
/// outside the sender's window slot and the window permits it; staged by the window otherwise).
template <class Comm>
class RingPoster {
 public:
  RingPoster(Comm& comm, RingProgress p, int messages) noexcept : comm_(comm), threaded_(p == RingProgress::thread), messages_(messages) {}
  /// What the rotation's construction checks (under tell_peers_on_failure(), so that the peers
  /// hear of it). @throws Error(invalid_shape) messages outside [1, kMaxRingMessages], or a
  /// worker thread over a communicator that says it cannot serve one (allows_worker_thread():
  /// MpiComm under an MPI thread level below MPI_THREAD_SERIALIZED).
  void check(const char* who) const {
    if (messages_ < 1 || messages_ > kMaxRingMessages)
      fail(Errc::invalid_shape, std::string(who) + ": messages=" + std::to_string(messages_) + " a block must be in [1, " +
                                    std::to_string(kMaxRingMessages) + "]");
    if constexpr (has_allows_worker_thread<Comm>::value)
      if (threaded_ && !comm_.allows_worker_thread())
        fail(Errc::invalid_shape, std::string(who) + ": RingProgress::thread calls the communicator from a worker thread, and it "
                                                     "does not allow that (MPI: initialise with MPI_THREAD_SERIALIZED or above)");
  }
  RingPoster(const RingPoster&) = delete;
  RingPoster& operator=(const RingPoster&) = delete;
  /// Completes a step still posted (a rotation left between start() and finish(), e.g. by an
  /// exception of the engine's): the transport must not write into the buffers after they are
  /// gone. Bounded by the communicator's timeout; its errors are dropped (the communicator reports
  /// them at its next call).
  ~RingPoster() {
    try {
      wait();
    } catch (...) {
    }
  }
  /// Posts one step: n sends (to one peer) and as many receives (from one peer), each a whole
  /// block; one of 0 bytes moves nothing (a block past its last use, RingPlan::last_use(): no
  /// message; in place, published as 0 bytes, so every rank publishes n blocks); the lists are
  /// copied (they may be reused). @pre n <= kMaxTensors.
  void post(const Message* send, const Message* recv, std::size_t n) {
    if (posted_) fail(Errc::invalid_shape, "ring rotation: an exchange was posted twice without finish()");
    whole_send_.assign(send, send + n);
    whole_recv_.assign(recv, recv + n);
    send_.clear();
    recv_.clear();
    if (!ring_reads_in_place_v<Comm>)
      for (std::size_t i = 0; i < n; ++i) cut(send[i], send_), cut(recv[i], recv_);
    posted_ = true;
    if (threaded_) {
      if (!worker_) worker_ = std::make_unique<Worker>();
      worker_->start(exchange_);
    } else if constexpr (comm_traits<Comm>::split_messages && !ring_reads_in_place_v<Comm>) {
      try {
        comm_.start_messages(send_.data(), send_.size(), recv_.data(), recv_.size());
      } catch (...) {
        posted_ = false;
        throw;
      }
    } else {
      try {
        exchange_();
      } catch (...) {
        posted_ = false;
        throw;
      }
    }
  }
  /// Waits for the posted exchange (nothing when none is posted); rethrows what it threw.
  void wait() {
    if (!posted_) return;
    posted_ = false;
    if (threaded_) {
      worker_->finish_here();
    } else if constexpr (comm_traits<Comm>::split_messages && !ring_reads_in_place_v<Comm>) {
      comm_.finish_messages();
    }
  }
  bool posted() const { return posted_; }
  Comm& comm() const { return comm_; }  ///< the ring communicator
  int messages() const { return messages_; }  ///< pieces a block goes in over messages

 private:
  void cut(const Message& m, std::vector<Message>& out) const {
    if (!m.bytes) return;  // (no message: the peer's list drops it too)
    for (int i = 0; i < messages_; ++i) {
      const std::size_t b = ring_piece_begin(m.bytes, messages_, i), e = ring_piece_begin(m.bytes, messages_, i + 1);
      out.push_back({m.peer, m.data + b, e - b});
    }
  }
  /// The in-place step: publishes this rank's sends (PeerRecord inputs 0 .. n − 1) and copies
  /// the sender's into the receives.
  void run_in_place() {
    if constexpr (ring_reads_in_place_v<Comm>) {
      PeerRecord mine;
      CrossMemoryRecord cma;
      const std::size_t n = whole_send_.size();
      mine.count = static_cast<int>(n);
      for (std::size_t i = 0; i < n; ++i) {
        mine.data[i] = whole_send_[i].data;
        mine.bytes[i] = whole_send_[i].bytes;
        mine.read_bytes[i] = whole_send_[i].bytes;
        cma.range_bytes[i] = whole_send_[i].bytes;
        mine.layouts = fnv1a(mine.layouts ? mine.layouts : kFnvBasis, static_cast<std::int64_t>(whole_send_[i].bytes));
      }
      cma.reads_remote = true;
      mine.cross_memory = &cma;
      comm_.with_peers(&mine, &RingPoster::read_in_place, this);
    }
  }
  static void read_in_place(void* ctx, const void* const* all) {
    if constexpr (ring_reads_in_place_v<Comm>) {
      auto& self = *static_cast<RingPoster*>(ctx);
      const int prev = self.whole_recv_.empty() ? 0 : self.whole_recv_[0].peer;
      const std::uint64_t mark = static_cast<const PeerRecord*>(all[prev])->layouts;
      if (mark == kRingZeroCopyOpen || mark == kRingZeroCopySync || mark == kRingZeroCopyAbandon)
        fail(Errc::plan_mismatch, "ring rotation: ring rank " + std::to_string(prev) + " runs RingAccess::zero_copy, this rank "
                                  "RingAccess::copy; every ring rank must run the same ring plan and RingAccess");
      for (std::size_t i = 0; i < self.whole_recv_.size(); ++i) {
        const Message& m = self.whole_recv_[i];
        const auto& from = *static_cast<const PeerRecord*>(all[m.peer]);
        if (static_cast<std::size_t>(from.count) != self.whole_recv_.size() || from.bytes[i] != m.bytes)
          fail(Errc::plan_mismatch, "ring rotation: ring rank " + std::to_string(m.peer) + " sends " +
                                        (static_cast<int>(i) < from.count ? std::to_string(from.bytes[i]) + " bytes" : std::string("nothing")) +
                                        " where ring rank " + std::to_string(self.comm_.rank()) + " receives " + std::to_string(m.bytes) +
                                        " as block " + std::to_string(i) + " of the step; the ranks' ring plans differ");
        if (!m.bytes) continue;
        if (from.data[i]) {
          std::memcpy(m.data, from.data[i], m.bytes);
        } else if (from.cross_memory && from.cross_memory->pid && from.cross_memory->remote[i]) {
          CrossMemoryReader& rd = self.reader_;
          rd.begin(from.cross_memory->pid, m.peer);
          rd.add(m.data, from.cross_memory->remote[i], m.bytes);
          rd.flush();
        } else {
          fail(Errc::plan_mismatch, "ring rotation: ring rank " + std::to_string(m.peer) + " published no readable block " + std::to_string(i));
        }
      }
    } else {
      (void)ctx;
      (void)all;
    }
  }
  struct Exchange {  // the job: the posted lists over the ring
    RingPoster* p;
    void operator()() const {
      if constexpr (ring_reads_in_place_v<Comm>)
        p->run_in_place();
      else
        p->comm_.exchange_messages(p->send_.data(), p->send_.size(), p->recv_.data(), p->recv_.size());
    }
  };
  Comm& comm_;
  bool threaded_;
  int messages_;
  bool posted_ = false;
  std::vector<Message> whole_send_, whole_recv_, send_, recv_;
  CrossMemoryReader reader_;  // the in-place reads of blocks outside the sender's window slot
  Exchange exchange_{this};
  std::unique_ptr<Worker> worker_;  // last: destroyed (after its job) first
};

/// Whether Comm's window can say if a buffer lies in this rank's slot (`comm.window().contains(p, n)`: MpiWindowComm).
template <class C, class = void>
struct has_window_contains : std::false_type {};
template <class C>
struct has_window_contains<C, std::void_t<decltype(bool{std::declval<const C&>().window().contains(std::declval<const void*>(), std::size_t{})})>>
    : std::true_type {};

/// Whether a rotation over Comm can run RingAccess::zero_copy: its with_peers() maps the peers'
/// memory for good (one address space: LocalGroup::Comm; or a window whose slots stay mapped and
/// that says which buffers lie in them: MpiWindowComm), host memory.
template <class Comm>
inline constexpr bool ring_zero_copy_v = comm_traits<Comm>::with_peers && !comm_traits<Comm>::device_memory &&
                                         (comm_traits<Comm>::one_address_space || has_window_contains<Comm>::value);

/// The peers' buffers of a zero-copy rotation (RingAccess::zero_copy): open() publishes this
/// rank's buffers (its own kv block; in the backward also its accumulator) through one
/// with_peers() and keeps every ring rank's address in this process, valid while the owners keep
/// them (every owner's rotation ends in sync(), so none rewrites its block while a peer reads it);
/// sync() is a with_peers() with nothing to read: it returns once every ring rank has reached it.
/// A rank of the other access meets a record of another mark: Error(plan_mismatch). A rotation
/// that ends early on this rank (an exception between open() and its last sync()) must not let
/// its owner free or rewrite the buffers while a peer still reads (or adds into) them: the
/// destructor then waits in one more with_peers() (abandon()) until every ring rank has reached
/// its next synchronisation, i.e. has finished its step; there they throw Error(aborted) (or
/// plan_mismatch: the calls differ). Bounded by the communicator's deadline: a peer whose step
/// outlasts it may still read after this rank has gone.
template <class Comm>
class RingSharedBlocks {
 public:
  explicit RingSharedBlocks(Comm& comm) noexcept : comm_(comm) {}
  ~RingSharedBlocks() { abandon(); }
  /// Checks what zero-copy needs, before any collective, and sizes the peers' address lists (no
  /// allocation inside the collectives). @throws Error(invalid_shape) Comm cannot map its peers'
  /// buffers; a buffer (n of them, bytes[i] each) outside this rank's window slot.
  void check(const char* who, std::byte* const* own, const std::size_t* bytes, std::size_t n) {
    for (auto& p : ptr_) p.assign(static_cast<std::size_t>(comm_.size()), nullptr);
    if constexpr (!ring_zero_copy_v<Comm>) {
      (void)own;
      (void)bytes;
      (void)n;
      fail(Errc::invalid_shape, std::string(who) + ": RingAccess::zero_copy reads the peers' buffers in place, which this communicator "
                                                   "cannot map (use MpiWindowComm or LocalGroup::Comm, or RingAccess::copy)");
    } else if constexpr (!comm_traits<Comm>::one_address_space) {
      for (std::size_t i = 0; i < n; ++i)
        if (bytes[i] && !comm_.window().contains(own[i], bytes[i]))
          fail(Errc::invalid_shape, std::string(who) + ": RingAccess::zero_copy: this rank's " + (i ? "accumulator" : "kv block") + " (" +
                                        std::to_string(bytes[i]) + " bytes) lies outside its window slot; the peers read it in place, so "
                                        "allocate the rotation's buffers from the MpiWindow (or use RingAccess::copy)");
    }
  }
  /// Publishes own[0 .. n) (n <= 2) and keeps every ring rank's: (*sizes[i])[j] is ring rank j's
  /// buffer i (the vectors outlive the rotation). Collective over the ring. @throws
  /// Error(plan_mismatch) a rank publishes other sizes, or runs the copy access; the
  /// communicator's errors.
  void open(std::byte* const* own, const std::vector<std::size_t>* const* sizes, std::size_t n) {
    PeerRecord mine;
    mine.count = static_cast<int>(n);
    mine.layouts = kRingZeroCopyOpen;
    for (std::size_t i = 0; i < n; ++i) {
      mine.data[i] = own[i];
      mine.bytes[i] = mine.read_bytes[i] = (*sizes[i])[static_cast<std::size_t>(comm_.rank())];
      sizes_[i] = sizes[i];
    }
    n_ = n;
    live_ = false;  // (an error here: the peers hear of it at their next collective)
    if constexpr (ring_zero_copy_v<Comm>) comm_.with_peers(&mine, &RingSharedBlocks::keep, this);  // (else check() refused it)
    live_ = true;
  }
  /// Returns once every ring rank has called it at the same `point` of its rotation (a step, or R
  /// for the end); `last`: the rotation's last synchronisation (no abandon() after it). Collective
  /// over the ring. @throws Error(plan_mismatch) a rank is elsewhere in its rotation;
  /// Error(aborted) a rank abandoned it; the communicator's errors.
  void sync(int point, bool last) {
    PeerRecord mine;
    mine.layouts = kRingZeroCopySync;
    mine.count = point;
    live_ = false;
    if constexpr (ring_zero_copy_v<Comm>) comm_.with_peers(&mine, &RingSharedBlocks::check_sync, this);
    live_ = !last;
  }
  /// While a rotation is open (after open(), before the last sync()): one with_peers() with the
  /// abandon mark, which returns once every ring rank has reached its next synchronisation
  /// (and so stopped reading this rank's buffers); its errors are swallowed (the rank is on its
  /// way out with its own). Otherwise nothing.
  void abandon() noexcept {
    if (!live_) return;
    live_ = false;
    try {
      PeerRecord mine;
      mine.layouts = kRingZeroCopyAbandon;
      if constexpr (ring_zero_copy_v<Comm>) comm_.with_peers(&mine, [](void*, const void* const*) {}, this);
    } catch (...) {  // (the peers throw at that synchronisation; this rank's own error is the one to report)
    }
  }
  /// Ring rank j's buffer i (after open()).
  std::byte* at(std::size_t i, int j) const { return ptr_[i][static_cast<std::size_t>(j)]; }

 private:
  static void keep(void* ctx, const void* const* all) {
    auto& self = *static_cast<RingSharedBlocks*>(ctx);
    const int R = self.comm_.size();
    for (std::size_t i = 0; i < self.n_; ++i) self.ptr_[i].assign(static_cast<std::size_t>(R), nullptr);  // (sized by check(): no allocation)
    for (int j = 0; j < R; ++j) {
      const auto& from = *static_cast<const PeerRecord*>(all[j]);
      for (std::size_t i = 0; i < self.n_; ++i) {
        const std::size_t want = (*self.sizes_[i])[static_cast<std::size_t>(j)];
        const bool ok = from.layouts == kRingZeroCopyOpen && from.count == static_cast<int>(self.n_) && from.bytes[i] == want && (from.data[i] || !want);
        if (!ok)
          fail(Errc::plan_mismatch, "zero-copy ring rotation: ring rank " + std::to_string(j) +
                                        (from.layouts != kRingZeroCopyOpen ? " runs another access (RingAccess) or step"
                                                                   : " publishes " + std::to_string(from.bytes[i]) + " bytes where its block has " +
                                                                         std::to_string(want) + " (or none this process can read)") +
                                        "; every ring rank must run the same ring plan and RingAccess");
        self.ptr_[i][static_cast<std::size_t>(j)] = from.data[i];
      }
    }
  }
  static void check_sync(void* ctx, const void* const* all) {
    auto& self = *static_cast<RingSharedBlocks*>(ctx);
    const int point = static_cast<const PeerRecord*>(all[self.comm_.rank()])->count;
    for (int j = 0; j < self.comm_.size(); ++j) {
      const auto& from = *static_cast<const PeerRecord*>(all[j]);
      if (from.layouts == kRingZeroCopyAbandon)
        fail(Errc::aborted, "zero-copy ring rotation: ring rank " + std::to_string(j) + " left its rotation on an error (its own error "
                            "says which) once every ring rank had stopped reading its blocks");
      if (from.layouts != kRingZeroCopySync || from.count != point)
        fail(Errc::plan_mismatch, "zero-copy ring rotation: ring rank " + std::to_string(j) + " is at another point of its rotation (or runs "
                                  "RingAccess::copy); every ring rank must run the same ring plan and RingAccess");
    }
  }
  Comm& comm_;
  const std::vector<std::size_t>* sizes_[2] = {nullptr, nullptr};  // by buffer: every ring rank's bytes
  std::size_t n_ = 0;
  bool live_ = false;  // published, the last sync() not passed: abandon() must wait for the peers
  std::vector<std::byte*> ptr_[2];  // by buffer, by ring rank
};

/// RingProgress::automatic resolved for Comm.
template <class Comm>
RingProgress resolve_progress(RingProgress p) {
  if (p != RingProgress::automatic) return p;
  return comm_traits<Comm>::progress_thread ? RingProgress::thread : RingProgress::in_start;
}

}  // namespace detail

ULYSSES_NAMESPACE_END
