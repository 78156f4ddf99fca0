// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief MpiComm: the communicator concept over the user's MPI_Comm (non-owning). Its mesh
///        split (split_by_node(), MpiMesh) is comm/mpi_mesh.hpp; comm/mpi.hpp includes both.
///
/// Needs <mpi.h> (link ulysses::mpi). Buffers may be host memory or, with a CUDA-aware MPI,
/// device memory. Byte counts are std::size_t end to end: MPI's `int` counts are never
/// truncated. When every count and displacement fits the per-message limit the exchange is one
/// MPI_Alltoallv of MPI_BYTE (on every rank of the group, or on none: the ranks agree through an
/// MPI_Allreduce of one int); otherwise each chunk is sent as point-to-point messages of at
/// most `max_message_bytes` (MPI_Isend / MPI_Irecv, one tag, MPI's non-overtaking order keeps
/// the pieces in sequence), so chunks over 2 GiB work with any MPI-3 library. The message-level
/// exchange (one message per (peer, tensor), see redistribute()) is MPI_Isend / MPI_Irecv with
/// the same splitting.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <string>
#include <vector>

#include "../layout/blocks.hpp"
#include "../error.hpp"
#include "exchange_state.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Communicator over an MPI communicator (models the communicator concept of comm/concepts.hpp).
class MpiComm {
 public:
  /// Largest message MPI can describe with an `int` count of MPI_BYTE.
  static constexpr std::size_t kIntMaxBytes = static_cast<std::size_t>(INT_MAX);

  /// Wraps `comm` (not owned, not duplicated: the caller keeps it alive and must not run other
  /// collectives on it concurrently).
  /// @param comm the MPI communicator of the sequence-parallel group (its size is P)
  /// @param max_message_bytes largest single MPI message and displacement, in bytes; 1 ..
  ///        INT_MAX. Tests lower it to exercise the splitting path with small buffers. Every rank
  ///        of the group must pass the same value (both sides of a pair cut messages by it).
  /// @throws Error(backend) when MPI_Comm_size / MPI_Comm_rank fail;
  ///         Error(invalid_shape) max_message_bytes out of range.
  explicit MpiComm(MPI_Comm comm, std::size_t max_message_bytes = kIntMaxBytes)
      : comm_(comm), max_msg_(max_message_bytes) {
    if (max_message_bytes < 1 || max_message_bytes > kIntMaxBytes)
      throw Error(Errc::invalid_shape, "max_message_bytes=" + std::to_string(max_message_bytes) + " must be in [1, INT_MAX]");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    const auto n = static_cast<std::size_t>(size_);
    sc_.resize(n);
    sd_.resize(n);
    rc_.resize(n);
    rd_.resize(n);
  }

  int size() const { return size_; }    ///< MPI_Comm_size
  int rank() const { return rank_; }    ///< MPI_Comm_rank
  MPI_Comm get() const { return comm_; }  ///< the wrapped communicator
  std::size_t max_message_bytes() const { return max_msg_; }

