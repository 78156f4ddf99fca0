// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief MpiWindowComm: the communicator that gives the MPI processes of one node the peer copy
///        (Path::direct across processes: one copy per element, no workspace, no wire) over an
///        MpiWindow (comm/mpi_window_arena.hpp). with_peers() publishes each rank's record
///        (comm/mpi_window_cross_memory.hpp), then runs the epoch barrier of
///        comm/window_protocol.hpp (comm/mpi_window_rendezvous.hpp); its other calls are the
///        MpiComm's. Usage, rules and the copies: docs/guide.md (One copy between the MPI
///        processes of a node); failures: docs/design.md (failure model) and docs/guide.md (Errors).
///        Notes: docs/headers.md (comm/mpi_window.hpp).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../layout/blocks.hpp"
#include "agreement.hpp"
#include "concepts.hpp"
#include "cross_memory.hpp"
#include "exchange_state.hpp"
#include "failure.hpp"
#include "mpi_comm.hpp"
#include "mpi_window_arena.hpp"
#include "mpi_window_cross_memory.hpp"
#include "mpi_window_rendezvous.hpp"
#include "peer_record.hpp"
#include "window.hpp"
#include "window_protocol.hpp"

ULYSSES_NAMESPACE_BEGIN

/// The communicator concept (comm/concepts.hpp) over an MpiComm and an MpiWindow of the same
/// group, with with_peers() across processes: Path::direct, the peer copy, between the MPI
/// processes of one node (docs/guide.md). alltoallv(), allgather() and
/// exchange_messages() are the MpiComm's. Non-owning (the MpiComm and the window must outlive it);
/// a copy shares the window's synchronisation (use one at a time).
class MpiWindowComm {
 public:
  /// Default wait bound of with_peers() (the shipped communicators', comm/failure.hpp).
  static constexpr std::chrono::milliseconds kDefaultTimeout = kDefaultCommTimeout;
  /// Default cross_memory_min_range(), in bytes.
  static constexpr std::size_t kCrossMemoryMinRange = 4096;
  /// with_peers() hands work() the peers' outputs that lie in the window (comm_traits::peer_outputs):
  /// with every rank's outputs allocated from the window, seq→head pushes (outputs_in_window()).
  static constexpr bool peer_outputs = true;

  /// Wraps `comm` and `window` (not owned). Local (no communication).
  /// @param comm    the MpiComm of the group (alltoallv, allgather, exchange_messages go through it)
  /// @param window  an MpiWindow allocated over the same group
  /// @param timeout how long with_peers() waits for the peers (at each of its two
  ///        synchronisations) before it throws Error(timeout) and breaks the group; it also bounds
  ///        the calls this communicator makes through the MpiComm (the exchange's agreement check,
  ///        the peer lists' all-gather, alltoallv, exchange_messages), which wait at most the
  ///        shorter of it and the MpiComm's own timeout()
  /// @throws Error(comm_mismatch) the window is not over comm's group (size, rank or members differ).
  MpiWindowComm(MpiComm& comm, MpiWindow& window, std::chrono::milliseconds timeout = kDefaultTimeout)
      : comm_(&comm), win_(&window), timeout_(timeout) {
    state_.count_calls_in(&window.calls_);  // every MpiWindowComm over the window numbers alike
    int cmp = MPI_UNEQUAL;
    MPI_Comm_compare(comm.get(), window.node_comm(), &cmp);
    if (comm.size() != window.size() || comm.rank() != window.rank() || (cmp != MPI_IDENT && cmp != MPI_CONGRUENT))
      detail::fail(Errc::comm_mismatch, "MpiWindowComm: the window was allocated over another group than the MpiComm's (size " +
                                            std::to_string(window.size()) + " vs " + std::to_string(comm.size()) + ", rank " +
                                            std::to_string(window.rank()) + " vs " + std::to_string(comm.rank()) + ")");
  }

  MpiWindowComm(const MpiWindowComm&) = default;             ///< shares the window's synchronisation (use one at a time)
  MpiWindowComm& operator=(const MpiWindowComm&) = default;  ///< as the copy constructor
  /// Local. When the MpiComm is broken (a call of it timed out or failed), marks the window's
  /// group broken (MpiWindow::mark_broken()), so that no rank's ~MpiWindow waits for the peers.
  ~MpiWindowComm() {
    if (comm_->broken()) win_->mark_broken();
  }

