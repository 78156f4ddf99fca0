// SPDX-License-Identifier: Apache-2.0
// Memory folding for ulysses_perf under SimGrid's SMPI (linked into the smpicxx build only, by
// bench/smpi/smpi.sh build): with ULYSSES_SMPI_FOLD_BYTES=N in the environment, every C++ allocation
// of N bytes or more (the tool's tensors, wire buffers and workspaces: std::vector) comes from
// SMPI_SHARED_MALLOC, which maps every such block onto the same smpi/shared-malloc-blocksize bytes
// of memory, for every rank. Thousands of simulated ranks then fit on one machine; the data is
// garbage (ranks overwrite each other), so only timings mean anything: run with -c 0. Unset or 0:
// nothing is folded (plain operator new).
//
// The program's own operator new replaces the global one in the program (each rank's dlopen'ed
// copy has its own, with its own table below); SimGrid's allocations are not affected.
#include <mpi.h>

#include <cstddef>
#include <cstdlib>
#include <new>

#ifndef SMPI_SHARED_MALLOC
#error "fold.cpp is for SimGrid's SMPI (compile with smpicxx)"
#endif

namespace {

constexpr int kMaxFolded = 1 << 14;  // live folded blocks at most (the tool holds a handful)
void* folded[kMaxFolded];            // no allocation in here: a plain table
int n_folded = 0;

std::size_t threshold() {
  static const std::size_t t = [] {
    const char* e = std::getenv("ULYSSES_SMPI_FOLD_BYTES");
    return e ? static_cast<std::size_t>(std::strtoull(e, nullptr, 10)) : std::size_t{0};
  }();
  return t;
}

void* allocate(std::size_t n) {
  const std::size_t t = threshold();
  if (t > 0 && n >= t && n_folded < kMaxFolded) {
    void* p = SMPI_SHARED_MALLOC(n);
    if (p) {
      folded[n_folded++] = p;
      return p;
    }
  }
  void* p = (std::malloc)(n > 0 ? n : 1);
  if (!p) throw std::bad_alloc();
  return p;
}

void release(void* p) noexcept {
  if (!p) return;
  for (int i = n_folded - 1; i >= 0; --i)
    if (folded[i] == p) {
      folded[i] = folded[--n_folded];
      SMPI_SHARED_FREE(p);
      return;
    }
  (std::free)(p);
}

}  // namespace

void* operator new(std::size_t n) { return allocate(n); }
void* operator new[](std::size_t n) { return allocate(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return allocate(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void operator delete(void* p) noexcept { release(p); }
void operator delete[](void* p) noexcept { release(p); }
void operator delete(void* p, std::size_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t) noexcept { release(p); }
