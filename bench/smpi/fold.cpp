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
// which made a 512-rank run spend most of its wall time in the kernel.
//
// The folded blocks are slots that all ranks share: the k-th slot is one smpi_shared_malloc()
// mapping, at one address, that every rank may hold (a rank holds each slot at most once, so its
// own buffers never overlap, which the library checks). The slots' table lives on the C heap,
// which the ranks' dlopen'ed copies share (their globals are private), found through an
// environment variable (ULYSSES_SMPI_FOLD_SLOTS, set by the first rank that folds). A released
// slot is handed out again to the rank's next folded allocation it is large enough for. So the
// mappings, their page tables and their page faults are paid once for all ranks, not once per rank
// and allocation: at 4096 ranks a mapping per allocation took a page fault per 4 KiB that each
// rank touched (half of a 512-rank run's wall time went to the kernel) and approached
// vm.max_map_count. Slots are never unmapped (SMPI 3.32's local-mode free unmaps an address it did
// not record).
//
// The program's own operator new replaces the global one in the program (each rank's dlopen'ed
// copy has its own, with its own table of the slots it holds); SimGrid's allocations are not affected.
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>

#ifndef SMPI_SHARED_MALLOC
#error "fold.cpp is for SimGrid's SMPI (compile with smpicxx)"
#endif

namespace {

constexpr int kMaxSlots = 256;  // the tool holds about ten folded buffers at once
/// The slots every rank shares (on the C heap: one table for the whole simulation).
struct Slots {
  int n = 0;
  void* block[kMaxSlots];
  std::size_t bytes[kMaxSlots];
};
bool held[kMaxSlots];  // this rank's: which slots it holds now

std::size_t threshold() {
  static const std::size_t t = [] {
    const char* e = std::getenv("ULYSSES_SMPI_FOLD_BYTES");
    return e ? static_cast<std::size_t>(std::strtoull(e, nullptr, 10)) : std::size_t{0};
  }();
  return t;
}

/// The shared table: made by the first rank that asks, then found through the environment.
Slots* slots() {
  static Slots* s = nullptr;
  if (s) return s;
  if (const char* e = std::getenv("ULYSSES_SMPI_FOLD_SLOTS")) {
    s = reinterpret_cast<Slots*>(static_cast<std::uintptr_t>(std::strtoull(e, nullptr, 16)));
    return s;
  }
  void* mem = (std::calloc)(1, sizeof(Slots));
  if (!mem) throw std::bad_alloc();
  s = new (mem) Slots;
  char text[32];
  std::snprintf(text, sizeof text, "%llx", static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(s)));
  setenv("ULYSSES_SMPI_FOLD_SLOTS", text, 1);
  return s;
}

void* allocate(std::size_t n) {
  const std::size_t t = threshold();
  if (t > 0 && n >= t) {
    Slots& s = *slots();
    int pick = -1;  // the smallest slot this rank does not hold that holds n bytes
    for (int i = 0; i < s.n; ++i)
      if (!held[i] && s.bytes[i] >= n && (pick < 0 || s.bytes[i] < s.bytes[pick])) pick = i;
    if (pick < 0 && s.n < kMaxSlots) {
      void* p = smpi_shared_malloc(n, "ulysses_perf folded", 0);  // one key: one segment for all
      if (p) {
        pick = s.n++;
        s.block[pick] = p;
        s.bytes[pick] = n;
      }
    }
    if (pick >= 0) {
      held[pick] = true;
      return s.block[pick];
    }
  }
  void* p = (std::malloc)(n > 0 ? n : 1);
  if (!p) throw std::bad_alloc();
  return p;
}

void release(void* p) noexcept {
  if (!p) return;
  if (threshold() > 0) {
    Slots& s = *slots();
    for (int i = 0; i < s.n; ++i)
      if (held[i] && s.block[i] == p) {
        held[i] = false;  // kept mapped, for the next folded allocation of any rank (see the file comment)
        return;
      }
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
