// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The device window's arena (MpiDeviceWindow): per rank one cudaMalloc segment (a
///        control block, comm/device_window_records.hpp, then the data slot) that every rank of
///        the node maps through CUDA IPC, the registrations and members it shares with MpiWindow
///        (detail::WindowSlots), and its destructors' bounded rendezvous in host shared memory.
///        The communicator over it: comm/mpi_device_window.cuh; usage: docs/gpu.md (One copy
///        between processes: the device window). Needs nvcc and <mpi.h>.
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../cuda/detail/config.cuh"
#include "../error.hpp"
#include "device_window_records.hpp"
#include "failure.hpp"
#include "mpi_comm.hpp"
#include "mpi_window_shared.hpp"
#include "window.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {
/// What a rank learns about the link between its GPU and a peer's (cudaDeviceGetP2PAttribute).
struct PeerLink {
  bool visible = false;         ///< the peer's GPU is a device of this process (cudaDeviceGetByPCIBusId found it)
  bool native_atomics = false;  ///< cudaDevP2PAttrNativeAtomicSupported between the two (meaningful when visible)
};

/// The device window's control words (rank 0's abort word and masks) take system-scope atomics
/// from every rank's GPU (DeviceWords: dw_claim); across a link without native atomics (PCIe, per
/// cudaDevP2PAttrNativeAtomicSupported) they are not atomic. "" when every peer's GPU is this
/// rank's own (several processes on one GPU), or is linked with native atomics, or is not
/// visible to this process (CUDA_VISIBLE_DEVICES: the link cannot be queried, and is assumed: the
/// window's setting is NVLink/NVSwitch); else the refusal, naming both GPUs.
/// @param rank this rank; @param bus every rank's PCI bus id (cudaDeviceGetPCIBusId)
/// @param link callable as PeerLink(const std::string& peer_bus_id)
template <class Link>
std::string peer_atomics_error(int rank, const std::vector<std::string>& bus, Link&& link) {
  const std::string& mine = bus[static_cast<std::size_t>(rank)];
  for (std::size_t p = 0; p < bus.size(); ++p) {
    if (static_cast<int>(p) == rank || bus[p] == mine) continue;
    const PeerLink l = link(bus[p]);
    if (l.visible && !l.native_atomics)
      return "MpiDeviceWindow: the GPUs of rank " + std::to_string(rank) + " (" + mine + ") and rank " + std::to_string(p) + " (" + bus[p] +
             ") have no native atomics over their link (cudaDevP2PAttrNativeAtomicSupported = 0, e.g. PCIe): the device window's "
             "control words need them; take the message path (PlanOptions::path = Path::alltoallv, or NcclComm)";
  }
  return "";
}

/// Agrees on a step that may fail on some ranks: "" everywhere, or throws Error(backend) on every
/// rank (its own message where it failed, else naming the ranks that did). Collective over node.
/// @param node the window's communicator
/// @param err  this rank's error ("" when it succeeded)
/// @param what the step, for the message
inline void agree_on_step(MPI_Comm node, const std::string& err, const char* what) {
  int size = 0, rank = 0;
  MPI_Comm_size(node, &size);
  MPI_Comm_rank(node, &rank);
  std::vector<unsigned long long> all(static_cast<std::size_t>(size));
  unsigned long long mine = err.empty() ? 0 : 1;
  mpi_check(MPI_Allgather(&mine, 1, MPI_UNSIGNED_LONG_LONG, all.data(), 1, MPI_UNSIGNED_LONG_LONG, node), "MPI_Allgather");
  const std::vector<int> failed = ranks_where(size, [&](int p) { return all[static_cast<std::size_t>(p)] != 0; });
  if (failed.empty()) return;
  fail(Errc::backend, err.empty() ? std::string(what) + ": ranks " + rank_set(failed) + " failed (their own errors say why)"
                                  : std::string(what) + ": rank " + std::to_string(rank) + ": " + err);
}
/// "" or "<what> failed: <cudaGetErrorName>: <cudaGetErrorString>".
inline std::string cuda_error(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  return std::string(what) + " failed: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
}
}  // namespace detail

namespace detail {
template <class>
struct DeviceWindowAccess;
}  // namespace detail

/// A registered device-memory arena over the ranks of one node (docs/gpu.md): per rank
/// one cudaMalloc segment (a control block and `bytes_per_rank()` bytes of data) that every rank
/// of the group maps through CUDA IPC. Not copyable or movable; one thread per rank uses it, as a
/// communicator; one MpiDeviceWindowComm at a time uses its control blocks.
class MpiDeviceWindow : public detail::WindowSlots {
 public:
  static_assert(sizeof(detail::DeviceWindowControl) <= kControlBytes, "the control block fits its page");

