// SPDX-License-Identifier: Apache-2.0
// The ways an MPI test runs one call (test_transform_mpi, test_allgather_mpi): over MpiComm on the
// message or the all-to-all-v path, or over MpiWindowComm on the direct path with the tensors in
// the window, partly, or outside it (Cross Memory Attach or staged); the group's communicators,
// the storage of one call's tensors, and run_via().
#pragma once

#include <doctest/doctest.h>
#include <mpi.h>
#include <ulysses/comm/mpi.hpp>
#include <ulysses/plan/spec.hpp>

#include <cstddef>
#include <exception>
#include <string>
#include <vector>

namespace ut {
using ulysses::MpiComm;
using ulysses::MpiWindow;
using ulysses::MpiWindowComm;
using ulysses::Path;
using ulysses::WindowSpan;

/// How a call runs: over MpiComm on the message or the all-to-all-v path, or over MpiWindowComm
/// on the direct path (the peer copy) with the tensors placed: every one in the window; the
/// inputs in it, the outputs outside; the inputs outside, the outputs in it; every one outside
/// (read in place with Cross Memory Attach where the window's probe allows it, else staged);
/// every one outside, staged (Cross Memory Attach off); rank 0's inputs in the window and its
/// peers' outside (read in place, some from shared memory, some with Cross Memory Attach); every
/// one outside, rank 0 staging its inputs and its peers publishing theirs for Cross Memory Attach.
enum class Via { messages, alltoallv, window, inputs_in_window, outputs_in_window, outside, staged, mixed_inputs, mixed_staging };
constexpr Via kVias[] = {Via::messages,          Via::alltoallv, Via::window, Via::inputs_in_window, Via::outputs_in_window,
                         Via::outside,           Via::staged,    Via::mixed_inputs, Via::mixed_staging};

inline const char* name_of(Via v) {
  switch (v) {
    case Via::messages: return "MpiComm, messages";
    case Via::alltoallv: return "MpiComm, alltoallv";
    case Via::window: return "MpiWindowComm, direct, inputs and outputs in the window";
    case Via::inputs_in_window: return "MpiWindowComm, direct, inputs in the window, outputs outside";
    case Via::outputs_in_window: return "MpiWindowComm, direct, inputs outside the window, outputs in it";
    case Via::outside: return "MpiWindowComm, direct, every tensor outside the window (Cross Memory Attach)";
    case Via::staged: return "MpiWindowComm, direct, every tensor outside the window, staged";
    case Via::mixed_inputs: return "MpiWindowComm, direct, rank 0's inputs in the window, the others' outside (Cross Memory Attach)";
    case Via::mixed_staging: return "MpiWindowComm, direct, every tensor outside the window, rank 0 staging, the others Cross Memory Attach";
  }
  return "?";
}
inline bool on_window(Via v) { return v != Via::messages && v != Via::alltoallv; }
/// Whether every rank's inputs lie in the window.
inline bool inputs_in(Via v) { return v == Via::window || v == Via::inputs_in_window; }
/// Whether rank r's inputs lie in the window.
inline bool inputs_in(Via v, int r) { return inputs_in(v) || (v == Via::mixed_inputs && r == 0); }
inline bool outputs_in(Via v) { return v == Via::window || v == Via::outputs_in_window; }

/// One group's communicators: an MpiComm, and an MpiWindowComm over a window of kWindow bytes per
/// rank, the first kArena of them one registration (the same on every rank) that the test hands
/// out in bumps (reset for every call), the rest free for staging.
constexpr std::size_t kArena = std::size_t{1} << 20, kWindow = 2 * kArena;
struct Comms {
  MpiComm comm;
  MpiWindow win;
  WindowSpan arena;
  MpiWindowComm wc;
  std::size_t used = 0;
  explicit Comms(MPI_Comm sub) : comm(sub), win(comm, kWindow), arena(win.allocate(kArena)), wc(comm, win) {}
  int rank() const { return comm.rank(); }
  int size() const { return comm.size(); }
};

/// The storage of one call's tensors on this rank: private vectors, or bumps of the group's arena.
struct Store {
  Comms& g;
  std::vector<std::vector<double>> own;  // (double: aligned for every element type)
  explicit Store(Comms& grp) : g(grp) { g.used = 0; }
  template <class T>
  T* take(std::size_t n, bool in_window) {
    const std::size_t bytes = n * sizeof(T);
    if (!in_window) {
      own.emplace_back(bytes / sizeof(double) + 1);
      return reinterpret_cast<T*>(own.back().data());
    }
    const std::size_t off = (g.used + 63) / 64 * 64;
    REQUIRE(off + bytes <= g.arena.size());
    g.used = off + bytes;
    return reinterpret_cast<T*>(g.arena.data() + off);
  }
};

/// Runs `call(comm, plan options' path)` the way `via` says, then checks what the window
/// communicator says of the copies it made. Returns this rank's error message ("" when none).
template <class F>
std::string run_via(Comms& g, Via via, F&& call) {
  try {
    if (!on_window(via)) {
      call(g.comm, via == Via::messages ? Path::messages : Path::alltoallv);
      return "";
    }
    g.wc.set_cross_memory_attach(!(via == Via::staged || (via == Via::mixed_staging && g.rank() == 0)));
    g.wc.set_cross_memory_min_range(0);  // the rows are short: read them in place anyway
    call(g.wc, Path::direct);
    g.wc.set_cross_memory_attach(true);
  } catch (const std::exception& e) {
    g.wc.set_cross_memory_attach(true);
    return std::string("threw: ") + e.what();
  }
  return "";
}

}  // namespace ut