  /// All-to-all-v in bytes (see the communicator concept in comm/concepts.hpp). Collective.
  /// @throws Error(backend) with MPI's error string when a call fails (only if the communicator's
  ///         error handler returns errors; MPI's default aborts the job).
  void alltoallv(const std::byte* send, const std::size_t* send_bytes, const std::size_t* send_offsets, std::byte* recv,
                 const std::size_t* recv_bytes, const std::size_t* recv_offsets) {
    // MPI_Alltoallv takes int counts and displacements. Whether they fit differs between ranks
    // (offsets grow with the rank), so the ranks agree on the path first: one tiny allreduce.
    int fits = 1;
    for (int p = 0; p < size_; ++p)
      fits = fits && send_bytes[p] <= max_msg_ && send_offsets[p] <= max_msg_ && recv_bytes[p] <= max_msg_ &&
             recv_offsets[p] <= max_msg_;
    if (size_ > 1) check(MPI_Allreduce(MPI_IN_PLACE, &fits, 1, MPI_INT, MPI_LAND, comm_), "MPI_Allreduce");
    if (fits) {
      for (std::size_t p = 0; p < sc_.size(); ++p) {
        sc_[p] = static_cast<int>(send_bytes[p]);
        sd_[p] = static_cast<int>(send_offsets[p]);
        rc_[p] = static_cast<int>(recv_bytes[p]);
        rd_[p] = static_cast<int>(recv_offsets[p]);
      }
      check(MPI_Alltoallv(send, sc_.data(), sd_.data(), MPI_BYTE, recv, rc_.data(), rd_.data(), MPI_BYTE, comm_),
            "MPI_Alltoallv");
      return;
    }
    // Split path: every chunk as messages of at most max_msg_ bytes. Receives first.
    reqs_.clear();
    for (int p = 0; p < size_; ++p) post(false, recv + recv_offsets[p], recv_bytes[p], p);
    for (int p = 0; p < size_; ++p) post(true, const_cast<std::byte*>(send) + send_offsets[p], send_bytes[p], p);
    check(MPI_Waitall(static_cast<int>(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  }

  /// Message-level exchange (the optional member of the communicator concept in
  /// redistribute.hpp): MPI_Irecv for every message of `recv`, MPI_Isend for every message of
  /// `send`, one MPI_Waitall. A message over max_message_bytes() goes as several MPI messages of
  /// at most that size (both sides cut it the same way; MPI's non-overtaking order between a pair
  /// of ranks keeps the k-th message of each side matched). Collective over the group in effect:
  /// every rank with messages for this one must call it too.
  /// @throws Error(backend) as alltoallv().
  void exchange_messages(const Message* send, std::size_t n_send, const Message* recv, std::size_t n_recv) {
    reqs_.clear();
    for (std::size_t i = 0; i < n_recv; ++i) post(false, recv[i].data, recv[i].bytes, recv[i].peer);
    for (std::size_t i = 0; i < n_send; ++i) post(true, send[i].data, send[i].bytes, send[i].peer);
    check(MPI_Waitall(static_cast<int>(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  }

  /// All-gather of `bytes` bytes (at most INT_MAX) from every rank into recv (rank order).
  /// Used for the cross-rank plan check. @throws Error(backend).
  void allgather(const void* send, std::size_t bytes, void* recv) {
    if (bytes > kIntMaxBytes) throw Error(Errc::size_overflow, "allgather of " + std::to_string(bytes) + " bytes");
    check(MPI_Allgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE, comm_),
          "MPI_Allgather");
  }

  /// What the transports learn on this communicator about the plans run on it, and their
  /// scratch lists (comm/exchange_state.hpp).
  ExchangeState& exchange_state() noexcept { return state_; }

 private:
  ExchangeState state_;  // see exchange_state()
  static constexpr int kTag = 0x75a;  // "ulysses"

  /// Posts `bytes` at `base` to / from `peer` as MPI messages of at most max_msg_ bytes.
  void post(bool is_send, std::byte* base, std::size_t bytes, int peer) {
    for (std::size_t done = 0; done < bytes;) {
      const int n = static_cast<int>(std::min(max_msg_, bytes - done));
      MPI_Request r;
      if (is_send)
        check(MPI_Isend(base + done, n, MPI_BYTE, peer, kTag, comm_, &r), "MPI_Isend");
      else
        check(MPI_Irecv(base + done, n, MPI_BYTE, peer, kTag, comm_, &r), "MPI_Irecv");
      reqs_.push_back(r);
      done += static_cast<std::size_t>(n);
    }
  }
  static void check(int rc, const char* what) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw Error(Errc::backend, std::string(what) + " failed: " + std::string(msg, static_cast<std::size_t>(len)));
  }
  MPI_Comm comm_;
  std::size_t max_msg_;
  int size_ = 0, rank_ = 0;
  std::vector<int> sc_, sd_, rc_, rd_;  // int counts for MPI_Alltoallv, sized once
  std::vector<MPI_Request> reqs_;       // split path and message-level exchange
};

ULYSSES_NAMESPACE_END
