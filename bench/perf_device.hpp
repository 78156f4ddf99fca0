// SPDX-License-Identifier: Apache-2.0
// The device backends of ulysses_perf (--backend nccl, cuda-local, cuda-ipc): one rank's exchanges
// on the GPU, behind a plain C++ interface so that ulysses_perf.cpp stays a C++ translation unit
// built with or without CUDA. The implementation is perf_device.cu (nvcc; built only where
// ulysses::cuda is, NCCL only where ulysses::nccl is).
//
// A rank holds one exchange at a time: load() copies the host inputs (the oracle's values) to
// device buffers and makes the CudaExecutor; run() enqueues redistribute() (or the bare
// all-to-all-v of load_bare()) on the rank's stream; time_us() times `iters` of them with CUDA
// events on that stream; fetch() copies the outputs back for the host oracle; unload() frees.
#pragma once

#include <ulysses/ulysses.hpp>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace perf_device {

/// "" when this process can use a CUDA device, else why not ("cudaGetDeviceCount: " and its
/// error, or "cudaGetDeviceCount found 0 devices").
std::string unavailable();

/// The number of CUDA devices this process sees (0 when unavailable() is not "").
int device_count();

/// "NAME (N SMs)" of device `device`.
std::string device_name(int device);

/// What run() and time_us() run: the loaded exchange (redistribute()), or the bare all-to-all-v
/// of load_bare().
enum class Op { exchange, bare };

/// One rank of a device group: an NCCL communicator of one process per GPU (with_nccl()), or a
/// virtual rank of a DeviceLocalGroup on one GPU (spawn_local()). Models what ulysses_perf's host
/// collectives need (size, rank, allgather of host memory).
class Rank {
 public:
  struct Impl;
  explicit Rank(Impl* impl) : impl_(impl) {}
  int size() const;  ///< P
  int rank() const;  ///< this rank
  /// All-gather of `bytes` bytes of host memory (rank p's at recv + p * bytes). Collective; waits
  /// for the rank's stream. @throws ulysses::Error(backend) CUDA / NCCL failures.
  void allgather(const void* send, std::size_t bytes, void* recv);
  /// The transport redistribute() takes for `plan` on this communicator with a CudaExecutor.
  std::string path(const ulysses::Plan& plan) const;

  /// Device buffers for one exchange of `plan` in `dir` (inputs, zeroed outputs, workspace), the
  /// host inputs `in` (the plan's input layouts) copied into them, and a CudaExecutor of `plan` on
  /// the rank's stream. `plan` must outlive unload() (the executor holds its lists).
  /// @throws ulysses::Error(backend) CUDA failures; what CudaExecutor's constructor throws.
  void load(const ulysses::Plan& plan, ulysses::Direction dir, const ulysses::TensorList<ulysses::ConstByteSpan>& in);
  /// Device buffers for the bare all-to-all-v of `bytes` bytes: P equal chunks (own included).
  void load_bare(std::size_t bytes);
  /// Enqueues `n` runs of `op` on the rank's stream. Collective (every rank calls it alike).
  /// @throws what redistribute() throws; ulysses::Error(backend).
  void run(Op op, int n);
  /// Microseconds per run of `iters` back-to-back runs of `op`, from CUDA events recorded on the
  /// rank's stream before the first and after the last (this rank's; waits for them). Collective.
  double time_us(Op op, int iters);
  /// Waits for everything enqueued on the rank's stream.
  void sync();
  /// Copies the loaded exchange's outputs into the host buffers `out` (its output layouts) and
  /// waits. @throws ulysses::Error(backend).
  void fetch(const ulysses::TensorList<ulysses::ByteSpan>& out);
  /// Frees the exchange's and the bare all-to-all-v's buffers and the executor (after waiting
  /// for the stream; errors ignored).
  void unload() noexcept;

 private:
  Impl* impl_;
};

/// Runs fn(Rank&) on P virtual ranks of the current device (DeviceLocalGroup; each a thread with
/// its own stream) and joins them; the first rank's error is rethrown (LocalGroup::spawn).
/// @throws ulysses::Error(backend) CUDA failures; what fn throws.
void spawn_local(int P, const std::function<void(Rank&)>& fn);

/// Whether this build has the NCCL backend (ulysses::nccl was found).
bool has_nccl();

/// Bytes of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES; perf_device.cu checks it against nccl.h).
constexpr std::size_t kNcclUniqueIdBytes = 128;

/// A new ncclUniqueId as bytes (rank 0 makes it; the others receive it, e.g. by MPI_Bcast).
/// @throws ulysses::Error(backend) without NCCL in this build or when ncclGetUniqueId fails.
std::vector<char> nccl_unique_id();

/// Runs fn(Rank&) on rank `rank` of an NCCL communicator of P ranks (one process each, `id` from
/// nccl_unique_id() of rank 0) on device `device`, on a new stream; destroys both afterwards.
/// Collective over the P processes. @throws ulysses::Error(backend); what fn throws.
void with_nccl(int rank, int P, int device, const std::vector<char>& id, const std::function<void(Rank&)>& fn);

/// Whether this build has the CUDA IPC backend (ulysses::mpi and ulysses::cuda were found).
bool has_ipc();

/// Runs fn(Rank&) on this process's rank of an MpiDeviceWindowComm (comm/mpi_device_window.cuh)
/// over MPI_COMM_WORLD (initialised by the caller; every process on one node), on device
/// `device`, a new stream and a device window of `window_bytes` bytes per rank: each exchange's
/// inputs are registered in it (the largest any rank needs, so the registrations agree) and read
/// in place by the peers; the bare op is one cudaMemcpyAsync of the same bytes on the rank's
/// stream (the copy floor; no exchange). Collective. @throws ulysses::Error(backend) without
/// MPI or CUDA IPC; the window's errors; what fn throws.
void with_ipc(int device, std::size_t window_bytes, const std::function<void(Rank&)>& fn);

}  // namespace perf_device
