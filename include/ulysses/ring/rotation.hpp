// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The ring rotation of Ulysses × Ring: R steps, at each a rank hands its current k|v block
///        to ring rank r + 1 and receives the next from r − 1 (RingRotation, forward), and the
///        backward whose fp32 dk|dv accumulators travel with their kv block and come home
///        (RingGradRotation). Double-buffered over the caller's RingBuffers, sized by a RingPlan;
///        one exchange a step, posted before the step's attention and completed after it
///        (RingProgress): read in place from the sender's window slot across the processes of a
///        node (MpiWindowComm: one copy, no wire), else messages (RingConfig::messages pieces a
///        block; MpiComm posts in start() and waits in finish()). Order, progress, transports, the
///        rules between start() and finish(), and sources: docs/ring.md ("Progress and communicators").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../layout/blocks.hpp"
#include "../comm/concepts.hpp"
#include "../comm/tell_peers.hpp"
#include "buffers.hpp"
#include "plan.hpp"
#include "../transport/ring_step.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {

/// Checks a ring communicator against the ring degree R. @throws Error(comm_mismatch).
template <class Comm>
void check_ring_comm(const Comm& comm, int R, const char* who) {
  check_comm_size(comm, R, -1, std::string(who) + " (the ring degree R)",
                  std::string("; hand in the ring group of the mesh (R ranks holding the same Ulysses rank), not ") +
                      (comm.size() == 1 ? "a group of one (a hybrid that would run as CP=1)" : "another group"));
}


/// The word of a ring step's library call (begin_call()): the step and the wire split, so that
/// ranks that cut their blocks differently never pair their messages (they time out instead).
inline std::uint64_t ring_call_word(int s, int messages) noexcept {
  return static_cast<std::uint64_t>(s) | static_cast<std::uint64_t>(messages) << 32;
}

/// Whether the hop from step s to s + 1 carries ring rank j's kv block: every hop without a plan's
/// last uses (`last_use` empty), else while s < last_use[j] (RingPlan::last_use()).
inline bool ring_hop_carries(const std::vector<int>& last_use, int j, int s) {
  return last_use.empty() || s < last_use[static_cast<std::size_t>(j)];
}

/// Checks that finish(s) completes the step started last. @throws Error(invalid_group).
inline void check_finish(const char* who, int s, int next, bool open) {
  if (!open || s != next - 1)
    fail(Errc::invalid_group, std::string(who) + ": finish(" + std::to_string(s) + ") " +
                                  (open ? "after start(" + std::to_string(next - 1) + ")" : std::string("with no step started")) +
                                  "; each start(s) is followed by its finish(s)");
}

/// Checks a rotation's double buffer against the blocks (bytes by ring rank) it must hold.
/// @throws Error(buffer_too_small) a null buffer (the second may be null when R = 1) or one smaller
///         than a block; Error(invalid_shape) the two buffers overlap (R > 1).
inline void check_ring_buffers(const char* who, const char* what, const RingBufferPair& b, const std::vector<std::size_t>& bytes) {
  const std::size_t R = bytes.size();
  if (R > 1 && b.first && b.second && b.first < b.second + b.second_bytes && b.second < b.first + b.first_bytes)
    fail(Errc::invalid_shape, std::string(who) + ": the two " + what + " buffers overlap; a step receives into one while the other is sent");
  for (std::size_t j = 0; j < R; ++j) {
    const bool null = !b.first || (R > 1 && !b.second);
    if (!null && bytes[j] <= b.first_bytes && (R == 1 || bytes[j] <= b.second_bytes)) continue;
    fail(Errc::buffer_too_small, std::string(who) + ": ring rank " + std::to_string(j) + "'s " + what + " has " + std::to_string(bytes[j]) +
                                     " bytes, the buffers " + std::to_string(b.first_bytes) + " and " + std::to_string(b.second_bytes) +
                                     (null ? " (a null buffer)" : "") + "; size them by the RingPlan");
  }
}

/// A buffer's bytes as T (the element type of its block). @throws Error(tensor_mismatch) sizeof(T) != element_bytes.
template <class T>
T* ring_typed(std::byte* p, std::size_t element_bytes, const char* who) {
  if (sizeof(T) != element_bytes)
    fail(Errc::tensor_mismatch, std::string(who) + ": elements of " + std::to_string(sizeof(T)) + " bytes asked for a block of " +
                                    std::to_string(element_bytes) + "-byte elements");
  return static_cast<T*>(static_cast<void*>(p));
}

}  // namespace detail

