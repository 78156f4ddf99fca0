// SPDX-License-Identifier: Apache-2.0
// detail::Worker (detail/worker.hpp): a job runs once, on the worker or, with finish_here(), on the
// caller when the worker has not taken it yet; what it throws comes back; the thread is reused.
#include <doctest/doctest.h>
#include <ulysses/detail/worker.hpp>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

using ulysses::detail::Worker;

namespace {
struct Count {  // a job: counts its runs and remembers the thread of the last
  std::atomic<int> runs{0};
  std::thread::id where;
  bool fail = false;
  void operator()() {
    where = std::this_thread::get_id();
    ++runs;
    if (fail) throw std::runtime_error("job failed");
  }
};
}  // namespace

TEST_CASE("Worker: start then finish runs the job once on the worker thread; the thread is reused") {
  Worker w;
  Count job;
  std::thread::id first;
  for (int i = 0; i < 3; ++i) {
    w.start(job);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // time for the worker to take it
    w.finish();
    CHECK(job.runs == i + 1);
    CHECK((job.where != std::this_thread::get_id()));
    if (i == 0) first = job.where;
    CHECK((job.where == first));
  }
}

TEST_CASE("Worker::finish_here: every job runs exactly once, here or on the worker; errors come back") {
  Worker w;
  Count job;
  int here = 0;
  for (int i = 0; i < 200; ++i) {  // start and finish back to back: most jobs run on the caller
    w.start(job);
    w.finish_here();
    CHECK(job.runs == i + 1);
    here += job.where == std::this_thread::get_id();
  }
  MESSAGE(here << " of 200 jobs ran on the caller");
  job.fail = true;
  w.start(job);
  CHECK_THROWS_AS(w.finish_here(), std::runtime_error);
  w.start(job);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_THROWS_AS(w.finish_here(), std::runtime_error);  // (taken by the worker: waited for, rethrown)
  CHECK(job.runs == 202);
  job.fail = false;
  w.start(job);
  w.finish_here();
  CHECK(job.runs == 203);
}
