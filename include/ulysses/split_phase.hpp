// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Split-phase exchanges: `auto h = start_seq_to_head(...); <compute>; finish(h);` on every
///        communicator, so that the engine's attention runs while the bytes move (Exchange).
///        One handle may carry several exchanges (the band pipeline's seq→head of band g + 1 and
///        head→seq of band g − 1, bands.hpp), posted as one. How each communicator progresses,
///        and what is measured: docs/overlap.md. Source of the pattern: MPI's non-blocking
///        collectives (MPI_Ialltoallv + MPI_Wait), DeepSpeed DistributedAttention's async handles.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "detail/worker.hpp"
#include "redistribute.hpp"
#include "transport/ring_step.hpp"  // Progress, detail::has_allows_worker_thread

ULYSSES_NAMESPACE_BEGIN

/// Most exchanges one split-phase handle carries (Exchange::start()).
inline constexpr int kMaxExchangeParts = 4;

/// One exchange of a split-phase handle: redistribute(plan, dir, ...) of the stages
/// [stages.first, stages.first + stages.count) of `plan` (all of them by default; a head band is
/// one stage of a HeadBands plan). Buffers as redistribute(); `ws` at least
/// plan.workspace_bytes() (the stages' regions in it are disjoint, so that the bands of one plan
/// may be in flight at once, but two plans in flight need a workspace each: start() refuses a
/// shared one, and outputs that share bytes, with Error(buffer_overlap)).
struct ExchangeCall {
  const Plan* plan = nullptr;                ///< the plan (must outlive the handle's finish())
  Direction dir = Direction::seq_to_head;    ///< which way
  TensorList<ConstByteSpan> in;              ///< the plan's inputs in direction dir
  TensorList<ByteSpan> out;                  ///< its outputs
  Workspace ws;                              ///< its workspace
  StageRange stages = StageRange::all();     ///< which stages (head bands) it moves
  const RowTransforms* transforms = nullptr;  ///< its row transforms (redistribute()), or none; must outlive finish()
};

namespace detail {
/// One exchange part's buffers as CallBuffers ranges (plan/buffers.hpp): its inputs, its outputs,
/// and its workspace where its path uses one.
inline CallBuffers part_buffers(const ExchangePart& p) {
  CallBuffers b;
  b.T = p.plan->num_tensors();
  b.s2h = p.dir == Direction::seq_to_head;
  for (int t = 0; t < b.T; ++t) {
    b.range[t] = {p.table.base[BufferIndex::input(t)], p.plan->input_bytes(p.dir, t)};
    b.range[b.T + t] = {p.table.base[BufferIndex::output(t)], p.plan->output_bytes(p.dir, t)};
  }
  b.range[2 * b.T] = {p.table.base[BufferIndex::send], p.path == Path::direct ? 0 : p.plan->workspace_bytes()};
  return b;
}
/// The exchanges of one handle against each other (each alone passed bind_table()): they are in
/// flight together (the split mode packs every part before any unpack), so none may write bytes
/// another one reads or writes: an output against the other's outputs (the exact test of
/// check_overlaps(): views interleaved without sharing a byte pass), a workspace against every
/// buffer of the other. Stages of one plan (the same plan, direction and buffers, disjoint
/// stages) write disjoint heads and workspace regions: they pass. An output that another part
/// reads is not refused (the library's band pipeline reads only finished bands), but its bytes
/// are then undefined. @throws Error(buffer_overlap) naming both exchanges and buffers.
inline void check_parts_overlap(const ExchangePart* parts, int n) {
  CallBuffers bufs[kMaxExchangeParts];
  for (int a = 0; a < n; ++a) bufs[a] = part_buffers(parts[a]);
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      const ExchangePart &x = parts[a], &y = parts[b];
      const CallBuffers &bx = bufs[a], &by = bufs[b];
      const bool stages = x.plan == y.plan && x.dir == y.dir &&
                          (x.stages.first + x.stages.count <= y.stages.first || y.stages.first + y.stages.count <= x.stages.first);
      for (int i = bx.T; i <= 2 * bx.T; ++i)  // what x writes: its outputs, its workspace
        for (int j = i < 2 * bx.T ? by.T : 0; j <= 2 * by.T; ++j) {  // an output against outputs and the workspace
          const CallBuffers::Range &u = bx.range[i], &v = by.range[j];
          if (!u.n || !v.n || !(u.p < v.p + v.n && v.p < u.p + u.n)) continue;
          if (stages && i == j && u.p == v.p) continue;  // (one plan's disjoint stages: other heads, other workspace regions)
          if (i < 2 * bx.T && j < 2 * by.T && x.plan->tensor(i % bx.T).elem_bytes == y.plan->tensor(j % by.T).elem_bytes &&
              !views_overlap(bx.layout(*x.plan, i), u.p, by.layout(*y.plan, j), v.p, x.plan->tensor(i % bx.T).elem_bytes))
            continue;
          fail(Errc::buffer_overlap, "exchange " + std::to_string(a) + " (" + call_name(x.dir) + "), " + bx.name(i) + ", overlaps exchange " +
                                         std::to_string(b) + " (" + call_name(y.dir) + "), " + by.name(j) +
                                         "; the exchanges of one handle are in flight together: each needs its own outputs and workspace");
        }
    }
}
}  // namespace detail

