// SPDX-License-Identifier: Apache-2.0
// The in-process benchmarks' rank threads (bench_host.cpp, bench_ring.cpp): a LocalGroup of P
// ranks whose threads are created once, so a timed loop creates no thread.
#pragma once

#include <ulysses/comm/local.hpp>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace ub {

/// Runs a job on every rank of a LocalGroup: rank 0 on the calling (benchmark) thread, ranks
/// 1..P-1 on threads created once, so the benchmark loop creates no thread.
class Lockstep {
 public:
  explicit Lockstep(int P) : group_(P) {
    for (int r = 1; r < P; ++r) workers_.emplace_back([this, r] { loop(r); });
  }
  ~Lockstep() {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }
  ulysses::LocalGroup& group() { return group_; }

  /// Runs job(r) on every rank r and returns when all are done; rethrows a rank's exception.
  void step(const std::function<void(int)>& job) {
    {
      std::lock_guard<std::mutex> l(m_);
      job_ = &job;
      pending_ = static_cast<int>(workers_.size());
      ++gen_;
    }
    cv_.notify_all();
    std::exception_ptr mine;
    try {
      job(0);
    } catch (...) {
      mine = std::current_exception();
    }
    std::unique_lock<std::mutex> l(m_);
    done_.wait(l, [&] { return pending_ == 0; });
    if (mine) std::rethrow_exception(mine);
    if (err_) std::rethrow_exception(std::exchange(err_, nullptr));
  }

 private:
  void loop(int r) {
    std::uint64_t seen = 0;
    std::unique_lock<std::mutex> l(m_);
    for (;;) {
      cv_.wait(l, [&] { return stop_ || gen_ != seen; });
      if (stop_) return;
      seen = gen_;
      const auto* job = job_;
      l.unlock();
      std::exception_ptr e;
      try {
        (*job)(r);
      } catch (...) {
        e = std::current_exception();
      }
      l.lock();
      if (e && !err_) err_ = e;
      if (--pending_ == 0) done_.notify_one();
    }
  }

  ulysses::LocalGroup group_;
  std::vector<std::thread> workers_;
  std::mutex m_;
  std::condition_variable cv_, done_;
  const std::function<void(int)>* job_ = nullptr;
  int pending_ = 0;
  std::uint64_t gen_ = 0;
  bool stop_ = false;
  std::exception_ptr err_;
};

/// The process's Lockstep of P ranks (created at the first call).
inline Lockstep& lockstep(int P) {
  static std::map<int, std::unique_ptr<Lockstep>> m;
  auto& p = m[P];
  if (!p) p = std::make_unique<Lockstep>(P);
  return *p;
}

}  // namespace ub
