// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief HostPipeline: overlaps pack, exchange and unpack of a K-stage plan on the host.
///
/// A plan made with PlanOptions::stages = K splits every exchange into K stages along the heads.
/// HostPipeline runs them as a three-step pipeline: a packer thread packs stage k+1 and an
/// unpacker thread unpacks stage k-1 while the calling thread exchanges stage k. Results are
/// bit-identical to redistribute(). (The CUDA equivalent orders the same stages on two streams
/// with events; see cuda/pipeline.cuh.)
#pragma once

#include <condition_variable>
#include <exception>
#include <mutex>

#include "../detail/worker.hpp"
#include "../redistribute.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Two persistent worker threads (packer, unpacker) that overlap the stages of a plan with the
/// caller's exchanges. Create one per rank thread and reuse it: redistribute() starts no thread
/// and allocates nothing. Not thread-safe: one redistribute() at a time. Total threads while running: the
/// caller + 2 (+ the executors' own threads, if any; give each executor its own, since the packer
/// and the unpacker call theirs concurrently).
class HostPipeline {
 public:
  HostPipeline() = default;
  HostPipeline(const HostPipeline&) = delete;
  HostPipeline& operator=(const HostPipeline&) = delete;

  /// seq_to_head / head_to_seq (by `dir`) of the plan's tensors with stage k's exchange
  /// overlapping stage k+1's pack and stage k-1's unpack. Arguments as redistribute(); `pack_exec`
  /// and `unpack_exec` run concurrently and must be different objects. It takes the path
  /// redistribute() takes (choose_path() with the pack executor; the unpack executor must run
  /// where the pack executor runs): per stage pack_pieces(), exchange_pieces(), unpack_pieces() on
  /// the message path, pack(), exchange(), unpack() on the all-to-all-v path; the direct path has
  /// nothing to overlap (one copy per element, no exchange) and runs exchange_direct() with
  /// `pack_exec` on the calling thread.
  /// @throws what redistribute() throws; an error in a worker is rethrown here after both workers
  ///         have stopped.
  template <class Comm, class PackExec, class UnpackExec>
  void redistribute(const Plan& plan, Direction dir, Comm& comm, PackExec& pack_exec, UnpackExec& unpack_exec,
                    const TensorList<ConstByteSpan>& in, const TensorList<ByteSpan>& out, Workspace ws) {
    static_assert(executor_traits<PackExec>::runs_on_host == executor_traits<UnpackExec>::runs_on_host,
                  "the pack and unpack executors of a HostPipeline run in the same memory");
    detail::begin_call(comm, detail::call_name(dir), detail::exchange_word(plan, dir, nullptr));
    detail::tell_peers_on_failure(comm, plan.rank(), detail::call_name(dir), [&] { run_stages(plan, dir, comm, pack_exec, unpack_exec, in, out, ws); });
  }

 private:
  /// redistribute() once its failures are told to the peers.
  template <class Comm, class PackExec, class UnpackExec>
  void run_stages(const Plan& plan, Direction dir, Comm& comm, PackExec& pack_exec, UnpackExec& unpack_exec,
                  const TensorList<ConstByteSpan>& in, const TensorList<ByteSpan>& out, Workspace ws) {
    const detail::ExchangePart b = detail::bind_part(plan, dir, comm, pack_exec, in, out, ws);
    const Path path = b.path;
    const BufferTable& t = b.table;
    if constexpr (PathSupport<Comm, PackExec>::direct) {
      if (path == Path::direct) return exchange_direct(plan, dir, comm, pack_exec, t);
    }
    const int K = plan.num_stages();
    {
      std::lock_guard<std::mutex> l(m_);
      packed_ = exchanged_ = 0;
      failed_ = false;
      error_ = nullptr;
    }
    auto pack_job = [&] {  // a worker's error fails the run at once: the other threads stop waiting
      try {
        for (int k = 0; k < K && !stopped(); ++k) {
          const std::vector<BlockCopy>& l = pack_list(plan, dir, path, k);
          pack_exec.run(l.data(), l.size(), t);
          advance(packed_);
        }
      } catch (...) {
        fail(std::current_exception());
      }
    };
    auto unpack_job = [&] {
      try {
        for (int k = 0; k < K; ++k) {
          if (!wait_for(exchanged_, k)) return;
          const std::vector<BlockCopy>& l = unpack_list(plan, dir, path, k);
          unpack_exec.run(l.data(), l.size(), t);
        }
      } catch (...) {
        fail(std::current_exception());
      }
    };
    packer_.start(pack_job);
    unpacker_.start(unpack_job);
    try {
      for (int k = 0; k < K; ++k) {
        if (!wait_for(packed_, k)) break;
        stage_exchange(plan, dir, path, comm, t, k);
        advance(exchanged_);
      }
    } catch (...) {
      fail(std::current_exception());
    }
    packer_.wait();
    unpacker_.wait();
    if (error_) std::rethrow_exception(error_);
  }

  void advance(int& counter) {
    std::lock_guard<std::mutex> l(m_);
    ++counter;
    cv_.notify_all();
  }
  /// Waits until counter > k; false when the run failed meanwhile.
  bool wait_for(const int& counter, int k) {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return counter > k || failed_; });
    return counter > k;
  }
  bool stopped() {
    std::lock_guard<std::mutex> l(m_);
    return failed_;
  }
  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> l(m_);
    if (!error_) error_ = e;
    failed_ = true;
    cv_.notify_all();
  }

  std::mutex m_;
  std::condition_variable cv_;
  int packed_ = 0, exchanged_ = 0;
  bool failed_ = false;
  std::exception_ptr error_;
  detail::Worker packer_, unpacker_;  // last: their threads start after the state above exists
};

ULYSSES_NAMESPACE_END
