// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The MPI window's arena: one MPI-3 shared-memory window over the ranks of a node, per
///        rank a data slot followed by a guard page, and, apart from the data, a control block
///        (the epoch words of comm/window_protocol.hpp, the record a call publishes, the abort
///        word, the destructors' rendezvous). The communicator over it: comm/mpi_window.hpp;
///        usage and rules: docs/guide.md (One copy between the MPI processes of a node).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../layout/blocks.hpp"
#include "cross_memory.hpp"
#include "failure.hpp"
#include "mpi_comm.hpp"
#include "mpi_window_shared.hpp"
#include "window.hpp"
#include "window_protocol.hpp"

ULYSSES_NAMESPACE_BEGIN

class MpiWindowComm;

namespace detail {
struct WindowCtrlAt;

/// One rank's control block, in the window's control segment (apart from the data slots). The epochs and the abort word
/// are process-shared atomics (HostWords: the protocol of comm/window_protocol.hpp), each on its own cache line; the record
/// is plain memory, written before the arrival epoch and read after it.
struct WindowControl {
  alignas(64) std::uint64_t arrive;  ///< epoch of the last with_peers() this rank published in
  alignas(64) std::uint64_t done;    ///< epoch of the last with_peers() whose reads this rank finished
  alignas(64) std::uint64_t abort;   ///< rank 0's only: 0, or 1 + the rank that broke the group
  alignas(64) std::uint64_t leaving;  ///< 1 once this rank is in ~MpiWindow (the rendezvous before MPI_Win_free)
  alignas(64) std::uint64_t verdict;  ///< rank 0's only: how ~MpiWindow ends, 0 undecided, kFree or kLeak (decided once, by a claim)
  alignas(64) std::uint64_t missed;   ///< 0, or 2e (arrival) or 2e + 1 (reads): a peer's deadline passed in call e while this rank had not
                                      ///< arrived (finished reading); set once (a claim) by a rank that timed out, before it breaks the group
  alignas(64) std::uint64_t status;  ///< record: 0 published, 1 this rank failed to publish (it throws its own error)
  char reason[1024];                 ///< why this rank broke the group (set before it claims `abort`; NUL-terminated)
  std::uint64_t call, call_what;     ///< record: the library call the rank is in (ExchangeState::call(): number, what)
  char call_name[32];                ///< record: and its name (NUL-terminated, cut)
  std::uint64_t pid;                 ///< this rank's process id (written once, at construction)
  std::uint64_t probe;               ///< the address of a word of this rank's private memory (the construction's probe)
  std::uint64_t reads_remote;        ///< record: CrossMemoryRecord::reads_remote of this rank's work
  std::uint64_t list, list_blocks, table;  ///< record: CrossMemoryRecord::list, list_blocks and table, passed on
  std::uint64_t count;               ///< record: the number of inputs (PeerRecord::count)
  std::uint64_t layouts;             ///< record: PeerRecord::layouts, passed on
  std::uint64_t offset[kMaxTensors];  ///< record: input t at this offset in the rank's data slot (kNone: empty)
  std::uint64_t bytes[kMaxTensors];   ///< record: and its size
  std::uint64_t address[kMaxTensors]; ///< record: with offset kRemote, input t's address in this rank's process
  std::uint64_t out_offset[kMaxTensors];  ///< record: output t at this offset in the rank's data slot (kNone: empty, not published, or outside the window)
  std::uint64_t out_bytes[kMaxTensors];   ///< record: output t's size (PeerRecord::output_bytes; 0: empty or not published)
  WindowDigest registered;            ///< record: what the rank registered
  static constexpr std::uint64_t kNone = ~std::uint64_t{0};
  static constexpr std::uint64_t kRemote = kNone - 1;  ///< offset: input t is outside the window, read at address[t] with Cross Memory Attach
  static constexpr std::uint64_t kOwn = kNone - 2;     ///< offset: input t is outside the window and no peer reads it (PeerRecord::unread)
  static constexpr std::uint64_t kFree = kWindowFree;  ///< verdict: every rank is in ~MpiWindow, all call MPI_Win_free
  static constexpr std::uint64_t kLeak = kWindowLeak;  ///< verdict: the group is broken or a rank did not come, none calls it
};

}  // namespace detail

