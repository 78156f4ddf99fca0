// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What the MPI windows share, host (MpiWindow, comm/mpi_window_arena.hpp) and device
///        (MpiDeviceWindow, comm/mpi_device_window.cuh): the node communicator and its size
///        check, the segments' bases, the destructors' bounded rendezvous before their
///        collective frees (window_rendezvous, SharedRendezvous), and the slots' registrations
///        and their members (WindowSlots). Why a destructor never waits on a dead peer:
///        docs/design.md (failure model).
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../error.hpp"
#include "agreement.hpp"
#include "failure.hpp"
#include "window.hpp"
#include "window_protocol.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {

static_assert(__atomic_always_lock_free(sizeof(std::uint64_t), 0),
              "the MPI windows need lock-free 8-byte atomics (they are address-free, so they work across processes)");

/// The verdict of a window's destructors (window_rendezvous): every rank is in its destructor,
/// all call MPI_Win_free.
inline constexpr std::uint64_t kWindowFree = 1;
/// The verdict: the group is broken or a rank did not come, none calls it.
inline constexpr std::uint64_t kWindowLeak = 2;

/// The bounded rendezvous of a window's destructors in shared host memory, before their
/// collective free (MPI_Win_free, MPI_Barrier: unbounded, a rank that never calls them hangs the
/// others): unless the group is broken (`abort` != 0), this rank sets its `leaving` word and
/// waits, at most `timeout`, until every rank's is set (verdict kWindowFree) or the group
/// breaks (kWindowLeak); a rank whose wait times out claims kWindowLeak. The verdict is claimed once, so every
/// rank takes the same way: true (kWindowFree) means every rank is in its destructor and will free.
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
        shared_claim(verdict, kWindowLeak);
        return true;
      }
      for (int p = 0; p < size; ++p)
        if (!shared_load(leaving(p))) return false;
      shared_claim(verdict, kWindowFree);
      return true;
    }, PollPace::relaxed);
  }
  shared_claim(verdict, kWindowLeak);  // broken, or timed out (no-op once decided)
  return shared_load(verdict) == kWindowFree;
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
    alignas(64) std::uint64_t verdict;  // rank 0's only: 0, kWindowFree or kWindowLeak
  };
  int size_ = 0, rank_ = 0;
  bool free_ = false;
  MPI_Win win_ = MPI_WIN_NULL;
  std::vector<Words*> words_;  // every rank's words in this process
};

/// What MpiWindow and MpiDeviceWindow have alike: the group, one slot of `bytes_per_rank()` bytes
/// per rank and its registrations (WindowRegistry: the same sizes in the same order on every
/// rank), the node communicator and the destructor's wait bound. The derived window maps the
/// slots (host shared memory, CUDA IPC) and sets slot_ to this rank's before any registration.
class WindowSlots {
 public:
  /// Alignment of every registration (allocate()) and staged input, in bytes.
  static constexpr std::size_t kAlignment = 256;
  /// Bytes of each rank's control block (a page).
  static constexpr std::size_t kControlBytes = 4096;

  int size() const noexcept { return size_; }                          ///< ranks of the group
  int rank() const noexcept { return rank_; }                          ///< this rank
  std::size_t bytes_per_rank() const noexcept { return reg_.bytes(); }  ///< data bytes of every rank's slot
  /// This rank's whole data slot (the registrations are its first used() bytes).
  WindowSpan local() const noexcept { return {slot_, reg_.bytes()}; }
  /// Registers the next `bytes` of this rank's slot (aligned to kAlignment) and returns them.
  /// Local (no communication); every rank must register the same sizes in the same order, which
  /// the communicator's calls and check_registrations() compare. Registrations last until reset().
  /// @throws Error(buffer_too_small) the slot has fewer bytes left (nothing registered then).
  WindowSpan allocate(std::size_t bytes) { return {slot_ + reg_.allocate(bytes, rank_, name_), bytes}; }
  /// Forgets every registration (the memory stays; the next allocate() starts at the slot's
  /// beginning). Every rank must do it alike (the next comparison sees it).
  void reset() noexcept { reg_.reset(); }
  /// Bytes of the slot taken by registrations (their end); inputs outside the window are staged after them.
  std::size_t used() const noexcept { return reg_.used(); }
  /// Number of registrations since construction or reset().
  std::size_t registrations() const noexcept { return static_cast<std::size_t>(reg_.digest().count); }
  /// What this rank registered (count, sizes, order), as the ranks compare it.
  const WindowDigest& digest() const noexcept { return reg_.digest(); }
  /// Compares what every rank registered (count, sizes, order). Collective (one MPI_Allgather of
  /// a digest over the group). @throws Error(plan_mismatch) on every rank when they differ (the
  /// message names the ranks and their sizes); Error(backend).
  void check_registrations() const {
    check_window_registrations(node_, reg_.digest(), (std::string(name_) + "::check_registrations").c_str());
  }
  /// Whether [p, p + bytes) lies in this rank's data slot.
  bool contains(const void* p, std::size_t bytes) const noexcept { return reg_.contains(slot_, p, bytes); }
  /// Whether p points into this rank's data slot (its first byte does).
  bool starts_in(const void* p) const noexcept { return reg_.starts_in(slot_, p); }
  /// The destructor's bound on the wait for the peers (kDefaultCommTimeout unless set_timeout() said otherwise).
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// Sets the destructor's wait bound. Local. @param timeout how long the destructor waits for
  /// the peers before it leaks the window
  void set_timeout(std::chrono::milliseconds timeout) noexcept { timeout_ = timeout; }
  MPI_Comm node_comm() const noexcept { return node_; }  ///< the window's communicator (the group's ranks, owned by the window)

 protected:
  /// @param bytes_per_rank the slots' size @param name the window's type, for the messages
  WindowSlots(std::size_t bytes_per_rank, const char* name) : reg_(bytes_per_rank, kAlignment), name_(name) {}
  ~WindowSlots() = default;
  WindowSlots(const WindowSlots&) = delete;
  WindowSlots& operator=(const WindowSlots&) = delete;

  WindowRegistry reg_;  // this rank's registrations
  const char* name_;    // "MpiWindow", "MpiDeviceWindow"
  std::byte* slot_ = nullptr;  // this rank's data slot in this process (set by the derived window)
  int size_ = 0, rank_ = 0;
  MPI_Comm node_ = MPI_COMM_NULL;
  std::chrono::milliseconds timeout_ = kDefaultCommTimeout;
};

}  // namespace detail

ULYSSES_NAMESPACE_END
