// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief NcclWindow: an NCCL symmetric window (ncclMemAlloc + ncclCommWindowRegister with
///        NCCL_WIN_COLL_SYMMETRIC, NCCL >= 2.27) with the registration rules and agreement check
///        of the other windows (comm/window.hpp): the same sizes in the same order on every rank,
///        checked (Error(plan_mismatch)). Exists only where the NCCL headers have the window API
///        (ULYSSES_NCCL_HAS_WINDOWS); the registration is resolved at run time. Teardown never
///        waits on a broken communicator. Notes: docs/headers.md (comm/nccl_window.cuh).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <string>
#include <vector>

#include "../error.hpp"
#include "nccl_comm.cuh"
#include "window.hpp"

/// 1 when the NCCL headers have symmetric windows (ncclCommWindowRegister, NCCL >= 2.27).
#if defined(NCCL_VERSION_CODE) && defined(NCCL_VERSION) && defined(NCCL_WIN_COLL_SYMMETRIC)
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
#define ULYSSES_NCCL_HAS_WINDOWS 1
#endif
#endif
#ifndef ULYSSES_NCCL_HAS_WINDOWS
#define ULYSSES_NCCL_HAS_WINDOWS 0
#endif

#if ULYSSES_NCCL_HAS_WINDOWS
ULYSSES_NAMESPACE_BEGIN

namespace detail {

/// The NCCL calls NcclWindow makes, as a table (NCCL's own: nccl_window_calls(); or a test's
/// fakes). window_register / window_deregister are null when the loaded libnccl has no windows.
struct NcclWindowCalls {
  ncclResult_t (*mem_alloc)(void**, std::size_t);                                    ///< ncclMemAlloc
  ncclResult_t (*mem_free)(void*);                                                   ///< ncclMemFree
  ncclResult_t (*window_register)(ncclComm_t, void*, std::size_t, ncclWindow_t*, int);  ///< ncclCommWindowRegister
  ncclResult_t (*window_deregister)(ncclComm_t, ncclWindow_t);                       ///< ncclCommWindowDeregister
};

/// NCCL's own: the window functions resolved at run time in the loaded libnccl (>= 2.27).
inline const NcclWindowCalls& nccl_window_calls() noexcept {
  static const NcclWindowCalls calls = [] {
    NcclWindowCalls c{};
    c.mem_alloc = &ncclMemAlloc;
    c.mem_free = &ncclMemFree;
    if (nccl_loaded_version() >= 22700) {
      c.window_register = reinterpret_cast<decltype(c.window_register)>(nccl_symbol("ncclCommWindowRegister"));
      c.window_deregister = reinterpret_cast<decltype(c.window_deregister)>(nccl_symbol("ncclCommWindowDeregister"));
    }
    if (!c.window_register || !c.window_deregister) c.window_register = nullptr, c.window_deregister = nullptr;
    return c;
  }();
  return calls;
}

}  // namespace detail

/// An NCCL symmetric window over the ranks of an NcclComm (see the file comment). Not copyable
/// or movable; freed collectively by the destructor.
class NcclWindow {
 public:
  /// Alignment of every registration, in bytes.
  static constexpr std::size_t kAlignment = 256;