  /// Allocates the window on the current device of every rank. Collective over `comm`: every
  /// rank calls it with the same `bytes_per_rank`; rank r of `comm` is rank r of the window.
  /// @param comm the group (not owned; it must outlive the window); all its ranks on one node,
  ///        at most 64
  /// @param bytes_per_rank data bytes each rank gets (zeroed)
  /// @throws Error(plan_mismatch) ranks passed different sizes (every rank, naming them);
  ///         Error(invalid_group) the group spans several nodes or has more than 64 ranks (every
  ///         rank); Error(size_overflow); Error(backend) a CUDA or MPI call failed on some rank
  ///         (every rank: out of device memory, IPC unsupported, a handle that did not open), or two
  ///         ranks' GPUs lack native atomics over their link (detail::peer_atomics_error()).
  MpiDeviceWindow(MPI_Comm comm, std::size_t bytes_per_rank) : WindowSlots(bytes_per_rank, "MpiDeviceWindow") {
    node_ = detail::window_node_comm(comm, bytes_per_rank, "MpiDeviceWindow");
    MPI_Comm_size(node_, &size_);
    MPI_Comm_rank(node_, &rank_);
    const std::size_t seg = kControlBytes + detail::round_up(bytes_per_rank, kAlignment);
    if (size_ > kMaxTableRanks || seg < bytes_per_rank) {
      MPI_Comm_free(&node_);
      detail::fail(size_ > kMaxTableRanks ? Errc::invalid_group : Errc::size_overflow,
                   "MpiDeviceWindow: " + (seg < bytes_per_rank ? "bytes_per_rank=" + std::to_string(bytes_per_rank) + " is too large"
                                                               : "a group of " + std::to_string(size_) + " ranks; at most " +
                                                                     std::to_string(kMaxTableRanks)));
    }
    try {
      host_ = std::make_unique<detail::SharedRendezvous>(node_);  // the destructor's rendezvous and the group's broken word
      bases_.assign(static_cast<std::size_t>(size_), nullptr);
      cudaIpcMemHandle_t handle{};
      detail::agree_on_step(node_, export_segment(seg, handle), "MpiDeviceWindow: allocating and exporting the segments");
      detail::agree_on_step(node_, check_peer_atomics(), "MpiDeviceWindow: system-scope atomics between the GPUs");
      detail::agree_on_step(node_, open_peers(handle), "MpiDeviceWindow: opening the peers' segments");
      slot_ = at(rank_);
    } catch (...) {
      release();
      throw;
    }
  }
  /// The same over MpiComm::get(). @throws as the constructor above.
  MpiDeviceWindow(const MpiComm& comm, std::size_t bytes_per_rank) : MpiDeviceWindow(comm.get(), bytes_per_rank) {}
  MpiDeviceWindow(const MpiDeviceWindow&) = delete;
  MpiDeviceWindow& operator=(const MpiDeviceWindow&) = delete;
  /// Frees the window, or leaks it; never waits for the peers longer than timeout(). Waits for
  /// the device (cudaDeviceSynchronize; the window's kernels are bounded). The ranks first meet
  /// as ~MpiWindow's do, in a few words of host shared memory allocated with the window
  /// (detail::SharedRendezvous: each marks that it is leaving and waits, bounded by timeout(),
  /// then one verdict claimed for all): when every rank came, all of them, once no rank reads
  /// any more (MPI_Barrier), close the peers' mappings and, after a second barrier, free their
  /// segments. When the group is broken (broken(): an MpiDeviceWindowComm over it failed or saw
  /// a peer fail, or mark_broken() on any rank), or a rank does not come within timeout() (a
  /// peer died, or skipped the destructor), the verdict is to leak: no collective call is made,
  /// the peers' mappings stay open and the segment allocated (device memory held until the
  /// process ends), and only the window's communicator is freed (MPI_Comm_free: local in
  /// practice). Errors are ignored.
  ~MpiDeviceWindow() { release(); }

  /// True once the window's group is broken (mark_broken() on this rank or any peer): the
  /// destructor then leaks the window on every rank instead of its collective free.
  bool broken() const noexcept { return broken_ || (host_ && host_->broken()); }
  /// Marks the group broken for every rank (a word of host shared memory; local, never blocks):
  /// every rank's destructor then leaks the window at once instead of waiting for the peers.
  /// MpiDeviceWindowComm calls it when it fails or sees a peer's failure; call it after a
  /// failure the window cannot see (a peer died, the MpiComm broke).
  void mark_broken() noexcept {
    broken_ = true;
    if (host_) host_->mark_broken();
  }
  int device() const noexcept { return device_; }  ///< the device the segment is on
  /// The start of rank p's data slot in this process's mapping (device memory).
  /// @pre 0 <= p < size().
  std::byte* at(int p) const noexcept { return bases_[static_cast<std::size_t>(p)] + kControlBytes; }