/// A split-phase exchange on communicator type Comm with executor type Exec: start() does every
/// check before a byte moves (the arguments, the communicator, the plans' agreement before their
/// first exchange) and begins the exchange; finish() completes it; the outputs are valid after
/// finish() (host executors; stream-ordered ones: in stream order once finish() returned).
///
/// How it progresses between the two (Progress): on a split-phase communicator (MpiComm:
/// comm_traits::split_messages) over the message path, start() packs and posts the non-blocking
/// sends and receives, finish() waits and unpacks (`in_start`); with Progress::thread a worker
/// thread runs the whole exchange (a communicator that declares progress_thread, LocalGroup::Comm,
/// takes it by default; MpiComm needs MPI_THREAD_SERIALIZED); otherwise start() runs it (a
/// stream-ordered communicator, NcclComm and the device groups: it enqueues it on the
/// communicator's stream, and finish() waits for nothing on the host) and finish() only checks.
/// A MpiComm has at most one handle in flight (a second start() before the first's finish() is
/// Error(invalid_shape) from the communicator): put the exchanges that overlap in one handle.
///
/// Errors are every rank's (comm/tell_peers.hpp): a failure in start() or finish() breaks the
/// group before it throws. A handle destroyed between start() and finish() completes the
/// exchange (bounded by the communicator's deadline: its buffers must not be written later) and
/// breaks the group, so that this rank and its peers throw Error(aborted) naming the unfinished
/// call at their next call, not a hang. Not copyable, not movable (a worker may hold it).
template <class Comm, class Exec>
class Exchange {
 public:
  /// A handle with nothing started, over `comm` and `exec` (both must outlive it).
  Exchange(Comm& comm, Exec& exec, Progress progress = Progress::automatic) noexcept
      : comm_(&comm), exec_(&exec), progress_(progress) {}
  /// start() of one exchange: what start_seq_to_head() and its siblings return.
  Exchange(Comm& comm, Exec& exec, const ExchangeCall& call, Progress progress = Progress::automatic)
      : Exchange(comm, exec, progress) {
    start(&call, 1);
  }
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;
  /// Completes an exchange still in flight and breaks the group (see the class comment).
  ~Exchange() {
    if (!pending_) return;
    try {
      complete(false);
    } catch (...) {
    }
    detail::break_group_for(*comm_, "rank " + std::to_string(comm_->rank()) + " destroyed a split-phase " + name_ +
                                        " before its finish() (the exchange was completed, its outputs dropped)");
  }

