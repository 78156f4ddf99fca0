// SPDX-License-Identifier: Apache-2.0
// Cross Memory Attach's cost per range (comm/cross_memory.hpp): 48 MiB written into another
// process (a forked child, process_vm_writev) from rows of `seg` bytes that lie `4 seg` apart in
// this process (a rank's head slice of its token rows, as seq->head pushes them), to one
// contiguous range there. Variants, same bytes:
//   ranges      one local range a row, 1024 a call (the kernel's iovec limit), nothing packed
//   reader      detail::CrossMemoryReader, what the peer copy uses: rows under kPackBelow bytes
//               are packed into its buffer first (one local range a call), longer ones as ranges
//   contiguous  the same bytes from one contiguous local range, 4 MiB a call (what MPI's
//               single-copy transport does for one message): the floor
// Linux only (elsewhere every benchmark is skipped, saying so).
//
// Run: bench_cross_memory [--benchmark_min_time=0.2]
#include <benchmark/benchmark.h>

#include <ulysses/comm/cross_memory.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "host_buffer.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#endif

namespace {
using namespace ulysses;
constexpr std::size_t kTotal = std::size_t{48} << 20;

std::int64_t g_child = 0;   // the process written into
std::byte* g_remote = nullptr;  // kTotal bytes mapped before the fork: the same address in the child

enum class Variant { ranges, reader, contiguous };

void bm(benchmark::State& st, Variant v) {
  if (!detail::kCrossMemoryAttach || g_child <= 0) {
    st.SkipWithError("no Cross Memory Attach here (Linux only), or no child process (mmap, pipe or fork failed)");
    return;
  }
  const auto seg = static_cast<std::size_t>(st.range(0)), stride = 4 * seg, n = kTotal / seg;
  std::vector<std::byte, ub::HugePageAllocator<std::byte>> local(kTotal * 4, std::byte{2});
  const auto remote = reinterpret_cast<std::uintptr_t>(g_remote);
  std::vector<detail::IoRange> l(detail::CrossMemoryReader::kMaxRanges);
  detail::CrossMemoryReader reader;
  for (auto _ : st) {
    switch (v) {
      case Variant::ranges:
        for (std::size_t i = 0; i < n;) {
          const std::size_t k = std::min(l.size(), n - i);
          for (std::size_t j = 0; j < k; ++j) l[j] = {local.data() + (i + j) * stride, seg};
          detail::IoRange r{g_remote + i * seg, k * seg};
          if (detail::transfer_process_memory(g_child, l.data(), k, &r, 1, k * seg, true)) {
            st.SkipWithError("process_vm_writev failed");
            return;
          }
          i += k;
        }
        break;
      case Variant::reader:
        reader.begin(g_child, 1, true);
        for (std::size_t i = 0; i < n; ++i) reader.add(local.data() + i * stride, remote + i * seg, seg);
        reader.flush();
        break;
      case Variant::contiguous:
        for (std::size_t off = 0; off < kTotal; off += std::size_t{4} << 20) {
          detail::IoRange lv{local.data() + off, std::size_t{4} << 20}, r{g_remote + off, std::size_t{4} << 20};
          if (detail::transfer_process_memory(g_child, &lv, 1, &r, 1, lv.iov_len, true)) {
            st.SkipWithError("process_vm_writev failed");
            return;
          }
        }
        break;
    }
  }
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations() * kTotal));
  st.counters["packed_per_call"] = static_cast<double>(reader.bytes_packed()) / static_cast<double>(std::max<std::int64_t>(1, st.iterations()));
}
}  // namespace

int main(int argc, char** argv) {
#if defined(__linux__)
  void* m = ::mmap(nullptr, kTotal, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m != MAP_FAILED) {
    g_remote = static_cast<std::byte*>(m);
    std::memset(g_remote, 1, kTotal);  // mapped in both processes after the fork
  }
  int pipe_fd[2] = {-1, -1};
  if (g_remote && ::pipe(pipe_fd) == 0) {
    const pid_t child = ::fork();
    if (child == 0) {  // waits until the parent closes the pipe
      ::close(pipe_fd[1]);
      char c;
      while (::read(pipe_fd[0], &c, 1) > 0) {
      }
      ::_exit(0);
    }
    ::close(pipe_fd[0]);
    if (child > 0) g_child = child;
  }
#endif
  for (const auto& [v, name] : {std::pair{Variant::ranges, "ranges"}, {Variant::reader, "reader"}, {Variant::contiguous, "contiguous"}})
    benchmark::RegisterBenchmark((std::string("cross_memory_write/") + name).c_str(), [v = v](benchmark::State& st) { bm(st, v); })
        ->Arg(512)->Arg(1024)->Arg(2048)->Arg(8192)->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
#if defined(__linux__)
  if (g_child > 0) {
    ::close(pipe_fd[1]);
    ::waitpid(static_cast<pid_t>(g_child), nullptr, 0);
  }
#endif
  return 0;
}
