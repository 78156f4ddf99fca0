// SPDX-License-Identifier: Apache-2.0
// Small collectives over any communicator with allgather() (host memory), for the timing of the
// demo and ulysses_perf: a barrier, reductions of one value, and the bare all-to-all-v they time
// the exchanges against.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace ulysses_group {

/// Every rank waits for every other (a one-byte all-gather).
template <class Comm>
void barrier(Comm& comm) {
  std::vector<char> all(static_cast<std::size_t>(comm.size()));
  const char mine = 0;
  comm.allgather(&mine, 1, all.data());
}

/// The largest of the ranks' `x`.
template <class Comm, class T>
T max_over_ranks(Comm& comm, T x) {
  std::vector<T> all(static_cast<std::size_t>(comm.size()));
  comm.allgather(&x, sizeof x, all.data());
  return *std::max_element(all.begin(), all.end());
}

/// The sum of the ranks' `x`.
template <class Comm, class T>
T sum_over_ranks(Comm& comm, T x) {
  std::vector<T> all(static_cast<std::size_t>(comm.size()));
  comm.allgather(&x, sizeof x, all.data());
  T s{};
  for (const T& v : all) s += v;
  return s;
}

/// The bare all-to-all-v of `bytes` bytes per rank between contiguous buffers: P equal chunks, the
/// rank's own included, as MPI_Alltoall and nccl-tests count an all-to-all. `bytes` must be the
/// same on every rank (take the largest under uneven splits). Buffer: a vector of std::byte (its
/// allocator decides the memory; both buffers are written at construction, so every page is mapped).
template <class Buffer = std::vector<std::byte>>
class BareAlltoall {
 public:
  BareAlltoall(int P, std::size_t bytes)
      : chunk_(bytes / static_cast<std::size_t>(P)), send_(chunk_ * static_cast<std::size_t>(P), std::byte{1}),
        recv_(send_.size(), std::byte{0}), counts_(static_cast<std::size_t>(P), chunk_), offsets_(static_cast<std::size_t>(P)) {
    for (std::size_t p = 0; p < offsets_.size(); ++p) offsets_[p] = p * chunk_;
  }
  /// One all-to-all-v. Collective.
  template <class Comm>
  void run(Comm& comm) {
    comm.alltoallv(send_.data(), counts_.data(), offsets_.data(), recv_.data(), counts_.data(), offsets_.data());
  }

 private:
  std::size_t chunk_;
  Buffer send_, recv_;
  std::vector<std::size_t> counts_, offsets_;
};

}  // namespace ulysses_group