  /// Checks and begins `n` exchanges (1 .. kMaxExchangeParts) as one library call, in the order
  /// given (every rank must give the same exchanges in the same order: their plans agree, and
  /// the call is numbered as one). The calls are copied; the buffers and plans must live until
  /// finish(). A part over the direct path (the peer copy) of some stages only takes the message
  /// path where the communicator has one, else the all-to-all-v (the peer copy has no stages).
  /// @throws Error(invalid_group) the handle is in flight (finish() first); Error(invalid_shape)
  ///         n outside [1, kMaxExchangeParts], a stage range outside the plan's, or
  ///         Progress::thread on a communicator that does not allow a worker thread;
  ///         Error(buffer_overlap) two exchanges that write the same bytes, or one whose workspace
  ///         holds another's buffers (detail::check_parts_overlap()); what redistribute() throws
  ///         before its exchange; the communicator's errors.
  void start(const ExchangeCall* calls, int n) {
    name_ = n == 1 && calls ? detail::call_name(calls[0].dir) : "exchange";
    if (pending_) {
      detail::tell_peers_on_failure(*comm_, comm_->rank(), name_, [&] {
        detail::fail(Errc::invalid_group, std::string(name_) + ": start() of a split-phase handle in flight (call finish() first)");
      });
    }
    detail::refuse_beside_worker(*comm_, name_);  // another handle's worker is in the communicator
    std::uint64_t what = detail::kFnvBasis;
    if (calls && n == 1 && calls[0].plan && calls[0].stages.first == 0 &&
        (calls[0].stages.count == -1 || calls[0].stages.count == calls[0].plan->num_stages())) {
      // one exchange of every stage: numbered as the blocking call (redistribute()), so that a
      // rank's seq_to_head() pairs with its peers' start_seq_to_head() + finish()
      what = detail::exchange_word(*calls[0].plan, calls[0].dir, calls[0].transforms);
    } else {
      for (int i = 0; calls && i < n && i < kMaxExchangeParts; ++i) {
        // the stages as resolved (StageRange::all() and {0, K} are one exchange on every rank)
        const StageRange& s = calls[i].stages;
        const std::int64_t count = s.count == -1 && calls[i].plan ? calls[i].plan->num_stages() - s.first : s.count;
        what = detail::fnv1a(detail::fnv1a(detail::fnv1a(what, static_cast<std::int64_t>(calls[i].plan ? calls[i].plan->fingerprint() : 0)),
                                           static_cast<int>(calls[i].dir)),
                             static_cast<std::int64_t>(s.first) * 65536 + count);
        if (calls[i].transforms && calls[i].transforms->sides())  // (the transforms' agreement: exchange_word())
          what = detail::fnv1a(what, calls[i].transforms->agreement());
      }
    }
    detail::begin_call(*comm_, name_, what);
    detail::tell_peers_on_failure(*comm_, comm_->rank(), name_, [&] {
      if (!calls || n < 1 || n > kMaxExchangeParts)
        detail::fail(Errc::invalid_shape, std::string(name_) + ": " + (calls ? std::to_string(n) + " exchanges in one handle" : "no exchanges (null)") +
                                              "; give 1 to " + std::to_string(kMaxExchangeParts));
      n_ = 0;
      for (int i = 0; i < n; ++i) {
        if (!calls[i].plan) detail::fail(Errc::invalid_shape, std::string(name_) + ": exchange " + std::to_string(i) + " has no plan");
        parts_[n_++] = detail::bind_part(*calls[i].plan, calls[i].dir, *comm_, *exec_, calls[i].in, calls[i].out, calls[i].ws, calls[i].stages,
                                        calls[i].transforms);
      }
      detail::check_parts_overlap(parts_, n_);
      mode_ = mode_of();
      if (mode_ == Mode::thread) {
        if constexpr (detail::has_allows_worker_thread<Comm>::value)
          if (!comm_->allows_worker_thread())
            detail::fail(Errc::invalid_shape, std::string(name_) + ": Progress::thread calls the communicator from a worker thread, "
                                                               "and it does not allow that (MPI: MPI_THREAD_SERIALIZED or above)");
        if (!worker_) worker_ = std::make_unique<detail::Worker>();
        pending_ = true;
        worker_->start(job_);
        set_worker_in_flight(true);
      } else if (mode_ == Mode::split) {
        post();
        pending_ = true;
      } else {
        run_parts();
        pending_ = true;
      }
    });
  }

