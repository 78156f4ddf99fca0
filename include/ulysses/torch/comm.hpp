// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief ProcessGroupComm: the communicator concept (transport.hpp) over a c10d::ProcessGroup
///        whose backend moves CPU tensors (Gloo, MPI), part of the libtorch client (target
///        ulysses::torch; torch/torch.hpp includes the whole client).
///
/// All-to-all-v goes through `alltoall_base` with byte split sizes, the agreement check's
/// all-gather through `allgather`; host memory. Requires libtorch (CMake: find_package(Torch);
/// Debian: libtorch-dev, and libgloo-dev for ProcessGroupGloo).
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "../comm/exchange_state.hpp"
#include "../error.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Communicator over a c10d::ProcessGroup of CPU tensors (Gloo, MPI), modelling the concept of
/// transport.hpp with alltoallv() and allgather() (so Path::alltoallv). Collective calls are
/// blocking (`work->wait()`), on the process group's own threads. The process group must outlive
/// the communicator; every rank of the group calls in the same order.
class ProcessGroupComm {
 public:
  /// Wraps `pg` (shared, not copied). @throws Error(invalid_group) a null process group.
  explicit ProcessGroupComm(c10::intrusive_ptr<c10d::ProcessGroup> pg) : pg_(std::move(pg)) {
    if (!pg_) detail::fail(Errc::invalid_group, "ProcessGroupComm needs a process group");
  }
  int size() const { return pg_->getSize(); }  ///< P
  int rank() const { return pg_->getRank(); }  ///< this rank

  /// All-to-all-v in bytes (transport.hpp). One `alltoall_base` over uint8 views of the buffers
  /// when the chunks lie back to back in peer order (the plan's always do); otherwise through
  /// contiguous copies. @throws Error(backend) with the process group's message.
  void alltoallv(const std::byte* send, const std::size_t* send_bytes, const std::size_t* send_offsets, std::byte* recv,
                 const std::size_t* recv_bytes, const std::size_t* recv_offsets) {
    const auto P = static_cast<std::size_t>(size());
    std::vector<std::int64_t> ss(P), rs(P);
    std::size_t st = 0, rt = 0;
    bool packed = true;
    for (std::size_t p = 0; p < P; ++p) {
      packed = packed && send_offsets[p] == send_offsets[0] + st && recv_offsets[p] == recv_offsets[0] + rt;
      ss[p] = static_cast<std::int64_t>(send_bytes[p]);
      rs[p] = static_cast<std::int64_t>(recv_bytes[p]);
      st += send_bytes[p];
      rt += recv_bytes[p];
    }
    auto bytes = [](void* p, std::size_t n) {
      return torch::from_blob(p, {static_cast<std::int64_t>(n)}, torch::TensorOptions().dtype(torch::kUInt8));
    };
    if (packed) {
      at::Tensor in = bytes(const_cast<std::byte*>(send + send_offsets[0]), st), out = bytes(recv + recv_offsets[0], rt);
      wait_work("alltoall_base", [&] { return pg_->alltoall_base(out, in, rs, ss); });
      return;
    }
    std::vector<std::byte> s(st), r(rt);
    std::size_t o = 0;
    for (std::size_t p = 0; p < P; o += send_bytes[p], ++p)
      if (send_bytes[p]) std::memcpy(s.data() + o, send + send_offsets[p], send_bytes[p]);
    at::Tensor in = bytes(s.data(), st), out = bytes(r.data(), rt);
    wait_work("alltoall_base", [&] { return pg_->alltoall_base(out, in, rs, ss); });
    o = 0;
    for (std::size_t p = 0; p < P; o += recv_bytes[p], ++p)
      if (recv_bytes[p]) std::memcpy(recv + recv_offsets[p], r.data() + o, recv_bytes[p]);
  }

  /// All-gather of `bytes` bytes per rank into recv (rank p's at recv + p * bytes): the agreement
  /// check's collective. @throws Error(backend) with the process group's message.
  void allgather(const void* send, std::size_t bytes, void* recv) {
    const auto n = static_cast<std::int64_t>(bytes);
    const auto u8 = torch::TensorOptions().dtype(torch::kUInt8);
    std::vector<at::Tensor> in{torch::from_blob(const_cast<void*>(send), {n}, u8).clone()};
    std::vector<std::vector<at::Tensor>> out(1);
    for (int p = 0; p < size(); ++p) out[0].push_back(torch::empty({n}, u8));
    wait_work("allgather", [&] { return pg_->allgather(out, in); });
    for (std::size_t p = 0; p < out[0].size(); ++p)
      std::memcpy(static_cast<std::byte*>(recv) + p * bytes, out[0][p].data_ptr(), bytes);
  }

  /// The process group.
  const c10::intrusive_ptr<c10d::ProcessGroup>& process_group() const { return pg_; }

  /// What the transports learn on this communicator about the plans run on it, and their
  /// scratch lists (comm/exchange_state.hpp).
  ExchangeState& exchange_state() noexcept { return state_; }

 private:
  ExchangeState state_;  // see exchange_state()
  /// Starts a c10d collective (f() returns its Work) and waits for it; a c10d failure becomes
  /// Error(backend) naming `what` and the backend.
  template <class F>
  void wait_work(const char* what, F&& f) {
    try {
      f()->wait();
    } catch (const std::exception& e) {
      detail::fail(Errc::backend, std::string("c10d ") + what + " on " + pg_->getBackendName() + ": " + e.what());
    }
  }
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
};

ULYSSES_NAMESPACE_END