/// The forward ring rotation of kv blocks over a ring communicator (see the file comment).
/// Allocates nothing after construction (the worker thread starts at the first threaded start()).
template <class Comm>
class RingRotation {
  static_assert(comm_traits<Comm>::exchange_messages, "RingRotation needs a communicator with exchange_messages() (comm/concepts.hpp)");

 public:
  /// @param ring      the ring communicator: R ranks, this rank's ring rank = ring.rank() = plan.ring_rank()
  /// @param plan      this rank's RingPlan: the blocks' sizes and layouts (the same sizes on every ring rank)
  /// @param buffers   `RingBuffers().kv(kv0, kv1)`: two buffers of at least plan.kv_buffer_bytes()
  ///                  each, in the communicator's memory; kv0 holds this rank's own block (k then
  ///                  v, RingKvBlock) before start(0) (kv<T>(0) points into it)
  /// @param progress  how the exchange overlaps (RingProgress)
  /// @param access    how step s's block is reached (RingAccess; every ring rank the same):
  ///                  zero_copy needs kv0 in the window (MpiWindowComm) and LocalGroup::Comm or MpiWindowComm
  /// @throws Error(comm_mismatch) ring.size() != R (e.g. a ring group of one rank for R = 2: the
  ///         misconfigured hybrid of bug case C14); Error(buffer_too_small) a buffer null or smaller than a block;
  ///         Error(invalid_shape) zero_copy over a communicator that cannot map its peers, or kv0 outside the window slot.
  RingRotation(Comm& ring, const RingPlan& plan, const RingBuffers& buffers, RingProgress progress = RingProgress::automatic,
               RingAccess access = RingAccess::copy)
      : bytes_(plan.block_bytes()), last_use_(plan.last_uses()), poster_(ring, detail::resolve_progress<Comm>(progress), plan.messages()),
        access_(access), shared_(ring) {
    for (int j = 0; j < plan.steps(); ++j) shapes_.push_back(plan.kv_block_of(j));
    init(ring, buffers.kv_buffers());
  }
  /// A rotation of blocks of any sizes (not an attention's: no RingPlan), e.g. an engine's own
  /// ring payload; kv<T>() needs a RingPlan's shapes, block(s) serves this form.
  /// @param ring        the ring communicator: R = block_bytes.size() ranks
  /// @param block_bytes ring rank j's block size at index j (R entries, the same on every ring rank)
  /// @param buffers     `RingBuffers().kv(b0, b1)`: two buffers of at least the largest block each
  /// @param progress    how the exchange overlaps (RingProgress)
  /// @param messages    pieces a block goes in over messages (RingConfig::messages; every ring rank the same)
  /// @param access      how step s's block is reached (RingAccess), as above
  /// @param last_uses   by ring rank, the last step that attends its block (RingPlan::last_uses(), e.g. for a
  ///                    head band of a plan's blocks: no message past it); empty: every block carried
  /// @throws as above; Error(invalid_shape) messages outside [1, kMaxRingMessages], last_uses not empty nor of R entries.
  RingRotation(Comm& ring, std::vector<std::size_t> block_bytes, const RingBuffers& buffers, RingProgress progress = RingProgress::automatic,
               int messages = 1, RingAccess access = RingAccess::copy, std::vector<int> last_uses = {})
      : bytes_(std::move(block_bytes)), last_use_(std::move(last_uses)), poster_(ring, detail::resolve_progress<Comm>(progress), messages),
        access_(access), shared_(ring) {
    init(ring, buffers.kv_buffers());
  }