/// A registered shared-memory arena over the ranks of one node (docs/guide.md): one MPI-3
/// shared window, per rank a control block and `bytes_per_rank()` bytes of data that every rank of
/// the group maps. Not copyable or movable (hold it by value or in a unique_ptr); one thread per
/// rank uses it at a time, as a communicator. One MpiWindowComm at a time uses its control blocks.
class MpiWindow : public detail::WindowSlots {
 public:
  static_assert(sizeof(detail::WindowControl) <= kControlBytes, "the control block fits its page");

  /// Allocates the window. Collective over `comm`: every rank of the group calls it with the same
  /// `bytes_per_rank`. The ranks are the group's in its order (rank r of `comm` is rank r of the
  /// window).
  /// @param comm the group (not owned; it must outlive the window); all its ranks on one node
  /// @param bytes_per_rank bytes of data each rank gets (0 allowed: then only inputs of 0 bytes,
  ///        or none staged, go through it), zeroed
  /// @throws Error(plan_mismatch) ranks passed different sizes (every rank, naming them);
  ///         Error(invalid_group) the group spans several shared-memory nodes (every rank);
  ///         Error(size_overflow) bytes_per_rank too large for MPI_Aint;
  ///         Error(backend) an MPI call failed (e.g. out of shared memory: /dev/shm too small).
  MpiWindow(MPI_Comm comm, std::size_t bytes_per_rank) : WindowSlots(bytes_per_rank, "MpiWindow") {
    node_ = detail::window_node_comm(comm, bytes_per_rank, "MpiWindow");  // the same size on every rank: the checks below agree
    MPI_Comm_size(node_, &size_);
    MPI_Comm_rank(node_, &rank_);
    allocate_segments(bytes_per_rank);
    detail::WindowControl& mine = control(rank_);
    mine.pid = static_cast<std::uint64_t>(detail::process_id());
    probe_ = kProbe ^ static_cast<std::uint64_t>(rank_);
    mine.probe = reinterpret_cast<std::uintptr_t>(&probe_);
    detail::mpi_check(MPI_Barrier(node_), "MPI_Barrier");  // every control block is zero (and has its pid) before anyone uses it
    cma_ = probe_cross_memory();
  }
  /// The same over MpiComm::get(). @throws as the constructor above; Error(aborted) at once, on
  ///         this rank, when `comm` is broken (a call of it timed out or failed: MPI cannot cancel
  ///         the collective it left pending, so a new window over its communicator could hang).
  MpiWindow(const MpiComm& comm, std::size_t bytes_per_rank) : MpiWindow(usable(comm), bytes_per_rank) {}
  MpiWindow(const MpiWindow&) = delete;
  MpiWindow& operator=(const MpiWindow&) = delete;
  /// Frees the window, or leaks it; never waits longer than timeout(). MPI_Win_free is
  /// collective and unbounded (a rank that never calls it hangs the others), so the ranks first
  /// meet in the shared memory: each marks that it is leaving and waits, bounded by timeout(),
  /// until every rank is; then all of them call MPI_Win_free and MPI_Comm_free (a verdict in the
  /// window, claimed once, so that every rank takes the same way). When the group is broken
  /// (broken(): a with_peers() timed out or failed on some rank, or mark_broken()), or a rank does
  /// not arrive within timeout() (a peer died, or skipped the destructor), the verdict is to leak:
  /// no rank makes a collective call, and this process keeps the shared segment mapped and MPI's
  /// window and communicator objects allocated until it ends (the OS frees them at exit; the peers
  /// still mapping the segment are not disturbed). No rank may use an address of the window
  /// afterwards. Errors are ignored.
  ~MpiWindow() {
    if (win_ == MPI_WIN_NULL) return;
    if (leave()) {
      MPI_Win_free(&win_);
      MPI_Win_free(&ctrl_win_);
      MPI_Comm_free(&node_);
    }
  }

  /// The start of rank p's data slot in this process's mapping (bytes_per_rank() bytes). Reading
  /// it is only safe while its owner does not write it (MpiWindowComm::with_peers orders that).
  /// @pre 0 <= p < size().
  std::byte* at(int p) const noexcept { return bases_[static_cast<std::size_t>(p)]; }
  /// Whether the guard page after this rank's data slot is as the constructor wrote it: false once
  /// something wrote past the slot's end (with_peers() then refuses the call: Error(buffer_too_small)).
  bool guard_intact() const noexcept {
    const std::byte* g = at(rank_) + guard_;
    for (std::size_t i = 0; i < kControlBytes; ++i)
      if (g[i] != static_cast<std::byte>(kGuardByte)) return false;
    return true;
  }

