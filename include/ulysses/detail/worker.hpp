// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief detail::Worker: one persistent thread that runs one job at a time and hands back what
///        it threw. The one worker-thread type of the library: HostPool (host/executor.hpp),
///        HostPipeline's packer and unpacker (host/pipeline.hpp) and the ring rotation's progress
///        thread (ring/rotation.hpp) are made of it. See docs/design.md ("Layers").
#pragma once

#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "../version.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {

/// One persistent thread running one job (a callable owned by the caller) at a time: start()
/// hands it over and returns, wait() waits for it and returns what it threw (finish() rethrows
/// it). The thread starts in the constructor and is joined by the destructor, after the job.
class Worker {
 public:
  /// Starts the thread. @throws std::system_error when it cannot be created.
  Worker() : th_([this] { loop(); }) {}
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  /// Waits for the running job, then stops and joins the thread.
  ~Worker() {
    {
      std::unique_lock<std::mutex> l(m_);
      cv_.wait(l, [&] { return !busy_; });
      quit_ = true;
    }
    cv_.notify_all();
    th_.join();
  }

  /// Runs job() on the worker thread; returns at once. `job` must live until wait().
  /// @pre no job is running (wait() returned since the last start()).
  template <class F>
  void start(F& job) {
    {
      std::lock_guard<std::mutex> l(m_);
      fn_ = [](void* x) { (*static_cast<F*>(x))(); };
      arg_ = &job;
      error_ = nullptr;
      busy_ = true;
    }
    cv_.notify_all();
  }
  /// Waits for the job started last (at once when none runs); returns what it threw, or null.
  std::exception_ptr wait() {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return !busy_; });
    std::exception_ptr e = error_;
    error_ = nullptr;
    return e;
  }
  /// wait(), rethrowing what the job threw.
  void finish() {
    if (std::exception_ptr e = wait()) std::rethrow_exception(e);
  }
  /// finish(), but a job the thread has not taken yet runs here, on the calling thread: what a
  /// caller that has nothing else to do while it waits wants (the ring rotation's finish() right
  /// after its start(): no hand-over to a sleeping thread and back, the cost measured on a loaded
  /// host, docs/ring.md). Rethrows what the job threw.
  void finish_here() {
    std::unique_lock<std::mutex> l(m_);
    if (!busy_ || taken_) {
      l.unlock();
      return finish();
    }
    run_taken(l);
    if (std::exception_ptr e = std::exchange(error_, nullptr)) std::rethrow_exception(e);
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> l(m_);
    for (;;) {
      cv_.wait(l, [&] { return (busy_ && !taken_) || quit_; });
      if (!busy_ || taken_) return;  // quit
      run_taken(l);
    }
  }
  /// Takes the started job and runs it on this thread (`l` held on entry and on return, released
  /// while it runs); its error lands in error_, and the waiters are woken.
  void run_taken(std::unique_lock<std::mutex>& l) {
    taken_ = true;
    l.unlock();
    std::exception_ptr e;
    try {
      fn_(arg_);
    } catch (...) {
      e = std::current_exception();
    }
    l.lock();
    error_ = e;
    busy_ = false;
    taken_ = false;
    cv_.notify_all();
  }

  std::mutex m_;
  std::condition_variable cv_;
  void (*fn_)(void*) = nullptr;
  void* arg_ = nullptr;
  bool busy_ = false, quit_ = false;
  bool taken_ = false;  // the running job's thread has it (the worker's, or finish_here()'s caller)
  std::exception_ptr error_;
  std::thread th_;  // last: the thread starts after the state above exists
};

}  // namespace detail

ULYSSES_NAMESPACE_END
