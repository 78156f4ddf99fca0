// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief CudaPipeline: overlaps pack, exchange and unpack of a K-stage plan on the GPU, with a
///        second stream and events instead of HostPipeline's threads.
///
/// Packing stage k+1 and unpacking stage k-1 run on the pipeline's copy stream while stage k is
/// exchanged on the user's (the communicator's) stream; a fork and a join through events order
/// the whole call on the user's stream like redistribute(), and capturable where the exchange is.
/// The schedule of events: docs/headers.md, "cuda/pipeline.cuh"; docs/gpu.md, "Overlapped
/// stages". Needs nvcc; link ulysses::cuda.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../redistribute.hpp"
#include "executor.cuh"
#include "detail/config.cuh"

ULYSSES_NAMESPACE_BEGIN

namespace detail {
/// Whether an executor can cap a launch's grid: sm_count(), ctas_per_sm() and
/// run(blocks, n, table, stream, max_ctas), as CudaExecutor.
template <class E, class = void>
struct caps_grid : std::false_type {};
template <class E>
struct caps_grid<E, std::void_t<decltype(std::declval<const E&>().sm_count()), decltype(std::declval<const E&>().ctas_per_sm()),
                                decltype(std::declval<const E&>().run(std::declval<const BlockCopy*>(), std::size_t{},
                                                                      std::declval<const BufferTable&>(), cudaStream_t{},
                                                                      std::int64_t{}))>> : std::true_type {};
}  // namespace detail

/// Runs the stages of a K-stage plan (K <= 64) on the GPU with pack(k+1) / exchange(k) /
/// unpack(k-1) overlapped: the CUDA counterpart of HostPipeline. Results are bit-identical to
/// redistribute() with the same plan.
///
/// Owns one non-blocking "copy" stream and 2*kMaxStages + 2 events (timing disabled), all created
/// by the constructor on the device current then and destroyed by the destructor; redistribute() creates
/// nothing. Create one per rank (per user stream) and reuse it. Not thread-safe: one redistribute()
/// at a time (the events are reused by the next call, which is correct in stream order).
///
/// SMs: a pack or unpack launched with the whole grid (SM count × occupancy) would fill every SM
/// and the NCCL kernel of the stage being exchanged could not start until it ends. The pipeline
/// launches its copies with at most (SM count − reserved_sms) × occupancy CTAs (an executor with
/// `run(blocks, n, table, stream, max_ctas)`, as CudaExecutor). What this does and does not do:
/// it leaves reserved_sms × occupancy copy-kernel CTA slots free across the GPU; it does NOT keep
/// reserved_sms SMs idle, since the CTA scheduler spreads the capped grid over all SMs and the
/// copy kernel is persistent (grid-stride: its CTAs live until the list is done). Whether an NCCL
/// point-to-point CTA (up to 32 channels, one CTA each, with more registers and shared memory than a
/// copy CTA) fits the slots left on an SM, and so whether exchange k overlaps pack k+1, has not been
/// measured (it needs a profile on the device, nsys); the stream priorities cannot help, as the
/// exchange runs on the user's stream. Real partitioning (green contexts, CUDA >= 12.4) is not used.
class CudaPipeline {
 public:
  /// Most stages a plan may have (ulysses::kMaxStages, the limit of PlanOptions::stages).
  static constexpr int kMaxStages = ulysses::kMaxStages;
  /// Copy-kernel CTA slots, in SMs' worth, left free for the exchange by default (see the class
  /// comment: not SMs kept idle).
  static constexpr int kReservedSms = 32;
  CudaPipeline(const CudaPipeline&) = delete;             ///< owns its stream and events
  CudaPipeline& operator=(const CudaPipeline&) = delete;  ///< owns its stream and events