  /// Completes the exchange start() began: waits for it (bounded by the communicator's deadline)
  /// and unpacks; rethrows what the worker threw.
  /// @throws Error(invalid_group) nothing is in flight (never started, or finished already);
  ///         the exchange's errors (as redistribute()).
  void finish() {
    detail::tell_peers_on_failure(*comm_, comm_->rank(), name_, [&] {
      if (!pending_)
        detail::fail(Errc::invalid_group, std::string(name_) + ": finish() of a split-phase handle with nothing in flight "
                                                               "(finished twice, or never started)");
      complete(true);
    });
  }
  /// True between a start() that succeeded and its finish().
  bool pending() const noexcept { return pending_; }
  /// How the exchange in flight (or the last one) progresses: "thread", "split" (posted in
  /// start(), completed in finish()) or "in start" (run by start()).
  const char* progress_name() const noexcept { return mode_ == Mode::thread ? "thread" : mode_ == Mode::split ? "split" : "in start"; }

 private:
  enum class Mode { run, split, thread };
  Mode mode_of() const {
    const Progress p = detail::resolve_progress<Comm>(progress_);
    if constexpr (!comm_traits<Comm>::stream) {
      if (p == Progress::thread) return Mode::thread;
      if constexpr (comm_traits<Comm>::split_messages) {
        bool all_messages = true;
        for (int i = 0; i < n_; ++i) all_messages = all_messages && parts_[i].path == Path::messages;
        if (all_messages) return Mode::split;
      }
    }
    return Mode::run;
  }
  /// Split mode: the agreement checks and the packs of every part, then one post of all messages.
  void post() {
    if constexpr (comm_traits<Comm>::split_messages) {
      send_.clear();
      recv_.clear();
      for (int i = 0; i < n_; ++i) {
        const detail::ExchangePart& p = parts_[i];
        detail::require_flat(*p.plan, "exchange_pieces");
        detail::before_exchange(*p.plan, *comm_);
        for (int k = p.stages.first; k < p.stages.first + p.stages.count; ++k) {
          detail::run_list(*exec_, MessagesTransport::pack_list(*p.plan, p.dir, k), p.table);
          const StageLists& s = p.plan->stage_lists(p.dir, k);
          for (const Piece& x : s.send_pieces) send_.push_back({x.peer, p.table.base[x.buffer] + x.offset, x.bytes});
          for (const Piece& x : s.recv_pieces) recv_.push_back({x.peer, p.table.base[x.buffer] + x.offset, x.bytes});
        }
      }
      comm_->start_messages(send_.data(), send_.size(), recv_.data(), recv_.size());
    }
  }
  void run_parts() {
    for (int i = 0; i < n_; ++i) detail::run_part(parts_[i], *comm_, *exec_);
  }
  /// Waits for the exchange; with `unpack`, also the split mode's unpacks.
  void complete(bool unpack) {
    pending_ = false;
    if (mode_ == Mode::thread) {
      struct Clear {  // the worker is out of the communicator once finish_here() returned or threw
        Exchange* x;
        ~Clear() { x->set_worker_in_flight(false); }
      } clear{this};
      worker_->finish_here();
    } else if (mode_ == Mode::split) {
      if constexpr (comm_traits<Comm>::split_messages) {
        comm_->finish_messages();
        for (int i = 0; unpack && i < n_; ++i) {
          const detail::ExchangePart& p = parts_[i];
          for (int k = p.stages.first; k < p.stages.first + p.stages.count; ++k)
            detail::run_list(*exec_, MessagesTransport::unpack_list(*p.plan, p.dir, k), p.table);
        }
      }
    }
  }
  void set_worker_in_flight(bool on) noexcept {
    if constexpr (comm_traits<Comm>::exchange_state) {
      if (on != worker_counted_) comm_->exchange_state().add_worker_in_flight(on ? 1 : -1);
      worker_counted_ = on;
    }
  }
  struct Job {
    Exchange* x;
    void operator()() const { x->run_parts(); }
  };