 private:
  /// Allocates, zeroes and exports this rank's segment: "" or the error (agreed by the caller).
  std::string export_segment(std::size_t seg, cudaIpcMemHandle_t& handle) {
    std::string err = detail::cuda_error(cudaGetDevice(&device_), "cudaGetDevice");
    void* mine = nullptr;
    if (err.empty()) err = detail::cuda_error(cudaMalloc(&mine, seg), "cudaMalloc (MpiDeviceWindow)");
    own_ = static_cast<std::byte*>(mine);
    if (err.empty()) err = detail::cuda_error(cudaMemset(own_, 0, seg), "cudaMemset (MpiDeviceWindow)");
    if (err.empty()) err = detail::cuda_error(cudaDeviceSynchronize(), "cudaDeviceSynchronize (MpiDeviceWindow)");
    if (err.empty()) err = detail::cuda_error(cudaIpcGetMemHandle(&handle, own_), "cudaIpcGetMemHandle");
    return err;
  }
  /// Every rank's PCI bus id (collective), then detail::peer_atomics_error(): "" or the refusal.
  std::string check_peer_atomics() const {
    char bus_id[32] = {};
    const std::string err = detail::cuda_error(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device_), "cudaDeviceGetPCIBusId");
    std::vector<char> all_bus(static_cast<std::size_t>(size_) * sizeof bus_id);
    detail::mpi_check(MPI_Allgather(bus_id, static_cast<int>(sizeof bus_id), MPI_CHAR, all_bus.data(), static_cast<int>(sizeof bus_id), MPI_CHAR, node_),
                      "MPI_Allgather");
    if (!err.empty()) return err;
    std::vector<std::string> bus(static_cast<std::size_t>(size_));
    for (int p = 0; p < size_; ++p) bus[static_cast<std::size_t>(p)] = std::string(all_bus.data() + static_cast<std::size_t>(p) * sizeof bus_id);
    return detail::peer_atomics_error(rank_, bus, [&](const std::string& id) {
      detail::PeerLink l;
      int peer = -1, native = 0;
      l.visible = cudaDeviceGetByPCIBusId(&peer, id.c_str()) == cudaSuccess;
      if (!l.visible) cudaGetLastError();  // not a device of this process: clear the error, it is not one
      l.native_atomics = l.visible && cudaDeviceGetP2PAttribute(&native, cudaDevP2PAttrNativeAtomicSupported, device_, peer) == cudaSuccess && native;
      cudaGetLastError();
      return l;
    });
  }
  /// All-gathers the handles (collective) and opens the peers' segments: "" or the error.
  std::string open_peers(const cudaIpcMemHandle_t& handle) {
    std::vector<cudaIpcMemHandle_t> all(static_cast<std::size_t>(size_));
    detail::mpi_check(MPI_Allgather(&handle, static_cast<int>(sizeof handle), MPI_BYTE, all.data(), static_cast<int>(sizeof handle), MPI_BYTE, node_),
                      "MPI_Allgather");
    std::string err;
    for (int p = 0; p < size_ && err.empty(); ++p) {
      void* b = own_;
      if (p != rank_)
        err = detail::cuda_error(cudaIpcOpenMemHandle(&b, all[static_cast<std::size_t>(p)], cudaIpcMemLazyEnablePeerAccess),
                                 ("cudaIpcOpenMemHandle of rank " + std::to_string(p) + "'s segment").c_str());
      if (err.empty()) bases_[static_cast<std::size_t>(p)] = static_cast<std::byte*>(b);
    }
    return err;
  }
  template <class>
  friend struct detail::DeviceWindowAccess;
  void release() noexcept {
    if (node_ == MPI_COMM_NULL) return;
    cudaDeviceSynchronize();
    if (!host_ || broken_ || !host_->leave(timeout_)) {  // leak: no collective with peers that may never come
      MPI_Comm_free(&node_);
      return;
    }
    MPI_Barrier(node_);  // every rank is here (the rendezvous met)
    for (int p = 0; p < size_ && p < static_cast<int>(bases_.size()); ++p)
      if (p != rank_ && bases_[static_cast<std::size_t>(p)]) cudaIpcCloseMemHandle(bases_[static_cast<std::size_t>(p)]);
    MPI_Barrier(node_);
    if (own_) cudaFree(own_);
    own_ = nullptr;
    host_.reset();  // MPI_Win_free, collective (every rank is here)
    MPI_Comm_free(&node_);
  }

  int device_ = 0;
  bool broken_ = false;            // mark_broken(): the destructor leaks
  std::unique_ptr<detail::SharedRendezvous> host_;  // the rendezvous' and broken words in host shared memory (null before construction got there)
  std::byte* own_ = nullptr;       // this rank's segment
  std::vector<std::byte*> bases_;  // every rank's segment (control block, then data) in this process
};

namespace detail {
/// What MpiDeviceWindowComm reads of the window beyond its public members.
template <class = void>
struct DeviceWindowAccess {
  static DeviceWindowControl* control(const MpiDeviceWindow& w, int p) noexcept {
    return reinterpret_cast<DeviceWindowControl*>(w.bases_[static_cast<std::size_t>(p)]);
  }
  static const WindowRegistry& registry(const MpiDeviceWindow& w) noexcept { return w.reg_; }
};
}  // namespace detail


ULYSSES_NAMESPACE_END
