// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Cross Memory Attach: reading and writing another process's memory in one copy (Linux
///        `process_vm_readv` / `process_vm_writev`), for the peer copy between processes when an
///        input lies outside the registered window (MpiWindowComm, comm/mpi_window.hpp): a block
///        copy as iovec ranges (merged where contiguous, up to IOV_MAX per call), the side with the
///        longer runs made the remote one (the reader pulls, or the owner pushes:
///        pushed_by_owner()), the permission probe (cross_memory_readable()), and the mechanism's
///        own record and scratch (CrossMemoryRecord, RemoteReadScratch). Why, when, and what a
///        range costs: docs/guide.md (One copy between the MPI processes of a node).
///        Notes: docs/headers.md (comm/cross_memory.hpp).
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>
#endif

#include "../error.hpp"
#include "../layout/blocks.hpp"
#include "../layout/rows.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {

/// Whether this build can read another process's memory (Linux: process_vm_readv).
#if defined(__linux__)
inline constexpr bool kCrossMemoryAttach = true;
using IoRange = ::iovec;
#else
inline constexpr bool kCrossMemoryAttach = false;
/// iovec's fields, where <sys/uio.h> has no process_vm_readv.
struct IoRange {
  void* iov_base;
  std::size_t iov_len;
};
#endif

/// This process's id (0 where Cross Memory Attach is not built).
inline std::int64_t process_id() noexcept {
#if defined(__linux__)
  return static_cast<std::int64_t>(::getpid());
#else
  return 0;
#endif
}

/// Reads `n` ranges of process `pid` (remote) into `n_local` ranges of this process, or with
/// `write` writes the local ranges into the remote ones; all their bytes (`bytes`).
/// @returns 0, or the errno of the failure (a short transfer is EFAULT).
inline int transfer_process_memory(std::int64_t pid, const IoRange* local, std::size_t n_local, const IoRange* remote, std::size_t n,
                                   std::size_t bytes, bool write = false) noexcept {
#if defined(__linux__)
  const ssize_t got = write ? ::process_vm_writev(static_cast<pid_t>(pid), local, n_local, remote, n, 0)
                            : ::process_vm_readv(static_cast<pid_t>(pid), local, n_local, remote, n, 0);
  if (got < 0) return errno;
  return static_cast<std::size_t>(got) == bytes ? 0 : EFAULT;
#else
  (void)pid, (void)local, (void)n_local, (void)remote, (void)n, (void)bytes, (void)write;
  return ENOSYS;
#endif
}

/// Whether this process can read the 8 bytes at `address` of process `pid` and finds `expect`
/// there (the probe of a window's construction). Never throws.
/// @param pid     the peer's process id
/// @param address an 8-byte word in the peer's address space
/// @param expect  the value the peer stored there
inline bool cross_memory_readable(std::int64_t pid, std::uint64_t address, std::uint64_t expect) noexcept {
  if (!kCrossMemoryAttach || pid <= 0) return false;
  std::uint64_t got = ~expect;
  IoRange local{&got, sizeof got}, remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(address)), sizeof got};
  return transfer_process_memory(pid, &local, 1, &remote, 1, sizeof got) == 0 && got == expect;
}

/// Reads ranges of one peer process's memory into this process's memory, batched: consecutive
/// ranges that are contiguous are merged (on each side independently), and a call of
/// process_vm_readv reads up to kMaxRanges ranges of each side. When writing, local ranges
/// shorter than kPackBelow are first copied one after the other into a pack buffer of kPackBytes
/// (it stays in cache), which the kernel then reads as one range: process_vm_writev pays a fixed
/// cost per local range on top of the bytes (measured: bench/bench_cross_memory.cpp, docs/headers.md,
/// "comm/cross_memory.hpp"), so short ranges go faster packed first. Those bytes are copied twice,
/// once of them in cache (bytes_packed()). Not thread-safe; keeps its range lists and the pack buffer between uses (no
/// allocation once they are grown).
class CrossMemoryReader {
 public:
  /// Ranges per side and call (Linux's IOV_MAX, UIO_MAXIOV).
  static constexpr std::size_t kMaxRanges = 1024;
  /// Bytes per call at most (a read's count is capped by the kernel near 2 GiB).
  static constexpr std::size_t kMaxBytes = std::size_t{1} << 30;
  /// Local ranges shorter than this are packed before a write (see the class comment).
  static constexpr std::size_t kPackBelow = 1024;
  /// Bytes of the pack buffer (a write call carries at most this many packed bytes).
  static constexpr std::size_t kPackBytes = std::size_t{256} << 10;

