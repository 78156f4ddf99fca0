// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The ring rotation of Ulysses × Ring: R steps, at each a rank hands its current k|v block
///        to the next ring rank and receives the next one (RingRotation, forward), and the backward
///        whose fp32 dk|dv accumulators travel with their kv block and come home (RingGradRotation).
///        Double-buffered; posted before the engine's attention of a step, completed after it.
///
/// Over any communicator with the `exchange_messages()` capability (comm/concepts.hpp: LocalGroup::Comm,
/// MpiComm, NcclComm, DeviceLocalGroup::Comm, a user's type) of the RING: R ranks, this rank's ring
/// rank = comm.rank(). One step is one exchange_messages() call with one message each way (k and v
/// together, one contiguous block; the backward adds the travelling accumulator as a second message
/// of the same call). The k-th message rank i sends rank j is the k-th j receives, so the ring needs
/// no tags. Bounded waits are the communicator's own (LocalGroup's timeout, MpiComm's and NcclComm's
/// deadlines): a ring rank that never arrives ends as their Error(timeout) / Error(aborted).
///
/// Order (the documented order that the tests check): at step s (0 .. R−1) ring rank r holds, in
/// block(s), the block of ring rank (r − s) mod R (ring_source(), ring/schedule.hpp); start(s) sends
/// block(s) to ring rank r + 1 and receives block(s + 1) from ring rank r − 1 (mod R); the last step
/// moves nothing. So every rank sees every ring rank's block exactly once, its own first.
///
/// Progress (RingProgress): an exchange_messages() of a host communicator returns when done, so a
/// rank cannot compute while it runs unless it runs on another thread:
/// - `thread`: start() hands the exchange to the rotation's worker thread (one, persistent), finish()
///   waits for it: the attention of step s overlaps the transfer of block s + 1. The communicator
///   must allow a call from another thread while the caller's thread makes none on it
///   (LocalGroup::Comm does; MPI needs MPI_THREAD_SERIALIZED or more, MPI_Init_thread);
/// - `in_start`: start() runs the exchange, finish() does nothing: right for stream-ordered
///   communicators (NcclComm, DeviceLocalGroup::Comm enqueue and return, so the transfer overlaps
///   the attention kernels of another stream), and for any communicator when overlap is not wanted;
/// - `automatic` (default): `thread` for a communicator that declares `progress_thread`
///   (comm_traits: LocalGroup::Comm, or a user's threaded type), `in_start` otherwise.
/// Between start(s) and finish(s) the caller must not write block(s) (it is being sent) nor touch
/// block(s + 1) (it is being received), and must make no other call on the ring communicator.
///
/// Source: ring attention (Liu et al., arXiv:2310.01889); zhuzilin's ring-flash-attention and
/// yunchang's LongContextAttention (USP, Fang & Zhao, arXiv:2405.07719): send/recv of the next kv
/// block posted before the step's attention and waited on after it; the dk|dv buffers that follow
/// their kv block in the backward.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../layout/blocks.hpp"
#include "../comm/concepts.hpp"
#include "../comm/tell_peers.hpp"

ULYSSES_NAMESPACE_BEGIN

/// How a rotation's exchange progresses while the engine computes (see the file comment).
enum class RingProgress : std::int32_t {
  automatic = 0,  ///< thread for a communicator that declares progress_thread (LocalGroup::Comm), in_start otherwise
  in_start = 1,   ///< start() runs the exchange (stream-ordered communicators: enqueued), finish() waits for nothing
  thread = 2,     ///< start() hands it to a worker thread, finish() waits for it (host communicators)
};