  /// Creates the copy stream and the events on the current device.
  /// @param stream       the user's stream (0 = legacy default stream): every redistribute() is ordered on
  ///                     it, and it must be the stream the communicator exchanges on. Not owned.
  /// @param reserved_sms SMs the packs and unpacks leave to the exchange (>= 0; at least one SM
  ///                     always copies)
  /// @throws Error(backend) when a CUDA call fails (what was created is released).
  explicit CudaPipeline(cudaStream_t stream, int reserved_sms = kReservedSms) : stream_(stream), reserved_sms_(reserved_sms) {
    try {
      detail::cuda_check(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags (CudaPipeline)");
      for (cudaEvent_t* e : {&start_, &done_}) create(e);
      for (int k = 0; k < kMaxStages; ++k) create(&packed_[k]), create(&exchanged_[k]);
    } catch (...) {
      release();
      throw;
    }
  }
  /// Destroys the copy stream and the events (work already enqueued still completes; errors are
  /// ignored).
  ~CudaPipeline() { release(); }

  /// Redistributes the plan's tensors in direction `dir` with the stages overlapped (see docs/headers.md,
  /// "cuda/pipeline.cuh" for the order of operations); returns once everything is enqueued.
  ///
  /// @param plan  a plan with 1 <= K <= 64 stages; for K = 1 nothing overlaps (as redistribute()
  ///              but on two streams)
  /// @param dir   seq_to_head or head_to_seq
  /// @param comm  a communicator (comm/concepts.hpp) of the plan's size and rank whose
  ///              exchange is ordered on stream() — NcclComm or DeviceLocalGroup::Comm made on
  ///              that stream (checked when the communicator has `stream()`)
  /// @param exec  the executor of the plan: a CudaExecutor made from `plan` (or any executor with
  ///              `run(const BlockCopy*, std::size_t, const BufferTable&, cudaStream_t)`); its
  ///              list upload must be ordered before this call's work on stream() — make it on
  ///              stream() or synchronise its stream once. Packs and unpacks run on copy_stream()
  /// @param in    the plan's tensors in order: seq-sharded [B, S_r, H, D] for seq_to_head,
  ///              head-sharded [B, S, H_r, D] for head_to_seq (in the plan's layouts), device
  ///              memory, ready in the order of stream()
  /// @param out   the other sharding, same order; must not overlap the inputs, each other or `ws`
  /// @param ws    device workspace of at least Plan::workspace_bytes() bytes (16-byte aligned for
  ///              the widest copies); all stages use their own parts of it
  /// @pre the pipeline's device is current; no other redistribute() of this pipeline is in progress.
  /// @throws before anything is enqueued: what bind_buffers() throws (wrong_tensor_count,
  ///         workspace_too_small, misaligned, buffer_overlap, invalid_shape); Error(comm_mismatch)
  ///         for a communicator of another size or rank, or one that exchanges on another
  ///         stream; Error(invalid_shape) for a plan of more than kMaxStages stages; what
  ///         check_agreement() throws when the plan's first-exchange check is on.
  ///         While enqueueing: the communicator's errors (backend, timeout, aborted,
  ///         plan_mismatch) and the executor's (backend); the user's stream is then still joined
  ///         to the copy stream (best effort) before the error propagates.
  template <class Comm, class Exec>
  void redistribute(const Plan& plan, Direction dir, Comm& comm, const Exec& exec, const TensorList<ConstByteSpan>& in,
                    const TensorList<ByteSpan>& out, Workspace ws) {
    detail::check_comm(plan, comm);
    if constexpr (comm_traits<Comm>::stream)
      detail::check_same_stream(static_cast<cudaStream_t>(comm.stream()), stream_,
                                "the communicator exchanges on another stream than the CudaPipeline's; make the communicator "
                                "on the stream the pipeline was made with");
    const int K = plan.num_stages();
    if (K < 1 || K > kMaxStages)
      detail::fail(Errc::invalid_shape, "the plan has " + std::to_string(K) + " stages; CudaPipeline runs 1 to " +
                                            std::to_string(kMaxStages));
    // The path redistribute() takes (choose_path): one message per piece where the communicator
    // can (NcclComm, DeviceLocalGroup::Comm), packing and unpacking only the staged pieces.
    const Path path = choose_path<Comm, Exec>(plan);
    const BufferTable t = detail::bind_table(plan, dir, in, out, ws, path == Path::direct ? 0 : plan.workspace_bytes());
    if constexpr (PathSupport<Comm, Exec>::direct) {
      if (path == Path::direct) return exchange_direct(plan, dir, comm, exec, t);  // one copy per element, no stages: on the user's stream
    }
    if (detail::agreement_due(plan, comm)) check_agreement(plan, comm);  // before the fork

    bool forked = false;
    try {
      detail::cuda_check(cudaEventRecord(start_, stream_), "cudaEventRecord (CudaPipeline)");
      detail::cuda_check(cudaStreamWaitEvent(copy_, start_, 0), "cudaStreamWaitEvent (CudaPipeline)");
      forked = true;
      pack_stage(plan, dir, path, exec, t, 0);
      for (int k = 0; k < K; ++k) {
        if (k + 1 < K) pack_stage(plan, dir, path, exec, t, k + 1);  // overlaps exchange k on the GPU
        detail::cuda_check(cudaStreamWaitEvent(stream_, packed_[k], 0), "cudaStreamWaitEvent (CudaPipeline)");
        stage_exchange(plan, dir, path, comm, t, k);
        detail::cuda_check(cudaEventRecord(exchanged_[k], stream_), "cudaEventRecord (CudaPipeline)");
        detail::cuda_check(cudaStreamWaitEvent(copy_, exchanged_[k], 0), "cudaStreamWaitEvent (CudaPipeline)");
        copy(exec, unpack_list(plan, dir, path, k), t);  // overlaps exchange k+1
      }
      join();
    } catch (...) {
      if (forked) {  // keep the copy stream's work ordered before the user's next work (and a
        try {        // capture joined), then report the first error
          join();
        } catch (...) {
        }
      }
      throw;
    }
  }

  /// redistribute(plan, Direction::seq_to_head, ...): seq-sharded inputs [B, S_r, H, D] →
  /// head-sharded outputs [B, S, H_r, D]. See redistribute().
  template <class Comm, class Exec>
  void seq_to_head(const Plan& plan, Comm& comm, const Exec& exec, const TensorList<ConstByteSpan>& in,
                   const TensorList<ByteSpan>& out, Workspace ws) {
    redistribute(plan, Direction::seq_to_head, comm, exec, in, out, ws);
  }
  /// redistribute(plan, Direction::head_to_seq, ...): head-sharded inputs → seq-sharded outputs.
  /// See redistribute().
  template <class Comm, class Exec>
  void head_to_seq(const Plan& plan, Comm& comm, const Exec& exec, const TensorList<ConstByteSpan>& in,
                   const TensorList<ByteSpan>& out, Workspace ws) {
    redistribute(plan, Direction::head_to_seq, comm, exec, in, out, ws);
  }

  cudaStream_t stream() const { return stream_; }     ///< the user's stream (exchanges; ordering)
  cudaStream_t copy_stream() const { return copy_; }  ///< the pipeline's stream (packs, unpacks)

 private:
  static void create(cudaEvent_t* e) {
    detail::cuda_check(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreateWithFlags (CudaPipeline)");
  }
  void release() noexcept {
    for (cudaEvent_t* e : {&start_, &done_})
      if (*e) cudaEventDestroy(*e), *e = nullptr;
    for (int k = 0; k < kMaxStages; ++k) {
      if (packed_[k]) cudaEventDestroy(packed_[k]), packed_[k] = nullptr;
      if (exchanged_[k]) cudaEventDestroy(exchanged_[k]), exchanged_[k] = nullptr;
    }
    if (copy_) cudaStreamDestroy(copy_), copy_ = nullptr;
  }
  /// Runs a list on the copy stream, with the grid capped when the executor can (see the class comment).
  template <class Exec>
  void copy(const Exec& exec, const std::vector<BlockCopy>& list, const BufferTable& t) {
    if constexpr (detail::caps_grid<Exec>::value) {
      const int sms = std::max(1, exec.sm_count() - std::max(0, reserved_sms_));
      exec.run(list.data(), list.size(), t, copy_, static_cast<std::int64_t>(sms) * exec.ctas_per_sm());
    } else {
      exec.run(list.data(), list.size(), t, copy_);
    }
  }
  /// Pack stage k (its staged pieces on the message path) on the copy stream, then record packed_[k] there.
  template <class Exec>
  void pack_stage(const Plan& plan, Direction dir, Path path, const Exec& exec, const BufferTable& t, int k) {
    copy(exec, pack_list(plan, dir, path, k), t);
    detail::cuda_check(cudaEventRecord(packed_[k], copy_), "cudaEventRecord (CudaPipeline)");
  }
  /// The user's stream waits for everything enqueued on the copy stream.
  void join() {
    detail::cuda_check(cudaEventRecord(done_, copy_), "cudaEventRecord (CudaPipeline)");
    detail::cuda_check(cudaStreamWaitEvent(stream_, done_, 0), "cudaStreamWaitEvent (CudaPipeline)");
  }

  cudaStream_t stream_ = nullptr;
  int reserved_sms_ = kReservedSms;
  cudaStream_t copy_ = nullptr;
  cudaEvent_t start_ = nullptr, done_ = nullptr;
  cudaEvent_t packed_[kMaxStages] = {};
  cudaEvent_t exchanged_[kMaxStages] = {};
};

ULYSSES_NAMESPACE_END
