// SPDX-License-Identifier: Apache-2.0
// comm/cross_memory.hpp: reading a process's memory with process_vm_readv, batched (contiguous
// ranges merged on each side, at most 1024 ranges per side and call), a block's rows read
// straight or packed, and written with process_vm_writev (short local ranges through the pack
// buffer) — here from this process itself (a process may always read and write its own memory),
// bit for bit against the rows the block names.
#include <doctest/doctest.h>

#include <ulysses/comm/cross_memory.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

using namespace ulysses;

namespace {
std::uint64_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

/// A block of 3 x 700 rows of 12 bytes: source rows 20 bytes apart (not contiguous), destination
/// rows contiguous within a run of 700 and 40 bytes between runs.
BlockCopy strided_block() {
  BlockCopy b{};
  for (int i = 0; i < 4; ++i) b.extent[i] = 1;
  b.extent[2] = 3, b.extent[3] = 700;
  b.src_stride[3] = 20, b.src_stride[2] = 20 * 700;
  b.dst_stride[3] = 12, b.dst_stride[2] = 12 * 700 + 40;
  b.src_offset = 8, b.dst_offset = 4, b.row_bytes = 12, b.elem_bytes = 4;
  return b;
}
}  // namespace

TEST_CASE("cross memory: this build reads its own process") {
  if (!detail::kCrossMemoryAttach) return;
  std::uint64_t word = 0x1234567890abcdefull;
  CHECK(detail::cross_memory_readable(detail::process_id(), addr(&word), word));
  CHECK(!detail::cross_memory_readable(detail::process_id(), addr(&word), word + 1));
  CHECK(!detail::cross_memory_readable(0, addr(&word), word));
}

TEST_CASE("cross memory: a block's rows, straight and packed, over more than 1024 ranges per side") {
  if (!detail::kCrossMemoryAttach) return;
  const BlockCopy b = strided_block();
  std::vector<std::byte> src(8 + 3 * 700 * 20);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 7 + 3);
  std::vector<std::byte> want(4 + 3 * (12 * 700 + 40), std::byte{0x5a}), got = want, packed(3 * 700 * 12), want_packed(packed.size());
  std::size_t k = 0;
  for (std::int64_t i2 = 0; i2 < 3; ++i2)
    for (std::int64_t i3 = 0; i3 < 700; ++i3)
      for (std::int64_t j = 0; j < 12; ++j) {
        const std::byte v = src[static_cast<std::size_t>(8 + i2 * b.src_stride[2] + i3 * 20 + j)];
        want[static_cast<std::size_t>(4 + i2 * b.dst_stride[2] + i3 * 12 + j)] = v;
        want_packed[k++] = v;
      }
  detail::CrossMemoryReader r;
  r.begin(detail::process_id(), 0);
  detail::read_block(r, b, addr(src.data()), got.data(), false);    // 2100 source ranges, 3 destination ranges
  detail::read_block(r, b, addr(src.data()), packed.data(), true);  // and 1 packed one
  r.flush();
  CHECK(got == want);
  CHECK(packed == want_packed);
  CHECK(r.bytes_read() == 2 * 3 * 700 * 12);
}