namespace detail {

/// The exchanges of a rotation, run now or on one persistent worker thread (RingProgress).
template <class Comm>
class RingPoster {
 public:
  RingPoster(Comm& comm, RingProgress p) : comm_(comm), threaded_(p == RingProgress::thread) {}
  RingPoster(const RingPoster&) = delete;
  RingPoster& operator=(const RingPoster&) = delete;
  ~RingPoster() {
    if (!worker_.joinable()) return;
    {
      std::unique_lock<std::mutex> l(m_);
      cv_.wait(l, [&] { return !pending_; });
      quit_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  /// Posts the exchange of n_send / n_recv messages (copied: the lists may be reused).
  void post(const Message* send, std::size_t n_send, const Message* recv, std::size_t n_recv) {
    if (posted_) fail(Errc::invalid_shape, "ring rotation: an exchange was posted twice without finish()");
    send_.assign(send, send + n_send);
    recv_.assign(recv, recv + n_recv);
    if (!threaded_) {
      comm_.exchange_messages(send_.data(), send_.size(), recv_.data(), recv_.size());
      posted_ = true;
      return;
    }
    posted_ = true;
    if (!worker_.joinable()) worker_ = std::thread([this] { loop(); });
    {
      std::lock_guard<std::mutex> l(m_);
      pending_ = true;
      error_ = nullptr;
    }
    cv_.notify_all();
  }
  /// Waits for the posted exchange (nothing when none is posted); rethrows what it threw.
  void wait() {
    if (!posted_) return;
    posted_ = false;
    if (!threaded_) return;
    std::exception_ptr e;
    {
      std::unique_lock<std::mutex> l(m_);
      cv_.wait(l, [&] { return !pending_; });
      e = error_;
      error_ = nullptr;
    }
    if (e) std::rethrow_exception(e);
  }
  bool posted() const { return posted_; }
  Comm& comm() const { return comm_; }  ///< the ring communicator

 private:
  void loop() {
    std::unique_lock<std::mutex> l(m_);
    for (;;) {
      cv_.wait(l, [&] { return pending_ || quit_; });
      if (quit_) return;
      l.unlock();
      std::exception_ptr e;
      try {
        comm_.exchange_messages(send_.data(), send_.size(), recv_.data(), recv_.size());
      } catch (...) {
        e = std::current_exception();
      }
      l.lock();
      error_ = e;
      pending_ = false;
      cv_.notify_all();
    }
  }
  Comm& comm_;
  bool threaded_;
  bool posted_ = false;
  std::vector<Message> send_, recv_;
  std::thread worker_;
  std::mutex m_;
  std::condition_variable cv_;
  bool pending_ = false, quit_ = false;
  std::exception_ptr error_;
};

/// RingProgress::automatic resolved for Comm.
template <class Comm>
RingProgress resolve_progress(RingProgress p) {
  if (p != RingProgress::automatic) return p;
  return comm_traits<Comm>::progress_thread ? RingProgress::thread : RingProgress::in_start;
}

/// Checks a ring communicator against the ring degree R. @throws Error(comm_mismatch).
template <class Comm>
void check_ring_comm(const Comm& comm, int R, const char* who) {
  check_comm_size(comm, R, -1, std::string(who) + " (the ring degree R)",
                  std::string("; hand in the ring group of the mesh (R ranks holding the same Ulysses rank), not ") +
                      (comm.size() == 1 ? "a group of one (a hybrid that would run as CP=1)" : "another group"));
}

}  // namespace detail

/// The forward ring rotation of kv blocks over a ring communicator (see the file comment).
/// Allocates nothing after construction (the worker thread starts at the first threaded start()).
template <class Comm>
class RingRotation {
  static_assert(comm_traits<Comm>::exchange_messages, "RingRotation needs a communicator with exchange_messages() (comm/concepts.hpp)");