  int steps() const { return R_; }        ///< R
  int ring_rank() const { return r_; }    ///< this rank's ring rank
  /// The ring rank whose block is held at step s: (r − s) mod R. @throws Error(invalid_group) s outside [0, R).
  int source(int s) const {
    check_step(s);
    return ((r_ - s) % R_ + R_) % R_;
  }
  /// The buffer holding step s's block (buffer s % 2); valid from finish(s − 1) (from the
  /// construction for s = 0) until start(s + 1). Over a RingPlan, a block past its last use
  /// (carried(s) false: no ring rank attends it from step s on) is not sent, and block(s) then
  /// holds stale bytes: the step's work is empty. RingAccess::zero_copy: ring rank source(s)'s
  /// own buffer kv0 (read it only: its owner's), valid from start(0) until finish(R − 1).
  /// @throws Error(invalid_group) s outside [0, R).
  std::byte* block(int s) const {
    check_step(s);
    if (access_ == RingAccess::zero_copy && s > 0) return shared_.at(0, source(s));
    return buf_[s % 2];
  }
  RingAccess access() const { return access_; }  ///< how step s's block is reached
  /// Whether step s's block arrives (s = 0: the rank's own, always): true for a rotation made
  /// from block sizes; over a RingPlan, whether s <= plan.last_use(source(s)).
  /// @throws Error(invalid_group) s outside [0, R).
  bool carried(int s) const {
    return s == 0 || access_ == RingAccess::zero_copy || detail::ring_hop_carries(last_use_, source(s), s - 1);
  }
  /// Step s's block typed: k and v of the block (T: the element type, of the plan's size).
  /// @throws Error(invalid_group) s outside [0, R); Error(tensor_mismatch) sizeof(T) is not the
  ///         element size, or a rotation made without a RingPlan.
  template <class T>
  RingKvView<T> kv(int s) const {
    const int j = source(s);
    if (shapes_.empty()) detail::fail(Errc::tensor_mismatch, "RingRotation::kv(): a rotation made without a RingPlan has no block layout");
    const RingKvBlock& b = shapes_[static_cast<std::size_t>(j)];
    return {detail::ring_typed<T>(block(s), b.element_bytes, "RingRotation::kv()"),
            detail::ring_typed<T>(block(s) + b.v_offset(), b.element_bytes, "RingRotation::kv()")};
  }
  /// Bytes of step s's block (block_bytes[source(s)]).
  std::size_t block_bytes(int s) const { return bytes_[static_cast<std::size_t>(source(s))]; }

  /// Posts step s's transfer (s < R − 1): block(s) to ring rank r + 1, block(s + 1) from ring rank
  /// r − 1, each only while a ring rank still attends it (carried()); nothing at the last step.
  /// Collective over the ring, steps in order.
  /// @throws Error(invalid_group) s outside [0, R) or out of order; the communicator's errors.
  void start(int s) {
    detail::begin_call(poster_.comm(), "a ring step", detail::ring_call_word(s, poster_.messages()));
    detail::tell_peers_on_failure(poster_.comm(), r_, "a ring step", [&] {
      check_step(s);
      if (s != next_ || open_)
        detail::fail(Errc::invalid_group, "RingRotation: start(" + std::to_string(s) + ") after step " + std::to_string(next_ - 1) +
                                              (open_ ? " was started and not finished" : "") +
                                              "; steps run 0 .. R-1 in order, each start() followed by its finish()");
      ++next_;
      open_ = true;
      if (access_ == RingAccess::zero_copy) {  // the blocks' addresses once; the steps move nothing
        const std::vector<std::size_t>* sizes[1] = {&bytes_};
        if (s == 0 && R_ > 1) shared_.open(buf_, sizes, 1);
        return;
      }
      if (s + 1 >= R_) return;
      const bool out = detail::ring_hop_carries(last_use_, source(s), s), in = carried(s + 1);  // (0 bytes past a last use: no message)
      const Message send{(r_ + 1) % R_, buf_[s % 2], out ? block_bytes(s) : 0};
      const Message recv{(r_ + R_ - 1) % R_, buf_[(s + 1) % 2], in ? bytes_[static_cast<std::size_t>(source(s + 1))] : 0};
      poster_.post(&send, &recv, 1);
    });
  }
  /// Completes step s's transfer: block(s + 1) holds its block on return (or in stream order) where carried(s + 1).
  /// @throws Error(invalid_group) s is not the step started last; the communicator's errors
  ///         (Error(timeout), Error(aborted), Error(backend)).
  void finish(int s) {
    detail::tell_peers_on_failure(poster_.comm(), r_, "a ring step", [&] {
      check_step(s);
      detail::check_finish("RingRotation", s, next_, open_);
      open_ = false;
      poster_.wait();
      if (access_ == RingAccess::zero_copy && s + 1 == R_ && R_ > 1) shared_.sync(R_, true);  // no owner rewrites its block while a peer reads it
    });
    if (s + 1 == R_) next_ = 0;  // a rotation object can run the next layer's ring
  }