  /// Transfers what was added before, then reads from process `pid` (rank `rank`, for the
  /// messages), or with `write` writes into it.
  /// @param pid the peer's process id @param rank its rank @param write whether add()'s local
  ///        ranges are written to the remote ones (process_vm_writev) rather than read from them
  /// @throws Error(backend) as flush().
  void begin(std::int64_t pid, int rank, bool write = false) {
    flush();
    pid_ = pid;
    rank_ = rank;
    write_ = write;
  }
  /// Adds `n` bytes: read from `src` (the peer's address space) to `dst` (this process's), or
  /// when writing, from `dst` (this process's) to `src` (the peer's). A write of fewer than
  /// kPackBelow bytes, with `may_pack`, copies them from `dst` into the pack buffer here, at add()
  /// (later changes to them are not written); every other range is transferred at flush().
  /// @param dst the range in this process @param src the range in the peer @param n bytes
  /// @param may_pack whether a short write may be packed (false where the caller's local ranges
  ///        continue one another, so that they merge into one range instead: write_block())
  /// @throws Error(backend) as flush() (when the lists are full).
  void add(std::byte* dst, std::uint64_t src, std::size_t n, bool may_pack = true) {
    for (; n > kMaxBytes; dst += kMaxBytes, src += kMaxBytes, n -= kMaxBytes) add(dst, src, kMaxBytes);
    if (n == 0) return;
    const bool pack = write_ && may_pack && n < kPackBelow;  // (the local side is the source: copied into the pack buffer now)
    if (pending_ + n > kMaxBytes || (pack && packed_ + n > kPackBytes)) flush();
    if (pack && pack_.size() < kPackBytes) pack_.resize(kPackBytes);
    std::byte* here = pack ? pack_.data() + packed_ : dst;
    bool local = !local_.empty() && static_cast<std::byte*>(local_.back().iov_base) + local_.back().iov_len == here;
    bool remote = !remote_.empty() && reinterpret_cast<std::uintptr_t>(remote_.back().iov_base) + remote_.back().iov_len == src;
    if ((!local && local_.size() == kMaxRanges) || (!remote && remote_.size() == kMaxRanges)) {
      flush();
      local = remote = false;
      here = pack ? pack_.data() : dst;
    }
    if (pack) {
      std::memcpy(here, dst, n);
      packed_ += n;
      packed_total_ += n;
    }
    if (local)
      local_.back().iov_len += n;
    else
      local_.push_back(IoRange{here, n});
    if (remote)
      remote_.back().iov_len += n;
    else
      remote_.push_back(IoRange{reinterpret_cast<void*>(static_cast<std::uintptr_t>(src)), n});
    pending_ += n;
  }
  /// Reads every range added so far. @throws Error(backend) the read failed (the peer's memory is
  /// not readable, or the peer is gone: the errno's message).
  void flush() {
    if (pending_ == 0) return;
    const std::size_t n = pending_;
    const int e = transfer_process_memory(pid_, local_.data(), local_.size(), remote_.data(), remote_.size(), n, write_);
    local_.clear();
    remote_.clear();
    pending_ = packed_ = 0;
    if (e)
      fail(Errc::backend, std::string(write_ ? "process_vm_writev" : "process_vm_readv") + " of " + std::to_string(n) + " bytes of rank " +
                              std::to_string(rank_) + " (pid " + std::to_string(pid_) + ") failed: " + std::strerror(e));
    read_ += n;
  }
  /// Drops what was added and not yet transferred (nothing is read or written): the start of a
  /// new batch after a failure left ranges pending (they may name a peer or buffers of a call
  /// that is over).
  void discard() noexcept {
    local_.clear();
    remote_.clear();
    pending_ = packed_ = 0;
  }
  /// Bytes read or written since construction.
  std::size_t bytes_read() const noexcept { return read_; }
  /// Bytes written through the pack buffer since construction (copied twice: into it, in cache,
  /// then by the kernel), counted at add(): bytes of a batch not yet flushed, or whose flush failed, included.
  std::size_t bytes_packed() const noexcept { return packed_total_; }

 private:
  std::int64_t pid_ = 0;
  int rank_ = 0;
  bool write_ = false;
  std::vector<IoRange> local_, remote_;
  std::vector<std::byte> pack_;  // the short local ranges of a write, one after the other
  std::size_t pending_ = 0, read_ = 0, packed_ = 0, packed_total_ = 0;
};

/// Adds the rows of block `b` to `r`: the source rows at `src` + b.src_offset (+ the strides) in
/// the peer's address space, to `dst` + b.dst_offset (+ the strides), or with `packed` to `dst`
/// row after row (a bounce buffer of b.bytes() bytes). Rows in the order of row_offsets().
/// @param r the reader (begin() called for the block's owner) @param b the block (op ignored)
/// @param src the source buffer's base in the peer @param dst the destination's base here
/// @param packed whether the rows go one after the other to dst
/// @throws Error(backend) as CrossMemoryReader::flush().
inline void read_block(CrossMemoryReader& r, const BlockCopy& b, std::uint64_t src, std::byte* dst, bool packed) {
  const auto rb = static_cast<std::size_t>(b.row_bytes);
  std::byte* out = dst;  // the next packed row
  for_each_row(b, [&](std::int64_t so, std::int64_t dso) {
    r.add(packed ? out : dst + dso, src + static_cast<std::uint64_t>(so), rb);
    if (packed) out += rb;
  });
}