  /// True once the window's group is broken (a with_peers() of an MpiWindowComm over it timed out
  /// or failed on some rank, or a rank called mark_broken()): the destructor then leaks the window
  /// on every rank instead of its collective free.
  bool broken() const noexcept { return detail::shared_load(control(0).abort) != 0; }
  /// Why the group is broken, as the control words say, for the aborted ranks' messages: the
  /// rank that broke it and the ranks a timed-out rank found missing ("rank 1 broke it: ranks {0}
  /// did not arrive in call 2"; the missing ranks as seen by every rank whose deadline passed), or
  /// "rank 1 timed out or failed in with_peers, or marked the window broken" when no rank's
  /// deadline passed. "" while not broken(). Local, lock-free.
  std::string why_broken() const {
    const std::uint64_t who = detail::shared_load(control(0).abort);
    if (!who) return {};
    std::vector<std::uint64_t> seen;  // the distinct missed words (phase and call), ascending
    for (int p = 0; p < size_; ++p)
      if (const std::uint64_t m = detail::shared_load(control(p).missed)) seen.push_back(m);
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    std::string s = "rank " + std::to_string(who - 1);
    if (seen.empty()) {
      const detail::WindowControl& b = control(static_cast<int>(who - 1));
      const auto n = static_cast<std::size_t>(std::find(b.reason, b.reason + sizeof b.reason, '\0') - b.reason);
      if (n) return s + " broke it: " + std::string(b.reason, n);
      return s + " timed out or failed in with_peers, or marked the window broken";
    }
    s += " broke it: ";
    for (std::size_t i = 0; i < seen.size(); ++i) {
      std::vector<int> ranks;
      for (int p = 0; p < size_; ++p)
        if (detail::shared_load(control(p).missed) == seen[i]) ranks.push_back(p);
      s += (i ? "; " : "") + detail::missing_ranks(ranks, (seen[i] & 1) == 0, seen[i] >> 1);
    }
    return s;
  }
  /// `comm`'s communicator, or Error(aborted) when `comm` is broken (the constructor over MpiComm).
  static MPI_Comm usable(const MpiComm& comm) {
    if (comm.poll_notices())
      detail::fail(Errc::aborted, "MpiWindow: rank " + std::to_string(comm.rank()) +
                                      ": the MpiComm is broken (a call of it timed out or failed, on this rank or a peer): MPI cannot cancel "
                                      "the collective it left pending, so a window over this communicator could hang; make the new window "
                                      "over another MPI communicator (e.g. one duplicated beforehand), or end the job");
    return comm.get();
  }
  /// Marks the group broken for every rank (the shared abort word; a no-op when it already is),
  /// after a failure the window cannot see (a peer died, the MpiComm broke): every
  /// MpiWindowComm's call then throws Error(aborted), and every rank's destructor leaks the window
  /// at once instead of waiting for the peers. Local, never blocks.
  void mark_broken() noexcept {
    detail::epoch_break<detail::HostWords>([this](int p) -> detail::WindowControl& { return control(p); }, rank_);
  }
  /// mark_broken() with the reason every rank's Error(aborted) then gives (why_broken(): "rank 3
  /// broke it: <why>"; cut to 1023 bytes). Local, never blocks; the first rank to break the group
  /// keeps its reason. @param why what failed on this rank
  void mark_broken(const std::string& why) noexcept {
    detail::WindowControl& mine = control(rank_);
    if (!broken() && !mine.reason[0]) {
      const std::size_t n = std::min(why.size(), sizeof mine.reason - 1);
      std::memcpy(mine.reason, why.data(), n);
      mine.reason[n] = '\0';
    }
    mark_broken();  // (a seq_cst claim: the reason is visible to whoever sees the abort word)
  }

  /// Whether every rank of the group can read every peer's private memory with Cross Memory
  /// Attach (comm/cross_memory.hpp: process_vm_readv), probed once by the constructor and agreed
  /// by all ranks: then MpiWindowComm's peers read inputs outside the window in place (one copy)
  /// instead of their owner staging them (two).
  bool cross_memory_attach() const noexcept { return cma_; }

  MPI_Win get() const noexcept { return win_; }  ///< the MPI window