 private:
  void init(Comm& ring, const RingBufferPair& b) {
    detail::tell_peers_on_failure(ring, ring.rank(), "RingRotation's construction", [&] {  // (the peers may be in start(0))
      poster_.check("RingRotation");
      R_ = static_cast<int>(bytes_.size());
      detail::check_ring_last_uses("RingRotation", last_use_, R_);
      detail::check_ring_comm(ring, R_, "RingRotation");
      r_ = ring.rank();
      detail::check_ring_buffers("RingRotation", "block", b, bytes_);
      buf_[0] = b.first;
      buf_[1] = b.second;
      if (access_ == RingAccess::zero_copy) shared_.check("RingRotation", buf_, &bytes_[static_cast<std::size_t>(r_)], 1);
    });
  }
  void check_step(int s) const {
    if (s < 0 || s >= R_)
      detail::fail(Errc::invalid_group, "ring step " + std::to_string(s) + " is outside [0, R=" + std::to_string(R_) + ")");
  }
  std::vector<std::size_t> bytes_;
  std::vector<int> last_use_;        // by ring rank: RingPlan::last_use() (empty: made without a plan, every block carried)
  std::vector<RingKvBlock> shapes_;  // by ring rank (empty: made without a plan)
  detail::RingPoster<Comm> poster_;
  RingAccess access_;
  detail::RingSharedBlocks<Comm> shared_;  // RingAccess::zero_copy: every ring rank's kv0
  std::byte* buf_[2] = {nullptr, nullptr};
  int R_ = 1, r_ = 0, next_ = 0;
  bool open_ = false;  // a step started and not finished
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
  /// @param ring, plan, progress  as RingRotation's
  /// @param buffers  `RingBuffers().kv(kv0, kv1).grad(g0, g1)`: the kv buffers as RingRotation's,
  ///                 and two fp32 dk|dv accumulators of at least plan.grad_buffer_bytes() each
  ///                 (g0 holds step 0's accumulator)
  /// @param access   as RingRotation's; zero_copy: grad(s) is ring rank source(s)'s own g0 (each
  ///                 step adds into its owner's accumulator, in the same order), kv0 and g0 in the window
  /// @throws as RingRotation (comm_mismatch; buffer_too_small, also for the accumulators; invalid_shape).
  RingGradRotation(Comm& ring, const RingPlan& plan, const RingBuffers& buffers, RingProgress progress = RingProgress::automatic,
                   RingAccess access = RingAccess::copy)
      : kv_(plan.block_bytes()), gr_(plan.grad_bytes()), last_use_(plan.last_uses()),
        poster_(ring, detail::resolve_progress<Comm>(progress), plan.messages()), access_(access), shared_(ring) {
    for (int j = 0; j < plan.steps(); ++j) shapes_.push_back(plan.kv_block_of(j));
    init(ring, buffers.kv_buffers(), buffers.grad_buffers());
  }
  /// A rotation of blocks and accumulators of any sizes (no RingPlan), as RingRotation's.
  /// @param ring        the ring communicator: R = block_bytes.size() ranks
  /// @param block_bytes ring rank j's block size at index j
  /// @param grad_bytes  ring rank j's accumulator size at index j (R entries)
  /// @param buffers     `RingBuffers().kv(b0, b1).grad(g0, g1)`
  /// @param progress    how the exchange overlaps (RingProgress)
  /// @param messages    pieces a block (and an accumulator) goes in over messages (every ring rank the same)
  /// @param access      how step s's block and accumulator are reached (RingAccess), as above
  /// @param last_uses   the blocks' last uses, as RingRotation's (the accumulators always travel)
  /// @throws as above; Error(invalid_shape) messages outside [1, kMaxRingMessages], last_uses not empty nor of R entries.
  RingGradRotation(Comm& ring, std::vector<std::size_t> block_bytes, std::vector<std::size_t> grad_bytes, const RingBuffers& buffers,
                   RingProgress progress = RingProgress::automatic, int messages = 1, RingAccess access = RingAccess::copy,
                   std::vector<int> last_uses = {})
      : kv_(std::move(block_bytes)), gr_(std::move(grad_bytes)), last_use_(std::move(last_uses)),
        poster_(ring, detail::resolve_progress<Comm>(progress), messages), access_(access), shared_(ring) {
    init(ring, buffers.kv_buffers(), buffers.grad_buffers());
  }