/// Bytes of the contiguous runs of block b's rows on the source side (`source`) or the
/// destination side: the row, times every inner dimension that continues it.
/// @param b the block @param source which side
inline std::int64_t contiguous_run(const BlockCopy& b, bool source) noexcept {
  const std::int64_t* stride = source ? b.src_stride : b.dst_stride;
  std::int64_t run = b.row_bytes;
  for (int k = 3; k >= 0 && (b.extent[k] == 1 || stride[k] == run); --k) run *= b.extent[k];
  return run;
}

/// Adds the rows of block `b` to `r` (begin() called with `write` for the block's reader): the
/// source rows at `src` + b.src_offset (+ the strides) in this process, written to `dst` +
/// b.dst_offset (+ the strides) in the peer's address space; rows shorter than kPackBelow are
/// packed (CrossMemoryReader) unless the block's source rows continue one another.
/// @param r the writer @param b the block (a copy) @param src the source buffer's base here
/// @param dst the destination buffer's base in the peer
/// @throws Error(backend) as CrossMemoryReader::flush().
inline void write_block(CrossMemoryReader& r, const BlockCopy& b, const std::byte* src, std::uint64_t dst) {
  const auto rb = static_cast<std::size_t>(b.row_bytes);
  const bool may_pack = contiguous_run(b, true) < static_cast<std::int64_t>(CrossMemoryReader::kPackBelow);  // (contiguous rows merge instead)
  for_each_row(b, [&](std::int64_t so, std::int64_t dso) {
    r.add(const_cast<std::byte*>(src + so), dst + static_cast<std::uint64_t>(dso), rb, may_pack);
  });
}

/// Whether the owner of a copy block's source pushes it into the reader's memory
/// (process_vm_writev: its own rows as the local side, the reader's destination as the remote
/// one) rather than the reader pulls it: when the destination's runs are longer than the
/// source's (process_vm_* pay per remote range). Reader and owner decide alike from the block.
/// @param b the block (in the reader's list)
inline bool pushed_by_owner(const BlockCopy& b) noexcept { return b.op == BlockOp::copy && contiguous_run(b, false) > contiguous_run(b, true); }

/// What the peer copy keeps between calls to read inputs it cannot load (transport/peer_copy.hpp):
/// the blocks it hands the executor, the bounce buffer of the sums' remote terms, the reader.
/// Owned by the communicator whose with_peers() hands out remote inputs
/// (MpiWindowComm::cross_memory_scratch()); the peer copy makes one per call elsewhere.
struct RemoteReadScratch {
  std::vector<BlockCopy> blocks;  ///< the blocks the executor runs (local sources, and sum terms from the bounce buffer)
  std::vector<std::byte> bounce;  ///< the sums' remote terms, packed
  std::vector<BlockCopy> peer_list;  ///< a peer's list, read to push its blocks that read this rank's inputs
  CrossMemoryReader reader;       ///< the reads and writes
};

}  // namespace detail

/// The cross-memory part of a PeerRecord (comm/peer_record.hpp: PeerRecord::cross_memory).
/// Published by the peer copy on a host executor (the publisher's fields); in what work() gets,
/// filled by the communicator (MpiWindowComm) for each peer whose inputs lie outside the window.
struct CrossMemoryRecord {
  /// Set by the publisher: its work() also reads inputs that this process cannot load, published
  /// by their owner's process id and address (`pid`, `remote`). A communicator across processes
  /// may then publish its inputs outside registered memory that way instead of staging them.
  bool reads_remote = false;
  /// Set by the publisher with reads_remote: the mean contiguous bytes per range its peers read
  /// of input t (from the peers' lists where known, PeerCopyLists::peer_range_bytes, else
  /// estimated from this rank's own reads of its peers' inputs; 0: unknown). The cost is per
  /// range (docs/performance.md), so a communicator may stage an input whose ranges are short.
  std::uint64_t range_bytes[kMaxTensors] = {};
  /// Set by the publisher with reads_remote: the addresses, in its own process, of the block list
  /// its work() runs (`list_blocks` BlockCopy) and of its BufferTable, so that the owner of an
  /// input read remotely can push the blocks whose destination is the more contiguous side;
  /// passed on unchanged by a communicator across processes.
  std::uint64_t list = 0;
  std::uint64_t list_blocks = 0;  ///< see list
  std::uint64_t table = 0;        ///< see list
  /// In what work() gets: 0 when every input is loadable at data[t]; else the owner's process id,
  /// and each input t with data[t] null and bytes[t] > 0 lies at address remote[t] of that process.
  std::int64_t pid = 0;
  std::uint64_t remote[kMaxTensors] = {};  ///< see pid
};

ULYSSES_NAMESPACE_END
