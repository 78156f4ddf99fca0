// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Registered shared memory between the MPI processes of one node (MpiWindow) and the
///        communicator that gives them the peer copy (MpiWindowComm: Path::direct across
///        processes, one copy per element, no workspace, no wire).
///
/// Engines run one process per GPU or per socket; between processes the message path copies
/// every element twice (the staging copy and MPI's). With the inputs in memory that every rank of
/// the node maps, each rank instead copies its share of its peers' inputs straight into its own
/// outputs, as threads of one process do (LocalGroup::Comm::with_peers, transport/peer_copy.hpp):
///
///     MpiComm comm(node_comm);                      // the group: all its ranks on one node
///     MpiWindow win(comm, bytes_per_rank);          // collective; same size on every rank
///     WindowSpan q = win.allocate(q_bytes), ...;    // same sizes, same order on every rank
///     MpiWindowComm wc(comm, win);                  // choose_path() gives Path::direct
///     seq_to_head(plan, wc, exec, {q, k, v}, {q2, k2, v2}, {});  // inputs read in place by the peers
///
/// **The window** (MpiWindow) is one MPI-3 shared-memory window (MPI_Win_allocate_shared over
/// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)), allocated collectively and freed collectively by
/// its destructor after a bounded rendezvous in the shared memory, or leaked when the group is
/// broken or a peer does not come (~MpiWindow: a destructor never hangs on a dead peer): per rank
/// `bytes_per_rank` bytes of data, zeroed, first touched by their owner, followed by a guard page
/// (a write past the slot's end is a coded error at the next with_peers()), and, in a second
/// small shared window out of reach of the data, a control block (MpiWindow::kControlBytes: the
/// process-shared words of the synchronisation). Registration is
/// allocate(): the next bytes of the rank's own slot, as NCCL's symmetric windows
/// (ncclCommWindowRegister) every rank registers the same sizes in the same order (with uneven
/// sequence splits: the largest size any rank needs). What each rank registered (count, sizes,
/// order: a digest) is compared across ranks at every with_peers() and by check_registrations():
/// ranks that registered differently all throw Error(plan_mismatch), never silent corruption.
///
/// **The peer copy** (MpiWindowComm::with_peers, the optional member of the communicator concept,
/// comm/concepts.hpp): the peer copy publishes this rank's inputs (a PeerInputs: base pointers
/// and sizes); each input inside the rank's slot is published as its offset there, and every
/// peer turns the offsets back into addresses of its own mapping. An input outside the window is
/// read in place where every rank may read its peers' private memory (Cross Memory Attach,
/// probed once and agreed by the window's constructor: MpiWindow::cross_memory_attach()) and the
/// work reads so (the peer copy on a host executor, PeerInputs::reads_remote): it is published
/// by its owner's process id and address, and its rows go straight into the peers' outputs
/// (comm/cross_memory.hpp; one copy per element, as Open MPI's shared-memory transport moves a
/// message): each peer pulls them with process_vm_readv, or, where the destination is the more
/// contiguous side (seq→head), the owner pushes them with process_vm_writev; a sum's remote
/// terms go through a bounce buffer, then the sum),
/// unless the peers read it in short ranges (cross_memory_min_range(): the cost is per range).
/// Otherwise (not permitted, not Linux, set_cross_memory_attach(false), or another work such as
/// the decode merge) it is first copied once into the slot's free bytes after the registrations
/// (staged: 2 copies per element of that input, still no transport). Plan::copies() counts the
/// one-copy cases, 1; staged_bytes() and remote_bytes() say what the last call did. Outputs
/// allocated from the window are published too (offsets, as the inputs): when every rank's are
/// there, seq→head pushes, as between threads (each rank reads its own rows in order and stores
/// every peer's heads into that peer's output; its inputs may then lie anywhere), rather than each
/// rank pulling its heads out of its peers' rows at a stride (outputs_in_window()). Synchronisation is by epochs in the control blocks, with lock-free atomics on the
/// shared memory (seq_cst `__atomic` builtins): a rank publishes its record, then its arrival
/// epoch; no rank reads an input before its owner's arrival; every rank then marks its reads done
/// and returns only when every peer's are. Every wait is bounded by the comm's timeout: a rank
/// that waits longer throws Error(timeout) naming the ranks that did not arrive (or finish), marks
/// them in their control blocks, and breaks the group (a shared abort word): every rank's later
/// call (and peers still waiting) throws Error(aborted), naming the same missing ranks. alltoallv(), allgather() and exchange_messages() go through the
/// wrapped MpiComm, so every other path can still be forced (PlanOptions::path).
///
/// Host memory only: device buffers across processes (CUDA IPC, NCCL windows) are not handled
/// here. Needs <mpi.h> (link ulysses::mpi), an MPI-3 library, and 8-byte lock-free atomics.
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
#include "agreement.hpp"
#include "concepts.hpp"
#include "cross_memory.hpp"
#include "exchange_state.hpp"
#include "failure.hpp"
#include "mpi_comm.hpp"
#include "window.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {

static_assert(__atomic_always_lock_free(sizeof(std::uint64_t), 0),
              "MpiWindow needs lock-free 8-byte atomics (they are address-free, so they work across processes)");

/// Process-shared word access (the control blocks): sequentially consistent, so that a rank that
/// stores its arrival and then loads the abort word, and a rank that stores the abort word and
/// then loads the arrivals, cannot both miss the other's store.
inline std::uint64_t shared_load(const std::uint64_t& w) noexcept { return __atomic_load_n(&w, __ATOMIC_SEQ_CST); }
inline void shared_store(std::uint64_t& w, std::uint64_t v) noexcept { __atomic_store_n(&w, v, __ATOMIC_SEQ_CST); }
/// Sets `w` from 0 to `v`; false (and `w` unchanged) when it was not 0.
inline bool shared_claim(std::uint64_t& w, std::uint64_t v) noexcept {
  std::uint64_t zero = 0;
  return __atomic_compare_exchange_n(&w, &zero, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
/// One rank's control block, in the window's control segment (apart from the data slots). The epochs and the abort word
/// are process-shared atomics (shared_load / shared_store), each on its own cache line; the record
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
  std::uint64_t reads_remote;        ///< record: PeerInputs::reads_remote of this rank's work
  std::uint64_t list, list_blocks, table;  ///< record: PeerInputs::list, list_blocks and table, passed on
  std::uint64_t count;               ///< record: the number of inputs (PeerInputs::count)
  std::uint64_t layouts;             ///< record: PeerInputs::layouts, passed on
  std::uint64_t offset[kMaxTensors];  ///< record: input t at this offset in the rank's data slot (kNone: empty)
  std::uint64_t bytes[kMaxTensors];   ///< record: and its size
  std::uint64_t address[kMaxTensors]; ///< record: with offset kRemote, input t's address in this rank's process
  std::uint64_t out_offset[kMaxTensors];  ///< record: output t at this offset in the rank's data slot (kNone: empty, not published, or outside the window)
  std::uint64_t out_bytes[kMaxTensors];   ///< record: output t's size (PeerInputs::output_bytes; 0: empty or not published)
  WindowDigest registered;            ///< record: what the rank registered
  static constexpr std::uint64_t kNone = ~std::uint64_t{0};
  static constexpr std::uint64_t kRemote = kNone - 1;  ///< offset: input t is outside the window, read at address[t] with Cross Memory Attach
  static constexpr std::uint64_t kOwn = kNone - 2;     ///< offset: input t is outside the window and no peer reads it (PeerInputs::unread)
  static constexpr std::uint64_t kFree = 1;  ///< verdict: every rank is in ~MpiWindow, all call MPI_Win_free
  static constexpr std::uint64_t kLeak = 2;  ///< verdict: the group is broken or a rank did not come, none calls it
};

/// The bounded rendezvous of a window's destructors in shared host memory, before their
/// collective free (MPI_Win_free, MPI_Barrier: unbounded, a rank that never calls them hangs the
/// others): unless the group is broken (`abort` != 0), this rank sets its `leaving` word and
/// waits, at most `timeout`, until every rank's is set (verdict WindowControl::kFree) or the group
/// breaks (kLeak); a rank whose wait times out claims kLeak. The verdict is claimed once, so every
/// rank takes the same way: true (kFree) means every rank is in its destructor and will free.
/// Lock-free on process-shared words (shared_load, shared_claim); never throws.
/// @param size    ranks of the group
/// @param rank    this rank
/// @param leaving callable as std::uint64_t&(int p): rank p's leaving word (0 until it leaves)
/// @param verdict the group's verdict word (0 undecided)
/// @param abort   the group's abort word (0 while not broken)
/// @param timeout how long to wait for the peers
template <class Leaving>
bool window_rendezvous(int size, int rank, Leaving&& leaving, std::uint64_t& verdict, const std::uint64_t& abort,
                       std::chrono::milliseconds timeout) noexcept {
  if (!shared_load(abort)) {
    shared_store(leaving(rank), 1);
    poll_until(deadline_after(timeout), [&] {
      if (shared_load(verdict) != 0) return true;
      if (shared_load(abort)) {
        shared_claim(verdict, WindowControl::kLeak);
        return true;
      }
      for (int p = 0; p < size; ++p)
        if (!shared_load(leaving(p))) return false;
      shared_claim(verdict, WindowControl::kFree);
      return true;
    }, PollPace::relaxed);
  }
  shared_claim(verdict, WindowControl::kLeak);  // broken, or timed out (no-op once decided)
  return shared_load(verdict) == WindowControl::kFree;
}

inline void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(Errc::backend, std::string(what) + " failed: " + std::string(msg, static_cast<std::size_t>(len)));
}