  int steps() const { return R_; }      ///< R
  int ring_rank() const { return r_; }  ///< this rank's ring rank
  /// The ring rank whose block (and accumulator) is held at step s: (r − s) mod R.
  int source(int s) const {
    check_step(s, R_);
    return ((r_ - s) % R_ + R_) % R_;
  }
  /// The kv buffer of step s (s % 2), as RingRotation::block() (stale bytes where carried(s) is false;
  /// RingAccess::zero_copy: ring rank source(s)'s kv0, valid from start(0) until home()).
  std::byte* block(int s) const {
    check_step(s, R_);
    if (access_ == RingAccess::zero_copy && s > 0) return shared_.at(0, source(s));
    return kvb_[s % 2];
  }
  RingAccess access() const { return access_; }  ///< how step s's block and accumulator are reached
  /// Whether step s's kv block arrives, as RingRotation::carried(); the accumulators always travel.
  bool carried(int s) const {
    return s == 0 || access_ == RingAccess::zero_copy || detail::ring_hop_carries(last_use_, source(s), s - 1);
  }
  /// Step s's block typed, as RingRotation::kv().
  template <class T>
  RingKvView<T> kv(int s) const {
    const int j = source(s);
    if (shapes_.empty()) detail::fail(Errc::tensor_mismatch, "RingGradRotation::kv(): a rotation made without a RingPlan has no block layout");
    const RingKvBlock& b = shapes_[static_cast<std::size_t>(j)];
    return {detail::ring_typed<T>(block(s), b.element_bytes, "RingGradRotation::kv()"),
            detail::ring_typed<T>(block(s) + b.v_offset(), b.element_bytes, "RingGradRotation::kv()")};
  }
  /// The accumulator buffer of step s (s % 2): after finish(s) it holds the sum of the
  /// contributions of the ring ranks before this one to block source(s) (nothing for s = 0: the
  /// caller's start); add this rank's contribution to it before start(s + 1). RingAccess::zero_copy:
  /// ring rank source(s)'s own g0, which no other rank touches between finish(s) and start(s + 1).
  std::byte* grad(int s) const {
    check_step(s, R_);
    if (access_ == RingAccess::zero_copy && s > 0) return shared_.at(1, source(s));
    return gb_[s % 2];
  }
  /// grad(s) as fp32 (dk [B, L, Hkv, D] then dv [B, L, Hkv, Dv]).
  template <class T>
  T* grad(int s) const {
    return detail::ring_typed<T>(grad(s), sizeof(float), "RingGradRotation::grad()");
  }

  /// Posts step s's exchange (see the class comment). Collective over the ring, steps in order.
  /// @throws Error(invalid_group) s out of order; the communicator's errors.
  void start(int s) {
    detail::begin_call(poster_.comm(), "a backward ring step", detail::ring_call_word(s, poster_.messages()));
    detail::tell_peers_on_failure(poster_.comm(), r_, "a backward ring step", [&] {
      check_step(s, R_);
      if (s != next_ || open_)
        detail::fail(Errc::invalid_group, "RingGradRotation: start(" + std::to_string(s) + ") out of order (expected step " +
                                              std::to_string(next_) + (open_ ? ", after the finish() of the step started last" : "") + ")");
      ++next_;
      open_ = true;
      if (access_ == RingAccess::copy) return post_step(s);
      if (R_ == 1) return;
      if (s == 0) {  // every ring rank's kv0 and g0, once
        std::byte* own[2] = {kvb_[0], gb_[0]};
        const std::vector<std::size_t>* sizes[2] = {&kv_, &gr_};
        shared_.open(own, sizes, 2);
      } else {
        shared_.sync(s, false);  // every ring rank added its step s − 1 contribution: the next adds follow them
      }
    });
  }
  /// Completes step s's exchange: block(s + 1) and grad(s) hold what came from ring rank r − 1.
  /// @throws Error(invalid_group) s is not the step started last; the communicator's errors.
  void finish(int s) {
    detail::tell_peers_on_failure(poster_.comm(), r_, "a backward ring step", [&] {
      check_step(s, R_);
      detail::check_finish("RingGradRotation", s, next_, open_);
      open_ = false;
      poster_.wait();
    });
  }
  /// After finish(R − 1) and the last contribution added to grad(R − 1): sends it home (to ring
  /// rank r + 1, whose block it is) and receives this rank's own accumulator; returns the buffer
  /// that holds it (grad buffer R % 2). Collective over the ring; blocking.
  /// @throws Error(invalid_group) before the last step; the communicator's errors.
  std::byte* home() {
    if (next_ != R_ || open_) detail::fail(Errc::invalid_group, "RingGradRotation: home() before the last step's start()/finish()");
    next_ = 0;
    if (R_ == 1) return gb_[0];
    if (access_ == RingAccess::zero_copy) {  // every ring rank added its last contribution (and read its last block)
      detail::begin_call(poster_.comm(), "the backward ring's last step", detail::ring_call_word(R_, poster_.messages()));
      detail::tell_peers_on_failure(poster_.comm(), r_, "the backward ring's last step", [&] { shared_.sync(R_, true); });
      return gb_[0];
    }
    const Message send{(r_ + 1) % R_, gb_[(R_ - 1) % 2], gr_[static_cast<std::size_t>(source(R_ - 1))]};
    const Message recv{(r_ + R_ - 1) % R_, gb_[R_ % 2], gr_[static_cast<std::size_t>(r_)]};
    detail::begin_call(poster_.comm(), "the backward ring's last step", detail::ring_call_word(R_, poster_.messages()));
    detail::tell_peers_on_failure(poster_.comm(), r_, "the backward ring's last step", [&] {
      poster_.post(&send, &recv, 1);
      poster_.wait();
    });
    return gb_[R_ % 2];
  }
  /// home() as fp32 (this rank's own block's dk then dv).
  template <class T>
  T* home() {
    return detail::ring_typed<T>(home(), sizeof(float), "RingGradRotation::home()");
  }

