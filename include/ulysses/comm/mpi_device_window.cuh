// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Registered device memory between the MPI processes of one node (MpiDeviceWindow: CUDA
///        IPC) and the communicator that gives them the peer copy on the GPU
///        (MpiDeviceWindowComm: Path::direct across processes, one copy per element, no
///        workspace, no wire, no host synchronisation in the call).
///
/// The device counterpart of MpiWindow / MpiWindowComm (comm/mpi_window.hpp), with the same
/// registration rules and agreement checks (comm/window.hpp) and failure model (comm/failure.hpp):
///
///     MpiComm comm(node_comm);                          // the group: all its ranks on one node
///     MpiDeviceWindow win(comm, bytes_per_rank);        // collective; cudaMalloc + CUDA IPC
///     WindowSpan q = win.allocate(q_bytes), ...;        // same sizes, same order on every rank
///     MpiDeviceWindowComm wc(comm, win, stream);        // choose_path() gives Path::direct
///     CudaExecutor exec(plan, stream);
///     seq_to_head(plan, wc, exec, {q, k, v}, {q2, k2, v2}, {});  // enqueued on stream
///
/// **The window** (MpiDeviceWindow): every rank cudaMallocs one segment on its current device (a
/// control block, detail::DeviceWindowControl, then `bytes_per_rank` bytes of data, zeroed),
/// exports it with cudaIpcGetMemHandle, and the handles are all-gathered over the node
/// communicator (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) of the group, which must be all of
/// it); every rank opens its peers' with cudaIpcOpenMemHandle. Collective, and a failure of any
/// rank (out of memory, a handle that does not open) is an Error(backend) on every rank. Freed
/// collectively by the destructor after a bounded rendezvous in host shared memory, or leaked
/// when the group is broken or a peer does not come (as ~MpiWindow). Registration (allocate()), the digests and
/// check_registrations() are MpiWindow's: same sizes in the same order, or Error(plan_mismatch)
/// on every rank. CUDA IPC works between processes on one GPU (then every rank reads and
/// writes the same device memory) and between GPUs of a node with peer access (NVLink, PCIe).
///
/// **The peer copy** (MpiDeviceWindowComm::with_peers): everything is enqueued on the
/// communicator's stream, which must be the executor's: the staging copies (inputs outside the
/// window, cudaMemcpyAsync into the rank's slot: 2 copies per element of that input), the
/// arrive kernel, the executor's copy kernel reading the peers' window-resident inputs straight
/// into this rank's outputs, the done kernel (the protocol: comm/device_window_protocol.cuh).
/// Inputs must lie at the same offsets of every rank's slot (the same registrations; staged
/// inputs are put there alike); the records are compared on the device, and the peers'
/// addresses are computed on the host from this rank's offsets. No host synchronisation and no
/// host communication in the call, so it can be captured in a CUDA graph and replayed (the
/// epochs live in device memory); every device wait is bounded by timeout() (measured on the
/// GPU's timer): a wait that passes it sets this rank's status and breaks the group, the peers'
/// waits then end with `aborted`. The host reads the status (mapped pinned memory) at every call
/// and in synchronize() and check(), and throws the coded error there (Error(timeout) naming
/// the ranks that did not arrive or finish, Error(aborted) naming the rank that broke the group
/// and those ranks, Error(plan_mismatch)); the outputs of the call
/// that failed are unspecified, never memory outside the window. A broken communicator stays
/// broken (make a new window).
///
/// alltoallv() (the message paths, forced) goes through host memory and the MpiComm: bounded
/// stream wait, device-to-host copy, MPI's all-to-all-v, host-to-device copy (2 more copies
/// and a host synchronisation; any MPI, CUDA-aware or not). allgather() (the plan check, the
/// lists) is the MpiComm's, of host memory.
///
/// On one GPU shared by several processes (no MPS), the processes' kernels are time-sliced: a
/// rank's wait kernel spins until the GPU switches to its peers' work. Correct, and the bound
/// holds, but slower than between GPUs; MPS (nvidia-cuda-mps-control) runs them concurrently.
/// Needs nvcc, <mpi.h> (link ulysses::mpi and ulysses::cuda).
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../cuda/detail/config.cuh"
#include "../error.hpp"
#include "../layout/blocks.hpp"
#include "concepts.hpp"
#include "device_window_protocol.cuh"
#include "exchange_state.hpp"
#include "failure.hpp"
#include "mpi_comm.hpp"
#include "mpi_window.hpp"
#include "window.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {
/// What a rank learns about the link between its GPU and a peer's (cudaDeviceGetP2PAttribute).
struct PeerLink {
  bool visible = false;         ///< the peer's GPU is a device of this process (cudaDeviceGetByPCIBusId found it)
  bool native_atomics = false;  ///< cudaDevP2PAttrNativeAtomicSupported between the two (meaningful when visible)
};