/// The node communicator of a window over `comm`: checks that every rank asks for the same
/// `bytes_per_rank` and that the group lies on one shared-memory node, then returns
/// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) of it (the caller frees it). Collective.
/// @param comm           the group
/// @param bytes_per_rank this rank's size of the window's slots
/// @param window         the window's type, for the messages ("MpiWindow")
/// @throws Error(plan_mismatch) ranks passed different sizes (every rank, naming them);
///         Error(invalid_group) the group spans several nodes (every rank); Error(backend).
inline MPI_Comm window_node_comm(MPI_Comm comm, std::size_t bytes_per_rank, const char* window) {
  int size = 0, rank = 0;
  mpi_check(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  mpi_check(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  std::vector<unsigned long long> all(static_cast<std::size_t>(size));
  unsigned long long mine = bytes_per_rank;
  mpi_check(MPI_Allgather(&mine, 1, MPI_UNSIGNED_LONG_LONG, all.data(), 1, MPI_UNSIGNED_LONG_LONG, comm), "MPI_Allgather");
  const std::string diff = values_differ(all, "bytes_per_rank");
  if (!diff.empty()) fail(Errc::plan_mismatch, std::string(window) + ": " + diff + "; every rank must pass the same size");
  MPI_Comm node = MPI_COMM_NULL;
  mpi_check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  if (node_size != size) {
    MPI_Comm_free(&node);
    fail(Errc::invalid_group, std::string(window) + ": the group of " + std::to_string(size) + " ranks spans several nodes (rank " +
                                  std::to_string(rank) + "'s node holds " + std::to_string(node_size) +
                                  " of them); a window needs every rank on one node (split_by_node() gives such groups)");
  }
  return node;
}

/// Compares every rank's registrations over `node` (one MPI_Allgather of the digests).
/// Collective. @param node the window's communicator @param mine this rank's digest
/// @param window the window's type and call, for the message
/// @throws Error(plan_mismatch) on every rank when they differ; Error(backend).
inline void check_window_registrations(MPI_Comm node, const WindowDigest& mine, const char* window) {
  int size = 0;
  mpi_check(MPI_Comm_size(node, &size), "MPI_Comm_size");
  std::vector<WindowDigest> all(static_cast<std::size_t>(size));
  mpi_check(MPI_Allgather(&mine, static_cast<int>(sizeof mine), MPI_BYTE, all.data(), static_cast<int>(sizeof mine), MPI_BYTE, node),
            "MPI_Allgather");
  const std::string m = registration_mismatch(all.data(), size);
  if (!m.empty()) fail(Errc::plan_mismatch, std::string(window) + ": " + m);
}

/// Every rank's segment of the shared window `w` (MPI_Win_shared_query) in this process, each
/// base aligned up to `align` bytes (MPI's segments need not be aligned; every process aligns
/// every base alike, its mappings being page-aligned): what the windows allocate one `align`
/// longer. @param size the window's ranks
inline std::vector<std::byte*> segment_bases(MPI_Win w, int size, std::size_t align) {
  std::vector<std::byte*> bases(static_cast<std::size_t>(size));
  for (int p = 0; p < size; ++p) {
    MPI_Aint sz = 0;
    int disp = 0;
    void* b = nullptr;
    MPI_Win_shared_query(w, p, &sz, &disp, &b);
    const auto a = reinterpret_cast<std::uintptr_t>(b);
    bases[static_cast<std::size_t>(p)] = static_cast<std::byte*>(b) + (round_up<std::uintptr_t>(a, align) - a);
  }
  return bases;
}

/// A few process-shared words per rank in host memory over a window's node communicator (one
/// small MPI-3 shared window), for a window whose own memory the host cannot read (the device
/// window, comm/mpi_device_window.cuh): the group's broken word and its destructors' bounded
/// rendezvous (window_rendezvous, as ~MpiWindow's). Not copyable or movable.
class SharedRendezvous {
 public:
  /// Allocates the words (zeroed). Collective over `node` (MPI_Win_allocate_shared, then a barrier).
  /// @param node the window's communicator (all its ranks on one node; not owned, it must outlive this)
  /// @throws Error(backend) an MPI call failed.
  explicit SharedRendezvous(MPI_Comm node) {
    mpi_check(MPI_Comm_size(node, &size_), "MPI_Comm_size");
    mpi_check(MPI_Comm_rank(node, &rank_), "MPI_Comm_rank");
    void* base = nullptr;  // a segment need not be 64-byte aligned: each is a line longer, every process aligns every base up
    mpi_check(MPI_Win_allocate_shared(static_cast<MPI_Aint>(sizeof(Words) + 64), 1, MPI_INFO_NULL, node, &base, &win_),
              "MPI_Win_allocate_shared (the window's rendezvous)");
    words_.resize(static_cast<std::size_t>(size_));
    const std::vector<std::byte*> bases = segment_bases(win_, size_, 64);
    for (int p = 0; p < size_; ++p) words_[static_cast<std::size_t>(p)] = reinterpret_cast<Words*>(bases[static_cast<std::size_t>(p)]);
    std::memset(static_cast<void*>(words_[static_cast<std::size_t>(rank_)]), 0, sizeof(Words));
    mpi_check(MPI_Barrier(node), "MPI_Barrier");  // every rank's words are zero before anyone uses them
  }
  SharedRendezvous(const SharedRendezvous&) = delete;
  SharedRendezvous& operator=(const SharedRendezvous&) = delete;
  /// Frees the words (MPI_Win_free, collective) when leave() returned true; else leaks them (the
  /// OS frees them at exit), as a broken or deserted window must.
  ~SharedRendezvous() {
    if (free_) MPI_Win_free(&win_);
  }

  /// True once a rank called mark_broken().
  bool broken() const noexcept { return shared_load(words_[0]->abort) != 0; }
  /// Marks the group broken for every rank (local, never blocks; a no-op when it already is):
  /// every rank's leave() then returns false at once.
  void mark_broken() noexcept { shared_claim(words_[0]->abort, static_cast<std::uint64_t>(rank_) + 1); }
  /// The destructor's rendezvous (window_rendezvous): true when every rank is leaving and the
  /// group is not broken, so that all of them may make their collective frees (this object's
  /// included); false (leak) when it is broken or a rank did not come within `timeout`. Never
  /// throws; call it once. @param timeout how long to wait for the peers
  bool leave(std::chrono::milliseconds timeout) noexcept {
    free_ = window_rendezvous(size_, rank_, [this](int p) -> std::uint64_t& { return words_[static_cast<std::size_t>(p)]->leaving; },
                              words_[0]->verdict, words_[0]->abort, timeout);
    return free_;
  }

 private:
  struct Words {
    alignas(64) std::uint64_t leaving;  // 1 once this rank is in leave()
    alignas(64) std::uint64_t abort;    // rank 0's only: 0, or 1 + the rank that broke the group
    alignas(64) std::uint64_t verdict;  // rank 0's only: 0, WindowControl::kFree or kLeak
  };
  int size_ = 0, rank_ = 0;
  bool free_ = false;
  MPI_Win win_ = MPI_WIN_NULL;
  std::vector<Words*> words_;  // every rank's words in this process
};

}  // namespace detail

/// A registered shared-memory arena over the ranks of one node (see the file comment): one MPI-3
/// shared window, per rank a control block and `bytes_per_rank()` bytes of data that every rank of
/// the group maps. Not copyable or movable (hold it by value or in a unique_ptr); one thread per
/// rank uses it at a time, as a communicator. One MpiWindowComm at a time uses its control blocks.
class MpiWindow {
 public:
  /// Alignment of every registration (allocate()) and staged input, in bytes.
  static constexpr std::size_t kAlignment = 256;
  /// Bytes of each rank's control block, ahead of its data (a page).
  static constexpr std::size_t kControlBytes = 4096;
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
  MpiWindow(MPI_Comm comm, std::size_t bytes_per_rank) : reg_(bytes_per_rank, kAlignment) {
    // MPI's segments need not be page-aligned (Open MPI's start 264 bytes into a page): each is
    // allocated a page longer and every process aligns every rank's base up to a page (the same
    // offset in every process, whose mappings are page-aligned).
    node_ = detail::window_node_comm(comm, bytes_per_rank, "MpiWindow");  // the same size on every rank: the checks below agree
    const std::size_t data = detail::round_up(bytes_per_rank, kControlBytes), seg = 2 * kControlBytes + data;  // data, guard, alignment
    if (seg < bytes_per_rank || seg > static_cast<std::size_t>(PTRDIFF_MAX)) {
      MPI_Comm_free(&node_);
      detail::fail(Errc::size_overflow, "MpiWindow: bytes_per_rank=" + std::to_string(bytes_per_rank) + " is too large");
    }
    MPI_Comm_size(node_, &size_);
    MPI_Comm_rank(node_, &rank_);
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
    std::memset(bases_[static_cast<std::size_t>(rank_)], 0, data);  // the data, by its owner
    std::memset(bases_[static_cast<std::size_t>(rank_)] + guard_, kGuardByte, kControlBytes);  // its guard: the page after the slot
    std::memset(controls_[static_cast<std::size_t>(rank_)], 0, kControlBytes);
    detail::WindowControl& mine = control(rank_);
    mine.pid = static_cast<std::uint64_t>(detail::process_id());
    constexpr std::uint64_t kProbe = 0x756c7973736573;  // the probe word, xor the rank
    probe_ = kProbe ^ static_cast<std::uint64_t>(rank_);
    mine.probe = reinterpret_cast<std::uintptr_t>(&probe_);
    detail::mpi_check(MPI_Barrier(node_), "MPI_Barrier");  // every control block is zero (and has its pid) before anyone uses it
    // Cross Memory Attach: can every rank read every peer's private memory? One verdict for all.
    int readable = 1;
    for (int p = 0; p < size_; ++p)
      if (p != rank_ && !detail::cross_memory_readable(static_cast<std::int64_t>(control(p).pid), control(p).probe,
                                                       kProbe ^ static_cast<std::uint64_t>(p)))
        readable = 0;
    int all = 0;
    detail::mpi_check(MPI_Allreduce(&readable, &all, 1, MPI_INT, MPI_MIN, node_), "MPI_Allreduce");  // also: no peer reads probe_ any more
    cma_ = all == 1;
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

  int size() const noexcept { return size_; }                     ///< ranks of the group
  int rank() const noexcept { return rank_; }                     ///< this rank
  std::size_t bytes_per_rank() const noexcept { return reg_.bytes(); }  ///< data bytes of every rank's slot
  /// This rank's whole data slot (the registrations are its first used() bytes).
  WindowSpan local() const noexcept { return {at(rank_), reg_.bytes()}; }
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

  /// Registers the next `bytes` of this rank's slot (aligned to kAlignment) and returns them.
  /// Local (no communication); every rank must register the same sizes in the same order, which
  /// with_peers() and check_registrations() compare. Registrations last until reset().
  /// @throws Error(buffer_too_small) the slot has fewer bytes left (nothing registered then).
  WindowSpan allocate(std::size_t bytes) { return {at(rank_) + reg_.allocate(bytes, rank_, "MpiWindow"), bytes}; }
  /// Forgets every registration (the memory stays; the next allocate() starts at the slot's
  /// beginning). Every rank must do it alike (the next comparison sees it).
  void reset() noexcept { reg_.reset(); }
  /// Bytes of the slot taken by registrations (their end); inputs outside the window are staged after them.
  std::size_t used() const noexcept { return reg_.used(); }
  /// Number of registrations since construction or reset().
  std::size_t registrations() const noexcept { return static_cast<std::size_t>(reg_.digest().count); }

  /// Compares what every rank registered (count, sizes, order). Collective (one MPI_Allgather of
  /// a digest over the group). @throws Error(plan_mismatch) on every rank when they differ (the
  /// message names the ranks and their sizes); Error(backend).
  void check_registrations() const { detail::check_window_registrations(node_, reg_.digest(), "MpiWindow::check_registrations"); }

  /// Whether [p, p + bytes) lies in this rank's data slot.
  bool contains(const void* p, std::size_t bytes) const noexcept { return reg_.contains(at(rank_), p, bytes); }
  /// Whether p points into this rank's data slot (its first byte does).
  bool starts_in(const void* p) const noexcept { return reg_.starts_in(at(rank_), p); }

  /// The destructor's bound on the wait for the peers (kDefaultCommTimeout unless set_timeout() said otherwise).
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// Sets the destructor's wait bound. Local. @param timeout how long ~MpiWindow waits for the
  /// peers before it leaks the window
  void set_timeout(std::chrono::milliseconds timeout) noexcept { timeout_ = timeout; }
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
  void mark_broken() noexcept { detail::shared_claim(control(0).abort, static_cast<std::uint64_t>(rank_) + 1); }
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

  MPI_Win get() const noexcept { return win_; }          ///< the MPI window
  MPI_Comm node_comm() const noexcept { return node_; }  ///< the window's communicator (the group's ranks, owned by the window)

 private:
  friend class MpiWindowComm;
  detail::WindowControl& control(int p) const noexcept {
    return *reinterpret_cast<detail::WindowControl*>(controls_[static_cast<std::size_t>(p)]);
  }
  /// Every rank's segment of shared window `w` in this process, each aligned up to a page.
  std::vector<std::byte*> page_bases(MPI_Win w) const { return detail::segment_bases(w, size_, kControlBytes); }
  static constexpr unsigned char kGuardByte = 0xa5;  // the guard page's bytes
  const detail::WindowDigest& digest() const noexcept { return reg_.digest(); }
  /// The destructor's rendezvous: true when every rank is to call MPI_Win_free (see ~MpiWindow).
  bool leave() const noexcept {
    return detail::window_rendezvous(size_, rank_, [this](int p) -> std::uint64_t& { return control(p).leaving; }, control(0).verdict,
                                     control(0).abort, timeout_);
  }

  detail::WindowRegistry reg_;  // this rank's registrations
  std::uint64_t calls_ = 0;     // the library calls begun on the MpiWindowComms over this window (ExchangeState::count_calls_in)
  std::chrono::milliseconds timeout_ = kDefaultCommTimeout;
  std::uint64_t probe_ = 0;  // the word the peers read in the constructor's probe
  bool cma_ = false;         // cross_memory_attach()
  int size_ = 0, rank_ = 0;
  MPI_Comm node_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;       // the data slots, each followed by its guard page
  MPI_Win ctrl_win_ = MPI_WIN_NULL;  // the control blocks (apart: a write past a data slot cannot reach them)
  std::size_t guard_ = 0;            // where the guard page starts in the data slot: bytes_per_rank
  std::vector<std::byte*> bases_;    // every rank's data slot in this process
  std::vector<std::byte*> controls_;  // every rank's control block in this process
};

/// The communicator concept (comm/concepts.hpp) over an MpiComm and an MpiWindow of the same
/// group, with with_peers() across processes: Path::direct, the peer copy, between the MPI
/// processes of one node (see the file comment). alltoallv(), allgather() and
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
  /// PeerInputs::outputs, and every non-empty one lies in its rank's window slot): a seq→head then
  /// pushed (each rank wrote its peers' outputs from its own rows, in order) rather than pulled;
  /// head→seq always pulls.
  bool outputs_in_window() const noexcept { return outputs_in_window_; }
  /// Bytes of this rank's inputs outside the window that the peers read with Cross Memory Attach
  /// in the last with_peers() (their rows pulled by the peers or pushed by this rank: 1 copy per
  /// element, as in the window): the rows read, each read counted (PeerInputs::read_bytes), not
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
  /// The shortest mean range (PeerInputs::range_bytes) of an input outside the window that the
  /// peers read in place; inputs whose peers read shorter ranges are staged. Default
  /// kCrossMemoryMinRange: process_vm_readv pins the pages of every remote range, about a
  /// microsecond each (measured on Linux 6, x86-64), which doubles the read of a 4 KiB range and
  /// makes shorter ones slower than staging (a contiguous copy, then row copies from memory the
  /// reader maps). Llama-3.1-8B at P = 4: seq→head reads rows of H/P heads (q: 4 KiB in fp32, k
  /// and v: 1 KiB), head→seq whole sequence chunks per head.
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
  /// concept). Collective over the group. `mine` points to this rank's PeerInputs (what
  /// transport/peer_copy.hpp publishes); `work(ctx, all)` then runs with all[p] pointing to rank
  /// p's PeerInputs translated into this process's mapping of the window (valid during the call).
  /// Inputs in this rank's slot are read in place by the peers; inputs outside the window are
  /// published for the peers to read in place with Cross Memory Attach when
  /// cross_memory_attach() and `mine` says its work reads so (PeerInputs::reads_remote; the
  /// views then carry the owner's pid and addresses), else copied first into the slot's bytes
  /// after its registrations (and after any input of this call in the slot); an input outside the
  /// window that no peer reads (PeerInputs::unread) is neither staged nor published, and needs no
  /// room (C17). Returns when every rank's work has returned.
  /// @pre `mine` points to a PeerInputs; host memory.
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
  void with_peers(const void* mine, void (*work)(void* ctx, const void* const* all), void* ctx) {
    require_alive("with_peers");
    const auto& in = *static_cast<const PeerInputs*>(mine);
    const int P = size(), me = rank();
    detail::WindowControl& c = win_->control(me);
    const std::uint64_t e = detail::shared_load(c.arrive) + 1;
    std::exception_ptr err;
    Errc code = Errc::aborted;
    std::string what = "a call of with_peers failed";
    bool uniform = false;    // the error is a verdict every rank reaches alike (the group stays usable)
    bool timed_out = false;  // this rank already waited timeout() for the peers
    const std::string own = publish(in, c);  // "" or this rank's error (status = 1)
    if (!own.empty()) break_group(Errc::buffer_too_small, Error(Errc::buffer_too_small, own).what());  // before the arrival: the peers name it
    detail::shared_store(c.arrive, e);
    try {
      if (!own.empty()) detail::fail(Errc::buffer_too_small, own);  // the peers see the status (or the abort word) and read nothing
      wait_for(e, &detail::WindowControl::arrive, "arrive");
      std::vector<int> failed;
      for (int p = 0; p < P; ++p)
        if (win_->control(p).status) failed.push_back(p);
      if (!failed.empty())
        detail::fail(Errc::aborted, "rank " + std::to_string(me) + ": ranks " + detail::rank_set(failed) +
                                        " could not publish their inputs in the window (their own errors say why)");
      uniform = true;
      check_records(in);  // throws plan_mismatch (every rank alike)
      uniform = false;
      views_.resize(static_cast<std::size_t>(P));
      all_.resize(static_cast<std::size_t>(P));
      bool outputs = true, published = false;  // every rank's non-empty outputs in its window slot; some published
      for (int p = 0; p < P; ++p) {
        const detail::WindowControl& r = win_->control(p);
        PeerInputs& v = views_[static_cast<std::size_t>(p)];
        v.count = static_cast<int>(r.count);
        v.layouts = r.layouts;
        v.pid = p != me && win_->cross_memory_attach() ? static_cast<std::int64_t>(r.pid) : 0;  // (its inputs may be remote, or it may be pushed to)
        v.list = r.list;
        v.list_blocks = r.list_blocks;
        v.table = r.table;
        for (int t = 0; t < kMaxTensors; ++t) {
          const bool used = t < v.count && r.offset[t] != detail::WindowControl::kNone;
          const bool remote = used && r.offset[t] == detail::WindowControl::kRemote;
          const bool owner_only = used && r.offset[t] == detail::WindowControl::kOwn;  // read by its owner only
          v.data[t] = !used ? nullptr : !remote && !owner_only ? win_->at(p) + r.offset[t] : p == me ? in.data[t] : nullptr;  // own inputs: loaded here
          v.bytes[t] = used ? static_cast<std::size_t>(r.bytes[t]) : 0;
          v.remote[t] = remote ? r.address[t] : 0;
          if (remote && p != me) v.pid = static_cast<std::int64_t>(r.pid);
          const bool out = t < v.count && r.out_offset[t] != detail::WindowControl::kNone;
          v.outputs[t] = out ? win_->at(p) + r.out_offset[t] : nullptr;  // stored to by the pushed seq→head
          v.output_bytes[t] = t < v.count ? static_cast<std::size_t>(r.out_bytes[t]) : 0;
          outputs = outputs && (!v.output_bytes[t] || v.outputs[t]);
          published = published || v.output_bytes[t];
        }
        all_[static_cast<std::size_t>(p)] = &v;
      }
      outputs_in_window_ = outputs && published;
      work(ctx, all_.data());
    } catch (const Error& x) {
      err = std::current_exception();
      code = x.code();
      what = x.what();
      timed_out = code == Errc::timeout;
    } catch (const std::exception& x) {
      err = std::current_exception();
      what = x.what();
    } catch (...) {
      err = std::current_exception();
    }
    detail::shared_store(c.done, e);  // this rank reads no peer's memory any more
    if (!err) {
      try {
        wait_for(e, &detail::WindowControl::done, "finish reading");
        return;
      } catch (const Error& x) {
        err = std::current_exception();
        code = x.code();
        what = x.what();
        timed_out = code == Errc::timeout;
      }
    }
    if (!uniform) break_group(code, what);
    if (!timed_out) wait_for_readers(e);  // no peer still reads this rank's inputs when it returns
    std::rethrow_exception(err);
  }

  /// What the transports learn on this communicator about the plans run on it, and their scratch
  /// lists (comm/exchange_state.hpp).
  ExchangeState& exchange_state() noexcept { return state_; }

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

  /// Writes this rank's record (offsets in its slot, staging the inputs outside the window) and
  /// returns "" or why it cannot (then status = 1).
  std::string publish(const PeerInputs& in, detail::WindowControl& c) {
    MpiWindow& w = *win_;
    const std::byte* slot = w.at(rank());
    std::size_t cursor = w.used();  // staging goes after the registrations and after every input and published output of this call in the slot
    std::string err;
    staged_ = remote_ = 0;
    outputs_in_window_ = false;
    const bool read_in_place = in.reads_remote && cross_memory_attach();
    if (!w.guard_intact())
      err = "MpiWindowComm: rank " + std::to_string(rank()) + " wrote past the end of its window slot of " +
            std::to_string(w.bytes_per_rank()) + " bytes (the guard page after it changed): a buffer allocated from the window ran past "
            "its end; the window's contents can no longer be trusted (make a new MpiWindow, with room for every buffer)";
    const int n = std::min(std::max(in.count, 0), kMaxTensors);
    for (int t = 0; t < n; ++t) {
      if (in.bytes[t] && w.contains(in.data[t], in.bytes[t]))
        cursor = std::max(cursor, static_cast<std::size_t>(in.data[t] - slot) + in.bytes[t]);
      if (in.outputs[t] && in.output_bytes[t] && w.contains(in.outputs[t], in.output_bytes[t]))  // (nor over an output in the slot)
        cursor = std::max(cursor, static_cast<std::size_t>(in.outputs[t] - slot) + in.output_bytes[t]);
    }
    for (int t = 0; t < kMaxTensors; ++t) {
      c.offset[t] = detail::WindowControl::kNone;
      c.bytes[t] = 0;
      c.address[t] = 0;
      const bool out = t < n && in.outputs[t] && in.output_bytes[t] && w.contains(in.outputs[t], in.output_bytes[t]);
      c.out_offset[t] = out ? static_cast<std::uint64_t>(in.outputs[t] - slot) : detail::WindowControl::kNone;
      c.out_bytes[t] = t < n && in.outputs[t] ? in.output_bytes[t] : 0;
    }
    for (int t = 0; t < n && err.empty(); ++t) {  // (nothing staged once refused)
      const std::byte* p = in.data[t];
      const std::size_t b = in.bytes[t];
      if (!b || !p) continue;
      c.bytes[t] = b;
      if (w.contains(p, b)) {
        c.offset[t] = static_cast<std::uint64_t>(p - slot);
        continue;
      }
      if (w.starts_in(p)) {
        err = "MpiWindowComm: input " + std::to_string(t) + " of rank " + std::to_string(rank()) + " starts in the window and runs " +
              std::to_string(b - static_cast<std::size_t>(slot + w.bytes_per_rank() - p)) + " bytes past its end";
        break;
      }
      if (in.unread[t]) {  // no peer reads it (e.g. they have no tokens: C17): neither staged nor published, no room needed
        c.offset[t] = detail::WindowControl::kOwn;
        continue;
      }
      if (read_in_place && in.range_bytes[t] >= min_range_) {  // the peers read it where it is (Cross Memory Attach): one copy
        c.offset[t] = detail::WindowControl::kRemote;
        c.address[t] = reinterpret_cast<std::uintptr_t>(p);
        remote_ += in.read_bytes[t] ? static_cast<std::size_t>(in.read_bytes[t]) : b;  // what the peers read (not a view's span)
        continue;
      }
      const std::size_t off = detail::round_up(cursor, MpiWindow::kAlignment);
      if (off > w.bytes_per_rank() || b > w.bytes_per_rank() - off) {
        err = "MpiWindowComm: input " + std::to_string(t) + " of rank " + std::to_string(rank()) + " (" + std::to_string(b) +
              " bytes) is outside the window, and the window has " + std::to_string(off > w.bytes_per_rank() ? 0 : w.bytes_per_rank() - off) +
              " free bytes to stage it in; allocate the inputs from the window (MpiWindow::allocate) or make it larger";
        break;
      }
      std::memcpy(w.at(rank()) + off, p, b);
      c.offset[t] = off;
      staged_ += b;
      cursor = off + b;
    }
    c.count = static_cast<std::uint64_t>(in.count);
    c.layouts = in.layouts;
    c.reads_remote = in.reads_remote ? 1 : 0;
    c.list = in.list;
    c.list_blocks = in.list_blocks;
    c.table = in.table;
    c.registered = w.digest();
    const ExchangeState::Call& call = state_.call();
    c.call = call.number;
    c.call_what = call.what;
    const std::size_t nn = std::min(std::strlen(call.name), sizeof c.call_name - 1);
    std::memcpy(c.call_name, call.name, nn);
    c.call_name[nn] = '\0';
    c.status = err.empty() ? 0 : 1;
    return err;
  }

  /// After every rank arrived: the same verdict on every rank (they read the same records).
  void check_records(const PeerInputs& /*in*/) const {
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

  /// Spins (bounded) until every rank's `field` reaches epoch e. @throws Error(aborted) when the
  /// group breaks meanwhile; Error(timeout) after timeout() (breaking the group). The arrival
  /// wait looks at the abort word before the epochs (a rank that reads its peers has seen it clear
  /// after publishing its arrival: what wait_for_readers() relies on); the wait for the reads to
  /// finish looks at the epochs first (once every rank has read, the exchange is complete, even if
  /// a peer breaks the group in its next call).
  void wait_for(std::uint64_t e, std::uint64_t detail::WindowControl::*field, const char* what) {
    const int P = size();
    const bool arrival = field == &detail::WindowControl::arrive;
    auto reached = [&] {
      int p = 0;
      while (p < P && detail::shared_load(win_->control(p).*field) >= e) ++p;
      return p == P;
    };
    const bool ok = detail::poll_until(detail::deadline_after(timeout_), [&] {
      if (arrival) require_alive("with_peers");
      if (reached()) return true;
      if (!arrival) require_alive("with_peers");
      return false;
    }, detail::PollPace::relaxed);  // the peers are other processes: they progress on their own
    if (ok) return;
    std::vector<int> late;
    for (int q = 0; q < P; ++q)
      if (detail::shared_load(win_->control(q).*field) < e) {
        late.push_back(q);
        detail::shared_claim(win_->control(q).missed, 2 * e + (arrival ? 0u : 1u));  // before the abort word: the peers name them
      }
    const Error x(Errc::timeout, "rank " + std::to_string(rank()) + " waited " + std::to_string(timeout_.count()) +
                                     " ms in MpiWindowComm::with_peers for the peers to " + what + "; " +
                                     detail::missing_ranks(late, arrival, e) + " (a rank skipped the call, failed outside it, or is stuck)");
    break_group(Errc::timeout, x.what());
    throw x;
  }

  /// After this rank failed: waits (bounded by timeout()) until every peer that arrived at epoch e
  /// has finished reading (a peer that did not arrive sees the abort word and reads nothing).
  void wait_for_readers(std::uint64_t e) const noexcept {
    const int P = size();
    detail::poll_until(detail::deadline_after(timeout_), [&] {
      for (int p = 0; p < P; ++p) {
        const detail::WindowControl& r = win_->control(p);
        if (detail::shared_load(r.arrive) >= e && detail::shared_load(r.done) < e) return false;
      }
      return true;
    }, detail::PollPace::relaxed);
  }

  MpiComm* comm_;
  MpiWindow* win_;
  std::chrono::milliseconds timeout_;
  detail::CommFailure failure_;  // this rank's first failure
  std::size_t staged_ = 0, remote_ = 0;
  bool outputs_in_window_ = false;  // outputs_in_window()
  bool cma_ = true;                // set_cross_memory_attach()
  std::size_t min_range_ = kCrossMemoryMinRange;  // set_cross_memory_min_range()
  std::vector<PeerInputs> views_;  // every rank's inputs in this process's mapping (with_peers' scratch)
  std::vector<const void*> all_;   // &views_[p]
  ExchangeState state_;            // see exchange_state()
};

ULYSSES_NAMESPACE_END
