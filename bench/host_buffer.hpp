// SPDX-License-Identifier: Apache-2.0
// The host memory every benchmark times in (bench_* through Buf in common.hpp, ulysses_perf's
// buffers and its bare all-to-all-v through HugePageAllocator), so that the report and the tool
// time a call on the same kind of pages: aligned to 2 MiB and, unless ULYSSES_BENCH_THP=0,
// madvise(MADV_HUGEPAGE)d, as engines' large tensors often are (THP "always", or PyTorch's
// THP_MEM_ALLOC_ENABLE). With 4 KiB pages, copies of rows scattered one per page (strided views)
// pay a TLB miss per row and the bare memcpy does not, so the two would disagree on the ratio.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <memory>

#include <sys/mman.h>

namespace ub {

/// True unless ULYSSES_BENCH_THP=0: benchmark buffers ask for transparent huge pages.
inline bool use_thp() {
  const char* e = std::getenv("ULYSSES_BENCH_THP");
  return !(e && std::string(e) == "0");
}

/// `bytes` (> 0) of host memory aligned to 2 MiB, rounded up to whole 2 MiB, advised to huge
/// pages unless ULYSSES_BENCH_THP=0; not written. Free with std::free.
/// @throws std::bad_alloc when the allocation fails.
inline void* huge_page_alloc(std::size_t bytes) {
  constexpr std::size_t kAlign = std::size_t{2} << 20;
  const std::size_t rounded = std::max<std::size_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  void* p = std::aligned_alloc(kAlign, rounded);
  if (!p) throw std::bad_alloc();
  if (use_thp()) madvise(p, rounded, MADV_HUGEPAGE);
  return p;
}

/// A std::allocator whose allocations of 2 MiB or more come from huge_page_alloc(), and whose
/// vectors leave new elements default-initialised (not written: the caller writes them, or not).
template <class T>
struct HugePageAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = HugePageAllocator<U>;
  };
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}
  static constexpr std::size_t kHuge = std::size_t{2} << 20;
  T* allocate(std::size_t n) {
    if (n * sizeof(T) >= kHuge) return static_cast<T*>(huge_page_alloc(n * sizeof(T)));
    return std::allocator<T>::allocate(n);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n * sizeof(T) >= kHuge) return std::free(p);
    std::allocator<T>::deallocate(p, n);
  }
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible<U>::value) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
};
template <class T, class U>
bool operator==(const HugePageAllocator<T>&, const HugePageAllocator<U>&) noexcept {
  return true;
}
template <class T, class U>
bool operator!=(const HugePageAllocator<T>&, const HugePageAllocator<U>&) noexcept {
  return false;
}

}  // namespace ub