 public:
  /// @param ring         the ring communicator: R ranks, this rank's ring rank = ring.rank()
  /// @param block_bytes  R entries: bytes of ring rank j's kv block (k then v, as the engine packs
  ///                     them; ring/merge.hpp's RingKvBlock gives the layout), the same list on every rank
  /// @param buffer0, buffer1  two caller buffers of `buffer_bytes` bytes each, in the
  ///                     communicator's memory (host, or device for NcclComm); buffer0 must hold
  ///                     this rank's own block before start(0)
  /// @param buffer_bytes bytes of each buffer, >= the largest block_bytes entry
  /// @param progress     how the exchange overlaps (RingProgress)
  /// @throws Error(comm_mismatch) ring.size() != block_bytes.size() (e.g. a ring group of one
  ///         rank for a ring of R = 2: the misconfigured hybrid of bug case C14);
  ///         Error(buffer_too_small) a buffer is null or smaller than a block.
  RingRotation(Comm& ring, std::vector<std::size_t> block_bytes, std::byte* buffer0, std::byte* buffer1, std::size_t buffer_bytes,
               RingProgress progress = RingProgress::automatic)
      : bytes_(std::move(block_bytes)), poster_(ring, detail::resolve_progress<Comm>(progress)) {
    detail::tell_peers_on_failure(ring, ring.rank(), "RingRotation's construction", [&] {  // (the peers may be in start(0))
      R_ = static_cast<int>(bytes_.size());
      detail::check_ring_comm(ring, R_, "RingRotation");
      r_ = ring.rank();
      buf_[0] = buffer0;
      buf_[1] = buffer1;
      for (int j = 0; j < R_; ++j)
        if (bytes_[static_cast<std::size_t>(j)] > buffer_bytes || (R_ > 1 && (!buffer0 || !buffer1)) || !buffer0)
          detail::fail(Errc::buffer_too_small, "RingRotation: ring rank " + std::to_string(j) + "'s block has " +
                                                   std::to_string(bytes_[static_cast<std::size_t>(j)]) + " bytes, the buffers " +
                                                   std::to_string(buffer_bytes) + (buffer0 && (buffer1 || R_ == 1) ? "" : " (a null buffer)"));
    });
  }

  int steps() const { return R_; }        ///< R
  int ring_rank() const { return r_; }    ///< this rank's ring rank
  /// The ring rank whose block is held at step s: (r − s) mod R. @throws Error(invalid_group) s outside [0, R).
  int source(int s) const {
    check_step(s);
    return ((r_ - s) % R_ + R_) % R_;
  }
  /// The buffer holding step s's block (buffer s % 2); valid from finish(s − 1) (from the
  /// construction for s = 0) until start(s + 1). @throws Error(invalid_group) s outside [0, R).
  std::byte* block(int s) const {
    check_step(s);
    return buf_[s % 2];
  }
  /// Bytes of step s's block (block_bytes[source(s)]).
  std::size_t block_bytes(int s) const { return bytes_[static_cast<std::size_t>(source(s))]; }

  /// Posts step s's transfer (s < R − 1): block(s) to ring rank r + 1, block(s + 1) from ring rank
  /// r − 1; nothing at the last step. Collective over the ring, steps in order.
  /// @throws Error(invalid_group) s outside [0, R) or out of order; the communicator's errors.
  void start(int s) {
    detail::begin_call(poster_.comm(), "a ring step", static_cast<std::uint64_t>(s));
    detail::tell_peers_on_failure(poster_.comm(), r_, "a ring step", [&] {
      check_step(s);
      if (s != next_)
        detail::fail(Errc::invalid_group, "RingRotation: start(" + std::to_string(s) + ") after step " + std::to_string(next_ - 1) +
                                              "; steps run 0 .. R-1 in order, each start() followed by its finish()");
      ++next_;
      if (s + 1 >= R_) return;
      const Message send{(r_ + 1) % R_, buf_[s % 2], block_bytes(s)};
      const Message recv{(r_ + R_ - 1) % R_, buf_[(s + 1) % 2], bytes_[static_cast<std::size_t>(source(s + 1))]};
      poster_.post(&send, 1, &recv, 1);
    });
  }
  /// Completes step s's transfer: block(s + 1) holds its block on return (or in stream order).
  /// @throws the communicator's errors (Error(timeout), Error(aborted), Error(backend)).
  void finish(int s) {
    detail::tell_peers_on_failure(poster_.comm(), r_, "a ring step", [&] {
      check_step(s);
      poster_.wait();
    });
    if (s + 1 == R_) next_ = 0;  // a rotation object can run the next layer's ring
  }