 private:
  /// start(s)'s lists: the kv block of step s (not at the last step) and the accumulator of step s − 1 (from step 1).
  void post_step(int s) {
    if (R_ == 1) return;
    Message send[2], recv[2];
    std::size_t n = 0;
    const int next = (r_ + 1) % R_, prev = (r_ + R_ - 1) % R_;
    const std::size_t cur = static_cast<std::size_t>(s) % 2, other = 1 - cur;  // step s's buffers; s ± 1's
    if (s + 1 < R_) {  // the kv block, while a later ring rank attends it (0 bytes past its last use: no message)
      const bool out = detail::ring_hop_carries(last_use_, source(s), s), in = carried(s + 1);
      send[n] = {next, kvb_[cur], out ? kv_[static_cast<std::size_t>(source(s))] : 0};
      recv[n++] = {prev, kvb_[other], in ? kv_[static_cast<std::size_t>(source(s + 1))] : 0};
    }
    if (s >= 1) {  // the accumulator, always (it comes home)
      send[n] = {next, gb_[other], gr_[static_cast<std::size_t>(source(s - 1))]};
      recv[n++] = {prev, gb_[cur], gr_[static_cast<std::size_t>(source(s))]};
    }
    poster_.post(send, recv, n);
  }
  void init(Comm& ring, const RingBufferPair& kvp, const RingBufferPair& gp) {
    detail::tell_peers_on_failure(ring, ring.rank(), "RingGradRotation's construction", [&] {
      poster_.check("RingGradRotation");
      R_ = static_cast<int>(kv_.size());
      detail::check_ring_last_uses("RingGradRotation", last_use_, R_);
      detail::check_ring_comm(ring, R_, "RingGradRotation");
      r_ = ring.rank();
      if (gr_.size() != kv_.size())
        detail::fail(Errc::buffer_too_small, "RingGradRotation: " + std::to_string(gr_.size()) + " accumulator sizes for " +
                                                 std::to_string(kv_.size()) + " kv blocks; give one per ring rank");
      detail::check_ring_buffers("RingGradRotation", "block", kvp, kv_);
      detail::check_ring_buffers("RingGradRotation", "accumulator", gp, gr_);
      kvb_[0] = kvp.first;
      kvb_[1] = kvp.second;
      gb_[0] = gp.first;
      gb_[1] = gp.second;
      std::byte* own[2] = {kvb_[0], gb_[0]};
      const std::size_t own_bytes[2] = {kv_[static_cast<std::size_t>(r_)], gr_[static_cast<std::size_t>(r_)]};
      if (access_ == RingAccess::zero_copy) shared_.check("RingGradRotation", own, own_bytes, 2);
    });
  }
  static void check_step(int s, int R) {
    if (s < 0 || s >= R) detail::fail(Errc::invalid_group, "ring step " + std::to_string(s) + " is outside [0, R=" + std::to_string(R) + ")");
  }
  std::vector<std::size_t> kv_, gr_;
  std::vector<int> last_use_;        // by ring rank, as RingRotation's
  std::vector<RingKvBlock> shapes_;  // by ring rank (empty: made without a plan)
  detail::RingPoster<Comm> poster_;
  RingAccess access_;
  detail::RingSharedBlocks<Comm> shared_;  // RingAccess::zero_copy: every ring rank's kv0 and g0
  std::byte* kvb_[2] = {nullptr, nullptr};
  std::byte* gb_[2] = {nullptr, nullptr};
  int R_ = 1, r_ = 0, next_ = 0;
  bool open_ = false;  // a step started and not finished
};

ULYSSES_NAMESPACE_END