 private:
  friend class MpiWindowComm;
  friend struct detail::WindowCtrlAt;
  detail::WindowControl& control(int p) const noexcept {
    return *reinterpret_cast<detail::WindowControl*>(controls_[static_cast<std::size_t>(p)]);
  }
  /// The two shared windows (data slots with their guard pages; control blocks), zeroed and
  /// first touched by their owners. MPI's segments need not be page-aligned (Open MPI's start 264
  /// bytes into a page): each is allocated a page longer and every process aligns every rank's
  /// base up to a page (the same offset in every process, whose mappings are page-aligned).
  /// Collective; frees node_ before it throws.
  void allocate_segments(std::size_t bytes_per_rank) {
    const std::size_t data = detail::round_up(bytes_per_rank, kControlBytes), seg = 2 * kControlBytes + data;  // data, guard, alignment
    if (seg < bytes_per_rank || seg > static_cast<std::size_t>(PTRDIFF_MAX)) {
      MPI_Comm_free(&node_);
      detail::fail(Errc::size_overflow, "MpiWindow: bytes_per_rank=" + std::to_string(bytes_per_rank) + " is too large");
    }
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "alloc_shared_noncontig", "true");  // each rank's segment on its own pages (NUMA: first touch by its owner)
    void* base = nullptr;
    const int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(seg), 1, info, node_, &base, &win_);
    MPI_Info_free(&info);
    if (rc != MPI_SUCCESS) {
      MPI_Comm_free(&node_);
      detail::mpi_check(rc, "MPI_Win_allocate_shared");
    }
    const int crc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(2 * kControlBytes), 1, MPI_INFO_NULL, node_, &base, &ctrl_win_);
    if (crc != MPI_SUCCESS) {
      MPI_Win_free(&win_);
      MPI_Comm_free(&node_);
      detail::mpi_check(crc, "MPI_Win_allocate_shared (the control blocks)");
    }
    bases_ = page_bases(win_);
    controls_ = page_bases(ctrl_win_);
    guard_ = bytes_per_rank;
    slot_ = bases_[static_cast<std::size_t>(rank_)];
    std::memset(slot_, 0, data);                          // the data, by its owner
    std::memset(slot_ + guard_, kGuardByte, kControlBytes);  // its guard: the page after the slot
    std::memset(controls_[static_cast<std::size_t>(rank_)], 0, kControlBytes);
  }
  /// Cross Memory Attach: can every rank read every peer's private memory (its probe word)? One
  /// verdict for all (collective: after it, no peer reads probe_ any more).
  bool probe_cross_memory() const {
    int readable = 1;
    for (int p = 0; p < size_; ++p)
      if (p != rank_ && !detail::cross_memory_readable(static_cast<std::int64_t>(control(p).pid), control(p).probe,
                                                       kProbe ^ static_cast<std::uint64_t>(p)))
        readable = 0;
    int all = 0;
    detail::mpi_check(MPI_Allreduce(&readable, &all, 1, MPI_INT, MPI_MIN, node_), "MPI_Allreduce");
    return all == 1;
  }
  /// Every rank's segment of shared window `w` in this process, each aligned up to a page.
  std::vector<std::byte*> page_bases(MPI_Win w) const { return detail::segment_bases(w, size_, kControlBytes); }
  static constexpr unsigned char kGuardByte = 0xa5;  // the guard page's bytes
  static constexpr std::uint64_t kProbe = 0x756c7973736573;  // the probe word, xor the rank
  /// The destructor's rendezvous: true when every rank is to call MPI_Win_free (see ~MpiWindow).
  bool leave() const noexcept {
    return detail::window_rendezvous(size_, rank_, [this](int p) -> std::uint64_t& { return control(p).leaving; }, control(0).verdict,
                                     control(0).abort, timeout_);
  }

  std::uint64_t calls_ = 0;     // the library calls begun on the MpiWindowComms over this window (ExchangeState::count_calls_in)
  std::uint64_t probe_ = 0;  // the word the peers read in the constructor's probe
  bool cma_ = false;         // cross_memory_attach()
  MPI_Win win_ = MPI_WIN_NULL;       // the data slots, each followed by its guard page
  MPI_Win ctrl_win_ = MPI_WIN_NULL;  // the control blocks (apart: a write past a data slot cannot reach them)
  std::size_t guard_ = 0;            // where the guard page starts in the data slot: bytes_per_rank
  std::vector<std::byte*> bases_;    // every rank's data slot in this process
  std::vector<std::byte*> controls_;  // every rank's control block in this process
};

ULYSSES_NAMESPACE_END