 private:
  void check_step(int s) const {
    if (s < 0 || s >= R_)
      detail::fail(Errc::invalid_group, "ring step " + std::to_string(s) + " is outside [0, R=" + std::to_string(R_) + ")");
  }
  std::vector<std::size_t> bytes_;
  detail::RingPoster<Comm> poster_;
  std::byte* buf_[2] = {nullptr, nullptr};
  int R_ = 1, r_ = 0, next_ = 0;
};

/// The backward ring rotation: the kv blocks rotate as in RingRotation, and with each travels its
/// fp32 dk|dv accumulator, which comes home after R steps (one hop more than the kv block).
///
/// Per step s: start(s) (one exchange_messages() call: the kv block of step s to ring rank r + 1 and
/// block s + 1 from r − 1, as RingRotation; for s >= 1 also the accumulator of step s − 1 to r + 1
/// and step s's from r − 1); the engine computes step s's gradients into its own fp32 scratch;
/// finish(s); then adds its dk|dv contribution into grad(s) (for s = 0 grad(0) is the caller's
/// zeroed or first contribution: the accumulator of the rank's own block starts there). After the
/// last step, home() (one exchange: the accumulator of step R − 1 to r + 1) returns the buffer
/// holding the rank's own block's accumulator: the sum of every ring rank's contribution to it, in
/// step order from the rank itself: ((c_r + c_{r+1}) + c_{r+2}) + ... — the same bits on every run.
template <class Comm>
class RingGradRotation {
  static_assert(comm_traits<Comm>::exchange_messages, "RingGradRotation needs a communicator with exchange_messages()");

 public:
  /// @param ring, block_bytes, kv0, kv1, kv_buffer_bytes, progress  as RingRotation's
  /// @param grad_bytes   R entries: bytes of ring rank j's dk|dv accumulator (fp32 typically)
  /// @param grad0, grad1 two caller buffers of grad_buffer_bytes each; grad0 holds step 0's accumulator
  /// @param grad_buffer_bytes bytes of each of grad0 and grad1 (at least the largest grad_bytes entry)
  /// @throws as RingRotation (comm_mismatch; buffer_too_small, also for the accumulators, and when
  ///         grad_bytes.size() != block_bytes.size()).
  RingGradRotation(Comm& ring, std::vector<std::size_t> block_bytes, std::byte* kv0, std::byte* kv1, std::size_t kv_buffer_bytes,
                   std::vector<std::size_t> grad_bytes, std::byte* grad0, std::byte* grad1, std::size_t grad_buffer_bytes,
                   RingProgress progress = RingProgress::automatic)
      : kv_(std::move(block_bytes)), gr_(std::move(grad_bytes)), poster_(ring, detail::resolve_progress<Comm>(progress)) {
    detail::tell_peers_on_failure(ring, ring.rank(), "RingGradRotation's construction", [&] { check(ring, kv0, kv1, kv_buffer_bytes, grad0, grad1, grad_buffer_bytes); });
  }

 private:
  /// The constructor's checks. @throws as the constructor.
  void check(Comm& ring, std::byte* kv0, std::byte* kv1, std::size_t kv_buffer_bytes, std::byte* grad0, std::byte* grad1,
             std::size_t grad_buffer_bytes) {
    R_ = static_cast<int>(kv_.size());
    detail::check_ring_comm(ring, R_, "RingGradRotation");
    r_ = ring.rank();
    kvb_[0] = kv0;
    kvb_[1] = kv1;
    gb_[0] = grad0;
    gb_[1] = grad1;
    if (gr_.size() != kv_.size())
      detail::fail(Errc::buffer_too_small, "RingGradRotation: " + std::to_string(gr_.size()) + " accumulator sizes for " +
                                               std::to_string(kv_.size()) + " kv blocks; give one per ring rank");
    for (int j = 0; j < R_; ++j) {
      const auto J = static_cast<std::size_t>(j);
      if (kv_[J] > kv_buffer_bytes || gr_[J] > grad_buffer_bytes || !kv0 || !grad0 || (R_ > 1 && (!kv1 || !grad1)))
        detail::fail(Errc::buffer_too_small, "RingGradRotation: ring rank " + std::to_string(j) + "'s block has " + std::to_string(kv_[J]) +
                                                 " bytes and its accumulator " + std::to_string(gr_[J]) + ", the buffers " +
                                                 std::to_string(kv_buffer_bytes) + " and " + std::to_string(grad_buffer_bytes) +
                                                 " (or a buffer is null)");
    }
  }

 public:

