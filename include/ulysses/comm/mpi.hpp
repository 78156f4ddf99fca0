// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief MpiComm: the communicator concept over the user's MPI_Comm (non-owning).
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
#include "../topology/mesh.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Communicator over an MPI communicator (models the concept of redistribute.hpp).
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

  /// All-to-all-v in bytes (see the communicator concept in redistribute.hpp). Collective.
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

/// What split_by_node() returns: this rank's Ulysses group and outer group as MPI communicators
/// (owned by the caller: free() them), the mesh, this rank's node-first world index, and the node
/// layout of its Ulysses group (for PlanOptions::nodes).
struct MpiMesh {
  MPI_Comm ulysses = MPI_COMM_NULL;  ///< the Ulysses group: P ranks, rank = mesh.ulysses_rank(index)
  MPI_Comm outer = MPI_COMM_NULL;    ///< the ranks holding the same shard in the other groups (W / P ranks)
  Mesh mesh{1, 1, 1};                ///< the layout (world, P, ranks per node)
  int index = 0;                     ///< this rank's position in the node-first numbering (node * R + local rank)
  NodeLayout nodes;                  ///< mesh.nodes(): give it to PlanOptions::nodes
  /// MPI_Comm_free of both communicators (collective over each).
  void free() {
    if (ulysses != MPI_COMM_NULL) MPI_Comm_free(&ulysses);
    if (outer != MPI_COMM_NULL) MPI_Comm_free(&outer);
  }
};

/// Cuts `world` into Ulysses groups of `ulysses_degree` ranks laid out on the nodes: each group is
/// consecutive ranks of the node-first numbering (whole nodes, or a part of one), whatever order
/// the launcher gave the ranks; the outer group joins the ranks of equal rank in group. Nodes are
/// found with MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) and ordered by their lowest world rank;
/// `ranks_per_node` > 0 instead simulates nodes of that many consecutive world ranks (tests, or
/// launchers whose shared-memory domains are not the nodes you mean). Collective over `world`.
/// @throws Error(invalid_mesh) ranks_per_node < 0, nodes of different sizes, or a Mesh that does not
///         fit (see Mesh: e.g. a world that is not whole nodes of ranks_per_node);
///         Error(backend) an MPI call failed. Every rank throws the same (the checks use
///         all-gathered values only).
inline MpiMesh split_by_node(MPI_Comm world, int ulysses_degree, int ranks_per_node = 0) {
  auto check = [](int rc, const char* what) {
    if (rc != MPI_SUCCESS) throw Error(Errc::backend, std::string(what) + " failed");
  };
  int W = 0, w = 0;
  check(MPI_Comm_size(world, &W), "MPI_Comm_size");
  check(MPI_Comm_rank(world, &w), "MPI_Comm_rank");
  if (ranks_per_node < 0)
    detail::fail(Errc::invalid_mesh, "split_by_node: ranks_per_node=" + std::to_string(ranks_per_node) +
                                         " must be >= 0 (0: the shared-memory nodes MPI reports)");
  int mine[3] = {0, 0, 0};  // node id (its lowest world rank), local rank, node size
  if (ranks_per_node > 0) {  // simulated: Mesh checks that they tile the world
    mine[0] = w / ranks_per_node * ranks_per_node;
    mine[1] = w % ranks_per_node;
    mine[2] = ranks_per_node;
  } else {
    MPI_Comm node;
    check(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, w, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    check(MPI_Comm_rank(node, &mine[1]), "MPI_Comm_rank");
    check(MPI_Comm_size(node, &mine[2]), "MPI_Comm_size");
    check(MPI_Allreduce(&w, &mine[0], 1, MPI_INT, MPI_MIN, node), "MPI_Allreduce");
    MPI_Comm_free(&node);
  }
  std::vector<int> all(static_cast<std::size_t>(3 * W));
  check(MPI_Allgather(mine, 3, MPI_INT, all.data(), 3, MPI_INT, world), "MPI_Allgather");
  const int R = all[2];
  std::vector<int> ids;  // node ids, ascending
  for (int p = 0; p < W; ++p) {
    const int* a = &all[static_cast<std::size_t>(3 * p)];
    if (a[2] != R)
      detail::fail(Errc::invalid_mesh, "split_by_node: world rank " + std::to_string(p) + " is on a node of " + std::to_string(a[2]) +
                                           " ranks, rank 0 on one of " + std::to_string(R) + "; a mesh needs nodes of equal size");
    if (std::find(ids.begin(), ids.end(), a[0]) == ids.end()) ids.push_back(a[0]);
  }
  std::sort(ids.begin(), ids.end());
  MpiMesh m;
  m.mesh = Mesh(W, ulysses_degree, R);
  m.index = static_cast<int>(std::lower_bound(ids.begin(), ids.end(), mine[0]) - ids.begin()) * R + mine[1];
  m.nodes = m.mesh.nodes();
  check(MPI_Comm_split(world, m.mesh.ulysses_group(m.index), m.mesh.ulysses_rank(m.index), &m.ulysses), "MPI_Comm_split");
  check(MPI_Comm_split(world, m.mesh.outer_group(m.index), m.mesh.outer_rank(m.index), &m.outer), "MPI_Comm_split");
  return m;
}

ULYSSES_NAMESPACE_END