TEST_CASE("cross memory: written rows, short ones through the pack buffer, across its end and over 1024 ranges") {
  if (!detail::kCrossMemoryAttach) return;
  using R = detail::CrossMemoryReader;
  // 30000 rows of 12 bytes (packed: 360000 bytes, more than one pack buffer), then one row of
  // kPackBelow bytes (not packed), then 1500 rows of 700 bytes with gaps on both sides (packed;
  // the pack buffer fills before the remote list), then 3000 rows of 16 bytes with gaps on both
  // sides (packed; the remote list fills at 1024 ranges before the pack buffer, twice), then rows
  // of 512 bytes that end the pack buffer exactly: every byte where the rows say, the gaps untouched.
  struct Row {
    std::size_t src, dst, n;
  };
  std::vector<Row> rows;
  std::size_t s_at = 8, d_at = 4;
  for (int i = 0; i < 30000; ++i, s_at += 20, d_at += 12) rows.push_back({s_at, d_at, 12});
  rows.push_back({s_at, d_at, R::kPackBelow});
  s_at += R::kPackBelow + 4, d_at += R::kPackBelow;
  for (int i = 0; i < 1500; ++i, s_at += 720, d_at += 703) rows.push_back({s_at, d_at, 700});
  for (int i = 0; i < 3000; ++i, s_at += 20, d_at += 17) rows.push_back({s_at, d_at, 16});
  for (std::size_t i = 0; i < 2 * R::kPackBytes / 512; ++i, s_at += 520, d_at += 512) rows.push_back({s_at, d_at, 512});
  std::vector<std::byte> src(s_at), dst(d_at, std::byte{0x5a});
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 13 + 1);
  std::vector<std::byte> want = dst;
  std::size_t packed = 0;
  for (const Row& w : rows) {
    std::copy(src.begin() + static_cast<std::ptrdiff_t>(w.src), src.begin() + static_cast<std::ptrdiff_t>(w.src + w.n),
              want.begin() + static_cast<std::ptrdiff_t>(w.dst));
    if (w.n < R::kPackBelow) packed += w.n;
  }
  CHECK(packed > R::kPackBytes);
  R r;
  r.begin(detail::process_id(), 1, true);
  for (const Row& w : rows) r.add(src.data() + w.src, addr(dst.data() + w.dst), w.n);
  r.flush();
  CHECK(dst == want);
  CHECK(r.bytes_packed() == packed);
  std::size_t all = 0;
  for (const Row& w : rows) all += w.n;
  CHECK(r.bytes_read() == all);
  // A block whose short source rows continue one another is written as one range, not packed
  // (write_block); one whose source rows are apart is packed.
  std::vector<std::byte> rows64(64 * 80), out(64 * 64, std::byte{0}), out2 = out;
  for (std::size_t i = 0; i < rows64.size(); ++i) rows64[i] = static_cast<std::byte>(i * 5 + 2);
  BlockCopy b{};
  for (int i = 0; i < 4; ++i) b.extent[i] = 1;
  b.extent[3] = 64, b.row_bytes = 64, b.elem_bytes = 4, b.src_stride[3] = 64, b.dst_stride[3] = 64;
  r.begin(detail::process_id(), 1, true);
  detail::write_block(r, b, rows64.data(), addr(out.data()));
  r.flush();
  CHECK(std::equal(out.begin(), out.end(), rows64.begin()));
  CHECK(r.bytes_packed() == packed);
  b.src_stride[3] = 80;
  r.begin(detail::process_id(), 1, true);
  detail::write_block(r, b, rows64.data(), addr(out2.data()));
  r.flush();
  for (std::size_t i = 0; i < 64; ++i)
    CHECK(std::equal(out2.begin() + static_cast<std::ptrdiff_t>(i * 64), out2.begin() + static_cast<std::ptrdiff_t>(i * 64 + 64), rows64.begin() + static_cast<std::ptrdiff_t>(i * 80)));
  packed += 64 * 64;
  CHECK(r.bytes_packed() == packed);
  // Reads never pack.
  std::vector<std::byte> back(rows.size() * 12);
  r.begin(detail::process_id(), 1);
  for (std::size_t i = 0; i < 100; ++i) r.add(back.data() + i * 12, addr(src.data() + rows[i].src), 12);
  r.flush();
  CHECK(r.bytes_packed() == packed);
  for (std::size_t i = 0; i < 100; ++i) CHECK(std::equal(back.begin() + static_cast<std::ptrdiff_t>(i * 12), back.begin() + static_cast<std::ptrdiff_t>(i * 12 + 12), src.begin() + static_cast<std::ptrdiff_t>(rows[i].src)));
}

TEST_CASE("cross memory: contiguous rows merge into one range; a bad address is Error(backend)") {
  if (!detail::kCrossMemoryAttach) return;
  std::vector<std::uint32_t> src(5000), dst(5000, 0);
  std::iota(src.begin(), src.end(), 1u);
  detail::CrossMemoryReader r;
  r.begin(detail::process_id(), 3);
  for (std::size_t i = 0; i < src.size(); ++i) r.add(reinterpret_cast<std::byte*>(&dst[i]), addr(&src[i]), 4);
  r.flush();
  CHECK(dst == src);
  std::vector<std::uint32_t> untouched(4, 7);
  r.begin(detail::process_id(), 3);
  r.add(reinterpret_cast<std::byte*>(untouched.data()), addr(src.data()), 16);
  r.discard();  // dropped: never read, not counted
  r.flush();
  CHECK(untouched == std::vector<std::uint32_t>(4, 7));
  CHECK(r.bytes_read() == src.size() * 4);
  r.begin(detail::process_id(), 3);
  r.add(reinterpret_cast<std::byte*>(dst.data()), 16, 4);  // page 0 is never mapped
  try {
    r.flush();
    CHECK(false);
  } catch (const Error& e) {
    CHECK(e.code() == Errc::backend);
    CHECK(std::string(e.what()).find("rank 3") != std::string::npos);
  }
}