  int steps() const { return R_; }      ///< R
  int ring_rank() const { return r_; }  ///< this rank's ring rank
  /// The ring rank whose block (and accumulator) is held at step s: (r − s) mod R.
  int source(int s) const {
    check_step(s, R_);
    return ((r_ - s) % R_ + R_) % R_;
  }
  /// The kv buffer of step s (s % 2), as RingRotation::block().
  std::byte* block(int s) const {
    check_step(s, R_);
    return kvb_[s % 2];
  }
  /// The accumulator buffer of step s (s % 2): after finish(s) it holds the sum of the
  /// contributions of the ring ranks before this one to block source(s) (nothing for s = 0: the
  /// caller's start); add this rank's contribution to it before start(s + 1).
  std::byte* grad(int s) const {
    check_step(s, R_);
    return gb_[s % 2];
  }

  /// Posts step s's exchange (see the class comment). Collective over the ring, steps in order.
  /// @throws Error(invalid_group) s out of order; the communicator's errors.
  void start(int s) {
    check_step(s, R_);
    if (s != next_)
      detail::fail(Errc::invalid_group, "RingGradRotation: start(" + std::to_string(s) + ") out of order (expected step " +
                                            std::to_string(next_) + ")");
    ++next_;
    if (R_ == 1) return;
    Message send[2], recv[2];
    std::size_t n = 0;
    const int next = (r_ + 1) % R_, prev = (r_ + R_ - 1) % R_;
    if (s + 1 < R_) {
      send[n] = {next, kvb_[s % 2], kv_[static_cast<std::size_t>(source(s))]};
      recv[n++] = {prev, kvb_[(s + 1) % 2], kv_[static_cast<std::size_t>(source(s + 1))]};
    }
    if (s >= 1) {
      send[n] = {next, gb_[(s - 1) % 2], gr_[static_cast<std::size_t>(source(s - 1))]};
      recv[n++] = {prev, gb_[s % 2], gr_[static_cast<std::size_t>(source(s))]};
    }
    detail::begin_call(poster_.comm(), "a backward ring step", static_cast<std::uint64_t>(s));
    detail::tell_peers_on_failure(poster_.comm(), r_, "a backward ring step", [&] { poster_.post(send, n, recv, n); });
  }
  /// Completes step s's exchange: block(s + 1) and grad(s) hold what came from ring rank r − 1.
  void finish(int s) {
    check_step(s, R_);
    detail::tell_peers_on_failure(poster_.comm(), r_, "a backward ring step", [&] { poster_.wait(); });
  }
  /// After finish(R − 1) and the last contribution added to grad(R − 1): sends it home (to ring
  /// rank r + 1, whose block it is) and receives this rank's own accumulator; returns the buffer
  /// that holds it (grad buffer R % 2). Collective over the ring; blocking.
  /// @throws Error(invalid_group) before the last step; the communicator's errors.
  std::byte* home() {
    if (next_ != R_) detail::fail(Errc::invalid_group, "RingGradRotation: home() before the last step's start()/finish()");
    next_ = 0;
    if (R_ == 1) return gb_[0];
    const Message send{(r_ + 1) % R_, gb_[(R_ - 1) % 2], gr_[static_cast<std::size_t>(source(R_ - 1))]};
    const Message recv{(r_ + R_ - 1) % R_, gb_[R_ % 2], gr_[static_cast<std::size_t>(r_)]};
    detail::begin_call(poster_.comm(), "the backward ring's last step");
    detail::tell_peers_on_failure(poster_.comm(), r_, "the backward ring's last step", [&] {
      poster_.post(&send, 1, &recv, 1);
      poster_.wait();
    });
    return gb_[R_ % 2];
  }

 private:
  static void check_step(int s, int R) {
    if (s < 0 || s >= R) detail::fail(Errc::invalid_group, "ring step " + std::to_string(s) + " is outside [0, R=" + std::to_string(R) + ")");
  }
  std::vector<std::size_t> kv_, gr_;
  detail::RingPoster<Comm> poster_;
  std::byte* kvb_[2] = {nullptr, nullptr};
  std::byte* gb_[2] = {nullptr, nullptr};
  int R_ = 1, r_ = 0, next_ = 0;
};

ULYSSES_NAMESPACE_END