  Comm* comm_;
  Exec* exec_;
  Progress progress_;
  Mode mode_ = Mode::run;
  bool pending_ = false;
  bool worker_counted_ = false;  // counted in the communicator's workers_in_flight()
  const char* name_ = "exchange";
  int n_ = 0;
  detail::ExchangePart parts_[kMaxExchangeParts];
  std::vector<Message> send_, recv_;  // the split mode's posts (kept: no allocation once grown)
  Job job_{this};
  std::unique_ptr<detail::Worker> worker_;  // last: destroyed (after its job) first
};

/// Completes h (Exchange::finish()). @throws as Exchange::finish().
template <class Comm, class Exec>
void finish(Exchange<Comm, Exec>& h) {
  h.finish();
}

/// Starts seq→head (seq_to_head()) of every stage of `plan`; finish(h) completes it.
/// Buffers and errors as seq_to_head(), then as Exchange::start(). Source: see the file comment.
template <class Comm, class Exec>
Exchange<Comm, Exec> start_seq_to_head(const Plan& plan, Comm& comm, Exec& exec, const TensorList<ConstByteSpan>& in,
                                       const TensorList<ByteSpan>& out, Workspace ws, Progress progress = Progress::automatic) {
  return Exchange<Comm, Exec>(comm, exec, ExchangeCall{&plan, Direction::seq_to_head, in, out, ws}, progress);
}
/// Starts head→seq (head_to_seq()); finish(h) completes it. As start_seq_to_head().
template <class Comm, class Exec>
Exchange<Comm, Exec> start_head_to_seq(const Plan& plan, Comm& comm, Exec& exec, const TensorList<ConstByteSpan>& in,
                                       const TensorList<ByteSpan>& out, Workspace ws, Progress progress = Progress::automatic) {
  return Exchange<Comm, Exec>(comm, exec, ExchangeCall{&plan, Direction::head_to_seq, in, out, ws}, progress);
}
/// Starts seq_to_head_backward() (head→seq summing the replicas); finish(h) completes it.
/// @throws Error(not_adjoint) as seq_to_head_backward(), on every rank before anything moves.
template <class Comm, class Exec>
Exchange<Comm, Exec> start_seq_to_head_backward(const Plan& plan, Comm& comm, Exec& exec, const TensorList<ConstByteSpan>& grad_head,
                                                const TensorList<ByteSpan>& grad_seq, Workspace ws,
                                                Progress progress = Progress::automatic) {
  detail::require_adjoint(plan, "start_seq_to_head_backward");
  return Exchange<Comm, Exec>(comm, exec, ExchangeCall{&plan, Direction::head_to_seq, grad_head, grad_seq, ws}, progress);
}
/// Starts head_to_seq_backward() (seq→head); finish(h) completes it.
/// @throws Error(not_adjoint) as head_to_seq_backward().
template <class Comm, class Exec>
Exchange<Comm, Exec> start_head_to_seq_backward(const Plan& plan, Comm& comm, Exec& exec, const TensorList<ConstByteSpan>& grad_seq,
                                                const TensorList<ByteSpan>& grad_head, Workspace ws,
                                                Progress progress = Progress::automatic) {
  detail::require_adjoint(plan, "start_head_to_seq_backward");
  return Exchange<Comm, Exec>(comm, exec, ExchangeCall{&plan, Direction::seq_to_head, grad_seq, grad_head, ws}, progress);
}

ULYSSES_NAMESPACE_END