  int size() const noexcept { return comm_->size(); }  ///< P
  int rank() const noexcept { return comm_->rank(); }  ///< this rank
  /// Whether its calls may come from another thread, one at a time: its MpiComm's (MPI_THREAD_SERIALIZED or above).
  bool allows_worker_thread() const noexcept { return comm_->allows_worker_thread(); }
  /// Whether its calls may come from several threads at once: its MpiComm's (MPI_THREAD_MULTIPLE).
  bool allows_concurrent_threads() const noexcept { return comm_->allows_concurrent_threads(); }
  MpiComm& mpi() const noexcept { return *comm_; }     ///< the wrapped MpiComm
  MpiWindow& window() const noexcept { return *win_; }  ///< the window
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }  ///< the wait bound of every call (see the constructor)
  /// Sets the wait bound of every call (e.g. long for a first, slow step, then short). Local.
  void set_timeout(std::chrono::milliseconds timeout) noexcept { timeout_ = timeout; }
  /// True once a with_peers() of this group timed out or failed on any rank (or the MpiComm is
  /// broken): every call then throws Error(aborted). A broken group stays broken (make a new window).
  bool broken() const noexcept { return failure_.broken() || win_->broken() || comm_->broken(); }
  /// Bytes of inputs the last with_peers() staged into the window (2 copies per element; 0 when
  /// all were in it, read in place, or read by no peer).
  std::size_t staged_bytes() const noexcept { return staged_; }
  /// Whether the last with_peers() handed the peer copy every rank's outputs (they were published,
  /// PeerRecord::outputs, and every non-empty one lies in its rank's window slot): a seq→head then
  /// pushed (each rank wrote its peers' outputs from its own rows, in order) rather than pulled;
  /// head→seq always pulls.
  bool outputs_in_window() const noexcept { return outputs_in_window_; }
  /// Bytes of this rank's inputs outside the window that the peers read with Cross Memory Attach
  /// in the last with_peers() (their rows pulled by the peers or pushed by this rank: 1 copy per
  /// element, as in the window): the rows read, each read counted (PeerRecord::read_bytes), not
  /// the spans of the views (fused q, k and v views each span nearly the whole buffer); a work
  /// that does not say what its peers read counts the spans of the inputs it publishes.
  std::size_t remote_bytes() const noexcept { return remote_; }
  /// Whether inputs outside the window are read in place by the peers (Cross Memory Attach: the
  /// window's agreed probe, MpiWindow::cross_memory_attach(), and not turned off here), rather
  /// than staged; only for works that read them so (the peer copy on a host executor: Plan::copies()
  /// of Path::direct, 1, then holds for them too; other works, e.g. the decode merge, stage).
  bool cross_memory_attach() const noexcept { return cma_ && win_->cross_memory_attach(); }
  /// Turns the reads in place of inputs outside the window off (false: stage them, as where Cross
  /// Memory Attach is not permitted) or back on. Local: each rank decides how it publishes its own
  /// inputs, every peer reads either. @param on whether to publish them for reading in place
  void set_cross_memory_attach(bool on) noexcept { cma_ = on; }
  /// The shortest mean range (CrossMemoryRecord::range_bytes) of an input outside the window that the
  /// peers read in place; inputs whose peers read shorter ranges are staged. Default
  /// kCrossMemoryMinRange: process_vm_readv pins the pages of every remote range, so short
  /// ranges are slower than staging them (the trade-off and its measurement: docs/guide.md, One
  /// copy between the MPI processes of a node; bench/bench_cross_memory.cpp).
  std::size_t cross_memory_min_range() const noexcept { return min_range_; }
  /// Sets cross_memory_min_range(). Local. @param bytes the shortest mean range read in place
  void set_cross_memory_min_range(std::size_t bytes) noexcept { min_range_ = bytes; }

  /// MpiComm::alltoallv(). @throws Error(aborted) when broken(); as MpiComm::alltoallv().
  void alltoallv(const std::byte* send, const std::size_t* send_bytes, const std::size_t* send_offsets, std::byte* recv,
                 const std::size_t* recv_bytes, const std::size_t* recv_offsets) {
    require_alive("alltoallv");
    on_comm([&] { comm_->alltoallv(send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets); });
  }
  /// MpiComm::exchange_messages(). @throws Error(aborted) when broken(); as MpiComm::exchange_messages().
  void exchange_messages(const Message* send, std::size_t n_send, const Message* recv, std::size_t n_recv) {
    require_alive("exchange_messages");
    on_comm([&] { comm_->exchange_messages(send, n_send, recv, n_recv); });
  }
  /// MpiComm::allgather() (host memory). @throws Error(aborted) when broken(); as MpiComm::allgather().
  void allgather(const void* send, std::size_t bytes, void* recv) {
    require_alive("allgather");
    on_comm([&] { comm_->allgather(send, bytes, recv); });
  }

  /// The peer copy's step across processes (the optional with_peers() of the communicator
  /// concept). Collective over the group. `mine` points to this rank's PeerRecord (what
  /// transport/peer_copy.hpp publishes); `work(ctx, all)` then runs with all[p] pointing to rank
  /// p's PeerRecord translated into this process's mapping of the window (valid during the call).
  /// Inputs in this rank's slot are read in place by the peers; inputs outside the window are
  /// published for the peers to read in place with Cross Memory Attach when
  /// cross_memory_attach() and `mine` says its work reads so (CrossMemoryRecord::reads_remote; the
  /// views then carry the owner's pid and addresses), else copied first into the slot's bytes
  /// after its registrations (and after any input of this call in the slot); an input outside the
  /// window that no peer reads (PeerRecord::unread) is neither staged nor published, and needs no
  /// room (C17). Returns when every rank's work has returned.
  /// @pre `mine` points to a PeerRecord; host memory.
  /// @throws Error(plan_mismatch) on every rank: the ranks registered different window buffers,
  ///         or publish different numbers of inputs (the group stays usable);
  ///         Error(buffer_too_small) on this rank: an input outside the window does not fit the
  ///         slot's free bytes, or an input starts in the slot and runs past its end (allocate the
  ///         inputs from the window, or make it larger); the peers throw Error(aborted);
  ///         Error(timeout) on a rank that waited longer than timeout() (the message names the
  ///         ranks that did not arrive, or did not finish reading: "ranks {0} did not arrive in
  ///         call 2"); Error(aborted) when the group is broken (before or during the call; the
  ///         message names the rank that broke it and, after a timeout, the same missing ranks as
  ///         the timed-out ranks' messages: MpiWindow::why_broken()); what `work` throws (the group is then broken:
  ///         Error(backend) when a read with Cross Memory Attach fails).
  ///         After any error but plan_mismatch the group is broken.
  void with_peers(const void* mine, detail::PeerWork work, void* ctx) {
    require_alive("with_peers");
    const auto& in = *static_cast<const PeerRecord*>(mine);
    detail::WindowControl& c = win_->control(rank());
    const std::uint64_t e = detail::shared_load(c.arrive) + 1;
    CallFailure f;
    const std::string own = publish(in, c);  // "" or this rank's error (status = 1)
    if (!own.empty()) break_group(Errc::buffer_too_small, Error(Errc::buffer_too_small, own).what());  // before the arrival: the peers name it
    detail::epoch_publish<detail::HostWords>(c, e, true);
    try {
      if (!own.empty()) detail::fail(Errc::buffer_too_small, own);  // the peers see the status (or the abort word) and read nothing
      read_peers(in, e, f.uniform, work, ctx);
    } catch (...) {
      f.take();
      // A failure of this rank alone breaks the group before this rank says it finished reading:
      // a peer still waiting for that then ends with Error(aborted) naming it, instead of leaving
      // the call as if it had succeeded (a ring step's receiver that found the sender's block of
      // another size; the last step of a ring of two).
      if (!f.uniform) break_group(f.code, f.what);
    }
    detail::epoch_publish<detail::HostWords>(c, e, false);  // this rank reads no peer's memory any more
    if (!f.err) {
      try {
        wait_for(e, false, "finish reading");
        return;
      } catch (const Error&) {
        f.take();
      }
    }
    if (!f.uniform) break_group(f.code, f.what);
    if (!f.timed_out) detail::window_wait_for_readers(*win_, e, timeout_);  // no peer still reads this rank's inputs when it returns
    std::rethrow_exception(f.err);
  }

  /// What the transports learn on this communicator about the plans run on it, and their scratch
  /// lists (comm/exchange_state.hpp).
  ExchangeState& exchange_state() noexcept { return state_; }
  /// The peer copy's scratch for the inputs it reads with Cross Memory Attach
  /// (comm/cross_memory.hpp), kept from call to call.
  detail::RemoteReadScratch& cross_memory_scratch() noexcept { return cma_scratch_; }

  /// Breaks the group at once (the optional abort() of the communicator concept): the window's
  /// abort word with `why` and this rank (MpiWindow::mark_broken(why)), which every peer sees at
  /// its next poll, in with_peers() and in the calls made through the MpiComm (the agreement
  /// check; MpiComm::watch_for_abort()): every peer then throws Error(aborted) naming this rank
  /// and `why` within milliseconds, and no rank's ~MpiWindow waits for its peers. A peer that was
  /// waiting in one of the MpiComm's calls leaves it pending there (MPI cannot cancel it), so it
  /// breaks the MpiComm too and tells every rank (its failure notice): the MpiComm is then broken
  /// on every rank, and a new window needs another MPI communicator (MpiComm::poll_notices()).
  /// Where no peer was in such a call the MpiComm stays usable. What a call that fails on this
  /// rank alone does before it throws (comm/tell_peers.hpp).
  /// Local, never blocks; a no-op once broken.
  /// @param why what failed, for the peers' messages ("rank 3 failed in seq_to_head with ...")
  void abort(const std::string& why) { break_group(Errc::aborted, why); }

 private:
  /// Throws Error(aborted) when this rank failed before or the window's group is broken (cheap
  /// otherwise: the waits call it at every poll; a broken MpiComm throws from its own calls).
  void require_alive(const char* what) const {
    const std::uint64_t who = detail::shared_load(win_->control(0).abort);
    if (!who && !failure_.broken()) return;
    const std::string where = std::string("rank ") + std::to_string(rank()) + ": MpiWindowComm::" + what;
    failure_.check(where.c_str());  // this rank's own first failure
    detail::fail(Errc::aborted, where + ": the window's group is broken (" + win_->why_broken() +
                                    "); make a new MpiWindow (over another MPI communicator if the MpiComm is broken too: MpiComm::broken())");
  }
  /// Runs a call of the MpiComm, bounded by the shorter of timeout() and the MpiComm's own
  /// timeout (restored after); when it breaks the MpiComm (a timeout, a failed peer), breaks the
  /// window's group too (then no rank's ~MpiWindow waits for the peers) before rethrowing.
  template <class F>
  void on_comm(F&& f) {
    struct Bound {  // the MpiComm's timeout and abort watch for the call, restored on every way out
      MpiComm& comm;
      std::chrono::milliseconds saved;
      ~Bound() {
        comm.set_timeout(saved);
        comm.watch_for_abort({});
      }
    } bound{*comm_, comm_->timeout()};
    comm_->set_timeout(std::min(bound.saved, timeout_));
    comm_->watch_for_abort({win_, [](const void* w) {  // a peer that broke the window's group while this rank waits in the MpiComm
                              const auto& win = *static_cast<const MpiWindow*>(w);
                              return win.broken() ? "the window's group is broken (" + win.why_broken() + ")" : std::string();
                            }});
    comm_->exchange_state().set_call(state_.call());  // its messages' tags and the path's agreement name this call
    try {
      f();
    } catch (const Error& x) {
      if (comm_->broken()) break_group(x.code(), x.what());
      throw;
    }
  }
  /// Marks the group broken for every rank (the shared abort word) and this rank's failure.
  void break_group(Errc code, const std::string& what) noexcept {
    win_->mark_broken(what);
    try {
      failure_.record(code, what);
    } catch (...) {  // (std::string's allocation: the shared word already breaks the group)
    }
  }

  /// How a call of with_peers() failed on this rank (taken in a catch block).
  struct CallFailure {
    std::exception_ptr err;
    Errc code = Errc::aborted;
    std::string what = "a call of with_peers failed";
    bool uniform = false;    // the error is a verdict every rank reaches alike (the group stays usable)
    bool timed_out = false;  // this rank already waited timeout() for the peers
    void take() {
      err = std::current_exception();
      try {
        throw;
      } catch (const Error& x) {
        code = x.code();
        what = x.what();
        timed_out = code == Errc::timeout;
      } catch (const std::exception& x) {
        what = x.what();
      } catch (...) {
      }
    }
  };

  /// Writes this rank's record (comm/mpi_window_cross_memory.hpp: offsets in its slot, inputs
  /// read in place or staged) and the call it is in; returns "" or why it cannot (then status = 1).
  std::string publish(const PeerRecord& in, detail::WindowControl& c) {
    detail::WindowPolicy policy;
    policy.read_in_place = in.cross_memory && in.cross_memory->reads_remote && cross_memory_attach();
    policy.min_range = min_range_;
    detail::WindowPublished done;
    const std::string err = detail::window_publish(*win_, in, policy, c, done);
    staged_ = done.staged;
    remote_ = done.remote;
    outputs_in_window_ = false;
    const ExchangeState::Call& call = state_.call();
    c.call = call.number;
    c.call_what = call.what;
    const std::size_t nn = std::min(std::strlen(call.name), sizeof c.call_name - 1);
    std::memcpy(c.call_name, call.name, nn);
    c.call_name[nn] = '\0';
    c.status = err.empty() ? 0 : 1;
    return err;
  }

  /// The call between the two synchronisations: waits for every rank's arrival, checks what
  /// they published (`uniform` while the verdict is every rank's alike), then runs `work` over
  /// every rank's record in this process's mapping.
  void read_peers(const PeerRecord& in, std::uint64_t e, bool& uniform, detail::PeerWork work, void* ctx) {
    wait_for(e, true, "arrive");
    const std::vector<int> failed = detail::ranks_where(size(), [&](int p) { return win_->control(p).status != 0; });
    if (!failed.empty())
      detail::fail(Errc::aborted, "rank " + std::to_string(rank()) + ": ranks " + detail::rank_set(failed) +
                                      " could not publish their inputs in the window (their own errors say why)");
    uniform = true;
    check_records();  // throws plan_mismatch (every rank alike)
    uniform = false;
    const auto P = static_cast<std::size_t>(size());
    views_.resize(P);
    cma_views_.resize(P);
    all_.resize(P);
    bool outputs = true, published = false;  // every rank's non-empty outputs in its window slot; some published
    for (int p = 0; p < size(); ++p) {
      const auto i = static_cast<std::size_t>(p);
      outputs = detail::window_view(*win_, p, rank(), win_->control(p), in, views_[i], cma_views_[i], published) && outputs;
      all_[i] = &views_[i];
    }
    outputs_in_window_ = outputs && published;
    work(ctx, all_.data());
  }

  /// After every rank arrived: the same verdict on every rank (they read the same records).
  void check_records() const {
    const int P = size();
    std::vector<detail::WindowDigest> reg(static_cast<std::size_t>(P));
    for (int p = 0; p < P; ++p) reg[static_cast<std::size_t>(p)] = win_->control(p).registered;
    const std::string m = detail::registration_mismatch(reg.data(), P);
    if (!m.empty()) detail::fail(Errc::plan_mismatch, "MpiWindowComm::with_peers: " + m);
    const std::string calls = detail::call_mismatch(
        P, [&](int p) { return win_->control(p).call; }, [&](int p) { return win_->control(p).call_what; },
        [&](int p) -> const char* { return win_->control(p).call_name; });
    if (!calls.empty()) detail::fail(Errc::plan_mismatch, "MpiWindowComm::with_peers: " + calls);
    const std::string counts = detail::records_differ(
        P, 1, [&](int p, int) { return win_->control(p).count; }, [](int) { return std::string("the number of inputs published"); },
        [&](int p, int) { return std::to_string(win_->control(p).count); });
    if (!counts.empty()) detail::fail(Errc::plan_mismatch, "MpiWindowComm::with_peers: " + counts + "; the ranks' plans differ");
    std::vector<int> remote, unread;  // ranks publishing inputs to read in place; ranks whose work cannot
    for (int p = 0; p < P; ++p) {
      const detail::WindowControl& r = win_->control(p);
      if (!r.reads_remote) unread.push_back(p);
      for (std::uint64_t t = 0; t < r.count && t < static_cast<std::uint64_t>(kMaxTensors); ++t)
        if (r.offset[t] == detail::WindowControl::kRemote && (remote.empty() || remote.back() != p)) remote.push_back(p);
    }
    if (!remote.empty() && !unread.empty())
      detail::fail(Errc::plan_mismatch, "MpiWindowComm::with_peers: ranks " + detail::rank_set(remote) +
                                            " publish inputs to read in place, and the work of ranks " + detail::rank_set(unread) +
                                            " cannot read them (the ranks run different exchanges)");
    for (int p = 0; p < P; ++p) {
      const detail::WindowControl& r = win_->control(p);
      for (std::uint64_t t = 0; t < r.count && t < static_cast<std::uint64_t>(kMaxTensors); ++t)
        if (r.offset[t] != detail::WindowControl::kNone && r.offset[t] != detail::WindowControl::kRemote && r.offset[t] != detail::WindowControl::kOwn &&
            (r.offset[t] > win_->bytes_per_rank() || r.bytes[t] > win_->bytes_per_rank() - r.offset[t]))
          detail::fail(Errc::plan_mismatch, "MpiWindowComm::with_peers: rank " + std::to_string(p) + " publishes input " + std::to_string(t) +
                                                " outside its window slot (the ranks' windows differ)");
      for (std::uint64_t t = 0; t < r.count && t < static_cast<std::uint64_t>(kMaxTensors); ++t)
        if (r.out_offset[t] != detail::WindowControl::kNone &&
            (r.out_offset[t] > win_->bytes_per_rank() || r.out_bytes[t] > win_->bytes_per_rank() - r.out_offset[t]))
          detail::fail(Errc::plan_mismatch, "MpiWindowComm::with_peers: rank " + std::to_string(p) + " publishes output " + std::to_string(t) +
                                                " outside its window slot (the ranks' windows differ)");
    }
  }

  /// The bounded wait of the group for epoch e (comm/mpi_window_rendezvous.hpp). @throws
  /// Error(aborted) when the group breaks meanwhile; Error(timeout) after timeout(), having marked
  /// the late ranks' missed words and broken the group (the peers' aborted names them).
  void wait_for(std::uint64_t e, bool arrival, const char* what) {
    const detail::EpochPoll s = detail::window_wait(*win_, e, arrival, timeout_);
    if (s.code == detail::EpochCode::ok) return;
    if (s.code == detail::EpochCode::aborted) {
      require_alive("with_peers");
      detail::fail(Errc::aborted, "rank " + std::to_string(rank()) + ": MpiWindowComm::with_peers: the window's group is broken");
    }
    std::vector<int> late;
    detail::epoch_mark_missed<detail::HostWords>(detail::WindowCtrlAt{win_}, size(), e, arrival, [&](int q) { late.push_back(q); });
    const Error x(Errc::timeout, "rank " + std::to_string(rank()) + " waited " + std::to_string(timeout_.count()) +
                                     " ms in MpiWindowComm::with_peers for the peers to " + what + "; " +
                                     detail::missing_ranks(late, arrival, e) + " (a rank skipped the call, failed outside it, or is stuck)");
    break_group(Errc::timeout, x.what());
    throw x;
  }

  MpiComm* comm_;
  MpiWindow* win_;
  std::chrono::milliseconds timeout_;
  detail::CommFailure failure_;  // this rank's first failure
  std::size_t staged_ = 0, remote_ = 0;
  bool outputs_in_window_ = false;  // outputs_in_window()
  bool cma_ = true;                // set_cross_memory_attach()
  std::size_t min_range_ = kCrossMemoryMinRange;  // set_cross_memory_min_range()
  std::vector<PeerRecord> views_;  // every rank's record in this process's mapping (with_peers' scratch)
  std::vector<CrossMemoryRecord> cma_views_;  // and its cross-memory part
  detail::RemoteReadScratch cma_scratch_;     // see cross_memory_scratch()
  std::vector<const void*> all_;   // &views_[p]
  ExchangeState state_;            // see exchange_state()
};

ULYSSES_NAMESPACE_END