  /// Allocates and registers the window. Collective over `comm` (synchronises its stream: call
  /// it outside graph capture); every rank passes the same `bytes_per_rank`.
  /// @param comm           the communicator (not owned; it must outlive the window)
  /// @param bytes_per_rank device bytes of every rank's window (rounded up to
  ///        NCCL_WIN_REQUIRED_ALIGNMENT)
  /// @param calls          the NCCL functions to call (detail::nccl_window_calls(); a test's fakes)
  /// @throws Error(plan_mismatch) ranks passed different sizes (every rank, naming them);
  ///         Error(backend) the loaded libnccl has no windows, ncclMemAlloc or
  ///         ncclCommWindowRegister failed; Error(timeout) a non-blocking registration still in
  ///         progress after comm.timeout() (the communicator is then stopped); NcclComm's errors.
  NcclWindow(NcclComm& comm, std::size_t bytes_per_rank, const detail::NcclWindowCalls& calls = detail::nccl_window_calls())
      : comm_(&comm), calls_(&calls), reg_(detail::round_up<std::size_t>(bytes_per_rank, NCCL_WIN_REQUIRED_ALIGNMENT), kAlignment) {
    if (!calls.window_register)
      throw Error(Errc::backend, "NcclWindow: the loaded libnccl (ncclGetVersion " + std::to_string(detail::nccl_loaded_version()) +
                                     ") has no ncclCommWindowRegister (NCCL >= 2.27): allocate the buffers with cudaMalloc instead");
    std::vector<unsigned long long> all(static_cast<std::size_t>(comm.size()));
    const unsigned long long mine = reg_.bytes();
    comm.allgather(&mine, sizeof mine, all.data());
    const std::string diff = detail::values_differ(all, "bytes_per_rank");
    if (!diff.empty()) detail::fail(Errc::plan_mismatch, "NcclWindow: " + diff + "; every rank must pass the same size");
    ok(calls.mem_alloc(&base_, reg_.bytes() ? reg_.bytes() : NCCL_WIN_REQUIRED_ALIGNMENT), "ncclMemAlloc");
    const ncclResult_t r = calls.window_register(comm.get(), base_, reg_.bytes(), &win_, NCCL_WIN_COLL_SYMMETRIC);
    try {
      comm.complete(r, "ncclCommWindowRegister");  // non-blocking: ncclInProgress waited out; a failure stops comm
    } catch (...) {
      win_ = nullptr;  // not registered: nothing to deregister
      release();       // the comm is broken now: the buffer is freed only where that is safe
      throw;
    }
  }
  NcclWindow(const NcclWindow&) = delete;
  NcclWindow& operator=(const NcclWindow&) = delete;
  /// Healthy communicator: waits for its stream (bounded), deregisters (collective: every rank
  /// destroys its window) and frees. Broken: no collective call; frees or leaks the buffer (file
  /// comment). Errors are ignored.
  ~NcclWindow() { release(); }

  std::size_t bytes_per_rank() const noexcept { return reg_.bytes(); }  ///< device bytes of every rank's window
  ncclWindow_t get() const noexcept { return win_; }                    ///< the NCCL window
  /// This rank's whole window (device memory).
  WindowSpan local() const noexcept { return {static_cast<std::byte*>(base_), reg_.bytes()}; }

  /// Registers the next `bytes` of this rank's window (aligned to kAlignment) and returns them.
  /// Local; every rank must register the same sizes in the same order.
  /// @throws Error(buffer_too_small) the window has fewer bytes left.
  WindowSpan allocate(std::size_t bytes) { return {static_cast<std::byte*>(base_) + reg_.allocate(bytes, comm_->rank(), "NcclWindow"), bytes}; }
  /// Forgets every registration (every rank alike).
  void reset() noexcept { reg_.reset(); }
  /// Number of registrations since construction or reset().
  std::size_t registrations() const noexcept { return static_cast<std::size_t>(reg_.digest().count); }
  /// Compares what every rank registered (NcclComm::allgather of the digests; synchronises the
  /// stream). Collective. @throws Error(plan_mismatch) on every rank when they differ; NcclComm's errors.
  void check_registrations() const {
    std::vector<detail::WindowDigest> all(static_cast<std::size_t>(comm_->size()));
    comm_->allgather(&reg_.digest(), sizeof(detail::WindowDigest), all.data());
    const std::string m = detail::registration_mismatch(all.data(), comm_->size(), "NcclWindow");
    if (!m.empty()) detail::fail(Errc::plan_mismatch, "NcclWindow::check_registrations: " + m);
  }

 private:
  static void ok(ncclResult_t r, const char* what) {
    if (r != ncclSuccess) throw Error(Errc::backend, std::string(what) + " failed: " + ncclGetErrorString(r));
  }
  /// The teardown of the file comment; leaves base_ and win_ null.
  void release() noexcept {
    if (!base_) return;
    void* const base = base_;
    const ncclWindow_t win = win_;
    base_ = nullptr, win_ = nullptr;
    if (!comm_->broken()) {
      try {
        comm_->synchronize();  // no ncclSend / kernel still reads the buffer; a timeout stops comm
        if (win) comm_->complete(calls_->window_deregister(comm_->get(), win), "ncclCommWindowDeregister");
        calls_->mem_free(base);
        return;
      } catch (...) {  // comm is broken now: as below
      }
    }
    if (comm_->handle_freed()) return;  // aborted: leak
    const auto quiet = detail::nccl_wait_in_progress(comm_->calls(), comm_->get(), ncclInProgress, detail::deadline_after(comm_->timeout()));
    if (quiet != ncclInProgress) calls_->mem_free(base);  // revoked and quiescent: no kernel of it runs
  }
  NcclComm* comm_;
  const detail::NcclWindowCalls* calls_;
  detail::WindowRegistry reg_;
  void* base_ = nullptr;
  ncclWindow_t win_ = nullptr;
};

ULYSSES_NAMESPACE_END
#endif
