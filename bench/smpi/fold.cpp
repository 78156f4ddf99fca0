// SPDX-License-Identifier: Apache-2.0
// Memory folding for ulysses_perf under SimGrid's SMPI (linked into the smpicxx build only, by
// bench/smpi/smpi.sh build): with ULYSSES_SMPI_FOLD_BYTES=N in the environment, every C++ allocation
// of N bytes or more (the tool's tensors, wire buffers and workspaces: std::vector) comes from
// smpi_shared_malloc(), and all of them, on every rank, share the same memory. Thousands of
// simulated ranks then fit on one machine, and SMPI does not copy shared bytes between ranks; the
// data is garbage (ranks overwrite each other), so only timings mean anything: run with -c 0.
// Unset or 0: nothing is folded (plain operator new).
//
// smpi.sh selects smpi/shared-malloc:local: one POSIX shared-memory segment (/dev/shm, grown to the
// largest folded allocation) for this file's one call site. The default mode, global, maps every
// allocation onto a file that SMPI creates in /tmp; where /tmp is a disk file system (ext4 here),
// every written page of every rank goes through the file system's write fault and its writeback,
// which made a 512-rank run spend most of its wall time in the kernel. Folded blocks are never
// given back (SMPI 3.32's local-mode free unmaps an address it did not record): they stay mapped
// onto the one segment, which costs address space and page tables, not memory; a released one is
// handed out again to the next folded allocation it is large enough for (the sweep's next step or
// size), so a rank maps about as many blocks as it holds at once, and pages it touched once do not
// fault again (at 4096 ranks a fresh mapping per allocation cost a page fault per 4 KiB touched,
// and the mappings approached vm.max_map_count).
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

constexpr int kMaxFolded = 1 << 14;  // folded blocks at most (the tool makes about ten per size and direction)
void* folded[kMaxFolded];            // no allocation in here: plain tables
std::size_t folded_bytes[kMaxFolded];  // each block's size
bool folded_free[kMaxFolded];          // released, ready to be handed out again
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
  if (t > 0 && n >= t) {
    int reuse = -1;  // the smallest released block that holds n bytes
    for (int i = 0; i < n_folded; ++i)
      if (folded_free[i] && folded_bytes[i] >= n && (reuse < 0 || folded_bytes[i] < folded_bytes[reuse])) reuse = i;
    if (reuse >= 0) {
      folded_free[reuse] = false;
      return folded[reuse];
    }
    void* p = n_folded < kMaxFolded ? smpi_shared_malloc(n, "ulysses_perf folded", 0) : nullptr;  // one key: one segment for all
    if (p) {
      folded[n_folded] = p;
      folded_bytes[n_folded] = n;
      folded_free[n_folded++] = false;
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
      folded_free[i] = true;  // kept mapped, for the next folded allocation (see the file comment)
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