/// The device window's control words (rank 0's abort word and masks) take system-scope atomics
/// from every rank's GPU (dw_or / dw_claim); across a link without native atomics (PCIe, per
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

/// A registered device-memory arena over the ranks of one node (see the file comment): per rank
/// one cudaMalloc segment (a control block and `bytes_per_rank()` bytes of data) that every rank
/// of the group maps through CUDA IPC. Not copyable or movable; one thread per rank uses it, as a
/// communicator; one MpiDeviceWindowComm at a time uses its control blocks.
class MpiDeviceWindow {
 public:
  /// Alignment of every registration and staged input, in bytes.
  static constexpr std::size_t kAlignment = 256;
  /// Bytes of each rank's control block, ahead of its data.
  static constexpr std::size_t kControlBytes = 4096;
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
  MpiDeviceWindow(MPI_Comm comm, std::size_t bytes_per_rank) : reg_(bytes_per_rank, kAlignment) {
    node_ = detail::window_node_comm(comm, bytes_per_rank, "MpiDeviceWindow");
    MPI_Comm_size(node_, &size_);
    MPI_Comm_rank(node_, &rank_);
    const std::size_t seg = kControlBytes + detail::round_up(bytes_per_rank, kAlignment);
    if (size_ > detail::kMaxDeviceWindowRanks || seg < bytes_per_rank) {
      MPI_Comm_free(&node_);
      detail::fail(size_ > detail::kMaxDeviceWindowRanks ? Errc::invalid_group : Errc::size_overflow,
                   "MpiDeviceWindow: " + (seg < bytes_per_rank ? "bytes_per_rank=" + std::to_string(bytes_per_rank) + " is too large"
                                                               : "a group of " + std::to_string(size_) + " ranks; at most " +
                                                                     std::to_string(detail::kMaxDeviceWindowRanks)));
    }
    try {
      host_ = std::make_unique<detail::SharedRendezvous>(node_);  // the destructor's rendezvous and the group's broken word
      bases_.assign(static_cast<std::size_t>(size_), nullptr);
      std::string err = detail::cuda_error(cudaGetDevice(&device_), "cudaGetDevice");
      void* mine = nullptr;
      if (err.empty()) err = detail::cuda_error(cudaMalloc(&mine, seg), "cudaMalloc (MpiDeviceWindow)");
      own_ = static_cast<std::byte*>(mine);
      if (err.empty()) err = detail::cuda_error(cudaMemset(own_, 0, seg), "cudaMemset (MpiDeviceWindow)");
      if (err.empty()) err = detail::cuda_error(cudaDeviceSynchronize(), "cudaDeviceSynchronize (MpiDeviceWindow)");
      cudaIpcMemHandle_t handle{};
      if (err.empty()) err = detail::cuda_error(cudaIpcGetMemHandle(&handle, own_), "cudaIpcGetMemHandle");
      detail::agree_on_step(node_, err, "MpiDeviceWindow: allocating and exporting the segments");
      char bus_id[32] = {};
      err = detail::cuda_error(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device_), "cudaDeviceGetPCIBusId");
      std::vector<char> all_bus(static_cast<std::size_t>(size_) * sizeof bus_id);
      detail::mpi_check(MPI_Allgather(bus_id, static_cast<int>(sizeof bus_id), MPI_CHAR, all_bus.data(), static_cast<int>(sizeof bus_id), MPI_CHAR, node_),
                        "MPI_Allgather");
      std::vector<std::string> bus(static_cast<std::size_t>(size_));
      for (int p = 0; p < size_; ++p) bus[static_cast<std::size_t>(p)] = std::string(all_bus.data() + static_cast<std::size_t>(p) * sizeof bus_id);
      if (err.empty())
        err = detail::peer_atomics_error(rank_, bus, [&](const std::string& id) {
          detail::PeerLink l;
          int peer = -1, native = 0;
          l.visible = cudaDeviceGetByPCIBusId(&peer, id.c_str()) == cudaSuccess;
          if (!l.visible) cudaGetLastError();  // not a device of this process: clear the error, it is not one
          l.native_atomics = l.visible && cudaDeviceGetP2PAttribute(&native, cudaDevP2PAttrNativeAtomicSupported, device_, peer) == cudaSuccess && native;
          cudaGetLastError();
          return l;
        });
      detail::agree_on_step(node_, err, "MpiDeviceWindow: system-scope atomics between the GPUs");
      std::vector<cudaIpcMemHandle_t> all(static_cast<std::size_t>(size_));
      detail::mpi_check(MPI_Allgather(&handle, static_cast<int>(sizeof handle), MPI_BYTE, all.data(), static_cast<int>(sizeof handle), MPI_BYTE,
                                      node_),
                        "MPI_Allgather");
      for (int p = 0; p < size_ && err.empty(); ++p) {
        void* b = own_;
        if (p != rank_)
          err = detail::cuda_error(cudaIpcOpenMemHandle(&b, all[static_cast<std::size_t>(p)], cudaIpcMemLazyEnablePeerAccess),
                                   ("cudaIpcOpenMemHandle of rank " + std::to_string(p) + "'s segment").c_str());
        if (err.empty()) bases_[static_cast<std::size_t>(p)] = static_cast<std::byte*>(b);
      }
      detail::agree_on_step(node_, err, "MpiDeviceWindow: opening the peers' segments");
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
  /// The destructor's bound on the wait for the peers (kDefaultCommTimeout unless set_timeout() said otherwise).
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// Sets the destructor's wait bound. Local. @param timeout how long ~MpiDeviceWindow waits for
  /// the peers before it leaks the window
  void set_timeout(std::chrono::milliseconds timeout) noexcept { timeout_ = timeout; }

  int size() const noexcept { return size_; }                          ///< ranks of the group
  int rank() const noexcept { return rank_; }                          ///< this rank
  int device() const noexcept { return device_; }                      ///< the device the segment is on
  std::size_t bytes_per_rank() const noexcept { return reg_.bytes(); }  ///< data bytes of every rank's slot
  /// This rank's whole data slot (device memory).
  WindowSpan local() const noexcept { return {at(rank_), reg_.bytes()}; }
  /// The start of rank p's data slot in this process's mapping (device memory).
  /// @pre 0 <= p < size().
  std::byte* at(int p) const noexcept { return bases_[static_cast<std::size_t>(p)] + kControlBytes; }

  /// Registers the next `bytes` of this rank's slot (aligned to kAlignment) and returns them
  /// (device memory). Local; every rank must register the same sizes in the same order.
  /// @throws Error(buffer_too_small) the slot has fewer bytes left.
  WindowSpan allocate(std::size_t bytes) { return {at(rank_) + reg_.allocate(bytes, rank_, "MpiDeviceWindow"), bytes}; }
  /// Forgets every registration (every rank alike).
  void reset() noexcept { reg_.reset(); }
  /// Bytes of the slot taken by registrations; inputs outside the window are staged after them.
  std::size_t used() const noexcept { return reg_.used(); }
  /// Number of registrations since construction or reset().
  std::size_t registrations() const noexcept { return static_cast<std::size_t>(reg_.digest().count); }
  /// Compares what every rank registered. Collective (one MPI_Allgather).
  /// @throws Error(plan_mismatch) on every rank when they differ; Error(backend).
  void check_registrations() const { detail::check_window_registrations(node_, reg_.digest(), "MpiDeviceWindow::check_registrations"); }
  /// Whether [p, p + bytes) lies in this rank's data slot.
  bool contains(const void* p, std::size_t bytes) const noexcept { return reg_.contains(at(rank_), p, bytes); }
  MPI_Comm node_comm() const noexcept { return node_; }  ///< the window's communicator (owned by the window)

 private:
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

  detail::WindowRegistry reg_;
  int size_ = 0, rank_ = 0, device_ = 0;
  MPI_Comm node_ = MPI_COMM_NULL;
  bool broken_ = false;            // mark_broken(): the destructor leaks
  std::chrono::milliseconds timeout_ = kDefaultCommTimeout;  // the destructor's wait bound
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

ULYSSES_CUDA_NAMESPACE_BEGIN

/// The communicator concept (comm/concepts.hpp) over an MpiComm and an MpiDeviceWindow of the
/// same group, on a stream: with_peers() is the peer copy across processes on the GPU (see the
/// file comment). Non-owning (the MpiComm, the window and the stream must outlive it); not
/// copyable. Holds 56 bytes of mapped pinned host memory (its status).
class MpiDeviceWindowComm {
 public:
  /// Buffers are device memory.
  static constexpr bool device_memory = true;

  /// Wraps `comm`, `window` and `stream`. Local (no communication); allocates the status
  /// (cudaHostAlloc, mapped).
  /// @param comm    the MpiComm of the group (allgather and the forced message paths go through it)
  /// @param window  an MpiDeviceWindow allocated over the same group
  /// @param stream  the stream every call is enqueued on (the executor's), of the window's device
  /// @param timeout bound of each device wait (and of the host waits of synchronize() and alltoallv())
  /// @throws Error(comm_mismatch) the window is not over comm's group; Error(backend) loading the protocol
  ///         kernels (cudaFuncGetAttributes, against lazy loading) or cudaHostAlloc failed.
  MpiDeviceWindowComm(MpiComm& comm, MpiDeviceWindow& window, cudaStream_t stream, std::chrono::milliseconds timeout = kDefaultCommTimeout)
      : comm_(&comm), win_(&window), stream_(stream), timeout_(timeout) {
    int cmp = MPI_UNEQUAL;
    MPI_Comm_compare(comm.get(), window.node_comm(), &cmp);
    if (comm.size() != window.size() || comm.rank() != window.rank() || (cmp != MPI_IDENT && cmp != MPI_CONGRUENT))
      detail::fail(Errc::comm_mismatch, "MpiDeviceWindowComm: the window was allocated over another group than the MpiComm's");
    // Lazy loading (the default since CUDA 12.2) loads a kernel at its first launch, which may
    // synchronise the context: behind a spinning dw_arrive_kernel (or, for dw_break_kernel, on the
    // error path, while a peer never comes) that would wait out the device timeout. Load them now.
    cudaFuncAttributes a{};
    detail::cuda_check(cudaFuncGetAttributes(&a, detail::dw_arrive_kernel), "cudaFuncGetAttributes (dw_arrive_kernel)");
    detail::cuda_check(cudaFuncGetAttributes(&a, detail::dw_done_kernel), "cudaFuncGetAttributes (dw_done_kernel)");
    detail::cuda_check(cudaFuncGetAttributes(&a, detail::dw_break_kernel), "cudaFuncGetAttributes (dw_break_kernel)");
    detail::cuda_check(cudaHostAlloc(reinterpret_cast<void**>(&status_), sizeof(detail::DeviceWindowStatus), cudaHostAllocMapped | cudaHostAllocPortable),
                       "cudaHostAlloc (MpiDeviceWindowComm status)");
    *status_ = detail::DeviceWindowStatus{};
    const cudaError_t e = cudaHostGetDevicePointer(reinterpret_cast<void**>(&status_dev_), status_, 0);
    if (e != cudaSuccess) {
      cudaFreeHost(status_);
      detail::cuda_check(e, "cudaHostGetDevicePointer (MpiDeviceWindowComm status)");
    }
    group_.size = size();
    group_.rank = rank();
    for (int p = 0; p < size(); ++p) {
      group_.ctrl[p] = detail::DeviceWindowAccess<>::control(window, p);
      slots_.push_back(window.at(p));
    }
  }
  MpiDeviceWindowComm(const MpiDeviceWindowComm&) = delete;
  MpiDeviceWindowComm& operator=(const MpiDeviceWindowComm&) = delete;
  /// Waits for the stream (errors ignored) and frees the status. When broken() (this rank or a
  /// peer failed, or the MpiComm broke), marks the window broken (MpiDeviceWindow::mark_broken()),
  /// so that its destructor makes no collective call.
  ~MpiDeviceWindowComm() {
    cudaStreamSynchronize(stream_);
    if (broken()) win_->mark_broken();
    cudaFreeHost(status_);
  }

  int size() const noexcept { return comm_->size(); }  ///< P
  int rank() const noexcept { return comm_->rank(); }  ///< this rank
  cudaStream_t stream() const noexcept { return stream_; }  ///< the stream calls are enqueued on
  MpiComm& mpi() const noexcept { return *comm_; }          ///< the wrapped MpiComm
  MpiDeviceWindow& window() const noexcept { return *win_; }  ///< the window
  std::chrono::milliseconds timeout() const noexcept { return timeout_; }  ///< the wait bound
  /// Sets the wait bound of the calls enqueued from now on. Local.
  void set_timeout(std::chrono::milliseconds timeout) noexcept { timeout_ = timeout; }
  /// Bytes of inputs the last with_peers() staged into the window (0 when all were in it).
  std::size_t staged_bytes() const noexcept { return staged_; }
  /// True once a call failed or a device wait reported a failure (what check() throws).
  bool broken() const noexcept { return failure_.broken() || detail::dw_load(status_->code) != 0 || comm_->broken(); }

  /// Throws the error a device wait reported (without waiting for the stream): Error(timeout),
  /// Error(aborted) or Error(plan_mismatch) as the file comment says; returns when none did.
  /// @throws as said; Error(aborted) after an earlier failure.
  void check() { require_alive("check"); }

  /// Waits for the stream, at most timeout() plus the device waits' own bound (polling
  /// cudaStreamQuery), then check(). @throws Error(timeout) the stream did not drain; as check();
  /// Error(backend) a CUDA error.
  void synchronize() {
    require_alive("synchronize");
    drain("synchronize");
    require_alive("synchronize");
  }

  /// All-to-all-v of device memory through host memory and the MpiComm (see the file comment).
  /// Collective. @throws Error(aborted) when broken; Error(timeout) the stream did not drain;
  /// Error(backend); the MpiComm's errors.
  void alltoallv(const std::byte* send, const std::size_t* send_bytes, const std::size_t* send_offsets, std::byte* recv,
                 const std::size_t* recv_bytes, const std::size_t* recv_offsets) {
    require_alive("alltoallv");
    std::size_t ns = 0, nr = 0;
    for (int p = 0; p < size(); ++p) {
      ns = std::max(ns, send_offsets[p] + send_bytes[p]);
      nr = std::max(nr, recv_offsets[p] + recv_bytes[p]);
    }
    host_send_.resize(ns);
    host_recv_.resize(nr);
    drain("alltoallv");  // the pack is complete
    guarded([&] {
      if (ns) detail::cuda_check(cudaMemcpy(host_send_.data(), send, ns, cudaMemcpyDeviceToHost), "cudaMemcpy (MpiDeviceWindowComm::alltoallv)");
      comm_->alltoallv(host_send_.data(), send_bytes, send_offsets, host_recv_.data(), recv_bytes, recv_offsets);
      for (int p = 0; p < size(); ++p)
        if (recv_bytes[p])
          detail::cuda_check(cudaMemcpy(recv + recv_offsets[p], host_recv_.data() + recv_offsets[p], recv_bytes[p], cudaMemcpyHostToDevice),
                             "cudaMemcpy (MpiDeviceWindowComm::alltoallv)");
    });
  }
  /// MpiComm::allgather() (host memory). @throws Error(aborted) when broken; as MpiComm::allgather().
  void allgather(const void* send, std::size_t bytes, void* recv) {
    require_alive("allgather");
    comm_->allgather(send, bytes, recv);
  }

  /// The peer copy's step across processes on the GPU (the optional with_peers() of the
  /// communicator concept), enqueued on stream(): staging copies, the arrive kernel, work(ctx,
  /// all) (all[p]: rank p's inputs in this process's mapping, at this rank's offsets), the done
  /// kernel. Returns once everything is enqueued; no host synchronisation.
  /// @pre `mine` points to a PeerInputs of device memory.
  /// @throws Error(buffer_too_small) on this rank: an input outside the window does not fit its
  ///         share of the free bytes, or starts in the slot outside its registrations (the peers
  ///         get Error(aborted) from their next call or synchronize()); what an earlier call's
  ///         device waits reported (check()); Error(backend) a launch failed; what `work`
  ///         throws. After any error the communicator is broken.
  void with_peers(const void* mine, void (*work)(void* ctx, const void* const* all), void* ctx) {
    require_alive("with_peers");
    const auto& in = *static_cast<const PeerInputs*>(mine);
    const int P = size();
    guarded([&] {
      const std::string err = detail::device_window_record(detail::DeviceWindowAccess<>::registry(*win_), win_->at(rank()), in,
                                                           MpiDeviceWindow::kAlignment, rank(), record_, stage_);
      if (!err.empty()) detail::fail(Errc::buffer_too_small, err);
      staged_ = 0;
      for (const detail::DeviceStageCopy& c : stage_) {
        detail::cuda_check(cudaMemcpyAsync(win_->at(rank()) + c.offset, c.src, c.bytes, cudaMemcpyDeviceToDevice, stream_),
                           "cudaMemcpyAsync (MpiDeviceWindowComm staging)");
        staged_ += c.bytes;
      }
      group_.check_layouts = in.peer_layouts ? 1 : 0;
      for (int p = 0; p < P; ++p) group_.expect_layouts[p] = in.peer_layouts ? in.peer_layouts[p] : 0;
      detail::check_pending(cudaPeekAtLastError(), "MpiDeviceWindowComm arrive kernel");
      detail::dw_arrive_kernel<<<1, 1, 0, stream_>>>(group_, record_, timeout_ns(), status_dev_);
      detail::check_launch("MpiDeviceWindowComm arrive kernel");
      views_.resize(static_cast<std::size_t>(P));
      all_.resize(static_cast<std::size_t>(P));
      detail::device_window_views(record_, in, slots_.data(), P, views_.data());
      for (int p = 0; p < P; ++p) all_[static_cast<std::size_t>(p)] = &views_[static_cast<std::size_t>(p)];
      work(ctx, all_.data());
      detail::check_pending(cudaPeekAtLastError(), "MpiDeviceWindowComm done kernel");
      detail::dw_done_kernel<<<1, 1, 0, stream_>>>(group_, timeout_ns(), status_dev_);
      detail::check_launch("MpiDeviceWindowComm done kernel");
    });
  }

  /// What the transports learn on this communicator about the plans run on it, and their scratch
  /// lists (comm/exchange_state.hpp).
  ExchangeState& exchange_state() noexcept { return state_; }

  /// Breaks the group at once (the optional abort() of the communicator concept, what a call that
  /// fails on this rank alone does before it throws: comm/tell_peers.hpp): the abort word in
  /// rank 0's segment, set in stream order (the peers' device waits end with Error(aborted) naming
  /// this rank; the reason text stays on this rank: device memory carries no message), and the
  /// host-shared broken word, so that no rank's ~MpiDeviceWindow waits for its peers. Local.
  /// @param why what failed on this rank (this rank's later calls throw Error(aborted) with it)
  void abort(const std::string& why) {
    if (failure_.broken()) return;
    break_group(Errc::aborted, why);
  }

 private:
  std::uint64_t timeout_ns() const noexcept { return detail::wait_ns(timeout_); }

  /// Throws Error(aborted) after an earlier failure of this rank, or the error a device wait
  /// reported (recorded as this rank's failure first).
  void require_alive(const char* what) {
    const std::string where = "rank " + std::to_string(rank()) + ": MpiDeviceWindowComm::" + what;
    failure_.check(where.c_str());
    if (detail::dw_load(status_->code) == 0) return;
    detail::DeviceWindowStatus st{};
    st.peer = status_->peer, st.epoch = status_->epoch, st.field = status_->field, st.code = status_->code;
    st.not_arrived = status_->not_arrived, st.not_done = status_->not_done, st.missed_call = status_->missed_call;
    Errc code = Errc::aborted;
    const std::string m = detail::device_window_failure(st, rank(), static_cast<long long>(timeout_.count()), code);
    failure_.fail(code, m);
  }
  /// Runs f; on an error breaks the group (the abort word, in stream order: the peers' waits end)
  /// and records it as this rank's failure before rethrowing.
  template <class F>
  void guarded(F&& f) {
    try {
      f();
    } catch (const Error& x) {
      break_group(x.code(), x.what());
      throw;
    } catch (const std::exception& x) {
      break_group(Errc::aborted, x.what());
      throw;
    }
  }
  void break_group(Errc code, const std::string& what) noexcept {
    detail::dw_break_kernel<<<1, 1, 0, stream_>>>(group_.ctrl[0], static_cast<std::uint64_t>(rank()) + 1);
    win_->mark_broken();
    try {
      failure_.record(code, what);
    } catch (...) {
    }
  }
  /// Waits (bounded) for the stream.
  void drain(const char* what) {
    const auto deadline = detail::deadline_after(detail::scaled_wait(timeout_, 2));
    cudaError_t e = cudaSuccess;
    const bool ok = detail::poll_until(deadline, [&] {
      e = cudaStreamQuery(stream_);
      return e != cudaErrorNotReady;
    }, detail::PollPace::relaxed);
    if (!ok) {
      const std::string m = "rank " + std::to_string(rank()) + ": MpiDeviceWindowComm::" + what + ": the stream did not drain within " +
                            std::to_string(detail::scaled_wait(timeout_, 2).count()) + " ms (a kernel before the exchange is stuck)";
      break_group(Errc::timeout, m);
      throw Error(Errc::timeout, m);
    }
    if (e != cudaSuccess) {
      const std::string m = detail::cuda_error(e, "cudaStreamQuery (MpiDeviceWindowComm)");
      break_group(Errc::backend, m);
      throw Error(Errc::backend, m);
    }
  }

  MpiComm* comm_;
  MpiDeviceWindow* win_;
  cudaStream_t stream_;
  std::chrono::milliseconds timeout_;
  detail::DeviceWindowStatus* status_ = nullptr;      // mapped pinned host memory, written by this rank's kernels
  detail::DeviceWindowStatus* status_dev_ = nullptr;  // its device address
  detail::DeviceWindowGroup group_{};
  detail::DeviceWindowRecord record_;
  std::vector<detail::DeviceStageCopy> stage_;
  std::vector<std::byte*> slots_;  // every rank's slot in this process
  detail::CommFailure failure_;
  std::size_t staged_ = 0;
  std::vector<PeerInputs> views_;
  std::vector<const void*> all_;
  std::vector<std::byte> host_send_, host_recv_;  // alltoallv's staging
  ExchangeState state_;
};

ULYSSES_CUDA_NAMESPACE_END
