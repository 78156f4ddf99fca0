// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The point-to-point messages of one MpiComm call in flight (comm/mpi_comm.hpp): their
///        requests and peers, which are still incomplete, and how a call that gives up cancels
///        them (docs/design.md, "Failure model").
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "../version.hpp"
#include "failure.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {

/// The requests of a call's messages: receives [0, n_recv), then sends, and the peer of each.
struct MpiRequests {
  std::vector<MPI_Request> reqs;
  std::vector<int> peers;
  std::vector<int> bytes;              // each message's posted size
  std::vector<MPI_Status> statuses;    // the completed ones' (wait's scratch)
  std::size_t n_recv = 0;

  /// Adds a posted message's request (`n` bytes).
  void add(MPI_Request r, int peer, bool is_send, int n) {
    reqs.push_back(r);
    peers.push_back(peer);
    bytes.push_back(n);
    if (!is_send) n_recv = reqs.size();
  }
  /// Forgets every request (after they completed, or were cancelled or freed).
  void clear() noexcept {
    reqs.clear();
    peers.clear();
    bytes.clear();
    n_recv = 0;
  }
  /// After the receives completed into `statuses`: "" when each received the bytes it was posted
  /// for, else what differs ("rank 2 sent 4096 bytes where rank 0 receives 8192"), the first one.
  std::string short_receive(int rank) {
    for (std::size_t i = 0; i < n_recv && i < statuses.size(); ++i) {
      int got = 0;
      MPI_Get_count(&statuses[i], MPI_BYTE, &got);
      if (got != bytes[i])
        return "rank " + std::to_string(peers[i]) + " sent " + std::to_string(got) + " bytes where rank " + std::to_string(rank) +
               " receives " + std::to_string(bytes[i]);
    }
    return "";
  }
  /// The peers of the requests [begin, end) still incomplete, ascending, each once. Asks by
  /// MPI_Request_get_status, which leaves a completed request to the wait: MPI_Test would free it
  /// and drop its status, and the wait's MPI_Testall would then read an empty status (0 bytes) for
  /// it, a false short_receive() (this happened on a 200 Mbit/s link, where a call outlasts the
  /// call probe's grace, which asks this while the call waits).
  std::vector<int> incomplete(std::size_t begin, std::size_t end) {
    std::vector<int> late;
    for (std::size_t i = begin; i < end; ++i) {
      int done = 0;
      if (reqs[i] != MPI_REQUEST_NULL) MPI_Request_get_status(reqs[i], &done, MPI_STATUS_IGNORE);
      if (reqs[i] != MPI_REQUEST_NULL && !done) late.push_back(peers[i]);
    }
    std::sort(late.begin(), late.end());
    late.erase(std::unique(late.begin(), late.end()), late.end());
    return late;
  }
  /// Cancels the pending receives (waiting for the cancellations at most `timeout`, then
  /// freeing those still pending), frees the pending sends, and forgets them all: MPI writes
  /// nothing into the receive buffers afterwards.
  void cancel(std::chrono::milliseconds timeout) {
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      if (reqs[i] == MPI_REQUEST_NULL) continue;
      if (i < n_recv)
        MPI_Cancel(&reqs[i]);
      else
        MPI_Request_free(&reqs[i]);  // sends cannot be cancelled reliably; MPI may still read them
    }
    const auto cancelled = deadline_after(timeout);
    const bool quiet = poll_until(cancelled, [&] {
      int done = 0;
      MPI_Testall(static_cast<int>(n_recv), reqs.data(), &done, MPI_STATUSES_IGNORE);
      return done != 0;
    });
    for (std::size_t i = 0; !quiet && i < n_recv; ++i)
      if (reqs[i] != MPI_REQUEST_NULL) MPI_Request_free(&reqs[i]);
    clear();
  }
};

}  // namespace detail

ULYSSES_NAMESPACE_END
